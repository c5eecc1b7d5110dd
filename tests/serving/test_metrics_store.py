"""Serving's metrics are aggregated over its workers through prometheus_client's
multiprocess store, which prometheus_client picks when it is first imported: the
supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` in ``runtime.serving.launcher.main``, so
nothing the serve command imports before that may import prometheus_client."""
from __future__ import annotations

import subprocess
import sys


def test_the_serve_command_imports_prometheus_client_only_after_setting_its_store():
    code = ("import sys, runtime.cli, runtime.serving.cli, runtime.serving.launcher, runtime.metrics.serving; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prometheus_client'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"imported before PROMETHEUS_MULTIPROC_DIR is set: {out}"


def test_a_worker_records_into_the_store_and_the_supervisor_reads_it(tmp_path):
    code = f"""
import os
os.environ["PROMETHEUS_MULTIPROC_DIR"] = {str(tmp_path)!r}
from runtime.metrics.serving import ServingMetrics
m = ServingMetrics()
m.requests.labels("infer", "200").inc(3)
body, _ = ServingMetrics().exposition()
print(body.decode())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert 'elastic_ctr_serving_requests_total{code="200",endpoint="infer"} 3.0' in out, out
    assert "_created" not in out
    assert any(p.name.startswith("counter_") for p in tmp_path.iterdir())
