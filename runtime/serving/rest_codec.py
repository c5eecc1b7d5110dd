"""The Open Inference Protocol's REST codec (v2, as KServe and Triton define it): a JSON
request body, or Triton's binary tensor data extension, to the protocol's data model
(``runtime.serving.protocol``; the answers back: ``runtime.serving.rest_answer``); and the
bodies of the raw-row ``POST /predict``.

Specifications: https://github.com/kserve/open-inference-protocol (``inference_rest.md``)
and Triton's ``binary_data`` extension (``protocol/extension_binary_data.md``): after the
JSON header (its length in the ``Inference-Header-Content-Length`` HTTP header) come the
binary tensors, in the order of the inputs whose ``parameters.binary_data_size`` gives
their length; a tensor is its elements row-major, little-endian, a BYTES element a 4-byte
little-endian length then its bytes (``protocol.tensor_bytes_of``). An output is answered
in binary when it is requested with ``parameters.binary_data: true`` or the request has
``parameters.binary_data_output: true``.

The decoder checks the document's structure and keeps each input's data as sent (JSON
values, or binary bytes viewed in place in the body); the model checks names, datatypes
and shapes and only then converts the data (``InferInput.array``). JSON has no NaN or
infinity: ``NaN``/``Infinity`` literals are kept as ``protocol.NonFinite`` and refused by
the conversion, naming the element.

JSON is parsed with simdjson (``pysimdjson``, a strict RFC 8259 parser): a flat ``data``
array of numbers of an FP, INT or UINT input is copied straight into a typed array
(``protocol.JsonNumbers``: the FP datatype's floats, int64 or uint64) without a Python
object per element; any other array (null, booleans, strings, nested arrays) becomes JSON
values. A document simdjson does not take (``NaN`` literals, integers beyond 64 bits,
duplicate keys, encodings other than UTF-8) is parsed again by the standard library's
``json``, whose reading and error messages are the reference: both readings give the same
tensors and the same errors (``tests/serving/test_codec.py``). Answers are encoded with
orjson (``runtime.serving.rest_answer``). What the codec costs per request:
``make bench-serving`` (docs/benchmarks.md).

Missing values (``null``) in a large document's FP ``data`` arrays: simdjson copies only
arrays of numbers into typed arrays, so the body is read once more with every ``null``
spelled ``MISSING_TEXT`` (``1e99``, a number; ``spell_nulls``), each FP array taken as
numbers and its ``MISSING`` elements made NaN. That reading is kept only when it is
exact: the ``MISSING`` numbers found in FP data arrays are as many as the ``null``
tokens of the body (so every ``null`` was a missing value there, and no number sent was
``MISSING`` itself), and no other value, string or key of the document holds
``MISSING_TEXT`` (a ``null`` inside a string or elsewhere); otherwise, or on any error,
the body is read as it was sent, as above. ``null`` is spelled with as many bytes
(``1e99``), so offsets in the body do not move, and it and ``[`` are found with numpy
(``spell_nulls``, ``_count_open_brackets``).
"""
from __future__ import annotations

import json
import threading
from typing import Any, Optional

import numpy as np
import simdjson

from runtime.serving.protocol import (DATATYPES, BadRequest, InferInput, InferRequest, JsonNumbers, NonFinite,
                                      RequestedOutput)

#: the HTTP header giving the JSON part's length (bytes) of a body with binary tensors
HEADER_LENGTH = "Inference-Header-Content-Length"
#: datatype kind -> (simdjson buffer type, numpy dtype) of a ``data`` array decoded into numbers
_NUMBERS = {"f": ("d", np.dtype(np.float64)), "i": ("i", np.dtype(np.int64)), "u": ("u", np.dtype(np.uint64))}
#: documents up to this many bytes are read into Python values at once (in C: fewer steps
#: than the lazy reading of a larger one; at batch 1 it is the cheaper of the two)
SMALL_DOCUMENT = 4096
_local = threading.local()  # a simdjson parser per thread (a parser is not shared between threads)
#: how a large document's ``null`` is spelled to read its FP data arrays first (module
#: docstring): a number as long as ``null`` (so the spelling is a copy with bytes written in
#: place), a float64 beyond every FP datatype's range but FP64's (no FP16/FP32 value sent
#: can be it)
MISSING_TEXT = "1e99"
MISSING = float(MISSING_TEXT)
_NULL = np.frombuffer(b"null", np.uint8)
_MISSING_BYTES = np.frombuffer(MISSING_TEXT.encode(), np.uint8)
_OPEN_BRACKET = ord("[")


