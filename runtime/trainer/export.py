"""Export of one version: dense inference model (and its ONNX copy,
``runtime.trainer.onnx_export``), model_meta.json, sparse SequenceFiles, donefile line
(layout and formats: ``runtime.formats``).

Order: every file of ``versions/<id>/`` is written (to a local staging directory, then
``runtime.storage_write.upload_tree`` to the root: a directory or the file server's URL), then
its manifest (``runtime.formats.manifest``: size, SHA-256 and rows of every file), and
only then is the line (naming the manifest) appended to ``<root>/donefile/base.txt``, so a reader never sees a
half-written version.

Sparse table text (``fleet.save_one_table(0, dir, mode)``, Paddle 3.0.0, SparseAccessor
with the Adam rule, a table ``dim + 1`` wide: ``runtime.trainer.model.ps_table_width``):
``dir/000/part-<pserver>-<shard>.gz``, lines ``<uint64 key> <floats>``; columns: slot,
unseen_days, delta_score, show, click, embed_w, 4 optimizer-state values, embedx_w (``dim``
values), optimizer state. The embedding the model uses is ``embedx_w`` (columns
10..10+dim-1; ``embed_w`` is unused: ``runtime.trainer.lifecycle``); a row with only 10
columns has no ``embedx`` (a feasign not admitted, or one whose count decayed below the
admission threshold: the accessor writes ``embedx`` only for rows at or above it): it
reads as zeros. Measured on Paddle 3.0.0 and checked by tests/trainer (exported
predictions == trained program's predictions).
"""
from __future__ import annotations

import glob
import gzip
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from runtime import storage, storage_write
from runtime.formats import donefile, features, manifest, model_meta
from runtime.formats.donefile import DonefileRecord
from runtime.formats.model_meta import ModelMeta
from runtime.trainer import onnx_export

log = logging.getLogger(__name__)

EMBEDX_COL = 10  # the first column of embedx_w, the embedding (after the key)
PART_ROWS = 1 << 20  # rows per SequenceFile part


class ExportError(RuntimeError):
    """The export could not be completed; the message says which step and why."""


def _count(rows: dict[int, int] | None, path: str, n: int) -> None:
    """Adds ``n`` rows to ``rows[<pserver>]`` for a ``part-<pserver>-<shard>`` file."""
    if rows is not None:
        m = re.match(r"part-(\d+)-", os.path.basename(path))
        if m:
            rows[int(m.group(1))] = rows.get(int(m.group(1)), 0) + n


