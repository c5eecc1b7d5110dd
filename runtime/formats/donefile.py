"""Donefile lines and the version layout under a root: the contract between the trainer's
export (writer), the cube transfer and serving (readers). docs/contracts.md, "A version on
the file server".

Layout under a root ``R`` (a directory or the file server's URL)::

    R/donefile/base.txt        one line per base version; the last valid line is the newest
    R/donefile/patch.txt       one line per patch version; its key is the base it applies to
    R/versions/<id>/dense/     the dense model and model_meta.json (runtime.formats.model_meta)
    R/versions/<id>/sparse/    the embeddings as SequenceFile parts (runtime.formats.seqfile)
    R/versions/<id>/manifest.json  every file above: size, sha256, rows (runtime.formats.manifest)

A line is a JSON object: ``id`` (the version), ``key`` (a base: its own id; a patch: its
base's id) and ``input`` (the SequenceFiles, relative to ``R`` or absolute), the fields of
Paddle Serving's cube-transfer donefiles; this project adds ``model`` (the dense model
directory), ``dim``, ``count`` and, for a version trained on time partitions, its data
time: ``data_end`` (unix s, the end of the last partition it was trained through: the
served version's freshness is ``now - data_end``) and ``landed`` (unix s, when the trainer
found that partition complete: the transfer measures landed-to-served from it) and
``manifest`` (``versions/<id>/manifest.json``: every file of the version with its size,
SHA-256 and rows, ``runtime.formats.manifest``; a reader of a line that names one
verifies the version against it and refuses it on any difference; the trainer's lines
always name one). Ids are integers (numeric strings are accepted, as
Paddle Serving's own tools write them). Every file of a version is written before its
line is appended, so a reader never sees a half-written version.

Patch lines of one base apply in id order, each replacing (or adding) the rows it holds.
So consecutive patch lines can be applied as one (``fold``): their inputs read oldest
first, a later line's row winning for a key, carry the table that applying them one by
one carries. The cube transfer folds the patches queued behind a rollout this way
(``runtime.cube.transfer.coalesce``) and names the folded ids in its history and
``/dict/info``.

On an object store (``R = s3://bucket/prefix``) the donefile is one object rewritten whole
by a conditional write (``If-Match`` on the ETag read, ``If-None-Match: *`` for the first
line; ``runtime.objectstore.append_line``) rather than one object per line: readers keep
reading one file, exactly as Paddle Serving's transfer reads its donefile, a stale or
concurrent writer gets 412 and re-reads instead of overwriting a line, and a line already
present is not appended again, so a writer restarted mid-append repeats its append
without duplicating it.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from runtime import storage, storage_write
from runtime.formats._validation import NonNegInt, PosInt, describe

log = logging.getLogger(__name__)

Kind = Literal["base", "patch"]
KINDS: tuple[str, str] = ("base", "patch")


class DonefileRecord(BaseModel):
    """One donefile line. ``id``/``key``: version ids (int); ``input``/``model``: locations
    relative to the root (str); ``dim``: floats per embedding; ``count``: keys in the
    version's SequenceFiles; ``data_end`` / ``landed``: unix seconds (module docstring; None
    for a version not trained on time partitions); ``manifest``: the version's manifest,
    relative to the root (None: published without one, not verified). ``line`` is the 1-based line number it
    was read from (0 when built in memory); it is not written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: NonNegInt
    key: NonNegInt
    input: str = Field(min_length=1)
    model: Optional[str] = Field(default=None, min_length=1)
    dim: Optional[PosInt] = None
    count: Optional[NonNegInt] = None
    data_end: Optional[NonNegInt] = None
    landed: Optional[NonNegInt] = None
    manifest: Optional[str] = Field(default=None, min_length=1)
    _line: int = PrivateAttr(default=0)

    @property
    def line(self) -> int:
        return self._line

    def to_line(self) -> str:
        """The JSON line (no newline), fields in contract order, unset ones left out."""
        return json.dumps(self.model_dump(exclude_none=True))


def sparse_dir(version: int) -> str:
    """``versions/<id>/sparse``: where a version's SequenceFiles live, relative to the root."""
    return f"versions/{int(version)}/sparse"


