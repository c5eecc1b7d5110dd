"""The data gate's settings (``runtime.trainer.data_gate``): fields of
``runtime.trainer.config.TrainConfig`` (a base class of it), so each is a ``train`` flag
(``gate_window`` -> ``--gate-window``) and a stack key (``gateWindow``,
``infra.config_gates``). The defaults let a normal day of drifting data through (checked
over 24 partitions of the long-tail generator, tests/trainer/test_data_gate.py) and
quarantine an hour with flipped labels or a slot gone.

Bounds compare a partition with the median of the last ``gate_window`` accepted
partitions' figures, once ``gate_min_history`` of them exist (the schema's bounds apply
from the first partition). A lasting shift of the data (not a broken partition) is taken
as the new normal after ``gate_adapt_after`` partitions (``data_gate.DataGate.judge``)."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field

from runtime.trainer.flags import changed_flags

#: field -> default, for ``train_argv`` (a flag is passed only when it differs)
DEFAULTS = {"data_schema": None, "gate_window": 6, "gate_min_history": 3, "gate_rows_ratio": 4.0,
            "gate_click_ratio": 1.5, "gate_missing_shift": 0.2, "gate_dense_js": 0.25,
            "gate_new_feasign_shift": 0.3, "gate_auc_drop": 0.05, "gate_logloss_ratio": 1.3, "gate_eval_every": 20,
            "gate_adapt_after": 6, "gate_categorical_linf": 0.5, "gate_distinct_ratio": 3.0, "gate_eval_rows": 2000}


class GateFields(BaseModel):
    """The data gate's fields (module docstring); descriptions are the flags' help."""

    data_schema: Optional[str] = Field(
        DEFAULTS["data_schema"], description="continuous: data schema (YAML, `elastic-ctr schema infer`; path or "
        "URL) every partition is checked against before training; default: no schema checks",
        json_schema_extra={"metavar": "LOC"})
    gate_window: int = Field(DEFAULTS["gate_window"], description="continuous: accepted partitions the data gate "
                             "compares a partition with (0: no data gate, a malformed partition stops the job)",
                             ge=0, le=1000)
    gate_min_history: int = Field(DEFAULTS["gate_min_history"], description="continuous: accepted partitions needed "
                                  "before the statistics are compared", ge=1, le=1000)
    gate_rows_ratio: float = Field(DEFAULTS["gate_rows_ratio"], description="data gate: a partition's rows may be "
                                   "at most this many times the recent median, or this many times fewer", gt=1)
    gate_click_ratio: float = Field(DEFAULTS["gate_click_ratio"], description="data gate: click rate at most this "
                                    "many times the recent median, or this many times lower", gt=1)
    gate_missing_shift: float = Field(DEFAULTS["gate_missing_shift"], description="data gate: largest change of a "
                                      "slot's missing rate from the recent median (absolute)", gt=0, le=1)
    gate_dense_js: float = Field(DEFAULTS["gate_dense_js"], description="data gate: largest Jensen-Shannon distance "
                                 "of a dense feature's histogram from the recent partitions' mean", gt=0, le=1)
    gate_new_feasign_shift: float = Field(DEFAULTS["gate_new_feasign_shift"], description="data gate: largest "
                                          "increase of the new-feasign rate over the recent median (absolute)",
                                          gt=0, le=1)
    gate_auc_drop: float = Field(DEFAULTS["gate_auc_drop"], description="data gate: largest drop of the served "
                                 "model's AUC on a partition below the recent median", gt=0, le=1)
    gate_logloss_ratio: float = Field(DEFAULTS["gate_logloss_ratio"], description="data gate: largest ratio of the "
                                      "served model's log loss on a partition to the recent median", gt=1)
    gate_eval_every: int = Field(DEFAULTS["gate_eval_every"], description="continuous: trainer 0 sets aside every "
                                 "Nth row of its shard (never trained) to evaluate each exported version beside the "
                                 "previous one for the transfer's model gate (0: none, every row trained, every version "
                                 "passes the model gate)", ge=0, le=1000000)
    gate_eval_rows: int = Field(DEFAULTS["gate_eval_rows"], description="continuous: each version is evaluated on "
                                "the rows set aside from the newest partitions that hold at least this many (a "
                                "rolling window: at 1-minute partitions one holds a few hundred); keep it above the "
                                "transfer's --model-gate-min-rows", ge=1, le=1000000)
    gate_adapt_after: int = Field(DEFAULTS["gate_adapt_after"], description="data gate: after this many consecutive "
                                  "partitions quarantined for drift only (rows, click rate, missing rates, dense "
                                  "histograms, new feasigns) that agree with each other, the gate takes them as the "
                                  "new normal: they become its window and the last one is trained (0: never; a "
                                  "lasting shift then waits for an operator)", ge=0, le=1000)
    gate_categorical_linf: float = Field(DEFAULTS["gate_categorical_linf"], description="data gate: largest "
                                         "L-infinity distance of a slot's top values' frequencies from their recent "
                                         "median", gt=0, le=1)
    gate_distinct_ratio: float = Field(DEFAULTS["gate_distinct_ratio"], description="data gate: a slot's distinct "
                                       "values may fall at most this many times below the recent median (in count "
                                       "and per row); a slot that lost more is never taken as a new normal", gt=1)


def gate_argv(cfg) -> list[str]:
    """The gate's flags of ``cfg`` that differ from their defaults (``train_argv``)."""
    return changed_flags(cfg, DEFAULTS)
