# SPDX-License-Identifier: Apache-2.0
"""attnkit's ops as PyTorch custom ops (``torch.ops.attnkit.*``).

Importing this module registers every op with ``torch.library`` (schema, CPU and CUDA kernels,
and a fake kernel for shape propagation), so that the ops work inside
``torch.compile(fullgraph=True)`` and CUDA graph capture. ``attnkit.topk`` called on torch
tensors inside ``torch.compile`` routes here by itself; eager calls skip the dispatcher.

Ops
---
``attnkit::topk(Tensor x, SymInt k, bool largest, str sorted, Tensor? begin, Tensor? end,
ScalarType? indices_dtype, bool return_values, Tensor? index_offset, int index_fill,
float? value_fill, str nan, str ties, bool? check) -> (Tensor values, Tensor indices)``
    ``values`` is an empty tensor when ``return_values`` is False.

``attnkit::topk_out(..., Tensor(a!)? out_values, Tensor(b!) out_indices) -> ()``
    Writes caller buffers in place.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import topk as _topk_module

_LIB = torch.library.Library("attnkit", "DEF")

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
    return (*x.shape[:-1], k) if x.dim() >= 1 else (k,)


def _topk_impl(x, k, largest, sorted, begin, end, indices_dtype, return_values, index_offset,
               index_fill, value_fill, nan, ties, check):
    values, indices = _topk_module.topk(
        x, k, largest=largest, sorted=sorted, begin=begin, end=end,
        indices_dtype=indices_dtype or torch.int64, return_values=return_values,
        index_offset=index_offset, index_fill=index_fill, value_fill=value_fill, nan=nan,
        ties=ties, check=check)
    if values is None:
        values = x.new_empty((0,))
    return values, indices


def _topk_fake(x, k, largest, sorted, begin, end, indices_dtype, return_values, index_offset,
               index_fill, value_fill, nan, ties, check):
    shape = _out_shape(x, k)
    values = x.new_empty(shape) if return_values else x.new_empty((0,))
    return values, x.new_empty(shape, dtype=indices_dtype or torch.int64)


def _topk_out_impl(x, k, largest, sorted, begin, end, index_offset, index_fill, value_fill, nan,
                   ties, check, out_values, out_indices):
    _topk_module.topk(
        x, k, largest=largest, sorted=sorted, begin=begin, end=end,
        return_values=out_values is not None, out_values=out_values, out_indices=out_indices,
        index_offset=index_offset, index_fill=index_fill, value_fill=value_fill, nan=nan,
        ties=ties, check=check)


def _topk_out_fake(x, k, largest, sorted, begin, end, index_offset, index_fill, value_fill, nan,
                   ties, check, out_values, out_indices):
    return None


for _key in ("CPU", "CUDA"):
    _LIB.impl("topk", _topk_impl, _key)
    _LIB.impl("topk_out", _topk_out_impl, _key)
torch.library.register_fake("attnkit::topk", _topk_fake, lib=_LIB)
torch.library.register_fake("attnkit::topk_out", _topk_out_fake, lib=_LIB)


def _compiled_topk(x: torch.Tensor, k: int, *, largest: bool, sorted: Any, begin, end,
                   indices_dtype: Any, return_values: bool, out_values, out_indices,
                   index_offset, index_fill: int, value_fill: Optional[float], nan: str,
                   ties: str, check: Optional[bool]):
    """attnkit.topk's path inside torch.compile: the same arguments, through the dispatcher."""
    order = {True: "value", False: "none"}.get(sorted, sorted) if isinstance(sorted, bool) else sorted
    if out_indices is not None:
        torch.ops.attnkit.topk_out(
            x, k, largest, order, begin, end, index_offset, index_fill, value_fill, nan, ties,
            check, out_values if return_values else None, out_indices)
        return (out_values if return_values else None), out_indices
    if isinstance(indices_dtype, str):
        indices_dtype = getattr(torch, indices_dtype)
    values, indices = torch.ops.attnkit.topk(
        x, k, largest, order, begin, end, indices_dtype, return_values, index_offset, index_fill,
        value_fill, nan, ties, check)
    return (values if return_values else None), indices
