# SPDX-License-Identifier: Apache-2.0
"""bench/bench_topk.py: the --case specs it accepts and the ones it names as wrong, the check of a
peer's results and the table's peer columns."""

from __future__ import annotations

import importlib.util
import os
import sys

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


def test_peer_check_accepts_any_tie_break_and_rejects_a_wrong_set():
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 3.0], [0.0, 5.0, 4.0, 5.0, 1.0]])
    lowest = torch.tensor([[0, 2], [1, 3]])
    other_tie = torch.tensor([[4, 2], [3, 1]])  # the same values, a different tie broken
    wrong = torch.tensor([[0, 3], [1, 2]])  # 2.0 and 4.0 are not among the best two
    assert bench_topk.is_top_k(x, 2, None, lowest, lowest_index=True)
    assert bench_topk.is_top_k(x, 2, None, other_tie, lowest_index=False)
    assert not bench_topk.is_top_k(x, 2, None, other_tie, lowest_index=True)
    assert not bench_topk.is_top_k(x, 2, None, wrong, lowest_index=False)
    assert not bench_topk.is_top_k(x, 2, None, torch.tensor([[0, 5], [1, 3]]), lowest_index=False)


def test_peer_check_of_ragged_rows_wants_padding_past_each_end():
    x = torch.tensor([[9.0, 8.0, 7.0, 6.0], [1.0, 2.0, 3.0, 4.0]])
    end = torch.tensor([1, 4], dtype=torch.int32)
    assert bench_topk.is_top_k(x, 2, end, torch.tensor([[0, -1], [3, 2]]), lowest_index=False)
    # Row 0 holds one valid column: a second index there reads past its end.
    assert not bench_topk.is_top_k(x, 2, end, torch.tensor([[0, 1], [3, 2]]), lowest_index=False)


def test_markdown_shows_peer_columns_and_refusals():
    row = {"case": "sampling", "causal": False, "dtype": "float32", "B": 1, "N": 129280, "k": 4096,
           "values": True, "torch_us": 63.0, "attnkit_us": 16.0, "attnkit_TBps": 0.03,
           "speedup": 3.94, "flashinfer_us": 18.5, "flashinfer_check": "ok",
           "flashinfer_lowest_us": None, "flashinfer_lowest_check": "RuntimeError: not supported",
           "speedup_flashinfer": 1.16}
    table = bench_topk.markdown([row], "header")
    assert "FlashInfer us (any ties) | FlashInfer us (lowest index) | vs FlashInfer |" in table
    assert "| 18.5 | refused (RuntimeError: not supported) | 1.16x |" in table
    plain = dict(row)
    for key in ("flashinfer_us", "flashinfer_check", "flashinfer_lowest_us",
                "flashinfer_lowest_check", "speedup_flashinfer"):
        del plain[key]
    assert "FlashInfer" not in bench_topk.markdown([plain], "header")


def test_markdown_shows_the_deepselect_column():
    row = {"case": "dsa", "causal": True, "dtype": "bfloat16", "B": 64, "N": 8192, "k": 512,
           "values": False, "torch_us": 40.0, "attnkit_us": 10.0, "attnkit_TBps": 0.1,
           "speedup": 4.0, "deepselect_us": 12.5, "deepselect_check": "wrong",
           "speedup_deepselect": 1.25}
    table = bench_topk.markdown([row], "header")
    assert "DeepSelect us (any ties) | vs DeepSelect |" in table
    assert "| 12.5 (wrong) | 1.25x |" in table
    assert "FlashInfer" not in table


def test_deepselect_call_asks_for_int32_indices_and_minus_one_padding():
    seen = {}

    class FakeDeepSelect:
        @staticmethod
        def topk(x, k, **kwargs):
            seen.update(kwargs, k=k)
            return None, torch.zeros(x.shape[0], k, dtype=kwargs["indices_type"])

    x = torch.zeros(2, 8)
    call, indices_of = bench_topk.deepselect_call(FakeDeepSelect, x, 3, None, False)
    assert indices_of(call()).dtype == torch.int32
    assert seen == {"k": 3, "end": None, "indices_type": torch.int32, "idx_oob_fill_value": -1,
                    "return_value": False}


def test_a_peer_refusal_is_reported_not_raised():
    def refuses():
        raise RuntimeError("topk must be <= 4096\nmore detail")

    t, verdict = bench_topk.time_peer(refuses, lambda out: out, torch.zeros(1, 4), 2, None,
                                      False, timer=None)
    assert t is None and verdict == "RuntimeError: topk must be <= 4096"


def test_peers_are_the_importable_modules_by_key(monkeypatch):
    fake = type(sys)("deep_select")
    monkeypatch.setitem(sys.modules, "deep_select", fake)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # None in sys.modules: ImportError
    assert bench_topk.peers() == {"deepselect": fake}
