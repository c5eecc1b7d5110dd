"""A version's dense model run with Paddle Inference: the one place a predictor is set up
(the export's check, serving, and the tests' offline predictions use it).

The model directory holds what ``runtime.formats.model_meta`` describes: the legacy
static-graph program and its parameters (``model_files``) and ``model_meta.json``.
The program is run with the legacy executor, one math thread per predictor and Paddle's
native CPU kernels (oneDNN off): for this small DNN at small batches the fixed per-run cost
dominates, and the old executor's is the lowest; oneDNN's kernels (Paddle 3.0 turns them on
for CPU predictors) doubled it. The inputs are bound once per batch size to buffers the
predictor owns (``Tensor.share_external_data``): a run copies the caller's two arrays into
them instead of calling ``copy_from_cpu`` once per input (27 calls). The model run alone,
CPU ms per call (``bench/bench_serving.py``'s floor, 3 runs each on this 2-core machine):
oneDNN with ``copy_from_cpu`` 0.27-0.57 at batch 1 and 0.60-1.17 at batch 256; now
0.04-0.06 and 0.30-0.55. Split (``predict`` timed in a loop over 64 batches, median of 5
passes): oneDNN off alone 0.16-0.20 / 0.45-0.69, then the bound inputs 0.06-0.08 /
0.38-0.48.

Paddle is imported through ``import_paddle`` only: importing it installs Paddle's own C++
handler for SIGTERM (below), which would take the process's graceful stop away, and
lowers the process's logging to warnings.
"""
from __future__ import annotations

import ctypes
import logging
import os
import queue
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from runtime.formats.model_meta import ModelMeta


log = logging.getLogger(__name__)

#: The signals whose handler ``import paddle`` replaces. Paddle's ``InitGLOG`` (run at
#: import) installs glog's failure signal handler with ``SignalHandle`` as its writer for
#: SIGSEGV, SIGILL, SIGFPE, SIGABRT, SIGBUS and SIGTERM; on SIGTERM it prints
#: "FatalError: `Termination signal` is detected by the operating system" and kills the
#: process, so requests in flight are dropped (found by comparing every signal's
#: ``sigaction`` before and after ``import paddle`` 3.0.0; creating predictors changes none).
PADDLE_SIGNALS = (signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGTERM)
_import_lock = threading.Lock()
# struct sigaction, copied opaquely: larger than any libc's (glibc x86_64/aarch64: 152 bytes)
_SIGACTION_BYTES = 512


def _libc_sigaction():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sigaction
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


def import_paddle():
    """Imports ``paddle`` (the first call in a process does the import) without letting it
    take SIGTERM from the process: returns the ``paddle`` module.

    Why: ``import paddle`` replaces the C-level handler of ``PADDLE_SIGNALS``
    (``sigaction``), under Python's: ``signal.getsignal`` still names the process's
    handler, but a SIGTERM now runs Paddle's, which kills the process at once (a serving
    worker imports Paddle after installing its handlers, so its graceful stop would never run).
    What works: save each signal's ``struct sigaction`` before the import (libc's
    ``sigaction``, the bytes copied as they are) and put back afterwards SIGTERM's,
    whatever it was (a Python handler, or the default: termination without Paddle's
    "FatalError"), and every other one that had a handler (a server's SIGABRT, Python's
    ``faulthandler``); where nothing had one (SIGSEGV usually), Paddle's crash report stays.
    This works from any thread, unlike ``signal.signal`` (main thread only), so a model
    first loaded by a background thread does not lose SIGTERM either. Where libc's
    ``sigaction`` cannot be called, the main thread re-installs Python's handlers instead
    (``signal.signal(sig, signal.getsignal(sig))``).

    A SIGTERM arriving during the import itself (a second or two) still meets Paddle's
    handler: callers import Paddle at startup, before they serve.

    The import also sets the root logger's level to WARNING (a serving worker's INFO
    lines, its model loads and version switches, vanished); that level is put back too.
    """
    with _import_lock:
        if "paddle" in sys.modules:
            import paddle

            return paddle
        sigaction = _libc_sigaction()
        saved: dict[int, ctypes.Array] = {}
        if sigaction is not None:
            for sig in PADDLE_SIGNALS:
                buf = ctypes.create_string_buffer(_SIGACTION_BYTES)
                if sigaction(int(sig), None, buf) == 0:
                    saved[int(sig)] = buf
        root_level = logging.root.level
        import paddle

        logging.root.setLevel(root_level)

        for sig in PADDLE_SIGNALS:
            buf = saved.get(int(sig))
            if buf is not None:
                # the handler is the struct's first member (a pointer); 0 = SIG_DFL
                had_handler = int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_void_p)], sys.byteorder) != 0
                if sig == signal.SIGTERM or had_handler:
                    sigaction(int(sig), buf, None)
            elif threading.current_thread() is threading.main_thread():
                handler = signal.getsignal(sig)
                if handler is not None and (sig == signal.SIGTERM or handler != signal.SIG_DFL):
                    signal.signal(sig, handler)
            elif sig == signal.SIGTERM:
                log.warning("paddle imported outside the main thread and libc's sigaction is not available: "
                            "SIGTERM is Paddle's now (no graceful stop)")
        return paddle


