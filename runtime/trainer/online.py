"""Continuous (online) training: ``elastic-ctr train --mode continuous``.

The job follows the partitions (``runtime.formats.partitions``, hourly or of
``--partition-minutes`` down to one minute) from ``--start-hour``, in order, each once,
and never ends by itself unless ``--end-hour`` is given. For each
complete partition every worker stages and loads its shard (``runtime.trainer.worker``);
trainer 0 first scores the model of that moment on its rows (the AUC on the next hour's
data), the data gate judges it (``runtime.trainer.data_gate``: a quarantined partition is
not trained), then it is trained as one pass. After every partition, or at most once per
``--patch-every-seconds`` (``runtime.trainer.cadence``),
the job exports a version of ``--output``:

* a **base** (the whole sparse table, ``donefile/base.txt``) for the first export and
  whenever ``--base-every-minutes`` of data have been trained since the last base;
* otherwise a **patch**: the whole dense model and the sparse rows of every feasign the
  trainers fed since the previous export (new keys included), ``donefile/patch.txt`` with
  the base's id as its key. Only those rows can have changed, so applying the base and its
  patches in order gives the table the trainer held at the patch's export, bit for bit.

A patch's rows are cut without reading the table (``runtime.trainer.fedrows``): each
trainer keeps the distinct feasigns it staged since the last export point, trainer 0
gathers their union and pulls exactly those rows from the pservers (a single process
looks them up in its table), so the cost follows the hour's data, not the table. A base
is a full save (``Worker.full_table``) whose values are then pulled too (bit for bit the
pservers' floats, not the save's 6-digit text). Paddle 3.0.0's pserver has its own delta
save (``MemorySparseTable::SavePatch``, ``save_one_table`` mode 5 with the table's
``enable_revert``), but no public API documents it and its behaviour was not verified
here, so the trainer does not rely on it; see docs/training.md.

Resume: at every export point, in this order, (1) trainer 0 keeps the export's rows
(``--state-dir/exports/<id>/``, ``ROWS``) and writes the state file with the export as
``pending`` (its version id fixed), (2) publishes the version (files, then the donefile
line), (3) writes the state with the export done; then (4), when ``--checkpoint-every-minutes``
of data have been trained since the last checkpoint or the job reached
``--end-hour``, every worker takes a checkpoint (``Worker.checkpoint``: the pservers save all tables with
optimizer state, or the single process its program) into
``--state-dir/checkpoints/<partition>`` and trainer 0 records it in the state. The checkpoint
comes after the publish so that it is never on the path from a partition landing to its
version being served; a parameter-server checkpoint writes every row with its optimizer
state and costs what the table costs (docs/training.md), so it is taken every
``--checkpoint-every-minutes`` of data, not at every export (Paddle's own online-training
recipe saves the model daily and the deltas hourly).

A restarted job (any pod killed, the Volcano Job restarted) reads the state, restores the
last checkpoint, and on trainer 0 finishes a pending export whose donefile line is
missing, with the same id and rows. It then trains the partitions after the checkpoint
again; export points up to the last published one are passed over (their versions are
out), and the first export after them carries every row fed since the restore: a
partition trained again feeds the same feasigns, so those rows overwrite what the first
training published and base + patches still equal the trainer's table. So no partition is
skipped or trained twice into the served lineage, and version ids keep increasing. A
checkpoint restored into another pserver (or shard) count, a resize, is re-seeded and
verified row by row (``runtime.trainer.checkpoint``) and the next export is a base
(``base_due`` in the state until it is published); so is the first export after any
parameter-server restore (the checkpoint's tables are text, the exports the pservers'
exact floats).

The state file (``--state-dir/online-state.json``) is owned by ``OnlineState``
(``runtime/trainer/online_state.py``); the steps of an export point are
``runtime/trainer/export_point.py``'s.
"""
from __future__ import annotations

import logging
import os
import time

from runtime import tracking
from runtime.formats import partitions
from runtime.metrics.trainer import metrics as trainer_metrics, waiting_counter
from runtime.formats.train_result import PartitionResult
from runtime.trainer import cadence, data_gate, export_point, fedrows, model_eval
from runtime.trainer.lifecycle import Lifecycle
from runtime.trainer.online_state import CHECKPOINTS, OnlineState
from runtime.trainer.served import ServedKeys
from runtime.trainer.shrink import ShrinkPoints
from runtime.trainer.fedrows import apply_patch, table_diff  # noqa: F401  (the patch arithmetic, tests)
from runtime.trainer.config import TrainConfig

log = logging.getLogger(__name__)

EVAL_ROWS = 20_000


