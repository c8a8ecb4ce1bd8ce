# SPDX-License-Identifier: Apache-2.0
"""attnkit.topk bad input: one case per rule of SPEC "Bad input" and include/attnkit/topk.hpp.

ValueError for values, shapes and layouts; TypeError for dtypes. Each message must name the
argument and the value seen. Caller buffers passed to a failing call must be left untouched."""

from __future__ import annotations

import ctypes
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Tuple

import ml_dtypes
import numpy as np
import pytest
import torch

import attnkit
from conftest import assert_same_result, bits, make_rows, poisoned, rng_for
from reference import FLOAT_DTYPES, topk_reference

B, N, K = 4, 10, 3


def _x(dtype: str = "float32", shape=(B, N)) -> np.ndarray:
    return make_rows("normal@1", shape, dtype, rng_for("bad_input_x", dtype, shape))


def _as_strided(base: np.ndarray, shape, strides) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides, writeable=False)


@dataclass
class Bad:
    """One bad call: build() -> (x, k, kwargs); the error type and fragments of its message."""

    name: str
    build: Callable[[], Tuple[Any, int, dict]]
    error: type
    fragments: Tuple[str, ...]
    add_outputs: bool = True  # also pass poisoned caller buffers of the right shape
    extra: dict = field(default_factory=dict)


def _wrong(name, **kwargs):
    return lambda: (_x(), K, kwargs)


def _overlapping_outputs():
    raw = np.zeros(64, np.int64)
    oi = raw[: B * K].reshape(B, K)
    ov = raw.view(np.float32)[: B * K].reshape(B, K)  # the same bytes as oi
    return _x(), K, dict(out_indices=oi, out_values=ov)


def _out_overlaps_x():
    storage = np.zeros((B, N + 8), np.float32)
    x = storage[:, :N]
    ov = storage[:, N - 1:N - 1 + K]  # shares x's last column (the rest lies between rows)
    return x, K, dict(out_values=ov, out_indices=poisoned((B, K), np.int64))


def _out_overlaps_end():
    raw = poisoned((B * K + B,), np.int64)
    end = raw[:B]
    end[:] = N
    return _x(), K, dict(end=end, out_indices=raw[: B * K].reshape(B, K))


def _out_overlaps_index_offset():
    raw = poisoned((B * K + B,), np.int32)
    offset = raw[B * K - 2: B * K - 2 + B]
    offset[:] = 0
    return _x(), K, dict(index_offset=offset, out_indices=raw[: B * K].reshape(B, K),
                         indices_dtype="int32")


def _rows_overlap():
    # stride(0) = 1 < k: row b's slots are row b+1's too (writeable, so untouched is checked).
    oi = np.lib.stride_tricks.as_strided(poisoned((B * K,), np.int64), shape=(B, K),
                                         strides=(8, 8))
    return _x(), K, dict(out_indices=oi)


def _byte_strides():
    raw = np.zeros((B, 4 * N + 1), np.uint8)
    x = raw[:, : 4 * N].view(np.float32)  # byte row stride 4N + 1
    return x, K, {}


