# SPDX-License-Identifier: Apache-2.0
"""Benchmark of attnkit.topk against torch.topk on the GPU (and FlashInfer and DeepSelect when
installed), or of eager calls on the CPU (--device cpu --eager).

What is measured: the GPU time of one top-k call, as the median over repeats of CUDA-event
timings around a CUDA-graph replay of the call (so Python and launch overhead stay out, as in
triton's do_bench_cudagraph), with the L2 cache flushed before every repeat by writing a
256 MiB buffer and, by default (--flush clean), reading it back, so that L2 holds only clean
lines of a buffer the call never touches. --flush write skips the read, as triton's do_bench
does: L2 is then full of dirty lines that the timed call writes back to memory as its reads
evict them, up to the L2's size (50 MiB on an H100/H200) of extra traffic. Every case is
checked before it is timed: attnkit's indices must equal a stable-sort reference (lowest index
wins ties) and its values the input bits.

Effective bandwidth = (bytes of the valid input read once + bytes written) / time, the metric
DeepSelect reports; the H200's measured read ceiling is ~4.2 TB/s.

Axes: workload (DSA indexer bf16 k in {512, 1024, 2048}: decode, prefill and causal prefill;
sampling fp32 N = 129280 k in {1, 50, 1024, 4096}), return_values, and an input-pattern axis
(normal, DSA-like ReLU sums, ascending rows (the adversarial order for threshold filters),
4-valued ties).

FlashInfer, when it is installed, is timed the same way on every case: `flashinfer.top_k` as it
ships (ties broken any way, rows unsorted, int64 indices; it always returns the values) and with
`deterministic=True, tie_break=1` (lowest index wins, attnkit's contract), and on causal rows
`flashinfer.top_k_ragged_transform` (per-row lengths, int32 indices only). Its outputs are
checked too (a valid top-k set; with lowest-index ties, the reference set) and the verdict is
reported beside its time, not raised.

DeepSelect, when `deep_select` is importable, is timed on the same rows with the same return_values
(`deep_select.topk(x, k, end=end, indices_type=torch.int32, return_value=...)`, rows unsorted,
ties broken any way, unused slots filled with -1); its results are checked the same way.

Usage: python bench/bench_topk.py [--quick] [--eager] [--device cuda|cpu] [--flush clean|write]
                                 [--json out.json] [--markdown out.md]
                                 [--case dtype:B:N:k[:causal][:pattern] ...]

--eager times back-to-back eager calls by the host clock instead (EagerTimer): what a caller
outside CUDA graphs and torch.compile pays a call, Python and launch overhead included.
--device cpu --eager times the same on CPU tensors (small shapes unless --case is given), where
a small call's time is mostly the Python layer's and the call's own.

--case replaces the case list by the given shapes (repeatable): dtype bf16, f16 or f32;
"causal" gives row b of the last B queries of an N-key context end[b] = N - B + 1 + b; the
pattern is one of normal, dsa, ascending, ties, inf (60 % +inf) (default: dsa for 16-bit types,
normal for f32).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import sys
import time

import torch

import attnkit
from attnkit._demo import cpu_model

L2_FLUSH_BYTES = 256 << 20
DEVICE = "cuda"  # or "cpu" (--device cpu, eager calls only)


def sync() -> None:
    """Waits for the work queued on DEVICE (nothing to wait for on the CPU)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_input(pattern: str, batch: int, n: int, dtype: torch.dtype, gen: torch.Generator):
    if pattern == "normal":
        x = torch.randn(batch, n, device=DEVICE, generator=gen)
    elif pattern == "dsa":
        # Indexer scores: sum over 4 heads of w_h * relu(q . k); many exact zeros.
        h = torch.randn(4, batch, n, device=DEVICE, generator=gen).clamp_min_(0)
        x = (h * torch.rand(4, 1, 1, device=DEVICE, generator=gen)).sum(0)
    elif pattern == "ascending":
        x = torch.arange(n, device=DEVICE, dtype=torch.float32).expand(batch, n).contiguous()
        x = x / n + torch.rand(batch, 1, device=DEVICE, generator=gen)
    elif pattern == "ties":
        x = torch.randint(0, 4, (batch, n), device=DEVICE, generator=gen).float()
    elif pattern == "inf":
        # Mostly +inf (60 %): the k-th best is +inf, which only a NaN could beat.
        x = torch.randn(batch, n, device=DEVICE, generator=gen)
        x = x.masked_fill(torch.rand(batch, n, device=DEVICE, generator=gen) < 0.6, float("inf"))
    else:
        raise ValueError(pattern)
    return x.to(dtype)


