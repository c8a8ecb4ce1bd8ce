# SPDX-License-Identifier: Apache-2.0
"""Counts the select passes of the CUDA cluster top-k kernel on fp32 rows of N(0, 1) values, for
ways of choosing its first pass's bins (src/cuda/topk/kernels/topk_cluster.cuh, step 3).

The model follows the kernel on one row of 256-thread CTAs: the sampled columns
(common/topk_sample.hpp), the floor from the 11-bit digit holding the sample's
e + 3 sqrt(e) + 2-th best, then radix passes over the candidates (scores above the floor) with
2048 bins, the last open above, ending when the pivot's bin is a single score or is kept whole.

Usage: python3 tools/cluster_passes.py [--rows 200]
"""

import argparse
import math

import numpy as np

BINS, TOP_SHIFT, THREADS, PER_THREAD = 2048, 21, 256, 32


def scores(x: np.ndarray) -> np.ndarray:
    """fp32 bits as offset binary (largest=True): the selection order as integers."""
    b = x.view(np.uint32).astype(np.int64)
    return np.where(b >> 31, (1 << 31) - (b & 0x7FFFFFFF), (1 << 31) + (b & 0x7FFFFFFF))


def floor_and_top(sc: np.ndarray, k: int):
    n = len(sc)
    ctas = 1
    while ctas * THREADS * PER_THREAD < n:
        ctas *= 2
    every = 4 if ctas >= 4 else ctas
    cols = [(r * THREADS + t) * PER_THREAD + ((t * 11 + r * 5) & 31)
            for r in range(ctas) for t in range(0, THREADS, every)]
    digits = sc[[c for c in cols if c < n]] >> TOP_SHIFT
    e = k / (PER_THREAD * every)
    need = int(e + 3 * math.sqrt(e) + 2)
    from_top = np.cumsum(np.bincount(digits, minlength=BINS)[::-1])
    pivot = BINS - 1 - int(np.argmax(from_top >= need))
    return (pivot << TOP_SHIFT) - 1, int(digits.max())


def passes(sc: np.ndarray, k: int, first_shift) -> int:
    floor, top = floor_and_top(sc, k)
    cand = sc[sc > floor]
    lo, hi, need = floor + 1, (1 << 32) - 1, k
    shift = first_shift(lo, top)
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


def spanning(extra_digits: int):
    """2048 bins from the floor to the end of the digit extra_digits - 1 above the sampled top."""
    def shift(lo, top):
        end = min((top + extra_digits) << TOP_SHIFT, 1 << 32)
        return max(0, int(end - 1 - lo).bit_length() - 11)
    return shift


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200)
    args = ap.parse_args()
    # Each way as a function of k; the last spans two digits past the sampled top where under
    # 0.3 sampled elements are expected above the k-th best (one sample every 128 columns).
    ways = {"bins of 2^15": lambda k: lambda lo, top: 15,
            "to the sampled top digit's end": lambda k: spanning(1),
            "one digit past it": lambda k: spanning(2),
            "two past below e = 0.3": lambda k: spanning(3 if k / (PER_THREAD * 4) < 0.3 else 2)}
    for n in (129280, 151936):
        rows = [scores(np.random.default_rng(s).standard_normal(n).astype(np.float32))
                for s in range(args.rows)]
        for k in (2, 8, 20, 32, 50, 1024, 4096):
            line = [f"n={n} k={k}:"]
            for name, way in ways.items():
                line.append(f"{name} {np.mean([passes(r, k, way(k)) for r in rows]):.2f}")
            print("  ".join(line))


if __name__ == "__main__":
    main()
