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

The state file (``--state-dir/online-state.json``) is owned by ``OnlineState``.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime import tracking
from runtime.formats import donefile, partitions
from runtime.metrics.trainer import metrics as trainer_metrics, waiting_counter
# an export entry of the state file is the result line's record (one definition)
from runtime.formats.train_result import ExportResult as ExportRecord
from runtime.formats.statefile import read_record, write_atomically
from runtime.formats.train_result import PartitionResult
from runtime.trainer import cadence, data_gate, fedrows, model_eval, publish
from runtime.trainer.lifecycle import Lifecycle
from runtime.trainer.served import ServedKeys, zero_rows
from runtime.trainer.shrink import ShrinkPoints
from runtime.trainer.fedrows import apply_patch, table_diff  # noqa: F401  (the patch arithmetic, tests)
from runtime.trainer.config import TrainConfig

log = logging.getLogger(__name__)

STATE_FILE = "online-state.json"
CHECKPOINTS = "checkpoints"
EXPORTS = "exports"  # --state-dir/exports/<id>/: the pending export's ROWS, the last export's SNAPSHOT
ROWS = "exported-rows.npz"  # trainer 0's copy of the rows a pending export publishes
SNAPSHOT = "exported.npz"  # the whole table at the export, where the worker holds it (single process)
EVAL_ROWS = 20_000


class OnlineState(BaseModel):
    """The continuous job's progress (module docstring): written atomically by trainer 0,
    read by every worker at start.

    ``partition_minutes``: the partitions' period (a job keeps it for its life);
    ``next_hour``: the first partition not in the last export; ``since_base``: partitions
    trained since the last base export; ``checkpoint_hour``: the first partition not in the
    last checkpoint (``None``: none taken yet), ``since_checkpoint``: partitions trained
    since it; ``pending``: an export whose rows are kept but whose donefile line may be
    missing; ``base_due``: why the next export must be a base (the tables restored into
    another layout by ``Worker.restore``, or any parameter-server restore: the checkpoint's
    values are text). A checkpoint is named after the hour that follows it
    (``checkpoint_name``). A state written before ``checkpoint_hour`` existed (a checkpoint
    at every export, taken before its pending record) reads as its checkpoint at the
    pending export, else at ``next_hour``. ``checkpoint_since_shrink``: the shrink points'
    clock (``runtime.trainer.shrink``) when the last checkpoint was taken."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    data_root: str
    start_hour: str
    partition_minutes: int = partitions.HOURLY
    next_hour: str
    base_id: Optional[int] = None
    since_base: int = 0
    checkpoint_hour: Optional[str] = None
    since_checkpoint: int = 0
    pending: Optional[ExportRecord] = None
    base_due: Optional[str] = None  # e.g. "pservers 1 -> 2" or a PS restore: the next export is a base
    checkpoint_since_shrink: int = 0  # partitions trained since the last shrink point, at the last checkpoint
    exports: list[ExportRecord] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _checkpoint_at_every_export(cls, data: Any) -> Any:
        """A state file from before ``checkpoint_hour``: its checkpoint is the pending
        export's (written before the record), else the last export's."""
        if isinstance(data, dict) and "checkpoint_hour" not in data and data.get("exports") is not None:
            data = dict(data)
            pending = data.get("pending")
            if pending:
                data["checkpoint_hour"] = str(partitions.Hour.parse(pending["hour"]).next())
            elif data["exports"]:
                data["checkpoint_hour"] = data.get("next_hour")
        return data

    @property
    def checkpoint(self) -> Optional[str]:
        """The last checkpoint's directory name under ``checkpoints/`` (None before any)."""
        return checkpoint_name(self.partition(self.checkpoint_hour)) if self.checkpoint_hour else None

    def partition(self, name: str, what: str = "state partition") -> partitions.Partition:
        """The partition ``name`` of this job's period."""
        return partitions.Partition.parse(name, what, minutes=self.partition_minutes)

    @classmethod
    def load(cls, state_dir: str) -> Optional["OnlineState"]:
        """The state in ``state_dir``, or ``None`` if there is none. Raises ``ValueError``
        naming the file when it is not a valid state."""
        return read_record(os.path.join(state_dir, STATE_FILE), cls, ValueError, "online training state")

    def save(self, state_dir: str) -> None:
        """Writes the state atomically (temporary file, fsync, rename)."""
        write_atomically(os.path.join(state_dir, STATE_FILE), self.model_dump_json(indent=1))

    def published_hour(self) -> partitions.Partition:
        """The first partition in no published (or pending) version."""
        if self.pending is not None:
            return self.partition(self.pending.hour).next()
        return self.partition(self.next_hour, "state next_hour")

    def resume_point(self) -> tuple[str, Optional[str]]:
        """``(first partition to train, checkpoint to restore or None)``: the last
        checkpoint's, or the start hour when none was taken."""
        return (self.checkpoint_hour or self.start_hour), self.checkpoint


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


