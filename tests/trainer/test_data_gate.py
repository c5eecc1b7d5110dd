"""The data gate (runtime.trainer.data_gate): no false alarm over a drifting day of the
long-tail generator, flipped labels / a slot gone / a scaled feature / malformed lines
quarantined (marker, history, metric), a lasting shift taken as the new normal after
--gate-adapt-after partitions, the schema written from the project's own data."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.formats import data_schema, features, partition_stats as ps, partitions
from runtime.formats.train_result import SUMMARY, TrainResult
from runtime.trainer import data_gate, dataset, gate_checks, generator, readers
from runtime.trainer.config import TrainConfig

START = "20261120/00"
SLOTS = features.DEFAULT_SLOTS
NAMES = [f"C{s}" for s in SLOTS]


def _hours(n: int) -> list[partitions.Hour]:
    h0 = partitions.Hour.parse(START)
    return [h0.next(i) for i in range(n)]


def _batch(root, hour) -> readers.Batch:
    return readers.read_all(partitions.files(str(root), hour), "criteo", SLOTS)


def _rewrite(root, hour, fn) -> None:
    """Rewrites a partition's lines through ``fn(fields) -> fields`` (fields of one TSV line)."""
    (f,) = partitions.files(str(root), hour)
    lines = Path(f).read_text().splitlines()
    Path(f).write_text("\n".join("\t".join(fn(x.split("\t"))) for x in lines) + "\n")


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    """24 hours of the long-tail generator's drifting data (big vocabularies scaled down)."""
    root = tmp_path_factory.mktemp("longtail")
    generator.generate_hours(root, 24, START, 8000, seed=3, shape="long-tail", scale=0.05)
    return root


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    generator.generate_hours(root, 8, START, 6000, seed=5)
    return root


def _replay(root, hours, th=gate_checks.Thresholds(), schema=None):
    """Judges each hour in order as the job's gate does; returns [(hour, anomalies)]."""
    hist, sketch, out = ps.GateHistory(), data_gate.FeasignSketch(), []
    for h in hours:
        b = _batch(root, h)
        st = data_gate.statistics(str(h), b.labels, b.dense, b.feasigns, SLOTS, sketch, th.window)
        an = gate_checks.check_history(st, hist.accepted, th, NAMES)
        if schema is not None:
            an += gate_checks.check_schema(st, schema)
        out.append((str(h), an))
        if not an:
            hist.accept(st, th.window)
            sketch.add(data_gate.present_keys(b.feasigns, SLOTS))
    return out


def test_no_false_alarm_over_a_drifting_long_tail_day(day):
    """(e): the defaults let 24 normal partitions through, the schema inferred from the
    first 6 hours included, and the new-feasign rate is measured once the window is full."""
    stats = [data_gate.statistics(str(h), *(lambda b: (b.labels, b.dense, b.feasigns))(_batch(day, h)), SLOTS)
             for h in _hours(6)]
    schema = data_schema.infer(stats, "criteo", SLOTS)
    verdicts = _replay(day, _hours(24), schema=schema)
    assert [v for v in verdicts if v[1]] == []
    sketch = data_gate.FeasignSketch()
    rates = []
    for h in _hours(8):
        b = _batch(day, h)
        rates.append(data_gate.statistics(str(h), b.labels, b.dense, b.feasigns, SLOTS, sketch, 6).new_feasign_rate)
        sketch.add(data_gate.present_keys(b.feasigns, SLOTS))
    assert rates[:6] == [None] * 6 and 0 < rates[6] < 0.5 and 0 < rates[7] < 0.5


def test_flipped_labels_are_quarantined(small):
    """(a) at unit level: an hour whose labels are flipped breaks the click-rate bound."""
    _rewrite(small, _hours(8)[6], lambda f: [str(1 - int(f[0]))] + f[1:])
    try:
        verdicts = dict(_replay(small, _hours(7)))
    finally:
        _rewrite(small, _hours(8)[6], lambda f: [str(1 - int(f[0]))] + f[1:])
    assert all(not verdicts[str(h)] for h in _hours(6))
    checks = {a.check for a in verdicts["20261120/06"]}
    assert "click_rate" in checks, verdicts["20261120/06"]



