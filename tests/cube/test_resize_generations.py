"""A shard-count change with zero failed requests, as processes on 127.0.0.1 (issue 17):
the steps ``pulumi up`` takes for a new ``cubeShards``, played with ``LocalCubeCluster``.

A 2-shard generation serves a base and a patch; clients send throughout. A 3-shard
generation is started beside it (empty), the transfer restarted on its topology with the
same work dir (it lays the served chain out there while the old one keeps serving), a
patch published meanwhile (held until the re-layout ends, then rolled out on the new
generation only); a "serving pod" on the new topology becomes ready only once its cube
serves a version laid out for 3 shards on every shard; clients move to it (the serving
rollout); the old generation is stopped last. Then the new generation grows to 2
replicas (the new ones empty, loaded by the transfer's reconcile) and back to 1 (the
removed ones stopped while pods still list them). Every request answers,
every answer is one version's table exactly, the old pod never leaves the version it
served.

A serving pod here is what serving's readiness is made of (``runtime.serving.launcher``):
a ``VersionWatcher`` with its topology's shard count probing every shard through its
``CubeClient``, and requests pinned to the watcher's version; the dense model is not
loaded (serving's own tests cover it).
"""
from __future__ import annotations

import threading
import time

import numpy as np
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


def _wait(cond, what: str, cluster, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        cluster.group.check()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen after {timeout_s:.0f} s; transfer says {cluster.info()}")
        time.sleep(0.05)


def test_shard_change_beside_the_serving_generation_fails_no_request(tmp_path):
    from runtime.cube.cluster import LocalCubeCluster

    rng = np.random.default_rng(17)
    root, run = tmp_path / "root", tmp_path / "run"
    keys = rng.choice(1 << 40, N, replace=False).astype(np.uint64)
    values = rng.standard_normal((N, DIM)).astype(np.float32)
    expected = {BASE: table_from_files(write_version(root, BASE, keys, values))}
    for vid, seed in ((PATCH, 1), (HELD, 2)):  # each patch: 500 changed keys and 300 new ones
        r = np.random.default_rng(seed)
        pk = np.concatenate([r.choice(keys, 500, replace=False),
                             (r.choice(1 << 40, 300, replace=False) + (1 << 41)).astype(np.uint64)])
        table = dict(expected[BASE if vid == PATCH else PATCH])
        table.update(table_from_files(write_version(root, vid, pk, r.standard_normal((800, DIM)).astype(np.float32),
                                                    parts=1)))
        expected[vid] = table
    all_keys = np.fromiter(expected[HELD].keys(), np.uint64)

    with LocalCubeCluster(run, root, shards=2, replicas=1, poll_interval_s=0.1,
                          extra_transfer_args=["--reconcile-interval", "1"]) as c:
        c.publish_version(BASE, BASE, dim=DIM, count=N)
        c.wait_version(BASE, timeout_s=60)
        c.publish_version(PATCH, BASE, patch=True, dim=DIM)
        c.wait_version(PATCH, timeout_s=60)
        old = Pod("old", c.topology_path, root, c.transfer_url, tmp_path / "w-old")
        _wait(lambda: old.watcher.current is not None and old.watcher.current.version == PATCH, "old pod ready", c)

        stop = threading.Event()
        active = [old]  # the pods the load balancer sends to (a rolling update: both, then the new one)
        counts = {"ok": 0, "failed": 0, "wrong": 0, "by_pod": {}}
        errors: list[str] = []

        def send(pinned: bool, seed: int) -> None:
            r = np.random.default_rng(seed)
            i = 0
            while not stop.is_set():
                pod = active[i % len(active)]
                i += 1
                k = r.choice(all_keys, 256)
                k[:8] = r.integers(1 << 42, 1 << 43, 8, dtype=np.uint64)  # keys in no version
                try:
                    v = pod.watcher.current.version if pinned else None
                    res = pod.client.seek(k, version=v)
                except Exception as exc:  # noqa: BLE001 - counted: the test's point
                    counts["failed"] += 1
                    errors.append(f"{pod.name}: {type(exc).__name__}: {exc}")
                    continue
                table = expected.get(res.version)
                want_found = np.array([x in table for x in k.tolist()]) if table else None
                if table is None or (pinned and res.version != v) or not np.array_equal(res.found, want_found) \
                        or not np.array_equal(res.values[res.found],
                                              np.stack([table[x] for x in k[res.found].tolist()])) \
                        or res.values[~res.found].any():
                    counts["wrong"] += 1
                    errors.append(f"{pod.name}: wrong answer of version {res.version} (pinned {v})")
                    continue
                counts["ok"] += 1
                counts["by_pod"][pod.name] = counts["by_pod"].get(pod.name, 0) + 1

        senders = [threading.Thread(target=send, args=(p, s), daemon=True) for p, s in ((True, 1), (False, 2))]
        for t in senders:
            t.start()
        try:
            time.sleep(0.3)
            # pulumi up: the new generation's StatefulSets (ready when up, empty) ...
            g3 = c.start_generation(3, 1)
            new = Pod("new", g3.topology_path, root, c.transfer_url, tmp_path / "w-new")
            # ... then the transfer updated to the new topology (same work dir) ...
            t_switch = time.monotonic()
            c.restart_transfer(g3.topology_path)
            c.publish_version(HELD, BASE, patch=True, dim=DIM)  # published during the switch: held
            assert not new.ready()  # nothing laid out on 3 shards yet
            # ... then serving rolls: a new pod is ready once its cube serves the version
            _wait(new.ready, "the new generation serving", c)
            relayout_s = time.monotonic() - t_switch
            active.append(new)  # maxSurge: both pods take traffic ...
            time.sleep(0.3)
            active.remove(old)  # ... then the old one is gone
            _wait(lambda: new.watcher.current.version == HELD, "the held patch on the new generation", c)
            time.sleep(0.3)
            # the old generation kept the version it served, untouched, until deleted last
            for reps in g2_replicas(c):
                assert requests.get(reps + "/status", timeout=5).json()["version"] == PATCH
            codes = c.stop_generation(c.generation)
            assert set(codes.values()) == {0}, codes
            time.sleep(0.3)
            # cubeReplicas 1 -> 2 on the new generation: the StatefulSets grow (new replicas
            # empty), the transfer restarts on the grown topology and loads them (reconcile);
            # a pod on it is ready at once (every shard answers HELD on replica 0), the
            # client's version-checked failover keeps the empty replicas out of its answers
            grown_topology = c.grow_generation(g3, 2)
            grown = Pod("grown", grown_topology, root, c.transfer_url, tmp_path / "w-grown")
            c.restart_transfer(grown_topology)
            _wait(grown.ready, "the pod on the grown topology ready", c)
            active.append(grown)
            time.sleep(0.2)
            active.remove(new)
            _wait(lambda: all(requests.get(r.http + "/status", timeout=5).json()["version"] == HELD
                              for s in g3.topology.shards for r in s.replicas), "the new replicas loaded", c)
            time.sleep(0.3)
            # cubeReplicas 2 -> 1: the highest ordinals stop first (SIGTERM, lookups received
            # answered) while pods still list them (failover), then the topology shrinks
            shrunk_topology, codes = c.shrink_generation(g3, 1)
            assert set(codes.values()) == {0}, codes
            shrunk = Pod("shrunk", shrunk_topology, root, c.transfer_url, tmp_path / "w-shrunk")
            c.restart_transfer(shrunk_topology)
            _wait(shrunk.ready, "the pod on the shrunk topology ready", c)
            active.append(shrunk)
            time.sleep(0.2)
            active.remove(grown)
            time.sleep(0.3)
        finally:
            stop.set()
            for t in senders:
                t.join(10)
            for p in (old, locals().get("new"), locals().get("grown"), locals().get("shrunk")):
                if p is not None:
                    p.watcher.stop()
        assert counts["failed"] == 0 and counts["wrong"] == 0, (counts, errors[:5])
        assert all(counts["by_pod"].get(p, 0) > 0 for p in ("old", "new", "grown", "shrunk")), counts
        assert grown.versions == [HELD] and shrunk.versions == [HELD]
        assert old.versions == [PATCH]  # never a link of the re-layout, never the held patch
        assert new.versions in ([PATCH, HELD], [HELD])
        hist = requests.get(f"{c.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
        tail = [(h["version"], h["status"], h.get("reason")) for h in hist][-3:]
        assert tail == [(BASE, "finished", "relayout 2->3 shards"), (PATCH, "finished", "relayout 2->3 shards"),
                        (HELD, "finished", None)]
        info = c.info()
        assert (info.version, info.served_shard_num, info.shard_num) == (HELD, 3, 3)
        print(f"shard change 2->3 at {N} keys: new generation serving {relayout_s:.2f} s after the transfer's "
              f"restart; {counts['ok']} requests answered, 0 failed")


def g2_replicas(c) -> list[str]:
    return [r.http for s in c.topology.shards for r in s.replicas]
