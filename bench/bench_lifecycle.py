"""The feature lifecycle's settings against what they cost and save: AUC against table size,
on the long-tail generator (``runtime.trainer.lifecycle``; the defaults of
``--feature-min-count`` / ``--feature-ttl-hours`` / ``--feature-count-half-life-hours`` come
from this table).

``--hours`` hourly partitions of ``--rows-per-hour`` long-tail rows (``data generate
--shape long-tail``; reused from ``--data`` when given) are trained by the continuous job
(1 pserver, 2 trainers, no cube: the parameter servers' table and the rows a version would
publish are what is compared), once per setting of ``--settings`` (``min_count:ttl_hours``
or ``min_count:ttl_hours:half_life_hours``, comma-separated; ``1:0`` is the lifecycle off).
Per setting: the next-hour AUC (trainer 0's model on each partition before training on it,
the mean over the last ``--auc-hours``), the parameter servers' rows at the end (the
checkpoint taken after the last partition: every row, admitted or not), the served table
at the end (the keys the versions hold: admitted feasigns), the shrink points' seconds and
the job's wall time. The feasigns fed within each setting's time to live are counted from
the data. Last line per setting::

    lifecycle min_count=<n> ttl_hours=<h> half_life_hours=<h> auc_mean=<x> auc_delta_vs_off=<x>
    ps_rows_end=<n> served_rows_end=<n> active_ttl=<n> shrink_s_p50=<s> wall_s=<s>

Usage: ``python bench/bench_lifecycle.py [--hours 24 --rows-per-hour 300000 --settings 1:0,2:0,2:12,3:12]``.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import proc  # noqa: E402
from runtime.formats import partitions  # noqa: E402
from runtime.formats.train_result import SUMMARY, TrainResult  # noqa: E402

START = "20261120/00"


def parse_settings(text: str) -> list[tuple[int, float, float]]:
    """``"1:0,2:12:24"`` -> ``[(1, 0.0, 0.0), (2, 12.0, 24.0)]``. Raises ``ValueError``
    naming the bad item."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            out.append((int(parts[0]), float(parts[1]), float(parts[2]) if len(parts) == 3 else 0.0))
        except ValueError:
            raise ValueError(f"--settings {item!r}: expected min_count:ttl_hours[:half_life_hours]") from None
    return out


def distinct_feasigns(root: Path, hours: list[partitions.Partition]) -> int:
    """How many distinct feasigns the partitions ``hours`` under ``root`` hold."""
    from runtime.trainer import readers
    from runtime.trainer.dataset import distinct

    seen = np.zeros(0, np.uint64)
    for h in hours:
        f = readers.read_all(partitions.files(str(root), h)).feasigns.ravel()
        seen = distinct(np.concatenate([seen, f[f != 0]]))
    return int(len(seen))


def checkpoint_rows(state: Path) -> int:
    """Rows of the sparse table in the last checkpoint under ``state`` (its ``000`` part files)."""
    n = 0
    for path in (state / "checkpoints").glob("*/000/part-*"):
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            n += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    return n


