"""Continuous training (runtime.trainer.online): hourly partitions, base and patch versions
whose base + patches equal the trainer's table bit for bit, resume after a killed trainer."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.formats import donefile, partitions
from runtime.formats.model_meta import ModelMeta
from runtime.formats.seqfile import read_sequence_file
from runtime.formats.train_result import SUMMARY, TrainResult
from runtime.trainer import generator, online, online_state, readers
from runtime.trainer.config import FIELDS
from tests.helpers import CliProcess

START = "20261120/00"


def test_table_diff_finds_new_and_changed_rows_bitwise():
    prev_k = np.array([5, 1, 9], np.uint64)
    prev_v = np.array([[1.0, 2.0], [3.0, 4.0], [0.0, -0.0]], np.float32)
    keys = np.array([1, 9, 5, 7], np.uint64)
    values = np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 2.5], [0.0, 0.0]], np.float32)
    # 9 changed only in the sign of a zero: bitwise a change; 5 changed; 7 is new
    assert online.table_diff(prev_k, prev_v, keys, values).tolist() == [1, 2, 3]
    assert online.table_diff(np.zeros(0, np.uint64), np.zeros((0, 2), np.float32), keys, values).tolist() == [
        0, 1, 2, 3]
    # a patch as the cube applies it: 5 replaced; a zero row deletes its key (9), or nothing (7)
    k, v = online.apply_patch(prev_k, prev_v, keys[[1, 2, 3]], values[[1, 2, 3]])
    assert k.tolist() == [1, 5] and v[1].tolist() == [1.0, 2.5]


def test_state_roundtrip_and_bad_file(tmp_path):
    st = online_state.OnlineState(data_root="/d", start_hour=START, next_hour=START)
    st.pending = online_state.ExportRecord(id=3, kind="patch", base=1, hour=START, rows=5)
    st.save(str(tmp_path))
    again = online_state.OnlineState.load(str(tmp_path))
    # no checkpoint yet: from the start; the pending export's hour counts as published
    assert again == st and again.resume_point() == (START, None)
    assert str(again.published_hour()) == "20261120/01"
    st.checkpoint_hour = "20261120/01"
    assert st.resume_point() == ("20261120/01", "20261120-01")
    assert [p.name for p in tmp_path.iterdir()] == [online_state.STATE_FILE]  # no temporary left
    (tmp_path / online_state.STATE_FILE).write_text('{"data_root": 1}')
    with pytest.raises(ValueError, match="not a valid online training state"):
        online_state.OnlineState.load(str(tmp_path))


def test_state_from_before_checkpoint_every_reads_its_checkpoint_at_the_last_export(tmp_path):
    """A state file written when every export took a checkpoint first (no checkpoint_hour)."""
    rec = {"id": 7, "kind": "base", "base": 7, "hour": START, "rows": 5}
    old = {"schema_version": 1, "data_root": "/d", "start_hour": START, "next_hour": "20261120/01",
           "base_id": 7, "since_base": 0, "pending": None, "base_due": None, "exports": [rec]}
    st = online_state.OnlineState.model_validate(old)
    assert st.resume_point() == ("20261120/01", "20261120-01")
    pend = dict(old, pending=dict(rec, id=8, kind="patch", hour="20261120/01"))
    assert online_state.OnlineState.model_validate(pend).resume_point() == ("20261120/02", "20261120-02")
    fresh = online_state.OnlineState.model_validate(dict(old, exports=[], next_hour=START))
    assert fresh.resume_point() == (START, None)


@pytest.fixture(scope="module")
def hours(tmp_path_factory):
    root = tmp_path_factory.mktemp("hours")
    rec = generator.generate_hours(root, 4, START, 6000, seed=4)
    return root, rec


def test_generated_hours_drift_and_are_complete(hours):
    root, rec = hours
    hs = partitions.hours(partitions.Hour.parse(START), partitions.Hour.parse(START).next(3))
    assert [h.hour for h in rec.hours] == [str(h) for h in hs]
    seen = []
    for h in hs:
        (f,) = partitions.files(str(root), h)
        b = readers.read_all([f])
        assert len(b) == 6000
        seen.append(set(np.unique(b.feasigns).tolist()))
    # new feasigns appear every hour, old ones disappear
    assert seen[1] - seen[0] and seen[0] - seen[3]


def _run(args, tmp, timeout=400):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "runtime.cli", "train", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp)


def _summary(r):
    rec = TrainResult.find(r.stdout, SUMMARY, source="train stdout")
    if rec is not None:
        return rec.to_dict()
    raise AssertionError(f"no summary; rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def _chain(out: Path) -> list[tuple[str, int, np.ndarray, np.ndarray]]:
    """[(kind, id, keys, values)] of every version, in id order, read from the SequenceFiles."""
    recs = [("base", r) for r in donefile.read(str(out), "base")] + [("patch", r) for r in
                                                                      donefile.read(str(out), "patch")]
    out_l = []
    for kind, r in sorted(recs, key=lambda x: x[1].id):
        parts = sorted((out / r.input).glob("part-*"))
        kv = [read_sequence_file(p) for p in parts]
        keys = np.concatenate([k for k, _ in kv])
        values = np.concatenate([v.reshape(-1, 9) for _, v in kv])
        assert len(keys) == r.count
        meta = ModelMeta.read(out / r.model)
        assert meta.sparse.kind == kind and (meta.sparse.base == (r.key if kind == "patch" else None))
        out_l.append((kind, r.id, keys, values))
    return out_l


def test_single_continuous_base_patches_equal_the_trainers_table(hours, tmp_path):
    root, _ = hours
    out, state = tmp_path / "out", tmp_path / "state"
    r = _run(["--single", "--mode", "continuous", "--data-root", str(root), "--start-hour", START,
              "--end-hour", "20261120/02", "--state-dir", str(state), "--output", str(out), "--base-every-minutes", "180",
              "--poll-seconds", "0.2", "--gate-eval-every", "0",  # every row trained, so every feasign fed
              "--feature-ttl-hours", "0"], tmp_path)  # no eviction: the export after the restart stays a patch
    s = _summary(r)
    assert [e["kind"] for e in s["exports"]] == ["base", "patch", "patch"]
    assert [p["hour"] for p in s["partitions"]] == ["20261120/00", "20261120/01", "20261120/02"]
    chain = _chain(out)
    assert [c[0] for c in chain] == ["base", "patch", "patch"]
    base_id = chain[0][1]
    assert all(r.key == base_id for r in donefile.read(str(out), "patch"))
    keys, values = chain[0][2], chain[0][3]
    least = int(FIELDS["feature_min_count"].default)  # admission: fed at least this many times
    counts = _counts(root, START)
    assert np.array_equal(keys, np.array(sorted(k for k, c in counts.items() if c >= least), np.uint64))
    for i, (_, _, pk, pv) in enumerate(chain[1:], start=1):
        hour = partitions.Hour.parse(START).next(i)
        touched = np.unique(readers.read_all(partitions.files(str(root), hour)).feasigns)
        touched = touched[touched != 0]
        for k, c in _counts(root, str(hour)).items():
            counts[k] = counts.get(k, 0) + c
        admitted = touched[np.array([counts[int(k)] >= least for k in touched], bool)]
        assert np.isin(pk, touched).all(), "a patch row the partition never touched"
        assert np.array_equal(np.sort(pk), admitted), "a patch holds the partition's admitted feasigns, no other"
        assert pv.any(axis=1).all(), "no eviction here: no deletion"
        keys, values = online.apply_patch(keys, values, pk, pv)
    # the trainer's own table at the last export
    st = online_state.OnlineState.load(str(state))
    with np.load(Path(online_state.export_dir(str(state), st.exports[-1].id)) / online_state.SNAPSHOT) as z:
        assert np.array_equal(z["keys"], keys)
        assert np.array_equal(z["values"].view(np.uint32), values.astype(np.float32).view(np.uint32))
    assert st.next_hour == "20261120/03" and st.pending is None
    # the end hour was reached: a checkpoint after its export, the only one kept
    assert st.checkpoint_hour == "20261120/03" and os.listdir(state / online_state.CHECKPOINTS) == ["20261120-03"]
    assert not (Path(online_state.export_dir(str(state), st.exports[-1].id)) / online_state.ROWS).exists()
    # resumes with the next hour only, exports a patch on the same base
    r2 = _run(["--single", "--mode", "continuous", "--data-root", str(root), "--start-hour", START,
               "--end-hour", "20261120/03", "--state-dir", str(state), "--output", str(out), "--base-every-minutes", "240",
               "--poll-seconds", "0.2", "--feature-ttl-hours", "0"], tmp_path)
    s2 = _summary(r2)
    assert [p["hour"] for p in s2["partitions"]] == ["20261120/03"]
    assert s2["partitions"][0]["auc_before"] > 0.7  # the restored model, not a fresh one
    ids = [e["id"] for e in s2["exports"]]
    assert ids == sorted(ids) and len(ids) == 4 and s2["exports"][-1]["kind"] == "patch"


def _counts(root, hour: str) -> dict:
    """feasign -> occurrences in the partition ``hour``."""
    f = readers.read_all(partitions.files(str(root), partitions.Hour.parse(hour))).feasigns.ravel()
    u, n = np.unique(f[f != 0], return_counts=True)
    return dict(zip(u.tolist(), n.tolist()))


def _chain_table(chain):
    keys, values = chain[0][2], chain[0][3]
    for _, _, pk, pv in chain[1:]:
        keys, values = online.apply_patch(keys, values, pk, pv)
    return keys, values


def _four_hours_exported(state: Path, kinds: list[str]):
    """The state after a resumed run: one export per hour 00..03 of ``kinds``, ids increasing."""
    st = online_state.OnlineState.load(str(state))
    assert [e.hour for e in st.exports] == ["20261120/00", "20261120/01", "20261120/02", "20261120/03"]
    assert [e.kind for e in st.exports] == kinds
    ids = [e.id for e in st.exports]
    assert ids == sorted(ids) and len(set(ids)) == 4
    return st, ids


def _fed(root, *hours_) -> np.ndarray:
    f = np.unique(np.concatenate([readers.read_all(partitions.files(str(root), partitions.Hour.parse(h))).feasigns
                                  .ravel() for h in hours_]))
    return f[f != 0]


def test_single_resume_from_an_older_checkpoint_trains_again_and_exports_every_row_fed_since(hours, tmp_path):
    """--checkpoint-every-minutes 120 (two hourly partitions): the checkpoint follows 01's export, 02 is exported
    without one;
    stopped there, the job resumes from the checkpoint, trains 02 again without exporting
    it a second time, and 03's patch carries every row fed in 02 and 03, so the chain still
    equals the trainer's table bit for bit."""
    import shutil

    src, _ = hours
    root, out, state = tmp_path / "data", tmp_path / "out", tmp_path / "state"
    for h in ("20261120/00", "20261120/01", "20261120/02"):
        shutil.copytree(partitions.Hour.parse(h).location(str(src)), partitions.Hour.parse(h).location(str(root)))
    args = ["--single", "--mode", "continuous", "--data-root", str(root), "--start-hour", START, "--state-dir",
            str(state), "--output", str(out), "--base-every-minutes", "240", "--checkpoint-every-minutes", "120", "--poll-seconds", "0.2",
            "--gate-eval-every", "0",  # every row trained: the patches carry every row fed
            "--feature-ttl-hours", "0"]  # no eviction: the export after the restart stays a patch
    p = CliProcess(["train", *args], tmp_path)
    p.wait_for("waiting for partition 20261120/03")
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait(60) == 0, p.text()[-3000:]
    st = online_state.OnlineState.load(str(state))
    assert [e.kind for e in st.exports] == ["base", "patch", "patch"]
    assert st.next_hour == "20261120/03" and st.checkpoint_hour == "20261120/02" and st.since_checkpoint == 1
    assert [e.checkpoint_seconds is not None for e in st.exports] == [False, True, False]
    assert os.listdir(state / online_state.CHECKPOINTS) == ["20261120-02"]
    hour3 = partitions.Hour.parse("20261120/03")
    shutil.copytree(hour3.location(str(src)), hour3.location(str(root)))
    r = _run([*args, "--end-hour", "20261120/03"], tmp_path)
    s = _summary(r)
    assert [x["hour"] for x in s["partitions"]] == ["20261120/02", "20261120/03"]
    assert "their rows go into the next export" in r.stderr + r.stdout
    st, ids = _four_hours_exported(state, ["base", "patch", "patch", "patch"])
    chain = _chain(out)
    assert np.isin(_fed(root, "20261120/02", "20261120/03"), chain[-1][2]).all(), "a row fed since the restore"
    keys, values = _chain_table(chain)
    with np.load(Path(online_state.export_dir(str(state), ids[-1])) / online_state.SNAPSHOT) as z:
        assert np.array_equal(z["keys"], keys)
        assert np.array_equal(z["values"].view(np.uint32), values.astype(np.float32).view(np.uint32))
    assert st.checkpoint_hour == "20261120/04" and os.listdir(state / online_state.CHECKPOINTS) == ["20261120-04"]


