"""The Prometheus rules (``runtime.metrics.rules``): ``promtool check rules`` accepts the
rule file, and ``promtool test rules`` runs a unit test per alert (``rules_test.yaml``: it
fires on the series that should fire it and stays silent on a healthy one). The unit
tests discriminate: with other thresholds they fail."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from runtime.metrics import rules

HERE = Path(__file__).resolve().parent


#: the promtool unit test files (the gates' and the table budget's alerts have their own)
TEST_FILES = ("rules_test.yaml", "gate_rules_test.yaml", "budget_rules_test.yaml")
#: the thresholds budget_rules_test.yaml is written for (the others: the defaults)
BUDGETS = rules.Thresholds(pserver_budget_rows=1_000_000, cube_shard_budget_keys=500_000)


def _write(tmp_path: Path, t: rules.Thresholds) -> Path:
    (tmp_path / "rules.yaml").write_text(rules.rule_file(t))
    for name in TEST_FILES:
        shutil.copy(HERE / name, tmp_path / name)
    return tmp_path / "rules_test.yaml"


def test_promtool_checks_the_rule_file(promtool, tmp_path):
    (tmp_path / "rules.yaml").write_text(rules.rule_file())
    r = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(rules.recording_rules()) + len(rules.alerts())
    assert f"SUCCESS: {n} rules found" in r.stdout


def test_every_alert_has_a_unit_test_that_passes(promtool, tmp_path):
    _write(tmp_path, BUDGETS)
    tested = {case["alertname"] for name in TEST_FILES for t in yaml.safe_load((tmp_path / name).read_text())["tests"]
              for case in t.get("alert_rule_test", [])}
    assert tested == set(rules.ALERTS), f"alerts without a unit test: {set(rules.ALERTS) - tested}"
    r = subprocess.run([promtool, "test", "rules", *TEST_FILES], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_gate_alerts_lifecycle_fire_at_once_and_resolve_an_hour_after_the_last(promtool, tmp_path, monkeypatch):
    """The gates' alerts (gate_rules_test.yaml): a quarantined partition or a held version
    fires its ticket at the next evaluation, with the count of the last hour, and resolves
    an hour after the last one (a restarted trainer's counter included); a stack whose
    gates refused nothing stays silent. The same tests fail when the alerts stay open
    longer."""
    _write(tmp_path, rules.Thresholds())
    r = subprocess.run([promtool, "test", "rules", "gate_rules_test.yaml"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    monkeypatch.setattr(rules, "GATE_ALERT_WINDOW", "2h")
    _write(tmp_path, rules.Thresholds())
    r = subprocess.run([promtool, "test", "rules", "gate_rules_test.yaml"], capture_output=True, text=True,
                       cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "ElasticCtrPartitionsQuarantined" in out and "ElasticCtrModelGateHeld" in out


def test_lifecycle_table_budget_alerts_fire_a_day_ahead_of_the_budget(promtool, tmp_path):
    """The table budget's alerts (budget_rules_test.yaml): a table growing 20k rows an hour
    toward a 1M budget opens a ticket as soon as 6 hours show the trend; a table at its
    plateau stays silent. With twice the budget the same series stay silent (the tests
    fail), and a stack without a budget has no such alert."""
    _write(tmp_path, BUDGETS)
    r = subprocess.run([promtool, "test", "rules", "budget_rules_test.yaml"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    _write(tmp_path, rules.Thresholds(pserver_budget_rows=2_000_000, cube_shard_budget_keys=1_000_000))
    r = subprocess.run([promtool, "test", "rules", "budget_rules_test.yaml"], capture_output=True, text=True,
                       cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "ElasticCtrPserverTableOverBudget" in out and "ElasticCtrCubeShardOverBudget" in out
    names = {a.name for a in rules.alerts()}
    assert not names & {"ElasticCtrPserverTableOverBudget", "ElasticCtrCubeShardOverBudget"}


def test_the_unit_tests_fail_against_other_thresholds(promtool, tmp_path):
    test_file = _write(tmp_path, rules.Thresholds(freshness_slo_s=4 * 3600, error_ratio=0.1))
    r = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "ElasticCtrServedDataStale" in out and "ElasticCtrServingErrors" in out


def test_every_alert_expression_names_catalogued_metrics():
    from runtime.metrics import catalog

    known = catalog.series_names()
    for name, expr in [(a.name, a.expr) for a in rules.ALERTS.values()] + [(r["record"], r["expr"])
                                                                   for r in rules.recording_rules()]:
        missing = catalog.unknown_metrics(expr, known)
        assert not missing, f"{name}: no role exposes {missing}"


@pytest.mark.parametrize("bad", [{"freshness_slo_s": -1}, {"error_ratio": 1.5}, {"p99_s": float("nan")}])
def test_thresholds_refuse_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        rules.Thresholds(**bad)


def test_durations():
    assert [rules.duration(s) for s in (0, 90, 300, 3600, 5400, 7200)] == ["0s", "90s", "5m", "1h", "90m", "2h"]
