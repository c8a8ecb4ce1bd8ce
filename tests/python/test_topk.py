# SPDX-License-Identifier: Apache-2.0
"""attnkit.topk on NumPy arrays (CPU): behaviour checked exactly against tests/python/reference.py.

Indices are compared for equality and values bit for bit; padding is exact. Every case is
generated from its id (dtype, distribution, sizes, options, seed)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import attnkit
from conftest import (DISTRIBUTIONS, DTYPES, POISON_INDEX, assert_same_result, bits,
                      check_topk, describe, dtype_of, make_rows, poisoned, ragged_ranges, rng_for)
from reference import selection_is_valid, topk_reference

SORTED_MODES = ("none", "index", "value", True, False)


def k_values(n: int) -> list:
    """k in {0, 1, mid, n, > n} for a row length n (deduplicated, in order)."""
    out = []
    for k in (0, 1, max(1, n // 3), n, n + 1, 2 * n + 3):
        if k not in out:
            out.append(k)
    return out


# ---------------------------------------------------------------------------------------------
# Documented examples (hand-written expectations, independent of the reference)
# ---------------------------------------------------------------------------------------------


def test_docstring_example():
    x = np.array([[0.5, 3.0, -1.0, 3.0, 2.0]], dtype=np.float32)
    values, indices = attnkit.topk(x, 3, sorted="value")
    assert values.tolist() == [[3.0, 3.0, 2.0]]
    assert indices.tolist() == [[1, 3, 4]]
    assert indices.dtype == np.int64 and values.dtype == np.float32


def test_nan_ranks_above_inf_both_directions():
    x = np.array([[1.0, np.nan, np.inf, -np.inf, 0.0]], dtype=np.float32)
    v, i = attnkit.topk(x, 2, sorted="value")
    assert i.tolist() == [[1, 2]]
    v, i = attnkit.topk(x, 5, sorted="value", largest=False)
    assert i.tolist() == [[3, 4, 0, 2, 1]], "NaN is the last choice when largest=False"
    v, i = attnkit.topk(x, 5, sorted="value", nan="ignore")
    assert i.tolist() == [[2, 0, 4, 3, -1]]
    assert np.isneginf(v[0, 4])


def test_signed_zeros_tie_and_keep_their_bits():
    x = np.array([[-0.0, 0.0, -0.0, -1.0]], dtype=np.float32)
    v, i = attnkit.topk(x, 2, sorted="value")
    assert i.tolist() == [[0, 1]], "-0.0 == +0.0, so the lower column wins"
    assert v.view(np.uint32).tolist() == [[0x80000000, 0x00000000]]


def test_padding_comes_last_with_default_fills():
    x = np.array([[2.0, 1.0]], dtype=np.float32)
    v, i = attnkit.topk(x, 4, sorted="value")
    assert i.tolist() == [[0, 1, -1, -1]]
    assert v.tolist() == [[2.0, 1.0, -np.inf, -np.inf]]
    v, i = attnkit.topk(x, 4, sorted="value", largest=False)
    assert i.tolist() == [[1, 0, -1, -1]]
    assert v.tolist() == [[1.0, 2.0, np.inf, np.inf]]


def test_index_offset_not_added_to_padding():
    x = np.array([[2.0, 1.0, 3.0]], dtype=np.float32)
    v, i = attnkit.topk(x, 4, sorted="index", end=np.array([2], np.int32),
                        index_offset=np.array([100], np.int64), index_fill=-9)
    assert i.tolist() == [[100, 101, -9, -9]]


# ---------------------------------------------------------------------------------------------
# Distributions x options: exact against the reference, and backend="reference" identical
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sorted_mode", SORTED_MODES, ids=lambda s: f"sorted={s!r}")
@pytest.mark.parametrize("nan", ("largest", "ignore"), ids=lambda s: f"nan={s}")
@pytest.mark.parametrize("largest", (True, False), ids=lambda b: f"largest={b}")
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_distributions(dtype, dist, largest, nan, sorted_mode):
    rng = rng_for("dist", dtype, dist, largest, nan, sorted_mode)
    rows = 7
    cols = int(rng.choice([37, 100, 129, 225]))
    x = make_rows(dist, (rows, cols), dtype, rng)
    range_kind = ("full", "ragged", "suffix", "causal")[int(rng.integers(4))]
    index_dtype = (np.int32, np.int64)[int(rng.integers(2))]
    begin, end = ragged_ranges(rng, rows, cols, range_kind, index_dtype)
    for k in k_values(cols):
        for backend in ("auto", "reference"):
            opts = dict(largest=largest, nan=nan, sorted=sorted_mode, begin=begin, end=end)
            ctx = describe(dtype=dtype, dist=dist, cols=cols, k=k, backend=backend,
                           ranges=range_kind, largest=largest, nan=nan, sorted=sorted_mode)
            check_topk(x, k, ctx, backend=backend, **opts)


@pytest.mark.parametrize("sorted_mode", ("none", "index", "value"), ids=lambda s: f"sorted={s}")
@pytest.mark.parametrize("largest", (True, False), ids=lambda b: f"largest={b}")
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_any_gives_a_valid_deterministic_selection(dtype, dist, largest, sorted_mode):
    rng = rng_for("ties_any", dtype, dist, largest, sorted_mode)
    rows, cols = 5, int(rng.choice([50, 127, 300]))
    x = make_rows(dist, (rows, cols), dtype, rng)
    begin, end = ragged_ranges(rng, rows, cols, "ragged", np.int64)
    nan = "ignore" if dist == "nan" and largest else "largest"
    for k in k_values(cols):
        ctx = describe(dtype=dtype, dist=dist, cols=cols, k=k, largest=largest,
                       sorted=sorted_mode, nan=nan)
        v1, i1 = attnkit.topk(x, k, largest=largest, sorted=sorted_mode, begin=begin, end=end,
                              nan=nan, ties="any")
        reason = selection_is_valid(x, k, v1, i1, largest=largest, sorted=sorted_mode,
                                    begin=begin, end=end, nan=nan)
        assert reason is None, f"{ctx}: {reason}"
        v2, i2 = attnkit.topk(x, k, largest=largest, sorted=sorted_mode, begin=begin, end=end,
                              nan=nan, ties="any")
        assert_same_result((v2, i2), (v1, i1), f"{ctx}: second run")


@pytest.mark.parametrize("sorted_mode", ("none", "index", "value"), ids=lambda s: f"sorted={s}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_sorted_bool_aliases(dtype, sorted_mode):
    rng = rng_for("alias", dtype, sorted_mode)
    x = make_rows("ties4", (4, 60), dtype, rng)
    alias = {"none": False, "value": True}.get(sorted_mode)
    if alias is None:
        alias = "index"
    a = attnkit.topk(x, 13, sorted=sorted_mode)
    b = attnkit.topk(x, 13, sorted=alias)
    assert_same_result(a, b, describe(dtype=dtype, sorted=sorted_mode, alias=alias))


# ---------------------------------------------------------------------------------------------
# Sizes: B in {0, 1, 3, 1000}; N in {0, 1, 3, 2^k - 31, ...}; k in {0, 1, mid, N, > N}
# ---------------------------------------------------------------------------------------------


SIZES = [(1, 1), (1, 3), (3, 1), (3, 97), (1, 225), (3, 993), (2, 4065), (1000, 1), (1000, 3),
         (1000, 97), (1000, 225), (0, 5), (4, 0), (0, 0)]


@pytest.mark.parametrize("largest", (True, False), ids=lambda b: f"largest={b}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", SIZES, ids=[f"B={b}-N={n}" for b, n in SIZES])
def test_sizes(rows, cols, dtype, largest):
    rng = rng_for("sizes", rows, cols, dtype, largest)
    x = make_rows("normal@1", (rows, cols), dtype, rng)
    for k in k_values(cols) + [cols + 1000]:
        for sorted_mode in ("index", "value"):
            got = check_topk(x, k, largest=largest, sorted=sorted_mode,
                             context=describe(B=rows, N=cols, dtype=dtype, k=k, largest=largest,
                                              sorted=sorted_mode))
            assert got[1].shape == (rows, k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [0, 1, 5, 993], ids=lambda n: f"N={n}")
def test_one_dimensional_x(dtype, cols):
    rng = rng_for("1d", dtype, cols)
    x = make_rows("ties4", (cols,), dtype, rng)
    for k in k_values(cols):
        v, i = check_topk(x, k, sorted="value", context=describe(dtype=dtype, N=cols, k=k))
        assert v.shape == (k,) and i.shape == (k,)


# ---------------------------------------------------------------------------------------------
# Long rows: the fast path's sampled starting threshold, and rows cut into segments
# ---------------------------------------------------------------------------------------------


def spiky_rows(rows: int, cols: int, dtype: str, rng) -> np.ndarray:
    """Small values with large spikes on an evenly spaced lattice (about 1/64 of the row):
    an evenly spaced sample of such a row sees mostly spikes, so a threshold estimated from it
    is far too high for k larger than the number of spikes (256..2048, cpu_floor_samples)."""
    x = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float64)
    size = min(max(cols // 64, 256), 2048)
    pos = (2 * np.arange(size) + 1) * cols // (2 * size)
    x[:, pos] = 100.0 + rng.random(size)
    return x.astype(dtype_of(dtype))


LONG_CASES = [(3, 20000), (1, 40000), (1, 70001), (2, 131071)]
LONG_DISTS = ("normal@1", "ties4", "all_equal", "ascending", "descending", "nan", "inf",
              "denormal", "spiky")


@pytest.mark.parametrize("dist", LONG_DISTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", LONG_CASES, ids=[f"B={b}-N={n}" for b, n in LONG_CASES])
def test_long_rows(rows, cols, dtype, dist):
    rng = rng_for("long", rows, cols, dtype, dist)
    if dist == "spiky":
        x = spiky_rows(rows, cols, dtype, rng)
    else:
        x = make_rows(dist, (rows, cols), dtype, rng)
    cases = [(1, True, "value"), (50, False, "index"), (1024, True, "none"),
             (1500, False, "value")]
    if cols >= 48000:
        cases.append((3000, True, "value"))
    for k, largest, sorted_mode in cases:
        check_topk(x, k, largest=largest, sorted=sorted_mode,
                   context=describe(B=rows, N=cols, dtype=dtype, dist=dist, k=k,
                                    largest=largest, sorted=sorted_mode))


@pytest.mark.parametrize("fill", ["nan", "+inf", "-inf"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_rows_mostly_at_the_best_score(dtype, fill):
    # Rows whose k-th best is the best score there is (NaN's, or an infinity's): nothing after
    # the first k such columns can enter, and only a NaN beats an infinity. One NaN planted in
    # the last column of each row tests that the scan still looks for it.
    rng = rng_for("best_score", dtype, fill)
    rows, cols = 3, 70001
    x = make_rows("normal@1", (rows, cols), dtype, rng)
    mask = rng.random((rows, cols)) < 0.6
    x[mask] = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf}[fill]
    planted = x.copy()
    planted[:, -1] = np.nan
    for a in (x, planted):
        for k in (1, 50, 2048):
            for largest in (True, False):
                for nan in ("largest", "ignore"):
                    check_topk(a, k, largest=largest, nan=nan, sorted="index",
                               context=describe(dtype=dtype, fill=fill, k=k, largest=largest,
                                                nan=nan, planted=a is planted))


@pytest.mark.parametrize("dtype", DTYPES)
def test_long_rows_with_ranges_and_nan_ignore(dtype):
    rng = rng_for("long_ranges", dtype)
    rows, cols = 4, 50000
    x = make_rows("nan", (rows, cols), dtype, rng)
    begin = np.array([0, 17, 25000, 3], np.int64)
    end = np.array([cols, 40001, 25000, 20003], np.int32)
    for k in (1, 200, 2048):
        for nan in ("largest", "ignore"):
            check_topk(x, k, sorted="value", begin=begin, end=end, nan=nan,
                       context=describe(dtype=dtype, k=k, nan=nan))


# ---------------------------------------------------------------------------------------------
# Layouts of x: strided, reversed, broadcast rows, unaligned base pointers
# ---------------------------------------------------------------------------------------------


def x_view(layout: str, rows: int, cols: int, dtype: str, rng) -> np.ndarray:
    """A view of `layout` with shape [rows, cols] into a larger, differently shaped buffer."""
    if layout == "contiguous":
        return make_rows("ties4", (rows, cols), dtype, rng)
    if layout == "slice_of_wider":  # x = wide[:, 2:2+N]: row stride N+9, offset 2
        wide = make_rows("ties4", (rows, cols + 9), dtype, rng)
        return wide[:, 2:2 + cols]
    if layout == "view_of_wider":  # x = wide[:, ::1][:, :N]
        wide = make_rows("ties4", (rows, cols + 64), dtype, rng)
        return wide[:, ::1][:, :cols]
    if layout.startswith("unaligned+"):  # x = wide[:, off:], base off elements past alignment
        off = int(layout.split("+")[1])
        wide = make_rows("ties4", (rows, cols + off), dtype, rng)
        return wide[:, off:]
    if layout == "every_other_row":
        return make_rows("ties4", (2 * rows, cols), dtype, rng)[::2]
    if layout == "reversed_rows":  # negative row stride
        return make_rows("ties4", (rows, cols), dtype, rng)[::-1]
    if layout == "broadcast_row":  # row stride 0
        return np.broadcast_to(make_rows("ties4", (cols,), dtype, rng), (rows, cols))
    raise ValueError(layout)


LAYOUTS = ("contiguous", "slice_of_wider", "view_of_wider", "unaligned+1", "unaligned+3",
           "unaligned+7", "every_other_row", "reversed_rows", "broadcast_row")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [13, 300, 20000], ids=lambda n: f"N={n}")
def test_x_layouts(layout, dtype, cols):
    rng = rng_for("layout", layout, dtype, cols)
    rows = 5
    x = x_view(layout, rows, cols, dtype, rng)
    assert x.shape == (rows, cols)
    begin, end = ragged_ranges(rng, rows, cols, "ragged", np.int32)
    for k in (1, 7, cols + 2):
        for sorted_mode in ("none", "value"):
            ctx = describe(layout=layout, dtype=dtype, cols=cols, k=k, sorted=sorted_mode)
            got = check_topk(x, k, ctx, sorted=sorted_mode, begin=begin, end=end)
            # The same as the contiguous copy, too.
            again = attnkit.topk(np.ascontiguousarray(x), k, sorted=sorted_mode, begin=begin,
                                 end=end)
            assert_same_result(got, again, ctx + " vs contiguous copy")


def test_x_is_not_modified():
    rng = rng_for("x_unchanged")
    x = make_rows("nan", (9, 333), "float32", rng)
    before = x.copy()
    attnkit.topk(x, 50, sorted="value")
    attnkit.topk(x, 400, largest=False, nan="ignore")
    assert np.array_equal(bits(x), bits(before))


# ---------------------------------------------------------------------------------------------
# Caller buffers: poisoned, strided, unaligned; every slot overwritten; returned zero-copy
# ---------------------------------------------------------------------------------------------


def out_buffer(layout: str, rows: int, k: int, dtype, rng) -> np.ndarray:
    """A poisoned caller buffer of shape [rows, k] in `layout`."""
    if layout == "contiguous":
        return poisoned((rows, k), dtype)
    if layout == "slice_of_wider":
        return poisoned((rows, k + 5), dtype)[:, 3:3 + k]
    if layout == "reversed_rows":
        return poisoned((rows, k), dtype)[::-1]
    if layout == "every_third_row":
        return poisoned((3 * rows, k), dtype)[1::3]
    raise ValueError(layout)


@pytest.mark.parametrize("out_layout", ("contiguous", "slice_of_wider", "reversed_rows",
                                        "every_third_row"))
@pytest.mark.parametrize("indices_dtype", ("int32", "int64"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 10, 40, 95], ids=lambda k: f"k={k}")
def test_poisoned_caller_buffers(out_layout, indices_dtype, dtype, k):
    rng = rng_for("poison", out_layout, indices_dtype, dtype, k)
    rows, cols = 6, 41
    x = make_rows("nan", (rows, cols), dtype, rng)
    begin, end = ragged_ranges(rng, rows, cols, "ragged", np.int64)
    offset = rng.integers(-50, 50, size=rows).astype(np.int32)
    ov = out_buffer(out_layout, rows, k, dtype_of(dtype), rng)
    oi = out_buffer(out_layout, rows, k, np.dtype(indices_dtype), rng)
    for sorted_mode in ("none", "value"):
        ov[...] = poisoned(ov.shape, ov.dtype)
        oi[...] = poisoned(oi.shape, oi.dtype)
        ctx = describe(out_layout=out_layout, indices_dtype=indices_dtype, dtype=dtype, k=k,
                       sorted=sorted_mode)
        v, i = attnkit.topk(x, k, sorted=sorted_mode, begin=begin, end=end, index_offset=offset,
                            out_values=ov, out_indices=oi, index_fill=-3, value_fill=0.5)
        assert v is ov and i is oi, f"{ctx}: caller buffers are returned as given"
        want = topk_reference(x, k, sorted=sorted_mode, begin=begin, end=end,
                              index_offset=offset, index_fill=-3, value_fill=0.5,
                              indices_dtype=indices_dtype)
        assert not np.any(i == POISON_INDEX), f"{ctx}: an index slot was not written"
        assert_same_result((v, i), want, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_only_out_indices_given(dtype):
    rng = rng_for("only_out_indices", dtype)
    x = make_rows("normal@1", (4, 30), dtype, rng)
    oi = poisoned((4, 35), np.int32)
    v, i = attnkit.topk(x, 35, sorted="value", out_indices=oi)
    assert i is oi
    assert_same_result((v, i), topk_reference(x, 35, sorted="value", indices_dtype=np.int32),
                       describe(dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_return_values_false(dtype):
    rng = rng_for("no_values", dtype)
    x = make_rows("ties4", (5, 64), dtype, rng)
    v, i = attnkit.topk(x, 9, return_values=False, sorted="value")
    assert v is None
    assert np.array_equal(i, topk_reference(x, 9, sorted="value")[1])
    oi = poisoned((5, 70), np.int64)
    v, i = attnkit.topk(x, 70, return_values=False, out_indices=oi)
    assert v is None and i is oi
    assert np.array_equal(oi, topk_reference(x, 70)[1])


# ---------------------------------------------------------------------------------------------
# begin / end / index_offset / fills / indices dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ("ragged", "empty", "causal", "suffix", "begin_only",
                                  "end_only", "strided"))
@pytest.mark.parametrize("begin_dtype,end_dtype",
                         [(np.int32, np.int32), (np.int64, np.int64), (np.int32, np.int64),
                          (np.int64, np.int32)],
                         ids=["i32-i32", "i64-i64", "i32-i64", "i64-i32"])
@pytest.mark.parametrize("seed", [0, 1])
def test_begin_end(kind, begin_dtype, end_dtype, seed):
    rng = rng_for("begin_end", kind, begin_dtype, end_dtype, seed)
    rows, cols = 33, 150
    x = make_rows("normal@1", (rows, cols), "bfloat16", rng)
    base = {"begin_only": "suffix", "end_only": "causal", "strided": "ragged"}.get(kind, kind)
    begin, end = ragged_ranges(rng, rows, cols, base, np.int64)
    begin, end = begin.astype(begin_dtype), end.astype(end_dtype)
    if kind == "begin_only":
        end = None
    if kind == "end_only":
        begin = None
    if kind == "strided":  # begin/end as strided views (stride 2 and -1)
        begin = np.repeat(begin, 2)[::2]
        end = end[::-1].copy()[::-1]
    for k in (0, 1, 20, cols, cols + 7):
        for largest in (True, False):
            check_topk(x, k, largest=largest, sorted="value", begin=begin, end=end,
                       context=describe(kind=kind, begin=begin_dtype.__name__,
                                        end=end_dtype.__name__, seed=seed, k=k, largest=largest))


@pytest.mark.parametrize("offset_dtype", (np.int32, np.int64), ids=("off_i32", "off_i64"))
@pytest.mark.parametrize("indices_dtype", ("int32", "int64"))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_index_offset(offset_dtype, indices_dtype, seed):
    rng = rng_for("offset", offset_dtype, indices_dtype, seed)
    rows, cols = 8, 70
    x = make_rows("ties4", (rows, cols), "float32", rng)
    begin, end = ragged_ranges(rng, rows, cols, "ragged", np.int32)
    top = np.iinfo(np.int32).max - cols  # largest offset that keeps int32 indices valid
    offset = rng.integers(-1000, 1000, size=rows)
    offset[0], offset[-1] = top, -(2**31)
    offset = offset.astype(offset_dtype)
    for k in (1, 30, cols + 3):
        check_topk(x, k, sorted="index", begin=begin, end=end, index_offset=offset,
                   indices_dtype=indices_dtype,
                   context=describe(offset=offset_dtype.__name__, indices_dtype=indices_dtype,
                                    seed=seed, k=k))


def test_index_offset_large_int64():
    rng = rng_for("offset64")
    x = make_rows("normal@1", (3, 40), "float16", rng)
    offset = np.array([2**40, -(2**50), 2**62], np.int64)
    check_topk(x, 45, sorted="value", index_offset=offset, index_fill=-(2**60))


@pytest.mark.parametrize("indices_dtype,expected",
                         [("int32", np.int32), ("int64", np.int64), (np.int32, np.int32),
                          (np.int64, np.int64), (np.dtype("int32"), np.int32),
                          ("i4", np.int32), ("<i8", np.int64)],
                         ids=["str32", "str64", "np32", "np64", "dtype32", "code32", "code64"])
def test_indices_dtype(indices_dtype, expected):
    x = make_rows("normal@1", (3, 20), "float32", rng_for("idx_dtype", str(indices_dtype)))
    v, i = attnkit.topk(x, 25, indices_dtype=indices_dtype, sorted="value")
    assert i.dtype == np.dtype(expected)
    want = topk_reference(x, 25, sorted="value", indices_dtype=expected)
    assert_same_result((v, i), want, describe(indices_dtype=indices_dtype))


@pytest.mark.parametrize("value_fill", [0.0, -0.0, 1.5, -7.25, float("nan"), 1e6, -1e30, 0.1,
                                        1 + 2**-11 + 2**-40],
                         ids=lambda f: f"value_fill={f!r}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("largest", (True, False), ids=lambda b: f"largest={b}")
def test_fills(value_fill, dtype, largest):
    rng = rng_for("fills", value_fill, dtype, largest)
    x = make_rows("normal@1", (4, 10), dtype, rng)
    end = np.array([10, 3, 0, 7], np.int64)
    for index_fill in (-1, 0, 2**31 - 1, -(2**31)):
        for indices_dtype in ("int32", "int64"):
            check_topk(x, 12, largest=largest, end=end, value_fill=value_fill,
                       index_fill=index_fill, indices_dtype=indices_dtype, sorted="value",
                       context=describe(value_fill=value_fill, dtype=dtype, largest=largest,
                                        index_fill=index_fill, indices_dtype=indices_dtype))
    check_topk(x, 12, end=end, index_fill=2**40, indices_dtype="int64")


@pytest.mark.parametrize("make", [np.array, lambda v: np.array(v, np.float16),
                                  lambda v: np.array(v, ml_dtypes.bfloat16), ml_dtypes.bfloat16,
                                  "torch"],
                         ids=["ndarray", "float16-ndarray", "bfloat16-ndarray", "bfloat16",
                              "tensor"])
def test_value_fill_takes_0d_arrays(make):
    # As k and index_fill take 0-d integer arrays: the number the array holds.
    if make == "torch":
        import torch  # in the package's test extra

        make = torch.tensor
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    values, indices = attnkit.topk(x, 6, value_fill=make(-2.5), index_fill=np.array(-7))
    assert values[:, 4:].tolist() == [[-2.5, -2.5]] * 2
    assert indices[:, 4:].tolist() == [[-7, -7]] * 2


def test_value_fill_rounds_once_from_the_exact_value():
    # float32's ulp at 2**60 is 2**37. 2**60 + 2**36 + 1 lies above the midpoint 2**60 + 2**36,
    # so it rounds up; rounded to float64 first it would become the midpoint and then go to
    # even, 2**60.
    n = 2**60 + 2**36 + 1
    for sign in (1, -1):
        v = attnkit.topk(np.zeros(1, np.float32), 2, value_fill=sign * n).values
        assert v[1] == np.float32(sign * (2**60 + 2**37))
    # bfloat16 keeps 7 fraction bits: 1 + 2**-8 is halfway between 1.0 (0x3F80) and 1 + 2**-7
    # (0x3F81); a hair either side decides, in an exact Fraction as in a float64.
    x = np.zeros(1, ml_dtypes.bfloat16)
    half = Fraction(1) + Fraction(1, 2**8)
    for fill, want in ((half + Fraction(1, 2**100), 0x3F81), (half - Fraction(1, 2**100), 0x3F80),
                       (half, 0x3F80), (1 + 2**-8 + 2**-30, 0x3F81)):
        v = attnkit.topk(x, 2, value_fill=fill).values
        assert v.view(np.uint16)[1] == want, (fill, hex(int(v.view(np.uint16)[1])))


def test_value_fill_beyond_float64_becomes_the_infinity_of_its_sign():
    # Beyond float64's range is beyond every dtype's: the README's rule (+-inf) applies to an
    # int or a Fraction that float() cannot take, as it does to 1e300 in float16.
    for dtype in DTYPES:
        x = np.zeros(1, dtype)
        for fill in (10**400, Fraction(10**400, 3), -10**400):
            v = attnkit.topk(x, 2, value_fill=fill).values
            assert np.isinf(v[1]) and (v[1] > 0) == (fill > 0), (dtype, v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_check_false_clamps_ranges(dtype):
    # With checking off, end is clamped into [0, N] and begin into [0, end] (documented).
    rng = rng_for("clamp", dtype)
    rows, cols = 5, 20
    x = make_rows("normal@1", (rows, cols), dtype, rng)
    begin = np.array([-5, 3, 15, 0, 30], np.int64)
    end = np.array([8, 100, 10, -4, 40], np.int64)
    got = attnkit.topk(x, 22, sorted="value", begin=begin, end=end, check=False)
    clamped_end = np.clip(end, 0, cols)
    clamped_begin = np.clip(begin, 0, clamped_end)
    want = topk_reference(x, 22, sorted="value", begin=clamped_begin, end=clamped_end)
    assert_same_result(got, want, describe(dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_check_true_on_cpu_matches_default(dtype):
    rng = rng_for("check_true", dtype)
    x = make_rows("ties4", (6, 50), dtype, rng)
    begin, end = ragged_ranges(rng, 6, 50, "ragged", np.int32)
    for check in (None, True, False):
        check_topk(x, 17, sorted="value", begin=begin, end=end, check=check,
                   context=describe(dtype=dtype, check=check))


# ---------------------------------------------------------------------------------------------
# backend="reference" vs "auto" over many shapes and options
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_backends_identical_random_cases(seed):
    rng = rng_for("backends", seed)
    dtype = DTYPES[seed % 3]
    dist = DISTRIBUTIONS[int(rng.integers(len(DISTRIBUTIONS)))]
    rows = int(rng.choice([1, 2, 5, 64]))
    cols = int(rng.choice([1, 31, 1000, 17000, 33000]))
    x = make_rows(dist, (rows, cols), dtype, rng)
    begin, end = ragged_ranges(rng, rows, cols, ("full", "ragged", "suffix")[seed % 3], np.int64)
    for k, largest, sorted_mode, nan in itertools.product(
            (1, 40, cols), (True, False), ("none", "value"), ("largest", "ignore")):
        ctx = describe(seed=seed, dtype=dtype, dist=dist, rows=rows, cols=cols, k=k,
                       largest=largest, sorted=sorted_mode, nan=nan)
        opts = dict(largest=largest, sorted=sorted_mode, nan=nan, begin=begin, end=end)
        auto = attnkit.topk(x, k, backend="auto", **opts)
        ref = attnkit.topk(x, k, backend="reference", **opts)
        assert_same_result(auto, ref, ctx)


def test_bfloat16_is_ml_dtypes():
    x = np.array([[1.0, 3.0, 2.0]], dtype=ml_dtypes.bfloat16)
    v, i = attnkit.topk(x, 2, sorted="value")
    assert v.dtype == np.dtype(ml_dtypes.bfloat16)
    assert v.astype(np.float32).tolist() == [[3.0, 2.0]] and i.tolist() == [[1, 2]]


class _CopyingProducer:
    """A DLPack producer whose capsule owns the only reference to a fresh copy of its array, as
    a framework that exports a temporary would: the copy must outlive the call."""

    def __init__(self, a):
        self.a = a

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)

    def __dlpack__(self, **kwargs):
        return self.a.copy().__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class _BareProducer:
    """A DLPack producer with nothing but the protocol (no shape, no dtype)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("n", [1000, 1_000_000])
