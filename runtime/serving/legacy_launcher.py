"""The hand-written server's launcher (gunicorn master, ``LoopWorker`` workers), kept while
it is measured against uvicorn and granian (``docs/serving-servers.md``)."""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from runtime.formats import features
from runtime.serving.dataplane import DataPlane
from runtime.serving.launcher import build_dataplane

if TYPE_CHECKING:
    from runtime.serving.grpc_server import GrpcServer
    from runtime.serving.rest import RestApp

log = logging.getLogger(__name__)


@dataclass
class Transports:
    """One worker's serving, side by side: the data ``plane``, the ``rest`` WSGI app over
    it and the ``grpc`` server over it (None without ``--grpc-port``; started by
    ``ServerHooks.post_worker_init``)."""

    plane: DataPlane
    rest: "RestApp"
    grpc: Optional["GrpcServer"] = None


class ServerHooks:
    """Serving's gunicorn server hooks (module docstring: stopping).

    Args:
        mp_dir: the Prometheus multiprocess directory.
        grace_s: seconds calls in flight get on SIGTERM (gunicorn's ``graceful_timeout``).
        mark_process_dead: ``prometheus_client.multiprocess.mark_process_dead``, imported
            by the caller before gunicorn starts (``child_exit`` must not import).
    """

    def __init__(self, mp_dir: str, grace_s: float, mark_process_dead: Callable[[int, str], None]):
        self.mp_dir = mp_dir
        self.grace_s = grace_s
        self.mark_process_dead = mark_process_dead
        #: this worker's transports (``load``); None in the master
        self.transports: Optional[Transports] = None

    def load(self, make: Callable[[], Transports]):
        """Worker (gunicorn's ``load``): makes the worker's transports, keeps them for the
        hooks below and returns the WSGI app gunicorn serves."""
        self.transports = make()
        return self.transports.rest

    def child_exit(self, _server, worker) -> None:
        """Master, inside its SIGCHLD handler (re-entered when workers exit together, and
        interrupting the main thread anywhere, an import included): drops the worker's live
        gauges. Imports nothing and raises nothing (an exception here unwinds the master)."""
        try:
            self.mark_process_dead(worker.pid, self.mp_dir)
        except Exception as exc:  # noqa: BLE001 - e.g. the directory already removed at exit
            log.warning("metrics of worker %s not cleaned up: %s: %s", worker.pid, type(exc).__name__, exc)

    def post_worker_init(self, worker) -> None:
        """Worker, main thread, once the app (and Paddle) is loaded, before it serves:
        installs the worker's SIGTERM handler and starts its gRPC server."""
        t = self.transports
        grace_s = self.grace_s

        def on_sigterm(signum, frame):
            t.plane.draining = True  # readiness false first (REST and gRPC)
            if t.grpc is not None:  # no new calls; those in flight get the grace (not waited for here)
                t.grpc.stop(grace_s, wait=False)
            worker.handle_exit(signum, frame)  # the worker's drain, then gunicorn's graceful stop

        # Ours, whatever was imported since gunicorn's init_signals (Paddle's import replaces
        # the C-level SIGTERM handler; import_paddle puts it back, this makes sure of it).
        signal.signal(signal.SIGTERM, on_sigterm)
        signal.siginterrupt(signal.SIGTERM, False)  # as gunicorn: no EINTR in requests in flight
        signal.signal(signal.SIGABRT, worker.handle_abort)
        if t.grpc is not None:
            t.grpc.start()

    def worker_exit(self, _server, worker) -> None:
        """Worker, on its way out: gRPC calls in flight finish (within the grace). After a
        graceful stop (``worker.drained``: every request answered) the worker then ends
        at once with ``os._exit(0)``, logs flushed: the interpreter's own finalization
        (C++ destructors of Paddle and gRPC's core, no Python frame left) took 2-9 s on
        the loaded test machine and over the whole ``--graceful-timeout`` in the
        container resize test, where the master then SIGKILLed the workers and the
        kubelet the pod. Any other exit (a failed boot) goes gunicorn's normal way."""
        if self.transports is not None and self.transports.grpc is not None:
            self.transports.grpc.stop(self.grace_s)
        if getattr(worker, "drained", False):
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # closed or broken: nothing more to say
                    pass
            os._exit(0)


