"""The continuous job's export points: publishing a version, recording it, and the checkpoints after it.

``export_point`` runs the steps ``runtime/trainer/online.py``'s docstring orders (keep the
rows, record the export as pending, publish, record it done, then a checkpoint when one is
due); ``finish_pending`` completes an export a restarted job found pending.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Optional

import numpy as np

from runtime.formats import donefile, partitions
from runtime.metrics.trainer import metrics as trainer_metrics
from runtime.trainer import cadence, fedrows, model_eval, publish
from runtime.trainer.config import TrainConfig
from runtime.trainer.fedrows import table_diff
from runtime.trainer.online_state import (EXPORTS, ROWS, SNAPSHOT, ExportRecord, OnlineState, checkpoint_name,
                                          export_dir)
from runtime.trainer.served import ServedKeys, zero_rows

log = logging.getLogger(__name__)


def export_point(worker, cfg: TrainConfig, state: OnlineState, next_hour: partitions.Partition,
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


def checkpoint(worker, cfg: TrainConfig, state: OnlineState, next_hour: partitions.Partition, ckroot: str,
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


def finish_pending(worker, cfg: TrainConfig, state: OnlineState, ckroot: str) -> None:
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
