# SPDX-License-Identifier: Apache-2.0
"""Row-wise top-k selection (the DSA Lightning Indexer's and the sampler's top-k)."""

from __future__ import annotations

import math
import numbers
import operator
import struct
import threading
from fractions import Fraction
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from . import _arrays
from . import _ext


class TopkResult(NamedTuple):
    """``(values, indices)``, also reachable as ``.values`` and ``.indices`` (as torch.topk's)."""

    values: Any
    indices: Any


_ORDERS = {"none": 0, "index": 1, "value": 2, False: 0, True: 2}
_ORDER_NAMES = {0: "none", 1: "index", 2: "value"}
_NANS = {"largest": 0, "ignore": 1, "raise": 2}
_TIES = {"lowest_index": 0, "any": 1}
_BACKENDS = {"auto": 0, "reference": 1}
_CHECKS = {None: 0, True: 1, False: 2}


class _KernelDepth(threading.local):
    depth = 0


# How deep this thread is in the registered op's own CPU and CUDA kernels (attnkit.torch). They
# call topk on the real tensors the dispatcher hands them, and that call must run here, never
# back through the op, whatever torch's tracing state reads: a call sent back would reach the
# kernel again without end (as it did while _recorded read torch.compiler.is_compiling(), a
# process-wide flag that torch.export and, from torch 2.15 on, dynamo hold while any thread
# compiles).
_OP_KERNEL = _KernelDepth()


def _kernel_topk(*args: Any, **kwargs: Any) -> TopkResult:
    """topk as the registered op's kernels call it: eagerly, on the tensors given."""
    state = _OP_KERNEL
    state.depth += 1
    try:
        return topk(*args, **kwargs)
    finally:
        state.depth -= 1


def _dynamo_tracing(torch: Any) -> bool:
    """Whether dynamo is tracing this code (torch.compile, strict torch.export): dynamo answers
    torch.compiler.is_dynamo_compiling() itself, in the trace, for this call alone, where
    torch.compiler.is_compiling() reads a process-wide flag that another thread's compile may
    hold. Non-strict torch.export runs this code on fake tensors under a dispatch mode, which
    _recorded tells."""
    asked = getattr(torch.compiler, "is_dynamo_compiling", None)  # torch >= 2.3
    return asked() if asked is not None else torch.compiler.is_compiling()


_MAX_EXTENT = 2**31 - 1
# Outputs of at least this many elements are allocated only after the inputs are checked.
_CHECK_BEFORE_ALLOCATING = 1 << 20


def _integer(name: str, value: Any, rule: str) -> int:
    """`value` as a Python int: an integer, or a 0-d integer array or tensor (not a bool, nor
    one of several elements, which torch's __index__ would take). `rule` is the range the C++
    layer checks, said here for values beyond int64, which cannot reach it."""
    if type(value) is int and -2**63 <= value < 2**63:
        return value  # what the checks below return for it, at a fraction of their cost
    dtype = str(getattr(value, "dtype", ""))
    if (isinstance(value, (bool, np.bool_)) or dtype in ("bool", "torch.bool")
            or getattr(value, "ndim", 0) != 0):
        raise TypeError(f"topk: {name} = {value!r}; expected an integer")
    if dtype.startswith("torch."):
        _check_tensor_number(name, value)
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"topk: {name} = {value!r}; expected an integer") from None
    if not -2**63 <= value < 2**63:
        raise ValueError(f"topk: {name} = {value} {rule}")
    return value