def test_dlpack_producer_whose_capsule_owns_a_copy(n):
    x = np.arange(n, dtype=np.float32).reshape(1, n)
    values, indices = attnkit.topk(_CopyingProducer(x), 5, sorted="value")
    assert indices.tolist() == [[n - 1 - j for j in range(5)]]
    assert values.tolist() == [[float(n - 1 - j) for j in range(5)]]


def test_dlpack_producer_with_only_the_protocol():
    x = np.array([[1.0, 5.0, 3.0, -2.0]], np.float32)
    values, indices = attnkit.topk(_BareProducer(x), 2)
    assert indices.tolist() == [[1, 2]] and values.tolist() == [[5.0, 3.0]]


class _ReadOnlyProducer(_CopyingProducer):
    """A DLPack producer of a read-only array with shape and dtype (as JAX exports its arrays)."""

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)


def test_read_only_dlpack_inputs_are_read_and_outputs_refused():
    x = np.array([[1.0, 5.0, 3.0, -2.0]], np.float32)
    x.flags.writeable = False
    values, indices = attnkit.topk(_ReadOnlyProducer(x), 2)
    assert indices.tolist() == [[1, 2]] and values.tolist() == [[5.0, 3.0]]
    out = np.full((1, 2), -7, np.int64)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="topk: out_indices is read-only"):
        attnkit.topk(np.array([[1.0, 2.0, 3.0]], np.float32), 2, out_indices=_ReadOnlyProducer(out))
    assert out.tolist() == [[-7, -7]]
