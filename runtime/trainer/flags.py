"""The ``train`` command's flag names, one per ``TrainConfig`` field
(``runtime.trainer.config``): the rule the trainer's parser, ``role_specs.train_argv`` and
the gate's and lifecycle's argv builders share. Imports nothing of the project."""
from __future__ import annotations


def flag(field: str) -> str:
    """The ``train`` flag of a field: ``base_every_minutes`` -> ``--base-every-minutes``."""
    return "--" + field.replace("_", "-")


def changed_flags(cfg, defaults: dict) -> list[str]:
    """The ``train`` flags of the fields ``defaults`` names (field -> default) whose value in
    ``cfg`` differs from it: ``["--gate-window", "3", ...]`` (floats as ``repr``)."""
    out = []
    for name, default in defaults.items():
        v = getattr(cfg, name)
        if v != default:
            out += [flag(name), repr(float(v)) if isinstance(v, float) else str(v)]
    return out
