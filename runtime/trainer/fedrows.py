"""The rows a patch carries: the feasigns the trainers FED since the last export point, with
their values as the table holds them now (``runtime.trainer.online`` cuts patches with it).

Why these rows and only these: a sparse row changes only when a batch pushes a gradient for
its feasign (async PS: the pserver's Adam rule updates the pushed keys only; single process:
``Adam(lazy_mode=True)`` updates only the looked-up rows), and a trainer pushes exactly the
feasigns its batches fed. So the union over the trainers of the feasigns staged since the
last export (``Worker.keys_seen``, collected by ``runtime.trainer.dataset.stage``) holds
every row that may differ from the last export, and new rows too. The cost follows the
hour's data, not the table: no full save and no diff with the previous export.

Parameter servers: every trainer writes its feasigns (``keys-<trainer>.npy``, uint64[m]
sorted) into ``<--table-dir>/elastic-ctr-fed-<n>/`` (``n`` agreed with gloo), trainer 0
reads their union and PULLS the rows from the pservers with the inference program
(``distributed_lookup_table`` with the table's own values: its ``embedx_w``, the same
floats the trainers pull; a row whose ``embedx`` part was never created, a feasign not
admitted, pulls zeros), ``PULL_ROWS`` feed rows x S slots per run. The pulled
values are the pserver's float32 values exactly, not the 6-digit text of a table save.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile

import numpy as np

log = logging.getLogger(__name__)

PULL_ROWS = 4096  # feed rows per pull run: PULL_ROWS x S keys


def agree(worker, value: int) -> int:
    """Trainer 0's ``value`` on every trainer of a parameter-server job (gloo all-reduce of
    trainer 0's value and zeros); a single process returns ``value``."""
    if getattr(worker, "role", None) is None:
        return int(value)
    from paddle.distributed import fleet

    mine = float(value) if worker.chief else 0.0
    return int(np.asarray(fleet.util.all_reduce(np.array([mine]), "sum")).ravel()[0])


def total(worker, value: int) -> int:
    """The sum of every trainer's ``value`` (gloo all-reduce; every trainer calls it, in the
    same order as the job's other collectives); a single process returns ``value``."""
    if getattr(worker, "role", None) is None:
        return int(value)
    from paddle.distributed import fleet

    return int(np.asarray(fleet.util.all_reduce(np.array([float(value)]), "sum")).ravel()[0])


def gather_keys(worker, purpose: str = "patch rows", keys: np.ndarray | None = None) -> np.ndarray | None:
    """The union of every trainer's fed feasigns (``keys``, uint64[m]; default
    ``worker.keys_seen``) on trainer 0 (uint64[k], sorted, unique), ``None`` on the others.
    Every trainer calls it (barriers). Raises ``RuntimeError`` starting with ``purpose`` and
    naming the directory when a trainer's file is missing (``--table-dir`` not shared by
    the trainers)."""
    from runtime.trainer.config import TABLE_DIR_PREFIX

    seen = keys if keys is not None else getattr(worker, "keys_seen", None)
    seen = np.zeros(0, np.uint64) if seen is None else seen
    if getattr(worker, "role", None) is None:
        return np.unique(seen)
    nonce = agree(worker, int(np.random.default_rng().integers(1, 1 << 30)))
    base = worker.cfg.table_dir or os.path.dirname(tempfile.mkdtemp(prefix=TABLE_DIR_PREFIX))
    shared = os.path.join(base, f"elastic-ctr-fed-{nonce}")
    os.makedirs(shared, exist_ok=True)
    np.save(os.path.join(shared, f"keys-{worker.role.trainer_id}.npy"), seen)
    worker.barrier()
    if not worker.chief:
        worker.barrier()
        return None
    try:
        parts = [np.load(os.path.join(shared, f"keys-{i}.npy")) for i in range(worker.role.trainers)]
    except OSError as exc:
        raise RuntimeError(f"{purpose}: the trainers' fed feasigns are not all in {shared} ({exc}): "
                           "--table-dir must be a directory shared by every trainer") from None
    finally:
        worker.barrier()
        shutil.rmtree(shared, ignore_errors=True)
    from runtime.trainer.dataset import distinct

    return distinct(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)


def pull(worker, keys: np.ndarray, rows: int = PULL_ROWS) -> np.ndarray:
    """float32[n, dim]: the rows of ``keys`` (uint64[n], none 0: Paddle's feed drops a 0)
    pulled from the pservers through ``worker.test_program`` (module docstring): the
    embedding the model uses, zeros for a feasign not admitted or not in the table (a pull
    creates no row in Paddle 3.0.0: ``pserver_create_value_when_push`` is on, measured)."""
    from runtime.trainer import datafeed

    dim = int(worker.cfg.embedding_dim)
    S = len(worker.slots)
    names = [e.name for e in worker.net.embs]
    out = np.empty((len(keys), dim), np.float32)
    per = S * rows
    exe = worker._predict_exe()
    for s in range(0, len(keys), per):
        chunk = keys[s:s + per]
        n = len(chunk)
        r = -(-n // S)
        pad = np.full(r * S, chunk[0], dtype=np.uint64)
        pad[:n] = chunk
        ids = pad.reshape(S, r).T.view(np.int64)  # column i: slot i's keys, pad[i*r:(i+1)*r]
        feed = {datafeed.DENSE_VAR: np.zeros((r, worker.net.dense.shape[1]), np.float32),
                datafeed.LABEL_VAR: np.zeros((r, 1), np.int64)}
        for i in range(S):
            feed[datafeed.slot_var(i)] = np.ascontiguousarray(ids[:, i:i + 1])
        got = exe.run(worker.test_program, feed=feed, fetch_list=names)
        vals = np.concatenate([np.asarray(g, dtype=np.float32).reshape(r, dim) for g in got])
        out[s:s + n] = vals[:n]
    return out


def table_diff(prev_keys: np.ndarray, prev_values: np.ndarray, keys: np.ndarray,
               values: np.ndarray) -> np.ndarray:
    """Indices into ``keys`` of the rows that are new or whose values differ bitwise from
    the previous export. ``prev_keys``/``keys``: uint64[m]/[n] (unique, any order),
    ``prev_values``/``values``: float32[m, d]/[n, d]. Returns int64[k], ascending."""
    if len(prev_keys) == 0:
        return np.arange(len(keys), dtype=np.int64)
    order = np.argsort(prev_keys, kind="stable")
    sk = prev_keys[order]
    pos = np.searchsorted(sk, keys)
    pos_c = np.minimum(pos, len(sk) - 1)
    found = sk[pos_c] == keys
    changed = ~found
    idx = np.flatnonzero(found)
    a = np.ascontiguousarray(values[idx], dtype=np.float32).view(np.uint32)
    b = np.ascontiguousarray(prev_values[order[pos_c[idx]]], dtype=np.float32).view(np.uint32)
    changed[idx] = (a != b).any(axis=1)
    return np.flatnonzero(changed).astype(np.int64)


def apply_patch(keys: np.ndarray, values: np.ndarray, patch_keys: np.ndarray,
                patch_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A table (uint64[n], float32[n, d]) with a patch's rows replacing or adding rows and
    its zero rows deleting theirs, as the cube does (``runtime.trainer.served``); returns
    it sorted by key."""
    k = np.concatenate([patch_keys, keys])
    v = np.concatenate([patch_values, values])
    uniq, first = np.unique(k, return_index=True)  # the patch's row wins (it comes first)
    live = v[first].any(axis=1)
    return uniq[live], v[first][live]
