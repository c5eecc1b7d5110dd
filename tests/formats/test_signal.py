"""``signal.json`` (``runtime.formats.signal``): a reader accepts exactly what the generator
writes, and names the file and the field of anything else."""
from __future__ import annotations

import json

import pytest

from runtime.formats import signal
from runtime.trainer import generator

START = "20261120/00"


def test_hourly_signal_round_trips_and_gives_the_hours_auc(tmp_path):
    rec = generator.generate_hours(tmp_path, 2, START, 500, seed=2)
    back = signal.read_hourly(tmp_path)
    assert back == rec and [h.hour for h in back.hours] == ["20261120/00", "20261120/01"]
    assert signal.true_logit_auc(back, 1) == [back.hours[1].true_logit_auc]
    with pytest.raises(signal.SignalError, match="seconds: Field required"):
        signal.read_split(tmp_path)  # an hourly document is not a split one


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.pop("rows_per_hour"), "rows_per_hour: Field required"),
    (lambda d: d["hours"][0].update(rows=0), r"hours\[0\]\.rows: Input should be greater"),
    (lambda d: d.update(colour="blue"), "colour: Extra inputs are not permitted"),
])
def test_a_malformed_signal_names_the_file_and_the_field(tmp_path, edit, field):
    generator.generate_hours(tmp_path, 1, START, 200, seed=2)
    path = tmp_path / signal.FILE
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(signal.SignalError, match=field) as err:
        signal.read_hourly(tmp_path)
    assert str(path) in str(err.value)


def test_a_missing_or_broken_signal_is_named(tmp_path):
    with pytest.raises(signal.SignalError, match="no such file"):
        signal.read_split(tmp_path)
    (tmp_path / signal.FILE).write_text("{not json")
    with pytest.raises(signal.SignalError, match="not JSON"):
        signal.read_split(tmp_path)
