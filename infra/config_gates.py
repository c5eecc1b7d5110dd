"""Stack keys of the data gate (``runtime.trainer.data_gate``): the schema every
partition of a continuous job is checked against and the bounds of its statistics; and of
the cube transfer's model gate (``runtime.cube.transfer.model_gate``: ``modelGate*``, the
transfer's ``--model-gate*`` flags, ``transfer_argv``). Each data-gate key is
a training key (``TRAIN_KEYS``: the ``TrainConfig`` field it sets, its type, range and
default from ``runtime.trainer.gate_config``) that reaches the trainer pods as a ``train``
flag (``gate_argv``: only the keys that differ from the defaults, so a stack that leaves
them alone renders the same job).

``GateKeys`` is a base of ``infra.config.StackConfig``.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config_types import check as _check, pulumi_bool
from runtime.trainer import config as train
from runtime.trainer.gate_config import gate_argv  # noqa: F401  (the pods' flags)

#: stack key (snake_case) -> the ``TrainConfig`` field it sets (both spelled alike)
TRAIN_KEYS = {k: k for k in ("gate_window", "gate_min_history", "gate_rows_ratio", "gate_click_ratio",
                             "gate_missing_shift", "gate_dense_js", "gate_new_feasign_shift", "gate_auc_drop",
                             "gate_logloss_ratio", "gate_eval_every", "gate_adapt_after", "gate_categorical_linf",
                             "gate_distinct_ratio", "gate_eval_rows")}
#: the model gate's keys -> (``cube transfer`` flag, default): ``runtime.cube.transfer.model_gate``
MODEL_GATE_FLAGS = {"model_gate_auc_drop": ("--model-gate-auc-drop", 0.05),
                    "model_gate_logloss_ratio": ("--model-gate-logloss-ratio", 1.25),
                    "model_gate_calibration": ("--model-gate-calibration", 2.5)}


def trainer_field(name: str, text: str):
    """A stack key's ``Field`` for the ``TrainConfig`` field ``name``: the trainer's default,
    ``text`` then the flag and what it allows as the description."""
    return Field(train.FIELDS[name].default, description=f"{text} (train {train.flag(name)}; {train.allowed(name)}).")


class GateKeys(BaseModel):
    """The data gate's and the model gate's keys (camelCase in Pulumi)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    data_schema: Annotated[str, _check(lambda v: v == v.strip(), "empty or a location, no surrounding spaces")] = Field(
        "", description="Continuous: the data schema (YAML written by `elastic-ctr schema infer`, e.g. schemas/ctr.yaml "
                        "uploaded beside the data) every partition is checked against before training, as a path or URL "
                        "the trainer pods can read; empty = no schema checks (train --data-schema).",
        json_schema_extra={"group": "data gate"})
    gate_window: train.field_type("gate_window") = trainer_field(
        "gate_window", "Continuous: accepted partitions the data gate compares each partition with; 0 = no data gate")
    gate_min_history: train.field_type("gate_min_history") = trainer_field(
        "gate_min_history", "Accepted partitions needed before the data gate compares statistics")
    gate_rows_ratio: train.field_type("gate_rows_ratio") = trainer_field(
        "gate_rows_ratio", "Data gate: largest factor between a partition's rows and the recent median, either way")
    gate_click_ratio: train.field_type("gate_click_ratio") = trainer_field(
        "gate_click_ratio", "Data gate: largest factor between a partition's click rate and the recent median")
    gate_missing_shift: train.field_type("gate_missing_shift") = trainer_field(
        "gate_missing_shift", "Data gate: largest change of a slot's missing rate from the recent median")
    gate_dense_js: train.field_type("gate_dense_js") = trainer_field(
        "gate_dense_js", "Data gate: largest Jensen-Shannon distance of a dense feature's histogram from the recent one")
    gate_new_feasign_shift: train.field_type("gate_new_feasign_shift") = trainer_field(
        "gate_new_feasign_shift", "Data gate: largest rise of the new-feasign rate over the recent median")
    gate_auc_drop: train.field_type("gate_auc_drop") = trainer_field(
        "gate_auc_drop", "Data gate: largest drop of the served model's AUC on a partition below the recent median")
    gate_logloss_ratio: train.field_type("gate_logloss_ratio") = trainer_field(
        "gate_logloss_ratio", "Data gate: largest ratio of the served model's log loss on a partition to the recent "
                              "median")
    gate_eval_every: train.field_type("gate_eval_every") = trainer_field(
        "gate_eval_every", "Continuous: trainer 0 sets aside every Nth row of its shard (never trained) to evaluate each "
                           "exported version beside the previous one, which the transfer's model gate compares; 0 = "
                           "no evaluation, every version passes the model gate")
    gate_adapt_after: train.field_type("gate_adapt_after") = trainer_field(
        "gate_adapt_after", "Data gate: after this many partitions in a row quarantined for drift only, that agree with "
                            "each other, the gate takes them as the new normal and trains the last; 0 = never (the "
                            "shift stays quarantined until the bounds are widened)")
    gate_categorical_linf: train.field_type("gate_categorical_linf") = trainer_field(
        "gate_categorical_linf", "Data gate: largest L-infinity distance of a slot's top values' frequencies from their "
                                 "recent median")
    gate_distinct_ratio: train.field_type("gate_distinct_ratio") = trainer_field(
        "gate_distinct_ratio", "Data gate: largest fall of a slot's distinct values below the recent median, in count "
                               "and per row (a slot collapsed to a few values); such a partition is never taken as a "
                               "new normal")
    gate_eval_rows: train.field_type("gate_eval_rows") = trainer_field(
        "gate_eval_rows", "Continuous: each version is evaluated on the rows set aside from the newest partitions that "
                          "hold at least this many (a rolling window); keep it above the transfer's minimum (500)")
    model_gate: Annotated[bool, BeforeValidator(pulumi_bool)] = Field(
        True, description="The cube transfer holds a version worse than the previous one on the rows set aside "
                          "(gateEvalEvery) beyond the modelGate* thresholds (cube transfer --model-gate).")
    model_gate_auc_drop: Annotated[float, _check(lambda v: 0 < v <= 1, "a decimal number in (0, 1]")] = Field(
        0.05, description="Model gate: largest AUC drop of a version below the previous one's on the same rows.")
    model_gate_logloss_ratio: Annotated[float, _check(lambda v: v > 1, "a decimal number > 1")] = Field(
        1.25, description="Model gate: largest ratio of a version's log loss to the previous one's on the same rows.")
    model_gate_calibration: Annotated[float, _check(lambda v: v > 1, "a decimal number > 1")] = Field(
        2.5, description="Model gate: largest factor between a version's mean prediction and the click rate, either "
                         "way (held only when the previous version's is within it).")


def transfer_argv(cfg: GateKeys) -> list[str]:
    """The ``cube transfer`` flags of the model-gate keys that differ from the defaults."""
    out = [] if cfg.model_gate else ["--model-gate", "off"]
    for key, (flag, default) in MODEL_GATE_FLAGS.items():
        v = getattr(cfg, key)
        if v != default:
            out += [flag, repr(float(v))]
    return out
