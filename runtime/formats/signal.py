"""``signal.json``: what the data generator (``runtime.trainer.generator``, ``elastic-ctr data
generate``) knows about the rows it wrote, beside them: the best AUC a model can reach
(the true logit's) and the shape of the generative model. Written by the generator,
read by the local pipeline (the true-logit AUC per hour in the demo's summary), the
training benchmark and the tests; docs/contracts.md.

Two documents, one per ``generate`` flavour:

- ``SplitSignal`` (``data generate --out DIR``): ``DIR/train.txt``, ``test.txt`` (and
  ``train-dayN.txt``); ``true_logit_auc_test`` is the test split's;
- ``HourlySignal`` (``data generate --hours H``): hourly partitions under the root
  (``runtime.formats.partitions``); ``hours[i].true_logit_auc`` per partition.

Writers and readers go through ``write`` and ``read_split`` / ``read_hourly``; a reader
accepts exactly what the writer writes (unknown fields refused), and a malformed file
raises ``SignalError`` naming the file and the field.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict

from runtime.formats._validation import NonNegInt, PosInt, validated

FILE = "signal.json"


class SignalError(ValueError):
    """``signal.json`` is missing or malformed; the message names the file and the field."""


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSummary(_Doc):
    """The generative model, for a reader to see what the rows hold: per slot
    ``vocab_sizes`` (distinct values), ``missing_rates`` (0..1), ``slot_weight_sigma``;
    ``dense_beta`` per dense feature; ``interactions`` (descriptions); ``bias`` (logit)."""

    vocab_sizes: list[PosInt]
    missing_rates: list[float]
    slot_weight_sigma: list[float]
    dense_beta: list[float]
    interactions: list[str]
    bias: float


class SplitSignal(_Doc):
    """``data generate --out DIR``: ``rows`` / ``test_rows`` written, ``files`` (split name ->
    file name in DIR), the test split's ``true_logit_auc_test``, the click rates
    ``ctr_train`` / ``ctr_test`` (0..1), ``seed``, ``model``, ``seconds`` it took."""

    seed: int
    rows: PosInt
    test_rows: PosInt
    format: str
    files: dict[str, str]
    true_logit_auc_test: float
    ctr_train: float
    ctr_test: float
    model: ModelSummary
    generator: str
    seconds: float


class HourSignal(_Doc):
    """One partition: ``hour`` (its name, ``YYYYMMDD/HH`` or ``YYYYMMDD/HHMM``), ``rows``, click rate ``ctr`` (0..1),
    ``true_logit_auc``."""

    hour: str
    rows: PosInt
    ctr: float
    true_logit_auc: float


class Drift(_Doc):
    """The hour-to-hour drift: ``new_fraction`` of a big slot's values replaced per hour,
    the ``drift_slots`` whose weights random-walk with step ``drift_sigma``."""

    new_fraction: float
    drift_slots: list[NonNegInt]
    drift_sigma: float


class HourlySignal(_Doc):
    """``data generate --hours H``: ``start`` partition, ``hours`` (one ``HourSignal`` per
    partition, in order), ``rows_per_hour`` (rows per partition), ``partition_minutes`` (the
    partitions' period, ``runtime.formats.partitions``), the data ``shape`` (small |
    long-tail), ``vocab_sizes`` per slot, ``table_scale`` (the long tail's scale), ``drift``,
    ``seed``."""

    seed: int
    start: str
    partition_minutes: PosInt = 60
    hours: list[HourSignal]
    rows_per_hour: PosInt
    shape: str
    vocab_sizes: list[PosInt]
    table_scale: float
    drift: Drift
    generator: str


Signal = Union[SplitSignal, HourlySignal]
_S = TypeVar("_S", SplitSignal, HourlySignal)


def write(out_dir: Union[str, os.PathLike], signal: Signal) -> Path:
    """Writes ``signal`` to ``out_dir/signal.json`` (indented JSON, a temporary file renamed
    into place); returns the path."""
    path = Path(out_dir) / FILE
    tmp = path.with_name(f".{FILE}.tmp")
    tmp.write_text(json.dumps(signal.model_dump(mode="json"), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def _read(out_dir: Union[str, os.PathLike], cls: type[_S]) -> _S:
    path = Path(out_dir) / FILE
    try:
        obj: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise SignalError(f"{path}: no such file (written by 'elastic-ctr data generate')") from None
    except ValueError as exc:
        raise SignalError(f"{path}: not JSON ({exc})") from None
    return validated(cls, obj, SignalError, str(path))


def read_split(out_dir: Union[str, os.PathLike]) -> SplitSignal:
    """The ``SplitSignal`` of ``out_dir``. Raises ``SignalError``."""
    return _read(out_dir, SplitSignal)


def read_hourly(root: Union[str, os.PathLike]) -> HourlySignal:
    """The ``HourlySignal`` of a partition root. Raises ``SignalError``."""
    return _read(root, HourlySignal)


def true_logit_auc(signal: HourlySignal, first: int = 0, count: Optional[int] = None) -> list[float]:
    """The partitions' true-logit AUCs from index ``first`` on (``count`` of them; all when
    None)."""
    hours = signal.hours[first:] if count is None else signal.hours[first:first + count]
    return [h.true_logit_auc for h in hours]
