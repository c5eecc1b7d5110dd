"""CTR serving (``elastic-ctr serve``): the Open Inference Protocol v2 over HTTP, and ``/predict``.

Each request is answered by one version: the dense model current when the request
starts (``VersionWatcher.current``) and the cube embeddings of that same version (the
lookup is pinned: ``CubeClient.seek(keys, version=v)``). Missing keys (feasigns never
seen in training) are zero vectors, as in training.

HTTP API (Open Inference Protocol v2, as KServe and Triton define it:
https://github.com/kserve/open-inference-protocol/blob/main/specification/protocol/inference_rest.md):

- ``GET /v2`` -> ``{"name", "version", "extensions": []}``
- ``GET /v2/health/live`` -> 200 while the process runs.
- ``GET /v2/health/ready``, ``GET /v2/models/ctr/ready`` -> 200 when a model version is
  loaded and cube answers; otherwise 400 (the protocol: "4xx indicates false"; Triton
  uses 400) with ``{"error": reason}``.
- ``GET /v2/models/ctr`` -> ``{"name": "ctr", "versions": [..], "platform": "paddle_inference",
  "inputs": [...], "outputs": [...]}`` (metadata tensors ``{name, datatype, shape}``,
  -1 = any batch size).
- ``POST /v2/models/ctr[/versions/<v>]/infer`` with either
    * ``dense_features`` FP32 [n,13]: the raw integer features I1..I13 as in the data
      (serving applies the model's normalization; ``null`` = missing) and
      ``feasigns`` UINT64 [n,26]: the feasigns of C1..C26
      (``runtime.trainer.features.feasign``), or
    * ``lines`` BYTES [n]: raw rows in the training data format (Criteo TSV/CSV with or
      without the label, or the slot format when the model was trained on it).
  ``data`` is row-major, flat or nested. Answer: ``{"model_name": "ctr",
  "model_version": "<id>", "id", "parameters": {"model_version": id, "cube_version": id},
  "outputs": [{"name": "probability", "datatype": "FP32", "shape": [n,1], "data": [...]}]}``.
- ``POST /predict`` ``{"lines": ["..."]}`` (or a text/plain body, one row per line) ->
  ``{"probabilities": [...], "model_version": id}``.
- ``GET /metrics``: Prometheus text format.

Errors: ``{"error": "<message naming the field>"}`` with 400 (bad input: wrong name,
shape, datatype, feature count, non-numeric value, empty or over-size batch), 404
(unknown model/version), 503 (no version loaded yet, cube unreachable). Never a 500
with a traceback: an unexpected exception is logged and answered as a JSON 500.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np
from flask import Flask, Response, request

from runtime.serving.model import DenseModel, VersionWatcher
from runtime.trainer import features

log = logging.getLogger(__name__)

MODEL_NAME = "ctr"
SERVER_NAME = "elastic-ctr"
SERVER_VERSION = "0.1.0"
NUM_DENSE = features.NUM_DENSE


class BadRequest(Exception):
    """Bad input: answered with ``status`` (400 by default) and the message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Unavailable(BadRequest):
    """Serving cannot answer now (no version loaded, cube unreachable): 503."""

    def __init__(self, message: str):
        super().__init__(message, 503)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), status=status, mimetype="application/json")


