# SPDX-License-Identifier: Apache-2.0
"""attnkit runtime functions: CPU thread count, build info, CUDA availability; results that do
not depend on the thread count."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import attnkit
from conftest import assert_same_result, bits, describe, make_rows, rng_for
from reference import topk_reference


def test_num_threads_is_positive():
    n = attnkit.num_threads()
    assert isinstance(n, int) and n >= 1


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_set_num_threads(restore_threads, n):
    attnkit.set_num_threads(n)
    assert attnkit.num_threads() == n
    assert f"cpu threads: {n}" in attnkit.info()


@pytest.mark.parametrize("n", [0, -1, -100])
def test_set_num_threads_rejects_below_one(restore_threads, n):
    attnkit.set_num_threads(2)
    with pytest.raises(ValueError) as info:
        attnkit.set_num_threads(n)
    assert f"n = {n}" in str(info.value) and "[1, 4096]" in str(info.value)
    assert attnkit.num_threads() == 2, "a refused resize keeps the pool as it was"
    x = make_rows("normal@1", (3, 100), "float32", rng_for("after_refused_resize", n))
    assert_same_result(attnkit.topk(x, 5), topk_reference(x, 5), "topk after a refused resize")


@pytest.mark.parametrize("n", [1.5, "2", None, True])
def test_set_num_threads_rejects_non_integers_by_name(restore_threads, n):
    attnkit.set_num_threads(2)
    with pytest.raises(TypeError, match=r"set_num_threads: n = .*; expected an integer"):
        attnkit.set_num_threads(n)
    assert attnkit.num_threads() == 2


def test_num_threads_from_environment():
    env = dict(os.environ, ATTNKIT_NUM_THREADS="3")
    out = subprocess.run([sys.executable, "-c", "import attnkit; print(attnkit.num_threads())"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "3"


def test_one_version_everywhere():
    # The package's metadata, its __version__, the CMake project (whose version the C++
    # attnkit::version() and find_package report) and the built library's build info agree.
    import re
    from importlib.metadata import version
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pyproject = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    cmake = re.search(r"^project\(attnkit VERSION (\S+)", (root / "CMakeLists.txt").read_text(),
                      re.M)
    assert pyproject and cmake
    assert {pyproject[1], cmake[1], attnkit.__version__, version("attnkit")} == {cmake[1]}
    assert attnkit.info().startswith(f"attnkit {cmake[1]}\n")


def test_info():
    text = attnkit.info()
    assert isinstance(text, str)
    assert text.startswith(f"attnkit {attnkit.__version__}")
    assert f"cpu threads: {attnkit.num_threads()}" in text
    assert "cuda" in text


def test_cuda_available_matches_info():
    available = attnkit.cuda_available()
    assert isinstance(available, bool)
    assert ("cuda: not built" in attnkit.info()) == (not available)


THREAD_CASES = [(1, 70001, "float32"), (1, 200000, "bfloat16"), (2, 70000, "float16"),
                (1000, 100, "bfloat16"), (5, 3000, "float32")]


@pytest.mark.parametrize("rows,cols,dtype", THREAD_CASES,
                         ids=[f"B={b}-N={n}-{d}" for b, n, d in THREAD_CASES])
def test_results_do_not_depend_on_thread_count(restore_threads, rows, cols, dtype):
    rng = rng_for("threads", rows, cols, dtype)
    x = make_rows("ties4" if rows > 3 else "normal@1", (rows, cols), dtype, rng)
    x[:, ::97] = x[:, :1]  # extra ties spread over every segment of the row
    results = {}
    for n in (1, 2, 3):
        attnkit.set_num_threads(n)
        for k, sorted_mode, ties in ((1, "value", "lowest_index"), (64, "none", "lowest_index"),
                                     (1024, "value", "any")):
            results[(n, k, sorted_mode, ties)] = attnkit.topk(x, k, sorted=sorted_mode,
                                                              ties=ties)
    for (n, k, sorted_mode, ties), got in results.items():
        want = results[(1, k, sorted_mode, ties)]
        assert_same_result(got, want, describe(threads=n, k=k, sorted=sorted_mode, ties=ties,
                                               rows=rows, cols=cols, dtype=dtype))
    # And the one-thread result is the reference (ties="lowest_index").
    for k, sorted_mode in ((1, "value"), (64, "none")):
        assert_same_result(results[(1, k, sorted_mode, "lowest_index")],
                           topk_reference(x, k, sorted=sorted_mode),
                           describe(k=k, sorted=sorted_mode, rows=rows, cols=cols, dtype=dtype))


def test_concurrent_calls_from_python_threads(restore_threads):
    attnkit.set_num_threads(2)
    inputs = [make_rows("normal@1", (2, 30000), "float32", rng_for("concurrent", t))
              for t in range(4)]
    expected = [topk_reference(x, 100, sorted="value") for x in inputs]
    results = [None] * len(inputs)
    errors = []

    def work(t):
        try:
            for _ in range(5):
                results[t] = attnkit.topk(inputs[t], 100, sorted="value")
        except Exception as e:  # reported below with the thread's number
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(inputs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t, (got, want) in enumerate(zip(results, expected)):
        assert_same_result(got, want, f"python thread {t}")


def test_repeated_calls_are_bit_identical():
    x = make_rows("ties4", (7, 50000), "bfloat16", rng_for("repeat"))
    first = attnkit.topk(x, 2000, ties="any")
    for _ in range(3):
        again = attnkit.topk(x, 2000, ties="any")
        assert np.array_equal(again[1], first[1])
        assert np.array_equal(bits(again[0]), bits(first[0]))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_another_thread_is_inside_topk(restore_threads):
    # A child forked mid-call inherits the pool's locks as the parent's workers held them, but
    # not the workers: its own first call must still run (torch.topk's pool copes too).
    attnkit.set_num_threads(4)
    x = np.random.default_rng(3).random((4, 200_000), dtype=np.float32)
    want = topk_reference(x, 50)[1]
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            attnkit.topk(x, 50)

    worker = threading.Thread(target=busy)
    worker.start()
    hung = []
    try:
        for _ in range(6):
            pid = os.fork()
            if pid == 0:  # the child: one ordinary call, checked
                ok = np.array_equal(attnkit.topk(x, 50).indices, want)
                os._exit(0 if ok else 3)
            for _ in range(2000):  # up to 20 s
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0
                    break
                threading.Event().wait(0.01)
            else:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                hung.append(pid)
    finally:
        stop.set()
        worker.join()
    assert not hung, f"{len(hung)} of 6 forked children hung in their first attnkit.topk"


_DAEMON_AT_EXIT = """
import threading, time
import numpy as np, attnkit
x = np.random.default_rng(0).random((8, 1_000_000), dtype=np.float32)
def loop():
    while True:
        attnkit.topk(x, 100)