class _Nulls:
    """The reading of a document whose ``null`` tokens were spelled ``MISSING``: ``left``
    counts the ``null`` tokens not yet found as missing values of FP data arrays."""

    __slots__ = ("left",)

    def __init__(self, left: int):
        self.left = left


class _NotMissing(Exception):
    """The document's ``null`` tokens are not all missing values of FP data arrays: it is
    read again as sent."""


def _shape(raw: Any, where: str) -> list[int]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                            for d in raw):
        raise BadRequest(f"{where}.shape: expected a list of non-negative integers, got {raw!r}")
    return raw


class _Reparse(Exception):
    """The simdjson reading of a document is not the ``json`` reading (duplicate keys)."""


def _plain(v: Any, arrays: list, nulls: Optional[_Nulls] = None) -> Any:
    """A simdjson value -> Python values (``json``'s reading); counts the arrays it holds
    in ``arrays[0]``. With ``nulls``: raises ``_NotMissing`` for ``MISSING`` met here."""
    if isinstance(v, simdjson.Object):
        return {k: _plain(v[k], arrays, nulls) for k in _keys(v, nulls)}
    if isinstance(v, simdjson.Array):
        arrays[0] += 1
        return [_plain(x, arrays, nulls) for x in v]
    if nulls is not None and (v == MISSING if type(v) is float else type(v) is str and MISSING_TEXT in v):
        raise _NotMissing
    return v


def _keys(obj: "simdjson.Object", nulls: Optional[_Nulls] = None) -> list[str]:
    keys = list(obj)
    if len(set(keys)) != len(keys):
        raise _Reparse  # json keeps the last value of a duplicate key, simdjson's lookup the first
    if nulls is not None and any(MISSING_TEXT in k for k in keys):
        raise _NotMissing
    return keys


def _parse(text: bytes, recursive: bool = False) -> Any:
    """simdjson's reading of ``text`` with this thread's parser (``recursive``: into Python
    values, else lazily). Raises ``ValueError``/``RuntimeError`` for what is not JSON."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = simdjson.Parser()
    try:
        return parser.parse(text, recursive)
    except RuntimeError as exc:
        if "re-use a parser" not in str(exc):
            raise  # e.g. BIGINT_ERROR
        parser = _local.parser = simdjson.Parser()  # a value of the last document still referenced
        return parser.parse(text, recursive)


def _simd_document(text: bytes, nulls: Optional[_Nulls] = None) -> tuple[Any, int]:
    """``(document, arrays)``: the document as ``json.loads`` reads it, but each input's
    ``data`` array left as a simdjson array (for ``_data``); ``arrays``: how many arrays it
    holds, not counting those inside ``data`` arrays. Raises ``ValueError``/``RuntimeError``
    (not JSON for simdjson) or ``_Reparse``; with ``nulls``, ``_NotMissing`` as ``_plain``."""
    doc = _parse(text)
    arrays = [0]
    if not isinstance(doc, simdjson.Object):
        return _plain(doc, arrays, nulls), arrays[0]
    out = {}
    for k in _keys(doc, nulls):
        v = doc[k]
        if k == "inputs" and isinstance(v, simdjson.Array):
            arrays[0] += 1
            items = []
            for raw in v:
                if isinstance(raw, simdjson.Object):
                    item = {}
                    for ik in _keys(raw, nulls):
                        iv = raw[ik]
                        item[ik] = iv if ik == "data" and isinstance(iv, simdjson.Array) else _plain(iv, arrays,
                                                                                                      nulls)
                        arrays[0] += ik == "data" and isinstance(iv, simdjson.Array)
                    items.append(item)
                else:
                    items.append(_plain(raw, arrays, nulls))
            out[k] = items
        else:
            out[k] = _plain(v, arrays, nulls)
    return out, arrays[0]


def _data(data: Any, datatype: str, flat: bool, nulls: Optional[_Nulls] = None) -> Any:
    """An input's ``data`` as the model converts it: a simdjson array of numbers of the
    datatype's kind -> ``JsonNumbers`` (``flat``: no array of the document is nested in a
    ``data`` array; floats already of the FP datatype, within its range); any other
    simdjson array -> its JSON values. With ``nulls`` (the document's ``null`` spelled
    ``MISSING``): an FP array's ``MISSING`` elements become NaN and are counted off
    ``nulls.left``; an array that would become JSON values raises ``_NotMissing``."""
    if not isinstance(data, simdjson.Array):
        return data
    dtype = DATATYPES.get(datatype)
    kind = _NUMBERS.get(dtype.kind) if dtype is not None else None
    if flat and kind is not None:
        try:
            values = np.frombuffer(data.as_buffer(of_type=kind[0]), dtype=kind[1])
        except (TypeError, ValueError):  # null, a boolean, a string; an integer out of range or negative
            if nulls is not None:
                raise _NotMissing from None
            return data.as_list()
        if dtype.kind == "f":
            missing = None
            if nulls is not None:
                missing = values == MISSING
                found = int(np.count_nonzero(missing))
                nulls.left -= found
                if not found:
                    missing = None
            with np.errstate(over="ignore"):
                values = values.astype(dtype)
            if missing is not None:
                values[missing] = np.nan
            if np.isinf(values).any():  # out of the datatype's range: the message quotes the JSON number
                if nulls is not None:
                    raise _NotMissing
                return data.as_list()
        return JsonNumbers(values)
    if nulls is not None:
        raise _NotMissing
    return data.as_list()


def _loads(text: bytes, nulls: Optional[_Nulls] = None) -> tuple[Any, Optional[bool]]:
    """``(document, flat)``: the JSON document ``text`` (module docstring). A large one
    read by simdjson has its ``data`` arrays as simdjson arrays (for ``_data``), and
    ``flat`` tells whether they hold no array; read into Python values (a small one, or by
    ``json``), ``flat`` is None. Raises ``ValueError`` (``json``'s, for a document that is
    not JSON); with ``nulls``, ``_NotMissing`` wherever simdjson's reading is not taken."""
    try:
        if len(text) <= SMALL_DOCUMENT:
            return _parse(text, True), None  # a duplicate key: the last value, as json reads it
        doc, arrays = _simd_document(text, nulls)
        # every "[" in the text opens an array or lies in a string: as many as the arrays
        # outside data contents plus the data arrays means no data array holds an array
        return doc, _count_open_brackets(text) == arrays
    except (ValueError, RuntimeError, _Reparse):
        if nulls is not None:
            raise _NotMissing from None
        return json.loads(text, parse_constant=NonFinite), None


