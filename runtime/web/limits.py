"""What a client may hold of an HTTP server, defined once: ``ServerLimits``, taken by every
role's server (``runtime.web.server.HttpServer``: the control roles through
``runtime.web.wsgi.WebServer``, serving's workers through ``runtime.serving.worker``), each
limit applied where its field says, and the answer to a request refused by the queue limit
(``overloaded_message``); and what a stop shares: ``ACCEPT_DRAIN_S`` and ``readable_now``.
"""
from __future__ import annotations

import math
import select
from dataclasses import dataclass, fields

#: seconds a stopping server still accepts the connections already in its listen backlog
#: (``runtime.web.server.HttpServer.stop``): a client that connected before the stop is served
ACCEPT_DRAIN_S = 2.0


def readable_now(sock) -> bool:
    """True when ``sock`` has something to read now (data, a connection, EOF or an error);
    ``poll``, not ``select``: any descriptor number."""
    try:
        p = select.poll()
        p.register(sock, select.POLLIN)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class ServerLimits:
    """The limits on clients of one HTTP server (units in the names).

    Attributes:
        header_timeout_s: s a request's head (request line and headers) may take to
            arrive, from its first byte, before the connection is closed (slowloris;
            ``runtime.web.heads``: uvicorn has no such timeout).
        max_head_bytes: bytes of a request's head accepted; beyond, the request is
            refused 431 and the connection closed (``runtime.web.heads``).
        idle_timeout_s: s a connection may stay without sending anything before it is
            closed: a new connection (``runtime.web.heads``), a keep-alive connection
            between requests (uvicorn's ``timeout_keep_alive``), a stalled body (408: serving's
            app, ``runtime.web.wsgi``).
        max_body_bytes: bytes of a request body accepted; a larger one is answered 413
            (``Content-Length`` above it: before the body is read).
        max_queue: work requests that may wait for a work thread; one more is answered at
            once 503 with ``Retry-After: retry_after_s`` and a JSON ``{"error"}``
            (``overloaded_message``). None: unbounded.
        connection_limit: connections and requests held at once; beyond, new ones are
            answered 503 (uvicorn's ``limit_concurrency``).
        max_buffered_bytes: bytes of request bodies being received in memory, over every
            connection, held at most; a body that would go beyond is answered 503 and its
            connection closed (many large uploads at once cannot exhaust the memory).
            Serving; the control roles spool bodies above 512 KiB to temporary files.
            None: 4 x ``max_body_bytes``, within 256 MiB .. 1 GiB (``buffered_limit``).
        grace_period_s: s a stop gives the requests in flight before the connections
            still busy are closed (uvicorn's ``timeout_graceful_shutdown``).
        retry_after_s: s a refused client is asked to wait (``Retry-After``).

    Raises ``ValueError`` naming the field for a negative, non-finite or zero (where at
    least 1 is needed) value.
    """

    header_timeout_s: float = 10.0
    max_head_bytes: int = 64 << 10
    idle_timeout_s: float = 30.0
    max_body_bytes: int = 1 << 40
    max_queue: int | None = None
    connection_limit: int = 1000
    max_buffered_bytes: int | None = None
    grace_period_s: float = 10.0
    retry_after_s: int = 1

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("max_queue", "max_buffered_bytes"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{f.name}: {value!r} is not a finite number")
            if value < 0:
                raise ValueError(f"{f.name}: {value} is negative")
            if value == 0 and f.name in ("idle_timeout_s", "header_timeout_s", "max_head_bytes", "max_body_bytes",
                                              "connection_limit"):
                raise ValueError(f"{f.name}: 0, more is needed")
        if self.max_buffered_bytes is not None and self.max_buffered_bytes < min(self.max_body_bytes, 1 << 30):
            raise ValueError(f"max_buffered_bytes: {self.max_buffered_bytes} is below max_body_bytes "
                             f"{self.max_body_bytes}: a request of the largest size allowed could never be received")

    @property
    def buffered_limit(self) -> int:
        """``max_buffered_bytes``, or its default (its docstring)."""
        if self.max_buffered_bytes is not None:
            return self.max_buffered_bytes
        return max(256 << 20, min(4 * self.max_body_bytes, 1 << 30))

    def overloaded_message(self, method: str, path: str, waiting: int) -> str:
        """The error of a work request refused because ``waiting`` (>= ``max_queue``)
        requests already wait for a work thread."""
        return (f"{method} {path}: overloaded, {waiting} requests are already waiting (queue limit "
                f"{self.max_queue}); retry later")