def cases(quick: bool):
    """The case list: (name, dtype, batch, n, k, causal, pattern)."""
    out = []
    dsa_shapes = [(1, 131072), (8, 131072), (1, 1048576), (8, 1048576), (256, 65536),
                  (256, 131072), (512, 131072), (256, 1048576), (4096, 8192)]
    if quick:
        dsa_shapes = [(1, 131072), (256, 131072), (4096, 8192)]
    for k in (512, 1024, 2048):
        for b, n in dsa_shapes:
            out.append(("dsa", torch.bfloat16, b, n, k, False, "dsa"))
        out.append(("dsa-causal", torch.bfloat16, 4096, 8192, k, True, "dsa"))
        if not quick:
            out.append(("dsa-causal", torch.bfloat16, 2048, 65536, k, True, "dsa"))
    for k in (1, 50, 1024, 4096):
        for b in (1, 256):
            out.append(("sampling", torch.float32, b, 129280, k, False, "normal"))
    if not quick:
        for b, n in ((1, 151936), (64, 202048)):
            out.append(("sampling", torch.float32, b, n, 50, False, "normal"))
        for pattern in ("ascending", "ties"):
            out.append((f"dsa-{pattern}", torch.bfloat16, 256, 131072, 2048, False, pattern))
    return out


def cpu_cases():
    """The eager CPU case list (--device cpu): small calls, where the time of the Python layer
    and the call itself shows beside the selection's."""
    return [("tiny", torch.float32, 4, 64, 8, False, "normal"),
            ("router", torch.float32, 1, 256, 8, False, "normal"),
            ("greedy", torch.float32, 256, 64, 1, False, "normal"),
            ("sampling", torch.float32, 1, 32000, 50, False, "normal"),
            ("sampling", torch.float32, 8, 32000, 50, False, "normal"),
            ("dsa", torch.bfloat16, 1, 8192, 512, False, "dsa")]


_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
_PATTERNS = ("normal", "dsa", "ascending", "ties", "inf")


def parse_case(spec: str):
    """A case tuple of cases() from "dtype:B:N:k[:causal][:pattern]"; ValueError names the
    part that is wrong."""
    parts = spec.split(":")
    if len(parts) < 4:
        raise ValueError(f"--case {spec!r}: expected dtype:B:N:k[:causal][:pattern]")
    if parts[0] not in _DTYPES:
        raise ValueError(f"--case {spec!r}: dtype {parts[0]!r} is not one of {sorted(_DTYPES)}")
    dtype = _DTYPES[parts[0]]
    try:
        b, n, k = (int(v) for v in parts[1:4])
    except ValueError:
        raise ValueError(f"--case {spec!r}: B, N and k must be integers") from None
    if b < 1 or n < 1 or k < 1:
        raise ValueError(f"--case {spec!r}: B, N and k must be >= 1")
    causal = False
    pattern = "normal" if dtype == torch.float32 else "dsa"
    for extra in parts[4:]:
        if extra == "causal":
            causal = True
        elif extra in _PATTERNS:
            pattern = extra
        else:
            raise ValueError(f"--case {spec!r}: {extra!r} is neither 'causal' nor a pattern "
                             f"({', '.join(_PATTERNS)})")
    name = "custom-causal" if causal else "custom"
    return (name, dtype, b, n, k, causal, pattern)


