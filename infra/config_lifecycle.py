"""Stack keys of the sparse table's feature lifecycle (``runtime.trainer.lifecycle``:
admission, count decay, eviction, shrink points) and its budget.

The lifecycle keys are training keys (``TRAIN_KEYS``: the ``TrainConfig`` field each sets,
its type, range and default from ``runtime.trainer.lifecycle.LifecycleFields``); they reach
the trainer pods as ``train`` flags (``lifecycle_argv``: only the keys that differ from the
defaults, so a stack that leaves them alone renders the same job).

The budget keys plan memory: ``pserverBudgetRows`` (rows of the sparse table per
parameter server, admitted feasigns or not) and ``cubeShardBudgetKeys`` (keys per cube
shard) feed the ``ElasticCtrTableOverBudget`` alert (``runtime.metrics.rules``: the table
on course to pass its budget within a day), and when set the stack refuses a
``pserverMemory`` or ``cubeServerMemory`` below what the budget needs
(``pserver_memory_for`` / ``cube_memory_for``: bytes per row measured here,
docs/training.md "Sizing the table").

``LifecycleKeys`` is a base of ``infra.config.StackConfig``.
"""
from __future__ import annotations

import math
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config_gates import trainer_field
from infra.config_types import check as _check
from runtime.trainer import config as train
from runtime.trainer.lifecycle import lifecycle_argv  # noqa: F401  (the pods' flags)

#: stack key (snake_case) -> the ``TrainConfig`` field it sets (spelled alike)
TRAIN_KEYS = {k: k for k in ("feature_min_count", "feature_ttl_hours", "shrink_every_minutes",
                             "feature_count_half_life_hours")}

#: bytes of one parameter-server row at dim 9, and per dimension more, measured by
#: ``make bench-table-bytes`` (Paddle 3.0.0, SparseAccessor + Adam; the pserver's RSS after
#: 1M keys pushed once, then again, at dims 9 and 16): an admitted row (embedx and its Adam
#: state) and a row only counted (not admitted), each with its hash-map entry and allocation
PSERVER_ROW_BYTES = {"admitted": (344, 26), "counted": (201, 14)}
#: resident memory of a pserver process before any row (Paddle, the programs), bytes
PSERVER_BASE_BYTES = 330 * 2**20
#: fixed resident memory of a cube server (Python, numpy, the kernel), bytes
CUBE_BASE_BYTES = 120 * 2**20


def pserver_memory_for(rows: int, embedding_dim: int) -> int:
    """Bytes a pserver holding ``rows`` rows needs, every one admitted (the bound),
    ``embedding_dim`` wide (``PSERVER_ROW_BYTES``)."""
    at9, per_dim = PSERVER_ROW_BYTES["admitted"]
    return PSERVER_BASE_BYTES + int(rows) * (at9 + per_dim * (int(embedding_dim) - 9))


def cube_memory_for(keys: int, embedding_dim: int) -> int:
    """Bytes a cube server holding ``keys`` keys of ``embedding_dim`` floats needs: two
    tables of the shard while a base loads beside the served one (``runtime.cube.table``:
    slots of ``8 * ceil((8 + 4 * dim) / 8)`` bytes at a load factor of 0.6), plus 10 % for
    the overlays and extensions patches add between bases."""
    slot = 8 * math.ceil((8 + 4 * int(embedding_dim)) / 8)
    return CUBE_BASE_BYTES + int(2.2 * int(keys) / 0.6 * slot)


Budget = Annotated[int, _check(lambda v: 0 <= v <= 10**12, "0 (no budget) or a row count up to 10^12")]


class LifecycleKeys(BaseModel):
    """The feature lifecycle's and the table budget's keys (camelCase in Pulumi)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    feature_min_count: train.field_type("feature_min_count") = Field(
        train.FIELDS["feature_min_count"].default,
        description="Feature admission: a feasign gets a trained embedding once it has been fed this many times; "
                    f"before, it reads as zeros in training and serving and is not exported (train "
                    f"--feature-min-count; {train.allowed('feature_min_count')}; 1 = every feasign at once).",
        json_schema_extra={"group": "feature lifecycle"})
    feature_ttl_hours: train.field_type("feature_ttl_hours") = trainer_field(
        "feature_ttl_hours", "Continuous: a feasign's row is evicted once no trained partition fed it for this many "
                             "hours of data, and the cube drops it with the next version; 0 = never evict")
    shrink_every_minutes: train.field_type("shrink_every_minutes") = trainer_field(
        "shrink_every_minutes", "Continuous: minutes of trained data between two shrink points (count decay and "
                                "eviction on the parameter servers)")
    feature_count_half_life_hours: train.field_type("feature_count_half_life_hours") = trainer_field(
        "feature_count_half_life_hours", "Continuous: half-life of the feasign counts admission compares with "
                                         "featureMinCount; 0 = counts never decay")
    pserver_budget_rows: Budget = Field(
        0, description="Rows of the sparse table each parameter server may hold (admitted feasigns or not); the "
                       "ElasticCtrTableOverBudget alert fires when the table is on course to pass it within a day, "
                       "and pserverMemory must hold it. 0 = no budget.")
    cube_shard_budget_keys: Budget = Field(
        0, description="Keys each cube shard may hold; the ElasticCtrTableOverBudget alert fires when a shard is on "
                       "course to pass it within a day, and cubeServerMemory must hold it (two tables while a base "
                       "loads). 0 = no budget.")

    def budget_problems(self, pserver_memory: tuple[str, Optional[int]], cube_memory: tuple[str, Optional[int]],
                        embedding_dim: int) -> list[tuple[str, object, str]]:
        """``(key, value, allowed)`` for a memory key below what a budget needs; each memory
        key as ``(its text, its bytes or None when malformed: reported elsewhere)``."""
        out = []
        for key, (text, size), budget_key, budget, need in (
                ("pserverMemory", pserver_memory, "pserverBudgetRows", self.pserver_budget_rows,
                 pserver_memory_for(self.pserver_budget_rows, embedding_dim)),
                ("cubeServerMemory", cube_memory, "cubeShardBudgetKeys", self.cube_shard_budget_keys,
                 cube_memory_for(self.cube_shard_budget_keys, embedding_dim))):
            if budget and size is not None and size < need:
                out.append((key, text, f"at least {_gi(need)} for {budget_key} {budget} (docs/training.md, "
                                       "Sizing the table)"))
        return out


def _gi(n: int) -> str:
    """Bytes as a Kubernetes quantity, rounded up to 0.1 Gi (``2.4Gi``) or to Mi below 1 Gi."""
    if n < 2**30:
        return f"{math.ceil(n / 2**20)}Mi"
    return f"{math.ceil(n / 2**30 * 10) / 10:g}Gi"
