"""The continuous job's state: ``OnlineState`` (``--state-dir/online-state.json``) and the layout of its state directory.

Trainer 0 writes the state atomically at every export point; every worker reads it at
start to resume (``runtime/trainer/online.py`` has the protocol). Beside the state file,
``--state-dir`` holds the checkpoints (``CHECKPOINTS/<checkpoint_name>``) and the exports'
rows (``export_dir``).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.formats import partitions
from runtime.formats.statefile import read_record, write_atomically
# an export entry of the state file is the result line's record (one definition)
from runtime.formats.train_result import ExportResult as ExportRecord

STATE_FILE = "online-state.json"
CHECKPOINTS = "checkpoints"
EXPORTS = "exports"  # --state-dir/exports/<id>/: the pending export's ROWS, the last export's SNAPSHOT
ROWS = "exported-rows.npz"  # trainer 0's copy of the rows a pending export publishes
SNAPSHOT = "exported.npz"  # the whole table at the export, where the worker holds it (single process)


STATE_FILE = "online-state.json"


CHECKPOINTS = "checkpoints"


EXPORTS = "exports"  # --state-dir/exports/<id>/: the pending export's ROWS, the last export's SNAPSHOT


ROWS = "exported-rows.npz"  # trainer 0's copy of the rows a pending export publishes


SNAPSHOT = "exported.npz"  # the whole table at the export, where the worker holds it (single process)


class OnlineState(BaseModel):
    """The continuous job's progress (module docstring): written atomically by trainer 0,
    read by every worker at start.

    ``partition_minutes``: the partitions' period (a job keeps it for its life);
    ``next_hour``: the first partition not in the last export; ``since_base``: partitions
    trained since the last base export; ``checkpoint_hour``: the first partition not in the
    last checkpoint (``None``: none taken yet), ``since_checkpoint``: partitions trained
    since it; ``pending``: an export whose rows are kept but whose donefile line may be
    missing; ``base_due``: why the next export must be a base (the tables restored into
    another layout by ``Worker.restore``, or any parameter-server restore: the checkpoint's
    values are text). A checkpoint is named after the hour that follows it
    (``checkpoint_name``). A state written before ``checkpoint_hour`` existed (a checkpoint
    at every export, taken before its pending record) reads as its checkpoint at the
    pending export, else at ``next_hour``. ``checkpoint_since_shrink``: the shrink points'
    clock (``runtime.trainer.shrink``) when the last checkpoint was taken."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    data_root: str
    start_hour: str
    partition_minutes: int = partitions.HOURLY
    next_hour: str
    base_id: Optional[int] = None
    since_base: int = 0
    checkpoint_hour: Optional[str] = None
    since_checkpoint: int = 0
    pending: Optional[ExportRecord] = None
    base_due: Optional[str] = None  # e.g. "pservers 1 -> 2" or a PS restore: the next export is a base
    checkpoint_since_shrink: int = 0  # partitions trained since the last shrink point, at the last checkpoint
    exports: list[ExportRecord] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _checkpoint_at_every_export(cls, data: Any) -> Any:
        """A state file from before ``checkpoint_hour``: its checkpoint is the pending
        export's (written before the record), else the last export's."""
        if isinstance(data, dict) and "checkpoint_hour" not in data and data.get("exports") is not None:
            data = dict(data)
            pending = data.get("pending")
            if pending:
                data["checkpoint_hour"] = str(partitions.Hour.parse(pending["hour"]).next())
            elif data["exports"]:
                data["checkpoint_hour"] = data.get("next_hour")
        return data

    @property
    def checkpoint(self) -> Optional[str]:
        """The last checkpoint's directory name under ``checkpoints/`` (None before any)."""
        return checkpoint_name(self.partition(self.checkpoint_hour)) if self.checkpoint_hour else None

    def partition(self, name: str, what: str = "state partition") -> partitions.Partition:
        """The partition ``name`` of this job's period."""
        return partitions.Partition.parse(name, what, minutes=self.partition_minutes)

    @classmethod
    def load(cls, state_dir: str) -> Optional["OnlineState"]:
        """The state in ``state_dir``, or ``None`` if there is none. Raises ``ValueError``
        naming the file when it is not a valid state."""
        return read_record(os.path.join(state_dir, STATE_FILE), cls, ValueError, "online training state")

    def save(self, state_dir: str) -> None:
        """Writes the state atomically (temporary file, fsync, rename)."""
        write_atomically(os.path.join(state_dir, STATE_FILE), self.model_dump_json(indent=1))

    def published_hour(self) -> partitions.Partition:
        """The first partition in no published (or pending) version."""
        if self.pending is not None:
            return self.partition(self.pending.hour).next()
        return self.partition(self.next_hour, "state next_hour")

    def resume_point(self) -> tuple[str, Optional[str]]:
        """``(first partition to train, checkpoint to restore or None)``: the last
        checkpoint's, or the start hour when none was taken."""
        return (self.checkpoint_hour or self.start_hour), self.checkpoint


def checkpoint_name(hour: partitions.Partition) -> str:
    """``checkpoints/<name>``: the checkpoint taken before ``hour`` (``YYYYMMDD-HH[MM]``)."""
    return str(hour).replace("/", "-")


def export_dir(state_dir: str, version_id: int) -> str:
    """``--state-dir/exports/<id>``: a pending export's rows (``ROWS``), the last export's
    table (``SNAPSHOT``, where the worker holds it)."""
    return os.path.join(state_dir, EXPORTS, str(version_id))