class GraphTimer:
    """Times fn() by replaying a CUDA graph of it between two events, L2 flushed first."""

    def __init__(self, fn, repeats: int, clean_flush: bool = True):
        self.repeats = repeats
        self.clean_flush = clean_flush
        self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=DEVICE)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            fn()

    def median_us(self) -> float:
        times = []
        for _ in range(self.repeats):
            self.flush.fill_(1)
            if self.clean_flush:
                self.flush.view(torch.int32).max()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)


class EagerTimer:
    """Times back-to-back eager calls of fn() by the host clock, synchronised before and after
    each batch of `batch` calls, with nothing flushed: the cost a caller outside CUDA graphs
    sees per call, the larger of the Python layer's and launch overhead and the GPU time on a
    warm L2. Median over `repeats` batches, per call."""

    def __init__(self, fn, repeats: int, batch: int = 50):
        self.fn, self.repeats, self.batch = fn, repeats, batch
        for _ in range(5):
            fn()
        sync()

    def median_us(self) -> float:
        times = []
        for _ in range(self.repeats):
            sync()
            t0 = time.perf_counter()
            for _ in range(self.batch):
                self.fn()
            sync()
            times.append((time.perf_counter() - t0) / self.batch * 1e6)
        return statistics.median(times)


def reference_indices(x, k, end):
    """Lowest-index top-k by a stable descending sort (valid range [0, end[b]))."""
    xs = x.float()
    if end is not None:
        col = torch.arange(x.shape[1], device=x.device)
        xs = xs.masked_fill(col[None, :] >= end[:, None], float("-inf"))
    order = torch.sort(xs, dim=1, descending=True, stable=True).indices[:, :k]
    return torch.sort(order, dim=1).values


def check(x, k, end, values, indices, order="none"):
    want = reference_indices(x, k, end)
    got = indices.long()
    if end is not None:
        # Rows shorter than k pad with -1 after their valid columns.
        lengths = end.long().clamp(max=k)
        slot = torch.arange(k, device=x.device)[None, :]
        want = torch.where(slot < lengths[:, None], want, torch.full_like(want, -1))
        got_sorted = torch.where(slot < lengths[:, None],
                                 torch.sort(got.masked_fill(got < 0, 1 << 40), dim=1).values, got)
    else:
        got_sorted = torch.sort(got, dim=1).values
    if not torch.equal(got_sorted, want):
        bad = (got_sorted != want).any(dim=1).nonzero()[:3].flatten().tolist()
        raise AssertionError(f"indices differ from the stable-sort reference in rows {bad}")
    if values is not None:
        valid = indices >= 0
        gathered = torch.gather(x, 1, indices.long().clamp(min=0))
        bits = torch.int16 if x.element_size() == 2 else torch.int32
        if not torch.equal(gathered.view(bits)[valid], values.view(bits)[valid]):
            raise AssertionError("values are not the input bits at the returned indices")
    if order != "none" and end is None:
        # Best first by value, or ascending column: each row's order, not only its set.
        key = x.gather(1, indices.long()).float() if order == "value" else -indices.double()
        if (key[:, 1:] > key[:, :-1]).any():
            raise AssertionError(f"a row is not in sorted={order!r} order")


def is_top_k(x, k, end, indices, lowest_index: bool) -> bool:
    """Whether indices hold a top-k of each row's valid range: the values they pick equal the
    k best values (ties broken any way), and with lowest_index the set is the reference's."""
    want = reference_indices(x, k, end)
    got = indices.long()
    if end is not None:
        lengths = end.long().clamp(max=k)
        slot = torch.arange(k, device=x.device)[None, :]
        if not torch.equal(got < 0, slot >= lengths[:, None]):
            return False
        got = torch.where(slot < lengths[:, None], got, want)
    if ((got < 0) | (got >= x.shape[1])).any():
        return False
    if lowest_index:
        return torch.equal(torch.sort(got, dim=1).values, want)
    picked = torch.sort(x.gather(1, got).float(), dim=1).values
    best = torch.sort(x.gather(1, want).float(), dim=1).values
    return torch.equal(picked, best)


