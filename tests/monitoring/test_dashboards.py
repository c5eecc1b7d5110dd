"""The Grafana dashboards (``monitoring/dashboards``): each loads, every panel has a query,
every query names metrics some role exposes (``runtime.metrics.catalog``), and the
overview shows what the issue asks of it."""
from __future__ import annotations

import json

import pytest

from runtime.metrics import catalog
from runtime.metrics import dashboards


def test_every_dashboard_loads_and_has_queries():
    files = dashboards.files()
    assert {f.name for f in files} == {"elastic-ctr-overview.json", "elastic-ctr-serving.json",
                                       "elastic-ctr-cube.json", "elastic-ctr-training.json"}
    uids = [dashboards.load(f)["uid"] for f in files]
    assert len(set(uids)) == len(uids)
    assert len(dashboards.queries()) >= 40


def test_every_query_names_metrics_that_exist():
    known = catalog.series_names()
    bad = {(q.dashboard, q.panel): catalog.unknown_metrics(q.expr, known) for q in dashboards.queries()}
    assert not {k: v for k, v in bad.items() if v}


def test_the_unknown_metric_check_can_fail():
    assert catalog.unknown_metrics('rate(elastic_ctr_cube_lookups_totl{shard="0"}[5m])') == \
        {"elastic_ctr_cube_lookups_totl"}
    assert catalog.metric_names('histogram_quantile(0.9, sum by (le, job) (rate(a_bucket{x="y"}[$__range]))) '
                                '> 1e3 and on (namespace) b') == {"a_bucket", "b"}


def test_the_overview_shows_freshness_quality_rollouts_serving_cube_training_memory():
    doc = dashboards.load(dashboards.DIR / "elastic-ctr-overview.json")
    text = json.dumps([p["targets"] for p in dashboards.panels(doc)])
    for metric in ("elastic_ctr_serving_model_data_end_timestamp_seconds", "elastic_ctr_trainer_auc",
                   "elastic_ctr_transfer_rollouts_total", "elastic_ctr_transfer_phase_seconds_sum",
                   "elastic_ctr_serving_request_seconds_bucket", "elastic_ctr_cube_misses_total",
                   "elastic_ctr_trainer_examples_total", "process_resident_memory_bytes"):
        assert metric in text, metric


def test_a_broken_dashboard_file_is_named(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"uid": "x", "title": "x", "panels": [
        {"type": "timeseries", "title": "p", "targets": [{"refId": "A"}]}]}))
    with pytest.raises(dashboards.DashboardError, match=r"x.json: panel 'p' target A: no expr"):
        dashboards.queries(tmp_path)


def test_variables_expand():
    assert dashboards.expand('rate(x{namespace=~"$namespace"}[$__rate_interval]) + y[$__range]') == \
        'rate(x{namespace=~".*"}[1m]) + y[1h]'
