"""The stack with its data and versions on an object store (issue 18): ``modelRoot`` moves
the version root off the file server (not deployed), the pods that read or write
locations get the store's endpoint and region, and credentials reach them either from a
Secret made of Pulumi secrets (redacted in the render) or through a workload-identity
ServiceAccount with no keys."""
from __future__ import annotations

import pytest

from infra.config import ConfigError
from infra.render import REDACTED, dump, run_program, stack_config, to_manifest
from tests.helpers import flag

ROOT = "s3://ctr-bucket/model"
STORE = ("modelRoot=" + ROOT, "storageEndpointUrl=http://minio.storage:9000", "storageRegion=us-east-1",
         "dataSource=s3://ctr-bucket/hours", "trainingMode=continuous", "dataStartHour=20261120/00")
IRSA = "eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/ctr"


def _pods(r) -> dict[str, dict]:
    """name -> pod spec of every workload."""
    out = {m.name: m.body["spec"]["template"]["spec"] for m in r.manifests if m.kind in ("Deployment", "StatefulSet")}
    for task in r.get("Job", "ctr-train")["spec"]["tasks"]:
        out[f"ctr-train-{task['name']}"] = task["template"]["spec"]
    return out


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_model_root_on_a_store_deploys_no_file_server(rendered):
    r = rendered("dev", *STORE)
    assert not [m for m in r.manifests if "fileserver" in m.name]
    assert "fileServerUrl" not in r.outputs and r.outputs["modelRoot"] == ROOT
    # no upload token: the stack file sets none, the render sets no placeholder (the program
    # reads it with get_secret), no Secret holds one
    assert "elastic-ctr:uploadToken" not in stack_config("dev", STORE)[0]
    assert "elastic-ctr:uploadToken" in stack_config("dev")[0]
    assert not [m for m in r.manifests if m.kind == "Secret" and "upload-token" in m.name]
    pods = _pods(r)
    trainer = pods["ctr-train-trainer"]["containers"][0]
    assert flag(trainer["args"], "--output") == ROOT
    assert flag(trainer["args"], "--data-root") == "s3://ctr-bucket/hours"
    transfer = pods["cube-transfer"]["containers"][0]
    assert flag(transfer["args"], "--root") == ROOT
    serving = pods["serving"]["containers"][0]
    assert flag(serving["args"], "--model-root") == ROOT
    agent = pods["cube-2s-shard-0"]["containers"][1]
    assert agent["name"] == "cube-agent"
    for c in (trainer, transfer, serving, agent):
        env = _env(c)
        assert env["AWS_ENDPOINT_URL_S3"] == "http://minio.storage:9000" and env["AWS_DEFAULT_REGION"] == "us-east-1"
        assert "ELASTIC_CTR_UPLOAD_TOKEN" not in env, c["name"]  # nothing uploads through the file server
    assert not r.by_kind("ServiceAccount") and all("serviceAccountName" not in p for p in pods.values())


def test_default_stack_keeps_the_file_server_and_no_store_env(rendered):
    r = rendered("dev")
    assert r.get("Deployment", "fileserver")
    for name, pod in _pods(r).items():
        for c in pod["containers"]:
            assert not [k for k in _env(c) if k.startswith("AWS_")], (name, c["name"])


def test_keys_are_pulumi_secrets_rendered_into_a_redacted_secret():
    config, secrets = stack_config("dev", [*STORE, "storageAccessKeyId=AKIAEXAMPLEKEY1",
                                           "storageSecretAccessKey=very-secret-value-1"])
    secrets |= {"elastic-ctr:storageAccessKeyId", "elastic-ctr:storageSecretAccessKey"}
    resources, _ = run_program(config, secrets, "dev")
    manifests = [m for m in (to_manifest(x) for x in resources) if m]
    text = "".join(dump(m.body) for m in manifests)
    assert "very-secret-value-1" not in text and "AKIAEXAMPLEKEY1" not in text
    (sec,) = [m.body for m in manifests if m.kind == "Secret" and m.name == "object-store-credentials"]
    assert sec["stringData"] == {"AWS_ACCESS_KEY_ID": REDACTED, "AWS_SECRET_ACCESS_KEY": REDACTED}
    by = {m.name: m.body for m in manifests}
    serving = by["serving"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in serving["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "object-store-credentials", "key": "AWS_SECRET_ACCESS_KEY"}
    assert "value" not in env["AWS_SECRET_ACCESS_KEY"]


def test_workload_identity_is_a_service_account_with_no_keys(rendered):
    r = rendered("dev", *STORE, "storageServiceAccountAnnotations=" + IRSA)
    sa = r.get("ServiceAccount", "object-store")
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/ctr"}
    pods = _pods(r)
    for name in ("ctr-train-trainer", "cube-transfer", "serving", "cube-2s-shard-0"):
        assert pods[name]["serviceAccountName"] == "object-store", name
        for c in pods[name]["containers"]:
            assert "AWS_ACCESS_KEY_ID" not in _env(c)
    assert not [m for m in r.by_kind("Secret") if m.name == "object-store-credentials"]


@pytest.mark.parametrize("overrides, secret, message", [
    (["modelRoot=/data/model"], False, "modelRoot: '/data/model' is invalid; allowed: empty \\(the file server\\) or an "
                                       "object-store location: s3://"),
    (["storageEndpointUrl=minio:9000"], False, "storageEndpointUrl: 'minio:9000' is invalid"),
    (["storageServiceAccountAnnotations=role"], False, "storageServiceAccountAnnotations: 'role' is invalid"),
    (["storageAccessKeyId=AKIAEXAMPLEKEY1"], True, "storageAccessKeyId: \\[secret\\] is set without "
                                                  "storageSecretAccessKey"),
    (["storageAccessKeyId=AKIAEXAMPLEKEY1"], False, "storageAccessKeyId: \\[value hidden\\] is stored in plain text"),
    (["storageAccessKeyId=k", "storageSecretAccessKey=s", "storageServiceAccountAnnotations=" + IRSA], True,
     "keys or a workload identity, not both"),
])
def test_bad_storage_config_is_named(overrides, secret, message):
    config, secrets = stack_config("dev", overrides)
    if secret:
        given = {o.split("=")[0] for o in overrides}
        secrets |= {f"elastic-ctr:{k}" for k in ("storageAccessKeyId", "storageSecretAccessKey") if k in given}
    with pytest.raises(ConfigError, match=message):
        run_program(config, secrets, "dev")