def flashinfer_calls(fi, x, k, end):
    """FlashInfer's calls for one case, by column: its top_k as it ships (any ties) and with
    lowest-index ties, or on rows with per-row ends its ragged top-k (any ties). Each is
    (call, indices of the call's result, whether its ties are lowest-index)."""
    if end is not None:
        offsets = torch.zeros_like(end)
        return {"flashinfer_us": (lambda: fi.top_k_ragged_transform(x, offsets, end, k),
                                  lambda out: out, False)}
    return {"flashinfer_us": (lambda: fi.top_k(x, k), lambda out: out[1], False),
            "flashinfer_lowest_us": (lambda: fi.top_k(x, k, deterministic=True, tie_break=1),
                                     lambda out: out[1], True)}


def time_flashinfer(fi, x, k, end, timer):
    """{column: median us or None} and {column: "ok" / "wrong" / the error it raised}."""
    times, verdicts = {}, {}
    for column, (call, indices_of, lowest) in flashinfer_calls(fi, x, k, end).items():
        times[column], verdicts[column] = time_peer(call, indices_of, x, k, end, lowest, timer)
    return times, verdicts


def deepselect_call(ds, x, k, end, return_values):
    """DeepSelect's call for one row of a case: (call, indices of its result)."""
    def call():
        return ds.topk(x, k, end=end, indices_type=torch.int32, idx_oob_fill_value=-1,
                       return_value=return_values)
    return call, lambda out: out[1]


def time_peer(call, indices_of, x, k, end, lowest, timer):
    """(median us or None, "ok" / "wrong" / the error the call raised)."""
    try:
        out = call()
        sync()
        verdict = "ok" if is_top_k(x, k, end, indices_of(out), lowest) else "wrong"
        return round(timer(call).median_us(), 2), verdict
    except Exception as e:  # a peer's refusal is reported, not fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


# The peers timed when importable: {key: (module, the call timed)}. A row's columns for a peer
# are `<key>_us`, `<key>_check` and `speedup_<key>`.
PEERS = {"flashinfer": ("flashinfer", "flashinfer.top_k"),
         "deepselect": ("deep_select", "deep_select.topk")}


def peers():
    found = {}
    for key, (module, _) in PEERS.items():
        try:
            found[key] = importlib.import_module(module)
        except ImportError:
            pass
    return found


def warm_up_gpu(seconds: float = 1.0) -> None:
    """Keeps the GPU busy for `seconds` before the first timing: an idle H100 clocks its SMs
    down (345 MHz), and the first cases of a run, timed while the clocks ramp up, measured up to
    3x their time later in the same run (run 232: causal bf16 4096 x 8192 k=512 182 and 79 us,
    then 54-56)."""
    a = torch.randn(4096, 4096, device=DEVICE)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()


