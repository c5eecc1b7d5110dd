"""Days, not hours: the long-tail stream at compressed time through the whole pipeline,
once with the feature lifecycle on (the trainer's defaults: ``runtime.trainer.lifecycle``)
and once off (``--feature-min-count 1 --feature-ttl-hours 0``), on the same data.

1. ``--hours`` hourly partitions of ``--rows-per-hour`` rows of the long-tail generator
   (``data generate --shape long-tail``, seed 5; reused from ``--data`` when given);
2. per run: file server, cube (2 shards x 2 replicas), transfer and serving
   (``runtime.local.services``), the continuous job (1 pserver, 2 trainers; a base every
   ``--base-every`` hours, a checkpoint every 24); partition ``t + 1`` lands as soon as the
   version trained on ``t`` is served and has scored partition ``t + 1`` (``--score-rows``
   rows through serving: the served AUC on the next hour), so the stream runs as fast as
   the pipeline takes it and never slower than real time; a client sends throughout
   (``--client-rate`` requests/s, batch 1; its failed requests are counted);
3. the parameter servers' rows after the first day and at the end (every row of the
   checkpoints taken then, admitted or not), the served table (the cube's keys), the
   resident memory of every role at the end of each day, and the feasigns the data fed
   within the last ``ttl`` hours (every row of those partitions, counted from the data).

Last line::

    soak hours=<n> rows_per_hour=<n> ttl_hours=<n> table_rows_h24=<n> table_rows_end=<n>
    active_ttl=<n> table_rows_end_off=<n> pserver_rss_mib_end=<n> cube_rss_mib_end=<n>
    rss_growth_day2_max=<x> auc_delta_vs_off=<x> failed_requests=<n>

``rss_growth_day2_max``: the largest ratio, over the roles of the lifecycle run (serving with
its workers, each cube server and agent, the transfer, the file server, the pserver), of the
resident memory after the last hour (the pservers': their last sample while the job runs,
after the hour before the last) to after the 24th; ``auc_delta_vs_off``: the served AUC
on the next hour, on minus off, averaged over the hours of the second day;
``failed_requests``: both runs'.

Usage: ``python bench/bench_soak.py [--hours 48 --rows-per-hour 300000]``;
``--hours 6 --rows-per-hour 20000 --day 3``: a quick try (a "day" of 3 hours).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_lifecycle import START, distinct_feasigns  # noqa: E402
from bench.bench_online import SERVICES, continuous_job, descendants, pserver_pids  # noqa: E402
from bench.bench_rollout import rss_mib  # noqa: E402
from runtime import proc  # noqa: E402
from runtime.formats import donefile, partitions  # noqa: E402

OFF = ["--feature-min-count", "1", "--feature-ttl-hours", "0", "--feature-count-half-life-hours", "0"]


def role_rss(group, train_pid: int) -> dict[str, float]:
    """Resident MiB of every long-running role of ``group``: a role with its children
    (serving's workers) summed; the pservers under the training job's process."""
    out = {}
    for r in list(group.roles):
        if r.name in ("train",) or r.name.startswith("client") or r.proc.poll() is not None:
            continue
        out[r.name] = rss_mib(r.proc.pid, "VmRSS") + sum(rss_mib(p, "VmRSS") for p in descendants(r.proc.pid))
    for i, p in enumerate(pserver_pids(train_pid)):
        out[f"pserver-{i}"] = rss_mib(p, "VmRSS")
    return out


def checkpoint_rows(state: Path, name: str) -> int:
    """Rows of the sparse table in checkpoint ``name`` under ``state`` (text lines of its
    ``000`` part files)."""
    n = 0
    for path in (state / "checkpoints" / name / "000").glob("part-*"):
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            n += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    return n


def run(args, data: Path, work: Path, label: str, flags: list[str]) -> dict:
    """One run of the pipeline over every partition (module docstring); its figures."""
    from runtime.formats.dict_info import served_version
    from runtime.local.online import _served_auc
    from runtime.local.services import start_client, start_serving, start_services
    from runtime.local.status import Waiter, serving_version, summary_line
    from runtime.trainer.online_state import OnlineState, checkpoint_name

    H, day = args.hours, args.day
    hs = [partitions.Hour.parse(START).next(i) for i in range(H)]
    hours_root = work / "hours"
    hours_root.mkdir(parents=True)
    evals = []
    for h in hs:  # the rows each hour is scored on (the first of its partition)
        dst = work / "eval" / f"{str(h).replace('/', '-')}.txt"
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(partitions.files(str(data), h)[0]) as f, open(dst, "w") as out:
            out.writelines(ln for _, ln in zip(range(args.score_rows), f))
        evals.append(dst)
    rec: dict = {"label": label, "hours": [], "failed": 0}
    with proc.ProcessGroup(work / "logs", grace_s=10.0) as group:
        waiter = Waiter(group, args.timeout)
        svc = start_services(SERVICES, work, group)
        argv = continuous_job(work, svc, hours_root, "--start-hour", START, "--end-hour", str(hs[-1]), "--poll-seconds",
                              "0.2", "--base-every-minutes", str(60 * args.base_every),
                              "--checkpoint-every-minutes", str(60 * day), *flags)
        trainer = group.start("train", argv, expect_exit=True)
        state_dir = work / "train-state"

        def land(h):
            dst = Path(h.location(str(hours_root)))
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(h.location(str(data)), dst.with_name(dst.name + ".tmp"))
            os.rename(dst.with_name(dst.name + ".tmp"), dst)  # complete (its _SUCCESS inside) at once

        def newer(after: int):
            recs = [r for k in ("base", "patch") for r in donefile.read(svc.root, k) if r.id > after]
            return min(recs, key=lambda r: r.id) if recs else None

        last, bg, stop_file = 0, None, work / "client-bg.stop"
        land(hs[0])
        for t, h in enumerate(hs):
            v = waiter.until(lambda: newer(last), f"the version trained on {h}", args.timeout, 0.1)
            last = v.id
            waiter.until(lambda: (served_version(svc.transfer_url) or 0) >= v.id, f"rollout of {v.id}", 1800, 0.1)
            if bg is None:
                start_serving(SERVICES, work, group, svc, "criteo")
            waiter.until(lambda: (serving_version(svc.serving_url) or 0) >= v.id, f"serving on {v.id}", 600, 0.1)
            if bg is None:
                bg = start_client(work, group, "client-bg", svc.serving_url, evals[0], "criteo", 1, 1,
                                  ["--until-file", str(stop_file), "--rate", str(args.client_rate)])
            row = {"hour": str(h), "version": v.id, "kind": "base" if v.key == v.id else "patch", "rows": v.count}
            if t + 1 < H:
                c = start_client(work, group, f"client-{t + 1}", svc.serving_url, evals[t + 1], "criteo", 2, 64)
                waiter.wait([c.role], f"scoring {hs[t + 1]}")
                row["served_auc_next"], _ = _served_auc(c.predictions, v.id)
                rec["failed"] += c.result()["failed_requests"]
                group.roles.remove(c.role)
                c.predictions.unlink()
            if (t + 1) % day == 0:  # the end of a "day": the checkpoint of its last hour, every role's memory
                name = checkpoint_name(hs[t].next())
                waiter.until(lambda: (OnlineState.load(str(state_dir)) or OnlineState.model_construct(
                    checkpoint_hour=None)).checkpoint_hour == str(hs[t].next()), f"checkpoint {name}", 1800, 0.5)
                row["ps_rows"] = checkpoint_rows(state_dir, name)
                row["rss"] = role_rss(group, trainer.proc.pid)
                row["cube_keys"] = sum(_cube_keys(svc))
            # the job exits after the last partition: the pservers' memory is taken while it runs
            live = {f"pserver-{i}": rss_mib(p, "VmRSS") for i, p in enumerate(pserver_pids(trainer.proc.pid))}
            if any(live.values()):
                rec["pserver_rss_last"] = {"hour": h, **live}
            rec["hours"].append(row)
            print(f"[{label}] {h}: {row['kind']} {v.id} ({v.count} rows), served AUC next "
                  f"{row.get('served_auc_next', float('nan')):.4f}"
                  + (f", pserver rows {row['ps_rows']}, cube keys {row['cube_keys']}" if "ps_rows" in row else ""),
                  flush=True)
            if t + 1 < H:
                land(hs[t + 1])
        stop_file.write_text("stop")
        bg.role.proc.wait(timeout=120)
        group.roles.remove(bg.role)
        rec["failed"] += int(bg.result()["failed_requests"])
        waiter.wait([trainer], "continuous training")
        rec["trainer"] = summary_line(trainer.log_path)
    return rec


def _cube_keys(svc) -> list[int]:
    """Keys each cube shard serves (its first replica's status)."""
    import requests

    return [int(requests.get(f"{http}/status", timeout=10).json()["keys"])
            for (s, r), (_, http, _) in sorted(svc.cube.layout.addresses.items()) if r == 0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--hours", type=int, default=48, help="hourly partitions (at least two days)")
    ap.add_argument("--rows-per-hour", type=int, default=300_000, help="rows per partition")
    ap.add_argument("--day", type=int, default=24, help="hours of a simulated day (the checkpoint cadence)")
    ap.add_argument("--base-every", type=int, default=24, help="hours between two bases")
    ap.add_argument("--score-rows", type=int, default=5000, help="rows of the next hour scored through serving")
    ap.add_argument("--client-rate", type=float, default=20.0, help="background client requests/s (batch 1)")
    ap.add_argument("--data", help="partitions to reuse (ROOT/YYYYMMDD/HH/), else generated (seed 5)")
    ap.add_argument("--timeout", type=float, default=6 * 3600.0, help="seconds per run")
    ap.add_argument("--workdir", help="scratch directory (default: a temp dir, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    if args.hours < 2 * args.day:
        ap.error("--hours must cover two days (2 x --day)")
    from runtime.trainer.config import FIELDS

    ttl = float(FIELDS["feature_ttl_hours"].default)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_soak_"))
    data = Path(args.data) if args.data else work / "data"
    if not args.data:
        from runtime.trainer import generator

        generator.generate_hours(data, args.hours, START, args.rows_per_hour, seed=5, shape="long-tail")
    on = run(args, data, work / "on", "on", [])
    off = run(args, data, work / "off", "off", OFF)
    hs = [partitions.Hour.parse(START).next(i) for i in range(args.hours)]
    active = distinct_feasigns(data, hs[-int(np.ceil(ttl)):] if ttl else hs)
    d1, d2 = on["hours"][args.day - 1], on["hours"][2 * args.day - 1]
    end, end_off = on["hours"][-1], off["hours"][-1]
    last = {k: v for k, v in on.get("pserver_rss_last", {}).items() if k != "hour"}
    end_rss = {**last, **end["rss"]}  # the pservers' last sample (the job has exited at the end)
    growth = {k: end_rss[k] / d1["rss"][k] for k in d1["rss"] if k in end_rss and d1["rss"][k] > 0}
    second = range(args.day, args.hours - 1)  # the hours of day 2 that have a next hour
    delta = [on["hours"][t]["served_auc_next"] - off["hours"][t]["served_auc_next"] for t in second]
    (work / "bench-soak.json").write_text(json.dumps({"on": on, "off": off, "active_ttl": active,
                                                      "rss_growth_day2": growth}, indent=1))
    print("\nper hour (on | off): served AUC on the next hour; on: the pserver rows after a shrink point")
    shrunk = {p["hour"]: p.get("table_rows") for p in on["trainer"].get("partitions", [])}
    for t in range(args.hours - 1):
        a, b = on["hours"][t], off["hours"][t]
        print(f"{a['hour']:>12} {a['served_auc_next']:.4f} | {b['served_auc_next']:.4f} {shrunk.get(a['hour']) or '':>10}")
    print("rss MiB day 1 -> day 2 (on): " + ", ".join(f"{k} {d1['rss'][k]:.0f}->{end_rss[k]:.0f}"
                                                     for k in sorted(growth)))
    print(f"cube keys (on): day 1 {d1['cube_keys']}, end {end['cube_keys']}; (off): end {end_off['cube_keys']}")
    print(f"(details: {work / 'bench-soak.json'})")
    pserver = max((v for k, v in end_rss.items() if k.startswith("pserver")), default=0.0)
    cube = max((v for k, v in end["rss"].items() if k.startswith("cube-server")), default=0.0)
    print(f"soak hours={args.hours} rows_per_hour={args.rows_per_hour} ttl_hours={ttl:g} "
          f"table_rows_h24={d1['ps_rows']} table_rows_end={d2['ps_rows']} active_ttl={active} "
          f"table_rows_end_off={end_off['ps_rows']} pserver_rss_mib_end={pserver:.0f} cube_rss_mib_end={cube:.0f} "
          f"rss_growth_day2_max={max(growth.values()):.3f} auc_delta_vs_off={float(np.mean(delta)):+.4f} "
          f"failed_requests={on['failed'] + off['failed']}", flush=True)
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
