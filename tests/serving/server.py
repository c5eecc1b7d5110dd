"""Serving's ASGI app served in process as a worker serves it (``runtime.serving.worker.
http_server``: the roles' HTTP server with the head limits, on a listening socket of its
own), in a thread of its own. Loopback only."""
from __future__ import annotations

from runtime.serving.worker import http_server
from runtime.web.limits import ServerLimits


class ServingThread:
    """``app`` (an ASGI app; serving's ``ServingApp`` or any other) on 127.0.0.1, a port the
    kernel picks, under ``limits``; a context manager (``start``/``stop``). ``url``, ``port``.
    ``stop()``: the worker's graceful stop (a ``ServingApp``'s data plane turns stopping
    first), returns once the server has stopped."""

    def __init__(self, app, limits: ServerLimits | None = None, host: str = "127.0.0.1"):
        self.app = app
        self.server = http_server(app, host, 0, limits or ServerLimits(), reuse_port=False)
        self.port = self.server.port
        self.url = self.server.url

    def start(self) -> "ServingThread":
        self.server.start(timeout_s=10)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        plane = getattr(self.app, "plane", None)
        if plane is not None:
            plane.stopping = True
        self.server.stop()

    def __enter__(self) -> "ServingThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
