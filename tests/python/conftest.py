# SPDX-License-Identifier: Apache-2.0
"""Shared generators and checks for the attnkit Python tests (CPU).

Every input comes from a seeded generator; a test's parameters (seed included) are in its id,
so a failing case can be rerun alone with ``pytest -k``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference import FLOAT_DTYPES, bits, topk_reference, uint_dtype  # noqa: E402

import attnkit  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16")

# Distributions of row values. "normal@s" is N(0, s^2) rounded to the dtype.
DISTRIBUTIONS = (
    "normal@1e-3", "normal@1", "normal@1e3", "ties4", "all_equal", "inf", "nan", "denormal",
    "signed_zeros", "ascending", "descending",
)

# Poison written into caller buffers before a call: every slot must be overwritten.
POISON_INDEX = -7777
POISON_BITS = {2: 0x7E5A, 4: 0x7FA5A5A5}  # NaNs with a payload no result can have


def rng_for(*key: Any) -> np.random.Generator:
    """A generator seeded from the test's parameters (stable across runs and processes)."""
    text = "|".join(str(k) for k in key)
    seed = int.from_bytes(text.encode(), "little") % (2**63)
    return np.random.default_rng(seed)


def dtype_of(name: str) -> np.dtype:
    return FLOAT_DTYPES[name]


