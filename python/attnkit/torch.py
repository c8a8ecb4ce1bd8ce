# SPDX-License-Identifier: Apache-2.0
"""attnkit's ops as PyTorch custom ops (``torch.ops.attnkit.*``).

Importing this module registers every op with ``torch.library`` (schema, CPU and CUDA kernels,
a fake kernel for shape propagation and an autograd formula), so that the ops work inside
``torch.compile(fullgraph=True)``, in CUDA graph capture and under autograd. ``attnkit.topk``
called on torch tensors routes here by itself inside ``torch.compile``, ``torch.jit.trace``, a
dispatch mode (``make_fx``, FakeTensorMode) or a ``torch.func`` transform (``vmap``), and when
autograd must record the call; other eager calls skip the dispatcher.

Ops
---
``attnkit::topk(Tensor x, SymInt k, bool largest, str sorted, Tensor? begin, Tensor? end,
ScalarType? indices_dtype, bool return_values, Tensor? index_offset, int index_fill,
float? value_fill, str nan, str ties, bool? check) -> (Tensor values, Tensor indices)``
    ``values`` is an empty tensor when ``return_values`` is False. Differentiable in ``x``
    by reverse mode: the gradient of a selected value flows to its element; padding slots
    (those after a row's first min(k, selectable) entries) carry none. A dual ``x`` of
    forward-mode AD raises ``NotImplementedError`` when values are returned; under
    ``torch.func.jvp`` the op does not see the tangent and its outputs carry none (a zero
    tangent), where ``attnkit.topk`` refuses the transform by name.

``attnkit::topk_out(..., Tensor(a!)? out_values, Tensor(b!) out_indices) -> ()``
    Writes caller buffers in place.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch

from . import _arrays, _ext
from .topk import _CHECKS, _NANS, _ORDERS, _TIES, _choice
from .topk import _dynamo_tracing, _kernel_topk, _refuse_forward_ad, _refuse_grad_into_buffers

_LIB = torch.library.Library("attnkit", "DEF")

# The op's schema takes `sorted` by name only (attnkit.topk turns a bool into one).
_OP_ORDERS = {name: code for name, code in _ORDERS.items() if isinstance(name, str)}

_LIB.define(
    "topk(Tensor x, SymInt k, bool largest=True, str sorted='none', Tensor? begin=None, "
    "Tensor? end=None, ScalarType? indices_dtype=None, bool return_values=True, "
    "Tensor? index_offset=None, int index_fill=-1, float? value_fill=None, "
    "str nan='largest', str ties='lowest_index', bool? check=None) -> (Tensor, Tensor)"
)
_LIB.define(
    "topk_out(Tensor x, SymInt k, bool largest, str sorted, Tensor? begin, Tensor? end, "
    "Tensor? index_offset, int index_fill, float? value_fill, str nan, str ties, bool? check, "
    "Tensor(a!)? out_values, Tensor(b!) out_indices) -> ()"
)


def _out_shape(x: torch.Tensor, k: int) -> tuple:
    # A k that topk refuses gets empty outputs here; the op itself then names it.
    k = k if 0 <= k <= 2**31 - 1 else 0
    return (*x.shape[:-1], k) if x.dim() >= 1 else (k,)


def _topk_impl(x, k, largest=True, sorted="none", begin=None, end=None, indices_dtype=None,
               return_values=True, index_offset=None, index_fill=-1, value_fill=None,
               nan="largest", ties="lowest_index", check=None):
    _choice("sorted", sorted, _OP_ORDERS)
    if return_values:
        # A dual x reaches this kernel with its tangent (its autograd formula is reached only
        # when x requires grad): refused, as attnkit.topk refuses it, not dropped.
        _refuse_forward_ad(torch, x)
    values, indices = _kernel_topk(
        x.detach(), k, largest=largest, sorted=sorted, begin=begin, end=end,
        indices_dtype=indices_dtype or torch.int64, return_values=return_values,
        index_offset=index_offset, index_fill=index_fill, value_fill=value_fill, nan=nan,
        ties=ties, check=check)
    if values is None:
        values = x.new_empty((0,))
    return values, indices


def _refuse_meta_arguments(x, **tensors):
    """The dispatcher sends a call to the fake kernel when any tensor is on the meta device.
    With a real x that is a mistake (no data to read or write): refused as the eager path
    refuses it, rather than answered with uninitialised outputs. A meta x (shape propagation)
    takes meta tensors only, as a real x takes tensors on its own device."""
    x_meta = x.device.type == "meta"
    for name, t in tensors.items():
        if t is not None and (t.device.type == "meta") != x_meta:
            raise ValueError(f"topk: {name} is on device {t.device} while x is on {x.device}; "
                             + ("a meta x takes meta tensors only" if x_meta
                                else "attnkit runs on cpu and cuda tensors"))


def _check_fake_call(x, k, sorted="none", nan="largest", ties="lowest_index",
                     indices_dtype=None, largest=True, index_fill=-1, value_fill=None,
                     begin=None, end=None, index_offset=None, out_values=None,
                     out_indices=None) -> None:
    """The rules that shapes, dtypes and options alone decide, as the op words them, so that
    shape propagation refuses what the op would. k may be a data-dependent SymInt
    (``t.item()``): a check on it becomes a runtime assert instead of a guard. With concrete
    sizes the op's own checks run on the tensors' metadata (no data is read): the inputs', and
    with ``out_indices`` the buffers' (shapes, dtypes, overlaps); symbolic sizes are left to
    the call, so that no check adds a guard; whether the two buffers share a tensor is
    decided either way."""
    if x.dim() not in (1, 2):
        raise ValueError(f"topk: x has shape {list(x.shape)}; expected [B, N] or [N]")
    dtype = str(x.dtype).removeprefix("torch.")
    if dtype not in _arrays.X_DTYPES:
        raise TypeError(f"topk: x.dtype = {dtype}; expected float32, bfloat16 or float16")
    # k may be a SymInt (a dynamic size, or t.item()): an unbacked one is checked when the
    # graph runs; the message names k's value wherever the trace has one (_k_is).
    torch._check_value(k >= 0, lambda: f"topk: {_k_is(k)} must be >= 0")
    torch._check_value(k <= 2**31 - 1, lambda: f"topk: {_k_is(k)} must be <= 2^31 - 1")
    order = _choice("sorted", sorted, _OP_ORDERS)
    nan_code = _choice("nan", nan, _NANS)
    ties_code = _choice("ties", ties, _TIES)
    if indices_dtype not in (None, torch.int32, torch.int64):
        raise TypeError(f"topk: indices_dtype = {indices_dtype}; expected int32 or int64")
    tensors = {"x": x, "out_indices": out_indices, "out_values": out_values, "begin": begin,
               "end": end, "index_offset": index_offset}
    storages = {name: _storage_of(t, name) for name, t in tensors.items() if t is not None}
    sizes = [n for t in tensors.values() if t is not None
             for n in (*t.shape, *t.stride(), t.storage_offset())]
    if all(type(n) is int for n in (k, *sizes)):
        checked, checked_storages = tensors, storages
        if out_indices is None:
            # The indices the op makes, as a buffer of their own, so that the op's checks of
            # the outputs (an index_fill that int32 indices cannot hold) run here too.
            made = x.new_empty(_out_shape(x, k), dtype=indices_dtype or torch.int64)
            checked = {**tensors, "out_indices": made}
            checked_storages = {**storages, "out_indices": _storage_of(made, "out_indices")}
        views = _metadata_views(checked, checked_storages)
        options = (k, bool(largest), order, nan_code, ties_code, index_fill, value_fill,
                   _CHECKS[False], 0)
        _ext.topk_workspace_size(*views.values(), *options)
    if out_values is not None and storages["out_values"] == storages["out_indices"]:
        # Views of one tensor in two dtypes, both written by the op: torch.compile (AOT
        # autograd) keeps only one of the two writes when the views are made inside the
        # compiled code, so the values would be lost without an error. Symbolic sizes
        # (dynamic shapes) skip the checks above, not this one.
        raise ValueError("topk: out_values and out_indices are views of one tensor; under "
                         "torch.compile and shape propagation they must be separate tensors "
                         "(torch keeps only one of two writes into views of one tensor in two "
                         "dtypes)")


def _k_is(k) -> str:
    """How a message names k: by its value where the trace knows one (an int, or a dynamic
    size, which int() pins to the value this trace saw; the call fails either way), else as
    read from a tensor (an unbacked SymInt, computed in the graph, whose value exists only when
    the graph runs and which int() cannot pin while tracing)."""
    if isinstance(k, int):
        return f"k = {k}"
    from torch.fx.experimental.symbolic_shapes import has_free_unbacked_symbols
    if has_free_unbacked_symbols(k):
        return "k (read from a tensor when the graph runs)"
    return f"k = {int(k)}"


def _storage_of(t: torch.Tensor, name: str):
    """A key that two views of one storage share; a tensor with no storage to ask (some
    subclasses, functional tensors) gets a key of its own."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return ("view", name)


