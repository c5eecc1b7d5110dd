"""The local pipeline (``elastic-ctr local``, what ``make demo`` runs).

Every role runs as its own process on 127.0.0.1, with the same ``elastic-ctr``
subcommands the pods run, supervised by ``runtime.proc.ProcessGroup`` (logs in
``runs/<timestamp>/logs/``; every process stopped by PID on exit, Ctrl-C or failure):

1. data: ``elastic-ctr data generate`` (seeded, known signal), or ``--data FILE...``
   (Criteo TSV, Criteo CSV with a header, or the slot format with ``--slot-file``),
   split into train (first 80 %) and test (last 20 %) rows;
2. file server (the version root, token-authenticated uploads);
3. cube: S shards x R replicas (``cube server`` + ``cube agent`` each) and the
   ``cube transfer`` watching the file server's donefile;
4. round 1: ``elastic-ctr train --local-cluster`` (P pservers, T trainers) exporting a
   version to the file server; the transfer rolls it out; ``serve`` loads it;
5. the demo client scores the test set (AUC of the served version) and measures
   latency/QPS at batch 1;
6. round 2: a second training run (generated data: on day 1 plus the next day's rows,
   ``train-day2.txt``) exports a new version while the client keeps sending;
   the transfer rolls it out and serving switches without a failed request;
7. the client scores the test set on the new version; a summary table, ending with
   ``demo: versions=<n> auc=<test AUC of the last version> failed_requests=<n> qps=<x> p99_ms=<y>``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

DESCRIPTION = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds the local pipeline's flags to ``p`` (sizes and counts)."""
    p.add_argument("--run-dir", default=None, help="where logs and data go")
    p.add_argument("--data", nargs="+", default=None,
                   help="use these rows instead of generated data (Criteo TSV/CSV or slot format)")
    p.add_argument("--format", choices=("auto", "criteo", "slot"), default="auto",
                   help="format of --data (default: detect)")
    p.add_argument("--slot-file", default=None, help="slot list for slot-format --data")
    # counts: the data, the training job, the topology and the demo client
    for flag, default, text in (
            ("--rows", 200_000, "generated training rows"),
            ("--test-rows", 20_000, "generated test rows"),
            ("--seed", 1, "data generator seed"),
            ("--epochs", None, "training passes per round (default: the trainer's)"),
            ("--epochs-round2", None, "passes of the second round (default: half of --epochs, at least 1, over the "
                                      "two days of generated data, so both rounds train on as many examples; with "
                                      "--data: --epochs)"),
            ("--batch-size-train", None, "training batch size (default: the trainer's)"),
            ("--embedding-dim", None, "embedding width (default: the trainer's)"),
            ("--pservers", 1, "parameter servers"),
            ("--trainers", 2, "trainers"),
            ("--cube-shards", 2, "cube shards (the stack key cubeShards)"),
            ("--cube-replicas", 2, "cube replicas per shard (the stack key cubeReplicas)"),
            ("--serving-workers", 2, "serving worker processes"),
            ("--serving-threads", 2, "serving threads per worker"),
            ("--concurrency", 4, "demo client workers"),
            ("--batch-size", 1, "client batch size of the latency run"),
            ("--score-batch-size", 64, "client batch size when scoring the whole test set"),
            ("--latency-requests", 3000, "requests of the batch-1 latency/QPS run"),
            ("--rollout-concurrency", 2, "client workers sending during the second round")):
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument("--rollout-rate", type=float, default=200.0,
                   help="requests/s the client sends during the second round (0 = unlimited); "
                   "bounded so that it does not starve the training it overlaps with")
    p.add_argument("--rounds", type=int, choices=(1, 2), default=2, help="training rounds (--mode rounds)")
    p.add_argument("--mode", choices=("online", "rounds"), default="online",
                   help="online: continuous training over hourly partitions landing one by one, a base then "
                        "patches (generated data); rounds: two batch training runs (always with --data)")
    p.add_argument("--hours", type=int, default=6, help="online: hourly partitions trained (one more is "
                   "generated to score the last version on)")
    p.add_argument("--rows-per-hour", type=int, default=50_000, help="online: rows per hourly partition")
    p.add_argument("--eval-rows", type=int, default=10_000,
                   help="online: rows of the next hour each version is scored on")
    p.add_argument("--base-every-minutes", type=int, default=1440,
                   help="online: minutes of data between two bases (the job's --base-every-minutes)")
    p.add_argument("--shrink-every-minutes", type=int, default=None,
                   help="online: minutes of data between two shrink points, count decay and eviction (the "
                        "job's --shrink-every-minutes; default the job's)")
    p.add_argument("--partition-minutes", type=int, default=60,
                   help="online: the partitions' period in minutes (60: hourly; 1..30 dividing 60: minute "
                        "partitions ROOT/YYYYMMDD/HHMM/, docs/freshness.md); --hours and --rows-per-hour then "
                        "count partitions and rows per partition")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.add_argument("--start-hour", default=None, metavar="YYYYMMDD/HH|now",
                   help="online: the first hourly partition (UTC; default: the demo's fixed first hour, for "
                        "reproducible runs); now: the partitions are the hours before the current one, so the "
                        "versions' data times, and the served data's age, are real")
    from runtime.local import breaks, demo_tracking, prometheus

    breaks.add_arguments(p)
    demo_tracking.add_arguments(p)
    prometheus.add_arguments(p)
    p.add_argument("--data-root", default=None, metavar="ROOT",
                   help="online: where the hourly partitions land (ROOT/YYYYMMDD/HH/, data then _SUCCESS): a "
                        "directory or an object-store location such as s3://bucket/hours (credentials and "
                        "endpoint from the standard AWS_* variables); default RUN_DIR/data/hours")
    p.add_argument("--model-root", default=None, metavar="ROOT",
                   help="online: the version root (donefiles, versions, shard tars) on an object store, e.g. "
                        "s3://bucket/model, instead of the file server (which is then not started)")


