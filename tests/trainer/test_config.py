"""``TrainConfig``: the training settings and their rules, owned in one place. The flags of
``train`` (type, choices, help, default) are generated from its fields; ``--config`` YAML
keys are validated by the same model; every error names the flag."""
from __future__ import annotations

import argparse

import pytest

from runtime import role_specs
from runtime.trainer import cli, config
from runtime.trainer.config import TrainConfig, TrainConfigError
from runtime.trainer.flags import flag


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser


def _train(argv: list[str]) -> TrainConfig:
    return config.config_from_args(_parser().parse_args(["train", *argv]))


def test_every_field_is_a_flag_with_the_fields_help_and_default():
    train = _parser()._subparsers._group_actions[0].choices["train"]
    actions = {a.dest: a for a in train._actions}
    for name, field in config.FIELDS.items():
        action = actions[name]
        assert action.option_strings == [flag(name)] and action.default is None, name
        assert action.help.startswith(field.description), name
        assert tuple(action.choices or ()) == (config.choices(name) or ()), name
    assert actions["epochs"].help.endswith("(default: 2)") and actions["layers"].help.endswith("(default: 128,64,32)")
    assert actions["data_train"].nargs == "+" and actions["threads"].type is int and actions["lr"].type is float


def test_defaults_are_valid_and_frozen():
    cfg = TrainConfig()
    assert (cfg.mode, cfg.ps_mode, cfg.layers, cfg.data_train) == ("batch", "async", (128, 64, 32), [])
    with pytest.raises(Exception):
        cfg.epochs = 3  # type: ignore[misc]


def test_config_yaml_values_are_checked_by_the_same_rules_naming_the_flag(tmp_path):
    conf = tmp_path / "train.yaml"
    conf.write_text("data-train: x.txt\nlayers: 64,32\nepochs: 3\n")
    cfg = _train(["--config", str(conf), "--epochs", "4"])
    assert (cfg.data_train, cfg.layers, cfg.epochs) == (["x.txt"], (64, 32), 4)
    conf.write_text("data_train: x.txt\nbatch_size: 0\nlayers: 64,x\n")
    with pytest.raises(TrainConfigError) as exc:
        _train(["--config", str(conf)])
    assert {p.field for p in exc.value.problems} == {"batch_size", "layers"}
    assert "--batch-size 0 is invalid; allowed: an integer in [1, 65536]" in str(exc.value)
    assert "--layers '64,x' is invalid; allowed: positive widths" in str(exc.value)
    conf.write_text("data_train: x.txt\nbatch: 3\n")
    with pytest.raises(ValueError, match="unknown key 'batch'"):
        _train(["--config", str(conf)])


def test_cross_field_rules_report_every_problem_with_flag_names():
    with pytest.raises(TrainConfigError) as exc:
        TrainConfig(mode="continuous", ps_mode="geo", data_root="/d", partition_minutes=5, start_hour="20261120/0003",
                    end_hour="20261120/00")
    fields = [p.field for p in exc.value.problems]
    assert fields == ["ps_mode", "state_dir", "start_hour"]
    text = str(exc.value)
    assert "--state-dir is not set; allowed: a local directory (required when --mode is continuous" in text
    assert "--start-hour '20261120/0003' is invalid; allowed: a partition of --partition-minutes (5)" in text
    # the same problem named as another input names it
    assert exc.value.problems[-1].render(lambda n: n.upper()).startswith(
        "START_HOUR '20261120/0003' is invalid; allowed: a partition of PARTITION_MINUTES (5)")
    with pytest.raises(TrainConfigError, match="--partition-minutes 7 is invalid; allowed: minutes that divide an hour"):
        TrainConfig(mode="continuous", data_root="/d", start_hour="20261120/00", state_dir="/s", partition_minutes=7)
    with pytest.raises(TrainConfigError, match="--state-dir 'http://fs/state' is invalid; allowed: a local directory, not a URL"):
        TrainConfig(mode="continuous", data_root="/d", start_hour="20261120/00", state_dir="http://fs/state")
    with pytest.raises(TrainConfigError, match="--start-hour '20261132/00' is invalid; allowed: an hour YYYYMMDD/HH"):
        TrainConfig(data_root="/d", start_hour="20261132/00", end_hour="20261120/01")


def test_child_flags_rebuild_the_same_config(tmp_path):
    cfg = TrainConfig(mode="continuous", data_root="/d", start_hour="20261120/00", state_dir=str(tmp_path),
                      patch_every_seconds=5, base_every_minutes=360, checkpoint_every_minutes=120,
                      layers=(32, 16), lr=0.01, ps_mode="async-merged")
    assert _train(role_specs.train_argv(cfg)[1:]) == cfg
    cfg = TrainConfig(mode="continuous", data_root="/d", start_hour="20261120/0005", end_hour="20261120/0130",
                      partition_minutes=5, state_dir=str(tmp_path))
    assert [str(p) for p in cfg.hours()] == ["20261120/0005", "20261120/0130"]
    assert _train(role_specs.train_argv(cfg)[1:]) == cfg


def test_only_the_exporting_process_checks_the_version_root_writable():
    """A pserver and trainers other than 0 never write the version root (nor hold its write
    credential): they check it reachable only."""
    from runtime.trainer.input_checks import _exports

    assert _exports({}) and _exports({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "0"})
    assert _exports({"TRAINING_ROLE": "trainer", "VC_TASK_INDEX": "0"})
    assert not _exports({"TRAINING_ROLE": "PSERVER"})
    assert not _exports({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "1"})
    assert not _exports({"TRAINING_ROLE": "TRAINER", "VC_TASK_INDEX": "2"})
