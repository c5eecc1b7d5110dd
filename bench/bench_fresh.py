"""Freshness at minute partitions (``make bench-fresh``): 1M rows/hour in 1-minute
partitions on a table of millions of rows, a version per partition, landed-to-served per
partition.

1. ``--partitions`` + 1 one-minute partitions (``runtime.formats.partitions``'s minute
   layout ``ROOT/YYYYMMDD/HHMM/``) are written into ``upstream/`` (not timed): partition 0
   is a warm-up of ``--warmup-rows`` rows of the generator whose present categorical values
   are all distinct (about 22 new feasigns a row, a few slots missing: 245k rows make a base
   of 5.3M rows, the long tail of a big table, without generating hours of traffic), each
   row written ``--feature-min-count`` times (the trainer's default), so that its feasigns
   are admitted (``runtime.trainer.lifecycle``);
   partitions 1..N hold
   ``--rows-per-hour`` / 60 rows each at the generator's production shape (``--shape
   long-tail``, ``runtime.trainer.generator``);
2. file server, cube 2 shards x 2 replicas, transfer (``runtime.local.services``: coalescing
   on, ``runtime.cube.transfer.coalesce``), ``train --local-cluster --mode continuous
   --partition-minutes 1`` (1 pserver, 2 trainers) following ``hours/``; partition 0 lands,
   its base is rolled out, serving starts on it and a client (``--client-rate`` requests/s,
   batch 1) runs from then on;
3. the cube servers' RSS is read while serving the base (``VmRSS``; again at the end,
   serving the table the patches made, the ratio's denominator) and their peak RSS reset (``/proc/<pid>/clear_refs``, 5); partitions 1..N then land (a directory rename,
   ``_SUCCESS`` inside) every ``--land-every-s`` seconds (at most 60: faster than real time
   is allowed, never slower), whatever the job and the cube are doing;
4. a thread follows serving's version (``/v2/health/ready``, every 50 ms); partition ``t``
   is served once serving answers with a version whose donefile ``data_end`` is at least
   the partition's end (a version trained through it, coalesced or not).

Per partition: train and export seconds (the trainer's summary), the version that first
served it, its rollout seconds and the patches coalesced into it (the transfer's history),
landed-to-served seconds. Then where the time goes (p50 of each step), and the line
``fresh partition_s=60 partitions=<n> table_rows=<n> rows_per_hour=<n> patch_rows_p50=<n>
rollout_s_p50=<s> landed_to_served_s_p50=<s> landed_to_served_s_p99=<s>
cube_rss_patch_ratio=<peak RSS while patching / RSS serving the table patched, the largest
server's>
failed_requests=<n>`` (patch rows and rollouts over the patches; landed-to-served over
partitions 1..N; ``table_rows``: the distinct keys served at the end).

Usage: ``python bench/bench_fresh.py [--partitions 30 --warmup-rows 245000 --land-every-s 10]``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_online import SERVICES, _stop_client, add_run_args, continuous_job  # noqa: E402
from bench.bench_rollout import rss_mib  # noqa: E402
from runtime import proc  # noqa: E402
from runtime.formats import donefile, partition_stats, partitions  # noqa: E402

START = "20261120/0000"


def _reset_peak(pid: int) -> bool:
    """Resets ``VmHWM`` of ``pid`` to its current RSS (``/proc/<pid>/clear_refs``, 5);
    False when the kernel refuses."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def write_warmup(directory: Path, rows: int, seed: int, copies: int = 1) -> None:
    """``directory/part-00000``: ``rows`` rows of the long-tail generator (its labels, dense
    features and missing slots: the data gate sees the same source as in the partitions
    after it) whose present categorical values are replaced by random 32-bit hex tokens,
    distinct across the rows, each row written ``copies`` times; then ``_SUCCESS``."""
    from runtime.formats import features
    from runtime.trainer import generator

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="warmup_") as tmp:
        first = partitions.Partition.parse(START, minutes=1)
        generator.generate_hours(Path(tmp), 1, str(first), rows, seed=seed + 1, shape="long-tail", minutes=1)
        (src,) = partitions.files(tmp, first)
        lines = Path(src).read_text().splitlines()
    # an odd multiplier is a bijection mod 2**32: distinct tokens, scattered over the range
    start = int(rng.integers(0, 1 << 32))
    tokens = ((np.arange(len(lines) * features.NUM_SLOTS, dtype=np.uint64) * np.uint64(2654435761)
               + np.uint64(start)) % np.uint64(1 << 32)).reshape(len(lines), features.NUM_SLOTS)
    head = 1 + features.NUM_DENSE
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "part-00000", "w") as f:
        for line, row in zip(lines, tokens):
            x = line.split("\t")
            x[head:] = [c and f"{t:08x}" for c, t in zip(x[head:], row)]  # a missing slot stays missing
            f.write(("\t".join(x) + "\n") * copies)
    partitions.mark_complete(directory)