def test_continuous_waits_for_the_done_marker(tmp_path):
    root = tmp_path / "data"
    generator.generate_hours(root, 1, START, 2000, seed=2)
    late = partitions.Hour.parse(START).next()
    d = Path(late.location(str(root)))
    d.mkdir(parents=True)
    src = Path(partitions.files(str(root), partitions.Hour.parse(START))[0])
    (d / "part-00000").write_bytes(src.read_bytes())  # data there, marker not yet
    p = CliProcess(["train", "--single", "--mode", "continuous", "--data-root", str(root), "--start-hour", START,
                    "--end-hour", str(late), "--state-dir", str(tmp_path / "state"), "--poll-seconds", "0.2"], tmp_path)
    p.wait_for(f"waiting for partition {late}: no _SUCCESS")
    partitions.mark_complete(d)
    assert p.wait() == 0
    s = TrainResult.find("\n".join(p.lines), SUMMARY).to_dict()
    assert [p["hour"] for p in s["partitions"]] == [START, str(late)]


@pytest.mark.slow
def test_ps_continuous_resumes_after_trainer0_is_killed(hours, tmp_path):
    """--checkpoint-every-minutes 120 (two hourly partitions): the checkpoint follows 01's export and 02 is exported without
    one; trainer 0 is killed in the middle of partition 03: the launcher fails the job; the
    same command again restores the checkpoint, trains 02 again without exporting it twice,
    then 03 (a base: the restored tables are text): every hour once in the served lineage,
    none skipped, version ids increase."""
    from runtime import proc
    from runtime.local.ps import run_local_ps
    from runtime.trainer.config import TrainConfig

    root, _ = hours
    out, state = tmp_path / "out", tmp_path / "state"
    cfg = TrainConfig(mode="continuous", data_root=str(root), start_hour=START, end_hour="20261120/03",
                      state_dir=str(state), output=str(out), base_every_minutes=180, checkpoint_every_minutes=120, poll_seconds=0.2,
                      gate_eval_every=0)  # every row trained: the examples are every row of the hours
    logs = tmp_path / "logs1"
    killed = {}

    def started(_endpoints, pids):
        def watch():
            log0 = logs / "trainer-0.log"
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                text = log0.read_text(errors="replace") if log0.exists() else ""
                if "partition 20261120/03: auc" in text:  # exported 00, 01, 02; now in 03
                    time.sleep(0.5)
                    os.kill(pids[0], signal.SIGKILL)
                    killed["at"] = time.monotonic()
                    return
                time.sleep(0.1)
        threading.Thread(target=watch, daemon=True).start()

    with pytest.raises(proc.RoleFailed):
        run_local_ps(cfg, 1, 2, log_dir=str(logs), timeout_s=300, on_started=started)
    assert "at" in killed
    first = online_state.OnlineState.load(str(state))
    assert first.next_hour == "20261120/03" and [e.hour for e in first.exports] == [
        "20261120/00", "20261120/01", "20261120/02"]
    assert first.checkpoint_hour == "20261120/02"
    rec = run_local_ps(cfg, 1, 2, log_dir=str(tmp_path / "logs2"), timeout_s=300)
    assert [p["hour"] for p in rec["partitions"]] == ["20261120/02", "20261120/03"]
    # the job's rate counts both trainers' rows of 02 and 03 (it reported 0)
    assert rec["examples_total"] == 2 * 6000 and rec["examples_per_s_total"] > 0
    # the restored tables hold the checkpoint's text values, not the exported floats: the
    # first export after the restore is a base (the state's base_due)
    _, ids = _four_hours_exported(state, ["base", "patch", "patch", "base"])
    chain = _chain(out)
    assert [c[1] for c in chain] == ids
    # the pservers resumed from the checkpoint: rows trained before the kill and not
    # touched since are in the base after the restore with the values they had at the export of 01
    k01, v01 = online.apply_patch(chain[0][2], chain[0][3], chain[1][2], chain[1][3])
    keep = ~np.isin(k01, _fed(root, "20261120/02", "20261120/03"))
    assert keep.sum() > 100
    kb, vb = chain[3][2], chain[3][3]
    order = np.argsort(kb)
    pos = np.searchsorted(kb[order], k01[keep])
    assert np.array_equal(kb[order][pos], k01[keep])
    np.testing.assert_allclose(vb[order][pos], v01[keep], rtol=1e-5, atol=1e-7)
    # and the dense head: the same rows score as they did when 02 was first trained
    text = (logs / "trainer-0.log").read_text(errors="replace")
    first_02 = float(text.split("partition 20261120/02: auc ")[1].split()[0])
    assert abs(rec["partitions"][0]["auc_before"] - first_02) < 0.002, (first_02, rec["partitions"][0])


