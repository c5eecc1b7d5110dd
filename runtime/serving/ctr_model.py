"""The CTR model served (``ctr``): its signature, the checks of a request against it, its own
REST route ``POST /predict`` (raw rows), the cube lookups pinned to a version, and the
predictor runs.

Signature (the owner: the demo client and the benchmark build requests from these names):
inputs either ``dense_features`` FP32 [n,13] (the raw integer features I1..I13; NaN/null =
missing; the model's normalization is applied here) with ``feasigns`` UINT64 [n,S] (the
feasigns of the S slots, ``runtime.formats.features``), or ``lines`` BYTES [n] (raw rows in
the training format, the label optional); output ``probability`` FP32 [n,1].

Each request is answered by one version: the dense model current when it starts
(``VersionWatcher.current``) and the cube embeddings of that same version
(``CubeClient.seek(keys, version=v)``). Missing keys (feasigns never seen in training) are
zero vectors, as in training.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import numpy as np

from runtime import dense_backends
from runtime.formats import features
from runtime.serving.batching import Combiner
from runtime.serving.dataplane import Model
from runtime.metrics.serving import ServingMetrics
from runtime.serving.model import DenseModel, VersionWatcher
from runtime.serving.protocol import BadRequest, InferOutput, InferRequest, InferResponse, NotFound, Unavailable

MODEL_NAME = "ctr"
DENSE, FEASIGNS, LINES, PROBABILITY = "dense_features", "feasigns", "lines", "probability"
#: how long readiness waits (s) for the cube lookup it makes after a failed one. The lookup
#: runs on a thread of its own: a cube that answers does so well within this, so readiness
#: turns true as soon as the cube is back; a hung one leaves the lookup waiting out the
#: client's timeouts there while readiness answers "not ready" (it is answered on the
#: worker's event loop, which must not wait out those timeouts: 3 x 200 ms by default)
READY_CHECK_WAIT_S = 0.05


def signature(num_slots: int = features.NUM_SLOTS) -> tuple[list[dict], list[dict]]:
    """``(inputs, outputs)``: the model's tensors as the v2 metadata lists them (``name``,
    ``datatype``, ``shape``; -1 = any batch size)."""
    inputs = [
        {"name": DENSE, "datatype": "FP32", "shape": [-1, features.NUM_DENSE]},
        {"name": FEASIGNS, "datatype": "UINT64", "shape": [-1, num_slots]},
        {"name": LINES, "datatype": "BYTES", "shape": [-1]},
    ]
    return inputs, [{"name": PROBABILITY, "datatype": "FP32", "shape": [-1, 1]}]


class CtrModel(Model):
    """The model ``ctr`` (module docstring) over the versions a ``VersionWatcher`` loads.

    Args:
        watcher: a ``VersionWatcher`` (its ``current`` model answers).
        cube_factory: makes a cube client (``seek(keys uint64[m], version) -> result with
            values float32[m,dim], found bool[m], version``; a missing key's values are
            zeros, as ``runtime.cube.client.calls.SeekResult`` and the cube's wire protocol give
            them, and are fed to the model as they are); called once, at the first lookup, and
            shared by every thread that serves requests (its ``seek`` must be thread-safe, as
            ``CubeClient``'s is: what one thread's lookups learn, such as the embedding
            width its C path needs, serves the others, readiness's lookups included).
        max_batch: largest batch accepted (samples).
        fmt, slots: the raw-line format when the model's metadata does not say.
        metrics: Prometheus metrics (samples, predictor runs, the version served;
            default: new ones).
        combine: combine concurrent requests (``runtime.serving.batching.Combiner``).
    """

    name = MODEL_NAME

    def __init__(self, watcher: VersionWatcher, cube_factory: Callable[[], Any], max_batch: int = 4096,
                 fmt: str = "criteo", slots: tuple[int, ...] = features.DEFAULT_SLOTS,
                 metrics: Optional[ServingMetrics] = None, combine: bool = True):
        self.watcher = watcher
        self.cube_factory = cube_factory
        self.max_batch = int(max_batch)
        self.fmt = fmt
        self.slots = tuple(slots)
        self.metrics = metrics or ServingMetrics()
        self.combine = combine
        self._lock = threading.Lock()  # the lazily made combiner and cube client
        self._cube = None
        self._check: Optional[_CubeCheck] = None  # readiness's cube lookup after a failed one
        self.cube_ok = True
        self.cube_error: Optional[str] = None
        watcher.on_switch.append(self._switched)
        if watcher.current is not None:
            self._switched(watcher.current)

    def _switched(self, model: DenseModel) -> None:
        self.metrics.version.set(model.version)
        data_end = getattr(model, "data_end", None)
        self.metrics.data_end.set(float("nan") if data_end is None else data_end)
        self.metrics.switches.inc()
        backend = getattr(model, "backend", None)
        for b in dense_backends.BACKENDS:
            self.metrics.dense_backend.labels(b).set(1 if b == backend else 0)

    def cube(self):
        """The cube client (made at the first call; shared by the request threads)."""
        c = self._cube
        if c is None:
            with self._lock:
                c = self._cube
                if c is None:
                    c = self._cube = self.cube_factory()
        return c

    # -- versions, health and metadata -------------------------------------------------------
    def versions(self) -> list[str]:
        m = self.watcher.current
        return [str(m.version)] if m is not None else []

    def ready(self) -> tuple[bool, str]:
        """``(ready, reason)``: a version is loaded and cube answers a pinned lookup. After
        a failed lookup, readiness asks cube again (``_check_cube``) and waits for the
        answer at most ``READY_CHECK_WAIT_S``."""
        m = self.watcher.current
        if m is None:
            return False, self._no_version()
        if not self.cube_ok:
            return self._check_cube(m.version)
        return True, "ready"

    def _check_cube(self, version: int) -> tuple[bool, str]:
        """``(ready, reason)`` from a pinned lookup of one key (a lookup that answers sets
        ``cube_ok``), run on a thread of its own, one at a time: a probe finding none
        running starts one; any waits for it at most ``READY_CHECK_WAIT_S`` and, when it
        has not answered by then, answers not ready, the lookup still waiting for cube."""
        with self._lock:
            check = self._check
            if check is None or check.done.is_set():
                keys = np.array([features.missing_feasign(1)], dtype=np.uint64)
                check = self._check = _CubeCheck(version, lambda: self._seek(keys, version))
        if not check.done.wait(READY_CHECK_WAIT_S):
            return False, (f"cube lookup failed: {self.cube_error}; asked again (version "
                           f"{check.version}), no answer within {READY_CHECK_WAIT_S * 1e3:.0f} ms yet")
        if check.error is not None:
            return False, check.error
        if check.version != version:  # the version switched meanwhile: this one is not asked yet
            return self._check_cube(version)
        return True, "ready"

    def _no_version(self) -> str:
        err = self.watcher.last_error
        return "no model version loaded yet" + (f" ({err})" if err else "")

    def current(self) -> DenseModel:
        """The dense model answering now. Raises ``Unavailable``."""
        m = self.watcher.current
        if m is None:
            raise Unavailable(self._no_version())
        return m

    def _pinned(self, version: Optional[str]) -> DenseModel:
        """The dense model answering a request for ``version`` (None: the current one).
        Raises ``Unavailable`` or ``NotFound`` (a version not served)."""
        m = self.current()  # one read: the request uses this version throughout
        if version is not None and version != str(m.version):
            raise NotFound(f"model {self.name!r} version {version!r} is not being served (serving {m.version})")
        return m

    def metadata(self, version: Optional[str] = None) -> dict:
        m = self.watcher.current
        versions = [str(m.version)] if m else []
        if version is not None and version not in versions:
            raise NotFound(f"model {self.name!r} version {version!r} is not being served (serving {versions})")
        inputs, outputs = signature(m.num_slots if m else features.NUM_SLOTS)
        return {
            "name": self.name, "versions": versions,
            "platform": dense_backends.PLATFORMS[m.backend if m else self.watcher.dense_backend],
            "inputs": inputs, "outputs": outputs,
            "parameters": {"note": f"give '{DENSE}' (raw I1..I13; null = missing) and '{FEASIGNS}' (the slots' "
                                   f"feasigns), or '{LINES}' (raw rows) alone"},
        }

    # -- inference -----------------------------------------------------------------------
    def infer(self, req: InferRequest, version: Optional[str] = None) -> InferResponse:
        model = self._pinned(version)
        if req.outputs is not None:
            for j, o in enumerate(req.outputs):
                if o.name != PROBABILITY:
                    raise BadRequest(f"outputs[{j}].name: unknown output {o.name!r} (this model has "
                                     f"{PROBABILITY!r})")
        dense, fs = self._inputs(req, model)
        probs = self.predict(model, dense, fs)
        v = model.version
        return InferResponse(model_name=self.name, model_version=str(v), id=req.id,
                             parameters={"model_version": v, "cube_version": v},
                             outputs=[InferOutput(PROBABILITY, "FP32", [int(probs.shape[0]), 1], probs)])

    def _inputs(self, req: InferRequest, model: DenseModel) -> tuple[np.ndarray, np.ndarray]:
        """The request's rows: ``(dense float[n,13] raw, feasigns uint64[n,S])``. Raises
        ``BadRequest`` naming the first field that does not fit the signature."""
        by_name = {inp.name: inp for inp in req.inputs}
        for inp in req.inputs:
            if inp.name not in (DENSE, FEASIGNS, LINES):
                raise BadRequest(f"{inp.where}.name: unknown input {inp.name!r} (expected '{DENSE}' and "
                                 f"'{FEASIGNS}', or '{LINES}')")
        if LINES in by_name:
            if len(by_name) > 1:
                raise BadRequest(f"inputs: give either '{LINES}' or '{DENSE}' + '{FEASIGNS}', not both")
            inp = by_name[LINES]
            if inp.datatype != "BYTES":
                raise BadRequest(f"{inp.where}.datatype: expected BYTES for '{LINES}', got {inp.datatype!r}")
            if len(inp.shape) != 1:
                raise BadRequest(f"{inp.where}.shape: expected [n] for '{LINES}', got {inp.shape}")
            self.check_batch(inp.shape[0], f"{inp.where}.shape")
            return self.parse_lines(model, list(inp.array()), f"{inp.where}.data")
        for need in (DENSE, FEASIGNS):
            if need not in by_name:
                raise BadRequest(f"inputs: missing input {need!r} (or give raw rows as '{LINES}')")
        d, f = by_name[DENSE], by_name[FEASIGNS]
        if d.datatype != "FP32":
            raise BadRequest(f"{d.where}.datatype: expected FP32 for '{DENSE}', got {d.datatype!r}")
        if len(d.shape) != 2 or d.shape[1] != features.NUM_DENSE:
            raise BadRequest(f"{d.where}.shape: expected [n,{features.NUM_DENSE}] for '{DENSE}' "
                             f"({features.NUM_DENSE} dense features), got {d.shape}")
        n = d.shape[0]
        self.check_batch(n, f"{d.where}.shape")
        dense = d.array().reshape(n, features.NUM_DENSE)
        nslots = model.num_slots
        if f.datatype != "UINT64":
            raise BadRequest(f"{f.where}.datatype: expected UINT64 for '{FEASIGNS}', got {f.datatype!r}")
        if len(f.shape) != 2 or f.shape[1] != nslots:
            raise BadRequest(f"{f.where}.shape: expected [n,{nslots}] for '{FEASIGNS}' ({nslots} sparse slots), "
                             f"got {f.shape}")
        if f.shape[0] != n:
            raise BadRequest(f"{f.where}.shape: batch {f.shape[0]} differs from {DENSE}' batch {n}")
        return dense, f.array().reshape(n, nslots)

    def check_batch(self, n: int, field: str) -> None:
        """Raises ``BadRequest`` naming ``field`` for an empty or over-size batch."""
        if n == 0:
            raise BadRequest(f"{field}: empty batch (0 samples)")
        if n > self.max_batch:
            raise BadRequest(f"{field}: batch of {n} samples exceeds the limit of {self.max_batch}")

    def parse_lines(self, model: DenseModel, lines: list, field: str) -> tuple[np.ndarray, np.ndarray]:
        """Raw rows in the model's training format (the label optional) -> ``(dense
        float32[n,13] raw, feasigns uint64[n,S])``. Raises ``BadRequest`` naming
        ``field[i]`` for the first row that is not a sample."""
        for i, ln in enumerate(lines):
            if not isinstance(ln, str):
                raise BadRequest(f"{field}[{i}]: expected a string, got {type(ln).__name__}")
        spec = model.meta.features
        batch = features.parse_lines([ln.rstrip("\r\n") for ln in lines], spec.format, spec.slots,
                                     label_optional=True, strict=True)
        if batch.bad:
            i, why = batch.bad[0]
            raise BadRequest(f"{field}[{i}]: {why}")
        return batch.dense, batch.feasigns

    def routes(self) -> dict[str, tuple[str, Callable[[bytes, str], Any]]]:
        """``POST /predict``: ``{"lines": [...]}`` (``Content-Type: application/json``) or
        a text body, one raw row per line (``rest_codec.decode_predict_request``) ->
        ``{"probabilities": [...], "model_version": id}`` (``predict_lines``)."""
        return {"/predict": ("predict", self._predict_route)}

    def _predict_route(self, body: bytes, content_type: str) -> dict:
        # imported here: the model runs where the REST codec's JSON parser is absent (the
        # KServe peer of bench/kserve_peer.py imports this module in KServe's venv)
        from runtime.serving.rest_codec import decode_predict_request

        probs, version = self.predict_lines(decode_predict_request(body, content_type))
        return {"probabilities": probs.ravel().tolist(), "model_version": version}

    def predict_lines(self, lines: Any) -> tuple[np.ndarray, int]:
        """``POST /predict``: raw rows (a list of str) -> ``(probabilities float32[n,1],
        version)``. Raises ``Unavailable`` (no version loaded) or ``BadRequest`` (not a
        list, an empty or over-size batch, a row that is not a sample)."""
        model = self.current()
        if not isinstance(lines, list):
            raise BadRequest("lines: expected an array of raw rows (strings)")
        self.check_batch(len(lines), "lines")
        dense, fs = self.parse_lines(model, lines, "lines")
        return self.predict(model, dense, fs), model.version

    def predict(self, model: DenseModel, dense_raw: np.ndarray, feasigns: np.ndarray) -> np.ndarray:
        """``dense_raw`` float[n,13] (NaN = missing), ``feasigns`` uint64[n,S] ->
        probabilities float32[n,1], with ``model`` and cube pinned to its version.
        Concurrent calls for one version are combined (``Combiner``) when ``combine`` is on.
        Raises ``Unavailable`` (cube lookup failed)."""
        m = self.metrics
        m.request_samples.observe(feasigns.shape[0])
        m.inflight.inc()  # the autoscaler's custom metric (docs/monitoring.md)
        try:
            return self._submit(model, dense_raw, feasigns)
        finally:
            m.inflight.dec()

    def _submit(self, model: DenseModel, dense_raw: np.ndarray, feasigns: np.ndarray) -> np.ndarray:
        """``predict`` without its metrics: one run, or a share of a combined one."""
        if not self.combine:
            return self._predict(model, dense_raw, feasigns)
        comb = model.combiner
        if comb is None:
            with self._lock:
                comb = model.combiner
                if comb is None:
                    comb = model.combiner = Combiner(lambda d, f, m=model: self._predict(m, d, f),
                                                     max(self.max_batch, 256))
        return comb.submit(dense_raw, feasigns)

    def _seek(self, keys: np.ndarray, version: int):
        try:
            res = self.cube().seek(keys, version=version)
        except Exception as exc:  # CubeUnavailable, timeouts, version not held
            self.cube_ok = False
            self.cube_error = f"{exc.__class__.__name__}: {exc}"
            raise Unavailable(f"cube lookup failed: {self.cube_error}") from exc
        got = getattr(res, "version", version)
        if got is not None and int(got) != version:
            self.cube_ok = False
            self.cube_error = f"cube answered version {got}, request pinned to {version}"
            raise Unavailable(self.cube_error)
        self.cube_ok = True
        return res

    def _predict(self, model: DenseModel, dense_raw: np.ndarray, feasigns: np.ndarray) -> np.ndarray:
        n = feasigns.shape[0]
        dense = features.normalize_dense(dense_raw, model.meta.normalization.clip_max)
        keys = np.ascontiguousarray(feasigns.T).ravel()  # slot-major: slot s = rows s*n..s*n+n-1
        res = self._seek(keys, model.version)
        self.metrics.runs.inc()  # counted once the lookups answered
        self.metrics.batch_samples.observe(n)
        values = res.values
        if values.dtype != np.float32 or not values.flags.c_contiguous:
            values = np.ascontiguousarray(values, dtype=np.float32)
        self.metrics.samples.inc(n)
        return model.predict(dense, values)


class _CubeCheck:
    """One readiness lookup on a daemon thread of its own: ``version`` (int) asked,
    ``done`` (``threading.Event``) set once it answered or failed, ``error`` (str) the
    failure's message, None when it answered."""

    def __init__(self, version: int, lookup: Callable[[], Any]):
        self.version = version
        self.done = threading.Event()
        self.error: Optional[str] = None
        threading.Thread(target=self._run, args=(lookup,), name="cube-ready-check", daemon=True).start()

    def _run(self, lookup: Callable[[], Any]) -> None:
        try:
            lookup()
        except Unavailable as exc:
            self.error = str(exc)
        except Exception as exc:  # anything else the lookup raises is a failure to report, not to lose
            self.error = f"cube lookup failed: {exc.__class__.__name__}: {exc}"
        finally:
            self.done.set()
