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


def test_cube_shards_2_to_4_adds_exactly_the_new_shards(rendered):
    before, after = rendered("dev", "cubeShards=2"), rendered("dev", "cubeShards=4")
    added, removed, changed = diff(before, after)
    assert removed == set()
    assert added == {f"{p}-cube-shard-{i}.yaml" for i in (2, 3)
                     for p in ("04-service", "05-statefulset", "07-poddisruptionbudget")}
    assert changed == {
        "02-configmap-cube-topology.yaml",
        "05-statefulset-cube-shard-0.yaml", "05-statefulset-cube-shard-1.yaml",
        "06-deployment-cube-transfer.yaml", "06-deployment-serving.yaml",
    }
    fa, fb = files(before), files(after)
    # existing shards: only the server's --shard-num (key % N changes which keys it owns)
    for i in (0, 1):
        name = f"05-statefulset-cube-shard-{i}.yaml"
        server_args = fb[name]["spec"]["template"]["spec"]["containers"][0]["args"]
        at = server_args.index("--shard-num") + 1
        assert paths(fa[name], fb[name]) == [f"spec.template.spec.containers[0].args[{at}]"]
        assert flag(server_args, "--shard-num") == "4"
    # transfer and serving: only the topology checksum, which rolls their pods
    for name in ("06-deployment-cube-transfer.yaml", "06-deployment-serving.yaml"):
        assert paths(fa[name], fb[name]) == [
            "spec.template.metadata.annotations.elastic-ctr.io/topology-sha256"]
    topo = json.loads(fb["02-configmap-cube-topology.yaml"]["data"]["topology.json"])
    assert [s["shard"] for s in topo["shards"]] == [0, 1, 2, 3]
    assert topo["shards"][3]["replicas"][1]["server"] == (
        "cube-shard-3-1.cube-shard-3.elastic-ctr-dev.svc.cluster.local:8900")
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
