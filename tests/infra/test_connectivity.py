"""The NetworkPolicies admit exactly the pipeline's flows: network-config-analyzer (nca, IBM's
NetworkPolicy analyzer, in .venv-nca: ``make install``) computes the connectivity map of the
rendered dev and prod stacks and of a resize (two cube layouts at once, a surge serving pod),
and the map's connections into the stack's namespace must equal the expected matrix below:
every flow the pipeline uses allowed, nothing else (from the stack's other pods, an unlabelled
pod, a labelled pod of another namespace, or addresses outside the cluster).

nca knows Deployments, StatefulSets and Pods, not Volcano Jobs: each task of the Job becomes
its replicas' Pods (the task template's labels). The peers outside the stack are Pods made
here: Prometheus in the monitoring namespace, a serving client (``servingClientPodLabels``),
an intruder with no labels in the stack's namespace and a pod of another namespace carrying
the client label. The expected matrix is written from the roles' documented flows
(docs/security.md#networkpolicies), not from the policies.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.config import REPO_ROOT
from infra.render import dump
from runtime.role_specs import PORTS
from tests import tools

NCA = REPO_ROOT / ".venv-nca" / "bin" / "nca"
CLIENT_LABEL = {"elastic-ctr.io/serving-client": "true"}
WORKLOAD_KINDS = ("Namespace", "Deployment", "StatefulSet", "NetworkPolicy")
_LINE = re.compile(r"^(\S+) => (\S+) : (.+)$")


def _pod(ns: str, name: str, labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


def _namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}}


def cluster(renderings, surge: bool = False) -> tuple[str, list[dict]]:
    """(the stack's namespace, the objects nca reads): the renderings' namespaces, workloads
    and policies (a name once: the last rendering's), the Job's tasks as Pods, the peers."""
    objs: dict[tuple[str, str], dict] = {}
    for r in renderings:
        for m in r.manifests:
            if m.kind in WORKLOAD_KINDS:
                objs[(m.kind, m.name)] = yaml.safe_load(dump(m.body))
    (ns_obj,) = [o for (k, _), o in objs.items() if k == "Namespace"]
    ns = ns_obj["metadata"]["name"]
    ns_obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = ns  # the API server adds it
    out = list(objs.values())
    job = renderings[-1].get("Job", "ctr-train")
    for task in job["spec"]["tasks"]:
        for i in range(task["replicas"]):
            out.append(_pod(ns, f"ctr-train-{task['name']}-{i}", task["template"]["metadata"]["labels"]))
    if surge:  # a serving pod of the next template beside the current ones (maxSurge 1)
        labels = renderings[-1].get("Deployment", "serving")["spec"]["template"]["metadata"]["labels"]
        out.append(_pod(ns, "serving-surge", {**labels, "pod-template-hash": "next"}))
    out += [_namespace("monitoring"), _pod("monitoring", "prometheus", {"app": "prometheus"}),
            _pod(ns, "client", dict(CLIENT_LABEL)), _pod(ns, "intruder", {}),
            _namespace("elsewhere"), _pod("elsewhere", "client", dict(CLIENT_LABEL))]
    return ns, out


def _ports(text: str) -> frozenset:
    """``{protocols:TCP,dst_ports:8000-8001,8900}`` -> {8000, 8001, 8900}; All connections -> {"all"}."""
    if text.strip() == "All connections":
        return frozenset({"all"})
    m = re.search(r"dst_ports:([0-9,\-]+)", text)
    assert m and "TCP" in text, text
    out = set()
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def connectivity(ns: str, objects: list[dict], tmp_path: Path, inbound: bool = True) -> dict[tuple[str, str], frozenset]:
    """nca's connectivity map, ``(src, dst) -> ports``, of the connections into ``ns``'s
    pods (``ns/name`` of a workload or pod; an address range as nca prints it); not
    ``inbound``: every connection of the map."""
    tools.need([NCA], "network-config-analyzer", "make .venv-nca/.installed (needs Python 3.11: NCA_PYTHON)")
    d = tmp_path / "cluster"
    d.mkdir()
    for i, o in enumerate(objects):
        (d / f"{i:03d}-{o['kind'].lower()}-{o['metadata']['name']}.yaml").write_text(yaml.safe_dump(o))
    proc = subprocess.run([str(NCA), "--connectivity", str(d), "--resource_list", str(d), "--output_format",
                           "txt_no_fw_rules", "--output_endpoints", "deployments"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        src, dst = (re.sub(r"\[\w+\]$", "", e) for e in m.group(1, 2))
        if dst.startswith(f"{ns}/") or not inbound:
            out[(src, dst)] = _ports(m.group(3))
    assert out, proc.stdout + proc.stderr
    return out


def expected(ns: str, objects: list[dict]) -> dict[tuple[str, str], frozenset]:
    """The pipeline's flows into the stack's pods, by role (docs/security.md#networkpolicies)."""
    names = [o["metadata"]["name"] for o in objects if o["metadata"].get("namespace") == ns
             and o["kind"] in ("Deployment", "StatefulSet", "Pod")]
    cube = [n for n in names if re.fullmatch(r"cube-\d+s-shard-\d+", n)]
    serving = [n for n in names if n in ("serving", "serving-surge")]
    pservers = [n for n in names if n.startswith("ctr-train-pserver-")]
    trainers = [n for n in names if n.startswith("ctr-train-trainer-")]
    transfer, files, tracking = "cube-transfer", "fileserver", "tracking"
    prom, client = "monitoring/prometheus", f"{ns}/client"
    flows: dict[tuple[str, str], set] = {}

    def allow(srcs, dsts, *ports):
        for s in srcs:
            for d in dsts:
                if s != d:
                    flows.setdefault((s if "/" in s else f"{ns}/{s}", f"{ns}/{d}"), set()).update(ports)

    allow([client], serving, PORTS["serving"]["http"], PORTS["serving"]["grpc"])
    allow([prom], serving, PORTS["serving"]["http"])
    allow(serving, cube, PORTS["cube-server"]["data"])
    allow([transfer], cube, PORTS["cube-agent"]["agent"])
    allow([prom], cube, PORTS["cube-server"]["http"], PORTS["cube-agent"]["agent"])
    allow(serving, [transfer], PORTS["cube-transfer"]["http"])
    allow([prom], [transfer], PORTS["cube-transfer"]["http"])
    if files in names:
        allow([*trainers, transfer, *cube, *serving], [files], PORTS["fileserver"]["http"])
        allow([prom], [files], PORTS["fileserver"]["http"])
    if tracking in names:
        allow([*trainers, transfer], [tracking], PORTS["tracking"]["http"])
    allow([*pservers, *trainers], pservers, PORTS["pserver"]["paddle"], PORTS["pserver"]["gloo"])
    allow([prom], pservers, PORTS["pserver"]["metrics"])
    allow([*pservers, *trainers], trainers, PORTS["trainer"]["paddle"])
    allow([prom], trainers, PORTS["trainer"]["metrics"])
    return {k: frozenset(v) for k, v in flows.items()}


def _compare(got: dict, want: dict) -> None:
    extra = {k: sorted(map(str, v)) for k, v in got.items() if k not in want or not v <= want[k]}
    missing = {k: sorted(map(str, v)) for k, v in want.items() if k not in got or not v <= got[k]}
    assert not extra and not missing, f"allowed but not a pipeline flow: {extra}\nflows not allowed: {missing}"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_policies_admit_exactly_the_pipeline_flows(rendered, stack, tmp_path):
    ns, objects = cluster([rendered(stack)])
    _compare(connectivity(ns, objects, tmp_path), expected(ns, objects))


def test_during_a_resize_both_layouts_and_a_surge_serving_pod_keep_their_flows(rendered, tmp_path):
    ns, objects = cluster([rendered("dev", "cubeShards=2"), rendered("dev", "cubeShards=4")], surge=True)
    names = {o["metadata"]["name"] for o in objects}
    assert {"cube-2s-shard-1", "cube-4s-shard-3", "serving-surge"} <= names
    _compare(connectivity(ns, objects, tmp_path), expected(ns, objects))


def test_egress_policies_keep_the_flows_and_admit_only_dns_and_the_cidrs(rendered, tmp_path):
    r = rendered("dev", "networkPolicyEgress=true", "egressCidrs=192.0.2.0/24")
    ns, objects = cluster([r])
    objects += [_namespace("kube-system"), _pod("kube-system", "coredns", {"k8s-app": "kube-dns"})]
    got = connectivity(ns, objects, tmp_path, inbound=False)
    _compare({k: v for k, v in got.items() if k[1].startswith(f"{ns}/")}, expected(ns, objects))
    stack_pods = {k[0] for k in got if k[0].startswith(f"{ns}/") and k[0] not in (f"{ns}/client", f"{ns}/intruder")}
    assert len(stack_pods) == 9  # every workload (2 cube shards) and job pod (1 pserver, 2 trainers)
    for src in stack_pods:
        out = {dst: ports for (s, dst), ports in got.items() if s == src and not dst.startswith(f"{ns}/")}
        assert out == {"kube-system/coredns": {53}, "192.0.2.0-192.0.2.255": {"all"}}, (src, out)
    # a pod of the namespace that is not the stack's keeps its egress (the client reaches outside)
    assert got[(f"{ns}/client", "monitoring/prometheus")] == {"all"}


def test_clients_and_sources_follow_the_stack_keys(rendered, tmp_path):
    r = rendered("dev", "servingClientNamespaces=elsewhere", "servingClientCidrs=198.51.100.0/24",
                 "exposeFileServer=true", "fileServerSourceRanges=203.0.113.0/24", "monitoringNamespace=")
    ns, objects = cluster([r])
    got = connectivity(ns, objects, tmp_path)
    http, grpc, files = PORTS["serving"]["http"], PORTS["serving"]["grpc"], PORTS["fileserver"]["http"]
    assert got[("elsewhere/client", f"{ns}/serving")] == {http, grpc}
    assert (f"{ns}/client", f"{ns}/serving") not in got  # the stack's own namespace no longer listed
    assert got[("198.51.100.0-198.51.100.255", f"{ns}/serving")] == {http, grpc}
    assert got[("203.0.113.0-203.0.113.255", f"{ns}/fileserver")] == {files}
    assert not [k for k in got if k[0].startswith("monitoring/")]


def test_without_policies_every_pod_reaches_every_pod(rendered, tmp_path):
    """The analyzer is not vacuous: with networkPolicies false the intruder reaches a pserver."""
    ns, objects = cluster([rendered("dev", "networkPolicies=false")])
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    got = connectivity(ns, objects, tmp_path)
    assert got[(f"{ns}/intruder", f"{ns}/ctr-train-pserver-0")] == {"all"}
