"""The port-file contract (``runtime.bound_ports``): every long-running role takes
``--port-file`` and port 0; the file is written whole, read back as written, and refused
when it holds anything else. The roles writing it on port 0 are exercised by the process
tests (``tests/lifecycle``, ``tests/e2e/test_serving_process.py``, the local cube)."""
from __future__ import annotations

import sys

import pytest

from runtime import bound_ports, proc, role_specs


def test_written_whole_and_read_back(tmp_path):
    path = tmp_path / "ports.json"
    assert bound_ports.read(path) is None
    bound_ports.write(path, {"data": 40123, "http": 40124})
    assert bound_ports.read(path) == {"data": 40123, "http": 40124}
    assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]  # no temporary file left
    bound_ports.write(None, {"http": 1})  # no file asked for: nothing written


@pytest.mark.parametrize("ports", [{"http": 0}, {"http": 70000}, {"http": "80"}])
def test_an_unbound_port_is_refused(tmp_path, ports):
    with pytest.raises(ValueError, match="not bound ports"):
        bound_ports.write(tmp_path / "p.json", ports)
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("text", ["{", "[1, 2]", '{"http": "x"}'])
def test_a_file_that_is_not_a_port_file_is_named(tmp_path, text):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}: not a port file"):
        bound_ports.read(path)


@pytest.mark.parametrize("command", [["fileserver", "--root", "r"],
                                     ["cube", "server", "--shard", "0", "--shard-num", "1"],
                                     ["cube", "agent", "--work-dir", "w"],
                                     ["cube", "transfer", "--topology", "t", "--root", "r", "--work-dir", "w"],
                                     ["serve", "--topology", "t", "--model-root", "r"]])
def test_every_long_running_role_takes_port_0_and_a_port_file(command):
    from runtime.cli import build_parser

    args = build_parser().parse_args([*command, "--port", "0", bound_ports.FLAG, "/p.json"])
    assert args.port == 0 and args.port_file == "/p.json", command


def test_a_role_that_exits_before_writing_its_ports_is_reported(tmp_path):
    with proc.ProcessGroup(tmp_path / "logs") as group:
        role = group.start("quits", [sys.executable, "-c", "print('bye'); raise SystemExit(4)"], port_file=True)
        with pytest.raises(proc.RoleFailed, match="exit code 4"):
            group.bound_ports(role, timeout_s=30)
        plain = group.start("plain", [sys.executable, "-c", "pass"])
        with pytest.raises(ValueError, match="without port_file"):
            group.bound_ports(plain)


def test_a_spec_with_the_bound_ports():
    spec = role_specs.cube_server(0, 1, role_specs.LOOPBACK, 0, 0)
    bound = spec.with_ports({"data": 40123, "http": 40124})
    assert bound.ports == (("data", 40123), ("http", 40124)) and bound.args == spec.args
    assert bound.port(bound.metrics.port) == 40124
