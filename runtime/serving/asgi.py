"""Serving's ASGI application: the REST endpoints (``runtime.serving.rest.RestApp``) as
an ASGI 3 app, served by uvicorn in each worker (``runtime.serving.worker``).

- the whole request, headers and body, is received by the event loop before anything
  runs (a slow client holds a socket, never a thread); a body over
  ``limits.max_body_bytes`` is answered 413 and the connection closed (a larger
  ``Content-Length``: before the body is read); a body stalled ``limits.idle_timeout_s``:
  408, the connection closed; bodies being received beyond
  ``limits.buffered_limit`` over every connection: 503, the connection closed;
- inference (every ``POST``) runs on ``threads`` worker threads (Paddle releases the GIL
  while a predictor runs; concurrent requests are combined,
  ``runtime.serving.batching.Combiner``); with ``limits.max_queue`` of them already
  waiting for a thread, one more is answered at once 503 with ``Retry-After`` and a JSON
  ``{"error"}`` (``protocol.Overloaded``; the connection stays open), counted in the
  metrics (``elastic_ctr_serving_requests_total{endpoint="overloaded",code="503"}``);
- but a small inference request (a body of at most ``Inline.max_bytes``) that comes when
  no other inference of this worker is running or waiting runs on the event loop itself
  (``Inline``): the hand-off to a thread and back cost about 60 us of CPU per request
  (``docs/serving-servers.md``), a tenth of a batch-1 request's. The loop does nothing else
  meanwhile, so this is bounded: a small request that takes more than
  ``Inline.budget_ms`` of its own (inline or on a thread, waits for a thread not counted:
  a slow cube replica, a loaded machine) sends every inference to the threads for the
  next ``Inline.backoff_s`` (logged and counted in
  ``elastic_ctr_serving_inline_backoffs_total`` when it turns inlining off). At worst the
  loop stalls for one small request's cube timeouts (``--cube-timeout-ms`` per try, times
  the tries) once, when the cube turns slow while the worker was idle;
- everything else (probes, metadata, ``/metrics``) is answered on the event loop, so it
  answers while every thread is busy;
- once the data plane is stopping (``DataPlane.stopping``: the worker is stopping) every
  answer says ``Connection: close``, so a keep-alive client learns from the answer itself
  not to send on that connection again.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from runtime.web.limits import ServerLimits
from runtime.serving.protocol import Overloaded
from runtime.serving.rest import RestApp

log = logging.getLogger(__name__)

_CLOSE = (b"connection", b"close")


@dataclass(frozen=True)
class Inline:
    """When an inference request runs on the event loop instead of a thread (module
    docstring): its body is at most ``max_bytes`` (0: never; 8 KiB holds a JSON request of
    about ten CTR rows), no other inference of the worker is running or waiting, and no
    such small request took more than ``budget_ms`` (wall clock, its own run: inline or on
    a thread) in the last ``backoff_s``.
    Raises ``ValueError`` for a negative ``max_bytes`` or a budget or backoff that is not a
    positive number."""

    max_bytes: int = 8192
    budget_ms: float = 20.0
    backoff_s: float = 10.0

    def __post_init__(self):
        if self.max_bytes < 0:
            raise ValueError(f"inline max_bytes: {self.max_bytes}, must be >= 0 (0: no request inline)")
        for name in ("budget_ms", "backoff_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"inline {name}: {v!r}, must be a positive number")


class InferenceThreads:
    """``n`` daemon threads running calls handed over by an event loop: ``run(loop, fn,
    *args)`` is awaited for ``fn(*args)``'s result (or raises what it raised). What
    ``loop.run_in_executor`` does, with less CPU per call: no ``concurrent.futures.Future``
    to chain to the loop's, no coroutine-function check per call. ``close()`` ends the
    threads once the calls given to them are done."""

    def __init__(self, n: int, name: str = "serving-infer"):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def run(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args) -> asyncio.Future:
        fut = loop.create_future()
        self._calls.put((loop, fut, fn, args))
        return fut

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            loop, fut, fn, args = call
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                loop.call_soon_threadsafe(_settle, fut, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, fut, result, None)

    def close(self) -> None:
        for _ in self._threads:
            self._calls.put(None)
        for t in self._threads:
            t.join()


def _settle(fut: asyncio.Future, result, exc) -> None:
    if fut.done():  # the request went (cancelled)
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class ServingApp:
    """The ASGI application (module docstring) over ``rest``; ``limits`` applies its
    ``max_body_bytes``, ``max_queue`` and ``retry_after_s``; ``threads`` (>= 1) run inference;
    ``inline``: which requests run on the event loop (``Inline``; default ``Inline()``).
    Raises ``ValueError`` for ``threads`` < 1."""

    def __init__(self, rest: RestApp, limits: ServerLimits, threads: int = 1, inline: Inline | None = None):
        if threads < 1:
            raise ValueError(f"threads: {threads}, at least 1 is needed")
        self.rest, self.plane, self.metrics = rest, rest.plane, rest.metrics
        self.limits, self.threads = limits, threads
        self.inline = inline if inline is not None else Inline()
        #: inference requests run on the event loop
        self.inlined = 0
        #: ``time.monotonic()`` before which no request runs inline (after one over the budget)
        self.inline_off_until = 0.0
        self.pool = InferenceThreads(threads)
        #: inference requests running or waiting for a thread (the event loop's count)
        self.admitted = 0
        #: inference requests answered 503 by the queue limit
        self.rejected = 0
        #: bytes of request bodies being received, over every connection
        self.buffered = 0

    def queued(self) -> int:
        """Inference requests waiting for a thread."""
        return max(0, self.admitted - self.threads)

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":  # nothing to start or stop: the worker made everything before serving
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _http(self, scope, receive, send) -> None:
        method, path = scope["method"], scope["path"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.limits.max_body_bytes
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await self._refuse(send, 413, f"request body of {length} bytes exceeds the limit of {limit}")
        chunks, size = [], 0
        try:
            while True:
                if chunks:  # the body comes in parts: each within the idle timeout
                    try:
                        message = await asyncio.wait_for(receive(), self.limits.idle_timeout_s)
                    except asyncio.TimeoutError:
                        return await self._refuse(send, 408, f"request body incomplete: nothing received for "
                                                             f"{self.limits.idle_timeout_s:g} s")
                else:
                    message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    return await self._refuse(send, 413, f"request body of more than {limit} bytes")
                if self.buffered + len(chunk) > self.limits.buffered_limit:
                    return await self._refuse(send, 503, f"the server holds {self.buffered} bytes of request bodies "
                                                         f"being received (limit {self.limits.buffered_limit}); "
                                                         "retry later")
                self.buffered += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        finally:
            self.buffered -= sum(len(c) for c in chunks)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if method != "POST":
            status, data, out = self.rest.respond(method, path, headers, body)
        else:
            max_queue = self.limits.max_queue
            waiting = self.admitted - self.threads
            if max_queue is not None and waiting >= max_queue:
                return await self._overloaded(send, method, path, waiting)
            self.admitted += 1
            try:
                small = 0 < self.inline.max_bytes and len(body) <= self.inline.max_bytes
                if small and self.admitted == 1 and self._inline_on():
                    self.inlined += 1
                    answer, took_s = self._timed(method, path, headers, body)
                else:
                    answer, took_s = await self.pool.run(asyncio.get_running_loop(), self._timed, method, path,
                                                         headers, body)
                if small and took_s * 1e3 > self.inline.budget_ms:
                    self._over_budget(took_s)
                status, data, out = answer
            finally:
                self.admitted -= 1
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in out]
        raw.append((b"content-length", str(len(data)).encode()))
        if self.plane.stopping:
            raw.append(_CLOSE)
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": data})

    def _inline_on(self) -> bool:
        return not self.inline_off_until or time.monotonic() >= self.inline_off_until

    def _timed(self, method: str, path: str, headers: dict, body: bytes):
        """``(rest.respond(...), its wall-clock seconds)``, on whichever thread runs it."""
        t0 = time.perf_counter()
        answer = self.rest.respond(method, path, headers, body)
        return answer, time.perf_counter() - t0

    def _over_budget(self, took_s: float) -> None:
        """A small inference request took beyond the inline budget: none inline for the backoff."""
        if self._inline_on():
            self.metrics.inline_backoffs.inc()
            log.warning("an inference request took %.1f ms (inline budget %g ms): inference runs on the threads "
                        "for the next %g s", took_s * 1e3, self.inline.budget_ms, self.inline.backoff_s)
        self.inline_off_until = time.monotonic() + self.inline.backoff_s

    async def _overloaded(self, send, method: str, path: str, waiting: int) -> None:
        self.rejected += 1
        self.metrics.observe("overloaded", 503, 0.0)
        self.metrics.error(503)
        exc = Overloaded(self.limits.overloaded_message(method, path, waiting))
        extra = [(b"retry-after", str(self.limits.retry_after_s).encode())]
        await self._send_error(send, exc.status, str(exc), extra, close=self.plane.stopping)

    async def _refuse(self, send, status: int, message: str) -> None:
        """Answers ``status`` with ``{"error": message}`` and closes the connection (the
        rest of the request is not read)."""
        self.metrics.error(status)
        await self._send_error(send, status, message, [], close=True)

    @staticmethod
    async def _send_error(send, status: int, message: str, extra: list, close: bool) -> None:
        data = json.dumps({"error": message}).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
        if close:
            raw.append(_CLOSE)
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": data})

    def close(self) -> None:
        """Ends the inference threads once the requests given to them are done (waits)."""
        self.pool.close()
