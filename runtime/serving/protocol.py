"""The Open Inference Protocol (v2, as KServe and Triton define it): request and response
data models, the errors serving answers with, and the JSON codec of the REST transport.

Specification: https://github.com/kserve/open-inference-protocol (``inference_rest.md``).
A request's tensors are decoded in two steps: ``decode_json_request`` checks the
document's structure and keeps each input's ``data`` as sent; the data plane checks the
names, datatypes and shapes against the model and only then converts the data
(``InferInput.array``), so an error names the first thing that is wrong.
"""
from __future__ import annotations

import json
import math
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
    ``data`` (JSON: a flat or nested row-major array) and ``parameters``; ``where`` names it
    in errors (``inputs[i]``)."""

    name: str
    datatype: str
    shape: list[int]
    data: Any
    parameters: dict = field(default_factory=dict)
    where: str = "input"

    @property
    def count(self) -> int:
        """Elements the shape holds."""
        return math.prod(self.shape)

    def array(self) -> np.ndarray:
        """The data as a flat numpy array of the datatype (BYTES: an object array of str).
        FP16/32/64 accept JSON ``null`` for a missing value (NaN). Raises ``BadRequest``
        naming ``<where>.data``: not an array, ragged nesting, a wrong element count, an
        element of the wrong kind (a string or boolean for a number, a float or negative
        for an unsigned integer), or a value out of the datatype's range."""
        return _json_tensor(self.data, self.datatype, self.count, f"{self.where}.data")


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
    """An inference response (``model_version`` is a string, as the protocol says)."""

    model_name: str
    model_version: str
    outputs: list[InferOutput]
    id: Optional[str] = None
    parameters: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The REST (JSON) form."""
        out: dict[str, Any] = {"model_name": self.model_name, "model_version": self.model_version}
        if self.id is not None:
            out["id"] = self.id
        if self.parameters:
            out["parameters"] = self.parameters
        out["outputs"] = [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape),
                           "data": o.data.ravel().tolist()} for o in self.outputs]
        return out


def _shape(raw: Any, where: str) -> list[int]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                            for d in raw):
        raise BadRequest(f"{where}.shape: expected a list of non-negative integers, got {raw!r}")
    return raw


def decode_json_request(body: bytes) -> InferRequest:
    """Parses a JSON inference request and checks its structure (module docstring).
    Raises ``BadRequest`` naming the field."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body: not valid JSON ({exc})") from None
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
    inputs, names = [], set()
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
        if "binary_data_size" in ip:
            raise BadRequest(f"{where}.parameters.binary_data_size: the binary tensor data extension is not "
                             "supported")
        if "data" not in raw:
            raise BadRequest(f"{where}.data: missing")
        inputs.append(InferInput(name, datatype, shape, raw["data"], ip, where))
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


def _json_tensor(data: Any, datatype: str, count: int, where: str) -> np.ndarray:
    flat = _flatten(data, where)
    if len(flat) != count:
        raise BadRequest(f"{where}: {len(flat)} elements, but shape needs {count}")
    dtype = DATATYPES[datatype]
    types = set(map(type, flat))
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
    out = np.array(flat, dtype=dtype)  # None -> NaN
    if np.isinf(out).any():
        raise BadRequest(f"{where}: infinite or out-of-range value")
    return out
