# SPDX-License-Identifier: Apache-2.0
"""attnkit.topk on torch CPU tensors, and the torch.library ops of attnkit.torch.

Results must be torch tensors (zero-copy into caller buffers), values bit-equal to
torch.topk(sorted=True).values on NaN-free rows, index sets equal to a stable sort's first k;
torch.ops.attnkit.topk / topk_out pass torch.library.opcheck and work under
torch.compile(fullgraph=True)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attnkit
import attnkit.torch  # noqa: F401  (registers torch.ops.attnkit)
from conftest import DTYPES, assert_same_result, describe, make_rows, rng_for, to_numpy, to_torch
from reference import topk_reference

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TORCH_UINT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}



def tensor_bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(TORCH_UINT[t.dtype])


def torch_rows(dist: str, shape, dtype: str, rng) -> torch.Tensor:
    return to_torch(make_rows(dist, shape, dtype, rng))


def stable_topk_indices(x: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
    """First k columns of a stable sort by preference (NaN above +inf), ascending column."""
    order = torch.sort(x.float(), dim=-1, descending=largest, stable=True).indices[..., :k]
    return torch.sort(order, dim=-1).values


# ---------------------------------------------------------------------------------------------
# attnkit.topk with torch tensors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sorted_mode", ("none", "index", "value", True, False),
                         ids=lambda s: f"sorted={s!r}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_results_are_torch_tensors(dtype, sorted_mode):
    rng = rng_for("torch_types", dtype, sorted_mode)
    x = torch_rows("ties4", (6, 50), dtype, rng)
    v, i = attnkit.topk(x, 60, sorted=sorted_mode)
    assert isinstance(v, torch.Tensor) and isinstance(i, torch.Tensor)
    assert v.dtype == TORCH_DTYPES[dtype] and i.dtype == torch.int64
    assert v.device.type == "cpu" and v.shape == (6, 60) and i.shape == (6, 60)
    want = topk_reference(to_numpy(x), 60, sorted=sorted_mode)
    assert_same_result((to_numpy(v), i.numpy()), want, describe(dtype=dtype, sorted=sorted_mode))
    v, i = attnkit.topk(x, 5, indices_dtype=torch.int32)
    assert i.dtype == torch.int32


@pytest.mark.parametrize("largest", (True, False), ids=lambda b: f"largest={b}")
@pytest.mark.parametrize("dist", ("normal@1e-3", "normal@1", "normal@1e3", "ties4", "inf",
                                  "denormal", "all_equal", "ascending", "descending"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_values_bit_equal_to_torch_topk(dtype, dist, largest):
    rng = rng_for("vs_torch", dtype, dist, largest)
    rows, cols = 9, int(rng.choice([64, 200, 1000, 20000]))
    x = torch_rows(dist, (rows, cols), dtype, rng)
    # Signed zeros tie, and torch.topk may order tied -0.0/+0.0 either way: use +0.0 only, so
    # that the values are bit-comparable.
    x = torch.where(x == 0, torch.zeros_like(x), x)
    for k in (1, 17, cols // 2, cols):
        ctx = describe(dtype=dtype, dist=dist, largest=largest, cols=cols, k=k)
        v, i = attnkit.topk(x, k, largest=largest, sorted="value")
        want = torch.topk(x, k, largest=largest, sorted=True).values
        assert torch.equal(tensor_bits(v), tensor_bits(want)), f"{ctx}: values differ"
        assert torch.equal(torch.sort(i, dim=-1).values, stable_topk_indices(x, k, largest)), \
            f"{ctx}: index set differs from a stable sort's first k"
        assert torch.equal(tensor_bits(x).gather(1, i), tensor_bits(v)), ctx


@pytest.mark.parametrize("largest", (True, False), ids=lambda b: f"largest={b}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_rows_match_stable_sort(dtype, largest):
    rng = rng_for("torch_nan", dtype, largest)
    x = torch_rows("nan", (8, 300), dtype, rng)
    for k in (1, 30, 300):
        v, i = attnkit.topk(x, k, largest=largest)
        assert torch.equal(i, stable_topk_indices(x, k, largest)), describe(
            dtype=dtype, largest=largest, k=k)
        assert torch.equal(tensor_bits(x).gather(1, i), tensor_bits(v))


@pytest.mark.parametrize("dtype", DTYPES)
def test_caller_buffers_are_written_in_place(dtype):
    rng = rng_for("torch_out", dtype)
    x = torch_rows("normal@1", (5, 40), dtype, rng)
    wide_v = torch.full((5, 50), float("nan"), dtype=TORCH_DTYPES[dtype])
    wide_i = torch.full((5, 50), -7777, dtype=torch.int32)
    ov, oi = wide_v[:, 3:48], wide_i[:, 1:46]  # strided, unaligned views: k = 45 > N
    ptr_v, ptr_i = ov.data_ptr(), oi.data_ptr()
    end = torch.tensor([40, 0, 13, 39, 1], dtype=torch.int32)
    v, i = attnkit.topk(x, 45, sorted="value", end=end, out_values=ov, out_indices=oi)
    assert v is ov and i is oi
    assert v.data_ptr() == ptr_v and i.data_ptr() == ptr_i
    want = topk_reference(to_numpy(x), 45, sorted="value", end=end.numpy(),
                          indices_dtype=np.int32)
    assert_same_result((to_numpy(v), i.numpy()), want, describe(dtype=dtype))
    # Columns outside the views are untouched.
    assert torch.isnan(wide_v[:, :3].float()).all() and torch.isnan(wide_v[:, 48:].float()).all()
    assert (wide_i[:, :1] == -7777).all() and (wide_i[:, 46:] == -7777).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_requires_grad_inputs_are_accepted(dtype):
    rng = rng_for("torch_grad", dtype)
    x = torch_rows("normal@1", (4, 64), dtype, rng)
    xg = x.clone().requires_grad_(True)
    got = attnkit.topk(xg, 10, sorted="value")
    want = attnkit.topk(x, 10, sorted="value")
    assert torch.equal(tensor_bits(got[0]), tensor_bits(want[0]))
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("layout", ("slice", "unaligned", "every_other_row", "expanded",
                                    "narrowed"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_tensors(dtype, layout):
    rng = rng_for("torch_layout", dtype, layout)
    base = torch_rows("ties4", (8, 300), dtype, rng)
    x = {
        "slice": base[:, 5:205],
        "unaligned": base[:, 1:],
        "every_other_row": base[::2],
        "expanded": base[0].expand(6, 300),
        "narrowed": base[2:7, 3:250],
    }[layout]
    begin = torch.tensor(rng.integers(0, 50, size=x.shape[0]), dtype=torch.int64)
    for k in (1, 33, x.shape[1] + 1):
        v, i = attnkit.topk(x, k, sorted="value", begin=begin)
        xs = to_numpy(x)
        want = topk_reference(xs, k, sorted="value", begin=begin.numpy())
        assert_same_result((to_numpy(v), i.numpy()), want, describe(dtype=dtype, layout=layout,
                                                                    k=k))


def test_begin_end_offset_tensors():
    rng = rng_for("torch_ranges")
    x = torch_rows("normal@1", (7, 90), "bfloat16", rng)
    begin = torch.tensor(rng.integers(0, 40, size=7), dtype=torch.int32)
    end = torch.tensor(rng.integers(40, 91, size=7), dtype=torch.int64)
    offset = torch.tensor(rng.integers(-10**6, 10**6, size=7), dtype=torch.int64)
    v, i = attnkit.topk(x, 60, begin=begin, end=end, index_offset=offset, sorted="index")
    want = topk_reference(to_numpy(x), 60, begin=begin.numpy(), end=end.numpy(),
                          index_offset=offset.numpy(), sorted="index")
    assert_same_result((to_numpy(v), i.numpy()), want, "torch begin/end/index_offset")


def test_torch_errors_are_python_exceptions():
    with pytest.raises(TypeError, match="x.dtype"):
        attnkit.topk(torch.zeros(3, 4, dtype=torch.float64), 2)
    with pytest.raises(ValueError, match=r"x.stride\(-1\)"):
        attnkit.topk(torch.zeros(4, 3).t(), 2)
    with pytest.raises(ValueError, match="k = -2"):
        attnkit.topk(torch.zeros(3, 4), -2)


# ---------------------------------------------------------------------------------------------
# torch.ops.attnkit.topk / topk_out
# ---------------------------------------------------------------------------------------------


def test_op_topk_schema_defaults():
    x = torch_rows("ties4", (5, 40), "float32", rng_for("op_defaults"))
    v, i = torch.ops.attnkit.topk(x, 7)
    want = topk_reference(to_numpy(x), 7)
    assert_same_result((to_numpy(v), i.numpy()), want, "torch.ops.attnkit.topk(x, 7)")


def test_op_sorted_names_only_what_its_schema_takes():
    # The op's `sorted` is a string: its message offers no bool, which the schema would refuse.
    x = torch.randn(3, 20)
    want = r"topk: sorted = 'Value'; expected one of 'none', 'index', 'value'$"
    with pytest.raises(ValueError, match=want):
        torch.ops.attnkit.topk(x, 4, sorted="Value")
    with pytest.raises(ValueError, match=want):
        torch.ops.attnkit.topk_out(x, 4, True, "Value", None, None, None, -1, None, "largest",
                                   "lowest_index", None, None, torch.empty(3, 4, dtype=torch.int64))
    # Dynamo wraps the fake kernel's ValueError; its message ends the quoted repr.
    with pytest.raises(Exception, match=r"""expected one of 'none', 'index', 'value'"\)"""):
        torch.compile(lambda t: torch.ops.attnkit.topk(t, 4, sorted="Value"), backend="eager",
                      fullgraph=True)(x)


