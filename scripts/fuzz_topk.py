#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Randomised differential fuzzer for attnkit.topk.

  python3 scripts/fuzz_topk.py --seconds S --seed N [--device cuda|cpu] [--max-elems M]
                       [--case I] [--cases C] [--ref] [--threads T] [--verbose]

--device cuda (default when torch.cuda.is_available()): every case runs attnkit.topk on a CUDA
  tensor and on the same bytes copied to the CPU (CPU backend) and requires identical results:
  indices exactly, values bit for bit, the same error outcome; with ties="any" only what SPEC
  section 1 defines is compared (a valid top-k set, the padding, the order). With --ref the CPU
  result is also checked against the test suite's NumPy reference (tests/python/reference.py).
  check=None (the default) means "off" on CUDA, so the CPU side then runs with check=False
  (clamped ranges).
--device cpu: the CPU backend against that reference (float64 keys, a stable sort; NaN above
  +inf; -0.0 == +0.0; ties by lowest column).

Each case is drawn from random.Random(f"{seed}:{case}") alone, so `--seed N --case I`
replays case I exactly (add --verbose for the full parameters).  Exit status 1 when any
mismatch or unexpected exception occurred.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import random
import sys
import time
import traceback

import ml_dtypes
import numpy as np
import torch

import attnkit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests",
                                "python"))
from reference import topk_reference  # noqa: E402  (the test suite's independent reference)

# ----------------------------------------------------------------------------------------------
# constants

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
BITS_DT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
NP_DT = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16, torch.float32: np.float32}
IDX_DT = {"int32": torch.int32, "int64": torch.int64}
SENT_V = {torch.int16: 0x5A5A, torch.int32: 0x5A5A5A5A}
SENT_I = {torch.int32: 0x5A5A5A5A, torch.int64: 0x5A5A5A5A5A5A5A5A}
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

BOUNDARY_N = [8192, 8193, 16384, 65536, 65537, 131072, 131073, 151936, 202048, 262144, 262145]
BOUNDARY_B = [1, 7, 8, 10, 15, 16, 32, 64, 132, 133, 256]
BOUNDARY_K = [50, 512, 2048, 4096]
K_CHOICES = [0, 1, 2, 7, 50, 512, 1024, 2048, 4096, 5000, "N", "N+3", "rand", "rand"]
DISTS = ["normal", "normal", "ties4", "equal", "ascending", "descending", "nan", "nan", "inf",
         "denormal", "zeros", "relu", "relu", "range", "randbits"]
VALUE_FILLS = [0.0, -0.0, 1.5, -2.0, float("inf"), float("-inf"), 65504.0, 100000.0, 0.1]
INDEX_FILLS = [0, -7, INT32_MAX, INT32_MIN, 2**40, -2**63, 2**63 - 1]


def bits(t):
    return t.view(BITS_DT[t.dtype])


def wrap_signed(t64, nbits):
    """int64 tensor of unsigned nbits patterns -> signed intN tensor with the same bits."""
    half, full = 1 << (nbits - 1), 1 << nbits
    t64 = torch.where(t64 >= half, t64 - full, t64)
    return t64.to(torch.int16 if nbits == 16 else torch.int32)


# ----------------------------------------------------------------------------------------------
# case parameters (plain Python values, printed on a failure)

