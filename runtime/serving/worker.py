"""Serving's gunicorn worker: gunicorn's ``gthread`` worker with a stop that drops no
request that reached it.

gunicorn's own ``gthread`` worker, on SIGTERM, leaves its loop at the next tick and closes
its selector: a connection it had accepted but not yet handed to a thread (the request
arrived in the last tick), and every connection still in the listening socket's backlog,
is closed unanswered, so a client that sent its request just before the signal sees a
connection reset. This worker instead, on SIGTERM, goes on accepting and handing requests
to its threads until the backlog is empty and every accepted connection has been handed
over (at most ``ACCEPT_DRAIN_S`` s, so a client that keeps connecting cannot hold it up),
and only then leaves the loop; gunicorn then waits (``graceful_timeout``) for the requests
in its threads, as always. Readiness is the application's: serving's answers not ready
from the signal on (``runtime.serving.launcher``).
"""
from __future__ import annotations

import select
import time

from gunicorn.workers.gthread import ThreadWorker

#: seconds after SIGTERM during which a stopping worker still accepts connections that
#: arrived before it (the backlog) and hands accepted ones to its threads
ACCEPT_DRAIN_S = 2.0


class DrainingThreadWorker(ThreadWorker):
    """``gthread`` worker whose SIGTERM ends the loop only once nothing that reached it is
    left unhandled (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stopping_since: float | None = None

    def handle_exit(self, sig, frame) -> None:
        """SIGTERM: start draining (``alive`` stays true until ``_drained``)."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()

    def murder_keepalived(self) -> None:
        # called by the loop once per tick (after the tick's events are handled): the place
        # to decide whether the loop may end
        super().murder_keepalived()
        if self.stopping_since is not None and self.alive and self._drained():
            for sock in self.sockets:
                try:
                    self.poller.unregister(sock)
                except (KeyError, ValueError, OSError):
                    pass
            self.alive = False

    def _drained(self) -> bool:
        """True when the loop may end: nothing waits in the backlog and every accepted
        connection has been handed to a thread at least once (or ``ACCEPT_DRAIN_S`` passed)."""
        if time.monotonic() - self.stopping_since >= ACCEPT_DRAIN_S:
            return True
        try:
            backlog, _, _ = select.select(self.sockets, [], [], 0)
        except (OSError, ValueError):
            backlog = []
        if backlog:
            return False
        with self._lock:
            keys = list(self.poller.get_map().values())
        for key in keys:
            conn = getattr(key.data, "args", (None,))[0]  # partial(on_client_socket_readable, conn)
            if conn is not None and hasattr(conn, "initialized") and not conn.initialized:
                return False  # accepted, its request not yet read
        return True
