"""The cube server's HTTP control app (Flask).

Routes (docs/contracts.md): ``GET /status``, ``POST /bg_load_base {"dir", "version"}``
(202), ``POST /bg_load_patch {"dir", "version", "base_version"}`` (202; 409 unless
``base_version`` is the served version), ``POST /enable {"version"}`` (409 unless the bg
slot holds it, loaded; 200 when it is already served), ``POST /bg_unload``, ``GET
/metrics`` (Prometheus text format: ``runtime.metrics.cube``). ``/healthz`` and
``/readyz`` come from ``runtime/web/wsgi.py``. Errors are JSON ``{"error"}``: 400 for a bad body, 404, 405, 409.

Every ``POST`` needs the ``cube-control`` credential when the app has a ``guard``
(``runtime.auth``: 401 otherwise, counted in ``elastic_ctr_auth_refusals_total``); the
``GET`` routes stay open.
"""
from __future__ import annotations

from runtime.cube.server.versions import Conflict
from runtime.web.wsgi import json_errors


def create_control_app(server, guard=None):
    """The control app of ``server`` (a ``CubeServer``, ``core.py``: its ``status()`` and
    ``versions``) -> a Flask app (routes in the module docstring). ``guard``: a
    ``runtime.auth.Guard`` checking the state-changing requests (None: none checked)."""
    from flask import Flask, Response, jsonify, request

    from runtime.metrics import exposition
    from runtime.metrics.cube import server_registry

    versions = server.versions
    from runtime.metrics.auth import AuthMetrics

    registry = server_registry(server)
    auth_metrics = AuthMetrics(registry)
    app = json_errors(Flask("cube-server"))
    if guard is not None:
        guard.metrics = auth_metrics
        guard.install(app)

    def body() -> dict:
        data = request.get_json(silent=True) if request.content_length else {}
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        return data

    @app.get("/status")
    def status():
        return jsonify(server.status())

    @app.get("/metrics")
    def metrics():
        body, ctype = exposition(registry)
        return Response(body, mimetype=ctype)

    @app.post("/bg_load_base")
    def bg_load_base():
        b = body()
        versions.bg_load(_req_str(b, "dir"), _req_int(b, "version"))
        return jsonify(accepted=True, version=b["version"]), 202

    @app.post("/bg_load_patch")
    def bg_load_patch():
        b = body()
        versions.bg_load(_req_str(b, "dir"), _req_int(b, "version"), _req_int(b, "base_version"))
        return jsonify(accepted=True, version=b["version"]), 202

    @app.post("/enable")
    def enable():
        return jsonify(versions.enable(_req_int(body(), "version")))

    @app.post("/bg_unload")
    def bg_unload():
        versions.bg_unload()
        return jsonify(ok=True)

    @app.errorhandler(Conflict)
    def conflict(exc):
        return jsonify(error=str(exc)), 409

    @app.errorhandler(ValueError)
    def bad_request(exc):
        return jsonify(error=f"bad request to {request.path}: {exc}"), 400

    return app


def _req_int(body: dict, key: str) -> int:
    v = body.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, str)) or not str(v).isdigit():
        raise ValueError(f"field {key!r} must be a non-negative integer, got {v!r}")
    return int(v)


def _req_str(body: dict, key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not v:
        raise ValueError(f"field {key!r} must be a non-empty string, got {v!r}")
    return v