def _copy_hours(src, root: Path, n: int) -> None:
    """The first ``n`` hourly partitions of ``src`` copied under ``root``, each complete."""
    for h in _hours(n):
        d = Path(h.location(str(root)))
        d.mkdir(parents=True)
        (d / "part-00000").write_bytes(Path(partitions.files(str(src), h)[0]).read_bytes())
        partitions.mark_complete(d)

def test_a_slot_gone_is_quarantined_and_named(small, tmp_path):
    """(b) at unit level: slot C3 empty in every row of an hour: the missing-rate bound and
    the schema's presence bound both name it."""
    src = small
    root = tmp_path / "hours"
    _copy_hours(src, root, 7)
    _rewrite(root, _hours(7)[6], lambda f: f[:16] + [""] + f[17:])  # label, I1..I13, C1, C2, [C3]
    stats = [data_gate.statistics(str(h), *(lambda b: (b.labels, b.dense, b.feasigns))(_batch(root, h)), SLOTS)
             for h in _hours(6)]
    schema = data_schema.infer(stats, "criteo", SLOTS)
    verdicts = dict(_replay(root, _hours(7), schema=schema))
    bad = verdicts["20261120/06"]
    assert {(a.check, a.feature) for a in bad} >= {("missing_rate", "C3"), ("schema_missing", "C3")}, bad
    assert all(a.feature == "C3" for a in bad if a.check in ("missing_rate", "schema_missing"))


#: the bounds before the categorical ones: those two off (a distance is at most 1; a fall
#: of the distinct values by more than 1e9 cannot happen)
WITHOUT_CATEGORICAL = gate_checks.Thresholds(categorical_linf=1.0, distinct_ratio=1e9)
CATEGORICAL = {"categorical_drift", "distinct_values"}


def _collapse(slot: int, value: str):
    """A rewrite: slot ``C<slot>`` holds ``value`` in every row (a join fallen back to a
    default); ``value`` None: the slot's most frequent value in the partition."""
    col = 13 + slot  # label, I1..I13, C1...

    def rewrite(f):
        return f[:col] + [value] + f[col + 1:]

    return rewrite


@pytest.mark.parametrize("fixture,slot,value", [("small", 5, "0badcafe"), ("small", 8, None),
                                                ("day", 21, "00000000")],
                         ids=["600-values-to-a-default", "4-values-to-the-top-one", "long-tail-to-a-default"])
def test_a_slot_collapsed_to_one_constant_passes_the_other_bounds_and_breaks_the_categorical(
        request, tmp_path, fixture, slot, value):
    """The breakage: slot C<slot> holds one value in every row of hour 06 (a default from a
    failed join, or its own most frequent value). Every bound but the categorical ones lets
    it through (no missing-rate, row, click-rate, dense or new-feasign bound moves); with
    them, hour 06 is quarantined by the distinct values (and the top values' L-infinity
    distance, but for a slot of 4 values collapsed onto the one of half its rows), naming
    the slot alone."""
    root = tmp_path / "hours"
    _copy_hours(request.getfixturevalue(fixture), root, 7)
    default = value is not None
    if not default:
        values = [ln.split("\t")[13 + slot] for ln in Path(partitions.files(str(root), _hours(7)[6])[0]).open()]
        value = max(set(values) - {""}, key=values.count)
    _rewrite(root, _hours(7)[6], _collapse(slot, value))
    before = dict(_replay(root, _hours(7), th=WITHOUT_CATEGORICAL))
    assert all(v == [] for v in before.values()), before  # the blind spot
    verdicts = dict(_replay(root, _hours(7)))
    assert all(verdicts[str(h)] == [] for h in _hours(6))
    bad = verdicts["20261120/06"]
    assert {a.check for a in bad} <= CATEGORICAL and "distinct_values" in {a.check for a in bad}, bad
    assert {a.feature for a in bad} == {f"C{slot}"}, bad
    got = {a.check: a for a in bad}
    assert got["distinct_values"].value == 1
    assert got["distinct_values"].message.startswith(f"distinct values 1 (C{slot})")
    if default:  # a value the window never saw: its whole frequency is the distance
        assert got["categorical_drift"].value > 0.99