def _nan_bits(dtype: np.dtype, rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` NaN bit patterns of dtype with random sign and nonzero payload."""
    u = uint_dtype(dtype)
    if dtype == np.dtype(np.float32):
        exp, mant_bits, sign = 0x7F800000, 23, 0x80000000
    elif dtype == np.dtype(np.float16):
        exp, mant_bits, sign = 0x7C00, 10, 0x8000
    else:  # bfloat16
        exp, mant_bits, sign = 0x7F80, 7, 0x8000
    mant = rng.integers(1, 1 << mant_bits, size=count, dtype=np.int64)
    signs = rng.integers(0, 2, size=count, dtype=np.int64) * sign
    return (exp | mant | signs).astype(u)


def _denormal_bits(dtype: np.dtype, rng: np.random.Generator, shape) -> np.ndarray:
    """Subnormal bit patterns (and some zeros) of dtype, with random signs."""
    u = uint_dtype(dtype)
    mant_bits = {4: 23}.get(dtype.itemsize, 10 if dtype == np.dtype(np.float16) else 7)
    sign = 0x80000000 if dtype.itemsize == 4 else 0x8000
    # A few distinct magnitudes so that ties among denormals occur too.
    pool = rng.integers(0, 1 << mant_bits, size=16, dtype=np.int64)
    mant = rng.choice(pool, size=shape)
    signs = rng.integers(0, 2, size=shape, dtype=np.int64) * sign
    return (mant | signs).astype(u)


def make_rows(dist: str, shape, dtype_name: str, rng: np.random.Generator) -> np.ndarray:
    """A C-contiguous array of `shape` and dtype `dtype_name` drawn from `dist`."""
    dtype = dtype_of(dtype_name)
    shape = tuple(shape)
    if dist.startswith("normal@"):
        scale = float(dist.split("@")[1])
        return (rng.standard_normal(shape) * scale).astype(dtype)
    if dist == "ties4":
        return rng.choice(np.array([-1.5, 0.25, 2.0, 7.0]), size=shape).astype(dtype)
    if dist == "all_equal":
        return np.full(shape, rng.choice([-3.0, 0.0, 1.0, 42.0]), dtype=np.float64).astype(dtype)
    if dist == "inf":
        a = rng.standard_normal(shape)
        r = rng.random(shape)
        a[r < 0.15] = np.inf
        a[(r >= 0.15) & (r < 0.3)] = -np.inf
        return a.astype(dtype)
    if dist == "nan":
        a = (rng.standard_normal(shape) * 10).astype(dtype)
        r = rng.random(shape)
        a[r < 0.05] = np.inf
        a[(r >= 0.05) & (r < 0.1)] = -np.inf
        mask = rng.random(shape) < 0.12
        view = a.view(uint_dtype(dtype))
        view[mask] = _nan_bits(dtype, rng, int(mask.sum()))
        return a
    if dist == "denormal":
        a = _denormal_bits(dtype, rng, shape).view(dtype)
        # A few normal numbers of both signs around the denormals.
        mask = rng.random(shape) < 0.05
        tiny = {4: 0x00800000, 2: 0x0400 if dtype == np.dtype(np.float16) else 0x0080}
        sign = 0x80000000 if dtype.itemsize == 4 else 0x8000
        signs = rng.integers(0, 2, size=int(mask.sum()), dtype=np.int64) * sign
        a.view(uint_dtype(dtype))[mask] = (tiny[dtype.itemsize] | signs).astype(uint_dtype(dtype))
        return a
    if dist == "signed_zeros":
        return rng.choice(np.array([-0.0, 0.0, -0.0, 0.0, 1.0, -1.0]), size=shape).astype(dtype)
    if dist in ("ascending", "descending"):
        base = np.sort(rng.standard_normal(shape), axis=-1)
        if dist == "descending":
            base = base[..., ::-1]
        return np.ascontiguousarray(base.astype(dtype))
    raise ValueError(f"unknown distribution {dist!r}")


def ragged_ranges(rng: np.random.Generator, rows: int, cols: int, kind: str, index_dtype):
    """(begin, end) host arrays for `kind`: "full", "ragged", "empty", "causal", "suffix"."""
    if kind == "full":
        return None, None
    if kind == "ragged":
        a = rng.integers(0, cols + 1, size=rows)
        b = rng.integers(0, cols + 1, size=rows)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        if rows > 1:
            lo[0], hi[0] = 0, cols  # one full row
            hi[1] = lo[1]  # one empty row
    elif kind == "empty":
        lo = rng.integers(0, cols + 1, size=rows)
        hi = lo.copy()
    elif kind == "causal":
        lo = np.zeros(rows, np.int64)
        hi = np.minimum(np.arange(1, rows + 1) * max(1, cols // max(rows, 1)), cols)
        hi[-1] = cols
    elif kind == "suffix":
        lo = rng.integers(0, cols + 1, size=rows)
        hi = np.full(rows, cols)
    else:
        raise ValueError(kind)
    return lo.astype(index_dtype), hi.astype(index_dtype)


def describe(**params: Any) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


def assert_same_result(got, want, context: str) -> None:
    """Exact comparison of (values, indices) pairs: indices equal, values bit-equal."""
    gv, gi = got
    wv, wi = want
    gi = np.asarray(gi)
    assert gi.shape == np.asarray(wi).shape, f"{context}: indices shape {gi.shape} != {wi.shape}"
    assert gi.dtype == np.asarray(wi).dtype, f"{context}: indices dtype {gi.dtype} != {wi.dtype}"
    if not np.array_equal(gi, wi):
        bad = np.argwhere(gi != wi)[:5]
        raise AssertionError(
            f"{context}: indices differ at {bad.tolist()}: got "
            f"{[gi[tuple(p)] for p in bad]} want {[np.asarray(wi)[tuple(p)] for p in bad]}")
    if wv is None:
        assert gv is None, f"{context}: values should be None"
        return
    gv = np.asarray(gv)
    assert gv.dtype == np.asarray(wv).dtype, f"{context}: values dtype {gv.dtype} != {wv.dtype}"
    assert gv.shape == np.asarray(wv).shape, f"{context}: values shape {gv.shape} != {wv.shape}"
    gb, wb = bits(gv), bits(wv)
    if not np.array_equal(gb, wb):
        bad = np.argwhere(gb != wb)[:5]
        raise AssertionError(
            f"{context}: value bits differ at {bad.tolist()}: got "
            f"{[hex(gb[tuple(p)]) for p in bad]} want {[hex(wb[tuple(p)]) for p in bad]}")


def check_topk(x: np.ndarray, k: int, context: str = "", *, backend: Optional[str] = None,
               **opts: Any):
    """Runs attnkit.topk(x, k, **opts) and compares it exactly with the reference.

    The reference sees begin/end/index_offset as host arrays and indices_dtype as a NumPy
    dtype; ties="lowest_index" only. Returns attnkit's result."""
    call = dict(opts)
    if backend is not None:
        call["backend"] = backend
    got = attnkit.topk(x, k, **call)
    ref_opts = {key: v for key, v in opts.items()
                if key in ("largest", "sorted", "begin", "end", "index_offset", "index_fill",
                           "value_fill", "nan")}
    ref_opts["indices_dtype"] = np.dtype(opts.get("indices_dtype", "int64"))
    want = topk_reference(np.asarray(x), k, **ref_opts)
    if opts.get("return_values", True) is False:
        want = (None, want[1])
    ctx = context or describe(k=k, shape=np.shape(x), dtype=str(np.asarray(x).dtype), **opts)
    assert_same_result(got, want, ctx)
    return got


@pytest.fixture
def restore_threads():
    """Restores attnkit's CPU thread count after a test that changes it."""
    before = attnkit.num_threads()
    yield before
    attnkit.set_num_threads(before)


def poisoned(shape, dtype) -> np.ndarray:
    """A buffer of `shape`/`dtype` filled with poison (a NaN payload or POISON_INDEX)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return np.full(shape, POISON_INDEX, dtype=dtype)
    return np.full(shape, POISON_BITS[dtype.itemsize], dtype=uint_dtype(dtype)).view(dtype)


def to_torch(a: np.ndarray):
    """A NumPy float array (bfloat16 through ml_dtypes) as a torch tensor, bit for bit."""
    import torch

    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def to_numpy(t) -> np.ndarray:
    """A torch tensor as NumPy, bit for bit (bfloat16 through ml_dtypes)."""
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
