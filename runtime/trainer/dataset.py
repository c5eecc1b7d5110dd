"""Training data for Paddle's dataset path: our readers -> MultiSlot files -> ``InMemoryDataset``.

``stage`` runs the project's readers (``runtime.trainer.readers``: Criteo TSV/CSV or slot
format, local files, globs or HTTP(S) URLs, this trainer's shard of the lines, the
bad-line budget with file and line in every warning) and writes the rows as MultiSlot
text (``runtime.trainer.datafeed``) into ``parts`` local files, one per dataset thread.
``load`` hands them to ``paddle.distributed.InMemoryDataset`` with ``pipe_command="cat"``
and ``load_into_memory()``; ``exe.train_from_dataset`` then runs the passes in C++.

Why the trainer converts instead of running a generator as the dataset's pipe command
(``fleet.MultiSlotDataGenerator``, what Paddle's examples do): Paddle swallows a failing
pipe command (its traceback goes to the log, the pass trains on 0 rows, the process exits
0), the dataset's file reader cannot open HTTP locations, the single-process mode maps
feasigns to table rows in one place, and a pipe process that imports Paddle's generator
costs ~1 s and ~300 MB per file. Here a bad input fails the trainer with the readers'
message, and ``load`` still checks that Paddle loaded exactly the rows staged.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from runtime.formats import features
from runtime.trainer import datafeed, readers

log = logging.getLogger(__name__)

STAGE_CHUNK_ROWS = 16384  # rows parsed and encoded at a time


def distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of ``a`` (uint64[...] any shape), sorted: uint64[k]. A sort and
    a neighbour compare instead of ``np.unique``'s hash table (numpy 2.4; faster on the
    long-tail rows staging sees); merging sorted runs (``distinct(np.concatenate([seen,
    new]))``) is a stable sort of two runs."""
    a = np.sort(a.ravel(), kind="stable")
    if len(a) < 2:
        return a
    keep = np.empty(len(a), bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


@dataclass
class Staged:
    """A staged shard: ``files`` (MultiSlot parts, one per dataset thread), ``rows``
    (examples written), ``seconds`` (wall time of parsing + encoding), ``holdout`` (the
    parsed rows as a ``readers.Batch`` when asked to keep them, else None), ``ids_seen``
    (the distinct feasigns, uint64[k] sorted, when asked to collect them, else None),
    ``evaluation`` (the rows set aside, not staged, with ``holdout_every``, else None)."""

    files: list[str]
    rows: int
    seconds: float
    directory: str
    holdout: readers.Batch | None = None
    ids_seen: np.ndarray | None = field(default=None, repr=False)
    evaluation: readers.Batch | None = None

    def remove(self) -> None:
        """Deletes the staged files (after Paddle loaded them)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def stage(files: Sequence[str], *, fmt: str, slots: Sequence[int], parts: int,
          shard: tuple[int, int] = (0, 1), budget: readers.BadLineBudget | None = None,
          id_map: Callable[[np.ndarray], np.ndarray] | None = None, work_dir: str | None = None,
          keep_rows: bool = False, limit: int | None = None, collect_keys: bool = False,
          holdout_every: int = 0) -> Staged:
    """Parses ``files`` (this trainer's ``shard`` of the lines) into ``parts`` MultiSlot files.

    Args:
        files: resolved input locations (``readers.resolve``).
        fmt, slots: the input format and slot list (``runtime.formats.features``).
        parts: files to write (the dataset's thread count); chunks go round-robin.
        shard: ``(index, count)``: keep the data lines ``index`` mod ``count``.
        budget: the bad-line budget (``TooManyBadLines`` past it).
        id_map: uint64[n, S] feasigns -> uint64[n, S] ids the program looks up (the
            single-process vocabulary); ``None`` = the feasigns themselves.
        work_dir: parent of the staging directory (default: the system temp dir).
        keep_rows: also return the parsed rows (``holdout``), e.g. to evaluate on them.
        limit: stop after this many rows.
        collect_keys: also return the distinct feasigns staged (``ids_seen`` uint64[k], sorted).
        holdout_every: > 0: every ``holdout_every``-th row of this shard (running index
            ``i % holdout_every == holdout_every - 1``) is set aside, not staged (never
            trained), and returned as ``evaluation``; ``rows`` counts the staged rows only.
            ``holdout`` (``keep_rows``) holds every row, set aside or not.

    Raises ``readers.TooManyBadLines``, ``storage.LocationError``, ``ValueError`` (bad
    values); the staging directory is removed on error.
    """
    if parts < 1:
        raise ValueError(f"dataset threads must be >= 1 (got {parts})")
    t0 = time.monotonic()
    directory = os.path.abspath(tempfile.mkdtemp(prefix="elastic-ctr-stage-", dir=work_dir))
    paths = [os.path.join(directory, f"part-{i:03d}.txt") for i in range(parts)]
    kept: list[readers.Batch] = []
    held: list[readers.Batch] = []
    seen_rows = 0  # rows read, set aside or not (holdout_every)
    seen: list[np.ndarray] = []
    rows = 0
    try:
        outs = [open(p, "wb") for p in paths]
        try:
            for i, b in enumerate(readers.iter_batches(files, fmt, STAGE_CHUNK_ROWS, slots, shard=shard,
                                                       budget=budget)):
                if limit is not None and rows + len(b) > limit:
                    b = readers.Batch(b.labels[:limit - rows], b.dense[:limit - rows], b.feasigns[:limit - rows])
                if keep_rows:
                    kept.append(b)
                if holdout_every > 0:
                    aside = (np.arange(seen_rows, seen_rows + len(b)) % holdout_every) == holdout_every - 1
                    seen_rows += len(b)
                    held.append(readers.Batch(b.labels[aside], b.dense[aside], b.feasigns[aside]))
                    b = readers.Batch(b.labels[~aside], b.dense[~aside], b.feasigns[~aside])
                ids = id_map(b.feasigns) if id_map is not None else b.feasigns
                outs[i % parts].write(datafeed.encode(b.dense, ids, b.labels))
                rows += len(b)
                if collect_keys:
                    seen.append(distinct(b.feasigns))
                if limit is not None and rows >= limit:
                    break
        finally:
            for f in outs:
                f.close()
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    def joined(batches: list[readers.Batch]) -> readers.Batch:
        return readers.Batch(
            np.concatenate([b.labels for b in batches]) if batches else np.zeros(0, np.int64),
            np.concatenate([b.dense for b in batches]) if batches else np.zeros((0, features.NUM_DENSE), np.float32),
            np.concatenate([b.feasigns for b in batches]) if batches else np.zeros((0, len(slots)), np.uint64))

    holdout = joined(kept) if keep_rows else None
    ids_seen = distinct(np.concatenate(seen)) if seen else (np.zeros(0, np.uint64) if collect_keys else None)
    return Staged(paths, rows, round(time.monotonic() - t0, 3), directory, holdout, ids_seen,
                  joined(held) if holdout_every > 0 else None)


def load(staged: Staged, use_vars: list, batch_size: int, threads: int):
    """An ``InMemoryDataset`` over ``staged`` (``pipe_command="cat"``), loaded into memory.

    ``use_vars``: the program's data variables in ``datafeed.use_var_names`` order.
    Raises ``RuntimeError`` when Paddle loaded another number of rows than were staged
    (Paddle does not report a failed read). The staged files are removed once loaded.
    """
    import paddle

    names = [v.name for v in use_vars]
    want = datafeed.use_var_names(len(names) - 2)
    if names != want:
        raise ValueError(f"dataset variables {names} are not in the MultiSlot order {want}")
    ds = paddle.distributed.InMemoryDataset()
    ds.init(batch_size=batch_size, thread_num=threads, use_var=use_vars, pipe_command="cat")
    ds.set_filelist(staged.files)
    ds.load_into_memory()
    loaded = int(ds.get_memory_data_size())
    staged.remove()
    if loaded != staged.rows:
        ds.release_memory()
        raise RuntimeError(f"Paddle's dataset loaded {loaded} rows of the {staged.rows} staged")
    return ds
