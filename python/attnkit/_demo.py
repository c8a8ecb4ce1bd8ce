# SPDX-License-Identifier: Apache-2.0
"""``attnkit demo``: the seed top-k workloads, checked and timed beside the usual baselines.

On the CPU every case is timed for attnkit, ``std::nth_element``, ``std::partial_sort`` (both
in C++ over attnkit's thread pool, so all run on the same threads) and ``numpy.argpartition``
(rows split over the same number of Python threads), and attnkit's result is compared with the
reference backend bit for bit. With a CUDA build of attnkit, torch and a visible GPU, the cases
run on the GPU instead, beside ``torch.topk``, timed with CUDA events on a cold L2.
"""

from __future__ import annotations

import datetime
import fnmatch
import io
import json
import os
import platform
import stat
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ml_dtypes
import numpy as np

from . import _arrays, _ext
from . import _MAX_THREADS, __version__
from .topk import topk as _topk

# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    workload: str
    dtype: str  # "float32" or "bfloat16"
    batch: int
    n: int
    k: int
    order: str  # "none" or "value"; the std baselines have no index order
    quick: tuple[int, int]  # (batch, n) under --quick
    causal: bool = False  # end[b] = N - B + b + 1: a prefill chunk at the end of the context
    issue: bool = False
    gpu_only: bool = False

    def shape(self, quick: bool) -> tuple[int, int]:
        return self.quick if quick else (self.batch, self.n)


# The workloads of SPEC §1: the DSA indexer (bf16 scores, k of 512..2048, unordered) and the
# sampler (fp32 logits over a 129280-token vocabulary, best first). The cases marked `issue`
# are the tracked benchmark shapes whose speed-ups the summary repeats.
CASES: tuple[Case, ...] = (
    Case("dsa-decode-1m", "dsa indexer", "bfloat16", 1, 1 << 20, 2048, "none", (1, 1 << 16)),
    Case("dsa-k512", "dsa indexer", "bfloat16", 64, 65536, 512, "none", (4, 8192)),
    Case("dsa-k1024", "dsa indexer", "bfloat16", 64, 65536, 1024, "none", (4, 8192)),
    Case("dsa-k2048-issue", "dsa indexer", "bfloat16", 16, 131072, 2048, "none", (2, 16384),
         issue=True),
    Case("dsa-prefill-causal", "dsa indexer", "bfloat16", 1024, 16384, 2048, "none", (64, 4096),
         causal=True),
    Case("sample-k1", "sampling", "float32", 256, 129280, 1, "value", (4, 16160)),
    Case("sample-k50-issue", "sampling", "float32", 1, 129280, 50, "value", (1, 16160),
         issue=True),
    Case("sample-b256-k50", "sampling", "float32", 256, 129280, 50, "value", (4, 16160)),
    Case("sample-k1024-issue", "sampling", "float32", 64, 129280, 1024, "value", (4, 16160),
         issue=True),
    Case("sample-k4096", "sampling", "float32", 16, 129280, 4096, "value", (2, 16160)),
    # Production batch sizes that only a GPU runs in reasonable time.
    Case("dsa-prefill-4096", "dsa indexer", "bfloat16", 4096, 65536, 2048, "none", (64, 8192),
         causal=True, gpu_only=True),
    Case("sample-b4096-k50", "sampling", "float32", 4096, 129280, 50, "value", (64, 16160),
         gpu_only=True),
)

_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_BITS = {"float32": np.uint32, "bfloat16": np.uint16}
_INDEX_BYTES = 8  # the demo asks for int64 indices, as the std baselines write


class DemoUsageError(Exception):
    """A bad --cases/--device/--repeats value: exit code 2."""