def _check_tensor_number(name: str, t: Any) -> None:
    """A 0-d tensor given for a number (k, index_fill, value_fill) outside dynamo: refused by
    name where it holds no value to read (the meta device, or a fake tensor of torch.export or
    make_fx), and read with torch.jit.trace's warning under it, as torch's own conversions warn:
    the trace keeps the value it read."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    if t.device.type == "meta" or is_fake(t):
        raise TypeError(f"topk: {name} is a tensor without a value to read (on the meta device, "
                        f"or traced); pass a Python number")
    if torch._C._is_tracing():
        import warnings

        warnings.warn(f"topk: {name} is a tensor; torch.jit.trace records the value it holds "
                      f"now as a constant, so the trace ignores the {name} of later calls",
                      torch.jit.TracerWarning, stacklevel=4)


def _within_int64(k: int, torch_module: Any) -> bool:
    """-2^63 <= k < 2^63 for an int k. Under torch.compile a k read from a tensor (an unbacked
    SymInt, which the tracer also reports as an int) lies within int64 by construction, but its
    value is known only when the graph runs: there the comparison is asked without a guard,
    which such a k cannot take, and holds. A constant k is compared as it is."""
    if torch_module is not None and _dynamo_tracing(torch_module):
        from torch.fx.experimental import symbolic_shapes
        holds = getattr(symbolic_shapes, "guard_or_true", None)  # torch >= 2.7
        if holds is not None:
            return holds(k >= -2**63) and holds(k < 2**63)
    return -2**63 <= k < 2**63


def _number_of_0d(value: Any, torch_module: Any) -> Any:
    """The number a 0-d NumPy array or scalar (of integers, floats or ml_dtypes' formats such
    as bfloat16, not bool) or 0-d torch tensor holds; any other value as it is. A tensor is
    refused while torch.compile or torch.export traces (a fake tensor's value is not known):
    the op's schema takes the fills as numbers, which a tensor's value is not until the graph
    runs."""
    if isinstance(value, (np.ndarray, np.generic)):
        real = value.dtype.kind in "iuf" or value.dtype.type.__module__ == "ml_dtypes"
        return value.item() if value.ndim == 0 and real else value
    if torch_module is not None and isinstance(value, torch_module.Tensor):
        if _dynamo_tracing(torch_module):
            raise TypeError("topk: value_fill is a tensor; under torch.compile the fills are "
                            "Python numbers (a tensor's value is known only when the graph runs)")
        _check_tensor_number("value_fill", value)
        real = value.dtype != torch_module.bool and not value.is_complex()
        return value.item() if value.ndim == 0 and real else value
    return value


def _real(value: Any) -> float:
    """`value` as a float64 that rounds to every narrower format as `value` itself would.

    A value that float64 holds exactly is returned as is. Any other (an int beyond 2**53, a
    Fraction, a longdouble) is rounded to odd: toward zero, with the lowest mantissa bit set.
    float64 keeps more than two bits beyond every dtype the op takes, so the one rounding to
    nearest even that follows (to x's dtype) gives the correctly rounded value, where rounding
    to nearest twice could miss it. A value beyond float64's range (an int of 10**400) is
    beyond every such dtype's, and becomes the infinity of its sign, as it would there.
    """
    try:
        f = float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
    if type(value) is float or not math.isfinite(f):
        return f
    if isinstance(value, int) and -2**53 <= value <= 2**53:
        return f
    ratio = getattr(value, "as_integer_ratio", None)
    if ratio is None:
        return f
    exact = Fraction(*ratio())
    got = Fraction(f)
    if got == exact:
        return f
    toward_zero = f if abs(got) < abs(exact) else math.nextafter(f, 0.0)
    (bits,) = struct.unpack("<q", struct.pack("<d", toward_zero))
    (odd,) = struct.unpack("<d", struct.pack("<q", bits | 1))
    return odd


def _choice(name: str, value: Any, table: dict) -> int:
    # Keys are strings, bools and None: an int equal to a bool (1 == True) is not a choice.
    # Values of exactly those types are looked up at once (the common call); the rest, among
    # them subclasses and NumPy bools, below.
    cls = type(value)
    if cls is str or cls is bool or value is None:
        code = table.get(value)
        if code is not None:
            return code
    known = isinstance(value, (str, bool, np.bool_)) or value is None
    try:
        if known:
            return table[bool(value) if isinstance(value, np.bool_) else value]
    except (KeyError, TypeError):
        pass
    allowed = ", ".join(repr(k) for k in table)
    raise ValueError(f"topk: {name} = {value!r}; expected one of {allowed}")


# The end of the MemoryError's advice, which callers without these arguments (the CLI) drop.
OUT_BUFFERS_HINT = " or out_indices/out_values"


def _check_host_memory(x: Any, out_shape: tuple[int, ...], k: int, *dtypes: Optional[str]):
    """MemoryError when the outputs to allocate in host memory exceed the machine's memory: the
    allocation itself would succeed on an overcommitting OS, and the padding writes would then
    get the process killed (a k far beyond N pads every slot)."""
    if _arrays.device_of(x)[0] != "cpu":
        return  # device allocators fail cleanly
    need = math.prod(out_shape) * sum(_arrays.itemsize(d) for d in dtypes if d is not None)
    have = _arrays.physical_memory()
    if have is not None and need > have:
        def size(n: int) -> str:
            return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"

        raise MemoryError(
            f"topk: k = {k} asks for outputs of shape {list(out_shape)}, {size(need)}, beyond "
            f"this machine's {size(have)} of memory; pass a smaller k (slots beyond a row's "
            f"length are padding){OUT_BUFFERS_HINT}")


def topk(
    x: Any,
    k: int,
    *,
    largest: bool = True,
    sorted: Union[str, bool] = "none",
    begin: Any = None,
    end: Any = None,
    indices_dtype: Any = None,
    return_values: bool = True,
    out_values: Any = None,
    out_indices: Any = None,
    index_offset: Any = None,
    index_fill: int = -1,
    value_fill: Optional[float] = None,
    nan: str = "largest",
    ties: str = "lowest_index",
    check: Optional[bool] = None,
    backend: str = "auto",
) -> TopkResult:
    """The k best elements of each row of ``x``, with their column indices.

    Parameters
    ----------
    x : array, shape [B, N] or [N]
        float32, bfloat16 or float16; a NumPy array (bfloat16 through ``ml_dtypes``), a torch
        tensor on CPU or CUDA, or any DLPack tensor. The last dimension must be contiguous; the
        row stride and the element offset are free (the data pointer must be a multiple of the
        element size, as every framework allocates).
    k : int
        Elements per row, ``0 <= k <= 2^31 - 1``. May exceed a row's valid length: the valid
        elements fill the first slots and the rest is padding.
    largest : bool
        Select the largest (default) or the smallest values.
    sorted : {"none", "index", "value"} or bool
        Order of each output row: "none" (unspecified but deterministic; at present ascending
        column on every backend, but ask for "index" to rely on that, which costs no more),
        "index" (ascending column), "value" (best first, ties by ascending column).
        ``True`` means "value" and ``False`` "none", as in ``torch.topk``.
    begin, end : array of shape [B], int32 or int64, optional
        Row b's valid range is ``[begin[b], end[b])`` (defaults 0 and N), on x's device.
    indices_dtype : "int32" or "int64" (or a NumPy/torch dtype, or a code such as "i4"), optional
        Dtype of the returned indices (default int64; int32 for a JAX x while
        ``jax_enable_x64`` is off, where int64 raises ValueError). With ``out_indices`` it may
        be left out; given, it must be ``out_indices``' dtype (ValueError otherwise). Names
        and types whose size depends on the platform ("long", "int", "l", Python's ``int``)
        raise TypeError.
    return_values : bool
        Return the values too (default). With False the first result is None.
    out_values, out_indices : array of shape [B, k] ([k] for x of shape [N]), optional
        Caller buffers written in place (any row stride whose rows do not overlap, last
        dimension contiguous).
    index_offset : array of shape [B], int32 or int64, optional
        Added to every returned index of row b (not to padding). A negative offset can make
        a real index equal ``index_fill`` (-1 by default): pick a fill no offset column can
        take (e.g. 2**31 - 1) where padding must be told apart.
    index_fill : int
        Index written to padding slots (default -1). It must fit the indices' dtype (int32 or
        int64; ValueError otherwise), whether or not a slot is padded.
    value_fill : float, optional
        Value written to padding slots (default -inf when ``largest``, +inf otherwise; a 0-d
        NumPy array or tensor of a number is read as that number),
        rounded once to x's dtype, to nearest even: a value beyond the dtype's range becomes
        +-inf (1e40 in bfloat16, 1e6 in float16), as a cast would make it.
    nan : {"largest", "ignore", "raise"}
        "largest" ranks NaN above +inf (``torch.topk``'s order); "ignore" never selects NaN;
        "raise" raises if a valid range holds a NaN (on CUDA after the kernel: one sync).
    ties : {"lowest_index", "any"}
        Among elements equal to the k-th, keep those with the lowest column ("lowest_index",
        the first k of a stable sort), or any of them ("any").
    check : bool, optional
        Validate ``begin``/``end``/``index_offset`` values and raise on bad ones. Default: on
        for CPU tensors, off for CUDA tensors (where the host waits for a copy of each of
        them that is given); when off, kernels clamp ``begin``/``end`` into ``[0, N]`` so that
        no access is out of bounds, and an out-of-range ``index + index_offset`` wraps as
        two's-complement arithmetic.
    backend : {"auto", "reference"}
        "reference" runs the plain CPU reference (a stable sort per row), for testing.

    Returns
    -------
    TopkResult
        A named tuple ``(values, indices)``, each [B, k] ([k] for x of shape [N]):
        ``values``, array [B, k] of x's dtype, or None: the selected values, bit-identical to
        the input elements; ``indices``, array [B, k] of ``indices_dtype``: their column
        indices in x (counted from column 0, not from ``begin``), plus ``index_offset``. With
        torch tensors that require grad (and grad mode on), ``values`` carries a gradient back
        to the selected elements of ``x``.

    Raises
    ------
    ValueError
        Bad shapes, nested tensors, tensors on the meta device beside an ``x`` that is not
        (a meta ``x`` gets meta results of the right shapes and dtypes, as torch's ops give,
        and takes meta tensors only), tensors without storage of their own, k outside
        [0, 2^31 - 1], out-of-range ``begin``/``end``/``index_offset`` (when checked),
        overlapping or mis-shaped output buffers, a NaN with ``nan="raise"``, unknown options,
        ``out_values`` given with ``return_values=False``, ``backend="reference"`` with an
        ``x`` that requires grad or on the meta device, or inside tracing, a dispatch mode or
        vmap (inside torch.compile such a call is not compiled: with ``fullgraph=True``
        compiling fails, otherwise the graph breaks there and the call runs eagerly).
    TypeError
        Unsupported dtypes (NumPy ones not in the machine's byte order among them); non-integer
        ``k``/``index_fill``, non-bool ``largest``/``return_values``, a non-real
        ``value_fill``; arguments that are not arrays; masked arrays, non-strided tensors.
    MemoryError
        Outputs to allocate in host memory that exceed the machine's physical memory (a k far
        beyond N: the outputs are [B, k] whatever N).
    NotImplementedError
        Under ``torch.func.grad``/``jvp`` (and ``jacrev``, ``jacfwd``, ``hessian``), with
        forward-mode AD (dual tensors, ``torch.func.linearize``) when values are asked for,
        and with caller buffers under ``torch.func.vmap`` or ``torch.func.functionalize``.
    RuntimeError
        A CUDA runtime failure; caller buffers with an ``x`` that requires grad (values asked
        for), caller buffers that require grad (grad mode on), inference-tensor buffers outside
        ``torch.inference_mode``. Caller torch buffers that were written get
        their version counters bumped, so that autograd refuses a stale saved copy.

    Notes
    -----
    Semantics follow ``torch.topk`` (NaN order, ``largest``, ``sorted``) and DeepSelect
    (``end``, ``index_offset``, fills, ``return_values``, index-sorted output), with DeepSelect's
    limits lifted: any k, any N up to 2^31 - 1, any stride, checked ``end``, no trap on NaN.
    The output is deterministic. With torch tensors the op runs on torch's current CUDA stream;
    inside ``torch.compile``, ``torch.jit.trace``, dispatch modes and ``torch.func.vmap`` it
    dispatches to ``torch.ops.attnkit.topk`` (see ``attnkit.torch``). Algorithm and measured
    speed: docs/topk.md.

    Examples
    --------
    >>> import numpy as np, attnkit
    >>> x = np.array([[0.5, 3.0, -1.0, 3.0, 2.0]], dtype=np.float32)
    >>> values, indices = attnkit.topk(x, 3, sorted="value")
    >>> values.tolist(), indices.tolist()
    ([[3.0, 3.0, 2.0]], [[1, 3, 4]])

    See Also
    --------
    torch.topk, numpy.argpartition
    """
    # Options first, for every path.
    order = _choice("sorted", sorted, _ORDERS)
    nan_code = _choice("nan", nan, _NANS)
    ties_code = _choice("ties", ties, _TIES)
    check_code = _choice("check", check, _CHECKS)
    backend_code = _choice("backend", backend, _BACKENDS)
    torch_module = _arrays._torch()
    # A k that may be traced (t.item() under torch.compile) is left to the op's fake kernel,
    # which checks it without the guard that operator.index would ask for. An int within int64
    # is what _integer would return; one beyond is refused here, compiling or not, since the
    # op's schema takes 64 bits.
    # So is a symbolic k of make_fx or non-strict torch.export (a size, or t.item()).
    plain = type(k) is int
    traced_k = torch_module is not None and (
        isinstance(k, torch_module.SymInt)
        or (isinstance(k, int) and not isinstance(k, bool) and _dynamo_tracing(torch_module)))
    if not (plain and _within_int64(k, torch_module)) and (plain or not traced_k):
        k = _integer("k", k, "must be in [0, 2^31 - 1]")
    # Beyond int64 fits no indices: int32 ones are checked by the C++ layer, which names them.
    index_fill = _integer("index_fill", index_fill, "does not fit int64, the widest indices")
    if not isinstance(largest, (bool, np.bool_)):
        raise TypeError(f"topk: largest = {largest!r}; expected a bool")
    if not isinstance(return_values, (bool, np.bool_)):
        raise TypeError(f"topk: return_values = {return_values!r}; expected a bool")
    if value_fill is not None:
        value_fill = _number_of_0d(value_fill, torch_module)  # as k and index_fill take 0-d ints
        # NumPy's timedelta64 is a signed integer type to `numbers`, but no number of a value.
        if (isinstance(value_fill, (str, bytes, bool, np.timedelta64))
                or not isinstance(value_fill, numbers.Real)):
            raise TypeError(f"topk: value_fill = {value_fill!r}; expected a real number")
    if out_values is not None and not return_values:
        raise ValueError("topk: out_values is given but return_values = False; values are "
                         "written only when returned: pass return_values=True or leave "
                         "out_values out")
    is_torch = _arrays.is_torch
    for name, a in (("x", x), ("begin", begin), ("end", end), ("index_offset", index_offset),
                    ("out_values", out_values), ("out_indices", out_indices)):
        # NumPy and torch arguments, most calls' and the ones torch.compile traces, skip it.
        if a is not None and type(a) is not np.ndarray and not is_torch(a):
            _arrays.refuse_jax_tracer(a, name)
    buffers_given = out_values is not None or out_indices is not None
    # A bare DLPack argument is read or written as it exports itself: shape or dtype attributes
    # that say otherwise are refused by its name (as for x), not quoted in other errors.
    exported_index = None
    if buffers_given:
        for name, out in (("out_values", out_values), ("out_indices", out_indices)):
            if out is not None and _arrays.is_jax(out):  # its export does not say so
                raise ValueError(f"topk: {name} is a JAX array, which is immutable; outputs "
                                 f"must be writable (leave {name} out to get a JAX array back)")
    if begin is not None or end is not None or index_offset is not None or buffers_given:
        for name, a in (("begin", begin), ("end", end), ("index_offset", index_offset),
                        ("out_values", out_values)):
            if a is not None and _arrays.is_bare_producer(a):
                _arrays.dlpack_layout(a, name)
        if out_indices is not None and _arrays.is_bare_producer(out_indices):
            exported_index = _arrays.dlpack_layout(out_indices, "out_indices")[1]
    index_name = None
    # JAX without jax_enable_x64 holds no int64 array: its indices are int32 unless asked for.
    narrow = (out_indices is None and not is_torch(x) and _arrays.is_jax(x)
              and not _arrays.jax_keeps_int64())
    if indices_dtype is None and out_indices is None:
        index_name = "int32" if narrow else "int64"
    elif indices_dtype is not None:
        try:
            index_name = _arrays.dtype_name(indices_dtype)
        except TypeError:
            pass
        if index_name not in ("int32", "int64"):
            raise TypeError(f"topk: indices_dtype = {indices_dtype!r}; expected int32 or int64"
                            + _indices_dtype_note(indices_dtype))
        if narrow and index_name == "int64":
            raise ValueError("topk: indices_dtype = int64, but x is a JAX array and "
                             "jax_enable_x64 is off, so jax.numpy would narrow the indices to "
                             "int32; enable jax_enable_x64 or pass indices_dtype='int32'")
    if out_indices is not None and index_name is not None:
        buffer_index = exported_index
        if buffer_index is None:
            try:
                buffer_index = _arrays.array_dtype_name(out_indices, "out_indices")
            except TypeError:
                buffer_index = None  # reported with the other checks of out_indices
        if buffer_index is not None and buffer_index != index_name:
            raise ValueError(f"topk: indices_dtype = {index_name} but out_indices has dtype "
                             f"{buffer_index}; leave indices_dtype out or give the same dtype")

    buffers = (("out_values", out_values), ("out_indices", out_indices)) if buffers_given else ()
    for name, out in buffers:
        if not is_torch(out):
            continue
        torch = torch_module
        if out.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                f"topk: {name} requires grad; caller buffers are written without autograd "
                "(torch.topk(..., out=...) refuses them too): pass one that does not "
                "require grad, or call under torch.no_grad()")
        if (not _dynamo_tracing(torch) and out.is_inference()
                and not torch.is_inference_mode_enabled()):
            raise RuntimeError(
                f"topk: {name} is an inference tensor, which torch lets no one write outside "
                "torch.inference_mode(); call there, or pass a tensor made outside it")
    fill = None if value_fill is None else _real(value_fill)

    if is_torch(x):
        torch = torch_module
        if x.is_nested:
            raise ValueError("topk: x is a nested tensor; pass a dense [B, N] tensor, e.g. "
                             "x.to_padded_tensor(0.0) with end = the rows' lengths")
        # Before the dispatcher, which has no sparse kernel to name the rule.
        _arrays.check_strided(x, "x")
        if return_values:
            _refuse_forward_ad(torch, x)
        # Inside torch.compile, and whenever autograd must see the op, go through the
        # dispatcher (torch.ops.attnkit.topk, registered by attnkit.torch).
        needs_grad = return_values and x.requires_grad and torch.is_grad_enabled()
        if needs_grad and buffers_given:
            _refuse_grad_into_buffers(
                "/".join(name for name, out in buffers if out is not None))

        if needs_grad and backend != "auto":
            raise ValueError(f"topk: backend = {backend!r} runs without autograd; detach x or "
                             "use torch.no_grad()")
        recorded = _recorded(torch)
        if recorded and backend != "auto":
            # The registered op has one backend: the tensors' device picks it.
            raise ValueError(f"topk: backend = {backend!r} is for eager calls; under "
                             "torch.compile, tracing, a dispatch mode or vmap use "
                             "backend='auto'")
        if x.device.type == "meta" and backend != "auto":
            raise ValueError(f"topk: backend = {backend!r} runs on CPU tensors, but x is on "
                             "the meta device (backend='auto' gives meta results)")
        # A meta x (no data) takes the op's shape propagation, as torch's own ops do.
        if needs_grad or recorded or x.device.type == "meta":
            from . import torch as _torch_ops

            _refuse_func_differentiation(torch)
            if buffers_given:
                _refuse_transformed_buffers(torch)
            # The op's schema takes the options in one spelling each.
            return TopkResult(*_torch_ops._dispatched_topk(
                x, k, largest=bool(largest), sorted=_ORDER_NAMES[order], begin=begin, end=end,
                indices_dtype=index_name or indices_dtype, return_values=bool(return_values),
                out_values=out_values, out_indices=out_indices, index_offset=index_offset,
                index_fill=index_fill, value_fill=fill, nan=str(nan), ties=str(ties),
                check=None if check is None else bool(check)))
    else:
        others = (("begin", begin), ("end", end), ("index_offset", index_offset), *buffers)
        transformed = [name for name, a in others if is_torch(a)]
        if transformed and _recorded(torch_module):
            # The op is recorded only through a torch x: its other tensors have no memory to
            # read here (a vmap's batched tensor, a fake tensor).
            raise TypeError(f"topk: {transformed[0]} is a torch tensor under torch.compile, "
                            f"tracing, a dispatch mode or a torch.func transform, but x is a "
                            f"{type(x).__name__}; pass x as a torch tensor there")

    if torch_module is not None and isinstance(k, torch_module.SymInt):  # not recorded: its value
        k = _integer("k", k, "must be in [0, 2^31 - 1]")
    # torch views with the negative or conjugate bit set (x.conj().imag, torch._neg_view) hold
    # their values in memory with the sign not yet applied, and bare DLPack producers have no
    # shape or dtype to read: both are read through arrays made for the call (held until it ends).
    resolved = _arrays.resolved
    x = resolved(x, "x")
    if begin is not None:
        begin = resolved(begin, "begin")
    if end is not None:
        end = resolved(end, "end")
    if index_offset is not None:
        index_offset = resolved(index_offset, "index_offset")
    raw_view = _arrays.raw_view
    x_view = raw_view(x, "x")
    # The shape and dtype of x's memory as the view reads them (a subclass's or a DLPack
    # producer's attributes may differ).
    if type(x_view) is tuple:
        shape, x_dtype = tuple(x_view[1]), _arrays.DTYPE_NAMES[x_view[3]]
    else:
        shape, x_dtype = _arrays.dlpack_layout(x, "x")
    # Outside [0, 2^31 - 1], k allocates empty outputs, so that the C++ check reports it by
    # name before any large allocation.
    columns = k if 0 <= k <= _MAX_EXTENT else 0
    out_shape = (*shape[:-1], columns) if len(shape) >= 1 else (columns,)
    inputs = (None if begin is None else raw_view(begin, "begin"),
              None if end is None else raw_view(end, "end"),
              None if index_offset is None else raw_view(index_offset, "index_offset"))
    options = (k, bool(largest), order, nan_code, ties_code, index_fill, fill, check_code,
               backend_code)
    # The dtypes of the outputs to allocate (None: the caller's buffer, or no values).
    make_indices = index_name if out_indices is None else None
    make_values = None
    if out_values is None and return_values:
        make_values = x_dtype
    made_indices, made_values = make_indices is not None, make_values is not None
    if (made_indices or made_values) and math.prod(out_shape) >= _CHECK_BEFORE_ALLOCATING:
        # Bad input is named before a large allocation.
        _ext.topk_check_inputs(x_view, *inputs, *options)
        _check_host_memory(x, out_shape, k, make_indices, make_values)
    indices_view = values_view = None
    if made_indices or made_values:
        (made_i, indices_view), (made_v, values_view) = _arrays.empty_outputs(
            x, x_view, out_shape, (make_indices, make_values), ("out_indices", "out_values"))
        if made_indices:
            out_indices = made_i
        if made_values:
            out_values = made_v
    if indices_view is None:
        indices_view = raw_view(out_indices, "out_indices", writable=True)
    if values_view is None and out_values is not None:
        values_view = raw_view(out_values, "out_values", writable=True)

    # A raw view says where x lives: on the CPU there is no workspace or stream to ask for.
    workspace = None
    if type(x_view) is tuple and x_view[4] == 0:
        stream = 0
    elif is_torch(x):  # x as resolved: a GPU DLPack producer is read through torch
        # Scratch from torch's caching allocator, asked for by the extension when the call
        # needs any; on torch's current stream, read without a Stream object.
        workspace, stream = _torch_workspace, _arrays.torch_stream(x_view[5])
    else:
        stream = _arrays.current_stream(x)
    _ext.topk(x_view, indices_view, values_view, *inputs, *options, workspace, stream)
    # Caller tensors were written behind torch's back: bump their version counters, so that
    # autograd refuses a backward through a value saved before the write (as after torch.topk's
    # out=).
    for _, out in buffers:
        if is_torch(out):
            torch_module.autograd.graph.increment_version(out)

    values = out_values if return_values else None
    indices = out_indices
    if type(x_view) is not tuple:  # x was read through DLPack: what was made here may convert
        if made_values:
            values = _arrays.to_caller(values, x)
        if made_indices:
            indices = _arrays.to_caller(indices, x)
    # tuple.__new__ builds the same TopkResult as its own __new__, a Python function that costs
    # twice as much.
    return tuple.__new__(TopkResult, (values, indices))


def _indices_dtype_note(dtype: Any) -> str:
    """Why an int32 or int64 that attnkit does not take was refused: a NumPy code or name
    whose size depends on the platform ("l", "int_", "long"), Python's int, or a byte order
    other than the machine's (">i8" on x86); for anything else ""."""
    platform = (" (a code or type whose size depends on the platform is refused: spell it "
                "'int32', 'int64', 'i4' or 'i8')")
    if dtype is int:
        return platform
    try:
        as_numpy = np.dtype(dtype) if isinstance(dtype, (str, np.dtype)) else None
    except TypeError:
        return ""
    if as_numpy is None or as_numpy.kind != "i" or as_numpy.itemsize not in (4, 8):
        return ""
    if not as_numpy.isnative:
        bits = 8 * as_numpy.itemsize
        return f" (indices are written in this machine's byte order: pass 'int{bits}')"
    return platform if isinstance(dtype, str) else ""


def _recorded(torch: Any) -> bool:
    """Whether torch is recording or transforming this call rather than running it: inside
    torch.compile, torch.jit.trace, a dispatch mode (make_fx, FakeTensorMode, FlopCounterMode)
    or a torch.func transform (vmap, grad). Such calls must go through the dispatcher's op: the
    eager path writes through raw pointers, which none of them can see."""
    if _OP_KERNEL.depth:
        return False
    # torch._C._is_tracing() is what torch.jit.is_tracing() returns outside TorchScript.
    C = torch._C
    return (_dynamo_tracing(torch) or C._is_tracing()
            or C._len_torch_dispatch_stack() > 0
            or C._functorch.peek_interpreter_stack() is not None)


def _func_transforms(torch: Any) -> tuple:
    """The torch.func transforms (TransformType keys) this call runs under; none inside
    torch.compile, whose dynamo traces neither the stack nor hashes of its keys."""
    if _dynamo_tracing(torch):
        return ()
    return tuple(i.key() for i in torch._C._functorch.get_interpreter_stack() or ())


def _refuse_func_differentiation(torch: Any) -> None:
    """torch.func.grad, jvp, jacrev and friends cannot differentiate the op (its autograd
    formula is torch.library's, which they do not take): a clear error instead of torch's.
    torch.autograd (values.backward()) and torch.func.vmap work."""
    from torch._C._functorch import TransformType

    if any(t in (TransformType.Grad, TransformType.Jvp) for t in _func_transforms(torch)):
        raise NotImplementedError(
            "topk: torch.func's grad/jvp transforms (grad, jacrev, jacfwd, hessian) cannot "
            "differentiate attnkit.topk; use torch.autograd (values.sum().backward()) instead. "
            "torch.func.vmap works")


def _refuse_grad_into_buffers(given: str) -> None:
    """Values written into caller buffers from an x that requires grad would drop its gradient
    (torch.topk(..., out=...) refuses them too)."""
    raise RuntimeError(
        f"topk: {given} cannot be used when x requires grad: autograd does not record "
        "writes into caller buffers (detach x or use torch.no_grad())")


def _refuse_forward_ad(torch: Any, x: Any) -> None:
    """Forward-mode AD (torch.autograd.forward_ad dual tensors, torch.func.linearize) would
    lose x's tangent: the op has a backward formula only. A clear error instead."""
    forward_ad = torch.autograd.forward_ad
    if forward_ad._current_level >= 0 and forward_ad.unpack_dual(x).tangent is not None:
        raise NotImplementedError(
            "topk: forward-mode AD (dual tensors, torch.func.linearize) cannot differentiate "
            "attnkit.topk; use torch.autograd (values.sum().backward()), or gather the tangent "
            "at the returned indices")


def _refuse_transformed_buffers(torch: Any) -> None:
    """Under torch.func.vmap (no batching rule for the in-place op) or torch.func.functionalize
    (which takes no custom op whose outputs alias its inputs) the op cannot write caller
    buffers: a clear error instead of torch's."""
    from torch._C._functorch import TransformType

    transforms = _func_transforms(torch)
    for transform, name in ((TransformType.Vmap, "vmap"),
                            (TransformType.Functionalize, "functionalize")):
        if transform in transforms:
            raise NotImplementedError(
                f"topk: out_values/out_indices cannot be used under torch.func.{name}; call "
                f"without them and use the returned results")


_UINT8 = _arrays.DTYPE_CODES["uint8"]


def _torch_workspace(nbytes: int, device_index: int) -> tuple:
    """Scratch of `nbytes` on CUDA device `device_index` from torch's caching allocator
    (stream-ordered, and from the graph's pool inside CUDA graph capture), as the extension asks
    for it: (the tensor, to hold until the launch is enqueued; the raw view of its first
    256-byte aligned `nbytes`)."""
    torch = _arrays._torch()
    scratch = torch.empty(nbytes + 256, dtype=torch.uint8, device=_arrays.cuda_device(device_index))
    ptr = scratch.data_ptr()
    return scratch, (ptr + (-ptr) % 256, (nbytes,), (1,), _UINT8, 1, device_index)
