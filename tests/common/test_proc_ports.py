"""Ports handed out to local listeners (``runtime.proc.free_ports``): outside the kernel's
ephemeral range, so no outgoing connection can take one before its listener binds it."""
from __future__ import annotations

import socket

import pytest

from runtime import proc


def test_listen_range_lies_below_the_ephemeral_range(tmp_path):
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert proc.listen_range(str(f)) == (32768 - proc.SPAN, 32768)
    f.write_text("1024 65535\n")  # no room below it
    assert proc.listen_range(str(f)) is None
    f.write_text("not a range\n")
    assert proc.listen_range(str(f)) is None
    assert proc.listen_range(str(tmp_path / "absent")) is None


def test_free_ports_are_distinct_bindable_and_not_ephemeral():
    span = proc.listen_range()
    ports = proc.free_ports(8)
    assert len(set(ports)) == 8
    if span is not None:
        assert all(span[0] <= p < span[1] for p in ports), (ports, span)
    for p in ports:  # free now
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_drawn_again(monkeypatch):
    span = proc.listen_range()
    if span is None:
        pytest.skip("no room below this machine's ephemeral range")
    with socket.socket() as held:
        held.bind(("127.0.0.1", span[0]))
        draws = iter([span[0], span[0], span[0] + 1])
        monkeypatch.setattr(proc._rng, "randrange", lambda a, b: next(draws))
        assert proc.free_ports(1) == [span[0] + 1]


def test_without_a_range_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(proc, "listen_range", lambda path=proc.EPHEMERAL_RANGE_FILE: None)
    ports = proc.free_ports(3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)
    assert proc.free_port() > 0