@pytest.mark.parametrize("return_values", (True, False), ids=lambda b: f"return_values={b}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_op_topk_all_arguments(dtype, return_values):
    rng = rng_for("op_all", dtype, return_values)
    x = torch_rows("nan", (6, 70), dtype, rng)
    begin = torch.tensor(rng.integers(0, 30, size=6), dtype=torch.int64)
    end = torch.tensor(rng.integers(30, 71, size=6), dtype=torch.int32)
    offset = torch.tensor(rng.integers(0, 1000, size=6), dtype=torch.int32)
    v, i = torch.ops.attnkit.topk(x, 50, False, "value", begin, end, torch.int32, return_values,
                                  offset, -5, 2.5, "ignore", "lowest_index", True)
    want = topk_reference(to_numpy(x), 50, largest=False, sorted="value", begin=begin.numpy(),
                          end=end.numpy(), index_offset=offset.numpy(), index_fill=-5,
                          value_fill=2.5, nan="ignore", indices_dtype=np.int32)
    if return_values:
        assert_same_result((to_numpy(v), i.numpy()), want, describe(dtype=dtype))
    else:
        assert v.shape == (0,) and v.dtype == x.dtype
        assert np.array_equal(i.numpy(), want[1])


@pytest.mark.parametrize("with_values", (True, False), ids=lambda b: f"with_values={b}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_op_topk_out(dtype, with_values):
    rng = rng_for("op_out", dtype, with_values)
    x = torch_rows("normal@1", (4, 30), dtype, rng)
    ov = torch.full((4, 33), 7.0, dtype=x.dtype) if with_values else None
    oi = torch.full((4, 33), -7777, dtype=torch.int64)
    result = torch.ops.attnkit.topk_out(x, 33, True, "value", None, None, None, -1, None,
                                        "largest", "lowest_index", None, ov, oi)
    assert result is None
    want = topk_reference(to_numpy(x), 33, sorted="value")
    if with_values:
        assert_same_result((to_numpy(ov), oi.numpy()), want, describe(dtype=dtype))
    else:
        assert np.array_equal(oi.numpy(), want[1])


def _opcheck_samples():
    rng = rng_for("opcheck")
    x32 = torch_rows("normal@1", (4, 50), "float32", rng)
    xbf = torch_rows("ties4", (3, 40), "bfloat16", rng)
    x16 = torch_rows("normal@1", (60,), "float16", rng)
    begin = torch.tensor([0, 5, 10], dtype=torch.int32)
    end = torch.tensor([40, 30, 10], dtype=torch.int64)
    return {
        "float32_defaults": ((x32, 5), {}),
        "float32_requires_grad": ((x32.clone().requires_grad_(True), 5), {}),
        "bfloat16_ranges_padding": ((xbf, 45, True, "value", begin, end, torch.int32), {}),
        "float16_1d_smallest_no_values": ((x16, 8, False, "index", None, None, None, False), {}),
        "float32_non_contiguous": ((x32[:, 2:], 6), {"sorted": "value", "nan": "ignore"}),
    }


OPCHECK_SAMPLES = _opcheck_samples()


@pytest.mark.parametrize("name", list(OPCHECK_SAMPLES))
def test_opcheck_topk(name):
    args, kwargs = OPCHECK_SAMPLES[name]
    torch.library.opcheck(torch.ops.attnkit.topk.default, args, kwargs)


@pytest.mark.parametrize("with_values", (True, False), ids=lambda b: f"with_values={b}")
def test_opcheck_topk_out(with_values):
    x = torch_rows("normal@1", (4, 50), "bfloat16", rng_for("opcheck_out", with_values))
    ov = torch.empty((4, 9), dtype=x.dtype) if with_values else None
    oi = torch.empty((4, 9), dtype=torch.int32)
    args = (x, 9, True, "value", None, torch.tensor([50, 3, 0, 20]), None, -1, None, "largest",
            "lowest_index", None, ov, oi)
    torch.library.opcheck(torch.ops.attnkit.topk_out.default, args)


# ---------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------


def _scores_then_topk(q, keys, end):
    scores = (q @ keys.t()).to(torch.bfloat16)
    values, indices = attnkit.topk(scores, 16, sorted="value", end=end)
    return values.float() * 2, indices + 1


def test_compile_fullgraph_matches_eager():
    rng = rng_for("compile")
    q = torch.tensor(rng.standard_normal((6, 32)), dtype=torch.float32)
    keys = torch.tensor(rng.standard_normal((300, 32)), dtype=torch.float32)
    end = torch.tensor([1, 50, 100, 150, 299, 300], dtype=torch.int64)
    eager = _scores_then_topk(q, keys, end)
    compiled = torch.compile(_scores_then_topk, fullgraph=True, backend="inductor")(q, keys, end)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def _topk_into_buffers(x, out_values, out_indices):
    attnkit.topk(x, 12, largest=False, sorted="index", out_values=out_values,
                 out_indices=out_indices)
    return out_indices.sum()


def test_compile_fullgraph_out_buffers():
    x = torch_rows("ties4", (5, 100), "float16", rng_for("compile_out"))
    ov_e, oi_e = torch.empty(5, 12, dtype=x.dtype), torch.empty(5, 12, dtype=torch.int64)
    ov_c, oi_c = torch.zeros_like(ov_e), torch.zeros_like(oi_e)
    eager = _topk_into_buffers(x, ov_e, oi_e)
    compiled = torch.compile(_topk_into_buffers, fullgraph=True, backend="inductor")(x, ov_c,
                                                                                    oi_c)
    assert torch.equal(eager, compiled)
    assert torch.equal(tensor_bits(ov_e), tensor_bits(ov_c)) and torch.equal(oi_e, oi_c)


@pytest.mark.parametrize("layout", ("row_stride", "every_other_row", "storage_offset"))
@pytest.mark.parametrize("read_after", (True, False), ids=lambda b: f"read_after={b}")
@pytest.mark.parametrize("with_values", (True, False), ids=lambda b: f"with_values={b}")
def test_compile_fullgraph_writes_strided_out_buffers(layout, read_after, with_values):
    # Caller buffers of any row stride are written in place under inductor, also when the
    # compiled code returns them (torch 2.15's inductor then ran the op on a copy of a
    # row-strided buffer and left the caller's as it was).
    x = torch_rows("normal@1", (4, 60), "float32", rng_for("compile_strided", layout))
    want = attnkit.topk(x, 5, sorted="index")

    def buffer(dtype):
        if layout == "row_stride":
            return torch.full((4, 9), 7, dtype=dtype)[:, 2:7]
        if layout == "every_other_row":
            return torch.full((8, 5), 7, dtype=dtype)[::2]
        return torch.full((6, 5), 7, dtype=dtype)[1:5]

    def f(a, ov, oi):
        attnkit.topk(a, 5, sorted="index", return_values=ov is not None, out_values=ov,
                     out_indices=oi)
        # A product by 1 is the buffer itself to inductor, which then returned its copy.
        return (oi * 1, None if ov is None else ov * 1) if read_after else None

    ov, oi = buffer(torch.float32) if with_values else None, buffer(torch.int64)
    torch._dynamo.reset()  # a graph of its own for each layout, as a first call makes
    got = torch.compile(f, fullgraph=True, backend="inductor")(x, ov, oi)
    assert torch.equal(oi, want.indices)
    if with_values:
        assert torch.equal(tensor_bits(ov), tensor_bits(want.values))
    if read_after:
        assert torch.equal(got[0], want.indices)
        assert not with_values or torch.equal(tensor_bits(got[1]), tensor_bits(want.values))


@pytest.mark.parametrize("given", ("values", "indices"))
def test_compile_fullgraph_one_out_buffer(given):
    # One caller buffer: it is written in place, and the other result is made, as in eager.
    x = torch_rows("normal@1", (3, 50), "float32", rng_for("compile_one_out", given))
    want = attnkit.topk(x, 4)
    buf = torch.zeros(3, 4) if given == "values" else torch.zeros(3, 4, dtype=torch.int64)
    kwargs = {"out_" + given: buf}
    got = torch.compile(lambda x: attnkit.topk(x, 4, **kwargs), fullgraph=True)(x)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.values, want.values)
    assert torch.equal(buf, want.values if given == "values" else want.indices)


# torch 2.15 deprecates TorchScript, which these tests call on purpose (jit.trace) or reach
# through torch.func.linearize (jit.script).
_JIT_DEPRECATED = pytest.mark.filterwarnings(
    "ignore:`torch.jit.(trace|script)` is deprecated:FutureWarning")


@_JIT_DEPRECATED
def test_traced_and_transformed_calls_record_the_op():
    # jit.trace, make_fx (real and fake) and vmap see the op, not an eager write they miss.
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(r):
        return attnkit.topk(r, 3, sorted="value")

    x = torch_rows("normal@1", (3, 50), "float32", rng_for("traced", 1))
    y = torch_rows("normal@1", (3, 50), "float32", rng_for("traced", 2))
    want = torch.topk(y, 3)
    traced = torch.jit.trace(f, (x,), check_trace=False)
    assert torch.equal(traced(y)[0], want.values) and torch.equal(traced(y)[1], want.indices)
    for mode in ("real", "fake"):
        graph = make_fx(f, tracing_mode=mode)(x)
        assert torch.equal(graph(y)[0], want.values), mode
    batched = torch.func.vmap(lambda r: f(r).values)(y)
    assert torch.equal(batched, want.values)


@pytest.mark.parametrize("route", ["plain", "grad", "buffers", "tensor_fill"])
def test_eager_calls_run_while_another_thread_compiles(monkeypatch, route):
    # torch.compiler.is_compiling() reads a process-wide flag that torch.export (and from torch
    # 2.15 on, dynamo) holds while any thread compiles: an eager call in another thread runs as
    # it would without it (a call taken for a traced one went through the op, whose kernel sent
    # it back to the op without end).
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling()
    x = torch_rows("normal@1", (4, 100), "float32", rng_for("compiling_flag", route))
    want = torch.topk(x, 5)
    if route == "tensor_fill":
        v, i = attnkit.topk(x, 102, sorted="value", value_fill=torch.tensor(-2.5))
        assert (v[:, 100:] == -2.5).all() and (i[:, 100:] == -1).all()
        v, i = v[:, :5], i[:, :5]
    elif route == "buffers":
        ov = torch.full((4, 8), -7.0)[:, :5]
        oi = torch.full((4, 5), -7, dtype=torch.int64)
        v, i = attnkit.topk(x, 5, sorted="value", out_values=ov, out_indices=oi)
        assert v is ov and i is oi
    else:
        v, i = attnkit.topk(x.requires_grad_(route == "grad"), 5, sorted="value")
    assert torch.equal(v.detach(), want.values) and torch.equal(i, want.indices)
    if route == "grad":
        v.sum().backward()
        assert torch.equal(x.grad, torch.zeros_like(x).scatter_(1, want.indices, 1.0))


class _TopkModule(torch.nn.Module):
    def forward(self, x, fill=None):
        return attnkit.topk(x, 3, sorted="value", value_fill=fill)


@pytest.mark.parametrize("strict", [True, False], ids=lambda b: f"strict={b}")
def test_export_records_the_op(strict):
    # Strict export traces with dynamo, non-strict runs the module on fake tensors: either way
    # the program holds attnkit's op, which runs on other inputs of the same shape.
    x = torch_rows("normal@1", (4, 20), "float32", rng_for("export", strict, 1))
    y = torch_rows("normal@1", (4, 20), "float32", rng_for("export", strict, 2))
    program = torch.export.export(_TopkModule(), (x,), strict=strict)
    assert "attnkit.topk" in str(program.graph)
    got, want = program.module()(y), torch.topk(y, 3)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)