def select_cases(spec: Optional[str], device: str) -> list[Case]:
    usable = [c for c in CASES if device == "cuda" or not c.gpu_only]
    if spec is None:
        return usable
    chosen: list[Case] = []
    patterns = [p.strip() for p in spec.split(",") if p.strip()]
    if not patterns:
        raise DemoUsageError(f"--cases {spec!r}: no pattern given; --list shows the cases")
    for pattern in patterns:
        hits = [c for c in usable if fnmatch.fnmatchcase(c.name, pattern)]
        if not hits:
            names = ", ".join(c.name for c in usable)
            gpu = [c.name for c in CASES
                   if c not in usable and fnmatch.fnmatchcase(c.name, pattern)]
            verb = "runs" if len(gpu) == 1 else "run"
            only = f" ({', '.join(gpu)} {verb} on the GPU only)" if gpu else ""
            raise DemoUsageError(f"--cases: no case matches {pattern!r} on {device}{only}; "
                                 f"cases: {names}")
        chosen.extend(c for c in hits if c not in chosen)
    return chosen


def case_list(device: str, spec: Optional[str] = None) -> str:
    """The cases `--cases spec` (every case without one) runs on `device`, one a line."""
    lines = []
    for c in select_cases(spec, device):
        b, n = c.shape(False)
        qb, qn = c.shape(True)
        tags = [t for t, on in (("causal", c.causal), ("issue", c.issue), ("gpu only", c.gpu_only))
                if on]
        lines.append(f"{c.name:22s} {c.workload:12s} {c.dtype:9s} [{b}, {n}] k={c.k} "
                     f"sorted={c.order}  (--quick: [{qb}, {qn}])"
                     + (f"  {', '.join(tags)}" if tags else ""))
    return "\n".join(lines)


def case_end(batch: int, n: int) -> np.ndarray:
    """Causal prefill: row b is query N - B + b of a context of N keys and sees keys [0, end)."""
    return (n - batch + 1 + np.arange(batch)).astype(np.int32)


def make_input(case: Case, quick: bool, seed: int) -> np.ndarray:
    b, n = case.shape(quick)
    rng = np.random.default_rng([seed, CASES.index(case)])
    x = rng.standard_normal((b, n), dtype=np.float32)
    return x if case.dtype == "float32" else x.astype(ml_dtypes.bfloat16)


def traffic_bytes(case: Case, quick: bool) -> tuple[int, int]:
    """(bytes of the valid input read once, bytes of values and indices written)."""
    b, n = case.shape(quick)
    item = _DTYPES[case.dtype].itemsize
    valid = int(case_end(b, n).astype(np.int64).sum()) if case.causal else b * n
    return valid * item, b * case.k * (_INDEX_BYTES + item)


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass
class Timing:
    samples: list[float]  # seconds per call

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


