"""The one way the HTTP roles serve: the file server, the cube server's control port, the
cube agent and the cube transfer. (Serving's request path runs several processes under
gunicorn: ``runtime.serving.launcher``.)

cheroot, CherryPy's production WSGI server: a thread pool in this process (the roles keep
their state in memory) and a graceful stop that lets requests in flight finish.

Every app served here also answers, ahead of its own routes:

- ``GET /healthz``: 200 ``{"status": "ok"}`` while the process is up (liveness);
- ``GET /readyz``: 200 ``{"ready": true}`` while serving, 503 ``{"ready": false, "reason"}``
  once it is stopping (readiness), so a load balancer takes it out before it goes.

``json_errors(app)`` makes a Flask app answer every HTTP error (unknown path 404, wrong
method 405, ``abort(...)``) as JSON ``{"error": "..."}``, as the roles' own errors are.

``serve_forever`` runs a role's server in the main thread's stead until SIGTERM or
SIGINT: readiness turns false, ``on_stop`` runs (the role stops its own work), requests
in flight finish (up to ``shutdown_timeout_s``), and it returns so the process exits 0.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


def _json(start_response, status: str, body: dict) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def json_errors(app):
    """Registers on the Flask ``app`` one handler for every werkzeug ``HTTPException``: the
    answer is its status (and headers, e.g. ``Allow`` on a 405) with the JSON body
    ``{"error": "<METHOD> <path>: <what>"}``, ``<what>`` being the description given to
    ``abort`` or else the status name in lower case (``not found``, ``method not
    allowed``). Returns ``app``. Handlers the app registers for a specific status or
    exception class still take precedence (Flask picks the most specific)."""
    from flask import jsonify, request
    from werkzeug.exceptions import HTTPException

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        custom = exc.description and exc.description != type(exc).description
        what = exc.description if custom else exc.name.lower()
        resp = jsonify(error=f"{request.method} {request.path}: {what}")
        resp.status_code = exc.code or 500
        for name, value in exc.get_headers():
            if name.lower() != "content-type":
                resp.headers[name] = value
        return resp

    return app


class WebServer:
    """A WSGI ``app`` served by cheroot on ``host:port`` (``port=0``: any free port; the
    bound one is ``port`` after construction).

    Args:
        app: the WSGI application.
        host, port: where to listen.
        threads: worker threads (concurrent requests).
        name: for log lines.
        shutdown_timeout_s: how long ``stop`` waits for requests in flight (s).

    Raises ``OSError`` when the address cannot be bound.
    """

    TICK_S = 0.1

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, threads: int = 8, name: str = "",
                 shutdown_timeout_s: float = 10.0):
        from cheroot import wsgi

        self.app = app
        self.name = name or "http"
        self.ready = False
        self.reason = "starting"
        self._server = wsgi.Server((host, port), self._dispatch, numthreads=threads,
                                   shutdown_timeout=shutdown_timeout_s, server_name=self.name)
        # how often the server's selector loop wakes (s): bounds how long stop() waits for it
        self._server.expiration_interval = self.TICK_S
        self._server.prepare()  # binds now: errors surface here, the port is known
        self.host = host
        self.port = int(self._server.bind_addr[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` (``127.0.0.1`` for a wildcard host)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def _dispatch(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") == "GET":
            if path == "/healthz":
                return _json(start_response, "200 OK", {"status": "ok"})
            if path == "/readyz":
                if self.ready:
                    return _json(start_response, "200 OK", {"ready": True})
                return _json(start_response, "503 Service Unavailable", {"ready": False, "reason": self.reason})
        return self.app(environ, start_response)

    def start(self) -> "WebServer":
        """Serves in a daemon thread; returns at once (the socket is already bound)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve, name=f"{self.name}-http", daemon=True)
            self._thread.start()
            self.ready, self.reason = True, ""
            log.info("%s listening on http://%s:%d (pid %d)", self.name, self.host, self.port, os.getpid())
        return self

    def stop(self) -> None:
        """Graceful stop: readiness false, no new connections, requests in flight finish
        (up to ``shutdown_timeout_s``). Idempotent."""
        self.ready, self.reason = False, "stopping"
        self._server.stop()

    def __enter__(self) -> "WebServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class StopSignal:
    """Catches SIGTERM and SIGINT from its creation on (create it before the process starts
    listening, so an early signal is not lost); ``wait()`` blocks until one arrives and
    returns its name. Create it in the main thread."""

    def __init__(self):
        self._event = threading.Event()
        self._received: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)

    def _handler(self, signum, _frame) -> None:
        self._received.append(signum)
        self._event.set()

    def wait(self) -> str:
        while not self._event.wait(3600):
            pass
        return signal.Signals(self._received[0]).name


DRAIN_HELP = ("on SIGTERM, keep answering this long with readiness false before stopping "
              "(time for load balancers and clients to notice)")


def add_drain_seconds(parser) -> None:
    """Adds ``--drain-seconds`` (float seconds, default 0) to the ``argparse`` ``parser`` of
    a role that stops gracefully: the ``drain_s`` of ``serve_forever`` (the cube server's
    data plane drains the same way)."""
    parser.add_argument("--drain-seconds", type=float, default=0.0, help=DRAIN_HELP)


def serve_forever(server: WebServer, on_stop: Callable[[], None] | None = None, drain_s: float = 0.0) -> int:
    """Serves ``server`` until SIGTERM or SIGINT, then stops gracefully: readiness turns
    false, ``drain_s`` seconds pass (still answering, while load balancers notice),
    ``on_stop`` runs, requests in flight finish. Returns the exit code (0). Call from the
    main thread."""
    stop = StopSignal()
    server.start()
    name = stop.wait()
    log.info("%s: %s received, stopping (draining %.1f s)", server.name, name, drain_s)
    server.ready, server.reason = False, "terminating"
    if drain_s > 0:
        time.sleep(drain_s)
    if on_stop is not None:
        on_stop()
    server.stop()
    log.info("%s stopped", server.name)
    return 0
