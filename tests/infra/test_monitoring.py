"""The stack's monitoring (``components/monitoring.py``, stack keys in
``infra/config_monitoring.py``): every ServiceMonitor selects Services that have its
endpoint's port, every PodMonitor selects the training task whose containers have it, each
relabels ``job`` to its role spec's name; the PrometheusRule holds the stack's thresholds;
the dashboards' ConfigMaps carry Grafana's sidecar label; ``monitoring: annotations`` and
``none``; serving's autoscaler on in-flight requests; the keys' validation."""
from __future__ import annotations

import json

import pytest

from infra import config, config_load
from runtime import role_specs
from runtime.metrics import dashboards, rules


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("stack", [("dev",), ("prod",), ("dev", "cubeShards=3")])
def test_every_monitor_selects_its_role_and_port(rendered, stack):
    r = rendered(*stack)
    jobs = set()
    for sm in r.by_kind("ServiceMonitor"):
        sel = sm.body["spec"]["selector"]["matchLabels"]
        (ep,) = sm.body["spec"]["endpoints"]
        services = [s.body for s in r.by_kind("Service") if _matches(sel, s.body["metadata"]["labels"])]
        assert services, sm.name
        for svc in services:
            assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}, (sm.name, svc["metadata"]["name"])
        (relabel,) = ep["relabelings"]
        jobs.add(relabel["replacement"])
    for pm in r.by_kind("PodMonitor"):
        sel = pm.body["spec"]["selector"]["matchLabels"]
        (ep,) = pm.body["spec"]["podMetricsEndpoints"]
        (job,) = r.by_kind("Job")
        tasks = [t for t in job.body["spec"]["tasks"] if _matches(sel, t["template"]["metadata"]["labels"])]
        assert [t["name"] for t in tasks] == [sel["elastic-ctr.io/task"]]
        (c,) = tasks[0]["template"]["spec"]["containers"]
        assert ep["port"] in {p["name"] for p in c["ports"]}
        jobs.add(ep["relabelings"][0]["replacement"])
    assert jobs == {"fileserver", "cube-server", "cube-agent", "cube-transfer", "serving", "pserver", "trainer"}


def test_the_rule_holds_the_stacks_thresholds(rendered):
    (dev,) = rendered("dev").by_kind("PrometheusRule")
    assert dev.body["spec"]["groups"] == rules.rule_groups()
    (prod,) = rendered("prod").by_kind("PrometheusRule")
    assert prod.body["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    stale = next(x for g in prod.body["spec"]["groups"] for x in g["rules"] if x.get("alert") == "ElasticCtrServedDataStale")
    assert stale["expr"].endswith("> 7200")
    assert rendered("dev", "servingP99Ms=250").get("PrometheusRule", "monitoring-rules") != dev.body


def test_dashboards_are_configmaps_for_grafanas_sidecar(rendered):
    r = rendered("dev")
    cms = [m for m in r.by_kind("ConfigMap") if m.body["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert {m.name for m in cms} == {f"grafana-dashboard-{d}" for d in dashboards.configmap_data()}
    for m in cms:
        (text,) = m.body["data"].values()
        assert json.loads(text)["panels"]
    assert not [m for m in rendered("dev", "grafanaDashboards=false").by_kind("ConfigMap")
                if "grafana_dashboard" in m.body["metadata"]["labels"]]


def _templates(r):
    for kind in ("Deployment", "StatefulSet"):
        for m in r.by_kind(kind):
            yield m.name, m.body["spec"]["template"]
    for task in r.by_kind("Job")[0].body["spec"]["tasks"]:
        yield task["name"], task["template"]


def test_annotations_mode_annotates_every_pod_with_its_metrics_port(rendered):
    r = rendered("dev", "monitoring=annotations")
    assert not r.by_kind("ServiceMonitor") and not r.by_kind("PodMonitor") and not r.by_kind("PrometheusRule")
    annotated = {}
    for name, t in _templates(r):
        a = t["metadata"].get("annotations") or {}
        if "prometheus.io/scrape" not in a:
            continue
        ports = {p["name"]: p["containerPort"] for c in t["spec"]["containers"] for p in c.get("ports", [])}
        assert int(a["prometheus.io/port"]) in ports.values() and a["prometheus.io/path"] == role_specs.METRICS_PATH
        annotated[name] = int(a["prometheus.io/port"])
    assert annotated["serving"] == 8000 and annotated["cube-2s-shard-0"] == 8901 and annotated["trainer"] == 8220
    assert set(annotated) == {"fileserver", "cube-transfer", "serving", "cube-2s-shard-0", "cube-2s-shard-1",
                              "pserver", "trainer"}  # not the tracking server (no metrics)
    none = rendered("dev", "monitoring=none")
    assert not any("prometheus.io/scrape" in (t["metadata"].get("annotations") or {}) for _, t in _templates(none))
    assert not none.by_kind("ServiceMonitor")


def test_the_autoscaler_follows_inflight_requests_or_cpu(rendered):
    (hpa,) = rendered("prod").by_kind("HorizontalPodAutoscaler")
    (metric,) = hpa.body["spec"]["metrics"]
    assert metric == {"type": "Pods", "pods": {"metric": {"name": "elastic_ctr_serving_inflight_requests"},
                                                "target": {"type": "AverageValue", "averageValue": "16"}}}
    (hpa,) = rendered("prod", "servingAutoscaleMetric=cpu").by_kind("HorizontalPodAutoscaler")
    assert hpa.body["spec"]["metrics"][0]["resource"]["name"] == "cpu"


@pytest.mark.parametrize("raw,message", [
    ({"monitoring": "prometheus"}, "monitoring: 'prometheus' is invalid; allowed: none | annotations | prometheus-operator"),
    ({"servingAutoscaleMetric": "inflight"}, "servingAutoscaleMetric: 'inflight' is invalid; allowed: cpu when "
                                             "servingMaxReplicas is 0"),
    ({"servingAutoscaleMetric": "inflight", "servingMaxReplicas": "6", "monitoring": "none"},
     "allowed: cpu when monitoring is none"),
    ({"freshnessSloSeconds": "10"}, "freshnessSloSeconds: 10 is invalid; allowed: seconds from 60 to 2592000"),
    ({"servingErrorRatio": "2"}, "servingErrorRatio: 2 is invalid; allowed: a ratio from 0.0001 to 0.5"),
    ({"monitoringLabels": "release"}, "monitoringLabels: 'release' is invalid"),
])
def test_bad_monitoring_keys_are_named(raw, message):
    with pytest.raises(config.ConfigError) as e:
        config_load.parse({"uploadToken": "x" * 32, **raw}, {"uploadToken"})
    assert message in str(e.value)
