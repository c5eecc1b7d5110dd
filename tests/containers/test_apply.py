"""``Cluster.apply`` without an engine: the steps between two renderings (``kube.diff``) and
their order, and the controllers' rollouts played against a fake kubelet (pods become
ready a moment after they start; a deletion takes a moment), so the order of pod creations
and deletions, and the ready pods during a rollout, are checked exactly."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from tests.containers.kube import Cluster
from tests.containers.kube.apply import resolve_int_or_percent
from tests.containers.kube.diff import Change, changed_paths, dependency_order, diff, object_key
from tests.containers.kube.errors import HarnessError
from tests.containers.kube.records import ContainerExit, Termination

BASE = ["pservers=1", "trainers=2", "cubeShards=2", "cubeReplicas=2", "servingReplicas=2", "epochs=1"]


def render(*overrides: str):
    from infra.render import render as _render

    return _render("dev", [*BASE, *overrides])


def cm(name: str, data: dict, ns: str = "n") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data}


def sts(name: str, replicas: int = 2, service: str = "s", image: str = "i:1") -> dict:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": "n"},
            "spec": {"replicas": replicas, "serviceName": service, "selector": {"matchLabels": {"a": name}},
                     "template": {"metadata": {"labels": {"a": name}},
                                  "spec": {"containers": [{"name": "c", "image": image}]}}}}


# ----------------------------------------------------------------------------- diff (pure)
def test_each_object_is_created_updated_replaced_deleted_or_left_alone():
    old = [cm("a", {"k": "1"}), cm("b", {"k": "1"}), sts("x"), sts("y"), cm("gone1", {}), cm("gone2", {})]
    new = [cm("a", {"k": "1"}), cm("b", {"k": "2"}), sts("x", replicas=3), sts("y", service="other"), cm("new", {})]
    steps = diff(old, new, "n")
    assert [(s.action, s.kind, s.name) for s in steps] == [
        ("update", "ConfigMap", "b"), ("update", "StatefulSet", "x"), ("replace", "StatefulSet", "y"),
        ("create", "ConfigMap", "new"),
        ("delete", "ConfigMap", "gone2"), ("delete", "ConfigMap", "gone1")]  # deletes last, reverse order
    assert steps[0].paths == ("data.k",) and steps[1].paths == ("spec.replicas",)
    assert "spec.serviceName" in steps[2].paths
    assert diff(new, new, "n") == []


def test_a_duplicate_or_nameless_object_is_refused_naming_it():
    with pytest.raises(ValueError, match="ConfigMap/a twice"):
        diff([], [cm("a", {}), cm("a", {"x": "1"})], "n")
    with pytest.raises(ValueError, match="without kind or metadata.name"):
        object_key({"kind": "ConfigMap", "metadata": {}})


def test_changed_paths_go_down_to_the_differing_field():
    a = {"spec": {"template": {"spec": {"containers": [{"args": ["--n", "2"], "image": "i"}]}}}}
    b = {"spec": {"template": {"spec": {"containers": [{"args": ["--n", "3"], "image": "i"}]}}}}
    assert changed_paths(a, b) == ["spec.template.spec.containers[0].args"]


def test_dependency_order_puts_what_is_depended_on_first_and_keeps_file_order_otherwise():
    docs = [("01-a", {"n": 1}), ("02-b", {"n": 2}), ("03-c", {"n": 3}), ("04-d", {"n": 4})]
    assert [w for w, _ in dependency_order(docs, {})] == ["01-a", "02-b", "03-c", "04-d"]
    assert [w for w, _ in dependency_order(docs, {"02-b": ["04-d"], "01-a": ["03-c", "99-absent"]})] == \
        ["03-c", "01-a", "04-d", "02-b"]
    with pytest.raises(ValueError, match="cycle among \\['01-a', '02-b'\\]"):
        dependency_order(docs, {"01-a": ["02-b"], "02-b": ["01-a"]})


def test_rolling_update_values_round_as_the_deployment_controller_does():
    assert resolve_int_or_percent(None, 2, round_up=True) == 1      # 25 % of 2, up
    assert resolve_int_or_percent(None, 2, round_up=False) == 0     # 25 % of 2, down
    assert resolve_int_or_percent("50%", 3, round_up=False) == 1
    assert resolve_int_or_percent(2, 5, round_up=True) == 2
    with pytest.raises(Exception, match="an int or 'N%'"):
        resolve_int_or_percent("half", 2, round_up=True)


def test_a_resize_of_the_dev_stack_orders_its_steps_like_pulumi_up():
    """Every rendered resize step: creates and updates in dependency order (what each
    depends on comes earlier), every delete after them; the serving and transfer templates
    change with the topology (their checksum annotation), so both roll."""
    for override in ("cubeShards=3", "cubeReplicas=1", "servingReplicas=3"):
        old, new = render(), render(override)
        steps = diff([m.body for m in old.manifests], [m.body for m in new.manifests], "elastic-ctr-dev")
        assert steps, override
        actions = [s.action for s in steps]
        first_delete = actions.index("delete") if "delete" in actions else len(actions)
        assert all(a == "delete" for a in actions[first_delete:]), (override, actions)
        deps = new.dependencies() if hasattr(new, "dependencies") else {}
        fname = {(m.kind, m.name): m.filename for m in new.manifests}
        seen: set[str] = set()
        for s in steps[:first_delete]:
            f = fname[(s.kind, s.name)]
            later = [d for d in deps.get(f, []) if d not in seen and any(
                fname[(t.kind, t.name)] == d for t in steps[:first_delete])]
            assert not later, f"{override}: {s} before what it depends on: {later}"
            seen.add(f)
        by = {(s.kind, s.name): s for s in steps}
        if override == "servingReplicas=3":
            assert [str(s) for s in steps] == ["update Deployment/serving (spec.replicas)"]
        else:
            assert by[("Deployment", "serving")].action == "update"
            assert any("template" in p for p in by[("Deployment", "serving")].paths)
            assert by[("Deployment", "cube-transfer")].action == "update"


# ----------------------------------------------------------------------------- rollouts on a fake kubelet
class FakeDocker:
    """Answers ``docker image inspect`` (every image present) and nothing else."""

    def __call__(self, *args, **kw):
        return subprocess.CompletedProcess(args, 0, "sha256:x\n", "")

    def watch_exits(self, on_exit):
        pass

    def stop_watching(self):
        pass

    def sweep(self):
        pass


class FakeNode:
    """Plays the kubelet (a started pod is Running at once and ready ``ready_s`` later) and
    the pod deletion (``delete_s``), and records every event with the ready pods of each
    workload at that moment."""

    def __init__(self, cluster: Cluster, ready_s: float = 0.3, delete_s: float = 0.2):
        self.c, self.ready_s, self.delete_s = cluster, ready_s, delete_s
        self.events: list[tuple[str, str, str, int]] = []  # (event, pod, workload, ready pods of it)
        self.lock = threading.Lock()
        cluster.docker = FakeDocker()
        cluster.kubelet.spawn = cluster.controllers.spawn = self.spawn
        cluster.terminator.delete_pod = self.delete_pod
        cluster.applier.c = cluster

    def ready_of(self, workload: str) -> int:
        return sum(1 for p in self.c.live_pods(workload) if p.ready)

    def note(self, event: str, pod) -> None:
        with self.lock:
            self.events.append((event, pod.name, pod.owner.name, self.ready_of(pod.owner.name)))

    def spawn(self, pod, gang=None):
        self.note("start", pod)
        pod.phase = "Running"
        for cr in pod.containers:
            cr.id = f"fake-{pod.name}-{cr.name}"

        def ready():
            for cr in pod.containers:
                if not pod.terminating:
                    cr.set_ready(True)
            self.note("ready", pod)
        threading.Timer(self.ready_s, ready).start()

    def delete_pod(self, name, *, replace=True, grace_s=None, watch_readiness_s=None, reason="delete"):
        pod = self.c.store.pods[name]
        self.note("delete", pod)
        pod.terminating = True
        time.sleep(self.delete_s)
        for cr in pod.containers:
            cr.set_ready(False)
            cr.exit_code = 0
            cr.exited.set()
        pod.deleted, pod.phase = True, "Succeeded"
        self.note("gone", pod)
        return Termination(name, reason, pod.grace_s, [ContainerExit(c.name, 0, self.delete_s, False)
                                                        for c in pod.containers])

    def of(self, workload: str, since: int = 0) -> list[tuple[str, str, int]]:
        return [(e, p, r) for e, p, w, r in self.events[since:] if w == workload]


@pytest.fixture
def node(tmp_path):
    c = Cluster(render(), tmp_path, {}, ip_prefix="127.0.9.", first_ip=10)
    fake = FakeNode(c)
    c._check_addresses_free = lambda: None
    c.start()
    c.wait_for("every pod ready", lambda: all(p.ready for p in c.live_pods() if p.owner.kind != "Job"), 20)
    yield fake
    c.store.stopping.set()


def test_serving_scale_up_and_down_adds_then_removes_the_newest_pod(node):
    c = node.c
    before = {p.name for p in c.live_pods("serving")}
    rep = c.apply(render("servingReplicas=3"), timeout_s=30)
    assert [s.change.action for s in rep.steps] == ["update"]
    after = {p.name for p in c.live_pods("serving")}
    assert before < after and len(after) == 3 and all(c.ready(n) for n in after)
    added = (after - before).pop()
    mark = len(node.events)
    c.apply(render(), timeout_s=30)
    assert [(e, p) for e, p, _ in node.of("serving", mark) if e == "delete"] == [("delete", added)]
    assert {p.name for p in c.live_pods("serving")} == before


def test_a_topology_change_rolls_serving_with_surge_1_and_no_unavailable_pod(node):
    """cubeReplicas 2 -> 1: the StatefulSets drop their highest ordinal, the transfer is
    recreated (old pod gone before the new one starts, on its address), serving rolls
    one pod at a time and never has fewer than 2 ready pods nor more than 3 pods."""
    c = node.c
    old_transfer = c.live_pods("cube-transfer")[0]
    old_serving = {p.name for p in c.live_pods("serving")}
    mark = len(node.events)
    rep = c.apply(render("cubeReplicas=1"), timeout_s=30)
    stsets = [n for n, w in c.workloads.items() if w.kind == "StatefulSet"]
    for name in stsets:
        assert [p.name for p in c.live_pods(name)] == [f"{name}-0"]
        assert [(e, p) for e, p, _ in node.of(name, mark) if e == "delete"] == [("delete", f"{name}-1")]
    tr = node.of("cube-transfer", mark)
    assert [e for e, _, _ in tr][:3] == ["delete", "gone", "start"], tr
    assert c.live_pods("cube-transfer")[0].ip == old_transfer.ip
    sv = node.of("serving", mark)
    assert min(r for e, _, r in sv if e == "delete") >= 2, sv   # maxUnavailable 0: a delete only with 3 ready
    assert {p.name for p in c.live_pods("serving")}.isdisjoint(old_serving)
    assert len(c.live_pods("serving")) == 2 and all(p.ready for p in c.live_pods("serving"))
    live_max = 0
    for i in range(mark, len(node.events)):
        starts = sum(1 for e, _, w, _ in node.events[mark:i + 1] if w == "serving" and e == "start")
        deletes = sum(1 for e, _, w, _ in node.events[mark:i + 1] if w == "serving" and e == "delete")
        live_max = max(live_max, 2 + starts - deletes)
    assert live_max == 3
    # order of the steps: StatefulSets and the topology before the Deployments that use them
    order = [f"{s.change.kind}/{s.change.name}" for s in rep.steps]
    assert order.index("Deployment/serving") > max(order.index(f"StatefulSet/{n}") for n in stsets)
    assert order.index("Deployment/serving") > order.index("Deployment/cube-transfer")


def test_a_new_shard_count_creates_before_it_deletes(node):
    c = node.c
    old_sts = {n for n, w in c.workloads.items() if w.kind == "StatefulSet"}
    rep = c.apply(render("cubeShards=3"), timeout_s=60)
    new_sts = {n for n, w in c.workloads.items() if w.kind == "StatefulSet"}
    actions = [s.change.action for s in rep.steps]
    if new_sts.isdisjoint(old_sts):  # layouts side by side
        first_delete = actions.index("delete")
        assert all(a == "delete" for a in actions[first_delete:])
        assert {s.change.name for s in rep.steps if s.change.action == "delete" and s.change.kind == "StatefulSet"} \
            == old_sts
        for n in old_sts:
            assert not c.live_pods(n)
    assert len(new_sts) == 3 and all(len(c.live_pods(n)) == 2 for n in new_sts)


def test_apply_before_start_is_an_error(tmp_path):
    c = Cluster(render(), tmp_path, {}, ip_prefix="127.0.9.", first_ip=10)
    with pytest.raises(HarnessError, match="not started"):
        c.apply(render("servingReplicas=3"))


def test_change_str_names_the_step():
    assert str(Change("update", "Deployment", "n", "serving", paths=("spec.replicas",))) == \
        "update Deployment/serving (spec.replicas)"
