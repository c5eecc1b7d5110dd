"""The trainer's result lines (``runtime.formats.train_result``): what the writer writes the
reader reads back, a malformed line is an error that says what was wrong, and the
local-cluster launcher's totals."""
from __future__ import annotations

import math
import re

import pytest

from runtime.formats.train_result import RESULT, SUMMARY, TrainResult, TrainResultError
from runtime.local.ps import job_totals

BATCH = {"mode": "ps", "trainers": 2, "pservers": 1, "trainer_id": 0, "epochs": 2, "threads": 1,
         "examples": 2000, "rows": 1000, "load_seconds": 0.5, "train_seconds": 2.0, "examples_per_s": 1000.0,
         "examples_per_s_with_load": 800.0, "train_auc": [0.7, 0.75], "test_auc": [0.71, 0.76],
         "version": 1795432842, "export_seconds": 1.5}
CONTINUOUS = {"mode": "single", "trainers": 1, "pservers": 0, "mode_online": "continuous",
              "next_hour": "20261120/02", "examples": 300, "rows": 300, "train_seconds": 1.5,
              "partitions": [{"hour": "20261120/00", "rows": 100, "seconds": 0.5, "train_auc": 0.6},
                             {"hour": "20261120/01", "rows": 200, "seconds": 1.0, "auc_before": 0.7,
                              "train_auc": 0.65, "version": 7}],
              "wall_seconds_online": 3.0, "test_auc": [0.7],
              "exports": [{"id": 7, "kind": "base", "base": 7, "hour": "20261120/01", "rows": 10, "seconds": 0.1}],
              "version": 7}


@pytest.mark.parametrize("record", [BATCH, CONTINUOUS], ids=["batch", "continuous"])
@pytest.mark.parametrize("kind", [RESULT, SUMMARY])
def test_what_is_written_is_read_back(record, kind):
    line = TrainResult.of(record).format(kind)
    assert line.startswith(kind + " ") and "\n" not in line and "null" not in line
    assert TrainResult.parse(line, kind).to_dict() == record


def test_nan_auc_survives_the_line():
    line = TrainResult.of({**BATCH, "train_auc": [float("nan")]}).format()
    assert math.isnan(TrainResult.parse(line).train_auc[0])


def test_find_takes_the_last_line_of_its_kind():
    a = TrainResult.of({**BATCH, "version": 1}).format(SUMMARY)
    b = TrainResult.of({**BATCH, "version": 2}).format(SUMMARY)
    other = TrainResult.of({**BATCH, "version": 3}).format(RESULT)
    text = f"log line\n{a}\n{b}\n{other}\nmore\n"
    assert TrainResult.find(text, SUMMARY).version == 2
    assert TrainResult.find(text, RESULT).version == 3
    assert TrainResult.find("no result here\n", RESULT) is None


@pytest.mark.parametrize("line, says", [
    ("ELASTIC_CTR_SUMMARY {}", "ELASTIC_CTR_RESULT line expected"),
    ("ELASTIC_CTR_RESULT {not json", "not JSON"),
    ("ELASTIC_CTR_RESULT [1, 2]", "a JSON object expected"),
    ('ELASTIC_CTR_RESULT {"trainers": 1, "pservers": 0}', "mode: Field required"),
    ('ELASTIC_CTR_RESULT {"mode": "ps", "trainers": 1, "pservers": 0, "speed": 3}', "speed: Extra inputs"),
    ('ELASTIC_CTR_RESULT {"mode": "ps", "trainers": "two", "pservers": 0}', "trainers: "),
    ('ELASTIC_CTR_RESULT {"mode": "ps", "trainers": 1, "pservers": 0, "partitions": [{"hour": "x"}]}',
     "partitions[0].rows"),
])
def test_a_malformed_line_says_what_is_wrong(line, says):
    with pytest.raises(TrainResultError, match=re.escape(says)):
        TrainResult.parse(line, RESULT)


