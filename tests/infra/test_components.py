"""The program under Pulumi mocks: resource counts and key fields for several configs."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from infra.render import SECRET_PLACEHOLDER, dump, run_program, stack_config
from tests.helpers import flag

CONFIGS = [
    ("dev",),
    ("dev", "pservers=2", "trainers=5"),
    ("dev", "cubeShards=3", "cubeReplicas=1"),
    ("dev", "cubeShards=4", "cubeReplicas=3", "servingReplicas=3", "servingMaxReplicas=10"),
    ("prod",),
]


def kinds(r) -> Counter:
    return Counter(m.kind for m in r.manifests)


def test_dev_stack_resource_counts(rendered):
    r = rendered("dev")
    assert kinds(r) == {"Namespace": 1, "Secret": 1 + 4, "ConfigMap": 1 + 4 + 1, "PersistentVolumeClaim": 4,
                        "Service": 6, "StatefulSet": 2, "Deployment": 4,
                        "PodDisruptionBudget": 2, "Job": 1,
                        "ServiceMonitor": 5, "PodMonitor": 2, "PrometheusRule": 1,  # 4 dashboards, monitoring
                        # a credentials Secret per trust boundary, a ServiceAccount per workload (the cube
                        # layout's, each task's), the default-deny NetworkPolicy and one per pod group
                        "ServiceAccount": 7, "NetworkPolicy": 8}
    types = Counter(x["type"] for x in r.resources)
    assert types["docker:index/image:Image"] == 4
    for name in ("Images", "TrainingJob", "CubeCluster", "CubeTransfer", "FileServer", "Serving", "TrackingServer",
                 "Monitoring", "Credentials", "NetworkPolicies"):
        assert types[f"elastic-ctr:index:{name}"] == 1


@pytest.mark.parametrize("args", CONFIGS, ids=lambda a: " ".join(a))
def test_scale_fields_follow_config(rendered, args):
    r = rendered(*args)
    cfg = {k.split(":", 1)[1]: v for k, v in stack_config(args[0], args[1:])[0].items()}
    pservers, trainers = int(cfg.get("pservers", 1)), int(cfg.get("trainers", 2))
    shards, replicas = int(cfg.get("cubeShards", 2)), int(cfg.get("cubeReplicas", 2))
    ns = cfg["namespace"]

    job = r.get("Job", "ctr-train")["spec"]
    assert job["minAvailable"] == pservers + trainers
    assert [(t["name"], t["replicas"]) for t in job["tasks"]] == [
        ("pserver", pservers), ("trainer", trainers)]

    sts = r.by_kind("StatefulSet")
    gen = f"cube-{shards}s"  # the layout: its shard count in every name
    assert [s.name for s in sts] == [f"{gen}-shard-{i}" for i in range(shards)]
    for i, s in enumerate(sts):
        spec = s.body["spec"]
        assert spec["replicas"] == replicas and spec["serviceName"] == f"{gen}-shard-{i}"
        server = spec["template"]["spec"]["containers"][0]
        assert server["args"][:2] == ["cube", "server"]
        assert (flag(server["args"], "--shard"), flag(server["args"], "--shard-num")) == (str(i), str(shards))
        svc = r.get("Service", f"{gen}-shard-{i}")["spec"]
        assert svc["clusterIP"] == "None" and svc["selector"] == spec["selector"]["matchLabels"]
        assert r.get("PodDisruptionBudget", f"{gen}-shard-{i}")["spec"]["maxUnavailable"] == 1

    # the topology (ConfigMap and stack output) lists every shard x replica, in shard order
    doc = json.loads(r.get("ConfigMap", f"{gen}-topology")["data"]["topology.json"])
    assert doc == r.outputs["cubeTopology"] and doc["dict_name"] == "ctr_embedding"
    assert [s["shard"] for s in doc["shards"]] == list(range(shards))
    for s in doc["shards"]:
        assert [x["server"] for x in s["replicas"]] == [
            f"{gen}-shard-{s['shard']}-{k}.{gen}-shard-{s['shard']}.{ns}.svc.cluster.local:8900"
            for k in range(replicas)]
        assert all(x["http"].endswith(":8901") and x["agent"].endswith(":8902")
                   for x in s["replicas"])
    # transfer and serving both mount it
    for name in ("cube-transfer", "serving"):
        pod = r.get("Deployment", name)["spec"]["template"]["spec"]
        assert {"configMap": {"name": f"{gen}-topology"}, "name": "topology"} in pod["volumes"]
        assert "/etc/elastic-ctr/topology.json" in pod["containers"][0]["args"]


def test_volcano_job_contract(rendered):
    job = rendered("dev").get("Job", "ctr-train")
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1"
    spec = job["spec"]
    assert spec["schedulerName"] == "volcano" and spec["queue"] == "default"
    assert spec["plugins"] == {"env": [], "svc": []}
    assert {(p["event"], p["action"]) for p in spec["policies"]} == {
        ("PodEvicted", "RestartJob"), ("PodFailed", "RestartJob")}
    tasks = {t["name"]: t for t in spec["tasks"]}
    assert tasks["trainer"]["policies"] == [{"action": "CompleteJob", "event": "TaskCompleted"}]
    for name, role in (("pserver", "PSERVER"), ("trainer", "TRAINER")):
        c = tasks[name]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in c["env"]}
        assert env["TRAINING_ROLE"]["value"] == role and env["PADDLE_PORT"]["value"] == "8200"
        if role == "TRAINER":
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        else:  # runtime.trainer.roles: a pserver's POD_IP is its VC_PSERVER_HOSTS entry
            assert "POD_IP" not in env
        assert c["args"][0] == "train" and "--output" in c["args"]
        assert c["resources"]["requests"] == c["resources"]["limits"]
    trainer_env = {e["name"] for e in tasks["trainer"]["template"]["spec"]["containers"][0]["env"]}
    pserver_env = {e["name"] for e in tasks["pserver"]["template"]["spec"]["containers"][0]["env"]}
    assert "ELASTIC_CTR_UPLOAD_TOKEN" in trainer_env and "ELASTIC_CTR_UPLOAD_TOKEN" not in pserver_env


@pytest.mark.parametrize("args", [("dev",), ("dev", "psMode=geo", "geoKSteps=50", "trainerCpu=2", "trainerThreads=2")],
                         ids=lambda a: " ".join(a))
def test_training_mode_threads_work_dir_and_gloo_port(rendered, args):
    """psMode/trainerThreads reach both tasks' command lines; the dataset is staged on the
    /data emptyDir; pserver 0's gloo store port is declared and named in the env."""
    r = rendered(*args)
    cfg = {k.split(":", 1)[1]: v for k, v in stack_config(args[0], args[1:])[0].items()}
    tasks = {t["name"]: t["template"]["spec"] for t in r.get("Job", "ctr-train")["spec"]["tasks"]}
    for name, pod in tasks.items():
        (c,) = pod["containers"]
        assert flag(c["args"], "--ps-mode") == cfg.get("psMode", "async"), name
        assert flag(c["args"], "--threads") == cfg.get("trainerThreads", "1"), name
        assert (flag(c["args"], "--geo-k-steps") if "--geo-k-steps" in c["args"] else None) == cfg.get("geoKSteps")
        assert flag(c["args"], "--work-dir") == "/data/work"
        assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["PADDLE_GLOO_PORT"] == "8210"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports.get("gloo") == (8210 if name == "pserver" else None), name