def log_uniform_int(rng, lo, hi):
    return max(lo, min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def draw_case(seed, index, max_elems, device):
    rng = random.Random(f"{seed}:{index}")
    p = {}
    p["dtype"] = rng.choice(list(DTYPES))
    p["boundary"] = rng.random() < 0.22
    if p["boundary"]:
        N = rng.choice(BOUNDARY_N)
        cap = max(1, max_elems // (N + 16))
        bs = [b for b in BOUNDARY_B if b <= cap] or [1]
        B = rng.choice(bs)
        k = rng.choice(BOUNDARY_K)
    else:
        N = log_uniform_int(rng, 1, 2**20)
        B = log_uniform_int(rng, 1, 4096)
        if B * (N + 16) > max_elems:
            if rng.random() < 0.5:
                B = max(1, max_elems // (N + 16))
            else:
                N = max(1, max_elems // B - 16)
        kc = rng.choice(K_CHOICES)
        k = N if kc == "N" else N + 3 if kc == "N+3" else (
            log_uniform_int(rng, 1, min(2 * N + 8, 20000)) if kc == "rand" else kc)
    if B * max(k, 1) > max_elems:
        B = max(1, max_elems // max(k, 1))
    p["B"], p["N"], p["k"] = B, N, k

    r = rng.random()
    if B == 1 and r < 0.25:
        p["layout"] = "1d"
    elif B > 1 and r < 0.06:
        p["layout"] = "expand"  # row stride 0
    elif r < 0.35:
        p["layout"] = "contig"
    else:
        p["layout"] = "slice"
    p["off"] = rng.randrange(8) if p["layout"] in ("slice", "1d", "expand") else 0
    p["extra"] = rng.randrange(10) if p["layout"] != "contig" else 0

    p["largest"] = rng.random() < 0.7
    p["sorted"] = rng.choice(["none", "index", "value", True, False, "default"])
    p["idx"] = rng.choice(["int32", "int64", "torch.int32", "torch.int64", "default"])
    p["rv"] = rng.random() < 0.8
    p["nan"] = rng.choice(["default", "largest", "ignore", "raise"])
    p["ties"] = rng.choice(["default", "lowest_index", "any"])

    p["dist"] = rng.choice(DISTS)
    d = {}
    d["scale"] = 10.0 ** rng.uniform(-3, 3)
    if p["dist"] in ("nan", "inf"):
        d["density"] = rng.choice(["one", 1e-4, 0.01, 0.3, 0.9, 1.0])
    if p["dist"] == "equal":
        d["c"] = rng.choice([0.0, -0.0, 1.0, -3.5, float("inf"), float("-inf"), rng.gauss(0, 1)])
    if p["dist"] == "denormal":
        d["mix"] = rng.choice([0.0, 0.001, 0.1])
    if p["dist"] == "zeros":
        d["nz"] = rng.choice([0.0, 1e-4, 0.01])
    if p["dist"] == "relu":
        d["shift"] = rng.choice([0.0, 1.0, 2.0, 3.0])
    if p["dist"] == "range":
        d["emax"] = rng.choice([20, 60, 126])
    p["dp"] = d
    p["poison"] = rng.choice([None, None, "nan", "best"])  # outside the valid ranges

    # Per-row ranges.
    p["ranges"] = rng.choice(["none", "none", "none", "full", "end", "causal", "begin_end",
                              "empty", "oob"])
    p["be_dtype"] = rng.choice(["int32", "int64"])
    p["be_which"] = rng.choice(["both", "begin", "end"]) if p["ranges"] != "end" else "end"
    if p["ranges"] == "causal":
        p["be_which"] = "end"
    p["be_strided"] = rng.random() < 0.2
    # check: None (backend default), True, False
    p["check"] = rng.choice([None, None, True, False])

    # index_offset
    p["offset"] = rng.choice([None, None, None, "small", "small", "large", "edge_fit",
                              "edge_over"])
    p["off_dtype"] = rng.choice(["int32", "int64"])
    if p["offset"] == "large":
        p["off_dtype"] = "int64"
    checked = p["check"] is True or (p["check"] is None and device == "cpu")
    if not checked and p["offset"] in ("large", "edge_over"):
        p["offset"] = "small"  # unchecked overflow is unspecified
    p["index_fill"] = rng.choice(["default"] * 12 + INDEX_FILLS[:4] * 2
                                 + [rng.choice(INDEX_FILLS[4:])])
    p["value_fill"] = rng.choice(["default"] * 5 + VALUE_FILLS)

    p["out"] = rng.choice(["none", "none", "idx", "val", "both", "both"])
    if rng.random() < 0.02:
        p["out"] = "val_no_rv"  # documented ValueError
    if p["out"] in ("val", "both"):
        p["rv"] = True
    elif p["out"] == "val_no_rv":
        p["rv"] = False
    idx_name = p["idx"].replace("torch.", "")
    p["idx_eff"] = "int64" if idx_name == "default" else idx_name
    p["out_idx_dt"] = None
    if p["out"] in ("idx", "both"):
        # out_indices sets the dtype: an explicit indices_dtype mostly agrees with it; when it
        # does not, the call must raise (a rare case, so most cases still compare results).
        p["out_idx_dt"] = rng.choice(["int32", "int64"])
        if idx_name != "default" and rng.random() < 0.95:
            p["out_idx_dt"] = idx_name
    p["out_c0"] = rng.randrange(4)
    p["out_extra"] = p["out_c0"] + 1 + rng.randrange(9)
    p["repeat"] = rng.random() < 0.1  # run the device call twice (determinism)
    p["data_seed"] = rng.getrandbits(62)
    return p


def short(p):
    keys = ["dtype", "B", "N", "k", "layout", "off", "extra", "largest", "sorted", "idx", "rv",
            "nan", "ties", "dist", "dp", "poison", "ranges", "be_dtype", "be_which",
            "be_strided", "check", "offset", "off_dtype", "index_fill", "value_fill", "out",
            "out_idx_dt", "out_c0", "out_extra", "boundary"]
    parts = []
    for key in keys:
        v = p[key]
        if isinstance(v, dict):
            v = ",".join(f"{a}={(round(b, 4) if isinstance(b, float) else b)}"
                         for a, b in v.items())
            v = "{" + v + "}"
        parts.append(f"{key}={v}")
    return " ".join(parts)


# ----------------------------------------------------------------------------------------------
# data

def nan_bits(g, n, dtype):
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64)
    if dtype == torch.float32:
        payload = torch.randint(1, 1 << 23, (n,), generator=g, dtype=torch.int64)
        # some canonical quiet NaNs too
        payload = torch.where(torch.rand(n, generator=g) < 0.3,
                              torch.full_like(payload, 1 << 22), payload)
        return wrap_signed((sign << 31) | 0x7F800000 | payload, 32)
    if dtype == torch.bfloat16:
        payload = torch.randint(1, 1 << 7, (n,), generator=g, dtype=torch.int64)
        return wrap_signed((sign << 15) | 0x7F80 | payload, 16)
    payload = torch.randint(1, 1 << 10, (n,), generator=g, dtype=torch.int64)
    return wrap_signed((sign << 15) | 0x7C00 | payload, 16)


def random_bits(g, shape, dtype):
    if dtype == torch.float32:
        t = torch.randint(0, 1 << 32, shape, generator=g, dtype=torch.int64)
        return wrap_signed(t, 32).view(dtype)
    t = torch.randint(0, 1 << 16, shape, generator=g, dtype=torch.int64)
    return wrap_signed(t, 16).view(dtype)


def denormal_bits(g, shape, dtype):
    sign = torch.randint(0, 2, shape, generator=g, dtype=torch.int64)
    if dtype == torch.float32:
        mant = torch.randint(0, 1 << 23, shape, generator=g, dtype=torch.int64)
        return wrap_signed((sign << 31) | mant, 32).view(dtype)
    mb = 7 if dtype == torch.bfloat16 else 10
    mant = torch.randint(0, 1 << mb, shape, generator=g, dtype=torch.int64)
    return wrap_signed((sign << 15) | mant, 16).view(dtype)


def plant(g, x, density, values_fn):
    """Replace a random subset of x (2-D, in place) by values_fn(n) (bits tensor)."""
    rows, cols = x.shape
    xb = bits(x)
    if density == "one":
        c = torch.randint(0, cols, (rows,), generator=g)
        xb[torch.arange(rows), c] = values_fn(rows)
        return
    mask = torch.rand(rows, cols, generator=g) < density
    n = int(mask.sum())
    if n:
        xb[mask] = values_fn(n)


def gen_values(g, p, rows, cols):
    dt = DTYPES[p["dtype"]]
    d = p["dp"]
    dist = p["dist"]
    s = d["scale"]
    shape = (rows, cols)
    if dist == "normal":
        return (torch.randn(shape, generator=g) * s).to(dt)
    if dist == "ties4":
        levels = (torch.randn(4, generator=g) * s).to(dt)
        return levels[torch.randint(0, 4, shape, generator=g)]
    if dist == "equal":
        return torch.full(shape, d["c"], dtype=torch.float32).to(dt)
    if dist in ("ascending", "descending"):
        line = torch.linspace(-s, s, cols, dtype=torch.float32)
        if dist == "descending":
            line = line.flip(0)
        shift = (torch.randn(rows, 1, generator=g) * s * 0.01)
        return (line[None, :] + shift).to(dt)
    if dist == "nan":
        x = (torch.randn(shape, generator=g) * s).to(dt)
        plant(g, x, d["density"], lambda n: nan_bits(g, n, dt))
        return x
    if dist == "inf":
        x = (torch.randn(shape, generator=g) * s).to(dt)
        plant(g, x, d["density"], lambda n: bits(
            torch.where(torch.rand(n, generator=g) < 0.5, float("inf"), float("-inf")).to(dt)))
        return x
    if dist == "denormal":
        x = denormal_bits(g, shape, dt)
        if d["mix"]:
            plant(g, x, d["mix"], lambda n: bits((torch.randn(n, generator=g) * s).to(dt)))
        return x
    if dist == "zeros":
        x = torch.where(torch.rand(shape, generator=g) < 0.5, 0.0, -0.0).to(dt)
        if d["nz"]:
            plant(g, x, d["nz"], lambda n: bits((torch.randn(n, generator=g) * s).to(dt)))
        return x
    if dist == "relu":  # DSA-like: sum over heads of w_h * relu(q.k); many exact zeros
        acc = torch.zeros(shape)
        for _ in range(4):
            w = float(torch.rand(1, generator=g)) + 0.1
            acc += w * torch.relu(torch.randn(shape, generator=g) - d["shift"])
        return (acc * s).to(torch.bfloat16).to(dt)
    if dist == "range":
        e = torch.randint(-d["emax"], d["emax"] + 1, shape, generator=g).float()
        v = torch.randn(shape, generator=g) * torch.exp2(e)
        return v.to(torch.bfloat16).to(dt)
    if dist == "randbits":
        return random_bits(g, shape, dt)
    raise AssertionError(dist)


def gen_ranges(g, p, B, N):
    """(begin, end) as int64 lists or None; out-of-range values only for p['ranges']='oob'."""
    mode = p["ranges"]
    if mode == "none":
        return None, None
    if mode == "full":
        return [0] * B, [N] * B
    if mode == "end":
        return None, torch.randint(0, N + 1, (B,), generator=g).tolist()
    if mode == "causal":
        step = int(torch.randint(1, max(2, N // max(B, 1) + 2), (1,), generator=g))
        return None, [max(0, N - (B - 1 - b) * step) for b in range(B)]
    lo = torch.randint(0, N + 1, (B,), generator=g)
    hi = lo + (torch.rand(B, generator=g) * (N + 1 - lo).double()).long()
    lo, hi = lo.tolist(), hi.tolist()
    if mode == "empty":
        for b in range(B):
            c = int(torch.randint(0, 4, (1,), generator=g))
            if c == 0:
                hi[b] = lo[b]
            elif c == 1:
                lo[b] = hi[b] = 0
            elif c == 2:
                lo[b] = hi[b] = N
    if mode == "oob":
        for _ in range(1 + B // 8):
            b = int(torch.randint(0, B, (1,), generator=g))
            c = int(torch.randint(0, 5, (1,), generator=g))
            if c == 0:
                hi[b] = N + int(torch.randint(1, 100, (1,), generator=g))
            elif c == 1:
                lo[b], hi[b] = hi[b] + 1, hi[b]  # begin > end
            elif c == 2:
                lo[b] = -int(torch.randint(1, 100, (1,), generator=g))
            elif c == 3:
                hi[b] = -int(torch.randint(1, 5, (1,), generator=g))
            else:
                lo[b] = N + 5
                hi[b] = N + 9
    which = p["be_which"]
    return (lo if which in ("both", "begin") else None), (hi if which in ("both", "end") else None)


def gen_offsets(g, p, B, N):
    mode = p["offset"]
    if mode is None:
        return None
    if mode == "small":
        return torch.randint(-1000, 1001, (B,), generator=g).tolist()
    if mode == "large":
        return torch.randint(-2**40, 2**40, (B,), generator=g).tolist()
    idx_dt = p["out_idx_dt"] or p["idx_eff"]
    big = INT32_MAX if p["off_dtype"] == "int32" or idx_dt == "int32" else 2**63 - 1
    v = big - (N - 1) + (1 if mode == "edge_over" else 0)
    lim = INT32_MAX if p["off_dtype"] == "int32" else 2**63 - 1
    return [min(v, lim)] * B


def row_vector(values, dtype_name, strided):
    if values is None:
        return None
    t = torch.tensor(values, dtype=IDX_DT[dtype_name])
    if strided:
        wide = torch.zeros(2 * len(values), dtype=t.dtype)
        wide[::2] = t
        wide[1::2] = 12345
        return wide[::2]
    return t


def build(p):
    """CPU tensors of the case: x (its final layout, and the buffer behind it) and row vectors."""
    g = torch.Generator().manual_seed(p["data_seed"])
    B, N = p["B"], p["N"]
    W = N + p["off"] + p["extra"]
    layout = p["layout"]
    data_rows = 1 if layout == "expand" else B
    big = gen_values(g, p, data_rows, W).clone(memory_format=torch.contiguous_format)
    begin, end = gen_ranges(g, p, B, N)
    offsets = gen_offsets(g, p, B, N)
    # Poison what lies outside each row's (clamped) valid range, inside the buffer too.
    lo_c, hi_c = clamp_ranges(begin, end, B, N)
    dt = DTYPES[p["dtype"]]
    if p["poison"] and layout != "expand":
        if p["poison"] == "nan":
            pv = float("nan")
        else:
            pv = float("inf") if p["largest"] else float("-inf")
        col = torch.arange(W)[None, :] - p["off"]
        outside = (col < torch.tensor(lo_c)[:, None]) | (col >= torch.tensor(hi_c)[:, None])
        big[outside] = torch.tensor(pv, dtype=dt)
    elif layout != "contig":
        # the bytes around x (not part of it) are NaN: a read of them would show
        col = torch.arange(W)
        big[:, (col < p["off"]) | (col >= p["off"] + N)] = torch.tensor(float("nan"), dtype=dt)
    x = make_x(big, p)
    return {
        "big": big, "x": x, "begin": begin, "end": end, "offsets": offsets,
        "begin_t": row_vector(begin, p["be_dtype"], p["be_strided"]),
        "end_t": row_vector(end, p["be_dtype"], p["be_strided"]),
        "off_t": row_vector(offsets, p["off_dtype"], False),
    }


def make_x(big, p):
    """x in its case layout, as a view of the buffer `big` ([B or 1, W], contiguous)."""
    off, N = p["off"], p["N"]
    if p["layout"] == "contig":
        return big
    if p["layout"] == "1d":
        return big[0, off:off + N]
    x = big[:, off:off + N]
    return x.expand(p["B"], N) if p["layout"] == "expand" else x


def clamp_ranges(begin, end, B, N):
    hi = [N] * B if end is None else [min(max(e, 0), N) for e in end]
    lo = [0] * B if begin is None else [min(max(b, 0), h) for b, h in zip(begin, hi)]
    return lo, hi


def to_device(t, device):
    """A row vector with the same layout on another device (a strided one: copy its buffer)."""
    if t is None or t.device.type == device:
        return t
    if t._base is None:
        return t.to(device)
    base = t._base
    assert base.dtype == t.dtype and base.is_contiguous() and base.storage_offset() == 0
    return base.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


# ----------------------------------------------------------------------------------------------
# the reference

def rank_keys(x2, lo, hi, largest, nan):
    """float64 [B, N]: higher is preferred; -inf marks elements that cannot be selected."""
    xf = x2.to(torch.float64)
    isnan = torch.isnan(xf)
    r = (xf if largest else -xf) + 0.0  # + 0.0 turns -0.0 into +0.0
    r = r.clone()
    r[torch.isinf(r) & (r > 0)] = 1e300
    r[torch.isinf(r) & (r < 0)] = -1e300
    # NaN ranks above +inf whatever `largest` (the last choice when largest=False)
    r[isnan] = float("-inf") if nan == "ignore" else (1e301 if largest else -1e301)
    col = torch.arange(x2.shape[1])
    valid = (col[None, :] >= torch.tensor(lo)[:, None]) & (col[None, :] < torch.tensor(hi)[:, None])
    return r.masked_fill_(~valid, float("-inf"))


def opt(p, key, default):
    v = p[key]
    return default if v == "default" else v


def expected_error(p, t, checked):
    """Reason string when the call must raise ValueError, else None."""
    B, N, k = p["B"], p["N"], p["k"]
    out_idx_dt = p["idx_eff"] if p["out"] not in ("idx", "both") else p["out_idx_dt"]
    fill = opt(p, "index_fill", -1)
    if p["out"] == "val_no_rv":
        return "out_values with return_values=False"
    if p["out"] in ("idx", "both") and p["idx"] != "default" and p["idx_eff"] != out_idx_dt:
        return "indices_dtype contradicts the dtype of out_indices"
    if out_idx_dt == "int32" and not INT32_MIN <= fill <= INT32_MAX:
        return "index_fill does not fit int32"
    if checked:
        for b in range(B):
            lo = 0 if t["begin"] is None else t["begin"][b]
            hi = N if t["end"] is None else t["end"][b]
            if lo < 0 or lo > N:
                return f"begin[{b}]={lo} outside [0,N]"
            if hi < lo or hi > N:
                return f"end[{b}]={hi} outside [begin,N]"
            if t["offsets"] is None or hi == lo or k == 0:
                continue
            o = t["offsets"][b]
            a, z = lo + o, hi - 1 + o
            lim = (INT32_MIN, INT32_MAX) if out_idx_dt == "int32" else (-2**63, 2**63 - 1)
            if not (lim[0] <= a <= lim[1] and lim[0] <= z <= lim[1]):
                return f"index_offset[{b}]={o} overflows {out_idx_dt}"
    if p["nan"] == "raise":
        lo, hi = clamp_ranges(t["begin"], t["end"], B, N)
        x2 = t["x"].reshape(1, -1) if t["x"].dim() == 1 else t["x"]
        isnan = torch.isnan(x2)
        col = torch.arange(N)
        valid = ((col[None, :] >= torch.tensor(lo)[:, None])
                 & (col[None, :] < torch.tensor(hi)[:, None]))
        hit = (isnan & valid).any(1).nonzero()
        if len(hit):
            return f"NaN in row {int(hit[0])}'s valid range"
    return None


def to_numpy(x):
    """x's bits as a NumPy array of the same float dtype (ml_dtypes' for bfloat16)."""
    return bits(x.contiguous()).numpy().view(NP_DT[x.dtype])


def reference(p, t):
    """Expected (values bits [B,k] or None, indices [B,k]) from the test suite's NumPy
    reference (tests/python/reference.py), and the rank keys check_any compares with."""
    B, N, k = p["B"], p["N"], p["k"]
    x2 = t["x"].reshape(1, -1) if t["x"].dim() == 1 else t["x"]
    nan = opt(p, "nan", "largest")
    lo, hi = clamp_ranges(t["begin"], t["end"], B, N)
    values, indices = topk_reference(
        to_numpy(x2), k, largest=p["largest"], sorted=opt(p, "sorted", "none"),
        begin=np.array(lo, dtype=np.int64), end=np.array(hi, dtype=np.int64),
        index_offset=None if t["offsets"] is None else np.array(t["offsets"], dtype=np.int64),
        index_fill=opt(p, "index_fill", -1), value_fill=opt(p, "value_fill", None),
        nan="largest" if nan == "raise" else nan)  # "raise" reaches here only without NaN
    vb = torch.from_numpy(values.view(np.dtype(f"i{values.itemsize}")).copy()) if p["rv"] else None
    r = rank_keys(x2, lo, hi, p["largest"], nan)
    cnt = (r > float("-inf")).sum(1).clamp(max=k)
    return vb, torch.from_numpy(indices.copy()), r, cnt


# ----------------------------------------------------------------------------------------------
# the call

def call(p, t, device, check):
    """Runs attnkit.topk on `device`. Returns dict(res=..., exc=..., wides=...)."""
    x = t["x"] if device == "cpu" else make_x(t["big"].to(device), p)
    assert x.stride() == t["x"].stride() and x.shape == t["x"].shape
    B, k = p["B"], p["k"]
    kw = {}
    if not p["largest"] or random.Random(p["data_seed"]).random() < 0.5:
        kw["largest"] = p["largest"]
    for key, name in (("sorted", "sorted"), ("nan", "nan"), ("ties", "ties"),
                      ("index_fill", "index_fill"), ("value_fill", "value_fill")):
        if p[key] != "default":
            kw[name] = p[key]
    if p["idx"] != "default":
        kw["indices_dtype"] = getattr(torch, p["idx"][6:]) if p["idx"].startswith("torch.") \
            else p["idx"]
    if not p["rv"]:
        kw["return_values"] = False
    if check is not None:
        kw["check"] = check
    for key, name in (("begin_t", "begin"), ("end_t", "end"), ("off_t", "index_offset")):
        if t[key] is not None:
            kw[name] = to_device(t[key], device)
    wides = {}
    one_row = p["layout"] == "1d"
    c0, ext = p["out_c0"], p["out_extra"]

    def out_buffer(dtype, sentinel):
        shape = (k + ext,) if one_row else (B, k + ext)
        wide = torch.empty(shape, dtype=dtype, device=device)
        bdt = BITS_DT.get(dtype, dtype)
        wide.view(bdt).fill_(sentinel)
        return wide, (wide[c0:c0 + k] if one_row else wide[:, c0:c0 + k])

    if p["out"] in ("idx", "both"):
        dt = IDX_DT[p["out_idx_dt"]]
        wides["i"], kw["out_indices"] = out_buffer(dt, SENT_I[dt])
    if p["out"] in ("val", "both", "val_no_rv"):
        dt = DTYPES[p["dtype"]]
        wides["v"], kw["out_values"] = out_buffer(dt, SENT_V[BITS_DT[dt]])
    res = exc = None
    try:
        res = attnkit.topk(x, k, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        exc = e
    out = {"res": res, "exc": exc, "wides": wides, "kw": kw}
    if res is not None:
        v, i = res
        def rows(a):  # [B, k] when the size is right (the shape is checked separately)
            return a.reshape(B, k) if a.numel() == B * k else a.reshape(1, -1)
        out["v"] = None if v is None else rows(bits(v.cpu()))
        out["i"] = rows(i.cpu())
        out["i_dtype"] = i.dtype
        out["v_shape"] = None if v is None else tuple(v.shape)
        out["i_shape"] = tuple(i.shape)
    return out


def wide_untouched(o, p, whole):
    """None, or where the call wrote outside its [B, k] region (or anywhere, if whole)."""
    k, c0 = p["k"], p["out_c0"]
    for name, wide in o["wides"].items():
        w = wide.cpu()
        w = w.view(BITS_DT.get(w.dtype, w.dtype)).clone()
        sent = SENT_I[w.dtype] if name == "i" else SENT_V[w.dtype]
        if not whole:
            if w.dim() == 1:
                w[c0:c0 + k] = sent
            else:
                w[:, c0:c0 + k] = sent
        bad = (w != sent).nonzero()
        if len(bad):
            return f"{'out_indices' if name == 'i' else 'out_values'} buffer written at " \
                   f"{bad[0].tolist()} ({'on error' if whole else 'outside [B,k]'})"
    return None


# ----------------------------------------------------------------------------------------------
# comparisons

def first_diff(got, exp):
    ne = got != exp
    rows = ne.any(1).nonzero()
    if not len(rows):
        return None
    b = int(rows[0])
    pos = ne[b].nonzero().flatten()[:4].tolist()
    return b, pos, [int(got[b, j]) for j in pos], [int(exp[b, j]) for j in pos], int(ne.sum())


def compare_exact(got, exp_v, exp_i, p):
    """got: call() dict; exp_*: CPU tensors. None or a description."""
    B, k = p["B"], p["k"]
    one_row = p["layout"] == "1d"
    want_shape = (k,) if one_row else (B, k)
    if got["i_shape"] != want_shape:
        return f"indices shape {got['i_shape']} != {want_shape}"
    if p["rv"] and got["v_shape"] != want_shape:
        return f"values shape {got['v_shape']} != {want_shape}"
    if not p["rv"] and got["v"] is not None:
        return "values returned with return_values=False"
    want_dt = IDX_DT[p["out_idx_dt"] if p["out"] in ("idx", "both") else p["idx_eff"]]
    if got["i_dtype"] != want_dt:
        return f"indices dtype {got['i_dtype']} != {want_dt}"
    d = first_diff(got["i"].long(), exp_i.long())
    if d:
        return (f"indices differ: row {d[0]} pos {d[1]} got {d[2]} exp {d[3]} "
                f"({d[4]} slots differ)")
    if p["rv"]:
        mask = 0xFFFFFFFF if exp_v.dtype == torch.int32 else 0xFFFF
        d = first_diff(got["v"].long() & mask, exp_v.long() & mask)
        if d:
            return (f"value bits differ: row {d[0]} pos {d[1]} got "
                    f"{[hex(v) for v in d[2]]} exp {[hex(v) for v in d[3]]} ({d[4]} differ)")
    return None


def check_any(got, exp_i, t, r, cnt, p):
    """ties='any': a valid top-k set with the right padding and order. exp_i: another valid
    answer (indices with offsets), used for the multiset of rank keys."""
    B, N, k = p["B"], p["N"], p["k"]
    one_row = p["layout"] == "1d"
    want_shape = (k,) if one_row else (B, k)
    if got["i_shape"] != want_shape:
        return f"indices shape {got['i_shape']} != {want_shape}"
    want_dt = IDX_DT[p["out_idx_dt"] if p["out"] in ("idx", "both") else p["idx_eff"]]
    if got["i_dtype"] != want_dt:
        return f"indices dtype {got['i_dtype']} != {want_dt}"
    if k == 0:
        return None
    gi = got["i"].long()
    j = torch.arange(k)
    pad = j[None, :] >= cnt[:, None]
    fill_i = opt(p, "index_fill", -1)
    bad = pad & (gi != fill_i)
    if bad.any():
        b = int(bad.any(1).nonzero()[0])
        return f"padding index: row {b} cnt {int(cnt[b])} got {gi[b, int(cnt[b]):][:4].tolist()}"
    off = torch.zeros(B, 1, dtype=torch.int64) if t["offsets"] is None else \
        torch.tensor(t["offsets"], dtype=torch.int64)[:, None]
    lo, hi = clamp_ranges(t["begin"], t["end"], B, N)
    lo_t, hi_t = torch.tensor(lo)[:, None], torch.tensor(hi)[:, None]
    col = torch.where(pad, 0, gi - off)
    inr = pad | ((col >= lo_t) & (col < hi_t))
    if not inr.all():
        b = int((~inr).any(1).nonzero()[0])
        return f"index outside [begin,end): row {b} cols {col[b][~inr[b]][:4].tolist()}"
    colc = col.clamp(0, max(N - 1, 0))
    rk = torch.where(pad, float("-inf"), r.gather(1, colc))
    if ((~pad) & (rk == float("-inf"))).any():
        b = int(((~pad) & (rk == float("-inf"))).any(1).nonzero()[0])
        return f"selected an unselectable element (NaN with nan='ignore'?) in row {b}"
    sc = torch.sort(torch.where(pad, N + j[None, :], col), dim=1).values
    if k > 1 and ((sc[:, 1:] == sc[:, :-1])).any():
        b = int((sc[:, 1:] == sc[:, :-1]).any(1).nonzero()[0])
        return f"repeated index in row {b}"
    if p["rv"]:
        x2 = t["x"].reshape(1, -1) if t["x"].dim() == 1 else t["x"]
        xb = bits(x2.contiguous()).gather(1, colc)
        fill_v = opt(p, "value_fill", float("-inf") if p["largest"] else float("inf"))
        fb = bits(torch.tensor([fill_v], dtype=torch.float64).to(x2.dtype))[0]
        want = torch.where(pad, fb, xb)
        d = first_diff(got["v"].long(), want.long())
        if d:
            return f"values are not x[indices] / fill: row {d[0]} pos {d[1]}"
    ecol = torch.where(pad, 0, exp_i.long() - off).clamp(0, max(N - 1, 0))
    erk = torch.where(pad, float("-inf"), r.gather(1, ecol))
    a = torch.sort(rk, dim=1, descending=True).values
    e = torch.sort(erk, dim=1, descending=True).values
    if not torch.equal(a, e):
        b = int((a != e).any(1).nonzero()[0])
        return f"selected set is not a top-k (rank keys differ) in row {b}"
    order = opt(p, "sorted", "none")
    if k > 1:
        both = (~pad[:, 1:]) & (~pad[:, :-1])
        if order == "index":
            bad = both & (col[:, 1:] <= col[:, :-1])
        elif order in ("value", True):
            bad = both & ((rk[:, 1:] > rk[:, :-1]) |
                          ((rk[:, 1:] == rk[:, :-1]) & (col[:, 1:] < col[:, :-1])))
        else:
            bad = torch.zeros_like(both)
        if bad.any():
            b = int(bad.any(1).nonzero()[0])
            return f"order '{order}' violated in row {b}"
    return None


# ----------------------------------------------------------------------------------------------
# reporting

class Report:
    def __init__(self, max_lines=36, per_kind=6):
        self.kinds = collections.Counter()
        self.lines = 0
        self.max_lines = max_lines
        self.per_kind = per_kind
        self.suppressed = 0
        self.info = collections.Counter()
        self.outcomes = collections.Counter()

    def fail(self, kind, msg):
        self.kinds[kind] += 1
        if self.kinds[kind] <= self.per_kind and self.lines < self.max_lines:
            self.lines += 1
            msg = msg if len(msg) < 1500 else msg[:1500] + "..."
            print(f"FAIL [{kind}] {msg}", flush=True)
        else:
            self.suppressed += 1


def err_name(e):
    return None if e is None else type(e).__name__


REPRO = {}


def run_case(seed, ci, p, device, rep, use_ref):
    env = os.environ.get("ATTNKIT_CUDA_TOPK_PATH")
    tag = (f"[repro: {'ATTNKIT_CUDA_TOPK_PATH=' + env + ' ' if env else ''}"
           f"python3 scripts/fuzz_topk.py --device {device} "
           f"--max-elems {REPRO.get('max_elems')} --seed {seed} --case {ci}]")
    t = build(p)
    B, N, k = p["B"], p["N"], p["k"]
    ties = opt(p, "ties", "lowest_index")
    where = f"{tag} {short(p)}"

    def check_result(got, exp_v, exp_i, keys, what):
        """keys: (r, cnt) or a callable returning them (computed only when needed)."""
        def get_keys():
            return keys() if callable(keys) else keys
        if ties == "any":
            m = check_any(got, exp_i, t, *get_keys(), p)
            if m is None and compare_exact(got, exp_v, exp_i, p) is not None:
                rep.info["ties=any chose a different (valid) answer"] += 1
        else:
            m = compare_exact(got, exp_v, exp_i, p)
            if m is not None and opt(p, "sorted", "none") in ("none", False) and \
                    got["i"].shape == exp_i.shape and torch.equal(
                        torch.sort(got["i"].long(), dim=1).values,
                        torch.sort(exp_i.long(), dim=1).values):
                m = "sorted='none': same indices, different order: " + m
        if m:
            rep.fail(what, f"{where} :: {m}")
            return False
        return True

    def lazy_keys():
        x2 = t["x"].reshape(1, -1) if t["x"].dim() == 1 else t["x"]
        lo, hi = clamp_ranges(t["begin"], t["end"], B, N)
        r = rank_keys(x2, lo, hi, p["largest"], opt(p, "nan", "largest"))
        cnt = (r > float("-inf")).sum(1).clamp(max=k)
        return r, cnt

    if device == "cpu":
        checked = p["check"] in (None, True)
        exp_err = expected_error(p, t, checked)
        got = call(p, t, "cpu", p["check"])
        if got["exc"] is not None and not isinstance(got["exc"], ValueError) or \
                (got["exc"] is not None and exp_err is None):
            rep.fail(f"unexpected {err_name(got['exc'])}",
                     f"{where} :: {str(got['exc'])[:300]}")
            return
        rep.outcomes["expected ValueError: " + (exp_err or "-").split("[")[0].split(" ")[0]
                     if exp_err else "compared"] += 1
        if exp_err is not None:
            if got["exc"] is None:
                rep.fail("missing error", f"{where} :: expected ValueError ({exp_err})")
                return
            m = wide_untouched(got, p, whole=True)
            if m:
                rep.fail("wrote on error", f"{where} :: {m}")
            return
        m = wide_untouched(got, p, whole=False)
        if m:
            rep.fail("wrote outside", f"{where} :: {m}")
        exp_v, exp_i, r, cnt = reference(p, t)
        check_result(got, exp_v, exp_i, (r, cnt), "mismatch cpu-vs-ref")
        return

    # CUDA vs CPU ("selftest": the same logic with the CPU backend on both sides)
    dev2 = "cuda" if device == "cuda" else "cpu"
    cuda_check = p["check"] if dev2 == "cuda" or p["check"] is not None else False
    cpu_check = False if p["check"] is None else p["check"]
    exp_err = expected_error(p, t, cuda_check is True)
    rep.outcomes["expected ValueError: " + (exp_err or "-").split("[")[0].split(" ")[0]
                 if exp_err else "compared"] += 1
    gc = call(p, t, "cpu", cpu_check)
    gd = call(p, t, dev2, cuda_check)
    if dev2 == "cuda" and gd["exc"] is not None and not isinstance(gd["exc"], ValueError):
        try:  # is the context still usable?
            torch.cuda.synchronize()
            assert torch.ones(4, device="cuda").sum().item() == 4
        except Exception:  # noqa: BLE001
            rep.fail("cuda runtime error", f"{where} :: {str(gd['exc'])[:300]}")
            raise CudaFault(str(gd["exc"])) from None
    unexpected = False
    for name, g in (("cpu", gc), ("cuda", gd)):
        e = g["exc"]
        if e is not None and (not isinstance(e, ValueError) or exp_err is None):
            rep.fail(f"unexpected {err_name(e)} ({name})", f"{where} :: {str(e)[:300]}")
            unexpected = True
    if unexpected:
        return
    if (gc["exc"] is None) != (gd["exc"] is None):
        rep.fail("error outcome differs",
                 f"{where} :: cpu={err_name(gc['exc'])} cuda={err_name(gd['exc'])} "
                 f"expected={'ValueError: ' + exp_err if exp_err else 'success'} :: "
                 f"{str(gc['exc'] or gd['exc'])[:200]}")
        return
    if exp_err is not None and gc["exc"] is None:
        rep.fail("missing error", f"{where} :: neither backend raised ({exp_err})")
        return
    if gc["exc"] is not None:
        m = wide_untouched(gc, p, whole=True)
        if m:
            rep.fail("wrote on error (cpu)", f"{where} :: {m}")
        if exp_err is not None and not exp_err.startswith("NaN"):
            m = wide_untouched(gd, p, whole=True)
            if m:
                rep.fail("wrote on error (cuda)", f"{where} :: {m}")
        if exp_err is not None and exp_err.startswith("NaN") and str(gc["exc"]) != str(gd["exc"]):
            # Both name the first NaN in row-major order.
            rep.fail("NaN error differs",
                     f"{where} :: cpu={str(gc['exc'])[:150]} cuda={str(gd['exc'])[:150]}")
        return
    for name, g in (("cpu", gc), ("cuda", gd)):
        m = wide_untouched(g, p, whole=False)
        if m:
            rep.fail(f"wrote outside ({name})", f"{where} :: {m}")
    check_result(gd, gc["v"], gc["i"], lazy_keys, "mismatch cuda-vs-cpu")
    if use_ref:
        exp_v, exp_i, r2, cnt2 = reference(p, t)
        check_result(gc, exp_v, exp_i, (r2, cnt2), "mismatch cpu-vs-ref")
    if p["repeat"]:
        g2 = call(p, t, dev2, cuda_check)
        if g2["exc"] is not None or not torch.equal(g2["i"], gd["i"]) or (
                p["rv"] and not torch.equal(g2["v"], gd["v"])):
            rep.fail("cuda nondeterministic", f"{where} :: second run differs")


class CudaFault(Exception):
    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="stop drawing new cases after this many seconds (default 60)")
    ap.add_argument("--seed", type=int, default=0,
                    help="case I is drawn from (seed, I) alone (default 0)")
    ap.add_argument("--device", choices=["cuda", "cpu", "selftest"],
                    default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cuda: the CUDA backend against the CPU one on the same bytes; cpu: "
                         "the CPU backend against the NumPy reference; selftest: the cuda "
                         "mode's comparison with the CPU backend on both sides (default cuda "
                         "when torch sees a GPU, else cpu)")
    ap.add_argument("--max-elems", type=int, default=2**24,
                    help="most elements (B x N) a case's input holds (default 2^24)")
    ap.add_argument("--case", type=int, default=None, help="replay only this case index")
    ap.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    ap.add_argument("--ref", action="store_true",
                    help="cuda mode: also check the CPU backend against the torch reference")
    ap.add_argument("--threads", type=int, default=None,
                    help="attnkit and torch CPU threads (default: leave as is)")
    ap.add_argument("--verbose", action="store_true", help="print every case's parameters")
    ap.add_argument("--cuda-path", choices=["auto", "cluster", "filter"], default=None,
                    help="sets ATTNKIT_CUDA_TOPK_PATH before the first CUDA call")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no GPU")
        return 2
    if a.cuda_path:
        os.environ["ATTNKIT_CUDA_TOPK_PATH"] = "" if a.cuda_path == "auto" else a.cuda_path
    if a.threads:
        attnkit.set_num_threads(a.threads)
        torch.set_num_threads(a.threads)
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "-"
    print(f"fuzz_topk: device={a.device} ({gpu}) seed={a.seed} seconds={a.seconds} "
          f"max_elems={a.max_elems} torch={torch.__version__} attnkit_threads="
          f"{attnkit.num_threads()} ATTNKIT_CUDA_TOPK_PATH="
          f"{os.environ.get('ATTNKIT_CUDA_TOPK_PATH', '')!r}", flush=True)
    REPRO["max_elems"] = a.max_elems
    rep = Report()
    start = time.time()
    n = 0
    stats = collections.Counter()
    harness_errors = 0
    slow = []
    indices = [a.case] if a.case is not None else None
    ci = -1
    while True:
        if indices is not None:
            if n >= 1:
                break
            ci = indices[0]
        else:
            ci += 1
            if time.time() - start >= a.seconds or (a.cases is not None and n >= a.cases):
                break
        p = draw_case(a.seed, ci, a.max_elems, "cuda" if a.device == "selftest" else a.device)
        if a.verbose:
            print(f"case {ci}: {short(p)} data_seed={p['data_seed']}", flush=True)
        n += 1
        stats[p["dtype"]] += 1
        stats["boundary"] += p["boundary"]
        t0 = time.time()
        try:
            run_case(a.seed, ci, p, a.device, rep, a.ref)
        except CudaFault:
            print("stopping: a CUDA runtime error may have poisoned the context", flush=True)
            break
        except Exception:  # noqa: BLE001  (a bug of this script, or of torch)
            harness_errors += 1
            tb = traceback.format_exc().strip().splitlines()
            rep.fail("harness exception",
                     f"seed={a.seed} case={ci} max_elems={a.max_elems} {short(p)} :: {tb[-1]} @ "
                     f"{' | '.join(l.strip() for l in tb[-4:-1])}")
        dt = time.time() - t0
        slow.append((dt, ci))
        slow = sorted(slow, reverse=True)[:3]
    el = time.time() - start
    mismatches = sum(v for kk, v in rep.kinds.items() if kk.startswith("mismatch")
                     or kk.startswith("error outcome") or kk.startswith("missing")
                     or kk.startswith("wrote") or kk.startswith("cuda nondet"))
    unexpected = sum(rep.kinds.values()) - mismatches
    print(f"summary: {n} cases in {el:.1f}s (bf16 {stats['bf16']}, f16 {stats['f16']}, "
          f"f32 {stats['f32']}, dispatch-boundary {stats['boundary']}); "
          f"mismatches {mismatches}; unexpected exceptions/errors {unexpected}"
          + (f"; {rep.suppressed} failure lines suppressed" if rep.suppressed else ""))
    print("  slowest cases: " + ", ".join(f"case {c} {d:.2f}s" for d, c in slow))
    print("  outcomes: " + ", ".join(f"{kk} {v}" for kk, v in sorted(rep.outcomes.items())))
    for kind, c in sorted(rep.kinds.items()):
        print(f"  {kind}: {c}")
    for kind, c in sorted(rep.info.items()):
        print(f"  info: {kind}: {c}")
    return 1 if rep.kinds else 0


if __name__ == "__main__":
    sys.exit(main())
