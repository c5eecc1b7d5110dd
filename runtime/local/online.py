"""The online loop of ``elastic-ctr local`` (``--mode online``, what ``make demo`` runs).

1. ``data generate --hours H+1``: H+1 hourly partitions with drift (new feasigns, moving
   click rates; ``runtime.trainer.generator``) into ``data/upstream/``, the output of an
   upstream job; they land one by one in the data root ``data/hours/YYYYMMDD/HH/`` (a
   directory rename, ``_SUCCESS`` inside) while the training job runs; with
   ``--data-root s3://...`` they are uploaded there, data objects first, ``_SUCCESS`` last;
2. file server, cube (S shards x R replicas), cube transfer (``runtime.local.services``);
   with ``--model-root s3://...`` no file server: the trainer publishes its versions there,
   the transfer its shard tars, and agents and serving download from there;
3. ``train --local-cluster --mode continuous`` follows the data root: after each hour it
   exports a version, the first a base, the others patches (rows changed since the
   previous version); the transfer rolls each out to every shard and replica;
4. serving starts on the base; a client keeps sending (rate-bounded) through every patch
   rollout; each version, once served, scores the NEXT hour's rows (not yet trained on),
   before that hour lands;
5. freshness: the last hour's next hour is scored by serving (the latest patch) and,
   offline, by the base alone (its dense model and SequenceFiles);
6. a chart of the AUC per hour and the rollout seconds per version
   (``runtime.local.plot``), the job's run in a local MLflow server
   (``runtime.local.demo_tracking``, unless ``--no-tracking``), with ``--prometheus`` the
   chart of the served data's age and the AUC from the run's Prometheus
   (``runtime.local.prometheus``), a summary table per version (kind, sparse rows,
   rollout seconds, the trainer's and the served AUC on the next hour) and the line
   ``demo: versions=<n> auc=<served next-hour AUC of the last version> failed_requests=<n>
   qps=<x> p99_ms=<y> patches=<n> quarantined=<n> held=<n>`` (``--break-hour``: a
   partition corrupted as it lands, ``runtime.local.breaks``; a quarantined hour and a
   version the transfer's model gate held are rows of their own, the served version
   scoring the next hour).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from runtime import role_specs
from runtime.local import breaks, demo_tracking, plot
from runtime.local import prometheus as local_prometheus
from runtime.local.services import start_client, start_serving, start_services
from runtime.formats import dict_info, signal
from runtime.formats.partition_stats import marker_location
from runtime.formats.dict_info import served_version as cube_version
from runtime.local.status import Waiter, serving_version, summary_line

START = "20261120/00"


def start_hour(value, hours: int, minutes: int = 60) -> str:
    """The first partition of a run of ``hours`` trained partitions of ``minutes``:
    ``value`` (``YYYYMMDD/HH``, or ``YYYYMMDD/HHMM`` under an hour), ``START`` when None,
    or with ``now`` the partition ``hours`` periods before the current one (the last
    trained partition then ends when the current one began). Raises ``ValueError``
    naming ``--start-hour``."""
    from runtime.formats import partitions

    if value is None:
        return str(partitions.Partition.parse(START, minutes=minutes))
    if value == "now":
        import datetime as dt

        now = dt.datetime.now(dt.timezone.utc)
        since = (now.hour * 60 + now.minute) // minutes * minutes
        current = now.replace(hour=since // 60, minute=since % 60, second=0, microsecond=0)
        return str(partitions.Partition(current, minutes).next(-hours))
    return str(partitions.Partition.parse(value, "--start-hour", minutes=minutes))


def _eval_file(src: Path, dst: Path, rows: int) -> Path:
    """The first ``rows`` lines of ``src`` written to ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src) as f, open(dst, "w") as out:
        for i, line in enumerate(f):
            if i >= rows:
                break
            out.write(line)
    return dst


def _served_auc(pred_tsv: Path, version: int) -> tuple[float, int]:
    """AUC over the rows of a client's ``--predictions-out`` answered by ``version``."""
    from runtime.evaluation import auc

    labels, probs = [], []
    for ln in pred_tsv.read_text().splitlines():
        _row, label, prob, ver = ln.split("\t")
        if int(ver) == version:
            labels.append(int(label))
            probs.append(float(prob))
    return (auc(np.array(labels), np.array(probs)) if labels else float("nan")), len(labels)


