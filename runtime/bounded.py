"""A thread's wait budget: code run on an event loop's own thread must not block it for
long. Serving's HTTP server runs a lone inference request on its loop thread under a budget
(``runtime.serving.http_server``, ``inline_budget_s``); the calls that could wait on another
process or thread honour it: the cube client's lookups (``runtime.cube.client``) and the
dynamic batcher (``runtime.serving.batching``). Where one cannot finish within the budget
without waiting (a reply late, a connection to open, another thread's batch in the way, a
retry), it raises ``WouldBlock`` instead, having left nothing half done, and the caller
runs the work again where waiting is allowed (a work thread).

Outside a ``budget`` scope (``remaining_s()`` is None) nothing changes.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

_local = threading.local()


class WouldBlock(BaseException):
    """The work cannot finish within the calling thread's budget without waiting.

    Derives from ``BaseException`` as ``asyncio.CancelledError`` does: it is a message to
    the code that set the budget, not an error of the request, so the ``except Exception``
    handlers between them (which answer a request's errors) let it through."""


@contextlib.contextmanager
def budget(seconds: float) -> Iterator[None]:
    """Within this scope the calling thread may wait at most ``seconds`` (s) in all, from
    now, in the calls that honour it (module docstring). Scopes do not nest (the inner one
    applies until it ends)."""
    prev = getattr(_local, "deadline", None)
    _local.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.deadline = prev


def remaining_s() -> float | None:
    """s left of the calling thread's budget (0 when spent); None outside a ``budget`` scope."""
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def bounded() -> bool:
    """True within a ``budget`` scope: a call that would wait raises ``WouldBlock``."""
    return getattr(_local, "deadline", None) is not None
