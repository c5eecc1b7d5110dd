"""The rendered dev stack with its data and version root in an S3 bucket, run as
containers by ``tests/containers/kube/``: ``modelRoot=s3://...``, ``dataSource`` /
``dataTestSource`` in the same bucket, ``storageEndpointUrl`` and the access keys as stack
secrets (a Secret the pods read as ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``).

Two runs. In the first the S3 server is moto's server mode started by the test on the host
at 127.77.0.1 (every pod shares the host's network, so each reaches it; an address other
than 127.0.0.1, which the harness rewrites to the pod's own address), holding the training
data and the version root. In the second it is a pod of the run (an image built by the test
from ``tests/containers/s3server.Dockerfile``: moto on the cube image), reached through its
Service's cluster DNS name, holding the version root (the trainers generate their data:
the bucket can only be made once the pod runs, and the job starts with it). Each run checks:

1. no file server is rendered or started; the training job completes, trainer 0 publishes
   its version to the bucket (donefile line, dense model, SequenceFiles);
2. the transfer reads it from the bucket, publishes the shard tars there, and every cube
   pod's agent downloads from there and serves the version;
3. both serving pods fetch the dense model from the bucket and score the test rows with
   zero failed requests, at trainer 0's test AUC;
4. every pod stopped with SIGTERM: every container exits 0.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from runtime import role_specs
from runtime import storage, storage_write
from runtime.formats import donefile
from tests.containers.kube import Cluster
from tests.containers.stack_steps import cube_versions, dict_info, forbidden_log_lines
from tests.containers.test_stack import OVERRIDES, VENV_BIN
from tests.helpers import restore_environ
from tests.s3server import S3Server

#: the pods' port (``runtime.role_specs.PORTS``)
SERVING_PORT = role_specs.PORTS["serving"]["http"]

pytestmark = [pytest.mark.containers, pytest.mark.slow]

JOB = "ctr-train"
KEY_ID, SECRET = "AKIASTACKTEST0000001", "stack-test-secret-key-1"
#: the read-write pair (writers) and the read-only pair (readers): the test store does not model
#: permissions, so both are the one key it knows
STORE_KEYS = (f"storageAccessKeyId={KEY_ID}", f"storageSecretAccessKey={SECRET}",
              f"storageReadAccessKeyId={KEY_ID}", f"storageReadSecretAccessKey={SECRET}")
#: the redacted Secret values the run fills in
SECRET_VALUES = {(secret, key): value for secret in ("object-store-credentials", "object-store-read-credentials")
                 for key, value in (("AWS_ACCESS_KEY_ID", KEY_ID), ("AWS_SECRET_ACCESS_KEY", SECRET))}


def _rendering(endpoint: str, bucket: str, tag: str):
    """The dev stack rendered with the store keys and the access keys as secrets."""
    from infra.render import Rendering, run_program, stack_config, to_manifest

    overrides = [*OVERRIDES, f"imageTag={tag}", "trackingServer=false", f"modelRoot=s3://{bucket}/model",
                 f"storageEndpointUrl={endpoint}",
                 "storageRegion=us-east-1", f"dataSource=s3://{bucket}/data/train.txt",
                 f"dataTestSource=s3://{bucket}/data/test.txt",
                 *STORE_KEYS]
    config, secrets = stack_config("dev", overrides)
    secrets |= {f"elastic-ctr:{k.split('=')[0]}" for k in STORE_KEYS}
    resources, outputs = run_program(config, secrets, "dev")
    manifests = sorted((m for m in (to_manifest(r) for r in resources) if m), key=lambda m: m.filename)
    return Rendering(stack="dev", config=config, manifests=manifests, outputs=outputs, resources=resources)


def _client_report(ip: str, rows, out: Path) -> dict:
    """``elastic-ctr client`` (host, .venv) scoring ``rows`` against the serving pod at ``ip``
    (batch 256, 2 workers): its JSON report, written to ``out``."""
    proc = subprocess.run([str(VENV_BIN / "elastic-ctr"), "client", "--url", f"http://{ip}:{SERVING_PORT}", "--data", str(rows),
                           "--format", "criteo", "--batch-size", "256", "--concurrency", "2", "--json-out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def s3_stack(engine, images, tmp_path_factory):
    work = tmp_path_factory.mktemp("stack-s3")
    with S3Server(work, host="127.77.0.1") as s3:
        env = s3.env()
        import os

        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            bucket = s3.new_bucket("ctr-stack")
            data = work / "data"
            subprocess.run([str(VENV_BIN / "elastic-ctr"), *role_specs.data_generate(str(data), rows=40000,
                                                                             test_rows=5000)],
                           check=True, capture_output=True, timeout=300)
            for name in ("train.txt", "test.txt"):
                storage_write.upload(data / name, f"s3://{bucket}/data/{name}")
            rendering = _rendering(s3.endpoint, bucket, images.tag)
            # no file server (its credentials' Secrets exist whatever the stack deploys)
            assert not [m for m in rendering.manifests if "fileserver" in m.name and m.kind != "Secret"]
            cluster = Cluster(rendering, work, engine.env, secret_values=SECRET_VALUES)
            state = {"cluster": cluster, "work": work, "bucket": bucket, "test_rows": data / "test.txt"}
            try:
                cluster.start()
                yield state
            finally:
                cluster.teardown()
        finally:
            restore_environ(saved)


@pytest.mark.timeout(1500)
def test_stack_with_data_and_versions_in_a_bucket(s3_stack):
    c: Cluster = s3_stack["cluster"]
    root = f"s3://{s3_stack['bucket']}/model"
    assert not c.live_pods("fileserver")
    job = c.workloads[JOB]
    t0 = time.monotonic()
    c.wait_for(f"Job/{JOB} Completing", lambda: job.phase in ("Completing", "Completed", "Failed"), timeout_s=700,
               every_s=1, fail_on_errors=False)
    assert job.phase in ("Completing", "Completed"), "\n".join(c.errors) + "\n" + c.status() + \
        c.logs(f"{JOB}-trainer-0")[-3000:]
    from runtime.formats.train_result import RESULT, TrainResult

    res = TrainResult.find(c.logs(f"{JOB}-trainer-0"), RESULT, source="trainer 0 log").to_dict()
    version, auc = int(res["version"]), float(res["test_auc"][-1])
    print(f"stack-s3: training completed in {time.monotonic() - t0:.0f} s, version {version}, test AUC {auc:.6f}")
    assert [r.id for r in donefile.read(root, "base")] == [version]
    assert storage.exists(storage.join(root, donefile.dense_dir(version), "model_meta.json"))
    # the transfer reads the version from the bucket and rolls it out from there
    c.wait_for(f"/dict/info version {version}", lambda: dict_info(c).get("version") == version, timeout_s=300,
               every_s=0.5)
    assert set(cube_versions(c).values()) == {version}
    tars = storage.expand(storage.join(root, f"cube/ctr_embedding/{version}/*.tar"))
    assert len(tars) == 2, tars
    agent_logs = c.logs(c.live_pods("cube-2s-shard-0")[0].name, "cube-agent")
    assert root.replace("s3://", "") in agent_logs or "s3://" in agent_logs, agent_logs[-2000:]
    # serving fetches the dense model from the bucket and answers every request
    pods = c.live_pods("serving")
    c.wait_ready([p.name for p in pods], timeout_s=300)
    for i, p in enumerate(pods):
        out = s3_stack["work"] / f"client-{i}.json"
        rep = _client_report(p.ip, s3_stack["test_rows"], out)
        print(f"stack-s3: client -> {p.name}: requests {rep['requests']}, failed {rep['failed_requests']}, "
              f"served AUC {rep['auc']:.6f} (trainer {auc:.6f}), p50 {rep['p50_ms']} ms")
        assert rep["failed_requests"] == 0 and rep["requests"] > 0, rep
        assert rep["versions"] == {str(version): rep["requests"]}, rep["versions"]
        assert abs(rep["auc"] - auc) <= 1e-4, (rep["auc"], auc)
    assert not c.errors, c.errors
    # every pod stopped with SIGTERM: exit 0, no traceback
    terms = c.shutdown(watch_readiness_s=0.05)
    for t in terms:
        print(f"stack-s3: {t.summary()}")
    bad = [t.summary() for t in terms if not t.clean]
    assert not bad, bad
    bad_logs = forbidden_log_lines(c)
    assert not bad_logs, bad_logs


# ----------------------------------------------------------------------------- the S3 server as a pod
S3_PORT = 5000


def _s3_pod_manifests(rendering, image: str):
    """A Deployment ``s3`` (moto's server, one replica) and its Service, shaped like the
    rendered serving Deployment (labels, security context, probes) so the harness runs it
    as it runs the stack's own pods."""
    import copy

    from infra.render import Manifest

    dep = copy.deepcopy(rendering.get("Deployment", "serving"))
    svc = copy.deepcopy(rendering.get("Service", "serving"))
    labels = {**dep["metadata"]["labels"], "app.kubernetes.io/name": "s3", "app.kubernetes.io/component": "storage"}
    sel = {"app.kubernetes.io/instance": labels["app.kubernetes.io/instance"], "app.kubernetes.io/name": "s3"}
    dep["metadata"].update(name="s3", labels=labels)
    dep["spec"].update(replicas=1, selector={"matchLabels": sel})
    dep["spec"]["template"]["metadata"] = {"labels": labels}
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    for k in ("lifecycle", "livenessProbe", "startupProbe", "volumeMounts", "env"):
        c.pop(k, None)
    c.update(name="s3", image=image, args=["-H", "0.0.0.0", "-p", str(S3_PORT)],
             ports=[{"containerPort": S3_PORT, "name": "http"}],
             readinessProbe={"tcpSocket": {"port": "http"}, "periodSeconds": 2, "failureThreshold": 3,
                             "timeoutSeconds": 3},
             securityContext={**c["securityContext"], "readOnlyRootFilesystem": False})
    pod.pop("volumes", None)
    svc["metadata"].update(name="s3", labels=labels)
    svc["spec"] = {"ports": [{"name": "http", "port": S3_PORT, "targetPort": "http"}], "selector": sel}
    return [Manifest("Deployment", "s3", dep), Manifest("Service", "s3", svc)]


@pytest.fixture(scope="module")
def s3_pod_stack(engine, images, tmp_path_factory):
    from infra.render import Rendering, run_program, stack_config, to_manifest

    work = tmp_path_factory.mktemp("stack-s3-pod")
    image = f"elastic-ctr-s3test:{images.tag}"
    repo = Path(__file__).resolve().parents[2]
    engine.docker("build", "-q", "--network", "host", "--build-arg", f"BASE={images.refs['cube']}", "-t", image,
                  "-f", str(repo / "tests" / "containers" / "s3server.Dockerfile"), str(repo / "requirements"),
                  timeout=600)
    bucket = "ctr-stack-pod"
    config, secrets = stack_config("dev", [*OVERRIDES, f"imageTag={images.tag}", "trackingServer=false",
                                           f"modelRoot=s3://{bucket}/model",
                                           f"storageEndpointUrl=http://s3.elastic-ctr-dev.svc.cluster.local:{S3_PORT}",
                                           *STORE_KEYS])
    secrets |= {f"elastic-ctr:{k.split('=')[0]}" for k in STORE_KEYS}
    resources, outputs = run_program(config, secrets, "dev")
    manifests = [m for m in (to_manifest(r) for r in resources) if m]
    rendering = Rendering(stack="dev", config=config, manifests=manifests, outputs=outputs, resources=resources)
    rendering.manifests = sorted(manifests + _s3_pod_manifests(rendering, image), key=lambda m: m.filename)
    cluster = Cluster(rendering, work, engine.env, secret_values=SECRET_VALUES)
    try:
        cluster.start(only=["s3"])  # the object store and its bucket exist before the stack
        s3 = cluster.live_pods("s3")[0]
        cluster.wait_ready([s3.name], timeout_s=120)
        import boto3

        endpoint = f"http://{s3.ip}:{S3_PORT}"
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        cluster.start()
        yield {"cluster": cluster, "work": work, "bucket": bucket, "endpoint": endpoint}
    finally:
        cluster.teardown()


@pytest.mark.timeout(1500)
def test_stack_with_the_s3_server_as_a_pod(s3_pod_stack, monkeypatch):
    """The same stack with the S3 server as a pod of the run (its Service's cluster DNS name
    is the stack's storageEndpointUrl) and the version root in it; training data generated
    in the trainer pods. Every version path goes through the pod: no file server."""
    from s3fs import S3FileSystem

    c: Cluster = s3_pod_stack["cluster"]
    root = f"s3://{s3_pod_stack['bucket']}/model"
    for k, v in {"AWS_ENDPOINT_URL_S3": s3_pod_stack["endpoint"], "AWS_ACCESS_KEY_ID": KEY_ID,
                 "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    S3FileSystem.clear_instance_cache()
    assert not c.live_pods("fileserver")
    job = c.workloads[JOB]
    c.wait_for(f"Job/{JOB} Completing", lambda: job.phase in ("Completing", "Completed", "Failed"), timeout_s=700,
               every_s=1, fail_on_errors=False)
    assert job.phase in ("Completing", "Completed"), c.status() + c.logs(f"{JOB}-trainer-0")[-3000:]
    from runtime.formats.train_result import RESULT, TrainResult

    res = TrainResult.find(c.logs(f"{JOB}-trainer-0"), RESULT, source="trainer 0 log").to_dict()
    version = int(res["version"])
    assert [r.id for r in donefile.read(root, "base")] == [version]
    c.wait_for(f"/dict/info version {version}", lambda: dict_info(c).get("version") == version, timeout_s=300,
               every_s=0.5)
    assert set(cube_versions(c).values()) == {version}
    assert len(storage.expand(storage.join(root, f"cube/ctr_embedding/{version}/*.tar"))) == 2
    pods = c.live_pods("serving")
    c.wait_ready([p.name for p in pods], timeout_s=300)
    rows = s3_pod_stack["work"] / "test.txt"
    rows.write_bytes(c.volume_dir(f"{JOB}-trainer-0", "data").joinpath("test.txt").read_bytes())
    for i, p in enumerate(pods):
        out = s3_pod_stack["work"] / f"client-{i}.json"
        rep = _client_report(p.ip, rows, out)
        print(f"stack-s3-pod: client -> {p.name}: requests {rep['requests']}, failed {rep['failed_requests']}, "
              f"served AUC {rep['auc']:.6f} (trainer {float(res['test_auc'][-1]):.6f})")
        assert rep["failed_requests"] == 0 and rep["requests"] > 0, rep
        assert rep["versions"] == {str(version): rep["requests"]}, rep["versions"]
    assert not c.errors, c.errors
    terms = c.shutdown(watch_readiness_s=0.05)
    # every project role exits 0 on SIGTERM (moto's server, test infrastructure, is not checked)
    bad = [t.summary() for t in terms if not t.clean and not t.pod.startswith("s3-")]
    assert not bad, bad
