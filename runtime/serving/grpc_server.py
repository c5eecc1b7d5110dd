"""Serving's gRPC transport: the Open Inference Protocol's ``inference.GRPCInferenceService``
over the data plane (messages: ``runtime.serving.grpc_codec``), so an answer has the same
version guarantee as over HTTP: one version's dense model and that version's embeddings,
named in ``model_version``.

Errors are gRPC statuses with the data plane's message (``grpc_codec.status_code``);
anything unexpected is ``INTERNAL``, logged. Every call is counted in serving's metrics
under the endpoint ``grpc_<Method>``.

Overload, as over HTTP (``runtime.serving.asgi``): at most ``threads`` ``ModelInfer``
calls run at once and ``max_queue`` more wait; one more is answered at once
``RESOURCE_EXHAUSTED`` (``protocol.Overloaded``, counted as ``grpc_ModelInfer`` 503). The
handler pool has ``CONTROL_THREADS`` threads beyond those, so health, readiness and
metadata calls, and the refusals, are answered while inference is busy.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from typing import Callable, Optional

import grpc

from runtime.serving import grpc_codec
from runtime.serving.dataplane import DataPlane
from runtime.serving.proto import open_inference_pb2 as pb
from runtime.serving.proto import open_inference_pb2_grpc as pb_grpc
from runtime.serving.protocol import InferenceError, Overloaded
from runtime.role_specs import ANY_HOST, PORTS

#: handler threads beyond those of ModelInfer: health, metadata, refusals
CONTROL_THREADS = 2
#: calls in flight on a connection past its maximum age get this long to finish (s)
MAX_AGE_GRACE_S = 30.0

log = logging.getLogger(__name__)


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The service's methods over ``plane`` (module docstring)."""

    def __init__(self, plane: DataPlane, threads: int = 4, max_queue: int | None = None):
        self.plane = plane
        self.metrics = plane.metrics
        self.max_queue = max_queue
        self._running = threading.BoundedSemaphore(threads)  # ModelInfer calls running
        self._lock = threading.Lock()
        self._admitted = 0  # ModelInfer calls running or waiting for _running
        self._limit = None if max_queue is None else threads + max_queue

    def _call(self, method: str, context: grpc.ServicerContext, fn: Callable):
        """The one path of every call: run, map errors to statuses, count."""
        t0 = time.perf_counter()
        code = 200
        try:
            return fn()
        except InferenceError as exc:
            code = exc.status
            context.abort(grpc_codec.status_code(exc), str(exc))
        except Exception as exc:  # the client gets a status, never a traceback
            code = 500
            log.exception("gRPC %s: unexpected error", method)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            if code >= 400:
                self.metrics.error(code)
            self.metrics.observe(f"grpc_{method}", code, time.perf_counter() - t0)

    def ServerLive(self, request, context):
        return self._call("ServerLive", context, lambda: pb.ServerLiveResponse(live=True))

    def ServerReady(self, request, context):
        return self._call("ServerReady", context, lambda: pb.ServerReadyResponse(ready=self.plane.ready()[0]))

    def ModelReady(self, request, context):
        def run():
            ok, _ = self.plane.model_ready(request.name, request.version or None)  # NotFound: another model
            return pb.ModelReadyResponse(ready=ok)

        return self._call("ModelReady", context, run)

    def ServerMetadata(self, request, context):
        def run():
            return grpc_codec.server_metadata_response(self.plane.server_metadata())

        return self._call("ServerMetadata", context, run)

    def ModelMetadata(self, request, context):
        def run():
            return grpc_codec.model_metadata_response(self.plane.model_metadata(request.name, request.version or None))

        return self._call("ModelMetadata", context, run)

    def ModelInfer(self, request, context):
        def run():
            req, typed = grpc_codec.decode_request(request)
            resp = self.plane.infer(request.model_name, request.model_version or None, req)
            return grpc_codec.encode_response(resp, typed)

        with self._lock:
            admitted = self._limit is None or self._admitted < self._limit
            if admitted:
                self._admitted += 1
                waiting = 0
            else:
                waiting = self._admitted - (self._limit - self.max_queue)
        if not admitted:
            return self._call("ModelInfer", context, lambda: self._overloaded(waiting))
        try:
            with self._running:
                return self._call("ModelInfer", context, run)
        finally:
            with self._lock:
                self._admitted -= 1

    def _overloaded(self, waiting: int):
        raise Overloaded(f"ModelInfer: overloaded, {waiting} requests are already waiting (queue limit "
                         f"{self.max_queue}); retry later")


class GrpcServer:
    """``inference.GRPCInferenceService`` on ``host:port`` over ``plane``: ``threads``
    ``ModelInfer`` calls at once, ``max_queue`` more waiting (None: no limit; module
    docstring); messages up to ``max_message_bytes``. ``SO_REUSEPORT`` is on, so every serving
    worker process listens on the same port: the kernel hashes each new connection to one of
    them, and a client keeps its connection (a gRPC channel) for as long as it lives.
    ``max_connection_age_s`` (s; None or 0: never) bounds that: past it (gRPC adds up to
    +-10 % jitter) the server sends GOAWAY, calls in flight get ``MAX_AGE_GRACE_S`` to finish,
    and the client's channel reconnects by itself, landing on a worker (and, behind a
    Kubernetes Service, a pod) chosen anew, so connections spread over workers and over
    replicas added since (gRPC's ``GRPC_ARG_MAX_CONNECTION_AGE_MS``). Raises ``RuntimeError``
    when the port cannot be bound."""

    def __init__(self, plane: DataPlane, host: str = ANY_HOST, port: int = PORTS["serving"]["grpc"], threads: int = 4,
                 max_message_bytes: int = 64 << 20, max_queue: int | None = None,
                 max_connection_age_s: float | None = None):
        handlers = threads + (max_queue if max_queue is not None else 2 * threads) + CONTROL_THREADS
        options = [("grpc.so_reuseport", 1), ("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        if max_connection_age_s:
            options += [("grpc.max_connection_age_ms", max(1, int(max_connection_age_s * 1000))),
                        ("grpc.max_connection_age_grace_ms", int(MAX_AGE_GRACE_S * 1000))]
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=handlers, thread_name_prefix="grpc"), options=options)
        self.servicer = InferenceServicer(plane, threads, max_queue)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise RuntimeError(f"gRPC: cannot listen on {host}:{port}")

    def start(self) -> "GrpcServer":
        self.server.start()
        return self

    def stop(self, grace_s: Optional[float] = 10.0, wait: bool = True) -> threading.Event:
        """Stops accepting calls; calls in flight get ``grace_s`` seconds to finish. Waits
        for that unless ``wait`` is false; returns the event set once stopped. Idempotent
        (a later call never extends an earlier call's grace)."""
        done = self.server.stop(grace_s)
        if wait:
            done.wait()
        return done
