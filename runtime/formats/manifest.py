"""A version's manifest: every file of a published version with its size and SHA-256, and
the rows of each sparse SequenceFile. The contract between the trainer's export (writer)
and every reader of a version (the cube transfer before building, serving before loading
a dense model). docs/contracts.md, "A version on the file server".

Location: ``R/versions/<id>/manifest.json`` (``location``), written after every other
file of the version and before its donefile line, which names it (``manifest`` field of
``runtime.formats.donefile.DonefileRecord``). A reader of a line that names a manifest
verifies every file it uses against it and refuses the version on any difference: a file
missing, a size, a checksum or a row count that differs (``ManifestMismatch``, naming the
file and what differs), or the manifest itself missing or unreadable (``ManifestError``).

Document (JSON object)::

    {"format": "elastic-ctr-manifest/1", "version": <id>,
     "files": [{"path": "dense/inference.pdiparams", "bytes": 1234, "sha256": "<64 hex>"},
               {"path": "sparse/part-00000", "bytes": 5678, "sha256": "...", "rows": 100}, ...]}

``path`` is relative to ``R/versions/<id>/`` (``/``-separated, no ``..``); ``rows`` is set
for SequenceFiles (``runtime.formats.seqfile``) only. SHA-256: FIPS 180-4 (``hashlib``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Iterable, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime import storage
from runtime.formats._validation import NonNegInt, describe

FILE = "manifest.json"
FORMAT = "elastic-ctr-manifest/1"
SPARSE_DIR = "sparse"
DENSE_DIR = "dense"


class ManifestError(ValueError):
    """A manifest is missing, unreadable or malformed; the message names it."""


class ManifestMismatch(ManifestError):
    """A version's file differs from its manifest (missing, size, checksum or rows); the
    message names the file and what differs."""


class FileEntry(BaseModel):
    """One file: ``path`` (relative to the version directory), ``bytes`` (size), ``sha256``
    (64 lowercase hex digits) and ``rows`` (records of a SequenceFile, else None)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    bytes: NonNegInt
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    rows: Optional[NonNegInt] = None

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or "\\" in v:
            raise ValueError(f"{v!r}: expected a relative path inside the version directory")
        return v


