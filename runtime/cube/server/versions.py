"""The cube server's versions: the served pair ``(current, prev)``, the background slot
being loaded, and the enabled chain recorded in ``<data-dir>/state.json``.

``current`` is served; ``prev`` (the version served before the last enable) is still
answered when a request names it, so a client can finish a batch on one version across
shards while a switch propagates; it is dropped when the next load begins. The
background slot (``bg``) holds the version being loaded. ``enable`` swaps one reference
(atomic for the data plane's readers). Each version is a ``VersionView``
(``runtime/cube/views.py``): a patch is loaded as a small overlay table on the served
version's base, never a copy of the table; when the next patch load begins (``prev``
dropped, so no served view lacks the current version's overlays), the current version's
overlays are merged into the base in place, while lookups go on. A view leaving ``served``
is retired (a lookup already holding it re-reads ``served``), and the merge waits until no
lookup is in progress on a retired view. Design and invariants: docs/cube.md, "Versions in
place".

Dict files are read through ``runtime/cube/dictfile.py`` (their owner); a load checks
the dict's meta against this server's dict name, shard, ``shard_num`` and the version
asked for, so a server never serves another layout. ``state.json``: a ``ServerState``
(``runtime.cube.server.state``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from runtime.cube import dictfile
from runtime.cube.server.state import FILE as STATE_FILE
from runtime.cube.server.state import ChainEntry, ServerState
from runtime.cube.views import VersionView

log = logging.getLogger(__name__)


class Conflict(Exception):
    """A control request that the current state refuses (HTTP 409)."""


class Slot:
    """A loaded version, ready for the hot path: its view ``t`` (``VersionView``,
    ``runtime/cube/table.py``; the dict's keys/values arrays are not kept). ``version``:
    its id; ``dim``: floats per value. ``lineage``: the versions it is made of (base
    first, then each patch applied). ``chain``: their ``ChainEntry`` records. ``addr``:
    the view's address, the first argument of ``KERNEL.view_lookup_raw``."""

    __slots__ = ("t", "version", "dim", "addr", "lineage", "chain")

    def __init__(self, t: VersionView, version: int, lineage: list[int], chain: list[ChainEntry]):
        self.t = t
        self.version = version
        self.dim = t.dim
        self.lineage = lineage
        self.chain = chain
        self.addr = t.addr


class Versions:
    """The versions of one server (``dict_name``, ``shard`` of ``shard_num``).

    ``served``: ``(current, prev)``, each a ``Slot`` or None; replaced as a whole, read
    without a lock by the data plane. ``bg``/``bg_state`` ("empty", "loading", "loaded",
    "failed")/``bg_error``/``bg_version``: the background slot. ``loads`` (``{"ok",
    "failed"}``) and ``enables``: counters. ``data_dir``: where ``state.json`` is kept
    (None: not kept). ``verify``: check the dicts' crc32 on load. ``load_roots``: the
    directories loads may come from (a directory whose real path, symlinks resolved, lies
    outside every one is refused: ``ValueError``, HTTP 400); None: any."""

    def __init__(self, dict_name: str, shard: int, shard_num: int, data_dir: Path | None = None,
                 verify: bool = True, load_roots=None):
        self.load_roots = None if load_roots is None else [os.path.realpath(r) for r in load_roots]
        self.dict_name, self.shard, self.shard_num = dict_name, shard, shard_num
        self.data_dir, self.verify = data_dir, verify
        self.served: tuple[Slot | None, Slot | None] = (None, None)
        self._lock = threading.Lock()  # control operations
        self._fold_lock = threading.Lock()  # one merge into the base at a time
        self.bg: Slot | None = None
        self.bg_state, self.bg_error, self.bg_version = "empty", None, None
        self._bg_gen = 0
        self.loads = {"ok": 0, "failed": 0}
        self.enables = 0
        self._retired: list[VersionView] = []  # left `served`; unpinned before an in-place merge
        #: longest wait (s) for a retired view's lookups before a merge; past it the merge copies
        self.unpin_timeout_s = 10.0
        self.merges = {"in_place": 0, "copied": 0}

    def status(self) -> dict:
        """The versions' part of ``GET /status``: ``version``, ``prev_version``,
        ``bg_version``, ``bg_state``, ``bg_error``, ``keys``, ``dim``, ``lineage``,
        ``extensions`` (the served view's extension tables: growth past its base's
        headroom), ``merges`` (``{"in_place", "copied"}``: patch merges so far)."""
        cur, prev = self.served
        return {"version": cur.version if cur else None, "prev_version": prev.version if prev else None,
                "bg_version": self.bg_version, "bg_state": self.bg_state, "bg_error": self.bg_error,
                "keys": len(cur.t) if cur else 0, "dim": cur.dim if cur else None,
                "lineage": cur.lineage if cur else [], "extensions": len(cur.t.extensions) if cur else 0,
                "merges": dict(self.merges)}

    def bg_load(self, directory: str, version: int, base_version: int | None = None) -> None:
        """Starts a background load of the dict in ``directory`` (a base, or a patch when
        ``base_version`` is given) on a thread; its result shows in ``bg_state``/``bg_error``.
        Raises ``Conflict`` (HTTP 409) when a load is running or the patch's base is not
        served, ``ValueError`` (HTTP 400) for a directory outside ``load_roots``."""
        if self.load_roots is not None:
            real = os.path.realpath(directory)
            if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in self.load_roots):
                raise ValueError(f"dir {directory!r} is not under a load root ({', '.join(self.load_roots)})")
        with self._lock:
            if self.bg_state == "loading":
                raise Conflict(f"a load of version {self.bg_version} is in progress")
            cur, prev = self.served
            if base_version is not None and (cur is None or cur.version != base_version):
                raise Conflict(f"patch {version} applies to version {base_version}, but the served "
                               f"version is {cur.version if cur else None}")
            # the previous version is kept only until the next load begins
            self.served = (cur, None)
            if prev is not None:
                self._retire(prev)
            self._bg_gen += 1
            gen = self._bg_gen
            self.bg, self.bg_state, self.bg_error, self.bg_version = None, "loading", None, version
        threading.Thread(target=self._load, args=(gen, directory, version, base_version),
                         name="cube-load", daemon=True).start()

    def _load(self, gen: int, directory: str, version: int, base_version: int | None):
        t0 = time.perf_counter()
        try:
            if base_version is not None:
                # first, so that the served version's overlay is freed before the patch is read
                base = self._fold()
                if base is None or base.version != base_version:
                    raise Conflict(f"the served version changed to {base.version if base else None} "
                                   f"while patch {version} on {base_version} was loading")
            if base_version is None:
                d = dictfile.load_shard_dict(directory, verify=self.verify, index=False)
                m = d.meta
            else:  # the values read in chunks into the overlay: never all held at once
                m, keys, chunks = dictfile.load_shard_dict_chunked(directory, verify=self.verify)
            want = (self.dict_name, self.shard, self.shard_num, version)
            got = (m.dict_name, m.shard, m.shard_num, m.version)
            if got != want:
                raise dictfile.DictFormatError(
                    f"{directory}: holds dict {m.dict_name} shard {m.shard}/{m.shard_num} version "
                    f"{m.version}, expected {self.dict_name} shard {self.shard}/{self.shard_num} version {version}")
            entry = ChainEntry(dir=str(Path(directory).resolve()), version=version, mode=m.mode,
                               base_version=base_version)
            if base_version is None:
                if m.mode != "base":
                    raise dictfile.DictFormatError(f"{directory}: a {m.mode} dict, bg_load_base needs a base")
                slot = Slot(VersionView.of_base(d.keys, d.values, version), version, [version], [entry])
                del d  # keys/values arrays: the table holds the data
            else:
                if m.mode != "delta":
                    raise dictfile.DictFormatError(f"{directory}: a {m.mode} dict, bg_load_patch needs a delta")
                if m.base_version not in base.lineage:
                    raise dictfile.DictFormatError(
                        f"{directory}: delta {version} is built on {m.base_version}, which is not part of the "
                        f"served version {base.version} (made of {base.lineage})")
                if m.dim != base.dim:
                    raise dictfile.DictFormatError(f"{directory}: dim {m.dim}, the served version has dim {base.dim}")
                slot = Slot(base.t.patched_chunks(keys, chunks, version), version, base.lineage + [version],
                            base.chain + [entry])
        except Exception as exc:  # reported through /status; the served version is untouched
            with self._lock:
                if gen == self._bg_gen:
                    self.bg_state, self.bg_error = "failed", f"{type(exc).__name__}: {exc}"
                    self.loads["failed"] += 1
            log.error("load of version %s from %s failed: %s", version, directory, exc)
            return
        with self._lock:
            if gen != self._bg_gen:  # unloaded or superseded meanwhile
                return
            self.bg, self.bg_state = slot, "loaded"
            self.loads["ok"] += 1
        log.info("loaded version %d (%d keys, dim %d) from %s in %.2f s", version, len(slot.t), slot.dim,
                 directory, time.perf_counter() - t0)

    def _retire(self, slot: Slot) -> None:
        """``slot`` has left ``served`` (under ``_lock``): lookups holding it re-read ``served``."""
        slot.t.retire()
        # a retired view seen unpinned is never read again: only those still pinned are kept
        self._retired = [v for v in self._retired if v.pinned] + [slot.t]

    def _fold(self) -> Slot | None:
        """Merges the overlays of the served version into its base (``VersionView.folded``)
        and serves the folded view in its place (same version, same answers); only while no
        previous version is served (else nothing is done). In place once every retired view
        is unpinned (none can read a merged key from the base then: the only views served
        or loading hold every merged overlay); by a copy if one stays pinned past
        ``unpin_timeout_s``. Returns the slot now serving the current version (None: none)."""
        with self._fold_lock:
            with self._lock:
                cur, prev = self.served
                retired = list(self._retired)
            if cur is None or not cur.t.overlays or prev is not None:
                return cur
            in_place = all(v.wait_unpinned(self.unpin_timeout_s) for v in retired)
            t0 = time.perf_counter()
            folded = Slot(cur.t.folded(in_place), cur.version, cur.lineage, cur.chain)
            with self._lock:
                self._retired = [v for v in self._retired if v not in retired]
                c, p = self.served
                swapped = c is cur  # else a base was enabled meanwhile (a load discarded by bg_unload)
                if swapped:
                    self.served = (folded, p)
                    self._retire(cur)
            how = "in place" if folded.t.base is cur.t.base else "copied"
            self.merges["in_place" if how == "in place" else "copied"] += 1
            if swapped and cur.t.wait_unpinned(self.unpin_timeout_s):  # its overlays can be freed now
                with self._lock:
                    self._retired = [v for v in self._retired if v is not cur.t]
            log.info("merged %d patch(es) of version %d into its base (%s; %d extension(s)) in %.3f s",
                     len(cur.t.overlays), cur.version, how, len(folded.t.extensions), time.perf_counter() - t0)
            return folded

    def enable(self, version: int) -> dict:
        """Switches to the loaded bg version atomically and records it in ``state.json``.
        Returns ``{"version", "changed": True, "prev_version"}``, or ``{"version",
        "changed": False}`` when ``version`` is already served. Raises ``Conflict`` when
        the bg slot does not hold ``version``, loaded."""
        with self._lock:
            cur, prev = self.served
            if self.bg is None or self.bg_state != "loaded" or self.bg.version != version:
                if cur is not None and cur.version == version:
                    return {"version": version, "changed": False}
                raise Conflict(f"cannot enable {version}: the background slot holds "
                               f"{self.bg_version} ({self.bg_state})")
            self.served = (self.bg, cur)
            self.bg, self.bg_state, self.bg_version, self.bg_error = None, "empty", None, None
            self.enables += 1
            new = self.served[0]
        log.info("enabled version %d (previous %s)", version, cur.version if cur else None)
        self._persist(new)
        return {"version": version, "changed": True, "prev_version": cur.version if cur else None}

    def bg_unload(self) -> None:
        """Empties the background slot; a load in progress is discarded when it ends."""
        with self._lock:
            self._bg_gen += 1
            self.bg, self.bg_state, self.bg_version, self.bg_error = None, "empty", None, None

    def _persist(self, slot: Slot) -> None:
        if self.data_dir is not None:
            ServerState(dict_name=self.dict_name, shard=self.shard, shard_num=self.shard_num, version=slot.version,
                        chain=slot.chain).save(self.data_dir / STATE_FILE)

    def restore(self) -> None:
        """Reloads the chain recorded in ``<data-dir>/state.json`` (``ServerState``;
        synchronously) and serves it. Starts empty (logged, nothing raised) when the file
        is unreadable or a dict of the chain is not this server's ``(dict_name, shard,
        shard_num)``, e.g. after a restart with a new ``--shard-num``."""
        if self.data_dir is None:
            return
        try:
            state = ServerState.load(self.data_dir / STATE_FILE)
            if state is None:
                return
            slot = None
            want = (self.dict_name, self.shard, self.shard_num)
            for e in state.chain:
                d = dictfile.load_shard_dict(e.dir, verify=self.verify, index=False)
                got = (d.meta.dict_name, d.meta.shard, d.meta.shard_num)
                if got != want:
                    raise dictfile.DictFormatError(
                        f"{e.dir} holds dict {got[0]} shard {got[1]}/{got[2]}, this server is "
                        f"{want[0]} shard {want[1]}/{want[2]} (resized?)")
                if slot is None:
                    slot = Slot(VersionView.of_base(d.keys, d.values, e.version), e.version, [e.version], [e])
                else:
                    if d.meta.dim != slot.dim:
                        raise dictfile.DictFormatError(f"{e.dir}: dim {d.meta.dim}, the chain has dim {slot.dim}")
                    # nothing is served yet: merged in place at once
                    slot = Slot(slot.t.patched(d.keys, d.values, e.version).folded(), e.version,
                                slot.lineage + [e.version], slot.chain + [e])
                del d
            if slot is not None:
                self.served = (slot, None)
                log.info("restored version %d from %s", slot.version, self.data_dir / STATE_FILE)
        except Exception as exc:
            log.error("cannot restore the state in %s (starting empty): %s", self.data_dir, exc)