def run_setting(args, data: Path, work: Path, setting: tuple[int, float, float]) -> dict:
    """One continuous job over every partition with ``setting``; its figures (module docstring)."""
    min_count, ttl, half = setting
    run = work / f"run-{min_count}-{ttl:g}-{half:g}"
    shutil.rmtree(run, ignore_errors=True)
    end = partitions.Hour.parse(START).next(args.hours - 1)
    cmd = proc.self_command() + [
        "train", "--local-cluster", "--pservers", "1", "--trainers", "2", "--mode", "continuous",
        "--data-root", str(data), "--start-hour", START, "--end-hour", str(end), "--poll-seconds", "0.2",
        "--state-dir", str(run / "state"), "--table-dir", str(run / "table"), "--log-dir", str(run / "logs"),
        "--checkpoint-every-minutes", str(60 * args.hours), "--base-every-minutes", str(60 * args.base_every),
        "--feature-min-count", str(min_count), "--feature-ttl-hours", str(ttl),
        "--feature-count-half-life-hours", str(half), "--shrink-every-minutes", str(args.shrink_every_minutes)]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    wall = time.monotonic() - t0
    rec = TrainResult.find(r.stdout, SUMMARY, source="train stdout")
    if r.returncode != 0 or rec is None:
        raise RuntimeError(f"setting {setting}: train exited {r.returncode}\n{r.stderr[-3000:]}")
    rec = rec.to_dict()
    aucs = [p["auc_before"] for p in rec["partitions"] if p.get("auc_before") is not None]
    log = (run / "logs" / "trainer-0.log").read_text(errors="replace")
    served = [int(x) for x in re.findall(r"the served table: (\d+) keys", log)]
    shrink = [p["shrink_seconds"] for p in rec["partitions"] if p.get("shrink_seconds") is not None]
    out = {"min_count": min_count, "ttl_hours": ttl, "half_life_hours": half,
           "auc_mean": float(np.mean(aucs[-args.auc_hours:])), "aucs": aucs,
           "ps_rows_end": checkpoint_rows(run / "state"), "served_rows_end": served[-1] if served else None,
           "table_rows": [p.get("table_rows") for p in rec["partitions"]],
           "shrink_s_p50": float(np.median(shrink)) if shrink else 0.0, "wall_s": round(wall, 1)}
    if not args.keep:
        shutil.rmtree(run, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--hours", type=int, default=24, help="hourly partitions")
    ap.add_argument("--rows-per-hour", type=int, default=300_000, help="rows per partition")
    ap.add_argument("--settings", default="1:0,2:0,2:12,3:12,2:6", help="min_count:ttl_hours[:half_life_hours], ...")
    ap.add_argument("--auc-hours", type=int, default=8, help="the AUC is the mean of the last N hours")
    ap.add_argument("--base-every", type=int, default=24, help="hours between two bases")
    ap.add_argument("--shrink-every-minutes", type=int, default=60, help="the job's shrink period (data minutes)")
    ap.add_argument("--data", help="partitions to reuse (ROOT/YYYYMMDD/HH/), else generated (seed 5)")
    ap.add_argument("--workdir", help="scratch directory (default: a temp dir, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per setting")
    args = ap.parse_args()
    settings = parse_settings(args.settings)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_lifecycle_"))
    data = Path(args.data) if args.data else work / "hours"
    if not args.data:
        from runtime.trainer import generator

        generator.generate_hours(data, args.hours, START, args.rows_per_hour, seed=5, shape="long-tail")
    hs = [partitions.Hour.parse(START).next(i) for i in range(args.hours)]
    results = []
    for s in settings:
        res = run_setting(args, data, work, s)
        ttl = int(np.ceil(s[1])) or args.hours
        res["active_ttl"] = distinct_feasigns(data, hs[-ttl:])
        results.append(res)
        print(json.dumps(res), flush=True)
    off = next((r for r in results if r["min_count"] == 1 and r["ttl_hours"] == 0), None)
    print(f"\n{'min count':>9} {'ttl h':>6} {'half-life h':>11} {'AUC':>7} {'vs off':>8} {'ps rows':>10} "
          f"{'served rows':>11} {'fed in ttl':>10} {'shrink s':>8} {'wall s':>7}")
    for r in results:
        d = r["auc_mean"] - off["auc_mean"] if off else float("nan")
        print(f"{r['min_count']:>9} {r['ttl_hours']:>6g} {r['half_life_hours']:>11g} {r['auc_mean']:>7.4f} "
              f"{d:>+8.4f} {r['ps_rows_end']:>10} {r['served_rows_end'] or 0:>11} {r['active_ttl']:>10} "
              f"{r['shrink_s_p50']:>8.1f} {r['wall_s']:>7.0f}")
    for r in results:
        d = r["auc_mean"] - off["auc_mean"] if off else float("nan")
        print(f"lifecycle min_count={r['min_count']} ttl_hours={r['ttl_hours']:g} half_life_hours={r['half_life_hours']:g} "
              f"auc_mean={r['auc_mean']:.4f} auc_delta_vs_off={d:+.4f} ps_rows_end={r['ps_rows_end']} "
              f"served_rows_end={r['served_rows_end'] or 0} active_ttl={r['active_ttl']} "
              f"shrink_s_p50={r['shrink_s_p50']:.1f} wall_s={r['wall_s']:.0f}", flush=True)
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