def _count_open_brackets(text: bytes) -> int:
    """How many ``[`` bytes ``text`` holds (numpy's compare and count, cheaper than
    ``bytes.count`` on a large body)."""
    return int(np.count_nonzero(np.frombuffer(text, np.uint8) == _OPEN_BRACKET))


def spell_nulls(body: bytes) -> tuple[bytes, int]:
    """``(text, count)``: ``body`` with each of its ``count`` ``null`` byte sequences
    (tokens, or inside strings and keys) written as ``MISSING_TEXT``; ``body`` itself
    when it has none. The same text as ``body.replace(b"null", b"1e99")`` (``null`` cannot
    overlap itself), found with numpy (the ``n`` bytes, then the three after each) and
    written in place in a copy of the bytes, made ``bytes`` at the end."""
    a = np.frombuffer(body, np.uint8)
    at = np.flatnonzero(a[:-3] == _NULL[0])  # (empty for a body shorter than 4 bytes)
    for j in (1, 2, 3):
        at = at[a[at + j] == _NULL[j]]
    if not at.shape[0]:
        return body, 0
    out = a.copy()
    for j in range(4):
        out[at + j] = _MISSING_BYTES[j]
    return out.tobytes(), int(at.shape[0])


def decode_rest_request(body: bytes, header_length: Optional[int] = None) -> InferRequest:
    """Parses a REST inference request and checks its structure (module docstring).
    ``header_length``: the ``Inference-Header-Content-Length`` header (None: the whole body
    is JSON). Raises ``BadRequest`` naming the field."""
    if header_length is None and len(body) > SMALL_DOCUMENT and b"null" in body:
        spelled, count = spell_nulls(body)
        nulls = _Nulls(count)
        try:
            req = _decode(spelled, None, nulls)
            if nulls.left == 0:
                return req
        except (_NotMissing, BadRequest):  # read as sent: its own reading, or its own error
            pass
    return _decode(body, header_length)


def _decode(body: bytes, header_length: Optional[int], nulls: Optional[_Nulls] = None) -> InferRequest:
    if header_length is not None:
        if not 0 < header_length <= len(body):
            raise BadRequest(f"Inference-Header-Content-Length: {header_length} is not within the body's "
                             f"{len(body)} bytes")
        head, blob = body[:header_length], memoryview(body)[header_length:]
    else:
        head, blob = body, None
    try:
        req, flat = _loads(head, nulls)
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
            inp.raw = blob[offset:offset + size]  # a view of the body, no copy
            offset += size
        elif "data" not in raw:
            raise BadRequest(f"{where}.data: missing")
        else:
            inp.data = _data(raw["data"], datatype, flat is True, nulls)
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
