"""Prometheus in the local pipeline (``elastic-ctr local --prometheus``; ``make demo
DEMO_ARGS=--prometheus``): a Prometheus on 127.0.0.1 (``runtime.local.prometheus_server``)
scraping every role the run starts (each launcher writes its processes' targets:
``runtime.local.targets``), evaluating the stack's rules, its URL printed; at the end
the chart of the served data's age and the AUC drawn from its query API
(``runtime.local.chart``, ``<run dir>/freshness-auc.png``). Like the MLflow server, it
stays up for browsing after the demo when the demo runs from a terminal.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

from runtime.metrics.rules import Thresholds


def add_arguments(p) -> None:
    """``--prometheus`` and ``--freshness-slo``."""
    p.add_argument("--prometheus", action="store_true",
                   help="run a Prometheus on 127.0.0.1 that scrapes every role and evaluates the stack's alert rules; "
                        "its URL is printed, and an online run ends with a chart of the served data's age and the AUC "
                        "drawn from its query API (needs Debian's prometheus package: make install)")
    p.add_argument("--freshness-slo", type=float, default=Thresholds().freshness_slo_s, metavar="SECONDS",
                   help="with --prometheus: the served-data-age SLO of the freshness alert (default %(default)g)")


def launch(args, run_dir: Path, group):
    """Starts the run's Prometheus (``<run dir>/prometheus``) and points every launcher at its
    target directory (``$ELASTIC_CTR_SCRAPE_DIR``) before any role starts; waits until it is
    ready and prints its URL. Returns the ``PrometheusServer``, or None without
    ``--prometheus``. Raises ``FileNotFoundError`` (not installed), ``TimeoutError``."""
    if not getattr(args, "prometheus", False):
        return None
    from runtime.local import targets
    from runtime.local.prometheus_server import PrometheusServer

    server = PrometheusServer(run_dir / "prometheus", group, scrape_interval_s=1.0, evaluation_interval_s=1.0,
                              thresholds=Thresholds(freshness_slo_s=float(args.freshness_slo)))
    os.environ[targets.SCRAPE_DIR_ENV] = str(server.targets_dir)
    server.launch()
    server.wait_ready()
    print(f"Prometheus: {server.url} (targets {server.url}/targets, alerts {server.url}/alerts)", flush=True)
    return server


def report(server, run_dir: Path, start: float) -> Optional[Path]:
    """Draws ``<run dir>/freshness-auc.png`` from ``server``'s series since ``start`` (unix
    s) and prints where it is; returns it (None without a server)."""
    if server is None:
        return None
    from runtime.local import chart

    time.sleep(2 * server.scrape_interval_s)  # the last scrapes of the roles still running
    path = chart.write_chart(run_dir / chart.CHART, chart.fetch(server, start, time.time()),
                             slo_s=server.thresholds.freshness_slo_s, start=start)
    print(f"chart from Prometheus: {path}", flush=True)
    return path
