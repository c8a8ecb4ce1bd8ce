# SPDX-License-Identifier: Apache-2.0
"""attnkit.compat.deep_select.topk: DeepSelect's signature and defaults, its limits lifted."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from attnkit.compat import deep_select
from conftest import assert_same_result, describe, make_rows, rng_for, to_numpy, to_torch
from reference import topk_reference

INT32_MAX = 2147483647



def test_signature_and_defaults():
    params = inspect.signature(deep_select.topk).parameters
    assert list(params) == [
        "input", "topk", "sorted", "begin", "end", "indices_type", "sorted_index", "hint",
        "output_idx", "output_idx_offset", "idx_oob_fill_value", "value_oob_fill_value",
        "return_value", "abort_when_nan_found"]
    d = {name: p.default for name, p in params.items()}
    assert d["input"] is inspect.Parameter.empty and d["topk"] is inspect.Parameter.empty
    assert d["sorted"] is False and d["sorted_index"] is False
    assert d["begin"] is None and d["end"] is None and d["hint"] is None
    assert d["output_idx"] is None and d["output_idx_offset"] is None
    assert d["indices_type"] in (None, torch.int64)
    assert d["idx_oob_fill_value"] == INT32_MAX
    assert math.isinf(d["value_oob_fill_value"]) and d["value_oob_fill_value"] < 0
    assert d["return_value"] is True and d["abort_when_nan_found"] is True
    for name, p in params.items():
        assert p.kind in (p.POSITIONAL_OR_KEYWORD,), f"{name} must be passable by position"


@pytest.mark.parametrize("dtype", ("bfloat16", "float32", "float16"))
@pytest.mark.parametrize("seed", [0, 1])
def test_defaults_behave_like_deep_select(dtype, seed):
    rng = rng_for("ds_defaults", dtype, seed)
    x = to_torch(make_rows("normal@1", (5, 300), dtype, rng))
    end = torch.tensor(rng.integers(0, 301, size=5), dtype=torch.int32)
    end[0] = 300
    values, indices = deep_select.topk(x, 64, end=end)
    assert isinstance(values, torch.Tensor) and indices.dtype == torch.int64
    want = topk_reference(to_numpy(x), 64, end=end.numpy(), index_fill=INT32_MAX,
                          value_fill=-np.inf)
    assert_same_result((to_numpy(values), indices.numpy()), want,
                       describe(dtype=dtype, seed=seed))


@pytest.mark.parametrize("sorted_flag,sorted_index,order",
                         [(False, False, "none"), (True, False, "value"), (False, True, "index")],
                         ids=["unsorted", "sorted", "sorted_index"])
@pytest.mark.parametrize("indices_type", (torch.int32, torch.int64), ids=("i32", "i64"))
def test_orders_and_indices_type(sorted_flag, sorted_index, order, indices_type):
    rng = rng_for("ds_orders", sorted_flag, sorted_index, str(indices_type))
    x = to_torch(make_rows("ties4", (4, 500), "bfloat16", rng))
    values, indices = deep_select.topk(x, 100, sorted=sorted_flag, sorted_index=sorted_index,
                                       indices_type=indices_type)
    assert indices.dtype == indices_type
    want = topk_reference(to_numpy(x), 100, sorted=order,
                          indices_dtype=np.int32 if indices_type == torch.int32 else np.int64)
    assert_same_result((to_numpy(values), indices.numpy()), want, describe(order=order))


def test_positional_arguments_follow_deep_select_order():
    x = to_torch(make_rows("normal@1", (3, 50), "float32", rng_for("ds_positional")))
    end = torch.tensor([50, 20, 3], dtype=torch.int32)
    # topk(input, topk, sorted, begin, end, indices_type, sorted_index)
    values, indices = deep_select.topk(x, 10, True, None, end, torch.int32, False)
    want = topk_reference(to_numpy(x), 10, sorted="value", end=end.numpy(),
                          index_fill=INT32_MAX, indices_dtype=np.int32)
    assert_same_result((to_numpy(values), indices.numpy()), want, "positional call")


def test_sorted_and_sorted_index_together_raise():
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match="sorted"):
        deep_select.topk(x, 4, sorted=True, sorted_index=True)


@pytest.mark.parametrize("flag", ("sorted", "sorted_index", "return_value",
                                  "abort_when_nan_found"))
@pytest.mark.parametrize("value", ("none", 1, None), ids=("str", "int", "None"))
def test_flags_must_be_bools(flag, value):
    # DeepSelect's flags are bools: a string such as "none" would otherwise read as True.
    x = torch.randn(2, 16)
    with pytest.raises(TypeError, match=rf"topk: {flag} = {value!r}; expected a bool"):
        deep_select.topk(x, 4, **{flag: value})
    assert deep_select.topk(x, 4, **{flag: np.bool_(False)})[1].shape == (2, 4)


@pytest.mark.parametrize("indices_type", (torch.int32, torch.int64), ids=("i32", "i64"))
def test_output_idx_offset_and_fills(indices_type):
    rng = rng_for("ds_out", str(indices_type))
    x = to_torch(make_rows("normal@1", (6, 40), "float32", rng))
    end = torch.tensor([40, 0, 5, 39, 1, 20], dtype=torch.int32)
    offset = torch.tensor([0, 1000, -3, 7, 2**20, 12], dtype=torch.int32)
    out = torch.full((6, 45), -7777, dtype=indices_type)
    values, indices = deep_select.topk(x, 45, end=end, indices_type=indices_type,
                                       sorted_index=True, output_idx=out,
                                       output_idx_offset=offset, idx_oob_fill_value=-2,
                                       value_oob_fill_value=0.25)
    assert indices is out
    want = topk_reference(to_numpy(x), 45, sorted="index", end=end.numpy(),
                          index_offset=offset.numpy(), index_fill=-2, value_fill=0.25,
                          indices_dtype=np.int32 if indices_type == torch.int32 else np.int64)
    assert_same_result((to_numpy(values), out.numpy()), want, f"indices_type={indices_type}")


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64), ids=("i32", "i64"))
def test_output_idx_sets_the_index_dtype_when_indices_type_is_left_out(dtype):
    x = to_torch(make_rows("normal@1", (2, 300), "float32", rng_for("ds_out_dtype", str(dtype))))
    out = torch.full((2, 16), -7, dtype=dtype)
    values, indices = deep_select.topk(x, 16, sorted=True, output_idx=out)
    assert indices is out and out.dtype == dtype
    want = topk_reference(to_numpy(x), 16, sorted="value",
                          indices_dtype=np.int32 if dtype == torch.int32 else np.int64)
    assert_same_result((to_numpy(values), out.numpy()), want, f"output_idx {dtype}")


def test_indices_type_contradicting_output_idx_raises_in_deep_select_terms():
    x = torch.zeros(2, 10)
    out = torch.full((2, 3), -7, dtype=torch.int32)
    with pytest.raises(ValueError) as info:
        deep_select.topk(x, 3, indices_type=torch.int64, output_idx=out)
    assert "indices_type = int64 but output_idx has dtype int32" in str(info.value)
    assert (out == -7).all()


def test_default_index_fill_is_int32_max():
    x = torch.tensor([[3.0, 1.0]], dtype=torch.float32)
    for indices_type in (torch.int32, torch.int64):
        values, indices = deep_select.topk(x, 4, indices_type=indices_type, sorted=True)
        assert indices.tolist() == [[0, 1, INT32_MAX, INT32_MAX]]
        assert values.tolist() == [[3.0, 1.0, -math.inf, -math.inf]]


def test_return_value_false():
    x = to_torch(make_rows("normal@1", (3, 64), "bfloat16", rng_for("ds_noval")))
    values, indices = deep_select.topk(x, 8, return_value=False, sorted_index=True)
    assert values is None
    want = topk_reference(to_numpy(x), 8, sorted="index")
    assert np.array_equal(indices.numpy(), want[1])


@pytest.mark.parametrize("dtype", ("bfloat16", "float32"))
def test_abort_when_nan_found(dtype):
    rng = rng_for("ds_nan", dtype)
    a = make_rows("normal@1", (4, 100), dtype, rng)
    a[2, 17] = np.nan
    x = to_torch(a)
    with pytest.raises(ValueError, match="NaN"):
        deep_select.topk(x, 10)
    with pytest.raises(ValueError, match="NaN"):
        deep_select.topk(x, 10, abort_when_nan_found=True)
    # Outside the valid range the NaN is not seen.
    end = torch.tensor([100, 100, 17, 100], dtype=torch.int32)
    got = deep_select.topk(x, 10, end=end, sorted=True)
    want = topk_reference(a, 10, end=end.numpy(), sorted="value", index_fill=INT32_MAX)
    assert_same_result((to_numpy(got[0]), got[1].numpy()), want, "NaN outside end")
    # abort_when_nan_found=False: NaN ranks above +inf (torch.topk's order).
    got = deep_select.topk(x, 10, abort_when_nan_found=False, sorted=True)
    want = topk_reference(a, 10, sorted="value", index_fill=INT32_MAX)
    assert_same_result((to_numpy(got[0]), got[1].numpy()), want, "abort_when_nan_found=False")
    assert got[1][2, 0].item() == 17


def test_limits_lifted():
    rng = rng_for("ds_limits")
    # k > 4096, float16, an unaligned row stride, begin and hint given.
    wide = make_rows("normal@1", (2, 9001), "float16", rng)
    x = to_torch(wide)[:, 1:]
    begin = torch.tensor([0, 100], dtype=torch.int64)
    values, indices = deep_select.topk(x, 5000, begin=begin, hint=object(), sorted=True)
    want = topk_reference(wide[:, 1:], 5000, begin=begin.numpy(), sorted="value",
                          index_fill=INT32_MAX)
    assert_same_result((to_numpy(values), indices.numpy()), want, "limits lifted")


def test_numpy_input():
    x = make_rows("ties4", (3, 30), "float32", rng_for("ds_numpy"))
    values, indices = deep_select.topk(x, 5, sorted=True)
    assert isinstance(values, np.ndarray)
    assert_same_result((values, indices), topk_reference(x, 5, sorted="value"), "numpy input")


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(topk=-1), ValueError, "topk: topk = -1"),
    (dict(topk=3, indices_type="int32", idx_oob_fill_value=2**40), ValueError,
     "idx_oob_fill_value = 1099511627776"),
    (dict(topk=3, output_idx=np.zeros((3, 2), np.int64)), ValueError, "output_idx has shape"),
    (dict(topk=3, output_idx_offset=np.zeros(2, np.int64)), ValueError,
     "output_idx_offset has shape"),
    (dict(topk=3, nan_row=True), ValueError, "input[1, 4] is NaN"),
    (dict(topk=3, float64=True), TypeError, "input.dtype = float64"),
    (dict(topk=2, indices_type="int32", overlapping_output=True), ValueError,
     ") overlaps input (bytes"),
])
def test_errors_name_deep_select_arguments(kwargs, error, fragment):
    x = make_rows("normal@1", (3, 10), "float32", rng_for("ds_errors"))
    if kwargs.pop("nan_row", False):
        x[1, 4] = np.nan
    if kwargs.pop("float64", False):
        x = x.astype(np.float64)
    if kwargs.pop("overlapping_output", False):
        kwargs["output_idx"] = x.view(np.int32)[:, 4:6]
    with pytest.raises(error) as info:
        deep_select.topk(x, **kwargs)
    assert fragment in str(info.value)


def test_memory_and_autograd_errors_name_deep_select_arguments(monkeypatch):
    import attnkit

    monkeypatch.setattr(attnkit._arrays, "physical_memory", lambda: 10 << 20)
    with pytest.raises(MemoryError) as info:
        deep_select.topk(np.zeros((2, 3), np.float32), 1 << 20)
    message = str(info.value)
    assert message.startswith("topk: topk = 1048576 asks for outputs"), message
    assert message.endswith("or output_idx") and "out_values" not in message, message
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError) as info:
        deep_select.topk(x, 2, output_idx=torch.zeros(2, 2, dtype=torch.int64))
    assert str(info.value).startswith(
        "topk: output_idx cannot be used when input requires grad"), str(info.value)