def _metadata_views(tensors: dict, storages: dict) -> dict:
    """Raw views of fake tensors' metadata for the op's checks, which read no data. Each
    storage gets a placeholder address range of its own, 2^56 bytes apart (six storages stay
    below the checks' 2^62-byte bound), and a view its storage offset within it, so that the
    overlap checks see which tensors share memory (under torch.compile, the first shape
    propagation still sees the caller's aliasing). Meta tensors, all on one device by then,
    are checked as CPU tensors: the rules are the same and need no CUDA build."""
    bases: dict = {}
    views = {}
    for name, t in tensors.items():
        if t is None:
            views[name] = None
            continue
        dtype = _arrays._torch_dtype_name(t.dtype)
        if dtype is None:
            raise _arrays.no_such_dtype(name, t.dtype)
        base = bases.setdefault(storages[name], (len(bases) + 1) << 56)
        device = (1, t.device.index or 0) if t.device.type == "cuda" else (0, 0)
        views[name] = (base + t.storage_offset() * t.element_size(), tuple(t.shape),
                       tuple(t.stride()), _arrays.DTYPE_CODES[dtype], *device)
    return views


def _topk_fake(x, k, largest=True, sorted="none", begin=None, end=None, indices_dtype=None,
               return_values=True, index_offset=None, index_fill=-1, value_fill=None,
               nan="largest", ties="lowest_index", check=None):
    _refuse_meta_arguments(x, begin=begin, end=end, index_offset=index_offset)
    _check_fake_call(x, k, sorted, nan, ties, indices_dtype, largest, index_fill, value_fill,
                     begin, end, index_offset)
    shape = (*x.shape[:-1], k)
    values = x.new_empty(shape) if return_values else x.new_empty((0,))
    return values, x.new_empty(shape, dtype=indices_dtype or torch.int64)