def checkpoint_name(hour: partitions.Partition) -> str:
    """``checkpoints/<name>``: the checkpoint taken before ``hour`` (``YYYYMMDD-HH[MM]``)."""
    return str(hour).replace("/", "-")


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
        _finish_pending(worker, cfg, state, ckroot)
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
                ver = _export_point(worker, cfg, state, hour, landed=landed, ev=ev, served=served)
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
            _checkpoint(worker, cfg, state, hour, ckroot, ver, shrinks.since)
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


def _export_point(worker, cfg: TrainConfig, state: OnlineState, next_hour: partitions.Partition,
                  landed: Optional[int] = None, ev: Optional[model_eval.Collector] = None,
                  served: Optional[ServedKeys] = None):
    """Rows, pending state, publish, state (module docstring; the checkpoint, when one is
    due, comes after: ``_follow``). Every process calls it; returns the ``ExportRecord`` on
    trainer 0, ``None`` elsewhere. ``landed``: when the last partition was found complete
    (unix s); ``ev``: trainer 0's evaluation rows (the version's ``metrics.evaluation``,
    ``runtime.formats.version_eval``); ``served``: trainer 0's record of the served chain.

    The rows: a base is the whole table (a save, then its values pulled), a patch the
    rows of the feasigns fed since the last export point (``Worker.fed_rows``); trainer 0
    decides which and every trainer follows (``fedrows.agree``); ``ServedKeys.cut`` then
    leaves out the rows of feasigns not admitted and adds the deletions
    (``runtime.trainer.served``). Trainer 0 keeps them in ``--state-dir/exports/<id>/``
    (``ROWS``) until the export is committed, so that a restart publishes a pending export
    with the same rows."""
    is_base = bool(fedrows.agree(worker, int(cadence.base_due(state.base_id is not None, state.since_base,
                                                              cfg.partition_minutes, cfg.base_every_minutes,
                                                              forced=state.base_due is not None))))
    t0 = time.monotonic()
    if is_base:
        with publish.table_save_dir(cfg.table_dir) as save_dir:
            table = worker.full_table(save_dir, exact=True)
    else:
        table = worker.fed_rows()
    worker.reset_fed()
    rows_s = time.monotonic() - t0
    rec = None
    if worker.chief:
        keys, values = (served or ServedKeys()).cut(*table, base=is_base)
        last_hour = str(next_hour.next(-1))
        vid = donefile.new_version_id(cfg.output) if cfg.output else (state.exports[-1].id + 1 if state.exports else 1)
        rec = ExportRecord(id=vid, kind="base" if is_base else "patch", base=vid if is_base else state.base_id,
                           hour=last_hour, rows=int(len(keys)), rows_seconds=round(rows_s, 3), landed=landed,
                           deleted=int(np.count_nonzero(zero_rows(values))))
        directory = export_dir(cfg.state_dir, vid)
        shutil.rmtree(directory, ignore_errors=True)  # left by a run that died before its state
        os.makedirs(directory)
        np.savez(os.path.join(directory, ROWS), keys=keys, values=values)
        whole = worker.local_table()
        if whole is not None:
            o = np.argsort(whole[0], kind="stable")
            np.savez(os.path.join(directory, SNAPSHOT), keys=whole[0][o], values=whole[1][o])
        state.pending = rec
        state.save(cfg.state_dir)
        t2 = time.monotonic()
        if cfg.output:
            _publish(worker, cfg, rec, keys, values, ev.finish(worker) if ev is not None else None)
        rec.publish_seconds = round(time.monotonic() - t2, 3)
        rec.seconds = round(time.monotonic() - t0, 3)
        _commit(state, rec, cfg)
        if served is not None:
            served.published(keys, values, is_base)
            trainer_metrics().served_changed(None if served.keys is None else len(served.keys), served.admitted,
                                             served.deleted)
        trainer_metrics().export_done(rec.kind, rec.seconds, rec.rows, rec.id, next_hour.start.timestamp())
        log.info("%s: exported %s %d after partition %s: %d sparse rows (%d deletions; the served table: %s keys) "
                 "in %.1f s (rows %.1f s, publish %.1f s)", worker.who, rec.kind, rec.id, last_hour, rec.rows,
                 rec.deleted, "n/a" if served is None or served.keys is None else len(served.keys), rec.seconds,
                 rows_s, rec.publish_seconds)
    return rec


