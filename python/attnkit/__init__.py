# SPDX-License-Identifier: Apache-2.0
"""attnkit: the kernels that sparse and linear attention need around the attention kernel.

Ops take NumPy arrays (bfloat16 through ``ml_dtypes``), torch tensors (CPU or CUDA) or any
DLPack tensor, and return the caller's array type. ``import attnkit.torch`` registers them as
``torch.ops.attnkit.*`` for ``torch.compile`` and CUDA graphs.
"""

from __future__ import annotations

# NumPy and ml_dtypes load before the extension: on some systems importing ml_dtypes after a
# module linked to another libstdc++ build crashes inside its number formatting.
import operator as _operator

import ml_dtypes as _ml_dtypes  # noqa: F401
import numpy as _numpy  # noqa: F401

from . import _ext
from .topk import topk, TopkResult

__version__ = "0.1.0"
__all__ = ["topk", "TopkResult", "num_threads", "set_num_threads", "info", "cuda_available"]


def num_threads() -> int:
    """Threads the CPU backend uses (``ATTNKIT_NUM_THREADS``, else one a CPU the process may
    run on)."""
    return _ext.num_threads()


_MAX_THREADS = 4096  # the CPU pool's largest size (src/core/thread_pool.cpp)


def set_num_threads(n: int) -> None:
    """Resizes the CPU thread pool; ``1 <= n <= 4096``, more than the machine's cores allowed
    (as ``torch.set_num_threads`` allows it; the threads then share the cores). Raises
    ValueError otherwise, and when the system starts fewer threads (a process or memory limit:
    the pool then runs those, which ``num_threads()`` reports); TypeError for a non-integer."""
    if isinstance(n, bool):
        raise TypeError(f"set_num_threads: n = {n!r}; expected an integer")
    try:
        n = _operator.index(n)
    except TypeError:
        raise TypeError(f"set_num_threads: n = {n!r}; expected an integer") from None
    if not 1 <= n <= _MAX_THREADS:  # also keeps n within the C++ int it crosses as
        raise ValueError(f"set_num_threads: n = {n} must be in [1, {_MAX_THREADS}]")
    _ext.set_num_threads(n)


def info() -> str:
    """Build information: version, compiler, CPU threads, CUDA targets and visible devices."""
    return _ext.build_info()


def cuda_available() -> bool:
    """True when this build has the CUDA backend (a GPU may still be absent)."""
    return _ext.cuda_available_in_build()