def _wait_for(cfg: TrainConfig, hour: partitions.Partition, stop) -> bool:
    """Waits until ``hour`` is complete; False if a stop was requested meanwhile. Logs the
    wait at once, then once a minute (an hourly job would otherwise log every few seconds)."""
    waited = 0
    every = max(1, round(60.0 / cfg.poll_seconds))
    while not partitions.is_complete(cfg.data_root, hour):
        if stop.requested:
            return False
        if waited % every == 0:
            log.info("waiting for partition %s: no %s in %s yet (polling every %g s)", hour,
                     partitions.DONE_MARKER, hour.location(cfg.data_root), cfg.poll_seconds)
        waited += 1
        time.sleep(cfg.poll_seconds)
    return True


def run(worker, cfg: TrainConfig, test_files: list[str], job: dict) -> dict:
    """Runs the continuous job on ``worker`` (module docstring); every process of the job
    calls it. Returns the result record (``partitions``, ``exports``...)."""
    from runtime.trainer.stop import StopRequest

    stop = StopRequest.current()
    state = OnlineState.load(cfg.state_dir)
    start = cfg.partition(cfg.start_hour, "--start-hour")
    end = cfg.partition(cfg.end_hour, "--end-hour") if cfg.end_hour else None
    if state is not None and (state.data_root != cfg.data_root or state.start_hour != str(start)
                              or state.partition_minutes != cfg.partition_minutes):
        raise RuntimeError(f"--state-dir {cfg.state_dir} holds the state of another job (data root "
                           f"{state.data_root}, start {state.start_hour}, {state.partition_minutes}-minute "
                           "partitions); use a new --state-dir")
    if state is None:
        state = OnlineState(data_root=cfg.data_root, start_hour=str(start), next_hour=str(start),
                            partition_minutes=cfg.partition_minutes)
    next_hour, ckpt = state.resume_point()
    ckroot = os.path.join(cfg.state_dir, CHECKPOINTS)
    if ckpt is not None:
        log.info("%s: resuming from checkpoint %s (next partition %s)", worker.who, ckpt, next_hour)
        change = worker.restore(os.path.join(ckroot, ckpt))
        if change is None and getattr(worker, "role", None) is not None:
            # Paddle's PS checkpoint holds the tables as text (6 significant digits), while
            # exports carry the pservers' exact floats: restored rows that no later batch
            # feeds would differ from the served chain, so the next export is a base
            change = f"restored from checkpoint {ckpt} (text values)"
        if change is not None and worker.chief:  # recorded, so a restart before the base keeps it due
            log.info("%s: tables restored (%s): the next export is a base", worker.who, change)
            state.base_due = change
            state.save(cfg.state_dir)
    elif (state.exports or state.pending) and worker.chief and state.base_due is None:
        # versions are out but no checkpoint was taken: the tables start empty and every
        # partition is trained again, so the next export replaces the whole served table
        state.base_due = "no checkpoint: trained again from the start hour"
        state.save(cfg.state_dir)
    if (state.exports or state.pending) and worker.chief and state.base_due is None and Lifecycle.of(cfg).evicts:
        # the served chain's keys are known from a base on (runtime.trainer.served): until
        # one, an evicted key could not be deleted from the cube
        state.base_due = "feature eviction: the served keys are known again from a base"
        state.save(cfg.state_dir)
    published = state.published_hour()  # read before trainer 0 finishes a pending export
    if worker.chief and state.pending is not None:
        export_point.finish_pending(worker, cfg, state, ckroot)
    hour = state.partition(next_hour, "state next_hour")
    tr = tracking.start_training(cfg, job)
    try:
        out = _follow(worker, cfg, test_files, job, state, hour, end, ckpt, ckroot, tr, stop, published)
    except BaseException:
        tr.close(status="FAILED")
        raise
    tr.close()
    return out


