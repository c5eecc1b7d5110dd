"""A continuous job resized to another pserver count: the checkpoint's
layout and record (runtime.trainer.checkpoint), and, at process level, a job checkpointed
with 1 pserver resumed with 2, then 1 again, then 2 with another table shard count: every
row of the checkpoint in the new job's tables bit for bit, the next partition's AUC as the
old job gives it, a base next."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.trainer import checkpoint, generator, online, online_state

START = "20261120/00"


def _write_ckpt(d: Path, rows: dict[int, str], dense: list[list[str]], shards: int, pservers: int,
                info: bool = True) -> Path:
    """A checkpoint as Paddle writes it: sparse rows in part-<pserver>-<shard>.gz by
    key % shards (pserver = shard // ceil(shards / pservers)), dense slices part-<p>.gz."""
    per = -(-shards // pservers)
    (d / "000").mkdir(parents=True)
    (d / "001").mkdir()
    for s in range(shards):
        with gzip.open(d / "000" / f"part-{s // per:03d}-{s:05d}.gz", "wt") as f:
            f.writelines(f"{k} {v}\n" for k, v in rows.items() if k % shards == s)
    for p, lines in enumerate(dense):
        with gzip.open(d / "001" / f"part-{p:03d}.gz", "wt") as f:
            f.writelines(x + "\n" for x in lines)
    if info:
        checkpoint.write_info(str(d), checkpoint.CheckpointInfo(pservers=pservers, trainers=2,
                                                                 pserver_table_shards=shards, embedding_dim=2))
    return d


ROWS = {12884901888: "0 0 341.9 3419 0 -0.0158392 -0.110897", 7: "1 0 1 0 0.5 1e-05 0.975298",
        21474836485: "2 0 184.6 1846 0 0.0289081 -0.140937", 3: "3 0 0 0 0 0 0"}
DENSE = ["-0.0335503 0.000382447 6.83803e-08", "-0.0407084 3.65461e-05 8.84807e-10", "1 2 3"]


def test_scan_reads_the_layout_and_rejects_incomplete_checkpoints(tmp_path):
    one = _write_ckpt(tmp_path / "one", ROWS, [DENSE], shards=4, pservers=1)
    lay = checkpoint.scan(str(one))
    assert (lay.pservers, lay.pserver_table_shards) == (1, 4)
    assert lay.describe_change(2, 4) == "pservers 1 -> 2" and lay.describe_change(1, 4) is None
    assert lay.describe_change(2, 8) == "pservers 1 -> 2, sparse shards 4 -> 8"
    # without the record, the count comes from the files (one dense file per pserver)
    two = _write_ckpt(tmp_path / "two", ROWS, [DENSE[:2], DENSE[2:]], shards=4, pservers=2, info=False)
    assert checkpoint.scan(str(two)).pservers == 2 and not checkpoint.scan(str(two)).recorded
    os.unlink(two / "000" / "part-000-00001.gz")  # a shard file missing: Paddle would load nothing
    with pytest.raises(checkpoint.CheckpointError, match=r"two: table 000: shard files \[0, 2, 3\]"):
        checkpoint.scan(str(two))
    three = _write_ckpt(tmp_path / "three", ROWS, [DENSE[:2], DENSE[2:]], shards=4, pservers=2)
    os.unlink(three / "000" / "part-001-00003.gz")  # the last one: only the record tells
    with pytest.raises(checkpoint.CheckpointError, match="says 4 sparse shards, the files 3"):
        checkpoint.scan(str(three))
    # the record and the files disagree
    checkpoint.write_info(str(one), checkpoint.CheckpointInfo(pservers=2, trainers=2, pserver_table_shards=4,
                                                              embedding_dim=2))
    with pytest.raises(checkpoint.CheckpointError, match="written by 2 pserver"):
        checkpoint.scan(str(one))
    single = tmp_path / "single"
    single.mkdir()
    (single / "model.pdparams").write_bytes(b"x")
    with pytest.raises(checkpoint.CheckpointError, match="single: no sparse table files"):
        checkpoint.scan(str(single))
    with pytest.raises(checkpoint.CheckpointError, match="missing"):
        checkpoint.scan(str(tmp_path / "absent"))
    (one / checkpoint.INFO_FILE).write_text('{"pservers": 0}')
    with pytest.raises(checkpoint.CheckpointError, match="not a valid checkpoint record"):
        checkpoint.read_info(str(one))


def test_compare_counts_every_missing_extra_and_changed_row(tmp_path):
    a = _write_ckpt(tmp_path / "a", ROWS, [DENSE], shards=4, pservers=1)
    same = _write_ckpt(tmp_path / "same", ROWS, [DENSE[:2], DENSE[2:]], shards=4, pservers=2)
    rep = checkpoint.compare(str(a), str(same))  # another layout, the same rows
    assert rep["equal"] and rep["rows"] == 4 and rep["dense_lines"] == 3
    rows = dict(ROWS)
    del rows[7]
    rows[3] = "3 0 0 0 0 0 1e-45"  # one column of one row, in its last digit
    rows[99] = "9 0 0 0 0 0 0"
    b = _write_ckpt(tmp_path / "b", rows, [DENSE[:2] + ["1 2 3.00001"]], shards=4, pservers=1)
    rep = checkpoint.compare(str(a), str(b))
    assert (rep["missing"], rep["extra"], rep["changed"], rep["dense_changed"], rep["equal"]) == (1, 1, 1, 1, False)
    c = _write_ckpt(tmp_path / "c", ROWS, [DENSE[:2]], shards=4, pservers=1)  # a dense line lost
    assert checkpoint.compare(str(a), str(c))["dense_changed"] == 1


def test_relayout_puts_every_row_verbatim_into_its_new_shard(tmp_path):
    src = _write_ckpt(tmp_path / "src", ROWS, [DENSE[:2], DENSE[2:]], shards=4, pservers=2)
    lay = checkpoint.relayout(str(src), str(tmp_path / "dst"), 3)
    assert lay.pserver_table_shards == 3 and lay.pservers == 2  # dense files copied as they are
    for s in range(3):
        with gzip.open(tmp_path / "dst" / "000" / f"part-000-{s:05d}.gz", "rt") as f:
            got = dict(ln.rstrip("\n").split(" ", 1) for ln in f)
        assert got == {str(k): v for k, v in ROWS.items() if k % 3 == s}
    assert checkpoint.compare(str(src), str(tmp_path / "dst"))["equal"]


def test_state_records_a_due_base_and_reads_older_files(tmp_path):
    st = online_state.OnlineState(data_root="/d", start_hour=START, next_hour="20261120/02", base_id=5, since_base=1,
                            base_due="pservers 1 -> 2")
    st.save(str(tmp_path))
    assert online_state.OnlineState.load(str(tmp_path)).base_due == "pservers 1 -> 2"
    raw = json.loads((tmp_path / online_state.STATE_FILE).read_text())
    del raw["base_due"]  # a state written before the field
    (tmp_path / online_state.STATE_FILE).write_text(json.dumps(raw))
    assert online_state.OnlineState.load(str(tmp_path)).base_due is None


# ---- process level ---------------------------------------------------------------------

def _float_rows(table_dir: Path) -> dict[int, np.ndarray]:
    """{key: float32[columns]} of a saved sparse table, read independently of the module."""
    out = {}
    for p in sorted(table_dir.glob("part-*")):
        with gzip.open(p, "rt") as f:
            for ln in f:
                k, *cols = ln.split()
                assert int(k) not in out
                out[int(k)] = np.array([float(c) for c in cols], np.float32)
    return out


def _assert_rows_bit_for_bit(ckpt: Path, loaded: Path) -> int:
    a, b = _float_rows(ckpt / "000"), _float_rows(loaded / "000")
    assert a.keys() == b.keys(), (len(a.keys() - b.keys()), len(b.keys() - a.keys()))
    for k, v in a.items():
        assert v.shape == b[k].shape and np.array_equal(v.view(np.uint32), b[k].view(np.uint32)), k
    return len(a)


def _cfg(root, state, out, end, **kw):
    from runtime.trainer.config import TrainConfig

    return TrainConfig(mode="continuous", data_root=str(root), start_hour=START, end_hour=end,
                       state_dir=str(state), output=str(out), base_every_minutes=1440, poll_seconds=0.2, **kw)


def _assert_owners(loaded: Path, shards: int, pservers: int) -> None:
    """Each row is held by its new owner: shard ``key % shards``, pserver ``shard // ceil(shards / pservers)``."""
    per = -(-shards // pservers)
    files = sorted((loaded / "000").glob("part-*"))
    assert len(files) == shards and {int(p.name[5:8]) for p in files} == set(range(pservers))
    for p in files:
        owner, shard = int(p.name[5:8]), int(p.name[9:14])
        assert owner == shard // per
        with gzip.open(p, "rt") as f:
            assert all(int(ln.split(" ", 1)[0]) % shards == shard for ln in f)


def _auc_logged(log: Path, hour: str) -> float:
    return float(log.read_text(errors="replace").split(f"partition {hour}: auc ")[1].split()[0])


@pytest.mark.slow
def test_continuous_job_resized_1_to_2_to_1_pservers_loses_no_row(tmp_path):
    """1 pserver (00, 01) -> 2 (02: killed after scoring it, then again) -> 1 (03) -> 2 with
    4 sparse shards instead of 8 (04, the re-layout path)."""
    from runtime import proc
    from runtime.local.ps import run_local_ps

    root = tmp_path / "data"
    generator.generate_hours(root, 5, START, 6000, seed=4)
    state, out = tmp_path / "state", tmp_path / "out"
    run_local_ps(_cfg(root, state, out, "20261120/01"), 1, 2, log_dir=str(tmp_path / "logs-a"), timeout_s=300)
    ck = state / online_state.CHECKPOINTS / "20261120-02"
    assert json.loads((ck / checkpoint.INFO_FILE).read_text())["pservers"] == 1
    kept = tmp_path / "ckpt-1p"
    shutil.copytree(ck, kept)

    # what the old job gives on the next partition: the same checkpoint, 1 pserver
    shutil.copytree(state, tmp_path / "ref-state")
    shutil.copytree(out, tmp_path / "ref-out")
    ref = run_local_ps(_cfg(root, tmp_path / "ref-state", tmp_path / "ref-out", "20261120/02"), 1, 2,
                            log_dir=str(tmp_path / "logs-ref"), timeout_s=300)
    auc_ref = ref["partitions"][0]["auc_before"]
    # a base every 1440 minutes, but a restored PS job holds the checkpoint's text values, not the
    # exported floats: its first export is a base even without a resize (the base after a
    # resize itself, recorded across a restart, is test_a_restart_before_the_base_keeps_it_due)
    assert ref["exports"][-1]["kind"] == "base"

    # resized to 2 pservers; trainer 0 killed once it has scored 02 (before its export)
    logs_b = tmp_path / "logs-b1"

    def started(_endpoints, pids):
        def watch():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                p = logs_b / "trainer-0.log"
                if p.exists() and "partition 20261120/02: auc" in p.read_text(errors="replace"):
                    os.kill(pids[0], signal.SIGKILL)
                    return
                time.sleep(0.1)
        threading.Thread(target=watch, daemon=True).start()

    with pytest.raises(proc.RoleFailed):
        run_local_ps(_cfg(root, state, out, "20261120/02"), 2, 2, log_dir=str(logs_b), timeout_s=300,
                          on_started=started)
    assert abs(_auc_logged(logs_b / "trainer-0.log", "20261120/02") - auc_ref) < 1e-4
    st = online_state.OnlineState.load(str(state))
    assert st.base_due == "pservers 1 -> 2" and st.next_hour == "20261120/02"
    report = json.loads((state / checkpoint.RESIZED / "report.json").read_text())
    assert report["equal"] and report["change"] == "pservers 1 -> 2"
    loaded = state / checkpoint.RESIZED / "loaded"
    n = _assert_rows_bit_for_bit(kept, loaded)
    assert n == report["rows"] > 1000
    _assert_owners(loaded, 8, 2)

    # the job restarted, still on 2 pservers: same AUC, the next export is a base
    b2 = run_local_ps(_cfg(root, state, out, "20261120/02"), 2, 2, log_dir=str(tmp_path / "logs-b2"),
                           timeout_s=300)
    assert abs(b2["partitions"][0]["auc_before"] - auc_ref) < 1e-4
    kinds = [e["kind"] for e in b2["exports"]]
    ids = [e["id"] for e in b2["exports"]]
    assert kinds == ["base", "patch", "base"] and ids == sorted(ids) and len(set(ids)) == 3
    st = online_state.OnlineState.load(str(state))
    assert st.base_due is None and st.base_id == ids[-1]
    ck2 = state / online_state.CHECKPOINTS / "20261120-03"
    assert json.loads((ck2 / checkpoint.INFO_FILE).read_text())["pservers"] == 2
    kept2 = tmp_path / "ckpt-2p"
    shutil.copytree(ck2, kept2)

    # and back to 1 pserver for 03
    c = run_local_ps(_cfg(root, state, out, "20261120/03"), 1, 2, log_dir=str(tmp_path / "logs-c"),
                          timeout_s=300)
    assert [e["kind"] for e in c["exports"]][-1] == "base" and c["exports"][-1]["id"] > ids[-1]
    report = json.loads((state / checkpoint.RESIZED / "report.json").read_text())
    assert report["equal"] and report["change"] == "pservers 2 -> 1"
    assert _assert_rows_bit_for_bit(kept2, state / checkpoint.RESIZED / "loaded") == report["rows"]
    _assert_owners(state / checkpoint.RESIZED / "loaded", 8, 1)
    kept3 = tmp_path / "ckpt-1p-03"
    shutil.copytree(state / online_state.CHECKPOINTS / "20261120-04", kept3)

    # 2 pservers and 4 table shards: the rows re-laid out by key % 4, then loaded
    d = run_local_ps(_cfg(root, state, out, "20261120/04", pserver_table_shards=4), 2, 2,
                          log_dir=str(tmp_path / "logs-d"), timeout_s=300)
    assert d["exports"][-1]["kind"] == "base" and d["exports"][-1]["id"] > c["exports"][-1]["id"]
    report = json.loads((state / checkpoint.RESIZED / "report.json").read_text())
    assert report["equal"] and report["change"] == "pservers 1 -> 2, sparse shards 8 -> 4"
    assert _assert_rows_bit_for_bit(kept3, state / checkpoint.RESIZED / "loaded") == report["rows"]
    _assert_owners(state / checkpoint.RESIZED / "loaded", 4, 2)
    assert not (state / checkpoint.RESIZED / "relayout").exists()


def test_a_restart_before_the_base_keeps_it_due(tmp_path):
    """Resized (restore reports a layout change), stopped before its next export, then
    restarted on the checkpoint's own count (nothing to re-seed): the export is still a
    base, because the state recorded it; without that record the same run cuts a patch."""
    from runtime.formats import partitions
    from runtime.trainer.config import TrainConfig
    from tests.trainer.test_train_result import _FakeWorker

    class Worker(_FakeWorker):
        def __init__(self, change=None, fail=False):
            super().__init__(rows=10, seconds=0.01)
            self.change, self.fail = change, fail

        def restore(self, directory):
            assert os.path.isdir(directory)
            return self.change

        def train_pass(self, ds, label, expected_rows):
            if self.fail:
                raise RuntimeError("killed in the middle of the partition")
            return super().train_pass(ds, label, expected_rows)

    for h in ("20261120/00", "20261120/01"):
        d = tmp_path / "data" / h
        d.mkdir(parents=True)
        (d / "part-0.txt").write_text("")
        partitions.mark_complete(d)

    def cfg(state, end):
        return TrainConfig(mode="continuous", data_root=str(tmp_path / "data"), start_hour=START, end_hour=end,
                           state_dir=str(state), table_dir=str(tmp_path / "table"),
                           feature_ttl_hours=0)  # no eviction: a restart would force a base by itself

    state = tmp_path / "state"
    online.run(Worker(), cfg(state, "20261120/00"), [], {})
    shutil.copytree(state, tmp_path / "control")
    with pytest.raises(RuntimeError, match="killed"):
        online.run(Worker("pservers 1 -> 2", fail=True), cfg(state, "20261120/01"), [], {})
    assert online_state.OnlineState.load(str(state)).base_due == "pservers 1 -> 2"
    online.run(Worker(None), cfg(state, "20261120/01"), [], {})
    st = online_state.OnlineState.load(str(state))
    assert [e.kind for e in st.exports] == ["base", "base"] and st.base_due is None
    assert st.exports[1].id > st.exports[0].id and st.base_id == st.exports[1].id
    online.run(Worker(None), cfg(tmp_path / "control", "20261120/01"), [], {})
    assert [e.kind for e in online_state.OnlineState.load(str(tmp_path / "control")).exports] == ["base", "patch"]