@pytest.mark.parametrize("strict", [True, False], ids=lambda b: f"strict={b}")
def test_export_refuses_a_tensor_value_fill_by_name(strict):
    x = torch.randn(4, 20)
    with pytest.raises(Exception) as info:
        torch.export.export(_TopkModule(), (x, torch.tensor(-2.5)), strict=strict)
    assert "topk: value_fill is a tensor" in str(info.value)


@pytest.mark.parametrize("source", ["size", "item"])
def test_make_fx_symbolic_keeps_k_symbolic(source):
    # A k from a symbolic size or from t.item() reaches the op as a SymInt: the graph selects
    # the k of each call, as torch.topk's does, not the k of the traced one.
    from torch.fx.experimental.proxy_tensor import make_fx

    if source == "size":
        graph = make_fx(lambda a: attnkit.topk(a, a.shape[-1] // 2, sorted="value"),
                        tracing_mode="symbolic")(torch.randn(3, 10))
        y, k, args = torch.randn(3, 20), 10, ()
    else:
        graph = make_fx(lambda a, t: attnkit.topk(a, t.item(), sorted="value"),
                        tracing_mode="symbolic")(torch.randn(3, 10), torch.tensor(3))
        y, k, args = torch.randn(4, 10), 4, (torch.tensor(4),)
    got, want = graph(y, *args), torch.topk(y, k)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)


