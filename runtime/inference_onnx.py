"""A version's dense model run with ONNX Runtime: the one place an ONNX Runtime session
of the dense network is set up (serving's default backend and the export's check).

The model is the version's ``model.onnx`` (``runtime.formats.model_meta.OnnxExport``),
written by the trainer's export from the Paddle inference program: the same inputs
(``dense_input`` float32[n,13], ``emb_1``..``emb_S`` float32[n,dim]) and output (``prob``
float32[n,1]). Nothing here imports Paddle.

Session options, chosen by measurement (``make bench-dense``: the trainer's default
network on this 2-core machine, µs of CPU per run at batch 1 / 256; docs/benchmarks.md):

* one intra-op thread and one inter-op thread, sequential execution: the run stays on the
  calling thread (serving scales by worker processes). Two intra-op threads: 11.1 / 229
  (the wall time at 256 halves, the CPU doubles: the pool's threads spin while waiting);
* graph optimization ``ORT_ENABLE_ALL``: 10.4 / 122 (extended and basic the same within
  noise; none: 23.4 / 149, the converter's Identity and Reshape nodes then run);
* the CPU memory arena and memory patterns on (ONNX Runtime's defaults): memory patterns
  off 12.4 / 125; the arena off the same CPU, more wall time at batch 1;
* inputs and the output bound once per batch size (``IOBinding``) to buffers each binding
  owns, which ONNX Runtime reads and writes in place (``bind_cpu_input`` keeps a NumPy
  array's memory, no copy): a run copies the caller's two arrays into them and the output
  out. The 27 inputs passed to ``InferenceSession.run`` instead: 29.9 / 139; bound anew
  from the caller's arrays on every run: 35.2 / 144; making a binding costs about 31-36,
  so each pooled binding keeps the last ``BOUND_SIZES`` batch sizes.
"""
from __future__ import annotations

import logging
import os
import queue
from collections import OrderedDict
from pathlib import Path

import numpy as np

from runtime.formats.model_meta import ModelMeta
from runtime.inference import PredictorError, check_inputs

log = logging.getLogger(__name__)

#: batch sizes whose bound buffers each pooled binding keeps (least recently used dropped)
BOUND_SIZES = 4


def version() -> str:
    """``onnxruntime <version>``. Raises ``PredictorError`` when ONNX Runtime is not installed."""
    return f"onnxruntime {_ort().__version__}"


def _ort():
    try:
        import onnxruntime
    except ImportError as exc:
        raise PredictorError(f"ONNX Runtime is not installed ({exc}): pip install onnxruntime") from None
    return onnxruntime


def session_options():
    """The ``onnxruntime.SessionOptions`` of every dense session (module docstring)."""
    ort = _ort()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_cpu_mem_arena = True
    so.enable_mem_pattern = True
    so.log_severity_level = 3  # errors only
    return so


class _Bound:
    """A batch size's buffers and the ``IOBinding`` that binds the session to them."""

    __slots__ = ("io", "dense", "emb", "out")

    def __init__(self, io, dense: np.ndarray, emb: np.ndarray, out: np.ndarray):
        self.io, self.dense, self.emb, self.out = io, dense, emb, out


class OnnxPredictor:
    """One ONNX Runtime session of a version's ``model.onnx`` (sessions are thread-safe)
    and a pool of ``pool_size`` bindings; ``predict`` is thread-safe, each call borrowing
    one binding. Same interface as ``runtime.inference.DensePredictor``.

    Each binding binds the session's inputs to two buffers of its own,
    ``float32[n, num_dense]`` and ``float32[num_slots * n, dim]`` (slot ``s``'s input is
    rows ``s*n .. s*n+n-1``), and the output to ``float32[n, 1]``, for each of the last
    ``BOUND_SIZES`` batch sizes ``n`` it ran.

    Args:
        model_dir: the version's dense directory (local).
        meta: its metadata (default: read from ``model_dir``).
        pool_size: bindings (concurrent ``predict`` calls without waiting).

    Raises:
        PredictorError: ONNX Runtime is not installed, the model cannot be loaded, or its
            inputs and output are not the feeds and fetch ``model_meta.json`` names.
        runtime.formats.model_meta.ModelMetaError: the metadata is missing or invalid, or
            names no ONNX model (its ``onnx.error`` says why).
    """

    def __init__(self, model_dir: str | os.PathLike, meta: ModelMeta | None = None, pool_size: int = 1):
        ort = _ort()
        self.dir = Path(model_dir)
        self.meta = meta if meta is not None else ModelMeta.read(self.dir)
        path = self.meta.onnx_in(self.dir)
        try:
            self.session = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
        except Exception as exc:  # ONNX Runtime raises its own error types
            raise PredictorError(f"{path}: cannot load ({type(exc).__name__}: {exc})") from exc
        inputs = {i.name: i for i in self.session.get_inputs()}
        outputs = {o.name for o in self.session.get_outputs()}
        if set(inputs) != set(self.meta.feeds) or self.meta.fetch not in outputs:
            raise PredictorError(f"{path}: inputs {sorted(inputs)} / outputs {sorted(outputs)} do not match "
                                 f"model_meta.json's feeds {self.meta.feeds} / fetch {self.meta.fetch!r}")
        self.num_slots = self.meta.num_slots
        self.num_dense = self.meta.features.num_dense
        self.dim = self.meta.embedding_dim
        for name, width in [(self.meta.dense_feed, self.num_dense)] + [(e, self.dim) for e in self.meta.emb_feeds]:
            shape = inputs[name].shape
            if len(shape) != 2 or shape[1] != width or inputs[name].type != "tensor(float)":
                raise PredictorError(f"{path}: input {name!r} is {inputs[name].type}{shape}, expected "
                                     f"tensor(float)[n, {width}]")
        self._pool: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(max(1, pool_size)):
            self._pool.put(OrderedDict())

    def predict(self, dense: np.ndarray, emb: np.ndarray) -> np.ndarray:
        """``dense``: float32[n, num_dense], normalized; ``emb``: float32[num_slots * n, dim]
        in slot-major order (rows ``s*n .. s*n+n-1`` are slot ``s``'s embeddings); n >= 1.
        Returns the click probabilities, float32[n,1] (a new array). Raises ``ValueError``
        naming the shapes (``runtime.inference.check_inputs``)."""
        n = check_inputs(dense, emb, self.num_dense, self.num_slots, self.dim)
        sizes = self._pool.get()
        try:
            b = sizes.get(n)
            if b is None:
                b = sizes[n] = self._bind(n)
                if len(sizes) > BOUND_SIZES:
                    sizes.popitem(last=False)
            else:
                sizes.move_to_end(n)
            b.dense[...] = dense
            b.emb[...] = emb
            self.session.run_with_iobinding(b.io)
            return b.out.copy()
        finally:
            self._pool.put(sizes)

    def _bind(self, n: int) -> _Bound:
        """A binding of the session's inputs and output to new buffers for ``n`` rows."""
        dense = np.zeros((n, self.num_dense), np.float32)
        emb = np.zeros((self.num_slots * n, self.dim), np.float32)
        out = np.zeros((n, 1), np.float32)
        io = self.session.io_binding()
        io.bind_cpu_input(self.meta.dense_feed, dense)
        for s, name in enumerate(self.meta.emb_feeds):
            io.bind_cpu_input(name, emb[s * n:(s + 1) * n])
        io.bind_output(self.meta.fetch, "cpu", 0, np.float32, out.shape, out.ctypes.data)
        return _Bound(io, dense, emb, out)

