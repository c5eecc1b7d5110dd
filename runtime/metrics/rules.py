"""The pipeline's Prometheus rules: recording rules (freshness as a series, serving's rates)
and the SLO alerts, built from ``Thresholds``. The one definition of both the stack's
PrometheusRule (``components/monitoring.py``: ``spec.groups``) and the local Prometheus's
rule file (``runtime.local.prometheus_server``); ``promtool check rules`` and ``promtool test
rules`` check them (``tests/monitoring``, a unit test per alert), and docs/monitoring.md
has a runbook section per alert (its anchor is ``ALERTS[name].anchor``).

Every expression keeps the ``namespace`` label (one stack per namespace; on one machine
there is none, and the grouping is the same); the jobs are the role specs' names
(``runtime.role_specs``: ``serving``, ``cube-server``, ``cube-transfer``...), the
``job`` label the stack's ServiceMonitors and PodMonitors and the local scrape
configuration give each role.

``Thresholds`` are seconds and ratios; ``python -m runtime.metrics.rules`` writes the
rule file with the defaults (``--freshness-slo 3600`` etc. to change them).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

#: serving's inference endpoints (``runtime.serving``: REST, ``/predict``, gRPC, and the
#: requests refused by the queue limit before any endpoint ran)
INFERENCE = "infer|predict|grpc_ModelInfer|overloaded"
#: the published documentation site (mkdocs.yml's ``site_url``; .github/workflows/docs.yml)
DOCS_SITE = "https://elastic-ctr.github.io/elastic-ctr/"
#: the page whose sections are the runbooks (docs/monitoring.md, as the site publishes it): an
#: absolute URL, as Alertmanager and Grafana open an alert's ``runbook_url``
RUNBOOK_PAGE = DOCS_SITE + "monitoring.html"


@dataclass(frozen=True)
class Thresholds:
    """What the alerts compare against (seconds, ratios, requests per second).

    Attributes:
        freshness_slo_s: served data older than this (now - its data time) pages.
        rollout_max_s: a replica serving another version than its shard's others for
            longer than this (a rollout takes less) is a skew.
        error_ratio: serving's 5xx answers over all inference answers, 5 minutes.
        p99_s: serving's inference p99 latency, 5 minutes.
        unavailable_per_s: serving's 503 answers per second, sustained.
        trainer_stall_s: no partition trained for this long while partitions wait.
        for_s: how long a condition holds before most alerts fire.
        pserver_budget_rows / cube_shard_budget_keys: the sparse table's budget per
            parameter server (rows) and per cube shard (keys); 0: no budget, no alert.
    """

    freshness_slo_s: float = 3 * 3600
    rollout_max_s: float = 1800
    error_ratio: float = 0.01
    p99_s: float = 0.1
    unavailable_per_s: float = 1.0
    trainer_stall_s: float = 3600
    for_s: float = 300
    pserver_budget_rows: float = 0
    cube_shard_budget_keys: float = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or v != v or v < 0:
                raise ValueError(f"Thresholds.{f.name}: {v!r} is not a number >= 0")
        if not 0 < self.error_ratio < 1:
            raise ValueError(f"Thresholds.error_ratio: {self.error_ratio!r} is not in (0, 1)")


def duration(seconds: float) -> str:
    """A Prometheus duration (``300`` -> ``5m``, ``90`` -> ``90s``, ``7200`` -> ``2h``)."""
    s = int(round(seconds))
    for unit, n in (("h", 3600), ("m", 60)):
        if s >= n and s % n == 0:
            return f"{s // n}{unit}"
    return f"{s}s"


@dataclass(frozen=True)
class Alert:
    """One alert: ``name``, ``expr`` (PromQL), ``for_s``, ``severity`` (page | ticket),
    ``summary``/``description`` (annotation templates), ``anchor`` (its runbook section in
    ``RUNBOOK_PAGE``)."""

    name: str
    expr: str
    for_s: float
    severity: str
    summary: str
    description: str
    anchor: str

    def rule(self, runbook: str = RUNBOOK_PAGE) -> dict[str, Any]:
        """The alerting rule as Prometheus' rule files (and the PrometheusRule) hold it."""
        return {"alert": self.name, "expr": self.expr, "for": duration(self.for_s),
                "labels": {"severity": self.severity, "part_of": "elastic-ctr"},
                "annotations": {"summary": self.summary, "description": self.description,
                                "runbook_url": f"{runbook}#{self.anchor}"}}


