# SPDX-License-Identifier: Apache-2.0
"""An independent NumPy reference of ``attnkit.topk`` (float64 comparisons; never calls attnkit).

Per row b, the candidates are the columns of ``[begin[b], end[b])``, without NaN when
``nan="ignore"``. They are ranked by preference:

- ``largest=True``: NaN first (NaN ranks above +inf), then descending value;
- ``largest=False``: ascending value, NaN last (NaN still ranks above +inf, so it is the
  last choice);
- ``-0.0 == +0.0``; ties by ascending column (a stable sort).

The first k are kept; the output order is ascending column for ``"none"``/``"index"`` and
preference order for ``"value"``. Slots past the row's candidates are padding: ``index_fill``
and ``value_fill`` (default ``-inf`` when ``largest``, ``+inf`` otherwise; rounded once, to
nearest even, from the double given to x's dtype). Values are copied
bit for bit from ``x``; ``index_offset[b]`` is added to every non-padding index.
"""

from __future__ import annotations

import builtins
from typing import Any, Optional, Tuple

import ml_dtypes
import numpy as np

FLOAT_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}

ORDER_NAMES = {"none": "none", "index": "index", "value": "value", False: "none", True: "value"}


def uint_dtype(dtype: Any) -> np.dtype:
    """The unsigned integer dtype with dtype's width (for bit comparisons)."""
    return np.dtype(f"u{np.dtype(dtype).itemsize}")


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bits of a float array, as unsigned integers of the same width."""
    a = np.asarray(a)
    return np.ascontiguousarray(a).view(uint_dtype(a.dtype))


def as_float64(x: np.ndarray) -> np.ndarray:
    """x widened exactly to float64 (every float32/bfloat16/float16 value is a float64 value)."""
    with np.errstate(invalid="ignore"):  # NaNs with payloads widen without a warning
        return np.asarray(x).astype(np.float64)


def preference_order(xf: np.ndarray, valid: np.ndarray, largest: bool) -> np.ndarray:
    """Column permutation per row, best first; invalid columns last; ties by column."""
    rows, cols = xf.shape
    col = np.broadcast_to(np.arange(cols, dtype=np.int64), (rows, cols))
    isnan = np.isnan(xf)
    finite_or_inf = np.where(isnan, 0.0, xf) + 0.0  # + 0.0 turns -0.0 into +0.0
    if largest:
        group = np.where(isnan, 0, 1)
        key = -finite_or_inf
    else:
        group = np.where(isnan, 1, 0)
        key = finite_or_inf
    group = np.where(valid, group, 2)
    # lexsort: the last key is the primary one.
    return np.lexsort((col, key, group), axis=-1)


def topk_reference(
    x: np.ndarray,
    k: int,
    *,
    largest: bool = True,
    sorted: Any = "none",
    begin: Optional[np.ndarray] = None,
    end: Optional[np.ndarray] = None,
    index_offset: Optional[np.ndarray] = None,
    index_fill: int = -1,
    value_fill: Optional[float] = None,
    nan: str = "largest",
    indices_dtype: Any = np.int64,
) -> Tuple[np.ndarray, np.ndarray]:
    """(values, indices) of the top-k of each row of x ([B, N] or [N]), as attnkit defines them.

    ``begin``/``end``/``index_offset`` are host arrays of length B (any integer dtype).
    ``nan="raise"`` is not modelled here (the tests check the exception separately)."""
    x = np.asarray(x)
    if x.dtype not in FLOAT_DTYPES.values():
        raise TypeError(f"reference: unsupported dtype {x.dtype}")
    order_name = ORDER_NAMES[sorted]
    if nan not in ("largest", "ignore"):
        raise ValueError(f"reference: nan = {nan!r} is not modelled")
    one_row = x.ndim == 1
    x2 = x.reshape(1, -1) if one_row else x
    rows, cols = x2.shape
    lo = np.zeros(rows, np.int64) if begin is None else np.asarray(begin, dtype=np.int64)
    hi = np.full(rows, cols, np.int64) if end is None else np.asarray(end, dtype=np.int64)
    offset = (np.zeros(rows, np.int64) if index_offset is None
              else np.asarray(index_offset, dtype=np.int64))
    if lo.shape != (rows,) or hi.shape != (rows,) or offset.shape != (rows,):
        raise ValueError("reference: begin/end/index_offset must have shape [B]")
    if np.any(lo < 0) or np.any(hi > cols) or np.any(lo > hi):
        raise ValueError("reference: needs 0 <= begin <= end <= N")

    xf = as_float64(x2)
    col = np.broadcast_to(np.arange(cols, dtype=np.int64), (rows, cols))
    valid = (col >= lo[:, None]) & (col < hi[:, None])
    if nan == "ignore":
        valid &= ~np.isnan(xf)
    count = valid.sum(axis=1)
    perm = preference_order(xf, valid, largest)

    kk = min(k, cols)
    chosen = perm[:, :kk]  # [B, kk], best first; slots past count[b] are not selected
    taken = np.arange(kk)[None, :] < np.minimum(count, k)[:, None]
    if order_name != "value":
        # Ascending column among the selected, selected slots before the rest.
        chosen = np.sort(np.where(taken, chosen, cols), axis=1)

    x_bits = bits(x2)
    ubits = uint_dtype(x.dtype)
    fill = value_fill if value_fill is not None else (-np.inf if largest else np.inf)
    # The fill is rounded once, from the double given, to x's dtype (NumPy's and ml_dtypes'
    # casts from float64 round correctly).
    with np.errstate(over="ignore"):
        fill_bits = np.array(fill, dtype=np.float64).astype(x.dtype).reshape(1).view(ubits)[0]

    out_bits = np.full((rows, k), fill_bits, dtype=ubits)
    out_idx = np.full((rows, k), index_fill, dtype=np.int64)
    safe = np.where(taken, chosen, 0)
    row_ix = np.arange(rows)[:, None]
    out_bits[:, :kk] = np.where(taken, x_bits[row_ix, safe], fill_bits)
    out_idx[:, :kk] = np.where(taken, safe + offset[:, None], index_fill)

    values = out_bits.view(x.dtype)
    indices = out_idx.astype(np.dtype(indices_dtype))
    if one_row:
        return values.reshape(k), indices.reshape(k)
    return values, indices


def selection_is_valid(
    x: np.ndarray,
    k: int,
    values: np.ndarray,
    indices: np.ndarray,
    *,
    largest: bool = True,
    sorted: Any = "none",
    begin: Optional[np.ndarray] = None,
    end: Optional[np.ndarray] = None,
    nan: str = "largest",
) -> Optional[str]:
    """None if (values, indices) is *a* valid top-k of x under ``ties="any"``, else the reason.

    Checks per row: the padding matches the reference's padding; the selected indices are
    distinct, inside the valid range, and point at their values bit for bit; the selected
    preference keys equal the reference's (so min(S) >= max(rest)); the order follows
    ``sorted`` (for "value": best first, ties by ascending index)."""
    order_name = ORDER_NAMES[sorted]
    ref_values, ref_indices = topk_reference(
        x, k, largest=largest, sorted="value", begin=begin, end=end, nan=nan)
    x2 = np.asarray(x).reshape(1, -1) if np.ndim(x) == 1 else np.asarray(x)
    values = np.asarray(values).reshape(x2.shape[0], k)
    indices = np.asarray(indices).reshape(x2.shape[0], k).astype(np.int64)
    ref_indices = ref_indices.reshape(x2.shape[0], k)
    ref_values = ref_values.reshape(x2.shape[0], k)
    xb = bits(x2)
    for b in range(x2.shape[0]):
        n = int(np.count_nonzero(ref_indices[b] != -1))
        if not np.array_equal(indices[b, n:], ref_indices[b, n:]):
            return f"row {b}: padding indices {indices[b, n:]} != {ref_indices[b, n:]}"
        if not np.array_equal(bits(values[b, n:]), bits(ref_values[b, n:])):
            return f"row {b}: padding values differ"
        sel = indices[b, :n]
        if len(np.unique(sel)) != n:
            return f"row {b}: repeated indices {sel}"
        lo = 0 if begin is None else int(begin[b])
        hi = x2.shape[1] if end is None else int(end[b])
        if np.any(sel < lo) or np.any(sel >= hi):
            return f"row {b}: index outside [{lo}, {hi}): {sel}"
        if not np.array_equal(bits(values[b, :n]), xb[b, sel]):
            return f"row {b}: values are not the bits of x at the indices"
        xf = as_float64(x2[b, sel])
        if nan == "ignore" and np.any(np.isnan(xf)):
            return f"row {b}: selected a NaN with nan='ignore'"
        got = builtins.sorted(_pref_key(xf, largest))
        want = builtins.sorted(_pref_key(as_float64(ref_values[b, :n]), largest))
        if got != want:
            return f"row {b}: selected set is not a top-k set"
        if order_name == "value":
            keys = _pref_key(xf, largest)
            for j in range(1, n):
                if keys[j - 1] > keys[j] or (keys[j - 1] == keys[j] and sel[j - 1] > sel[j]):
                    return f"row {b}: not in value order at slot {j}"
        elif np.any(np.diff(sel) <= 0):
            return f"row {b}: not in ascending column order"
    return None


def _pref_key(xf: np.ndarray, largest: bool) -> list:
    """(group, key) per element, smaller = preferred; NaN in its own group (above +inf)."""
    out = []
    for v in xf.tolist():
        if v != v:
            out.append((0, 0.0) if largest else (1, 0.0))
        else:
            v = v + 0.0
            out.append((1, -v) if largest else (0, v))
    return out
