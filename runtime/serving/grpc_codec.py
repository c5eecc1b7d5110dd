"""The Open Inference Protocol's gRPC codec: ``inference.GRPCInferenceService`` messages
(stubs generated from ``proto/open_inference.proto`` at build time) to the protocol's data
model (``runtime.serving.protocol``) and back, and serving's errors to gRPC status codes.

``ModelInferRequest``: each input's data comes from ``raw_input_contents`` (one entry per
input, row-major little-endian; BYTES length-prefixed, ``protocol.tensor_bytes_of``) or from
its typed ``contents`` (``fp32_contents``, ``uint64_contents``, ``bytes_contents``, ...),
not both. ``ModelInferResponse``: outputs in ``raw_output_contents``, or in typed
``contents`` when the request's inputs came typed. Errors: ``INVALID_ARGUMENT`` (400),
``NOT_FOUND`` (404), ``RESOURCE_EXHAUSTED`` (413), ``UNAVAILABLE`` (503), ``INTERNAL``
(anything else).
"""
from __future__ import annotations

import grpc
import numpy as np

from runtime.serving.proto import open_inference_pb2 as pb
from runtime.serving.protocol import (DATATYPES, BadRequest, InferenceError, InferInput, InferRequest,
                                      InferResponse, Overloaded, RequestedOutput, tensor_bytes_of)

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


def status_code(exc: InferenceError) -> grpc.StatusCode:
    """The gRPC status answering ``exc`` (``Overloaded``: RESOURCE_EXHAUSTED; else
    ``STATUS_CODES`` by its HTTP status, INTERNAL for the others)."""
    if isinstance(exc, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return STATUS_CODES.get(exc.status, grpc.StatusCode.INTERNAL)


def server_metadata_response(meta: dict) -> pb.ServerMetadataResponse:
    """The data plane's v2 server metadata (``name``, ``version``, ``extensions``) as a message."""
    return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])


def model_metadata_response(meta: dict) -> pb.ModelMetadataResponse:
    """A model's v2 metadata (``name``, ``versions``, ``platform``, ``inputs``/``outputs`` of
    ``name``, ``datatype``, ``shape``) as a message (``parameters`` are not carried)."""
    def tensors(ts):
        return [pb.ModelMetadataResponse.TensorMetadata(**t) for t in ts]

    return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                    inputs=tensors(meta["inputs"]), outputs=tensors(meta["outputs"]))
