"""The cube server's versioned views in one process (``runtime/cube/views.py``): what a
patch costs the server, and what a merge costs lookups.

Builds a base of ``--keys`` random uint64 keys x ``--dim`` float32 (one shard's table),
then for each patch size (half new values of base keys, half new keys): the seconds to
build its overlay (``VersionView.patched``: the load's table work, O(patch rows)) and to
merge it into the base in place (``VersionView.folded``); the time of a batch lookup
(``--batch`` random base keys, median of many) on the base alone and on base + overlay;
and, while a merge runs, the longest batch lookup a reader thread saw, beside the longest
it saw in 0.5 s without a merge (a merge takes no lock lookups take: the difference is
what sharing the cores and the GIL's hand-offs cost).

Then the table grows (``grow``): patches of ``--grow-rows`` rows, half new keys, until it
holds ``--grow`` times its keys, past the base's headroom into extensions: merge seconds,
RSS at the start, at the end and its peak, lookups on the grown table.

Last line: ``versions keys=<n> dim=<d> batch=<b> lookup_us_base=<us> lookup_us_absent=<us>
lookup_us_max_idle=<us>
patch_<rows>_overlay_s=<s> patch_<rows>_merge_s=<s> patch_<rows>_lookup_us_overlay=<us>
patch_<rows>_lookup_us_max_during_merge=<us> ... grown_keys=<n> grown_extensions=<n>
grown_merge_s_max=<s> grown_rss_ratio=<end / start> grown_peak_rss_ratio=<peak / end>
grown_lookup_us=<us> grown_lookup_us_base_keys=<us> grown_lookup_us_absent=<us>``.

Usage: ``python bench/bench_versions.py [--keys 2500000 --dim 10 --sizes 10000,100000,500000]``
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.cube.views import VersionView  # noqa: E402


def lookup_us(view: VersionView, keys: np.ndarray, batch: int, rounds: int, rng) -> float:
    """Median microseconds of ``rounds`` lookups of ``batch`` random ``keys``."""
    times = []
    for _ in range(rounds):
        q = keys[rng.integers(0, len(keys), batch)]
        t0 = time.perf_counter()
        view.lookup(q)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)


def max_lookup_us(view: VersionView, keys: np.ndarray, batch: int, during) -> float:
    """The longest lookup (us) of ``batch`` random ``keys`` a reader thread saw while
    ``during()`` ran in this thread."""
    stop, worst = threading.Event(), [0.0]

    def reader():
        r = np.random.default_rng(1)
        while not stop.is_set():
            q = keys[r.integers(0, len(keys), batch)]
            t = time.perf_counter()
            view.lookup(q)
            worst[0] = max(worst[0], time.perf_counter() - t)

    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.05)
    try:
        during()
    finally:
        stop.set()
        th.join()
    return worst[0] * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=2_500_000, help="keys in the base (one shard)")
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--sizes", default="10000,100000,500000", help="patch rows, comma-separated")
    ap.add_argument("--batch", type=int, default=1000, help="keys per lookup")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grow", type=float, default=1.4, help="grow the table to this many times its keys (<= 1: no growth rows)")
    ap.add_argument("--grow-rows", type=int, default=40_000, help="rows per patch while growing")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    keys = np.unique(rng.integers(1, 1 << 63, args.keys + args.keys // 100, dtype=np.uint64))[:args.keys]
    cur = VersionView.of_base(keys, rng.standard_normal((len(keys), args.dim)).astype(np.float32), 1)
    base_us = lookup_us(cur, keys, args.batch, 2000, rng)
    absent_us = lookup_us(cur, rng.integers(1, 1 << 63, 200_000, dtype=np.uint64), args.batch, 2000, rng)
    idle_max = max_lookup_us(cur, keys, args.batch, lambda: time.sleep(0.5))
    fields = [f"versions keys={len(keys)} dim={args.dim} batch={args.batch} lookup_us_base={base_us:.1f} "
              f"lookup_us_absent={absent_us:.1f} lookup_us_max_idle={idle_max:.0f}"]
    overlay_us = []
    for i, n in enumerate(int(x) for x in args.sizes.split(",") if x.strip()):
        pk = np.unique(np.concatenate([keys[rng.choice(len(keys), n - n // 2, replace=False)],
                                       rng.integers(1, 1 << 63, n // 2, dtype=np.uint64)]))
        pv = rng.standard_normal((len(pk), args.dim)).astype(np.float32)
        t0 = time.perf_counter()
        nxt = cur.patched(pk, pv, 2 + i)
        t_overlay = time.perf_counter() - t0
        overlay_us.append(lookup_us(nxt, keys, args.batch, 2000, rng))
        merged, t_merge = [], [0.0]

        def merge(view=nxt):
            t0 = time.perf_counter()
            merged.append(view.folded())
            t_merge[0] = time.perf_counter() - t0

        worst = [max_lookup_us(nxt, keys, args.batch, merge) / 1e6]
        cur, t_merge = merged[0], t_merge[0]
        print(f"patch {len(pk):>8} rows: overlay built in {t_overlay:.3f} s, merged in place in {t_merge:.3f} s "
              f"(in place: {cur.base is nxt.base}); batch lookup {overlay_us[-1]:.1f} us with the overlay "
              f"({base_us:.1f} on the base alone), longest during the merge {worst[0] * 1e6:.0f} us "
              f"({idle_max:.0f} in 0.5 s without a merge)", flush=True)
        fields.append(f"patch_{len(pk)}_overlay_s={t_overlay:.3f} patch_{len(pk)}_merge_s={t_merge:.3f} "
                      f"patch_{len(pk)}_lookup_us_overlay={overlay_us[-1]:.1f} "
                      f"patch_{len(pk)}_lookup_us_max_during_merge={worst[0] * 1e6:.0f}")
    if args.grow > 1:
        fields.append(grow(cur, keys, args, rng, base_us))
    print(" ".join(fields))
    return 0


def grow(cur: VersionView, keys: np.ndarray, args, rng, base_us: float) -> str:
    """Patches of ``--grow-rows`` rows, half of them new keys, merged one after the other
    until the table holds ``--grow`` times its keys: past the base's headroom they go into
    extensions. Prints each merge's seconds, the tables and the process RSS; returns the
    line's ``grown_*`` fields (lookups of known keys, and of absent ones, on the grown
    table: every key, the base's keys only, absent keys; against the base alone)."""
    from bench.bench_rollout import rss_mib

    start_keys, start_rss, n = len(cur), rss_mib(os.getpid(), "VmRSS"), args.grow_rows
    merges, peak, version, known = [], start_rss, 100, [keys]
    while len(cur) < args.grow * start_keys:
        pool = known[rng.integers(0, len(known))]
        pk = np.unique(np.concatenate([pool[rng.integers(0, len(pool), n - n // 2)],
                                       rng.integers(1, 1 << 63, n // 2, dtype=np.uint64)]))
        known.append(pk)
        nxt = cur.patched(pk, rng.standard_normal((len(pk), args.dim)).astype(np.float32), version)
        t0 = time.perf_counter()
        cur = nxt.folded()
        merges.append(time.perf_counter() - t0)
        version += 1
        peak = max(peak, rss_mib(os.getpid(), "VmRSS"))
    end_rss = rss_mib(os.getpid(), "VmRSS")
    allk = np.concatenate(known)
    grown_us = lookup_us(cur, allk, args.batch, 2000, rng)
    base_keys_us = lookup_us(cur, keys, args.batch, 2000, rng)
    absent = rng.integers(1, 1 << 63, 200_000, dtype=np.uint64)
    miss_us = lookup_us(cur, absent, args.batch, 2000, rng)
    print(f"grown from {start_keys} to {len(cur)} keys by {len(merges)} patches of {n} rows: "
          f"{len(cur.extensions)} extension(s), copied: {cur.base.count + sum(e.count for e in cur.extensions) != len(cur)}; "
          f"merge {np.median(merges):.3f} s median, {max(merges):.3f} s max; RSS {start_rss:.0f} -> {end_rss:.0f} MiB "
          f"(peak {peak:.0f}); batch lookup {grown_us:.1f} us (keys of the base {base_keys_us:.1f}, absent keys "
          f"{miss_us:.1f}), {base_us:.1f} on the base before growing", flush=True)
    return (f"grown_keys={len(cur)} grown_extensions={len(cur.extensions)} grown_merge_s_max={max(merges):.3f} "
            f"grown_rss_ratio={end_rss / start_rss:.3f} grown_peak_rss_ratio={peak / end_rss:.3f} "
            f"grown_lookup_us={grown_us:.1f} grown_lookup_us_base_keys={base_keys_us:.1f} "
            f"grown_lookup_us_absent={miss_us:.1f}")


if __name__ == "__main__":
    sys.exit(main())
