"""Parameter-server checkpoints of the continuous job: what one records, its files, and
restoring it into a job with another pserver count (a resize) without losing a row.

A checkpoint is ``fleet.save_persistables(exe, dir, main, mode=0)`` (``PsWorker.checkpoint``):
every pserver writes its part of every table under ``dir/<table id>/`` on the shared
``--state-dir`` volume (Paddle 3.0.0, ``MemorySparseTable::Save`` / ``MemoryDenseTable::Save``):

* sparse table (``000``): ``part-<pserver>-<shard>.gz``, one file per table shard
  (``--pserver-table-shards``, key ``% shard_num``), gzip text lines ``<uint64 key> <floats>``
  with every column the accessor keeps (slot, unseen_days, delta_score, show, click,
  embed_w and its Adam state, embedx_w and its Adam state; ``runtime.trainer.export``),
  6 significant digits;
* dense table (``001``): ``part-<pserver>.gz``, one per pserver, its slice of the dense
  parameters, a line per element: param, Adam moment 1, moment 2 (the Adam beta powers
  are not saved by Paddle: any restore starts them again, resized or not).

Beside them trainer 0 writes ``checkpoint.json`` (``CheckpointInfo``: the pserver count,
trainers, shard count and embedding dim the checkpoint was written with).

**Does ``fleet.load_model`` load into another pserver count?** Checked against Paddle
3.0.0's sources and measured here (1 -> 2 and 2 -> 1 pservers): yes, as long as the table
shard count is the same. ``MemorySparseTable::Load`` lists the table's files, sorted, and
requires exactly ``shard_num`` of them (otherwise it logs a warning and returns -1;
``fleet.cc`` only logs "load model from path ... failed" and ``fleet.load_model`` returns
normally: measured here, the sparse table stays empty); pserver ``i`` loads files
``i * ceil(shard_num / pservers) ...``, which are exactly the shards the clients route
to it (``(key % shard_num) / ceil(shard_num / pservers)``), whichever pserver wrote them.
``MemoryDenseTable::Load`` reads the element range of its own slice across however many
files there are. So:

* same shard count (the usual resize): ``fleet.load_model`` on the checkpoint itself;
* another shard count: trainer 0 first re-lays the sparse rows out (``relayout``: every
  line copied verbatim into the file of its new shard ``key % shard_num``), and the
  pservers load that.

Either way, a restore into another layout is then **verified**: every trainer saves the
loaded tables again (``fleet.save_persistables`` into ``<state-dir>/resized/loaded``) and
trainer 0 compares them with the checkpoint, every sparse row by key and every dense line,
as text (the saved text is a deterministic function of the float32 values, so equal text
means the same floats bit for bit). A missing, extra or different row fails the job
(``CheckpointError``) before any training. The report (``resized/report.json``) and the
loaded tables of the last resize stay in ``<state-dir>/resized`` (removed at the next).
A restore with the same layout is not re-saved (restarts stay cheap), but its files are
checked (every shard file present) so that Paddle's silent partial load cannot happen.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from runtime.formats.statefile import read_record

log = logging.getLogger(__name__)

INFO_FILE = "checkpoint.json"
RESIZED = "resized"  # under --state-dir: the last resize's loaded tables and report
SPARSE_PART = re.compile(r"^part-(\d{3})-(\d{5})(\.gz)?$")
DENSE_PART = re.compile(r"^part-(\d{3})(\.gz)?$")


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, not of this kind, or was not loaded exactly; the
    message names the directory and what is wrong."""