def test_find_names_the_source_and_the_writer_refuses_unknown_fields():
    with pytest.raises(TrainResultError, match="trainer-0.log: ELASTIC_CTR_RESULT line: not JSON"):
        TrainResult.find("ELASTIC_CTR_RESULT {", RESULT, source="trainer-0.log")
    with pytest.raises(TrainResultError, match="train result record: typo: Extra inputs"):
        TrainResult.of({**BATCH, "typo": 1})
    with pytest.raises(ValueError, match="kind"):
        TrainResult.of(BATCH).format("ELASTIC_CTR_OTHER")


def test_job_totals_sum_examples_over_the_slowest_trainer():
    recs = [TrainResult.of({**BATCH, "examples": 2000, "train_seconds": 2.0, "load_seconds": 0.5}),
            TrainResult.of({**BATCH, "trainer_id": 1, "examples": 1000, "train_seconds": 4.0, "load_seconds": 1.0})]
    assert job_totals(recs) == {"examples_total": 3000, "examples_per_s_total": 750.0,
                                "examples_per_s_with_load_total": 600.0}
    assert job_totals([]) == {"examples_total": 0, "examples_per_s_total": 0.0,
                              "examples_per_s_with_load_total": 0.0}


class _FakeWorker:
    """Just enough of ``runtime.trainer.worker.Worker`` for ``online.run`` without Paddle:
    each partition is ``rows`` rows trained in ``seconds``."""

    who, chief, shard = "fake", True, (0, 1)

    def __init__(self, rows: int, seconds: float):
        from types import SimpleNamespace

        self.rows, self.seconds = rows, seconds
        self.slots = [1]
        self.budget = SimpleNamespace(finish=lambda: None)

    def load(self, files, keep_rows=False, holdout_every=0):
        from types import SimpleNamespace

        return SimpleNamespace(release_memory=lambda: None), SimpleNamespace(rows=self.rows, holdout=None, ids_seen=None)

    def train_pass(self, ds, label, expected_rows):
        from runtime.trainer.passes import PassStats

        return PassStats(expected_rows, self.seconds, 0.7, 0.5)

    def barrier(self):
        pass

    def sync(self):
        pass

    def full_table(self, save_dir, exact=False):
        import numpy as np

        return np.arange(3, dtype=np.uint64), np.ones((3, 9), np.float32)

    def fed_rows(self):
        return self.full_table(None)

    def reset_fed(self):
        pass

    def local_table(self):
        return None

    def checkpoint(self, directory):
        import os

        os.makedirs(directory, exist_ok=True)


def test_continuous_job_reports_its_examples_and_rate(tmp_path):
    """The summary of a continuous job counts every partition's rows (it reported
    ``examples_total 0`` and ``examples_per_s_total 0.0``)."""
    from runtime.formats import partitions
    from runtime.trainer import online
    from runtime.trainer.config import TrainConfig

    for h in ("20261120/00", "20261120/01", "20261120/02"):
        d = tmp_path / "data" / h
        d.mkdir(parents=True)
        (d / "part-0.txt").write_text("")
        partitions.mark_complete(d)
    cfg = TrainConfig(mode="continuous", data_root=str(tmp_path / "data"), start_hour="20261120/00",
                      end_hour="20261120/02", state_dir=str(tmp_path / "state"), patch_every_seconds=3600,
                      table_dir=str(tmp_path / "table"))
    job = {"mode": "ps", "trainers": 1, "pservers": 1, "trainer_id": 0}
    rec = TrainResult.of(online.run(_FakeWorker(rows=500, seconds=0.25), cfg, [], job))
    assert rec.examples == 1500 and rec.rows == 1500 and rec.train_seconds == pytest.approx(0.75)
    assert [p.seconds for p in rec.partitions] == [0.25, 0.25, 0.25]
    totals = job_totals([rec])
    assert totals["examples_total"] == 1500 and totals["examples_per_s_total"] == 2000.0
    assert 0 < totals["examples_per_s_with_load_total"] <= 2000.0
