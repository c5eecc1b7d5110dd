"""Retention of published versions (runtime/cube/transfer/retention.py): beyond
keepVersions, old versions are deleted from the version root (a directory, the file
server through DELETE, an object store), never a link of a kept, served or pinned
version's chain."""
from __future__ import annotations

from runtime import storage, storage_write
from runtime.cube.transfer import retention, rollback
from runtime.fileserver.app import create_app
from runtime.formats import donefile
from tests.cube.transfer_harness import DICT, drain, make_transfer
from tests.helpers import ThreadedApp


def test_protected_keeps_every_chain_of_a_kept_version():
    b = [donefile.base_record(10), donefile.base_record(20)]
    p = [donefile.patch_record(11, 10), donefile.patch_record(12, 10), donefile.patch_record(21, 20),
         donefile.patch_record(22, 20)]
    doomed, kept = retention.protected(1, b, p, pinned=set())
    assert (doomed, kept) == ([10, 11, 12], {20, 21, 22})  # 22's chain: its base 20 and patch 21
    doomed, kept = retention.protected(1, b, p, pinned={11})  # a pinned version keeps its chain
    assert (doomed, kept) == ([12], {10, 11, 20, 21, 22})


def _publish(root: str, vid: int, key: int, patch: bool = False) -> None:
    """A version with one part file (the harness's stub builder reads its bytes)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / "part-00000"
        part.write_bytes(b"v%d" % vid)
        storage_write.upload(part, storage.join(root, "versions", str(vid), "sparse", "part-00000"), "tok")
    rec = donefile.DonefileRecord(id=vid, key=key, input=donefile.sparse_dir(vid))
    donefile.append(root, "patch" if patch else "base", rec, "tok")


def _exists(root: str, rel: str) -> bool:
    try:
        return bool(storage.list_dir(storage.join(root, rel) + "/"))
    except storage.LocationError:
        return False


def _run(cluster, root: str, work):
    for vid, key, patch in [(10, 10, False), (11, 10, True), (12, 10, True)]:
        _publish(root, vid, key, patch)
    tr = make_transfer(cluster, root, work, keep_versions=2, token="tok")
    assert [e["version"] for e in drain(tr)] == [10, 11, 12]
    # 12 is served: its chain (10, 11, 12) is kept although only 2 versions are to be kept
    assert all(_exists(root, f"versions/{v}") for v in (10, 11, 12))
    rollback.set_pin(tr, 11)  # pinned: 11's chain kept
    drain(tr)
    for vid, key, patch in [(20, 20, False), (21, 20, True), (22, 20, True)]:
        _publish(root, vid, key, patch)
    rollback.set_pin(tr, 22)
    drain(tr)
    assert tr.info().version == 22 and cluster.versions() == [22] * 4
    # newest 2 are 21, 22; their chain adds 20; the served/pinned version is 22
    assert [v for v in (10, 11, 12, 20, 21, 22) if _exists(root, f"versions/{v}")] == [20, 21, 22]
    assert not any(_exists(root, f"cube/{DICT}/{n}") for n in ("10", "11", "11-chain", "12"))
    assert _exists(root, f"cube/{DICT}/22-chain")
    return tr


def test_local_root(cluster, tmp_path):
    root = tmp_path / "root"
    (root / "donefile").mkdir(parents=True)
    _run(cluster, str(root), tmp_path / "work")


def test_file_server_root(cluster, tmp_path):
    fs = ThreadedApp(create_app(tmp_path / "served", token="tok"))
    try:
        _run(cluster, fs.url + "/models", tmp_path / "work")
        r = storage.session().delete(fs.url + "/models/versions/20")
        assert r.status_code == 401  # DELETE needs the upload token
        assert storage.session().delete(fs.url + "/", headers={"Authorization": "Bearer tok"}).status_code == 400
    finally:
        fs.close()


def test_object_store_root(cluster, tmp_path, s3_bucket):
    _run(cluster, f"{s3_bucket}/models", tmp_path / "work")