class CheckpointInfo(BaseModel):
    """``checkpoint.json``: the job shape a parameter-server checkpoint was written with
    (``pservers``, ``trainers``, ``pserver_table_shards``: the sparse table's shard_num,
    ``embedding_dim``)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    pservers: int = Field(ge=1)
    trainers: int = Field(ge=1)
    pserver_table_shards: int = Field(ge=1)
    embedding_dim: int = Field(ge=1)


def write_info(directory: str, info: CheckpointInfo) -> None:
    """Writes ``directory/checkpoint.json`` (temporary file, then rename)."""
    tmp = os.path.join(directory, f".{INFO_FILE}.tmp")
    with open(tmp, "w") as f:
        f.write(info.model_dump_json(indent=1))
    os.replace(tmp, os.path.join(directory, INFO_FILE))


def read_info(directory: str) -> Optional[CheckpointInfo]:
    """The checkpoint's record, ``None`` for a checkpoint written before it existed.
    Raises ``CheckpointError`` naming the file when it is not a valid record."""
    return read_record(os.path.join(directory, INFO_FILE), CheckpointInfo, CheckpointError, "checkpoint record")


@dataclass(frozen=True)
class CheckpointLayout:
    """What a checkpoint's files say: ``pservers`` that wrote it, the sparse table's
    ``pserver_table_shards``, and the table directories (``sparse``: ``{table: [file names]}``
    sorted, ``dense`` likewise)."""

    pservers: int
    pserver_table_shards: int
    sparse: dict
    dense: dict
    recorded: bool = True  # False: no checkpoint.json (written before it existed)

    def describe_change(self, pservers: int, pserver_table_shards: int) -> Optional[str]:
        """``"pservers 1 -> 2"`` (and/or ``"sparse shards 8 -> 16"``) when a job with
        ``pservers`` and ``pserver_table_shards`` would hold the tables in another layout."""
        parts = []
        if self.pservers != pservers:
            parts.append(f"pservers {self.pservers} -> {pservers}")
        if self.pserver_table_shards != pserver_table_shards:
            parts.append(f"sparse shards {self.pserver_table_shards} -> {pserver_table_shards}")
        return ", ".join(parts) or None


def scan(directory: str) -> CheckpointLayout:
    """Reads a parameter-server checkpoint's layout from its files and ``checkpoint.json``.

    Raises ``CheckpointError`` naming ``directory`` when it is missing, holds no sparse
    table (e.g. a single-process checkpoint), a sparse table's shard files are not
    exactly ``part-*-00000`` .. ``part-*-<S-1>``, or the files disagree with the record."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint {directory}: missing (the pservers' checkpoints must be on a volume "
                              "shared with the trainers)")
    sparse, dense = {}, {}
    pservers_seen: set[int] = set()
    for table in sorted(os.listdir(directory)):
        tdir = os.path.join(directory, table)
        if not (table.isdigit() and os.path.isdir(tdir)):
            continue
        names = sorted(os.listdir(tdir))
        s = [n for n in names if SPARSE_PART.match(n)]
        d = [n for n in names if DENSE_PART.match(n)]
        if s and d:
            raise CheckpointError(f"checkpoint {directory}: table {table} has both sparse and dense part files")
        if s:
            shards = sorted(int(SPARSE_PART.match(n).group(2)) for n in s)
            if shards != list(range(len(shards))):
                raise CheckpointError(f"checkpoint {directory}: table {table}: shard files {shards} are not "
                                      f"0..{len(shards) - 1} (an incomplete save)")
            pservers_seen.update(int(SPARSE_PART.match(n).group(1)) for n in s)
            sparse[table] = s
        elif d:
            dense[table] = d
    if not sparse:
        raise CheckpointError(f"checkpoint {directory}: no sparse table files (not a parameter-server checkpoint)")
    counts = {len(v) for v in sparse.values()}
    if len(counts) != 1:
        raise CheckpointError(f"checkpoint {directory}: sparse tables with different shard counts {sorted(counts)}")
    shards = counts.pop()
    info = read_info(directory)
    dense_counts = {len(v) for v in dense.values()}
    if info is not None:
        pservers = info.pservers
        if info.pserver_table_shards != shards:
            raise CheckpointError(f"checkpoint {directory}: {INFO_FILE} says {info.pserver_table_shards} sparse shards, "
                                  f"the files {shards}")
    elif dense_counts:
        pservers = max(dense_counts)  # every pserver writes one file of each dense table
    else:
        pservers = max(pservers_seen) + 1
    if max(pservers_seen) >= pservers or any(c != pservers for c in dense_counts):
        raise CheckpointError(f"checkpoint {directory}: written by {pservers} pserver(s), but part files of "
                              f"pservers {sorted(pservers_seen)} and dense file counts {sorted(dense_counts)}")
    return CheckpointLayout(pservers, shards, sparse, dense, info is not None)


def _lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [ln for ln in f.read().split("\n") if ln]


def read_dense_lines(table_dir: str) -> list[str]:
    """A dense table's element lines, in order (the pservers' slices concatenated)."""
    out: list[str] = []
    for name in sorted(os.listdir(table_dir)):
        if DENSE_PART.match(name):
            out.extend(_lines(os.path.join(table_dir, name)))
    return out


def _sparse_lines(directory: str, table: str, layout: CheckpointLayout) -> list[str]:
    return [ln for n in layout.sparse.get(table, []) for ln in _lines(os.path.join(directory, table, n))]


def compare(expected_dir: str, loaded_dir: str) -> dict:
    """Compares two checkpoints' tables whatever their layouts: sparse rows by key,
    dense tables line by line. Returns ``{"rows", "missing", "extra", "changed",
    "dense_lines", "dense_changed", "equal"}`` (counts; ``equal``: nothing differs).

    The equal case (every resize) compares the sets of row lines (a key lives in one
    shard file only, ``scan``); only a difference builds the per-key maps that count it."""
    exp, got = scan(expected_dir), scan(loaded_dir)
    rep = {"rows": 0, "missing": 0, "extra": 0, "changed": 0, "dense_lines": 0, "dense_changed": 0}
    for table in sorted(set(exp.sparse) | set(got.sparse)):
        la, lb = _sparse_lines(expected_dir, table, exp), _sparse_lines(loaded_dir, table, got)
        rep["rows"] += len(la)
        if len(la) == len(lb) and set(la) == set(lb):
            continue
        a = dict(ln.partition(" ")[::2] for ln in la)
        b = dict(ln.partition(" ")[::2] for ln in lb)
        rep["missing"] += sum(1 for k in a if k not in b)
        rep["extra"] += sum(1 for k in b if k not in a)
        rep["changed"] += sum(1 for k, v in a.items() if k in b and b[k] != v)
    for table in sorted(set(exp.dense) | set(got.dense)):
        a = read_dense_lines(os.path.join(expected_dir, table)) if table in exp.dense else []
        b = read_dense_lines(os.path.join(loaded_dir, table)) if table in got.dense else []
        rep["dense_lines"] += len(a)
        rep["dense_changed"] += sum(1 for x, y in zip(a, b) if x != y) + abs(len(a) - len(b))
    rep["equal"] = not (rep["missing"] or rep["extra"] or rep["changed"] or rep["dense_changed"])
    return rep


