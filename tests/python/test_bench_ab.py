# SPDX-License-Identifier: Apache-2.0
"""bench/ab_cuda.py: the rotation of which build runs first, the arguments each run gets, the
log it writes and the summary's per-seed speed-ups, with stand-in benchmarks that print the
C++ benchmark's table."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import stat
import sys

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "ab_cuda.py")
_spec = importlib.util.spec_from_file_location("ab_cuda", _PATH)
ab_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_cuda)

# A stand-in for attnkit_bench_cuda: appends its name and arguments to a file, then prints the
# benchmark's header and its rows, each time being base_us * factor, the factor set per build
# and tripled for the seed SLOW_SEED; on the seed FAIL_SEED it exits 4 after its first row.
_FAKE = """#!{python}
import json, os, sys
args = sys.argv[1:]
seed = int(args[args.index("--seed") + 1])
with open({calls!r}, "a") as f:
    f.write(json.dumps(["{name}"] + args) + "\\n")
factor = {factor} * (3.0 if seed == {slow_seed} else 1.0)
factor *= float(os.environ.get("AB_TEST_FACTOR", "1"))
print("dtype      B        N     k causal values         us     TB/s")
print("f32        1   129280    50 no     yes    %10.2f    0.041" % (12.0 * factor))
if seed == {fail_seed}:
    sys.exit(4)
print("bf16       8   131072   512 yes    no     %10.2f    0.170" % (20.0 * factor))
print("bf16       8   131072   512 end    yes    %10.2f    0.170" % (30.0 * factor))
print("bf16       8   131072   512 end    yes    %10.2f    0.170" % (40.0 * factor))
print("bf16    4096     8192   512 last   yes    %10.2f    1.100" % (50.0 * factor))
"""


def _fake(tmp_path, name, factor, slow_seed=-1, fail_seed=-1):
    path = tmp_path / f"bench_{name}"
    path.write_text(_FAKE.format(python=sys.executable, calls=str(tmp_path / "calls.txt"),
                                 name=name, factor=factor, slow_seed=slow_seed,
                                 fail_seed=fail_seed))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return f"{name}={path}"


def _calls(tmp_path):
    return [json.loads(line) for line in (tmp_path / "calls.txt").read_text().splitlines()]


def _rows(out):
    """The summary's rows by case name (the text before the first number)."""
    rows = {}
    for line in out.splitlines()[1:]:
        words = line.split()
        cut = next(i for i, w in enumerate(words) if w.replace(".", "").isdigit())
        rows[" ".join(words[:cut])] = words[cut:]
    return rows


def test_builds_take_turns_running_first_each_run_gets_the_arguments_then_its_seed(tmp_path):
    builds = [_fake(tmp_path, n, 1.0) for n in ("a", "b", "c")]
    args = [a for b in builds for a in ("--build", b)]
    assert ab_cuda.main(args + ["--seeds", "1-4", "--", "--reps", "2", "f32:1:129280:50"]) == 0
    calls = _calls(tmp_path)
    assert [(c[0], int(c[-1])) for c in calls] == [
        ("a", 1), ("b", 1), ("c", 1), ("b", 2), ("c", 2), ("a", 2),
        ("c", 3), ("a", 3), ("b", 3), ("a", 4), ("b", 4), ("c", 4)]
    assert all(c[1:-1] == ["--reps", "2", "f32:1:129280:50", "--seed"] for c in calls)


