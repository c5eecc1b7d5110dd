"""The cube agent's persisted state (``<work_dir>/agent_state.json``, a
``runtime.formats.statefile.StateFile``): the versions it unpacked and the versions it
enabled, so a restarted agent knows what it may clean and what it can reload without a
download. Written and read by the agent only.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from runtime.formats.statefile import StateFile

FILE = "agent_state.json"


class Unpacked(StateFile):
    """A version downloaded and unpacked: its dict directory ``dir`` (what the server loads),
    ``dict_name``, build ``mode`` (base | delta), ``base_version`` (a delta's base, else
    None), the tar's ``md5`` (hex) and the ``url`` it came from."""

    dir: str
    dict_name: str
    mode: Literal["base", "delta"]
    base_version: Optional[int] = None
    md5: str
    url: str


class AgentState(StateFile):
    """``versions``: version id -> ``Unpacked``; ``enabled``: versions enabled, oldest first."""

    versions: dict[int, Unpacked] = Field(default_factory=dict)
    enabled: list[int] = Field(default_factory=list)