def test_a_collapsed_slot_is_never_taken_as_a_new_normal_categorical(small, tmp_path):
    """A join that stays broken: C5 one default value from hour 04 on. Its partitions agree
    with each other, but a slot that lost its distinct values is broken data, not a lasting
    shift: with --gate-adapt-after 3 every collapsed hour stays quarantined."""
    cfg = TrainConfig(mode="continuous", data_root=str(tmp_path / "hours"), start_hour=START,
                      state_dir=str(tmp_path / "state"), gate_adapt_after=3)
    gate = data_gate.DataGate(cfg, SLOTS)
    col = features.DEFAULT_SLOTS.index(5)
    quarantined = []
    for i, h in enumerate(_hours(8)):
        b = _batch(small, h)
        fs = b.feasigns.copy()
        if i >= 4:
            fs[:, col] = features.feasign(5, "0badcafe")
        st, an = gate.judge(str(h), b.labels, b.dense, fs)
        if an:
            gate.quarantine(str(h), h.location(cfg.data_root), st, an)
        else:
            gate.accept(st, fs)
        quarantined.append({a.check for a in an})
    assert quarantined[:4] == [set()] * 4
    assert all(q == CATEGORICAL for q in quarantined[4:]), quarantined
    assert ps.GateHistory.load(gate.state_dir).adaptations == []


def test_categorical_statistics_match_a_direct_count():
    """``partition_stats.categorical`` (one sort, run lengths) against a per-slot count: the
    top values (most frequent first, ties by feasign), their fractions of the present
    values, the distinct counts; the missing feasign left out; rows evenly read past the
    cap."""
    rng = np.random.default_rng(4)
    slots = [1, 2, 3]
    miss = features.missing_feasign(np.asarray(slots))
    fs = np.stack([rng.integers(0, 50, 3000).astype(np.uint64) + np.uint64(7),
                   np.full(3000, 9, np.uint64), rng.zipf(1.5, 3000).astype(np.uint64)], axis=1)
    fs[rng.random(3000) < 0.2, 0] = miss[0]
    fs[:, 1][:1000] = miss[1]
    m, top, distinct = ps.categorical(fs, miss, k=5)
    assert m == 3000
    for j in range(3):
        col = fs[:, j][fs[:, j] != miss[j]]
        vals, counts = np.unique(col, return_counts=True)
        order = np.lexsort((vals, -counts))[:5]
        assert top[j] == [(int(vals[i]), round(counts[i] / len(col), 6)) for i in order]
        assert distinct[j] == len(vals)
    assert top[1] == [(9, 1.0)] and distinct[1] == 1
    m, _, _ = ps.categorical(fs, miss, k=5, rows=700)
    assert m == 700
    assert ps.categorical(fs[:0], miss) == (0, [[], [], []], [0, 0, 0])


def test_linf_distance_bounds():
    recent = [[(1, 0.5), (2, 0.3)], [(1, 0.45), (2, 0.35)], [(1, 0.55), (3, 0.3)]]
    assert ps.linf_distance([(1, 0.5), (2, 0.3)], recent) == pytest.approx(0.0)
    assert ps.linf_distance([(7, 1.0)], recent) == pytest.approx(1.0)  # a constant never seen
    assert ps.linf_distance([(1, 1.0)], recent) == pytest.approx(0.5)  # collapsed onto the top value
    assert ps.linf_distance([(1, 0.5), (3, 0.3)], recent) == pytest.approx(0.3)  # value 2 gone, 3 new
    assert ps.linf_distance([(1, 1.0)], []) == 0.0


def test_a_dense_feature_scaled_by_1000_drifts(small):
    hist = ps.GateHistory()
    for h in _hours(4):
        b = _batch(small, h)
        hist.accept(data_gate.statistics(str(h), b.labels, b.dense, b.feasigns, SLOTS), 6)
    lines = Path(partitions.files(str(small), _hours(5)[4])[0]).read_text().splitlines()
    fields = [x.split("\t") for x in lines]
    for f in fields:
        f[2] = str(int(f[2]) * 1000) if f[2] not in ("", "-1") else f[2]  # I2
    b = features.parse_lines(["\t".join(f) for f in fields], "criteo", SLOTS)
    st = data_gate.statistics("20261120/04", b.labels, features.normalize_dense(b.dense), b.feasigns, SLOTS)
    an = gate_checks.check_history(st, hist.accepted, gate_checks.Thresholds(), NAMES)
    assert [(a.check, a.feature) for a in an] == [("dense_drift", "I2")], an


