"""Serving: Open Inference Protocol v2 conformance, bad input (each case), cube down,
predictions equal to the exported model's offline predictions, version switch without
mixing. Uses a tiny dense model in the export layout and an in-memory cube."""
from __future__ import annotations

import copy
import json
import threading
import time

import numpy as np
import pytest
from werkzeug.test import Client

from runtime.evaluation import auc
from runtime.serving.batching import Combiner
from runtime.serving.model import VersionWatcher
from runtime.serving.rest import create_app
from tests.helpers import V1, V2, FakeCube, offline_predict, publish as _publish, wait_until
from tests.serving.conftest import ctr_plane


def v2_request(b, rows=slice(0, 3), flat=True, rid="r-1"):
    dense = b.dense[rows]
    fs = b.feasigns[rows]
    n = dense.shape[0]
    dd = [None if np.isnan(x) else float(x) for x in dense.ravel()]
    fd = [int(x) for x in fs.ravel()]
    if not flat:
        dd = [dd[i * 13:(i + 1) * 13] for i in range(n)]
        fd = [fd[i * 26:(i + 1) * 26] for i in range(n)]
    return {"id": rid, "inputs": [
        {"name": "dense_features", "datatype": "FP32", "shape": [n, 13], "data": dd},
        {"name": "feasigns", "datatype": "UINT64", "shape": [n, 26], "data": fd}]}


def test_health_and_metadata(served):
    c = served["client"]
    assert c.get("/v2/health/live").status_code == 200
    r = c.get("/v2/health/ready")
    assert r.status_code == 200 and r.json["model_version"] == str(V1)
    assert c.get("/v2/models/ctr/ready").status_code == 200
    assert c.get("/v2/models/other/ready").status_code == 404
    meta = c.get("/v2").json
    assert set(meta) == {"name", "version", "extensions"}
    m = c.get("/v2/models/ctr").json
    assert m["name"] == "ctr" and m["versions"] == [str(V1)]
    assert {t["name"]: (t["datatype"], t["shape"]) for t in m["inputs"]} == {
        "dense_features": ("FP32", [-1, 13]), "feasigns": ("UINT64", [-1, 26]), "lines": ("BYTES", [-1])}
    assert m["outputs"] == [{"name": "probability", "datatype": "FP32", "shape": [-1, 1]}]
    assert c.get(f"/v2/models/ctr/versions/{V1}").status_code == 200
    assert c.get("/v2/models/ctr/versions/123").status_code == 404
    assert c.get("/v2/models/nope").status_code == 404


def test_infer_matches_offline_model(served, env):
    c, b = served["client"], env["batch"]
    r = c.post("/v2/models/ctr/infer", json=v2_request(b, slice(0, 20)))
    assert r.status_code == 200, r.json
    body = r.json
    assert body["model_name"] == "ctr" and body["model_version"] == str(V1) and body["id"] == "r-1"
    assert body["parameters"] == {"model_version": V1, "cube_version": V1}
    (out,) = body["outputs"]
    assert out["name"] == "probability" and out["datatype"] == "FP32" and out["shape"] == [20, 1]
    want = offline_predict(env["dirs"][V1], env["tables"][V1], b.dense[:20], b.feasigns[:20])
    np.testing.assert_allclose(out["data"], want, rtol=1e-5, atol=1e-6)
    # some keys were missing in cube: they must have been zero vectors (offline does that)
    assert any(int(k) not in env["tables"][V1] for k in b.feasigns[:20].ravel())


def test_nested_lines_and_predict_agree(served, env):
    c, b = served["client"], env["batch"]
    flat = c.post("/v2/models/ctr/infer", json=v2_request(b, slice(0, 5))).json["outputs"][0]["data"]
    nested = c.post("/v2/models/ctr/infer", json=v2_request(b, slice(0, 5), flat=False)).json["outputs"][0]["data"]
    lines = env["lines"][:5]
    r = c.post("/v2/models/ctr/infer", json={"inputs": [
        {"name": "lines", "datatype": "BYTES", "shape": [5], "data": lines}]})
    assert r.status_code == 200, r.json
    by_lines = r.json["outputs"][0]["data"]
    # rows without their label, and CSV rows, are accepted too
    nolabel = [ln.split("\t", 1)[1] for ln in lines]
    p = c.post("/predict", json={"lines": nolabel})
    assert p.status_code == 200, p.json
    csv = c.post("/predict", data="\n".join(ln.replace("\t", ",") for ln in lines), content_type="text/plain")
    assert csv.status_code == 200, csv.json
    np.testing.assert_allclose(flat, nested, rtol=1e-6)
    np.testing.assert_allclose(flat, by_lines, rtol=1e-6)
    np.testing.assert_allclose(flat, p.json["probabilities"], rtol=1e-6)
    np.testing.assert_allclose(flat, csv.json["probabilities"], rtol=1e-6)
    assert p.json["model_version"] == V1