def relayout(src: str, dst: str, pserver_table_shards: int) -> CheckpointLayout:
    """Writes ``src``'s tables into ``dst`` for ``pserver_table_shards`` table shards: each sparse
    row's line, verbatim, into ``dst/<table>/part-000-<key % pserver_table_shards>.gz``; dense
    tables copied as they are (any file count loads). Returns the new layout. The gzip
    level is 1: the files live until the pservers have loaded them."""
    lay = scan(src)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    for table in lay.sparse:
        buckets: list[list[str]] = [[] for _ in range(pserver_table_shards)]
        for ln in _sparse_lines(src, table, lay):
            buckets[int(ln[:ln.index(" ")]) % pserver_table_shards].append(ln)
        os.makedirs(os.path.join(dst, table))
        for i, lines in enumerate(buckets):
            with gzip.open(os.path.join(dst, table, f"part-000-{i:05d}.gz"), "wt", compresslevel=1) as f:
                f.write("".join(ln + "\n" for ln in lines))
    for table, names in lay.dense.items():
        os.makedirs(os.path.join(dst, table))
        for n in names:
            shutil.copy2(os.path.join(src, table, n), os.path.join(dst, table, n))
    return scan(dst)


def restore_ps(worker, directory: str) -> Optional[str]:
    """Loads the checkpoint ``directory`` into the job's pservers (every trainer calls it,
    in the same order: it holds barriers), then pulls the dense parameters. Returns the
    layout change (``CheckpointLayout.describe_change``) when the checkpoint was written by another
    pserver or shard count, else ``None``. Raises ``CheckpointError`` when the checkpoint
    is incomplete or the loaded tables differ from it (module docstring)."""
    from paddle.distributed import fleet

    layout = scan(directory)
    pservers, shards = len(worker.role.pservers), int(worker.cfg.pserver_table_shards)
    change = layout.describe_change(pservers, shards)
    work = os.path.join(worker.cfg.state_dir, RESIZED)
    source = directory
    if layout.pserver_table_shards != shards and not layout.recorded:
        # the last shard files missing look the same as fewer shards: no guess without the record
        raise CheckpointError(f"checkpoint {directory}: {layout.pserver_table_shards} sparse shard files, the job has "
                              f"{shards} (--pserver-table-shards) and no {INFO_FILE} says which count it was written with")
    if layout.pserver_table_shards != shards:
        source = os.path.join(work, "relayout")
        if worker.chief:
            t0 = time.monotonic()
            relayout(directory, source, shards)
            log.info("%s: checkpoint %s re-laid out for %d sparse shards in %.1f s", worker.who, directory, shards,
                     time.monotonic() - t0)
        worker.barrier()
    t0 = time.monotonic()
    fleet.load_model(source, 0)
    worker.sync()
    log.info("%s: checkpoint %s (%d pserver(s), %d shards) loaded into %d pserver(s) in %.1f s", worker.who,
             directory, layout.pservers, layout.pserver_table_shards, pservers, time.monotonic() - t0)
    if change is not None:
        _verify(worker, directory, work, change)
    if source != directory and worker.chief:
        shutil.rmtree(source, ignore_errors=True)
    return change


def _verify(worker, directory: str, work: str, change: str) -> None:
    """Saves the loaded tables into ``work/loaded`` and, on trainer 0, compares them with
    the checkpoint (module docstring); writes ``work/report.json``."""
    from paddle.distributed import fleet

    loaded = os.path.join(work, "loaded")
    if worker.chief:
        shutil.rmtree(loaded, ignore_errors=True)
        os.makedirs(loaded)
    worker.barrier()
    t0 = time.monotonic()
    fleet.save_persistables(worker.exe, loaded, worker.main, mode=0)
    if not worker.chief:
        return
    rep = compare(directory, loaded)
    rep.update(checkpoint=directory, change=change, seconds=round(time.monotonic() - t0, 3))
    with open(os.path.join(work, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    if not rep["equal"]:
        raise CheckpointError(f"checkpoint {directory} loaded after a resize ({change}) differs from its files: "
                              f"{rep['missing']} row(s) missing, {rep['extra']} extra, {rep['changed']} changed, "
                              f"{rep['dense_changed']} dense line(s) changed (saved under {loaded})")
    log.info("%s: resize %s: all %d sparse rows and %d dense lines of %s loaded bit for bit (checked in %.1f s)",
             worker.who, change, rep["rows"], rep["dense_lines"], directory, rep["seconds"])