class Manifest(BaseModel):
    """A version's manifest (module docstring). ``files`` sorted by path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = FORMAT
    version: NonNegInt
    files: list[FileEntry]

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        if v != FORMAT:
            raise ValueError(f"{v!r}: expected {FORMAT!r}")
        return v

    def under(self, prefix: str) -> list[FileEntry]:
        """The entries under ``prefix`` (``"sparse"``, ``"dense"``), in path order."""
        pre = prefix.rstrip("/") + "/"
        return [f for f in self.files if f.path.startswith(pre)]

    def entry(self, path: str) -> Optional[FileEntry]:
        return next((f for f in self.files if f.path == path), None)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), indent=1) + "\n"

    @classmethod
    def parse(cls, data: bytes, name: str) -> "Manifest":
        """Parses a manifest document. Raises ``ManifestError`` naming ``name``."""
        try:
            return cls.model_validate(json.loads(data.decode("utf-8")))
        except ValidationError as exc:
            raise ManifestError(f"{name}: not a valid manifest: {describe(exc)}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{name}: not a JSON manifest ({exc})") from None


def location(version: int) -> str:
    """``versions/<id>/manifest.json`` relative to the root (what a donefile line names)."""
    return f"versions/{int(version)}/{FILE}"


def read(root: str, rel: str, version: Optional[int] = None) -> Manifest:
    """Reads the manifest at ``root``/``rel`` (a path, URL or object-store location) and,
    with ``version``, checks it is that version's. Raises ``ManifestMismatch`` (missing),
    ``ManifestError`` (malformed or another version's), both naming the location, or
    ``runtime.storage.LocationError`` (unreachable: worth a retry)."""
    from runtime import storage

    loc = storage.join(root, rel)
    try:
        data = storage.read_bytes(loc)
    except storage.LocationNotFound:
        raise ManifestMismatch(f"{loc}: manifest missing (the version's donefile line names it)") from None
    m = Manifest.parse(data, loc)
    if version is not None and m.version != int(version):
        raise ManifestError(f"{loc}: manifest of version {m.version}, expected {int(version)}")
    return m


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a local file (``storage.file_digest``)."""
    return storage.file_digest(path, "sha256")


def count_rows(path: str | os.PathLike, expect: Optional[int] = None) -> int:
    """Records in a local SequenceFile; with ``expect``, the reader raises
    ``SequenceFileError`` when the file ends after another count (a file cut between two
    records). Raises ``SequenceFileError`` for a malformed file."""
    from runtime.formats.seqfile import SequenceFileReader

    with SequenceFileReader(path, expect_rows=expect) as r:
        return sum(len(k) for k, _ in r.iter_batches())


def build(version_dir: str | os.PathLike, version: int, rows: Optional[dict[str, int]] = None) -> Manifest:
    """The manifest of every file under ``version_dir`` (a staged version: ``dense/``,
    ``sparse/``; ``manifest.json`` itself left out). ``rows``: records per SequenceFile by
    relative path; a file under ``sparse/`` missing from it is counted by reading it.
    Raises ``OSError``, ``SequenceFileError``."""
    base = Path(version_dir)
    rows = dict(rows or {})
    out = []
    for p in sorted(q for q in base.rglob("*") if q.is_file()):
        rel = p.relative_to(base).as_posix()
        if rel == FILE:
            continue
        n = None
        if rel.startswith(SPARSE_DIR + "/"):
            n = rows[rel] if rel in rows else count_rows(p)
        out.append(FileEntry(path=rel, bytes=p.stat().st_size, sha256=sha256_file(p), rows=n))
    return Manifest(version=int(version), files=out)


def verify_file(entry: FileEntry, local: str | os.PathLike, name: str) -> None:
    """Checks the local copy ``local`` of ``entry``'s file (``name``: its location, for the
    message): present, size, SHA-256 and, for a SequenceFile, rows (read to its end).
    Raises ``ManifestMismatch`` naming ``name`` and what differs."""
    from runtime.formats.seqfile import SequenceFileError

    p = Path(local)
    if not p.is_file():
        raise ManifestMismatch(f"{name}: missing (the manifest lists it, {entry.bytes} bytes)")
    size = p.stat().st_size
    if size != entry.bytes:
        raise ManifestMismatch(f"{name}: size {size} bytes, the manifest says {entry.bytes}")
    digest = sha256_file(p)
    if digest != entry.sha256:
        raise ManifestMismatch(f"{name}: sha256 {digest[:16]}..., the manifest says {entry.sha256[:16]}... "
                               f"(same size: the content was altered)")
    if entry.rows is not None:
        try:
            count_rows(p, expect=entry.rows)
        except SequenceFileError as exc:
            raise ManifestMismatch(f"{name}: rows differ from the manifest's {entry.rows}: {exc}") from None


def check_listing(entries: Iterable[FileEntry], names: Iterable[str], where: str, prefix: str) -> None:
    """Checks that the file names found in a directory (``names``, basenames; ``where``:
    the directory, for the message) are exactly the manifest's ``entries`` under
    ``prefix``. Raises ``ManifestMismatch`` naming the first file missing or not listed."""
    want = {PurePosixPath(e.path).name for e in entries if e.path.startswith(prefix.rstrip("/") + "/")}
    have = set(names)
    for n in sorted(want - have):
        raise ManifestMismatch(f"{where.rstrip('/')}/{n}: missing (the manifest lists it)")
    for n in sorted(have - want):
        raise ManifestMismatch(f"{where.rstrip('/')}/{n}: not in the version's manifest")
