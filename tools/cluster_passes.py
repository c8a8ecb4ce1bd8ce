# SPDX-License-Identifier: Apache-2.0
"""Counts the select passes of the CUDA cluster top-k kernel on fp32 rows, for ways of choosing
its floor and its first pass's bins (src/cuda/topk/kernels/topk_cluster.cuh, steps 1 and 3):
the kernel's own (`past_top`) and candidates (docs/topk.md, "Next steps").

The model follows the kernel on one row of 256-thread CTAs: the sampled columns
(common/topk_sample.hpp), the floor from the 11-bit digit holding the sample's
e + 3 sqrt(e) + 2-th best (e = k / columns a sample, the sampled elements expected above the
k-th best; `inner_floor` 11 bits finer where that digit holds many sampled elements), then
radix passes over the candidates (scores above the floor) with 2048 bins, the last open above,
ending when the pivot's bin is a single score or is kept whole. A floor that fewer than k
elements beat costs a pass, then the passes of a select over the whole row.

Usage: python3 tools/cluster_passes.py [--rows 200] [--dist normal|lognormal|uniform|gumbel]
                                       [--k 2 8 ...]
"""

import argparse
import math

import numpy as np

BINS, TOP_SHIFT, THREADS, PER_THREAD, TAIL_RANK = 2048, 21, 256, 32, 16


def scores(x: np.ndarray) -> np.ndarray:
    """fp32 bits as offset binary (largest=True): the selection order as integers."""
    b = x.view(np.uint32).astype(np.int64)
    return np.where(b >> 31, (1 << 31) - (b & 0x7FFFFFFF), (1 << 31) + (b & 0x7FFFFFFF))


def row(dist: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = {"normal": lambda: rng.standard_normal(n),
         "lognormal": lambda: np.exp(rng.standard_normal(n)),
         "uniform": lambda: rng.random(n),
         "gumbel": lambda: rng.gumbel(size=n)}[dist]()
    return scores(x.astype(np.float32))


def sample(sc: np.ndarray, k: int):
    """The sample's digits and scores, best first, and e."""
    n = len(sc)
    ctas = 1
    while ctas * THREADS * PER_THREAD < n:
        ctas *= 2
    every = 4 if ctas >= 4 else ctas
    cols = [(r * THREADS + t) * PER_THREAD + ((t * 11 + r * 5) & 31)
            for r in range(ctas) for t in range(0, THREADS, every)]
    sampled = np.sort(sc[[c for c in cols if c < n]])[::-1]
    return sampled >> TOP_SHIFT, sampled, k / (PER_THREAD * every)


def sample_need(e):
    """The sample's rank whose digit sets the floor: e plus three deviations plus two."""
    return int(e + 3 * math.sqrt(e) + 2)


def digit_floor(digits, e):
    """The start of the digit holding the sample's need-th best, less one; with fewer sampled
    elements than that, no floor (every element a candidate)."""
    need = sample_need(e)
    return (int(digits[need - 1]) << TOP_SHIFT) - 1 if need <= len(digits) else -1


def passes(sc: np.ndarray, k: int, way) -> int:
    """Select passes after the sample; a floor that fewer than k beat costs a pass, then the
    passes of a select over the whole row from the top digit."""
    digits, sampled, e = sample(sc, k)
    floor, end_digit = way(digits, e, sampled)
    if floor < 0:  # no floor: the kernel's passes start from the top digits of the whole row
        return select_passes(sc, k, 0, 1 << 32)
    cand = sc[sc > floor]
    if len(cand) < k:
        return 1 + select_passes(sc, k, 0, 1 << 32)
    return select_passes(cand, k, floor, min(end_digit, BINS) << TOP_SHIFT)


def select_passes(cand: np.ndarray, k: int, floor: int, end: int) -> int:
    lo, hi, need = floor + 1, (1 << 32) - 1, k
    shift = max(0, int(end - 1 - lo).bit_length() - 11)
    count = 0
    while True:
        count += 1
        c = cand[(cand >= lo) & (cand <= hi)]
        if len(c) <= need:
            return count
        hist = np.bincount(np.minimum((c - lo) >> shift, BINS - 1), minlength=BINS)
        from_top = np.cumsum(hist[::-1])
        d = BINS - 1 - int(np.argmax(from_top >= need))
        need -= int(from_top[BINS - 1 - d] - hist[d])
        bin_lo = lo + (d << shift)
        hi = hi if d == BINS - 1 or hi - bin_lo <= (1 << shift) - 1 else bin_lo + (1 << shift) - 1
        lo = bin_lo
        if lo == hi or hist[d] == need:
            return count
        shift = max(0, int(hi - lo).bit_length() - 11)


def past_top(digits, e, sampled=None):
    """The digit floor; the span to one digit past the sample's best, two where e < 0.3."""
    return digit_floor(digits, e), int(digits[0]) + (3 if e < 0.3 else 2)


def second_rank(digits, e, sampled=None):
    """The span ends with the digit of the (e - sqrt(e))-th best where e >= 2; below e = 1 it
    reaches past the best by the tail gap from the TAIL_RANK-th best to the best, scaled by
    log(1 / e) / log(TAIL_RANK)."""
    floor, end = past_top(digits, e)
    if e >= 2:
        return floor, int(digits[math.ceil(e - math.sqrt(e)) - 1]) + 1
    if e < 1 and len(digits) >= TAIL_RANK:
        gap = int(digits[0]) - int(digits[TAIL_RANK - 1])
        reach = min(1.25 * gap * math.log2(1 / e) / math.log2(TAIL_RANK), 2048.0)
        end = max(end, int(digits[0]) + 1 + math.ceil(reach))
    return floor, end


def inner_floor(digits, e, sampled):
    """second_rank, with the floor at the start of the sample's need-th best's next 11 bits
    where its digit holds at least max(4 need, 16) sampled elements; the span then ends with
    the floor's digit when it is the sample's top one."""
    floor, end = second_rank(digits, e)
    need = sample_need(e)
    if floor < 0:
        return floor, end
    d = int(digits[need - 1])
    if int((digits == d).sum()) >= max(4 * need, 16):
        floor = (int(sampled[need - 1]) >> (TOP_SHIFT - 11) << (TOP_SHIFT - 11)) - 1
        if d == int(digits[0]):
            end = d + 1
    return floor, end


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--dist", default="normal",
                    choices=["normal", "lognormal", "uniform", "gumbel"])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 8, 20, 50, 256, 1024, 4096])
    args = ap.parse_args()
    ways = {"one digit past the top (the kernel)": past_top, "second rank": second_rank,
            "and an inner floor": inner_floor}
    for n in (129280, 32000):
        rows = [row(args.dist, n, s) for s in range(args.rows)]
        for k in args.k:
            line = [f"{args.dist} n={n} k={k}:"]
            for name, way in ways.items():
                line.append(f"{name} {np.mean([passes(r, k, way) for r in rows]):.2f}")
            print("  ".join(line))


if __name__ == "__main__":
    main()
