"""The transfer's HTTP API and process entry point (``elastic-ctr cube transfer``).

Routes (docs/contracts.md): ``GET /dict/info`` (serving follows its ``version``),
``GET /instance/status``, ``GET /dict/deploy/history``, ``GET /metrics``; ``/healthz`` and
``/readyz`` come with ``runtime.webserver``.
"""
from __future__ import annotations

import logging
import threading

from runtime import storage
from runtime.cube.transfer.service import Transfer
from runtime.webserver import json_errors

log = logging.getLogger(__name__)


def create_app(transfer: Transfer):
    """The transfer's Flask app (routes in the module docstring)."""
    from flask import Flask, Response, jsonify
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    app = json_errors(Flask("cube-transfer"))

    @app.get("/dict/info")
    def dict_info():
        return jsonify(transfer.info().to_json())

    @app.get("/instance/status")
    def replica_status():
        return jsonify(transfer.replica_status())

    @app.get("/dict/deploy/history")
    def history():
        return jsonify(history=transfer.history())

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(transfer.metrics.registry), mimetype=CONTENT_TYPE_LATEST)

    return app


def main(args) -> int:
    """``elastic-ctr cube transfer``: polls in a thread and serves HTTP until SIGTERM; then
    readiness turns false, ``--drain-seconds`` pass still answering, the poll loop stops
    after the step in progress (its state is persisted, so an interrupted rollout resumes
    at the next start), requests in flight finish, and it returns the exit code (0)."""
    from runtime.webserver import WebServer, serve_forever

    token = storage.read_token(args.upload_token_file)
    tr = Transfer(args.topology, args.root, args.work_dir, publish_url=args.publish_url, token=token,
                  poll_interval_s=args.poll_interval, phase_timeout_s=args.phase_timeout,
                  retries=args.retries, max_rollout_attempts=args.max_rollout_attempts,
                  rollout_backoff_s=args.rollout_backoff, reconcile_interval_s=args.reconcile_interval,
                  dict_name=args.dict_name, coalesce=not args.no_coalesce)
    if args.once:
        while tr.poll_once() is not None:
            pass
        return 0
    server = WebServer(create_app(tr), args.host, args.port, threads=4, name="cube-transfer")
    loop = threading.Thread(target=tr.run, name="transfer-loop", daemon=True)
    loop.start()

    def stop_loop() -> None:
        tr.stop.set()
        loop.join(timeout=args.stop_timeout)
        if loop.is_alive():
            log.warning("the rollout in progress did not stop within %.0f s; it resumes at the next start",
                        args.stop_timeout)

    return serve_forever(server, on_stop=stop_loop, drain_s=args.drain_seconds)