@pytest.mark.parametrize("route", ["export", "make_fx_fake"])
def test_a_k_read_from_a_tensor_traces_outside_dynamo(route):
    # Non-strict torch.export and make_fx trace a k of t.item() as an unbacked SymInt, which
    # operator.index could not turn into a number.
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, t):
        return attnkit.topk(a, t.item(), sorted="value").indices

    x = torch.randn(4, 50)
    if route == "export":
        graph = torch.export.export(_KFromTensor(), (x, torch.tensor(3)), strict=False).module()
    else:
        graph = make_fx(f, tracing_mode="fake")(x, torch.tensor(3))
    y = torch_rows("normal@1", (4, 50), "float32", rng_for("item_k", route))
    assert torch.equal(graph(y, torch.tensor(4)), torch.topk(y, 4).indices)


class _KFromTensor(torch.nn.Module):
    def forward(self, x, t):
        return attnkit.topk(x, t.item(), sorted="value").indices


def test_jit_trace_warns_that_a_tensor_k_becomes_a_constant():
    with pytest.warns(torch.jit.TracerWarning, match="topk: k is a tensor; torch.jit.trace"):
        torch.jit.trace(lambda a, k: attnkit.topk(a, k).values,
                        (torch.randn(3, 10), torch.tensor(3)), check_trace=False)


@pytest.mark.parametrize("name", ["k", "index_fill", "value_fill"])
def test_meta_tensor_numbers_are_refused_by_name(name):
    kwargs = {"k": 5, name: torch.tensor(3, device="meta")}
    for x in (torch.randn(4, 50), torch.empty(4, 50, device="meta")):
        with pytest.raises(TypeError, match=f"topk: {name} is a tensor without a value to read"):
            attnkit.topk(x, **kwargs)


def test_op_without_values_passes_no_gradient():
    # torch.ops.attnkit.topk(return_values=False) returns an empty values tensor: a backward
    # through it reaches x as no gradient at all.
    x = torch.randn(3, 10, requires_grad=True)
    values, indices = torch.ops.attnkit.topk(x, 3, return_values=False)
    assert values.numel() == 0 and indices.shape == (3, 3)
    values.sum().backward()
    assert x.grad is None


def test_meta_x_gets_meta_results():
    # Shape propagation, as torch.topk gives it on the meta device; the eager checks still name
    # what a meta x cannot take.
    x = torch.empty(3, 10, dtype=torch.bfloat16, device="meta")
    v, i = attnkit.topk(x, 12)
    assert (v.device.type, v.shape, v.dtype) == ("meta", (3, 12), torch.bfloat16)
    assert (i.device.type, i.shape, i.dtype) == ("meta", (3, 12), torch.int64)
    v, i = attnkit.topk(x, 4, return_values=False, indices_dtype="int32")
    assert v is None and (i.device.type, i.shape, i.dtype) == ("meta", (3, 4), torch.int32)
    oi = torch.empty(3, 4, dtype=torch.int64, device="meta")
    assert attnkit.topk(x, 4, out_indices=oi).indices is oi
    with pytest.raises(ValueError, match="index_fill = 2147483648 does not fit the int32"):
        attnkit.topk(x, 4, indices_dtype=torch.int32, index_fill=2**31)
    with pytest.raises(ValueError, match="end is on device cpu while x is on meta"):
        attnkit.topk(x, 4, end=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"backend = 'reference' runs on CPU tensors, but x is "
                       r"on the meta device \(backend='auto' gives meta results\)"):
        attnkit.topk(x, 4, backend="reference")
    with pytest.raises(ValueError, match="k = -1"):
        attnkit.topk(x, -1)


@pytest.mark.parametrize("route", ["compile", "make_fx", "vmap"])
def test_reference_backend_is_refused_where_the_op_is_recorded(route):
    # The registered op picks its backend by device; a recorded call asking for another one
    # is refused rather than run on a backend it did not ask for.
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(r):
        return attnkit.topk(r, 3, backend="reference").indices

    x = torch.randn(3, 50)
    with pytest.raises(Exception, match="backend = 'reference' is for eager calls"):
        if route == "compile":
            torch.compile(f, fullgraph=True, backend="eager")(x)
        elif route == "make_fx":
            make_fx(f)(x)
        else:
            torch.func.vmap(f)(x)
    # Eager, the same call runs on the reference backend.
    assert torch.equal(f(x), attnkit.topk(x, 3).indices)


def test_func_grad_is_refused_by_name():
    x = torch.randn(2, 20)
    with pytest.raises(NotImplementedError, match="topk: torch.func"):
        torch.func.grad(lambda r: attnkit.topk(r, 3).values.sum())(x)


def test_inference_tensor_buffers_are_written_only_in_inference_mode():
    x = torch.randn(2, 20)
    with torch.inference_mode():
        ov, oi = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="out_values is an inference tensor"):
        attnkit.topk(x, 3, out_values=ov, out_indices=oi)
    assert (ov == 0).all() and (oi == 0).all()
    with torch.inference_mode():
        attnkit.topk(x, 3, out_values=ov, out_indices=oi)
    assert torch.equal(torch.gather(x, 1, oi), ov)


def test_grad_path_takes_a_value_fill_beyond_float64_as_infinity():
    x = torch.randn(2, 5, requires_grad=True)
    values = attnkit.topk(x, 7, value_fill=-10**400).values
    assert torch.equal(values[:, 5:], torch.full((2, 2), -torch.inf))
    values[:, :5].sum().backward()
    assert torch.equal(x.grad, torch.ones(2, 5))


@pytest.mark.parametrize("offset", [False, True])
def test_autograd_values_route_gradient_to_selected_elements(offset):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(4, 300, generator=gen, requires_grad=True)
    off = torch.tensor([0, 5, -7, 100]) if offset else None
    end = torch.tensor([300, 2, 300, 150])  # row 1 pads: its padding carries no gradient
    weights = torch.randn(4, 8, generator=gen)
    values, indices = attnkit.topk(x, 8, end=end, index_offset=off, sorted="value")
    (values.nan_to_num(neginf=0.0) * weights).sum().backward()
    expected = torch.zeros_like(x)
    cols = indices - (off[:, None] if offset else 0)
    for b in range(4):
        for j in range(min(8, int(end[b]))):  # real slots; the rest is padding
            expected[b, cols[b, j]] += weights[b, j]
    assert torch.equal(x.grad, expected)


def test_caller_buffers_refused_when_autograd_would_need_them():
    x = torch.randn(2, 50, requires_grad=True)
    out_i = torch.empty(2, 5, dtype=torch.int64)
    # The message names the buffers given.
    with pytest.raises(RuntimeError, match="topk: out_indices cannot be used when x requires"):
        attnkit.topk(x, 5, out_indices=out_i)
    out_v = torch.empty(2, 5)
    with pytest.raises(RuntimeError, match="topk: out_values cannot be used when x requires"):
        attnkit.topk(x, 5, out_values=out_v)
    with pytest.raises(RuntimeError, match="topk: out_values/out_indices cannot be used"):
        attnkit.topk(x, 5, out_values=out_v, out_indices=out_i)
    with torch.no_grad():
        attnkit.topk(x, 5, out_indices=out_i)  # nothing to record: allowed
    values, indices = attnkit.topk(x, 5, out_indices=out_i, return_values=False)
    assert values is None and indices.data_ptr() == out_i.data_ptr()


def test_caller_buffers_that_require_grad_are_refused():
    x = torch.randn(2, 50)
    ov = torch.zeros(2, 5, requires_grad=True)
    oi = torch.full((2, 5), -3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="out_values requires grad"):
        attnkit.topk(x, 5, out_values=ov, out_indices=oi)
    assert (ov == 0).all() and (oi == -3).all()
    with torch.no_grad():  # as torch.topk(..., out=...): allowed without grad mode
        attnkit.topk(x, 5, out_values=ov, out_indices=oi)
    assert torch.equal(torch.gather(x, 1, oi), ov.detach())


