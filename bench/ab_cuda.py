#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Side-by-side timing of builds of the C++ CUDA benchmark (attnkit_bench_cuda): each seed
runs every build once on the same cases, the build that runs first rotating from seed to
seed, so that clock ramps and the machine's drift fall on all builds alike. A change of a few
percent is then told from noise by the per-seed ratios, not by one run's means.

    python3 bench/ab_cuda.py --build main=/tmp/bench_main --build new=/tmp/bench_new \\
        --seeds 1-20 --until 300 --log ab.txt -- --reps 10 bf16:8:131072:512 f32:1:129280:50

One binary may run as two builds that differ in the environment only (``--env``, e.g. a
kernel chosen by ``ATTNKIT_CUDA_TOPK_PATH``):

    python3 bench/ab_cuda.py --build auto=B --build filter=B \\
        --env filter:ATTNKIT_CUDA_TOPK_PATH=filter -- --reps 10 bf16:8:131072:512

Everything after ``--`` goes to every build's command line, with ``--seed S`` added. The
summary gives, for each case, each build's mean time over the seeds every build timed it on
(a run that fails counts for none of its rows), and for each build after the first the
geometric mean of its per-seed speed-ups over the first (first's us / its us: above 1 is
faster), how many seeds it was faster on and the range of the ratios. ``--summarize LOG``
prints the summary of a log this script wrote. Exit status 1 when no case was timed by every
build.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

_HEADER = re.compile(r"## build=(\S+) seed=(\d+)")
_NOTHING_TIMED = "no case was timed by every build on one seed\n"


def parse_log(lines) -> tuple[list[str], dict]:
    """The builds in order of first appearance, and {case: {(build, seed): us}} from a log of
    ``## build=NAME seed=S`` headers, each followed by the benchmark's table (columns dtype, B,
    N, k, causal, values, us, TB/s)."""
    builds: list[str] = []
    times: dict = defaultdict(dict)
    current = None
    seen: dict = defaultdict(int)  # a case named twice in one run: "#2" on its second row
    for line in lines:
        m = _HEADER.match(line)
        if m:
            current = (m.group(1), int(m.group(2)))
            seen.clear()
            if current[0] not in builds:
                builds.append(current[0])
            continue
        f = line.split()
        if current is None or len(f) != 8 or f[0] not in ("f32", "bf16", "f16"):
            continue
        try:
            us = float(f[6])
        except ValueError:
            continue
        if not us > 0:
            continue
        rows = {"yes": " causal", "last": " last", "end": " end"}.get(f[4], "")
        case = f"{f[0]} {f[1]}x{f[2]} k={f[3]}{rows}" + ("" if f[5] == "yes" else " no-values")
        seen[case] += 1
        if seen[case] > 1:
            case += f" #{seen[case]}"
        times[case][current] = us
    return builds, times


def summarize(builds: list[str], times: dict) -> str:
    """One line a case: mean us a build, then each later build against the first."""
    if not builds:
        return _NOTHING_TIMED
    width = max([len(c) for c in times] + [4])
    out = [f"{'case':{width}s} " + " ".join(f"{b:>10s}" for b in builds) +
           "  (speed-up over " + builds[0] + ": geometric mean of the per-seed ratios; "
           "seeds faster / seeds; range)"]
    dropped = []
    for case, d in times.items():
        seeds = sorted({s for (_, s) in d if all((b, s) in d for b in builds)})
        if not seeds:
            dropped.append(case)
            continue
        means = [sum(d[(b, s)] for s in seeds) / len(seeds) for b in builds]
        row = f"{case:{width}s} " + " ".join(f"{m:10.2f}" for m in means)
        for b in builds[1:]:
            ratios = [d[(builds[0], s)] / d[(b, s)] for s in seeds]
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            wins = sum(r > 1 for r in ratios)
            row += f"  {b}: {geo:.3f} {wins}/{len(seeds)} {min(ratios):.3f}-{max(ratios):.3f}"
        out.append(row)
    if len(out) == 1:
        return _NOTHING_TIMED
    if dropped:
        out.append("not timed by every build on one seed: " + ", ".join(dropped))
    return "\n".join(out) + "\n"


