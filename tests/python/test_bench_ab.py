# SPDX-License-Identifier: Apache-2.0
"""bench/ab_cuda.py: the rotation of which build runs first, the log it writes and the summary's
per-seed speed-ups, with stand-in benchmarks that print the C++ benchmark's table."""

from __future__ import annotations

import importlib.util
import math
import os
import stat
import sys

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "ab_cuda.py")
_spec = importlib.util.spec_from_file_location("ab_cuda", _PATH)
ab_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_cuda)

# A stand-in for attnkit_bench_cuda: appends its name and seed to a file, then prints the
# benchmark's header and one row a case, the time being base_us * factor, the factor set per
# build and, for the seed named by SLOW_SEED, doubled.
_FAKE = """#!{python}
import sys
args = sys.argv[1:]
seed = int(args[args.index("--seed") + 1])
with open({calls!r}, "a") as f:
    f.write("{name} %d\\n" % seed)
factor = {factor} * (2.0 if seed == {slow_seed} else 1.0)
print("dtype      B        N     k causal values         us     TB/s")
print("f32        1   129280    50 no     yes    %10.2f    0.041" % (12.0 * factor))
print("bf16       8   131072   512 yes    no     %10.2f    0.170" % (20.0 * factor))
"""


def _fake(tmp_path, name, factor, slow_seed=-1):
    path = tmp_path / f"bench_{name}"
    path.write_text(_FAKE.format(python=sys.executable, calls=str(tmp_path / "calls.txt"),
                                 name=name, factor=factor, slow_seed=slow_seed))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return f"{name}={path}"


def test_builds_take_turns_running_first_and_every_seed_runs_every_build(tmp_path):
    builds = [_fake(tmp_path, n, 1.0) for n in ("a", "b", "c")]
    args = [a for b in builds for a in ("--build", b)]
    assert ab_cuda.main(args + ["--seeds", "1-4", "--", "--reps", "2", "f32:1:129280:50"]) == 0
    calls = (tmp_path / "calls.txt").read_text().split("\n")[:-1]
    assert calls == ["a 1", "b 1", "c 1", "b 2", "c 2", "a 2",
                     "c 3", "a 3", "b 3", "a 4", "b 4", "c 4"]


def test_summary_gives_the_per_seed_geometric_mean_and_the_seeds_won(tmp_path, capsys):
    # b is 1.25x faster than a on every seed but seed 2, where it is 2x slower than that.
    builds = [_fake(tmp_path, "a", 1.0), _fake(tmp_path, "b", 0.8, slow_seed=2)]
    log = tmp_path / "ab.txt"
    args = [a for b in builds for a in ("--build", b)]
    assert ab_cuda.main(args + ["--seeds", "1,2,3,4", "--log", str(log), "--"]) == 0
    out = capsys.readouterr().out
    want = math.exp((3 * math.log(1.25) + math.log(1.25 / 2)) / 4)
    lines = {line.split()[0] + " " + line.split()[1]: line for line in out.splitlines()[1:]}
    fp32 = lines["f32 1x129280"]
    assert f"b: {want:.3f} 3/4 0.625-1.250" in fp32
    assert fp32.split()[3:5] == [f"{12.0:.2f}", f"{(3 * 9.6 + 19.2) / 4:.2f}"]
    # The 16-bit case's causal rows and missing values are part of its name.
    assert "bf16 8x131072 k=512 causal no-values" in out
    # The log holds every run and gives the same summary again.
    assert ab_cuda.main(["--summarize", str(log)]) == 0
    assert capsys.readouterr().out == out


def test_a_build_that_fails_on_a_seed_leaves_that_seed_out_of_the_summary(tmp_path, capsys):
    builds = [_fake(tmp_path, "a", 1.0), _fake(tmp_path, "b", 0.5)]
    broken = tmp_path / "bench_b"
    failing = broken.read_text().replace("factor = ", "if seed == 3: sys.exit(4)\nfactor = ")
    broken.write_text(failing)
    args = [a for b in builds for a in ("--build", b)]
    assert ab_cuda.main(args + ["--seeds", "1-3", "--"]) == 0
    captured = capsys.readouterr()
    assert "b seed 3: exit status 4" in captured.err
    assert " 2/2 2.000-2.000" in captured.out


@pytest.mark.parametrize("args, fragment", [
    (["--build", "a=/x"], "at least two"),
    (["--build", "a=/x", "--build", "a=/y"], "names must differ"),
    (["--build", "a", "--build", "b=/y"], "expected NAME=PATH"),
    (["--build", "a=/x", "--build", "b=/y", "--seeds", "1-z"], "--seeds '1-z'"),
])
def test_bad_arguments_are_named(args, fragment, capsys):
    with pytest.raises(SystemExit):
        ab_cuda.main(args)
    assert fragment in capsys.readouterr().err


def test_nothing_timed_is_said_and_fails(tmp_path, capsys):
    missing = tmp_path / "no_such_benchmark"
    args = ["--build", _fake(tmp_path, "a", 1.0), "--build", f"b={missing}", "--seeds", "1-2"]
    assert ab_cuda.main(args) == 1
    assert "no case was timed by every build on one seed" in capsys.readouterr().out