def test_caller_buffers_written_bump_their_version():
    # Autograd saved ov before the call; the write must invalidate that (as torch.topk's out=
    # does), not let backward read the new contents as if they were the old.
    x = torch.tensor([[1.0, 5.0, 3.0, 4.0]])
    z = torch.ones(1, 2, requires_grad=True)
    ov, oi = torch.zeros(1, 2), torch.empty(1, 2, dtype=torch.int64)
    y = (z * ov).sum()
    version, version_i = ov._version, oi._version
    attnkit.topk(x, 2, out_values=ov, out_indices=oi)
    assert ov._version > version and oi._version > version_i
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    # Each torch buffer is bumped, whatever the other one is.
    for other in (None, np.empty((1, 2), np.float32)):
        version_i = oi._version
        attnkit.topk(x, 2, out_values=other, out_indices=oi)
        assert oi._version > version_i


def test_grad_path_takes_the_eager_spellings_of_options():
    # numpy bools for `sorted`/`check` and numpy ends with negative strides reach the
    # dispatcher's op (taken when x requires grad) as they reach the eager call.
    x = torch.randn(2, 6, requires_grad=True)
    end = np.array([9, 6, 9, 0])[::-2]  # [0, 6]: negative stride
    got = attnkit.topk(x, 3, sorted=np.True_, end=end, check=np.True_)
    want = attnkit.topk(x.detach(), 3, sorted="value", end=end.copy())
    assert torch.equal(got.indices, want.indices) and torch.equal(got.values.detach(), want.values)
    got.values.sum().backward()
    assert x.grad[0].sum() == 0 and x.grad[1].sum() == 3


# Subclasses of torch.Tensor (nn.Parameter, a plain subclass) are read as tensors, as inputs and
# as caller buffers; outputs made for them are plain tensors.
def test_tensor_subclasses_are_read_as_tensors():
    class Sub(torch.Tensor):
        pass

    x = torch.randn(3, 9)
    end = torch.tensor([9, 4, 0])
    want = attnkit.topk(x, 4, end=end, sorted="value")
    for sub in (torch.nn.Parameter(x.clone(), requires_grad=False), x.as_subclass(Sub)):
        got = attnkit.topk(sub, 4, end=end.as_subclass(Sub), sorted="value")
        assert type(got.values) is torch.Tensor and type(got.indices) is torch.Tensor
        assert torch.equal(got.indices, want.indices) and torch.equal(got.values, want.values)
    out_v, out_i = torch.empty(3, 4).as_subclass(Sub), torch.empty(3, 4, dtype=torch.int64)
    got = attnkit.topk(x.as_subclass(Sub), 4, end=end, sorted="value", out_values=out_v,
                       out_indices=torch.nn.Parameter(out_i, requires_grad=False))
    assert got.values is out_v and torch.equal(got.indices, want.indices)
    assert torch.equal(out_v.as_subclass(torch.Tensor), want.values)


# Views whose sign or conjugation is a bit on the tensor, not in memory, are read resolved.
def test_negative_and_conjugate_views_are_read_resolved():
    x = torch._neg_view(torch.tensor([[1.0, 5.0, 3.0, -2.0]]))
    values, indices = attnkit.topk(x, 2, sorted="value")
    expected = torch.topk(x.resolve_neg(), 2)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)
    y = torch.tensor([[1 + 5j, 2 + 3j, 4 - 1j]]).conj().imag  # [[-5, -3, 1]], negative bit
    assert y.is_neg()
    values, indices = attnkit.topk(y, 1)
    assert values.tolist() == [[1.0]] and indices.tolist() == [[2]]


@pytest.mark.parametrize("name", ["end", "index_offset"])
def test_autograd_takes_numpy_row_arrays_whatever_the_default_device(name):
    # A NumPy array is on the CPU, where a CPU x is, whatever torch's default device says.
    x = torch.randn(3, 20, requires_grad=True)
    arg = np.array([2, 5, 20]) if name == "end" else np.array([10, 20, 30])
    want = attnkit.topk(x.detach(), 4, **{name: arg}).indices
    torch.set_default_device("meta")
    try:
        values, indices = attnkit.topk(x, 4, **{name: arg})
    finally:
        torch.set_default_device(None)
    assert torch.equal(indices, want)
    values.nan_to_num(neginf=0.0).sum().backward()
    assert x.grad.sum().item() == float(torch.isfinite(values).sum())


@pytest.mark.parametrize("name", ["end", "index_offset"])
def test_autograd_keeps_the_numpy_row_arrays_of_the_forward(name):
    # A NumPy end or index_offset changed between forward and backward (a reused lengths
    # buffer): torch cannot see that write, so the gradient must come from the forward's values.
    x = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]], requires_grad=True)
    arg = np.array([2]) if name == "end" else np.array([10])
    values, indices = attnkit.topk(x, 4 if name == "end" else 2, **{name: arg})
    arg[0] = 6 if name == "end" else 11
    values.sum().backward()  # the padding slots of end=[2] carry no gradient
    assert x.grad.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]


def test_autograd_with_empty_rows_gives_an_empty_gradient():
    x = torch.zeros(2, 0, requires_grad=True)
    values, _ = attnkit.topk(x, 3)
    values.sum().backward()
    assert x.grad.shape == (2, 0)


def test_autograd_undoes_a_wrapped_int32_index_offset():
    # With check=False an int32 offset that overflows wraps the indices; the gradient must
    # still reach the selected columns (4 and 3 at columns 1 and 2).
    x = torch.tensor([[1.0, 4.0, 3.0, 2.0]], requires_grad=True)
    off = torch.tensor([2**31 - 2], dtype=torch.int32)
    values, indices = attnkit.topk(x, 2, index_offset=off, indices_dtype=torch.int32, check=False)
    assert indices.tolist() == [[2**31 - 1, -2**31]]
    values.sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 1.0, 0.0]]


@pytest.mark.parametrize("route", ["grad", "op", "op_offset", "out_op", "compile"])
def test_meta_row_tensors_with_a_real_x_are_refused(route):
    # A meta tensor among the arguments sends the dispatcher to the fake kernel, which must
    # refuse it as the eager path does rather than hand back uninitialised outputs.
    x = torch.randn(3, 10)
    end = torch.tensor([3, 5, 7], device="meta")
    with pytest.raises(Exception, match="end is on device meta|index_offset is on device meta"):
        if route == "grad":
            attnkit.topk(x.requires_grad_(), 2, end=end)
        elif route == "op":
            torch.ops.attnkit.topk(x, 2, end=end)
        elif route == "op_offset":
            torch.ops.attnkit.topk(x, 2, index_offset=torch.zeros(3, dtype=torch.long,
                                                                  device="meta"))
        elif route == "out_op":
            oi = torch.full((3, 2), -5, dtype=torch.int64)
            try:
                torch.ops.attnkit.topk_out(x, 2, True, "none", None, end, None, -1, None,
                                           "largest", "lowest_index", None, None, oi)
            finally:
                assert (oi == -5).all()
        else:
            torch.compile(lambda a, e: attnkit.topk(a, 2, end=e), fullgraph=True)(x, end)
    # Shape propagation with a meta x still works.
    assert torch.ops.attnkit.topk(torch.empty(3, 10, device="meta"), 2)[1].shape == (3, 2)


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("kwargs, fragment", [
    ({"end": _meta(4, dtype=torch.int64)}, "end has shape [4]; expected [B] = [3]"),
    ({"begin": _meta(3)}, "begin.dtype = float32"),
    ({"index_offset": _meta(3, 1, dtype=torch.int64)}, "index_offset has shape [3, 1]"),
    ({"end": torch.tensor([1, 2, 3])}, "end is on device cpu while x is on meta"),
])
def test_meta_x_row_tensors_are_checked_as_the_op_checks_them(kwargs, fragment):
    # Shape propagation on meta tensors refuses what the op would refuse on real ones.
    with pytest.raises(ValueError if "dtype" not in fragment else TypeError,
                       match=re.escape(fragment)):
        torch.ops.attnkit.topk(_meta(3, 10), 2, **kwargs)
    with pytest.raises(ValueError, match=re.escape("out_indices has shape [3, 3]")):
        torch.ops.attnkit.topk_out(_meta(3, 10), 2, True, "none", None, None, None, -1, None,
                                   "largest", "lowest_index", None, None,
                                   _meta(3, 3, dtype=torch.int64))
    good = {name: _meta(3, dtype=torch.int32) for name in kwargs}
    assert torch.ops.attnkit.topk(_meta(3, 10), 2, **good)[1].shape == (3, 2)