threading.Thread(target=loop, daemon=True).start()
time.sleep(0.2)
print("exiting")
"""


def test_interpreter_exits_cleanly_while_a_daemon_thread_is_inside_topk():
    # At exit Python (before 3.14) ends a daemon thread that waits for the GIL with a forced
    # unwind; coming back from the call with the GIL released, that must not abort the process.
    _expect_children_print(_DAEMON_AT_EXIT, "exiting", attempts=5, timeout=120)


def _expect_children_print(code: str, expected: str, attempts: int, timeout: float) -> None:
    """Runs `code` in `attempts` fresh interpreters, one after another (races that show in
    some runs only), and asserts each exits with 0 having printed `expected`."""
    for attempt in range(attempts):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout)
        assert (out.returncode, out.stdout.strip()) == (0, expected), \
            f"attempt {attempt}: exit code {out.returncode}, stderr: {out.stderr[-2000:]}"


_RESIZE_DURING_CALLS = """
import threading
import numpy as np, attnkit
x = np.random.default_rng(0).standard_normal((64, 4000)).astype(np.float32)
want = attnkit.topk(x, 10, backend="reference").indices
stop = threading.Event()
def resize():
    while not stop.is_set():
        attnkit.set_num_threads(1); attnkit.set_num_threads(8)
wrong = []
def run(t):
    for _ in range(1000):
        if not np.array_equal(attnkit.topk(x, 10).indices, want):
            wrong.append(t)
resizer = threading.Thread(target=resize); resizer.start()
workers = [threading.Thread(target=run, args=(t,)) for t in range(4)]
for w in workers: w.start()
for w in workers: w.join()
stop.set(); resizer.join()
print("wrong", len(wrong))
"""


def test_set_num_threads_while_other_threads_are_inside_topk():
    # A call sizes its working buffers by the thread count when it starts; a pool grown by
    # another thread meanwhile must not run more tasks at once than it has buffers for (this
    # crashed the process in some runs; the C++ test
    # ThreadPool.ParallelForRunsAtMostTheThreadsAskedFor checks the bound itself).
    _expect_children_print(_RESIZE_DURING_CALLS, "wrong 0", attempts=2, timeout=300)


def _child_prints_mib(code: str) -> int:
    """Runs `code` in a fresh interpreter (its own memory counters) and returns the number of
    MiB it prints last."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().splitlines()[-1])


def test_split_rows_scratch_does_not_grow_with_threads():
    # One long row split over many threads with k = N: the per-segment lists hold at most their
    # segment, so the peak memory stays near the row's size (2^22 fp32: 16 MiB in, 16 MiB out)
    # whatever the thread count (it grew by 2 x 8 bytes x k a thread).
    code = (
        "import resource, numpy as np, attnkit\n"
        "attnkit.set_num_threads(32)\n"
        "x = np.random.default_rng(0).standard_normal((1, 1 << 22)).astype(np.float32)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "r = attnkit.topk(x, 1 << 22, indices_dtype='int32', return_values=False)\n"
        "assert np.array_equal(np.sort(r.indices[0]), np.arange(1 << 22))\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    grown_mib = _child_prints_mib(code)
    assert grown_mib < 200, f"peak memory grew by {grown_mib} MiB for a 16 MiB row"


def test_large_k_scratch_is_given_back():
    # Each thread keeps its candidate lists between calls (no allocation in steady state), but
    # gives back lists grown past about a million entries: after one call with k = 2^21 the
    # process holds no more than before it (it held 96 MiB more).
    code = (
        "import numpy as np, attnkit\n"
        "def rss_mib():\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith('VmRSS'))\n"
        "    return int(line.split()[1]) // 1024\n"
        "attnkit.set_num_threads(2)\n"
        "x = np.random.default_rng(0).standard_normal((2, 1 << 22)).astype(np.float32)\n"
        "attnkit.topk(x[:, :1000], 5)\n"
        "before = rss_mib()\n"
        "r = attnkit.topk(x, 1 << 21, sorted='value')\n"
        "assert (np.diff(r.values, axis=1) <= 0).all()\n"
        "del r\n"
        "print(rss_mib() - before)\n")
    held_mib = _child_prints_mib(code)
    assert held_mib < 24, f"the process holds {held_mib} MiB more after the call"