def report(lines) -> int:
    """Writes the summary of a log's lines to stdout; the exit status, 1 when no case was timed
    by every build."""
    summary = summarize(*parse_log(lines))
    sys.stdout.write(summary)
    return 1 if summary == _NOTHING_TIMED else 0


def seed_list(spec: str) -> list[int]:
    """Seeds from "A-B" or "A,B,C"; ValueError names the spec."""
    try:
        if "-" in spec:
            lo, hi = (int(v) for v in spec.split("-", 1))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(v) for v in spec.split(",")]
    except ValueError:
        raise ValueError(f"--seeds {spec!r}: expected A-B or A,B,C of integers") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {spec!r}: expected at least one seed, none twice")
    return seeds


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    passed: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passed = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(
        usage="%(prog)s --build NAME=PATH --build NAME=PATH [options] -- [BENCHMARK ARGS]",
        description=" ".join(__doc__.split("\n\n")[0].split()) if __doc__ else None,
        allow_abbrev=False)
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PATH",
                    help="a benchmark binary and its name in the summary; the first is the base")
    ap.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE",
                    help="set VAR to VALUE in the environment of build NAME's runs")
    ap.add_argument("--seeds", default="1-10", help="A-B or A,B,C (default 1-10)")
    ap.add_argument("--until", type=float, default=None,
                    help="start no seed after this many seconds")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a benchmark run may take")
    ap.add_argument("--log", help="write every run's output here (for --summarize)")
    ap.add_argument("--summarize", metavar="LOG", help="print the summary of a log, run nothing")
    args = ap.parse_args(argv)
    if "--" in passed:
        ap.error("one -- only: what follows it goes to every benchmark run")
    if args.summarize:
        with open(args.summarize) as f:
            return report(f)
    builds = []
    for spec in args.build:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path or any(c.isspace() for c in name):
            ap.error(f"--build {spec!r}: expected NAME=PATH, NAME without spaces")
        builds.append((name, path))
    if len(builds) < 2:
        ap.error("give at least two --build NAME=PATH")
    if len({n for n, _ in builds}) != len(builds):
        ap.error("--build names must differ")
    envs: dict[str, dict[str, str]] = {name: {} for name, _ in builds}
    for spec in args.env:
        name, sep, setting = spec.partition(":")
        var, eq, value = setting.partition("=")
        if not sep or not eq or not var:
            ap.error(f"--env {spec!r}: expected NAME:VAR=VALUE")
        if name not in envs:
            ap.error(f"--env {spec!r}: no --build is named {name!r}")
        envs[name][var] = value
    try:
        seeds = seed_list(args.seeds)
    except ValueError as e:
        ap.error(str(e))
    start = time.monotonic()
    log_lines: list[str] = []
    log = open(args.log, "w") if args.log else None
    try:
        for turn, seed in enumerate(seeds):
            if args.until is not None and time.monotonic() - start > args.until:
                print(f"# stopped before seed {seed} (--until {args.until:g} s)", file=sys.stderr)
                break
            print(f"# seed {seed}", file=sys.stderr)
            order = builds[turn % len(builds):] + builds[:turn % len(builds)]
            for name, path in order:
                cmd = [path, *passed, "--seed", str(seed)]
                try:
                    run = subprocess.run(cmd, capture_output=True, text=True,
                                         timeout=args.timeout,
                                         env={**os.environ, **envs[name]})
                    failed = run.returncode != 0
                    why = run.stderr.strip() or f"exit status {run.returncode}"
                except (OSError, subprocess.TimeoutExpired) as e:
                    failed, why = True, str(e)
                # A failed run's rows are left out: the summary compares whole runs.
                text = "" if failed else run.stdout
                if failed:
                    print(f"# {name} seed {seed}: {why}", file=sys.stderr)
                chunk = [f"## build={name} seed={seed}"] + text.splitlines()
                log_lines += chunk
                if log:
                    log.write("\n".join(chunk) + "\n")
                    log.flush()
    except KeyboardInterrupt:
        print("# interrupted: the summary of the runs so far", file=sys.stderr)
    finally:
        if log:
            log.close()
    return report(log_lines)


if __name__ == "__main__":
    sys.exit(main())