def offline_auc(version_dir: Path, data: Path) -> float:
    """AUC of one exported version (``versions/<id>/``: dense model and SequenceFiles,
    whole table = a base) on the Criteo rows of ``data``, computed without serving."""
    from runtime.evaluation import auc
    from runtime.formats import features
    from runtime.formats.seqfile import read_sequence_file
    from runtime.inference import DensePredictor

    from runtime.formats.model_meta import ModelMeta

    b = features.parse_criteo_lines(data.read_text().splitlines())
    meta = ModelMeta.read(version_dir / "dense")
    keys_l, vals_l = [], []
    for part in meta.sparse.parts:  # the parts the export wrote, as model_meta.json names them
        k, v = read_sequence_file(str(version_dir / "sparse" / part.file))
        keys_l.append(k)
        vals_l.append(v.reshape(len(k), -1))
    keys, vals = np.concatenate(keys_l), np.concatenate(vals_l)
    order = np.argsort(keys)
    keys, vals = keys[order], vals[order]
    pred = DensePredictor(version_dir / "dense", meta)
    fs = b.feasigns.T.ravel()  # slot-major, as the dense model's inputs
    pos = np.minimum(np.searchsorted(keys, fs), len(keys) - 1)
    hit = keys[pos] == fs
    emb = np.where(hit[:, None], vals[pos], 0.0).astype(np.float32)
    p = pred.predict(features.normalize_dense(b.dense), emb).ravel()
    return auc(b.labels, p)


def _version_dir(svc, version: int, scratch: Path) -> Path:
    """A local directory holding ``versions/<version>/`` (dense and sparse): the file
    server's own directory, or a copy downloaded from the store ``--model-root``."""
    from runtime import storage

    if svc.fs_root is not None:
        return svc.fs_root / "versions" / str(version)
    dest = scratch / str(version)
    for sub in ("dense", "sparse"):
        for loc in storage.expand(storage.join(svc.root, "versions", str(version), sub)):
            storage.download(loc, dest / sub / loc.rsplit("/", 1)[-1])
    return dest


