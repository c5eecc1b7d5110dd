"""Serving's REST endpoints: the Open Inference Protocol v2 and the models' own routes,
over the data plane, independent of the HTTP server (``RestApp.respond``: method, path,
headers and whole body in; status, body and headers out). Served over HTTP by the ASGI
app of ``runtime.serving.asgi`` (uvicorn, ``runtime.serving.worker``); ``RestApp`` is
also a WSGI application, for callers in process (tests, the benchmark's in-process figure).

- ``GET /v2`` (server metadata), ``GET /v2/health/live``, ``GET /v2/health/ready`` (the
  server: not stopping and every model ready; ``model_version``: the first model's
  version): 200, or 400 when not ready (the protocol: "4xx indicates false", as Triton)
  with ``{"error": reason}``.
- ``GET /v2/models/<name>[/versions/<v>]/ready``: that model's readiness (KServe's), the
  same statuses.
- ``GET /v2/models/<name>[/versions/<v>]``: model metadata.
- ``POST /v2/models/<name>[/versions/<v>]/infer``: inference (codec:
  ``runtime.serving.rest_codec``), JSON or with binary tensors (Triton's binary tensor data
  extension).
- each model's own routes (``Model.routes``), e.g. the CTR model's ``POST /predict``.
- ``GET /metrics``: Prometheus text format.

Every request goes through one path (``RestApp.respond``): route, run the endpoint, turn
an ``InferenceError`` into ``{"error": "..."}`` with its status (400 bad input, 404 unknown
model or version, 503 unavailable), log anything else and answer a JSON 500 without a
traceback, count the request in the metrics.
"""
from __future__ import annotations

import functools
import json
import logging
import time
from typing import Callable, Mapping

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound as RouteNotFound
from werkzeug.routing import Map, Rule

from runtime.serving.dataplane import DataPlane
from runtime.serving.protocol import BadRequest, InferenceError, PayloadTooLarge
from runtime.serving.rest_answer import encode_response
from runtime.serving.rest_codec import HEADER_LENGTH, decode_rest_request
from runtime.role_specs import V2_LIVE, V2_READY

log = logging.getLogger(__name__)

_STATUS = {200: "200 OK", 400: "400 Bad Request", 404: "404 Not Found", 405: "405 Method Not Allowed",
           411: "411 Length Required", 413: "413 Payload Too Large", 500: "500 Internal Server Error",
           503: "503 Service Unavailable"}

_RULES = [
    Rule("/v2", endpoint="server_metadata", methods=["GET"]),
    Rule(V2_LIVE, endpoint="live", methods=["GET"]),
    Rule(V2_READY, endpoint="ready", methods=["GET"]),
    Rule("/v2/models/<name>/ready", endpoint="model_ready", methods=["GET"]),
    Rule("/v2/models/<name>/versions/<version>/ready", endpoint="model_ready", methods=["GET"]),
    Rule("/v2/models/<name>", endpoint="model_metadata", methods=["GET"]),
    Rule("/v2/models/<name>/versions/<version>", endpoint="model_metadata", methods=["GET"]),
    Rule("/v2/models/<name>/infer", endpoint="infer", methods=["POST"]),
    Rule("/v2/models/<name>/versions/<version>/infer", endpoint="infer", methods=["POST"]),
    Rule("/metrics", endpoint="metrics", methods=["GET"]),
]

#: (status, body, content type[, extra headers]); a dict body is sent as JSON
Answer = tuple
#: what ``RestApp.respond`` returns: (status, body bytes, headers incl. Content-Type)
Response = tuple[int, bytes, list[tuple[str, str]]]
JSON = "application/json"
BINARY = "application/octet-stream"


