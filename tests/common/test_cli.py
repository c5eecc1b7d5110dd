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
