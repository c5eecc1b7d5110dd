"""Resizing a stack changes exactly what it should: the rendered files, the apply order
(dependencies) and the steps `pulumi preview --diff` would show (infra/preview.py)."""
from __future__ import annotations

import copy
import json

from infra import preview
from infra.config import REPO_ROOT
from infra.render import Manifest
from runtime.cli import main
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


def test_cube_shards_2_to_4_declares_a_new_layout_and_drops_the_old(rendered):
    """A new shard count is a new layout (names carry the count); the old one's files
    leave the rendering (pulumi deletes them last); transfer and serving move to the new
    topology ConfigMap; nothing of the old layout is updated in place."""
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
                     "trainingMode=continuous", "dataStartHour=20261120/00", "baseEveryMinutes=720")
    added, removed, changed = diff(before, after)
    assert (added, removed, changed) == (set(), set(), {"09-job-ctr-train.yaml"})
    name = "09-job-ctr-train.yaml"
    changed_paths = paths(files(before)[name], files(after)[name])
    assert "spec.maxRetry" in changed_paths
    assert all(p == "spec.maxRetry" or p.startswith("spec.tasks[") and ".args" in p for p in changed_paths), \
        changed_paths
    args = files(after)[name]["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["args"]
    assert flag(args, "--base-every-minutes") == "720" and flag(args, "--state-dir") == "/shared/state"


def test_apply_order_new_layout_then_transfer_then_serving(rendered):
    """The dependencies pulumi follows (and the rendering's dependencies.json records):
    the cube layout's StatefulSets before the transfer's Deployment, both before
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
    # pulumi awaits the serving rollout (through a re-layout) longer than its 10-minute default
    (serving,) = [m for m in r.manifests if m.filename == "06-deployment-serving.yaml"]
    assert serving.options["customTimeouts"] == {"create": "30m", "update": "30m"}


# ----------------------------------------------------------------------------- previews
# What `pulumi up` does for each resize, as `pulumi preview --diff` words it (infra/preview.py).
ANNOTATION = 'spec.template.metadata.annotations["elastic-ctr.io/topology-sha256"]'
CONTINUOUS = ("dataSource=http://files/hours", "dataTestSource=http://files/test.txt",
              "trainingMode=continuous", "dataStartHour=20261120/00")


def steps_of(before, after, mutable=True) -> dict[tuple[str, str, str], set[str]]:
    """{(op, kind, name): changed paths} of the preview."""
    return {(s.op, s.kind, s.name): s.paths for s in preview.preview(before, after, mutable)}


def test_preview_cube_shards_2_to_3_creates_a_layout_and_deletes_the_old_one_last(rendered):
    before, after = rendered("dev", "cubeShards=2"), rendered("dev", "cubeShards=3")
    steps = preview.preview(before, after, configmap_mutable=True)
    new_gen = {(k, f"cube-3s-shard-{i}") for i in range(3) for k in ("Service", "StatefulSet", "PodDisruptionBudget")}
    old_gen = {(k, f"cube-2s-shard-{i}") for i in range(2) for k in ("Service", "StatefulSet", "PodDisruptionBudget")}
    assert steps_of(before, after) == {
        **{("create", k, n): set() for k, n in new_gen | {("ConfigMap", "cube-3s-topology")}},
        **{("delete", k, n): set() for k, n in old_gen | {("ConfigMap", "cube-2s-topology")}},
        ("update", "Deployment", "cube-transfer"): {ANNOTATION, "spec.template.spec.volumes[1].configMap.name"},
        ("update", "Deployment", "serving"): {ANNOTATION, "spec.template.spec.volumes[0].configMap.name"},
    }
    order = [(s.op, s.kind, s.name) for s in steps]
    at = {(k, n): i for i, (_, k, n) in enumerate(order)}
    # the new StatefulSets before the transfer, the transfer before serving, deletions last
    assert max(at[("StatefulSet", f"cube-3s-shard-{i}")] for i in range(3)) < at[("Deployment", "cube-transfer")]
    assert at[("Deployment", "cube-transfer")] < at[("Deployment", "serving")]
    assert [op for op, _, _ in order[-7:]] == ["delete"] * 7
    assert all(op != "delete" for op, _, _ in order[:-7])
    # the old layout's StatefulSets go before their Services and the ConfigMap last
    assert order[-1] == ("delete", "ConfigMap", "cube-2s-topology")


def test_preview_cube_replicas_2_to_1_updates_in_place(rendered):
    before, after = rendered("dev", "cubeReplicas=2"), rendered("dev", "cubeReplicas=1")
    assert steps_of(before, after) == {
        ("update", "ConfigMap", "cube-2s-topology"): {'data["topology.json"]'},
        ("update", "StatefulSet", "cube-2s-shard-0"): {"spec.replicas"},
        ("update", "StatefulSet", "cube-2s-shard-1"): {"spec.replicas"},
        ("update", "Deployment", "cube-transfer"): {ANNOTATION},
        ("update", "Deployment", "serving"): {ANNOTATION},
    }
    # without kubernetes:enableConfigMapMutable the provider replaces a changed ConfigMap
    (cm,) = [s for s in preview.preview(before, after, configmap_mutable=False) if s.kind == "ConfigMap"]
    assert (cm.op, cm.replace_because, cm.delete_before_replace) == ("replace", ("data",), True)


def test_stack_files_make_configmaps_mutable():
    for stack in ("dev", "prod"):
        assert preview.configmap_mutable(REPO_ROOT / f"Pulumi.{stack}.yaml"), stack


def test_preview_serving_replicas_2_to_3_scales_only_serving(rendered):
    before, after = rendered("dev", "servingReplicas=2"), rendered("dev", "servingReplicas=3")
    assert steps_of(before, after) == {("update", "Deployment", "serving"): {"spec.replicas"}}
    # with an autoscaler the count is the HPA's: ignoreChanges leaves spec.replicas out
    hpa = ("servingMaxReplicas=8",)
    before, after = rendered("dev", "servingReplicas=2", *hpa), rendered("dev", "servingReplicas=3", *hpa)
    assert steps_of(before, after) == {("update", "HorizontalPodAutoscaler", "serving"): {"spec.minReplicas"}}


def test_preview_pservers_1_to_2_replaces_the_continuous_job(rendered):
    before, after = rendered("dev", *CONTINUOUS, "pservers=1"), rendered("dev", *CONTINUOUS, "pservers=2")
    (job,) = preview.preview(before, after)
    assert (job.op, job.kind, job.name) == ("replace", "Job", "ctr-train")
    assert job.token == "kubernetes:batch.volcano.sh/v1alpha1:Job"
    assert job.paths == {"spec.minAvailable", "spec.tasks[0].replicas"}
    assert job.replace_because == ("spec",) and job.delete_before_replace  # replaceOnChanges: spec


def test_preview_force_new_fields_and_report_text(rendered):
    r = rendered("dev")
    sts = next(m for m in r.manifests if m.kind == "StatefulSet")
    changed = copy.deepcopy(sts.body)
    changed["spec"]["serviceName"] = "other"
    changed["spec"]["template"]["metadata"]["labels"]["x"] = "y"
    s = preview.step(sts, Manifest(sts.kind, sts.name, changed, options=sts.options))
    assert (s.op, s.replace_because) == ("replace", ("spec.serviceName",))
    assert s.paths == {"spec.serviceName", "spec.template.metadata.labels.x"}
    assert preview.step(sts, sts) is None
    text = preview.report(rendered("dev", "servingReplicas=2"), rendered("dev", "servingReplicas=3"))
    assert text.splitlines() == [
        "~  kubernetes:apps/v1:Deployment serving (update) [diff: ~spec.replicas]",
        f"Resources: ~1 to update, {len(r.manifests) - 1} unchanged"]


def test_render_diff_against_a_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without --out, nothing is written (no rendered/dev here)
    old = tmp_path / "old"
    assert main(["render", "--stack", "dev", "--set", "cubeShards=2", "--out", str(old)]) == 0
    capsys.readouterr()
    assert main(["render", "--stack", "dev", "--set", "cubeShards=3", "--diff-against", str(old)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "+  kubernetes:core/v1:ConfigMap cube-3s-topology (create)"
    assert out[-2] == "-  kubernetes:core/v1:ConfigMap cube-2s-topology (delete)"
    assert out[-1].startswith("Resources: +10 to create, ~2 to update, -7 to delete, ")
    assert not (tmp_path / "rendered").exists()
    (old / "05-statefulset-broken.yaml").write_text("- a list\n")
    assert main(["render", "--stack", "dev", "--diff-against", str(old)]) == 2
    assert "05-statefulset-broken.yaml: not a Kubernetes manifest" in capsys.readouterr().err
