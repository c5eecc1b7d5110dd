"""The control roles' server: the file server, the cube server's control port, the cube
agent and the cube transfer serve their Flask (WSGI) apps through ``WebServer``: the app
bridged to ASGI by a2wsgi (its ``WSGIMiddleware``: the WSGI call on a thread of a pool,
the answer streamed back to the event loop) and served by ``runtime.web.server.HttpServer``
(uvicorn) with the head limits of ``runtime.web.heads``. An ASGI middleware in front
(``WebServer._asgi``) gives what the bridge does not:

- ``GET /healthz`` 200 ``{"status": "ok"}`` while the process is up (liveness) and
  ``GET /readyz`` 200 ``{"ready": true}`` while serving, 503 ``{"ready": false, "reason"}``
  once stopping (readiness), answered on the event loop ahead of the app (``probes``);
- the whole request body is received by the event loop before a thread sees it (held in
  memory up to ``SPOOL_BYTES``, in a temporary file beyond), so a client that sends slowly
  holds a socket, never a thread; a body above ``max_body_bytes``: 413 (a larger
  ``Content-Length``: before it is read), a body stalled ``idle_timeout_s``: 408, both
  closing the connection;
- two thread pools: ``threads`` for the work, ``control_threads`` for what must answer
  while the work is busy (``is_work(method, path)`` false); with ``max_queue``, a work
  request arriving while ``max_queue`` others already wait for a work thread is answered
  at once 503 with ``Retry-After`` and a JSON ``{"error"}`` (the connection stays open),
  on the event loop, so a flood of refusals takes no thread;
- once stopping, every answer says ``Connection: close``, so a keep-alive client learns
  from the answer itself not to send on that connection again;
- a file the app sends (``wsgi.file_wrapper``) goes back to the event loop in blocks of
  ``CHUNK_BYTES``.

``json_errors(app)`` makes a Flask app answer every HTTP error (unknown path 404, wrong
method 405, ``abort(...)``) as JSON ``{"error": "..."}``, as the roles' own errors are.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from typing import Callable, Optional

from runtime.role_specs import HEALTHZ, READYZ
from runtime.web.limits import ServerLimits
from runtime.web.server import HttpServer, listen

log = logging.getLogger(__name__)

#: bytes of a request body held in memory; beyond, the rest goes to a temporary file
SPOOL_BYTES = 512 << 10
#: bytes of a spooled body handed to the WSGI thread at a time, and of a file the app sends
#: (its ``wsgi.file_wrapper``) handed back to the event loop at a time: each hand-off between
#: the thread and the loop costs tens of microseconds, so a 64 KiB block would bound a
#: download to a few hundred MB/s of CPU
CHUNK_BYTES = 1 << 20
_CLOSE = (b"connection", b"close")


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


def not_a_probe(method: str, path: str) -> bool:
    """``is_work``'s default: every request but the probes is work."""
    return path not in (HEALTHZ, READYZ)


async def _answer(send, status: int, body: dict, extra: tuple = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data)), *extra]})
    await send({"type": "http.response.body", "body": data})


