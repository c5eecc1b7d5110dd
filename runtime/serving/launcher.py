"""``elastic-ctr serve``: wires a serving process (cube client, version watcher, the CTR
model, data plane) and runs both transports: HTTP under gunicorn, gRPC in every worker.

gunicorn's master with ``--workers`` worker processes, each serving HTTP with an asyncio
loop and httptools' parser (``runtime.serving.worker.LoopWorker``: whole requests
buffered by the loop before a thread sees them, so slow clients hold no thread; inference
requests beyond ``--max-queue`` waiting are answered 503 with ``Retry-After`` at once;
the loop answers the probes itself). Paddle releases the GIL while a predictor runs, but
the rest of a request (decoding, the cube client, encoding) is Python that holds it, and
a thread waiting for the GIL gets it at the holder's switch interval (5 ms): beside one
busy Python thread, a thread running batch-256 predictions in a loop took 12.7 ms a run
(157 runs in 2 s) while the busy thread kept its full rate. So several processes, not
threads, use several cores; each worker loads the dense model and its own cube clients,
and concurrent requests of one worker are combined (``runtime.serving.batching.Combiner``).
Each worker also serves gRPC on ``--grpc-port`` (``SO_REUSEPORT``: one port for all
workers) over the same data plane, with the same queue limit (``RESOURCE_EXHAUSTED``
beyond it): the worker's ``Transports`` hold its data plane, REST app and gRPC server
side by side, the gRPC server started after the worker loaded its app (gRPC must not run
in a process that forks afterwards). Metrics are aggregated over the workers through
``PROMETHEUS_MULTIPROC_DIR`` (a temporary directory removed at exit).

Stopping (SIGTERM to the master, as the kubelet sends it): the master closes its
listening sockets and sends SIGTERM to every worker; a worker turns its readiness false
(``/v2/health/ready`` and gRPC ``ServerReady`` answer not ready), stops gRPC from taking
new calls, accepts what is already in the listen backlog and then nothing new, finishes
the requests in flight, partly received ones included (both transports, within
``--graceful-timeout``, 20 s by default: ``runtime.serving.worker``), and exits 0; then
the master exits 0 (a drained worker skips the interpreter's slow finalization:
``ServerHooks.worker_exit``). Two more things stood in the way and are handled here: Paddle's
import replaces a worker's SIGTERM handler with its own, which kills the worker at once
(``runtime.inference.import_paddle`` keeps the process's, and ``post_worker_init``
installs the worker's own once everything is loaded), and the master runs ``child_exit``
inside its SIGCHLD handler, re-entered when workers exit together, so that hook imports
nothing and never raises.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from runtime.formats import features
from runtime.serving.ctr_model import CtrModel
from runtime.serving.dataplane import DataPlane
from runtime.serving.metrics import Metrics
from runtime.serving.model import VersionWatcher

if TYPE_CHECKING:
    from runtime.serving.grpc_server import GrpcServer
    from runtime.serving.rest import RestApp

log = logging.getLogger(__name__)


def build_dataplane(topology: str, model_root: str, transfer_url: str | None, work_dir: str,
                    threads: int = 4, max_batch: int = 4096, poll_interval_s: float = 0.5,
                    cube_timeout_ms: float = 200.0, fmt: str = "criteo",
                    slots: tuple[int, ...] = features.DEFAULT_SLOTS, wait_s: float = 0.0) -> DataPlane:
    """Wires the cube client factory, the version watcher, the CTR model and the data
    plane serving it for one process and starts following versions. ``wait_s``: wait up
    to this long for a first version (the process serves anyway, answering 503 until one
    is loaded)."""
    from runtime.cube.client import CubeClient
    from runtime.inference import import_paddle

    # Paddle now, in the caller's thread (a worker's main thread, before it serves), not at
    # the first model load on the watcher's thread; import_paddle keeps SIGTERM ours.
    import_paddle()

    def cube_factory():
        return CubeClient.from_topology(topology, timeout_ms=cube_timeout_ms, retries=2)

    from runtime.formats.topology import Topology

    # a version counts once laid out for this topology's shard count, answering on every shard
    watcher = VersionWatcher(model_root, transfer_url, work_dir, pool_size=threads, poll_interval_s=poll_interval_s,
                             shard_num=Topology.load(topology).shard_num)
    metrics = Metrics()
    model = CtrModel(watcher, cube_factory, max_batch=max_batch, fmt=fmt, slots=slots, metrics=metrics)
    plane = DataPlane([model], metrics)

    def probe(v: int) -> None:  # with the requests' client: its first lookup is done before any request's
        model.cube().probe(v)

    watcher.probe = probe
    watcher.poll_once()
    watcher.start()
    deadline = time.monotonic() + wait_s
    while watcher.current is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return plane


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


def main(args) -> int:
    """Runs gunicorn with ``args.workers`` serving workers (``LoopWorker``) until SIGTERM;
    returns the exit code (0 after a graceful stop)."""
    from gunicorn.app.base import BaseApplication

    from runtime.serving.rest import create_app
    from runtime.serving.worker import ConnectionShare, LoopWorker

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
