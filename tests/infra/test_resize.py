"""Resizing a stack changes exactly what it should (the diff `pulumi preview` would show)."""
from __future__ import annotations

import json

from tests.helpers import flag

def files(r) -> dict[str, dict]:
    return {m.filename: m.body for m in r.manifests}


def diff(a, b) -> tuple[set, set, set]:
    fa, fb = files(a), files(b)
    added = set(fb) - set(fa)
    removed = set(fa) - set(fb)
    changed = {n for n in set(fa) & set(fb) if fa[n] != fb[n]}
    return added, removed, changed


def paths(a, b, prefix=""):
    """Dotted paths where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += paths(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += paths(x, y, f"{prefix}[{i}]")
        return out
    return [] if a == b else [prefix]


def test_cube_shards_2_to_4_declares_a_new_generation_and_drops_the_old(rendered):
    """A new shard count is a new generation (names carry the count); the old one's files
    leave the rendering (pulumi deletes them last); transfer and serving move to the new
    topology ConfigMap; nothing of the old generation is updated in place."""
    before, after = rendered("dev", "cubeShards=2"), rendered("dev", "cubeShards=4")
    added, removed, changed = diff(before, after)
    kinds = ("04-service", "05-statefulset", "07-poddisruptionbudget")
    assert removed == {f"{p}-cube-2s-shard-{i}.yaml" for i in (0, 1) for p in kinds} | {
        "02-configmap-cube-2s-topology.yaml"}
    assert added == {f"{p}-cube-4s-shard-{i}.yaml" for i in range(4) for p in kinds} | {
        "02-configmap-cube-4s-topology.yaml"}
    assert changed == {"06-deployment-cube-transfer.yaml", "06-deployment-serving.yaml"}
    fa, fb = files(before), files(after)
    for name, vol in (("06-deployment-cube-transfer.yaml", 1), ("06-deployment-serving.yaml", 0)):
        assert paths(fa[name], fb[name]) == [
            "spec.template.metadata.annotations.elastic-ctr.io/topology-sha256",
            f"spec.template.spec.volumes[{vol}].configMap.name"]
        assert fb[name]["spec"]["template"]["spec"]["volumes"][vol]["configMap"]["name"] == "cube-4s-topology"
    for i in range(4):
        args = fb[f"05-statefulset-cube-4s-shard-{i}.yaml"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert (flag(args, "--shard"), flag(args, "--shard-num")) == (str(i), "4")
    topo = json.loads(fb["02-configmap-cube-4s-topology.yaml"]["data"]["topology.json"])
    assert [s["shard"] for s in topo["shards"]] == [0, 1, 2, 3]
    assert topo["shards"][3]["replicas"][1]["server"] == (
        "cube-4s-shard-3-1.cube-4s-shard-3.elastic-ctr-dev.svc.cluster.local:8900")
    assert after.outputs["cubeTopology"] == topo


def test_trainers_2_to_5_changes_only_the_job(rendered):
    before, after = rendered("dev", "trainers=2"), rendered("dev", "trainers=5")
    added, removed, changed = diff(before, after)
    assert (added, removed, changed) == (set(), set(), {"09-job-ctr-train.yaml"})
    pvc = "03-persistentvolumeclaim-ctr-train-shared.yaml"  # the shared claim survives the new run
    assert pvc in files(before) and files(before)[pvc] == files(after)[pvc]
    name = "09-job-ctr-train.yaml"
    assert paths(files(before)[name], files(after)[name]) == [
        "spec.minAvailable", "spec.tasks[1].replicas"]
    assert files(after)[name]["spec"]["minAvailable"] == 6


def test_batch_to_continuous_changes_only_the_job(rendered):
    """Switching the training mode replaces the training job (and nothing else): its
    tasks' command lines and its retry budget; the shared claim (where the continuous
    job keeps its state) survives."""
    before = rendered("dev", "dataSource=http://files/hours", "dataTestSource=http://files/test.txt")
    after = rendered("dev", "dataSource=http://files/hours", "dataTestSource=http://files/test.txt",
                     "trainingMode=continuous", "dataStartHour=20261120/00", "baseEvery=12")
    added, removed, changed = diff(before, after)
    assert (added, removed, changed) == (set(), set(), {"09-job-ctr-train.yaml"})
    name = "09-job-ctr-train.yaml"
    changed_paths = paths(files(before)[name], files(after)[name])
    assert "spec.maxRetry" in changed_paths
    assert all(p == "spec.maxRetry" or p.startswith("spec.tasks[") and ".args" in p for p in changed_paths), \
        changed_paths
    args = files(after)[name]["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["args"]
    assert flag(args, "--base-every") == "12" and flag(args, "--state-dir") == "/shared/state"


def test_apply_order_new_generation_then_transfer_then_serving(rendered):
    """The dependencies pulumi follows (and the rendering's dependencies.json records):
    the cube generation's StatefulSets before the transfer's Deployment, both before
    serving's; and the NN-*.yaml file order is one valid apply order (each manifest
    after every manifest it depends on)."""
    r = rendered("dev", "cubeShards=3")
    deps = r.dependencies()
    assert list(deps) == sorted(deps)
    for name, needs in deps.items():
        assert all(n in deps and n < name for n in needs), (name, needs)
    sts = {m.filename for m in r.by_kind("StatefulSet")}
    assert sts == {f"05-statefulset-cube-3s-shard-{i}.yaml" for i in range(3)}
    assert sts <= set(deps["06-deployment-cube-transfer.yaml"])
    assert sts | {"06-deployment-cube-transfer.yaml"} <= set(deps["06-deployment-serving.yaml"])
    # the cube does not wait for its readers
    assert not any("deployment" in n for f in sts for n in deps[f])
    strategy = r.get("Deployment", "serving")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