@pytest.mark.parametrize("x, k, error, fragment", [
    (torch.empty(4, 10, device="meta"), -3, ValueError, "topk: k = -3 must be >= 0"),
    (torch.empty(4, 10, device="meta"), 2**31, ValueError, "must be <= 2^31 - 1"),
    (torch.empty(2, 3, 4, device="meta"), 3, ValueError, "x has shape [2, 3, 4]"),
    (torch.empty(4, 10, dtype=torch.float64, device="meta"), 3, TypeError, "x.dtype = float64"),
])
def test_shape_propagation_refuses_what_the_op_refuses(x, k, error, fragment):
    with pytest.raises(error, match=re.escape(fragment)):
        torch.ops.attnkit.topk(x, k)
    oi = torch.empty(x.shape[:-1] + (max(k, 0) if k < 2**31 else 0,), dtype=torch.int64,
                     device="meta")
    with pytest.raises(error, match=re.escape(fragment)):
        torch.ops.attnkit.topk_out(x, k, True, "none", None, None, None, -1, None, "largest",
                                   "lowest_index", None, None, oi)


@pytest.mark.parametrize("kwargs, error", [
    (dict(sorted="descending"), ValueError),
    (dict(nan="skip"), ValueError),
    (dict(ties="first"), ValueError),
    (dict(indices_dtype=torch.int16), TypeError),
    (dict(end=torch.zeros(3, dtype=torch.int32)), ValueError),
    (dict(begin=torch.zeros(4, 1, dtype=torch.int64)), ValueError),
    (dict(begin=torch.zeros(4)), TypeError),
    (dict(index_offset=torch.zeros(4, dtype=torch.float64)), TypeError),
], ids=["sorted", "nan", "ties", "indices_dtype", "end_length", "begin_rank", "begin_dtype",
        "offset_dtype"])
def test_fake_kernel_refuses_with_the_ops_message(kwargs, error):
    # Shape propagation (FakeTensorMode, as torch.compile runs it) refuses a bad call with the
    # message the op gives eagerly, before any kernel runs.
    x = torch.randn(4, 10)
    with pytest.raises(error) as eager:
        torch.ops.attnkit.topk(x, 3, **kwargs)
    assert str(eager.value).startswith("topk: ")
    with FakeTensorMode() as mode:
        fake = {name: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                for name, v in kwargs.items()}
        with pytest.raises(error) as traced:
            torch.ops.attnkit.topk(mode.from_tensor(x), 3, **fake)
    assert str(traced.value) == str(eager.value)


@pytest.mark.parametrize("layout", ["same_memory", "partial", "aliases_x", "wrong_shape"])
def test_fake_kernel_checks_caller_buffers_as_the_op(layout):
    # topk_out's shape propagation runs the op's buffer checks (shape, dtype, overlap) on the
    # tensors' metadata: the eager message, before anything is written.
    def buffers(x):
        o = torch.zeros(4, 8, dtype=torch.int64)
        if layout == "same_memory":
            return o.view(torch.float32)[:, :5], o[:, :5]
        if layout == "partial":
            return o.view(torch.float32)[:, 6:11], o[:, :5]
        if layout == "aliases_x":
            return x[:, :5], o[:, :5]
        return torch.empty(4, 5), o[:, :4]

    def call(x, ov, oi):
        torch.ops.attnkit.topk_out(x, 5, True, "none", None, None, None, -1, None, "largest",
                                   "lowest_index", None, ov, oi)

    x = torch.randn(4, 30)
    with pytest.raises(ValueError) as eager:
        call(x, *buffers(x))
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        with pytest.raises(ValueError) as traced:
            call(fx, *buffers(fx))
    fragment = "has shape" if layout == "wrong_shape" else "overlaps"
    assert fragment in str(eager.value) and fragment in str(traced.value)
    assert str(traced.value).split(" (")[0] == str(eager.value).split(" (")[0]


@pytest.mark.parametrize("dynamic", [False, True])
def test_traced_caller_buffers_must_be_separate_tensors(dynamic):
    # Disjoint views of one tensor in two dtypes: eager writes both; torch.compile keeps only
    # one of two such writes, so shape propagation refuses the pair rather than lose values.
    x = torch.randn(3, 16)
    want = attnkit.topk(x, 5, sorted="value", indices_dtype=torch.int32)
    s = torch.zeros(3, 10, dtype=torch.int32)
    attnkit.topk(x, 5, sorted="value", out_values=s[:, :5].view(torch.float32),
                 out_indices=s[:, 5:])
    assert torch.equal(s[:, :5].view(torch.float32), want.values)
    assert torch.equal(s[:, 5:], want.indices)

    def f(a, buffer):
        attnkit.topk(a, 5, sorted="value", out_values=buffer[:, :5].view(torch.float32),
                     out_indices=buffer[:, 5:])

    s.zero_()
    with pytest.raises(Exception, match="out_values and out_indices are views of one tensor"):
        # Symbolic sizes (dynamic shapes) skip the metadata checks, not this one.
        torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=dynamic)(x, s)
    assert (s == 0).all()


def test_compile_refuses_overlapping_caller_buffers_before_writing():
    x = torch.randn(4, 30)
    o = torch.zeros(4, 5, dtype=torch.int64)
    f = torch.compile(lambda a, b: attnkit.topk(a, 5, out_values=b.view(torch.float32)[:, :5],
                                                out_indices=b), fullgraph=True)
    with pytest.raises(Exception, match="out_values .* overlaps out_indices"):
        f(x, o)
    assert (o == 0).all()


def test_fake_kernel_accepts_a_good_call_with_row_tensors():
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(4, 10, dtype=torch.bfloat16))
        end = mode.from_tensor(torch.tensor([10, 3, 0, 7], dtype=torch.int32))
        values, indices = torch.ops.attnkit.topk(x, 5, end=end, indices_dtype=torch.int32)
    assert values.shape == (4, 5) and values.dtype == torch.bfloat16
    assert indices.shape == (4, 5) and indices.dtype == torch.int32


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compile_refuses_a_list_end_as_eager_does(fullgraph):
    f = torch.compile(lambda a: attnkit.topk(a, 3, end=[1, 2, 3, 4]), fullgraph=fullgraph)
    # With fullgraph torch reports the exception it observed while tracing, without the message.
    with pytest.raises(Exception if fullgraph else TypeError,
                       match=None if fullgraph else "topk: end is a list"):
        f(torch.randn(4, 10))


