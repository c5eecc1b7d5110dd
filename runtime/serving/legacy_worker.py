"""Serving's gunicorn worker: an asyncio event loop with httptools' parser
(``runtime.serving.http_server.HttpServer``) in each worker process, over the listening
sockets gunicorn's master bound and shares.

Why not gunicorn's own ``gthread`` worker: it gives a connection to a thread as soon as it
is readable and reads the request there, so 4 clients sending their headers one line per
second held every thread and serving answered nothing, probes included (gunicorn's
documentation: its sync and threaded workers expect a buffering proxy in front, and a pod
has none). The loop buffers whole requests first; a thread only ever sees a complete
request. Why not waitress, which the other roles use (``runtime.webserver``): its Python
parser and poll loop cost serving more per request than the model run (README,
Benchmarks, Serving). Per worker:

- ``--threads`` work threads run inference (``POST``); concurrent requests of one worker
  are combined (``runtime.serving.batching.Combiner``);
- the loop itself answers everything else (``/v2/health/*``, metadata, ``/metrics``), so
  probes are answered while the work threads are busy;
- beyond ``--max-queue`` inference requests waiting for a work thread, a new one is
  answered at once ``503`` with ``Retry-After: 1`` by the loop (the connection stays open)
  and counted in the metrics (``elastic_ctr_serving_requests_total{endpoint="overloaded"}``);
- ``--header-timeout`` and ``--idle-timeout`` bound how long a client may hold a
  connection without sending;
- the workers spread their connections: each publishes how many it holds open in memory
  shared with the others (``ConnectionShare``, made by the master before it forks them), and
  a worker holding more than another leaves a pending connection to it
  (``HttpServer``'s ``share``). All workers poll the master's one listening socket and the
  first to wake accepts, so a client's 4 keep-alive connections went all to one of 2
  workers in 3 rounds of 8 of ``make bench-serving-peers``, halving what the pod served.

Stopping: gunicorn's master sends SIGTERM; the worker's handler (``launcher.ServerHooks``)
turns readiness false and calls ``handle_exit``; at its next tick the loop accepts what is
already in the listen backlog (at most ``runtime.webserver.ACCEPT_DRAIN_S``), closes its
copy of the listening sockets, finishes every request received or partly received and
sends its answer with ``Connection: close`` (within gunicorn's ``graceful_timeout``), and the
worker exits 0 (at once: ``launcher.ServerHooks.worker_exit``).
"""
from __future__ import annotations

import mmap
import os
import time

import numpy as np
from gunicorn.workers.base import Worker


def is_inference(method: str, path: str) -> bool:
    """The work of serving: every ``POST`` (``/v2/models/.../infer``, ``/predict``)."""
    return method == "POST"


class ConnectionShare:
    """Open connections of each worker of one gunicorn master, in an anonymous shared
    mapping made by the master before it forks its workers (``slots`` of them:
    ``conns: int64[slots]``, ``beats: float64[slots]``, monotonic s of each slot's last
    publish). The master gives each new worker a free slot (``assign``, gunicorn's
    ``pre_fork``); the worker ``bind``s its own (``SharedSlot``). A slot not published for
    ``STALE_S`` is not counted (a worker gone or hung).

    Raises ``ValueError`` for ``slots`` < 1."""

    #: s without a publish after which a slot is no longer counted (workers publish every loop tick)
    STALE_S = 2.0

    def __init__(self, slots: int = 64):
        if slots < 1:
            raise ValueError(f"slots: {slots}, at least 1 is needed")
        self.slots = slots
        self._mem = mmap.mmap(-1, 16 * slots)  # MAP_SHARED: the workers forked later see one memory
        self.conns = np.ndarray((slots,), np.int64, self._mem, 0)
        self.beats = np.ndarray((slots,), np.float64, self._mem, 8 * slots)

    def assign(self, taken: set[int]) -> int:
        """Master: the lowest slot not in ``taken`` (the live workers' slots), cleared.
        Raises ``RuntimeError`` when every slot is taken."""
        for i in range(self.slots):
            if i not in taken:
                self.conns[i], self.beats[i] = 0, 0.0
                return i
        raise RuntimeError(f"ConnectionShare: all {self.slots} slots taken by live workers")

    def bind(self, slot: int) -> "SharedSlot":
        """Worker: its own ``slot`` (``runtime.serving.http_server.ConnectionShare``'s methods)."""
        return SharedSlot(self, slot)