def recording_rules() -> list[dict[str, str]]:
    """The recording rules (names ``level:metric:operations``, Prometheus' convention)."""
    inf = f'endpoint=~"{INFERENCE}"'
    return [
        {"record": "elastic_ctr:served_data_age_seconds",
         "expr": "time() - min by (namespace) (elastic_ctr_serving_model_data_end_timestamp_seconds)"},
        {"record": "elastic_ctr:serving_requests:rate5m",
         "expr": f"sum by (namespace) (rate(elastic_ctr_serving_requests_total{{{inf}}}[5m]))"},
        {"record": "elastic_ctr:serving_errors:ratio_rate5m",
         "expr": f'sum by (namespace) (rate(elastic_ctr_serving_requests_total{{{inf},code=~"5.."}}[5m])) '
                 f"/ sum by (namespace) (rate(elastic_ctr_serving_requests_total{{{inf}}}[5m]))"},
        {"record": "elastic_ctr:serving_latency_seconds:p99_5m",
         "expr": "histogram_quantile(0.99, sum by (namespace, le) "
                 f"(rate(elastic_ctr_serving_request_seconds_bucket{{{inf}}}[5m])))"},
        {"record": "elastic_ctr:cube_misses:ratio_rate5m",
         "expr": "sum by (namespace) (rate(elastic_ctr_cube_misses_total[5m])) "
                 "/ sum by (namespace) (rate(elastic_ctr_cube_keys_total[5m]))"},
    ]


