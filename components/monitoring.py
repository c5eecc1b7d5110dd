"""Monitoring: how a cluster's Prometheus finds every role's metrics, the SLO alerts and the
Grafana dashboards (stack keys in ``infra/config_monitoring.py``).

Every component lists the roles it runs as ``ScrapeTarget``s (``scrape_target``: a role
spec's ``metrics`` endpoint, ``runtime.role_specs``, and the labels that select its
Service or pods). With ``monitoring: prometheus-operator`` this component declares, in
the stack's namespace (type token ``elastic-ctr:index:Monitoring``):

* a ServiceMonitor per role behind a Service (``<name>-<job>``) (file server, cube server and cube agent,
  the transfer, serving) and a PodMonitor per training task (pserver, trainer: Volcano's
  pods have no Service of ours), ``monitoring.coreos.com/v1``, each endpoint relabelled
  with ``job`` = the role spec's name, so the rules and dashboards read the same ``job``
  as on one machine (``runtime.local.targets``);
* a PrometheusRule with the recording rules and SLO alerts (``runtime.metrics.rules``);

and, with ``grafanaDashboards``, one ConfigMap per dashboard (``monitoring/dashboards``)
labelled ``grafana_dashboard: "1"`` for Grafana's dashboard sidecar, with every mode.
``monitoring: annotations`` puts ``prometheus.io/*`` scrape annotations on the pod
templates instead (``components.common.scrape_annotations``); the objects' schemas are
checked against the operator's CRDs offline (tests/infra/test_validate.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from runtime.metrics import dashboards, rules
from runtime.role_specs import RoleSpec

API_VERSION = "monitoring.coreos.com/v1"
#: the label Grafana's sidecar (k8s-sidecar, the Grafana Helm chart's default) watches
DASHBOARD_LABEL = "grafana_dashboard"
#: the annotation the Grafana chart's sidecar reads the folder of a dashboard from
FOLDER_ANNOTATION = "grafana_folder"
SCRAPE_INTERVAL = "30s"


@dataclass(frozen=True)
class ScrapeTarget:
    """One role to scrape: ``job`` (the role spec's name), its metrics ``port`` (a port
    name of its Service or pod) and ``path``, ``kind`` (``service``: a ServiceMonitor
    selects its Service; ``pod``: a PodMonitor selects its pods) and ``selector`` (the
    matchLabels)."""

    job: str
    port: str
    path: str
    kind: str
    selector: Mapping[str, str]


def scrape_target(spec: RoleSpec, selector: Mapping[str, str], kind: str = "service") -> ScrapeTarget:
    """The ``ScrapeTarget`` of role ``spec`` (its ``metrics`` endpoint). Raises
    ``ValueError`` for a spec without metrics or another ``kind``."""
    if spec.metrics is None:
        raise ValueError(f"{spec.name}: the role spec has no metrics endpoint")
    if kind not in ("service", "pod"):
        raise ValueError(f"scrape target kind {kind!r}: service or pod")
    return ScrapeTarget(spec.name, spec.metrics.port, spec.metrics.path, kind, dict(selector))


@dataclass(frozen=True)
class MonitoringArgs:
    """Inputs of :class:`Monitoring`.

    Attributes:
        deployment: namespace, instance.
        mode: ``none`` | ``annotations`` | ``prometheus-operator`` (stack key ``monitoring``).
        targets: every role's ``ScrapeTarget`` (the components' ``scrape_targets``).
        labels: extra labels of the monitors and the rule (a Prometheus' selectors).
        thresholds: the alerts' thresholds; runbook_url: the runbooks' page.
        dashboards: declare the dashboards' ConfigMaps.
    """

    deployment: DeployContext
    mode: str
    targets: Sequence[ScrapeTarget] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    thresholds: rules.Thresholds = field(default_factory=rules.Thresholds)
    runbook_url: str = rules.RUNBOOK_PAGE
    dashboards: bool = True


class Monitoring(pulumi.ComponentResource):
    """The monitors, the rule and the dashboards (module docstring). Outputs: ``monitors``
    (the ServiceMonitor and PodMonitor names), ``rule`` (the PrometheusRule's name or
    None), ``dashboards`` (the ConfigMaps' names)."""

    monitors: pulumi.Output[list]
    rule: pulumi.Output[Optional[str]]
    dashboards: pulumi.Output[list]

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:Monitoring", name, None, opts)
        dep = args.deployment
        monitors, rule = [], None
        if args.mode == "prometheus-operator":
            for t in args.targets:
                monitors.append(self._monitor(dep, f"{name}-{t.job}", t, args.labels))
            rule_name = f"{name}-rules"
            k8s.apiextensions.CustomResource(
                rule_name, api_version=API_VERSION, kind="PrometheusRule",
                metadata=common.metadata(dep, rule_name, {**common.labels(dep, rule_name, "monitoring"),
                                                           **args.labels}),
                spec={"groups": rules.rule_groups(args.thresholds, args.runbook_url)},
                opts=common.child(self))
            rule = rule_name
        boards = []
        if args.dashboards:
            for uid, data in dashboards.configmap_data().items():
                cm = f"grafana-dashboard-{uid}"
                k8s.core.v1.ConfigMap(
                    cm, metadata=common.metadata(dep, cm, {**common.labels(dep, cm, "monitoring"),
                                                           DASHBOARD_LABEL: "1"},
                                                 annotations={FOLDER_ANNOTATION: common.PART_OF}),
                    data=data, opts=common.child(self))
                boards.append(cm)
        self.monitors = pulumi.Output.from_input(monitors)
        self.rule = pulumi.Output.from_input(rule)
        self.dashboards = pulumi.Output.from_input(boards)
        self.register_outputs({"monitors": self.monitors, "rule": self.rule, "dashboards": self.dashboards})

    def _monitor(self, dep: DeployContext, name: str, t: ScrapeTarget, extra: Mapping[str, str]) -> str:
        """A ServiceMonitor (``service``) or PodMonitor (``pod``) ``name`` for ``t``."""
        endpoint = {"port": t.port, "path": t.path, "interval": SCRAPE_INTERVAL,
                    "relabelings": [{"action": "replace", "targetLabel": "job", "replacement": t.job}]}
        kind, key = (("ServiceMonitor", "endpoints") if t.kind == "service" else ("PodMonitor", "podMetricsEndpoints"))
        k8s.apiextensions.CustomResource(
            name, api_version=API_VERSION, kind=kind,
            metadata=common.metadata(dep, name, {**common.labels(dep, name, "monitoring"), **extra}),
            spec={"selector": {"matchLabels": dict(t.selector)}, key: [endpoint]},
            opts=common.child(self))
        return name
