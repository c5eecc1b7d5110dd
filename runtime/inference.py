"""A version's dense model run with Paddle Inference: the one place a predictor is set up
(the export's check, serving, and the tests' offline predictions use it).

The model directory holds what ``runtime.formats.model_meta`` describes: the legacy
static-graph program and its parameters (``model_files``) and ``model_meta.json``.
The program is run with the legacy executor and one math thread per predictor: for
this small DNN at small batches the fixed per-run cost dominates, and the old executor's
is the lowest.

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
    handler, but a SIGTERM now runs Paddle's, which kills the process at once (a gunicorn
    worker imports Paddle after installing its handlers, so its graceful stop never ran).
    What works: save each signal's ``struct sigaction`` before the import (libc's
    ``sigaction``, the bytes copied as they are) and put back afterwards SIGTERM's,
    whatever it was (a Python handler, or the default: termination without Paddle's
    "FatalError"), and every other one that had a handler (gunicorn's SIGABRT, Python's
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
        import_paddle()
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
