"""The trainer's result lines (``runtime.formats.train_result``): what the writer writes the
reader reads back, a malformed line is an error that says what was wrong, and the
local-cluster launcher's totals."""
from __future__ import annotations

import math
import re

import pytest

from runtime.formats.train_result import RESULT, SUMMARY, TrainResult, TrainResultError
from runtime.trainer.cluster import job_totals

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
