"""A real Prometheus (Debian's package, started and stopped by the project's code:
``runtime.local.prometheus`` / ``runtime.local.prometheus_server``) scraping the local pipeline
(``elastic-ctr local --prometheus``'s online loop, ``HOURS`` hourly partitions from three
hours before the current one, so the versions' data times are recent: the base's data
ends two hours before the current hour began, within the default 3 h freshness SLO) while
it runs:

* while every role is up (after the second version is served, or the third when the
  transfer's model gate held the second; the trainer waiting for the next partition),
  every target is up, every dashboard panel's query evaluates without error and returns
  data over the run, every rule is healthy and every alert expression evaluates, and the
  freshness alert is silent;
* the outage drill: the transfer is stopped, the next partition lands, the trainer
  exports its version, which is not served (the trainer then waits for one more
  partition, so its metrics of that export are scraped while it lives); the freshness SLO is set to the served
  version's age then plus 20 s (the partitions are hours, so any SLO of hours would take
  hours to pass), the rules reloaded: the alert is silent at first and fires once the SLO
  passes, on its namespace-less local series; the transfer comes back, rolls the waiting
  version out (the online loop waits for serving to switch to it), and the alert resolves;
* the chart of freshness and AUC is drawn from the query API.
"""
from __future__ import annotations

import time

import pytest

from runtime import proc, tracking
from runtime.cli import build_parser
from runtime.formats import donefile
from runtime.metrics import dashboards, rules
from runtime.local.targets import SCRAPE_DIR_ENV

STALE = "ElasticCtrServedDataStale"
#: partitions the live run trains: the drill's, after the base's, has two after it
HOURS = 5


