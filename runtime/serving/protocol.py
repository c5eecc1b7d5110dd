"""The Open Inference Protocol (v2, as KServe and Triton define it): request and response
data models, the errors serving answers with, and the REST transport's codec: JSON, and
Triton's binary tensor data extension.

Specifications: https://github.com/kserve/open-inference-protocol (``inference_rest.md``)
and Triton's ``binary_data`` extension (``protocol/extension_binary_data.md``): after the
JSON header (its length in the ``Inference-Header-Content-Length`` HTTP header) come the
binary tensors, in the order of the inputs whose ``parameters.binary_data_size`` gives
their length; a tensor is its elements row-major, little-endian, a BYTES element a 4-byte
little-endian length then its bytes. An output is answered in binary when it is requested
with ``parameters.binary_data: true`` or the request has ``parameters.binary_data_output:
true``.

A request's tensors are decoded in two steps: the codec checks the document's structure
and keeps each input's data as sent (JSON values, binary bytes, or gRPC contents); the data
plane checks the names, datatypes and shapes against the model and only then converts the
data (``InferInput.array``), so an error names the first thing that is wrong. JSON has no
NaN or infinity: ``NaN``/``Infinity`` literals are refused, and so are non-finite floats
in binary or gRPC data, naming the input and the element; a missing value is ``null`` in
JSON (read as NaN, as the model's features define missing).
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

#: the protocol's tensor datatypes and their numpy element types (BYTES: Python str/bytes)
DATATYPES: dict[str, Optional[np.dtype]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64), "BYTES": None,
}


class InferenceError(Exception):
    """An error answered to the client: ``status`` is the HTTP status, the message names
    the field and what was wrong."""

    status = 500

    def __init__(self, message: str):
        super().__init__(message)


class BadRequest(InferenceError):
    """Bad input (400)."""

    status = 400


class PayloadTooLarge(InferenceError):
    """A request body over the server's limit (413)."""

    status = 413


class NotFound(InferenceError):
    """Unknown model or version (404)."""

    status = 404


class Unavailable(InferenceError):
    """Serving cannot answer now: no version loaded, cube unreachable (503)."""

    status = 503


@dataclass
class InferInput:
    """One input tensor as sent: ``name``, ``datatype`` (a key of ``DATATYPES``), ``shape``,
    its data in one of three forms, and ``parameters``; ``where`` names it in errors
    (``inputs[i]``). ``data``: JSON values (a flat or nested row-major array) or a numpy
    array (gRPC typed contents); ``raw``: binary bytes (the binary extension, gRPC
    ``raw_input_contents``)."""

    name: str
    datatype: str
    shape: list[int]
    data: Any = None
    parameters: dict = field(default_factory=dict)
    where: str = "input"
    raw: Optional[bytes] = None

    @property
    def count(self) -> int:
        """Elements the shape holds."""
        return math.prod(self.shape)

    def array(self) -> np.ndarray:
        """The data as a flat numpy array of the datatype (BYTES: an object array of str).
        FP16/32/64 accept JSON ``null`` for a missing value (NaN). Raises ``BadRequest``
        naming ``<where>.data`` (or ``<where>`` for binary data): not an array, ragged
        nesting, a wrong element or byte count, an element of the wrong kind (a string or
        boolean for a number, a float or negative for an unsigned integer), a value out of
        the datatype's range, or a non-finite float (naming the element)."""
        if self.raw is not None:
            out = _raw_tensor(self.raw, self.datatype, self.count, self.where)
        elif isinstance(self.data, np.ndarray):
            if self.data.size != self.count:
                raise BadRequest(f"{self.where}: {self.data.size} elements, but shape {self.shape} needs "
                                 f"{self.count}")
            out = self.data.ravel()
        else:
            return _json_tensor(self.data, self.datatype, self.count, f"{self.where}.data", self.shape)
        if out.dtype.kind == "f":
            _check_finite(out, self.where, self.shape)
        return out


@dataclass
class RequestedOutput:
    """An output the client asked for (``outputs`` of the request)."""

    name: str
    parameters: dict = field(default_factory=dict)


@dataclass
class InferRequest:
    """A decoded inference request: ``id`` (echoed), ``inputs``, the requested ``outputs``
    (None: every output) and ``parameters``."""

    inputs: list[InferInput]
    id: Optional[str] = None
    outputs: Optional[list[RequestedOutput]] = None
    parameters: dict = field(default_factory=dict)


