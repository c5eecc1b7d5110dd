"""Test helpers for serving: versions written by the trainer's own export, and a fake cube.

``export_version`` runs the trainer's export (``python -m runtime.trainer.export``) in a
subprocess (Paddle's static mode stays out of the test process) with a seeded, untrained
head and the given embeddings: the dense model, ``model_meta.json``, the SequenceFiles and the donefile line
are exactly what a training run publishes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from runtime.formats import features

DIM = 4
LAYERS = (16,)

def export_version(root: Path, version: int, table: dict, seed: int, layers=LAYERS) -> Path:
    """Publishes ``version`` under ``root`` (its embeddings: ``table``, feasign ->
    float32[dim]) with the trainer's export; returns its dense directory."""
    keys = np.array(sorted(table), dtype=np.uint64)
    values = np.stack([table[int(k)] for k in keys]).astype(np.float32)
    npz = Path(root) / f".table-{version}.npz"
    Path(root).mkdir(parents=True, exist_ok=True)
    np.savez(npz, keys=keys, values=values)
    r = subprocess.run([sys.executable, "-m", "runtime.trainer.export", "--root", str(root), "--version",
                        str(version), "--seed", str(seed), "--table", str(npz), "--layers", ",".join(map(str, layers))],
                       capture_output=True, text=True, timeout=180, env=dict(os.environ, GLOG_minloglevel="2"))
    npz.unlink()
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(root) / "versions" / str(version) / "dense"


def make_table(rows_feasigns: np.ndarray, seed: int, dim: int = DIM, drop_every: int = 7) -> dict:
    """Random embeddings for the feasigns of some rows (every ``drop_every``-th key left
    out, so lookups also meet missing keys)."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rows_feasigns.ravel())
    return {int(k): rng.normal(0, 0.5, dim).astype(np.float32) for i, k in enumerate(keys) if i % drop_every}


class FakeCube:
    """In-memory stand-in for ``runtime.cube.client.CubeClient``: tables per version.

    ``seek(keys, version)`` -> object with ``values`` float32[m,dim] (zeros where
    missing), ``found`` bool[m], ``version``. Raises ``ConnectionError`` when ``down``
    or the version is not held. Records (version, number of keys) per call in ``calls``.
    """

    def __init__(self, tables: dict[int, dict], dim: int = DIM):
        self.tables = tables
        self.dim = dim
        self.down = False
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def seek(self, keys: np.ndarray, version: int | None = None):
        if self.down:
            raise ConnectionError("no replica of shard 0 answers")
        if version is None:
            version = max(self.tables)
        if version not in self.tables:
            raise ConnectionError(f"version {version} not held")
        t = self.tables[version]
        vals = np.zeros((len(keys), self.dim), np.float32)
        found = np.zeros(len(keys), bool)
        for i, k in enumerate(keys.tolist()):
            v = t.get(k)
            if v is not None:
                vals[i] = v
                found[i] = True
        with self.lock:
            self.calls.append((version, len(keys)))

        class R:
            pass

        r = R()
        r.values, r.found, r.version = vals, found, version
        return r


def offline_predict(model_dir: Path, table: dict, dense_raw: np.ndarray, fs: np.ndarray) -> np.ndarray:
    """Predictions of an exported dense model for rows, computed without serving:
    embeddings from ``table`` (missing = 0), the model's predictor directly. float32[n]."""
    from runtime.inference import DensePredictor

    pred = DensePredictor(model_dir)
    n, dim = fs.shape[0], pred.dim
    emb = np.stack([table.get(int(k), np.zeros(dim, np.float32)) for k in fs.T.ravel()]).astype(np.float32)
    return pred.predict(features.normalize_dense(dense_raw), emb.reshape(fs.shape[1] * n, dim)).ravel()
