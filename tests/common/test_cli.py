"""The top-level command line: a role's subcommand imports only its own role module."""
from __future__ import annotations

import subprocess
import sys

import pytest

from runtime.cli import command_of


@pytest.mark.parametrize("argv, command", [
    (["cube", "server", "--shard", "0"], "cube"),
    (["--log-level", "DEBUG", "train", "--single"], "train"),
    (["--log-level=DEBUG", "serve"], "serve"),
    (["--help"], None),
    ([], None),
])
def test_command_of(argv, command):
    assert command_of(argv) == command


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_a_role_parser_imports_no_other_role():
    mods = _modules_after("from runtime.cli import build_parser; "
                          "build_parser('cube').parse_args(['cube', 'server', '--shard', '0'])")
    assert "runtime.cube.cli" in mods
    assert not {"runtime.trainer.cli", "runtime.trainer.config", "runtime.serving.cli", "infra.cli"} & mods


def test_the_full_parser_lists_every_role():
    parser_mods = _modules_after("from runtime.cli import build_parser; build_parser()")
    assert {"runtime.trainer.cli", "runtime.cube.cli", "runtime.serving.cli", "runtime.local.cli"} <= parser_mods


def test_serve_reads_its_durations_and_refuses_a_bad_one(capsys):
    from runtime.cli import build_parser

    base = ["serve", "--topology", "t.yaml", "--model-root", "r", "--transfer-url", "http://x"]
    args = build_parser("serve").parse_args(base + ["--idle-timeout-seconds", "5.5", "--grpc-max-connection-age-seconds", "0"])
    assert args.idle_timeout_seconds == 5.5 and args.grpc_max_connection_age_seconds == 0.0
    assert build_parser("serve").parse_args(base).header_timeout_seconds == 10.0
    for flag, value, unit in (("--idle-timeout-seconds", "-1", "seconds"),
                              ("--header-timeout-seconds", "nan", "seconds"),
                              ("--header-timeout-seconds", "0", "seconds"),
                              ("--grpc-max-connection-age-seconds", "soon", "seconds")):
        with pytest.raises(SystemExit):
            build_parser("serve").parse_args(base + [flag, value])
        err = capsys.readouterr().err
        assert f"argument {flag}" in err and value in err and unit in err, err