def _misaligned(shape, dtype) -> np.ndarray:
    """An array whose base address is one byte past a multiple of its item size."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.zeros(count * dtype.itemsize + 16, dtype=np.uint8)
    start = (-raw.ctypes.data) % 16 + 1
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def _misaligned_out_indices():
    oi = _misaligned((B, K), np.int64)
    oi[...] = -7777
    return _x(), K, dict(out_indices=oi)


def _huge_columns():
    base = np.zeros(16, np.float32)
    return _as_strided(base, (1, 2**31), (0, 4)), 1, {}


def _huge_rows():
    base = np.zeros(16, np.float32)
    return _as_strided(base, (2**31, 1), (0, 4)), 0, {}


CASES = [
    # x: rank, dtype, layout, extents
    Bad("x_rank0", lambda: (np.array(1.0, np.float32), K, {}), ValueError,
        ("x has 0 dimensions",), add_outputs=False),
    Bad("x_rank3", lambda: (_x(shape=(2, 3, 4)), K, {}), ValueError,
        ("x has 3 dimensions", "[2, 3, 4]"), add_outputs=False),
    Bad("x_masked_array", lambda: (np.ma.masked_array(_x(), mask=_x() > 0), K, {}), TypeError,
        ("x is a NumPy masked array", "filled"), add_outputs=False),
    Bad("x_rank7", lambda: (np.zeros((1,) * 7, np.float32), K, {}), ValueError,
        ("x has 7 dimensions", "[B, N] or [N]"), add_outputs=False),
    Bad("x_float64", lambda: (np.zeros((B, N)), K, {}), TypeError, ("x.dtype", "float64")),
    Bad("x_int32", lambda: (np.zeros((B, N), np.int32), K, {}), TypeError, ("x.dtype", "int32")),
    Bad("x_int8", lambda: (np.zeros((B, N), np.int8), K, {}), TypeError, ("x.dtype", "int8")),
    Bad("x_bool", lambda: (np.zeros((B, N), np.bool_), K, {}), TypeError, ("x.dtype", "bool")),
    Bad("x_float8", lambda: (np.zeros((B, N), ml_dtypes.float8_e4m3fn), K, {}), TypeError,
        ("x.dtype = float8_e4m3fn is no dtype of attnkit's; expected float32, bfloat16 or "
         "float16",)),
    Bad("x_complex64", lambda: (np.zeros((B, N), np.complex64), K, {}), TypeError,
        ("x.dtype", "complex64")),
    Bad("x_list", lambda: ([[1.0, 2.0]], 1, {}), TypeError, ("x", "list"), add_outputs=False),
    Bad("x_numpy_scalar", lambda: (np.float32(1.0), 1, {}), TypeError, ("x", "NumPy scalar", "[N]"),
        add_outputs=False),
    Bad("x_columns_strided", lambda: (_x(shape=(B, 2 * N))[:, ::2], K, {}), ValueError,
        ("x.stride(-1) = 2 elements", "contiguous")),
    Bad("x_fortran_order", lambda: (np.asfortranarray(_x()), K, {}), ValueError,
        ("x.stride(-1) = 4", "contiguous")),
    Bad("x_byte_strides", _byte_strides, ValueError, ("x", "byte strides", "41")),
    Bad("x_misaligned_element", lambda: (_misaligned((B, N), np.float32), K, {}), ValueError,
        ("x.data", "4-byte element size")),
    Bad("x_columns_over_2^31-1", _huge_columns, ValueError, ("N = 2147483648", "2^31 - 1"),
        extra=dict(rows=1, k=1)),
    Bad("x_rows_over_2^31-1", _huge_rows, ValueError, ("B = 2147483648", "2^31 - 1"),
        add_outputs=False),
    # k
    Bad("k_negative", lambda: (_x(), -1, {}), ValueError, ("k = -1", ">= 0"), add_outputs=False),
    Bad("k_very_negative", lambda: (_x(), -(2**40), {}), ValueError, ("k = -1099511627776",),
        add_outputs=False),
    Bad("k_beyond_int64", lambda: (_x(), 10**30, {}), ValueError,
        (f"k = {10**30} must be in [0, 2^31 - 1]",), add_outputs=False),
    # torch's __index__ takes bool tensors and one-element tensors of any rank; NumPy's does not.
    Bad("k_bool_tensor", lambda: (_x(), torch.tensor(True), {}), TypeError,
        ("k = tensor(True); expected an integer",), add_outputs=False),
    Bad("k_one_element_tensor", lambda: (_x(), torch.tensor([2]), {}), TypeError,
        ("k = tensor([2]); expected an integer",), add_outputs=False),
    Bad("index_fill_bool_tensor", lambda: (_x(), K, dict(index_fill=torch.tensor(True))),
        TypeError, ("index_fill = tensor(True); expected an integer",)),
    # begin / end / index_offset: shape, dtype
    Bad("begin_wrong_length", _wrong("begin", begin=np.zeros(B + 1, np.int64)), ValueError,
        ("begin has shape [5]", "[B] = [4]")),
    Bad("end_wrong_length", _wrong("end", end=np.zeros(B - 1, np.int32)), ValueError,
        ("end has shape [3]", "[B] = [4]")),
    Bad("end_rank2", _wrong("end", end=np.zeros((B, 1), np.int32)), ValueError,
        ("end has shape [4, 1]",)),
    Bad("index_offset_wrong_length", _wrong("io", index_offset=np.zeros(2, np.int64)),
        ValueError, ("index_offset has shape [2]", "[B] = [4]")),
    Bad("begin_float", _wrong("begin", begin=np.zeros(B, np.float32)), TypeError,
        ("begin.dtype = float32",)),
    Bad("end_complex", _wrong("end", end=np.zeros(B, np.complex64)), TypeError,
        ("end.dtype = complex64 is no dtype of attnkit's; expected int32 or int64",)),
    Bad("end_int16", _wrong("end", end=np.zeros(B, np.int16)), TypeError, ("end.dtype = int16",)),
    Bad("end_uint32", _wrong("end", end=np.zeros(B, np.uint32)), TypeError,
        ("end.dtype = uint32",)),
    Bad("end_misaligned_element", _wrong("end", end=_misaligned((B,), np.int32)), ValueError,
        ("end.data", "4-byte element size")),
    Bad("index_offset_float64", _wrong("io", index_offset=np.zeros(B)), TypeError,
        ("index_offset.dtype = float64",)),
    # begin / end / index_offset: values (checked on the CPU by default)
    Bad("begin_negative", _wrong("begin", begin=np.array([0, 0, -1, 0], np.int64)), ValueError,
        ("begin[2] = -1",)),
    Bad("begin_past_N", _wrong("begin", begin=np.array([0, 11, 0, 0], np.int32)), ValueError,
        ("begin[1] = 11",)),
    Bad("end_past_N", _wrong("end", end=np.array([10, 10, 10, 11], np.int32)), ValueError,
        ("end[3] = 11",)),
    Bad("end_negative", _wrong("end", end=np.array([-3, 10, 10, 10], np.int64)), ValueError,
        ("end[0] = -3",)),
    Bad("end_before_begin", _wrong("end", begin=np.array([0, 5, 0, 0], np.int32),
                                   end=np.array([10, 4, 10, 10], np.int32)), ValueError,
        ("end[1] = 4", "begin[1]")),
    Bad("index_offset_past_int32", _wrong("io", index_offset=np.array([0, 2**31 - 5, 0, 0]),
                                          indices_dtype="int32"), ValueError,
        ("index_offset[1] = 2147483643", "int32")),
    Bad("index_offset_below_int32", _wrong("io", index_offset=np.array([0, 0, -(2**31) - 1, 0]),
                                           indices_dtype="int32"), ValueError,
        ("index_offset[2] = -2147483649", "int32")),
    Bad("index_offset_past_int64", _wrong("io", index_offset=np.array([0, 0, 0, 2**63 - 2])),
        ValueError, ("index_offset[3] = 9223372036854775806", "int64")),
    # outputs: shape, dtype, layout, overlap
    Bad("out_indices_wrong_shape", _wrong("oi", out_indices=poisoned((B, K + 1), np.int64)),
        ValueError, ("out_indices has shape [4, 4]", "[B, k] = [4, 3]"), add_outputs=False),
    Bad("out_indices_wrong_rows", _wrong("oi", out_indices=poisoned((B + 1, K), np.int64)),
        ValueError, ("out_indices has shape [5, 3]",), add_outputs=False),
    Bad("out_indices_rank1", _wrong("oi", out_indices=poisoned((B * K,), np.int64)),
        ValueError, ("out_indices has shape [12]",), add_outputs=False),
    Bad("out_indices_float32", _wrong("oi", out_indices=poisoned((B, K), np.float32)),
        TypeError, ("out_indices.dtype = float32",), add_outputs=False),
    Bad("out_indices_int16", _wrong("oi", out_indices=poisoned((B, K), np.int16)),
        TypeError, ("out_indices.dtype = int16",), add_outputs=False),
    Bad("indices_dtype_against_out_indices",
        _wrong("oi", out_indices=poisoned((B, K), np.int32), indices_dtype="int64"), ValueError,
        ("indices_dtype = int64", "out_indices has dtype int32"), add_outputs=False),
    Bad("out_indices_strided_columns",
        _wrong("oi", out_indices=poisoned((B, 2 * K), np.int64)[:, ::2]), ValueError,
        ("out_indices.stride(-1) = 2",), add_outputs=False),
    Bad("out_indices_misaligned_element", _misaligned_out_indices, ValueError,
        ("out_indices.data", "8-byte element size"), add_outputs=False),
    Bad("out_indices_rows_overlap", _rows_overlap, ValueError,
        ("out_indices.stride(0) = 1", "overlap"), add_outputs=False),
    Bad("out_values_wrong_shape",
        _wrong("ov", out_values=poisoned((B, K - 1), np.float32),
               out_indices=poisoned((B, K), np.int64)), ValueError,
        ("out_values has shape [4, 2]", "[B, k] = [4, 3]"), add_outputs=False),
    Bad("out_values_wrong_dtype",
        _wrong("ov", out_values=poisoned((B, K), np.float16),
               out_indices=poisoned((B, K), np.int64)), TypeError,
        ("out_values.dtype = float16", "float32"), add_outputs=False),
    Bad("out_values_strided_columns",
        _wrong("ov", out_values=poisoned((B, 3 * K), np.float32)[:, ::3],
               out_indices=poisoned((B, K), np.int64)), ValueError,
        ("out_values.stride(-1) = 3",), add_outputs=False),
    Bad("outputs_overlap_each_other", _overlapping_outputs, ValueError,
        ("out_values (bytes [0x", ") overlaps out_indices (bytes [0x"), add_outputs=False),
    Bad("out_values_overlaps_x", _out_overlaps_x, ValueError,
        ("out_values (bytes", ") overlaps x (bytes"), add_outputs=False),
    Bad("out_indices_overlaps_end", _out_overlaps_end, ValueError,
        ("out_indices (bytes", ") overlaps end (bytes"), add_outputs=False),
    Bad("out_indices_overlaps_index_offset", _out_overlaps_index_offset, ValueError,
        ("out_indices (bytes", ") overlaps index_offset (bytes"), add_outputs=False),
    # fills and options
    Bad("index_fill_past_int32", _wrong("if", index_fill=2**31, indices_dtype="int32"),
        ValueError, ("index_fill = 2147483648", "int32")),
    Bad("index_fill_past_int64_int32_indices",
        _wrong("if", index_fill=2**63, indices_dtype="int32"), ValueError,
        ("index_fill = 9223372036854775808 does not fit int64, the widest indices",)),
    Bad("index_fill_below_int32", _wrong("if", index_fill=-(2**31) - 1, indices_dtype="int32"),
        ValueError, ("index_fill = -2147483649", "int32")),
    Bad("sorted_unknown", _wrong("s", sorted="descending"), ValueError,
        ("sorted", "'descending'")),
    Bad("sorted_none_object", _wrong("s", sorted=None), ValueError, ("sorted", "None")),
    Bad("nan_unknown", _wrong("n", nan="skip"), ValueError, ("nan", "'skip'")),
    Bad("ties_unknown", _wrong("t", ties="first"), ValueError, ("ties", "'first'")),
    Bad("backend_unknown", _wrong("b", backend="cuda"), ValueError, ("backend", "'cuda'")),
    Bad("check_unknown", _wrong("c", check="yes"), ValueError, ("check", "'yes'")),
    Bad("indices_dtype_int16", _wrong("d", indices_dtype="int16"), TypeError,
        ("indices_dtype", "int16"), add_outputs=False),
    Bad("indices_dtype_platform_code", _wrong("d", indices_dtype="l"), TypeError,
        ("indices_dtype = 'l'", "depends on the platform", "'i8'"), add_outputs=False),
    Bad("indices_dtype_python_int", _wrong("d", indices_dtype=int), TypeError,
        ("indices_dtype = <class 'int'>", "depends on the platform"), add_outputs=False),
    Bad("indices_dtype_float32", _wrong("d", indices_dtype=np.float32), TypeError,
        ("indices_dtype", "float32"), add_outputs=False),
    Bad("indices_dtype_unknown_name", _wrong("d", indices_dtype="long"), TypeError,
        ("indices_dtype", "'long'"), add_outputs=False),
    Bad("indices_dtype_swapped_code", _wrong("d", indices_dtype=">i4"), TypeError,
        ("indices_dtype", "'>i4'", "this machine's byte order: pass 'int32'"),
        add_outputs=False),
    # device
    Bad("begin_on_meta_device",
        _wrong("begin", begin=torch.zeros(B, dtype=torch.int64, device="meta")), ValueError,
        ("begin", "meta")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case):
    x, k, kwargs = case.build()
    rows = case.extra.get("rows", B)
    out_k = case.extra.get("k", k)
    if case.add_outputs:
        x_dtype = np.asarray(x).dtype
        values_dtype = x_dtype if x_dtype in FLOAT_DTYPES.values() else np.dtype(np.float32)
        kwargs.setdefault("out_values", poisoned((rows, out_k), values_dtype))
        kwargs.setdefault("out_indices", poisoned(
            (rows, out_k), np.dtype(kwargs.pop("indices_dtype", "int64"))))
    outputs = {name: kwargs[name] for name in ("out_values", "out_indices")
               if isinstance(kwargs.get(name), np.ndarray) and kwargs[name].flags.writeable}
    before = {name: bits(a).copy() if a.dtype.kind == "f" else a.copy()
              for name, a in outputs.items()}
    with pytest.raises(case.error) as info:
        attnkit.topk(x, k, **kwargs)
    message = str(info.value)
    for fragment in case.fragments:
        assert fragment in message, f"{case.name}: {fragment!r} not in message {message!r}"
    for name, a in outputs.items():
        now = bits(a) if a.dtype.kind == "f" else a
        assert np.array_equal(now, before[name]), f"{case.name}: {name} was written"


# ---------------------------------------------------------------------------------------------
# nan="raise": raises only for a NaN inside a row's valid range
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "float16"))
@pytest.mark.parametrize("nan_sign", ("+", "-"))
@pytest.mark.parametrize("backend", ("auto", "reference"))
def test_nan_raise_inside_range(dtype, nan_sign, backend):
    x = _x(dtype)
    nan = np.array(np.nan if nan_sign == "+" else -np.nan, np.float32).astype(x.dtype)
    x[2, 6] = nan
    ov, oi = poisoned((B, K), x.dtype), poisoned((B, K), np.int64)
    before_v, before_i = bits(ov).copy(), oi.copy()
    with pytest.raises(ValueError) as info:
        attnkit.topk(x, K, nan="raise", out_values=ov, out_indices=oi, backend=backend)
    assert "x[2, 6] is NaN" in str(info.value) and 'nan = "raise"' in str(info.value)
    assert np.array_equal(bits(ov), before_v) and np.array_equal(oi, before_i)
    with pytest.raises(ValueError, match=r"topk: x\[6\] is NaN, inside x's valid range"):
        attnkit.topk(x[2], K, nan="raise", backend=backend)  # one row, [N]: named by column
    # The same NaN inside a narrowed range still raises.
    with pytest.raises(ValueError):
        attnkit.topk(x, K, nan="raise", begin=np.array([0, 0, 6, 0]),
                     end=np.array([0, 0, 7, 0]), backend=backend)


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "float16"))
@pytest.mark.parametrize("where", ("before_begin", "at_end", "empty_row", "long_row_outside"))
def test_nan_raise_outside_range_does_not_raise(dtype, where):
    cols = 20000 if where == "long_row_outside" else N
    x = _x(dtype, shape=(B, cols))
    begin = np.array([0, 3, 0, 0], np.int64)
    end = np.array([cols, cols, cols - 1, cols], np.int64)
    if where == "before_begin":
        x[1, 2] = np.nan
    elif where == "at_end":
        x[2, cols - 1] = np.nan  # end[2] = cols - 1: just outside
    elif where == "empty_row":
        begin[3] = end[3] = 5
        x[3, 5] = np.nan
    else:
        begin[0], end[0] = 100, cols - 100
        x[0, :100] = np.nan
        x[0, cols - 100:] = np.nan
    got = attnkit.topk(x, 7, nan="raise", begin=begin, end=end, sorted="value")
    want = topk_reference(x, 7, begin=begin, end=end, sorted="value")
    assert_same_result(got, want, f"dtype={dtype}, where={where}")


def test_outputs_in_the_spare_columns_of_x():
    # Outputs that share x's buffer but no byte of it are accepted; one shared column is not.
    base = _x(shape=(B, N + K + 2))
    x = base[:, :N]
    before = base.copy()
    v, i = attnkit.topk(x, K, sorted="value", out_values=base[:, N:N + K],
                        out_indices=np.empty((B, K), np.int64))
    assert_same_result((v, i), topk_reference(before[:, :N], K, sorted="value"), "spare columns")
    assert np.array_equal(bits(base[:, :N]), bits(before[:, :N]))
    assert np.array_equal(bits(base[:, N + K:]), bits(before[:, N + K:]))
    overlap = r"out_values \(bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\)\) overlaps x \(bytes"
    with pytest.raises(ValueError, match=overlap):
        attnkit.topk(x, K, out_values=base[:, N - 1:N - 1 + K],
                     out_indices=np.empty((B, K), np.int64))


def test_nan_raise_without_nan_equals_default():
    x = make_rows("inf", (6, 300), "bfloat16", rng_for("nan_raise_clean"))
    assert_same_result(attnkit.topk(x, 40, nan="raise", sorted="value"),
                       attnkit.topk(x, 40, sorted="value"), "nan=raise on a NaN-free x")


# Arguments that are not arrays, and outputs that are read-only, are refused by name.
@pytest.mark.parametrize("arg", ["x", "begin", "end", "index_offset", "out_indices"])
def test_non_arrays_are_refused_by_name(arg):
    import ctypes

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for bad in ((0, 1, 2), (4096, (3,), (1,), 3, 0, 0), [0, 1, 2], (ctypes.c_int64 * 3)(0, 1, 2),
                memoryview(np.zeros(3, np.int64))):
        kwargs = {} if arg == "x" else {arg: bad}
        with pytest.raises(TypeError, match=f"topk: {arg} is a "):
            attnkit.topk(bad if arg == "x" else x, 2, **kwargs)


def test_read_only_outputs_are_refused_and_untouched():
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    frozen = bytes(32)
    out_i = np.frombuffer(frozen, np.int64).reshape(2, 2)
    with pytest.raises(ValueError, match="out_indices is read-only"):
        attnkit.topk(x, 2, out_indices=out_i)
    assert frozen == bytes(32)


def test_indices_dtype_equal_to_out_indices_is_accepted():
    x = _x()
    for dtype in (np.int32, np.int64):
        out = np.full((B, K), -7, dtype)
        got = attnkit.topk(x, K, out_indices=out, indices_dtype=dtype)
        assert got.indices is out
        assert_same_result(got, topk_reference(x, K, indices_dtype=dtype), f"indices {dtype}")


@pytest.mark.parametrize("k", [2**31, 2**40, 2**62])
def test_huge_k_is_refused_before_allocating(k):
    with pytest.raises(ValueError, match=rf"k = {k} must be <= 2\^31 - 1"):
        attnkit.topk(np.zeros(10, np.float32), k)


# A k far beyond N pads every slot: outputs larger than the machine's memory are refused before
# they are allocated (an overcommitting OS would grant them and kill the process on the writes).
@pytest.mark.parametrize("make", [np.zeros, torch.zeros], ids=["numpy", "torch"])
def test_outputs_beyond_host_memory_are_refused(make, monkeypatch):
    monkeypatch.setattr(attnkit._arrays, "physical_memory", lambda: 10 << 20)
    x = make((2, 3), dtype=np.float32 if make is np.zeros else torch.float32)
    k = 1 << 20  # int64 indices and fp32 values: 2 x 2^20 x 12 bytes = 24 MiB
    want = r"k = 1048576 asks for outputs of shape \[2, 1048576\], 24.0 MiB, beyond .* 10.0 MiB"
    with pytest.raises(MemoryError, match=want):
        attnkit.topk(x, k)
    # int32 indices alone (8 MiB) fit; the padding is as for any k beyond N.
    values, indices = attnkit.topk(x, k, indices_dtype="int32", return_values=False)
    assert values is None and indices.shape == (2, k)
    assert (indices[:, 3:] == -1).all() and sorted(indices[0, :3].tolist()) == [0, 1, 2]
    # Caller buffers are not allocated, so they are not limited.
    out = make((2, k), dtype=np.int64 if make is np.zeros else torch.int64)
    attnkit.topk(x, k, out_indices=out, return_values=False)
    assert (out[:, 3:] == -1).all()


# Option values are matched by type as well as value: 1 is not True.
@pytest.mark.parametrize("arg,value", [("check", 1), ("sorted", 1), ("sorted", 0), ("check", 0)])
def test_ints_are_not_bool_choices(arg, value):
    with pytest.raises(ValueError, match=f"topk: {arg} = {value}; expected one of"):
        attnkit.topk(np.ones((1, 4), np.float32), 1, **{arg: value})


# An x topk refuses by rank or dtype is reported by name, before outputs sized from it are made.
def test_bad_x_is_named_before_outputs_are_allocated():
    with pytest.raises(ValueError, match=r"topk: x has 3 dimensions"):
        attnkit.topk(np.zeros((2**20, 2**20, 0), np.float32), 1)
    with pytest.raises(TypeError, match="topk: x.dtype = float64"):
        attnkit.topk(np.zeros((3, 4)), 2**31 - 1)


@pytest.mark.parametrize("requires_grad", [False, True])  # with grad: before the dispatcher
def test_sparse_torch_x_is_refused_by_name(requires_grad):
    with pytest.raises(TypeError, match="topk: x has layout torch.sparse_coo"):
        attnkit.topk(torch.eye(3).to_sparse().requires_grad_(requires_grad), 1)
    with pytest.raises(TypeError, match="topk: x has layout torch.sparse_csr"):
        attnkit.topk(torch.eye(3).to_sparse_csr().requires_grad_(requires_grad), 1)


def test_lists_are_refused_on_the_autograd_path_too():
    with pytest.raises(TypeError, match="topk: begin is a list"):
        attnkit.topk(torch.ones(2, 4, requires_grad=True), 1, begin=[0, 1])


def test_torch_outputs_with_the_negative_bit_are_refused_and_untouched():
    out_v = torch.zeros(1, 1)
    out_i = torch.full((1, 1), -5, dtype=torch.int64)
    with pytest.raises(ValueError, match="topk: out_values is a torch view with its negative"):
        attnkit.topk(torch.tensor([[1.0, 2.0]]), 1, out_values=torch._neg_view(out_v),
                     out_indices=out_i)
    assert out_v.item() == 0.0 and out_i.item() == -5


# Large outputs are allocated only after the inputs pass: a bad begin is named, not a MemoryError.
@pytest.mark.parametrize("arg", ["begin", "end", "index_offset"])
def test_bad_row_vector_is_named_before_large_outputs_are_allocated(arg):
    x = np.zeros((3, 10), np.float32)
    with pytest.raises(ValueError, match=f"{arg}"):
        attnkit.topk(x, 2**30, **{arg: np.zeros(2, np.int64)})


def test_dlpack_producer_whose_export_fails_is_named():
    # A producer with shape and dtype whose __dlpack__ raises (here: a torch tensor that
    # requires grad underneath) reaches the extension, which must say that the export failed.
    class Producer:
        def __init__(self, a):
            self.a = a
            self.shape, self.dtype = a.shape, a.dtype

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    with pytest.raises(TypeError, match=r"topk: x \(a Producer\) could not be read through "
                                        r"DLPack"):
        attnkit.topk(Producer(torch.randn(3, 10, requires_grad=True)), 2)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]  # null: nothing to free


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


class _HandMadeCapsule:
    """A producer with only __dlpack__, whose capsule describes a float32 [rows, cols] tensor
    over `buf` with the given element strides and, if `null`, no data pointer. The header may
    be broken on purpose: `ndim` other than 2, no shape (`null_shape`), a versioned capsule of
    DLPack `version` (major, minor) and `flags`, a capsule `name` of another kind, a
    `byte_offset`. The keyword arguments of each __dlpack__ call are kept in `calls`."""

    def __init__(self, buf, shape, strides, null=False, ndim=2, null_shape=False,
                 version=None, name=None, byte_offset=0, flags=0):
        self.buf, self.shape_, self.strides_, self.null = buf, shape, strides, null
        self.ndim, self.null_shape, self.version, self.name = ndim, null_shape, version, name
        self.byte_offset, self.flags = byte_offset, flags
        self.alive = []  # the structures the capsules point into
        self.calls = []

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        shape = (ctypes.c_int64 * 2)(*self.shape_)
        strides = (ctypes.c_int64 * 2)(*self.strides_)
        m = _DLManagedTensor() if self.version is None else _DLManagedTensorVersioned()
        if self.version is not None:
            m.major, m.minor, m.flags = *self.version, self.flags
        m.dl_tensor.byte_offset = self.byte_offset
        m.dl_tensor.data = None if self.null else self.buf.ctypes.data
        m.dl_tensor.device = _DLDevice(1, 0)  # kDLCPU
        m.dl_tensor.ndim = self.ndim
        m.dl_tensor.dtype = _DLDataType(2, 32, 1)  # kDLFloat, 32 bits
        m.dl_tensor.shape, m.dl_tensor.strides = (None if self.null_shape else shape), strides
        self.alive += [shape, strides, m]
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        name = self.name or (b"dltensor" if self.version is None else b"dltensor_versioned")
        return new(ctypes.addressof(m), name, None)

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.parametrize("arg", ["x", "end", "out_indices"])
@pytest.mark.parametrize("broken,why", [
    (dict(null_shape=True), r"its tensor has ndim = 2 and a null shape"),
    (dict(ndim=-1), r"its tensor has ndim = -1"),
    (dict(version=(2, 0)), r"its capsule is of DLPack version 2.0; attnkit reads version 1 "
                           r"and unversioned capsules"),
    (dict(name=b"used_dltensor"), r"its __dlpack__ returned a capsule named 'used_dltensor'")])
def test_dlpack_capsule_with_a_broken_header_is_refused_by_name(arg, broken, why):
    # Read before the import, which would trust them: never a crash, nothing written.
    buf = np.zeros(16, np.float32)
    bad = _HandMadeCapsule(buf, (2, 8), (8, 1), **broken)
    args = {"x": buf.reshape(2, 8), arg: bad}
    out = poisoned((2, 3), np.int64)
    if arg != "out_indices":
        args["out_indices"] = out
    with pytest.raises(TypeError, match=rf"topk: {arg} \(a _HandMadeCapsule\) could not be "
                                        rf"read through DLPack: {why}"):
        attnkit.topk(args.pop("x"), 3, **args)
    assert (out == poisoned((2, 3), np.int64)).all()


@pytest.mark.parametrize("arg", ["x", "end", "out_indices"])
def test_dlpack_capsule_of_more_dimensions_than_its_shape_holds_is_refused_by_name(arg):
    # ndim = 40 over a shape of two: refused as a shape, before the import reads it.
    buf = np.zeros(16, np.float32)
    args = {"x": buf.reshape(2, 8), arg: _HandMadeCapsule(buf, (2, 8), (8, 1), ndim=40)}
    out = poisoned((2, 3), np.int64)
    if arg != "out_indices":
        args["out_indices"] = out
    with pytest.raises(ValueError, match=rf"topk: {arg} has 40 dimensions; at most \d+ are"):
        attnkit.topk(args.pop("x"), 3, **args)
    assert (out == poisoned((2, 3), np.int64)).all()


@pytest.mark.parametrize("arg", ["x", "out_indices"])
def test_dlpack_null_data_with_a_byte_offset_is_refused_by_name(arg):
    # The import adds byte_offset to the null pointer, which no later null check would see.
    buf = np.zeros(16, np.float32)
    args = {"x": buf.reshape(2, 8),
            arg: _HandMadeCapsule(buf, (2, 8), (8, 1), null=True, byte_offset=4096)}
    with pytest.raises(ValueError, match=rf"topk: {arg} has 16 elements but a null data "
                                         rf"pointer$"):
        attnkit.topk(args.pop("x"), 3, **args)


def test_dlpack_output_is_asked_for_in_place_and_a_copy_is_refused():
    # An output is exported with copy=False; a producer that copies anyway (and says so in the
    # versioned flags) would take the results away with its copy.
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    buf = np.full(6, -7.0, np.float32)
    copying = _HandMadeCapsule(buf, (2, 3), (3, 1), version=(1, 0), flags=2)  # IS_COPIED
    with pytest.raises(TypeError, match=r"topk: out_values \(a _HandMadeCapsule\) could not "
                                        r"be read through DLPack: its export is a copy"):
        attnkit.topk(x, 3, out_values=copying)
    assert {"max_version": (1, 1), "copy": False} in copying.calls
    assert (buf == -7.0).all()
    in_place = _HandMadeCapsule(buf, (2, 3), (3, 1), version=(1, 0))
    got = attnkit.topk(x, 3, out_values=in_place, sorted="value")
    assert {"max_version": (1, 1), "copy": False} in in_place.calls
    np.testing.assert_array_equal(buf.reshape(2, 3), [[7, 6, 5], [15, 14, 13]])
    assert got.values is in_place


def test_versioned_dlpack_capsule_is_read():
    buf = np.arange(16, dtype=np.float32)
    got = attnkit.topk(_HandMadeCapsule(buf, (2, 8), (8, 1), version=(1, 0)), 2, sorted="value")
    assert_same_result(got, topk_reference(buf.reshape(2, 8), 2, sorted="value"), "versioned")


def test_bare_dlpack_producers_are_checked_as_other_inputs():
    # A producer with neither shape nor dtype: NumPy's import of it gives both, but its strides
    # and data pointer are checked by attnkit's own import, which NumPy's does not do (a byte
    # stride that overflows wraps to 0 there, and a null pointer gets fresh memory).
    buf = np.arange(16, dtype=np.float32)
    good = attnkit.topk(_HandMadeCapsule(buf, (2, 8), (8, 1)), 2, sorted="value")
    assert_same_result(good, topk_reference(buf.reshape(2, 8), 2, sorted="value"), "bare")
    with pytest.raises(ValueError, match=r"topk: x has shape \[2, 8\] and strides "
                                         r"\(4611686018427387904, 1\), whose byte span is 2\^62"):
        attnkit.topk(_HandMadeCapsule(buf, (2, 8), (2**62, 1)), 2)
    with pytest.raises(ValueError, match="topk: x has 16 elements but a null data pointer"):
        attnkit.topk(_HandMadeCapsule(buf, (2, 8), (8, 1), null=True), 2)
    with pytest.raises(ValueError, match=r"topk: x \(a _HandMadeCapsule\) exports shape "
                                         r"\[-1, 8\] through DLPack; dimensions must be >= 0"):
        attnkit.topk(_HandMadeCapsule(buf, (-1, 8), (8, 1)), 2)


class _Relay:
    """A DLPack producer of `a`'s capsules with `shape` and `dtype` of its own choosing, which
    need not be what it exports."""

    def __init__(self, a, shape=None, dtype=np.float32):
        self.a = a
        if shape is not None:
            self.shape, self.dtype = shape, np.dtype(dtype)

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("arg", ["x", "end", "out_indices"])
@pytest.mark.parametrize("ndim", [7, 12, 64])
def test_dlpack_export_of_more_dimensions_than_its_shape_says_is_named(arg, ndim):
    # The import's own rank is checked before its dimensions are copied, whatever .shape said.
    exported = np.zeros((1,) * (ndim - 1) + (N,), np.float32 if arg == "x" else np.int64)
    args = {"x": _x(), "out_indices": poisoned((B, K), np.int64)}
    args[arg] = _Relay(exported, shape={"x": (B, N), "end": (B,), "out_indices": (B, K)}[arg])
    x = args.pop("x")
    with pytest.raises(ValueError, match=rf"topk: {arg} has {ndim} dimensions; at most 6"):
        attnkit.topk(x, K, **args)
    if arg != "out_indices":
        assert (args["out_indices"] == poisoned((B, K), np.int64)).all()


@pytest.mark.parametrize("said", [(B + 1, N), (B, N + 2), (B * N,), "[B, N]"])
def test_dlpack_x_whose_shape_attribute_disagrees_with_its_export_is_named(said):
    # The outputs are sized by x's shape: an attribute that is not what the export holds is
    # refused by x's name, before anything is allocated or written.
    out = poisoned((B, K), np.int64)
    with pytest.raises(ValueError, match=r"topk: x \(a _Relay\) has shape .* but exports shape "
                                         rf"\[{B}, {N}\] through DLPack"):
        attnkit.topk(_Relay(_x(), shape=said), K)
    with pytest.raises(ValueError, match=r"topk: x \(a _Relay\) has shape"):
        attnkit.topk(_Relay(_x(), shape=said), K, out_indices=out)
    assert (out == poisoned((B, K), np.int64)).all()
    agreed = attnkit.topk(_Relay(_x(), shape=(B, N)), K, sorted="value")
    assert_same_result(agreed, topk_reference(_x(), K, sorted="value"), "shape agreed")


@pytest.mark.parametrize("said", [np.float16, ml_dtypes.bfloat16])
def test_dlpack_x_whose_dtype_attribute_disagrees_with_its_export_is_named(said):
    # The values are typed by x's dtype: an attribute that is not what the export holds is
    # refused by x's name, not found later as a mismatch of an out_values the caller never gave.
    with pytest.raises(TypeError, match=r"topk: x \(a _Relay\) has dtype .* but exports "
                                        r"float32 through DLPack; the two must agree"):
        attnkit.topk(_Relay(_x(), shape=(B, N), dtype=said), K)


@pytest.mark.parametrize("indices_dtype", [None, "int32", "int64"])
@pytest.mark.parametrize("arg, said", [("out_indices", {"dtype": np.int32}),
                                       ("out_indices", {"shape": (B, K + 1), "dtype": np.int64}),
                                       ("out_values", {"dtype": np.float16})])
def test_dlpack_buffer_whose_attributes_disagree_with_its_export_is_named(arg, said,
                                                                         indices_dtype):
    # A buffer is written as it exports itself: attributes that say otherwise are refused by
    # the buffer's name, whatever indices_dtype says, and nothing is written.
    buffers = {"out_indices": poisoned((B, K), np.int64),
               "out_values": poisoned((B, K), np.float32)}
    args = {name: _Relay(buf, shape=(B, K), dtype=buf.dtype) for name, buf in buffers.items()}
    args[arg] = _Relay(buffers[arg], **{"shape": (B, K), **said})
    error = TypeError if "shape" not in said else ValueError
    what = "dtype" if error is TypeError else "shape"
    with pytest.raises(error, match=rf"topk: {arg} \(a _Relay\) has {what} .* but exports "):
        attnkit.topk(_x(), K, indices_dtype=indices_dtype, **args)
    assert (buffers["out_indices"] == poisoned((B, K), np.int64)).all()
    poison = poisoned((B, K), np.float32).view(np.uint32)
    assert (buffers["out_values"].view(np.uint32) == poison).all()
    # The same buffers with truthful attributes are written.
    args = {name: _Relay(buf, shape=(B, K), dtype=buf.dtype) for name, buf in buffers.items()}
    attnkit.topk(_x(), K, indices_dtype="int64" if indices_dtype else None, sorted="value",
                 **args)
    assert_same_result((buffers["out_values"], buffers["out_indices"]),
                       topk_reference(_x(), K, sorted="value"), "truthful buffers")


@pytest.mark.parametrize("arg", ["x", "end", "out_indices"])
@pytest.mark.parametrize("said", [5, "[B, N]", (B, N, 1)])
def test_dlpack_argument_whose_shape_attribute_is_not_its_export_is_named(arg, said):
    # Whatever a shape attribute holds (a number, a string, another shape), the argument is
    # refused by its name beside its export's shape, and nothing is written; a truthful
    # attribute is read.
    def call(shape, exported):
        args = dict(exported)
        args[arg] = _Relay(exported[arg], shape=shape or exported[arg].shape,
                           dtype=exported[arg].dtype)
        return attnkit.topk(args.pop("x"), K, sorted="index", **args)

    arrays = {"x": _x(), "end": np.full(B, N, np.int64), "out_indices": poisoned((B, K), np.int64)}
    shape = {"x": (B, N), "end": (B,), "out_indices": (B, K)}[arg]
    with pytest.raises(ValueError, match=rf"topk: {arg} \(a _Relay\) has shape .* but exports "
                                         rf"shape \[{', '.join(map(str, shape))}\] through"):
        call(said, arrays)
    assert (arrays["out_indices"] == poisoned((B, K), np.int64)).all()
    got = call(None, arrays)
    assert_same_result((got.values, arrays["out_indices"]),
                       topk_reference(_x(), K, sorted="index"), f"truthful {arg}")


def test_bare_dlpack_producer_of_bfloat16_is_read():
    # NumPy cannot import bfloat16 through DLPack; the result comes back as NumPy arrays.
    x = torch.from_numpy(_x()).bfloat16()
    values, indices = attnkit.topk(_Relay(x), K, sorted="value")
    want = topk_reference(x.float().numpy().astype(ml_dtypes.bfloat16), K, sorted="value")
    assert isinstance(values, np.ndarray) and values.dtype == ml_dtypes.bfloat16
    assert_same_result((values, indices), want, "bare bfloat16 producer")


class _NoCapsule:
    """A DLPack producer whose __dlpack__ returns something that is not a capsule."""

    def __init__(self, shape=None):
        if shape is not None:
            self.shape, self.dtype = shape, np.dtype(np.float32)

    def __dlpack__(self, **kwargs):
        return 42

    def __dlpack_device__(self):
        return (1, 0)


class _ExportRaises(_NoCapsule):
    """A DLPack producer whose __dlpack__ raises, as torch's does for a tensor that requires
    grad."""

    def __dlpack__(self, **kwargs):
        raise RuntimeError("this producer cannot export now")


@pytest.mark.parametrize("producer,reason", [
    (_NoCapsule, r": its __dlpack__ returned int, not a DLPack capsule"),
    (_ExportRaises, r": its __dlpack__ raised \(this producer cannot export now\)")])
@pytest.mark.parametrize("arg", ["x", "end", "out_indices"])
@pytest.mark.parametrize("with_shape", [False, True])
def test_dlpack_producer_that_exports_no_capsule_is_named(producer, reason, arg, with_shape):
    # Without shape and dtype the producer is imported in Python, with them in the extension;
    # a producer whose export raised is named with its own reason.
    bad = producer({"x": (B, N), "end": (B,), "out_indices": (B, K)}[arg] if with_shape
                   else None)
    args = {"x": _x(), arg: bad}
    out = poisoned((B, K), np.int64)
    if arg != "out_indices":
        args["out_indices"] = out
    x = args.pop("x")
    with pytest.raises(TypeError, match=rf"topk: {arg} \(a {producer.__name__}\) could not be "
                                        rf"read through DLPack{reason}"):
        attnkit.topk(x, K, **args)
    assert (out == poisoned((B, K), np.int64)).all()


def test_a_non_array_is_named_with_its_article():
    with pytest.raises(TypeError, match="topk: begin is an int; expected a NumPy array"):
        attnkit.topk(np.ones((2, 4), np.float32), 1, begin=3)


def test_a_loaded_bfloat16_npy_gets_a_hint(tmp_path):
    # np.save writes ml_dtypes' bfloat16 as 2-byte void records, which np.load returns.
    import ml_dtypes  # a dependency of attnkit itself
    path = tmp_path / "scores.npy"
    np.save(path, np.ones((2, 8), ml_dtypes.bfloat16))
    loaded = np.load(path)
    assert loaded.dtype.kind == "V"
    with pytest.raises(TypeError, match=r"x.dtype = \|V2 is no dtype of attnkit's; expected "
                                        r"float32, bfloat16 or float16 \(a bfloat16 array "
                                        r".*x.view\(ml_dtypes.bfloat16\)"):
        attnkit.topk(loaded, 2)
    assert attnkit.topk(loaded.view(ml_dtypes.bfloat16), 2).indices.tolist() == [[0, 1]] * 2


@pytest.mark.parametrize("arg", ["largest", "return_values"])
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_bool_options_take_bools_only(arg, value):
    message = rf"topk: {arg} = {re.escape(repr(value))}; expected a bool"
    with pytest.raises(TypeError, match=message):
        attnkit.topk(np.ones((1, 4), np.float32), 1, **{arg: value})


@pytest.mark.parametrize("value", ["1.0", b"1", True, 1j, [1.0], np.array([1.0, 2.0]),
                                   np.array(True), np.array(1j), np.array([1.5]),
                                   np.timedelta64(3), np.timedelta64(3, "s"),
                                   np.timedelta64("NaT"), np.datetime64(3, "s"),
                                   np.array(np.timedelta64(5, "ms"))])
def test_value_fill_takes_real_numbers_only(value):
    with pytest.raises(TypeError, match=r"topk: value_fill = .*; expected a real number"):
        attnkit.topk(np.ones((1, 4), np.float32), 1, value_fill=value)


def test_out_values_with_return_values_false_is_refused():
    out = np.full((1, 1), 7.0, np.float32)
    with pytest.raises(ValueError, match="topk: out_values is given but return_values = False; "
                       "values are written only when returned"):
        attnkit.topk(np.ones((1, 4), np.float32), 1, out_values=out, return_values=False)
    assert out.item() == 7.0


# NumPy arrays in the other byte order are refused by name, before their dtype is looked at (so
# a swapped float64 x is named for its byte order too), as inputs and as caller buffers.
@pytest.mark.parametrize("arg,dtype", [("x", "f4"), ("x", "f8"), ("begin", "i4"),
                                       ("out_indices", "i8"), ("out_values", "f4")])
def test_arrays_in_the_other_byte_order_are_refused_by_name(arg, dtype):
    swapped = np.dtype(dtype).newbyteorder("S")
    kwargs = {}
    x = np.ones((1, 4), np.float32)
    if arg == "x":
        x = x.astype(swapped)
    elif arg == "begin":
        kwargs["begin"] = np.zeros(1, swapped)
    else:
        kwargs[arg] = np.zeros((1, 1), swapped)
    with pytest.raises(TypeError, match=rf"topk: {arg}.dtype = {re.escape(swapped.str)} is not "
                                        r"in this machine's byte order"):
        attnkit.topk(x, 1, **kwargs)


def test_subclasses_of_ndarray_are_read_as_arrays():
    class Sub(np.ndarray):
        pass

    x = _x()
    end = np.array([N, 5, 1, 0], np.int64)
    want = topk_reference(x, K, end=end, sorted="value")
    got = attnkit.topk(x.view(Sub), K, end=end.view(Sub), sorted="value")
    assert_same_result(got, want, "ndarray subclass")
    out_v, out_i = poisoned((B, K), np.float32).view(Sub), poisoned((B, K), np.int64).view(Sub)
    got = attnkit.topk(x.view(Sub), K, end=end, sorted="value", out_values=out_v,
                       out_indices=out_i)
    assert got.values is out_v and got.indices is out_i
    assert_same_result((np.asarray(out_v), np.asarray(out_i)), want, "ndarray subclass buffers")


@pytest.mark.parametrize("lie", ["more_dims", "more_columns", "dtype"])
def test_subclasses_whose_attributes_misstate_their_memory_are_read_as_stored(lie):
    # A subclass overriding shape or dtype is read as its memory is laid out (a base-class
    # view): the result of the plain array, or a clear error; never a read past the memory.
    stated = {"more_dims": (B, N, 1), "more_columns": (B, 200000)}

    class Numpy(np.ndarray):
        @property
        def shape(self):
            return stated[lie] if lie in stated else np.ndarray.shape.__get__(self)

        @property
        def dtype(self):
            return np.dtype(np.float16) if lie == "dtype" else np.ndarray.dtype.__get__(self)

    class Torch(torch.Tensor):
        @property
        def shape(self):
            return torch.Size(stated[lie]) if lie in stated else super().shape

        @property
        def dtype(self):
            return torch.float16 if lie == "dtype" else super().dtype

    x = _x()
    want = topk_reference(x, K, sorted="value")
    got = attnkit.topk(x.view(Numpy), K, sorted="value")
    assert_same_result((np.asarray(got.values), np.asarray(got.indices)), want, f"numpy {lie}")
    got = attnkit.topk(torch.from_numpy(x).as_subclass(Torch), K, sorted="value")
    assert_same_result((got.values.as_subclass(torch.Tensor).numpy(),
                        got.indices.as_subclass(torch.Tensor).numpy()), want, f"torch {lie}")


def test_dlpack_producers_with_a_broken_device_are_named():
    a = np.zeros((2, 8), np.float32)

    class NoDevice:
        def __dlpack__(self, **kwargs):
            return a.__dlpack__(**kwargs)

    class BadDevice(NoDevice):
        def __dlpack_device__(self):
            return "cpu"

    with pytest.raises(TypeError, match=r"topk: x \(a NoDevice\) has __dlpack__ but no "
                                        r"__dlpack_device__"):
        attnkit.topk(NoDevice(), 2)
    class RaisingDevice(NoDevice):
        def __dlpack_device__(self):
            raise RuntimeError("device lookup failed")

    with pytest.raises(TypeError, match=r"topk: end.__dlpack_device__\(\) \(a BadDevice\) "
                                        r"returned 'cpu'; expected a \(device_type, device_id\)"):
        attnkit.topk(a, 2, end=BadDevice())
    with pytest.raises(TypeError, match=r"topk: x.__dlpack_device__\(\) \(a RaisingDevice\) "
                                        r"raised \(device lookup failed\)"):
        attnkit.topk(RaisingDevice(), 2)


class _StandInJaxArray(_Relay):
    """A JAX array as attnkit sees one: a DLPack producer whose type lives in the jax package."""

    __module__ = "jax._src.array"


@pytest.fixture
def stand_in_jax(monkeypatch):
    """jax and jax.numpy as far as attnkit uses them: jax_enable_x64 (off unless set), and
    jax.numpy.asarray, which narrows int64 to int32 while it is off, as JAX does."""
    import types

    state = {"x64": False}
    jax = types.ModuleType("jax")
    jax.config = types.SimpleNamespace(read=lambda name: state["x64"])
    jnp = types.ModuleType("jax.numpy")
    jnp.asarray = lambda r: (r.astype(np.int32) if r.dtype == np.int64 and not state["x64"]
                             else r)
    jax.numpy = jnp
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax.numpy", jnp)
    return state


def test_jax_indices_are_int32_unless_jax_holds_int64(stand_in_jax):
    # Without jax_enable_x64 jax.numpy would narrow int64 indices silently (an offset of 2^40
    # wrapped to 7): they are int32 by default there, checked as such, and int64 is refused.
    x = _StandInJaxArray(np.arange(20, dtype=np.float32).reshape(2, 10))
    got = attnkit.topk(x, 3, index_offset=np.array([2**20, 5]), sorted="index").indices
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [[2**20 + 7, 2**20 + 8, 2**20 + 9], [12, 13, 14]])
    with pytest.raises(ValueError, match=r"index_offset\[0\] = 1099511627776 moves indices"):
        attnkit.topk(x, 3, index_offset=np.array([2**40, 5]))
    with pytest.raises(ValueError, match=r"topk: indices_dtype = int64, but x is a JAX array "
                                         r"and jax_enable_x64 is off"):
        attnkit.topk(x, 3, indices_dtype="int64")
    stand_in_jax["x64"] = True
    got = attnkit.topk(x, 3, index_offset=np.array([2**40, 5]), sorted="index").indices
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [[2**40 + 7, 2**40 + 8, 2**40 + 9], [12, 13, 14]])


@pytest.mark.parametrize("arg", ["out_values", "out_indices"])
def test_jax_arrays_are_refused_as_outputs(stand_in_jax, arg):
    # JAX arrays are immutable, and their export does not say so: refused by kind, untouched.
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    buf = np.full((2, 3), -7, np.float32 if arg == "out_values" else np.int32)
    with pytest.raises(ValueError, match=rf"topk: {arg} is a JAX array, which is immutable"):
        attnkit.topk(x, 3, **{arg: _StandInJaxArray(buf)})
    assert (buf == -7).all()


class DynamicJaxprTracer:
    """A value inside jax.jit as attnkit sees one: a DLPack method on the class, no device."""

    __module__ = "jax._src.interpreters.partial_eval"

    def __dlpack__(self, **kwargs):
        raise RuntimeError("a tracer has no buffer")


@pytest.mark.parametrize("arg", ["x", "begin", "end", "index_offset", "out_values",
                                 "out_indices"])
def test_jax_tracers_are_refused_by_name(arg):
    # Before any other check reads them as arrays (inside jax.jit a value has no data yet).
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    args = {"x": DynamicJaxprTracer()} if arg == "x" else {"x": x, arg: DynamicJaxprTracer()}
    with pytest.raises(TypeError, match=rf"topk: {arg} is a JAX tracer \(DynamicJaxprTracer\): "
                                        r"inside jax.jit"):
        attnkit.topk(k=2, **args)


class _RaisingAttributes(_Relay):
    """A producer whose shape and dtype properties raise: read through its export alone."""

    @property
    def shape(self):
        raise RuntimeError("shape is not available")

    @property
    def dtype(self):
        raise RuntimeError("dtype is not available")


def test_dlpack_producer_whose_attributes_raise_is_read_through_its_export():
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    want = topk_reference(x, 2, end=np.array([3, 10]))
    end = _RaisingAttributes(np.array([3, 10], np.int64))
    assert_same_result(attnkit.topk(_RaisingAttributes(x), 2, end=end), want, "x and end")
    values, indices = np.zeros((2, 2), np.float32), np.zeros((2, 2), np.int64)
    attnkit.topk(x, 2, end=np.array([3, 10]), out_values=_RaisingAttributes(values),
                 out_indices=_RaisingAttributes(indices))
    assert_same_result((values, indices), want, "outputs")


class _UnversionedOnly(_Relay):
    """A producer that refuses versioned capsules (and so copy=False) with BufferError."""

    def __dlpack__(self, max_version=None, **kwargs):
        if max_version is not None:
            raise BufferError("only unversioned capsules")
        return self.a.__dlpack__()


def test_dlpack_outputs_of_a_producer_without_versioned_capsules_are_written():
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    values, indices = np.zeros((2, 3), np.float32), np.zeros((2, 3), np.int64)
    attnkit.topk(x, 3, out_values=_UnversionedOnly(values), out_indices=_UnversionedOnly(indices))
    assert_same_result((values, indices), topk_reference(x, 3), "unversioned outputs")