class PredictorError(RuntimeError):
    """The dense model could not be loaded, or does not match its metadata; the message
    names the directory."""


def check_inputs(dense: np.ndarray, emb: np.ndarray, num_dense: int, num_slots: int, dim: int) -> int:
    """The batch size ``n`` of a predictor's inputs: ``dense`` float32[n, num_dense] and
    ``emb`` float32[num_slots * n, dim]. Raises ``ValueError`` for an empty batch (Paddle
    3.0 crashes the process on one) and, naming the shapes, for any other shape."""
    n = dense.shape[0]
    if n < 1:
        raise ValueError(f"dense: shape {dense.shape}, an empty batch (at least one row is needed)")
    if dense.shape != (n, num_dense):
        raise ValueError(f"dense: shape {dense.shape}, expected ({n}, {num_dense}) (model_meta.json's num_dense)")
    if emb.shape != (num_slots * n, dim):
        raise ValueError(f"embeddings: shape {emb.shape}, expected ({num_slots * n}, {dim}) "
                         f"for {n} rows of {num_slots} slots")
    return n


def _dynamic_mode() -> bool:
    """Whether Paddle is in dynamic-graph mode, where tensors can be made from arrays
    (in static-graph mode, ``paddle.enable_static()`` as the trainer's export check runs,
    ``paddle.Tensor(array)`` crashes the process in Paddle 3.0)."""
    import paddle

    return paddle.in_dynamic_mode()


class _Bound:
    """One predictor of the pool with its input and output handles, and the buffers its
    inputs are bound to (``n``: the batch size they hold; None before the first call)."""

    __slots__ = ("predictor", "inputs", "output", "n", "dense", "emb", "tensors")

    def __init__(self, predictor, inputs, output):
        self.predictor, self.inputs, self.output = predictor, inputs, output
        self.n = None
        self.dense = self.emb = None
        self.tensors: list = []