def _wait(what: str, cond, timeout_s: float, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(poll_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


class Drill:
    """The observer of ``runtime.local.online.run`` (its ``before_landing`` / ``at_end``)."""

    def __init__(self, prom, t_run: float, hours: int):
        self.prom, self.t_run = prom, t_run
        self.last_t = hours - 3  # the drill's partition lands with at least one after it
        self.report: dict = {}

    def value(self, expr: str) -> float:
        (sample,) = self.prom.query(expr)
        return float(sample["value"][1])

    def firing(self) -> list[dict]:
        return [a for a in self.prom.alerts(STALE) if a["state"] == "firing"]

    def check_everything_evaluates(self) -> None:
        p = self.prom

        jobs = {"fileserver", "cube-server", "cube-agent", "cube-transfer", "serving", "pserver", "trainer"}

        def down():  # a scrape missed on a loaded machine is retried; a role that is down stays down
            targets = p.targets()
            # a role's target file is read by Prometheus's file discovery a moment after it is written
            absent = [(job, "no target yet") for job in sorted(jobs - {t["labels"]["job"] for t in targets})]
            return absent + [(t["labels"]["job"], t["lastError"]) for t in targets if t["health"] != "up"]

        try:
            _wait("every target discovered and up", lambda: not down(), 30)
        except TimeoutError:
            pytest.fail(f"targets absent or down: {down()}")
        assert {t["labels"]["job"] for t in p.targets()} == jobs

        def empty_panels() -> list[tuple[str, str, str]]:
            now = time.time()
            rng = f"{int(now - self.t_run) + 5}s"
            empty = []
            for q in dashboards.queries():
                res = p.query_range(dashboards.expand(q.expr, "15s", rng), self.t_run, now, 1.0)  # errors raise
                if not any(v == v for r in res for _, v in ((t, float(x)) for t, x in r["values"])):
                    empty.append((q.dashboard, q.panel, q.ref))
            return empty

        # a rate needs two scrapes after the client's first requests: on a loaded machine
        # the first may come a scrape interval or two after serving turned ready
        try:
            _wait("every panel query has data", lambda: not empty_panels(), 30, 2.0)
        except TimeoutError:
            pytest.fail(f"panel queries without data: {empty_panels()}")
        for r in p.rules():
            assert r["health"] == "ok", r
        for a in rules.alerts():
            p.query(a.expr)  # an expression that does not evaluate raises PrometheusError
        assert not self.firing()
        self.report["queries"] = len(dashboards.queries())

    def before_landing(self, t: int, svc, land) -> bool:
        # the first served version after the base; the transfer's model gate may hold the
        # version of the second partition (a small, drifting hour), then it is the third's.
        # Never the last partition's: the trainer must live on after the drill's export
        if not 1 <= t <= self.last_t or "waiting" in self.report:
            return False
        self.check_everything_evaluates()
        cube = svc.cube
        served = int(self.value("min(elastic_ctr_serving_model_version)"))
        cube.group.stop(cube.transfer)  # SIGTERM by PID: readiness false, in-flight work done, exit 0
        land()
        def exported_after_served():
            newest = max((r.id for k in donefile.KINDS for r in donefile.read(svc.root, k)), default=0)
            return newest if newest > served else None

        newest = _wait("the trainer's version of the landed partition", exported_after_served, 180)
        _wait("the transfer's target down", lambda: any(
            x["labels"]["job"] == "cube-transfer" and x["health"] == "down" for x in self.prom.targets()), 30)
        age = self.value("time() - min(elastic_ctr_serving_model_data_end_timestamp_seconds)")
        slo = age + 20.0
        self.prom.set_rules(rules.Thresholds(freshness_slo_s=slo))
        time.sleep(3 * self.prom.evaluation_interval_s)
        assert not self.firing(), "fired before its SLO passed"
        alert = _wait("the freshness alert", self.firing, 60)[0]
        assert float(alert["value"]) > slo
        # the metrics show the version waiting beyond the served one (the trainer lives on,
        # waiting for the next partition, so the export is scraped)
        exported = _wait("the trainer's exported version scraped", lambda: int(self.value(
            "max(max_over_time(elastic_ctr_trainer_exported_version[2m]))")) == newest and newest, 30)
        assert served < exported, (served, exported)
        assert int(self.value("min(elastic_ctr_serving_model_version)")) == served  # still the old one
        self.report.update(slo=slo, alert=alert, served=served, waiting=newest)
        cube.restart_transfer()
        return True

    def at_end(self, svc) -> None:
        _wait("the freshness alert resolved", lambda: not self.firing(), 60)
        # the waiting version was served (the loop waited for it), then the next partitions'
        # unless the model gate held them
        assert "waiting" in self.report, "no drill: the model gate held every version it could take"
        assert int(self.value("min(elastic_ctr_serving_model_version)")) >= self.report["waiting"]
        self.report["resolved"] = True


@pytest.mark.slow
def test_prometheus_scrapes_the_live_pipeline_and_the_freshness_alert_fires(tmp_path, prometheus_binary,
                                                                            monkeypatch):
    from runtime.local import online, pipeline
    from runtime.local import prometheus as local_prometheus

    run_dir = tmp_path / "run"
    args = build_parser().parse_args([
        "local", "--hours", str(HOURS), "--rows-per-hour", "12000", "--eval-rows", "2000", "--latency-requests", "200",
        "--rollout-rate", "100", "--no-tracking", "--no-wait", "--prometheus",
        "--shrink-every-minutes", "60",  # a shrink point after the first partition, for its panel
        "--start-hour", online.start_hour("now", 3),
        "--run-dir", str(run_dir)])
    # the variables the run sets for its roles, restored after the test
    monkeypatch.setenv(SCRAPE_DIR_ENV, str(run_dir / "prometheus" / "targets"))
    monkeypatch.setenv(tracking.JOB_ENV, "live-monitoring-test")
    run_dir.mkdir(parents=True)
    with proc.ProcessGroup(run_dir / "logs", grace_s=5.0) as group:
        prom = local_prometheus.launch(args, run_dir, group)
        drill = Drill(prom, time.time(), HOURS)
        rc = online.run(args, run_dir, group, pipeline._Step(), prom=prom, observer=drill)
    assert rc == 0
    assert drill.report["queries"] >= 40 and drill.report["resolved"]
    assert drill.report["alert"]["labels"]["severity"] == "page"
    png = run_dir / "freshness-auc.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert prom.role.proc.poll() is not None  # stopped with the group