def test_continuous_training_job(rendered):
    """trainingMode continuous: the trainers follow dataSource's hourly partitions, keep
    their state on the shared volume, and the job tolerates many restarts."""
    r = rendered("dev", "trainingMode=continuous", "dataSource=http://files:8080/hours",
                 "dataStartHour=20261120/0010", "partitionMinutes=5", "patchEverySeconds=30",
                 "baseEveryMinutes=720")
    job = r.get("Job", "ctr-train")["spec"]
    assert job["maxRetry"] == 1000
    assert {(p["event"], p["action"]) for p in job["policies"]} == {
        ("PodEvicted", "RestartJob"), ("PodFailed", "RestartJob")}
    for t in job["tasks"]:
        (c,) = t["template"]["spec"]["containers"]
        a = c["args"]
        assert flag(a, "--mode") == "continuous" and flag(a, "--data-root") == "http://files:8080/hours"
        assert flag(a, "--start-hour") == "20261120/0010" and "--end-hour" not in a
        assert flag(a, "--state-dir") == "/shared/state"
        assert flag(a, "--partition-minutes") == "5" and flag(a, "--patch-every-seconds") == "30"
        assert flag(a, "--base-every-minutes") == "720" and flag(a, "--checkpoint-every-minutes") == "1440"
        assert "--data-train" not in a
    batch = rendered("dev").get("Job", "ctr-train")["spec"]
    assert batch["maxRetry"] == 3 and flag(batch["tasks"][1]["template"]["spec"]["containers"][0]["args"],
                                           "--mode") == "batch"