class DensePredictor:
    """A pool of ``pool_size`` Paddle predictors of one dense model (clones share the
    weights); ``predict`` is thread-safe, each call borrowing one predictor.

    Each predictor's inputs are bound (``paddle.inference.Tensor.share_external_data``) to
    two buffers of its own, ``float32[n, num_dense]`` and ``float32[num_slots * n, dim]``,
    re-made and bound again when a call's batch size ``n`` differs from the last one's; a
    call copies its arrays into them (two copies instead of one ``copy_from_cpu`` per
    input). ``zero_copy=False`` feeds every input with ``copy_from_cpu`` instead (the
    reference the tests compare against), as does a call that would bind while Paddle is
    in static-graph mode (``_dynamic_mode``).

    Args:
        model_dir: the version's dense directory (local).
        meta: its metadata (default: read from ``model_dir``).
        pool_size: predictors (concurrent ``predict`` calls without waiting).
        zero_copy: bind the inputs to buffers (default) or copy each input per call.

    Raises:
        PredictorError: the program cannot be loaded, or its inputs and outputs are not
            the feeds and fetch ``model_meta.json`` names.
        runtime.formats.model_meta.ModelMetaError: the metadata is missing or invalid.
    """

    def __init__(self, model_dir: str | os.PathLike, meta: ModelMeta | None = None, pool_size: int = 1,
                 zero_copy: bool = True):
        import_paddle()
        from paddle import inference

        self.dir = Path(model_dir)
        self.meta = meta if meta is not None else ModelMeta.read(self.dir)
        prog, params = self.meta.files_in(self.dir)
        config = inference.Config(str(prog), str(params))
        config.disable_gpu()
        config.disable_glog_info()
        config.set_cpu_math_library_num_threads(1)
        config.disable_mkldnn()
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
        self.num_dense = self.meta.features.num_dense
        self.dim = self.meta.embedding_dim
        self.zero_copy = zero_copy
        self._pool: queue.SimpleQueue = queue.SimpleQueue()
        for p in [first] + [first.clone() for _ in range(max(0, pool_size - 1))]:
            handles = [p.get_input_handle(n) for n in self.meta.feeds]
            self._pool.put(_Bound(p, handles, p.get_output_handle(self.meta.fetch)))

    def predict(self, dense: np.ndarray, emb: np.ndarray) -> np.ndarray:
        """``dense``: float32[n, num_dense], normalized; ``emb``: float32[num_slots * n, dim]
        in slot-major order (rows ``s*n .. s*n+n-1`` are slot ``s``'s embeddings); n >= 1.
        Returns the click probabilities, float32[n,1]. Raises ``ValueError`` for an empty
        batch (Paddle 3.0 crashes the process on one) and, naming the shapes, when ``dense``
        is not ``[n, num_dense]`` or ``emb`` does not hold ``num_slots * n`` rows of ``dim``."""
        n = check_inputs(dense, emb, self.num_dense, self.num_slots, self.dim)
        b = self._pool.get()
        try:
            bound = b.n == n
            if self.zero_copy and not bound and _dynamic_mode():
                self._bind(b, n)
                bound = True
            if bound:
                b.dense[...] = dense
                b.emb[...] = emb
            else:  # copied; a copy may move an input off its buffer: bind again next time
                b.n = None
                b.inputs[0].copy_from_cpu(np.ascontiguousarray(dense, dtype=np.float32))
                for s, h in enumerate(b.inputs[1:]):
                    h.copy_from_cpu(np.ascontiguousarray(emb[s * n:(s + 1) * n], dtype=np.float32))
            b.predictor.run()
            return b.output.copy_to_cpu()
        finally:
            self._pool.put(b)

    def _bind(self, b: _Bound, n: int) -> None:
        """Makes ``b``'s buffers for ``n`` rows and binds its inputs to them: the dense
        input to ``float32[n, num_dense]``, slot ``s``'s to rows ``s*n .. s*n+n-1`` of
        ``float32[num_slots * n, dim]``. The Paddle tensors wrap the buffers without a copy
        and are kept with them (the predictor reads their memory on every run)."""
        import paddle

        cpu = paddle.CPUPlace()
        dense = np.zeros((n, self.num_dense), np.float32)
        emb = np.zeros((self.num_slots * n, self.dim), np.float32)
        tensors = [paddle.Tensor(dense, cpu, False, True)]  # value, place, persistable, zero_copy
        tensors += [paddle.Tensor(emb[s * n:(s + 1) * n], cpu, False, True) for s in range(self.num_slots)]
        for h, t in zip(b.inputs, tensors):
            h.share_external_data(t)
        b.n, b.dense, b.emb, b.tensors = n, dense, emb, tensors
