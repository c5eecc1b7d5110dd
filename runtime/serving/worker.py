"""Serving's gunicorn worker: waitress (``runtime.webserver.WebServer``) in each worker
process, over the listening sockets gunicorn's master bound and shares.

Why not gunicorn's own ``gthread`` worker: it gives a connection to a thread as soon as it
is readable and reads the request there, so 4 clients sending their headers one line per
second held every thread and serving answered nothing, probes included (gunicorn's
documentation: its sync and threaded workers expect a buffering proxy in front, and a pod
has none). waitress's event loop buffers whole requests first; a thread only ever sees a
complete request. Per worker:

- ``--threads`` work threads run inference (``POST``); concurrent requests of one worker
  are combined (``runtime.serving.batching.Combiner``);
- ``CONTROL_THREADS`` threads answer everything else (``/v2/health/*``, metadata,
  ``/metrics``), so probes are answered while the work threads are busy;
- beyond ``--max-queue`` inference requests waiting for a work thread, a new one is
  answered at once ``503`` with ``Retry-After: 1`` by the event loop
  (``runtime.webserver.Overloaded``; the connection stays open) and counted in the
  metrics (``elastic_ctr_serving_requests_total{endpoint="overloaded"}``);
- ``--header-timeout`` and ``--idle-timeout`` bound how long a client may hold a
  connection without sending (``runtime.webserver``).

Stopping: gunicorn's master sends SIGTERM; the worker's handler (``launcher.ServerHooks``)
turns readiness false and calls ``handle_exit``; at its next tick the loop accepts what is
already in the listen backlog (at most ``runtime.webserver.ACCEPT_DRAIN_S``), closes its
copy of the listening sockets, finishes every request received or partly received and
sends its answer with ``Connection: close`` (within gunicorn's ``graceful_timeout``), and the
worker exits 0 (at once: ``launcher.ServerHooks.worker_exit``).
"""
from __future__ import annotations

import os

from gunicorn.workers.base import Worker

#: threads per worker for probes, metadata and metrics
CONTROL_THREADS = 2


def is_inference(method: str, path: str) -> bool:
    """The work of serving: every ``POST`` (``/v2/models/.../infer``, ``/predict``)."""
    return method == "POST"


class WaitressWorker(Worker):
    """gunicorn worker serving its app with waitress (module docstring). Options of the
    server (``max_queue``, ``header_timeout_s``, ``idle_timeout_s``, ``max_body_bytes``)
    come from the class attribute ``options``: the launcher makes a subclass setting it."""

    options: dict = {}

    def run(self) -> None:
        from runtime.webserver import WebServer

        metrics = getattr(self.wsgi, "metrics", None)  # serving's RestApp: count the 503s

        def on_reject() -> None:
            metrics.observe("overloaded", 503, 0.0)
            metrics.error(503)

        self.server = WebServer(
            self.wsgi, threads=self.cfg.threads, name="serving",
            shutdown_timeout_s=max(1.0, self.cfg.graceful_timeout - 1.0),
            sockets=[s.sock for s in self.sockets], probes=False, control_threads=CONTROL_THREADS,
            is_work=is_inference, on_reject=on_reject if metrics is not None else None, **self.options)
        self.server.serve(on_tick=self._tick)
        #: every request answered: ``launcher.ServerHooks.worker_exit`` may end the process at once
        self.drained = True

    def _tick(self) -> None:
        """The loop's heartbeat: tells the master this worker lives; stops the loop once
        the worker is to exit (SIGTERM, or the master gone)."""
        self.notify()
        if self.alive and self.ppid != os.getppid():
            self.log.info("Parent changed, shutting down: %s", self)
            self.alive = False
        if not self.alive:
            self.server.request_stop("terminating")