def test_model_metrics_against_their_history():
    base = dict(rows=1000, click_rate=0.25, missing_rate=[0.1] * 26, dense_hist=[[0.1] * 10] * 13,
                dense_saturated=[0.0] * 13)
    recent = [ps.PartitionStats(hour=f"20261120/0{i}", auc=0.75 + 0.002 * i, logloss=0.5, **base) for i in range(4)]
    th = gate_checks.Thresholds()
    ok = ps.PartitionStats(hour="20261120/05", auc=0.74, logloss=0.55, **base)
    assert gate_checks.check_history(ok, recent, th, NAMES) == []
    bad = ps.PartitionStats(hour="20261120/05", auc=0.60, logloss=0.9, **base)
    assert [a.check for a in gate_checks.check_history(bad, recent, th, NAMES)] == ["auc", "logloss"]
    # not before min_history accepted partitions
    assert gate_checks.check_history(bad, recent[:2], th, NAMES) == []


def test_js_distance_bounds():
    p = np.array([0.5, 0.5, 0, 0])
    assert ps.js_distance(p, p) == 0.0
    assert ps.js_distance(p, np.array([0, 0, 0.5, 0.5])) == pytest.approx(1.0)
    assert 0 < ps.js_distance(p, np.array([0.4, 0.6, 0, 0])) < 0.1


def test_schema_yaml_roundtrip_and_errors(small, tmp_path):
    stats = [data_gate.statistics(str(h), *(lambda b: (b.labels, b.dense, b.feasigns))(_batch(small, h)), SLOTS)
             for h in _hours(3)]
    schema = data_schema.infer(stats, "criteo", SLOTS)
    path = tmp_path / "ctr.yaml"
    path.write_text(schema.to_yaml())
    assert data_schema.load(str(path)) == schema
    with pytest.raises(data_schema.SchemaError, match="the job reads format slot"):
        schema.check_job("slot", SLOTS, "--data-schema x")
    broken = schema.model_dump(mode="json")
    broken["sparse"] = broken["sparse"][:-1]
    import yaml

    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(data_schema.SchemaError, match=r"ctr\.yaml: .*one entry per slot"):
        data_schema.load(str(path))


class _Ds:
    released = False

    def release_memory(self):
        self.released = True


class _Worker:
    """A single-process stand-in for ``runtime.trainer.worker``: stages with the real
    reader and bad-line budget, no Paddle."""

    chief, who, role = True, "fake", None

    def __init__(self, budget):
        self.budget = budget
        self.keys_seen = np.zeros(0, np.uint64)

    def load(self, files, keep_rows=False, holdout_every=0):
        st = dataset.stage(files, fmt="criteo", slots=SLOTS, parts=1, budget=self.budget, keep_rows=keep_rows,
                           collect_keys=True, holdout_every=holdout_every)
        st.remove()
        self.keys_seen = dataset.distinct(np.concatenate([self.keys_seen, st.ids_seen]))
        return _Ds(), st


def test_admit_quarantines_marks_and_restores(small, tmp_path):
    """The job's path: a flipped hour is released (nothing trained), marked beside its
    _SUCCESS, recorded in the history and the metric; the fed feasigns and the bad-line
    budget are restored; a marked partition is passed over unread; a partition of
    malformed lines is quarantined instead of stopping the job."""
    from runtime.metrics.trainer import metrics

    root = tmp_path / "hours"
    _copy_hours(small, root, 7)
    _rewrite(root, _hours(7)[4], lambda f: [str(1 - int(f[0]))] + f[1:])
    _rewrite(root, _hours(7)[5], lambda f: f[:-1])  # a column dropped: 39 fields
    cfg = TrainConfig(mode="continuous", data_root=str(root), start_hour=START, state_dir=str(tmp_path / "state"))
    gate = data_gate.DataGate(cfg, SLOTS)
    worker = _Worker(readers.BadLineBudget(100))
    before = metrics().quarantined._value.get()
    kinds = []
    for h in _hours(7):
        fed = worker.keys_seen.copy()
        v = data_gate.admit(worker, gate, cfg, str(h), h.location(str(root)), partitions.files(str(root), h),
                            lambda staged: (None, None))
        kinds.append("trained" if v.loaded else "quarantined")
        if v.loaded is None:
            assert np.array_equal(worker.keys_seen, fed) and worker.budget.bad == 0
    assert kinds == ["trained"] * 4 + ["quarantined", "quarantined", "trained"]
    assert metrics().quarantined._value.get() == before + 2
    marker = ps.read_marker(_hours(7)[4].location(str(root)))
    assert marker["hour"] == "20261120/04" and "click_rate" in {a["check"] for a in marker["anomalies"]}
    assert ps.read_marker(_hours(7)[5].location(str(root)))["anomalies"][0]["check"] == "malformed_lines"
    hist = ps.GateHistory.load(cfg.state_dir)
    assert [q.hour for q in hist.quarantined] == ["20261120/04", "20261120/05"]
    assert [s.hour for s in hist.accepted][-1] == "20261120/06"
    # a restarted job passes a marked partition over without reading it
    v = data_gate.admit(worker, data_gate.DataGate(cfg, SLOTS), cfg, "20261120/04",
                        _hours(7)[4].location(str(root)), [], lambda staged: (None, None))
    assert v.loaded is None and "marker" in v.anomalies[0]