def _follow(worker, cfg: TrainConfig, test_files, job: dict, state: OnlineState, hour: partitions.Partition, end,
            ckpt, ckroot: str, tr, stop, published: partitions.Partition) -> dict:
    """``run``'s loop over the partitions from ``hour`` (logging to the tracker ``tr``);
    partitions before ``published`` are in versions already out (trained again after a
    restore: their export points are passed over, module docstring)."""
    since_export = 0
    records: list[PartitionResult] = []
    load_s = 0.0
    t_job = time.monotonic()
    m = trainer_metrics()
    t_export = -float("inf")  # the first boundary of this run exports (runtime.trainer.cadence)
    untrained = [hour]  # the first partition not trained yet (partitions_waiting counts from it)
    gate = data_gate.DataGate(cfg, worker.slots) if worker.chief and data_gate.active(cfg) else None
    ev = model_eval.Collector(EVAL_ROWS, cfg.gate_eval_rows) if worker.chief else None  # each version's evaluation
    served = ServedKeys() if worker.chief else None
    shrinks = ShrinkPoints(worker, cfg, since=state.checkpoint_since_shrink if ckpt is not None else 0)
    if worker.chief:
        m.count_waiting(waiting_counter(cfg.data_root, lambda: untrained[0]))
    while (end is None or hour <= end) and not stop.requested:
        if not _wait_for(cfg, hour, stop):
            break
        landed = int(time.time())  # found complete now (within --poll-seconds of its _SUCCESS when waited for)
        untrained[0] = hour.next()
        files = partitions.files(cfg.data_root, hour)
        t_load = time.monotonic()
        rec = PartitionResult(hour=str(hour), rows=0)
        scored = worker.chief and bool(state.exports or ckpt is not None or any(not r.quarantined for r in records))
        # every worker loads its shard; trainer 0 scores the model (EVAL_ROWS) and gates it
        verdict = data_gate.admit(worker, gate, cfg, str(hour), hour.location(cfg.data_root), files, lambda staged: (
            data_gate.score(worker, staged, rec, EVAL_ROWS) if scored else (None, None)))
        load_s += time.monotonic() - t_load
        step = tracking.partition_step(cfg.start_hour, rec.hour, cfg.partition_minutes)
        rec.gate_seconds = round(verdict.seconds, 4) if worker.chief and data_gate.active(cfg) else None
        if verdict.loaded is not None:
            ds, staged = verdict.loaded
            rec.rows = staged.rows
            if ev is not None:  # the rows set aside, scored by the model before this partition
                ev.before(worker, staged, rec.hour, scored)
            # nobody trains the partition before trainer 0 has scored the model on it: the
            # others' pushes would otherwise leak this hour into the "before" AUC
            worker.barrier()
            st = worker.train_pass(ds, f"partition {hour}", staged.rows)
            ds.release_memory()
            rec.train_auc, rec.seconds = round(st.train_auc, 6), st.seconds
            worker.sync()
            tr.partition(step, rec, st.loss, fedrows.total(worker, rec.rows), hour.location(cfg.data_root))
            m.partition_done(hour.next().start.timestamp(), rec.auc_before)
            shrinks.trained(staged.ids_seen)
            since_export += 1
        elif worker.chief:
            rec.quarantined = verdict.anomalies
            tr.quarantine(step, rec.hour, verdict.anomalies or [])
        records.append(rec)
        hour = hour.next()
        fresh = hour > published  # not in a version already out
        if fresh and verdict.loaded is not None:
            state.since_base += 1
            state.since_checkpoint += 1
        last = end is not None and hour > end
        # trainer 0's clock decides (every trainer calls agree, in the same order)
        due = cadence.export_due(since_export, time.monotonic() - t_export, cfg.patch_every_seconds)
        if cfg.patch_every_seconds > 0:
            due = bool(fedrows.agree(worker, int(due)))
        # a stop exports only in one process: in a PS job the others may not have stopped
        exported, ver = False, None
        if since_export and (due or last or (stop.requested and worker.shard[1] == 1)):
            since_export, t_export = 0, time.monotonic()
            if not fresh:
                log.info("%s: partitions before %s are in published versions: trained again after the restore, "
                         "their rows go into the next export", worker.who, hour)
            else:
                exported = True
                ver = export_point.export_point(worker, cfg, state, hour, landed=landed, ev=ev, served=served)
                if ver is not None:
                    rec.version = ver.id
                    tr.version(step, ver.model_dump(), tracking.published_model_meta(cfg.output, rec.version))
        # after the version is out: eviction, then a checkpoint, cost the next partition
        if verdict.loaded is not None and shrinks.due():
            done = shrinks.run(served)
            if done is not None:
                rec.shrink_seconds, rec.table_rows, rec.evicted = done["seconds"], done["table_rows"], done["evicted"]
        if exported and fedrows.agree(worker, int(cadence.checkpoint_due(
                state.since_checkpoint, cfg.partition_minutes, cfg.checkpoint_every_minutes, last))):
            export_point.checkpoint(worker, cfg, state, hour, ckroot, ver, shrinks.since)
    worker.budget.finish()
    # every partition is one pass over its rows (train_pass checks the count)
    examples = sum(r.rows for r in records)  # a quarantined partition's rows are 0
    train_s = sum(r.seconds or 0.0 for r in records)
    out = {**job, "mode_online": "continuous", "next_hour": str(hour),
           "partitions": [r.model_dump() for r in records], "examples": examples, "rows": examples,
           "load_seconds": round(load_s, 3), "train_seconds": round(train_s, 3),
           "examples_per_s": round(examples / max(train_s, 1e-9), 1),
           "examples_per_s_with_load": round(examples / max(train_s + load_s, 1e-9), 1),
           "wall_seconds_online": round(time.monotonic() - t_job, 1)}
    if worker.chief:
        final = OnlineState.load(cfg.state_dir) or state
        out["exports"] = [e.model_dump() for e in final.exports]
        if final.exports:
            out["version"] = final.exports[-1].id
        out["test_auc"] = [r.auc_before for r in records if r.auc_before is not None and r.quarantined is None]
        log.info("%s: continuous training stopped before %s: %d partition(s) trained, %d version(s) exported",
                 worker.who, hour, len(records), len(final.exports))
    return out