def test_summary_gives_the_per_seed_geometric_mean_and_the_seeds_won(tmp_path, capsys):
    # b is 1.25x faster than a on every seed but seed 2, where it is 2.4x slower.
    builds = [_fake(tmp_path, "a", 1.0), _fake(tmp_path, "b", 0.8, slow_seed=2)]
    log = tmp_path / "ab.txt"
    args = [a for b in builds for a in ("--build", b)]
    assert ab_cuda.main(args + ["--seeds", "1,2,3,4", "--log", str(log), "--"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    want = math.exp((3 * math.log(1.25) + math.log(1.25 / 3)) / 4)
    assert rows["f32 1x129280 k=50"] == [
        "12.00", f"{(3 * 9.6 + 28.8) / 4:.2f}", "b:", f"{want:.3f}", "3/4", "0.417-1.250"]
    # Causal rows, rows with `end` and missing values are part of a case's name, and a case
    # printed twice in one run is two cases.
    assert rows["bf16 8x131072 k=512 causal no-values"][0] == "20.00"
    assert rows["bf16 8x131072 k=512 end"][0] == "30.00"
    assert rows["bf16 8x131072 k=512 end #2"][0] == "40.00"
    assert rows["bf16 4096x8192 k=512 last"][0] == "50.00"
    # The log holds every run and gives the same summary again.
    assert ab_cuda.main(["--summarize", str(log)]) == 0
    assert capsys.readouterr().out == out


def test_env_sets_a_variable_for_one_build_only(tmp_path, capsys):
    # One binary as two builds: "half" runs with AB_TEST_FACTOR=0.5, so it is 2x faster.
    path = _fake(tmp_path, "a", 1.0).split("=", 1)[1]
    args = ["--build", f"base={path}", "--build", f"half={path}",
            "--env", "half:AB_TEST_FACTOR=0.5", "--seeds", "1-2", "--"]
    assert ab_cuda.main(args) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["f32 1x129280 k=50"] == ["12.00", "6.00", "half:", "2.000", "2/2", "2.000-2.000"]


def test_a_run_that_fails_counts_for_none_of_its_rows(tmp_path, capsys):
    # b prints its first row on seed 3, then exits 4: that row must not count either.
    builds = [_fake(tmp_path, "a", 1.0), _fake(tmp_path, "b", 0.5, fail_seed=3)]
    args = [a for b in builds for a in ("--build", b)]
    assert ab_cuda.main(args + ["--seeds", "1-3", "--"]) == 0
    captured = capsys.readouterr()
    assert "b seed 3: exit status 4" in captured.err
    rows = _rows(captured.out)
    assert rows["f32 1x129280 k=50"][2:] == ["b:", "2.000", "2/2", "2.000-2.000"]
    assert rows["bf16 8x131072 k=512 end"][2:] == ["b:", "2.000", "2/2", "2.000-2.000"]


def test_nothing_timed_is_said_and_fails(tmp_path, capsys):
    missing = tmp_path / "no_such_benchmark"
    args = ["--build", _fake(tmp_path, "a", 1.0), "--build", f"b={missing}", "--seeds", "1-2"]
    assert ab_cuda.main(args) == 1
    assert "no case was timed by every build on one seed" in capsys.readouterr().out


@pytest.mark.parametrize("args, fragment", [
    (["--build", "a=/x"], "at least two"),
    (["--build", "a=/x", "--build", "a=/y"], "names must differ"),
    (["--build", "a", "--build", "b=/y"], "expected NAME=PATH"),
    (["--build", "a=/x", "--build", "b=/y", "--seeds", "1-z"], "--seeds '1-z'"),
    (["--build", "a=/x", "--build", "b=/y", "--seeds", "3-1"], "at least one seed"),
    (["--build", "a=/x", "--build", "b=/y", "--seeds", "1,1"], "none twice"),
    (["--build", "a=/x", "--build", "b=/y", "--seed", "7"], "unrecognized arguments"),
    (["--build", "a=/x", "--build", "b=/y", "--", "f32:1:8:2", "--", "x"], "one -- only"),
    (["--build", "a=/x", "--build", "b=/y", "--env", "b:X"], "expected NAME:VAR=VALUE"),
    (["--build", "a=/x", "--build", "b=/y", "--env", "c:X=1"], "no --build is named 'c'"),
])
def test_bad_arguments_are_named(args, fragment, capsys):
    with pytest.raises(SystemExit):
        ab_cuda.main(args)
    assert fragment in capsys.readouterr().err