def _trainer_log(log: Path) -> dict[str, dict[str, float]]:
    """Trainer 0's seconds per partition from its log: ``stage`` (its shard staged and
    loaded), ``train`` (the pass), ``export`` (rows cut and published)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    out: dict[str, dict[str, float]] = {}
    staged = [float(a) + float(b) for a, b in re.findall(r"rows staged in ([\d.]+) s, loaded in ([\d.]+) s", text)]
    for i, (name, s) in enumerate(re.findall(r"partition (\d{8}/\d{4}) done: \d+ examples in ([\d.]+) s", text)):
        out.setdefault(name, {})["train"] = float(s)
        if i < len(staged):
            out[name]["stage"] = staged[i]
    for name, s in re.findall(r"after partition (\d{8}/\d{4}): \d+ sparse rows in ([\d.]+) s", text):
        out.setdefault(name, {})["export"] = float(s)
    return out


def _keys(root: str, version: int) -> np.ndarray:
    """uint64[n]: the keys of one version's SequenceFiles (``versions/<id>/sparse``)."""
    from runtime.formats.seqfile import read_sequence_file

    d = Path(root) / donefile.sparse_dir(version)
    return np.concatenate([read_sequence_file(str(p))[0] for p in sorted(d.glob("part-*"))] or
                          [np.zeros(0, np.uint64)])


def _pct(xs, q: float) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.percentile(xs, q)) if xs else float("nan")


class ServedLog:
    """Follows serving's version every ``every_s`` seconds in a thread: ``changes`` is
    [(monotonic s, version)] of each new version seen, and the cube servers' RSS
    (``VmRSS``, MiB) is sampled at each look (``rss_max``: per server, the peak seen)."""

    def __init__(self, serving_url: str, servers: dict, every_s: float = 0.05):
        self.url, self.servers, self.every_s = serving_url, servers, every_s
        self.changes: list[tuple[float, int]] = []
        self.rss_max: dict = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from runtime.local.status import serving_version

        last = None
        while not self.stop.is_set():
            v = serving_version(self.url)
            if v is not None and v != last:
                self.changes.append((time.monotonic(), v))
                last = v
            for key, role in self.servers.items():
                self.rss_max[key] = max(self.rss_max.get(key, 0.0), rss_mib(role.proc.pid, "VmRSS"))
            self.stop.wait(self.every_s)

    def served_at(self, data_end: dict[int, int], end_s: float) -> float | None:
        """When serving first answered with a version whose data end is at least ``end_s``
        (unix s); None if it never did."""
        for t, v in self.changes:
            if data_end.get(v, -1) >= end_s:
                return t
        return None


