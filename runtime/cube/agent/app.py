"""The cube agent's HTTP layer: a Flask app on ``runtime.web.wsgi`` (one process, threads;
routes in ``runtime/cube/agent``'s package docstring) and ``elastic-ctr cube agent``.
"""
from __future__ import annotations

from runtime.cube.agent.commands import Agent
from runtime.web.wsgi import json_errors


def create_app(agent: Agent, guard=None):
    """The agent's Flask app (routes in the module docstring). ``guard``: a
    ``runtime.auth.Guard`` checking every ``POST`` (None: none checked)."""
    from flask import Flask, Response, jsonify, request

    from runtime.metrics import exposition

    app = json_errors(Flask("cube-agent"))
    if guard is not None:
        guard.metrics = agent.metrics.auth
        guard.install(app)

    def body() -> dict:
        data = request.get_json(silent=True)
        return data if isinstance(data, dict) else {}

    def wait_of(data: dict) -> float:
        try:
            return max(0.0, min(float(data.get("wait", 0) or 0), 600.0))
        except (TypeError, ValueError):
            return 0.0

    @app.get("/status")
    def status():
        return jsonify(agent.status())

    @app.get("/metrics")
    def metrics():
        body, ctype = exposition(agent.metrics.registry)
        return Response(body, mimetype=ctype)

    @app.post("/download")
    def download():
        data = body()
        code, out = agent.download(data, wait_of(data))
        return jsonify(out), code

    @app.post("/reload")
    def reload():
        data = body()
        code, out = agent.reload(data, wait_of(data))
        return jsonify(out), code

    @app.post("/enable")
    def enable():
        code, out = agent.enable(body())
        return jsonify(out), code

    @app.post("/bg_unload")
    def bg_unload():
        code, out = agent.bg_unload()
        return jsonify(out), code

    return app


def main(args) -> int:
    """``elastic-ctr cube agent``: serves the agent until SIGTERM (every ``POST`` checked for
    the ``cube-control`` credential, which it presents to its server too, unless
    ``--insecure-no-auth``; ``runtime.auth.CredentialError`` when it is not configured), then readiness false,
    ``--prestop-seconds`` still answering, requests in flight finish, exit code 0; a step in
    progress is abandoned (the transfer drives it again, on this agent after its restart or
    on the rollout's retry)."""
    from runtime import auth
    from runtime.web.stop import serve_forever
    from runtime.web.wsgi import WebServer

    guard = auth.control_guard("cube-agent", args.insecure_no_auth)
    control = auth.control_client("cube-agent", args.insecure_no_auth)
    import logging

    if not args.version_root:
        logging.getLogger(__name__).warning(
            "cube agent: no --version-root: any http(s) or object-store URL with its published md5 is downloaded")
    agent = Agent(args.server_http, args.work_dir, load_timeout_s=args.load_timeout_seconds, control=control,
                  version_roots=tuple(args.version_root or ()))
    server = WebServer(create_app(agent, guard), args.host, args.port, threads=8, name="cube-agent")
    return serve_forever(server, on_stop=agent.shutdown, prestop_s=args.prestop_seconds, port_file=args.port_file,
                         port_name="agent")