def _shifted_day(small, tmp_path, adapt_after: int, auc_shifted=None):
    """Judges 8 hours of ``small`` through a ``DataGate`` (as ``admit`` does), dense I2
    saturated from hour 04 on (a lasting shift of the source); the served model's AUC
    0.75 on normal hours and ``auc_shifted`` on shifted ones. Returns the gate and which
    hours were quarantined."""
    cfg = TrainConfig(mode="continuous", data_root=str(tmp_path / "hours"), start_hour=START,
                      state_dir=str(tmp_path / "state"), gate_adapt_after=adapt_after)
    gate = data_gate.DataGate(cfg, SLOTS)
    quarantined = []
    for i, h in enumerate(_hours(8)):
        b = _batch(small, h)
        dense = b.dense.copy()
        if i >= 4:
            dense[:, 1] = 1.0
        auc = 0.75 if i < 4 or auc_shifted is None else auc_shifted
        st, an = gate.judge(str(h), b.labels, dense, b.feasigns, auc, 0.5 if auc is not None else None)
        if an:
            gate.quarantine(str(h), h.location(cfg.data_root), st, an)
        else:
            gate.accept(st, b.feasigns)
        quarantined.append(bool(an))
    return gate, quarantined


def test_a_lasting_shift_becomes_the_new_normal_after_gate_adapt_after(small, tmp_path):
    """Hours 04 and 05 drift (quarantined); hour 06 drifts the same way: with
    --gate-adapt-after 3 the three agree, so 04-06 become the window, 06 and 07 are
    trained; recorded in the history and counted."""
    from runtime.metrics.trainer import metrics

    before = metrics().gate_adaptations._value.get()
    gate, quarantined = _shifted_day(small, tmp_path, adapt_after=3)
    assert quarantined == [False] * 4 + [True, True, False, False]
    hist = ps.GateHistory.load(gate.state_dir)
    assert [(a.hour, a.partitions) for a in hist.adaptations] == [("20261120/06", ["20261120/04", "20261120/05"])]
    assert [s.hour for s in hist.accepted][-4:] == ["20261120/04", "20261120/05", "20261120/06", "20261120/07"]
    assert metrics().gate_adaptations._value.get() == before + 1
    assert [q.hour for q in hist.quarantined] == ["20261120/04", "20261120/05"]
    assert all(q.stats is not None and {a.check for a in q.anomalies} == {"dense_drift"} for q in hist.quarantined)


@pytest.mark.parametrize("adapt_after,auc_shifted", [(0, None), (3, 0.6)])
def test_a_shift_that_hurts_the_model_or_with_adaptation_off_stays_quarantined(small, tmp_path, adapt_after,
                                                                                auc_shifted):
    """The same shift with --gate-adapt-after 0, or with the served model's AUC falling on
    the shifted hours (a broken source, not a new normal): every shifted hour quarantined."""
    gate, quarantined = _shifted_day(small, tmp_path, adapt_after, auc_shifted)
    assert quarantined == [False] * 4 + [True] * 4
    assert ps.GateHistory.load(gate.state_dir).adaptations == []


BREAKS = {"labels": (lambda f: [str(1 - int(f[0]))] + f[1:], "click_rate", "click rate"),
          "slot": (lambda f: f[:16] + [""] + f[17:], "missing_rate", "missing rate 1 (C3)"),
          "categorical": (_collapse(13, "0badcafe"), "categorical_drift", "distinct values 1 (C13)")}


