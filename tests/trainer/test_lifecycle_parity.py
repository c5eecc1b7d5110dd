"""Offline/online parity of the feature lifecycle, key by key, on a real parameter-server job
and a real cube: what serving looks up for a feasign (the cube, through the client serving
uses) equals what the trainer used for it, for feasigns admitted, never admitted, evicted,
and evicted then admitted again.

A continuous job (1 pserver, 2 trainers) trains five hourly partitions of the long-tail
generator (vocabularies small enough that most feasigns come and go) with
``--feature-min-count 2``, shrink points every two hours and a time to live of two hours:
the shrink point after 01 ticks every row, the one after 03 evicts every feasign not fed
in 02-03. Its versions (a base, then patches carrying the deletions) are rolled out to a
2 x 2 cube. What the trainer used at the end is its checkpoint (taken after the last
export, nothing trained between): every row with its embedding (the ``embedx`` columns,
6 significant digits), a row without (a feasign not admitted: the pull gives zeros), or
no row (evicted, or never fed: zeros).
"""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.formats import donefile, partitions
from runtime.trainer import generator, readers
from runtime.trainer.export import EMBEDX_COL

pytestmark = pytest.mark.slow

START = "20261120/00"
HOURS = 5
DIM = 4


def _fed(root: Path, hour: partitions.Partition) -> np.ndarray:
    f = readers.read_all(partitions.files(str(root), hour)).feasigns.ravel()
    return np.unique(f[f != 0])


def _checkpoint(state: Path) -> dict[int, np.ndarray | None]:
    """key -> its embedding in the last checkpoint (``embedx`` columns), None for a row
    without one (not admitted)."""
    (ck,) = (state / "checkpoints").iterdir()
    out = {}
    for path in (ck / "000").glob("part-*"):
        with gzip.open(path, "rt") as f:
            for line in f:
                cols = line.split()
                emb = cols[1 + EMBEDX_COL:1 + EMBEDX_COL + DIM]
                out[int(cols[0])] = np.array(emb, np.float32) if len(emb) == DIM else None
    return out


