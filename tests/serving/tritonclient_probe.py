"""Runs under Triton's own clients (tritonclient[http,grpc], the .venv-tritonclient venv):
calls serving over HTTP and gRPC as a user would, and prints what came back as one JSON
document for tests/serving/test_tritonclient.py to check. Not imported by the tests.

Usage: python tritonclient_probe.py HTTP_HOST:PORT GRPC_HOST:PORT ROWS.json
ROWS.json: {"dense": float32[n,13] (null = missing), "feasigns": uint64[n,26], "lines": [str]}
"""
from __future__ import annotations

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODEL = "ctr"


def _inputs(mod, dense, fs, binary):
    a = mod.InferInput("dense_features", list(dense.shape), "FP32")
    b = mod.InferInput("feasigns", list(fs.shape), "UINT64")
    if mod is httpclient:
        a.set_data_from_numpy(dense, binary_data=binary)
        b.set_data_from_numpy(fs, binary_data=binary)
    else:
        a.set_data_from_numpy(dense)
        b.set_data_from_numpy(fs)
    return [a, b]


def _error(fn) -> dict:
    try:
        fn()
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}
    return {"status": "ok", "message": ""}


def main() -> int:
    http_url, grpc_url, rows_path = sys.argv[1:4]
    rows = json.load(open(rows_path))
    # a missing value is 0 in binary and gRPC data (the model reads 0 and missing alike)
    dense = np.nan_to_num(np.array(rows["dense"], dtype=np.float64)).astype(np.float32)
    fs = np.array(rows["feasigns"], dtype=np.uint64)
    lines = np.array([ln.encode() for ln in rows["lines"]], dtype=np.object_)
    h = httpclient.InferenceServerClient(http_url)
    g = grpcclient.InferenceServerClient(grpc_url)
    out: dict = {"http": {}, "grpc": {}}
    for name, c in (("http", h), ("grpc", g)):
        meta = c.get_server_metadata()
        model = c.get_model_metadata(MODEL)
        if name == "grpc":
            meta = {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}
            model = {"name": model.name, "versions": list(model.versions),
                     "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in model.inputs]}
        out[name]["health"] = {"live": c.is_server_live(), "ready": c.is_server_ready(),
                               "model_ready": c.is_model_ready(MODEL), "server": meta,
                               "model": {"name": model["name"], "versions": model["versions"],
                                         "inputs": model["inputs"]}}
    # answers: n = 1 and n = 64, binary and JSON (HTTP), raw (gRPC); each with its version
    for n in (1, 64):
        for binary in (True, False):
            r = h.infer(MODEL, _inputs(httpclient, dense[:n], fs[:n], binary), request_id=f"h{n}{binary}",
                        outputs=[httpclient.InferRequestedOutput("probability", binary_data=binary)])
            resp = r.get_response()
            out["http"][f"features-{n}-{'binary' if binary else 'json'}"] = {
                "probability": r.as_numpy("probability").ravel().tolist(), "id": resp.get("id"),
                "model_version": resp["model_version"], "binary_output": "data" not in resp["outputs"][0]}
        r = h.infer(MODEL, _inputs(httpclient, dense[:n], fs[:n], True))  # defaults: binary in and out
        out["http"][f"features-{n}-defaults"] = {"probability": r.as_numpy("probability").ravel().tolist(),
                                                 "model_version": r.get_response()["model_version"]}
        li = httpclient.InferInput("lines", [n], "BYTES")
        li.set_data_from_numpy(lines[:n], binary_data=True)
        r = h.infer(MODEL, [li])
        out["http"][f"lines-{n}-binary"] = {"probability": r.as_numpy("probability").ravel().tolist()}
        r = g.infer(MODEL, _inputs(grpcclient, dense[:n], fs[:n], True), request_id=f"g{n}")
        resp = r.get_response()
        out["grpc"][f"features-{n}-raw"] = {"probability": r.as_numpy("probability").ravel().tolist(),
                                            "id": resp.id, "model_version": resp.model_version,
                                            "cube_version": resp.parameters["cube_version"].int64_param}
        gl = grpcclient.InferInput("lines", [n], "BYTES")
        gl.set_data_from_numpy(lines[:n])
        out["grpc"][f"lines-{n}-raw"] = {"probability": g.infer(MODEL, [gl]).as_numpy("probability").ravel().tolist()}
    # bad requests, through both transports
    nan = dense[:2].copy()
    nan[1, 4] = np.nan
    big = 65  # the test server's --max-batch is 64
    bad = {
        "nan": lambda mod, c, b: c.infer(MODEL, _inputs(mod, nan, fs[:2], b)),
        "wrong-datatype": lambda mod, c, b: c.infer(MODEL, [_typed(mod, "dense_features", dense[:2].astype(np.float64),
                                                                   "FP64", b), _inputs(mod, dense[:2], fs[:2], b)[1]]),
        "shape": lambda mod, c, b: c.infer(MODEL, _inputs(mod, dense[:2, :12].copy(), fs[:2], b)),
        "unknown-input": lambda mod, c, b: c.infer(MODEL, [_typed(mod, "dense", dense[:2], "FP32", b),
                                                           _inputs(mod, dense[:2], fs[:2], b)[1]]),
        "unknown-model": lambda mod, c, b: c.infer("nope", _inputs(mod, dense[:2], fs[:2], b)),
        "unknown-version": lambda mod, c, b: c.infer(MODEL, _inputs(mod, dense[:2], fs[:2], b), model_version="42"),
        "oversized-batch": lambda mod, c, b: c.infer(MODEL, _inputs(mod, np.zeros((big, 13), np.float32),
                                                                    np.ones((big, 26), np.uint64), b)),
    }
    for case, fn in bad.items():
        out["http"][f"bad-{case}-json"] = _error(lambda: fn(httpclient, h, False))
        out["http"][f"bad-{case}-binary"] = _error(lambda: fn(httpclient, h, True))
        out["grpc"][f"bad-{case}"] = _error(lambda: fn(grpcclient, g, True))
    json.dump(out, sys.stdout)
    return 0


def _typed(mod, name, array, datatype, binary):
    t = mod.InferInput(name, list(array.shape), datatype)
    if mod is httpclient:
        t.set_data_from_numpy(array, binary_data=binary)
    else:
        t.set_data_from_numpy(array)
    return t


if __name__ == "__main__":
    sys.exit(main())