def alerts(t: Optional[Thresholds] = None) -> list[Alert]:
    """Every alert, with the thresholds ``t`` (default ``Thresholds()``)."""
    t = t or Thresholds()
    inf = f'endpoint=~"{INFERENCE}"'
    stall = duration(t.trainer_stall_s)
    return [
        Alert("ElasticCtrServedDataStale",
              "time() - min by (namespace) (elastic_ctr_serving_model_data_end_timestamp_seconds) "
              f"> {t.freshness_slo_s:g}",
              0, "page", "Served model data is older than its SLO",
              "Serving in {{ $labels.namespace }} answers with a version trained through data "
              "{{ $value | humanizeDuration }} old (SLO " + duration(t.freshness_slo_s) + ").",
              "served-data-stale"),
        Alert("ElasticCtrRolloutFailed",
              'sum by (namespace) (increase(elastic_ctr_transfer_rollouts_total{status=~"failed|partial"}[15m])) > 0',
              0, "ticket", "A cube rollout failed",
              "A rollout failed or stopped part-way in {{ $labels.namespace }} in the last 15 minutes; the "
              "previous version keeps serving.", "rollout-failed"),
        Alert("ElasticCtrVersionGivenUp",
              "sum by (namespace) (increase(elastic_ctr_transfer_versions_failed_total[1h])) > 0",
              0, "page", "The transfer gave a version up",
              "A version failed its last rollout attempt in {{ $labels.namespace }}: it will not be served.",
              "version-given-up"),
        Alert("ElasticCtrVersionHeld",
              "max by (namespace) (elastic_ctr_transfer_held_versions) > 0",
              t.rollout_max_s, "ticket", "Published versions are held back",
              "{{ $value }} version(s) published in {{ $labels.namespace }} have been held from their rollout "
              "for " + duration(t.rollout_max_s) + ".", "version-held"),
        Alert("ElasticCtrCubeReplicaDown",
              'up{job="cube-server"} == 0',
              t.for_s, "page", "A cube replica does not answer",
              "Cube server {{ $labels.instance }} in {{ $labels.namespace }} has not answered its scrape for "
              + duration(t.for_s) + ".", "cube-replica-down"),
        Alert("ElasticCtrCubeVersionSkew",
              "count by (namespace, shard_num, shard) (count_values by (namespace, shard_num, shard) "
              '("version", elastic_ctr_cube_served_version)) > 1',
              t.rollout_max_s, "page", "A cube shard's replicas serve different versions",
              "Shard {{ $labels.shard }} of {{ $labels.shard_num }} in {{ $labels.namespace }} has served "
              "{{ $value }} versions at once for longer than a rollout (" + duration(t.rollout_max_s) + ").",
              "cube-version-skew"),
        Alert("ElasticCtrServingErrors",
              f'sum by (namespace) (rate(elastic_ctr_serving_requests_total{{{inf},code=~"5.."}}[5m])) '
              f"/ sum by (namespace) (rate(elastic_ctr_serving_requests_total{{{inf}}}[5m])) > {t.error_ratio:g}",
              t.for_s, "page", "Serving answers too many 5xx",
              "{{ $value | humanizePercentage }} of inference requests in {{ $labels.namespace }} got a 5xx "
              "answer (threshold " + f"{t.error_ratio:.2%}" + ").", "serving-errors"),
        Alert("ElasticCtrServingLatency",
              "histogram_quantile(0.99, sum by (namespace, le) "
              f"(rate(elastic_ctr_serving_request_seconds_bucket{{{inf}}}[5m]))) > {t.p99_s:g}",
              t.for_s, "page", "Serving's p99 latency is above its threshold",
              "Inference p99 in {{ $labels.namespace }} is {{ $value | humanizeDuration }} (threshold "
              f"{t.p99_s * 1000:g} ms).", "serving-latency"),
        Alert("ElasticCtrServingUnavailable",
              f'sum by (namespace) (rate(elastic_ctr_serving_requests_total{{code="503"}}[5m])) '
              f"> {t.unavailable_per_s:g}",
              t.for_s, "page", "Serving keeps answering 503",
              "Serving in {{ $labels.namespace }} answers {{ $value | humanize }} 503/s (overloaded, or no "
              "version or cube to answer with).", "serving-unavailable"),
        Alert("ElasticCtrTrainerStalled",
              "max by (namespace) (elastic_ctr_trainer_partitions_waiting) > 0 and on (namespace) "
              f"sum by (namespace) (increase(elastic_ctr_trainer_partitions_trained_total[{stall}])) == 0 "
              'and on (namespace) max by (namespace) (time() - process_start_time_seconds{job="trainer"}) '
              f"> {t.trainer_stall_s:g}",
              t.for_s, "page", "The trainer trains no partition while partitions wait",
              "{{ $value }} complete partition(s) wait in {{ $labels.namespace }} and none was trained in "
              + stall + ".", "trainer-stalled"),
        Alert("ElasticCtrTrackingUnreachable",
              "min by (namespace, job) (elastic_ctr_tracking_reachable) == 0",
              2 * t.for_s, "ticket", "The tracking server does not answer",
              "The {{ $labels.job }} of {{ $labels.namespace }} cannot reach its MLflow server; events are kept "
              "and retried, then dropped.", "tracking-unreachable"),
        *gate_alerts(),
        *budget_alerts(t),
    ]


#: the table's trend the budget alerts extrapolate (``predict_linear``), and how far
BUDGET_TREND, BUDGET_HORIZON_S = "6h", 86400


def budget_alerts(t: Thresholds) -> list[Alert]:
    """The table budget's alerts (``runtime.trainer.lifecycle``: the rows each parameter
    server holds, ``elastic_ctr_pserver_table_rows``, counted at every shrink point and
    base; the keys each cube shard serves, ``elastic_ctr_cube_dict_keys``): a ticket when
    the last ``BUDGET_TREND`` of the table, extrapolated ``BUDGET_HORIZON_S`` ahead, passes
    the budget, so that memory is planned before it runs out. Only for a budget set."""
    out, ahead = [], duration(BUDGET_HORIZON_S)
    for name, metric, by, budget, what in (
            ("ElasticCtrPserverTableOverBudget", "elastic_ctr_pserver_table_rows", "pserver", t.pserver_budget_rows,
             "Parameter server {{ $labels.pserver }}"),
            ("ElasticCtrCubeShardOverBudget", "elastic_ctr_cube_dict_keys", "shard", t.cube_shard_budget_keys,
             "Cube shard {{ $labels.shard }}")):
        if budget:
            out.append(Alert(
                name, f"max by (namespace, {by}) (predict_linear({metric}[{BUDGET_TREND}], {BUDGET_HORIZON_S})) "
                      f"> {budget:g}",
                t.for_s, "ticket", "The sparse table is on course to pass its budget",
                what + " of {{ $labels.namespace }} is on course to hold {{ $value | humanize }} rows in " + ahead
                + f" (budget {budget:g}).", "table-over-budget"))
    return out