def main_gunicorn(args) -> int:
    """Runs gunicorn with ``args.workers`` serving workers (``LoopWorker``) until SIGTERM;
    returns the exit code (0 after a graceful stop)."""
    from gunicorn.app.base import BaseApplication

    from runtime.serving.rest import create_app
    from runtime.serving.legacy_worker import ConnectionShare, LoopWorker

    slots = features.DEFAULT_SLOTS
    if args.slot_file:
        from runtime import storage

        slots = features.load_slots(storage.read_bytes(args.slot_file).decode())
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="elastic-ctr-serving-")
    mp_dir = tempfile.mkdtemp(prefix="elastic-ctr-prom-")
    # before prometheus_client is imported: it picks its multiprocess value store at import
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
    # Imported here, in the master, before gunicorn installs its signal handlers: child_exit
    # runs inside the master's SIGCHLD handler, which interrupts the main thread anywhere
    # (in the middle of an import too) and is re-entered when two workers exit at once; an
    # import there met a half-imported prometheus_client.metrics ("cannot import name
    # 'Gauge' from partially initialized module") and crashed the master at exit.
    from prometheus_client import multiprocess

    master = os.getpid()
    atexit.register(lambda: os.getpid() == master and shutil.rmtree(mp_dir, ignore_errors=True))

    # s, gunicorn's graceful_timeout: the master SIGKILLs a worker still running after it
    grace_s = int(args.graceful_timeout)

    def make_transports() -> Transports:
        """Worker: the data plane, the REST app and (not yet started) the gRPC server,
        imported here, in the worker, since gRPC must not run in a process that forks."""
        plane = build_dataplane(args.topology, args.model_root, args.transfer_url,
                                os.path.join(work_dir, f"w{os.getpid()}"), threads=args.threads,
                                max_batch=args.max_batch, poll_interval_s=args.poll_interval,
                                cube_timeout_ms=args.cube_timeout_ms, fmt=args.format, slots=slots)
        grpc_server = None
        if args.grpc_port:
            from runtime.serving.grpc_server import GrpcServer

            grpc_server = GrpcServer(plane, args.host, args.grpc_port, threads=args.threads,
                                     max_message_bytes=args.max_body_bytes, max_queue=args.max_queue,
                                     max_connection_age_s=args.grpc_max_connection_age)
        return Transports(plane, create_app(plane, args.max_body_bytes), grpc_server)

    hooks = ServerHooks(mp_dir, grace_s, multiprocess.mark_process_dead)
    worker_class = type("ServingWorker", (LoopWorker,), {"options": {
        "max_queue": args.max_queue, "header_timeout_s": args.header_timeout, "idle_timeout_s": args.idle_timeout,
        "max_body_bytes": args.max_body_bytes,
        "inline_budget_s": args.inline_budget_ms / 1000.0 if args.inline_budget_ms > 0 else None},
        "share": ConnectionShare(max(64, 2 * args.workers))})

    class ServingApplication(BaseApplication):
        def load_config(self):
            for key, value in {"bind": f"{args.host}:{args.port}", "workers": args.workers,
                               "worker_class": worker_class, "threads": args.threads,
                               "timeout": 60, "graceful_timeout": grace_s, "accesslog": None,
                               "child_exit": hooks.child_exit, "post_worker_init": hooks.post_worker_init,
                               "pre_fork": worker_class.pre_fork,
                               "worker_exit": hooks.worker_exit}.items():
                self.cfg.set(key, value)

        def load(self):
            return hooks.load(make_transports)

    log.info("serving on http://%s:%d (pid %d; gunicorn, %d workers x %d threads, queue limit %d)%s",
             args.host, int(args.port), os.getpid(), args.workers, args.threads, args.max_queue,
             f" and gRPC {args.host}:{int(args.grpc_port)}" if args.grpc_port else "")
    ServingApplication().run()
    return 0


_ARGS_ENV, _WORK_ENV = "ELASTIC_CTR_SERVE_ARGS", "ELASTIC_CTR_SERVE_WORK_DIR"


def main_granian(args, limits, slots, work_dir: str) -> int:
    """``serve`` on granian's own worker processes (ASGI, no lifespan), for the measurement."""
    import json

    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.http import HTTP1Settings

    os.environ[_ARGS_ENV] = json.dumps({k: v for k, v in vars(args).items() if k != "handler"})
    os.environ[_WORK_ENV] = work_dir
    log.info("serving on http://%s:%d (pid %d; granian, %d workers x %d threads, queue limit %d)",
             args.host, int(args.port), os.getpid(), args.workers, args.threads, args.max_queue)
    Granian("runtime.serving.legacy_launcher:granian_app", address=args.host, port=int(args.port),
            interface=Interfaces.ASGINL, workers=args.workers, loop=Loops.uvloop, http=HTTPModes.http1,
            http1_settings=HTTP1Settings(header_read_timeout=int(limits.header_timeout_s * 1000)),
            factory=True, log_access=False).serve()
    return 0


def granian_app():
    """granian's factory, in each of its workers: the transports, gRPC started."""
    import argparse
    import json

    from runtime.serving.launcher import _slots, make_transports

    args = argparse.Namespace(**json.loads(os.environ[_ARGS_ENV]))
    t = make_transports(args, os.environ[_WORK_ENV], _slots(args))
    if t.grpc is not None:
        t.grpc.start()
    _KEPT.append(t)  # a gRPC server no longer referenced stops
    return t.app


_KEPT: list = []