def _topk_out_impl(x, k, largest, sorted, begin, end, index_offset, index_fill, value_fill, nan,
                   ties, check, out_values, out_indices):
    _choice("sorted", sorted, _OP_ORDERS)
    if out_values is not None:
        _refuse_forward_ad(torch, x)
        # The op has no backward: values written from an x that requires grad would drop it.
        if x.requires_grad and torch.is_grad_enabled():
            _refuse_grad_into_buffers("out_values")
    _kernel_topk(
        x.detach(), k, largest=largest, sorted=sorted, begin=begin, end=end,
        return_values=out_values is not None, out_values=out_values, out_indices=out_indices,
        index_offset=index_offset, index_fill=index_fill, value_fill=value_fill, nan=nan,
        ties=ties, check=check)


def _topk_out_fake(x, k, largest, sorted, begin, end, index_offset, index_fill, value_fill, nan,
                   ties, check, out_values, out_indices):
    _refuse_meta_arguments(x, begin=begin, end=end, index_offset=index_offset,
                           out_values=out_values, out_indices=out_indices)
    _check_fake_call(x, k, sorted, nan, ties, None, largest, index_fill, value_fill, begin, end,
                     index_offset, out_values, out_indices)
    return None


def _setup_context(ctx, inputs, output):
    x, k = inputs[0], inputs[1]
    begin, end, index_offset = inputs[4], inputs[5], inputs[8]
    ctx.k = k
    ctx.x_shape = x.shape
    ctx.nan_ignored = inputs[11] == "ignore"
    ctx.return_values = inputs[7]
    ctx.save_for_backward(output[1], begin, end, index_offset,
                          x if ctx.nan_ignored else None)