def _checkpoint(worker, cfg: TrainConfig, state: OnlineState, next_hour: partitions.Partition, ckroot: str,
                rec: Optional[ExportRecord], since_shrink: int = 0) -> None:
    """Every process: ``Worker.checkpoint`` into ``checkpoints/<next_hour>``; trainer 0 then
    records it in the state (with its seconds on the export ``rec``, and the shrink points'
    clock ``since_shrink``) and drops older ones."""
    name = checkpoint_name(next_hour)
    directory = os.path.join(ckroot, name)
    if worker.chief and os.path.isdir(directory):
        shutil.rmtree(directory)  # a checkpoint left by a run that died before its state
    t = time.monotonic()
    worker.checkpoint(directory)
    seconds = time.monotonic() - t
    if not worker.chief:
        return
    state.checkpoint_hour, state.since_checkpoint = str(next_hour), 0
    state.checkpoint_since_shrink = int(since_shrink)
    if rec is not None:
        rec.checkpoint_seconds = round(seconds, 3)
    state.save(cfg.state_dir)
    for old in os.listdir(ckroot):
        if old != name:
            shutil.rmtree(os.path.join(ckroot, old), ignore_errors=True)
    log.info("%s: checkpoint %s taken in %.1f s", worker.who, name, seconds)


def export_dir(state_dir: str, version_id: int) -> str:
    """``--state-dir/exports/<id>``: a pending export's rows (``ROWS``), the last export's
    table (``SNAPSHOT``, where the worker holds it)."""
    return os.path.join(state_dir, EXPORTS, str(version_id))


def _publish(worker, cfg: TrainConfig, rec: ExportRecord, keys: np.ndarray, values: np.ndarray,
             evaluation: Optional[dict] = None) -> None:
    """Publishes ``rec``'s version with its data time (``data_end``: the end of its last
    partition, ``rec.hour``; ``landed``: ``rec.landed``) on its donefile line and its
    ``evaluation`` (``runtime.formats.version_eval``) in ``model_meta.json``."""
    meta_rec = {"mode": "continuous", "test_auc": [], "trainers": None, "pservers": None, "epochs": 1,
                "evaluation": evaluation}
    data_end = int(cfg.partition(rec.hour).end.timestamp())
    publish.publish(cfg, worker.slots, keys, values, meta_rec, version_id=rec.id,
                    base_id=None if rec.kind == "base" else rec.base, data_end=data_end, landed=rec.landed)


def _commit(state: OnlineState, rec: ExportRecord, cfg: TrainConfig) -> None:
    """Marks the pending export done and moves the published hour; drops its kept rows and
    older exports' directories."""
    state.exports.append(rec)
    state.next_hour = str(state.partition(rec.hour).next())
    if rec.kind == "base":
        state.base_id, state.since_base, state.base_due = rec.id, 0, None
    state.pending = None
    state.save(cfg.state_dir)
    root = os.path.join(cfg.state_dir, EXPORTS)
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name != str(rec.id):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    rows = os.path.join(root, str(rec.id), ROWS)
    if os.path.exists(rows):
        os.unlink(rows)


def _finish_pending(worker, cfg: TrainConfig, state: OnlineState, ckroot: str) -> None:
    """After a restart: publishes the pending export again if its donefile line is
    missing (same id, same rows: ``exports/<id>/ROWS``; a state from before that layout
    kept them beside the checkpoint taken for it, ``ROWS``, or, older still, the whole
    table, ``SNAPSHOT``, the patch then cut by ``table_diff`` against the previous
    export's as it was then)."""
    rec = state.pending
    lines = donefile.read(cfg.output, rec.kind) if cfg.output else []
    if any(r.id == rec.id for r in lines):
        log.info("%s: pending %s %d was published before the restart", worker.who, rec.kind, rec.id)
    else:
        rows_file = os.path.join(export_dir(cfg.state_dir, rec.id), ROWS)
        legacy = os.path.join(ckroot, checkpoint_name(state.partition(rec.hour).next()))
        if not os.path.exists(rows_file):
            rows_file = os.path.join(legacy, ROWS)
        with np.load(rows_file if os.path.exists(rows_file) else os.path.join(legacy, SNAPSHOT)) as z:
            keys, values = z["keys"], z["values"]
        idx = np.arange(len(keys))
        if rec.kind == "patch" and not os.path.exists(rows_file):
            prev = os.path.join(ckroot, checkpoint_name(state.partition(state.next_hour)), SNAPSHOT)
            if not state.exports or not os.path.exists(prev):
                raise RuntimeError(f"pending patch {rec.id}: the previous export's table ({prev}) is missing")
            with np.load(prev) as z:
                idx = table_diff(z["keys"], z["values"], keys, values)
        log.info("%s: publishing pending %s %d again (no donefile line)", worker.who, rec.kind, rec.id)
        if cfg.output:
            _publish(worker, cfg, rec, keys[idx], values[idx])
    _commit(state, rec, cfg)
