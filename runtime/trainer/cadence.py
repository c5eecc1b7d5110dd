"""The continuous job's cadences in time (``runtime.trainer.online``): when a version is
exported, when it is a base, when the tables are checkpointed. Pure functions of the
settings (``TrainConfig``: ``partition_minutes``, ``patch_every_seconds``,
``base_every_minutes``, ``checkpoint_every_minutes``) and counts, so they are tested
without Paddle.

* **export**: at a partition boundary, once at least one partition was trained since the
  last export and at least ``patch_every_seconds`` of wall time have passed since it
  (every partition or every ``patch_every_seconds``, whichever is later; 0: every
  partition). The first boundary after the job (re)starts exports.
* **base**: the export is a base when no base exists yet, when one is due for another
  reason (``OnlineState.base_due``), or when the partitions trained since the last base
  cover at least ``base_every_minutes`` of data time (partitions x period).
* **checkpoint**: after an export, when the partitions trained since the last checkpoint
  cover at least ``checkpoint_every_minutes`` of data time, or at the job's end partition.

Data time, not wall time, for base and checkpoint: a job catching up on a backlog keeps the
same lineage of bases as one that kept up, and a restarted job counts from its state.
"""
from __future__ import annotations


def export_due(since_export: int, seconds_since_export: float, patch_every_seconds: float) -> bool:
    """True when a version is due at this partition boundary: ``since_export`` partitions
    (>= 0) trained since the last export, ``seconds_since_export`` (s, wall time; ``inf``
    before the first export of this run)."""
    return since_export >= 1 and seconds_since_export >= patch_every_seconds


def covered_minutes(partition_count: int, partition_minutes: int) -> int:
    """Minutes of data in ``partition_count`` partitions of ``partition_minutes``."""
    return int(partition_count) * int(partition_minutes)


def base_due(has_base: bool, since_base: int, partition_minutes: int, base_every_minutes: int,
             forced: bool = False) -> bool:
    """True when the next export is a base: none yet, ``forced`` (a reason recorded in the
    state), or ``since_base`` partitions cover ``base_every_minutes``."""
    return (not has_base) or forced or covered_minutes(since_base, partition_minutes) >= base_every_minutes


def checkpoint_due(since_checkpoint: int, partition_minutes: int, checkpoint_every_minutes: int,
                   last: bool = False) -> bool:
    """True when a checkpoint is due after this export: ``since_checkpoint`` partitions
    cover ``checkpoint_every_minutes``, or ``last`` (the job's end partition was trained)."""
    return last or covered_minutes(since_checkpoint, partition_minutes) >= checkpoint_every_minutes