def test_sigterm_while_waiting_exits_0_with_the_exports_done(tmp_path):
    """A continuous job stopped as Kubernetes stops a pod: SIGTERM while it waits for the
    next partition; it exits 0 and the state says where to resume."""
    root = tmp_path / "data"
    generator.generate_hours(root, 1, START, 2000, seed=2)
    state = tmp_path / "state"
    p = CliProcess(["train", "--single", "--mode", "continuous", "--data-root", str(root), "--start-hour", START,
                    "--state-dir", str(state), "--poll-seconds", "0.2"], tmp_path)
    p.wait_for("waiting for partition 20261120/01")
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait(60) == 0, p.text()[-3000:]
    assert "Traceback" not in p.text() and "FatalError" not in p.text()
    st = online_state.OnlineState.load(str(state))
    assert st.next_hour == "20261120/01" and st.pending is None and len(st.exports) == 1


def test_single_continuous_job_on_minute_partitions(tmp_path):
    """One-minute partitions (ROOT/YYYYMMDD/HHMM/) across midnight: a version per partition,
    bases by minutes of data, each donefile line's data end at its partition's end."""
    import datetime as dt

    root, out, state = tmp_path / "minutes", tmp_path / "out", tmp_path / "state"
    generator.generate_hours(root, 3, "20261120/2359", 1500, seed=6, minutes=1)
    r = _run(["--single", "--mode", "continuous", "--data-root", str(root), "--partition-minutes", "1",
              "--start-hour", "20261120/2359", "--end-hour", "20261121/0001", "--state-dir", str(state),
              "--output", str(out), "--base-every-minutes", "2", "--checkpoint-every-minutes", "60",
              "--poll-seconds", "0.1"], tmp_path)
    s = _summary(r)
    assert [p["hour"] for p in s["partitions"]] == ["20261120/2359", "20261121/0000", "20261121/0001"]
    assert [(e["kind"], e["hour"]) for e in s["exports"]] == [
        ("base", "20261120/2359"), ("patch", "20261121/0000"), ("base", "20261121/0001")]
    lines = sorted(donefile.read(str(out), "base") + donefile.read(str(out), "patch"), key=lambda x: x.id)
    ends = [dt.datetime.fromtimestamp(x.data_end, dt.timezone.utc).strftime("%H%M") for x in lines]
    assert ends == ["0000", "0001", "0002"]
    st = online_state.OnlineState.load(str(state))
    assert (st.partition_minutes, st.next_hour, st.checkpoint_hour) == (1, "20261121/0002", "20261121/0002")
    # the same state directory refuses another period
    r = _run(["--single", "--mode", "continuous", "--data-root", str(root), "--start-hour", "20261120/23",
              "--state-dir", str(state), "--output", str(out), "--poll-seconds", "0.1"], tmp_path)
    assert r.returncode != 0 and "holds the state of another job" in (r.stdout + r.stderr)
