"""The dense backends: what runs a version's dense network in serving (the owner of their
names: serving's ``--dense-backend``, the stack key ``denseBackend`` and the benchmarks
use these).

* ``onnxruntime`` (the default): ONNX Runtime on the version's ``model.onnx``
  (``runtime.inference_onnx``); a version without one (its ``model_meta.json`` says why,
  or it was exported without an ONNX copy) runs on Paddle Inference instead, which must
  then be installed (the ``serving-paddle`` image, or the ``paddle`` extra).
* ``paddle``: Paddle Inference on the program and parameters (``runtime.inference``).

Neither runtime is imported before a version needs it.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

from runtime.formats.model_meta import ModelMeta

log = logging.getLogger(__name__)

ONNXRUNTIME, PADDLE = "onnxruntime", "paddle"
BACKENDS = (ONNXRUNTIME, PADDLE)
DEFAULT = ONNXRUNTIME
#: the Open Inference Protocol's model ``platform`` per backend (Triton's names)
PLATFORMS = {ONNXRUNTIME: "onnxruntime_onnx", PADDLE: "paddle_inference"}


def check(name: str) -> str:
    """``name`` if it is a backend; else ``ValueError`` naming the choices."""
    if name not in BACKENDS:
        raise ValueError(f"dense backend {name!r}: expected one of {', '.join(BACKENDS)}")
    return name


def paddle_installed() -> bool:
    """Whether Paddle can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("paddle") is not None


class Loaded:
    """A version's predictor (``predict(dense float32[n,13], emb float32[S*n,dim]) ->
    float32[n,1]``), the ``backend`` that runs it and, when that is not the one asked
    for, ``fallback`` (why)."""

    def __init__(self, predictor, backend: str, fallback: Optional[str] = None):
        self.predictor, self.backend, self.fallback = predictor, backend, fallback


def load(model_dir: str | os.PathLike, meta: ModelMeta, backend: str = DEFAULT, pool_size: int = 1) -> Loaded:
    """The predictor of the dense model in ``model_dir`` (``meta``: its metadata) on
    ``backend``, falling back from ``onnxruntime`` to ``paddle`` for a version without
    ``model.onnx`` (module docstring; logged).

    Raises ``runtime.inference.PredictorError``: the model cannot be loaded, or the
    version needs Paddle Inference and Paddle is not installed (naming the version's
    reason and the image that has it); ``ValueError`` for an unknown backend."""
    from runtime.inference import PredictorError

    check(backend)
    fallback = None
    if backend == ONNXRUNTIME:
        if meta.onnx_file:
            from runtime.inference_onnx import OnnxPredictor

            return Loaded(OnnxPredictor(model_dir, meta, pool_size), ONNXRUNTIME)
        fallback = (f"version {meta.version} has no ONNX model ("
                    f"{meta.onnx.error if meta.onnx is not None else 'exported without one'})")
        if not paddle_installed():
            raise PredictorError(f"{model_dir}: {fallback}, and Paddle Inference, which runs such a version, is not "
                                 f"installed here (the serving-paddle image, or pip install 'elastic-ctr[paddle]')")
        log.warning("%s: served by Paddle Inference", fallback)
    elif not paddle_installed():
        raise PredictorError(f"{model_dir}: dense backend {PADDLE!r} asked for, and Paddle is not installed here (the "
                             f"serving-paddle image, or pip install 'elastic-ctr[paddle]'); or use {ONNXRUNTIME!r}")
    from runtime.inference import DensePredictor

    return Loaded(DensePredictor(model_dir, meta, pool_size), PADDLE, fallback)