class Metrics:
    """Prometheus metrics of one serving process (or, with ``PROMETHEUS_MULTIPROC_DIR``
    set, aggregated over gunicorn workers)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.multiproc = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("elastic_ctr_serving_requests_total", "HTTP requests answered",
                                ["endpoint", "code"], registry=r)
        self.latency = Histogram("elastic_ctr_serving_request_seconds", "request latency, seconds",
                                 ["endpoint"], registry=r,
                                 buckets=(.0005, .001, .002, .003, .005, .0075, .01, .02, .05, .1, .25, .5, 1, 2.5))
        self.samples = Counter("elastic_ctr_serving_samples_total", "samples scored", registry=r)
        self.errors = Counter("elastic_ctr_serving_errors_total", "requests answered with an error",
                              ["kind"], registry=r)
        kw = {"multiprocess_mode": "max"} if self.multiproc else {}
        self.version = Gauge("elastic_ctr_serving_model_version", "version (base/patch id) being served",
                             registry=r, **kw)
        self.ready = Gauge("elastic_ctr_serving_ready", "1 when a version is loaded and cube answers",
                           registry=r, **({"multiprocess_mode": "min"} if self.multiproc else {}))
        self.runs = Counter("elastic_ctr_serving_predictor_runs_total",
                            "dense-model runs (one per combined batch of requests)", registry=r)
        self.switches = Counter("elastic_ctr_serving_version_switches_total", "version switches", registry=r)
        # Bound children: no label lookup on the hot path.
        self._bound: dict = {}

    def observe(self, endpoint: str, code: int, seconds: float) -> None:
        key = (endpoint, code)
        b = self._bound.get(key)
        if b is None:
            b = self._bound[key] = (self.requests.labels(endpoint, str(code)), self.latency.labels(endpoint))
        b[0].inc()
        b[1].observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        if self.multiproc:
            from prometheus_client import multiprocess

            reg = CollectorRegistry()
            multiprocess.MultiProcessCollector(reg)
            return generate_latest(reg), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Job:
    __slots__ = ("dense", "fs", "n", "event", "result", "error", "lead")

    def __init__(self, dense: np.ndarray, fs: np.ndarray):
        self.dense, self.fs, self.n = dense, fs, fs.shape[0]
        self.event = threading.Event()
        self.result = self.error = None
        self.lead = False


class Combiner:
    """Combines concurrent requests for one ``DenseModel`` into one cube lookup and one
    predictor run (dynamic batching, as Triton's dynamic batcher): the per-call overhead
    of a Paddle predictor run (~0.4-0.8 ms at batch 1, most of it fixed) and of a cube
    round trip is paid once per combined batch instead of once per request.

    No timer and no extra thread: a request that finds fewer than ``max_active``
    batches in flight runs at once with whatever requests are queued (up to
    ``max_rows`` rows); the others queue, and when a batch finishes the oldest queued
    request is promoted to run the next one. A lone request is never delayed. All
    requests of a combined batch use the same model, hence the same version.
    """

    def __init__(self, process: Callable[[np.ndarray, np.ndarray], np.ndarray], max_rows: int,
                 max_active: int = 1):
        self.process = process
        self.max_rows = max_rows
        self.max_active = max_active
        self.lock = threading.Lock()
        self.pending: list[_Job] = []
        self.active = 0
        self.batches = 0
        self.requests = 0

    def submit(self, dense: np.ndarray, fs: np.ndarray) -> np.ndarray:
        """``dense`` float[n,13] raw, ``fs`` uint64[n,S] -> probabilities float32[n,1]."""
        job = _Job(dense, fs)
        with self.lock:
            if self.active < self.max_active:
                self.active += 1
                job.lead = True
            else:
                self.pending.append(job)
        if not job.lead:
            job.event.wait()
        if job.lead and job.result is None and job.error is None:
            self._run(job)
        if job.error is not None:
            raise job.error
        return job.result

    def _run(self, me: _Job) -> None:
        batch, rows = [me], me.n
        with self.lock:
            while self.pending and rows + self.pending[0].n <= self.max_rows:
                j = self.pending.pop(0)
                batch.append(j)
                rows += j.n
        try:
            if len(batch) == 1:
                me.result = self.process(me.dense, me.fs)
            else:
                out = self.process(np.concatenate([j.dense for j in batch]),
                                   np.concatenate([j.fs for j in batch]))
                off = 0
                for j in batch:
                    j.result = out[off:off + j.n]
                    off += j.n
        except BaseException as exc:  # every request of the batch gets the error
            for j in batch:
                j.error = exc
        self.batches += 1
        self.requests += len(batch)
        nxt = None
        with self.lock:
            if self.pending:
                nxt = self.pending.pop(0)
                nxt.lead = True  # leadership (and the active slot) passes on
            else:
                self.active -= 1
        for j in batch[1:]:
            j.event.set()
        if nxt is not None:
            nxt.event.set()


class Service:
    """The prediction logic, independent of HTTP.

    ``watcher``: a started ``VersionWatcher`` (its ``current`` model is used);
    ``cube_factory``: makes a cube client (``seek(keys uint64[m], version) -> result with
    values float32[m,dim], found bool[m], version``); one client per thread.
    ``max_batch``: largest batch (samples); ``fmt``/``slots``: raw-line format when the
    model's metadata does not say.
    """

    def __init__(self, watcher: VersionWatcher, cube_factory: Callable[[], Any], max_batch: int = 4096,
                 fmt: str = "criteo", slots: tuple[int, ...] = features.DEFAULT_SLOTS,
                 metrics: Metrics | None = None, combine: bool = True):
        self.watcher = watcher
        self.combine = combine
        self._comb_lock = threading.Lock()
        self.cube_factory = cube_factory
        self.max_batch = int(max_batch)
        self.fmt = fmt
        self.slots = tuple(slots)
        self.metrics = metrics or Metrics()
        self._local = threading.local()
        self.cube_ok = True
        self.cube_error: str | None = None
        watcher.on_switch.append(self._switched)
        if watcher.current is not None:
            self._switched(watcher.current)

    def _switched(self, model: DenseModel) -> None:
        self.metrics.version.set(model.version)
        self.metrics.switches.inc()

    def cube(self):
        c = getattr(self._local, "cube", None)
        if c is None:
            c = self._local.cube = self.cube_factory()
        return c

    def probe(self, version: int) -> None:
        """A pinned one-key lookup; raises if cube cannot answer ``version``."""
        self._seek(np.array([features.missing_feasign(1)], dtype=np.uint64), version)

    def _seek(self, keys: np.ndarray, version: int):
        try:
            res = self.cube().seek(keys, version=version)
        except Exception as exc:  # CubeUnavailable, timeouts, version not held
            self.cube_ok = False
            self.cube_error = f"{exc.__class__.__name__}: {exc}"
            self.metrics.errors.labels("cube").inc()
            raise Unavailable(f"cube lookup failed: {self.cube_error}") from exc
        got = getattr(res, "version", version)
        if got is not None and int(got) != version:
            self.cube_ok = False
            raise Unavailable(f"cube answered version {got}, request pinned to {version}")
        self.cube_ok = True
        return res

    def model_format(self, model: DenseModel) -> tuple[str, tuple[int, ...]]:
        spec = model.meta.get("features") or {}
        fmt = spec.get("format", self.fmt)
        slots = tuple(spec.get("slots") or self.slots)
        return fmt, slots

    def ready(self) -> tuple[bool, str]:
        """(ready, reason): a version is loaded and cube answers a pinned lookup."""
        m = self.watcher.current
        if m is None:
            return False, "no model version loaded yet" + (
                f" ({self.watcher.last_error})" if self.watcher.last_error else "")
        if not self.cube_ok:
            try:
                self.probe(m.version)
            except Unavailable as exc:
                return False, str(exc)
        return True, "ready"

    def current(self) -> DenseModel:
        m = self.watcher.current
        if m is None:
            raise Unavailable("no model version loaded yet" + (
                f" ({self.watcher.last_error})" if self.watcher.last_error else ""))
        return m

    def predict(self, model: DenseModel, dense_raw: np.ndarray, feasigns: np.ndarray) -> np.ndarray:
        """``dense_raw`` float[n,13] raw (NaN = missing), ``feasigns`` uint64[n,S] ->
        probabilities float32[n,1], with ``model`` and cube pinned to its version.
        Concurrent calls for the same model are combined (``Combiner``) when
        ``combine`` is on."""
        if not self.combine:
            return self._predict(model, dense_raw, feasigns)
        comb = model.combiner
        if comb is None:
            with self._comb_lock:
                comb = model.combiner
                if comb is None:
                    comb = model.combiner = Combiner(
                        lambda d, f, m=model: self._predict(m, d, f), max(self.max_batch, 256))
        return comb.submit(dense_raw, feasigns)

    def _predict(self, model: DenseModel, dense_raw: np.ndarray, feasigns: np.ndarray) -> np.ndarray:
        n = feasigns.shape[0]
        self.metrics.runs.inc()
        dense = features.normalize_dense(dense_raw)
        keys = np.ascontiguousarray(feasigns.T).ravel()  # slot-major: slot s = rows s*n..s*n+n-1
        res = self._seek(keys, model.version)
        values = res.values
        if values.dtype != np.float32 or not values.flags.c_contiguous:
            values = np.ascontiguousarray(values, dtype=np.float32)
        found = res.found
        if found is not None and not found.all():
            values = values.copy() if not values.flags.writeable else values
            values[~found] = 0.0
        self.metrics.samples.inc(n)
        return model.predict(dense, values)

    def parse_lines(self, model: DenseModel, lines: list, field: str) -> tuple[np.ndarray, np.ndarray]:
        """Raw rows -> (dense float32[n,13] raw, feasigns uint64[n,S]). Raises ``BadRequest``
        naming ``field[i]`` for a malformed row."""
        fmt, slots = self.model_format(model)
        for i, ln in enumerate(lines):
            if not isinstance(ln, str):
                raise BadRequest(f"{field}[{i}]: expected a string, got {type(ln).__name__}")
        if fmt == "slot":
            lines = [ln.strip() for ln in lines]
            for i, ln in enumerate(lines):
                if not ln:
                    raise BadRequest(f"{field}[{i}]: empty line")
            batch = features.parse_slot_lines(lines, slots)
        else:
            fixed = []
            for i, ln in enumerate(lines):
                ln = ln.rstrip("\r\n")
                if not ln.strip():
                    raise BadRequest(f"{field}[{i}]: empty line")
                sep = "\t" if "\t" in ln else ","
                c = ln.count(sep)
                if c == features.CRITEO_FIELDS - 2:  # no label: serving does not need one
                    ln = "0" + sep + ln
                elif c != features.CRITEO_FIELDS - 1:
                    raise BadRequest(f"{field}[{i}]: expected {features.CRITEO_FIELDS} fields "
                                     f"(label, I1..I13, C1..C26) or {features.CRITEO_FIELDS - 1} "
                                     f"without the label, got {c + 1}")
                if features.is_header(ln):
                    raise BadRequest(f"{field}[{i}]: a header line is not a sample")
                fixed.append(ln)
            batch = features.parse_criteo_lines(fixed)
        if batch.bad:
            i, why = batch.bad[0]
            raise BadRequest(f"{field}[{i}]: {why}")
        if len(batch) != len(lines):
            raise BadRequest(f"{field}: {len(lines) - len(batch)} line(s) were not samples")
        return batch.dense, batch.feasigns

    def check_batch(self, n: int, field: str) -> None:
        if n == 0:
            raise BadRequest(f"{field}: empty batch (0 samples)")
        if n > self.max_batch:
            raise BadRequest(f"{field}: batch of {n} samples exceeds the limit of {self.max_batch}")


# -- v2 request decoding -------------------------------------------------------------------

def _shape(inp: dict, where: str) -> list[int]:
    shape = inp.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise BadRequest(f"{where}.shape: expected a list of non-negative integers, got {shape!r}")
    return shape


_F_TYPES = {int, float, type(None)}


def _numeric(data: Any, where: str, kind: str, count: int) -> np.ndarray:
    """JSON tensor data (flat or nested, row-major) -> a flat numpy array of ``count``
    elements. ``kind``: 'f' (FP32; ``null`` = missing -> NaN) or 'u' (UINT64).
    Raises ``BadRequest`` naming ``where.data`` for non-numeric values (strings, booleans),
    non-integers or negatives for UINT64, ragged nesting, or a wrong element count."""
    if not isinstance(data, list):
        raise BadRequest(f"{where}.data: expected a JSON array")
    if data and isinstance(data[0], list):  # nested form: flatten row-major
        try:
            a = np.asarray(data, dtype=object)
        except ValueError:
            raise BadRequest(f"{where}.data: ragged nested arrays (not a tensor)") from None
        if a.dtype != object or any(isinstance(x, list) for x in a.ravel()):
            raise BadRequest(f"{where}.data: ragged nested arrays (not a tensor)")
        flat = a.ravel().tolist()
    else:
        flat = data
    if len(flat) != count:
        raise BadRequest(f"{where}.data: {len(flat)} elements, but shape needs {count}")
    types = set(map(type, flat))
    if kind == "u":
        if not types <= {int}:
            bad = next(x for x in flat if type(x) is not int)
            raise BadRequest(f"{where}.data: {bad!r} is not an unsigned integer (UINT64 expected)")
        try:
            return np.array(flat, dtype=np.uint64)
        except OverflowError:
            raise BadRequest(f"{where}.data: value out of the UINT64 range (negative or >= 2**64)") from None
    if not types <= _F_TYPES:
        bad = next(x for x in flat if type(x) not in _F_TYPES)
        raise BadRequest(f"{where}.data: non-numeric value {bad!r} (FP32 expected; null = missing)")
    out = np.array(flat, dtype=np.float32)
    if np.isinf(out).any():
        raise BadRequest(f"{where}.data: infinite or out-of-range value")
    return out


def decode_v2(body: bytes, service: Service, model: DenseModel) -> tuple[dict, np.ndarray, np.ndarray, list | None]:
    """Parses and validates an inference request. Returns (request JSON, dense float32[n,13]
    raw, feasigns uint64[n,S], requested output names or None). Raises ``BadRequest``."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body: not valid JSON ({exc})") from None
    if not isinstance(req, dict):
        raise BadRequest("request body: expected a JSON object")
    if "id" in req and not isinstance(req["id"], str):
        raise BadRequest("id: expected a string")
    params = req.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise BadRequest("parameters: expected a JSON object")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("inputs: expected a non-empty array of input tensors")
    by_name: dict[str, tuple[int, dict]] = {}
    for i, inp in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(inp, dict):
            raise BadRequest(f"{where}: expected a JSON object")
        name = inp.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"{where}.name: expected a string")
        if name not in ("dense_features", "feasigns", "lines"):
            raise BadRequest(f"{where}.name: unknown input {name!r} (expected 'dense_features' and "
                             f"'feasigns', or 'lines')")
        if name in by_name:
            raise BadRequest(f"{where}.name: input {name!r} given twice")
        ip = inp.get("parameters")
        if isinstance(ip, dict) and "binary_data_size" in ip:
            raise BadRequest(f"{where}.parameters.binary_data_size: the binary tensor data extension is not supported")
        if "data" not in inp:
            raise BadRequest(f"{where}.data: missing")
        if not isinstance(inp.get("datatype"), str):
            raise BadRequest(f"{where}.datatype: expected a string")
        by_name[name] = (i, inp)
    outs = req.get("outputs")
    out_names = None
    if outs is not None:
        if not isinstance(outs, list):
            raise BadRequest("outputs: expected an array")
        out_names = []
        for j, o in enumerate(outs):
            if not isinstance(o, dict) or o.get("name") != "probability":
                raise BadRequest(f"outputs[{j}].name: unknown output "
                                 f"{o.get('name') if isinstance(o, dict) else o!r} (this model has 'probability')")
            out_names.append("probability")
    nslots = model.num_slots
    if "lines" in by_name:
        if len(by_name) > 1:
            raise BadRequest("inputs: give either 'lines' or 'dense_features' + 'feasigns', not both")
        i, inp = by_name["lines"]
        where = f"inputs[{i}]"
        if inp["datatype"] != "BYTES":
            raise BadRequest(f"{where}.datatype: expected BYTES for 'lines', got {inp['datatype']!r}")
        shape = _shape(inp, where)
        if len(shape) != 1:
            raise BadRequest(f"{where}.shape: expected [n] for 'lines', got {shape}")
        service.check_batch(shape[0], f"{where}.shape")
        data = inp["data"]
        if not isinstance(data, list):
            raise BadRequest(f"{where}.data: expected an array of strings")
        if len(data) == 1 and isinstance(data[0], list):
            data = data[0]
        if len(data) != shape[0]:
            raise BadRequest(f"{where}.data: {len(data)} elements, but shape needs {shape[0]}")
        dense, fs = service.parse_lines(model, data, f"{where}.data")
        return req, dense, fs, out_names
    for need in ("dense_features", "feasigns"):
        if need not in by_name:
            raise BadRequest(f"inputs: missing input {need!r} (or give raw rows as 'lines')")
    i, inp = by_name["dense_features"]
    where = f"inputs[{i}]"
    if inp["datatype"] != "FP32":
        raise BadRequest(f"{where}.datatype: expected FP32 for 'dense_features', got {inp['datatype']!r}")
    shape = _shape(inp, where)
    if len(shape) != 2 or shape[1] != NUM_DENSE:
        raise BadRequest(f"{where}.shape: expected [n,{NUM_DENSE}] for 'dense_features' "
                         f"({NUM_DENSE} dense features), got {shape}")
    n = shape[0]
    service.check_batch(n, f"{where}.shape")
    dense = _numeric(inp["data"], where, "f", n * NUM_DENSE).reshape(n, NUM_DENSE)
    j, inp = by_name["feasigns"]
    where = f"inputs[{j}]"
    if inp["datatype"] != "UINT64":
        raise BadRequest(f"{where}.datatype: expected UINT64 for 'feasigns', got {inp['datatype']!r}")
    shape = _shape(inp, where)
    if len(shape) != 2 or shape[1] != nslots:
        raise BadRequest(f"{where}.shape: expected [n,{nslots}] for 'feasigns' ({nslots} sparse slots), got {shape}")
    if shape[0] != n:
        raise BadRequest(f"{where}.shape: batch {shape[0]} differs from dense_features' batch {n}")
    fs = _numeric(inp["data"], where, "u", n * nslots).reshape(n, nslots)
    return req, dense, fs, out_names


