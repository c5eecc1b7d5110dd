"""The online loop at production shape: hourly partitions landing on their own schedule, a
continuous job (1 pserver, 2 trainers) exporting a version per hour, the cube (2 shards x
2 replicas) rolling each out, serving switching to it, a client sending throughout.

1. ``--hours`` hourly partitions of ``--rows-per-hour`` rows at the generator's production
   shape (``runtime.trainer.generator``, ``--shape long-tail``; ``--table-scale`` 0.2 gives
   a 5x smaller table with the same hours) are generated into ``upstream/`` (not timed);
2. file server, cube, transfer (``runtime.local.services``), ``train --local-cluster --mode
   continuous`` following ``hours/``; partition ``t`` lands (a directory rename, ``_SUCCESS``
   inside) at ``t x --land-every-s`` seconds after the first, whatever the job is doing;
3. serving starts on the first version; a client (``--client-rate`` requests/s, batch 1) runs
   from then on, a new one per version served, so failed requests are counted per hour.

Per hour: train seconds (the pass), stage seconds (trainer 0's shard parsed and staged),
patch rows, patch export seconds (rows cut + publish, each given; a checkpoint, when one is
due, comes after the publish and is given apart: ``--checkpoint-every``), rollout
seconds (donefile line -> every cube instance on the version), landed-to-served seconds
(the partition's landing -> serving answering with the version trained on it), failed
requests. RSS: the pserver's and the largest cube server's peak (``VmHWM``, MiB). Last line:
``online hours=<n> table_rows=<n> rows_per_hour=<n> patch_rows_p50=<n> patch_export_s_p50=<s>
rollout_s_p50=<s> landed_to_served_s_p50=<s> landed_to_served_s_max=<s> failed_requests=<n>
gate_s_p50=<s> pserver_rss_mib=<n> cube_rss_mib=<n>`` (the p50s over the patches; landed-to-served over
every hour; ``gate_s_p50``: the data gate's statistics and checks per partition on trainer 0,
``runtime.trainer.data_gate``).

``--rollout-check``: instead, the rollout cost of patches of 10k, 100k and 1M rows on a cube
(2 x 2) holding a ``--keys`` (10M) key base: build, ship, load seconds per patch (the
transfer's phases) and the servers' RSS after each.

Usage: ``python bench/bench_online.py [--hours 4 --rows-per-hour 1000000 --table-scale 1]``,
``python bench/bench_online.py --rollout-check [--keys 10000000]``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_rollout import rss_mib  # noqa: E402
from runtime import proc  # noqa: E402
from runtime.formats import donefile, partitions  # noqa: E402

START = "20261120/00"


def descendants(pid: int) -> list[int]:
    """The PIDs of every process below ``pid`` (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pserver_pids(train_pid: int) -> list[int]:
    """The pservers a ``train --local-cluster`` process started (``TRAINING_ROLE=PSERVER``)."""
    out = []
    for p in descendants(train_pid):
        try:
            if b"TRAINING_ROLE=PSERVER" in Path(f"/proc/{p}/environ").read_bytes().split(b"\0"):
                out.append(p)
        except OSError:
            pass
    return out


def _p50(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else float("nan")


def _stage_seconds(log: Path) -> list[float]:
    """Trainer 0's "N rows staged in X s, loaded in Y s" per partition: X + Y."""
    pat = re.compile(r"rows staged in ([\d.]+) s, loaded in ([\d.]+) s")
    return [float(a) + float(b) for a, b in pat.findall(log.read_text(errors="replace"))] if log.exists() else []


#: the local services of the online benches: cube 2 shards x 2 replicas, serving 1 worker x 2 threads
SERVICES = SimpleNamespace(cube_shards=2, cube_replicas=2, model_root=None, serving_workers=1, serving_threads=2)


def continuous_job(work: Path, svc, data_root: Path, *extra: str) -> list[str]:
    """argv of the online benches' continuous PS job (the local cluster: 1 pserver, 2
    trainers) on the partitions under ``data_root``, its state, table and logs under
    ``work``, exporting to ``svc``'s file server (``runtime.local.services.start_services``);
    ``extra``: the bench's own ``train`` flags (start, cadences, polling), read into the job's
    ``TrainConfig`` by the trainer's own parser, whose command line ``role_specs.train_argv``
    writes."""
    from runtime import role_specs
    from runtime.cli import build_parser
    from runtime.trainer.config import config_from_args

    cfg = config_from_args(build_parser().parse_args([
        "train", "--mode", "continuous", "--data-root", str(data_root), "--state-dir", str(work / "train-state"),
        "--table-dir", str(work / "table"), "--output", svc.root_url, "--upload-token-file", str(svc.token_file),
        *extra]))
    launch = ["--local-cluster", "--pservers", "1", "--trainers", "2", "--log-dir", str(work / "logs" / "train")]
    return proc.self_command() + role_specs.train_argv(cfg, launch)


def run_online(args) -> int:
    from runtime.formats.dict_info import served_version
    from runtime.local.services import start_client, start_serving, start_services
    from runtime.local.status import Waiter, serving_version, summary_line
    from runtime.trainer import generator

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_online_"))
    H = args.hours
    hs = [partitions.Hour.parse(START).next(i) for i in range(H)]
    upstream, hours_root = work / "upstream", work / "hours"
    t0 = time.monotonic()
    sig = generator.generate_hours(upstream, H, START, args.rows_per_hour, seed=args.seed, shape="long-tail",
                                   scale=args.table_scale)
    print(f"generated {H} hours x {args.rows_per_hour} rows (long-tail, table scale {args.table_scale}, vocab "
          f"{max(sig.vocab_sizes)} max) in {time.monotonic() - t0:.0f} s; true-logit AUC "
          + " ".join(f"{h.true_logit_auc:.4f}" for h in sig.hours), flush=True)
    hours_root.mkdir(parents=True, exist_ok=True)
    ns = SERVICES
    landed: dict[int, float] = {}
    failed_by_hour: dict[int, int] = {}
    with proc.ProcessGroup(work / "logs", grace_s=10.0) as group:
        waiter = Waiter(group, args.timeout)
        svc = start_services(ns, work, group)
        argv = continuous_job(work, svc, hours_root, "--start-hour", START, "--end-hour", str(hs[-1]), "--poll-seconds",
                              "0.2", "--base-every-minutes", str(60 * args.base_every),
                              "--checkpoint-every-minutes", str(60 * args.checkpoint_every))
        trainer = group.start("train", argv, expect_exit=True)

        def lander():
            first = time.monotonic()
            for t, h in enumerate(hs):
                time.sleep(max(0.0, first + t * args.land_every_s - time.monotonic()))
                dst = Path(h.location(str(hours_root)))
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.rename(h.location(str(upstream)), dst)  # complete (its _SUCCESS inside) at once
                landed[t] = time.monotonic()
                print(f"[{time.monotonic() - first:7.1f} s] partition {h} landed", flush=True)

        threading.Thread(target=lander, daemon=True).start()
        ps_hwm: dict[int, float] = {}
        cube_hwm: dict[tuple, float] = {}
        sampled = [0.0]

        def sample_rss():
            if time.monotonic() - sampled[0] < 1.0:
                return
            sampled[0] = time.monotonic()
            for p in pserver_pids(trainer.proc.pid):
                ps_hwm[p] = max(ps_hwm.get(p, 0.0), rss_mib(p, "VmHWM"))
            for key, role in svc.cube.servers.items():
                cube_hwm[key] = max(cube_hwm.get(key, 0.0), rss_mib(role.proc.pid, "VmHWM"))

        def version_seen(after: int):
            sample_rss()
            recs = [r for k in ("base", "patch") for r in donefile.read(svc.root, k) if r.id > after]
            return min(recs, key=lambda r: r.id) if recs else None

        rows: list[dict] = []
        client = None
        last = 0
        for t, h in enumerate(hs):
            rec = waiter.until(lambda: version_seen(last), f"the version trained on {h}", args.timeout, 0.05)
            last, t_line = rec.id, time.monotonic()
            waiter.until(lambda: sample_rss() or (served_version(svc.transfer_url) or 0) >= rec.id,
                         f"cube rollout of {rec.id}", 600, 0.05)
            t_cube = time.monotonic()
            if client is None:
                start_serving(ns, work, group, svc, "criteo")
            waiter.until(lambda: (serving_version(svc.serving_url) or 0) >= rec.id, f"serving on {rec.id}", 600, 0.05)
            t_served = time.monotonic()
            if client is not None:
                failed_by_hour[t - 1] = _stop_client(group, client, work / f"client-{t - 1}.stop")
            eval_rows = work / "eval.txt"
            if not eval_rows.exists():
                with open(Path(hs[0].location(str(hours_root))) / "part-00000") as f, open(eval_rows, "w") as out:
                    out.writelines(ln for _, ln in zip(range(2000), f))
            client = start_client(work, group, f"client-{t}", svc.serving_url, eval_rows, "criteo", 2, 1,
                                  ["--until-file", str(work / f"client-{t}.stop"), "--rate", str(args.client_rate)])
            rows.append({"hour": str(h), "version": rec.id, "kind": "base" if rec.key == rec.id else "patch",
                         "rows": rec.count, "rollout_s": round(t_cube - t_line, 2),
                         "landed_to_served_s": round(t_served - landed[t], 2)})
            print(f"{h}: version {rec.id} ({rows[-1]['kind']}, {rec.count} rows) rolled out in "
                  f"{rows[-1]['rollout_s']:.1f} s, served {rows[-1]['landed_to_served_s']:.1f} s after landing",
                  flush=True)
        time.sleep(2.0)
        failed_by_hour[H - 1] = _stop_client(group, client, work / f"client-{H - 1}.stop")
        waiter.wait([trainer], "continuous training")
        sample_rss()
        trec = summary_line(trainer.log_path)
        keys = [np.unique(_version_keys(svc.root, r)) for r in rows]
        table_rows = int(len(np.unique(np.concatenate(keys)))) if keys else 0
    exports = trec.get("exports") or []
    parts = trec.get("partitions") or []
    stage = _stage_seconds(work / "logs" / "train" / "trainer-0.log")
    print(f"\n{'hour':>12} {'kind':>6} {'rows':>9} {'stage s':>8} {'train s':>8} {'export s':>9} {'(rows':>6} "
          f"{'ckpt':>6} {'publish)':>8} {'rollout s':>9} {'landed->served s':>16} {'failed':>6}")
    for t, r in enumerate(rows):
        e = exports[t] if t < len(exports) else {}
        p = parts[t] if t < len(parts) else {}
        r.update(train_s=p.get("seconds"), stage_s=stage[t] if t < len(stage) else None, export_s=e.get("seconds"),
                 export_rows_s=e.get("rows_seconds"), checkpoint_s=e.get("checkpoint_seconds"),
                 publish_s=e.get("publish_seconds"), failed=failed_by_hour.get(t, 0))
        f = lambda x: f"{x:.1f}" if isinstance(x, (int, float)) else "n/a"  # noqa: E731
        print(f"{r['hour']:>12} {r['kind']:>6} {r['rows']:>9} {f(r['stage_s']):>8} {f(r['train_s']):>8} "
              f"{f(r['export_s']):>9} {f(r['export_rows_s']):>6} {f(r['checkpoint_s']):>6} {f(r['publish_s']):>8} "
              f"{r['rollout_s']:>9.1f} {r['landed_to_served_s']:>16.1f} {r['failed']:>6}")
    patches = [r for r in rows if r["kind"] == "patch"] or rows
    l2s = [r["landed_to_served_s"] for r in rows]
    gate_s = [p["gate_seconds"] for p in parts if p.get("gate_seconds") is not None]  # the data gate, trainer 0
    (work / "bench-online.json").write_text(json.dumps({"hours": rows, "trainer": trec, "signal": sig.model_dump(mode="json")}, indent=1))
    print(f"(land every {args.land_every_s} s; details: {work / 'bench-online.json'})")
    print(f"online hours={H} table_rows={table_rows} rows_per_hour={args.rows_per_hour} "
          f"patch_rows_p50={int(_p50([r['rows'] for r in patches]))} "
          f"patch_export_s_p50={_p50([r['export_s'] for r in patches]):.2f} "
          f"rollout_s_p50={_p50([r['rollout_s'] for r in patches]):.2f} landed_to_served_s_p50={_p50(l2s):.2f} "
          f"landed_to_served_s_max={max(l2s):.2f} failed_requests={sum(failed_by_hour.values())} "
          f"gate_s_p50={_p50(gate_s):.3f} "
          f"pserver_rss_mib={int(max(ps_hwm.values(), default=0))} cube_rss_mib={int(max(cube_hwm.values(), default=0))}",
          flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _stop_client(group, client, stop_file: Path, timeout_s: float = 120.0) -> int:
    """Stops a client running with ``--until-file stop_file`` and returns its failed
    requests. A client exits 1 when a request failed: here that is a figure to report, not
    a failed role, so it is taken out of ``group`` before the group checks its roles."""
    stop_file.write_text("stop")
    client.role.proc.wait(timeout=timeout_s)
    group.roles.remove(client.role)
    return int(client.result()["failed_requests"])


def _version_keys(root: str, rec: dict) -> np.ndarray:
    """uint64[n]: the keys of one exported version's SequenceFiles."""
    from runtime.formats.seqfile import read_sequence_file

    d = Path(root) / "versions" / str(rec["version"]) / "sparse"
    return np.concatenate([read_sequence_file(str(p))[0] for p in sorted(d.glob("part-*"))] or
                          [np.zeros(0, np.uint64)])


def run_rollout_check(args) -> int:
    """Patches of 10k, 100k, 1M rows over a ``--keys`` base on a 2 x 2 cube (module docstring)."""
    import requests

    from runtime.local.cube import LocalCubeCluster
    from runtime.formats.seqfile_writer import write_sequence_file

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_online_rollout_"))
    dim, part = 9, 1 << 20
    rng = np.random.default_rng(args.seed)
    try:
        k = np.unique(rng.integers(1, 1 << 63, args.keys + args.keys // 100, dtype=np.uint64))[:args.keys]
        root = work / "root"

        def write(vid: int, keys: np.ndarray) -> None:
            d = root / "versions" / str(vid) / "sparse"
            d.mkdir(parents=True)
            for i, s in enumerate(range(0, len(keys), part)):
                kk = keys[s:s + part]
                write_sequence_file(d / f"part-{i:05d}", kk, rng.standard_normal((len(kk), dim)).astype(np.float32))

        vid = int(time.time())
        write(vid, k)
        with LocalCubeCluster(work / "run", root, shards=2, replicas=2, poll_interval_s=0.2,
                              start_timeout_s=120) as c:
            def rss():
                now = [rss_mib(r.proc.pid, "VmRSS") for r in c.servers.values()]
                return round(max(now)), round(sum(now))

            def roll(v: int, key: int, n: int, patch: bool) -> None:
                t0 = time.monotonic()
                c.publish_version(v, key, patch=patch, dim=dim, count=n)
                c.wait_version(v, timeout_s=900, poll_s=0.05)
                s = time.monotonic() - t0
                last = requests.get(f"{c.transfer_url}/dict/deploy/history", timeout=5).json()["history"][-1]
                big, total = rss()
                print(f"{'patch' if patch else 'base':>5} {n:>9} keys: {s:7.2f} s (phases {json.dumps(last.get('phases'))}); "
                      f"server RSS max {big} MiB, all 4 {total} MiB", flush=True)
                out.append((n, s, big))

            out: list = []
            roll(vid, vid, len(k), False)
            for i, n in enumerate((10_000, 100_000, 1_000_000)):
                pk = np.concatenate([k[rng.choice(len(k), min(n // 2, len(k)), replace=False)],
                                     rng.integers(1, 1 << 63, n - n // 2, dtype=np.uint64)])
                write(vid + 1 + i, np.unique(pk))
                roll(vid + 1 + i, vid, len(np.unique(pk)), True)
            hwm = max(rss_mib(r.proc.pid, "VmHWM") for r in c.servers.values())
        print("rollout_check base_keys={} base_s={:.2f} ".format(out[0][0], out[0][1])
              + " ".join(f"patch_{n}_s={s:.2f}" for n, s, _ in out[1:])
              + f" server_rss_mib={out[-1][2]} server_hwm_mib={int(hwm)}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def add_run_args(ap: argparse.ArgumentParser, timeout_s: float) -> None:
    """The options every online bench shares: the client's rate, the seed, the time limit
    (``timeout_s`` by default), the scratch directory and whether to keep it."""
    ap.add_argument("--client-rate", type=float, default=20.0, help="client requests/s (batch 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=timeout_s, help="give up after this many seconds")
    ap.add_argument("--workdir", help="scratch directory (default: a temp dir, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--hours", type=int, default=4, help="hourly partitions")
    ap.add_argument("--rows-per-hour", type=int, default=1_000_000, help="rows per partition")
    ap.add_argument("--table-scale", type=float, default=1.0, help="the generator's big vocabularies x this")
    ap.add_argument("--land-every-s", type=float, default=240.0, help="seconds between two partitions landing")
    ap.add_argument("--base-every", type=int, default=24, help="hours between two bases (the job's --base-every-minutes / 60)")
    ap.add_argument("--checkpoint-every", type=int, default=24,
                    help="hours between two checkpoints (the job's --checkpoint-every-minutes / 60; it also "
                         "checkpoints after the last hour)")
    add_run_args(ap, timeout_s=7200.0)
    ap.add_argument("--rollout-check", action="store_true", help="the 10M-key base patch rollout check instead")
    ap.add_argument("--keys", type=int, default=10_000_000, help="--rollout-check: keys in the base")
    args = ap.parse_args()
    if args.hours < 1 or args.rows_per_hour < 1:
        ap.error("--hours and --rows-per-hour must be >= 1")
    return run_rollout_check(args) if args.rollout_check else run_online(args)


if __name__ == "__main__":
    sys.exit(main())
