# SPDX-License-Identifier: Apache-2.0
"""The differential fuzzer (scripts/fuzz_topk.py) run briefly on the CPU backend.

``--device cpu`` compares the CPU backend with the fuzzer's torch reference on random options,
layouts and distributions, and checks that every call its model says must raise does raise and
writes nothing. The GPU check runs the same fuzzer, CUDA against CPU, for a minute; running it
here keeps its model of the API (which calls must raise) in step with the library, so that a
change of the rules shows up in CI and not first on the GPU machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

FUZZER = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "fuzz_topk.py")


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzzer_finds_nothing_on_the_cpu_backend(seed):
    run = subprocess.run(
        [sys.executable, FUZZER, "--device", "cpu", "--seed", str(seed), "--cases", "60",
         "--max-elems", "200000", "--seconds", "600"],
        capture_output=True, text=True, timeout=900, check=False)
    out = run.stdout + run.stderr
    summary = re.search(
        r"summary: (\d+) cases .*mismatches (\d+); unexpected exceptions/errors (\d+)", out)
    assert summary is not None, out[-3000:]
    cases, mismatches, errors = map(int, summary.groups())
    assert cases == 60, out[-3000:]
    assert (mismatches, errors) == (0, 0), out[-3000:]
    assert run.returncode == 0, out[-3000:]
    # The cases compared results, not only error paths.
    compared = re.search(r"outcomes: compared (\d+)", out)
    assert compared is not None and int(compared.group(1)) >= 30, out[-3000:]