def run(args, run_dir: Path, group, step, prom=None, observer=None) -> int:
    """Runs the online demo (module docstring); returns 0 when no request failed.

    ``prom``: the run's Prometheus (``runtime.local.prometheus``; its chart is drawn at the
    end). ``observer`` (the live monitoring test's): ``before_landing(t, svc, land)`` is
    called after version ``t`` was scored, before the next partition lands, and returns
    True when it called ``land()`` itself; ``at_end(svc)`` once the summary is printed,
    before the roles stop."""
    from runtime import proc, storage, storage_write
    from runtime.formats import donefile, partitions

    cli = proc.self_command()
    waiter = Waiter(group, args.timeout)
    until = waiter.until
    data_dir, logs = run_dir / "data", run_dir / "logs"
    upstream = data_dir / "upstream"
    hours_root = str(args.data_root or data_dir / "hours")
    H = int(args.hours)
    if H < 2:
        raise ValueError(f"--hours must be >= 2 (a base and at least one patch; got {H})")
    breaks.check(args, H)
    brk = getattr(args, "break_hour", None)
    minutes = int(getattr(args, "partition_minutes", 60))
    first = start_hour(getattr(args, "start_hour", None), H, minutes)
    hs = [partitions.Partition.parse(first, minutes=minutes).next(i) for i in range(H + 1)]
    t_run = time.time()

    gen = group.start("datagen", cli + list(role_specs.data_generate(
        str(upstream), rows=args.rows_per_hour, seed=args.seed, hours=H + 1, start=first, partition_minutes=minutes)),
        expect_exit=True)
    step(f"data: generating {H + 1} partitions of {minutes} minutes, {args.rows_per_hour} rows each, from {first} "
         "(drifting hour to hour); they land one by one while the job trains")
    from runtime import tracking

    os.environ[tracking.JOB_ENV] = tracking.job_name(start_hour=first)  # the transfer's run: the job's child
    server = demo_tracking.launch(args, run_dir, group)
    svc = start_services(args, run_dir, group)
    step(f"{'file server' if svc.fs_root else 'version root (no file server)'} {svc.root_url}; "
         f"cube {args.cube_shards} shards x {args.cube_replicas} replicas; "
         f"transfer {svc.transfer_url}")
    waiter.wait([gen], "data generation")
    sig = signal.read_hourly(upstream)
    evals = [_eval_file(Path(h.location(str(upstream))) / "part-00000", data_dir / "eval" / f"{h.start:%Y%m%d-%H%M}.txt",
                        args.eval_rows) for h in hs]

    def land(h) -> None:
        src = Path(h.location(str(upstream)))
        if brk is not None and h == hs[brk]:  # a broken upstream job (runtime.local.breaks)
            step(f"partition {h}: {breaks.corrupt(src, args.break_kind)} rows broken ({args.break_kind}) as it lands")
        if storage.is_store(hours_root):  # no rename on an object store: data first, _SUCCESS last
            for f in sorted(src.iterdir(), key=lambda p: p.name == partitions.DONE_MARKER):
                storage_write.upload(f, storage.join(h.location(hours_root), f.name))
            return
        dst = Path(h.location(hours_root))
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src, dst)  # complete (its _SUCCESS inside) the moment it appears

    land(hs[0])
    step(f"partition {hs[0]} landed")
    from runtime.trainer.config import TrainConfig

    # the job's own defaults where the local run leaves a setting out
    given = {k: v for k, v in (("embedding_dim", args.embedding_dim), ("batch_size", args.batch_size_train),
                               ("shrink_every_minutes", args.shrink_every_minutes)) if v}
    cfg = TrainConfig(mode="continuous", data_root=hours_root, start_hour=first, end_hour=str(hs[H - 1]),
                      state_dir=str(run_dir / "train-state"), output=svc.root_url,
                      upload_token_file=str(svc.token_file), poll_seconds=0.2, partition_minutes=minutes,
                      base_every_minutes=args.base_every_minutes, seed=args.seed, **given)
    launch = ["--local-cluster", "--pservers", str(args.pservers), "--trainers", str(args.trainers),
              "--log-dir", str(logs / "train")]
    if server is not None:
        server.wait_ready()
        launch += ["--tracking-uri", server.url]
        step(f"MLflow server {server.url} (store {server.root}); the job logs to it")
    trainer = group.start("train", cli + role_specs.train_argv(cfg, launch), expect_exit=True)
    step(f"continuous training started ({args.pservers} pserver, {args.trainers} trainers): a version per "
         f"{minutes}-minute partition, a base every {args.base_every_minutes} minutes of data, patches between")
    sv_url = None  # serving's, once it started

    def new_line(after: int):
        recs = [(k, r) for k in ("base", "patch") for r in donefile.read(svc.root, k) if r.id > after]
        return min(recs, key=lambda x: x[1].id) if recs else None

    def client(name: str, data: Path, extra: list[str], concurrency: int, batch: int, wait: bool = True):
        c = start_client(run_dir, group, name, sv_url, data, "criteo", concurrency, batch, extra)
        if wait:
            waiter.wait([c.role], name)
            return c.result()
        return c

    versions: list[dict] = []
    failed = 0
    bg = None
    stop_file = run_dir / "client-rollout.stop"
    last_id = 0
    for t in range(H):
        marker = marker_location(hs[t].location(hours_root))
        got = until(lambda: new_line(last_id) or (storage.exists(marker) and ("quarantined", None)),
                    f"the version exported after partition {hs[t]} (or its quarantine)", 300)
        kind, rec = got
        if rec is not None:  # served, or held by the transfer's model gate
            last_id, t_line = rec.id, time.monotonic()
            until(lambda: cube_version(svc.transfer_url) == rec.id
                  or rec.id in dict_info.fetch_dict_info(svc.transfer_url).held, f"rollout of {kind} {rec.id}",
                  180, 0.05)
            kind = kind if cube_version(svc.transfer_url) == rec.id else "held"
        if rec is None or kind == "held":  # nothing new served: the served version scores the next hour
            sv = cube_version(svc.transfer_url)
            s = client(f"client-hour-{t + 1}", evals[t + 1], [], args.concurrency, args.score_batch_size)
            served, n = _served_auc(run_dir / f"client-hour-{t + 1}.tsv", sv)
            failed += s["failed_requests"]
            versions.append({"version": sv, "kind": kind, "hour": str(hs[t]), "rows": 0, "rollout_s": 0.0,
                             "served_auc_next": served, "scored_rows": n, "failed": s["failed_requests"]})
            step(f"partition {hs[t]}: {kind}; version {sv} keeps serving, AUC on {hs[t + 1]} {served:.4f}")
            if t + 1 < H:
                land(hs[t + 1])
            continue
        rollout_s = time.monotonic() - t_line
        if bg is None:
            start_serving(args, run_dir, group, svc, "criteo")
            sv_url = svc.serving_url
            until(lambda: serving_version(sv_url) == rec.id, f"serving ready on {kind} {rec.id}", 120)
            step(f"serving ready on base {rec.id} at {sv_url}; a client keeps sending through every rollout")
            bg = client("client-rollout", evals[0], ["--until-file", str(stop_file), "--rate",
                                                     str(args.rollout_rate)], args.rollout_concurrency, 1, wait=False)
        else:
            until(lambda: serving_version(sv_url) == rec.id, f"serving switch to {kind} {rec.id}", 120, 0.05)
        s = client(f"client-hour-{t + 1}", evals[t + 1], [], args.concurrency, args.score_batch_size)
        served, n = _served_auc(run_dir / f"client-hour-{t + 1}.tsv", rec.id)
        failed += s["failed_requests"]
        versions.append({"version": rec.id, "kind": kind, "hour": str(hs[t]), "rows": rec.count,
                         "rollout_s": round(rollout_s, 2), "served_auc_next": served, "scored_rows": n,
                         "failed": s["failed_requests"]})
        step(f"{kind} {rec.id} (after {hs[t]}, {rec.count} sparse rows): rolled out in {rollout_s:.1f} s; "
             f"AUC on {hs[t + 1]} (not trained yet) {served:.4f}")
        if t + 1 < H and not (observer is not None and observer.before_landing(t, svc, lambda: land(hs[t + 1]))):
            land(hs[t + 1])
    waiter.wait([trainer], "continuous training")
    trec = summary_line(trainer.log_path)
    before = {p["hour"]: p.get("auc_before") for p in trec.get("partitions", [])}
    for v, h in zip(versions, hs[1:]):
        v["trainer_auc_next"] = before.get(str(h))
    time.sleep(0.5)
    stop_file.write_text("stop")
    waiter.wait([bg.role], "client during the rollouts")
    rollout = bg.result()
    failed += rollout["failed_requests"]
    lat = client("client-latency", evals[0], ["--max-requests", str(args.latency_requests)], args.concurrency,
                 args.batch_size)
    failed += lat["failed_requests"]
    base = versions[0]
    base_dir = _version_dir(svc, base["version"], run_dir / "versions")
    base_alone_h = [offline_auc(base_dir, evals[t + 1]) for t in range(H)]  # the base alone on every hour
    base_alone = base_alone_h[-1]
    latest = versions[-1]
    true_logit = signal.true_logit_auc(sig, 1, H)
    scored = [str(h) for h in hs[1:]]
    chart = plot.write_chart(run_dir / plot.CHART, scored, [v["trainer_auc_next"] for v in versions],
                             [v["served_auc_next"] for v in versions], base_alone_h, true_logit,
                             [v["version"] for v in versions], [v["kind"] for v in versions],
                             [v["rollout_s"] for v in versions])
    run_rec = (demo_tracking.log_demo(server, run_dir / "train-state", first, versions, scored, base_alone_h,
                                      true_logit, minutes) if server is not None else None)
    # -- summary -------------------------------------------------------------------------------
    print("\n== elastic-ctr local (online): summary ==")
    print(f"{'version':>12} {'kind':>6} {'after hour':>12} {'sparse rows':>12} {'rollout s':>10} "
          f"{'trainer AUC next h':>19} {'served AUC next h':>18} {'failed':>7}")
    for v in versions:
        tr = v["trainer_auc_next"]
        print(f"{v['version']:>12} {v['kind']:>6} {v['hour']:>12} {v['rows']:>12} {v['rollout_s']:>10.2f} "
              f"{(f'{tr:.4f}' if tr is not None else 'n/a'):>19} {v['served_auc_next']:>18.4f} {v['failed']:>7}")
    print("(trainer AUC: trainer 0's share of the next hour, before training on it; served: "
          f"{args.eval_rows} rows of the next hour through serving; the last version's next hour is never trained)")
    print(f"freshness on {hs[H]}: base {base['version']} alone {base_alone:.4f}, latest "
          f"{latest['kind']} {latest['version']} {latest['served_auc_next']:.4f} "
          f"({latest['served_auc_next'] - base_alone:+.4f}); true-logit AUC per hour "
          + " ".join(f"{a:.4f}" for a in signal.true_logit_auc(sig)))
    print(f"client through the rollouts: {rollout['requests']} requests, {rollout['failed_requests']} failed, "
          f"answers per version {rollout['versions']}")
    print(f"latency run (batch {args.batch_size}, {args.concurrency} workers, {lat['requests']} requests): "
          f"{lat['qps']} requests/s, p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms")
    print(f"failed requests: {failed}")
    print(f"logs: {logs}")
    print(f"chart: {chart}")
    prom_chart = local_prometheus.report(prom, run_dir, t_run)
    patches = sum(v["kind"] == "patch" for v in versions)
    quarantined, held = (sum(v["kind"] == k for v in versions) for k in ("quarantined", "held"))
    (run_dir / "summary.json").write_text(json.dumps({
        "mode": "online", "versions": versions, "base_alone_auc_last": base_alone, "base_alone_auc": base_alone_h,
        "chart": str(chart), "prometheus_chart": str(prom_chart) if prom_chart else None, "tracking": run_rec,
        "failed_requests": failed,
        "latency": lat, "rollout": rollout, "signal": sig.model_dump(mode="json"), "eval_files": [str(e) for e in evals],
        "trainer": trec}, indent=1))
    served_n = sum(v["kind"] in ("base", "patch") for v in versions)
    print(f"demo: versions={served_n} auc={latest['served_auc_next']:.4f} failed_requests={failed} "
          f"qps={lat['qps']} p99_ms={lat['p99_ms']} patches={patches} quarantined={quarantined} held={held}",
          flush=True)
    if observer is not None:
        observer.at_end(svc)
    demo_tracking.linger(args, group, server, run_rec, keep=[prom.role] if prom is not None else [])
    return 0 if failed == 0 else 1