@pytest.mark.parametrize("args", [("dev",), ("prod",), ("dev", "trainingSharedStorageClass=nfs-client",
                                                         "trainingSharedSize=20Gi")],
                         ids=lambda a: " ".join(a))
def test_training_shared_volume_is_rwx_and_mounted_in_both_tasks(rendered, args):
    """The pservers save the sparse table where trainer 0 reads it: one RWX claim, mounted
    at the same path in both tasks, passed as --table-dir."""
    r = rendered(*args)
    cfg = {k.split(":", 1)[1]: v for k, v in stack_config(args[0], args[1:])[0].items()}
    pvc = r.get("PersistentVolumeClaim", "ctr-train-shared")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == cfg.get("trainingSharedSize", "5Gi")
    assert pvc["spec"].get("storageClassName") == (cfg.get("trainingSharedStorageClass") or None)
    assert pvc["metadata"]["labels"]["app.kubernetes.io/component"] == "training"
    assert pvc["metadata"]["labels"]["app.kubernetes.io/name"] == "ctr-train-shared"
    tasks = {t["name"]: t["template"]["spec"] for t in r.get("Job", "ctr-train")["spec"]["tasks"]}
    assert set(tasks) == {"pserver", "trainer"}
    for name, pod in tasks.items():
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["shared"] == {"name": "shared",
                                  "persistentVolumeClaim": {"claimName": "ctr-train-shared"}}, name
        (c,) = pod["containers"]
        assert {"name": "shared", "mountPath": "/shared"} in c["volumeMounts"], name
        assert flag(c["args"], "--table-dir") == "/shared/table", name
    # the claim is the training component's child (not in the Job spec: a new run keeps it)
    (res,) = [x for x in r.resources if x["type"] == "kubernetes:core/v1:PersistentVolumeClaim"
              and x["name"] == "ctr-train-shared"]
    assert res["parent_type"] == "elastic-ctr:index:TrainingJob"


def test_every_child_is_parented_to_its_component(rendered):
    r = rendered("dev")
    for x in r.resources:
        if x["type"] == "kubernetes:core/v1:Namespace":
            assert x["parent_type"] == "pulumi:pulumi:Stack"
        elif x["type"].startswith(("kubernetes:", "docker:", "random:")):
            assert x["parent_type"].startswith("elastic-ctr:index:"), x["urn"]
        else:
            assert x["parent_type"] == "pulumi:pulumi:Stack", x["urn"]


