# SPDX-License-Identifier: Apache-2.0
"""attnkit.topk on torch CUDA tensors: results against the CPU backend and torch.topk, torch's
current stream, torch.compile(fullgraph=True), CUDA graph capture and replay, errors.

Needs a CUDA GPU; scripts/gpu-check.sh runs this directory (the CPU suite is tests/python)."""

import sys

import numpy as np
import pytest
import torch

import attnkit
import attnkit.torch  # noqa: F401  (registers torch.ops.attnkit)

DEV = "cuda"


def bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def cpu_expected(x, k, **kw):
    v, i = attnkit.topk(x.cpu(), k, **kw)
    return v, i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,k", [((1, 131072), 512), ((7, 129280), 50), ((300, 8192), 2048),
                                     ((3, 1000), 1), ((2, 70000), 4096), ((2, 9000), 5000),
                                     ((5, 10), 20)])
@pytest.mark.parametrize("sorted_", ["none", "index", "value"])
def test_matches_cpu_backend(dtype, shape, k, sorted_):
    gen = torch.Generator(device=DEV).manual_seed(hash((str(dtype), shape, k, sorted_)) % 2**31)
    x = torch.randn(*shape, device=DEV, generator=gen).to(dtype)
    v, i = attnkit.topk(x, k, sorted=sorted_)
    ev, ei = cpu_expected(x, k, sorted=sorted_)
    assert v.device.type == "cuda" and i.device.type == "cuda"
    assert torch.equal(i.cpu(), ei), f"indices differ for {dtype} {shape} k={k} {sorted_}"
    assert torch.equal(bits(v.cpu()), bits(ev))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "b,n,k", [(1, 129280, 50), (64, 129280, 1024), (16, 131072, 2048), (256, 4096, 512)])
