# SPDX-License-Identifier: Apache-2.0
"""DeepSelect's ``deep_select.topk`` signature and defaults, on attnkit.

Switch with one import::

    from attnkit.compat.deep_select import topk

Differences: none in results for inputs DeepSelect accepts, except that ties resolve to the
lowest indices. DeepSelect's limits are lifted: any k >= 0, any N < 2^31, float16 as well,
any row stride and alignment, ``end`` checked, and a NaN with ``abort_when_nan_found=True``
raises ValueError instead of trapping the CUDA context. ``begin`` and ``hint`` are accepted
(``hint`` is ignored).
"""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple

import numpy as np

from ..topk import topk as _topk

# attnkit's argument names in error messages -> DeepSelect's.
_NAMES = [
    (re.compile(r"\bout_(values/out_indices|indices/out_values)\b"), "output_idx"),
    (re.compile(r"\bindex_fill\b"), "idx_oob_fill_value"),
    (re.compile(r"\bvalue_fill\b"), "value_oob_fill_value"),
    (re.compile(r"\bindex_offset\b"), "output_idx_offset"),
    (re.compile(r"\bout_indices\b"), "output_idx"),
    (re.compile(r"\bindices_dtype\b"), "indices_type"),
    (re.compile(r"\breturn_values\b"), "return_value"),
    (re.compile(r'\bnan = "raise"'), "abort_when_nan_found = True"),
    (re.compile(r"^topk: k = "), "topk: topk = "),
    (re.compile(r"\bx(?=\[|\.|;|,|'s\b| has\b| is\b| requires\b| \(bytes|$)"), "input"),
]


def _in_deep_select_terms(e: Exception) -> Exception:
    message = str(e)
    for pattern, name in _NAMES:
        message = pattern.sub(name, message)
    try:
        return type(e)(message)
    except Exception:  # an exception type that is not built from a message alone
        return e


def topk(
    input: Any,
    topk: int,
    sorted: bool = False,
    begin: Any = None,
    end: Any = None,
    indices_type: Any = None,
    sorted_index: bool = False,
    hint: Any = None,
    output_idx: Any = None,
    output_idx_offset: Any = None,
    idx_oob_fill_value: int = 2147483647,
    value_oob_fill_value: float = float("-inf"),
    return_value: bool = True,
    abort_when_nan_found: bool = True,
) -> Tuple[Optional[Any], Any]:
    """DeepSelect-compatible top-k (largest), returning ``(values or None, indices)``.

    ``sorted`` orders by value (descending); ``sorted_index`` by ascending index; the two are
    exclusive as in DeepSelect. ``indices_type`` defaults to int64, or to the dtype of
    ``output_idx`` when that is given. See ``attnkit.topk``.
    """
    # DeepSelect's flags are bools ("none" is no False); attnkit.topk checks return_value.
    flags = {"sorted": sorted, "sorted_index": sorted_index,
             "abort_when_nan_found": abort_when_nan_found}
    for name, flag in flags.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"topk: {name} = {flag!r}; expected a bool")
    if sorted and sorted_index:
        raise ValueError("topk: sorted and sorted_index cannot both be True")
    del hint
    order = "value" if sorted else ("index" if sorted_index else "none")
    try:
        return _topk(
            input, topk, largest=True, sorted=order, begin=begin, end=end,
            indices_dtype=indices_type,
            return_values=return_value, out_indices=output_idx, index_offset=output_idx_offset,
            index_fill=idx_oob_fill_value, value_fill=value_oob_fill_value,
            nan="raise" if abort_when_nan_found else "largest")
    except (ValueError, TypeError, MemoryError, RuntimeError) as e:  # the caller's names
        raise _in_deep_select_terms(e) from None