def _mut(fn):
    def apply(req):
        req = copy.deepcopy(req)
        fn(req)
        return req
    return apply


def _set(path, value):
    def fn(req):
        obj = req
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return _mut(fn)


BAD = [
    # (case id, request transform, expected substring of the error)
    ("not-json", lambda r: b"{nope", "not valid JSON"),
    ("not-object", lambda r: [1, 2], "JSON object"),
    ("no-inputs", _set(["inputs"], []), "inputs"),
    ("inputs-not-list", _set(["inputs"], {"a": 1}), "inputs"),
    ("unknown-input", _set(["inputs", 0, "name"], "dense"), "inputs[0].name"),
    ("missing-feasigns", _mut(lambda r: r["inputs"].pop(1)), "feasigns"),
    ("duplicate-input", _mut(lambda r: r["inputs"].append(copy.deepcopy(r["inputs"][0]))), "twice"),
    ("dense-datatype", _set(["inputs", 0, "datatype"], "FP64"), "inputs[0].datatype"),
    ("feasign-datatype", _set(["inputs", 1, "datatype"], "INT64"), "inputs[1].datatype"),
    ("dense-shape-rank", _set(["inputs", 0, "shape"], [39]), "inputs[0].shape"),
    ("dense-feature-count", _set(["inputs", 0, "shape"], [3, 12]), "inputs[0].shape"),
    ("sparse-feature-count", _set(["inputs", 1, "shape"], [3, 25]), "inputs[1].shape"),
    ("batch-mismatch", _set(["inputs", 1, "shape"], [2, 26]), "inputs[1].shape"),
    ("shape-not-ints", _set(["inputs", 0, "shape"], ["3", 13]), "inputs[0].shape"),
    ("too-few-elements", _mut(lambda r: r["inputs"][0]["data"].pop()), "inputs[0].data"),
    ("too-many-elements", _mut(lambda r: r["inputs"][1]["data"].append(5)), "inputs[1].data"),
    ("dense-non-numeric", _mut(lambda r: r["inputs"][0]["data"].__setitem__(4, "abc")), "inputs[0].data"),
    ("dense-numeric-string", _mut(lambda r: r["inputs"][0]["data"].__setitem__(4, "1.5")), "inputs[0].data"),
    ("dense-bool", _mut(lambda r: r["inputs"][0]["data"].__setitem__(4, True)), "inputs[0].data"),
    ("feasign-float", _mut(lambda r: r["inputs"][1]["data"].__setitem__(0, 1.5)), "inputs[1].data"),
    ("feasign-negative", _mut(lambda r: r["inputs"][1]["data"].__setitem__(0, -1)), "inputs[1].data"),
    ("feasign-string", _mut(lambda r: r["inputs"][1]["data"].__setitem__(0, "x")), "inputs[1].data"),
    ("feasign-null", _mut(lambda r: r["inputs"][1]["data"].__setitem__(0, None)), "inputs[1].data"),
    ("ragged", _set(["inputs", 0, "data"], [[1.0] * 13, [1.0] * 12, [1.0] * 13]), "inputs[0].data"),
    ("data-not-array", _set(["inputs", 0, "data"], "1,2,3"), "inputs[0].data"),
    ("data-missing", _mut(lambda r: r["inputs"][0].pop("data")), "inputs[0].data"),
    ("empty-batch", _mut(lambda r: (r["inputs"][0].update(shape=[0, 13], data=[]),
                                    r["inputs"][1].update(shape=[0, 26], data=[]))), "empty batch"),
    ("oversize-batch", _mut(lambda r: (r["inputs"][0].update(shape=[33, 13], data=[0.0] * 33 * 13),
                                       r["inputs"][1].update(shape=[33, 26], data=[1] * 33 * 26))), "exceeds"),
    ("binary-extension", _set(["inputs", 0, "parameters"], {"binary_data_size": 52}), "binary_data_size"),
    ("unknown-output", _set(["outputs"], [{"name": "logit"}]), "outputs[0].name"),
    ("id-not-string", _set(["id"], 5), "id"),
    ("lines-datatype", lambda r: {"inputs": [{"name": "lines", "datatype": "FP32", "shape": [1], "data": ["x"]}]},
     "inputs[0].datatype"),
    ("lines-malformed", lambda r: {"inputs": [{"name": "lines", "datatype": "BYTES", "shape": [1],
                                               "data": ["1\t2\t3"]}]}, "inputs[0].data[0]"),
    ("lines-bad-hex", lambda r: {"inputs": [{"name": "lines", "datatype": "BYTES", "shape": [1],
                                             "data": ["0" + "\t1" * 13 + "\tzz" * 26]}]}, "inputs[0].data[0]"),
    ("lines-non-numeric-dense", lambda r: {"inputs": [{"name": "lines", "datatype": "BYTES", "shape": [1],
                                                       "data": ["0" + "\tx" * 13 + "\taa" * 26]}]}, "I1"),
    ("lines-with-features", _mut(lambda r: r["inputs"].append(
        {"name": "lines", "datatype": "BYTES", "shape": [1], "data": ["x"]})), "either"),
]


