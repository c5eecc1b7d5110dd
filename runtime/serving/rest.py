"""Serving's HTTP transport: the Open Inference Protocol v2 REST endpoints and ``/predict``,
as a WSGI application over the data plane.

- ``GET /v2`` (server metadata), ``GET /v2/health/live``, ``GET /v2/health/ready``,
  ``GET /v2/models/ctr[/versions/<v>]/ready``: 200, or 400 when not ready (the protocol:
  "4xx indicates false", as Triton) with ``{"error": reason}``.
- ``GET /v2/models/ctr[/versions/<v>]``: model metadata.
- ``POST /v2/models/ctr[/versions/<v>]/infer``: inference (codec:
  ``runtime.serving.rest_codec``), JSON or with binary tensors (Triton's binary tensor data
  extension).
- ``POST /predict`` ``{"lines": [...]}`` or a text/plain body (one row per line) ->
  ``{"probabilities": [...], "model_version": id}``, answered by the data plane's default
  model (``runtime.serving.ctr_model.CtrModel.predict_lines``).
- ``GET /metrics``: Prometheus text format.

Every request goes through one path (``RestApp.__call__``): route, run the endpoint, turn
an ``InferenceError`` into ``{"error": "..."}`` with its status (400 bad input, 404 unknown
model or version, 503 unavailable), log anything else and answer a JSON 500 without a
traceback, count the request in the metrics.
"""
from __future__ import annotations

import functools
import json
import logging
import time
from typing import Callable

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound as RouteNotFound
from werkzeug.routing import Map, Rule

from runtime.serving.dataplane import DataPlane
from runtime.serving.protocol import BadRequest, InferenceError, PayloadTooLarge
from runtime.serving.rest_codec import HEADER_LENGTH, decode_predict_request, decode_rest_request, encode_response

log = logging.getLogger(__name__)

_STATUS = {200: "200 OK", 400: "400 Bad Request", 404: "404 Not Found", 405: "405 Method Not Allowed",
           411: "411 Length Required", 413: "413 Payload Too Large", 500: "500 Internal Server Error",
           503: "503 Service Unavailable"}

_ROUTES = Map([
    Rule("/v2", endpoint="server_metadata", methods=["GET"]),
    Rule("/v2/health/live", endpoint="live", methods=["GET"]),
    Rule("/v2/health/ready", endpoint="ready", methods=["GET"]),
    Rule("/v2/models/<name>/ready", endpoint="model_ready", methods=["GET"]),
    Rule("/v2/models/<name>/versions/<version>/ready", endpoint="model_ready", methods=["GET"]),
    Rule("/v2/models/<name>", endpoint="model_metadata", methods=["GET"]),
    Rule("/v2/models/<name>/versions/<version>", endpoint="model_metadata", methods=["GET"]),
    Rule("/v2/models/<name>/infer", endpoint="infer", methods=["POST"]),
    Rule("/v2/models/<name>/versions/<version>/infer", endpoint="infer", methods=["POST"]),
    Rule("/predict", endpoint="predict", methods=["POST"]),
    Rule("/metrics", endpoint="metrics", methods=["GET"]),
], strict_slashes=False)


@functools.lru_cache(maxsize=1024)
def _route(method: str, script_name: str, path_info: str) -> tuple[str, dict]:
    """``(endpoint, values)`` of ``_ROUTES`` for a request's method, ``SCRIPT_NAME`` and
    ``PATH_INFO`` (WSGI strings); raises werkzeug's ``NotFound`` / ``MethodNotAllowed``.
    Cached (a few paths carry every request; binding and matching cost 20-30 us each
    time): no rule matches on the host, so these three decide the match. ``values`` is
    shared between calls: read it, do not change it."""
    return _ROUTES.bind_to_environ({"REQUEST_METHOD": method, "SCRIPT_NAME": script_name, "PATH_INFO": path_info,
                                    "SERVER_NAME": "localhost", "SERVER_PORT": "80",
                                    "wsgi.url_scheme": "http"}).match()


#: (status, body, content type[, extra headers]); a dict body is sent as JSON
Answer = tuple
JSON = "application/json"
BINARY = "application/octet-stream"