def _backward(ctx, grad_values, grad_indices):
    indices, begin, end, index_offset, x = ctx.saved_tensors
    none = (None,) * 13
    if grad_values is None or not ctx.return_values:  # no values: nothing flows back to x
        return (None,) + none
    # Rows as [B, N]; a 1-D x is one row. No test of k here: under torch.compile a k read from
    # a tensor is known only when the graph runs, and k = 0 or B = 0 scatters nothing.
    n = ctx.x_shape[-1]
    if n == 0:  # nothing selectable: a zero gradient of x's shape
        return (grad_values.new_zeros(ctx.x_shape),) + none
    idx = indices.reshape(math.prod(ctx.x_shape[:-1]), indices.shape[-1]).long()
    grad = grad_values.reshape(idx.shape)
    rows = idx.shape[0]
    # Real slots are the first min(k, selectable) of each row, whatever their indices hold
    # (a real index may equal index_fill): the same count the kernels pad after.
    hi = (end.long() if end is not None else torch.full((rows,), n, device=idx.device)).clamp(0, n)
    lo = begin.long() if begin is not None else torch.zeros_like(hi)
    lo = torch.minimum(lo.clamp(min=0), hi)
    selectable = hi - lo
    if ctx.nan_ignored:
        col = torch.arange(n, device=idx.device)
        in_range = (col >= lo[:, None]) & (col < hi[:, None])
        selectable = selectable - (torch.isnan(x.reshape(rows, n)) & in_range).sum(-1)
    slot = torch.arange(idx.shape[-1], device=idx.device)
    real = slot[None, :] < selectable.clamp(max=ctx.k)[:, None]
    cols = idx - index_offset.long()[:, None] if index_offset is not None else idx
    if indices.dtype == torch.int32:  # int32 indices wrap: undo the offset modulo 2^32
        cols = cols & 0xFFFFFFFF
    cols = torch.where(real, cols, 0).clamp(0, max(n - 1, 0))
    grad_x = grad.new_zeros((rows, n))
    grad_x.scatter_add_(-1, cols, torch.where(real, grad, 0))
    return (grad_x.reshape(ctx.x_shape),) + none


def _topk_vmap(info, in_dims, x, k, largest=True, sorted="none", begin=None, end=None,
               indices_dtype=None, return_values=True, index_offset=None, index_fill=-1,
               value_fill=None, nan="largest", ties="lowest_index", check=None):
    """``torch.func.vmap``'s batching rule: the rows of every sample as one [V * B, N] call (one
    launch), where vmap's fallback would call the op once a sample on slices whose last
    dimension may be strided (``in_dims=1``). A sample's x of [N] is one row. A sample whose
    x or row tensors have other shapes, or a call the op refuses (a bad ``end``, a NaN with
    ``nan="raise"``, more rows than one call takes), goes through the op once a sample, so
    that its own checks name the sample's shapes and rows. (The dispatcher leaves out trailing
    arguments that hold their defaults, and their in_dims with them.)"""
    v = info.batch_size
    in_dims = tuple(in_dims) + (None,) * (14 - len(in_dims))

    def batched(t, dim):
        if t is None:
            return None
        return t.movedim(dim, 0) if dim is not None else t.expand(v, *t.shape)

    x = batched(x, in_dims[0])
    rows_args = {"begin": batched(begin, in_dims[4]), "end": batched(end, in_dims[5]),
                 "index_offset": batched(index_offset, in_dims[8])}
    options = dict(largest=largest, sorted=sorted, indices_dtype=indices_dtype,
                   return_values=return_values, index_fill=index_fill, value_fill=value_fill,
                   nan=nan, ties=ties, check=check)

    def per_sample():
        def sample(t, i):  # no samples: one of their shapes, for the op's checks
            return None if t is None else t[i] if v else t.new_empty(t.shape[1:])

        results = [torch.ops.attnkit.topk(
            sample(x, i), k, **{name: sample(t, i) for name, t in rows_args.items()}, **options)
            for i in range(max(v, 1))]
        return tuple(torch.stack([r[j] for r in results])[:v] for j in (0, 1)), (0, 0)

    rows = 1 if x.dim() == 2 else x.shape[1] if x.dim() == 3 else None
    if rows is None or any(t is not None and tuple(t.shape[1:]) != (rows,)
                           for t in rows_args.values()):
        return per_sample()
    flat = x.reshape(v * rows, x.shape[-1])
    if flat.stride(-1) != 1:  # a batch dimension that was last: the op reads contiguous rows
        flat = flat.contiguous()
    flat_rows = {name: None if t is None else t.reshape(v * rows)
                 for name, t in rows_args.items()}
    try:
        values, indices = torch.ops.attnkit.topk(flat, k, **flat_rows, **options)
    except (ValueError, TypeError):
        return per_sample()
    shape = (v, *x.shape[1:-1], indices.shape[-1])
    values = values.reshape(shape) if return_values else values.new_empty((v, 0))
    return (values, indices.reshape(shape)), (0, 0)


