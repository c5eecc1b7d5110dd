"""The Open Inference Protocol's REST codec (v2, as KServe and Triton define it): a JSON
request body, or Triton's binary tensor data extension, to the protocol's data model
(``runtime.serving.protocol``) and back; and the bodies of the raw-row ``POST /predict``.

Specifications: https://github.com/kserve/open-inference-protocol (``inference_rest.md``)
and Triton's ``binary_data`` extension (``protocol/extension_binary_data.md``): after the
JSON header (its length in the ``Inference-Header-Content-Length`` HTTP header) come the
binary tensors, in the order of the inputs whose ``parameters.binary_data_size`` gives
their length; a tensor is its elements row-major, little-endian, a BYTES element a 4-byte
little-endian length then its bytes (``protocol.tensor_bytes_of``). An output is answered
in binary when it is requested with ``parameters.binary_data: true`` or the request has
``parameters.binary_data_output: true``.

The decoder checks the document's structure and keeps each input's data as sent (JSON
values or binary bytes); the model checks names, datatypes and shapes and only then
converts the data (``InferInput.array``). JSON has no NaN or infinity: ``NaN``/``Infinity``
literals are kept as ``protocol.NonFinite`` and refused by the conversion, naming the
element.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from runtime.serving.protocol import (DATATYPES, BadRequest, InferInput, InferRequest, InferResponse, NonFinite,
                                      RequestedOutput, tensor_bytes, tensor_bytes_of)

#: the HTTP header giving the JSON part's length (bytes) of a body with binary tensors
HEADER_LENGTH = "Inference-Header-Content-Length"


def _shape(raw: Any, where: str) -> list[int]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                            for d in raw):
        raise BadRequest(f"{where}.shape: expected a list of non-negative integers, got {raw!r}")
    return raw



def _loads(text: bytes):
    return json.loads(text, parse_constant=NonFinite)


def decode_rest_request(body: bytes, header_length: Optional[int] = None) -> InferRequest:
    """Parses a REST inference request and checks its structure (module docstring).
    ``header_length``: the ``Inference-Header-Content-Length`` header (None: the whole body
    is JSON). Raises ``BadRequest`` naming the field."""
    if header_length is not None:
        if not 0 < header_length <= len(body):
            raise BadRequest(f"Inference-Header-Content-Length: {header_length} is not within the body's "
                             f"{len(body)} bytes")
        head, blob = body[:header_length], memoryview(body)[header_length:]
    else:
        head, blob = body, None
    try:
        req = _loads(head)
    except (ValueError, UnicodeDecodeError) as exc:
        what = "request header" if header_length is not None else "request body"
        raise BadRequest(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(req, dict):
        raise BadRequest("request body: expected a JSON object")
    rid = req.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("id: expected a string")
    params = req.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("parameters: expected a JSON object")
    raw_inputs = req.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("inputs: expected a non-empty array of input tensors")
    inputs, names, offset = [], set(), 0
    for i, raw in enumerate(raw_inputs):
        where = f"inputs[{i}]"
        if not isinstance(raw, dict):
            raise BadRequest(f"{where}: expected a JSON object")
        name = raw.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"{where}.name: expected a string")
        if name in names:
            raise BadRequest(f"{where}.name: input {name!r} given twice")
        names.add(name)
        datatype = raw.get("datatype")
        if not isinstance(datatype, str):
            raise BadRequest(f"{where}.datatype: expected a string")
        if datatype not in DATATYPES:
            raise BadRequest(f"{where}.datatype: unknown datatype {datatype!r} (the protocol's: "
                             f"{', '.join(DATATYPES)})")
        shape = _shape(raw.get("shape"), where)
        ip = raw.get("parameters") or {}
        if not isinstance(ip, dict):
            raise BadRequest(f"{where}.parameters: expected a JSON object")
        inp = InferInput(name, datatype, shape, parameters=ip, where=where)
        size = ip.get("binary_data_size")
        if size is not None:
            if blob is None:
                raise BadRequest(f"{where}.parameters.binary_data_size: binary data needs the "
                                 "Inference-Header-Content-Length header")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise BadRequest(f"{where}.parameters.binary_data_size: expected a non-negative integer, "
                                 f"got {size!r}")
            if "data" in raw:
                raise BadRequest(f"{where}: give either 'data' or binary data (binary_data_size), not both")
            if offset + size > len(blob):
                raise BadRequest(f"{where}.parameters.binary_data_size: {size} bytes at offset {offset}, "
                                 f"but the binary part has {len(blob)} bytes")
            inp.raw = bytes(blob[offset:offset + size])
            offset += size
        elif "data" not in raw:
            raise BadRequest(f"{where}.data: missing")
        else:
            inp.data = raw["data"]
        inputs.append(inp)
    if blob is not None and offset != len(blob):
        raise BadRequest(f"request body: {len(blob) - offset} bytes of binary data after the inputs' "
                         f"binary_data_size ({offset} of {len(blob)} bytes used)")
    outputs = None
    raw_outputs = req.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise BadRequest("outputs: expected an array")
        outputs = []
        for j, o in enumerate(raw_outputs):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise BadRequest(f"outputs[{j}].name: expected an object with a string 'name'")
            op = o.get("parameters") or {}
            if not isinstance(op, dict):
                raise BadRequest(f"outputs[{j}].parameters: expected a JSON object")
            outputs.append(RequestedOutput(o["name"], op))
    return InferRequest(inputs=inputs, id=rid, outputs=outputs, parameters=params)



def binary_outputs(req: InferRequest, names: list[str]) -> frozenset:
    """Which of the outputs ``names`` to answer in binary: those requested with
    ``parameters.binary_data: true``; with ``parameters.binary_data_output: true`` on the
    request, every output not requested with ``binary_data: false``."""
    default = req.parameters.get("binary_data_output") is True
    asked = {o.name: o.parameters.get("binary_data") for o in (req.outputs or [])}
    return frozenset(n for n in names if asked.get(n, default) is True
                     or (asked.get(n) is None and default))



def encode_response(resp: InferResponse, req: InferRequest) -> tuple[bytes, Optional[int]]:
    """The REST body answering ``req``: ``(body, header length)``. The header length is None
    when the body is JSON alone, else the JSON part's length (bytes, sent as
    ``Inference-Header-Content-Length``) and the binary outputs (``binary_outputs``)
    follow it in output order."""
    binary = binary_outputs(req, [o.name for o in resp.outputs])
    out: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id is not None:
        out["id"] = resp.id
    if resp.parameters:
        out["parameters"] = resp.parameters
    outs = []
    for o in resp.outputs:
        t: dict[str, Any] = {"name": o.name, "datatype": o.datatype, "shape": list(o.shape)}
        if o.name in binary:
            t["parameters"] = {"binary_data_size": int(tensor_bytes(o))}
        else:
            t["data"] = o.data.ravel().tolist()
        outs.append(t)
    out["outputs"] = outs
    header = json.dumps(out, separators=(",", ":")).encode()
    blobs = [tensor_bytes_of(o) for o in resp.outputs if o.name in binary]
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def decode_predict_request(body: bytes, content_type: str) -> Any:
    """``POST /predict``'s body -> its raw rows, unchecked (the model checks them): with
    ``Content-Type: application/json``, the ``lines`` of ``{"lines": [...]}`` (or the
    document itself when it is not an object); otherwise the body's non-blank text lines
    (UTF-8, undecodable bytes replaced). Raises ``BadRequest`` for JSON that does not parse."""
    if content_type.split(";")[0].strip() == "application/json":
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"request body: not valid JSON ({exc})") from None
        return doc.get("lines") if isinstance(doc, dict) else doc
    return [ln for ln in body.decode("utf-8", "replace").splitlines() if ln.strip()]
