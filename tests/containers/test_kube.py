"""The container harness's mapping of a rendering, checked without an engine: every rendered
field of the dev stack is played or allow-listed, anything else is refused naming the
field, the one rewrite, Volcano's svc/env plugins, cluster DNS, and the docker command
line of a pod (command, args, env, volumes, user, read-only root)."""
from __future__ import annotations

import copy
import os

import pytest

from runtime import role_specs
from tests.containers.kube import Cluster, UnsupportedField, dns, env, volumes
from tests.containers.kube.containerspec import docker_run_args, rewrite_value
from tests.containers.kube.manifests import REDACTED
from tests.containers.kube.schema import IGNORED

OVERRIDES = ["pservers=1", "trainers=2", "cubeShards=2", "cubeReplicas=2", "servingReplicas=2", "epochs=1"]


@pytest.fixture(scope="module")
def rendering():
    from infra.render import render

    return render("dev", OVERRIDES)


@pytest.fixture
def cluster(rendering, tmp_path):
    return Cluster(rendering, tmp_path, {})


def bodies(rendering):
    return [copy.deepcopy(m.body) for m in rendering.manifests]


def test_every_rendered_field_is_played_or_allow_listed(cluster):
    assert {p.name.rsplit("-", 2)[0] if p.owner.kind == "Deployment" else p.name for p in cluster.live_pods()} == {
        "cube-2s-shard-0-0", "cube-2s-shard-0-1", "cube-2s-shard-1-0", "cube-2s-shard-1-1", "cube-transfer", "fileserver",
        "serving", "ctr-train-pserver-0", "ctr-train-trainer-0", "ctr-train-trainer-1", "tracking"}
    assert len(cluster.live_pods("serving")) == 2
    ips = [p.ip for p in cluster.live_pods()]
    assert len(set(ips)) == len(ips) and all(ip.startswith("127.0.0.") for ip in ips)
    for path, reason in cluster.ignored:
        assert reason in IGNORED.values(), path


@pytest.mark.parametrize("mutate,field", [
    (lambda b: b["spec"]["template"]["spec"]["volumes"].insert(0, {"name": "h", "hostPath": {"path": "/"}}),
     "volumes[0].hostPath"),
    (lambda b: b["spec"]["template"]["spec"]["containers"][0].__setitem__(
        "readinessProbe", {"udpPing": {"port": 1}}), "containers[0].readinessProbe.udpPing"),
    (lambda b: b["spec"]["template"]["spec"]["containers"][0].__setitem__(
        "lifecycle", {"preStop": {"rpc": {}}}), "lifecycle.preStop.rpc"),
    (lambda b: b["spec"]["template"]["spec"].__setitem__("hostNetwork", True), "spec.hostNetwork"),
    (lambda b: b["spec"]["template"]["spec"]["containers"][0].__setitem__("stdin", True), "containers[0].stdin"),
])
def test_an_unknown_field_is_refused_naming_it(rendering, tmp_path, mutate, field):
    docs = bodies(rendering)
    dep = next(b for b in docs if b["kind"] == "Deployment" and b["metadata"]["name"] == "serving")
    mutate(dep)
    with pytest.raises(UnsupportedField) as err:
        Cluster(docs, tmp_path, {})
    assert field in err.value.path, err.value.path


