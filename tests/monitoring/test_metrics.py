"""The roles' metric modules (``runtime.metrics``) and the local scrape targets, in
process: what each family reads or counts, and the values that mean "unknown"."""
from __future__ import annotations

import json
import logging
import math
import time
from types import SimpleNamespace

import pytest

from runtime import role_specs
from runtime.formats import partitions
from runtime.metrics.cube import AgentMetrics, server_registry
from runtime.metrics.trainer import TrainerMetrics, waiting_counter
from runtime.metrics.transfer import TransferMetrics
from runtime.local import targets


def _table(nbytes: int):
    return SimpleNamespace(t=SimpleNamespace(nbytes=nbytes))


def test_the_cube_servers_families_come_from_its_counters():
    versions = SimpleNamespace(served=(_table(4096), None), bg=_table(100), loads={"ok": 2, "failed": 1}, enables=3)
    server = SimpleNamespace(shard=1, shard_num=4, versions=versions, status=lambda: {
        "requests": 10, "keys_looked_up": 1000, "hits": 900, "errors": {"BAD_REQUEST": 2}, "version": 7,
        "prev_version": None, "keys": 123, "connections": 2})
    reg = server_registry(server)
    lbl = {"shard": "1", "shard_num": "4"}
    assert reg.get_sample_value("elastic_ctr_cube_misses_total", lbl) == 100
    assert reg.get_sample_value("elastic_ctr_cube_served_version", lbl) == 7
    assert reg.get_sample_value("elastic_ctr_cube_previous_version", lbl) == 0
    assert reg.get_sample_value("elastic_ctr_cube_version_bytes", {**lbl, "slot": "current"}) == 4096
    assert reg.get_sample_value("elastic_ctr_cube_version_bytes", {**lbl, "slot": "previous"}) == 0
    assert reg.get_sample_value("elastic_ctr_cube_version_bytes", {**lbl, "slot": "loading"}) == 100
    assert reg.get_sample_value("elastic_ctr_cube_errors_total", {**lbl, "status": "BAD_REQUEST"}) == 2
    assert reg.get_sample_value("elastic_ctr_cube_loads_total", {**lbl, "result": "failed"}) == 1


def test_agent_steps_count_seconds_bytes_and_failures():
    m = AgentMetrics()
    m.step_done("download", 1.5, True, 2048)
    m.step_done("reload", 0.5, False, 999)  # a failed step moves no bytes
    r = m.registry
    assert r.get_sample_value("elastic_ctr_cube_agent_bytes_total", {"step": "download"}) == 2048
    assert r.get_sample_value("elastic_ctr_cube_agent_bytes_total", {"step": "reload"}) == 0
    assert r.get_sample_value("elastic_ctr_cube_agent_steps_total", {"step": "reload", "result": "failed"}) == 1
    assert r.get_sample_value("elastic_ctr_cube_agent_step_seconds_sum", {"step": "download"}) == 1.5


def test_transfer_data_time_and_landed_to_served():
    m = TransferMetrics()
    r = m.registry
    assert math.isnan(r.get_sample_value("elastic_ctr_transfer_served_data_end_timestamp_seconds"))
    m.served(5, data_end=1000.0, landed=1100.0, served_at=1160.0)
    m.served(5, data_end=1000.0, landed=1100.0, served_at=2000.0, new=False)  # after a restart: not again
    assert r.get_sample_value("elastic_ctr_transfer_served_data_end_timestamp_seconds") == 1000
    assert r.get_sample_value("elastic_ctr_transfer_landed_to_served_seconds_count") == 1
    assert r.get_sample_value("elastic_ctr_transfer_landed_to_served_seconds_sum") == 60
    m.in_phase("reloading")
    assert r.get_sample_value("elastic_ctr_transfer_rollout_phase", {"phase": "reloading"}) == 1
    m.rollout_done("failed", None, {"Building": 2.0}, given_up=True)
    assert r.get_sample_value("elastic_ctr_transfer_rollout_phase", {"phase": "reloading"}) == 0
    assert r.get_sample_value("elastic_ctr_transfer_versions_failed_total") == 1
    assert r.get_sample_value("elastic_ctr_transfer_phase_seconds_sum", {"phase": "building"}) == 2.0
    m.served(6, data_end=None, landed=None, served_at=3000.0)  # a batch job's version: no data time
    assert math.isnan(r.get_sample_value("elastic_ctr_transfer_served_data_end_timestamp_seconds"))


