"""How every role stops, in one place: the signals (SIGTERM, as the kubelet sends it, and
SIGINT), the preStop delay and the grace period.

A role's process catches SIGTERM and SIGINT from its start (``StopSignal``, created before
it listens, so an early signal is not lost). At the first one: readiness turns false, the
role keeps answering for the preStop delay (``--prestop-seconds``, 0 by default: time for
load balancers and clients to notice; a pod's ``preStop`` hook gives the same delay from
outside), its own work stops (``on_stop``), then its HTTP server stops gracefully (the
requests in flight get ``ServerLimits.grace_period_s``, the grace period) and the
process exits 0. ``serve_forever`` is that sequence for a ``runtime.web.wsgi.WebServer``;
serving's workers (``runtime.serving.worker``) and the cube server's data plane follow it
with what they add (gRPC, lookups in flight).
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable, Optional

log = logging.getLogger(__name__)

PRESTOP_HELP = ("on SIGTERM, keep answering this long with readiness false before stopping "
                "(time for load balancers and clients to notice)")


class StopSignal:
    """Catches SIGTERM and SIGINT from its creation on, without interrupting the system
    calls in flight; ``wait()`` blocks until one arrives and returns its name. Create it in
    the main thread, before the process listens."""

    def __init__(self):
        self._event = threading.Event()
        self._received: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)
            signal.siginterrupt(sig, False)

    def _handler(self, signum, _frame) -> None:
        self._received.append(signum)
        self._event.set()

    @property
    def received(self) -> Optional[str]:
        """The first signal's name, or None while none arrived."""
        return signal.Signals(self._received[0]).name if self._received else None

    def wait(self) -> str:
        """Blocks until a stop signal arrives; returns its name (``SIGTERM``)."""
        while not self._event.wait(3600):
            pass
        return signal.Signals(self._received[0]).name


def add_prestop_seconds(parser) -> None:
    """Adds ``--prestop-seconds`` (float seconds, default 0: the preStop delay) to the
    ``argparse`` ``parser`` of a role that stops gracefully."""
    parser.add_argument("--prestop-seconds", type=float, default=0.0, help=PRESTOP_HELP)


def serve_forever(server, on_stop: Optional[Callable[[], None]] = None, prestop_s: float = 0.0,
                  port_file: Optional[str] = None, port_name: str = "http") -> int:
    """Serves ``server`` (a ``runtime.web.wsgi.WebServer``) until SIGTERM or SIGINT, then
    stops as the module docstring says: readiness false, ``prestop_s`` seconds still
    answering, ``on_stop``, the requests in flight finished. Once it serves, the bound port
    is written to ``port_file`` as ``{port_name: port}`` (``runtime.bound_ports``). Returns
    the exit code (0). Call from the main thread."""
    from runtime import bound_ports

    stop = StopSignal()
    server.start()
    bound_ports.write(port_file, {port_name: server.port})
    name = stop.wait()
    log.info("%s: %s received, stopping (preStop delay %.1f s)", server.name, name, prestop_s)
    server.ready, server.reason = False, "terminating"
    if prestop_s > 0:
        time.sleep(prestop_s)
    if on_stop is not None:
        on_stop()
    server.stop()
    log.info("%s stopped", server.name)
    return 0
