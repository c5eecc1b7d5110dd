"""Every rendered manifest passes kubernetes-validate (strict, pinned Kubernetes version);
the Volcano Job and the Prometheus Operator's ServiceMonitors, PodMonitors and
PrometheusRule pass their CRDs' openAPIV3Schema (vendored: tests/infra/schemas/) with
unknown fields refused."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helpers import K8S_VERSION

SCHEMAS = Path(__file__).resolve().parent / "schemas"
VOLCANO_JOB_CRD = SCHEMAS / "batch.volcano.sh_jobs.yaml"
#: the Prometheus Operator's kinds -> their vendored CRD
MONITORING_CRDS = {"ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
                   "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
                   "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml"}

STACKS = [
    ("dev",),
    ("prod",),
    ("dev", "servingReplicas=3", "servingMaxReplicas=10", "exposeFileServer=true", "fileServerSourceRanges=203.0.113.0/24",
     "storageClass=fast-ssd", "trainingSharedStorageClass=nfs-client", "trainingSharedSize=50Gi",
     "dataFormat=slot", "slotFile=/data/slots.txt",
     "dataSource=/data/train/*", "dataTestSource=/data/test/*"),
    # data and versions on an object store, a workload identity: no file server
    ("dev", "modelRoot=s3://ctr-bucket/model", "storageEndpointUrl=http://minio.storage:9000",
     "storageServiceAccountAnnotations=eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/ctr",
     "storageReadServiceAccountAnnotations=eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/ctr-read",
     "dataSource=s3://ctr-bucket/hours", "trainingMode=continuous", "dataStartHour=20261120/00"),
    # scrape annotations instead of the operator's objects; the autoscaler on in-flight requests
    ("dev", "monitoring=annotations", "servingMaxReplicas=6", "servingAutoscaleMetric=inflight"),
]


def k8s_validate(body: dict) -> None:
    """Raises kubernetes_validate.ValidationError on any schema violation (strict mode:
    unknown fields are errors)."""
    kubernetes_validate.validate(body, K8S_VERSION, strict=True)


def closed(schema):
    """The schema with ``additionalProperties: false`` added to every object schema that
    lists ``properties`` and says nothing about extra ones (free-form objects such as
    ``metadata`` or preserve-unknown-fields stay open)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def volcano_job_schema():
    crd = yaml.safe_load(VOLCANO_JOB_CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return closed(version["schema"]["openAPIV3Schema"])


def python_patterns(node):
    """``node`` with Go's ``^(?i)...`` patterns written as Python takes them (``(?i)^...``:
    Python wants a global flag first; the same language otherwise)."""
    if isinstance(node, dict):
        return {k: (re.sub(r"^\^\(\?i\)", "(?i)^", v) if k == "pattern" and isinstance(v, str)
                    else python_patterns(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [python_patterns(v) for v in node]
    return node


def crd_schema(path: Path, version: str):
    """The closed ``openAPIV3Schema`` of ``version`` in the CRD file ``path``."""
    crd = yaml.safe_load(path.read_text())
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return closed(python_patterns(v["schema"]["openAPIV3Schema"]))


@pytest.fixture(scope="module")
def monitoring_schemas():
    return {kind: crd_schema(SCHEMAS / f, "v1") for kind, f in MONITORING_CRDS.items()}


@pytest.mark.parametrize("args", STACKS, ids=lambda a: " ".join(a))
def test_every_kubernetes_manifest_is_valid_strict(rendered, args, monitoring_schemas):
    r = rendered(*args)
    checked = crds = 0
    for m in r.manifests:
        if m.kind in MONITORING_CRDS:
            assert m.body["apiVersion"] == "monitoring.coreos.com/v1"
            jsonschema.validate(m.body, monitoring_schemas[m.kind])
            crds += 1
            continue
        if m.kind == "Job" and m.body["apiVersion"].startswith("batch.volcano.sh/"):
            # the Job's pod templates are core objects: validate them as PodTemplates
            for task in m.body["spec"]["tasks"]:
                k8s_validate({"apiVersion": "v1", "kind": "PodTemplate",
                              "metadata": {"name": task["name"], "namespace": "x"},
                              "template": task["template"]})
            continue
        k8s_validate(m.body)
        checked += 1
    assert checked == len(r.manifests) - 1 - crds


@pytest.mark.parametrize("args", STACKS, ids=lambda a: " ".join(a))
def test_volcano_job_matches_crd_schema(rendered, args, volcano_job_schema):
    job = rendered(*args).get("Job", "ctr-train")
    jsonschema.validate(job, volcano_job_schema)


def test_validators_reject_what_they_should(rendered, volcano_job_schema):
    """The checks above can fail: an unknown field, a wrong type, a bad enum."""
    r = rendered("dev")
    sts = copy.deepcopy(r.get("StatefulSet", "cube-2s-shard-0"))
    sts["spec"]["replicaz"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(sts)
    svc = copy.deepcopy(r.get("Service", "serving"))
    svc["spec"]["ports"][0]["port"] = "eighty"
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(svc)

    job = r.get("Job", "ctr-train")
    for mutate in (
        lambda j: j["spec"].__setitem__("minAvalable", 3),             # unknown field
        lambda j: j["spec"]["tasks"][1]["policies"][0].__setitem__("event", "Done"),  # enum
        lambda j: j["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
        .__setitem__("imagePullPolicies", "Always"),                  # unknown, deep
        lambda j: j["spec"].__setitem__("minAvailable", -1),          # minimum
    ):
        bad = copy.deepcopy(job)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, volcano_job_schema)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_operator_objects_are_in_the_dev_and_prod_renderings(rendered, stack, monitoring_schemas):
    r = rendered(stack)
    kinds = {k: len(r.by_kind(k)) for k in MONITORING_CRDS}
    assert kinds == {"ServiceMonitor": 5, "PodMonitor": 2, "PrometheusRule": 1}
    for kind in MONITORING_CRDS:
        for m in r.by_kind(kind):
            jsonschema.validate(m.body, monitoring_schemas[kind])


def test_the_monitoring_schemas_reject_what_they_should(rendered, monitoring_schemas):
    r = rendered("dev")
    cases = [
        ("ServiceMonitor", "monitoring-serving",
         lambda b: b["spec"]["endpoints"][0].__setitem__("scrapeIntervall", "30s")),        # unknown field
        ("ServiceMonitor", "monitoring-serving",
         lambda b: b["spec"]["endpoints"][0]["relabelings"][0].__setitem__("action", "rename")),  # enum
        ("PodMonitor", "monitoring-trainer",
         lambda b: b["spec"]["podMetricsEndpoints"][0].__setitem__("port", 8220)),         # type
        ("PrometheusRule", "monitoring-rules",
         lambda b: b["spec"]["groups"][1]["rules"][0].pop("expr")),                        # required
    ]
    for kind, name, mutate in cases:
        bad = copy.deepcopy(r.get(kind, name))
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, monitoring_schemas[kind])
