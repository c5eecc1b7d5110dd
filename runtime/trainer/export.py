"""Export of one version: dense inference model, model_meta.json, sparse SequenceFiles,
donefile line (layout: docs/contracts.md "A version on the file server").

Order: every file of ``versions/<id>/`` is written (to a local staging directory, then
``runtime.storage.upload_tree`` to the root: a directory or the file server's URL), and
only then is the line appended to ``<root>/donefile/base.txt``, so a reader never sees a
half-written version.

Sparse table text (``fleet.save_one_table(0, dir, 0)``, Paddle 3.0.0, SparseAccessor with
the Adam rule): ``dir/000/part-<pserver>-<shard>.gz``, lines ``<uint64 key> <floats>``;
columns: slot, unseen_days, delta_score, show, click, embed_w, 4 optimizer-state values,
embedx_w (dim-1 values), optimizer state. The embedding is ``[embed_w] + embedx_w``
(columns 5 and 10..10+dim-2); a row with only 10 columns has embedx = 0 (what the
parameter-server pull returns for it). Source: measured, ../shared/notes/paddle-ps.md,
and checked by tests/trainer (exported predictions == trained program's predictions).
"""
from __future__ import annotations

import glob
import gzip
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from runtime import storage
from runtime.trainer import features as F

log = logging.getLogger(__name__)

EMBED_W_COL = 5
EMBEDX_COL = 10
PART_ROWS = 1 << 20  # rows per SequenceFile part


class ExportError(RuntimeError):
    """The export could not be completed; the message says which step and why."""


