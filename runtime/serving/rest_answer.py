"""The Open Inference Protocol's REST answers: ``encode_response``, a response as JSON or with Triton's binary outputs.

The other direction, a request body to the protocol's data model, is
``runtime.serving.rest_codec``'s. Answers are encoded with orjson (numbers as ``json``
writes their values); an output goes in binary when the request asks for it
(``binary_outputs``), after the JSON part, whose length the
``Inference-Header-Content-Length`` HTTP header gives.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import orjson

from runtime.serving.protocol import InferRequest, InferResponse, tensor_bytes, tensor_bytes_of


def binary_outputs(req: InferRequest, names: list[str]) -> frozenset:
    """Which of the outputs ``names`` to answer in binary: those requested with
    ``parameters.binary_data: true``; with ``parameters.binary_data_output: true`` on the
    request, every output not requested with ``binary_data: false``."""
    default = req.parameters.get("binary_data_output") is True
    asked = {o.name: o.parameters.get("binary_data") for o in (req.outputs or [])}
    return frozenset(n for n in names if asked.get(n, default) is True
                     or (asked.get(n) is None and default))


def _json_values(data: np.ndarray) -> Any:
    """An output's elements as orjson writes them without a Python object each: a float
    array as float64 (each number written as ``json`` writes that value: the shortest
    text that reads back to it), integer and boolean arrays as they are; BYTES as a list."""
    flat = data.ravel()
    if flat.dtype == object:
        return flat.tolist()
    return np.ascontiguousarray(flat, dtype=np.float64 if flat.dtype.kind == "f" else flat.dtype.newbyteorder("="))


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
            t["data"] = _json_values(o.data)
        outs.append(t)
    out["outputs"] = outs
    header = orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)
    blobs = [tensor_bytes_of(o) for o in resp.outputs if o.name in binary]
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)