def test_labels_probes_resources_and_security(rendered):
    r = rendered("dev")
    required = {"app.kubernetes.io/name", "app.kubernetes.io/instance",
                "app.kubernetes.io/component", "app.kubernetes.io/part-of",
                "app.kubernetes.io/managed-by"}
    for m in r.manifests:
        labels = m.body["metadata"]["labels"]
        assert required <= set(labels), m.filename
        assert labels["app.kubernetes.io/part-of"] == "elastic-ctr"
        assert labels["app.kubernetes.io/managed-by"] == "pulumi"
        assert labels["app.kubernetes.io/instance"] == "elastic-ctr-dev"
    pods = [(m.filename, m.body["spec"]["template"]["spec"])
            for m in r.manifests if m.kind in ("StatefulSet", "Deployment")]
    pods += [(t["name"], t["template"]["spec"]) for t in r.get("Job", "ctr-train")["spec"]["tasks"]]
    for where, pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
            assert c["resources"]["requests"] and c["resources"]["limits"], where
            if c["name"] not in ("pserver", "trainer"):
                assert sc["readOnlyRootFilesystem"] is True, (where, c["name"])
            if c["name"] not in ("trainer", "generate-data"):
                assert "readinessProbe" in c and "livenessProbe" in c, (where, c["name"])
    serving = r.get("Deployment", "serving")["spec"]["template"]["spec"]["containers"][0]
    assert serving["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert serving["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for name in ("fileserver", "cube-transfer"):
        c = r.get("Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_serving_exposes_rest_and_grpc_on_the_ports_it_listens_on(rendered):
    r = rendered("dev")
    c = r.get("Deployment", "serving")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    args = c["args"]
    assert ports == {"http": int(args[args.index("--port") + 1]),
                     "grpc": int(args[args.index("--grpc-port") + 1])}
    svc = {p["name"]: p for p in r.get("Service", "serving")["spec"]["ports"]}
    assert {n: (p["port"], p["targetPort"]) for n, p in svc.items()} == {
        "http": (8000, "http"), "grpc": (8001, "grpc")}
    assert svc["grpc"]["appProtocol"] == "grpc"

def test_upload_token_reaches_pods_only_through_the_secret(rendered):
    r = rendered("dev")
    text = "".join(dump(m.body) for m in r.manifests)
    assert SECRET_PLACEHOLDER not in text
    assert r.get("Secret", "fileserver-upload-token")["stringData"] == {"token": "[redacted]"}
    for name in ("fileserver", "cube-transfer"):
        env = r.get("Deployment", name)["spec"]["template"]["spec"]["containers"][0]["env"]
        tok = [e for e in env if e["name"] == "ELASTIC_CTR_UPLOAD_TOKEN"]
        assert tok == [{"name": "ELASTIC_CTR_UPLOAD_TOKEN", "valueFrom": {
            "secretKeyRef": {"key": "token", "name": "fileserver-upload-token"}}}]
    # the token stays a secret Output end to end: every input holding it is marked secret
    (sec,) = [x for x in r.resources if x["type"] == "kubernetes:core/v1:Secret" and x["name"] == "fileserver-upload-token"]
    assert sec["inputs"]["stringData"]["4dabf18193072939515e22adb298388d"] == "1b47061264138c4ac30d75fd1eb44270"


def test_optional_parts(rendered):
    dev = rendered("dev")
    assert dev.by_kind("HorizontalPodAutoscaler") == []
    assert dev.get("Service", "fileserver")["spec"]["type"] == "ClusterIP"
    big = rendered("dev", "servingReplicas=3", "servingMaxReplicas=10", "exposeFileServer=true",
                   "fileServerSourceRanges=203.0.113.0/24")
    hpa = big.get("HorizontalPodAutoscaler", "serving")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 10)
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "serving"}
    assert big.get("Service", "fileserver")["spec"]["type"] == "LoadBalancer"
    assert big.get("Service", "fileserver")["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]


def test_images_pushed_only_with_a_registry(rendered):
    local = {x["name"].removeprefix("images-"): x["inputs"] for x in rendered("dev").resources
             if x["type"] == "docker:index/image:Image"}
    assert set(local) == {"trainer", "cube", "serving", "tracking"}
    for role, img in local.items():
        assert img["skipPush"] is True and img["imageName"] == f"elastic-ctr-{role}:dev"
        assert img["build"]["dockerfile"].endswith("/Dockerfile") and img["build"]["target"] == role
        assert "registry" not in img
    pushed = rendered("prod")
    imgs = {x["name"]: x["inputs"] for x in pushed.resources if x["type"] == "docker:index/image:Image"}
    assert all(i["skipPush"] is False for i in imgs.values())
    c = pushed.get("Deployment", "serving")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].startswith("registry.example.com/elastic-ctr/elastic-ctr-serving@sha256:")


def test_registry_password_becomes_an_image_pull_secret():
    config, secrets = stack_config("prod", ["registryUsername=ci-bot", "registryPassword=pw-123"])
    secrets.add("elastic-ctr:registryPassword")
    resources, _ = run_program(config, secrets, "prod")
    by = {(x["type"], x["name"]): x["inputs"] for x in resources}
    sec = by[("kubernetes:core/v1:Secret", "registry-credentials")]
    assert sec["type"] == "kubernetes.io/dockerconfigjson"
    pod = by[("kubernetes:apps/v1:Deployment", "serving")]["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    img = by[("docker:index/image:Image", "images-serving")]
    registry = img["registry"]["value"]  # the whole block is marked secret (the password)
    assert img["registry"]["4dabf18193072939515e22adb298388d"] == "1b47061264138c4ac30d75fd1eb44270"
    assert registry == {"server": "registry.example.com", "username": "ci-bot", "password": "pw-123"}
    from infra.render import to_manifest
    text = dump(to_manifest({"type": "kubernetes:core/v1:Secret", "inputs": sec}).body)
    assert "pw-123" not in text and "[redacted]" in text


def test_secrets_given_in_plain_text_are_refused():
    from infra.config import ConfigError
    config, secrets = stack_config("prod", ["registryUsername=ci-bot", "registryPassword=pw-123"])
    with pytest.raises(ConfigError, match="registryPassword: \\[value hidden\\] is stored in plain"):
        run_program(config, secrets, "prod")
