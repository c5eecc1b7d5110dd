"""The cube builder's output contract: shard names, shard tar names and the build record.

Owner of the layout of one built version (docs/contracts.md, "Cube internals"; the
reference is Paddle Serving's cube-builder, which names a shard ``<dict>_part<i>``)::

    <version dir>/<dict_name>_part<i>/          shard dict directory   (part_name)
    <version dir>/<dict_name>_part<i>.tar       that directory as a tar (shard_tar_name)
    <version dir>/<dict_name>_part<i>.tar.md5   hex md5 of the tar     (md5_name)
    <version dir>/build.json                    the BuildRecord        (FILE)

Written by the cube builder (``runtime/cube/builder/``); ``build.json`` is read by
the transfer (``runtime/cube/transfer/build.py``), and the agent recovers the dict name
from a downloaded tar's name with ``parse_shard_tar_name``.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.formats._validation import NonNegInt, PosInt, validated

FILE = "build.json"
TAR_SUFFIX = ".tar"
MD5_SUFFIX = ".md5"

_TAR_RE = re.compile(r"^(?P<dict>.+)_part(?P<shard>\d+)\.tar$")


class BuildRecordError(ValueError):
    """A build record is unreadable or invalid; the message names the file and field."""


def part_name(dict_name: str, shard: int) -> str:
    """``<dict_name>_part<shard>``: the shard's dict directory (and its tar's stem)."""
    return f"{dict_name}_part{int(shard)}"


def shard_tar_name(dict_name: str, shard: int) -> str:
    """``<dict_name>_part<shard>.tar``: the file name of a shard's tar."""
    return part_name(dict_name, shard) + TAR_SUFFIX


def md5_name(tar_name: str) -> str:
    """``<tar_name>.md5``: the file holding the tar's hex md5 (one line)."""
    return tar_name + MD5_SUFFIX


def parse_shard_tar_name(name: str) -> tuple[str, int] | None:
    """``"<dict>_part<i>.tar"`` (a file name or the last segment of a URL/path) ->
    ``(dict_name, shard)``; None for a name ``shard_tar_name`` does not write."""
    m = _TAR_RE.match(name.rstrip("/").rsplit("/", 1)[-1])
    return (m.group("dict"), int(m.group("shard"))) if m else None


class ShardBuild(BaseModel):
    """One shard of a build: ``dir`` and ``tar`` are names relative to the version
    directory (``part_name``, ``shard_tar_name``); ``md5`` the tar's hex md5; ``count``
    keys; ``bytes`` dict data bytes; ``tar_bytes`` the tar's size in bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shard: NonNegInt
    dir: str
    tar: str
    md5: str = Field(pattern=r"^[0-9a-f]{32}$")
    count: NonNegInt
    bytes: NonNegInt
    tar_bytes: NonNegInt


class BuildRecord(BaseModel):
    """``build.json``: what the builder wrote for one version. ``count``: unique keys over
    all shards; ``duplicates``: input records dropped by last-wins; ``input_records``:
    records read; ``inputs``: the SequenceFiles in the order read; ``shards``: one
    ``ShardBuild`` per shard, in shard order; ``output_dir``: the version directory as
    written; ``seconds``: build wall time (s). ``base_version`` is set iff ``mode`` is
    ``delta``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dict_name: str = Field(min_length=1)
    version: NonNegInt
    mode: Literal["base", "delta"]
    base_version: NonNegInt | None
    shard_num: PosInt
    dim: NonNegInt
    count: NonNegInt
    duplicates: NonNegInt
    input_records: NonNegInt
    inputs: list[str]
    shards: list[ShardBuild]
    output_dir: str = ""
    seconds: float = 0.0

    @model_validator(mode="after")
    def _consistent(self) -> "BuildRecord":
        if (self.mode == "delta") != (self.base_version is not None):
            raise ValueError(f"base_version {self.base_version} does not fit mode {self.mode!r}")
        if [s.shard for s in self.shards] != list(range(self.shard_num)):
            raise ValueError(f"shards {[s.shard for s in self.shards]} are not 0..{self.shard_num - 1} in order")
        for s in self.shards:
            if s.dir != part_name(self.dict_name, s.shard) or s.tar != shard_tar_name(self.dict_name, s.shard):
                raise ValueError(f"shard {s.shard}: dir {s.dir!r} / tar {s.tar!r} are not "
                                 f"{part_name(self.dict_name, s.shard)!r} / {shard_tar_name(self.dict_name, s.shard)!r}")
        return self

    def to_json(self) -> str:
        """The JSON text written to ``build.json`` (1-space indent)."""
        return json.dumps(self.model_dump(), indent=1)

    def write(self, path: str | os.PathLike) -> Path:
        """Writes the record to ``path`` (a version directory, or the file itself); returns
        the file's path."""
        path = Path(path)
        if path.is_dir():
            path = path / FILE
        path.write_text(self.to_json())
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> "BuildRecord":
        """Reads ``path`` (a version directory, or the file itself). Raises
        ``BuildRecordError`` naming the file (and the field, if one is invalid)."""
        path = Path(path)
        if path.is_dir():
            path = path / FILE
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BuildRecordError(f"{path}: cannot read the build record: {exc}") from None
        return validated(cls, doc, BuildRecordError, f"{path}: invalid build record")
