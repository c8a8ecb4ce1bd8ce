# SPDX-License-Identifier: Apache-2.0
"""Adapters between the caller's array framework and attnkit's extension module.

NumPy arrays and torch tensors are handed to C++ as raw views ``(data_ptr, shape, strides,
dtype_code, device_type, device_index)``: cheaper than DLPack, with no stream handshake and no
refusal of tensors that require grad. Any other DLPack producer (CuPy, JAX, ...) goes through
nanobind's DLPack import. Outputs are allocated by the caller's framework, on the caller's
device, so results come back zero-copy in the caller's type.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Optional

import ml_dtypes
import numpy as np
# Imported here, not on first use through np.ma: a lazy import inside a call holds Python's
# module lock, which a process forked meanwhile inherits held (its first call would hang).
import numpy.ma

from . import _ext

# attnkit::DType enumerators, in order.
DTYPE_NAMES = (
    "float32", "bfloat16", "float16", "int32", "int64", "float64",
    "int8", "uint8", "int16", "uint16", "uint32", "uint64", "bool",
)
DTYPE_CODES = {name: i for i, name in enumerate(DTYPE_NAMES)}
X_DTYPES = DTYPE_NAMES[:3]  # the dtypes topk selects in

_NUMPY_DTYPES = {
    "float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "float64": np.dtype(np.float64), "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16), "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64), "bool": np.dtype(np.bool_),
}
_NUMPY_NAMES = {dt: name for name, dt in _NUMPY_DTYPES.items()}
_NUMPY_CODES = {dt: DTYPE_CODES[name] for dt, name in _NUMPY_NAMES.items()}
# A NumPy type code with its size in bytes and an optional byte order: "i4", "<i8", "=f2".
_SIZED_CODE = re.compile(r"[<>=|]?[iuf][1248]")
_MASKED_ARRAY = np.ma.MaskedArray


def _torch():
    """torch if it is already imported (attnkit never imports it on its own)."""
    return sys.modules.get("torch")


_tensor_type: Any = None  # torch.Tensor, once torch is imported
_strided: Any = None  # torch.strided, with it


def is_torch(a: Any) -> bool:
    # Asked of every argument of every call: the class is looked up once, not each time, and
    # the common answers come first (isinstance is slower on what is not a tensor, through
    # torch.Tensor's metaclass).
    global _tensor_type, _strided
    cls = type(a)
    if cls is _tensor_type:
        return True
    if cls is np.ndarray or a is None:
        return False
    if _tensor_type is None:
        torch = _torch()
        tensor = getattr(torch, "Tensor", None)  # None while torch is being imported
        strided = getattr(torch, "strided", None)
        if tensor is None or strided is None:
            return False
        _tensor_type, _strided = tensor, strided
    return isinstance(a, _tensor_type)


# attnkit's name of each torch dtype seen so far that has one: str(dtype) costs more than a
# dict lookup, and runs for every tensor of every call.
_TORCH_NAMES: dict = {}


def _torch_dtype_name(dtype: Any) -> Optional[str]:
    name = _TORCH_NAMES.get(dtype)
    if name is None:
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPE_CODES:
            return None
        _TORCH_NAMES[dtype] = name
    return name


def dtype_name(dtype: Any) -> str:
    """Canonical name of a dtype given as a name ("int32"), a NumPy dtype, a sized NumPy type
    code ("i4", "<i8", "f2") or a torch dtype. Names and types whose size depends on the platform
    ("long", "int", Python's int) are refused."""
    if isinstance(dtype, str):
        if dtype in DTYPE_CODES:
            return dtype
        name = None
        if _SIZED_CODE.fullmatch(dtype):
            name = _NUMPY_NAMES.get(np.dtype(dtype))
        if name is None:
            raise TypeError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
        return name
    if dtype is int:  # np.dtype(int) is int32 on Windows with NumPy < 2, as "int" and "long"
        raise TypeError("dtype int has a size that depends on the platform")
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        name = _torch_dtype_name(dtype)
        if name is not None:
            return name
        raise TypeError(f"dtype {dtype} has no attnkit equivalent")
    try:
        return _NUMPY_NAMES[np.dtype(dtype)]
    except (TypeError, KeyError):
        raise TypeError(f"dtype {dtype!r} has no attnkit equivalent") from None


# What each array argument of topk takes, for messages about dtypes attnkit has no name for
# (the C++ checks say it for the others); begin, end, index_offset and out_indices take ints.
_EXPECTED_DTYPES = {"x": ", ".join(X_DTYPES[:-1]) + " or " + X_DTYPES[-1], "out_values": "x.dtype"}


def no_such_dtype(name: str, dtype: Any) -> TypeError:
    """The TypeError for an array argument whose dtype attnkit does not take."""
    hint = ""
    if isinstance(dtype, np.dtype) and dtype.kind == "V" and dtype.itemsize == 2:
        # np.save writes ml_dtypes' bfloat16 as raw 2-byte records, which np.load returns.
        hint = (f" (a bfloat16 array saved with np.save loads as {dtype.str}: pass "
                f"{name}.view(ml_dtypes.bfloat16))")
    return TypeError(f"topk: {name}.dtype = {dtype} is no dtype of attnkit's; expected "
                     f"{_EXPECTED_DTYPES.get(name, 'int32 or int64')}{hint}")


def _readable(a: Any, attr: str) -> bool:
    """hasattr that also takes an attribute whose property raises anything as missing: such a
    producer is read through its DLPack export alone."""
    try:
        getattr(a, attr)
    except Exception:
        return False
    return True


def is_bare_producer(a: Any) -> bool:
    """Whether `a` is read through DLPack: neither a NumPy array nor a torch tensor, and its
    type has ``__dlpack__``."""
    return (not isinstance(a, np.ndarray) and not is_torch(a)
            and hasattr(type(a), "__dlpack__"))


def array_dtype_name(a: Any, name: str) -> str:
    """The dtype name of array argument `name`; TypeError naming it when attnkit has none."""
    check_array(a, name)
    try:
        return dtype_name(a.dtype)
    except TypeError:
        raise no_such_dtype(name, a.dtype) from None


def check_byte_order(a: np.ndarray, name: str) -> None:
    """TypeError naming `name` when a NumPy array is not in the machine's byte order."""
    if not a.dtype.isnative:
        raise TypeError(f"topk: {name}.dtype = {a.dtype.str} is not in this machine's byte "
                        f"order, which attnkit reads; pass {name}.astype("
                        f"{name}.dtype.newbyteorder('='))")


def check_array(a: Any, name: str) -> None:
    """NumPy arrays, torch tensors and DLPack producers pass; anything else (lists, tuples,
    memoryviews, ctypes arrays) is refused by name rather than guessed at."""
    cls = type(a)
    if cls is np.ndarray or cls is _tensor_type:
        return  # the common cases, at once
    if isinstance(a, _MASKED_ARRAY):
        raise TypeError(f"topk: {name} is a NumPy masked array, whose mask attnkit would ignore; "
                        f"pass {name}.filled(value) or {name}.data")
    if isinstance(a, np.ndarray) or is_torch(a):
        return
    if hasattr(type(a), "__dlpack__"):
        device_of(a, name)  # a producer must say where its memory is
        return
    if isinstance(a, np.generic):
        raise TypeError(f"topk: {name} is a NumPy scalar ({a.dtype}); expected an array (x: [N] "
                        "or [B, N]; begin, end, index_offset: [B]; outputs: [B, k])")
    kind = type(a).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    raise TypeError(f"topk: {name} is {article} {kind}; expected a NumPy array, a torch "
                    "tensor or an array supporting DLPack")


class _DLPackSource:
    """A CPU producer that offers only ``__dlpack__``, with the shape and dtype of the
    extension's import of it, which checks its strides and data pointer as any DLPack input's
    are (NumPy's import takes a capsule's strides as given, allocates for a null data pointer
    and cannot read bfloat16)."""

    def __init__(self, producer: Any, shape: tuple, dtype: np.dtype):
        self._producer = producer
        self.shape, self.dtype = shape, dtype

    def __dlpack__(self, **kwargs):
        return self._producer.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._producer.__dlpack_device__()


def _dlpack_source(producer: Any, name: str) -> _DLPackSource:
    from . import _ext

    shape, code = _ext.dlpack_shape_dtype(producer, name)
    if any(n < 0 for n in shape):  # before anything sizes an output by it
        raise ValueError(f"topk: {name} (a {type(producer).__name__}) exports shape "
                         f"{list(shape)} through DLPack; dimensions must be >= 0")
    # A subclass named as the producer's type, so that messages about it name that type.
    cls = type(type(producer).__name__, (_DLPackSource,), {})
    return cls(producer, tuple(shape), _NUMPY_DTYPES[DTYPE_NAMES[code]])


def dlpack_layout(a: Any, name: str) -> tuple:
    """The shape and dtype name of DLPack producer `a` as the call reads them: its export's,
    which ``shape`` and ``dtype`` attributes that say otherwise do not override (the outputs
    are sized and typed by them)."""
    if isinstance(a, _DLPackSource):
        return a.shape, _NUMPY_NAMES[a.dtype]
    from . import _ext

    shape, code = _ext.dlpack_shape_dtype(a, name)
    exported, dtype = tuple(shape), DTYPE_NAMES[code]
    declared = getattr(a, "shape", exported) if _readable(a, "shape") else exported
    try:
        same = tuple(int(n) for n in declared) == exported
    except (TypeError, ValueError):
        same = False
    if not same:
        raise ValueError(f"topk: {name} (a {type(a).__name__}) has shape {declared!r} but exports "
                         f"shape {list(exported)} through DLPack; the two must agree")
    declared = getattr(a, "dtype", None) if _readable(a, "dtype") else None
    try:
        same = declared is None or dtype_name(declared) == dtype
    except TypeError:
        same = False
    if not same:
        raise TypeError(f"topk: {name} (a {type(a).__name__}) has dtype {declared!r} but exports "
                        f"{dtype} through DLPack; the two must agree")
    return exported, dtype


def resolved(a: Any, name: str) -> Any:
    """An input array as attnkit reads it: `a` itself, or
    - for a torch view with its negative or conjugate bit set (whose memory holds the values
      before that sign or conjugation), a resolved copy;
    - for a producer that offers only ``__dlpack__`` (no ``shape`` or ``dtype``): on the CPU,
      the producer with the shape and dtype of its DLPack import (_DLPackSource); on a GPU,
      torch's import of it.
    The caller holds the result for the duration of the call."""
    if a is None or type(a) is np.ndarray:
        return a
    if is_torch(a):
        return a.resolve_neg().resolve_conj() if a.is_neg() or a.is_conj() else a
    if not is_bare_producer(a) or (_readable(a, "shape") and _readable(a, "dtype")):
        return a
    on_cpu = device_of(a, name)[0] == "cpu"
    torch = None if on_cpu else _torch()
    if not on_cpu and torch is None:
        raise TypeError(f"topk: {name} (a {type(a).__name__} on {device_of(a)}) offers only "
                        "__dlpack__; import torch to read it, or pass a torch tensor")
    if on_cpu:
        return _dlpack_source(a, name)  # the extension's errors name `a` already
    try:
        return torch.from_dlpack(a)
    except Exception as e:  # the producer's export or the capsule it gave
        why = " ".join(str(e).split()) or type(e).__name__
        raise TypeError(f"topk: {name} (a {type(a).__name__}) could not be read through DLPack "
                        f"({why}); pass a NumPy array or a torch tensor") from None


_MAX_DIMS = 6  # attnkit::kMaxDims


def raw_view(a: Any, name: str, writable: bool = False) -> Any:
    """What the extension takes for array `a`: a raw-view tuple, or `a` itself for DLPack."""
    cls = type(a)
    if cls is _tensor_type:  # the common case, without the checks that other types need
        return _torch_view(a, name, writable)
    check_array(a, name)
    if cls is not np.ndarray:
        # A subclass may override shape, dtype or strides with values its memory does not
        # have: its layout is read through a base-class view of the same memory.
        if isinstance(a, np.ndarray):
            a = np.ndarray.view(a, np.ndarray)
        elif is_torch(a):
            try:
                base = _tensor_type.as_subclass(a, _tensor_type)
            except Exception:  # a subclass torch cannot view plainly is refused below
                base = None
            if base is not None and (base.data_ptr() != 0 or base.numel() == 0):
                a = base  # wrapper subclasses, without memory, keep their name for the refusal
    if is_bare_producer(a):
        return a  # the extension reads its export (rank checked there)
    if is_torch(a):
        return _torch_view(a, name, writable)
    shape = a.shape
    _check_dims(shape, name)
    if writable and not a.flags.writeable:
        raise ValueError(f"topk: {name} is read-only; outputs must be writable")
    code = _NUMPY_CODES.get(a.dtype)  # native byte order only: no other dtype equals these
    if code is None:
        check_byte_order(a, name)
        raise no_such_dtype(name, a.dtype)
    ptr, strides = _ext.ndarray_data(a)
    if strides is None:
        raise ValueError(f"topk: {name} has byte strides {a.strides} that are not multiples "
                         f"of its itemsize {a.dtype.itemsize}")
    return (ptr, shape, strides, code, 0, 0)


def _check_dims(shape: tuple, name: str) -> None:
    if len(shape) > _MAX_DIMS:
        raise ValueError(f"topk: {name} has {len(shape)} dimensions (shape {tuple(shape)}); "
                         f"topk takes x as [B, N] or [N], and [B] or [B, k] for the others")


def check_strided(a: Any, name: str) -> None:
    """TypeError for a torch tensor of another layout than strided (sparse, mkldnn)."""
    if a.layout != _strided:
        raise TypeError(f"topk: {name} has layout {a.layout}; expected a strided (dense) tensor")


def _torch_view(a: Any, name: str, writable: bool) -> tuple:
    """raw_view of a torch tensor: torch.Tensor itself, or a plain view of a subclass's memory
    (or the subclass, when it has none, to be refused by its name)."""
    shape = a.shape  # a torch.Size, a tuple, as the extension takes it
    _check_dims(shape, name)
    if a.is_neg() or a.is_conj():
        what = "output" if writable else "input (resolve it first)"
        raise ValueError(f"topk: {name} is a torch view with its negative or conjugate bit "
                         f"set, which attnkit cannot read or write as memory; pass a plain "
                         f"tensor as this {what}")
    check_strided(a, name)
    known = _torch_dtype_name(a.dtype)
    if known is None:
        raise no_such_dtype(name, a.dtype)
    # is_cpu/is_cuda/get_device() rather than a.device.type: no device object per call.
    if a.is_cpu:
        device_type, index = 0, 0
    elif a.is_cuda:
        device_type, index = 1, a.get_device()
    else:
        raise ValueError(f"topk: {name} is on device {a.device}; attnkit runs on cpu and cuda "
                         "tensors")
    ptr = a.data_ptr()
    if ptr == 0 and a.numel() > 0:
        # Wrapper subclasses (e.g. a __torch_dispatch__ tensor over others) and zero tensors
        # hold no memory of their own to read or write.
        raise ValueError(f"topk: {name} ({type(a).__name__}, {a.numel()} elements) has no "
                         f"storage of its own, as tensor subclasses that wrap others and "
                         f"zero tensors; pass a plain dense tensor, or call "
                         f"torch.ops.attnkit.topk, which dispatches through subclasses")
    return (ptr, shape, a.stride(), DTYPE_CODES[known], device_type, index)


def device_of(a: Any, name: str = "x") -> tuple[str, int]:
    """("cpu", 0) or ("cuda", index) for array argument `name`."""
    if isinstance(a, np.ndarray):
        return ("cpu", 0)
    if is_torch(a):
        return (a.device.type, a.device.index or 0)
    dl = getattr(a, "__dlpack_device__", None)
    if dl is None and hasattr(type(a), "__dlpack__"):
        raise TypeError(f"topk: {name} (a {type(a).__name__}) has __dlpack__ but no "
                        "__dlpack_device__; a DLPack producer offers both")
    if dl is not None:
        try:
            device = dl()
        except Exception as e:  # the producer's own error, named as its
            why = " ".join(str(e).split()) or type(e).__name__
            raise TypeError(f"topk: {name}.__dlpack_device__() (a {type(a).__name__}) raised "
                            f"({why})") from e
        try:
            kind, index = (int(v) for v in device)
        except (TypeError, ValueError):
            raise TypeError(f"topk: {name}.__dlpack_device__() (a {type(a).__name__}) returned "
                            f"{device!r}; expected a (device_type, device_id) pair of "
                            "ints") from None
        return ("cuda", index) if kind == 2 else ("cpu", 0)
    return ("cpu", 0)


def itemsize(dtype: str) -> int:
    return _NUMPY_DTYPES[dtype].itemsize


def physical_memory() -> Optional[int]:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides, in elements, of a contiguous array of `shape`, as torch gives them (a
    dimension of size 0 counts as 1)."""
    if len(shape) == 2:  # [B, k], the outputs of nearly every call, without the loop
        return (max(shape[1], 1), 1)
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


_TORCH_DTYPES: dict = {}  # torch's dtype object by attnkit's name, looked up once each


def empty_outputs(ref: Any, ref_view: Any, shape: tuple[int, ...], dtypes: tuple,
                  names: tuple) -> list:
    """For each dtype of `dtypes` (None: none wanted), an uninitialised array of `shape` and
    that dtype in ref's framework and on ref's device, and its raw view (`ref_view` is ref's),
    as (array, view), or (None, None). An array made here has ref's device, the dtype asked for
    and memory of its own, so its view is read off it rather than checked as a caller's buffer
    is, which would cost more than the allocation."""
    if type(ref_view) is not tuple or isinstance(ref, np.ndarray):
        return [(None, None) if d is None else _empty_with_view(ref, ref_view, shape, d, name)
                for d, name in zip(dtypes, names)]
    # A torch tensor. torch.empty_strided with the strides given is 1.1 us cheaper a call than
    # torch.empty on a CUDA device (H200 host), and leaves no strides to read back; what the
    # outputs share (strides, device, the allocator) is looked up once.
    empty_strided = _torch().empty_strided
    strides = _contiguous_strides(shape)
    device = ref.device
    made = []
    for dtype in dtypes:
        if dtype is None:
            made.append((None, None))
            continue
        torch_dtype = _TORCH_DTYPES.get(dtype)
        if torch_dtype is None:
            torch_dtype = _TORCH_DTYPES[dtype] = getattr(_torch(), dtype)
        out = empty_strided(shape, strides, dtype=torch_dtype, device=device)
        made.append((out, (out.data_ptr(), shape, strides, DTYPE_CODES[dtype], ref_view[4],
                           ref_view[5])))
    return made


def _empty_with_view(ref: Any, ref_view: Any, shape: tuple[int, ...], dtype: str,
                     name: str) -> tuple[Any, Any]:
    """empty_outputs' array and view for one dtype, where ref is not a torch tensor."""
    if isinstance(ref, np.ndarray):
        out = np.empty(shape, dtype=_NUMPY_DTYPES[dtype])
        ptr, strides = _ext.ndarray_data(out)
        return out, (ptr, shape, strides, DTYPE_CODES[dtype], 0, 0)
    module = type(ref).__module__.split(".")[0]
    if module == "cupy":
        import cupy

        out = cupy.empty(shape, dtype=_NUMPY_DTYPES[dtype])
    elif device_of(ref)[0] != "cpu":
        raise ValueError(f"attnkit cannot allocate outputs for a {type(ref).__name__} on "
                         f"{device_of(ref)}; pass out_values/out_indices")
    else:
        out = np.empty(shape, dtype=_NUMPY_DTYPES[dtype])
    return out, raw_view(out, name, writable=True)


def refuse_jax_tracer(a: Any, name: str) -> None:
    """TypeError for a JAX tracer (a value inside jax.jit, vmap or grad), which holds no data
    yet, before any other check reads it as an array."""
    if "Tracer" in type(a).__name__ and is_jax(a):
        raise TypeError(f"topk: {name} is a JAX tracer ({type(a).__name__}): inside jax.jit, "
                        "jax.vmap or jax.grad its values do not exist yet, and attnkit.topk "
                        "reads concrete arrays; call it outside the transformation, or "
                        "through jax.pure_callback")


def is_jax(a: Any) -> bool:
    """Whether `a` is a JAX array (read through DLPack, returned through jax.numpy)."""
    return type(a).__module__.split(".")[0] in ("jax", "jaxlib")


def jax_keeps_int64() -> bool:
    """Whether JAX holds int64 arrays: only with jax_enable_x64, else jax.numpy narrows them
    to int32 without a word."""
    import jax

    try:
        return bool(jax.config.read("jax_enable_x64"))
    except Exception:  # an older config without read()
        return bool(getattr(jax.config, "jax_enable_x64", False))


def to_caller(result: Any, ref: Any) -> Any:
    """`result` (allocated by `empty_outputs`) in ref's framework: unchanged for NumPy, torch
    and CuPy; converted for other frameworks that only lent their arrays through DLPack (e.g.
    JAX)."""
    if isinstance(ref, np.ndarray) or is_torch(ref) or isinstance(result, type(ref)):
        return result
    if is_jax(ref):
        import jax.numpy as jnp

        return jnp.asarray(result)
    return result


_CUDA_DEVICES: dict = {}  # torch.device("cuda", i) by index i, made once each


def cuda_device(index: int) -> Any:
    """torch's device object for CUDA device `index`."""
    device = _CUDA_DEVICES.get(index)
    if device is None:
        device = _CUDA_DEVICES[index] = _torch().device("cuda", index)
    return device


_raw_stream: Any = None  # torch._C._cuda_getCurrentRawStream, once looked up


def torch_stream(index: int) -> int:
    """The handle of torch's current CUDA stream on device `index`, as torch's generated code
    (inductor) reads it: no Stream object per call. The public call where a torch lacks it."""
    global _raw_stream
    if _raw_stream is None:
        torch = _torch()
        _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda i: torch.cuda.current_stream(i).cuda_stream)
    return _raw_stream(index)


def current_stream(ref: Any) -> int:
    """The CUDA stream the caller's framework is using for ref's device (0 on the CPU)."""
    if isinstance(ref, np.ndarray):
        return 0
    if is_torch(ref):
        return torch_stream(ref.get_device()) if ref.is_cuda else 0
    if device_of(ref)[0] != "cuda":
        return 0
    if type(ref).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0
