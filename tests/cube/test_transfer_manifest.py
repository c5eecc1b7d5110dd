"""A version is rolled out whole or not at all: the transfer checks every file of a version
against its manifest (runtime/formats/manifest.py) before building it, on a local root and
on the S3 test server. A sparse file cut between two records, a dense parameter file cut
or altered, a manifest missing: each refused with an error naming the file and what
differs, the served version kept on every replica, and the next whole version served.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime import storage, storage_write
from runtime.formats import donefile, manifest
from runtime.formats.seqfile_writer import write_sequence_file
from tests.cube.transfer_harness import make_transfer

DIM = 4
SYNC = b"0123456789abcdef"


def stage_version(stage: Path, vid: int, rows: int = 400, seed: int = 0) -> Path:
    """A version's files as the trainer's export stages them (two sparse parts, a dense
    directory) with its manifest; returns the staged version directory."""
    rng = np.random.default_rng(seed + vid)
    vdir = stage / str(vid)
    (vdir / "sparse").mkdir(parents=True)
    (vdir / "dense").mkdir()
    keys = rng.choice(1 << 40, rows, replace=False).astype(np.uint64)
    values = rng.standard_normal((rows, DIM)).astype(np.float32)
    for i, sl in enumerate(np.array_split(np.arange(rows), 2)):
        write_sequence_file(vdir / "sparse" / f"part-{i:05d}", keys[sl], values[sl], sync=SYNC)
    (vdir / "dense" / "inference.pdmodel").write_bytes(rng.bytes(3000))
    (vdir / "dense" / "inference.pdiparams").write_bytes(rng.bytes(5000))
    (vdir / "dense" / "model_meta.json").write_text('{"version": %d}' % vid)
    (vdir / manifest.FILE).write_text(manifest.build(vdir, vid).to_json())
    return vdir


def publish(root: str, vdir: Path, vid: int, key: int | None = None, count: int | None = None) -> None:
    """Uploads a staged version to ``root`` (files, manifest, then the donefile line,
    with ``count`` rows when given)."""
    storage_write.upload_tree(vdir, storage.join(root, "versions", str(vid)))
    rec = (donefile.base_record(vid, DIM, count, manifest=manifest.location(vid)) if key is None else
           donefile.patch_record(vid, key, DIM, count, manifest=manifest.location(vid)))
    donefile.append(root, "base" if key is None else "patch", rec)


def cut_between_records(path: Path, keep_rows: int, dim: int = DIM) -> None:
    """Rewrites ``path`` as the byte prefix holding its first ``keep_rows`` records (the
    same sync marker: a file cut exactly between two records)."""
    from runtime.formats.seqfile import read_sequence_file

    keys, values = read_sequence_file(path)
    short = path.with_name(".short")
    write_sequence_file(short, keys[:keep_rows], values[:keep_rows], sync=SYNC)
    prefix = short.read_bytes()
    assert path.read_bytes().startswith(prefix) and len(prefix) < path.stat().st_size
    path.write_bytes(prefix)
    short.unlink()


def damage(kind: str, vdir: Path) -> str:
    """Damages the staged version ``vdir`` as ``kind`` says; returns the file name and
    what the refusal must say."""
    if kind == "sparse_cut":
        cut_between_records(vdir / "sparse" / "part-00001", 100)
        return "part-00001: size"
    if kind == "dense_cut":
        p = vdir / "dense" / "inference.pdiparams"
        p.write_bytes(p.read_bytes()[:-40])
        return "inference.pdiparams: size"
    if kind == "dense_altered":
        p = vdir / "dense" / "inference.pdiparams"
        b = bytearray(p.read_bytes())
        b[100] ^= 0xFF
        p.write_bytes(bytes(b))
        return "inference.pdiparams: sha256"
    if kind == "rows_only":  # bytes and checksum rewritten to the cut file: only rows differ
        cut_between_records(vdir / "sparse" / "part-00000", 50)
        m = manifest.Manifest.parse((vdir / manifest.FILE).read_bytes(), "m")
        p = vdir / "sparse" / "part-00000"
        files = [f.model_copy(update={"bytes": p.stat().st_size, "sha256": manifest.sha256_file(p)})
                 if f.path == "sparse/part-00000" else f for f in m.files]
        (vdir / manifest.FILE).write_text(m.model_copy(update={"files": files}).to_json())
        return "part-00000: rows differ"
    if kind == "manifest_missing":
        (vdir / manifest.FILE).unlink()
        return "manifest.json: manifest missing"
    if kind == "count":  # files and manifest agree; the donefile line says another count
        return "donefile line says 401 rows, its manifest's SequenceFiles hold 400"
    if kind == "extra_part":
        write_sequence_file(vdir / "sparse" / "part-00002", np.array([7], np.uint64),
                            np.zeros((1, DIM), np.float32))
        return "part-00002: not in the version's manifest"
    raise ValueError(kind)


def _roll_bad_then_good(cluster, root: str, tmp_path: Path, kind: str) -> None:
    stage = tmp_path / "stage"
    publish(root, stage_version(stage, 10), 10)
    tr = make_transfer(cluster, root, tmp_path / "work", max_rollout_attempts=3)
    assert tr.poll_once()["status"] == "finished"
    assert cluster.versions() == [10] * 4
    bad = stage_version(stage, 11)
    why = damage(kind, bad)
    publish(root, bad, 11, key=10, count=401 if kind == "count" else None)
    entry = tr.poll_once()
    assert entry["status"] == "refused" and entry["given_up"], entry
    assert why in entry["error"], entry["error"]
    assert cluster.versions() == [10] * 4  # the served version on every replica
    info = tr.info()
    assert info.version == 10 and info.last_rollout.status == "refused" and why in info.last_rollout.error
    assert tr.metrics.rollouts.labels("refused")._value.get() == 1
    assert tr.poll_once() is None  # refused once: not retried
    publish(root, stage_version(stage, 12), 12)  # the next whole version (a base) is served
    assert tr.poll_once()["status"] == "finished"
    assert cluster.versions() == [12] * 4


@pytest.mark.parametrize("kind", ["sparse_cut", "dense_cut", "dense_altered", "rows_only", "manifest_missing",
                                  "extra_part", "count"])
def test_local_root_refuses_a_version_that_is_not_whole(cluster, tmp_path, kind):
    root = tmp_path / "root"
    (root / "donefile").mkdir(parents=True)
    _roll_bad_then_good(cluster, str(root), tmp_path, kind)


@pytest.mark.parametrize("kind", ["sparse_cut", "dense_cut", "manifest_missing"])
def test_object_store_root_refuses_a_version_that_is_not_whole(cluster, tmp_path, s3_bucket, kind):
    _roll_bad_then_good(cluster, f"{s3_bucket}/models", tmp_path, kind)


def test_a_line_without_manifest_is_rolled_out_unverified(cluster, tmp_path):
    """Versions published by other tools (no ``manifest`` in their line) go out as before."""
    root = tmp_path / "root"
    (root / "donefile").mkdir(parents=True)
    vdir = stage_version(tmp_path / "stage", 10)
    (vdir / manifest.FILE).unlink()
    storage_write.upload_tree(vdir, storage.join(str(root), "versions", "10"))
    donefile.append(str(root), "base", donefile.base_record(10, DIM))
    tr = make_transfer(cluster, str(root), tmp_path / "work")
    assert tr.poll_once()["status"] == "finished"
