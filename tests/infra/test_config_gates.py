"""The gates' stack keys (infra/config_gates.py): the data gate's reach the trainer as
`train` flags, the model gate's the transfer as `cube transfer` flags, only when they differ
from the defaults (a stack that leaves them alone renders the same pods); bad values are
named."""
from __future__ import annotations

import pytest

from infra import config_gates
from infra.config import ConfigError
from infra.config_load import parse
from runtime import role_specs

OK = {"uploadToken": "t" * 32, "trainingMode": "continuous", "dataSource": "http://fs/hours",
      "dataStartHour": "20261120/00"}
SECRET = {"uploadToken"}


def test_defaults_add_no_flag():
    cfg = parse(OK, SECRET)
    assert config_gates.gate_argv(cfg.train_config()) == [] and config_gates.transfer_argv(cfg) == []


def test_keys_reach_the_trainer_and_the_transfer():
    cfg = parse({**OK, "dataSchema": "http://fs/schemas/ctr.yaml", "gateWindow": "12", "gateClickRatio": "2",
                 "gateEvalEvery": "20", "gateCategoricalLinf": "0.6", "gateEvalRows": "5000", "modelGate": "false",
                 "modelGateAucDrop": "0.02"}, SECRET)
    tc = cfg.train_config()
    assert (tc.data_schema, tc.gate_window, tc.gate_click_ratio, tc.gate_eval_every) == (
        "http://fs/schemas/ctr.yaml", 12, 2.0, 20)
    assert (tc.gate_categorical_linf, tc.gate_distinct_ratio, tc.gate_eval_rows) == (0.6, 3.0, 5000)
    argv = role_specs.train_argv(tc)
    assert argv[argv.index("--gate-window") + 1] == "12" and argv[argv.index("--data-schema") + 1].endswith(".yaml")
    assert argv[argv.index("--gate-categorical-linf") + 1] == "0.6" and "--gate-distinct-ratio" not in argv
    assert argv[argv.index("--gate-eval-rows") + 1] == "5000"
    assert config_gates.transfer_argv(cfg) == ["--model-gate", "off", "--model-gate-auc-drop", "0.02"]
    from runtime.cube.transfer.app import model_gate_of
    from runtime.cli import build_parser

    args = build_parser("cube").parse_args(["cube", "transfer", "--topology", "t", "--root", "r", "--work-dir", "w",
                                            *config_gates.transfer_argv(cfg)])
    th = model_gate_of(args)
    assert th.enabled is False and th.auc_drop == 0.02


@pytest.mark.parametrize("key,value,needle", [
    ("gateWindow", "-1", "elastic-ctr:gateWindow: -1 is invalid; allowed: an integer in [0, 1000]"),
    ("gateClickRatio", "1", "elastic-ctr:gateClickRatio"),
    ("gateCategoricalLinf", "1.5", "elastic-ctr:gateCategoricalLinf"),
    ("modelGateLoglossRatio", "0.5", "elastic-ctr:modelGateLoglossRatio"),
])
def test_bad_values_are_named(key, value, needle):
    with pytest.raises(ConfigError) as exc:
        parse({**OK, key: value}, SECRET)
    assert any(needle in e for e in exc.value.errors), exc.value.errors
