"""One serving worker process (``runtime.serving.launcher`` forks ``--workers`` of them):
its data plane, the REST endpoints as an ASGI app (``runtime.serving.asgi``) served by the
roles' HTTP server (``runtime.web.server.HttpServer``: uvicorn, its httptools protocol and
uvloop, with the head limits of ``runtime.web.heads``) on a listening socket of its own,
and its gRPC server.

Each worker binds ``host:port`` itself with ``SO_REUSEPORT``, once its model is loaded:
the kernel spreads new connections over the workers' sockets by a hash of the
connection's addresses and ports, so a client's keep-alive connections land on the
workers independently (with one socket shared, every idle worker wakes for a connection
and the first to accept takes it, so a client's few keep-alive connections can all land
on the one worker that happened to be first). The gRPC server listens the same way on
``--grpc-port``, started after the worker loaded its model (gRPC must not run in a
process that forks afterwards).

Stopping (SIGTERM from the launcher, or SIGINT; ``runtime.web.stop.StopSignal``):
readiness turns false (``DataPlane.stopping``: ``/v2/health/ready`` and gRPC
``ServerReady`` answer not ready, answers from then on say ``Connection: close``), gRPC
takes no new call, and the HTTP server stops gracefully (``HttpServer.stop``: the
connections in its listen backlog accepted and what they sent read, then uvicorn's own
graceful shutdown, the requests in flight getting ``ServerLimits.grace_period_s``: the
``--grace-period-seconds``); then the gRPC calls in flight finish (same grace) and the worker
ends (``runtime.serving.launcher.exit_now``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from runtime.serving.asgi import ServingApp
from runtime.serving.dataplane import DataPlane
from runtime.web.limits import ServerLimits

if TYPE_CHECKING:
    from runtime.serving.grpc_server import GrpcServer

log = logging.getLogger(__name__)


@dataclass
class Transports:
    """One worker's serving, side by side: the data ``plane``, the ASGI ``app`` over it and
    the ``grpc`` server over it (None without gRPC; started by ``serve``)."""

    plane: DataPlane
    app: ServingApp
    grpc: Optional["GrpcServer"] = None


def http_server(app, host: str, port: int, limits: ServerLimits, reuse_port: bool = True):
    """``app`` (ASGI 3) as a worker serves it, not started: the head limits around it, on its
    own listening socket on ``host:port`` (``SO_REUSEPORT`` with ``reuse_port``; port 0: one
    the kernel picks). Returns the ``runtime.web.server.HttpServer``. Raises ``OSError``
    when the address cannot be bound."""
    from runtime.web.server import HttpServer, listen

    return HttpServer(app, listen(host, port, reuse_port=reuse_port), limits, "serving")


def serve(t: Transports, host: str, port: int, limits: ServerLimits,
          on_started: Callable[[], None] = lambda: None) -> int:
    """Serves ``t`` in this process until SIGTERM or SIGINT (module docstring): REST on
    ``host:port`` (its own ``SO_REUSEPORT`` socket), gRPC if ``t.grpc``. ``on_started``
    is called once both listen. Returns the exit code (0) once everything stopped."""
    from runtime.web.stop import StopSignal

    stop = StopSignal()  # ours from now on, whatever was imported before
    http = http_server(t.app, host, port, limits)
    grace_s = limits.grace_period_s
    if t.grpc is not None:
        t.grpc.start()
    http.start()
    on_started()
    name = stop.wait()
    log.info("serving worker: %s received, stopping (readiness false; %.0f s for the requests in flight)", name,
             grace_s)
    t.plane.stopping = True  # readiness false first (REST and gRPC)
    if t.grpc is not None:  # no new calls; those in flight get the grace (waited for below)
        t.grpc.stop(grace_s, wait=False)
    http.stop()
    if t.grpc is not None:
        t.grpc.stop(grace_s)
    t.app.close()
    return 0