class _Step:
    """Prints a progress line with the elapsed time."""

    def __init__(self):
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)


def _split_user_data(files: list[str], out: Path, fmt: str) -> tuple[Path, Path, int, str]:
    """Copies user rows into train (first 80 %) and test (last 20 %) files, header dropped.
    Returns (train, test, rows, format)."""
    from runtime import storage
    from runtime.formats import features

    lines: list[str] = []
    for loc in files:
        got = storage.expand(loc)
        if not got:
            raise storage.LocationError(f"{loc}: no such file")
        for f in got:
            lines += [ln for ln in storage.iter_lines(f) if ln.strip() and not features.is_header(ln)]
    if len(lines) < 2:
        raise ValueError(f"--data: {len(lines)} data rows in {files}; need at least 2")
    if fmt == "auto":
        fmt = features.detect_format(lines[0])
    cut = max(1, int(len(lines) * 0.8))
    out.mkdir(parents=True, exist_ok=True)
    train, test = out / "train.txt", out / "test.txt"
    train.write_text("\n".join(lines[:cut]) + "\n")
    test.write_text("\n".join(lines[cut:]) + "\n")
    return train, test, len(lines), fmt


def _check_roots(args) -> None:
    """``--data-root`` / ``--model-root``: online mode only; ``--model-root`` must be an
    object-store location; both reachable and writable (the demo writes the hours and
    the versions there: ``runtime.roots.check_root``), before any process starts.
    Raises ``ValueError`` or ``storage.LocationError`` naming the flag."""
    from runtime import storage

    roots = {"--data-root": getattr(args, "data_root", None), "--model-root": getattr(args, "model_root", None)}
    for flag, value in roots.items():
        if value and (args.mode != "online" or args.data):
            raise ValueError(f"{flag} {value}: only with --mode online on generated data (no --data)")
    mr = roots["--model-root"]
    if mr and not storage.is_store(mr):
        raise ValueError(f"--model-root {mr}: expected an object-store location (s3://bucket/prefix); "
                         "leave it out to use the file server")
    from runtime.roots import check_root

    for flag, value in roots.items():
        if value:
            check_root(value, flag, write=True)


