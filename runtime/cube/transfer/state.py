"""The transfer's persisted state (``<work_dir>/transfer_state.json``): typed records,
written through a fsynced temp file renamed into place (``runtime.formats.statefile``), so
a restart neither loses nor repeats a rollout.

- ``served``: the version every replica serves (``Served``), and ``served_chain``: the
  links (base, then each patch) it is made of, with the tars they were published as,
  which is what a replica restarted empty is brought back through.
- ``current``: the rollout in progress (``Plan``), with its phase.
- ``attempts`` / ``retry_after``: failed rollouts per attempt key (a version id, or
  ``relayout-<N>:<id>`` for a re-layout link) and when each may be tried again (unix s).
- ``given_up`` / ``refused`` / ``held``: version ids not rolled out (``held``: by the model
  gate, ``runtime.cube.transfer.model_gate``), and why is in ``history``.
- ``relayout``: a pending re-layout of the served chain for a new shard count.
- ``pin``: the version pinned to be served (a rollback, or the stack's
  ``servedVersion``); None: follow training.
- ``history``: the last ``HISTORY_MAX`` rollouts and refusals (``HistoryEntry``).
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from runtime.formats.statefile import StateError, StateFile

STATE_FILE = "transfer_state.json"
HISTORY_MAX = 200

#: a build's job mode, as cube-builder's ``job_mode``: a whole table, or the changed rows
Mode = Literal["base", "delta"]


class Phase(str, enum.Enum):
    """The rollout phases of Paddle Serving's cube-transfer; each is a barrier over every
    shard x replica."""

    TRIGGING = "Trigging"
    BUILDING = "Building"
    DEPLOYING = "Deploying"
    DOWNLOADING = "Downloading"
    RELOADING = "Reloading"
    ENABLING = "Enabling"
    FINISHED = "Finished"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Served(_Record):
    """The version every replica serves: ``version``, its ``base_id`` and ``patch_id``
    (None for a base), ``dim``, ``count`` (keys of the base), ``model`` (dense model
    location), ``enabled_at`` (unix s), ``shard_num`` it was laid out for (None in state
    written before it was recorded)."""

    version: int
    base_id: int
    patch_id: Optional[int] = None
    dim: Optional[int] = None
    count: Optional[int] = None
    model: Optional[str] = None
    enabled_at: Optional[float] = None
    shard_num: Optional[int] = None


class ChainLink(_Record):
    """One link of the served chain: a base or a patch rolled out, its build ``mode``, the
    version it applies to (``base_version``), where its shard tars were published
    (``urls``, ``md5s``: one per shard) and its donefile fields (``key``, ``input``,
    ``model``: None in state written before they were recorded)."""

    version: int
    mode: Mode
    base_version: Optional[int] = None
    urls: list[str] = Field(default_factory=list)
    md5s: list[str] = Field(default_factory=list)
    key: Optional[int] = None
    input: Optional[str] = None
    model: Optional[str] = None
    shard_num: Optional[int] = None
    coalesced: list[int] = Field(default_factory=list)  # the Plan's: patches folded into this link
    coalesced_inputs: list[str] = Field(default_factory=list)


class RelayoutLink(_Record):
    """A link of the served chain to roll out again for a new shard count."""

    version: int
    mode: Mode
    key: int
    base_version: Optional[int] = None
    input: str
    model: Optional[str] = None
    coalesced: list[int] = Field(default_factory=list)  # the Plan's: patches folded into this link
    coalesced_inputs: list[str] = Field(default_factory=list)


class Relayout(_Record):
    """A pending re-layout: the served chain (``links``, base first) rolled out again for
    ``to`` shards (it was laid out for ``from_``); ``next`` = links done; ``target`` = the
    served version it restores. ``before`` / ``before_chain``: the served record and chain
    when it started, i.e. what the previous layout (``before.shard_num`` shards) still
    serves while the new one is laid out (None in state written before they were kept)."""

    from_: Optional[int] = Field(alias="from")
    to: int
    target: int
    links: list[RelayoutLink] = Field(default_factory=list)
    next: int = 0
    given_up: bool = False
    error: Optional[str] = None
    started: Optional[float] = None
    before: Optional[Served] = None
    before_chain: list[ChainLink] = Field(default_factory=list)


class RelayoutRef(_Record):
    """In a plan: which re-layout link it is (``link`` of ``links``, 1-based)."""

    from_: Optional[int] = Field(alias="from")
    to: int
    target: int
    link: int
    links: int


class Plan(_Record):
    """A rollout: the version, its donefile ``key``/``input``/``model``, the build ``mode``
    and ``base_version`` (the served version a patch applies to), the ``phase`` reached,
    when its line was seen and the rollout started (unix s), the attempt number, and for
    a re-layout link its ``reason``, ``relayout`` and ``attempt_key``; ``carry``: the inputs
    of held patches (``carry_versions``) built with it, before its own (model gate).
    ``coalesced``: the ids of older patch lines folded into this one
    (``runtime.cube.transfer.coalesce``), ``coalesced_inputs`` their inputs, oldest first:
    the build reads them (after ``carry``) before ``input``, a later row winning."""

    version: int
    key: int
    mode: Mode
    base_version: Optional[int] = None
    input: str
    model: Optional[str] = None
    phase: Phase = Phase.TRIGGING
    seen: float
    attempt: int = 0
    started: Optional[float] = None
    attempt_key: Optional[str] = None
    reason: Optional[str] = None
    relayout: Optional[RelayoutRef] = None
    coalesced: list[int] = Field(default_factory=list)
    coalesced_inputs: list[str] = Field(default_factory=list)
    carry: list[str] = Field(default_factory=list)
    carry_versions: list[int] = Field(default_factory=list)

    @property
    def akey(self) -> str:
        """The key of its attempts and backoff: the version id, or the re-layout link's."""
        return self.attempt_key or str(self.version)


