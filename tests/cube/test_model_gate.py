"""The transfer's model gate (runtime.cube.transfer.model_gate): a version worse than the
previous one on its rows set aside is held (not rolled out; history, /dict/info, metric),
the next good patch goes out with the held patch's rows (served complete), a model that
stays broken stays held until it is back within the last passed version's bounds, a held
base keeps its patches back until a newer base. Fixtures ``cluster`` and ``root``:
tests/cube/conftest.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.cube.buildinfo import BuildRecord
from runtime.cube.transfer import model_gate
from runtime.formats import donefile, version_eval
from tests.cube.transfer_harness import DICT, make_transfer

GOOD = {"auc": 0.78, "logloss": 0.47, "calibration": 1.01}
PREV = {"auc": 0.77, "logloss": 0.48, "calibration": 0.98}
# an export with blown-up parameters: predictions pinned near 0 or 1
BLOWN = {"auc": 0.55, "logloss": 3.2, "calibration": 3.4}


def add(root: Path, vid: int, key: int, cand: dict | None, base: dict | None = PREV) -> None:
    """A version whose model_meta.json carries ``metrics.evaluation`` (None: no record)."""
    vdir = root / "versions" / str(vid)
    (vdir / "sparse").mkdir(parents=True)
    (vdir / "dense").mkdir()
    (vdir / "sparse" / "part-00000").write_bytes(b"v%d;" % vid)
    metrics = {} if cand is None else {"evaluation": {"hour": "20261120/01", "rows": 1000, "candidate": cand,
                                                      "baseline": base}}
    (vdir / "dense" / "model_meta.json").write_text(json.dumps({"metrics": metrics}))
    rec = donefile.DonefileRecord(id=vid, key=key, input=donefile.sparse_dir(vid), model=donefile.dense_dir(vid))
    donefile.append(str(root), "base" if vid == key else "patch", rec)


def test_reasons_follow_the_thresholds():
    th = model_gate.Thresholds()
    ev = version_eval.VersionEvaluation.model_validate({"hour": "h", "rows": 1000, "candidate": BLOWN, "baseline": PREV})
    why = model_gate.reasons(ev, th)
    assert len(why) == 3 and why[0].startswith("AUC 0.5500") and "log loss" in why[1] and "calibration" in why[2]
    ok = version_eval.VersionEvaluation.model_validate({"hour": "h", "rows": 1000, "candidate": GOOD, "baseline": PREV})
    assert model_gate.reasons(ok, th) == []
    first = version_eval.VersionEvaluation.model_validate({"hour": "h", "rows": 1000, "candidate": BLOWN})
    assert model_gate.reasons(first, th) == []  # no baseline: nothing to compare with
    assert model_gate.reasons(ev, model_gate.Thresholds(enabled=False)) == []
    few = ev.model_copy(update={"rows": th.min_rows - 1})
    assert model_gate.reasons(few, th) == []  # too few rows to judge: it passes
    with pytest.raises(version_eval.EvaluationError, match="meta.json: metrics.evaluation"):
        version_eval.from_metrics({"evaluation": {"rows": 1}}, "meta.json")


def test_a_held_patch_is_not_served_and_the_next_good_one_carries_its_rows(cluster, root, tmp_path):
    """(c): version 102 (blown up) is held; 103 goes out built from 102's rows then its own,
    so the served table is never without them; history, /dict/info and the metric say so."""
    add(root, 100, 100, GOOD, None)
    add(root, 101, 100, GOOD)
    tr = make_transfer(cluster, root, tmp_path / "work")
    assert tr.poll_once()["version"] == 100
    assert tr.poll_once()["version"] == 101
    add(root, 102, 100, BLOWN)
    assert tr.poll_once() is None  # held: nothing rolled out
    assert cluster.versions() == [101] * 4
    info = tr.info()
    assert info.version == 101 and info.held == [102]
    held = [h for h in tr.history() if h.get("status") == "held"]
    assert [h["version"] for h in held] == [102] and "AUC 0.5500" in held[0]["error"]
    assert tr.metrics.registry.get_sample_value("elastic_ctr_transfer_versions_held_total") == 1
    add(root, 103, 100, GOOD)
    e = tr.poll_once()
    assert e["version"] == 103 and e["status"] == "finished", e
    assert cluster.versions() == [103] * 4
    for s in cluster.servers:
        assert s.enables == [100, 101, 103]
    build = BuildRecord.read(tmp_path / "work" / "build" / DICT / "103")
    assert [Path(p).parts[-3] for p in build.inputs] == ["102", "103"]  # the held rows first, its own win
    assert tr.metrics.registry.get_sample_value("elastic_ctr_transfer_versions_held_total") == 1  # judged once
    # a restarted transfer judges again, counts nothing twice and keeps serving 103
    tr2 = make_transfer(cluster, root, tmp_path / "work")
    assert tr2.poll_once() is None and tr2.info().held == [102]


# still broken, trained on from the held version: better than it, far worse than PREV/GOOD
STILL_BAD = {"auc": 0.60, "logloss": 2.1, "calibration": 2.9}
RECOVERED = {"auc": 0.775, "logloss": 0.475, "calibration": 1.0}


def test_a_model_broken_for_several_versions_stays_held_until_it_recovers(cluster, root, tmp_path):
    """The breakage a version-by-version comparison misses: after 102 (blown up) is held,
    the trainer goes on from it, so 103's baseline is 102 and 103 (still broken) is no
    worse than it: alone it would pass. The held chain is judged against the last version
    that passed too (102's baseline): 103 and 104 are held, 105 (recovered) goes out built
    from 102-104's rows then its own."""
    add(root, 100, 100, GOOD, None)
    add(root, 101, 100, GOOD)
    add(root, 102, 100, BLOWN, PREV)
    add(root, 103, 100, STILL_BAD, BLOWN)
    add(root, 104, 100, STILL_BAD, STILL_BAD)
    ev103 = version_eval.VersionEvaluation.model_validate({"hour": "h", "rows": 1000, "candidate": STILL_BAD,
                                                           "baseline": BLOWN})
    assert model_gate.reasons(ev103, model_gate.Thresholds()) == []  # against its held predecessor: passes
    tr = make_transfer(cluster, root, tmp_path / "work")
    assert tr.poll_once()["version"] == 100
    assert tr.poll_once()["version"] == 101
    assert tr.poll_once() is None and cluster.versions() == [101] * 4
    assert tr.info().held == [102, 103, 104]
    held = {h["version"]: h["error"] for h in tr.history() if h.get("status") == "held"}
    assert "AUC 0.6000 < the last passed version's 0.7700 - 0.05 (held since version 102)" in held[103]
    assert "held since version 102" in held[104]
    # a restarted transfer judges the chain again, in order, to the same verdicts
    tr = make_transfer(cluster, root, tmp_path / "work")
    assert tr.poll_once() is None and tr.info().held == [102, 103, 104]
    add(root, 105, 100, RECOVERED, STILL_BAD)
    e = tr.poll_once()
    assert e["version"] == 105 and e["status"] == "finished", e
    assert cluster.versions() == [105] * 4
    build = BuildRecord.read(tmp_path / "work" / "build" / DICT / "105")
    assert [Path(p).parts[-3] for p in build.inputs] == ["102", "103", "104", "105"]
    assert [h["version"] for h in tr.history() if h.get("status") == "held"] == [102, 103, 104]  # once each


def test_a_held_base_keeps_its_patches_back_until_a_newer_base(cluster, root, tmp_path):
    add(root, 100, 100, GOOD, None)
    tr = make_transfer(cluster, root, tmp_path / "work")
    assert tr.poll_once()["version"] == 100
    add(root, 200, 200, BLOWN)
    add(root, 201, 200, GOOD)  # a patch of the held base: never applied without it
    assert tr.poll_once() is None
    assert cluster.versions() == [100] * 4 and tr.info().held == [200]
    add(root, 300, 300, GOOD)
    assert tr.poll_once()["version"] == 300
    assert cluster.versions() == [300] * 4


def test_versions_without_an_evaluation_and_the_gate_off_pass(cluster, root, tmp_path):
    add(root, 100, 100, None)
    add(root, 101, 100, BLOWN)
    tr = make_transfer(cluster, root, tmp_path / "work", model_gate=model_gate.Thresholds(enabled=False))
    assert tr.poll_once()["version"] == 100
    assert tr.poll_once()["version"] == 101
    assert tr.info().held == []