#: how long a quarantined partition or a held version keeps its gate alert firing
GATE_ALERT_WINDOW = "1h"


def gate_alerts() -> list[Alert]:
    """The gates' alerts: a partition the data gate quarantined, a version the model gate
    held (``runtime.trainer.data_gate``, ``runtime.cube.transfer.model_gate``), each a
    ticket that fires at once and resolves ``GATE_ALERT_WINDOW`` after the last one: a
    refused partition is not trained on and a held version not served, so a run of them
    would otherwise show only as stale served data hours later."""
    w = GATE_ALERT_WINDOW
    return [
        Alert("ElasticCtrPartitionsQuarantined",
              f"sum by (namespace) (increase(elastic_ctr_trainer_partitions_quarantined_total[{w}])) > 0",
              0, "ticket", "The data gate quarantined partitions",
              "The data gate of {{ $labels.namespace }} quarantined {{ $value | printf \"%.0f\" }} partition(s) "
              "in the last " + w + ": they are not trained on.", "partitions-quarantined"),
        Alert("ElasticCtrModelGateHeld",
              f"sum by (namespace) (increase(elastic_ctr_transfer_versions_held_total[{w}])) > 0",
              0, "ticket", "The model gate held versions",
              "The model gate of {{ $labels.namespace }} held {{ $value | printf \"%.0f\" }} version(s) in the "
              "last " + w + ": worse than the version before them, they are not served.", "model-gate-held"),
    ]


#: every alert the rules may hold (the budget alerts with a budget set)
ALERTS: dict[str, Alert] = {a.name: a for a in alerts(Thresholds(pserver_budget_rows=1, cube_shard_budget_keys=1))}


def rule_groups(t: Optional[Thresholds] = None, runbook: str = RUNBOOK_PAGE,
                interval_s: Optional[float] = None) -> list[dict[str, Any]]:
    """The rule groups (``elastic-ctr.records``, ``elastic-ctr.alerts``): Prometheus' rule
    file's ``groups`` and a PrometheusRule's ``spec.groups``. ``interval_s``: the groups'
    evaluation interval (None: the server's)."""
    extra = {"interval": duration(interval_s)} if interval_s else {}
    return [{"name": "elastic-ctr.records", **extra, "rules": recording_rules()},
            {"name": "elastic-ctr.alerts", **extra, "rules": [a.rule(runbook) for a in alerts(t)]}]


def rule_file(t: Optional[Thresholds] = None, runbook: str = RUNBOOK_PAGE,
              interval_s: Optional[float] = None) -> str:
    """The rule file (YAML) of ``rule_groups``."""
    import yaml

    return yaml.safe_dump({"groups": rule_groups(t, runbook, interval_s)}, sort_keys=False, width=200)


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m runtime.metrics.rules [--out FILE] [--<threshold> N ...]``."""
    import argparse

    ap = argparse.ArgumentParser(description="write the pipeline's Prometheus rule file")
    ap.add_argument("--out", default="-", help="file to write (default: stdout)")
    for f in fields(Thresholds):
        ap.add_argument("--" + f.name.removesuffix("_s").replace("_", "-"), dest=f.name, type=float,
                        default=f.default, help=f"default {f.default:g}")
    a = ap.parse_args(argv)
    text = rule_file(Thresholds(**{f.name: getattr(a, f.name) for f in fields(Thresholds)}))
    if a.out == "-":
        print(text, end="")
    else:
        with open(a.out, "w") as out:
            out.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
