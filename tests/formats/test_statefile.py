"""Typed state files (``runtime.formats.statefile``): the agent's, the cube server's and the
transfer's records round-trip, and an unreadable file is named, field included."""
from __future__ import annotations

import json

import pytest

from runtime.cube.agent.state import AgentState, Unpacked
from runtime.cube.server.state import ChainEntry, ServerState
from runtime.cube.transfer.state import TransferState
from runtime.formats.statefile import StateError


def test_records_round_trip_and_a_missing_file_is_none(tmp_path):
    agent = AgentState(versions={7: Unpacked(dir="/d/7", dict_name="ctr", mode="base", md5="ab", url="http://f/7")},
                       enabled=[7])
    agent.save(tmp_path / "a.json")
    assert AgentState.load(tmp_path / "a.json") == agent
    server = ServerState(dict_name="ctr", shard=1, shard_num=2, version=9,
                         chain=[ChainEntry(dir="/d/7", version=7, mode="base"),
                                ChainEntry(dir="/d/9", version=9, mode="delta", base_version=7)])
    server.save(tmp_path / "s" / "state.json")
    assert ServerState.load(tmp_path / "s" / "state.json") == server
    assert AgentState.load(tmp_path / "none.json") is None
    assert TransferState.load(tmp_path / "none.json") == TransferState()  # the transfer starts empty
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


@pytest.mark.parametrize("text, why", [
    ("{", "not JSON"),
    ('{"dict_name": "ctr", "shard": 0, "shard_num": 1, "version": 1, "chain": [{"dir": "/d", "version": 1, '
     '"mode": "patch"}]}', r"chain\[0\]\.mode"),
    ('{"dict_name": "ctr", "shard": 0, "shard_num": 1, "version": 1, "chain": [], "extra": 1}', "extra"),
])
def test_an_unreadable_state_names_the_file_and_the_field(tmp_path, text, why):
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(StateError, match=why) as err:
        ServerState.load(path)
    assert str(path) in str(err.value)


def test_the_transfer_refuses_an_unreadable_state(tmp_path):
    path = tmp_path / "transfer_state.json"
    path.write_text(json.dumps({"served": {"version": "x"}}))
    with pytest.raises(StateError, match=r"unreadable transfer state: .*served\.version.*fix or remove it"):
        TransferState.load(path)
