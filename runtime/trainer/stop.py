"""Stopping a training process as Kubernetes stops a pod: a trainer finishes what it has in
hand (``StopRequest``), a pserver exits 0 at once (``exit_on_signal``, through the C helper
``runtime/trainer/_signals.c``). Imports nothing heavy: ``runtime.cli`` installs
``StopRequest`` before numpy or Paddle start any thread."""
from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)


class StopRequest:
    """SIGTERM/SIGINT, as Kubernetes stops a pod: sets ``requested``; the training loops
    finish the pass or partition in hand, then stop (``runtime.trainer.online`` for the
    continuous job); a pserver exits 0 at once (``run_pserver``).

    How: ``install()`` blocks both signals in the main thread, so in every thread started
    afterwards (Paddle's, brpc's), and a watcher thread takes them with ``sigwait``. It
    must run before ANY thread exists: ``runtime.cli.main`` calls it first for ``train``
    (not for the ``--local-cluster`` launcher), before even numpy is imported (OpenBLAS
    starts its worker threads at import, and a SIGTERM delivered to one of them would take
    the default action). A Python signal handler would not
    do: ``import paddle`` and starting the brpc server each put their own C++ handler on
    SIGTERM (Paddle's kills the process with "FatalError: Termination signal", brpc's only
    records it), and a Python handler runs only when the main thread is back in Python,
    which a pserver's ``run_server`` or a gloo rendezvous never is."""

    _current: "StopRequest | None" = None

    def __init__(self):
        self.requested = False
        self.on_signal = None  # called on the watcher thread after ``requested`` is set

    @classmethod
    def current(cls) -> "StopRequest":
        """The installed instance (a never-set one where none was installed, e.g. a test
        calling the loops in-process)."""
        return cls._current or StopRequest()

    def install(self) -> "StopRequest":
        """Blocks SIGTERM/SIGINT on the calling (main) thread and starts the watcher."""
        sigs = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)

        def watch():
            while True:
                signum = signal.sigwait(sigs)
                log.info("signal %d: stopping after the work in hand", signum)
                self.requested = True
                if self.on_signal is not None:
                    self.on_signal()

        threading.Thread(target=watch, name="stop-signal", daemon=True).start()
        StopRequest._current = self
        return self


def exit_on_signal(code: int = 0, signals: tuple[int, ...] | None = None) -> None:
    """Makes SIGTERM and SIGINT (or ``signals``) end the process at once with exit code
    ``code``, from any thread, without Python: a pserver blocked in ``fleet.run_server()``
    holds the GIL, so no Python handler could run (``runtime/trainer/_signals.c``). Call on
    the main thread after Paddle's and the PS runtime's own handlers are installed (after
    ``fleet.init_server()``). Raises ``RuntimeError`` when the compiled helper is missing
    (the project was not installed) or ``sigaction`` fails."""
    import ctypes
    import importlib.util

    spec = importlib.util.find_spec("runtime.trainer._signals")
    if spec is None or not spec.origin:
        raise RuntimeError("runtime.trainer._signals is not built: install the project (pip install -e .)")
    lib = ctypes.CDLL(spec.origin)
    for sig in signals or (signal.SIGTERM, signal.SIGINT):
        if lib.elastic_ctr_exit_on_signal(ctypes.c_int(int(sig)), ctypes.c_int(int(code))) != 0:
            raise RuntimeError(f"sigaction({int(sig)}) failed: errno {ctypes.get_errno()}")