def dense_dir(version: int) -> str:
    """``versions/<id>/dense``: where a version's dense model lives, relative to the root."""
    return f"versions/{int(version)}/dense"


def base_record(version: int, dim: int | None = None, count: int | None = None, data_end: int | None = None,
                landed: int | None = None, manifest: str | None = None) -> DonefileRecord:
    """The base line of ``version`` in the standard layout (key = its own id); ``dim``
    floats per embedding, ``count`` keys, the data time (``data_end``, ``landed``: unix
    s) and the ``manifest`` location, when known. Raises ``pydantic.ValidationError``."""
    return DonefileRecord(id=version, key=version, input=sparse_dir(version), model=dense_dir(version),
                          dim=dim, count=count, data_end=data_end, landed=landed, manifest=manifest)


def patch_record(version: int, base: int, dim: int | None = None, count: int | None = None,
                 data_end: int | None = None, landed: int | None = None,
                 manifest: str | None = None) -> DonefileRecord:
    """The patch line of ``version``, applying to base ``base``, in the standard layout;
    ``dim``, ``count``, the data time and the ``manifest`` location when known. Raises
    ``pydantic.ValidationError``."""
    return DonefileRecord(id=version, key=base, input=sparse_dir(version), model=dense_dir(version),
                          dim=dim, count=count, data_end=data_end, landed=landed, manifest=manifest)


def fold(patches: list[DonefileRecord]) -> tuple[DonefileRecord, list[int], list[str]]:
    """Consecutive patch lines of one base (module docstring), in the order they apply,
    as one: ``(the newest line: its id, model and data time, the ids folded into it (the
    older lines), every line's input oldest first)``. Raises ``ValueError`` for no line,
    lines naming different bases, or ids not increasing."""
    if not patches:
        raise ValueError("no patch line to fold")
    keys = {p.key for p in patches}
    if len(keys) != 1:
        raise ValueError(f"patch lines {[p.id for p in patches]} name different bases {sorted(keys)}")
    ids = [p.id for p in patches]
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(f"patch lines {ids}: ids not increasing")
    return patches[-1], ids[:-1], [p.input for p in patches]


def location(root: str, kind: Kind) -> str:
    """``<root>/donefile/<kind>.txt`` (path or URL)."""
    if kind not in KINDS:
        raise ValueError(f"donefile kind {kind!r}: expected base or patch")
    return storage.join(root, "donefile", f"{kind}.txt")


def parse(text: str) -> tuple[list[DonefileRecord], list[tuple[int, str, str]]]:
    """Donefile text -> ``(records, errors)``: the valid records in file order, and
    ``(line number, reason, the line's first 200 characters)`` for each malformed line.
    Blank lines are ignored."""
    records, errors = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            rec = DonefileRecord.model_validate(obj)
            rec._line = n
            records.append(rec)
        except ValidationError as exc:
            errors.append((n, describe(exc), line[:200]))
        except ValueError as exc:
            errors.append((n, str(exc), line[:200]))
    return records, errors


def read(root: str, kind: Kind) -> list[DonefileRecord]:
    """The valid records of ``root``'s ``kind`` donefile (a missing or unreadable donefile
    is empty). Malformed lines are logged with their line number and skipped."""
    loc = location(root, kind)
    try:
        text = storage.read_bytes(loc).decode("utf-8", "replace")
    except storage.LocationError:
        return []
    records, errors = parse(text)
    for n, why, line in errors:
        log.warning("donefile %s line %d skipped: %s: %r", loc, n, why, line)
    return records


def append(root: str, kind: Kind, record: DonefileRecord, token: str | None = None) -> None:
    """Appends ``record`` to ``root``'s ``kind`` donefile (last step of a version's export).
    Raises ``storage.LocationError``."""
    storage_write.append_line(location(root, kind), record.to_line(), token)


def newest_id(root: str) -> int:
    """The largest version id in ``root``'s donefiles (0 if none)."""
    return max((r.id for kind in KINDS for r in read(root, kind)), default=0)


def new_version_id(root: str, now_s: float | None = None) -> int:
    """A new version id for ``root``: ``max(unix seconds, newest id + 1)``, so ids increase
    even when two versions are exported within one second."""
    return max(int(time.time() if now_s is None else now_s), newest_id(root) + 1)
