"""``elastic-ctr train``: Fleet parameter-server training (async) or single-process, on
Paddle's dataset path (``runtime.trainer.worker``), and the export of the trained model.

Parameter-server mode (Paddle 3.0.0, legacy static graph ``FLAGS_enable_pir_api=0``): the
role (pserver or trainer) comes from the environment (``runtime.trainer.roles``), with gloo
over pserver 0's HTTP store so that the saves' barriers wait for every trainer. A pserver
serves the sparse table and the dense parameters until it is stopped (it never exits by
itself: Volcano's ``CompleteJob`` policy or the local-cluster launcher stops it). A
trainer stages its shard of the lines, trains ``epochs`` passes, and trainer 0 evaluates
the test AUC after each pass. Then every trainer takes part in the table save and
trainer 0 exports the version (``runtime.trainer.publish``).

The sparse table is saved by the PSERVERS, into the directory trainer 0 names, on the
pservers' own file system; trainer 0 then reads it back. That directory is a fresh
subdirectory of ``--table-dir`` (default: the system temp dir), removed after the export.
On one machine any local directory works; in Kubernetes ``--table-dir`` must be a volume
shared by the pserver and trainer pods (ReadWriteMany), mounted at the same path in both.

Single-process mode (``--single``): the same network with a local embedding table over a
vocabulary grown on the fly (feasign -> row; row 0 = zero vector for unseen feasigns),
same data path, same export.

``--mode continuous`` trains partition by partition instead (``runtime.trainer.online``).
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from runtime import tracking
from runtime.formats.train_result import RESULT, TrainResult
from runtime.trainer import readers, roles
from runtime.trainer.publish import publish, table_save_dir
from runtime.trainer.stop import StopRequest
from runtime.trainer.config import TrainConfig
from runtime.trainer.input_checks import check_inputs

log = logging.getLogger(__name__)


def result_line(record: dict) -> None:
    """Prints this process's ``ELASTIC_CTR_RESULT`` line (``runtime.formats.train_result``;
    read by the local-cluster launcher). Raises ``TrainResultError`` naming a field the
    record may not hold."""
    print(TrainResult.of(record).format(RESULT), flush=True)


def load_test(cfg: TrainConfig, test_files: list[str], slots) -> readers.Batch | None:
    """The test rows (at most ``--test-limit``), or None without ``--data-test``."""
    if not test_files:
        return None
    budget = readers.BadLineBudget(cfg.max_bad_lines, cfg.max_bad_fraction)
    return readers.read_all(test_files, cfg.format, slots, budget=budget, limit=cfg.test_limit)


def run_batch(worker, cfg: TrainConfig, train_files: list[str], test_files: list[str], job: dict) -> dict:
    """Trains ``cfg.epochs`` passes over ``train_files`` (loaded once), evaluates on the
    chief after each pass, saves and (chief, with ``--output``) exports. ``job``: the
    record's fields that describe the job (``mode``, ``trainers``, ``pservers``...).
    Returns the result record; every process of the job calls it. Logs to MLflow when a
    tracking URI is set (``runtime.tracking``)."""
    tr = tracking.start_training(cfg, job)
    try:
        rec = _run_batch(worker, cfg, train_files, test_files, job, tr)
    except BaseException:
        tr.close(status="FAILED")
        raise
    tr.close()
    return rec


def _run_batch(worker, cfg: TrainConfig, train_files: list[str], test_files: list[str], job: dict, tr) -> dict:
    t_start = time.monotonic()
    ds, staged = worker.load(train_files)
    load_s = time.monotonic() - t_start
    test = load_test(cfg, test_files, worker.slots) if worker.chief else None
    aucs, passes = [], []
    stop = StopRequest.current()
    for epoch in range(cfg.epochs):
        if stop.requested:  # a batch job stopped half way exports nothing; its pods are going
            log.warning("%s: stopped by a signal after %d of %d passes; nothing exported", worker.who, epoch,
                        cfg.epochs)
            logging.shutdown()
            os._exit(0)
        st = worker.train_pass(ds, f"pass {epoch + 1}/{cfg.epochs}", staged.rows)
        passes.append(st)
        worker.sync()
        a = None
        if test is not None:
            a, _ = worker.evaluate(test)
            aucs.append(a)
            log.info("%s pass %d/%d: test auc %.5f (%d rows)", worker.who, epoch + 1, cfg.epochs, a, len(test))
        tr.training_pass(epoch, st, a)
    ds.release_memory()
    worker.budget.finish()
    examples = sum(p.examples for p in passes)
    t_train = sum(p.seconds for p in passes)
    rec = {**job, "epochs": cfg.epochs, "threads": cfg.threads, "examples": examples,
           "rows": staged.rows, "load_seconds": round(load_s, 3), "train_seconds": round(t_train, 3),
           "examples_per_s": round(examples / max(t_train, 1e-9), 1),
           "examples_per_s_with_load": round(examples / max(t_train + load_s, 1e-9), 1),
           "train_auc": [round(p.train_auc, 5) for p in passes]}
    if worker.chief:
        rec["test_auc"] = aucs
        if cfg.dump_predictions and test is not None:
            np.save(cfg.dump_predictions, worker.predict(test))
    with table_save_dir(cfg.table_dir) as save_dir:
        t_save = time.monotonic()
        table = worker.full_table(save_dir)
        if worker.chief and cfg.output:
            keys, values = table
            ver = publish(cfg, worker.slots, keys, values, rec)
            rec.update(version=ver.id, export_seconds=round(time.monotonic() - t_save, 3))
            from runtime.metrics.trainer import metrics

            metrics().export_done("base", rec["export_seconds"], int(len(keys)), ver.id, None)
            tr.version(None, {"id": ver.id, "kind": "base", "base": ver.id, "hour": None, "rows": int(len(keys)),
                              "seconds": rec["export_seconds"]}, tracking.published_model_meta(cfg.output, ver.id))
    tr.totals({k: rec[k] for k in ("examples", "load_seconds", "train_seconds", "examples_per_s",
                                   "examples_per_s_with_load")})
    return rec


def run_single(cfg: TrainConfig) -> dict:
    """Trains in this process without parameter servers, evaluates, exports if ``output``.
    Returns the result record (``test_auc`` per pass, ``examples_per_s``, ``version``...)."""
    train_files, test_files = check_inputs(cfg)
    from runtime.metrics.trainer import serve_from_env
    from runtime.trainer.worker import SingleWorker

    serve_from_env()

    job = {"mode": "single", "trainers": 1, "pservers": 0}
    if cfg.mode == "continuous":
        from runtime.trainer import online

        rec = online.run(SingleWorker(cfg), cfg, test_files, job)
    else:
        rec = run_batch(SingleWorker(cfg), cfg, train_files, test_files, job)
    result_line(rec)
    return rec


def run_pserver(cfg: TrainConfig, role) -> None:
    """Serves the tables until the process is stopped: ``fleet.run_server()`` blocks in
    C++ for good; SIGTERM/SIGINT (Volcano's ``CompleteJob``, a deleted pod) end the
    process with exit code 0 (``runtime.trainer.stop.exit_on_signal``). Nothing is
    lost: a pserver's tables are saved by the trainers' calls (export, checkpoint), never
    at exit."""
    from paddle.distributed import fleet

    from runtime.trainer.program import build_ps_programs

    build_ps_programs(cfg, cfg.slots(), continuous=cfg.mode == "continuous")
    log.info("pserver %s: serving (trainers %d)", role.endpoint, role.trainers)
    fleet.init_server()
    from runtime.metrics.trainer import pserver_exporter
    from runtime.trainer.stop import exit_on_signal

    pserver_exporter()  # a process of its own: no thread of this one runs once run_server holds the GIL
    # after init_server (Paddle's and the PS runtime's handlers are in place); run_server
    # then holds the GIL for good, so the exit on SIGTERM is the C handler's
    exit_on_signal(0)
    log.info("pserver %s: SIGTERM/SIGINT end it with exit code 0", role.endpoint)
    fleet.run_server()
    raise RuntimeError(f"pserver {role.endpoint}: the server stopped")


def run_role(cfg: TrainConfig) -> dict | None:
    """Runs this process's parameter-server role (from the environment)."""
    role = roles.from_env()
    roles.apply(role)
    train_files, test_files = check_inputs(cfg)
    import paddle
    from paddle.distributed import fleet

    from runtime.trainer.ps_worker import PsWorker

    from runtime import proc

    if not role.is_pserver:  # Paddle 3.0.0's own wait for the gloo store is a no-op
        host, _, port = role.gloo_endpoint.rpartition(":")
        proc.wait_for_port(host, int(port), timeout_s=cfg.wait_pserver_s,
                           name=f"gloo store {role.gloo_endpoint} (pserver 0)")
    from runtime.trainer import mkl

    paddle.enable_static()
    mkl.init_math_runtimes()  # before any pserver/client thread (runtime.trainer.mkl)
    fleet.init(is_collective=False)
    if fleet.is_server():
        run_pserver(cfg, role)
        return None
    from runtime.metrics.trainer import serve_from_env

    serve_from_env()
    worker = PsWorker(cfg, role)
    job = {"mode": "ps", "trainers": role.trainers, "pservers": len(role.pservers), "trainer_id": role.trainer_id}
    if cfg.mode == "continuous":
        from runtime.trainer import online

        rec = online.run(worker, cfg, test_files, job)
    else:
        rec = run_batch(worker, cfg, train_files, test_files, job)
    worker.close()
    result_line(rec)
    return rec