@pytest.mark.parametrize("case,transform,needle", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_400_naming_the_field(served, env, case, transform, needle):
    req = transform(v2_request(env["batch"]))
    body = req if isinstance(req, bytes) else json.dumps(req)
    r = served["client"].post("/v2/models/ctr/infer", data=body, content_type="application/json")
    assert r.status_code == 400, (case, r.status_code, r.data[:300])
    err = r.json["error"]
    assert needle in err, (case, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("payload,needle", [
    ({"lines": []}, "empty batch"),
    ({"lines": ["bad line"]}, "lines[0]"),
    ({"lines": "not a list"}, "lines"),
    ({"lines": [5]}, "lines[0]"),
])
def test_predict_bad_input(served, payload, needle):
    r = served["client"].post("/predict", json=payload)
    assert r.status_code == 400 and needle in r.json["error"], r.json


def test_unknown_model_and_version(served, env):
    c = served["client"]
    assert c.post("/v2/models/other/infer", json=v2_request(env["batch"])).status_code == 404
    assert c.post("/v2/models/ctr/versions/42/infer", json=v2_request(env["batch"])).status_code == 404
    r = c.post(f"/v2/models/ctr/versions/{V1}/infer", json=v2_request(env["batch"]))
    assert r.status_code == 200
    assert c.get("/v2/models/ctr/infer").status_code == 405


def test_cube_down_is_503_and_not_ready(served, env):
    c, cube = served["client"], served["cube"]
    cube.down = True
    r = c.post("/v2/models/ctr/infer", json=v2_request(env["batch"]))
    assert r.status_code == 503 and "cube" in r.json["error"]
    r = c.get("/v2/health/ready")
    assert r.status_code == 400 and r.json["ready"] is False
    cube.down = False
    assert c.get("/v2/health/ready").status_code == 200
    assert c.post("/v2/models/ctr/infer", json=v2_request(env["batch"])).status_code == 200


def test_readiness_asks_a_hung_cube_once_and_does_not_wait_for_it(served, env, monkeypatch):
    """After a failed lookup, readiness asks cube on a thread of its own and waits for it
    at most ``READY_CHECK_WAIT_S``: probes while that lookup hangs answer not ready at
    once and start no second one; once cube answers, readiness is true."""
    from runtime.serving import ctr_model

    c, cube = served["client"], served["cube"]
    cube.down = True
    assert c.post("/v2/models/ctr/infer", json=v2_request(env["batch"])).status_code == 503
    release, asked = threading.Event(), []
    seek = cube.seek

    def hung(keys, version=None):
        asked.append(version)
        release.wait(10)
        return seek(keys, version)

    monkeypatch.setattr(cube, "seek", hung)
    cube.down = False
    try:
        for _ in range(3):
            t0 = time.monotonic()
            r = c.get("/v2/health/ready")
            assert time.monotonic() - t0 < ctr_model.READY_CHECK_WAIT_S + 0.5
            assert r.status_code == 400 and "asked again" in r.json["error"], r.json
        assert asked == [V1]  # one lookup, still waiting
    finally:
        release.set()
    assert wait_until(lambda: c.get("/v2/health/ready").status_code == 200)
    assert asked == [V1]
    assert c.post("/v2/models/ctr/infer", json=v2_request(env["batch"])).status_code == 200


def test_no_version_yet_is_503(env, tmp_path):
    cube = FakeCube(env["tables"])
    watcher = VersionWatcher(str(tmp_path / "empty"), None, tmp_path / "work")
    c = Client(create_app(ctr_plane(watcher, cube)))
    assert not watcher.poll_once()
    r = c.post("/v2/models/ctr/infer", json=v2_request(env["batch"]))
    assert r.status_code == 503 and "no model version" in r.json["error"]
    assert c.get("/v2/health/ready").status_code == 400
    assert c.get("/v2/health/live").status_code == 200


def test_metrics(served, env):
    c = served["client"]
    c.post("/v2/models/ctr/infer", json=v2_request(env["batch"]))
    c.post("/v2/models/ctr/infer", data=b"{", content_type="application/json")
    text = c.get("/metrics").data.decode()
    assert 'elastic_ctr_serving_requests_total{code="200",endpoint="infer"} 1.0' in text
    assert 'elastic_ctr_serving_requests_total{code="400",endpoint="infer"} 1.0' in text
    assert f"elastic_ctr_serving_model_version {float(V1)}" in text or "elastic_ctr_serving_model_version 1.700000001e+09" in text
    assert "elastic_ctr_serving_request_seconds_bucket" in text


def test_version_switch_without_mixing(served, env):
    """Requests keep flowing while V2 is published; every answer equals the offline
    prediction of the version it names (dense model and embeddings of one version)."""
    c, b = served["client"], env["batch"]
    n = 8
    want = {v: offline_predict(env["dirs"][v], env["tables"][v], b.dense[:n], b.feasigns[:n]) for v in (V1, V2)}
    assert not np.allclose(want[V1], want[V2])
    req = json.dumps(v2_request(b, slice(0, n)))
    seen: dict[str, int] = {}
    errors: list = []
    stop = threading.Event()
    lock = threading.Lock()

    def worker():
        cl = Client(served["client"].application)
        while not stop.is_set():
            r = cl.post("/v2/models/ctr/infer", data=req, content_type="application/json")
            if r.status_code != 200:
                errors.append(r.data)
                continue
            body = r.json
            v = int(body["model_version"])
            try:
                np.testing.assert_allclose(body["outputs"][0]["data"], want[v], rtol=1e-5, atol=1e-6)
            except AssertionError as exc:
                errors.append(str(exc))
            with lock:
                seen[str(v)] = seen.get(str(v), 0) + 1

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    _publish(served["root"], V2)
    assert served["watcher"].poll_once()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert seen.get(str(V1), 0) > 0 and seen.get(str(V2), 0) > 0, seen
    r = c.post("/v2/models/ctr/infer", data=req, content_type="application/json")
    assert r.json["model_version"] == str(V2)
    # the cube lookups were pinned to the versions of the dense models used
    assert {v for v, _ in served["cube"].calls} <= {V1, V2}


def test_switch_waits_for_cube(served, env):
    """A version the cube cannot answer yet is not switched to; the old one keeps serving."""
    cube, w = served["cube"], served["watcher"]
    del cube.tables[V2]
    _publish(served["root"], V2)
    assert not w.poll_once()
    assert w.current.version == V1 and "V2" not in (w.last_error or "") and str(V2) in w.last_error
    r = served["client"].post("/v2/models/ctr/infer", json=v2_request(env["batch"]))
    assert r.status_code == 200 and r.json["model_version"] == str(V1)


def test_combiner_merges_concurrent_requests_and_splits_results():
    """Concurrent requests are combined into fewer batches; each gets its own rows back,
    and an error reaches every request of its batch."""
    calls = []

    def process(dense, fs):
        calls.append(fs.shape[0])
        time.sleep(0.02)
        if (fs == 999).any():
            raise ValueError("boom")
        return fs[:, :1].astype(np.float32) * 2

    comb = Combiner(process, max_rows=64, max_active=1)
    out, errs = {}, {}

    def one(i):
        fs = np.full((1 + i % 3, 26), i, np.uint64)
        if i == 7:
            fs[:] = 999
        try:
            out[i] = comb.submit(np.zeros((fs.shape[0], 13), np.float32), fs)
        except ValueError as exc:
            errs[i] = exc

    ts = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert comb.requests == 12 and comb.batches < 12, (comb.batches, calls)
    assert 7 in errs
    for i, o in out.items():
        assert o.shape == (1 + i % 3, 1) and np.all(o == 2 * i), (i, o)
    assert comb.active == 0 and not comb.pending


def test_demo_client_over_http(served, env, tmp_path):
    """The demo client against serving's HTTP server (uvicorn) over HTTP: every row scored once, the
    AUC equals the offline AUC of the rows' served predictions, nothing failed; a
    malformed request body would count as failed (checked by summarize on errors)."""
    from runtime.web.limits import ServerLimits
    from runtime.serving.asgi import ServingApp
    from runtime.serving.client import encode_batches, load_rows, run_load, summarize
    from tests.serving.server import ServingThread

    data = tmp_path / "test.txt"
    data.write_text("\n".join(env["lines"]) + "\n")
    rows = load_rows([str(data)])
    assert rows.fmt == "criteo" and len(rows.labels) == 64
    with ServingThread(ServingApp(served["client"].application, ServerLimits(), threads=4)) as st:
        for mode in ("features", "lines"):
            res = run_load(st.url, encode_batches(rows, 5, mode), rows.labels, concurrency=3)
            rep = summarize(res, rows.labels)
            assert rep["requests"] == 13 and rep["failed_requests"] == 0 and rep["rows_scored"] == 64, rep
            assert rep["versions"] == {str(V1): 13}
            probs = np.concatenate([np.asarray(p) for _, _, _, p in sorted(res.scored, key=lambda x: x[0])])
            assert rep["auc"] == pytest.approx(auc(rows.labels, probs))
        served["cube"].down = True
        res = run_load(st.url, encode_batches(rows, 16), rows.labels, concurrency=2)
        rep = summarize(res, rows.labels)
        assert rep["failed_requests"] == 4 and "503" in rep["errors"][0]


# ---------------------------------------------------------------- binary tensor data extension
def _binary_request(b, n, binary=("dense_features", "feasigns"), out_binary=None, tamper=None):
    """A request with the inputs named in ``binary`` as binary tensors after the JSON header."""
    dense = np.nan_to_num(b.dense[:n]).astype("<f4")
    fs = b.feasigns[:n].astype("<u8")
    inputs, blobs = [], []
    for name, arr, dt in (("dense_features", dense, "FP32"), ("feasigns", fs, "UINT64")):
        t = {"name": name, "datatype": dt, "shape": list(arr.shape)}
        if name in binary:
            raw = arr.tobytes()
            t["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            t["data"] = arr.ravel().tolist()
        inputs.append(t)
    head = {"id": "b", "inputs": inputs}
    if out_binary is not None:
        head["outputs"] = [{"name": "probability", "parameters": {"binary_data": out_binary}}]
    if tamper:
        tamper(head, blobs)
    text = json.dumps(head).encode()
    return text + b"".join(blobs), len(text)


@pytest.mark.parametrize("binary", [("dense_features", "feasigns"), ("feasigns",), ()])
@pytest.mark.parametrize("out_binary", [True, False])
def test_binary_inputs_and_outputs_match_json(served, env, binary, out_binary):
    c, b = served["client"], env["batch"]
    body, hlen = _binary_request(b, 5, binary, out_binary)
    r = c.post("/v2/models/ctr/infer", data=body, headers={"Inference-Header-Content-Length": str(hlen)})
    assert r.status_code == 200, r.data[:300]
    want = c.post("/predict", json={"lines": env["lines"][:5]}).json["probabilities"]
    if out_binary:
        n = int(r.headers["Inference-Header-Content-Length"])
        head = json.loads(r.data[:n])
        out = head["outputs"][0]
        assert "data" not in out and out["parameters"]["binary_data_size"] == 5 * 4
        got = np.frombuffer(r.data[n:], "<f4")
        assert r.headers["Content-Type"] == "application/octet-stream"
    else:
        assert "Inference-Header-Content-Length" not in r.headers
        head = r.json
        got = head["outputs"][0]["data"]
    assert head["id"] == "b" and head["model_version"] == str(V1)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_binary_output_for_all_with_binary_data_output(served, env):
    body, hlen = _binary_request(env["batch"], 3, tamper=lambda h, _: h.update(parameters={"binary_data_output": True}))
    r = served["client"].post("/v2/models/ctr/infer", data=body, headers={"Inference-Header-Content-Length": str(hlen)})
    assert r.status_code == 200 and int(r.headers["Inference-Header-Content-Length"]) < len(r.data)


def _nan_blob(head, blobs):
    a = np.frombuffer(blobs[0], "<f4").copy()
    a[17] = np.inf
    blobs[0] = a.tobytes()


@pytest.mark.parametrize("case, tamper, header, needle", [
    ("size-past-end", lambda h, b: h["inputs"][1]["parameters"].update(binary_data_size=10**6), None,
     "inputs[1].parameters.binary_data_size"),
    ("size-wrong", lambda h, b: (h["inputs"][0]["parameters"].update(binary_data_size=12),
                                 b.__setitem__(0, b[0][:12])), None,
     "inputs[0]: 12 bytes of binary data, but 39 FP32 elements need 156"),
    ("size-negative", lambda h, b: h["inputs"][0]["parameters"].update(binary_data_size=-1), None,
     "expected a non-negative integer"),
    ("trailing-bytes", lambda h, b: b.append(b"xx"), None, "2 bytes of binary data after"),
    ("data-and-binary", lambda h, b: h["inputs"][0].update(data=[0.0] * 39), None, "not both"),
    ("non-finite", _nan_blob, None, "inputs[0]: element 17 (index [1, 4]) is inf"),
    ("header-past-body", None, "999999", "Inference-Header-Content-Length: 999999"),
    ("header-not-int", None, "x", "Inference-Header-Content-Length: 'x' is not an integer"),
])
def test_binary_requests_refused_naming_what_is_wrong(served, env, case, tamper, header, needle):
    body, hlen = _binary_request(env["batch"], 3, tamper=tamper)
    r = served["client"].post("/v2/models/ctr/infer", data=body,
                              headers={"Inference-Header-Content-Length": header or str(hlen)})
    assert r.status_code == 400, (case, r.data[:300])
    assert needle in r.json["error"], (case, r.json["error"])


def test_json_nan_literal_refused_and_null_is_missing(served, env):
    c = served["client"]
    req = v2_request(env["batch"], slice(0, 2))
    text = json.dumps(req).replace("null", "0.0", 1)
    body = json.loads(text)
    body["inputs"][0]["data"][5] = float("nan")
    r = c.post("/v2/models/ctr/infer", data=json.dumps(body), content_type="application/json")
    assert r.status_code == 400 and "element 5 (index [0, 5]) is NaN" in r.json["error"], r.json
    body["inputs"][0]["data"][5] = None  # the documented way to send a missing value
    assert c.post("/v2/models/ctr/infer", json=body).status_code == 200


def test_bytes_binary_lines(served, env):
    lines = env["lines"][:4]
    raw = b"".join(len(x.encode()).to_bytes(4, "little") + x.encode() for x in lines)
    head = json.dumps({"inputs": [{"name": "lines", "datatype": "BYTES", "shape": [4],
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    r = served["client"].post("/v2/models/ctr/infer", data=head + raw,
                              headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.data
    want = served["client"].post("/predict", json={"lines": lines}).json["probabilities"]
    np.testing.assert_allclose(r.json["outputs"][0]["data"], want, rtol=1e-6)
    r = served["client"].post("/v2/models/ctr/infer", data=head + raw[:-10] + b"\xff" * 10,
                              headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400, r.data