@dataclass
class InferOutput:
    """An output tensor: ``data`` is a numpy array of ``shape``."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray


@dataclass
class InferResponse:
    """An inference response (``model_version`` is a string, as the protocol says).
    ``binary``: the names of the outputs to send as binary data."""

    model_name: str
    model_version: str
    outputs: list[InferOutput]
    id: Optional[str] = None
    parameters: dict = field(default_factory=dict)
    binary: frozenset = frozenset()

    def to_json(self) -> dict:
        """The REST form with every output in JSON."""
        return self._header(binary=False)

    def _header(self, binary: bool) -> dict:
        out: dict[str, Any] = {"model_name": self.model_name, "model_version": self.model_version}
        if self.id is not None:
            out["id"] = self.id
        if self.parameters:
            out["parameters"] = self.parameters
        outs = []
        for o in self.outputs:
            t: dict[str, Any] = {"name": o.name, "datatype": o.datatype, "shape": list(o.shape)}
            if binary and o.name in self.binary:
                t["parameters"] = {"binary_data_size": int(tensor_bytes(o))}
            else:
                t["data"] = o.data.ravel().tolist()
            outs.append(t)
        out["outputs"] = outs
        return out

    def encode(self) -> tuple[bytes, Optional[int]]:
        """The REST body: ``(body, header length)``; the header length is None when the
        body is JSON alone, else the JSON part's length (``Inference-Header-Content-Length``)
        and the binary outputs follow it."""
        header = json.dumps(self._header(binary=True), separators=(",", ":")).encode()
        blobs = [tensor_bytes_of(o) for o in self.outputs if o.name in self.binary]
        if not blobs:
            return header, None
        return b"".join([header, *blobs]), len(header)


def tensor_bytes_of(o: InferOutput) -> bytes:
    """An output's binary form: row-major little-endian elements (BYTES: 4-byte length +
    bytes each)."""
    if o.datatype == "BYTES":
        parts = []
        for x in o.data.ravel():
            b = x if isinstance(x, bytes) else str(x).encode()
            parts += [struct.pack("<I", len(b)), b]
        return b"".join(parts)
    return np.ascontiguousarray(o.data, dtype=DATATYPES[o.datatype].newbyteorder("<")).tobytes()


def tensor_bytes(o: InferOutput) -> int:
    """Length of ``tensor_bytes_of(o)`` in bytes."""
    if o.datatype == "BYTES":
        return len(tensor_bytes_of(o))
    return int(o.data.size) * DATATYPES[o.datatype].itemsize


def _shape(raw: Any, where: str) -> list[int]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                            for d in raw):
        raise BadRequest(f"{where}.shape: expected a list of non-negative integers, got {raw!r}")
    return raw


class _NonFinite(float):
    """A ``NaN``/``Infinity``/``-Infinity`` literal of a JSON body (not JSON; refused by the
    tensor decoders, which name the element)."""

    def __new__(cls, literal: str):
        obj = super().__new__(cls, literal.lower().replace("infinity", "inf"))
        obj.literal = literal
        return obj


def _loads(text: bytes):
    return json.loads(text, parse_constant=_NonFinite)


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


def decode_json_request(body: bytes) -> InferRequest:
    """A REST request whose body is JSON alone (``decode_rest_request``)."""
    return decode_rest_request(body, None)


def binary_outputs(req: InferRequest, names: list[str]) -> frozenset:
    """Which of the outputs ``names`` to answer in binary: those requested with
    ``parameters.binary_data: true``; with ``parameters.binary_data_output: true`` on the
    request, every output not requested with ``binary_data: false``."""
    default = req.parameters.get("binary_data_output") is True
    asked = {o.name: o.parameters.get("binary_data") for o in (req.outputs or [])}
    return frozenset(n for n in names if asked.get(n, default) is True
                     or (asked.get(n) is None and default))


def _element(k: int, shape: list[int]) -> str:
    """``element k`` with its index in ``shape`` (``[row, col]``)."""
    if len(shape) > 1 and all(d > 0 for d in shape):
        return f"element {k} (index {list(int(i) for i in np.unravel_index(k, shape))})"
    return f"element {k}"


def _check_finite(arr: np.ndarray, where: str, shape: list[int]) -> None:
    bad = ~np.isfinite(arr)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise BadRequest(f"{where}: {_element(k, shape)} is {arr[k]}: NaN and infinities are not accepted")


def _raw_tensor(raw: bytes, datatype: str, count: int, where: str) -> np.ndarray:
    """Binary tensor bytes -> a flat array (BYTES: object array of str)."""
    dtype = DATATYPES[datatype]
    if dtype is None:
        out, pos = [], 0
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise BadRequest(f"{where}: BYTES element {len(out)} has a truncated length prefix")
            (n,) = struct.unpack_from("<I", raw, pos)
            if pos + 4 + n > len(raw):
                raise BadRequest(f"{where}: BYTES element {len(out)} of {n} bytes runs past the data")
            try:
                out.append(raw[pos + 4:pos + 4 + n].decode("utf-8"))
            except UnicodeDecodeError:
                raise BadRequest(f"{where}: BYTES element {len(out)} is not UTF-8 text") from None
            pos += 4 + n
        if len(out) != count:
            raise BadRequest(f"{where}: {len(out)} BYTES elements, but shape needs {count}")
        return np.array(out, dtype=object)
    want = count * dtype.itemsize
    if len(raw) != want:
        raise BadRequest(f"{where}: {len(raw)} bytes of binary data, but {count} {datatype} elements need {want}")
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)


_FLOATS = {int, float, type(None)}


def _flatten(data: Any, where: str) -> list:
    if not isinstance(data, list):
        raise BadRequest(f"{where}: expected a JSON array")
    if data and isinstance(data[0], list):  # nested form: flatten row-major
        try:
            a = np.asarray(data, dtype=object)
        except ValueError:
            raise BadRequest(f"{where}: ragged nested arrays (not a tensor)") from None
        if any(isinstance(x, list) for x in a.ravel()):
            raise BadRequest(f"{where}: ragged nested arrays (not a tensor)")
        return a.ravel().tolist()
    return data


def _json_tensor(data: Any, datatype: str, count: int, where: str, shape: list[int]) -> np.ndarray:
    flat = _flatten(data, where)
    if len(flat) != count:
        raise BadRequest(f"{where}: {len(flat)} elements, but shape needs {count}")
    dtype = DATATYPES[datatype]
    types = set(map(type, flat))
    if _NonFinite in types:
        k = next(i for i, x in enumerate(flat) if type(x) is _NonFinite)
        raise BadRequest(f"{where}: {_element(k, shape)} is {flat[k].literal}, which JSON has no such number for "
                         "(NaN and infinities are not accepted; send null for a missing value)")
    if dtype is None:  # BYTES
        if not types <= {str}:
            bad = next(x for x in flat if type(x) is not str)
            raise BadRequest(f"{where}: {bad!r} is not a string (BYTES expected)")
        return np.array(flat, dtype=object)
    if dtype.kind == "b":
        if not types <= {bool}:
            bad = next(x for x in flat if type(x) is not bool)
            raise BadRequest(f"{where}: {bad!r} is not a boolean (BOOL expected)")
        return np.array(flat, dtype=dtype)
    if dtype.kind in "ui":
        if not types <= {int}:
            bad = next(x for x in flat if type(x) is not int)
            kind = "an unsigned" if dtype.kind == "u" else "an"
            raise BadRequest(f"{where}: {bad!r} is not {kind} integer ({datatype} expected)")
        info = np.iinfo(dtype)
        if flat and (min(flat) < info.min or max(flat) > info.max):
            raise BadRequest(f"{where}: value out of the {datatype} range [{info.min}, {info.max}]")
        return np.array(flat, dtype=dtype)
    if not types <= _FLOATS:
        bad = next(x for x in flat if type(x) not in _FLOATS)
        raise BadRequest(f"{where}: non-numeric value {bad!r} ({datatype} expected; null = missing)")
    out = np.array(flat, dtype=dtype)  # None -> NaN (missing)
    inf = np.isinf(out)
    if inf.any():
        k = int(np.flatnonzero(inf)[0])
        raise BadRequest(f"{where}: {_element(k, shape)} is {flat[k]!r}, out of the {datatype} range")
    return out
