"""The continuous job's cadences in time (runtime.trainer.cadence), without Paddle, and the
generator writing minute partitions (runtime.trainer.generator)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from runtime.formats import partitions, signal
from runtime.trainer import cadence, generator, readers


@pytest.mark.parametrize("since,elapsed,every,due", [
    (0, math.inf, 0.0, False),   # nothing trained since the last export
    (1, math.inf, 300.0, True),  # the first boundary of a run exports
    (1, 0.5, 0.0, True),         # 0: every partition
    (3, 59.9, 60.0, False),      # partitions come faster than patchEverySeconds: wait
    (4, 60.0, 60.0, True),       # ... until it has passed (whichever is later)
])
def test_export_every_partition_or_every_patch_every_seconds_whichever_is_later(since, elapsed, every, due):
    assert cadence.export_due(since, elapsed, every) is due


def test_a_run_of_minute_partitions_exports_at_most_once_per_patch_every_seconds():
    # 20 one-minute partitions trained 15 s apart (faster than real time), patchEverySeconds 45
    exported, last = [], -math.inf
    for i in range(20):
        t = 15.0 * (i + 1)
        since = i + 1 - (exported[-1] + 1 if exported else 0)
        if cadence.export_due(since, t - last, 45.0):
            exported.append(i)
            last = t
    assert exported == [0, 3, 6, 9, 12, 15, 18]
    assert all(b - a >= 3 for a, b in zip(exported, exported[1:]))


@pytest.mark.parametrize("minutes,since,every,due", [
    (60, 23, 1440, False), (60, 24, 1440, True),   # hourly: 24 partitions = a day
    (1, 1439, 1440, False), (1, 1440, 1440, True),  # minute partitions: the same day of data
    (5, 12, 60, True), (15, 3, 60, False),
])
def test_base_and_checkpoint_cadences_count_minutes_of_data(minutes, since, every, due):
    assert cadence.base_due(True, since, minutes, every) is due
    assert cadence.checkpoint_due(since, minutes, every) is due


def test_base_due_without_a_base_or_when_forced_and_checkpoint_at_the_end():
    assert cadence.base_due(False, 0, 1, 1440)
    assert cadence.base_due(True, 0, 1, 1440, forced=True)
    assert not cadence.base_due(True, 0, 1, 1440)
    assert cadence.checkpoint_due(0, 1, 1440, last=True)
    assert not cadence.checkpoint_due(0, 1, 1440)


def test_generator_writes_minute_partitions(tmp_path):
    rec = generator.generate_hours(tmp_path, 3, "20261120/2359", 300, seed=2, minutes=1)
    assert [h.hour for h in rec.hours] == ["20261120/2359", "20261121/0000", "20261121/0001"]
    assert rec.partition_minutes == 1 and signal.read_hourly(tmp_path).partition_minutes == 1
    p = partitions.Partition.parse("20261120/2359", minutes=1)
    for i in range(3):
        (f,) = partitions.files(str(tmp_path), p.next(i))
        assert f.endswith(f"/{p.next(i)}/part-00000")
        assert len(readers.read_all([f])) == 300
    assert (tmp_path / "20261121" / "0001" / partitions.DONE_MARKER).exists()
    # an hourly run of the same seed keeps its layout
    hourly = generator.generate_hours(tmp_path / "h", 1, "20261120/00", 300, seed=2)
    assert hourly.partition_minutes == 60 and (tmp_path / "h" / "20261120" / "00" / "_SUCCESS").exists()
    with pytest.raises(partitions.PartitionError, match="--start"):
        generator.generate_hours(tmp_path / "bad", 1, "20261120/0003", 10, minutes=5)


def test_minute_partitions_drift_once_an_hour(tmp_path):
    # partitions inside one hour share a model: their feasign sets overlap far more than
    # two partitions an hour apart, whose drift replaced part of each big slot's values
    generator.generate_hours(tmp_path, 3, "20261120/0058", 4000, seed=3, minutes=1)
    p = partitions.Partition.parse("20261120/0058", minutes=1)
    sets = [set(np.unique(readers.read_all(partitions.files(str(tmp_path), p.next(i))).feasigns).tolist())
            for i in range(3)]
    assert sets[0] and sets[1] and sets[2]
    fresh_in_hour = len(sets[1] - sets[0]) / len(sets[1])
    fresh_across = len(sets[2] - sets[1]) / len(sets[2])
    assert fresh_across > fresh_in_hour
