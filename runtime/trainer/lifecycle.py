"""The sparse table's feature lifecycle: admission, count decay and eviction of feasigns,
with Paddle 3.0.0's own parameter-server mechanisms (``runtime.trainer.program`` configures
the table, ``runtime.trainer.online`` runs the shrink points, ``runtime.trainer.served``
makes the cube follow).

**Admission** (``--feature-min-count N``, stack ``featureMinCount``). Every row of the
pservers' table (``MemorySparseTable`` with the default ``SparseAccessor``) holds counters
(``show``, ``click``, ``unseen_days``) and a 1-wide ``embed_w`` for every feasign pushed,
and its ``embedx_w`` (the wide part) only once the row's score reaches the accessor's
``embedx_threshold`` (``SparseAccessor::NeedExtendMF``); until then a pull returns zeros
for the ``embedx`` part. With ``nonclk_coeff = click_coeff = 1`` the score is the row's
(decayed) show count, the number of times the feasign was fed. The model's embedding IS
the ``embedx`` part: the table is ``embedding_dim + 1`` wide and the program drops the
``embed_w`` column (``runtime.trainer.model``), which therefore gets no gradient and stays
at its zero initialisation. So a feasign seen fewer than ``N`` times reads as the table's
default row, zeros, exactly what serving answers for a key the cube does not hold; no
``embedx`` row is created for it, and it is never exported. Paddle's
``CountFilterEntry`` / ``ProbabilityEntry`` on ``sparse_embedding`` would be the
documented route, but Paddle 3.0.0's ``MemorySparseTable`` ignores the entry (measured:
``CountFilterEntry(3)`` creates every row at its first push; the string does not occur in
``libpaddle.so``), and its other admission (``pserver_enable_create_feasign_randomly``) is
random, not a count.

**Decay** (``--feature-count-half-life-hours``, 0 = none): every shrink point multiplies
the counters by ``0.5 ** (shrink period / half-life)`` (``show_click_decay_rate``), so
admission needs ``N`` recent occurrences.

**Eviction** (``--feature-ttl-hours T``, 0 = never): at every shrink point (every
``--shrink-every-minutes`` of trained data) the job calls ``fleet.shrink()``, which drops
every row whose ``unseen_days`` exceeds ``delete_after_unseen_days`` (``SparseAccessor::
Shrink``), then ticks ``unseen_days`` of every row by one with a table save in mode 3
(``SparseAccessor::UpdateStatAfterSave``: Paddle's own "day" is one mode-3 save; a push
resets it to 0). With ``delete_after_unseen_days = ceil(T / period) - 1`` a feasign is
evicted at the first shrink point at least ``T`` after the data that last fed it (within
one period more). The per-row counters live in the table, so a checkpoint
(``save_persistables``, every column) carries them through a restart.

``--ps-mode geo`` trains a fixed hashed table in the trainers (batch mode only): it has no
lifecycle, and these settings do not apply to it.

The sources: Paddle 3.0.0's ``paddle/fluid/distributed/ps/table/sparse_accessor.cc`` and
``memory_sparse_table.cc`` (the accessor parameters of ``the_one_ps.proto``'s
``CtrAccessorParameter``), measured on this Paddle build (docs/training.md, "Feature
lifecycle").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, Field

from runtime.trainer.flags import changed_flags

#: field -> default, for ``lifecycle_argv`` (a flag is passed only when it differs). Chosen by
#: ``make bench-lifecycle`` (docs/training.md, "Choosing the settings"): admission at 3 kept the
#: next-hour AUC within 0.0004 of no admission with 3.8x fewer rows served; a day's time to
#: live keeps the feasigns of a daily cycle; a shrink point every 4 hours (each is a table save)
DEFAULTS = {"feature_min_count": 3, "feature_ttl_hours": 24.0, "shrink_every_minutes": 240,
            "feature_count_half_life_hours": 0.0}
#: ``delete_after_unseen_days`` when nothing is evicted (a float field of the accessor)
NEVER = 1e9
#: the table's columns before the embedding the model uses (``SparseAccessor`` with the Adam
#: rule, width ``dim + 1``): slot, unseen_days, delta_score, show, click, embed_w, its 4
#: Adam values; then ``embedx_w`` (``dim`` values) and its Adam state (``runtime.trainer.export``)
UNSEEN_COL, SHOW_COL = 1, 3


class LifecycleFields(BaseModel):
    """The lifecycle's fields of ``runtime.trainer.config.TrainConfig`` (a base class of
    it), each a ``train`` flag and a stack key (``infra.config_lifecycle``)."""

    feature_min_count: int = Field(
        DEFAULTS["feature_min_count"], ge=1, le=1_000_000,
        description="feature admission: a feasign gets a trained embedding only once it has been fed this many "
                    "times (decayed count, --feature-count-half-life-hours); before, it reads as the table's default "
                    "row (zeros) in training and serving alike, and is not exported (1: every feasign at once)")
    feature_ttl_hours: float = Field(
        DEFAULTS["feature_ttl_hours"], ge=0, le=24 * 366,
        description="continuous: evict a feasign's row once no trained partition fed it for this many hours of data "
                    "(checked every --shrink-every-minutes; the cube drops it with the next version); 0: never evict")
    shrink_every_minutes: int = Field(
        DEFAULTS["shrink_every_minutes"], ge=1, le=525600,
        description="continuous: minutes of trained data between two shrink points (count decay and eviction "
                    "on the parameter servers)")
    feature_count_half_life_hours: float = Field(
        DEFAULTS["feature_count_half_life_hours"], ge=0, le=24 * 366,
        description="continuous: half-life of the feasign counts admission compares with --feature-min-count, "
                    "decayed at each shrink point; 0: counts never decay")


def lifecycle_argv(cfg) -> list[str]:
    """The lifecycle's flags of ``cfg`` that differ from their defaults (``train_argv``)."""
    return changed_flags(cfg, DEFAULTS)


