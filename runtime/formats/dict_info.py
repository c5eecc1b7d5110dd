"""The transfer's ``GET /dict/info`` body: the contract between the cube transfer (writer:
``Transfer.info()`` builds a ``DictInfo``, ``runtime.cube.transfer.app`` answers its
``to_json()``) and every reader (serving follows ``version``; the local pipeline, the
local cube cluster, the rollout benchmark and the container tests wait on it), all of
which call ``fetch_dict_info``. docs/contracts.md, "Transfer HTTP".

``version`` is the id every shard x replica of a complete layout serves (None before the
first rollout), ``served_shard_num`` the shard count of that layout; they change only once
every instance has enabled the new version (during a re-layout onto a new shard count:
once its last link is enabled on the new layout). A reader serving from a topology of
N shards follows ``version_for(N)``.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from runtime.formats._validation import validated


class _Body(BaseModel):
    # extra="ignore": a reader accepts a transfer that added a field after it was built
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class RolloutInfo(_Body):
    """The rollout in progress: ``version``, build ``mode`` (base | delta), ``phase``
    (``Phase`` value: Trigging ... Enabling), ``attempt`` (1-based), ``started`` (unix s),
    ``reason`` (a re-layout link's, else None), ``coalesced`` (the older patch ids folded
    into this rollout, ``runtime.formats.donefile.fold``; empty when none)."""

    version: int
    mode: str
    phase: str
    attempt: int
    started: Optional[float] = None
    reason: Optional[str] = None
    coalesced: list[int] = Field(default_factory=list)


class RelayoutInfo(_Body):
    """A re-layout of the served chain after a resize: ``from_`` (JSON ``from``) -> ``to``
    shards, ``target`` (the served version it ends on), ``done`` of ``links`` rolled out,
    ``given_up``, ``error``."""

    from_: Optional[int] = Field(default=None, alias="from")
    to: int
    target: int
    done: int
    links: int
    given_up: bool = False
    error: Optional[str] = None


class LastRollout(_Body):
    """The newest ``/dict/deploy/history`` entry: ``version``, ``status`` (finished |
    failed | partial | refused), ``error``, ``reason``, ``coalesced`` (the older patch ids
    folded into it; empty when none)."""

    version: int
    status: Optional[str] = None
    error: Optional[str] = None
    reason: Optional[str] = None
    coalesced: list[int] = Field(default_factory=list)


class DictInfo(_Body):
    """The ``/dict/info`` body. ``version``/``base_id``/``patch_id``: version ids served
    (None before the first rollout; ``patch_id`` None for a base); ``shard_num``: the
    topology's shard count; ``served_shard_num``: the one the served version was rolled
    out for (they differ until a re-layout is done); ``replica_num``: the fewest replicas
    of a shard, ``replicas``: per shard; ``dim``: floats per embedding; ``count``: keys
    of the base; ``model``: the dense model's location under the root; ``enabled_at``,
    ``last_poll``: unix s; ``status``: empty | serving | rolling_out; ``waiting_for``:
    instances whose server runs with another ``--shard-num``; ``pinned``: the version
    pinned to be served (a rollback or the stack's ``servedVersion``; None: following
    training)."""

    dict_name: str
    version: Optional[int] = None
    base_id: Optional[int] = None
    patch_id: Optional[int] = None
    shard_num: int
    replica_num: int
    replicas: list[int] = Field(default_factory=list)
    dim: Optional[int] = None
    count: Optional[int] = None
    model: Optional[str] = None
    enabled_at: Optional[float] = None
    status: Literal["empty", "serving", "rolling_out"]
    rollout: Optional[RolloutInfo] = None
    served_shard_num: Optional[int] = None
    relayout: Optional[RelayoutInfo] = None
    waiting_for: list[str] = Field(default_factory=list)
    last_rollout: Optional[LastRollout] = None
    last_poll: Optional[float] = None
    last_error: Optional[str] = None
    held: list[int] = Field(default_factory=list)
    pinned: Optional[int] = None

    def version_for(self, shard_num: int) -> Optional[int]:
        """The version a reader whose topology has ``shard_num`` shards may serve: ``version``
        when it is laid out for that many shards (``served_shard_num``; a transfer that
        does not say, None, is taken at its word), else None (the reader's layout is
        not the one the version is laid out on: a new one still being laid out, or an old
        one left behind by a resize). Raises ``ValueError`` when ``shard_num < 1``."""
        if shard_num < 1:
            raise ValueError(f"shard_num must be >= 1, got {shard_num}")
        if self.version is None or self.served_shard_num not in (None, shard_num):
            return None
        return self.version

    def to_json(self) -> dict[str, Any]:
        """The JSON object the transfer answers (every field, ``relayout.from`` by alias)."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_json(cls, obj: Any, source: str = "/dict/info") -> "DictInfo":
        """Parses a decoded body. Raises ``DictInfoError`` naming ``source`` and the field."""
        if not isinstance(obj, dict):
            raise DictInfoError(f"{source}: not a JSON object (got {type(obj).__name__})")
        return validated(cls, obj, DictInfoError, source)


class DictInfoError(RuntimeError):
    """``/dict/info`` could not be read: the transfer did not answer, answered an HTTP
    error, or a body that is not a ``DictInfo``. The message names the URL (and the field)."""


def info_url(transfer_url: str) -> str:
    """``<transfer_url>/dict/info`` (``transfer_url``: the transfer's base URL)."""
    return transfer_url.rstrip("/") + "/dict/info"


def fetch_dict_info(transfer_url: str, timeout_s: float = 2.0, session=None) -> DictInfo:
    """``GET <transfer_url>/dict/info`` -> ``DictInfo`` (``timeout_s``: connect and read
    timeout, s; ``session``: a ``requests.Session``, e.g. ``runtime.storage.session()``).
    Raises ``DictInfoError`` naming the URL, and the field when the body is malformed."""
    import requests

    url = info_url(transfer_url)
    try:
        r = (session or requests).get(url, timeout=timeout_s)
        r.raise_for_status()
        obj = r.json()
    except requests.RequestException as exc:
        raise DictInfoError(f"{url}: {exc}") from None
    except ValueError as exc:
        raise DictInfoError(f"{url}: not JSON ({exc})") from None
    return DictInfo.from_json(obj, url)


def served_version(transfer_url: str, timeout_s: float = 2.0) -> int | None:
    """The version every instance serves per ``<transfer_url>/dict/info``; None before the
    first rollout and while the transfer does not answer (a poller's view: it retries)."""
    try:
        return fetch_dict_info(transfer_url, timeout_s).version
    except DictInfoError:
        return None