def read_saved_table(table_dir: str, dim: int, rows: dict[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reads the text files of ``fleet.save_one_table`` under ``table_dir`` ->
    ``(keys uint64[n], values float32[n,dim])`` (layout: module docstring).

    Every part file under ``table_dir`` (any depth) is read, so several pservers, each
    writing its own ``part-<pserver>-<shard>`` files into the same directory, give the
    whole table. ``rows``: filled with the rows read per pserver index.

    Raises ``ExportError`` if no part file is found (e.g. the pservers saved on another
    machine's file system: ``--table-dir`` must then be a shared volume) or a line has
    too few columns.
    """
    files = sorted(glob.glob(os.path.join(table_dir, "**", "part-*"), recursive=True))
    if not files:
        raise ExportError(f"sparse table: no part files under {table_dir}: the pservers write the "
                          "table on their own file system, so it must be shared with trainer 0; in "
                          "Kubernetes pass --table-dir DIR where DIR is a volume shared by the pserver "
                          "and trainer pods (ReadWriteMany), mounted at the same path in both")
    keys_l, vals_l = [], []
    for path in files:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            lines = f.read().splitlines()
        _count(rows, path, len(lines))
        if not lines:
            continue
        ks = np.empty(len(lines), dtype=np.uint64)
        vs = np.zeros((len(lines), dim), dtype=np.float32)
        for i, ln in enumerate(lines):
            parts = ln.split()
            if len(parts) < 1 + EMBEDX_COL:
                raise ExportError(f"{path} line {i + 1}: {len(parts)} columns, expected >= {1 + EMBEDX_COL}")
            ks[i] = int(parts[0])
            cols = parts[1:]
            if len(cols) >= EMBEDX_COL + dim:
                vs[i] = [float(x) for x in cols[EMBEDX_COL:EMBEDX_COL + dim]]
        keys_l.append(ks)
        vals_l.append(vs)
    keys = np.concatenate(keys_l) if keys_l else np.zeros(0, np.uint64)
    values = np.concatenate(vals_l) if vals_l else np.zeros((0, dim), np.float32)
    return keys, values


def read_saved_keys(table_dir: str, rows: dict[int, int] | None = None) -> np.ndarray:
    """uint64[n]: only the keys (first column) of the text files of ``fleet.save_one_table``
    under ``table_dir``, for a caller that pulls the values itself (``runtime.trainer.fedrows``):
    about 10x cheaper than ``read_saved_table``'s float parsing. ``rows``: filled with the
    rows read per pserver index. Raises ``ExportError`` as ``read_saved_table`` when no part
    file is found or a key is not an integer."""
    files = sorted(glob.glob(os.path.join(table_dir, "**", "part-*"), recursive=True))
    if not files:
        raise ExportError(f"sparse table: no part files under {table_dir} (see read_saved_table)")
    out = []
    for path in files:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            data = f.read()
        try:
            out.append(np.array([int(ln.split(b" ", 1)[0]) for ln in data.splitlines() if ln], dtype=np.uint64))
            _count(rows, path, len(out[-1]))
        except ValueError as exc:
            raise ExportError(f"{path}: a line whose first column is not a uint64 key ({exc})") from None
    return np.concatenate(out) if out else np.zeros(0, np.uint64)


def write_dense(stage: Path, slots: Sequence[int], dim: int, layers: Sequence[int],
                source_scope=None, seed: int = 0) -> dict:
    """Builds the dense inference program (``runtime.trainer.model.build_infer``), takes the
    head's parameters by name from ``source_scope`` (the trained scope; ``None``: the
    program's own initialization, seeded by ``seed``) and saves
    ``stage/inference.{pdmodel,pdiparams}``. Returns ``{"files": [program, params],
    "feeds": [dense feed, slot feeds...], "fetch": name}`` (what ``model_meta.json`` records).

    Raises ``ExportError`` if a parameter is missing from ``source_scope``."""
    import paddle

    from runtime.trainer import model

    paddle.enable_static()
    paddle.seed(seed)
    net = model.build_infer(len(slots), dim, tuple(layers))
    scope = paddle.static.Scope()
    place = paddle.CPUPlace()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(place)
        exe.run(net.startup)
        if source_scope is not None:
            for name in model.dense_param_names(tuple(layers)):
                var = source_scope.find_var(name)
                if var is None:
                    raise ExportError(f"dense parameter {name} not found in the trained scope")
                scope.var(name).get_tensor().set(np.array(var.get_tensor()), place)
        paddle.static.save_inference_model(str(stage / "inference"), [net.dense] + net.embs, [net.prob], exe,
                                           program=net.main)
    return {"files": [f"inference{model_meta.PROGRAM_SUFFIX}", f"inference{model_meta.PARAMS_SUFFIX}"],
            "feeds": list(net.feeds), "fetch": net.prob.name}


def check_dense(stage: Path, meta: ModelMeta, rows: int = 64) -> float:
    """Runs the saved program twice on random inputs, with the static executor and with
    ``paddle.inference`` (``runtime.inference.DensePredictor``, what serving runs), and
    returns the max abs difference of the predictions. Raises ``ExportError`` above 1e-5."""
    import paddle

    from runtime.inference import DensePredictor

    rng = np.random.default_rng(0)
    dense = rng.random((rows, features.NUM_DENSE), dtype=np.float32)
    emb = (rng.standard_normal((meta.num_slots * rows, meta.embedding_dim)) * 0.05).astype(np.float32)
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        prog, feed_names, fetch = paddle.static.load_inference_model(str(stage / "inference"), exe)
        feed = {meta.dense_feed: dense}
        feed.update({name: emb[s * rows:(s + 1) * rows] for s, name in enumerate(meta.emb_feeds)})
        (want,) = exe.run(prog, feed={k: feed[k] for k in feed_names}, fetch_list=fetch)
    got = DensePredictor(stage, meta).predict(dense, emb)
    diff = float(np.max(np.abs(np.asarray(want).ravel() - got.ravel())))
    if not diff <= 1e-5:
        raise ExportError(f"dense model check: paddle.inference predictions differ by {diff}")
    return diff


def write_sparse(stage: Path, keys: np.ndarray, values: np.ndarray) -> list[dict]:
    """Writes ``stage/part-NNNNN`` SequenceFiles (raw style: key uint64 LE, value
    float32[dim] LE; ``runtime.formats.seqfile``), ``PART_ROWS`` rows each, keys sorted.
    Returns ``[{"file", "count", "bytes"}]``."""
    from runtime.formats.seqfile_writer import write_sequence_file

    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    if len(keys) and np.any(keys[1:] == keys[:-1]):
        raise ExportError("sparse table: duplicate keys")
    out = []
    n = len(keys)
    for i, s in enumerate(range(0, max(n, 1), PART_ROWS)):
        name = f"part-{i:05d}"
        nb = write_sequence_file(str(stage / name), keys[s:s + PART_ROWS],
                                 np.ascontiguousarray(values[s:s + PART_ROWS], dtype=np.float32))
        out.append({"file": name, "count": int(min(PART_ROWS, n - s)), "bytes": int(nb)})
    return out


def export_version(root: str, *, slots: Sequence[int], fmt: str, dim: int, layers: Sequence[int],
                   keys: np.ndarray, values: np.ndarray, metrics: dict, training: dict,
                   source_scope=None, token: str | None = None, version_id: int | None = None,
                   seed: int = 0, base_id: int | None = None, data_end: int | None = None,
                   landed: int | None = None) -> DonefileRecord:
    """Writes and publishes one version under ``root`` (a directory or the file server's
    URL): ``versions/<id>/dense/`` (program, parameters, ``model.onnx`` when its conversion
    and check passed, ``model_meta.json``),
    ``versions/<id>/sparse/part-*``, then the line in ``donefile/base.txt`` (a base: the
    whole table) or, with ``base_id``, in ``donefile/patch.txt`` (a patch: ``keys`` and
    ``values`` are the rows changed since the previous version of that base; the dense
    model is whole either way).

    Args:
        slots: the slot ids (int[S]); fmt: the input format (criteo | slot).
        dim, layers: the embedding width and the head's hidden widths.
        keys: uint64[n] feasigns; values: float32[n, dim] their embeddings.
        metrics, training: free-form records stored in ``model_meta.json``.
        source_scope: the trained Paddle scope holding the head's parameters (``None``:
            the program's seeded initialization; used by tests and benchmarks).
        token: the file server's upload token; version_id: default a new id
            (``runtime.formats.donefile.new_version_id``).
        data_end, landed: the version's data time for its donefile line (unix s; None:
            not trained on time partitions).

    Returns the donefile record. Raises ``ExportError`` / ``storage.LocationError``; the
    donefile line is appended only once every file of the version is in place.
    """
    if values.shape != (len(keys), dim):
        raise ExportError(f"sparse values shape {values.shape}, expected ({len(keys)}, {dim})")
    vid = int(version_id) if version_id is not None else donefile.new_version_id(root)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="elastic-ctr-export-") as tmp:
        stage = Path(tmp)
        (stage / "dense").mkdir()
        (stage / "sparse").mkdir()
        dense = write_dense(stage / "dense", slots, dim, layers, source_scope, seed)
        conversion = onnx_export.start_conversion(stage / "dense", *dense["files"], dense["fetch"])
        parts = write_sparse(stage / "sparse", keys, values)  # while the ONNX copy is converted
        meta = ModelMeta(
            version=vid, created=int(time.time()), features=model_meta.feature_spec(fmt, slots),
            embedding_dim=dim, normalization=features.NORMALIZATION,
            feeds=dense["feeds"], fetches=[dense["fetch"]], model_files=tuple(dense["files"]),
            layers=list(layers),
            sparse={"parts": parts, "count": int(len(keys)), "value": f"float32[{dim}] little-endian",
                    "key": "uint64 little-endian feasign", "style": "raw",
                    "kind": "base" if base_id is None else "patch", "base": base_id},
            training=training, metrics=metrics, export_check_max_abs_diff=0.0)
        meta = meta.model_copy(update={"export_check_max_abs_diff": check_dense(stage / "dense", meta)})
        meta = meta.model_copy(update={"onnx": onnx_export.export_onnx(stage / "dense", meta, values,
                                                                       conversion=conversion)})
        meta.write(stage / "dense")
        man = manifest.build(stage, vid, rows={f"sparse/{p['file']}": p["count"] for p in parts})
        vdir = storage.join(root, "versions", str(vid))
        storage_write.upload_tree(stage, vdir, token)
        (stage / manifest.FILE).write_text(man.to_json())
        storage_write.upload(stage / manifest.FILE, storage.join(vdir, manifest.FILE), token)
    mloc = manifest.location(vid)
    if base_id is None:
        rec = donefile.base_record(vid, dim, int(len(keys)), data_end, landed, manifest=mloc)
    else:
        rec = donefile.patch_record(vid, int(base_id), dim, int(len(keys)), data_end, landed, manifest=mloc)
    donefile.append(root, "base" if base_id is None else "patch", rec, token)
    log.info("exported %s version %d to %s: %d keys, dim %d, in %.1f s",
             "base" if base_id is None else f"patch (base {base_id})", vid, root, len(keys), dim,
             time.monotonic() - t0)
    return rec


def _main(argv: list[str] | None = None) -> int:
    """``python -m runtime.trainer.export``: publishes a version from given embeddings (an
    ``.npz`` with ``keys`` uint64[n] and ``values`` float32[n, dim]) and a seeded, untrained
    head: the same files and donefile line as a training run. For tests and benchmarks."""
    import argparse

    from runtime.trainer import set_paddle_flags

    ap = argparse.ArgumentParser(prog="python -m runtime.trainer.export", description=_main.__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--root", required=True, help="version root (directory or file-server URL)")
    ap.add_argument("--version", type=int, required=True, help="version id")
    ap.add_argument("--table", required=True, help=".npz with keys and values")
    ap.add_argument("--seed", type=int, default=0, help="seed of the head's initialization")
    ap.add_argument("--layers", default="128,64,32", help="hidden layer widths")
    ap.add_argument("--base", type=int, default=None, help="publish a patch of this base version (its rows: the table)")
    ap.add_argument("--repeat", type=int, default=1, help="publish this many versions (ids from --version, seeds "
                                                          "from --seed) in this process and print each one's seconds")
    args = ap.parse_args(argv)
    set_paddle_flags()
    table = np.load(args.table)
    for i in range(args.repeat):
        t0 = time.monotonic()
        export_version(args.root, slots=features.DEFAULT_SLOTS, fmt="criteo", dim=int(table["values"].shape[1]),
                       layers=[int(x) for x in args.layers.split(",")], keys=table["keys"], values=table["values"],
                       metrics={}, training={}, version_id=args.version + i, seed=args.seed + i, base_id=args.base)
        if args.repeat > 1:
            print(f"export_seconds {time.monotonic() - t0:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