class RestApp:
    """The REST endpoints over ``plane`` (module docstring). ``max_body_bytes``: larger
    request bodies are refused (413) before they are read (WSGI; the ASGI app checks it
    itself while receiving)."""

    def __init__(self, plane: DataPlane, max_body_bytes: int = 64 << 20):
        self.plane = plane
        self.metrics = plane.metrics
        self.max_body_bytes = max_body_bytes
        self._endpoints: dict[str, Callable[..., Answer]] = {
            "server_metadata": self.server_metadata, "live": self.live, "ready": self.ready,
            "model_ready": self.model_ready, "model_metadata": self.model_metadata, "infer": self.infer,
            "metrics": self.metrics_view}
        rules = [r.empty() for r in _RULES]  # a rule binds to one map
        for model in plane.models.values():
            for path, (endpoint, handler) in model.routes().items():
                if endpoint in self._endpoints:
                    raise ValueError(f"model {model.name!r}: route {path} names the endpoint {endpoint!r}, "
                                     "which the server has already")
                rules.append(Rule(path, endpoint=endpoint, methods=["POST"]))
                self._endpoints[endpoint] = functools.partial(self._model_route, handler)
        routes = Map(rules, strict_slashes=False)

        @functools.lru_cache(maxsize=1024)
        def route(method: str, path: str) -> tuple[str, dict]:
            # cached: a few paths carry every request, and binding and matching cost more than
            # the lookup; no rule matches on the host. ``values`` is shared between calls: read only.
            return routes.bind("localhost", path_info=path).match(method=method)

        self._route = route

    # -- the one request path ----------------------------------------------------------------
    def respond(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        """Answers one request: ``headers`` by lower-case name (``content-type``,
        ``content-encoding``, ``inference-header-content-length`` are read), ``body`` whole.
        Returns ``(status, body, headers)``; never raises (module docstring)."""
        t0 = time.perf_counter()
        endpoint = "unknown"
        extra: list[tuple[str, str]] = []
        try:
            endpoint, values = self._route(method, path)
            status, out, ctype, *more = self._endpoints[endpoint](headers, body, **values)
            if more:
                extra = more[0]
        except InferenceError as exc:
            status, out, ctype = exc.status, {"error": str(exc)}, JSON
        except RouteNotFound:
            status, out, ctype = 404, {"error": f"{path}: not found"}, JSON
        except MethodNotAllowed:
            status, out, ctype = 405, {"error": f"{method} {path}: method not allowed"}, JSON
        except HTTPException as exc:
            status, out, ctype = exc.code or 500, {"error": exc.description or exc.name}, JSON
        except Exception as exc:  # never a traceback to the client
            log.exception("%s: unexpected error", endpoint)
            status, out, ctype = 500, {"error": f"internal error: {exc.__class__.__name__}: {exc}"}, JSON
        data = json.dumps(out, separators=(",", ":")).encode() if isinstance(out, dict) else out
        if status >= 400:
            self.metrics.error(status)
        self.metrics.observe(endpoint, status, time.perf_counter() - t0)
        return status, data, [("Content-Type", ctype), *extra]

    def __call__(self, environ, start_response):
        """WSGI: ``respond`` to the request of ``environ`` (its body read up to
        ``max_body_bytes``: a larger ``Content-Length`` is answered 413 unread)."""
        headers = {"content-type": environ.get("CONTENT_TYPE", "")}
        for key in ("HTTP_CONTENT_ENCODING", "HTTP_INFERENCE_HEADER_CONTENT_LENGTH"):
            if key in environ:
                headers[key[5:].lower().replace("_", "-")] = environ[key]
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "")
        try:
            body = self._body(environ)
        except InferenceError as exc:
            data = json.dumps({"error": str(exc)}).encode()
            status, out = exc.status, [("Content-Type", JSON)]
            self.metrics.error(status)
        else:
            status, data, out = self.respond(method, path, headers, body)
        start_response(_STATUS.get(status, f"{status} Error"), [*out, ("Content-Length", str(len(data)))])
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

    # -- endpoints (headers, body, **route values) ----------------------------------------------
    def server_metadata(self, headers, body) -> Answer:
        return 200, self.plane.server_metadata(), JSON

    def live(self, headers, body) -> Answer:
        return 200, {"live": True}, JSON

    def ready(self, headers, body) -> Answer:
        ok, why = self.plane.ready()
        self.metrics.ready.set(1 if ok else 0)
        if ok:  # the version answering (runtime/local/status.py reads it)
            return 200, {"ready": True, "model_version": self.plane.default.versions()[0]}, JSON
        return 400, {"ready": False, "error": why}, JSON

    def model_ready(self, headers, body, name: str, version: str | None = None) -> Answer:
        ok, why = self.plane.model_ready(name, version)  # NotFound for another model
        if ok:
            return 200, {"name": name, "ready": True, "versions": self.plane.model(name).versions()}, JSON
        return 400, {"name": name, "ready": False, "error": why}, JSON

    def model_metadata(self, headers, body, name: str, version: str | None = None) -> Answer:
        return 200, self.plane.model_metadata(name, version), JSON

    def infer(self, headers, body, name: str, version: str | None = None) -> Answer:
        header = headers.get("inference-header-content-length")
        if header is not None:
            try:
                header = int(header)
            except ValueError:
                raise BadRequest(f"{HEADER_LENGTH}: {header!r} is not an integer") from None
        encoding = headers.get("content-encoding", "identity")
        if encoding not in ("identity", ""):
            raise BadRequest(f"Content-Encoding: {encoding!r} is not supported (send the body uncompressed)")
        req = decode_rest_request(body, header)
        out, header_length = encode_response(self.plane.infer(name, version, req), req)
        if header_length is None:
            return 200, out, JSON
        return 200, out, BINARY, [(HEADER_LENGTH, str(header_length))]

    @staticmethod
    def _model_route(handler, headers, body) -> Answer:
        return 200, handler(body, headers.get("content-type", "")), JSON

    def metrics_view(self, headers, body) -> Answer:
        ok = self.plane.ready()[0]
        self.metrics.ready.set(1 if ok else 0)
        data, ctype = self.metrics.exposition()
        return 200, data, ctype


def create_app(plane: DataPlane, max_body_bytes: int = 64 << 20) -> RestApp:
    """Serving's REST endpoints over ``plane`` (a WSGI application too)."""
    return RestApp(plane, max_body_bytes)
