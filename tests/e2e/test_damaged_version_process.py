"""A damaged version never reaches users, at process level on a local
root (through the file server) and on the S3 test server: the trainer's export publishes
a good base, then versions damaged in the root (a sparse SequenceFile cut exactly
between two records, the dense parameters cut by 40 bytes or altered, the manifest
missing), then a good one. Each damaged version is refused by the transfer with an error
naming the file and what differs; serving keeps answering the good version under a
client load (0 failed requests) and then serves the next good one."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from runtime import storage, storage_write
from runtime.formats import donefile, features, manifest
from runtime.formats.seqfile import read_sequence_file
from runtime.formats.seqfile_writer import write_sequence_file
from tests.helpers import PredictLoad, export_version, make_table, start_serving

pytestmark = pytest.mark.slow

V1, V5 = 1_800_000_200, 1_800_000_205


def _lines(n: int = 32) -> list[str]:
    rng = np.random.default_rng(2)
    return ["\t".join([str(i % 2)] + [str(int(rng.integers(0, 50))) for _ in range(13)]
                      + [format(int(rng.integers(0, 30)), "x") for _ in range(26)]) for i in range(n)]


def _cut_between_records(part: Path) -> None:
    """Keeps the byte prefix of ``part`` holding its first half of records (the same
    header and sync marker: a file cut exactly between two records)."""
    from runtime.formats.seqfile import SequenceFileReader

    keys, values = read_sequence_file(part)
    with SequenceFileReader(part) as r:
        sync = r.header.sync
    short = part.with_name(".short")
    write_sequence_file(short, keys[: len(keys) // 2], values[: len(keys) // 2], sync=sync)
    prefix, whole = short.read_bytes(), part.read_bytes()
    assert whole.startswith(prefix) and len(prefix) < len(whole)
    part.write_bytes(prefix)
    short.unlink()


def _damage(vdir: Path, kind: str) -> str:
    if kind == "sparse_cut":
        _cut_between_records(vdir / "sparse" / "part-00000")
        return "part-00000: size"
    p = vdir / "dense" / "inference.pdiparams"
    if kind == "dense_cut":
        p.write_bytes(p.read_bytes()[:-40])
        return "inference.pdiparams: size"
    if kind == "dense_altered":
        b = bytearray(p.read_bytes())
        b[len(b) // 3] ^= 0x10
        p.write_bytes(bytes(b))
        return "inference.pdiparams: sha256"
    (vdir / manifest.FILE).unlink()
    return "manifest.json: manifest missing"


def _publish(root: str, version: int, table: dict, seed: int, token: str, kind: str | None = None) -> str:
    """Exports ``version`` to a staging root, damages it there (``kind``), then copies its
    files to ``root`` and appends its donefile line last (the trainer's order). Returns
    what the refusal must name ("" for an undamaged version)."""
    why = ""
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        export_version(stage, version, table, seed=seed)
        vdir = stage / "versions" / str(version)
        if kind:
            why = _damage(vdir, kind)
        storage_write.upload_tree(vdir, storage.join(root, "versions", str(version)), token)
        (rec,) = donefile.read(str(stage), "base")
        donefile.append(root, "base", rec, token)
    return why


@pytest.mark.parametrize("where", ["file_server", "s3"])
def test_damaged_versions_are_refused_and_serving_keeps_answering(tmp_path, request, where):
    from runtime.local.cube import LocalCubeCluster

    lines = _lines()
    b = features.parse_criteo_lines(lines)
    if where == "s3":
        root = f"{request.getfixturevalue('s3_bucket')}/model"
    else:
        root = tmp_path / "root"
    with LocalCubeCluster(tmp_path / "cube", root, shards=2, replicas=2, poll_interval_s=0.1) as cube:
        tok = cube.token
        _publish(cube.root_url, V1, make_table(b.feasigns, 1), 1, tok)
        cube.wait_version(V1, timeout_s=180)
        first: list = []

        def answers_v1(u: str) -> bool:
            r = requests.post(u + "/predict", json={"lines": lines[:8]}, timeout=5)
            first[:] = [r]
            return r.status_code == 200 and r.json()["model_version"] == V1

        url = start_serving(cube, tmp_path / "sv", ready=answers_v1)
        r = first[0]
        want = r.json()["probabilities"]
        seen: dict[int, int] = {}

        def answered(v: int, probs: list[float]) -> None:
            seen[v] = seen.get(v, 0) + 1
            if v == V1:
                np.testing.assert_allclose(probs, want, rtol=1e-6)

        load = PredictLoad(url, lines[:8], answered).start()
        try:
            kinds = ["sparse_cut", "dense_cut", "dense_altered", "manifest_missing"]
            for i, kind in enumerate(kinds, 1):
                v = V1 + i
                why = _publish(cube.root_url, v, make_table(b.feasigns, 10 + i), 10 + i, tok, kind)
                deadline = time.monotonic() + 120
                while True:
                    cube.group.check()
                    hist = requests.get(cube.transfer_url + "/dict/deploy/history", timeout=5).json()["history"]
                    entry = next((h for h in hist if h["version"] == v), None)
                    if entry is not None:
                        break
                    assert time.monotonic() < deadline, f"version {v} ({kind}) not decided"
                    time.sleep(0.1)
                assert entry["status"] == "refused" and why in entry["error"], (kind, entry)
                info = cube.info()
                assert info.version == V1 and info.last_rollout.status == "refused", info
            assert seen.get(V1, 0) > 0 and set(seen) == {V1}, seen
            _publish(cube.root_url, V5, make_table(b.feasigns, 5), 5, tok)
            cube.wait_version(V5, timeout_s=180)
            deadline = time.monotonic() + 60
            while V5 not in seen:
                assert time.monotonic() < deadline, f"serving did not switch to {V5}: {seen}"
                time.sleep(0.1)
        finally:
            load.stop()
        assert not load.errors, load.errors[:5]
        print(f"{where}: {sum(seen.values())} requests, 0 failed, answers per version {seen}")
