"""Resizes with zero failed requests, as processes on 127.0.0.1: the steps
``pulumi up`` takes, played with ``LocalCubeCluster``; clients send throughout.

Shard count: a 2-shard layout serves a base and a patch. A 3-shard layout is
started beside it (empty), the transfer restarted on its topology with the same work dir
(it lays the served chain out there while the old one keeps serving), a patch published
meanwhile (held until the re-layout ends, then rolled out on the new layout only); a
"serving pod" on the new topology becomes ready only once its cube serves a version laid
out for 3 shards on every shard; clients move to it (the serving rollout); the old
layout is stopped last.

Replicas: a layout grows from 1 to 2 replicas (the new ones empty, loaded by the
transfer's reconcile while pods on the grown topology already send to them) and back to
1 (the removed ones stopped while pods still list them).

Every request answers, every answer is one version's table exactly, a pod never leaves
the version it served for an older one or a link of a re-layout.

A serving pod here is what serving's readiness is made of (``runtime.serving.launcher``):
a ``VersionWatcher`` with its topology's shard count probing every shard through its
``CubeClient``, and requests pinned to the watcher's version (plus an unpinned client);
the dense model is not loaded (tests/cube/test_resize_serving.py does, slow).
"""
from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest
import requests

from runtime.cube.client import CubeClient
from runtime.serving.model import VersionWatcher
from tests.helpers import table_from_files, write_version

DIM = 4
N = 20_000
BASE, PATCH, HELD = 3001, 3002, 3003


class _Model:
    def __init__(self, version: int):
        self.version = version


class Pod:
    """A serving pod's cube side on one topology (module docstring)."""

    def __init__(self, name, topology_path, root, transfer_url, work):
        self.name = name
        self.client = CubeClient.from_topology(topology_path, timeout_ms=2000, retries=2)
        self.shard_num = self.client.shard_num
        probe_client = CubeClient.from_topology(topology_path, timeout_ms=2000, retries=2)
        self.watcher = VersionWatcher(str(root), transfer_url, work, poll_interval_s=0.05, shard_num=self.shard_num,
                                      probe=probe_client.probe)
        self.watcher.load = _Model
        self.versions: list[int] = []  # every version it switched to
        self.watcher.on_switch.append(lambda m: self.versions.append(m.version))
        self.watcher.start()

    def ready(self) -> bool:
        return self.watcher.current is not None


class Traffic:
    """Two client threads sending 256-key batches round-robin over the ``active`` pods
    (a load balancer over ready pods): one pinned to the pod's version, one unpinned.
    Counts answers, failures and wrong answers (not exactly one version's table)."""

    def __init__(self, expected: dict[int, dict], pods: list[Pod]):
        self.expected = expected
        self.keys = np.fromiter(set().union(*(t.keys() for t in expected.values())), np.uint64)
        self.active = list(pods)
        self.ok: dict[str, int] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._send, args=(p, s), daemon=True) for p, s in ((True, 1), (False, 2))]
        for t in self.threads:
            t.start()

    def _send(self, pinned: bool, seed: int) -> None:
        r = np.random.default_rng(seed)
        i = 0
        while not self.stop.is_set():
            pod = self.active[i % len(self.active)]
            i += 1
            k = r.choice(self.keys, 256)
            k[:8] = r.integers(1 << 42, 1 << 43, 8, dtype=np.uint64)  # keys in no version
            try:
                v = pod.watcher.current.version if pinned else None
                res = pod.client.seek(k, version=v)
            except Exception as exc:  # noqa: BLE001 - counted: the test's point
                self.errors.append(f"{pod.name}: failed: {type(exc).__name__}: {exc}")
                continue
            table = self.expected.get(res.version)
            if table is None or (pinned and res.version != v) or \
                    not np.array_equal(res.found, np.array([x in table for x in k.tolist()])) or \
                    not np.array_equal(res.values[res.found], np.stack([table[x] for x in k[res.found].tolist()])) \
                    or res.values[~res.found].any():
                self.errors.append(f"{pod.name}: wrong answer of version {res.version} (pinned {v})")
                continue
            self.ok[pod.name] = self.ok.get(pod.name, 0) + 1

    def move(self, new: Pod, old: Pod, overlap_s: float = 0.2) -> None:
        """A rolling update's step: ``new`` takes traffic beside ``old``, then ``old`` none."""
        self.active.append(new)
        time.sleep(overlap_s)
        self.active.remove(old)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


