"""Prometheus metrics of the pipeline's roles: one owner module per role, each defining its
metrics in a registry of its own, in Prometheus' conventions (base units in the names:
``_seconds``, ``_bytes``, ``_timestamp_seconds``; counters end in ``_total``; labels take a
bounded set of values, never a version id or a key).

Owners (docs/monitoring.md lists every metric):

* ``runtime.metrics.trainer``: the trainers (``TrainerMetrics``) and the pservers'
  exporter process (``pserver_exporter``);
* ``runtime.metrics.cube``: the cube server (``CubeServerCollector``) and agent
  (``AgentMetrics``);
* ``runtime.metrics.transfer``: the cube transfer (``TransferMetrics``);
* ``runtime.metrics.fileserver``: the file server (``FileServerMetrics``);
* ``runtime.metrics.tracking``: what any role's MLflow client did (``TrackingCollector``);
* ``runtime.metrics.serving``: serving (``ServingMetrics``, aggregated over its workers).

Every other Prometheus definition of the project lives here too: the recording rules and
SLO alerts (``runtime.metrics.rules``) and the Grafana dashboards (``runtime.metrics.dashboards``,
data files under ``monitoring/dashboards/``). ``runtime.metrics.catalog`` gathers every
family for the docs and the tests that check that every dashboard panel and alert names
metrics that exist. The Kubernetes objects that carry them are declared by
``components/monitoring.py``; the Prometheus run on one machine is ``runtime.local``'s.
"""
from __future__ import annotations

#: the prefix of every metric the project defines
NAMESPACE = "elastic_ctr"


def no_created_series() -> None:
    """No ``*_created`` series beside every counter and histogram (they double the series a
    scrape carries and no panel or alert reads them): prometheus_client's global switch,
    read when a registry is collected. Called by every exposition path rather than at this
    package's import, because importing ``prometheus_client`` fixes its value store: serving's
    supervisor must set ``PROMETHEUS_MULTIPROC_DIR`` first (``runtime.serving.launcher``)."""
    import prometheus_client

    prometheus_client.disable_created_metrics()


def exposition(registry) -> tuple[bytes, str]:
    """``(body, content type)`` of ``registry``'s text exposition (a ``/metrics`` answer)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    no_created_series()
    return generate_latest(registry), CONTENT_TYPE_LATEST


def family_names(registry) -> set[str]:
    """The names of the families ``registry`` exposes now (counters without ``_total``,
    as ``prometheus_client`` names families)."""
    return {m.name for m in registry.collect()}
