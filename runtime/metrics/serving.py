"""Serving's Prometheus metrics, aggregated over the worker processes when
``PROMETHEUS_MULTIPROC_DIR`` is set (the launcher sets it)."""
from __future__ import annotations

import os

#: serving's in-flight inference requests (the autoscaler's pods metric: components/serving.py)
INFLIGHT = "elastic_ctr_serving_inflight_requests"
#: histogram buckets of samples per request and per dense-model run
_SAMPLES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class ServingMetrics:
    """Counters and gauges of one serving process: requests by endpoint and HTTP status,
    latency (s), errors by kind, samples, predictor runs, the version served, readiness,
    the served version's data time (``..._model_data_end_timestamp_seconds``), the dense
    backend running it (``..._dense_backend{backend}``), inference
    requests in progress, times inlining backed off (``runtime.serving.asgi.Inline``),
    and samples per request and per dense-model run (histograms)."""

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
        self.inline_backoffs = Counter("elastic_ctr_serving_inline_backoffs_total",
                                       "times inference left the event loop for the inline backoff: a small "
                                       "request took beyond the inline budget", registry=r)
        self.switches = Counter("elastic_ctr_serving_version_switches_total", "version switches", registry=r)
        # 1 for the backend running the served version's dense model (runtime.dense_backends), 0 for the other
        self.dense_backend = Gauge("elastic_ctr_serving_dense_backend", "1 for the backend running the served "
                                   "version's dense network (onnxruntime, paddle), else 0", ["backend"], registry=r,
                                   **({"multiprocess_mode": "livemax"} if self.multiproc else {}))
        # the served version's data time (its donefile line's data_end; NaN: unknown): freshness
        # is time() - this (docs/monitoring.md); the workers' most recent value
        self.data_end = Gauge("elastic_ctr_serving_model_data_end_timestamp_seconds",
                              "data time of the version served: the end of its last partition (unix s)",
                              registry=r, **({"multiprocess_mode": "livemostrecent"} if self.multiproc else {}))
        self.data_end.set(float("nan"))
        # inference requests inside the model now (summed over the workers): the autoscaler's metric
        self.inflight = Gauge(INFLIGHT, "inference requests in progress",
                              registry=r, **({"multiprocess_mode": "livesum"} if self.multiproc else {}))
        self.request_samples = Histogram("elastic_ctr_serving_request_samples", "samples per inference request",
                                         registry=r, buckets=_SAMPLES)
        self.batch_samples = Histogram("elastic_ctr_serving_batch_samples",
                                       "samples per dense-model run (requests combined)", registry=r,
                                       buckets=_SAMPLES)
        self._bound: dict = {}  # (endpoint, code) -> bound children: no label lookup per request

    def observe(self, endpoint: str, code: int, seconds: float) -> None:
        """One answered request."""
        key = (endpoint, code)
        b = self._bound.get(key)
        if b is None:
            b = self._bound[key] = (self.requests.labels(endpoint, str(code)), self.latency.labels(endpoint))
        b[0].inc()
        b[1].observe(seconds)

    def error(self, status: int) -> None:
        """Counts an error answer by kind (bad_request, not_found, unavailable, internal)."""
        kind = {400: "bad_request", 404: "not_found", 503: "unavailable"}.get(status, "internal")
        self.errors.labels(kind).inc()

    def exposition(self) -> tuple[bytes, str]:
        """``(text, content type)`` of the Prometheus exposition."""
        from prometheus_client import CollectorRegistry

        from runtime.metrics import exposition

        if self.multiproc:
            from prometheus_client import multiprocess

            reg = CollectorRegistry()
            multiprocess.MultiProcessCollector(reg)
            return exposition(reg)
        return exposition(self.registry)
