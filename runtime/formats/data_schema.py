"""The data schema: what a landed partition must look like before it is trained on (the
data gate, ``runtime.trainer.data_gate``), written by ``elastic-ctr schema infer`` from the
project's own data and kept, reviewed and versioned beside the stack (``schemas/ctr.yaml``).

YAML, one mapping (as TensorFlow Data Validation's schema: columns, their types, presence and
value ranges; bounds are on the parsed rows, ``runtime.formats.features``)::

    version: 1
    format: criteo                 # the parser: criteo | slot (columns and types follow from it)
    slots: [1, 2, ..., 26]         # the categorical slots, in order
    label:
      values: [0, 1]
      click_rate: [0.12, 0.5]      # the mean label of a partition must lie in [lo, hi]
    dense:                         # one per dense column I1..I13, values normalized to [0, 1]
      - {name: I1, mean: [0.2, 0.6], max_saturated: 0.1}
    sparse:                        # one per slot
      - {name: C1, slot: 1, max_missing: 0.25}

``mean``: the bounds of the column's mean normalized value; ``max_saturated``: the largest
fraction of rows at the normalization's clip bound (1.0; a feature arriving scaled by 1000
saturates); ``max_missing``: the largest fraction of rows whose slot is missing. The rows of
a line are typed by the parser: a line with another column count or a value of another type
is malformed (counted, ``runtime.trainer.readers.BadLineBudget``).

``infer`` widens the observed extremes by ``margin`` (relative, at least ``floor`` absolute),
so a normal day passes; ``load`` raises ``SchemaError`` naming the file and the field.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runtime.formats import features

VERSION = 1


class SchemaError(ValueError):
    """A schema file that cannot be read or is invalid; the message names it."""


class LabelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    values: list[int] = Field(default_factory=lambda: [0, 1])
    click_rate: tuple[float, float]


class DenseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    mean: tuple[float, float]
    max_saturated: float = Field(ge=0, le=1)


class SparseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    slot: int = Field(ge=1)
    max_missing: float = Field(ge=0, le=1)


class DataSchema(BaseModel):
    """A data schema (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    version: int = VERSION
    format: str
    slots: list[int]
    label: LabelSpec
    dense: list[DenseSpec]
    sparse: list[SparseSpec]

    @model_validator(mode="after")
    def _consistent(self) -> "DataSchema":
        if self.version != VERSION:
            raise ValueError(f"version {self.version}: this reader knows version {VERSION}")
        if self.format not in features.FORMATS:
            raise ValueError(f"format {self.format!r}: expected one of {features.FORMATS}")
        if [s.slot for s in self.sparse] != list(self.slots):
            raise ValueError("sparse: one entry per slot of 'slots', in the same order")
        if len(self.dense) != features.NUM_DENSE:
            raise ValueError(f"dense: {len(self.dense)} entries, expected {features.NUM_DENSE} (I1..I13)")
        return self

    def check_job(self, fmt: str, slots: Sequence[int], where: str) -> None:
        """Raises ``SchemaError`` (naming ``where``) when the job reads another format or
        slot list than the schema describes."""
        if fmt != self.format or list(slots) != list(self.slots):
            raise SchemaError(f"{where}: the schema describes format {self.format} with slots {self.slots}, the job "
                              f"reads format {fmt} with slots {list(slots)}")

    def to_yaml(self) -> str:
        """The schema as YAML (``load`` reads it back), with a header comment."""
        import yaml

        head = ("# Data schema of the training partitions (runtime/formats/data_schema.py), written by\n"
                "# `elastic-ctr schema infer`; review a change as you would code.\n")
        body = self.model_dump(mode="json")
        body["label"]["click_rate"] = list(body["label"]["click_rate"])
        return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=120)


def load(location: str) -> DataSchema:
    """Reads a schema (path or URL). Raises ``SchemaError`` naming ``location`` and the
    field, ``storage.LocationError`` when it cannot be read."""
    import yaml

    from runtime import storage

    raw = storage.read_bytes(location)
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise SchemaError(f"{location}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise SchemaError(f"{location}: expected a YAML mapping")
    try:
        return DataSchema.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise SchemaError(f"{location}: {where}: {err['msg']}") from None


def _widen(lo: float, hi: float, margin: float, floor: float, top: float = 1.0) -> tuple[float, float]:
    pad = max(floor, margin * (hi - lo), margin * abs(hi))
    return round(max(0.0, lo - pad), 4), round(min(top, hi + pad), 4)


def infer(stats: Sequence, fmt: str, slots: Sequence[int], margin: float = 0.5, floor: float = 0.05) -> DataSchema:
    """A schema from the statistics of normal partitions (``partition_stats.PartitionStats``,
    at least one): each bound the observed extreme widened by ``margin`` (relative) and at
    least ``floor`` (absolute). Raises ``ValueError`` for no statistics."""
    if not stats:
        raise ValueError("schema infer: no partition statistics to infer from")
    cr = [s.click_rate for s in stats]
    miss = np.array([s.missing_rate for s in stats])  # [P, S]
    sat = np.array([s.dense_saturated for s in stats])  # [P, 13]
    centers = (np.arange(len(stats[0].dense_hist[0])) + 0.5) / len(stats[0].dense_hist[0])
    means = np.array([[float(np.dot(h, centers)) for h in s.dense_hist] for s in stats])  # [P, 13]
    return DataSchema(
        format=fmt, slots=list(slots),
        label=LabelSpec(click_rate=_widen(min(cr), max(cr), margin, floor)),
        dense=[DenseSpec(name=f"I{i + 1}", mean=_widen(means[:, i].min(), means[:, i].max(), margin, floor),
                         max_saturated=_widen(0.0, sat[:, i].max(), margin, floor)[1])
               for i in range(features.NUM_DENSE)],
        sparse=[SparseSpec(name=f"C{s}", slot=int(s), max_missing=_widen(0.0, miss[:, j].max(), margin, floor)[1])
                for j, s in enumerate(slots)])
