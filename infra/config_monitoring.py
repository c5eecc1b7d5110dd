"""Stack keys for monitoring: how Prometheus finds the roles' metrics
(``monitoring``: none, scrape annotations, or the Prometheus Operator's ServiceMonitors,
PodMonitors and PrometheusRule), the SLO thresholds of the alerts
(``runtime.metrics.rules.Thresholds``), the Grafana dashboards, and serving's
autoscaler metric (CPU, or in-flight requests per pod through the Prometheus adapter).

``MonitoringKeys`` is a base of ``infra.config.StackConfig`` (its keys are stack keys like
any other: ``Pulumi.yaml`` declares them, ``infra.config_load.parse`` validates them, and
``problems(raw)`` adds the rules across keys).
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Mapping
from urllib.parse import urlparse

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config_types import check as _check, pulumi_bool as _pulumi_bool
from runtime.metrics.rules import RUNBOOK_PAGE, Thresholds

PROJECT = "elastic-ctr"
MODES = ("none", "annotations", "prometheus-operator")
AUTOSCALE_METRICS = ("cpu", "inflight")
_LABEL = re.compile(r"([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?=[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")

Labels = Annotated[str, _check(lambda v: all(_LABEL.fullmatch(p.strip()) for p in v.split(",") if p.strip()),
                               "empty or comma-separated key=value labels, e.g. release=kube-prometheus-stack")]


def _absolute_url(value: str) -> bool:
    """True for an absolute http(s) URL with a host, no fragment and no space."""
    url = urlparse(value)
    return url.scheme in ("http", "https") and bool(url.hostname) and not url.fragment and " " not in value


def _between(lo: float, hi: float, what: str):
    def num(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:g}"

    return _check(lambda v: lo <= v <= hi, f"{what} from {num(lo)} to {num(hi)}")


class MonitoringKeys(BaseModel):
    """The monitoring keys of the stack (camelCase in Pulumi)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    monitoring: Annotated[str, _check(lambda v: v in MODES, " | ".join(MODES))] = Field(
        "annotations", description="How Prometheus finds every role's /metrics: none; annotations (prometheus.io/"
                                   "scrape, port, path on each pod template; one port per pod, so the cube pods' "
                                   "agents are not scraped); prometheus-operator (a ServiceMonitor or PodMonitor per "
                                   "role and a PrometheusRule with the SLO alerts; needs the operator's CRDs).",
        json_schema_extra={"group": "monitoring"})
    monitoring_labels: Labels = Field(
        "", description="Labels added to the ServiceMonitors, PodMonitors and the PrometheusRule so the cluster's "
                        "Prometheus selects them, comma-separated key=value (e.g. release=kube-prometheus-stack).")
    monitoring_runbook_url: Annotated[str, _check(_absolute_url, "an absolute http(s) URL without a fragment, "
                                                                 "e.g. https://docs.example.com/monitoring.html")] = Field(
        RUNBOOK_PAGE, description="The page of the alerts' runbooks, as an absolute URL (each alert's runbook_url "
                                  "is <it>#<anchor>, which Alertmanager and Grafana open): the published docs site's "
                                  "monitoring page, or a copy of it on a site of your own.")
    grafana_dashboards: Annotated[bool, BeforeValidator(_pulumi_bool)] = Field(
        True, description="Ship the Grafana dashboards (pipeline overview, serving, cube, training) as ConfigMaps "
                          "labelled grafana_dashboard: \"1\" for Grafana's dashboard sidecar.")
    freshness_slo_seconds: Annotated[int, _between(60, 30 * 86400, "seconds")] = Field(
        int(Thresholds().freshness_slo_s), description="Freshness SLO: the alert fires when the served version's data "
                                                       "(the end of its last partition) is older (60 s to 30 days).")
    rollout_max_seconds: Annotated[int, _between(60, 86400, "seconds")] = Field(
        int(Thresholds().rollout_max_s), description="Longer than any rollout: a replica on another version than its "
                                                     "shard's others, or a version held, for longer alerts.")
    serving_error_ratio: Annotated[float, _between(0.0001, 0.5, "a ratio")] = Field(
        Thresholds().error_ratio, description="Serving's 5xx share of inference answers (5 minutes) that alerts.")
    serving_p99_ms: Annotated[int, _between(1, 60000, "milliseconds")] = Field(
        int(Thresholds().p99_s * 1000), description="Serving's inference p99 latency (5 minutes) that alerts, ms.")
    serving_unavailable_per_second: Annotated[float, _between(0.01, 100000, "answers per second")] = Field(
        Thresholds().unavailable_per_s, description="Serving's 503 answers per second, sustained, that alert.")
    trainer_stall_seconds: Annotated[int, _between(300, 7 * 86400, "seconds")] = Field(
        int(Thresholds().trainer_stall_s), description="No partition trained for this long while partitions wait "
                                                       "alerts.")
    serving_autoscale_metric: Annotated[str, _check(lambda v: v in AUTOSCALE_METRICS, " | ".join(AUTOSCALE_METRICS))] = Field(
        "cpu", description="What serving's autoscaler follows (with servingMaxReplicas): cpu (utilization of the "
                           "request) or inflight (in-flight inference requests per pod, "
                           "elastic_ctr_serving_inflight_requests, a pods metric served by the Prometheus adapter; "
                           "docs/monitoring.md).")
    serving_target_inflight: Annotated[int, _between(1, 10000, "requests")] = Field(
        8, description="servingAutoscaleMetric inflight: the in-flight requests per pod the autoscaler aims at.")

    def thresholds(self) -> Thresholds:
        """The alerts' thresholds of this stack."""
        return Thresholds(freshness_slo_s=self.freshness_slo_seconds, rollout_max_s=self.rollout_max_seconds,
                          error_ratio=self.serving_error_ratio, p99_s=self.serving_p99_ms / 1000,
                          unavailable_per_s=self.serving_unavailable_per_second,
                          trainer_stall_s=self.trainer_stall_seconds)


def problems(raw: Mapping[str, Any]) -> list[str]:
    """The rules across the monitoring keys and serving's, one message per problem."""
    out = []
    if raw.get("servingAutoscaleMetric") == "inflight":
        if str(raw.get("monitoring", "annotations")) == "none":
            out.append(f"{PROJECT}:servingAutoscaleMetric: 'inflight' is invalid; allowed: cpu when monitoring is "
                       "none (the adapter reads the metric from a Prometheus that scrapes serving)")
        if str(raw.get("servingMaxReplicas", "0")) in ("0", ""):
            out.append(f"{PROJECT}:servingAutoscaleMetric: 'inflight' is invalid; allowed: cpu when "
                       "servingMaxReplicas is 0 (no autoscaler)")
    return out


def labels(text: str) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` -> ``{"k1": "v1", "k2": "v2"}`` (empty text -> ``{}``)."""
    return dict(p.strip().split("=", 1) for p in text.split(",") if p.strip())