def read_saved_table(table_dir: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Reads the text files of ``fleet.save_one_table`` under ``table_dir`` ->
    ``(keys uint64[n], values float32[n,dim])`` (layout: module docstring).

    Every part file under ``table_dir`` (any depth) is read, so several pservers, each
    writing its own ``part-<pserver>-<shard>`` files into the same directory, give the
    whole table.

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
            vs[i, 0] = float(cols[EMBED_W_COL])
            if len(cols) >= EMBEDX_COL + dim - 1:
                vs[i, 1:] = [float(x) for x in cols[EMBEDX_COL:EMBEDX_COL + dim - 1]]
        keys_l.append(ks)
        vals_l.append(vs)
    keys = np.concatenate(keys_l) if keys_l else np.zeros(0, np.uint64)
    values = np.concatenate(vals_l) if vals_l else np.zeros((0, dim), np.float32)
    return keys, values


def previous_id(root: str) -> int:
    """The largest version id in ``root``'s donefiles (0 if none)."""
    ids = [r["id"] for name in ("base.txt", "patch.txt")
           for r in storage.read_donefile(storage.join(root, "donefile", name))]
    return max(ids, default=0)


def new_version_id(root: str) -> int:
    """``max(unix seconds, previous id + 1)``."""
    return max(int(time.time()), previous_id(root) + 1)


def write_dense(stage: Path, slots, dim: int, layers, exe, check_rows: int = 64) -> dict:
    """Builds the dense inference program, copies the trained head's parameters into it by
    name (from the global scope), saves ``stage/inference.{json|pdmodel,pdiparams}`` and
    checks that ``paddle.inference`` loads it and predicts like the program (random
    inputs, max abs diff <= 1e-5). Returns ``{"files": [...], "check_max_abs_diff": x}``.
    Raises ``ExportError`` if the check fails."""
    import paddle

    from runtime.trainer import model as M

    net = M.build_infer(len(slots), dim, tuple(layers))
    src = paddle.static.global_scope()
    scope = paddle.static.Scope()
    place = paddle.CPUPlace()
    with paddle.static.scope_guard(scope):
        exe2 = paddle.static.Executor(place)
        exe2.run(net.startup)
        for name in M.dense_param_names(tuple(layers)):
            var = src.find_var(name)
            if var is None:
                raise ExportError(f"dense parameter {name} not found in the trained scope")
            scope.var(name).get_tensor().set(np.array(var.get_tensor()), place)
        prefix = str(stage / "inference")
        feed_vars = [net.dense] + net.embs
        paddle.static.save_inference_model(prefix, feed_vars, [net.prob], exe2, program=net.main)
        rng = np.random.default_rng(0)
        feed = {"dense_input": rng.random((check_rows, F.NUM_DENSE), dtype=np.float32)}
        for i in range(len(slots)):
            feed[f"emb_{i + 1}"] = (rng.standard_normal((check_rows, dim)) * 0.05).astype(np.float32)
        (want,) = exe2.run(net.main, feed=feed, fetch_list=[net.prob])
    files = sorted(p.name for p in stage.iterdir() if p.name.startswith("inference."))
    got = predict_dense(stage, feed)
    diff = float(np.max(np.abs(np.asarray(want).ravel() - got.ravel())))
    if not diff <= 1e-5:
        raise ExportError(f"dense model check: paddle.inference predictions differ by {diff}")
    return {"files": files, "check_max_abs_diff": diff}


def model_files(model_dir: str | os.PathLike) -> tuple[str, str]:
    """(program file, params file) of a dense model directory (``inference.json`` or
    ``inference.pdmodel``, ``inference.pdiparams``)."""
    d = Path(model_dir)
    for prog in ("inference.json", "inference.pdmodel"):
        if (d / prog).exists():
            return str(d / prog), str(d / "inference.pdiparams")
    raise ExportError(f"{model_dir}: no inference.json or inference.pdmodel")


def predict_dense(model_dir: str | os.PathLike, feed: dict) -> np.ndarray:
    """Runs the exported dense model with ``paddle.inference`` on ``feed`` (name -> array);
    returns ``prob`` float32[n,1]."""
    import paddle.inference as pi

    prog, params = model_files(model_dir)
    config = pi.Config(prog, params)
    config.disable_gpu()
    config.disable_glog_info()
    config.set_cpu_math_library_num_threads(1)
    pred = pi.create_predictor(config)
    for name in pred.get_input_names():
        h = pred.get_input_handle(name)
        h.copy_from_cpu(np.ascontiguousarray(feed[name], dtype=np.float32))
    pred.run()
    out = pred.get_output_handle(pred.get_output_names()[0])
    return out.copy_to_cpu()


def write_sparse(stage: Path, keys: np.ndarray, values: np.ndarray) -> list[dict]:
    """Writes ``stage/part-NNNNN`` SequenceFiles (raw style: key uint64 LE, value
    float32[dim] LE; ``runtime.cube.seqfile``), ``PART_ROWS`` rows each, keys sorted.
    Returns ``[{"file", "count", "bytes"}]``."""
    from runtime.cube.seqfile import write_sequence_file

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


def export_version(cfg, slots, keys: np.ndarray, values: np.ndarray, metrics: dict, exe=None,
                   version_id: int | None = None) -> dict:
    """Writes and publishes one base version under ``cfg.output`` (dir or URL).

    ``keys``: uint64[n] feasigns, ``values``: float32[n,dim] embeddings. Returns the
    donefile record (``id``, ``key``, ``input``, ``model``, ``dim``, ``count``).
    Raises ``ExportError`` / ``storage.LocationError``.
    """
    root = cfg.output
    token = storage.read_token(cfg.upload_token_file)
    dim = int(cfg.embedding_dim)
    if values.shape != (len(keys), dim):
        raise ExportError(f"sparse values shape {values.shape}, expected ({len(keys)}, {dim})")
    vid = int(version_id) if version_id is not None else new_version_id(root)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="elastic-ctr-export-") as tmp:
        stage = Path(tmp)
        (stage / "dense").mkdir()
        (stage / "sparse").mkdir()
        dense_info = write_dense(stage / "dense", slots, dim, cfg.layers, exe)
        parts = write_sparse(stage / "sparse", keys, values)
        feeds = ["dense_input"] + [f"emb_{i + 1}" for i in range(len(slots))]
        meta = {
            "version": vid,
            "created": int(time.time()),
            "features": F.feature_spec(cfg.format, slots),
            "embedding_dim": dim,
            "normalization": F.NORMALIZATION,
            "feeds": feeds,
            "feed_shapes": {"dense_input": [-1, F.NUM_DENSE], **{f: [-1, dim] for f in feeds[1:]}},
            "slot_feeds": {str(s): f"emb_{i + 1}" for i, s in enumerate(slots)},
            "fetches": ["prob"],
            "model_files": dense_info["files"],
            "layers": list(cfg.layers),
            "sparse": {"parts": parts, "count": int(len(keys)), "value": f"float32[{dim}] little-endian",
                       "key": "uint64 little-endian feasign", "style": "raw"},
            "training": {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr,
                         "sparse_shards": cfg.sparse_shards, "data_train": list(cfg.data_train)},
            "metrics": metrics,
            "export_check_max_abs_diff": dense_info["check_max_abs_diff"],
        }
        (stage / "dense" / "model_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        vroot = storage.join(root, "versions", str(vid))
        storage.upload_tree(stage, vroot, token)
    rec = {"id": vid, "key": vid, "input": f"versions/{vid}/sparse", "model": f"versions/{vid}/dense",
           "dim": dim, "count": int(len(keys))}
    storage.append_line(storage.join(root, "donefile", "base.txt"), json.dumps(rec), token)
    log.info("exported version %d to %s: %d keys, dim %d, in %.1f s", vid, root, len(keys), dim,
             time.monotonic() - t0)
    return rec