class HistoryEntry(_Record):
    """One rollout (``status`` finished | failed | partial), refused patch or held version, as
    ``/dict/deploy/history`` shows it. Times are unix s, durations s; fields not set are
    left out of the JSON."""

    version: int
    mode: Mode
    status: Optional[Literal["finished", "failed", "partial", "refused", "held"]] = None
    key: Optional[int] = None
    base_version: Optional[int] = None
    attempt: Optional[int] = None
    started: Optional[float] = None
    finished: Optional[float] = None
    resumed: Optional[bool] = None
    shard_num: Optional[int] = None
    reason: Optional[str] = None
    relayout: Optional[dict[str, Any]] = None
    error: Optional[str] = None
    given_up: Optional[bool] = None
    phases: Optional[dict[str, float]] = None
    enabled: Optional[list[str]] = None
    skipped: Optional[list[str]] = None
    seconds: Optional[float] = None
    since_seen: Optional[float] = None
    count: Optional[int] = None
    coalesced: Optional[list[int]] = None  # older patch ids folded into this rollout

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)


class Pin(_Record):
    """The version pinned to be served (``runtime.cube.transfer.rollback``): ``version``,
    set ``by`` the ``--pin-version`` flag (the stack's ``servedVersion``) or the
    ``POST /rollback`` API, ``at`` (unix s)."""

    version: int
    by: Literal["flag", "api"]
    at: float


class TransferState(StateFile):
    """The whole state (module docstring)."""

    served: Optional[Served] = None
    served_chain: list[ChainLink] = Field(default_factory=list)
    current: Optional[Plan] = None
    attempts: dict[str, int] = Field(default_factory=dict)
    retry_after: dict[str, float] = Field(default_factory=dict)
    given_up: list[int] = Field(default_factory=list)
    refused: list[int] = Field(default_factory=list)
    held: list[int] = Field(default_factory=list)
    history: list[HistoryEntry] = Field(default_factory=list)
    relayout: Optional[Relayout] = None
    pin: Optional[Pin] = None

    def served_shard_num(self) -> Optional[int]:
        """The shard count the served version was rolled out for: the served record's, else
        (state written before it was recorded) the number of shard md5s of the served
        chain's last link; None when nothing is served or it is unknown."""
        if self.served is None:
            return None
        if self.served.shard_num is not None:
            return self.served.shard_num
        chain = self.served_chain
        if chain and chain[-1].version == self.served.version:
            return len(chain[-1].md5s) or None
        return None

    def add_history(self, entry: HistoryEntry) -> None:
        """Appends ``entry``, keeping the last ``HISTORY_MAX``."""
        self.history.append(entry)
        del self.history[:-HISTORY_MAX]

    def to_json(self) -> dict[str, Any]:
        out = self.model_dump(mode="json", by_alias=True, exclude={"history"})
        out["history"] = [h.to_json() for h in self.history]
        return out

    @classmethod
    def load(cls, path: Path) -> "TransferState":
        """Reads ``path``; a missing file is an empty state. Raises ``StateError`` naming
        the file and the field: the transfer refuses to guess (it could redeploy or skip
        versions)."""
        try:
            return super().load(path) or cls()
        except StateError as exc:
            raise StateError(f"unreadable transfer state: {exc}; fix or remove it") from None