class SharedSlot:
    """One worker's view of a ``ConnectionShare``: ``publish`` its count, ask whether it is
    the ``least`` loaded, ``leave`` when it stops accepting (``runtime.webserver``)."""

    def __init__(self, share: ConnectionShare, slot: int):
        self.share, self.slot = share, slot
        self._others = np.ones(share.slots, bool)
        self._others[slot] = False

    def publish(self, connections: int) -> None:
        """This worker holds ``connections`` open connections now."""
        self.share.conns[self.slot] = connections
        self.share.beats[self.slot] = time.monotonic()

    def least(self, connections: int) -> bool:
        """True when no other live worker holds fewer than ``connections``."""
        s = self.share
        live = (s.beats > time.monotonic() - s.STALE_S) & self._others
        return not live.any() or connections <= int(s.conns[live].min())

    def leave(self) -> None:
        """No longer counted by the others (this worker accepts nothing more)."""
        self.share.beats[self.slot] = 0.0


class LoopWorker(Worker):
    """gunicorn worker serving its app with ``HttpServer`` (module docstring). Options of the
    server (``max_queue``, ``header_timeout_s``, ``idle_timeout_s``, ``max_body_bytes``)
    come from the class attribute ``options``: the launcher makes a subclass setting it, and
    ``share`` (a ``ConnectionShare``; None: connections not spread), whose slot the master
    gives this worker in ``pre_fork``."""

    options: dict = {}
    share: ConnectionShare | None = None
    #: this worker's slot of ``share`` (``pre_fork``, in the master)
    share_slot: int = -1

    @classmethod
    def pre_fork(cls, arbiter, worker: "LoopWorker") -> None:
        """gunicorn's ``pre_fork`` hook (master, before it forks ``worker``): gives the worker
        a slot of ``share`` no live worker holds."""
        if cls.share is not None:
            worker.share_slot = cls.share.assign({w.share_slot for w in arbiter.WORKERS.values()})

    def run(self) -> None:
        from runtime.serving.http_server import HttpServer

        metrics = getattr(self.wsgi, "metrics", None)  # serving's RestApp: count the 503s

        def on_reject() -> None:
            metrics.observe("overloaded", 503, 0.0)
            metrics.error(503)

        self.server = HttpServer(
            self.wsgi, threads=self.cfg.threads, name="serving",
            shutdown_timeout_s=max(1.0, self.cfg.graceful_timeout - 1.0),
            sockets=[s.sock for s in self.sockets], is_work=is_inference,
            on_reject=on_reject if metrics is not None else None,
            share=self.share.bind(self.share_slot) if self.share is not None and self.share_slot >= 0 else None,
            **self.options)
        self.server.serve(on_tick=self._tick)
        #: every request answered: ``launcher.ServerHooks.worker_exit`` may end the process at once
        self.drained = True

    #: s between two heartbeats to the master (gunicorn's ``timeout`` is 60 s; one per loop step cost
    #: a syscall per request)
    NOTIFY_S = 1.0
    _notified = 0.0

    def _tick(self) -> None:
        """The loop's heartbeat: tells the master this worker lives (every ``NOTIFY_S``);
        stops the loop once the worker is to exit (SIGTERM, or the master gone)."""
        now = time.monotonic()
        if now - self._notified >= self.NOTIFY_S:
            self._notified = now
            self.notify()
        if self.alive and self.ppid != os.getppid():
            self.log.info("Parent changed, shutting down: %s", self)
            self.alive = False
        if not self.alive:
            self.server.request_stop("terminating")
