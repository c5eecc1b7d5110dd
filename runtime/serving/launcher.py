"""``elastic-ctr serve``: wires a serving process (cube client, version watcher, data
plane) and runs both transports: HTTP under gunicorn, gRPC in every worker.

gunicorn's ``gthread`` workers: Paddle holds the GIL while a predictor runs, so several
processes (``--workers``), not threads, use several cores; each worker loads the dense
model and its own cube clients, and concurrent requests of one worker are combined
(``runtime.serving.dataplane.Combiner``). Each worker also serves gRPC on ``--grpc-port``
(``SO_REUSEPORT``: one port for all workers) over the same data plane, started after the
worker loaded its app (gRPC must not run in a process that forks afterwards). Metrics
are aggregated over the workers through ``PROMETHEUS_MULTIPROC_DIR`` (a temporary
directory removed at exit).
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time

import numpy as np

from runtime.formats import features
from runtime.serving.dataplane import DataPlane
from runtime.serving.model import VersionWatcher

log = logging.getLogger(__name__)


def build_dataplane(topology: str, model_root: str, transfer_url: str | None, work_dir: str,
                    threads: int = 4, max_batch: int = 4096, poll_interval_s: float = 0.5,
                    cube_timeout_ms: float = 200.0, fmt: str = "criteo",
                    slots: tuple[int, ...] = features.DEFAULT_SLOTS, wait_s: float = 0.0) -> DataPlane:
    """Wires the cube client factory, the version watcher and the data plane for one
    process and starts following versions. ``wait_s``: wait up to this long for a first
    version (the process serves anyway, answering 503 until one is loaded)."""
    from runtime.cube.client import CubeClient

    def cube_factory():
        return CubeClient.from_topology(topology, timeout_ms=cube_timeout_ms, retries=2)

    watcher = VersionWatcher(model_root, transfer_url, work_dir, pool_size=threads, poll_interval_s=poll_interval_s)
    plane = DataPlane(watcher, cube_factory, max_batch=max_batch, fmt=fmt, slots=slots)
    probe_local = threading.local()  # the watcher's probe runs on its own thread: its own client

    def probe(v: int) -> None:
        c = getattr(probe_local, "c", None)
        if c is None:
            c = probe_local.c = cube_factory()
        c.seek(np.array([features.missing_feasign(1)], dtype=np.uint64), version=v)

    watcher.probe = probe
    watcher.poll_once()
    watcher.start()
    deadline = time.monotonic() + wait_s
    while watcher.current is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return plane


def main(args) -> int:
    """Runs gunicorn with ``args.workers`` gthread workers until SIGTERM."""
    from gunicorn.app.base import BaseApplication

    from runtime.serving.rest import create_app

    slots = features.DEFAULT_SLOTS
    if args.slot_file:
        from runtime import storage

        slots = features.load_slots(storage.read_bytes(args.slot_file).decode())
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="elastic-ctr-serving-")
    mp_dir = tempfile.mkdtemp(prefix="elastic-ctr-prom-")
    # before prometheus_client is imported: it picks its multiprocess value store at import
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
    # imported now, in the master: the child_exit hook must not import while workers exit
    from prometheus_client import multiprocess

    master = os.getpid()
    atexit.register(lambda: os.getpid() == master and shutil.rmtree(mp_dir, ignore_errors=True))

    def make_app():
        plane = build_dataplane(args.topology, args.model_root, args.transfer_url,
                                os.path.join(work_dir, f"w{os.getpid()}"), threads=args.threads,
                                max_batch=args.max_batch, poll_interval_s=args.poll_interval,
                                cube_timeout_ms=args.cube_timeout_ms, fmt=args.format, slots=slots)
        return create_app(plane, args.max_body_bytes)

    def child_exit(_server, worker):
        multiprocess.mark_process_dead(worker.pid)

    def post_worker_init(worker):
        if args.grpc_port:
            from runtime.serving.grpc_server import GrpcServer

            worker.grpc = GrpcServer(worker.wsgi.plane, args.host, args.grpc_port, threads=args.threads,
                                     max_message_bytes=args.max_body_bytes).start()

    def worker_exit(_server, worker):
        grpc_server = getattr(worker, "grpc", None)
        if grpc_server is not None:
            grpc_server.stop(grace_s=10.0)

    class ServingApplication(BaseApplication):
        def load_config(self):
            for key, value in {"bind": f"{args.host}:{args.port}", "workers": args.workers,
                               "worker_class": "gthread", "threads": args.threads, "keepalive": 30,
                               "timeout": 60, "graceful_timeout": 10, "accesslog": None,
                               "child_exit": child_exit, "post_worker_init": post_worker_init,
                               "worker_exit": worker_exit}.items():
                self.cfg.set(key, value)

        def load(self):
            return make_app()

    log.info("serving on http://%s:%d (gunicorn, %d gthread workers x %d threads)%s", args.host, args.port,
             args.workers, args.threads, f" and gRPC {args.host}:{args.grpc_port}" if args.grpc_port else "")
    ServingApplication().run()
    return 0
