"""The Open Inference Protocol (v2, as KServe and Triton define it), independent of the
transport: the request and response data models, the errors serving answers with, and a
tensor's data in the forms the transports carry it (JSON values, little-endian binary,
typed arrays). The codecs: ``runtime.serving.rest_codec`` (REST: JSON and Triton's binary
tensor data extension) and ``runtime.serving.grpc_codec`` (gRPC messages).

Specification: https://github.com/kserve/open-inference-protocol. A tensor's binary form
(REST's binary extension, gRPC's ``raw_input_contents``/``raw_output_contents``) is its
elements row-major, little-endian, a BYTES element a 4-byte little-endian length then its
bytes.

A request's tensors are decoded in two steps: the codec checks the document's structure
and keeps each input's data as sent (JSON values, binary bytes, or gRPC contents); the
model checks the names, datatypes and shapes against its signature and only then
converts the data (``InferInput.array``), so an error names the first thing that is
wrong. JSON has no NaN or infinity: ``NaN``/``Infinity`` literals are refused, and so are
non-finite floats in binary or gRPC data, naming the input and the element; a missing
value is ``null`` in JSON (read as NaN, as the model's features define missing).
"""
from __future__ import annotations

import functools
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


class Overloaded(Unavailable):
    """An inference request refused at once by the queue limit (``--max-queue``): HTTP
    503 with ``Retry-After`` (``runtime.web.limits.ServerLimits.retry_after_s``), gRPC
    ``RESOURCE_EXHAUSTED`` (``grpc_codec.status_code``)."""


@dataclass
class InferInput:
    """One input tensor as sent: ``name``, ``datatype`` (a key of ``DATATYPES``), ``shape``,
    its data in one of three forms, and ``parameters``; ``where`` names it in errors
    (``inputs[i]``). ``data``: JSON values (a flat or nested row-major array), a
    ``JsonNumbers`` (a JSON array the codec decoded into numbers) or a numpy array (gRPC
    typed contents); ``raw``: binary data, ``bytes`` or a ``memoryview`` of the request
    (the binary extension, gRPC ``raw_input_contents``), read in place."""

    name: str
    datatype: str
    shape: list[int]
    data: Any = None
    parameters: dict = field(default_factory=dict)
    where: str = "input"
    raw: Optional[bytes | memoryview] = None

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
    """An inference response (``model_version`` is a string, as the protocol says)."""

    model_name: str
    model_version: str
    outputs: list[InferOutput]
    id: Optional[str] = None
    parameters: dict = field(default_factory=dict)


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


@dataclass
class JsonNumbers:
    """A flat JSON array of numbers, decoded by the codec straight into a typed array
    (``values``: for an FP datatype, its float array, every element a JSON number within
    the datatype's range; for an integer datatype, int64[m] or uint64[m], every element an
    integer of that range). The model's conversion (``InferInput.array``) then checks the
    count and an integer datatype's range on the array as it does on JSON values, with the
    same messages. Arrays holding anything else (null, booleans, strings, nested arrays,
    numbers out of an FP datatype's range) stay JSON values."""

    values: np.ndarray


class NonFinite(float):
    """A ``NaN``/``Infinity``/``-Infinity`` literal of a JSON body (not JSON; refused by the
    tensor decoders, which name the element)."""

    def __new__(cls, literal: str):
        obj = super().__new__(cls, literal.lower().replace("infinity", "inf"))
        obj.literal = literal
        return obj


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
        raw = bytes(raw)
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


@functools.lru_cache(maxsize=None)
def _iinfo(dtype: np.dtype) -> np.iinfo:
    """``np.iinfo(dtype)``, made once per integer datatype (not per request)."""
    return np.iinfo(dtype)


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


def _typed_json_tensor(data: JsonNumbers, datatype: str, count: int, where: str, shape: list[int]) -> np.ndarray:
    """``_json_tensor`` of an array the codec decoded into numbers (same checks, same
    messages). The codec decodes floats only for FP datatypes and integers only for
    integer ones; any other pairing goes the JSON values' way."""
    vals = data.values
    if vals.size != count:
        raise BadRequest(f"{where}: {vals.size} elements, but shape needs {count}")
    dtype = DATATYPES[datatype]
    if dtype is not None and dtype.kind == "f" and vals.dtype == dtype:  # the codec kept them in range
        return vals
    if dtype is not None and dtype.kind in "ui" and vals.dtype.kind in "ui":
        info = _iinfo(dtype)
        if vals.size and (int(vals.min()) < info.min or int(vals.max()) > info.max):
            raise BadRequest(f"{where}: value out of the {datatype} range [{info.min}, {info.max}]")
        return vals.astype(dtype, copy=False)
    return _json_tensor(vals.tolist(), datatype, count, where, shape)


def _json_tensor(data: Any, datatype: str, count: int, where: str, shape: list[int]) -> np.ndarray:
    if isinstance(data, JsonNumbers):
        return _typed_json_tensor(data, datatype, count, where, shape)
    flat = _flatten(data, where)
    if len(flat) != count:
        raise BadRequest(f"{where}: {len(flat)} elements, but shape needs {count}")
    dtype = DATATYPES[datatype]
    types = set(map(type, flat))
    if NonFinite in types:
        k = next(i for i, x in enumerate(flat) if type(x) is NonFinite)
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
        info = _iinfo(dtype)
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