def model_metadata(service: Service) -> dict:
    """The v2 model metadata response."""
    m = service.watcher.current
    nslots = m.num_slots if m else features.NUM_SLOTS
    return {
        "name": MODEL_NAME,
        "versions": [str(m.version)] if m else [],
        "platform": "paddle_inference",
        "inputs": [
            {"name": "dense_features", "datatype": "FP32", "shape": [-1, NUM_DENSE]},
            {"name": "feasigns", "datatype": "UINT64", "shape": [-1, nslots]},
            {"name": "lines", "datatype": "BYTES", "shape": [-1]},
        ],
        "outputs": [{"name": "probability", "datatype": "FP32", "shape": [-1, 1]}],
        "parameters": {"note": "give 'dense_features' (raw I1..I13; null = missing) and 'feasigns' "
                               "(C1..C26 feasigns), or 'lines' (raw rows) alone"},
    }


def infer_response(service: Service, name: str, version: str | None, body: bytes) -> dict:
    """The v2 inference response for a request ``body`` (bytes). Raises ``BadRequest``."""
    if name != MODEL_NAME:
        raise BadRequest(f"model {name!r} not found (this server has {MODEL_NAME!r})", 404)
    model = service.current()  # one read: this request uses this version throughout
    if version is not None and version != str(model.version):
        raise BadRequest(f"model {name!r} version {version!r} is not being served "
                         f"(serving {model.version})", 404)
    req, dense, fs, _outs = decode_v2(body, service, model)
    probs = service.predict(model, dense, fs)
    v = model.version
    resp = {"model_name": MODEL_NAME, "model_version": str(v)}
    if "id" in req:
        resp["id"] = req["id"]
    resp["parameters"] = {"model_version": v, "cube_version": v}
    resp["outputs"] = [{"name": "probability", "datatype": "FP32", "shape": [int(probs.shape[0]), 1],
                        "data": probs.ravel().tolist()}]
    return resp