def problems(cfg) -> list[tuple[str, object, str]]:
    """The lifecycle's cross-field rules broken by ``cfg`` as ``(field, value, allowed)``
    (``allowed`` may name fields as ``{field}``; ``TrainConfig`` turns them into its
    ``Problem`` s)."""
    out = []
    if cfg.feature_ttl_hours and cfg.feature_ttl_hours * 60 < cfg.shrink_every_minutes:
        out.append(("feature_ttl_hours", cfg.feature_ttl_hours,
                    f"0 or at least one shrink period ({{shrink_every_minutes}} {cfg.shrink_every_minutes} min)"))
    return out


@dataclass(frozen=True)
class Lifecycle:
    """The lifecycle's settings as the table and the job use them (``of``):
    ``min_count`` (admission count), ``period_minutes`` (data minutes between shrink
    points), ``unseen_limit`` (``delete_after_unseen_days``: shrink points a row may go
    unfed before the next one evicts it; None: never), ``decay`` (count factor per shrink
    point, 1.0 = none)."""

    min_count: int
    period_minutes: int
    unseen_limit: Optional[int]
    decay: float

    @classmethod
    def of(cls, cfg) -> "Lifecycle":
        """From a ``TrainConfig`` (its lifecycle fields)."""
        period = int(cfg.shrink_every_minutes)
        limit = None
        if cfg.feature_ttl_hours:
            limit = max(0, math.ceil(cfg.feature_ttl_hours * 60 / period - 1e-9) - 1)
        half = float(cfg.feature_count_half_life_hours)
        decay = 0.5 ** (period / 60.0 / half) if half > 0 else 1.0
        return cls(int(cfg.feature_min_count), period, limit, decay)

    @property
    def evicts(self) -> bool:
        """Whether rows are ever evicted."""
        return self.unseen_limit is not None

    @property
    def shrinks(self) -> bool:
        """Whether the job has shrink points (eviction or decay)."""
        return self.evicts or self.decay < 1.0

    @property
    def ttl_minutes(self) -> Optional[int]:
        """Data minutes after the last feeding partition at which a row is evicted at the
        latest (the next shrink point after ``unseen_limit + 1`` periods), None: never."""
        return None if self.unseen_limit is None else (self.unseen_limit + 2) * self.period_minutes

    def shrink_due(self, trained_since: int, partition_minutes: int) -> bool:
        """True when ``trained_since`` partitions of ``partition_minutes`` trained since the
        last shrink point cover a period."""
        return self.shrinks and int(trained_since) * int(partition_minutes) >= self.period_minutes

    def accessor_configs(self, prefix: str) -> dict:
        """The ``DistributedStrategy.sparse_table_configs`` entries of the table named by
        ``prefix`` (``table_parameters.<table>``: full proto paths, a short key is ignored)
        that set the accessor: admission threshold, score = show count, decay, eviction."""
        acc = f"{prefix}.accessor"
        ctr = f"{acc}.ctr_accessor_param"
        return {f"{acc}.embedx_threshold": int(self.min_count),  # a uint32 field
                f"{ctr}.nonclk_coeff": 1.0, f"{ctr}.click_coeff": 1.0,
                f"{ctr}.show_click_decay_rate": float(self.decay),
                f"{ctr}.delete_threshold": 0.0,
                f"{ctr}.delete_after_unseen_days": float(NEVER if self.unseen_limit is None else self.unseen_limit)}
