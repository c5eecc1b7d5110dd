"""The transfer's check that a version is whole before it is built: every file its
manifest lists (``runtime.formats.manifest``) is there with the same size, SHA-256 and,
for a SequenceFile, rows; no part file the manifest does not list. A version that fails
is refused (``VersionRefused``: given up at once, history ``refused``, ``/dict/info``'s
``last_rollout.error`` naming the file and what differs); the served version keeps
serving.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Optional

from runtime import storage
from runtime.cube.transfer.agents import RolloutError
from runtime.cube.transfer.state import Phase
from runtime.formats import manifest
from runtime.formats.donefile import DonefileRecord


class VersionRefused(RolloutError):
    """A version's files differ from its manifest (or the manifest is missing or
    malformed): not worth a retry; the message names the file and what differs."""

    def __init__(self, message: str):
        super().__init__(Phase.BUILDING, message)


def load_manifest(root: str, rec: Optional[DonefileRecord]) -> Optional[manifest.Manifest]:
    """The manifest ``rec``'s line names (None: the line names none, nothing to verify).
    Raises ``VersionRefused`` (missing or malformed), ``RolloutError`` (unreachable)."""
    if rec is None or not rec.manifest:
        return None
    try:
        return manifest.read(root, rec.manifest, rec.id)
    except manifest.ManifestError as exc:
        raise VersionRefused(f"version {rec.id} refused: {exc}") from None
    except storage.LocationError as exc:
        raise RolloutError(Phase.BUILDING, f"manifest of version {rec.id}: {exc}") from exc


def check_sparse(man: manifest.Manifest, location: str, inputs: list[str], local: list[str],
                 count: Optional[int] = None) -> None:
    """Checks the part files found at ``location`` (``inputs``: their locations, ``local``:
    their local copies, same order) against ``man``'s ``sparse/`` entries: the same names,
    and each file's size, SHA-256 and rows; with ``count`` (the donefile line's), the
    manifest's rows must add up to it. Raises ``VersionRefused``."""
    entries = man.under(manifest.SPARSE_DIR)
    rows = sum(e.rows or 0 for e in entries)
    if count is not None and rows != count:
        raise VersionRefused(f"version {man.version} refused: its donefile line says {count} rows, its "
                             f"manifest's SequenceFiles hold {rows}")
    by_name = {PurePosixPath(e.path).name: e for e in entries}
    names = [i.rstrip("/").rsplit("/", 1)[-1] for i in inputs]
    try:
        manifest.check_listing(entries, names, location, manifest.SPARSE_DIR)
        for name, src, path in zip(names, inputs, local):
            manifest.verify_file(by_name[name], path, src)
    except manifest.ManifestMismatch as exc:
        raise VersionRefused(f"version {man.version} refused: {exc}") from None


def check_dense(man: manifest.Manifest, root: str, rec: DonefileRecord, work_dir: Path) -> None:
    """Checks every ``dense/`` file of ``man`` at ``root``/``rec.model`` (downloaded to a
    temporary directory under ``work_dir`` when remote; a few MB). Raises
    ``VersionRefused`` (missing or differing), ``RolloutError`` (unreachable)."""
    model = rec.model or f"versions/{rec.id}/dense"
    base = storage.join(root, model)
    tmp = None
    try:
        for e in man.under(manifest.DENSE_DIR):
            rel = e.path[len(manifest.DENSE_DIR) + 1:]
            src = storage.join(base.rstrip("/") + "/", rel)
            if storage.is_remote(src):
                if tmp is None:
                    work_dir.mkdir(parents=True, exist_ok=True)
                    tmp = Path(tempfile.mkdtemp(prefix=f".verify-{rec.id}-", dir=work_dir))
                path = tmp / rel.replace("/", "_")
                try:
                    storage.download(src, path)
                except storage.LocationNotFound:
                    pass  # verify_file names it missing
            else:
                path = Path(src)
            manifest.verify_file(e, path, src)
    except manifest.ManifestMismatch as exc:
        raise VersionRefused(f"version {man.version} refused: {exc}") from None
    except storage.LocationError as exc:
        raise RolloutError(Phase.BUILDING, f"dense model of version {rec.id}: {exc}") from exc
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

