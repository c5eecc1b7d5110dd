"""Every rendered manifest passes kubernetes-validate (strict, pinned Kubernetes version);
the Volcano Job passes the CRD's openAPIV3Schema (vendored: tests/infra/schemas/) with
unknown fields refused."""
from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helpers import K8S_VERSION

VOLCANO_JOB_CRD = Path(__file__).resolve().parent / "schemas" / "batch.volcano.sh_jobs.yaml"

STACKS = [
    ("dev",),
    ("prod",),
    ("dev", "servingReplicas=3", "servingMaxReplicas=10", "exposeFileServer=true",
     "storageClass=fast-ssd", "trainingSharedStorageClass=nfs-client", "trainingSharedSize=50Gi",
     "dataFormat=slot", "slotFile=/data/slots.txt",
     "dataSource=/data/train/*", "dataTestSource=/data/test/*"),
    # data and versions on an object store, a workload identity: no file server
    ("dev", "modelRoot=s3://ctr-bucket/model", "storageEndpointUrl=http://minio.storage:9000",
     "storageServiceAccountAnnotations=eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/ctr",
     "dataSource=s3://ctr-bucket/hours", "trainingMode=continuous", "dataStartHour=20261120/00"),
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


@pytest.mark.parametrize("args", STACKS, ids=lambda a: " ".join(a))
def test_every_kubernetes_manifest_is_valid_strict(rendered, args):
    r = rendered(*args)
    checked = 0
    for m in r.manifests:
        if m.kind == "Job" and m.body["apiVersion"].startswith("batch.volcano.sh/"):
            # the Job's pod templates are core objects: validate them as PodTemplates
            for task in m.body["spec"]["tasks"]:
                k8s_validate({"apiVersion": "v1", "kind": "PodTemplate",
                              "metadata": {"name": task["name"], "namespace": "x"},
                              "template": task["template"]})
            continue
        k8s_validate(m.body)
        checked += 1
    assert checked == len(r.manifests) - 1


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
