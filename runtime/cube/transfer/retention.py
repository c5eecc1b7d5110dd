"""Retention of published versions (``--keep-versions N``, the stack's ``keepVersions``):
after each rollout, the versions beyond the newest ``N`` in the donefiles are deleted
from the version root (``ROOT/versions/<id>/`` and ``ROOT/cube/<dict>/<id>*/``; a file
server through ``DELETE``, an object store by prefix), so that a rollback target still
exists and old ones do not pile up.

Never deleted: a link of the chain (``rollback.chain_of``: its base, then the patches
of that base up to it) of a kept version, of the served version, of the pinned one, of
the rollout in progress or of a version newer than the served one (pending), so every version kept can still be rolled back to. The
donefile lines stay (the files are what is deleted); a rollback to a deleted version
fails naming its missing manifest or inputs, and the served version keeps serving.
"""
from __future__ import annotations

import logging

from runtime import storage, storage_write
from runtime.cube.transfer.rollback import RollbackError, chain_of
from runtime.formats.donefile import DonefileRecord

log = logging.getLogger(__name__)


def protected(keep: int, bases: list[DonefileRecord], patches: list[DonefileRecord],
              pinned: set[int]) -> tuple[list[int], set[int]]:
    """``(versions to delete, versions kept)`` for ``keep`` newest versions (``keep`` >= 1)
    and the versions in ``pinned`` (served, pinned, in progress), each with its chain."""
    ids = sorted({r.id for r in bases} | {r.id for r in patches})
    keep_ids = set(ids[-keep:]) | (pinned & set(ids))
    kept = set()
    for v in keep_ids:
        try:
            kept |= {r.id for r in chain_of(v, bases, patches)}
        except RollbackError:  # a patch whose base line is gone: keep what is there
            kept.add(v)
    return [v for v in ids if v not in kept], kept


def prune(tr) -> list[int]:
    """Deletes the published versions beyond ``tr.keep_versions`` (module docstring) that
    are not deleted yet; ``tr`` is the ``service.Transfer``. Returns the ids deleted now.
    A failed deletion is logged and tried again at the next rollout."""
    if tr.keep_versions <= 0:
        return []
    bases, patches = tr._donefile("base"), tr._donefile("patch")
    with tr.lock:
        st = tr.state
        pinned = {v for v in (st.served.version if st.served else None, st.pin.version if st.pin else None,
                              st.current.version if st.current else None) if v is not None}
        pinned |= {c.version for c in st.served_chain}
        newest_served = st.served.version if st.served else -1
    # versions newer than the served one are pending (rolled out next, or skipped by the planner)
    pinned |= {r.id for r in bases + patches if r.id > newest_served}
    doomed, _ = protected(tr.keep_versions, bases, patches, pinned)
    done = tr.deleted  # this process's deletions (after a restart a missing file is no error)
    out = []
    for v in doomed:
        if v in done:
            continue
        try:
            storage_write.remove_tree(storage.join(tr.root, "versions", str(v)), tr.builder.token)
            for name in _cube_dirs(tr, v):
                storage_write.remove_tree(storage.join(tr.root, "cube", tr.dict_name, name), tr.builder.token)
        except storage.LocationError as exc:
            log.warning("retention: version %d not deleted yet: %s", v, exc)
            continue
        done.add(v)
        out.append(v)
    if out:
        log.info("retention (keep %d): deleted versions %s from %s", tr.keep_versions, out, tr.root)
    return out


def _cube_dirs(tr, version: int) -> list[str]:
    """The names under ``ROOT/cube/<dict>/`` of ``version``'s builds: ``<id>``, its
    re-layouts ``<id>-<N>shards`` and a rollback's ``<id>-chain``."""
    try:
        entries = storage.list_dir(storage.join(tr.root, "cube", tr.dict_name) + "/")
    except storage.LocationError:
        return [str(version)]
    return [n for n, _ in entries if n == str(version) or n.startswith(f"{version}-")]