def test_an_unknown_kind_and_an_unknown_fieldref_are_refused(rendering, tmp_path):
    docs = bodies(rendering) + [{"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "x"}}]
    with pytest.raises(UnsupportedField, match="Ingress"):
        Cluster(docs, tmp_path, {})
    docs = bodies(rendering)
    job = next(b for b in docs if b["kind"] == "Job")
    job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    c = Cluster(docs, tmp_path, {})
    pod = c.pods["ctr-train-pserver-0"]
    with pytest.raises(UnsupportedField, match="spec.nodeName"):
        env.resolve(c.store, pod, pod.spec["containers"][0], "pserver")


def test_the_one_rewrite_touches_only_whole_bind_all_and_loopback_tokens():
    ip = "127.0.0.42"
    assert rewrite_value("0.0.0.0", ip) == ip
    assert rewrite_value("http://127.0.0.1:8901", ip) == f"http://{ip}:8901"
    assert rewrite_value("localhost:8000", ip) == f"{ip}:8000"
    for same in ("10.0.0.0", "127.0.0.12", "127.0.0.10", "localhost.example", "mylocalhost", "0.0.0.01"):
        assert rewrite_value(same, ip) == same


def test_docker_command_line_of_a_cube_pod(cluster, monkeypatch):
    monkeypatch.setattr(os, "chown", lambda *a: None)
    pod = cluster.pods["cube-2s-shard-1-0"]
    vols = volumes.pod_volumes(cluster.store, pod)
    agent = pod.container("cube-agent")
    args, client_env = docker_run_args(cluster.store, cluster.docker, pod, agent, vols, dns.hosts(cluster.store))
    image_at = args.index("elastic-ctr-cube:dev")
    ports = role_specs.PORTS
    assert args[image_at + 1:] == ["cube", "agent", "--host", pod.ip, "--port", str(ports["cube-agent"]["agent"]),
                                   "--server-http", f"http://{pod.ip}:{ports['cube-server']['http']}", "--work-dir",
                                   "/data/agent", "--version-root",
                                   f"http://fileserver.elastic-ctr-dev.svc.cluster.local:{ports['fileserver']['http']}"
                                   "/cube/"]
    assert ["--network", "host"] == args[args.index("--network"):args.index("--network") + 2]
    assert "--read-only" in args and ["--user", "10001:10001"] == args[args.index("--user"):args.index("--user") + 2]
    assert "--group-add" in args and "no-new-privileges" in args and "ALL" in args
    assert f"{vols['cube-data'][0]}:/data" in args and f"{vols['tmp'][0]}:/tmp" in args
    assert f"cube-2s-shard-1-0.cube-2s-shard-1.elastic-ctr-dev.svc.cluster.local:{pod.ip}" in args
    assert f"cube-transfer.elastic-ctr-dev.svc.cluster.local:{cluster.live_pods('cube-transfer')[0].ip}" in args
    assert "ELASTIC_CTR_LOG_LEVEL=INFO" in args and "HOME=/tmp" in args
    assert [r.field for r in cluster.rewrites] == ["args[3]", "args[7]"]
    assert "--memory" in args and client_env == {}


def test_volcano_plugins_and_the_upload_token(cluster, monkeypatch):
    monkeypatch.setattr(os, "chown", lambda *a: None)
    pod = cluster.pods["ctr-train-trainer-1"]
    pairs, secret_names = env.resolve(cluster.store, pod, pod.spec["containers"][0], "trainer")
    environ = dict(pairs)
    assert environ["VC_PSERVER_HOSTS"] == "ctr-train-pserver-0.ctr-train" and environ["VC_PSERVER_NUM"] == "1"
    assert environ["VC_TRAINER_HOSTS"] == "ctr-train-trainer-0.ctr-train,ctr-train-trainer-1.ctr-train"
    assert environ["VC_TASK_INDEX"] == environ["VK_TASK_INDEX"] == "1" and environ["POD_IP"] == pod.ip
    token = cluster.secrets["fileserver-upload-token"]["token"]
    assert environ["ELASTIC_CTR_UPLOAD_TOKEN"] == token and secret_names == {"ELASTIC_CTR_UPLOAD_TOKEN"}
    assert token != REDACTED and len(token) >= 16
    vols = volumes.pod_volumes(cluster.store, pod)
    hosts = (vols["ctr-train-svc"][0] / "trainer.host").read_text()
    assert hosts == "ctr-train-trainer-0.ctr-train\nctr-train-trainer-1.ctr-train"
    args, client_env = docker_run_args(cluster.store, cluster.docker, pod, pod.init_containers[0], vols,
                                       dns.hosts(cluster.store))
    assert f"{vols['ctr-train-svc'][0]}:/etc/volcano:ro" in args
    assert ["--hostname", "ctr-train-trainer-1"] == args[args.index("--hostname"):args.index("--hostname") + 2]
    assert args[-4:] == ["data", "generate", "--out", "/data"]
    # the pservers and trainers share one claim directory
    ps = cluster.pods["ctr-train-pserver-0"]
    assert volumes.pod_volumes(cluster.store, ps)["shared"][0] == vols["shared"][0] == cluster.claims["ctr-train-shared"]


def test_service_endpoints_follow_readiness_and_deletion(cluster):
    a, b = sorted(cluster.live_pods("serving"), key=lambda p: p.slot)
    for p in (a, b):
        p.phase = "Running"
        for c in p.containers:
            c.ready = True
            c.id = "x"  # running
    assert cluster.endpoints("serving") == [a, b]
    b.containers[0].ready = False
    assert cluster.endpoints("serving") == [a]
    b.containers[0].ready = True
    import time
    a.ready_when_deleted, a.terminating_since, a.terminating = True, time.monotonic(), True
    assert cluster.endpoints("serving") == [b]  # the endpoints controller drops it at once
    assert cluster.endpoints("serving", propagation_s=60) == [a, b]  # a proxy lagging behind
    # headless cube Services publish not-ready addresses: running pods are endpoints
    shard = cluster.live_pods("cube-2s-shard-0")
    for p in shard:
        p.phase = "Running"
    assert cluster.endpoints("cube-2s-shard-0") == shard