def test_lifecycle_parity_serving_answers_what_the_trainer_used_key_by_key(tmp_path):
    from runtime.cube.client import CubeClient
    from runtime.local.cube import LocalCubeCluster

    data, out, state = tmp_path / "hours", tmp_path / "out", tmp_path / "state"
    generator.generate_hours(data, HOURS, START, 6000, seed=3, shape="long-tail", scale=0.004)
    hs = [partitions.Hour.parse(START).next(i) for i in range(HOURS)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "train", "--local-cluster", "--pservers", "1",
                        "--trainers", "2", "--mode", "continuous", "--data-root", str(data), "--start-hour", START,
                        "--end-hour", str(hs[-1]), "--state-dir", str(state), "--output", str(out),
                        "--table-dir", str(tmp_path / "table"), "--log-dir", str(tmp_path / "logs"),
                        "--embedding-dim", str(DIM), "--poll-seconds", "0.2", "--gate-eval-every", "0", "--gate-window", "0",
                        "--feature-min-count", "2", "--feature-ttl-hours", "2", "--shrink-every-minutes", "120"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    trained = _checkpoint(state)
    fed = [_fed(data, h) for h in hs]
    everything = np.unique(np.concatenate(fed))
    early, late = np.unique(np.concatenate(fed[:2])), np.unique(np.concatenate(fed[2:4]))
    evicted = np.setdiff1d(early, late)  # fed only in 00-01: gone at the shrink point after 03
    admitted = np.array(sorted(k for k, e in trained.items() if e is not None), np.uint64)
    counted = np.array(sorted(k for k, e in trained.items() if e is None), np.uint64)  # a row, no embedding
    back = np.intersect1d(np.intersect1d(evicted, fed[4]), admitted)  # evicted, then admitted again in 04
    gone = np.setdiff1d(evicted, np.fromiter(trained, np.uint64))  # evicted, no row at the end
    assert len(admitted) > 500 and len(counted) > 500 and len(gone) > 500 and len(back) > 0, (
        len(admitted), len(counted), len(gone), len(back))
    assert not np.isin(np.setdiff1d(evicted, fed[4]), np.fromiter(trained, np.uint64)).any(), \
        "a feasign unfed past the time to live kept its row"
    patches = donefile.read(str(out), "patch")
    assert len(donefile.read(str(out), "base")) == 1 and len(patches) == HOURS - 1
    last = max(r.id for r in patches)
    with LocalCubeCluster(tmp_path / "cube", out, shards=2, replicas=2, poll_interval_s=0.1) as cube:
        cube.wait_version(last, timeout_s=240)
        with CubeClient.from_topology(cube.topology, timeout_ms=5000) as client:
            got = client.seek(everything)
    assert got.version == last
    served = dict(zip(everything[got.found].tolist(), got.values[got.found]))
    # every feasign with an embedding in the trainer is served with it (6 significant digits of the text)
    assert sorted(served) == admitted.tolist()
    for k in admitted.tolist():
        np.testing.assert_allclose(served[k], trained[k], rtol=2e-5, atol=1e-7)
    # every other feasign ever fed (not admitted, evicted, or evicted and not admitted again)
    # is a miss, answered as zeros: what the trainer pulls for it
    others = ~np.isin(everything, admitted)
    assert not got.found[others].any() and not got.values[others].any()
    assert np.isin(counted, everything).all() and np.isin(gone, everything[others]).all()


def test_lifecycle_single_process_chain_equals_its_table_bit_for_bit(tmp_path):
    """The single process's lifecycle (its vocabulary): admission at 2, a shrink point
    every hour evicting what the last hour did not feed; the base and the patches, their
    zero rows deleting, equal the trainer's table at the last export bit for bit, and the
    served feasigns are all fed within the time to live (the last two hours)."""
    from runtime.trainer import online, online_state
    from runtime.trainer.served import zero_rows

    data, out, state = tmp_path / "hours", tmp_path / "out", tmp_path / "state"
    generator.generate_hours(data, HOURS, START, 4000, seed=4, shape="long-tail", scale=0.004)
    hs = [partitions.Hour.parse(START).next(i) for i in range(HOURS)]
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "train", "--single", "--mode", "continuous",
                        "--data-root", str(data), "--start-hour", START, "--end-hour", str(hs[-1]),
                        "--state-dir", str(state), "--output", str(out), "--poll-seconds", "0.2", "--gate-eval-every", "0",
                        "--gate-window", "0", "--embedding-dim", str(DIM), "--feature-min-count", "2",
                        "--feature-ttl-hours", "1", "--shrink-every-minutes", "60"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = sorted(donefile.read(str(out), "base") + donefile.read(str(out), "patch"), key=lambda x: x.id)
    from runtime.formats.seqfile import read_sequence_file

    keys = values = None
    deleted = 0
    for rec in recs:
        kv = [read_sequence_file(p) for p in sorted((out / rec.input).glob("part-*"))]
        k = np.concatenate([a for a, _ in kv])
        v = np.concatenate([b.reshape(-1, DIM) for _, b in kv])
        if keys is None:
            assert not zero_rows(v).any(), "a base holds no zero row"
            keys, values = k, v
        else:
            deleted += int(zero_rows(v).sum())
            keys, values = online.apply_patch(keys, values, k, v)
    assert deleted > 100, "evicted feasigns of the served table deleted by the patches"
    st = online_state.OnlineState.load(str(state))
    with np.load(Path(online_state.export_dir(str(state), st.exports[-1].id)) / online_state.SNAPSHOT) as z:
        order = np.argsort(keys)
        assert np.array_equal(z["keys"], keys[order])
        assert np.array_equal(z["values"].view(np.uint32), values[order].view(np.uint32))
    last_two = np.unique(np.concatenate([_fed(data, h) for h in hs[-2:]]))
    assert np.isin(keys, last_two).all(), "a served feasign unfed past the time to live"


def test_lifecycle_counts_and_unseen_survive_a_checkpoint_and_resume(tmp_path):
    """The lifecycle's per-feasign counts and unseen ticks are in the checkpoint (the single
    process's vocabulary, as the pservers' rows hold theirs): a job stopped after 02 and
    resumed from its checkpoint evicts and admits as one that ran through, so the chain of
    its versions (the resumed job's first export a base: the served keys are known again)
    equals the table the uninterrupted job ends with, key for key."""
    from runtime.formats.seqfile import read_sequence_file
    from runtime.trainer import online, online_state

    data = tmp_path / "hours"
    generator.generate_hours(data, HOURS, START, 4000, seed=6, shape="long-tail", scale=0.004)
    hs = [partitions.Hour.parse(START).next(i) for i in range(HOURS)]

    def train(name: str, end: partitions.Partition) -> Path:
        r = subprocess.run([sys.executable, "-m", "runtime.cli", "train", "--single", "--mode", "continuous",
                            "--data-root", str(data), "--start-hour", START, "--end-hour", str(end),
                            "--state-dir", str(tmp_path / name / "state"), "--output", str(tmp_path / name / "out"),
                            "--poll-seconds", "0.2", "--gate-eval-every", "0", "--gate-window", "0", "--embedding-dim",
                            str(DIM), "--feature-min-count", "2", "--feature-ttl-hours", "1",
                            "--shrink-every-minutes", "60", "--checkpoint-every-minutes", "60", "--seed", "3"],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"),
                           cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return tmp_path / name

    def served(run: Path) -> set:
        out = run / "out"
        recs = sorted(donefile.read(str(out), "base") + donefile.read(str(out), "patch"), key=lambda x: x.id)
        base = max(i for i, r in enumerate(recs) if r.key == r.id)
        keys = values = None
        for rec in recs[base:]:
            kv = [read_sequence_file(p) for p in sorted((out / rec.input).glob("part-*"))]
            k, v = np.concatenate([a for a, _ in kv]), np.concatenate([b.reshape(-1, DIM) for _, b in kv])
            keys, values = (k, v) if keys is None else online.apply_patch(keys, values, k, v)
        return set(keys.tolist())

    through = served(train("through", hs[-1]))
    train("stopped", hs[2])
    resumed = train("stopped", hs[-1])
    st = online_state.OnlineState.load(str(resumed / "state"))
    assert [e.kind for e in st.exports][3] == "base"
    assert served(resumed) == through
