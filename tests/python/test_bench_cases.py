# SPDX-License-Identifier: Apache-2.0
"""bench/bench_topk.py --case: the shape specs it accepts and the ones it names as wrong."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "bench_topk.py")
_spec = importlib.util.spec_from_file_location("bench_topk", _PATH)
bench_topk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_topk)


@pytest.mark.parametrize("spec, want", [
    ("bf16:4:131072:2048", ("custom", torch.bfloat16, 4, 131072, 2048, False, "dsa")),
    ("f32:1:129280:50", ("custom", torch.float32, 1, 129280, 50, False, "normal")),
    ("f16:8:100:3:causal:ties", ("custom-causal", torch.float16, 8, 100, 3, True, "ties")),
    ("bf16:2:64:5:ascending", ("custom", torch.bfloat16, 2, 64, 5, False, "ascending")),
])
def test_case_specs_parse_into_case_tuples(spec, want):
    assert bench_topk.parse_case(spec) == want


@pytest.mark.parametrize("spec, fragment", [
    ("bf16:4:131072", "expected dtype:B:N:k"),
    ("f64:1:2:3", "dtype 'f64' is not one of"),
    ("bf16:one:2:3", "B, N and k must be integers"),
    ("bf16:1:0:3", "B, N and k must be >= 1"),
    ("bf16:1:2:3:sideways", "'sideways' is neither 'causal' nor a pattern"),
])
def test_bad_case_specs_are_named(spec, fragment):
    with pytest.raises(ValueError, match=f"--case '{spec}': {fragment}"):
        bench_topk.parse_case(spec)
