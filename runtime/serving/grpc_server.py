"""Serving's gRPC transport: the Open Inference Protocol's ``inference.GRPCInferenceService``
(stubs generated from ``proto/open_inference.proto`` at build time) over the data plane, so
an answer has the same version guarantee as over HTTP: one version's dense model and that
version's embeddings, named in ``model_version``.

``ModelInfer`` takes each input's data from ``raw_input_contents`` (one entry per input,
row-major little-endian; BYTES length-prefixed) or from its typed ``contents``
(``fp32_contents``, ``uint64_contents``, ``bytes_contents``, ...), not both; it answers in
``raw_output_contents``, or in typed ``contents`` when the request's inputs came typed.
Errors are gRPC statuses with the data plane's message: ``INVALID_ARGUMENT`` (bad input,
over-size batch), ``NOT_FOUND`` (unknown model or version), ``UNAVAILABLE`` (no version
loaded, cube unreachable), ``INTERNAL`` (anything else, logged). Every call is counted in
serving's metrics under the endpoint ``grpc_<Method>``.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from typing import Callable, Optional

import grpc
import numpy as np

from runtime.serving.dataplane import DataPlane
from runtime.serving.proto import open_inference_pb2 as pb
from runtime.serving.proto import open_inference_pb2_grpc as pb_grpc
from runtime.serving.protocol import (DATATYPES, BadRequest, InferenceError, InferInput, InferRequest,
                                      InferResponse, RequestedOutput, tensor_bytes_of)

log = logging.getLogger(__name__)

#: HTTP status of an ``InferenceError`` -> gRPC status code
STATUS_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
                413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}
#: datatype -> the typed-contents field holding it (FP16 travels raw only)
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def _param_value(p: pb.InferParameter):
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def _set_param(target: pb.InferParameter, value) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def decode_request(req: pb.ModelInferRequest) -> tuple[InferRequest, bool]:
    """A ``ModelInferRequest`` -> ``(InferRequest, typed)``: ``typed`` when the inputs came in
    typed contents. Raises ``BadRequest`` naming the input."""
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise BadRequest(f"raw_input_contents: {len(raw)} entries for {len(req.inputs)} inputs (one per input)")
    inputs, names = [], set()
    for i, t in enumerate(req.inputs):
        where = f"inputs[{i}]"
        if t.name in names:
            raise BadRequest(f"{where}.name: input {t.name!r} given twice")
        names.add(t.name)
        if t.datatype not in DATATYPES:
            raise BadRequest(f"{where}.datatype: unknown datatype {t.datatype!r} (the protocol's: "
                             f"{', '.join(DATATYPES)})")
        shape = list(t.shape)
        if any(d < 0 for d in shape):
            raise BadRequest(f"{where}.shape: expected non-negative sizes, got {shape}")
        inp = InferInput(t.name, t.datatype, shape, parameters={k: _param_value(v) for k, v in t.parameters.items()},
                         where=where)
        has_contents = t.HasField("contents")
        if raw:
            if has_contents:
                raise BadRequest(f"{where}.contents: give raw_input_contents or typed contents, not both")
            inp.raw = raw[i]
        elif has_contents:
            field = CONTENTS.get(t.datatype)
            if field is None:
                raise BadRequest(f"{where}.contents: {t.datatype} travels in raw_input_contents only")
            values = getattr(t.contents, field)
            if t.datatype == "BYTES":
                try:
                    inp.data = np.array([v.decode("utf-8") for v in values], dtype=object)
                except UnicodeDecodeError:
                    raise BadRequest(f"{where}.contents.bytes_contents: not UTF-8 text") from None
            else:
                inp.data = np.array(values, dtype=DATATYPES[t.datatype])
        else:
            raise BadRequest(f"{where}: no data (raw_input_contents or contents)")
        inputs.append(inp)
    if not inputs:
        raise BadRequest("inputs: expected at least one input tensor")
    outputs = [RequestedOutput(o.name, {k: _param_value(v) for k, v in o.parameters.items()})
               for o in req.outputs] or None
    params = {k: _param_value(v) for k, v in req.parameters.items()}
    return InferRequest(inputs=inputs, id=req.id or None, outputs=outputs, parameters=params), not raw


def encode_response(resp: InferResponse, typed: bool) -> pb.ModelInferResponse:
    """An ``InferResponse`` -> ``ModelInferResponse`` (raw contents, or typed when ``typed``)."""
    out = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id or "")
    for k, v in resp.parameters.items():
        _set_param(out.parameters[k], v)
    for o in resp.outputs:
        t = out.outputs.add(name=o.name, datatype=o.datatype, shape=list(o.shape))
        if typed and o.datatype in CONTENTS:
            values = o.data.ravel()
            if o.datatype == "BYTES":
                values = [x if isinstance(x, bytes) else str(x).encode() for x in values]
            getattr(t.contents, CONTENTS[o.datatype]).extend(values.tolist() if hasattr(values, "tolist")
                                                              else values)
        else:
            out.raw_output_contents.append(tensor_bytes_of(o))
    return out


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The service's methods over ``plane`` (module docstring)."""

    def __init__(self, plane: DataPlane):
        self.plane = plane
        self.metrics = plane.metrics

    def _call(self, method: str, context: grpc.ServicerContext, fn: Callable):
        """The one path of every call: run, map errors to statuses, count."""
        t0 = time.perf_counter()
        code = 200
        try:
            return fn()
        except InferenceError as exc:
            code = exc.status
            context.abort(STATUS_CODES.get(exc.status, grpc.StatusCode.INTERNAL), str(exc))
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
            self.plane.model_metadata(request.name)  # NotFound for another model
            m = self.plane.watcher.current
            if request.version and (m is None or str(m.version) != request.version):
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=self.plane.ready()[0])

        return self._call("ModelReady", context, run)

    def ServerMetadata(self, request, context):
        def run():
            meta = self.plane.server_metadata()
            return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                             extensions=meta["extensions"])

        return self._call("ServerMetadata", context, run)

    def ModelMetadata(self, request, context):
        def run():
            meta = self.plane.model_metadata(request.name, request.version or None)
            tensors = lambda ts: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in ts]  # noqa: E731
            return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                            inputs=tensors(meta["inputs"]), outputs=tensors(meta["outputs"]))

        return self._call("ModelMetadata", context, run)

    def ModelInfer(self, request, context):
        def run():
            req, typed = decode_request(request)
            return encode_response(self.plane.infer(request.model_name, request.model_version or None, req), typed)

        return self._call("ModelInfer", context, run)


class GrpcServer:
    """``inference.GRPCInferenceService`` on ``host:port`` over ``plane``, ``threads`` handler
    threads; messages up to ``max_message_bytes``. ``SO_REUSEPORT`` is on, so every serving
    worker process listens on the same port (the kernel spreads connections). Raises
    ``RuntimeError`` when the port cannot be bound."""

    def __init__(self, plane: DataPlane, host: str = "0.0.0.0", port: int = 8001, threads: int = 4,
                 max_message_bytes: int = 64 << 20):
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
            options=[("grpc.so_reuseport", 1), ("grpc.max_receive_message_length", max_message_bytes),
                     ("grpc.max_send_message_length", max_message_bytes)])
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(plane), self.server)
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