def run(case_list, repeats: int, clean_flush: bool = True, order: str = "none",
        eager: bool = False):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    rows = []

    def timer(fn):
        return EagerTimer(fn, repeats) if eager else GraphTimer(fn, repeats, clean_flush)

    available = peers() if DEVICE == "cuda" else {}  # the peers are GPU libraries
    for key, (module, _) in PEERS.items():
        if key not in available and DEVICE == "cuda":
            print(f"# {module}: not installed on this machine, its columns skipped",
                  file=sys.stderr)
    if DEVICE == "cuda":
        warm_up_gpu()  # after the peers' imports, which leave the GPU idle
    for name, dtype, b, n, k, causal, pattern in case_list:
        x = make_input(pattern, b, n, dtype, gen)
        end = None
        if causal:
            # Causal prefill: row b of the last b query tokens sees end[b] keys, rising to N.
            end = (n - b + 1 + torch.arange(b, device=DEVICE, dtype=torch.int32)).clamp(min=1)
        valid = int(end.sum().item()) if end is not None else b * n
        fi_times, fi_verdicts = ({}, {})
        if "flashinfer" in available and order == "none":
            # It returns values on every call: one measurement serves both rows of the case.
            fi_times, fi_verdicts = time_flashinfer(available["flashinfer"], x, k, end, timer)
        for return_values in (True, False):
            out_i = torch.empty(b, k, dtype=torch.int32, device=DEVICE)
            out_v = torch.empty(b, k, dtype=dtype, device=DEVICE) if return_values else None

            def ours():
                attnkit.topk(x, k, end=end, sorted=order, indices_dtype=torch.int32,
                             out_indices=out_i, out_values=out_v, return_values=return_values)

            def ours_allocating():  # as an eager caller writes it: outputs made by the call
                attnkit.topk(x, k, end=end, sorted=order, indices_dtype=torch.int32,
                             return_values=return_values)

            ours()
            sync()
            check(x, k, end, out_v, out_i, order)
            t_ours = timer(ours_allocating if eager else ours).median_us()
            xt = x if end is None else x.masked_fill(
                torch.arange(n, device=DEVICE)[None, :] >= end[:, None], float("-inf"))

            def theirs():
                torch.topk(xt, k, dim=1, sorted=order == "value")

            t_torch = timer(theirs).median_us()
            written = b * k * (4 + (x.element_size() if return_values else 0))
            bytes_moved = valid * x.element_size() + written
            row = {
                "case": name, "pattern": pattern, "dtype": str(dtype).removeprefix("torch."),
                "B": b, "N": n, "k": k, "causal": causal, "values": return_values,
                "attnkit_us": round(t_ours, 2), "torch_us": round(t_torch, 2),
                "attnkit_TBps": round(bytes_moved / t_ours / 1e6, 3),
                "torch_TBps": round(bytes_moved / t_torch / 1e6, 3),
                "speedup": round(t_torch / t_ours, 2),
            }
            peer_times, peer_verdicts = dict(fi_times), dict(fi_verdicts)
            if "deepselect" in available and order == "none":
                call, indices_of = deepselect_call(available["deepselect"], x, k, end,
                                                   return_values)
                peer_times["deepselect_us"], peer_verdicts["deepselect_us"] = time_peer(
                    call, indices_of, x, k, end, False, timer)
            for column, t in peer_times.items():
                row[column] = t
                row[column.removesuffix("_us") + "_check"] = peer_verdicts[column]
            for key in PEERS:
                if row.get(key + "_us") is not None:
                    row["speedup_" + key] = round(row[key + "_us"] / t_ours, 2)
            rows.append(row)
            print(f"{name:16s} {row['dtype']:8s} B={b:<5d} N={n:<8d} k={k:<5d} "
                  f"values={int(return_values)} "
                  f"attnkit {t_ours:9.2f} us {row['attnkit_TBps']:6.3f} TB/s | "
                  f"torch {t_torch:9.2f} us | x{row['speedup']:.2f}"
                  + "".join(f" | {c.removesuffix('_us')} {t} us ({peer_verdicts[c]})"
                            for c, t in peer_times.items()), flush=True)
    return rows


def _peer_cell(r, column):
    t, verdict = r.get(column), r.get(column.removesuffix("_us") + "_check")
    if verdict is None:
        return "-"
    if t is None:
        return f"refused ({verdict})"
    return f"{t}" if verdict == "ok" else f"{t} ({verdict})"