class RestApp:
    """The WSGI application (module docstring). ``max_body_bytes``: larger request bodies
    are refused (413) before they are read."""

    def __init__(self, plane: DataPlane, max_body_bytes: int = 64 << 20):
        self.plane = plane
        self.metrics = plane.metrics
        self.max_body_bytes = max_body_bytes
        self._endpoints: dict[str, Callable[..., Answer]] = {
            "server_metadata": self.server_metadata, "live": self.live, "ready": self.ready,
            "model_ready": self.model_ready, "model_metadata": self.model_metadata, "infer": self.infer,
            "predict": self.predict, "metrics": self.metrics_view}

    # -- the one request path ----------------------------------------------------------------
    def __call__(self, environ, start_response):
        t0 = time.perf_counter()
        endpoint = "unknown"
        headers: list[tuple[str, str]] = []
        try:
            endpoint, values = _route(environ.get("REQUEST_METHOD", "GET"), environ.get("SCRIPT_NAME", ""),
                                      environ.get("PATH_INFO", ""))
            status, body, ctype, *extra = self._endpoints[endpoint](environ, **values)
            if extra:
                headers = extra[0]
        except InferenceError as exc:
            status, body, ctype = exc.status, {"error": str(exc)}, JSON
        except RouteNotFound:
            status, body, ctype = 404, {"error": f"{environ.get('PATH_INFO')}: not found"}, JSON
        except MethodNotAllowed:
            status, body, ctype = 405, {"error": f"{environ.get('REQUEST_METHOD')} {environ.get('PATH_INFO')}: "
                                                 "method not allowed"}, JSON
        except HTTPException as exc:
            status, body, ctype = exc.code or 500, {"error": exc.description or exc.name}, JSON
        except Exception as exc:  # never a traceback to the client
            log.exception("%s: unexpected error", endpoint)
            status, body, ctype = 500, {"error": f"internal error: {exc.__class__.__name__}: {exc}"}, JSON
        data = json.dumps(body, separators=(",", ":")).encode() if isinstance(body, dict) else body
        start_response(_STATUS.get(status, f"{status} Error"),
                       [("Content-Type", ctype), ("Content-Length", str(len(data))), *headers])
        if status >= 400:
            self.metrics.error(status)
        self.metrics.observe(endpoint, status, time.perf_counter() - t0)
        return [data]

    def _body(self, environ) -> bytes:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise BadRequest("Content-Length: not an integer") from None
        if length > self.max_body_bytes:
            raise PayloadTooLarge(f"request body of {length} bytes exceeds the limit of {self.max_body_bytes} "
                                  "(--max-body-bytes)")
        return environ["wsgi.input"].read(length) if length > 0 else b""

    # -- endpoints -------------------------------------------------------------------------------
    def server_metadata(self, environ) -> Answer:
        return 200, self.plane.server_metadata(), JSON

    def live(self, environ) -> Answer:
        return 200, {"live": True}, JSON

    def ready(self, environ) -> Answer:
        ok, why = self.plane.ready()
        self.metrics.ready.set(1 if ok else 0)
        if ok:
            return 200, {"ready": True, "model_version": self.plane.default.versions()[0]}, JSON
        return 400, {"ready": False, "error": why}, JSON

    def model_ready(self, environ, name: str, version: str | None = None) -> Answer:
        why = self.plane.not_served(name, version)  # NotFound for another model
        if why:
            return 400, {"ready": False, "error": why}, JSON
        return self.ready(environ)

    def model_metadata(self, environ, name: str, version: str | None = None) -> Answer:
        return 200, self.plane.model_metadata(name, version), JSON

    def infer(self, environ, name: str, version: str | None = None) -> Answer:
        header = environ.get("HTTP_INFERENCE_HEADER_CONTENT_LENGTH")
        if header is not None:
            try:
                header = int(header)
            except ValueError:
                raise BadRequest(f"{HEADER_LENGTH}: {header!r} is not an integer") from None
        if environ.get("HTTP_CONTENT_ENCODING", "identity") not in ("identity", ""):
            raise BadRequest(f"Content-Encoding: {environ['HTTP_CONTENT_ENCODING']!r} is not supported (send the "
                             "body uncompressed)")
        req = decode_rest_request(self._body(environ), header)
        body, header_length = encode_response(self.plane.infer(name, version, req), req)
        if header_length is None:
            return 200, body, JSON
        return 200, body, BINARY, [(HEADER_LENGTH, str(header_length))]

    def predict(self, environ) -> Answer:
        lines = decode_predict_request(self._body(environ), environ.get("CONTENT_TYPE", ""))
        probs, version = self.plane.default.predict_lines(lines)
        return 200, {"probabilities": probs.ravel().tolist(), "model_version": version}, JSON

    def metrics_view(self, environ) -> Answer:
        ok = self.plane.ready()[0]
        self.metrics.ready.set(1 if ok else 0)
        data, ctype = self.metrics.exposition()
        return 200, data, ctype


def create_app(plane: DataPlane, max_body_bytes: int = 64 << 20) -> RestApp:
    """Serving's WSGI application over ``plane``."""
    return RestApp(plane, max_body_bytes)