class _Refused(Exception):
    """A request refused while its body was received: ``status``, ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class WebServer:
    """A WSGI ``app`` served on ``host:port`` (module docstring; ``port=0``: one the kernel
    picks, the bound one is ``port`` after construction).

    Args:
        app: the WSGI application.
        host, port: where to listen.
        threads: work threads (concurrent requests of the app).
        name: for log lines.
        limits: the limits on clients (``ServerLimits``).
        probes: answer ``/healthz`` and ``/readyz`` ahead of the app.
        control_threads: threads for requests ``is_work`` says are not work (0: one pool).
        is_work: ``(method, path) -> bool``; by default everything but the probes.
        on_reject: called (event loop thread) for every request refused by ``max_queue``.

    Raises ``OSError`` when the address cannot be bound, ``ValueError`` for ``threads`` < 1.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, threads: int = 8, name: str = "", *,
                 limits: ServerLimits = ServerLimits(), probes: bool = True, control_threads: int = 1,
                 is_work: Callable[[str, str], bool] = not_a_probe, on_reject: Optional[Callable[[], None]] = None):
        from a2wsgi import WSGIMiddleware

        if threads < 1:
            raise ValueError(f"threads: {threads}, at least 1 is needed")
        self.name = name or "http"
        self.ready, self.reason = False, "starting"
        self.limits, self.threads, self.probes = limits, threads, probes
        self.is_work, self.on_reject = is_work, on_reject
        app = _large_file_blocks(app)
        self.work = WSGIMiddleware(app, workers=threads)
        self.control = WSGIMiddleware(app, workers=control_threads) if control_threads > 0 else self.work
        #: work requests running or waiting for a work thread (the event loop's count)
        self.admitted = 0
        #: work requests answered 503 by the queue limit
        self.rejected = 0
        self.stopping = False
        self.http = HttpServer(self._asgi, listen(host, port), limits, self.name)
        self.host, self.port = host, self.http.port

    @property
    def url(self) -> str:
        """``http://host:port`` (``127.0.0.1`` for a wildcard host)."""
        return self.http.url

    @property
    def header_timeouts(self) -> int:
        """Connections closed because their request head did not arrive in time."""
        return self.http.guard.timeouts

    def queued(self) -> int:
        """Work requests waiting for a work thread."""
        return max(0, self.admitted - self.threads)

    async def _asgi(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if self.probes and method == "GET" and path in (HEALTHZ, READYZ):
            if path == HEALTHZ:
                return await _answer(send, 200, {"status": "ok"})
            if self.ready:
                return await _answer(send, 200, {"ready": True})
            return await _answer(send, 503, {"ready": False, "reason": self.reason})
        if self.stopping:
            send = _closing(send)
        try:
            body, size = await self._body(scope, receive)
        except _Refused as exc:
            return await _answer(send, exc.status, {"error": f"{method} {path}: {exc}"}, (_CLOSE,))
        try:
            work = self.is_work(method, path)
            if work:
                if self.limits.max_queue is not None and self.queued() >= self.limits.max_queue:
                    return await self._overloaded(send, method, path)
                self.admitted += 1
            try:
                app = self.work if work else self.control
                await app(_with_length(scope, size), _replay(body), send)
            finally:
                if work:
                    self.admitted -= 1
        finally:
            body.close()

    async def _body(self, scope, receive):
        """The whole body, received on the event loop: ``(file, bytes)``. Raises
        ``_Refused`` (413, 408) or ``ConnectionError`` (the client went)."""
        limit = self.limits.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise _Refused(413, f"request body of {int(value)} bytes exceeds the limit of {limit}")
        body = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        size, first = 0, True
        try:
            while True:
                try:
                    message = await (receive() if first else asyncio.wait_for(receive(), self.limits.idle_timeout_s))
                except asyncio.TimeoutError:
                    raise _Refused(408, f"request body incomplete: nothing received for "
                                        f"{self.limits.idle_timeout_s:g} s") from None
                first = False
                if message["type"] == "http.disconnect":
                    raise ConnectionError("the client went")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise _Refused(413, f"request body of more than {limit} bytes")
                if chunk:
                    body.write(chunk)
                if not message.get("more_body", False):
                    body.seek(0)
                    return body, size
        except BaseException:
            body.close()
            raise

    async def _overloaded(self, send, method: str, path: str) -> None:
        self.rejected += 1
        if self.on_reject is not None:
            try:
                self.on_reject()
            except Exception:  # noqa: BLE001 - counting must not fail the answer
                log.exception("on_reject failed")
        extra = [(b"retry-after", str(self.limits.retry_after_s).encode())]
        await _answer(send, 503, {"error": self.limits.overloaded_message(method, path, self.queued())}, tuple(extra))

    # -- start and stop ------------------------------------------------------------------------
    def start(self) -> "WebServer":
        """Serves in a daemon thread; returns once it serves (the socket is already bound)."""
        self.http.start()
        self.ready, self.reason = True, ""
        log.info("%s listening on http://%s:%d (pid %d)", self.name, self.host, self.port, os.getpid())
        return self

    def stop(self) -> None:
        """Graceful stop: readiness false, no new connections, requests in flight finish
        (up to ``grace_period_s``); returns once the server stopped. Idempotent."""
        self.ready = False
        self.reason = self.reason or "stopping"
        self.stopping = True
        self.http.stop()

    def __enter__(self) -> "WebServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _large_file_blocks(app):
    """The WSGI ``app`` given a ``wsgi.file_wrapper`` (PEP 3333's optional file transmission)
    reading files in blocks of at least ``CHUNK_BYTES`` (werkzeug's ``FileWrapper``; Flask's
    ``send_file`` asks for 8 KiB)."""
    from werkzeug.wsgi import FileWrapper

    def wrapper(file, block_size: int = 8192):
        return FileWrapper(file, max(block_size, CHUNK_BYTES))

    def with_wrapper(environ, start_response):
        environ["wsgi.file_wrapper"] = wrapper
        return app(environ, start_response)

    return with_wrapper


def _closing(send):
    """``send`` adding ``Connection: close`` to the answer's head."""

    async def closing(message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
        await send(message)

    return closing


def _with_length(scope, size: int) -> dict:
    """``scope`` with ``Content-Length`` the body's size (the body is whole: a chunked
    request reaches the WSGI app with its length, as WSGI expects)."""
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"transfer-encoding")]
    return {**scope, "headers": [*headers, (b"content-length", b"%d" % size)]}


def _replay(body):
    """An ASGI ``receive`` giving the received ``body`` back in ``CHUNK_BYTES`` pieces."""

    async def receive():
        chunk = body.read(CHUNK_BYTES)
        return {"type": "http.request", "body": chunk, "more_body": len(chunk) == CHUNK_BYTES}

    return receive
