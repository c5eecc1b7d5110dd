"""``elastic-ctr serve``: a small supervisor forking ``--workers`` serving worker
processes (``runtime.serving.worker``: each loads the dense model and its own cube
clients, then serves REST with uvicorn and gRPC, each on its own ``SO_REUSEPORT`` socket).

Why processes: Paddle releases the GIL while a predictor runs, but the rest of a request
(decoding, the cube client, encoding) is Python that holds it, and a thread waiting for
the GIL gets it at the holder's switch interval (5 ms), so a thread running predictions
beside a busy Python thread runs far below its rate. So several processes, not threads,
use several cores;
concurrent requests of one worker are combined (``runtime.serving.batching.Combiner``).
Metrics are aggregated over the workers through ``PROMETHEUS_MULTIPROC_DIR`` (a temporary
directory removed at exit; a worker's live gauges are dropped when it exits).

The supervisor (``Supervisor``) holds no socket and imports neither Paddle, ONNX Runtime
nor gRPC (its workers are forked): it restarts a worker that dies while serving, and stops when one
dies before it served (a failed boot: exit code 3, the others stopped). Stopping (SIGTERM,
as the kubelet sends it to the container's first process, or SIGINT): it sends SIGTERM to
every worker, each stops gracefully (readiness false first; ``runtime.serving.worker``),
and it exits 0 once they all exited 0, SIGKILLing any still running ``KILL_AFTER_S`` after
the grace. Paddle's import replaces a process's SIGTERM handler with its own, which kills
it at once: ``runtime.inference.import_paddle`` keeps the process's.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Callable, Optional

from runtime import dense_backends
from runtime.formats import features
from runtime.web.limits import ServerLimits
from runtime.serving.ctr_model import CtrModel
from runtime.serving.dataplane import DataPlane
from runtime.metrics.serving import ServingMetrics
from runtime.serving.model import VersionWatcher

log = logging.getLogger(__name__)

#: exit code of the supervisor when a worker died before it served (gunicorn's)
BOOT_FAILED = 3
#: s between two looks of the supervisor at its workers
TICK_S = 0.1
#: s a stopping worker gets beyond the grace before it is SIGKILLed
KILL_AFTER_S = 5.0
#: s before a worker that died while serving is started again
RESTART_DELAY_S = 1.0


def build_dataplane(topology: str, model_root: str, transfer_url: str | None, work_dir: str,
                    threads: int = 4, max_batch: int = 4096, poll_interval_s: float = 0.5,
                    cube_timeout_ms: float = 200.0, fmt: str = "criteo",
                    slots: tuple[int, ...] = features.DEFAULT_SLOTS, wait_s: float = 0.0,
                    dense_backend: str = dense_backends.DEFAULT) -> DataPlane:
    """Wires the cube client factory, the version watcher, the CTR model and the data
    plane serving it for one process and starts following versions. ``wait_s``: wait up
    to this long for a first version (the process serves anyway, answering 503 until one
    is loaded). ``dense_backend``: what runs the dense models (``runtime.dense_backends``)."""
    from runtime.cube.client import CubeClient

    if dense_backend == dense_backends.PADDLE:
        from runtime.inference import import_paddle

        # Paddle now, in the caller's thread (a worker's main thread, before it serves), not
        # at the first model load on the watcher's thread; import_paddle keeps SIGTERM ours.
        # (On ONNX Runtime, Paddle is imported only for a version without model.onnx.)
        import_paddle()

    def cube_factory():
        return CubeClient.from_topology(topology, timeout_ms=cube_timeout_ms, retries=2)

    from runtime.formats.topology import Topology

    # a version counts once laid out for this topology's shard count, answering on every shard
    watcher = VersionWatcher(model_root, transfer_url, work_dir, pool_size=threads, poll_interval_s=poll_interval_s,
                             shard_num=Topology.load(topology).shard_num, dense_backend=dense_backend)
    metrics = ServingMetrics()
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


def _exit_early(signum, _frame) -> None:
    raise SystemExit(0)


def exit_now(code: int) -> None:
    """Ends the process with ``code`` at once, after flushing the logs and the standard
    streams: no interpreter finalization (the C++ destructors of Paddle and gRPC's core
    can take seconds on a loaded machine, longer than a pod's grace)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more to say
            pass
    os._exit(code)


class Supervisor:
    """Runs ``workers`` forked processes (module docstring). ``target(index, started)``
    runs in the child (``started()``: call once it serves) and returns its exit code;
    ``on_exit(pid)`` runs in the supervisor for every child that ended; ``grace_s``: what
    a stopping child gets before SIGKILL (plus ``KILL_AFTER_S``). An ``on_exit`` that
    raises is logged.

    ``run()`` returns the exit code: 0 after a stop where every child exited 0, 1 when one
    did not, ``BOOT_FAILED`` when a child died before it served. Call from the main thread.
    """

    def __init__(self, workers: int, target: Callable[[int, Callable[[], None]], int], grace_s: float,
                 on_exit: Callable[[int], None] = lambda pid: None, on_serving: Callable[[], None] = lambda: None):
        if workers < 1:
            raise ValueError(f"workers: {workers}, at least 1 is needed")
        self.workers, self.target, self.grace_s, self.on_exit = workers, target, grace_s, on_exit
        self.on_serving = on_serving
        self.children: dict[int, tuple[int, int]] = {}  # pid -> (index, read end of its "started" pipe)
        self.started: set[int] = set()  # pids that serve
        self.stop_signal: Optional[int] = None

    def _fork(self, index: int) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(r)
            code = 1
            try:
                for sig in (signal.SIGTERM, signal.SIGINT):  # a stop while it boots: exit 0 (the target
                    signal.signal(sig, _exit_early)         # puts its own handler before it serves)

                def started() -> None:
                    os.write(w, b"1")
                    os.close(w)

                code = self.target(index, started)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - logged; the worker's exit code says it failed
                log.exception("worker %d failed", index)
            finally:
                exit_now(code)
        os.close(w)
        os.set_blocking(r, False)
        self.children[pid] = (index, r)
        log.info("worker %d started (pid %d)", index, pid)

    def _handle(self, signum, _frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _poll_started(self) -> None:
        for pid, (_, r) in self.children.items():
            if pid not in self.started:
                try:
                    if os.read(r, 1):
                        self.started.add(pid)
                except BlockingIOError:
                    pass

    def _reap(self) -> list[tuple[int, int, int, bool]]:
        """Children that ended: ``[(pid, index, exit code, had started)]``."""
        out = []
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self._poll_started()
            index, r = self.children.pop(pid)
            os.close(r)
            out.append((pid, index, os.waitstatus_to_exitcode(status), pid in self.started))
            self.started.discard(pid)
            try:
                self.on_exit(pid)
            except Exception:  # noqa: BLE001 - a cleanup that failed must not stop the supervisor
                log.exception("cleanup after worker pid %d failed", pid)
        return out

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        for i in range(self.workers):
            self._fork(i)
        restart: dict[int, float] = {}  # index -> monotonic s to start it again
        serving = False
        while self.stop_signal is None:
            time.sleep(TICK_S)
            self._poll_started()
            if not serving and len(self.started) >= self.workers:
                serving = True
                self.on_serving()
            for pid, index, code, started in self._reap():
                if not started and self.stop_signal is None:
                    log.error("worker %d (pid %d) exited with code %d before it served: stopping", index, pid, code)
                    self._stop()
                    return BOOT_FAILED
                log.warning("worker %d (pid %d) exited with code %d while serving: starting it again", index, pid,
                            code)
                restart[index] = time.monotonic() + RESTART_DELAY_S
            for index, at in list(restart.items()):
                if time.monotonic() >= at and self.stop_signal is None:
                    del restart[index]
                    self._fork(index)
        log.info("%s received: stopping %d worker(s)", signal.Signals(self.stop_signal).name, len(self.children))
        return self._stop()

    def _stop(self) -> int:
        """SIGTERM to every child, waits for them (SIGKILL after the grace); 0 when each exited 0."""
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self.grace_s + KILL_AFTER_S
        codes = []
        while self.children:
            for pid, index, code, _ in self._reap():
                codes.append(code)
                if code != 0:
                    log.warning("worker %d (pid %d) exited with code %d", index, pid, code)
            if self.children and time.monotonic() >= deadline:
                for pid in self.children:
                    log.warning("worker pid %d still running %.0f s after SIGTERM: SIGKILL", pid,
                                self.grace_s + KILL_AFTER_S)
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                deadline = float("inf")
            time.sleep(0.02)
        return 0 if all(c == 0 for c in codes) else 1


def reserve_port(host: str, port: int) -> tuple[int, socket.socket | None]:
    """For ``port`` 0, a port the kernel picks on ``host``, held by a socket bound with
    ``SO_REUSEPORT`` that never listens (so it takes no connection), kept open while the
    supervisor runs: every worker then binds that port beside it (``SO_REUSEPORT``, the same
    user), and no other process can. Returns ``(port, socket)``; ``(port, None)`` for a
    port given. Raises ``OSError`` when ``host`` cannot be bound."""
    if port:
        return port, None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock.getsockname()[1], sock


def limits_of(args) -> ServerLimits:
    """``serve``'s limits on clients from its arguments."""
    return ServerLimits(header_timeout_s=args.header_timeout_seconds, idle_timeout_s=args.idle_timeout_seconds,
                        max_body_bytes=args.max_body_bytes,
                        max_queue=args.max_queue, grace_period_s=float(args.grace_period_seconds))


def make_transports(args, work_dir: str, slots: tuple[int, ...]):
    """Worker: the data plane, the ASGI app and (not yet started) the gRPC server,
    imported here, in the worker, since gRPC must not run in a process that forks."""
    from runtime.serving.asgi import Inline, ServingApp
    from runtime.serving.rest import create_app
    from runtime.serving.worker import Transports

    plane = build_dataplane(args.topology, args.model_root, args.transfer_url,
                            os.path.join(work_dir, f"w{os.getpid()}"), threads=args.threads,
                            max_batch=args.max_batch, poll_interval_s=args.poll_seconds,
                            cube_timeout_ms=args.cube_timeout_ms, fmt=args.format, slots=slots,
                            dense_backend=args.dense_backend)
    grpc_server = None
    if not args.no_grpc:
        from runtime.serving.grpc_server import GrpcServer

        grpc_server = GrpcServer(plane, args.host, args.grpc_port, threads=args.threads,
                                 max_message_bytes=args.max_body_bytes, max_queue=args.max_queue,
                                 max_connection_age_s=args.grpc_max_connection_age_seconds)
    app = ServingApp(create_app(plane, args.max_body_bytes), limits_of(args), threads=args.threads,
                     inline=Inline(args.inline_max_bytes))
    return Transports(plane, app, grpc_server)


def _slots(args) -> tuple[int, ...]:
    if not args.slot_file:
        return features.DEFAULT_SLOTS
    from runtime import storage

    return features.load_slots(storage.read_bytes(args.slot_file).decode())


def main(args) -> int:
    """Runs ``args.workers`` serving workers under a ``Supervisor`` until SIGTERM or
    SIGINT; returns the exit code (0 after a graceful stop)."""
    slots = _slots(args)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="elastic-ctr-serving-")
    mp_dir = tempfile.mkdtemp(prefix="elastic-ctr-prom-")
    # before prometheus_client is imported: it picks its multiprocess value store at import
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
    from prometheus_client import multiprocess

    master = os.getpid()
    atexit.register(lambda: os.getpid() == master and shutil.rmtree(mp_dir, ignore_errors=True))
    limits = limits_of(args)
    # port 0: the supervisor picks the port once and holds it; every worker binds it (reserve_port)
    args.port, http_hold = reserve_port(args.host, args.port)
    grpc_hold = None
    if not args.no_grpc:
        args.grpc_port, grpc_hold = reserve_port(args.host, args.grpc_port)
    ports = {"http": args.port} if args.no_grpc else {"http": args.port, "grpc": args.grpc_port}

    def run_worker(index: int, started: Callable[[], None]) -> int:
        from runtime.serving.worker import serve

        for hold in (http_hold, grpc_hold):
            if hold is not None:
                hold.close()  # the supervisor's; the worker binds its own
        return serve(make_transports(args, work_dir, slots), args.host, args.port, limits, started)

    log.info("serving on http://%s:%d (pid %d; uvicorn, %d workers x %d threads, queue limit %d, dense backend %s)%s",
             args.host, int(args.port), os.getpid(), args.workers, args.threads, args.max_queue, args.dense_backend,
             "" if args.no_grpc else f" and gRPC {args.host}:{int(args.grpc_port)}")
    from runtime import bound_ports

    return Supervisor(args.workers, run_worker, limits.grace_period_s,
                      lambda pid: multiprocess.mark_process_dead(pid, mp_dir),
                      on_serving=lambda: bound_ports.write(args.port_file, ports)).run()
