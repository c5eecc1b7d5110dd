"""Versioned reads at process level: 2 real cube server processes (shards of one dict,
started by ``runtime.local.cube.LocalCubeCluster.start_layout``), patches landing
back to back through the control calls the transfer makes (``bg_load_patch`` on every
shard, then ``enable`` on every shard), while reader threads seek through
``CubeClient``: batches pinned to a version they name, and batches on whatever version
the client settles on. Every answer must equal the offline answer of the version it
names (the base, then each patch's rows applied in order), also once the patches' new
keys outgrow the base's headroom (extensions); a pinned version may only be refused (``CubeVersionUnavailable``) once the server dropped it. Bounded: ~20 s."""
from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
import requests

from tests.helpers import DICT, build_version, make_data, shard_dir

pytestmark = pytest.mark.slow

DIM, N, PATCHES, PATCH_ROWS = 8, 200_000, 10, 20_000
BASE = 500


class Offline:
    """Answers of every version: the base's sorted keys and values, each patch's rows."""

    def __init__(self, keys, values):
        order = np.argsort(keys)
        self.keys, self.values = keys[order], values[order]
        self.patches: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, version: int, keys, values) -> None:
        order = np.argsort(keys)
        self.patches[version] = (keys[order], values[order])

    @staticmethod
    def _find(sorted_keys, query):
        i = np.minimum(np.searchsorted(sorted_keys, query), max(len(sorted_keys) - 1, 0))
        return i, sorted_keys[i] == query

    def answer(self, version: int, query):
        i, found = self._find(self.keys, query)
        vals = np.where(found[:, None], self.values[i], 0).astype(np.float32)
        for v in sorted(p for p in self.patches if p <= version):
            pk, pv = self.patches[v]
            j, hit = self._find(pk, query)
            vals[hit] = pv[j[hit]]
            found = found | hit
        return vals, found


def control(addr: str, path: str, body: dict, headers: dict) -> requests.Response:
    return requests.post(f"{addr}/{path}", json=body, headers=headers, timeout=10)


def wait_loaded(addr: str, version: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = requests.get(f"{addr}/status", timeout=5).json()
        if st["bg_state"] == "loaded" and st["bg_version"] == version:
            return
        assert st["bg_state"] == "loading", st
        time.sleep(0.005)
    raise TimeoutError(f"{addr}: version {version} not loaded after {timeout_s} s")


def test_readers_see_exactly_the_version_they_name_while_patches_land(tmp_path):
    from runtime import auth, role_specs
    from runtime.cube.client import CubeClient, CubeVersionUnavailable
    from runtime.local.cube import LocalCubeCluster

    rng = np.random.default_rng(11)
    keys, values = make_data(N, DIM, seed=11)
    ref = Offline(keys, values)
    builds = {BASE: build_version(tmp_path, keys, values, version=BASE, shard_num=2)}
    patch_keys = [keys]
    for i in range(1, PATCHES + 1):  # overwrites (of the base and of earlier patches) + new keys
        pool = np.concatenate(patch_keys)
        pk = np.unique(np.concatenate([rng.choice(pool, PATCH_ROWS * 3 // 4, replace=False),
                                       make_data(PATCH_ROWS // 4, DIM, seed=100 + i)[0]]))
        pv = rng.random((pk.shape[0], DIM), dtype=np.float32)
        builds[BASE + i] = build_version(tmp_path, pk, pv, version=BASE + i, shard_num=2, mode="delta",
                                         base_version=BASE + i - 1)
        ref.add(BASE + i, pk, pv)
        patch_keys.append(pk)
    misses = make_data(500, DIM, seed=999)[0]
    pool = np.concatenate(patch_keys + [misses])

    c = LocalCubeCluster(tmp_path / "run", tmp_path / "root", dict_name=DICT)
    try:
        gen = c.start_layout(2, 1)
        https = [gen.addresses[(s, 0)][1] for s in range(2)]
        headers = auth.Credential(role_specs.CUBE_CONTROL, c.credentials_dir).headers()

        def staged(version: int, s: int) -> str:
            """Shard ``s``'s dict of ``version`` where its server may load it (its agent's work
            directory: ``--load-root``), as the agent unpacks it."""
            dst = c.base / f"cube-2s-agent-{s}-0" / "loads" / f"{version}-{s}"
            if not dst.exists():
                shutil.copytree(shard_dir(builds[version], s), dst)
            return str(dst)

        def roll(version: int, base: int | None) -> None:  # the transfer's Reloading + Enabling
            for s, addr in enumerate(https):
                if base is None:
                    r = control(addr, "bg_load_base", {"dir": staged(version, s), "version": version}, headers)
                else:
                    r = control(addr, "bg_load_patch", {"dir": staged(version, s), "version": version,
                                                        "base_version": base}, headers)
                assert r.status_code == 202, r.text
            for addr in https:
                wait_loaded(addr, version)
            for addr in https:
                assert control(addr, "enable", {"version": version}, headers).status_code == 200

        roll(BASE, None)
        served = [BASE]  # versions enabled so far, in order
        stop, errors, counts = threading.Event(), [], {"pinned": 0, "refused": 0, "free": 0}

        def reader(seed: int) -> None:
            r = np.random.default_rng(seed)
            with CubeClient.from_topology(gen.topology, timeout_ms=5000) as client:
                while not stop.is_set():
                    q = r.choice(pool, 2000)
                    try:
                        if r.random() < 0.5:  # pinned to a recent version
                            want = served[-1 - int(r.integers(0, min(2, len(served))))]
                            try:
                                res = client.seek(q, version=want)
                            except CubeVersionUnavailable:
                                counts["refused"] += 1
                                if want == served[-1]:  # the newest enabled version is always held
                                    errors.append(f"refused the served version {want}")
                                continue
                            counts["pinned"] += 1
                            if res.version != want:
                                errors.append(f"asked {want}, answered {res.version}")
                                continue
                        else:
                            res = client.seek(q)
                            counts["free"] += 1
                        vals, found = ref.answer(res.version, q)
                        if not (np.array_equal(res.found, found) and np.array_equal(res.values, vals)):
                            bad = int((res.values != vals).any(axis=1).sum())
                            errors.append(f"version {res.version}: {bad} rows differ from the offline answer")
                    except Exception as exc:  # noqa: BLE001 - reported below
                        errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=reader, args=(s,), daemon=True) for s in range(3)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        for i in range(1, PATCHES + 1):
            roll(BASE + i, BASE + i - 1)
            served.append(BASE + i)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        print("reads", counts, "rollouts s", round(time.monotonic() - t0, 2))
        assert not errors, errors[:5]
        assert counts["pinned"] > PATCHES and counts["free"] > PATCHES, counts
        for addr in https:
            st = requests.get(f"{addr}/status", timeout=5).json()
            assert st["version"] == BASE + PATCHES and st["prev_version"] == BASE + PATCHES - 1
            # the patches' new keys outgrew the base's headroom: merged into extensions, never a copy
            assert st["extensions"] >= 1 and st["merges"]["copied"] == 0, st
        assert time.monotonic() - t0 < 60
    finally:
        c.group.stop_all()
    codes = {r.name: r.proc.returncode for r in c.group.roles}
    assert set(codes.values()) == {0}, codes  # SIGTERM: every server and agent exits 0
