"""The TrackingServer component and the tracking stack keys (infra/config_tracking.py): on in
the dev stack (Deployment, Service, claim; the trainers' and the transfer's
MLFLOW_TRACKING_URI), off with one key, an external server's URI, bad values named."""
from __future__ import annotations

import pytest

from infra.config import ConfigError

URI = "http://tracking.elastic-ctr-dev.svc.cluster.local:5000"


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _tasks(r) -> dict:
    job = r.get("Job", "ctr-train")["spec"]
    return {t["name"]: t["template"]["spec"]["containers"][0] for t in job["tasks"]}


def _transfer(r) -> dict:
    return r.get("Deployment", "cube-transfer")["spec"]["template"]["spec"]["containers"][0]


def test_dev_stack_deploys_the_tracking_server_and_wires_its_uri(rendered):
    r = rendered("dev")
    dep = r.get("Deployment", "tracking")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "elastic-ctr-tracking:dev" and c["args"][0] == "server"
    env = _env(c)
    assert env["MLFLOW_BACKEND_STORE_URI"] == "sqlite:////mlflow/mlflow.db"
    assert env["MLFLOW_ARTIFACTS_DESTINATION"] == "/mlflow/artifacts"
    assert "tracking.elastic-ctr-dev.svc.cluster.local:5000" in env["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert dep["metadata"]["labels"]["app.kubernetes.io/component"] == "tracking"
    (vol,) = [v for v in pod["volumes"] if v["name"] == "store"]
    assert vol["persistentVolumeClaim"]["claimName"] == "tracking"
    assert r.get("PersistentVolumeClaim", "tracking")["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert r.get("Service", "tracking")["spec"]["ports"][0]["port"] == 5000
    assert r.outputs["trackingUrl"] == URI
    tasks = _tasks(r)
    assert _env(tasks["trainer"])["MLFLOW_TRACKING_URI"] == URI
    assert _env(tasks["trainer"])["MLFLOW_EXPERIMENT_NAME"] == "elastic-ctr"
    assert "MLFLOW_TRACKING_URI" not in _env(tasks["pserver"])  # pservers never log
    assert _env(_transfer(r))["MLFLOW_TRACKING_URI"] == URI


def test_tracking_off_with_one_key(rendered):
    r = rendered("dev", "trackingServer=false")
    assert not [m for m in r.manifests if m.name == "tracking"]
    assert "trackingUrl" not in r.outputs and "tracking" not in r.outputs["images"]
    assert "MLFLOW_TRACKING_URI" not in _env(_tasks(r)["trainer"])
    assert "MLFLOW_TRACKING_URI" not in _env(_transfer(r))


def test_an_external_tracking_server(rendered):
    r = rendered("dev", "trackingServer=false", "trackingUri=http://mlflow.example.com:5000",
                 "trackingExperiment=ctr-prod")
    env = _env(_tasks(r)["trainer"])
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.example.com:5000"
    assert env["MLFLOW_EXPERIMENT_NAME"] == "ctr-prod"
    assert _env(_transfer(r))["MLFLOW_TRACKING_URI"] == "http://mlflow.example.com:5000"


@pytest.mark.parametrize("override, message", [
    ("trackingUri=mlflow:5000", "elastic-ctr:trackingUri: 'mlflow:5000' is invalid; allowed: empty or an MLflow "
                                "server's http(s)://host[:port][/path]"),
    ("trackingServer=yes", "elastic-ctr:trackingServer: 'yes' is invalid; allowed: true or false"),
    ("trackingMemory=lots", "elastic-ctr:trackingMemory: 'lots' is invalid; allowed: a Kubernetes quantity"),
])
def test_bad_tracking_keys_are_named(rendered, override, message):
    with pytest.raises(ConfigError) as exc:
        rendered("dev", override)
    assert any(e.startswith(message) for e in exc.value.errors), exc.value.errors


def test_a_database_backend_store_reaches_the_pod_only_through_a_secret():
    """With a database URI (a secret) and an artifacts destination: a Secret holds the URI,
    the container reads it by secretKeyRef (never a literal), and no claim is made."""
    import pulumi

    from components import DeployContext, TrackingServer, TrackingServerArgs
    from infra.render import run_program, to_manifest

    uri = "postgresql://mlflow:pw-1234@db.example.com:5432/mlflow"

    def program():
        TrackingServer("tracking", TrackingServerArgs(
            deployment=DeployContext(namespace="ns", instance="elastic-ctr-t"), image="img:1", cpu="500m",
            memory="1Gi", storage_size="5Gi", backend_store_uri=pulumi.Output.secret(uri),
            artifacts_destination="s3://bucket/mlflow"))
        return {}

    resources, _ = run_program({}, set(), "dev", program=program)
    manifests = {(m.kind, m.name): m.body for m in (to_manifest(r) for r in resources) if m is not None}
    assert ("PersistentVolumeClaim", "tracking") not in manifests
    assert ("Secret", "tracking-backend-store") in manifests
    (c,) = manifests[("Deployment", "tracking")]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"] == {"name": "tracking-backend-store",
                                                                            "key": "uri"}
    assert "value" not in env["MLFLOW_BACKEND_STORE_URI"]
    assert env["MLFLOW_ARTIFACTS_DESTINATION"]["value"] == "s3://bucket/mlflow"
    assert uri not in str(manifests[("Deployment", "tracking")])
    assert not [v for v in c.get("volumeMounts", []) if v["name"] == "store"]
