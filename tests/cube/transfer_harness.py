"""The in-process cube the transfer tests roll versions out to: ``shards`` x ``replicas`` of
``FakeServer`` (tests/helpers.py) behind a real ``Agent`` each, a stub builder that writes the
builder's output layout (docs/contracts.md) so these tests do not depend on the data plane,
and a root with a donefile. Used by tests/cube/test_transfer.py and test_resize_transfer.py.
"""
from __future__ import annotations

import hashlib
import json
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runtime.cube.agent import Agent, create_app as agent_app
from runtime.cube.buildinfo import BuildRecord, ShardBuild, md5_name, part_name, shard_tar_name
from runtime.cube.transfer.service import Transfer
from runtime.formats import donefile
from tests.helpers import FakeServer, ThreadedApp

DICT = "d"


def stub_build(inputs, output_dir, dict_name, shard_num, version, mode, base_version, bad_md5_shard=None):
    """Writes ``<out>/<dict>/<version>/{<dict>_part<i>/, .tar, .tar.md5, build.json}``."""
    vdir = Path(output_dir) / dict_name / str(version)
    vdir.mkdir(parents=True, exist_ok=True)
    payload = b"".join(Path(p).read_bytes() for p in inputs)
    shards = []
    for i in range(shard_num):
        part = vdir / part_name(dict_name, i)
        part.mkdir(exist_ok=True)
        (part / "data").write_bytes(payload + b"|%d|%d" % (i, version))
        # FakeServer checks it, as the real server checks a dict's meta
        (part / "meta.json").write_text(json.dumps({"shard": i, "shard_num": shard_num, "version": version}))
        tar = vdir / shard_tar_name(dict_name, i)
        with tarfile.open(tar, "w") as tf:
            tf.add(part, arcname=part.name)
        md5 = hashlib.md5(tar.read_bytes()).hexdigest()
        if i == bad_md5_shard:
            md5 = "f" * 32
        (vdir / md5_name(tar.name)).write_text(md5 + "\n")
        shards.append(ShardBuild(shard=i, dir=part.name, tar=tar.name, md5=md5, count=1,
                                 bytes=tar.stat().st_size, tar_bytes=tar.stat().st_size))
    BuildRecord(dict_name=dict_name, version=version, mode=mode, base_version=base_version,
                shard_num=shard_num, dim=2, count=len(payload), duplicates=0, input_records=len(payload),
                inputs=list(inputs), shards=shards).write(vdir)


class Cluster:
    """``shards`` x ``replicas`` (default 2 x 2) of FakeServer + Agent. ``servers``,
    ``agents`` are in topology order (shard-major)."""

    def __init__(self, tmp: Path, shards: int = 2, replicas: int = 2):
        self.tmp = tmp
        self.rep: dict[tuple[int, int], tuple[FakeServer, Agent, ThreadedApp]] = {}
        self.resize(shards, replicas)

    def resize(self, shards: int, replicas: int | None = None, keep_running: tuple = ()) -> None:
        """What ``pulumi up`` with new cubeShards/cubeReplicas does: when the shard count
        changes, every existing server restarts empty with the new ``--shard-num`` (but
        those in ``keep_running``, (shard, replica) pairs, which keep the old one and their
        version: a pod not restarted yet); the agents keep their state; missing replicas
        are added, surplus ones dropped; the topology is rewritten."""
        replicas = replicas or self.replicas
        for key in [k for k in self.rep if k[0] >= shards or k[1] >= replicas]:
            srv, _, app = self.rep.pop(key)
            app.close()
            srv.close()
        for (s, r), (srv, _, _) in self.rep.items():
            if srv.shard_num != shards and (s, r) not in keep_running:
                srv.restart(shard_num=shards)
        topo = {"dict_name": DICT, "shards": []}
        for s in range(shards):
            reps = []
            for r in range(replicas):
                if (s, r) not in self.rep:
                    srv = FakeServer(shard=s, shard_num=shards)
                    ag = Agent(srv.url, self.tmp / f"agent{s}{r}", load_timeout_s=10, poll_s=0.01)
                    self.rep[(s, r)] = (srv, ag, ThreadedApp(agent_app(ag)))
                srv, _, app = self.rep[(s, r)]
                reps.append({"server": "127.0.0.1:1", "http": srv.url, "agent": app.url})
            topo["shards"].append({"shard": s, "replicas": reps})
        self.shards, self.replicas, self.topology = shards, replicas, topo

    @property
    def servers(self) -> list[FakeServer]:
        return [self.rep[k][0] for k in sorted(self.rep)]

    @property
    def agents(self) -> list[Agent]:
        return [self.rep[k][1] for k in sorted(self.rep)]

    def versions(self):
        return [s.version for s in self.servers]

    def close(self):
        """Stops every agent's app and server, all at once (each drains its connections)."""
        def stop(rep):
            srv, _, app = rep
            app.close()
            srv.close()

        with ThreadPoolExecutor(max(1, len(self.rep))) as pool:
            list(pool.map(stop, self.rep.values()))


def add_version(root: Path, vid: int, key: int, patch: bool = False, data: bytes | None = None) -> None:
    sparse = root / "versions" / str(vid) / "sparse"
    sparse.mkdir(parents=True, exist_ok=True)
    (sparse / "part-00000").write_bytes(data or b"v%d" % vid)
    (sparse / "_SUCCESS").write_bytes(b"")
    rec = donefile.DonefileRecord(id=vid, key=key, input=donefile.sparse_dir(vid))
    donefile.append(str(root), "patch" if patch else "base", rec)


def make_transfer(cluster, root, work, **kw) -> Transfer:
    kw.setdefault("build_fn", stub_build)
    kw.setdefault("phase_timeout_s", 20)
    kw.setdefault("retries", 2)
    kw.setdefault("rollout_backoff_s", 0.0)
    kw.setdefault("coalesce", False)  # the transfer tests follow patches one by one: tests/cube/test_coalesce.py folds them
    return Transfer(cluster.topology, str(root), work, poll_interval_s=0.05, **kw)


def served_chain_2shards(cluster, root, work) -> Transfer:
    """Base 10, patches 11 and 12 served on the 2-shard cluster."""
    add_version(root, 10, 10)
    add_version(root, 11, 10, patch=True)
    add_version(root, 12, 10, patch=True)
    tr = make_transfer(cluster, root, work)
    while tr.poll_once():
        pass
    assert cluster.versions() == [12] * 4
    assert tr.info().served_shard_num == 2
    return tr


def drain(tr: Transfer) -> list[dict]:
    out = []
    while (e := tr.poll_once()) is not None:
        out.append(e)
        assert len(out) < 20
    return out
