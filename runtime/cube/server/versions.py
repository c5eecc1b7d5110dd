"""The cube server's versions: the served pair ``(current, prev)``, the background slot
being loaded, and the enabled chain recorded in ``<data-dir>/state.json``.

``current`` is served; ``prev`` (the version served before the last enable) is still
answered when a request names it, so a client can finish a batch on one version across
shards while a switch propagates; it is dropped when the next load begins. The
background slot (``bg``) holds the version being loaded. ``enable`` swaps one reference
(atomic for the data plane's readers); a patch is merged into a new table
(``InlineTable.upsert``: a copy of the served one, or a larger rehash of it; copy on
write), so the served table keeps answering.

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
from runtime.cube.table import InlineTable

log = logging.getLogger(__name__)


class Conflict(Exception):
    """A control request that the current state refuses (HTTP 409)."""


class Slot:
    """A loaded version, ready for the hot path: its inline table ``t``
    (``runtime/cube/table.py``; the dict's keys/values arrays are not kept). ``version``:
    its id; ``dim``: floats per value. ``lineage``: the versions it is made of (base
    first, then each patch applied). ``chain``: their ``ChainEntry`` records. ``args``:
    the table's leading arguments of ``KERNEL.table_lookup_raw`` (address, capacity,
    stride in bytes, sentinel, dim)."""

    __slots__ = ("t", "version", "dim", "args", "lineage", "chain")

    def __init__(self, t: InlineTable, version: int, lineage: list[int], chain: list[ChainEntry]):
        self.t = t
        self.version = version
        self.dim = t.dim
        self.lineage = lineage
        self.chain = chain
        self.args = (t.tab.ctypes.data, t.capacity, t.stride, t.sentinel, t.dim)


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
        self.bg: Slot | None = None
        self.bg_state, self.bg_error, self.bg_version = "empty", None, None
        self._bg_gen = 0
        self.loads = {"ok": 0, "failed": 0}
        self.enables = 0

    def status(self) -> dict:
        """The versions' part of ``GET /status``: ``version``, ``prev_version``,
        ``bg_version``, ``bg_state``, ``bg_error``, ``keys``, ``dim``, ``lineage``."""
        cur, prev = self.served
        return {"version": cur.version if cur else None, "prev_version": prev.version if prev else None,
                "bg_version": self.bg_version, "bg_state": self.bg_state, "bg_error": self.bg_error,
                "keys": len(cur.t) if cur else 0, "dim": cur.dim if cur else None,
                "lineage": cur.lineage if cur else []}

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
            self._bg_gen += 1
            gen = self._bg_gen
            self.bg, self.bg_state, self.bg_error, self.bg_version = None, "loading", None, version
        threading.Thread(target=self._load, args=(gen, directory, version, base_version, cur),
                         name="cube-load", daemon=True).start()

    def _load(self, gen: int, directory: str, version: int, base_version: int | None, base: Slot | None):
        t0 = time.perf_counter()
        try:
            d = dictfile.load_shard_dict(directory, verify=self.verify, index=False)
            m = d.meta
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
                slot = Slot(InlineTable.build(d.keys, d.values), version, [version], [entry])
            else:
                if m.mode != "delta":
                    raise dictfile.DictFormatError(f"{directory}: a {m.mode} dict, bg_load_patch needs a delta")
                if m.base_version not in base.lineage:
                    raise dictfile.DictFormatError(
                        f"{directory}: delta {version} is built on {m.base_version}, which is not part of the "
                        f"served version {base.version} (made of {base.lineage})")
                if m.dim != base.dim:
                    raise dictfile.DictFormatError(f"{directory}: dim {m.dim}, the served version has dim {base.dim}")
                slot = Slot(base.t.upsert(d.keys, d.values), version, base.lineage + [version],
                            base.chain + [entry])
            del d  # keys/values arrays: the table holds the data
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
                    slot = Slot(InlineTable.build(d.keys, d.values), e.version, [e.version], [e])
                else:
                    if d.meta.dim != slot.dim:
                        raise dictfile.DictFormatError(f"{e.dir}: dim {d.meta.dim}, the chain has dim {slot.dim}")
                    slot = Slot(slot.t.upsert(d.keys, d.values), e.version, slot.lineage + [e.version],
                                slot.chain + [e])
                del d
            if slot is not None:
                self.served = (slot, None)
                log.info("restored version %d from %s", slot.version, self.data_dir / STATE_FILE)
        except Exception as exc:
            log.error("cannot restore the state in %s (starting empty): %s", self.data_dir, exc)
