"""Patches cut from the fed feasigns (runtime.trainer.fedrows) in a parameter-server job:
a patch holds exactly the feasigns its hour fed, pulled from the pservers; base + patches
equal the pservers' table bit for bit (a later base, pulled whole, agrees on every row the
later hour did not touch)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.formats import donefile, partitions
from runtime.formats.seqfile import read_sequence_file
from runtime.trainer import generator, online, readers

START = "20261120/00"


def _version(out: Path, rec) -> tuple[np.ndarray, np.ndarray]:
    kv = [read_sequence_file(p) for p in sorted((out / rec.input).glob("part-*"))]
    keys = np.concatenate([k for k, _ in kv])
    values = np.concatenate([v.reshape(len(k), -1) for k, v in kv])
    o = np.argsort(keys)
    return keys[o], values[o]


def _fed(root: Path, hour: str) -> np.ndarray:
    return np.unique(readers.read_all(partitions.files(str(root), partitions.Hour.parse(hour))).feasigns)


@pytest.mark.slow
def test_ps_patch_is_the_hours_fed_rows_and_chains_bit_for_bit(tmp_path):
    from runtime.local.ps import run_local_ps
    from runtime.trainer.config import TrainConfig

    root = tmp_path / "hours"
    generator.generate_hours(root, 3, START, 3000, seed=5)
    out, state = tmp_path / "out", tmp_path / "state"
    cfg = TrainConfig(mode="continuous", data_root=str(root), start_hour=START, end_hour="20261120/02",
                      state_dir=str(state), output=str(out), base_every_minutes=120, poll_seconds=0.2, table_dir=str(tmp_path / "t"),
                      gate_eval_every=0,  # every row trained: the patch is every feasign the hour fed
                      feature_min_count=1)  # every feasign admitted at once (admission: test_lifecycle_parity)
    rec = run_local_ps(cfg, 1, 2, log_dir=str(tmp_path / "logs"), timeout_s=300)
    assert [e["kind"] for e in rec["exports"]] == ["base", "patch", "base"]
    (b0,), (p1,) = donefile.read(str(out), "base")[:1], donefile.read(str(out), "patch")
    b2 = donefile.read(str(out), "base")[1]
    k0, v0 = _version(out, b0)
    k1, v1 = _version(out, p1)
    k2, v2 = _version(out, b2)
    # the base: every feasign hour 00 fed (both trainers' shards), nothing else
    assert np.array_equal(k0, _fed(root, "20261120/00"))
    # the patch: exactly the feasigns hour 01 fed, by both trainers
    assert np.array_equal(k1, _fed(root, "20261120/01"))
    assert rec["exports"][1]["rows"] == len(k1) < len(np.union1d(k0, k1))
    kc, vc = online.apply_patch(k0, v0, k1, v1)
    # the later base (pulled whole): the same keys, and every row hour 02 did not feed is
    # bit for bit what base + patch gave
    fed2 = _fed(root, "20261120/02")
    assert np.array_equal(k2, np.union1d(kc, fed2))
    keep = ~np.isin(kc, fed2)
    assert keep.sum() > 100
    pos = np.searchsorted(k2, kc[keep])
    assert np.array_equal(v2[pos].view(np.uint32), vc[keep].view(np.uint32))
    # and the rows hour 02 fed did move
    moved = np.isin(kc, fed2)
    pos2 = np.searchsorted(k2, kc[moved])
    assert (v2[pos2] != vc[moved]).any(axis=1).mean() > 0.9


def test_read_saved_keys_gives_the_keys_read_saved_table_gives(tmp_path):
    import gzip

    from runtime.trainer import export

    rng = np.random.default_rng(0)
    keys = rng.integers(1, np.iinfo(np.uint64).max, 500, dtype=np.uint64, endpoint=True)
    for i, part in enumerate(np.array_split(keys, 3)):  # two pservers' files in one dir
        path = tmp_path / "000" / f"part-00{i % 2}-0000{i}.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            for k in part.tolist():
                f.write(f"{k} 1 0 0 1 0 0.5 0 0 0 0 0.25 0.125\n")
    full, _ = export.read_saved_table(str(tmp_path), 3)
    got = export.read_saved_keys(str(tmp_path))
    assert got.dtype == np.uint64 and np.array_equal(np.sort(got), np.sort(full))
    assert np.array_equal(np.sort(got), np.sort(keys))
    (tmp_path / "000" / "part-009-00000").write_text("x 1 2\n")
    with pytest.raises(export.ExportError, match="part-009-00000"):
        export.read_saved_keys(str(tmp_path))
    with pytest.raises(export.ExportError, match="no part files"):
        export.read_saved_keys(str(tmp_path / "empty"))