def test_partitions_waiting_counts_complete_partitions_from_the_first_untrained(tmp_path):
    start = partitions.Hour.parse("20261120/00")
    for i in (0, 1, 2, 4):  # 3 is missing: the count stops there
        d = tmp_path / start.next(i).location("").lstrip("/")
        d.mkdir(parents=True)
        partitions.mark_complete(d)
    first = [start]
    count = waiting_counter(str(tmp_path), lambda: first[0])
    assert count() == 3
    first[0] = start.next(2)
    assert count() == 1
    m = TrainerMetrics()
    m.count_waiting(count)
    assert m.registry.get_sample_value("elastic_ctr_trainer_partitions_waiting") == 1
    first[0] = start  # cached for WAITING_TTL_S: a scrape costs at most one count per TTL
    assert m.registry.get_sample_value("elastic_ctr_trainer_partitions_waiting") == 1


def test_trainer_figures_and_unknown_timestamps():
    m = TrainerMetrics()
    r = m.registry
    assert math.isnan(r.get_sample_value("elastic_ctr_trainer_exported_data_end_timestamp_seconds"))
    m.pass_done(1000, 2.0, 0.71, float("nan"))
    m.partition_done(7200.0, 0.68)
    m.export_done("patch", 3.0, 55, 1795870000, 7200.0)
    m.table_saved({0: 40, 1: 60})
    assert r.get_sample_value("elastic_ctr_trainer_pass_examples_per_second") == 500
    assert r.get_sample_value("elastic_ctr_trainer_auc", {"stage": "before_training"}) == 0.68
    assert math.isnan(r.get_sample_value("elastic_ctr_trainer_loss"))  # a NaN loss is not reported
    assert r.get_sample_value("elastic_ctr_trainer_export_rows_total", {"kind": "patch"}) == 55
    assert r.get_sample_value("elastic_ctr_pserver_table_rows", {"pserver": "1"}) == 60


def test_the_tracking_clients_reachability():
    from runtime import tracking
    from runtime.metrics.tracking import TrackingCollector

    def reachable():
        (fam,) = [f for f in TrackingCollector().collect() if f.name == "elastic_ctr_tracking_reachable"]
        return fam.samples[0].value

    tr = tracking.Tracker("http://127.0.0.1:9", "unreachable")  # nothing listens on port 9
    tr.log_metrics({"a": 1.0}, step=0)
    deadline = time.monotonic() + 30
    while tr.reachable is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tr.reachable is False and reachable() == 0
    tr.close(timeout_s=1)


def test_scrape_targets_are_written_from_role_specs(tmp_path, monkeypatch):
    spec = role_specs.cube_server(0, 2, role_specs.LOOPBACK, 9000, 9001)
    path = targets.register(spec, "cube-server-0-1", {"replica": "1"}, directory=tmp_path)
    assert path.name == "cube-server--cube-server-0-1.json"
    assert json.loads(path.read_text()) == [{"targets": ["127.0.0.1:9001"],
                                             "labels": {"job": "cube-server", "replica": "1"}}]
    assert targets.register(role_specs.tracking_server(), "mlflow", directory=tmp_path) is None  # no metrics
    monkeypatch.delenv(targets.SCRAPE_DIR_ENV, raising=False)
    assert targets.register(spec, "x") is None  # no directory: nothing written
    with pytest.raises(ValueError, match="name 'a--b'"):
        targets.target_file(tmp_path, "serving", "a--b")
    targets.unregister(path)
    assert not path.exists()
    assert not list(tmp_path.iterdir())


def test_a_trainer_whose_metrics_port_is_taken_trains_on_without_metrics(monkeypatch, caplog):
    import socket

    from runtime.metrics import trainer

    # a CLI run in this process before (``elastic-ctr data``) may have kept our loggers' lines
    # from the root logger, where caplog listens
    monkeypatch.setattr(logging.getLogger("runtime"), "propagate", True)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        monkeypatch.setenv(role_specs.METRICS_PORT_ENV, str(taken.getsockname()[1]))
        monkeypatch.setenv(role_specs.METRICS_HOST_ENV, "127.0.0.1")
        assert trainer.serve_from_env() is None
        assert "cannot listen on 127.0.0.1" in caplog.text
        monkeypatch.setenv(role_specs.METRICS_PORT_ENV, "http")
        with pytest.raises(ValueError, match="ELASTIC_CTR_METRICS_PORT: 'http' is not a port number"):
            trainer.metrics_port()
    finally:
        taken.close()