@pytest.mark.parametrize("source", ["item", "sum", "count", "tolist"])
def test_compile_fullgraph_with_a_data_dependent_k(source):
    # k read from a tensor is traced as an unbacked SymInt: no guard on its value, whether the
    # tensor is a graph input (whose int64 range the tracer knows) or computed in the graph.
    read = {"item": lambda t: t.item(), "sum": lambda t: t.sum().item(),
            "count": lambda t: (torch.arange(10) < t).sum().item(),
            "tolist": lambda t: t.view(1).tolist()[0]}[source]
    x = torch.randn(4, 10)
    f = torch.compile(lambda a, kk: attnkit.topk(a, read(kk), sorted=True), fullgraph=True)
    for k in (3, 5):
        values, indices = f(x, torch.tensor(k))
        want = torch.topk(x, k)
        assert torch.equal(values, want.values) and torch.equal(indices, want.indices)


@pytest.mark.parametrize("k", [3, 0])
def test_compile_fullgraph_backward_with_a_data_dependent_k(k):
    # The gradient's formula asks nothing of k's value, which is known only when the graph runs.
    x = torch.randn(4, 10, requires_grad=True)
    f = torch.compile(lambda a, kk: attnkit.topk(a, kk.item())[0].sum(), backend="aot_eager",
                      fullgraph=True)
    f(x, torch.tensor(k)).backward()
    want = torch.zeros(4, 10).scatter_(1, torch.topk(x.detach(), k).indices, 1.0)
    assert torch.equal(x.grad, want)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compile_refuses_a_k_beyond_int64_by_its_value(fullgraph):
    # Refused in the traced Python as in eager mode, not passed to the op's 64-bit schema
    # (whose own error names neither k nor its rule).
    f = torch.compile(lambda a: attnkit.topk(a, 2**70), fullgraph=fullgraph)
    with pytest.raises(Exception) as info:
        f(torch.randn(4, 10))
    assert "topk: k = 1180591620717411303424 must be in [0, 2^31 - 1]" in str(info.value)


def test_compile_refuses_a_tensor_value_fill_by_name():
    # Eagerly a 0-d tensor is read as its number; traced, its value is not known yet.
    f = torch.compile(lambda a, fill: attnkit.topk(a, 12, value_fill=fill), fullgraph=True)
    with pytest.raises(Exception) as info:
        f(torch.randn(4, 10), torch.tensor(-2.5))
    assert "topk: value_fill is a tensor; under torch.compile the fills are Python numbers" in \
        str(info.value)


def test_compile_names_a_k_read_from_an_input_tensor_by_its_value():
    # t.item() of a graph input is traced with the example's value as its hint: the message
    # quotes it.
    f = torch.compile(lambda a, kk: attnkit.topk(a, kk.item()), fullgraph=True)
    for k, rule in ((-1, "must be >= 0"), (2**31, "must be <= 2^31 - 1")):
        with pytest.raises(Exception) as info:
            f(torch.randn(4, 10), torch.tensor(k))
        assert f"topk: k = {k} {rule}" in str(info.value), str(info.value)


def test_compile_names_a_k_computed_in_the_graph_that_must_be_out_of_range():
    # A k computed from a tensor in the graph has no value while tracing, but its range may
    # already rule it out: the message says where k comes from instead of a tracer's symbol.
    def f(a, kk):
        u = kk.sum().item()
        torch._check(u >= 5)
        return attnkit.topk(a, -u)
    with pytest.raises(Exception) as info:
        torch.compile(f, fullgraph=True)(torch.randn(4, 10), torch.tensor(7))
    assert "topk: k (read from a tensor when the graph runs) must be >= 0" in str(info.value), \
        str(info.value)


@pytest.mark.parametrize("dynamic", ["declared", "automatic"])
def test_compile_names_a_dynamic_k_that_is_out_of_range_by_its_value(dynamic):
    # A Python int k traced as a dynamic size (dynamic=True, or torch's automatic dynamic
    # shapes after a second value) has its value while tracing: the message quotes it.
    f = torch.compile(lambda a, kk: attnkit.topk(a, kk, sorted="value").indices,
                      fullgraph=True, dynamic=True if dynamic == "declared" else None)
    x = torch.randn(4, 10)
    for k in (3, 5):
        assert torch.equal(f(x, k), torch.topk(x, k).indices)
    for k, rule in ((-7, "must be >= 0"), (2**31, "must be <= 2^31 - 1")):
        with pytest.raises(Exception) as info:
            f(x, k)
        assert f"topk: k = {k} {rule}" in str(info.value), str(info.value)


@_JIT_DEPRECATED
def test_forward_mode_ad_is_refused_by_name():
    import torch.autograd.forward_ad as forward_ad

    x = torch.randn(2, 10)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        with pytest.raises(NotImplementedError, match="topk: forward-mode AD"):
            attnkit.topk(dual, 3)
        # Indices carry no derivative: returning them alone is fine.
        got = attnkit.topk(dual, 3, return_values=False).indices
        assert torch.equal(torch.sort(got).values, stable_topk_indices(x, 3, True))
    with pytest.raises(NotImplementedError, match="topk: forward-mode AD"):
        torch.func.linearize(lambda a: attnkit.topk(a, 3).values, x)


@_JIT_DEPRECATED
def test_forward_mode_ad_through_the_ops_is_refused_by_name():
    # The raw ops see a dual x's tangent too; they must not drop it silently.
    import torch.autograd.forward_ad as forward_ad

    x = torch.randn(2, 10)
    values = torch.empty(2, 3)
    indices = torch.empty(2, 3, dtype=torch.int64)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        with pytest.raises(NotImplementedError, match="topk: forward-mode AD"):
            torch.ops.attnkit.topk(dual, 3)
        with pytest.raises(NotImplementedError, match="topk: forward-mode AD"):
            torch.ops.attnkit.topk_out(dual, 3, True, "none", None, None, None, -1, None,
                                       "largest", "lowest_index", None, values, indices)
        # Indices carry no derivative: returning them alone is fine.
        got = torch.ops.attnkit.topk(dual, 3, return_values=False)[1]
        assert torch.equal(torch.sort(got).values, stable_topk_indices(x, 3, True))
        torch.ops.attnkit.topk_out(dual, 3, True, "none", None, None, None, -1, None,
                                   "largest", "lowest_index", None, None, indices)
        assert torch.equal(torch.sort(indices).values, stable_topk_indices(x, 3, True))


def test_topk_out_op_refuses_values_from_an_x_that_requires_grad():
    # The out= op has no backward: written values would drop x's gradient silently.
    x = torch.randn(2, 10, requires_grad=True)
    values = torch.full((2, 3), 7.0)
    indices = torch.full((2, 3), -5, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="topk: out_values cannot be used when x requires"):
        torch.ops.attnkit.topk_out(x, 3, True, "none", None, None, None, -1, None,
                                   "largest", "lowest_index", None, values, indices)
    assert torch.equal(values, torch.full((2, 3), 7.0))  # nothing written
    assert torch.equal(indices, torch.full((2, 3), -5, dtype=torch.int64))
    # Indices alone carry no derivative, and without grad mode nothing is recorded anyway.
    torch.ops.attnkit.topk_out(x, 3, True, "none", None, None, None, -1, None,
                               "largest", "lowest_index", None, None, indices)
    assert torch.equal(torch.sort(indices).values, stable_topk_indices(x.detach(), 3, True))
    with torch.no_grad():
        torch.ops.attnkit.topk_out(x, 3, True, "value", None, None, None, -1, None,
                                   "largest", "lowest_index", None, values, indices)
    assert torch.equal(values, torch.topk(x.detach(), 3).values)


def test_nested_x_is_refused_by_name():
    nested = torch.nested.nested_tensor([torch.randn(3), torch.randn(4)], layout=torch.jagged)
    with pytest.raises(ValueError, match="topk: x is a nested tensor"):
        attnkit.topk(nested, 2)


