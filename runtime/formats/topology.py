"""The cube topology: which servers hold which shard. One document written by the Pulumi
``CubeCluster`` (a ConfigMap), the local cube cluster and the local pipeline; read by the
cube transfer, serving and the cube client. docs/contracts.md, "Cube".

``topology.json``::

    {"dict_name": "ctr_embedding",
     "shards": [
       {"shard": 0, "replicas": [{"server": "host:8900", "http": "http://host:8901",
                                  "agent": "http://host:8902"}, ...]},
       {"shard": 1, "replicas": [...]}]}

Shards are listed in shard order (a key lives on shard ``key % len(shards)``); every
replica names its server's binary data plane (``host:port``), the server's HTTP control
URL and its agent's URL. Every field is required: the writers always write all three.

The shard of a key, ``key % shard_num`` (as Paddle Serving cube's builder and client),
is defined here once: ``shard_of`` / ``shard_rows``, called by the cube builder (which
writes each shard's dict) and the cube client (which asks each shard for its keys).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.formats._validation import NonNegInt, validated

FILE = "topology.json"


def shard_of(keys: np.ndarray, shard_num: int) -> np.ndarray:
    """``keys: uint64[n]`` -> ``int64[n]``, each key's shard ``key % shard_num`` (taken as
    ``key & (shard_num - 1)`` when ``shard_num`` is a power of two: the same value, far
    cheaper than numpy's 64-bit remainder).

    Raises ``ValueError`` when ``shard_num < 1``."""
    if shard_num < 1:
        raise ValueError(f"shard_num must be >= 1, got {shard_num}")
    keys = np.asarray(keys, dtype=np.uint64)
    if shard_num & (shard_num - 1) == 0:
        return (keys & np.uint64(shard_num - 1)).astype(np.int64)
    return (keys % np.uint64(shard_num)).astype(np.int64)


def shard_rows(keys: np.ndarray, shard_num: int) -> list[np.ndarray]:
    """``keys: uint64[n]`` -> per shard ``0..shard_num-1``, the row indices (``int64``,
    ascending) of the keys on that shard (``shard_of``). Raises ``ValueError`` when
    ``shard_num < 1``."""
    keys = np.asarray(keys, dtype=np.uint64)
    if shard_num == 1:
        return [np.arange(keys.shape[0], dtype=np.int64)]
    shard = shard_of(keys, shard_num)
    if shard_num <= 16:  # one vectorized pass per shard beats a sort of the whole input
        return [np.flatnonzero(shard == i) for i in range(shard_num)]
    shard = shard.astype(np.int32)  # a narrower sort key sorts faster
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(shard_num + 1))
    return [order[bounds[i]:bounds[i + 1]] for i in range(shard_num)]


class TopologyError(ValueError):
    """A topology document is unreadable or invalid; the message names its source and field."""


class ReplicaAddresses(BaseModel):
    """One shard replica's addresses: ``server`` (data plane ``host:port``), ``http`` (server control
    URL), ``agent`` (agent URL). URLs carry no trailing slash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str
    http: str
    agent: str

    @field_validator("server")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{v!r} is not host:port")
        return v

    @field_validator("http", "agent")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v.rstrip("/")


class Shard(BaseModel):
    """One shard: its index and its replicas (at least one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shard: NonNegInt
    replicas: list[ReplicaAddresses] = Field(min_length=1)


class Replica(BaseModel):
    """One shard x replica (``replica``: its index in the shard), with its addresses, as the
    transfer drives it (``name``: ``shard<i>/replica<j>``)."""

    model_config = ConfigDict(frozen=True)

    shard: int
    replica: int
    server: str
    http: str
    agent: str

    @property
    def name(self) -> str:
        return f"shard{self.shard}/replica{self.replica}"


class Topology(BaseModel):
    """The whole document (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dict_name: str = Field(min_length=1)
    shards: list[Shard] = Field(min_length=1)

    @model_validator(mode="after")
    def _in_order(self) -> "Topology":
        for i, sh in enumerate(self.shards):
            if sh.shard != i:
                raise ValueError(f"shards must be listed in shard order: entry {i} is shard {sh.shard}")
        return self

    @classmethod
    def build(cls, dict_name: str, replicas: Sequence[Sequence[tuple[str, str, str]]]) -> "Topology":
        """From ``replicas[shard][replica] = (server host:port, http URL, agent URL)``.
        Raises ``TopologyError``."""
        doc = {"dict_name": dict_name,
               "shards": [{"shard": i, "replicas": [{"server": s, "http": h, "agent": a} for s, h, a in reps]}
                          for i, reps in enumerate(replicas)]}
        return cls.parse(doc, "topology")

    @classmethod
    def parse(cls, doc: object, source: str = "topology") -> "Topology":
        """Validates a parsed JSON document; raises ``TopologyError`` naming ``source``."""
        return validated(cls, doc, TopologyError, f"{source}: invalid topology")

    @classmethod
    def load(cls, source: "str | os.PathLike | dict | Topology") -> "Topology":
        """From a file path, a parsed document or a ``Topology``. Raises ``TopologyError``."""
        if isinstance(source, Topology):
            return source
        if isinstance(source, dict):
            return cls.parse(source)
        try:
            doc = json.loads(Path(source).read_text())
        except (OSError, ValueError) as exc:
            raise TopologyError(f"{source}: cannot read the topology: {exc}") from None
        return cls.parse(doc, str(source))

    @property
    def shard_num(self) -> int:
        return len(self.shards)

    def servers(self) -> list[list[str]]:
        """Per shard, its replicas' data-plane ``host:port`` (what the cube client needs)."""
        return [[r.server for r in sh.replicas] for sh in self.shards]

    def all_replicas(self) -> Iterator[Replica]:
        """Every shard x replica, shard by shard."""
        for sh in self.shards:
            for j, r in enumerate(sh.replicas):
                yield Replica(shard=sh.shard, replica=j, server=r.server, http=r.http, agent=r.agent)

    def to_json(self) -> str:
        """Canonical text (2-space indent, trailing newline): stable, so is its checksum."""
        return json.dumps(self.model_dump(), indent=2) + "\n"

    def checksum(self) -> str:
        """sha256 hex of ``to_json()`` (pod-template annotations roll pods on a change)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def write(self, path: str | os.PathLike) -> Path:
        """Writes ``to_json()`` to ``path``; returns it."""
        path = Path(path)
        path.write_text(self.to_json())
        return path
