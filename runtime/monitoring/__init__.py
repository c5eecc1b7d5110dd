"""Monitoring of the pipeline with Prometheus: the alert and recording rules
(``rules``), the Grafana dashboards (``dashboards``, data files under ``monitoring/``), the
local scrape targets (``targets``), a local Prometheus run by the project (``server``) and
the chart drawn from its query API (``chart``). The metrics themselves are defined by
``runtime.metrics``; the Kubernetes objects by ``components/monitoring.py``.
"""