def _per_sample(f, *samples):
    """f called on each sample of its arguments (None: an unbatched argument), stacked."""
    v = next(a.shape[0] for a, batched in samples if batched)
    outs = [f(*(a[i] if batched else a for a, batched in samples)) for i in range(v)]
    return torch.stack(outs)


@pytest.mark.parametrize("layout", ["columns", "rows", "unbatched_x", "nested"])
def test_vmap_calls_the_op_once_on_every_samples_rows(layout):
    # The batching rule reshapes the samples' rows into one call; results equal the op on each
    # sample, with ragged ends, offsets and ties (lowest index first).
    rng = rng_for("vmap", layout)
    v, b, n, k = 5, 3, 40, 6
    ends = torch.from_numpy(rng.integers(0, n + 1, size=(v, b))).long()
    offsets = torch.from_numpy(rng.integers(-9, 9, size=(v, b))).long()

    def f(r, e=None, o=None):
        res = attnkit.topk(r, k, sorted="value", end=e, index_offset=o, nan="ignore")
        return torch.cat([res.values.float(), res.indices.float()], -1)

    if layout == "columns":  # vmap over the last dimension of one matrix: strided samples
        x = torch_rows("ties4", (n, v), "float32", rng)
        got = torch.func.vmap(f, in_dims=1)(x)
        want = _per_sample(f, (x.T.contiguous(), True))
    elif layout == "rows":
        x = torch_rows("nan", (v, b, n), "bfloat16", rng)
        got = torch.func.vmap(f)(x, ends, offsets)
        want = _per_sample(f, (x, True), (ends, True), (offsets, True))
    elif layout == "unbatched_x":
        x = torch_rows("normal@1", (b, n), "float16", rng)
        got = torch.func.vmap(f, in_dims=(None, 0, None))(x, ends, offsets[0])
        want = _per_sample(f, (x, False), (ends, True), (offsets[0], False))
    else:
        x = torch_rows("ties4", (2, v, n), "float32", rng)
        got = torch.func.vmap(torch.func.vmap(f))(x)
        want = torch.stack([_per_sample(f, (x[i], True)) for i in range(2)])
    assert torch.equal(tensor_bits(got), tensor_bits(want))


def test_vmap_keeps_the_gradient_and_names_a_samples_shapes():
    x = torch.randn(4, 3, 30, requires_grad=True)
    torch.func.vmap(lambda r: attnkit.topk(r, 5).values)(x).square().sum().backward()
    y = x.detach().clone().requires_grad_(True)
    torch.topk(y, 5).values.square().sum().backward()
    assert torch.equal(x.grad, y.grad)
    # A sample's end of the wrong length is named with the sample's shapes, not the batch's.
    with pytest.raises(ValueError, match=r"topk: end has shape \[2\]; expected \[B\] = \[3\]"):
        torch.func.vmap(lambda r, e: attnkit.topk(r, 5, end=e).indices)(
            x.detach(), torch.full((4, 2), 7))


def test_vmap_names_a_refused_value_by_the_samples_row():
    # The one call over every sample's rows is refused; the samples then go one by one, so the
    # error names the row of the sample's own x (row 1 of sample 1, not row 3 of the batch).
    x = torch.randn(3, 2, 50)
    end = torch.full((3, 2), 50)
    end[1, 1] = 51
    with pytest.raises(ValueError, match=r"topk: end\[1\] = 51 is outside"):
        torch.func.vmap(lambda r, e: attnkit.topk(r, 5, end=e).indices)(x, end)
    rows = torch.tensor([[1.0, 2.0], [float("nan"), 1.0]])
    with pytest.raises(ValueError, match=r"x\[0\] is NaN"):
        torch.func.vmap(lambda r: attnkit.topk(r, 1, nan="raise").indices)(rows)


def test_vmap_whose_rows_one_call_cannot_take_runs_sample_by_sample():
    # 4 samples of 2^30 empty rows: each a valid call, 2^32 rows together are not.
    got = torch.func.vmap(lambda r: attnkit.topk(r, 0).indices)(torch.empty(4, 2**30, 0))
    assert got.shape == (4, 2**30, 0)


def test_vmap_over_a_torch_begin_with_a_numpy_x_is_refused_by_name():
    x = np.zeros((2, 10), np.float32)
    with pytest.raises(TypeError, match=r"topk: begin is a torch tensor under .* but x is a "
                                        r"ndarray; pass x as a torch tensor there"):
        torch.func.vmap(lambda b: attnkit.topk(x, 2, begin=b).indices)(
            torch.zeros(3, 2, dtype=torch.int64))


def test_vmap_runs_without_torchs_per_sample_fallback():
    # torch >= 2.5 takes attnkit's batching rule; older versions warn and loop over samples.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.func.vmap(lambda r: attnkit.topk(r, 2).indices)(torch.randn(3, 2, 10))
    fallback = [w for w in caught if "batching rule" in str(w.message)]
    assert bool(fallback) != hasattr(torch.library, "register_vmap")


def test_vmap_with_out_buffers_is_refused_by_name():
    rows, out = torch.randn(5, 2, 10), torch.empty(5, 2, 3, dtype=torch.long)
    with pytest.raises(NotImplementedError, match="out_values/out_indices cannot be used under"):
        torch.func.vmap(lambda r, o: attnkit.topk(r, 3, out_indices=o))(rows, out)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_big_endian_row_arrays_are_refused_by_name(requires_grad):
    x = torch.randn(3, 10, requires_grad=requires_grad)
    with pytest.raises(TypeError, match=r"topk: end.dtype = >i8 is not in this machine's byte"):
        attnkit.topk(x, 2, end=np.array([3, 5, 7], dtype=">i8"))


def test_compile_fullgraph_with_numpy_end():
    x = torch.randn(3, 10)
    end = np.array([3, 5, 7], dtype=np.int64)
    got = torch.compile(lambda a: attnkit.topk(a, 2, end=end), fullgraph=True)(x)
    want = attnkit.topk(x, 2, end=end)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.values, want.values)


def test_tensors_without_storage_are_refused_by_name():
    # A wrapper subclass holds no memory of its own; the dispatcher's op reaches its parts.
    from torch.testing._internal.two_tensor import TwoTensor

    a = torch.randn(2, 10, generator=torch.Generator().manual_seed(5))
    wrapped = TwoTensor(a, a.clone())
    with pytest.raises(ValueError, match=r"topk: x \(TwoTensor, 20 elements\) has no storage "
                                         r"of its own.*torch.ops.attnkit.topk"):
        attnkit.topk(wrapped, 3)
    with pytest.raises(ValueError, match=r"topk: x \(Tensor, 120 elements\) has no storage"):
        attnkit.topk(torch._efficientzerotensor(3, 40), 2)
    _, indices = torch.ops.attnkit.topk(wrapped, 3, True, "none", None, None, torch.int64, True,
                                        None, -1, None, "largest", "lowest_index", None)
    assert torch.equal(indices.a, torch.topk(a, 3, sorted=False).indices.sort().values)


def test_caller_buffers_under_functionalize_are_refused_by_name():
    def f(x):
        out = torch.empty(2, 3, dtype=torch.int64)
        attnkit.topk(x, 3, out_indices=out, return_values=False)
        return out

    message = "out_values/out_indices cannot be used under torch.func.functionalize"
    with pytest.raises(NotImplementedError, match=message):
        torch.func.functionalize(f)(torch.randn(2, 10))
    g = torch.func.functionalize(lambda x: attnkit.topk(x, 3).indices)
    x = torch.randn(2, 10, generator=torch.Generator().manual_seed(6))
    assert torch.equal(g(x), attnkit.topk(x, 3).indices)
