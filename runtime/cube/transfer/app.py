"""The transfer's HTTP API and process entry point (``elastic-ctr cube transfer``).

Routes (docs/contracts.md): ``GET /dict/info`` (serving follows its ``version``),
``GET /instance/status``, ``GET /dict/deploy/history``, ``GET /metrics``; ``/healthz`` and
``/readyz`` come with ``runtime.web.wsgi``. Control (mutating) calls: ``POST /rollback``
(``runtime.cube.transfer.rollback``).
"""
from __future__ import annotations

import logging
import threading

from runtime import storage
from runtime.cube.transfer.service import Transfer
from runtime.web.wsgi import json_errors

log = logging.getLogger(__name__)


def create_app(transfer: Transfer, guard=None):
    """The transfer's Flask app (routes in the module docstring). ``guard``: a
    ``runtime.auth.Guard`` checking every ``POST`` (the ``cube-control`` credential: a
    rollback replaces what every replica serves; None: none checked)."""
    from flask import Flask, Response, jsonify, request

    from runtime.metrics import exposition

    app = json_errors(Flask("cube-transfer"))
    if guard is not None:
        guard.install(app)

    @app.get("/dict/info")
    def dict_info():
        return jsonify(transfer.info().to_json())

    @app.get("/instance/status")
    def replica_status():
        return jsonify(transfer.replica_status())

    @app.get("/dict/deploy/history")
    def history():
        return jsonify(history=transfer.history())

    # ------------------------------------------------------------ control (mutating) calls
    @app.post("/rollback")
    def rollback_view():
        """``{"version": V}`` pins V (its chain is laid out at the next poll); ``{"version":
        null}`` lifts the pin. 202 ``{"pinned", "served"}``; 400 for a bad body or a version
        whose chain is not in the donefiles."""
        from runtime.cube.transfer import rollback

        body = request.get_json(silent=True)
        if not isinstance(body, dict) or "version" not in body:
            return jsonify(error='expected a JSON object {"version": <id> or null}'), 400
        v = body["version"]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str)) or not str(v).isdigit()):
            return jsonify(error=f"version {v!r}: expected a version id (an integer) or null"), 400
        try:
            pin = rollback.set_pin(transfer, None if v is None else int(v), "api")
        except rollback.RollbackError as exc:
            return jsonify(error=str(exc)), 400
        info = transfer.info()
        return jsonify(pinned=pin.version if pin else None, served=info.version), 202

    @app.get("/metrics")
    def metrics():
        body, ctype = exposition(transfer.metrics.registry)
        return Response(body, mimetype=ctype)

    return app


def model_gate_of(args):
    """The model gate's thresholds from ``cube transfer``'s flags (``--model-gate*``)."""
    from runtime.cube.transfer.model_gate import Thresholds

    return Thresholds(auc_drop=getattr(args, "model_gate_auc_drop", 0.05),
                      logloss_ratio=getattr(args, "model_gate_logloss_ratio", 1.25),
                      calibration=getattr(args, "model_gate_calibration", 2.5),
                      enabled=getattr(args, "model_gate", "on") == "on",
                      min_rows=getattr(args, "model_gate_min_rows", 500))


def main(args) -> int:
    """``elastic-ctr cube transfer``: polls in a thread and serves HTTP until SIGTERM; then
    readiness turns false, ``--prestop-seconds`` pass still answering, the poll loop stops
    after the step in progress (its state is persisted, so an interrupted rollout resumes
    at the next start), requests in flight finish, and it returns the exit code (0)."""
    from runtime import auth
    from runtime.web.stop import serve_forever
    from runtime.web.wsgi import WebServer

    control = auth.control_client("cube-transfer", args.insecure_no_auth)
    token = storage.read_token(args.upload_token_file)
    tr = Transfer(args.topology, args.root, args.work_dir, publish_url=args.publish_url, token=token,
                  poll_interval_s=args.poll_seconds, phase_timeout_s=args.phase_timeout_seconds,
                  retries=args.retries, max_rollout_attempts=args.max_rollout_attempts,
                  rollout_backoff_s=args.rollout_backoff_seconds, reconcile_interval_s=args.reconcile_every_seconds,
                  dict_name=args.dict_name, control=control, model_gate=model_gate_of(args),
                  pin_version=args.pin_version, keep_versions=args.keep_versions, coalesce=not args.no_coalesce)
    if args.once:
        while tr.poll_once() is not None:
            pass
        return 0
    guard = auth.control_guard("cube-transfer", args.insecure_no_auth)
    server = WebServer(create_app(tr, guard), args.host, args.port, threads=4, name="cube-transfer")
    loop = threading.Thread(target=tr.run, name="transfer-loop", daemon=True)
    loop.start()

    def stop_loop() -> None:
        tr.stop.set()
        loop.join(timeout=args.grace_period_seconds)
        if loop.is_alive():
            log.warning("the rollout in progress did not stop within %.0f s; it resumes at the next start",
                        args.grace_period_seconds)

    return serve_forever(server, on_stop=stop_loop, prestop_s=args.prestop_seconds, port_file=args.port_file)
