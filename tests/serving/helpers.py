"""Test helpers for serving: a tiny dense model in the export layout, and a fake cube.

``make_version(root, version, seed)`` writes ``root/versions/<v>/dense`` (a Paddle
inference program with feeds ``dense_input`` float32[n,13] and ``emb_1..emb_26``
float32[n,dim], output probability float32[n,1]; ``model_meta.json``) and appends the
donefile line, exactly as docs/contracts.md describes the trainer's export. The
embedding table is returned (dict feasign -> float32[dim]) for a ``FakeCube``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from runtime.trainer import features

DIM = 4

_MAKE_MODEL = r"""
import os, sys, json
os.environ.setdefault("GLOG_minloglevel", "2")
import numpy as np, paddle
paddle.enable_static()
out, dim, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
paddle.seed(seed); np.random.seed(seed)
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    dense = paddle.static.data("dense_input", [-1, 13], "float32")
    embs = [paddle.static.data(f"emb_{i}", [-1, dim], "float32") for i in range(1, 27)]
    x = paddle.concat(embs + [dense], axis=1)
    x = paddle.static.nn.fc(x, 16, activation="relu")
    prob = paddle.nn.functional.sigmoid(paddle.static.nn.fc(x, 1))
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
paddle.static.save_inference_model(os.path.join(out, "inference"), [dense] + embs, [prob], exe, program=main)
"""


def make_models(out_dirs: list[Path], dim: int = DIM, seeds: list[int] | None = None) -> None:
    """Writes one dense model per directory (one subprocess each: Paddle's static mode
    stays out of the test process). Even positions are saved as a PIR program
    (``inference.json``, Paddle 3's default), odd ones as a legacy ProgramDesc
    (``inference.pdmodel``, what the trainer's export writes under FLAGS_enable_pir_api=0),
    so both loaders are exercised."""
    seeds = seeds or list(range(len(out_dirs)))
    for i, (d, s) in enumerate(zip(out_dirs, seeds)):
        d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, FLAGS_enable_pir_api="0" if i % 2 else "1")
        subprocess.run([sys.executable, "-c", _MAKE_MODEL, str(d), str(dim), str(s)], check=True,
                       capture_output=True, timeout=120, env=env)
        assert (d / ("inference.pdmodel" if i % 2 else "inference.json")).exists(), os.listdir(d)


def write_meta(d: Path, version: int, dim: int = DIM) -> None:
    meta = {"version": version, "embedding_dim": dim, "features": features.feature_spec("criteo"),
            "normalization": features.NORMALIZATION,
            "feeds": ["dense_input"] + [f"emb_{i}" for i in range(1, 27)],
            "fetches": ["prob"]}
    (d / "model_meta.json").write_text(json.dumps(meta))


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
    embeddings from ``table`` (missing = 0), Paddle inference directly. float32[n]."""
    from paddle import inference

    d = Path(model_dir)
    prog = d / "inference.json" if (d / "inference.json").exists() else d / "inference.pdmodel"
    cfg = inference.Config(str(prog), str(d / "inference.pdiparams"))
    cfg.disable_gpu()
    cfg.set_cpu_math_library_num_threads(1)
    cfg.disable_glog_info()
    if prog.suffix == ".json":
        cfg.enable_new_ir(True)
        cfg.enable_new_executor(True)
    p = inference.create_predictor(cfg)
    names = list(p.get_input_names())
    dense_name = next(n for n in names if "dense" in n)
    emb_names = sorted((n for n in names if n != dense_name), key=lambda s: int(s.rsplit("_", 1)[1]))
    n = fs.shape[0]
    dim = next(iter(table.values())).shape[0]
    p.get_input_handle(dense_name).copy_from_cpu(features.normalize_dense(dense_raw))
    for s, name in enumerate(emb_names):
        e = np.stack([table.get(int(k), np.zeros(dim, np.float32)) for k in fs[:, s]]).astype(np.float32)
        p.get_input_handle(name).copy_from_cpu(e.reshape(n, dim))
    p.run()
    return p.get_output_handle(p.get_output_names()[0]).copy_to_cpu().ravel()