def main(args) -> int:
    """Runs the pipeline; returns 0 on success (zero failed requests), 1 otherwise."""
    from runtime import proc, storage

    step = _Step()
    run_dir = Path(args.run_dir or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S")))
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    print(f"elastic-ctr local: run directory {run_dir} (logs in {logs})", flush=True)
    group = proc.ProcessGroup(logs, grace_s=5.0)
    try:
        with group:
            _check_roots(args)
            from runtime.local import prometheus

            prom = prometheus.launch(args, run_dir, group)  # before any role: each one's target is written
            if args.mode == "online" and not args.data:
                from runtime.local import online

                return online.run(args, run_dir, group, step, prom=prom)
            return _pipeline(args, run_dir, group, step)
    except proc.RoleFailed as exc:
        print(f"\nelastic-ctr local: FAILED: role {exc.name!r} exited with code {exc.returncode}; "
              f"last lines of {logs / (exc.name + '.log')}:\n{exc.log_tail}", file=sys.stderr, flush=True)
        return 1
    except (TimeoutError, storage.LocationError, ValueError, FileNotFoundError) as exc:
        print(f"\nelastic-ctr local: FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt as exc:
        print("\nelastic-ctr local: interrupted; every process stopped", file=sys.stderr, flush=True)
        return 0 if isinstance(exc, proc.Terminated) else 130
    finally:
        left = [r.name for r in group.roles if r.proc.poll() is None]
        if left:
            print(f"elastic-ctr local: still running after shutdown: {left}", file=sys.stderr)


def _pipeline(args, run_dir: Path, group, step) -> int:
    from runtime import proc, role_specs
    from runtime.local.services import start_client, start_serving, start_services
    from runtime.formats.dict_info import served_version as cube_version
    from runtime.local.status import Waiter, serving_version, summary_line

    cli = proc.self_command()
    waiter = Waiter(group, args.timeout)
    until, wait_roles = waiter.until, waiter.wait
    data_dir = run_dir / "data"
    logs = run_dir / "logs"
    signal_auc = None

    # -- 1. data ---------------------------------------------------------------------------
    slot_args: list[str] = []
    if args.data:
        train, test, nrows, fmt = _split_user_data(args.data, data_dir, args.format)
        train_round2 = [train]  # user data: round 2 retrains on the same rows
        if fmt == "slot" and args.slot_file:
            slot_args = ["--slot-file", str(args.slot_file)]
        step(f"data: {nrows} rows from {' '.join(args.data)} ({fmt}); train {train}, test {test}")
        if nrows < 10_000:
            step(f"note: with {nrows} rows (test: {nrows - int(nrows * 0.8)}) the AUC means little; "
                 "it only shows the pipeline runs on these rows")
    else:
        fmt = "criteo"
        g = group.start("datagen", cli + list(role_specs.data_generate(
            str(data_dir), rows=args.rows, test_rows=args.test_rows, seed=args.seed,
            extra_days=1 if args.rounds == 2 else 0)), expect_exit=True)
        step(f"data: generating {args.rows} train + {args.test_rows} test rows (seed {args.seed})")
    # -- 2. file server, 3. cube (started while data is generated) ----------------------------
    svc = start_services(args, run_dir, group)
    root_url, tok, transfer_url = svc.root_url, svc.token_file, svc.transfer_url
    step(f"file server {root_url}; cube {args.cube_shards} shards x {args.cube_replicas} replicas (server + agent each); "
         f"transfer {transfer_url}")
    if not args.data:
        wait_roles([g], "data generation")
        m = re.search(r"true-logit test AUC: ([0-9.]+)", g.log_path.read_text())
        signal_auc = float(m.group(1)) if m else None
        train, test = data_dir / "train.txt", data_dir / "test.txt"
        # Round 2 retrains on a window of two days: day 1 plus the next day's traffic.
        train_round2 = [train, data_dir / "train-day2.txt"]
        step(f"data ready; the generator's true-logit test AUC is {signal_auc}")

    def train_round(i: int, epochs: int | None, seed: int, data_train: list) -> "proc.Role":
        from runtime.trainer.config import TrainConfig

        sizes = {k: v for k, v in (("epochs", epochs), ("batch_size", args.batch_size_train),
                                    ("embedding_dim", args.embedding_dim)) if v}
        cfg = TrainConfig(data_train=[str(d) for d in data_train], data_test=[str(test)], format=fmt,
                          output=root_url, upload_token_file=str(tok), seed=seed,
                          slot_file=str(args.slot_file) if slot_args else None, **sizes)
        launch = ["--local-cluster", "--pservers", str(args.pservers), "--trainers", str(args.trainers),
                  "--log-dir", str(logs / f"train{i}")]
        step(f"round {i}: training ({args.pservers} pserver, {args.trainers} trainers), exporting to the file server")
        return group.start(f"train{i}", cli + role_specs.train_argv(cfg, launch), expect_exit=True)

    def client(name: str, extra: list[str], concurrency: int, batch: int, wait: bool = True):
        c = start_client(run_dir, group, name, sv_url, test, fmt, concurrency, batch, extra, slot_args)
        if wait:
            wait_roles([c.role], name)
            return c.result()
        return c

    rounds: list[dict] = []
    # -- 4. round 1 --------------------------------------------------------------------------
    t1 = train_round(1, args.epochs, 1, [train])
    wait_roles([t1], "training round 1")
    rec1 = summary_line(t1.log_path)
    v1 = int(rec1.get("version") or 0)
    if not v1:
        raise TimeoutError(f"training round 1 exported no version (see {t1.log_path})")
    step(f"round 1: version {v1} exported; test AUC {_fmt(rec1.get('test_auc'))}; waiting for the cube rollout")
    until(lambda: cube_version(svc.transfer_url) == v1, f"cube rollout of version {v1}", 180)
    step(f"cube serves version {v1} on every shard and replica; starting serving")
    start_serving(args, run_dir, group, svc, fmt, slot_args)
    sv_url = svc.serving_url
    until(lambda: serving_version(sv_url) == v1, f"serving ready on version {v1}", 120)
    step(f"serving ready on version {v1} at {sv_url} (HTTP) and 127.0.0.1:{svc.grpc_port} (gRPC)")
    # -- 5. client: score the test set, then latency at batch 1 ------------------------------
    s1 = client("client-score-1", [], args.concurrency, args.score_batch_size)
    rounds.append({"version": v1, "train_auc": rec1.get("test_auc"), "served_auc": s1["auc"],
                   "rows": s1["rows_scored"], "failed": s1["failed_requests"]})
    step(f"client: test set scored on version {v1}: AUC {s1['auc']:.4f} over {s1['rows_scored']} rows, "
         f"{s1['failed_requests']} failed")
    lat = client("client-latency", ["--max-requests", str(args.latency_requests)], args.concurrency, args.batch_size)
    step(f"client: batch {args.batch_size} x {args.concurrency} workers: {lat['qps']} requests/s, "
         f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, {lat['failed_requests']} failed")
    failed = s1["failed_requests"] + lat["failed_requests"]
    versions_seen = {v1}
    rollout = None
    # -- 6. round 2 under load ---------------------------------------------------------------
    if args.rounds == 2:
        stop_file = run_dir / "client-rollout.stop"
        bg = client("client-rollout", ["--until-file", str(stop_file), "--rate", str(args.rollout_rate)],
                            args.rollout_concurrency, 1, wait=False)
        epochs2 = args.epochs_round2
        if epochs2 is None and len(train_round2) > 1:
            from runtime.trainer.config import TrainConfig

            epochs2 = max(1, (args.epochs or TrainConfig().epochs) // 2)
        t2 = train_round(2, epochs2 or args.epochs, 2, train_round2)
        wait_roles([t2], "training round 2")
        rec2 = summary_line(t2.log_path)
        v2 = int(rec2.get("version") or 0)
        if not v2:
            raise TimeoutError(f"training round 2 exported no version (see {t2.log_path})")
        step(f"round 2: version {v2} exported; test AUC {_fmt(rec2.get('test_auc'))}; rolling out while the "
             "client keeps sending")
        until(lambda: cube_version(svc.transfer_url) == v2, f"cube rollout of version {v2}", 180)
        step(f"cube serves version {v2}")
        until(lambda: serving_version(sv_url) == v2, f"serving switch to version {v2}", 120)
        step(f"serving switched to version {v2}")
        time.sleep(1.0)
        stop_file.write_text("stop")
        wait_roles([bg.role], "client during the rollout")
        rollout = bg.result()
        failed += rollout["failed_requests"]
        step(f"client during the rollout: {rollout['requests']} requests, versions seen {rollout['versions']}, "
             f"{rollout['failed_requests']} failed")
        # -- 7. score on the new version ----------------------------------------------------
        s2 = client("client-score-2", [], args.concurrency, args.score_batch_size)
        failed += s2["failed_requests"]
        rounds.append({"version": v2, "train_auc": rec2.get("test_auc"), "served_auc": s2["auc"],
                       "rows": s2["rows_scored"], "failed": s2["failed_requests"]})
        versions_seen |= {int(v) for v in rollout["versions"]} | {int(v) for v in s2["versions"]}
        step(f"client: test set scored on version {v2}: AUC {s2['auc']:.4f}")
    # -- summary -------------------------------------------------------------------------------
    print("\n== elastic-ctr local: summary ==")
    print(f"{'version':>12} {'trainer test AUC':>17} {'served test AUC':>16} {'rows':>7} {'failed':>7}")
    for r in rounds:
        print(f"{r['version']:>12} {_fmt(r['train_auc']):>17} {r['served_auc']:>16.4f} {r['rows']:>7} {r['failed']:>7}")
    if signal_auc is not None:
        print(f"generator's true-logit test AUC: {signal_auc:.4f}")
    if args.data:
        print("note: AUC on a few hundred rows means little; the run shows the pipeline works on these rows")
    print(f"versions rolled out: {len(rounds)} ({', '.join(str(r['version']) for r in rounds)}); "
          f"versions seen by the client: {sorted(versions_seen)}")
    if rollout is not None:
        print(f"during the rollout: {rollout['requests']} requests, {rollout['failed_requests']} failed, "
              f"answers per version {rollout['versions']}")
    print(f"latency run (batch {args.batch_size}, {args.concurrency} workers, {lat['requests']} requests): "
          f"{lat['qps']} requests/s, p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms")
    print(f"failed requests: {failed}")
    print(f"logs: {run_dir / 'logs'}")
    last = rounds[-1]
    (run_dir / "summary.json").write_text(json.dumps({
        "rounds": rounds, "signal_auc": signal_auc, "failed_requests": failed, "latency": lat,
        "rollout": rollout, "versions_seen": sorted(versions_seen), "test_data": str(test), "format": fmt}, indent=1))
    print(f"demo: versions={len(rounds)} auc={last['served_auc']:.4f} failed_requests={failed} "
          f"qps={lat['qps']} p99_ms={lat['p99_ms']} patches=0", flush=True)
    return 0 if failed == 0 else 1


def _fmt(x) -> str:
    if isinstance(x, list):
        x = x[-1] if x else None
    return f"{x:.4f}" if isinstance(x, (int, float)) else "n/a"