for _key in ("CPU", "CUDA"):
    _LIB.impl("topk", _topk_impl, _key)
    _LIB.impl("topk_out", _topk_out_impl, _key)
torch.library.register_fake("attnkit::topk", _topk_fake, lib=_LIB)
torch.library.register_fake("attnkit::topk_out", _topk_out_fake, lib=_LIB)
torch.library.register_autograd("attnkit::topk", _backward, setup_context=_setup_context,
                                lib=_LIB)
if hasattr(torch.library, "register_vmap"):  # torch >= 2.5; earlier ones loop over the samples
    torch.library.register_vmap("attnkit::topk", _topk_vmap, lib=_LIB)


def _dispatched_topk(x: torch.Tensor, k: int, *, largest: bool, sorted: Any, begin, end,
                     indices_dtype: Any, return_values: bool, out_values, out_indices,
                     index_offset, index_fill: int, value_fill: Optional[float], nan: str,
                     ties: str, check: Optional[bool]):
    """attnkit.topk through the dispatcher: the same arguments and results."""
    order = ("value" if sorted else "none") if isinstance(sorted, bool) else sorted
    # The op's schema takes tensors: NumPy begin/end/index_offset become tensors, as copies of
    # their [B] values: autograd saves them for backward, and a write to the caller's array
    # between forward and backward, which torch's version counters cannot see, must not move
    # the gradient. Lists and other non-arrays are refused as on the eager path.
    # Dynamo traces NumPy arrays as tensors already and reads none of their attributes.
    compiling = _dynamo_tracing(torch)
    for name, v in (("begin", begin), ("end", end), ("index_offset", index_offset)):
        # Lists and tuples are refused while compiling too, as the eager call refuses them.
        if v is not None and (not compiling or isinstance(v, (list, tuple))):
            _arrays.check_array(v, name)
            if isinstance(v, np.ndarray):
                _arrays.check_byte_order(v, name)
    begin, end, index_offset = (
        v if v is None or isinstance(v, torch.Tensor)
        # On the CPU, where the array is, whatever torch's default device.
        else torch.as_tensor(v.copy(), device="cpu") if not compiling and isinstance(v, np.ndarray)
        else torch.as_tensor(v).clone()
        for v in (begin, end, index_offset))
    if isinstance(indices_dtype, str):
        indices_dtype = getattr(torch, indices_dtype)
    if out_indices is not None or out_values is not None:
        # Caller buffers: the out op writes both, so the one not given is made here, as the
        # eager call makes it.
        shape = _out_shape(x, k)
        if out_indices is None:
            out_indices = x.new_empty(shape, dtype=indices_dtype)
        if out_values is None and return_values:
            out_values = x.new_empty(shape)
        if not return_values:
            out_values = None
        torch.ops.attnkit.topk_out(
            x, k, largest, order, begin, end, index_offset, index_fill, value_fill, nan, ties,
            check, out_values, out_indices)
        if compiling:
            # Inductor (torch 2.15) runs the op on a copy of a buffer that is not contiguous
            # when the graph returns the buffer's contents (e.g. `out * 1`), and drops the
            # copy's write-back into the caller's buffer; after a copy_ into the buffer the op
            # writes the buffer itself. Costs one copy of [B, k] per such buffer.
            for t in (out_values, out_indices):
                if t is not None and not t.is_contiguous():
                    t.copy_(t.clone())
        return out_values, out_indices
    values, indices = torch.ops.attnkit.topk(
        x, k, largest, order, begin, end, indices_dtype, return_values, index_offset, index_fill,
        value_fill, nan, ties, check)
    return (values if return_values else None), indices