def run(args) -> int:
    from runtime.formats.dict_info import served_version
    from runtime.local.services import start_client, start_serving, start_services
    from runtime.local.status import Waiter, serving_version
    from runtime.trainer import generator

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_fresh_"))
    n = args.partitions
    rows = math.ceil(args.rows_per_hour / 60)
    parts = [partitions.Partition.parse(START, minutes=1).next(i) for i in range(n + 1)]
    upstream, root = work / "upstream", work / "hours"
    t0 = time.monotonic()
    from runtime.trainer.config import FIELDS

    write_warmup(Path(parts[0].location(str(upstream))), args.warmup_rows, args.seed,
                 copies=int(FIELDS["feature_min_count"].default))
    generator.generate_hours(upstream, n, str(parts[1]), rows, seed=args.seed, shape="long-tail",
                             scale=args.table_scale, minutes=1)
    print(f"wrote a warm-up partition of {args.warmup_rows} rows and {n} one-minute partitions of {rows} rows "
          f"(long-tail, table scale {args.table_scale}) in {time.monotonic() - t0:.0f} s", flush=True)
    root.mkdir(parents=True, exist_ok=True)

    def land(p) -> float:
        dst = Path(p.location(str(root)))
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(p.location(str(upstream)), dst)  # complete (its _SUCCESS inside) at once
        return time.monotonic()

    ns = SERVICES
    landed: dict[int, float] = {}
    with proc.ProcessGroup(work / "logs", grace_s=10.0) as group:
        waiter = Waiter(group, args.timeout)
        svc = start_services(ns, work, group)
        argv = continuous_job(work, svc, root, "--partition-minutes", "1", "--start-hour", START, "--poll-seconds", "0.1",
                              "--patch-every-seconds", "0", "--base-every-minutes", "525600",
                              "--checkpoint-every-minutes", "525600")
        trainer = group.start("train", argv, expect_exit=False)
        landed[0] = land(parts[0])
        base = waiter.until(lambda: (donefile.read(svc.root, "base") or [None])[-1], "the warm-up base", args.timeout,
                            0.2)
        waiter.until(lambda: (served_version(svc.transfer_url) or 0) >= base.id, f"cube rollout of {base.id}",
                     args.timeout, 0.1)
        start_serving(ns, work, group, svc, "criteo")
        waiter.until(lambda: (serving_version(svc.serving_url) or 0) >= base.id, "serving on the base", 600, 0.1)
        print(f"base {base.id}: {base.count} rows served {time.monotonic() - landed[0]:.0f} s after its partition "
              "landed", flush=True)
        eval_rows = work / "eval.txt"
        with open(Path(parts[0].location(str(root))) / "part-00000") as f, open(eval_rows, "w") as out:
            out.writelines(ln for _, ln in zip(range(2000), f))
        client = start_client(work, group, "client", svc.serving_url, eval_rows, "criteo", 2, 1,
                              ["--until-file", str(work / "client.stop"), "--rate", str(args.client_rate)])
        time.sleep(2.0)
        servers = dict(svc.cube.servers)
        start_rss = {k: rss_mib(r.proc.pid, "VmRSS") for k, r in servers.items()}
        hwm_reset = all(_reset_peak(r.proc.pid) for r in servers.values())
        follow = ServedLog(svc.serving_url, servers)
        follow.thread.start()
        first = time.monotonic()
        for t in range(1, n + 1):
            time.sleep(max(0.0, first + (t - 1) * args.land_every_s - time.monotonic()))
            landed[t] = land(parts[t])
            print(f"[{landed[t] - first:6.1f} s] partition {parts[t]} landed", flush=True)
        last_end = parts[n].end.timestamp()

        def fresh_enough():
            for p in parts[1:]:  # the figures assume a normal stream: every partition served
                marker = Path(partition_stats.marker_location(p.location(str(root))))
                if marker.exists():
                    raise RuntimeError(f"partition {p} was quarantined by the data gate ({marker}: "
                                       f"{json.loads(marker.read_text()).get('anomalies')}); the figures assume "
                                       "every partition is served (partitions of a few hundred rows make noisy "
                                       "histograms: raise --rows-per-hour)")
            recs = {r.id: r for k in ("base", "patch") for r in donefile.read(svc.root, k)}
            v = follow.changes[-1][1] if follow.changes else None
            return v is not None and v in recs and (recs[v].data_end or 0) >= last_end

        waiter.until(fresh_enough, f"serving a version trained through {parts[n]}", args.timeout, 0.2)
        time.sleep(1.0)
        follow.stop.set()
        follow.thread.join(5)
        failed = _stop_client(group, client, work / "client.stop")
        end_rss = {k: rss_mib(r.proc.pid, "VmRSS") for k, r in servers.items()}
        serving_rss = {k: (start_rss[k], end_rss[k]) for k in servers}
        peak = {k: rss_mib(r.proc.pid, "VmHWM") if hwm_reset else follow.rss_max.get(k, 0.0)
                for k, r in servers.items()}
        import requests

        history = requests.get(f"{svc.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
        group.stop(trainer)
        group.roles.remove(trainer)
    steps = _trainer_log(work / "logs" / "train" / "trainer-0.log")
    return report(args, svc, parts, landed, follow, history, steps, serving_rss, peak, failed, rows, work)


def report(args, svc, parts, landed, follow, history, steps, serving_rss, peak, failed, rows, work) -> int:
    """Prints the per-partition table, where the time goes and the ``fresh`` line."""
    recs = {r.id: r for k in ("base", "patch") for r in donefile.read(svc.root, k)}
    data_end = {v: r.data_end or 0 for v, r in recs.items()}
    done = {h["version"]: h for h in history if h.get("status") == "finished"}
    out = []
    print(f"\n{'partition':>14} {'stage s':>8} {'train s':>8} {'export s':>9} {'served by':>11} {'coalesced':>9} "
          f"{'rollout s':>9} {'landed->served s':>16}")
    for t in range(1, len(parts)):
        p = parts[t]
        at = follow.served_at(data_end, p.end.timestamp())
        v = next((v for _, v in follow.changes if data_end.get(v, -1) >= p.end.timestamp()), None)
        h = done.get(v, {})
        st = steps.get(str(p), {})
        row = {"partition": str(p), "stage_s": st.get("stage"), "train_s": st.get("train"),
               "export_s": st.get("export"), "version": v,
               "coalesced": len(h.get("coalesced") or []), "rollout_s": h.get("seconds"),
               "landed_to_served_s": None if at is None else round(at - landed[t], 2)}
        out.append(row)
        f = lambda x: f"{x:.2f}" if isinstance(x, (int, float)) else "n/a"  # noqa: E731
        print(f"{row['partition']:>14} {f(row['stage_s']):>8} {f(row['train_s']):>8} {f(row['export_s']):>9} {str(v):>11} "
              f"{row['coalesced']:>9} {f(row['rollout_s']):>9} {f(row['landed_to_served_s']):>16}")
    patches = [h for h in done.values() if h.get("mode") == "delta"]
    phases = {}
    for h in patches:
        for k, s in (h.get("phases") or {}).items():
            phases.setdefault(k, []).append(s)
    l2s = [r["landed_to_served_s"] for r in out]
    print("where the time goes (p50 per partition or rollout): stage {:.2f} s, train {:.2f} s, export {:.2f} s, "
          "rollout {:.2f} s ({})".format(_pct([r["stage_s"] for r in out], 50), _pct([r["train_s"] for r in out], 50),
                                       _pct([r["export_s"] for r in out], 50),
                        _pct([h.get("seconds") for h in patches], 50),
                        ", ".join(f"{k} {_pct(v, 50):.2f}" for k, v in phases.items())))
    print(f"rollouts: {len(patches)} patch rollouts for {len(out)} partitions, "
          f"{sum(len(h.get('coalesced') or []) for h in patches)} patches coalesced; cube RSS serving "
          + ", ".join(f"{k}: {serving_rss[k][0]:.0f} at the base, {serving_rss[k][1]:.0f} at the end, "
                      f"peak {peak[k]:.0f} MiB" for k in sorted(serving_rss)))
    served = follow.changes[-1][1] if follow.changes else None
    chain = [v for v in sorted(recs) if served in recs and v <= served and recs[v].key == recs[served].key]
    keys = np.unique(np.concatenate([_keys(svc.root, v) for v in chain])) if chain else []
    # over the RSS serving the table the patches made (it grows with their new keys)
    ratio = max((peak[k] / serving_rss[k][1] for k in serving_rss if serving_rss[k][1] > 0), default=float("nan"))
    patch_rows = [recs[v].count for v in recs if recs[v].key != v]
    (work / "bench-fresh.json").write_text(json.dumps({"partitions": out, "history": history,
                                                       "serving_rss": {str(k): v for k, v in serving_rss.items()},
                                                       "peak_rss": {str(k): v for k, v in peak.items()}}, indent=1))
    print(f"(land every {args.land_every_s} s; details: {work / 'bench-fresh.json'})")
    print(f"fresh partition_s=60 partitions={len(out)} table_rows={len(keys)} rows_per_hour={rows * 60} "
          f"patch_rows_p50={int(_pct(patch_rows, 50)) if patch_rows else 0} "
          f"rollout_s_p50={_pct([h.get('seconds') for h in patches], 50):.2f} "
          f"landed_to_served_s_p50={_pct(l2s, 50):.2f} landed_to_served_s_p99={_pct(l2s, 99):.2f} "
          f"cube_rss_patch_ratio={ratio:.2f} failed_requests={failed}", flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--partitions", type=int, default=30, help="one-minute partitions after the warm-up")
    ap.add_argument("--rows-per-hour", type=int, default=1_000_000, help="rows per hour (/60 per partition)")
    ap.add_argument("--warmup-rows", type=int, default=245_000,
                    help="rows of the warm-up partition 0, 26 distinct feasigns each (its base is the table the "
                         "patches apply to)")
    ap.add_argument("--table-scale", type=float, default=1.0, help="the generator's big vocabularies x this")
    ap.add_argument("--land-every-s", type=float, default=10.0,
                    help="seconds between two partitions landing (at most 60: never slower than real time)")
    add_run_args(ap, timeout_s=1800.0)
    args = ap.parse_args()
    if args.partitions < 1 or args.rows_per_hour < 60 or args.warmup_rows < 1:
        ap.error("--partitions >= 1, --rows-per-hour >= 60 and --warmup-rows >= 1")
    if not 0 < args.land_every_s <= 60:
        ap.error("--land-every-s: more than 0 and at most 60 (a one-minute partition never lands slower than "
                 "real time)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
