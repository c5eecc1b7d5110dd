"""A version's dense model run with Paddle Inference: the one place a predictor is set up
(the export's check, serving, and the tests' offline predictions use it).

The model directory holds what ``runtime.formats.model_meta`` describes: the legacy
static-graph program and its parameters (``model_files``) and ``model_meta.json``.
The program is run with the legacy executor and one math thread per predictor: for
this small DNN at small batches the fixed per-run cost dominates, and the old executor's
is the lowest.
"""
from __future__ import annotations

import os
import queue
from pathlib import Path

import numpy as np

from runtime.formats.model_meta import ModelMeta


class PredictorError(RuntimeError):
    """The dense model could not be loaded, or does not match its metadata; the message
    names the directory."""


class DensePredictor:
    """A pool of ``pool_size`` Paddle predictors of one dense model (clones share the
    weights); ``predict`` is thread-safe, each call borrowing one predictor.

    Args:
        model_dir: the version's dense directory (local).
        meta: its metadata (default: read from ``model_dir``).
        pool_size: predictors (concurrent ``predict`` calls without waiting).

    Raises:
        PredictorError: the program cannot be loaded, or its inputs and outputs are not
            the feeds and fetch ``model_meta.json`` names.
        runtime.formats.model_meta.ModelMetaError: the metadata is missing or invalid.
    """

    def __init__(self, model_dir: str | os.PathLike, meta: ModelMeta | None = None, pool_size: int = 1):
        from paddle import inference

        self.dir = Path(model_dir)
        self.meta = meta if meta is not None else ModelMeta.read(self.dir)
        prog, params = self.meta.files_in(self.dir)
        config = inference.Config(str(prog), str(params))
        config.disable_gpu()
        config.disable_glog_info()
        config.set_cpu_math_library_num_threads(1)
        config.enable_new_ir(False)
        config.enable_new_executor(False)
        config.switch_ir_optim(True)
        try:
            first = inference.create_predictor(config)
        except Exception as exc:  # Paddle raises its own error types
            raise PredictorError(f"{prog}: cannot load ({type(exc).__name__}: {exc})") from exc
        inputs, outputs = set(first.get_input_names()), set(first.get_output_names())
        if inputs != set(self.meta.feeds) or self.meta.fetch not in outputs:
            raise PredictorError(f"{prog}: inputs {sorted(inputs)} / outputs {sorted(outputs)} do not match "
                                 f"model_meta.json's feeds {self.meta.feeds} / fetch {self.meta.fetch!r}")
        self.num_slots = self.meta.num_slots
        self.dim = self.meta.embedding_dim
        self._pool: queue.SimpleQueue = queue.SimpleQueue()
        for p in [first] + [first.clone() for _ in range(max(0, pool_size - 1))]:
            handles = [p.get_input_handle(n) for n in self.meta.feeds]
            self._pool.put((p, handles, p.get_output_handle(self.meta.fetch)))

    def predict(self, dense: np.ndarray, emb: np.ndarray) -> np.ndarray:
        """``dense``: float32[n,13], normalized; ``emb``: float32[num_slots * n, dim] in
        slot-major order (rows ``s*n .. s*n+n-1`` are slot ``s``'s embeddings).
        Returns the click probabilities, float32[n,1]."""
        n = dense.shape[0]
        p, handles, out = self._pool.get()
        try:
            handles[0].copy_from_cpu(np.ascontiguousarray(dense, dtype=np.float32))
            for s, h in enumerate(handles[1:]):
                h.copy_from_cpu(emb[s * n:(s + 1) * n])
            p.run()
            return out.copy_to_cpu()
        finally:
            self._pool.put((p, handles, out))
