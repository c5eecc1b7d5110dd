"""The stack with its data and versions on an object store: ``modelRoot`` moves
the version root off the file server (not deployed), the pods that read or write
locations get the store's endpoint and region, and credentials reach them either from a
Secret made of Pulumi secrets (redacted in the render) or through workload-identity
ServiceAccounts with no keys; readers (agents, serving, pservers) and writers (trainer,
transfer) get separate keys and identities."""
from __future__ import annotations

import pytest

from infra.config import ConfigError
from infra.render import REDACTED, dump, run_program, stack_config, to_manifest
from tests.helpers import flag

ROOT = "s3://ctr-bucket/model"
STORE = ("modelRoot=" + ROOT, "storageEndpointUrl=http://minio.storage:9000", "storageRegion=us-east-1",
         "dataSource=s3://ctr-bucket/hours", "trainingMode=continuous", "dataStartHour=20261120/00")
IRSA = "eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/ctr"
IRSA_READ = "eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/ctr-read"
KEYS = ("storageAccessKeyId=AKIAEXAMPLEKEY1", "storageSecretAccessKey=very-secret-value-1",
        "storageReadAccessKeyId=AKIAEXAMPLEREAD", "storageReadSecretAccessKey=very-secret-read-value")
#: the workloads that only read, and those that write (versions, tars)
READERS, WRITERS = ("serving", "cube-2s-shard-0", "ctr-train-pserver"), ("ctr-train-trainer", "cube-transfer")


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
    # (the file-server credentials' Secrets stay: every boundary has one, tests/infra/test_security.py)
    assert not [m for m in r.manifests if "fileserver" in m.name and not m.name.startswith("credentials-")]
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
    # every workload its own identity, none with the API token or a cloud identity (no annotations set)
    for name, pod in pods.items():
        assert pod["automountServiceAccountToken"] is False, name
        sa = r.get("ServiceAccount", pod["serviceAccountName"])
        assert sa["automountServiceAccountToken"] is False and "annotations" not in sa["metadata"], name
    # the two shards' StatefulSets of the cube layout share the layout's
    assert len({p["serviceAccountName"] for p in pods.values()}) == len(pods) - 1


def test_default_stack_keeps_the_file_server_and_no_store_env(rendered):
    r = rendered("dev")
    assert r.get("Deployment", "fileserver")
    for name, pod in _pods(r).items():
        for c in pod["containers"]:
            assert not [k for k in _env(c) if k.startswith("AWS_")], (name, c["name"])


def test_keys_are_pulumi_secrets_rendered_into_redacted_secrets_readers_read_only():
    config, secrets = stack_config("dev", [*STORE, *KEYS])
    secrets |= {f"elastic-ctr:{k.split('=')[0]}" for k in KEYS}
    resources, _ = run_program(config, secrets, "dev")
    manifests = [m for m in (to_manifest(x) for x in resources) if m]
    text = "".join(dump(m.body) for m in manifests)
    for k in KEYS:
        assert k.split("=")[1] not in text
    for name in ("object-store-credentials", "object-store-read-credentials"):
        (sec,) = [m.body for m in manifests if m.kind == "Secret" and m.name == name]
        assert sec["stringData"] == {"AWS_ACCESS_KEY_ID": REDACTED, "AWS_SECRET_ACCESS_KEY": REDACTED}
    by = {m.name: m.body for m in manifests}
    pods = {n: b["spec"]["template"]["spec"] for n, b in by.items() if b["kind"] in ("Deployment", "StatefulSet")}
    for task in by["ctr-train"]["spec"]["tasks"]:
        pods[f"ctr-train-{task['name']}"] = task["template"]["spec"]
    for name, secret in [*((n, "object-store-read-credentials") for n in READERS),
                         *((n, "object-store-credentials") for n in WRITERS)]:
        (c,) = [c for c in pods[name]["containers"] if "AWS_SECRET_ACCESS_KEY" in _env(c)]
        env = {e["name"]: e for e in c["env"]}
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": secret, "key": "AWS_SECRET_ACCESS_KEY"}, name
        assert "value" not in env["AWS_SECRET_ACCESS_KEY"]


def test_workload_identity_is_a_service_account_per_workload_with_no_keys(rendered):
    r = rendered("dev", *STORE, "storageServiceAccountAnnotations=" + IRSA,
                 "storageReadServiceAccountAnnotations=" + IRSA_READ)
    pods = _pods(r)
    for names, role in ((WRITERS, "ctr"), (READERS, "ctr-read")):
        for name in names:
            sa = r.get("ServiceAccount", pods[name]["serviceAccountName"])
            assert sa["metadata"]["annotations"] == {
                "eks.amazonaws.com/role-arn": f"arn:aws:iam::123456789012:role/{role}"}, name
            for c in pods[name]["containers"]:
                assert "AWS_ACCESS_KEY_ID" not in _env(c)
    assert not [m for m in r.by_kind("Secret") if m.name.startswith("object-store")]


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
    (["storageAccessKeyId=k", "storageSecretAccessKey=s"], True,
     "storageReadAccessKeyId: \\[secret\\] is not set; allowed: set with storageReadSecretAccessKey"),
    (["storageServiceAccountAnnotations=" + IRSA], False, "storageReadServiceAccountAnnotations: '' is invalid"),
])
def test_bad_storage_config_is_named(overrides, secret, message):
    config, secrets = stack_config("dev", overrides)
    if secret:
        given = {o.split("=")[0] for o in overrides}
        secrets |= {f"elastic-ctr:{k}" for k in ("storageAccessKeyId", "storageSecretAccessKey") if k in given}
    with pytest.raises(ConfigError, match=message):
        run_program(config, secrets, "dev")
