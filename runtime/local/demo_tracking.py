"""Tracking in the online demo (``elastic-ctr local``, ``make demo``): a real ``mlflow
server`` under ``<run dir>/mlflow/`` (``runtime.local.mlflow_server``) that the training
job logs to (``train --tracking-uri``), the demo's own figures added to the job's run, the
chart (``runtime.local.plot``), and the server left browsable after the demo until Ctrl-C
when the demo runs from a terminal (``--no-wait``, or no terminal on stdin: stopped at
once, as the tests do; ``--no-tracking``: none of it).

The demo's figures in the job's run (``runtime.tracking`` names; step = the partition
index from the start hour, as the job's): ``served_auc_next`` at the scored hour's step
(beside the trainer's ``auc_before`` of that hour), ``base_alone_auc`` and
``true_logit_auc`` at the same step. Rollouts are the transfer's run's (a child of the
job's run: the demo names the job to the transfer, ``$ELASTIC_CTR_JOB``).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

from runtime.local.mlflow_server import MlflowServer


def add_arguments(p) -> None:
    """``--no-tracking`` and ``--no-wait``."""
    p.add_argument("--no-tracking", action="store_true",
                   help="online: no MLflow server, no tracking (the chart is still written)")
    p.add_argument("--no-wait", action="store_true",
                   help="online: stop the MLflow server as soon as the demo is done (default, from a "
                        "terminal: it stays browsable until Ctrl-C)")


def launch(args, run_dir: Path, group) -> Optional[MlflowServer]:
    """Starts the demo's server (not waiting for it) with MLflow's basic auth, its login the
    run's ``tracking`` credential (``run_dir/credentials``, written here if not yet:
    ``runtime.auth.write_credentials``; ``$ELASTIC_CTR_CREDENTIALS_DIR`` set for the roles
    started next, which log in with it: ``runtime.tracking_login``), and sets
    ``$MLFLOW_TRACKING_URI`` for them; None with ``--no-tracking``."""
    if getattr(args, "no_tracking", False):
        return None
    from runtime import auth, tracking

    creds = auth.write_credentials(run_dir / "credentials")
    os.environ.update(auth.env_for(creds))
    server = MlflowServer(run_dir / "mlflow", group, credentials_dir=creds).launch()
    os.environ[tracking.URI_ENV] = server.url  # the roles started after this (transfer, trainers) log to it
    return server


def log_demo(server: MlflowServer, state_dir: Path, start_hour: str, versions: list[dict],
             scored_hours: list[str], base_alone: list[float], true_logit: list[float],
             minutes: int = 60) -> Optional[dict]:
    """Adds the demo's figures (module docstring) to the job's run (its id from the
    trainer's run id file under ``state_dir``); returns the run id file's record, or None
    when the job's run is unknown (the server was down: warned by the trainer). ``minutes``:
    the partitions' period (the steps count partitions, as the job's)."""
    from runtime import tracking

    rfile = tracking.RunIdFile(str(state_dir), "job")
    rec = rfile.record()
    if not rec or rec.get("uri") != server.url:
        return None
    tr = tracking.Tracker(server.url, "demo", run_id_file=rfile)
    for v, h, b, t in zip(versions, scored_hours, base_alone, true_logit):
        tr.log_metrics({"served_auc_next": v["served_auc_next"], "base_alone_auc": b, "true_logit_auc": t},
                       step=tracking.partition_step(start_hour, h, minutes))
    tr.close(timeout_s=30)
    return rec


def linger(args, group, server: Optional[MlflowServer], rec: Optional[dict], keep=()) -> None:
    """Prints the UI's and the run's addresses; when run from a terminal and without
    ``--no-wait``, stops every other role but ``keep`` (the run's Prometheus) and keeps the
    server (and ``keep``) up until Ctrl-C (or SIGTERM); then returns. (Not from a terminal,
    e.g. a test or CI: stops at once.)"""
    stay = [r for r in ([server.role] if server is not None else []) + list(keep) if r is not None]
    if server is not None:
        print(f"MLflow UI: {server.url}", flush=True)
        if rec:
            print(f"MLflow run: {server.run_url(rec['experiment_id'], rec['run_id'])} "
                  f"(charts: {server.metrics_url(rec['experiment_id'], rec['run_id'])})", flush=True)
    if not stay or getattr(args, "no_wait", False) or not sys.stdin.isatty():  # no one at a terminal to press Ctrl-C
        return
    for r in list(group.roles):
        if all(r is not k for k in stay):
            group.stop(r)
    print(f"{', '.join(r.name for r in stay)} stay(s) up for browsing; Ctrl-C stops it", flush=True)
    try:
        while all(r.proc.poll() is None for r in stay):
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping " + ", ".join(r.name for r in stay), flush=True)