def markdown(rows, header: str) -> str:
    with_fi = any("flashinfer_check" in r for r in rows)
    with_ds = any("deepselect_check" in r for r in rows)
    head = ("| case | dtype | B | N | k | values | torch.topk us | attnkit us | attnkit TB/s "
            "| speed-up |")
    rule = "|---|---|---|---|---|---|---|---|---|---|"
    if with_fi:
        head += " FlashInfer us (any ties) | FlashInfer us (lowest index) | vs FlashInfer |"
        rule += "---|---|---|"
    if with_ds:
        head += " DeepSelect us (any ties) | vs DeepSelect |"
        rule += "---|---|"
    lines = [header, "", head, rule]
    for r in rows:
        line = (f"| {r['case']}{' (causal)' if r['causal'] else ''} | {r['dtype']} | {r['B']} | "
                f"{r['N']} | {r['k']} | {'yes' if r['values'] else 'no'} | {r['torch_us']} | "
                f"{r['attnkit_us']} | {r['attnkit_TBps']} | {r['speedup']}x |")
        if with_fi:
            vs = r.get("speedup_flashinfer")
            line += (f" {_peer_cell(r, 'flashinfer_us')} | "
                     f"{_peer_cell(r, 'flashinfer_lowest_us')} | "
                     f"{f'{vs}x' if vs is not None else '-'} |")
        if with_ds:
            vs = r.get("speedup_deepselect")
            line += f" {_peer_cell(r, 'deepselect_us')} | {f'{vs}x' if vs is not None else '-'} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--flush", choices=("clean", "write"), default="clean",
                    help="L2 flush before each repeat: write a 256 MiB buffer and read it back "
                         "(clean), or only write it (write, as triton's do_bench)")
    ap.add_argument("--json", help="write all rows as JSON here")
    ap.add_argument("--markdown", help="write the table as markdown here")
    ap.add_argument("--sorted", choices=("none", "index", "value"), default="none",
                    help="attnkit's order; torch.topk sorts for 'value' only (default: none)")
    ap.add_argument("--eager", action="store_true",
                    help="time back-to-back eager calls by the host clock (Python and launch "
                         "overhead included, L2 warm) instead of CUDA-graph replays")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="where x lives; cpu times eager calls only (--eager) and runs small "
                         "shapes unless --case says otherwise (default: cuda)")
    ap.add_argument("--case", action="append", metavar="SPEC", default=[],
                    help="dtype:B:N:k[:causal][:pattern], e.g. bf16:4:131072:2048; repeatable; "
                         "replaces the case list")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cpu" and not args.eager:
        ap.error("--device cpu times eager calls: add --eager (CUDA graphs are a GPU's)")
    try:
        default = cpu_cases() if DEVICE == "cpu" else cases(args.quick)
        case_list = [parse_case(spec) for spec in args.case] or default
    except ValueError as e:
        ap.error(str(e))
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_topk: needs a CUDA GPU (or --device cpu --eager)", file=sys.stderr)
        return 2
    t0 = time.time()
    rows = run(case_list, args.repeats, args.flush == "clean", args.sorted, args.eager)
    where = (f"GPU: {torch.cuda.get_device_properties(0).name}" if DEVICE == "cuda" else
             f"CPU: {cpu_model()}, {torch.get_num_threads()} torch threads, "
             f"{attnkit.num_threads()} attnkit threads")
    method = ("eager calls back to back (outputs allocated by each call), host clock, L2 warm, "
              f"median of {args.repeats} batches of 50" if args.eager else
              f"CUDA-graph replay timed with events, L2 flushed ({args.flush}), "
              f"median of {args.repeats}")
    header = (f"{where}, torch {torch.__version__}, attnkit {attnkit.__version__}; "
              f"{method}; "
              f"int32 indices, sorted={args.sorted!r}, ties='lowest_index'")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "rows": rows, "seconds": time.time() - t0}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, header))
    geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    print(f"# geometric-mean speed-up over torch.topk: {geo:.2f}x over {len(rows)} cases")
    for key, (_, call) in PEERS.items():
        ratios = [r["speedup_" + key] for r in rows if "speedup_" + key in r]
        if ratios:
            geo_peer = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
            print(f"# geometric-mean speed-up over {call} (any ties): {geo_peer:.2f}x over "
                  f"{len(ratios)} cases, {min(ratios):.2f}-{max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
