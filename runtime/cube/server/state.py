"""The cube server's persisted state (``<data-dir>/state.json``, a
``runtime.formats.statefile.StateFile``): the chain of dict directories it serves (a base,
then each patch applied, in order), so a restarted server serves the same version again
before the transfer talks to it. Written on every enable and read at start by the server
only (``runtime.cube.server.versions``).
"""
from __future__ import annotations

from typing import Literal, Optional

from runtime.formats.statefile import StateFile

FILE = "state.json"


class ChainEntry(StateFile):
    """One link of the served chain: its dict directory ``dir`` (absolute), ``version``, build
    ``mode`` (base | delta) and ``base_version`` (the version a delta applies to; None for a
    base)."""

    dir: str
    version: int
    mode: Literal["base", "delta"]
    base_version: Optional[int] = None


class ServerState(StateFile):
    """What a server serves: ``dict_name``, its ``shard`` of ``shard_num``, the ``version``
    enabled and its ``chain`` (base first). A restarted server with another ``(dict_name,
    shard, shard_num)`` does not restore it."""

    dict_name: str
    shard: int
    shard_num: int
    version: int
    chain: list[ChainEntry]