def test_values_equal_torch_topk_sorted(dtype, b, n, k):
    gen = torch.Generator(device=DEV).manual_seed(b * n + k)
    x = torch.randn(b, n, device=DEV, generator=gen).to(dtype)
    v, i = attnkit.topk(x, k, sorted=True)
    tv = torch.topk(x, k, dim=1, sorted=True).values
    assert torch.equal(bits(v), bits(tv))
    # Index sets equal the stable-sort reference (lowest index first among ties).
    ref = torch.sort(x.float(), dim=1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(i, ref)


def test_ragged_end_begin_offset_int32():
    gen = torch.Generator(device=DEV).manual_seed(3)
    b, n, k = 64, 20000, 700
    x = torch.randn(b, n, device=DEV, generator=gen).to(torch.bfloat16)
    end = torch.randint(0, n + 1, (b,), device=DEV, generator=gen, dtype=torch.int32)
    begin = (end * torch.rand(b, device=DEV, generator=gen)).to(torch.int64)
    off = torch.randint(-1000, 1000, (b,), device=DEV, generator=gen, dtype=torch.int32)
    v, i = attnkit.topk(x, k, begin=begin, end=end, index_offset=off, indices_dtype=torch.int32,
                        sorted="index")
    ev, ei = attnkit.topk(x.cpu(), k, begin=begin.cpu(), end=end.cpu(), index_offset=off.cpu(),
                          indices_dtype=torch.int32, sorted="index")
    assert torch.equal(i.cpu(), ei)
    assert torch.equal(bits(v.cpu()), bits(ev))


def test_nan_policies():
    x = torch.randn(4, 5000, device=DEV)
    x[1, 17] = float("nan")
    x[2, 100] = -float("nan")
    for nan in ("largest", "ignore"):
        v, i = attnkit.topk(x, 10, nan=nan, sorted="value")
        ev, ei = attnkit.topk(x.cpu(), 10, nan=nan, sorted="value")
        assert torch.equal(i.cpu(), ei)
        assert torch.equal(bits(v.cpu()), bits(ev))
    # Named as the CPU backend names it: the first NaN in row-major order.
    first = r'topk: x\[1, 17\] is NaN, inside row 1\'s valid range, and nan = "raise"'
    with pytest.raises(ValueError, match=first):
        attnkit.topk(x, 10, nan="raise")
    with pytest.raises(ValueError, match=first):
        attnkit.topk(x.cpu(), 10, nan="raise")
    with pytest.raises(ValueError, match=r"x\[100\] is NaN, inside x's"):  # one row, [N]
        attnkit.topk(x[2], 10, nan="raise")
    end = torch.tensor([5000, 10, 50, 5000], device=DEV, dtype=torch.int32)
    attnkit.topk(x, 10, nan="raise", end=end)  # both NaNs lie outside their rows' ranges
    with pytest.raises(ValueError, match=first):  # k > 4096: the multi-pass kernel
        attnkit.topk(x, 4500, nan="raise")
    attnkit.topk(x, 4500, nan="raise", end=end)
    # k = 0 selects nothing but still raises for a NaN in range, as on the CPU.
    with pytest.raises(ValueError, match=first):
        attnkit.topk(x, 0, nan="raise")
    with pytest.raises(ValueError, match=first):
        attnkit.topk(x.cpu(), 0, nan="raise")
    v, i = attnkit.topk(x, 0, nan="raise", end=end)
    assert v.shape == (4, 0) and i.shape == (4, 0)
    torch.cuda.synchronize()


def test_runs_on_current_stream():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.randn(8, 100000, device=DEV)
        x.mul_(2).add_(1)  # pending work on s
        v, i = attnkit.topk(x, 100, sorted=True)
        tv = torch.topk(x, 100, sorted=True).values
    s.synchronize()
    assert torch.equal(v, tv)


def test_caller_buffers_zero_copy_and_strided():
    x = torch.randn(16, 40000, device=DEV).to(torch.bfloat16)
    base_i = torch.full((16, 300), -7, dtype=torch.int64, device=DEV)
    base_v = torch.zeros((16, 300), dtype=torch.bfloat16, device=DEV)
    out_i, out_v = base_i[:, :256], base_v[:, :256]  # row stride 300 > k
    v, i = attnkit.topk(x, 256, out_indices=out_i, out_values=out_v)
    assert i.data_ptr() == out_i.data_ptr() and v.data_ptr() == out_v.data_ptr()
    ev, ei = attnkit.topk(x.cpu(), 256)
    assert torch.equal(out_i.cpu(), ei)
    assert (base_i[:, 256:] == -7).all()


def test_unaligned_and_strided_input():
    wide = torch.randn(32, 50007, device=DEV).to(torch.bfloat16)
    x = wide[:, 3:40003]  # unaligned start, row stride 50007
    v, i = attnkit.topk(x, 1000)
    ev, ei = attnkit.topk(x.cpu(), 1000)
    assert torch.equal(i.cpu(), ei)


def test_return_values_false():
    x = torch.randn(4, 10000, device=DEV)
    v, i = attnkit.topk(x, 10, return_values=False)
    assert v is None and i.shape == (4, 10)


@pytest.mark.parametrize("in_dims", [0, -1])
def test_vmap_over_cuda_rows_matches_the_cpu_backend(in_dims):
    # The batching rule's one call over every sample's rows (in_dims=-1: samples strided in
    # the last dimension, made contiguous first), with per-sample ends and offsets on the GPU.
    gen = torch.Generator(device=DEV).manual_seed(11 - in_dims)
    v, b, n, k = 6, 4, 9000, 512
    x = torch.randn(v, b, n, device=DEV, generator=gen).to(torch.bfloat16)
    x[:, :, ::7] = x[:, :, :1]  # ties across the rows
    end = torch.randint(0, n + 1, (v, b), device=DEV, generator=gen)
    off = torch.randint(-50, 50, (v, b), device=DEV, generator=gen, dtype=torch.int32)
    xs = x if in_dims == 0 else x.movedim(0, -1).contiguous()

    def f(r, e, o):
        res = attnkit.topk(r, k, end=e, index_offset=o, sorted="index")
        return res.values, res.indices

    gv, gi = torch.func.vmap(f, in_dims=(in_dims, 0, 0))(xs, end, off)
    ev, ei = attnkit.topk(x.reshape(v * b, n).cpu(), k, end=end.reshape(-1).cpu(),
                          index_offset=off.reshape(-1).cpu(), sorted="index")
    assert gi.is_cuda and gi.shape == (v, b, k)
    assert torch.equal(gi.reshape(v * b, k).cpu(), ei)
    assert torch.equal(bits(gv.reshape(v * b, k).cpu()), bits(ev))


def test_compile_fullgraph():
    def f(x):
        v, i = attnkit.topk(x, 64, sorted=True)
        return v * 2, i

    x = torch.randn(8, 30000, device=DEV)
    compiled = torch.compile(f, fullgraph=True)
    cv, ci = compiled(x)
    ev, ei = f(x)
    assert torch.equal(cv, ev) and torch.equal(ci, ei)


def test_compile_fullgraph_caller_buffers():
    # topk_out's shape propagation checks CUDA buffers on their metadata: separate buffers are
    # written as eagerly; overlapping ones are refused before anything is written.
    x = torch.randn(8, 30000, device=DEV).to(torch.bfloat16)
    end = torch.arange(29993, 30001, device=DEV, dtype=torch.int32)

    def f(a, e, ov, oi):
        attnkit.topk(a, 300, end=e, sorted="value", out_values=ov, out_indices=oi)

    ov = torch.empty(8, 300, dtype=torch.bfloat16, device=DEV)
    oi = torch.empty(8, 300, dtype=torch.int32, device=DEV)
    torch.compile(f, fullgraph=True)(x, end, ov, oi)
    ev, ei = attnkit.topk(x, 300, end=end, sorted="value", indices_dtype=torch.int32)
    assert torch.equal(oi, ei) and torch.equal(bits(ov), bits(ev))
    # The views are made inside the compiled code: aot_autograd refuses graph inputs that are
    # views of one tensor in two dtypes on its own, before any op runs.
    shared = torch.zeros(8, 300, dtype=torch.int32, device=DEV)
    g = torch.compile(lambda a, e, s: f(a, e, s.view(torch.bfloat16)[:, :300], s), fullgraph=True)
    with pytest.raises(Exception, match="out_values .* overlaps out_indices"):
        g(x, end, shared)
    assert (shared == 0).all()


def test_torch_ops_opcheck_out():
    x = torch.randn(4, 3000, device=DEV)
    oi = torch.empty(4, 16, dtype=torch.int64, device=DEV)
    ov = torch.empty(4, 16, device=DEV)
    torch.library.opcheck(torch.ops.attnkit.topk_out.default,
                          (x, 16, True, "none", None, None, None, -1, None, "largest",
                           "lowest_index", None, ov, oi))


def test_cuda_graph_capture_and_replay():
    static_x = torch.randn(32, 65536, device=DEV).to(torch.bfloat16)
    out_i = torch.empty(32, 512, dtype=torch.int32, device=DEV)
    out_v = torch.empty(32, 512, dtype=torch.bfloat16, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        attnkit.topk(static_x, 512, out_indices=out_i, out_values=out_v)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        attnkit.topk(static_x, 512, out_indices=out_i, out_values=out_v)
    for seed in range(3):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        static_x.copy_(torch.randn(32, 65536, device=DEV, generator=gen))
        g.replay()
        torch.cuda.synchronize()
        ev, ei = attnkit.topk(static_x.cpu(), 512, indices_dtype=torch.int32)
        assert torch.equal(out_i.cpu(), ei)
        assert torch.equal(bits(out_v.cpu()), bits(ev))


def _workspace_bytes(x, k, oi, ov):
    from attnkit import _arrays, _ext

    views = [_arrays.raw_view(t, n, w) for t, n, w in ((x, "x", False), (oi, "oi", True),
                                                      (ov, "ov", True))]
    return _ext.topk_workspace_size(*views, None, None, None, k, True, 0, 0, 0, -1, None, 0, 0)


@pytest.mark.parametrize("shape,k", [((2, 1 << 20), 512), ((1, 129280), 50), ((1, 1 << 20), 1),
                                     ((300, 8192), 2048)])
def test_workspace_from_torch_allocator(monkeypatch, shape, k):
    # The extension asks torch's allocator for scratch exactly when the call needs some, for the
    # bytes the size query reports, on x's device; the call is right either way, eagerly and in
    # a captured CUDA graph (whose scratch comes from the graph's pool).
    ops = sys.modules["attnkit.topk"]
    asked = []

    def recording(nbytes, index):
        asked.append((nbytes, index))
        return allocate(nbytes, index)

    allocate = ops._torch_workspace
    monkeypatch.setattr(ops, "_torch_workspace", recording)
    x = torch.randn(*shape, device=DEV).to(torch.bfloat16)
    oi = torch.empty(shape[0], k, dtype=torch.int32, device=DEV)
    ov = torch.empty(shape[0], k, dtype=torch.bfloat16, device=DEV)
    need = _workspace_bytes(x, k, oi, ov)
    if shape == (2, 1 << 20):
        assert need > 0  # two long rows are cut into slices, whose lists meet in the workspace
    attnkit.topk(x, k, out_indices=oi, out_values=ov)
    assert asked == ([(need, 0)] if need else [])
    ev, ei = attnkit.topk(x.cpu(), k, indices_dtype=torch.int32)
    assert torch.equal(oi.cpu(), ei) and torch.equal(bits(ov.cpu()), bits(ev))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        attnkit.topk(x, k, out_indices=oi, out_values=ov)
    x.copy_(torch.randn(*shape, device=DEV).to(torch.bfloat16))
    oi.fill_(-5)
    g.replay()
    torch.cuda.synchronize()
    ev, ei = attnkit.topk(x.cpu(), k, indices_dtype=torch.int32)
    assert torch.equal(oi.cpu(), ei) and torch.equal(bits(ov.cpu()), bits(ev))


def test_torch_ops_opcheck():
    x = torch.randn(4, 3000, device=DEV)
    torch.library.opcheck(torch.ops.attnkit.topk.default, (x, 16))


def test_check_true_validates_device_values():
    x = torch.randn(2, 100, device=DEV)
    with pytest.raises(ValueError, match=r"end\[1\] = 101"):
        attnkit.topk(x, 5, end=torch.tensor([100, 101], device=DEV), check=True)
    # Unchecked: clamped, no fault.
    v, i = attnkit.topk(x, 5, end=torch.tensor([100, 101], device=DEV))
    torch.cuda.synchronize()
    assert i.shape == (2, 5)


def test_check_true_reads_broadcast_row_vectors():
    # expand() gives stride 0: every row reads the one element.
    x = torch.randn(3, 100, device=DEV)
    bad = torch.tensor([101], device=DEV, dtype=torch.int32).expand(3)
    with pytest.raises(ValueError, match=r"end\[0\] = 101"):
        attnkit.topk(x, 5, end=bad, check=True)
    end = torch.tensor([40], device=DEV).expand(3)
    begin = torch.tensor([5], device=DEV).expand(3)
    offset = torch.tensor([1000], device=DEV).expand(3)
    v, i = attnkit.topk(x, 8, begin=begin, end=end, index_offset=offset, check=True)
    cv, ci = attnkit.topk(x.cpu(), 8, begin=begin.cpu(), end=end.cpu(),
                          index_offset=offset.cpu())
    assert torch.equal(i.cpu(), ci)
    assert torch.equal(v.cpu(), cv)
    assert bool(((ci >= 1005) & (ci < 1040)).all())


def test_numpy_interop_roundtrip_matches():
    x = np.random.default_rng(0).standard_normal((3, 5000)).astype(np.float32)
    v, i = attnkit.topk(torch.from_numpy(x).to(DEV), 7, sorted=True)
    nv, ni = attnkit.topk(x, 7, sorted=True)
    assert np.array_equal(i.cpu().numpy(), ni)