@pytest.mark.parametrize("brk", sorted(BREAKS))
def test_continuous_job_quarantines_a_broken_hour_and_goes_on(tmp_path, brk):
    """(a) and (b) at process level: --single continuous over 6 hours, hour 04 with flipped
    labels, slot C3 empty, or slot C13 (2000 values) one constant in every row: quarantined
    (marker, summary, log line naming the anomaly), never trained, the hour after it
    trained and exported."""
    rewrite, check, words = BREAKS[brk]
    root = tmp_path / "hours"
    generator.generate_hours(root, 6, START, 4000, seed=6)
    _rewrite(root, _hours(6)[4], rewrite)
    out, state = tmp_path / "out", tmp_path / "state"
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "train", "--single", "--mode", "continuous",
                        "--data-root", str(root), "--start-hour", START, "--end-hour", "20261120/05",
                        "--state-dir", str(state), "--output", str(out), "--poll-seconds", "0.2", "--gate-eval-every", "20"],
                       capture_output=True, text=True, timeout=400, cwd=tmp_path,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    rec = TrainResult.find(r.stdout, SUMMARY, source="train stdout")
    assert rec is not None, f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    parts = rec.to_dict()["partitions"]
    assert [p["hour"] for p in parts] == [str(h) for h in _hours(6)]
    assert [bool(p.get("quarantined")) for p in parts] == [False] * 4 + [True, False]
    assert parts[4]["rows"] == 0 and parts[5]["rows"] == 4000 - 4000 // 20  # 1 in 20 set aside
    assert any(words in m for m in parts[4]["quarantined"]), parts[4]["quarantined"]
    assert (Path(_hours(6)[4].location(str(root))) / ps.QUARANTINE_MARKER).exists()
    assert f"data gate: partition 20261120/04 quarantined: {check}" in r.stderr
    assert parts[5]["auc_before"] > 0.7
    assert all(p["gate_seconds"] >= 0 for p in parts)
    exports = rec.to_dict()["exports"]
    assert [e["hour"] for e in exports] == ["20261120/00", "20261120/01", "20261120/02", "20261120/03",
                                            "20261120/05"]
    assert json.loads((state / ps.HISTORY_FILE).read_text())["quarantined"][0]["hour"] == "20261120/04"
    # each version carries its evaluation on rows set aside (never trained) beside the previous export's
    from runtime.formats import donefile, version_eval
    from runtime.formats.model_meta import ModelMeta

    lines = sorted(donefile.read(str(out), "base") + donefile.read(str(out), "patch"), key=lambda x: x.id)
    evs = [version_eval.from_metrics(ModelMeta.read(out / x.model).metrics, x.model) for x in lines]
    assert [e.hour for e in evs] == [e["hour"] for e in exports]
    # a rolling window of the rows set aside (200 a partition, the quarantined hour's none)
    assert [e.rows for e in evs] == [200, 400, 600, 800, 1000] and parts[0]["rows"] == 4000 - 200
    assert evs[0].baseline is None and all(e.baseline is not None for e in evs[1:])
    assert all(0.6 < e.candidate.auc < 1 and 0.5 < e.candidate.calibration < 2 for e in evs[1:])


def test_schema_drift_replays_partitions_and_names_a_collapsed_categorical_slot(small, tmp_path, capsys):
    """``elastic-ctr schema drift``: normal partitions exit 0 with each one's distances and
    the largest over the span; hour 06 with C5 one value in every row exits 1, its line
    naming the slot and the categorical bounds; ``schema infer`` and ``check`` read the
    same span."""
    from runtime.cli import main

    root = tmp_path / "hours"
    _copy_hours(small, root, 7)
    span = ["--data-root", str(root), "--start-hour", START, "--end-hour", "20261120/06"]
    assert main(["schema", "drift", *span]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out[1:8]] == [str(h) for h in _hours(7)]
    assert out[-1].startswith("drift linf_max=") and "quarantined=0" in out[-1]
    linf = float(out[-1].split("linf_max=")[1].split()[0])
    assert 0 < linf < gate_checks.Thresholds().categorical_linf
    _rewrite(root, _hours(7)[6], _collapse(5, "0badcafe"))
    assert main(["schema", "drift", *span]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "categorical drift 1 (C5)" in out[7] and "distinct values 1 (C5)" in out[7] and " C5 " in out[7]
    assert "quarantined=1" in out[-1]
    schema = tmp_path / "ctr.yaml"
    assert main(["schema", "infer", *span[:4], "--end-hour", "20261120/05", "--out", str(schema)]) == 0
    assert main(["schema", "check", *span, "--schema", str(schema)]) == 0