class InferFastPath:
    """WSGI middleware: answers ``POST /v2/models/ctr/infer`` without going through
    Flask's request/response machinery (routing, request context, Response objects
    cost ~0.2-0.4 ms of CPU per request, as much as the cube lookup); everything else,
    and every other method on that path, goes to the Flask ``app``. Same handler
    (``infer_response``), same errors, same metrics as the Flask route."""

    PATH = f"/v2/models/{MODEL_NAME}/infer"

    def __init__(self, app: Flask, service: Service):
        self.app = app
        self.service = service
        self.wsgi_app = app.wsgi_app

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") != self.PATH or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        t0 = time.perf_counter()
        metrics = self.service.metrics
        try:
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                raise BadRequest("Content-Length: not an integer") from None
            body = environ["wsgi.input"].read(length) if length > 0 else b""
            status, payload = 200, infer_response(self.service, MODEL_NAME, None, body)
        except BadRequest as exc:
            metrics.errors.labels("unavailable" if exc.status == 503 else "bad_request").inc()
            status, payload = exc.status, {"error": str(exc)}
        except Exception as exc:  # never a traceback to the client
            log.exception("infer: unexpected error")
            metrics.errors.labels("internal").inc()
            status, payload = 500, {"error": f"internal error: {exc.__class__.__name__}: {exc}"}
        data = json.dumps(payload, separators=(",", ":")).encode()
        start_response(_STATUS.get(status, f"{status} Error"),
                       [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        metrics.observe("infer", status, time.perf_counter() - t0)
        return [data]


_STATUS = {200: "200 OK", 400: "400 Bad Request", 404: "404 Not Found", 500: "500 Internal Server Error",
           503: "503 Service Unavailable"}


def create_wsgi(service: Service):
    """The WSGI application serving ``service``: the Flask app behind ``InferFastPath``."""
    return InferFastPath(create_app(service), service)


def create_app(service: Service) -> Flask:
    """The Flask app of ``service`` (routes: module docstring)."""
    app = Flask(__name__)
    metrics = service.metrics

    def timed(endpoint: str, fn: Callable[[], Response]) -> Response:
        t0 = time.perf_counter()
        try:
            resp = fn()
        except BadRequest as exc:
            metrics.errors.labels("unavailable" if exc.status == 503 else "bad_request").inc()
            resp = _json({"error": str(exc)}, exc.status)
        except Exception as exc:  # never a traceback to the client
            log.exception("%s: unexpected error", endpoint)
            metrics.errors.labels("internal").inc()
            resp = _json({"error": f"internal error: {exc.__class__.__name__}: {exc}"}, 500)
        metrics.observe(endpoint, resp.status_code, time.perf_counter() - t0)
        return resp

    @app.get("/v2")
    def server_metadata():
        return _json({"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": []})

    @app.get("/v2/health/live")
    def live():
        return _json({"live": True})

    @app.get("/healthz")
    def healthz():
        return _json({"status": "ok"})

    def _ready() -> Response:
        ok, why = service.ready()
        metrics.ready.set(1 if ok else 0)
        if ok:
            return _json({"ready": True, "model_version": str(service.watcher.current.version)})
        return _json({"ready": False, "error": why}, 400)

    app.add_url_rule("/v2/health/ready", "ready", _ready)

    @app.get("/v2/models/<name>/ready")
    @app.get("/v2/models/<name>/versions/<version>/ready")
    def model_ready(name: str, version: str | None = None):
        if name != MODEL_NAME:
            return _json({"error": f"model {name!r} not found (this server has {MODEL_NAME!r})"}, 404)
        if version is not None:
            m = service.watcher.current
            if m is None or str(m.version) != version:
                return _json({"error": f"model {name!r} version {version!r} is not being served"}, 400)
        return _ready()

    @app.get("/v2/models/<name>")
    @app.get("/v2/models/<name>/versions/<version>")
    def model_meta(name: str, version: str | None = None):
        if name != MODEL_NAME:
            return _json({"error": f"model {name!r} not found (this server has {MODEL_NAME!r})"}, 404)
        meta = model_metadata(service)
        if version is not None and version not in meta["versions"]:
            return _json({"error": f"model {name!r} version {version!r} is not being served "
                                   f"(serving {meta['versions']})"}, 404)
        return _json(meta)

    @app.post("/v2/models/<name>/infer")
    @app.post("/v2/models/<name>/versions/<version>/infer")
    def infer(name: str, version: str | None = None):
        return timed("infer", lambda: _json(infer_response(service, name, version,
                                                           request.get_data(cache=False))))

    @app.post("/predict")
    def predict():
        def run() -> Response:
            model = service.current()
            if request.mimetype == "application/json":
                try:
                    body = json.loads(request.get_data(cache=False))
                except (ValueError, UnicodeDecodeError) as exc:
                    raise BadRequest(f"request body: not valid JSON ({exc})") from None
                lines = body.get("lines") if isinstance(body, dict) else body
                if not isinstance(lines, list):
                    raise BadRequest("lines: expected an array of raw rows (strings)")
            else:
                text = request.get_data(cache=False).decode("utf-8", "replace")
                lines = [ln for ln in text.splitlines() if ln.strip()]
            service.check_batch(len(lines), "lines")
            dense, fs = service.parse_lines(model, lines, "lines")
            probs = service.predict(model, dense, fs)
            return _json({"probabilities": probs.ravel().tolist(), "model_version": model.version})

        return timed("predict", run)

    @app.get("/metrics")
    def metrics_view():
        ok, _ = service.ready() if service.watcher.current is not None else (False, "")
        metrics.ready.set(1 if ok else 0)
        data, ctype = metrics.exposition()
        return Response(data, mimetype=ctype.split(";")[0], headers={"Content-Type": ctype})

    @app.errorhandler(404)
    def not_found(_e):
        return _json({"error": f"{request.path}: not found"}, 404)

    @app.errorhandler(405)
    def not_allowed(_e):
        return _json({"error": f"{request.method} {request.path}: method not allowed"}, 405)

    @app.errorhandler(Exception)
    def internal(e):
        from werkzeug.exceptions import HTTPException

        if isinstance(e, HTTPException):
            return _json({"error": e.description or e.name}, e.code or 500)
        log.exception("unexpected error")
        return _json({"error": f"internal error: {e.__class__.__name__}"}, 500)

    return app


# -- process entry points ---------------------------------------------------------------

def build_service(topology: str, model_root: str, transfer_url: str | None, work_dir: str,
                  threads: int = 4, max_batch: int = 4096, poll_interval_s: float = 0.5,
                  cube_timeout_ms: float = 200.0, fmt: str = "criteo",
                  slots: tuple[int, ...] = features.DEFAULT_SLOTS, wait_s: float = 0.0) -> Service:
    """Wires the cube client, the version watcher and the service for one process.

    ``wait_s``: wait up to this many seconds for a first version before returning (the
    process serves anyway, answering 503 until one is loaded)."""
    from runtime.cube.client import CubeClient

    def cube_factory():
        return CubeClient.from_topology(topology, timeout_ms=cube_timeout_ms, retries=2)

    watcher = VersionWatcher(model_root, transfer_url, work_dir, pool_size=threads,
                             poll_interval_s=poll_interval_s)
    service = Service(watcher, cube_factory, max_batch=max_batch, fmt=fmt, slots=slots)
    # The watcher's probe runs on its own thread: it gets its own client.
    probe_local = threading.local()

    def probe(v: int) -> None:
        c = getattr(probe_local, "c", None)
        if c is None:
            c = probe_local.c = cube_factory()
        c.seek(np.array([features.missing_feasign(1)], dtype=np.uint64), version=v)

    watcher.probe = probe
    watcher.poll_once()
    watcher.start()
    deadline = time.monotonic() + wait_s
    while watcher.current is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return service


def main(args) -> int:
    """``elastic-ctr serve``: waitress (``--workers 1``) or gunicorn gthread workers."""
    import signal

    from runtime.serving.fileserver import make_server

    slots = features.DEFAULT_SLOTS
    if args.slot_file:
        from runtime import storage

        slots = features.load_slots(storage.read_bytes(args.slot_file).decode())
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="elastic-ctr-serving-")

    def make_app():
        service = build_service(args.topology, args.model_root, args.transfer_url,
                                os.path.join(work_dir, f"w{os.getpid()}") if args.workers > 1 else work_dir,
                                threads=args.threads, max_batch=args.max_batch,
                                poll_interval_s=args.poll_interval, cube_timeout_ms=args.cube_timeout_ms,
                                fmt=args.format, slots=slots)
        return create_wsgi(service)

    if args.workers <= 1:
        app = make_app()
        server = make_server(app, args.host, args.port, threads=args.threads)
        log.info("serving on http://%s:%d (waitress, %d threads)", args.host, server.effective_port, args.threads)

        def _stop(*_):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _stop)
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        return 0

    # Several processes: gunicorn gthread workers, metrics aggregated across them.
    import atexit
    import shutil

    mp_dir = tempfile.mkdtemp(prefix="elastic-ctr-prom-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
    master = os.getpid()
    atexit.register(lambda: os.getpid() == master and shutil.rmtree(mp_dir, ignore_errors=True))
    from gunicorn.app.base import BaseApplication

    class _App(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", f"{args.host}:{args.port}")
            self.cfg.set("workers", args.workers)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("threads", args.threads)
            self.cfg.set("keepalive", 30)
            self.cfg.set("timeout", 60)
            self.cfg.set("graceful_timeout", 10)
            self.cfg.set("accesslog", None)

            def child_exit(_server, worker):
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(worker.pid)

            self.cfg.set("child_exit", child_exit)

        def load(self):
            return make_app()

    log.info("serving on http://%s:%d (gunicorn, %d gthread workers x %d threads)",
             args.host, args.port, args.workers, args.threads)
    _App().run()
    return 0