@dataclass
class CaseResult:
    case: Case
    shape: tuple[int, int]
    read_bytes: int
    write_bytes: int
    times: dict[str, Timing] = field(default_factory=dict)
    check: str = "not run"  # "ok", "MISMATCH", "ERROR"
    detail: str = ""
    warnings: list[str] = field(default_factory=list)

    def gbps(self, method: str) -> float:
        return (self.read_bytes + self.write_bytes) / self.times[method].median / 1e9

    def speedup(self, baseline: str) -> Optional[float]:
        if baseline not in self.times or "attnkit" not in self.times:
            return None
        return self.times[baseline].median / self.times["attnkit"].median

    def to_json(self) -> dict:
        c = self.case
        out = {
            "name": c.name, "workload": c.workload, "dtype": c.dtype, "shape": list(self.shape),
            "k": c.k, "sorted": c.order, "causal": c.causal, "issue": c.issue,
            "indices_dtype": "int64", "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes, "check": self.check,
            "times_s": {m: {"median": t.median, "samples": t.samples}
                        for m, t in self.times.items()},
            "gbps": {m: self.gbps(m) for m in self.times},
            "speedup": {m: self.speedup(m) for m in self.times if m != "attnkit"},
        }
        if self.detail:
            out["detail"] = self.detail
        if self.warnings:
            out["warnings"] = self.warnings
        return out


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def _row_chunks(batch: int, parts: int) -> list[slice]:
    parts = max(1, min(parts, batch))
    bounds = [batch * i // parts for i in range(parts + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


def _canonical(indices: np.ndarray, values: np.ndarray,
               order: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows in column order when the order is unspecified ("none"), as they are otherwise."""
    if order != "none":
        return indices, values
    perm = np.argsort(indices, axis=1, kind="stable")
    return np.take_along_axis(indices, perm, 1), np.take_along_axis(values, perm, 1)


def _compare(dtype: str, order: str, got_i, got_v, want_i, want_v) -> str:
    """'' when equal (indices exactly, values bit for bit), else what differs first."""
    got_i, got_v = _canonical(got_i, got_v, order)
    want_i, want_v = _canonical(want_i, want_v, order)
    bits = _BITS[dtype]
    bad_i = np.argwhere(got_i != want_i)
    if bad_i.size:
        r, c = bad_i[0]
        return (f"{len(bad_i)} indices differ; first at [{r}, {c}]: {got_i[r, c]} vs reference "
                f"{want_i[r, c]}")
    bad_v = np.argwhere(got_v.view(bits) != want_v.view(bits))
    if bad_v.size:
        r, c = bad_v[0]
        return (f"{len(bad_v)} values differ; first at [{r}, {c}]: {got_v[r, c]} vs reference "
                f"{want_v[r, c]}")
    return ""


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _fmt_ratio(r: Optional[float]) -> str:
    if r is None:
        return "-"
    return f"{r:.1f}x" if r < 100 else f"{r:.0f}x"


def _short_dtype(dtype: str) -> str:
    return "bf16" if dtype == "bfloat16" else "fp32"


def _label_cells(r: "CaseResult") -> list[str]:
    """The case, dtype, shape, k and order cells of a table row."""
    c = r.case
    return [c.name, _short_dtype(c.dtype), f"[{r.shape[0]}, {r.shape[1]}]", str(c.k),
            c.order + (" causal" if c.causal else "")]


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    text = ("case", "dtype", "shape", "order", "check")
    right = [i for i, h in enumerate(headers) if h not in text]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2))
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numpy_simd() -> list:
    """The x86 SIMD extensions NumPy dispatches to on this CPU (numpy.argpartition and sort take
    AVX-512 code where the CPU has it, which moves the argpartition baseline several-fold
    between machines); empty where NumPy does not say."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as features
        except ImportError:
            return []
    return [name for name, on in features.items() if on and name.startswith(("AVX", "FMA"))]


def _count(n: int, noun: str) -> str:
    """"1 run", "5 runs"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    # disable=None turns the bar off when stderr is not a terminal (CI logs), and a closed
    # stderr (`2>&-`) has no bar at all. A terminal that reports no size (a pseudo-terminal
    # nobody sized, as `script` or an editor's console makes) has room for no bar in tqdm's
    # eyes, which then draws none: it is taken as 80 x 24, the bar one column short of the
    # width as tqdm keeps it on sized terminals (a full line wraps on some consoles).
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        size = os.terminal_size((0, 0))
    sized = size.columns > 0 and size.lines > 0
    return tqdm(total=total, desc="attnkit demo", unit="step", file=sys.stderr,
                disable=None if enabled and sys.stderr is not None else True, leave=False,
                dynamic_ncols=sized, ncols=None if sized else 79, nrows=None if sized else 24)


class _Step:
    """Progress: each call ends the running step and names the one that starts."""

    def __init__(self, bar):
        self.bar = bar
        self.running = False

    def __call__(self, case: Case, what: str) -> None:
        if self.running:
            self.bar.update(1)
        self.bar.set_postfix_str(f"{case.name}: {what}", refresh=False)
        self.bar.refresh()
        self.running = True

    def close(self) -> None:
        if self.running:
            self.bar.update(1)
        self.running = False


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------

_CPU_METHODS = ("attnkit", "nth_element", "partial_sort", "argpartition")
_CPU_STEPS = 2 + len(_CPU_METHODS)  # input, four timings, check


def _time_cpu(fn: Callable[[], Any], repeats: int, warmup: int) -> Timing:
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    # Calls shorter than ~2 ms are timed in batches so that the clock and the interpreter add
    # little to each sample.
    inner = max(1, min(200, int(2e-3 / max(once, 1e-7))))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return Timing(samples)


def _numpy_topk(x: np.ndarray, k: int, order: str) -> tuple[np.ndarray, np.ndarray]:
    """What a NumPy user writes: argpartition, gather the values, sort them if asked.
    bfloat16 rows are widened to float32 first: argpartition on ml_dtypes' bfloat16 goes
    through a scalar compare and is several times slower than the conversion plus a float32
    argpartition."""
    keys = x if x.dtype == np.float32 else x.astype(np.float32)
    n = keys.shape[1]
    idx = np.argpartition(keys, n - k, axis=1)[:, n - k:]
    if order == "value":
        perm = np.argsort(-np.take_along_axis(keys, idx, 1), axis=1, kind="stable")
        idx = np.take_along_axis(idx, perm, 1)
    return np.take_along_axis(x, idx, 1), idx


def _reference(x, k: int, order: str, end, pool: ThreadPoolExecutor, threads: int):
    """The reference backend over row chunks in parallel (it is serial per call)."""
    values = np.empty((x.shape[0], k), dtype=x.dtype)
    indices = np.empty((x.shape[0], k), dtype=np.int64)

    def run(rows: slice) -> None:
        _topk(x[rows], k, sorted=order, end=None if end is None else end[rows],
              out_values=values[rows], out_indices=indices[rows], backend="reference")

    list(pool.map(run, _row_chunks(x.shape[0], threads)))
    return indices, values


def run_cpu_case(case: Case, quick: bool, repeats: int, warmup: int, seed: int,
                 pool: ThreadPoolExecutor, threads: int, step: _Step) -> CaseResult:
    b, n = case.shape(quick)
    k = case.k
    read, write = traffic_bytes(case, quick)
    res = CaseResult(case, (b, n), read, write)
    step(case, "input")
    x = make_input(case, quick, seed)
    end = case_end(b, n) if case.causal else None
    # The baselines take whole rows; for the causal case they read rows whose keys past end
    # are -inf (prepared here, untimed), so they select the same set from a little more data.
    xb = x
    if end is not None:
        xb = x.copy()
        xb[np.arange(n)[None, :] >= end[:, None]] = -np.inf

    step(case, "attnkit")
    out_v = np.empty((b, k), dtype=x.dtype)
    out_i = np.empty((b, k), dtype=np.int64)
    res.times["attnkit"] = _time_cpu(
        lambda: _topk(x, k, sorted=case.order, end=end, out_values=out_v, out_indices=out_i),
        repeats, warmup)

    xb_view = _arrays.raw_view(xb, "x")
    base: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for method in ("nth_element", "partial_sort"):
        step(case, method)
        bv = np.empty((b, k), dtype=x.dtype)
        bi = np.empty((b, k), dtype=np.int64)
        call = (xb_view, _arrays.raw_view(bi, "indices"), _arrays.raw_view(bv, "values"), k,
                method, case.order == "value")
        res.times[method] = _time_cpu(lambda call=call: _ext.baseline_topk(*call),
                                      repeats, warmup)
        base[method] = (bi, bv)

    step(case, "argpartition")
    chunks = _row_chunks(b, threads)

    def numpy_all() -> list:
        if len(chunks) == 1:
            return [_numpy_topk(xb, k, case.order)]
        return list(pool.map(lambda rows: _numpy_topk(xb[rows], k, case.order), chunks))

    res.times["argpartition"] = _time_cpu(numpy_all, repeats, warmup)
    np_v = np.concatenate([v for v, _ in numpy_all()])

    step(case, "check")
    want_i, want_v = _reference(x, k, case.order, end, pool, threads)
    diff = _compare(case.dtype, case.order, out_i, out_v, want_i, want_v)
    res.check, res.detail = ("MISMATCH", diff) if diff else ("ok", "")
    # The baselines must compute the same thing for the ratios to mean anything. The std ones
    # break ties by lower index, as attnkit does; argpartition may keep other tied elements, so
    # only its sorted values are compared.
    for method, (bi, bv) in base.items():
        d = _compare(case.dtype, case.order, bi, bv, want_i, want_v)
        if d:
            res.warnings.append(f"std::{method} disagrees with the reference: {d}")
    if not np.array_equal(np.sort(np_v.astype(np.float32), 1),
                          np.sort(want_v.astype(np.float32), 1)):
        res.warnings.append("numpy.argpartition selected other values than the reference")
    return res


def cpu_table(results: list[CaseResult]) -> str:
    headers = ["case", "dtype", "shape", "k", "order", "attnkit", "GB/s", "vs nth_element",
               "vs partial_sort", "vs argpartition", "check"]
    rows = []
    for r in results:
        rows.append([*_label_cells(r),
                     _fmt_time(r.times["attnkit"].median), f"{r.gbps('attnkit'):.1f}",
                     _fmt_ratio(r.speedup("nth_element")), _fmt_ratio(r.speedup("partial_sort")),
                     _fmt_ratio(r.speedup("argpartition")), r.check])
    return markdown_table(headers, rows)


# ---------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------

_GPU_STEPS = 4  # input, attnkit, torch.topk, check
_FLUSH_BYTES = 256 << 20  # larger than the L2 of any GPU attnkit targets


def _torch_bits(t, dtype: str):
    import torch

    return t.view(torch.int16 if dtype == "bfloat16" else torch.int32)


def run_gpu_case(case: Case, quick: bool, repeats: int, warmup: int, seed: int,
                 pool: ThreadPoolExecutor, threads: int, step: _Step, torch, device,
                 flush) -> CaseResult:
    b, n = case.shape(quick)
    k = case.k
    read, write = traffic_bytes(case, quick)
    res = CaseResult(case, (b, n), read, write)
    step(case, "input")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1000 + CASES.index(case))
    x = torch.randn((b, n), generator=gen, device=device, dtype=torch.float32)
    if case.dtype == "bfloat16":
        x = x.to(torch.bfloat16)
    end = None
    xb = x
    if case.causal:
        end = torch.from_numpy(case_end(b, n)).to(device)
        cols = torch.arange(n, device=device)
        xb = x.masked_fill(cols[None, :] >= end[:, None].long(), float("-inf"))
    torch.cuda.synchronize(device)

    def timed(fn: Callable[[], Any]) -> Timing:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(device)
        samples = []
        for _ in range(repeats):
            # A write larger than L2 evicts the input, so every repeat reads it cold; reading
            # the buffer back leaves clean lines, which the timed call evicts without writing
            # them back to memory.
            flush.zero_()
            flush.view(torch.int32).max()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) / 1e3)
        return Timing(samples)

    step(case, "attnkit")
    out_v = torch.empty((b, k), dtype=x.dtype, device=device)
    out_i = torch.empty((b, k), dtype=torch.int64, device=device)
    res.times["attnkit"] = timed(
        lambda: _topk(x, k, sorted=case.order, end=end, out_values=out_v, out_indices=out_i))

    step(case, "torch.topk")
    tv = torch.empty((b, k), dtype=x.dtype, device=device)
    ti = torch.empty((b, k), dtype=torch.int64, device=device)
    res.times["torch.topk"] = timed(
        lambda: torch.topk(xb, k, dim=1, largest=True, sorted=case.order == "value",
                           out=(tv, ti)))

    step(case, "check")

    x_host = x.cpu()
    end_host = None if end is None else end.cpu()
    want_v = torch.empty((b, k), dtype=x.dtype)
    want_i = torch.empty((b, k), dtype=torch.int64)

    def run(rows: slice) -> None:
        _topk(x_host[rows], k, sorted=case.order,
              end=None if end_host is None else end_host[rows],
              out_values=want_v[rows], out_indices=want_i[rows], backend="reference")

    list(pool.map(run, _row_chunks(b, threads)))
    # Values travel as their bit patterns (numpy has no torch.bfloat16); _compare checks bits.
    diff = _compare(case.dtype, case.order, out_i.cpu().numpy(),
                    _torch_bits(out_v.cpu(), case.dtype).numpy().view(_BITS[case.dtype]),
                    want_i.numpy(), _torch_bits(want_v, case.dtype).numpy().view(_BITS[case.dtype]))
    res.check, res.detail = ("MISMATCH", diff) if diff else ("ok", "")
    # torch.topk must select the same values (its tie choice may differ).
    tvals = torch.sort(tv.float(), dim=1).values
    avals = torch.sort(out_v.float(), dim=1).values
    if not torch.equal(tvals, avals):
        res.warnings.append("torch.topk selected other values than attnkit")
    return res


def gpu_table(results: list[CaseResult]) -> str:
    headers = ["case", "dtype", "shape", "k", "order", "attnkit", "GB/s", "torch.topk",
               "torch GB/s", "speed-up", "check"]
    rows = []
    for r in results:
        rows.append([*_label_cells(r),
                     _fmt_time(r.times["attnkit"].median), f"{r.gbps('attnkit'):.0f}",
                     _fmt_time(r.times["torch.topk"].median), f"{r.gbps('torch.topk'):.0f}",
                     _fmt_ratio(r.speedup("torch.topk")), r.check])
    return markdown_table(headers, rows)


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _torch_for_cuda():
    """torch when it is installed and sees a GPU, else None (attnkit never needs torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch if torch.cuda.is_available() else None


def choose_device(requested: str):
    """("cpu", None) or ("cuda", torch)."""
    if requested == "cpu":
        return "cpu", None
    cuda_build = bool(_ext.cuda_available_in_build())
    torch = _torch_for_cuda() if cuda_build else None
    if torch is not None:
        return "cuda", torch
    if requested == "cuda":
        if cuda_build:
            why = "torch with a visible CUDA GPU is needed"
        elif _torch_for_cuda() is None:
            why = ("no CUDA GPU is visible to torch here (and this attnkit build has no CUDA "
                   "backend either)")
        else:
            why = "this attnkit build has no CUDA backend (reinstall with ATTNKIT_CUDA=ON)"
        raise DemoUsageError(f"--device cuda: {why}")
    return "cpu", None


def machine_info(device: str, torch) -> dict:
    info = {
        "attnkit_version": __version__,
        "attnkit_info": _ext.build_info(),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "threads": _ext.num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numpy_simd": numpy_simd(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
    }
    if torch is not None:
        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _issue_lines(results: list[CaseResult], device: str) -> list[str]:
    lines = []
    for r in (r for r in results if r.case.issue):
        c = r.case
        shape = f"{_short_dtype(c.dtype)} [{r.shape[0]}, {r.shape[1]}] k={c.k}"
        if device == "cuda":
            lines.append(f"  {shape}: {_fmt_ratio(r.speedup('torch.topk'))} vs torch.topk")
        else:
            nth = "std::nth_element" + (" + sort" if c.order == "value" else "")
            lines.append(f"  {shape} (sorted={c.order}): "
                         f"{_fmt_ratio(r.speedup('partial_sort'))} vs std::partial_sort, "
                         f"{_fmt_ratio(r.speedup('nth_element'))} vs {nth}, "
                         f"{_fmt_ratio(r.speedup('argpartition'))} vs numpy.argpartition")
    return lines


class _Discard(io.TextIOBase):
    """A text stream that drops what is written to it: the report when its stream is closed."""

    def write(self, s: str) -> int:
        return len(s)


def _check_writable(path: str) -> None:
    """Refuses a --json path that cannot be written before the run, not after it."""
    if not path:
        raise DemoUsageError("--json '': empty path")
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        raise DemoUsageError(f"--json {path}: is a directory")
    if not os.path.isdir(folder):
        raise DemoUsageError(f"--json {path}: folder {folder} does not exist")
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:  # also a link to a missing file, which open() would create
        mode = None
    except OSError as e:
        raise DemoUsageError(f"--json {path}: {e.strerror or e}") from None
    if mode is not None and not stat.S_ISREG(mode):
        # A FIFO or a character device: opening it to try could block (a FIFO waits for a
        # reader) or end what reads it, so only its permission is asked. A socket or a block
        # device takes no JSON.
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise DemoUsageError(f"--json {path}: cannot write: not a file, FIFO or character "
                                 f"device")
        if not os.access(target, os.W_OK):
            raise DemoUsageError(f"--json {path}: cannot write: Permission denied")
        return
    # Opening the file itself (kept as it is, and removed again if it was not there) is the
    # one test that every file system and every name (too long, ...) answers.
    try:
        with open(target, "a"):
            pass
    except OSError as e:
        raise DemoUsageError(f"--json {path}: cannot write: {e.strerror or e}") from None
    if mode is None:
        os.remove(os.path.realpath(target))  # the new file, not a link that led to it


def run(args, json_to_stdout: bool = False) -> int:
    """Entry point of ``attnkit demo``; returns the exit code. With `json_to_stdout` the JSON
    goes to standard output and the report to standard error, so that the two do not mix;
    else --json is written as `attnkit topk` writes its archive (cli.write_output: replaced
    once complete; an open descriptor's file, /dev/stderr or /dev/fd/N, appended to)."""
    if args.threads is not None:
        if not 1 <= args.threads <= _MAX_THREADS:
            raise DemoUsageError(f"--threads {args.threads}: must be in [1, {_MAX_THREADS}]")
        _ext.set_num_threads(args.threads)
    repeats = args.repeats if args.repeats is not None else (5 if args.quick else 7)
    if repeats < 1:
        raise DemoUsageError(f"--repeats {repeats}: must be >= 1")
    if args.warmup < 0:
        raise DemoUsageError(f"--warmup {args.warmup}: must be >= 0")
    if not 0 <= args.seed < 2**32:
        raise DemoUsageError(f"--seed {args.seed}: must be in [0, 2^32)")
    if args.json is not None and not json_to_stdout:
        _check_writable(args.json)
    out = sys.stderr if json_to_stdout else sys.stdout
    if out is None:  # started with stderr closed (`2>&-`): print(file=None) would write to stdout
        out = _Discard()
    device, torch = choose_device(args.device)
    if args.list:
        print(case_list(device, args.cases))
        return 0
    cases = select_cases(args.cases, device)
    threads = _ext.num_threads()
    info = machine_info(device, torch)

    print(f"attnkit {__version__} demo on {device}: {info.get('gpu', info['cpu_model'])}, "
          f"{threads} CPU thread{'s' if threads != 1 else ''}"
          f"{', quick sizes' if args.quick else ''}", file=out)
    results: list[CaseResult] = []
    steps = _GPU_STEPS if device == "cuda" else _CPU_STEPS
    with ThreadPoolExecutor(max_workers=threads) as pool, \
            _progress(len(cases) * steps, not args.no_progress) as bar:
        step = _Step(bar)
        dev = flush = None
        if device == "cuda":
            dev = torch.device("cuda", torch.cuda.current_device())
            flush = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device=dev)
        for i, case in enumerate(cases):
            try:
                if device == "cuda":
                    r = run_gpu_case(case, args.quick, repeats, args.warmup, args.seed, pool,
                                     threads, step, torch, dev, flush)
                else:
                    r = run_cpu_case(case, args.quick, repeats, args.warmup, args.seed, pool,
                                     threads, step)
            except (ValueError, TypeError, RuntimeError) as e:
                # attnkit refused or failed on a valid workload: a failed check, not a crash.
                bar.write(f"{case.name}: ERROR: {type(e).__name__}: {e}", file=out)
                b, n = case.shape(args.quick)
                r = CaseResult(case, (b, n), *traffic_bytes(case, args.quick), check="ERROR",
                               detail=f"{type(e).__name__}: {e}")
            step.close()
            bar.n = (i + 1) * steps  # a case that failed part-way still ends on its mark
            bar.refresh()
            results.append(r)
    timed = [r for r in results if r.check != "ERROR"]
    failed = [r for r in results if r.check != "ok"]
    json_error = None
    # Written before the table, so that a reader of stdout that leaves early (`| head -1`)
    # does not take the file with it.
    if args.json:
        doc = {
            "machine": info,
            "device": device,
            "quick": bool(args.quick),
            "repeats": repeats,
            "warmup": args.warmup,
            "seed": args.seed,
            "cases": [r.to_json() for r in results],
            "issue_cases": [r.to_json() for r in results if r.case.issue],
            "failures": len(failed),
        }
        if json_to_stdout:  # a closed pipe or a full disk: the CLI's own handling of stdout
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
            sys.stdout.flush()
        else:
            from .cli import write_output

            text = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
            try:
                write_output(args.json, lambda f: f.write(text))
            except OSError as e:  # raised after the report, which is not lost with it
                json_error = f"--json {args.json}: {e.strerror or e}"
    print(file=out)
    print(gpu_table(timed) if device == "cuda" else cpu_table(timed), file=out)
    print(file=out)
    if device == "cuda":
        print(f"Median of {_count(repeats, 'run')} after {_count(args.warmup, 'warm-up')}, "
              f"CUDA events, L2 flushed (256 MB written, then read) before each run. "
              f"GB/s = (valid input bytes + values and int64 "
              f"indices written) / time. torch.topk reads whole rows (causal rows masked "
              f"with -inf). Results checked against attnkit's CPU reference backend.", file=out)
    else:
        print(f"Median of {_count(repeats, 'run')} after {_count(args.warmup, 'warm-up')}; "
              f"{threads} thread(s) for every method (std baselines on attnkit's pool, "
              f"parallel over rows; argpartition over row chunks). GB/s = (valid input bytes "
              f"+ values and int64 indices written) / attnkit time. 'vs X' = time of X / time "
              f"of attnkit. Baselines read whole rows (causal rows masked with -inf); bf16 rows "
              f"are widened to fp32 for argpartition. Every attnkit result is compared with the "
              f"reference backend: indices exactly, values bit for bit.", file=out)
    issue = _issue_lines(timed, device)
    if issue:
        print("Tracked cases (the -issue ones; attnkit speed-up):", file=out)
        print("\n".join(issue), file=out)
    for r in results:
        for w in r.warnings:
            print(f"warning: {r.case.name}: {w}", file=out)
    for r in failed:
        print(f"FAILED: {r.case.name}: {r.check}: {r.detail}", file=out)
    print(f"checks: {len(results) - len(failed)} of {len(results)} cases match the reference",
          file=out)

    if json_error is not None:
        if not failed:
            raise DemoUsageError(json_error)
        if sys.stderr is not None:  # a failed check's exit code comes first
            print(f"attnkit demo: error: {json_error}", file=sys.stderr)
    elif args.json and not json_to_stdout:
        print(f"wrote {args.json}", file=out)
    return 1 if failed else 0
