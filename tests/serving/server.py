"""Serving's ASGI app served in process as a worker serves it: uvicorn with the worker's
configuration (``runtime.serving.worker.uvicorn_config``) on a listening socket of its
own (``worker.listen``), in a daemon thread. Loopback only."""
from __future__ import annotations

import threading
import time

from runtime.limits import ServerLimits
from runtime.serving.worker import uvicorn_server, listen, uvicorn_config


class ServingThread:
    """``app`` (an ASGI app; serving's ``ServingApp`` or any other) on 127.0.0.1, a free
    port, under ``limits``; a context manager (``start``/``stop``). ``url``, ``port``.
    ``stop()``: the worker's graceful stop (its ``on_stop`` first: a ``ServingApp``'s data
    plane turns draining), returns once uvicorn has stopped."""

    def __init__(self, app, limits: ServerLimits | None = None, host: str = "127.0.0.1"):
        self.app = app
        self.sock = listen(host, 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"

        def on_stop() -> None:
            plane = getattr(app, "plane", None)
            if plane is not None:
                plane.draining = True

        self.server = uvicorn_server()(uvicorn_config(app, limits or ServerLimits()), lambda: None, on_stop)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="uvicorn",
                                        daemon=True)

    def start(self) -> "ServingThread":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self.server.handle_exit(15, None)
            self._thread.join(timeout_s)
        self.sock.close()

    def __enter__(self) -> "ServingThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