def _wait(cond, what: str, cluster, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        cluster.group.check()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen after {timeout_s:.0f} s; transfer says {cluster.info()}")
        time.sleep(0.05)


def _versions(root) -> dict[int, dict]:
    """BASE (N keys), PATCH and HELD (each 500 changed keys, 300 new) under ``root``; their tables."""
    rng = np.random.default_rng(17)
    keys = rng.choice(1 << 40, N, replace=False).astype(np.uint64)
    values = rng.standard_normal((N, DIM)).astype(np.float32)
    expected = {BASE: table_from_files(write_version(root, BASE, keys, values))}
    for vid, seed in ((PATCH, 1), (HELD, 2)):
        r = np.random.default_rng(seed)
        pk = np.concatenate([r.choice(keys, 500, replace=False),
                             (r.choice(1 << 40, 300, replace=False) + (1 << 41)).astype(np.uint64)])
        table = dict(expected[BASE if vid == PATCH else PATCH])
        table.update(table_from_files(write_version(root, vid, pk, r.standard_normal((800, DIM)).astype(np.float32),
                                                    parts=1)))
        expected[vid] = table
    return expected


def _serving_patch(c) -> None:
    c.publish_version(BASE, BASE, dim=DIM, count=N)
    c.wait_version(BASE, timeout_s=60)
    c.publish_version(PATCH, BASE, patch=True, dim=DIM)
    c.wait_version(PATCH, timeout_s=60)


class _Run:
    """A local 2 x 1 cube serving PATCH (``cube``), the pods reading it (``pods``, the first
    ready on it) and the client sending through them (``traffic``)."""

    def __init__(self, cube, root, pods: list[Pod], traffic: Traffic):
        self.cube, self.root, self.pods, self.traffic = cube, root, pods, traffic

    def stop(self) -> None:
        """Stops the client and every pod's watcher (again: nothing)."""
        self.traffic.close()
        for p in self.pods:
            p.watcher.stop()


@contextlib.contextmanager
def _one_pod_serving(tmp_path, name: str):
    """``_Run`` of one pod ``name`` ready on PATCH; stopped (and the cube with it) at the end."""
    from runtime.local.cube import LocalCubeCluster

    root = tmp_path / "root"
    expected = _versions(root)
    with LocalCubeCluster(tmp_path / "run", root, shards=2, replicas=1, poll_interval_s=0.1) as c:
        _serving_patch(c)
        first = Pod(name, c.topology_path, root, c.transfer_url, tmp_path / f"w-{name}")
        _wait(lambda: first.ready() and first.watcher.current.version == PATCH, f"{name} pod ready", c)
        run = _Run(c, root, [first], Traffic(expected, [first]))
        try:
            yield run
        finally:
            run.stop()


def test_shard_change_beside_the_serving_layout_fails_no_request(tmp_path):
    with _one_pod_serving(tmp_path, "old") as run:
        c, root, traffic, (old,) = run.cube, run.root, run.traffic, run.pods
        time.sleep(0.3)
        # pulumi up: the new layout's StatefulSets (ready when up, empty) ...
        g3 = c.start_layout(3, 1)
        new = Pod("new", g3.topology_path, root, c.transfer_url, tmp_path / "w-new")
        run.pods.append(new)
        # ... then the transfer updated to the new topology (same work dir) ...
        t_switch = time.monotonic()
        c.restart_transfer(g3.topology_path)
        c.publish_version(HELD, BASE, patch=True, dim=DIM)  # published during the switch: held
        assert not new.ready()  # nothing laid out on 3 shards yet
        # ... then serving rolls: a new pod is ready once its cube serves the version
        _wait(new.ready, "the new layout serving", c)
        relayout_s = time.monotonic() - t_switch
        traffic.move(new, old)
        _wait(lambda: new.watcher.current.version == HELD, "the held patch on the new layout", c)
        time.sleep(0.3)
        # the old layout kept the version it served, untouched, until deleted last
        for s in c.topology.shards:
            for r in s.replicas:
                assert requests.get(r.http + "/status", timeout=5).json()["version"] == PATCH
        codes = c.stop_layout(c.layout)
        assert set(codes.values()) == {0}, codes
        time.sleep(0.3)
        run.stop()
        assert not traffic.errors, (traffic.ok, traffic.errors[:5])
        assert traffic.ok.get("old", 0) > 0 and traffic.ok.get("new", 0) > 0, traffic.ok
        assert old.versions == [PATCH]  # never a link of the re-layout, never the held patch
        assert new.versions in ([PATCH, HELD], [HELD])
        hist = requests.get(f"{c.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
        tail = [(h["version"], h["status"], h.get("reason")) for h in hist][-3:]
        assert tail == [(BASE, "finished", "relayout 2->3 shards"), (PATCH, "finished", "relayout 2->3 shards"),
                        (HELD, "finished", None)]
        info = c.info()
        assert (info.version, info.served_shard_num, info.shard_num) == (HELD, 3, 3)
        print(f"shard change 2->3 at {N} keys: new layout serving {relayout_s:.2f} s after the transfer's "
              f"restart; {sum(traffic.ok.values())} requests answered, 0 failed")


@pytest.mark.slow  # ~20 s on an idle 2-core machine, 37 s under load 20 (the shard change stays fast)
def test_replicas_up_and_down_fail_no_request(tmp_path):
    with _one_pod_serving(tmp_path, "one") as run:
        c, root, traffic, (one,) = run.cube, run.root, run.traffic, run.pods
        layout = c.layout
        time.sleep(0.2)
        # cubeReplicas 1 -> 2: the StatefulSets grow (new replicas empty), the transfer
        # restarts on the grown topology and loads them (reconcile at start); a pod on it
        # is ready at once (every shard answers on replica 0), the client's version-checked
        # failover keeps the empty or lagging replicas out of its answers
        grown_topology = c.grow_layout(layout, 2)
        two = Pod("two", grown_topology, root, c.transfer_url, tmp_path / "w-two")
        run.pods.append(two)
        c.restart_transfer(grown_topology)
        _wait(two.ready, "the pod on the grown topology ready", c)
        traffic.move(two, one)
        _wait(lambda: all(requests.get(r.http + "/status", timeout=5).json()["version"] == PATCH
                          for s in layout.topology.shards for r in s.replicas), "the new replicas loaded", c)
        time.sleep(0.3)
        # cubeReplicas 2 -> 1: the highest ordinals stop first (SIGTERM, lookups received
        # answered) while pods still list them, then the topology shrinks and pods roll
        shrunk_topology, codes = c.shrink_layout(layout, 1)
        assert set(codes.values()) == {0}, codes
        back = Pod("back", shrunk_topology, root, c.transfer_url, tmp_path / "w-back")
        run.pods.append(back)
        c.restart_transfer(shrunk_topology)
        _wait(back.ready, "the pod on the shrunk topology ready", c)
        traffic.move(back, two)
        time.sleep(0.3)
        run.stop()
        assert not traffic.errors, (traffic.ok, traffic.errors[:5])
        assert all(traffic.ok.get(p.name, 0) > 0 for p in run.pods), traffic.ok
        assert [p.versions for p in run.pods] == [[PATCH]] * 3
        assert c.info().replicas == [1, 1]
