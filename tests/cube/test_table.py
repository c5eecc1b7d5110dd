"""The server's versioned views (runtime/cube/views.py: VersionView over InlineTable):
every version answers as the offline model (a dict with each version's rows applied in
order, a zero row deleting its key), misses, overwrites across patches, deletions (evicted
keys) and the reuse of their slots, merges in place under concurrent readers,
retired views, growth past the base's headroom by extensions (also for a patch key that is
the base's sentinel) and the copy fallbacks (past ``MAX_EXTENSIONS``, a view still
pinned)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from runtime.cube.server.versions import Slot, Versions
from runtime.cube.table import MAX_LOAD
from runtime.cube.views import GROW_STEP, MAX_EXTENSIONS, VersionRetired, VersionView

DIM = 3


class Offline:
    """The reference: key -> value row, one dict per version."""

    def __init__(self, keys, values):
        self.versions = {0: dict(zip(keys.tolist(), values))}

    def apply(self, version: int, keys, values) -> None:
        """A patch: a row of zeros deletes its key (the cube's contract), any other sets it."""
        d = dict(self.versions[max(self.versions)])
        for k, v in zip(keys.tolist(), values):
            if v.any():
                d[k] = v
            else:
                d.pop(k, None)
        self.versions[version] = d

    def answer(self, version: int, query):
        d = self.versions[version]
        found = np.array([int(k) in d for k in query], bool)
        vals = np.stack([d.get(int(k), np.zeros(DIM, np.float32)) for k in query]).astype(np.float32)
        return vals, found


def rows(rng, n, pool=None, fresh=0):
    """``n`` rows: keys drawn from ``pool`` (overwrites) plus ``fresh`` new random keys."""
    keys = rng.choice(pool, n, replace=False) if n else np.empty(0, np.uint64)
    new = rng.integers(1, 1 << 62, fresh, dtype=np.uint64)
    keys = np.unique(np.concatenate([keys, new]).astype(np.uint64))
    rng.shuffle(keys)
    return keys, rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)


def check(view: VersionView, ref: Offline, version: int, query) -> None:
    vals, found = view.lookup(query)
    want_vals, want_found = ref.answer(version, query)
    np.testing.assert_array_equal(found, want_found)
    np.testing.assert_array_equal(vals, want_vals)
    assert len(view) == len(ref.versions[version])


def fold_under_readers(view: VersionView, readers: dict, ref: Offline, query) -> VersionView:
    """Folds ``view`` three times (merging the same rows again is idempotent: more time
    under readers) while one thread per ``readers`` item (version -> its view) looks
    ``query`` up and compares with the offline answer; returns the folded view. Fails
    when a reader saw any other answer or none read."""
    want = {v: ref.answer(v, query) for v in readers}
    stop, bad, reads = threading.Event(), [], [0]

    def reader(v, version):
        while not stop.is_set():
            vals, found = v.lookup(query)
            if not (np.array_equal(found, want[version][1]) and np.array_equal(vals, want[version][0])):
                bad.append(version)
            reads[0] += 1

    threads = [threading.Thread(target=reader, args=(v, version)) for version, v in readers.items()]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            folded = view.folded()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad and reads[0] > 0
    return folded


def test_every_version_answers_as_offline_with_misses_and_overwrites():
    rng = np.random.default_rng(1)
    keys, values = rows(rng, 0, fresh=5000)
    ref = Offline(keys, values)
    views = {0: VersionView.of_base(keys, values, 0)}
    added = [keys]
    for v in range(1, 6):
        pool = np.concatenate(added)
        pk, pv = rows(rng, 400, pool, fresh=100)  # overwrites (also of earlier patches' keys) + new keys
        views[v] = views[v - 1].patched(pk, pv, v)
        ref.apply(v, pk, pv)
        added.append(pk)
    misses = rng.integers(1 << 62, 1 << 63, 200, dtype=np.uint64)
    query = np.concatenate([np.concatenate(added)[::7], misses, np.array([views[0].base.sentinel], np.uint64)])
    for v, view in views.items():  # no merge: every view keeps its own answers
        check(view, ref, v, query)
        assert len(view.overlays) == v
    vals, found = views[5].lookup(misses)
    assert not found.any() and (vals == 0).all()
    assert not views[5].contains(misses).any() and views[5].contains(added[-1]).all()
    folded = views[5].folded()  # five overlays, a key in several: the newest row wins in the base
    assert folded.base is views[0].base and not folded.overlays
    check(folded, ref, 5, query)


def test_server_lifecycle_merges_in_place_and_keeps_current_and_previous():
    """As ``Versions`` does it: at each patch, the previous view is retired, the current
    one folded (in place), the patch added as an overlay; current and previous answer as
    offline at every step and the base is never copied."""
    rng = np.random.default_rng(2)
    keys, values = rows(rng, 0, fresh=20_000)
    ref = Offline(keys, values)
    cur, prev = VersionView.of_base(keys, values, 0), None
    base = cur.base
    query = np.concatenate([keys[::5], rng.integers(1 << 62, 1 << 63, 100, dtype=np.uint64)])
    for v in range(1, 8):
        if prev is not None:
            prev.retire()
            assert prev.wait_unpinned(1.0)
            with pytest.raises(VersionRetired):
                prev.lookup(query[:3])
        cur = cur.folded()
        assert cur.base is base and not cur.overlays
        check(cur, ref, v - 1, query)
        pk, pv = rows(rng, 300, keys, fresh=200)
        query = np.concatenate([query, pk[:50]])
        new = cur.patched(pk, pv, v)
        ref.apply(v, pk, pv)
        cur, prev = new, cur
        check(cur, ref, v, query)
        check(prev, ref, v - 1, query)
    assert base.count == len(ref.versions[6])  # the base holds everything up to the folded version


def test_merge_under_readers_never_shows_a_newer_row():
    """Readers of the current version and of the version loaded on it look up keys of
    the overlay being merged (and others) while the merge writes the base in place."""
    rng = np.random.default_rng(3)
    keys, values = rows(rng, 0, fresh=200_000)
    ref = Offline(keys, values)
    v0 = VersionView.of_base(keys, values, 0)
    p1k, p1v = rows(rng, 60_000, keys, fresh=20_000)
    v1 = v0.patched(p1k, p1v, 1)
    ref.apply(1, p1k, p1v)
    p2k, p2v = rows(rng, 30_000, p1k, fresh=5_000)
    v2 = v1.patched(p2k, p2v, 2)
    ref.apply(2, p2k, p2v)
    v0.retire()  # as the server: the view lacking v1's overlay is no longer read
    query = np.concatenate([p1k[:4000], p2k[:2000], keys[:2000]])
    folded = fold_under_readers(v1, {1: v1, 2: v2}, ref, query)
    assert folded.base is v1.base and folded.base.count == len(ref.versions[1])
    check(folded, ref, 1, query)
    check(v2, ref, 2, query)


def test_retired_view_refuses_lookups_and_pins_block_wait():
    keys, values = rows(np.random.default_rng(4), 0, fresh=100)
    v = VersionView.of_base(keys, values, 7)
    assert not v.pinned and not v.retired
    v.buf[0] += 1  # a lookup in progress
    v.retire()
    assert v.retired and v.pinned and not v.wait_unpinned(0.01)
    with pytest.raises(VersionRetired):
        v.lookup(keys)
    with pytest.raises(VersionRetired):
        v.contains(keys)
    assert int(v.buf[0]) == 1  # a refused lookup leaves the pins as they were
    v.buf[0] -= 1
    assert v.wait_unpinned(0.01)


def test_fold_grows_by_extensions_past_the_base_headroom_and_for_the_sentinel():
    """New keys past ``MAX_LOAD`` of the base, and a key that is the base's sentinel, go
    into extensions (the base is never copied, memory grows by an extension); later
    patches update rows in the base and the extensions in place; every view answers as
    offline, and the view being read during a merge keeps its answers."""
    rng = np.random.default_rng(5)
    keys, values = rows(rng, 0, fresh=4000)
    ref = Offline(keys, values)
    v0 = VersionView.of_base(keys, values, 0)
    base = v0.base
    room = int(MAX_LOAD * base.capacity) - base.count
    pk, pv = rows(rng, 10, keys, fresh=room + 10)  # past MAX_LOAD
    v1 = v0.patched(pk, pv, 1)
    ref.apply(1, pk, pv)
    f1 = v1.folded()
    assert f1.base is base and len(f1.extensions) == 1 and base.count + f1.extensions[0].count == len(f1)
    assert f1.extensions[0].capacity < base.capacity // 4  # memory added: the new keys, not a copy
    query = np.concatenate([keys, pk, rng.integers(1 << 62, 1 << 63, 100, dtype=np.uint64)])
    check(f1, ref, 1, query)
    check(v1, ref, 1, query)  # still answers while and after the merge (its overlay first)
    sk = np.array([base.sentinel], np.uint64)  # a patch key that is the base's sentinel
    sv = np.full((1, DIM), 4.0, np.float32)
    pk2 = np.concatenate([sk, pk[:50], keys[:50]])  # and rows of keys the extension and the base hold
    pv2 = np.concatenate([sv, rng.standard_normal((100, DIM)).astype(np.float32)])
    v2 = f1.patched(pk2, pv2, 2)
    ref.apply(2, pk2, pv2)
    f2 = v2.folded()
    assert f2.base is base and base.sentinel == sk[0] and len(f2.extensions) == 1
    assert f2.extensions[0].tab is f1.extensions[0].tab  # the last extension had room: no new table
    query = np.concatenate([query, sk])
    check(f2, ref, 2, query)
    check(v2, ref, 2, query)  # the view read during the merge: the patch's keys found in its overlay
    f = f2
    for v in range(3, 3 + 40):  # growth step after step, up to MAX_EXTENSIONS, then a copy
        pk, pv = rows(rng, 20, keys, fresh=int(GROW_STEP * MAX_LOAD * base.capacity))
        ref.apply(v, pk, pv)
        nxt = f.patched(pk, pv, v).folded()
        query = np.concatenate([query, pk[:20]])
        check(nxt, ref, v, query)
        if nxt.base is not base:
            assert len(f.extensions) == MAX_EXTENSIONS and not nxt.extensions
            check(f, ref, v - 1, query)  # the copy wrote nothing the previous view reads
            break
        assert len(nxt.extensions) >= len(f.extensions)
        f = nxt
    else:
        raise AssertionError("never reached MAX_EXTENSIONS")
    pk3, pv3 = rows(rng, 5, keys, fresh=5)
    v3 = f.patched(pk3, pv3, 99)
    ref.versions[99] = {**ref.versions[v - 1], **dict(zip(pk3.tolist(), pv3))}  # patched on version v - 1
    f3 = v3.folded(in_place=False)  # a copy: one base holding the extensions' rows too
    assert f3.base is not base and not f3.extensions
    check(f3, ref, 99, np.concatenate([query, pk3]))


def test_merge_into_an_extension_under_readers_never_shows_a_newer_row():
    """As the in-place test above, with the merge writing an extension: readers of the
    current version and of the one loaded on it, while new keys land in the extension
    and rows of the base and the extension are overwritten."""
    rng = np.random.default_rng(8)
    keys, values = rows(rng, 0, fresh=100_000)
    ref = Offline(keys, values)
    v0 = VersionView.of_base(keys, values, 0)
    room = int(MAX_LOAD * v0.base.capacity) - v0.base.count
    p1k, p1v = rows(rng, 2000, keys, fresh=room + 1000)
    v1 = v0.patched(p1k, p1v, 1)
    ref.apply(1, p1k, p1v)
    f1 = v1.folded()
    assert len(f1.extensions) == 1
    p2k, p2v = rows(rng, 20_000, np.concatenate([keys, p1k]), fresh=1500)
    v2 = f1.patched(p2k, p2v, 2)
    ref.apply(2, p2k, p2v)
    p3k, p3v = rows(rng, 5000, p2k, fresh=1000)
    v3 = v2.patched(p3k, p3v, 3)
    ref.apply(3, p3k, p3v)
    f1.retire()
    v1.retire()
    v0.retire()
    query = np.concatenate([p2k[:4000], p3k[:2000], p1k[-2000:], keys[:2000]])
    folded = fold_under_readers(v2, {2: v2, 3: v3}, ref, query)
    assert folded.base is v0.base and len(folded.extensions) == 1
    check(folded, ref, 2, query)
    check(v3, ref, 3, query)


def test_bad_patches_raise():
    keys, values = rows(np.random.default_rng(6), 0, fresh=50)
    v = VersionView.of_base(keys, values, 1)
    with pytest.raises(ValueError, match="duplicate"):
        v.patched(np.array([3, 3], np.uint64), np.zeros((2, DIM), np.float32), 2)
    with pytest.raises(ValueError, match="values must be"):
        v.patched(np.array([3], np.uint64), np.zeros((1, DIM + 1), np.float32), 2)
    many = v
    with pytest.raises(ValueError, match="at most 16 tables"):
        for i in range(16):
            many = many.patched(np.array([1000 + i], np.uint64), np.ones((1, DIM), np.float32), 2 + i)
    assert len(many.overlays) == 15
    vals, found = many.folded().lookup(np.array([1000, 1014], np.uint64))
    assert found.all() and (vals == 1).all()
    with pytest.raises(ValueError, match="do not fit"):
        v.base.merge(np.arange(1, 1000, dtype=np.uint64), np.ones((999, DIM), np.float32))


def test_versions_fold_waits_for_retired_views_else_copies():
    """``Versions._fold``: in place once retired views are unpinned; a view pinned past
    ``unpin_timeout_s`` makes it copy, so that view's answers never change."""
    rng = np.random.default_rng(7)
    keys, values = rows(rng, 0, fresh=2000)
    ref = Offline(keys, values)
    vs = Versions("d", 0, 1)
    v0 = VersionView.of_base(keys, values, 0)
    pk, pv = rows(rng, 100, keys, fresh=50)
    ref.apply(1, pk, pv)
    cur, prev = Slot(v0.patched(pk, pv, 1), 1, [0, 1], []), Slot(v0, 0, [0], [])
    vs.served = (cur, prev)
    assert vs._fold() is cur  # a previous version is served: nothing merged
    vs.served = (cur, None)
    prev.t.buf[0] += 1  # a lookup of version 0 still in progress
    vs._retire(prev)
    vs.unpin_timeout_s = 0.01
    folded = vs._fold()
    assert vs.served[0] is folded and folded.t.base is not v0.base and vs.merges == {"in_place": 0, "copied": 1}
    prev.t.buf[0] -= 1
    query = np.concatenate([keys, pk])
    check(folded.t, ref, 1, query)
    prev.t.buf[1] = 0  # un-retire only to read it: version 0 was left untouched
    check(prev.t, ref, 0, query)
    pk2, pv2 = rows(rng, 100, keys, fresh=50)
    ref.apply(2, pk2, pv2)
    nxt = Slot(folded.t.patched(pk2, pv2, 2), 2, [0, 1, 2], [])
    vs.served = (nxt, None)
    vs._retire(folded)
    f2 = vs._fold()
    assert f2.t.base is folded.t.base and vs.merges["in_place"] == 1
    check(f2.t, ref, 2, np.concatenate([query, pk2]))


def test_evicted_keys_deleted_by_zero_rows_reuse_their_slots_under_readers():
    """A patch deletes keys with zero rows (feasigns the trainer evicted): the version
    misses them, the version before still answers them, a merge in place under readers
    leaves dead slots that the next new keys reuse (the table's slots stay the same), a
    deleted key comes back with a later row, and a zero row of a key never held changes
    nothing."""
    rng = np.random.default_rng(11)
    keys, values = rows(rng, 0, fresh=20_000)
    ref = Offline(keys, values)
    v0 = VersionView.of_base(keys, values, 0)
    gone = rng.choice(keys, 3000, replace=False)
    absent = rng.integers(1 << 62, 1 << 63, 200, dtype=np.uint64)
    upd = rng.choice(np.setdiff1d(keys, gone), 500, replace=False)
    pk = np.concatenate([gone, absent, upd])
    pv = np.concatenate([np.zeros((len(gone) + len(absent), DIM), np.float32),
                         rng.standard_normal((len(upd), DIM)).astype(np.float32)])
    v1 = v0.patched(pk, pv, 1)
    ref.apply(1, pk, pv)
    query = np.concatenate([gone[:1000], absent[:50], upd[:200], keys[:1000]])
    check(v0, ref, 0, query)
    check(v1, ref, 1, query)
    assert len(v1) == len(keys) - len(gone)
    used = v0.base.used
    v0.retire()
    p2k, p2v = rows(rng, 0, fresh=2000)  # new keys: they take dead slots
    back = gone[:100]  # evicted keys admitted again
    p2k, p2v = np.concatenate([p2k, back]), np.concatenate([p2v, np.ones((100, DIM), np.float32)])
    v2 = v1.patched(p2k, p2v, 2)
    ref.apply(2, p2k, p2v)
    folded = fold_under_readers(v1, {1: v1, 2: v2}, ref, np.concatenate([query, p2k[:500]]))
    check(folded, ref, 1, query)
    assert folded.base is v0.base and not folded.extensions
    assert folded.base.used == used and folded.base.count == len(keys) - len(gone)
    v1.retire()
    f2 = v2.folded()
    check(f2, ref, 2, np.concatenate([query, p2k]))
    assert f2.base is v0.base and not f2.extensions
    # the keys back take their own dead slots, and new keys the dead slots on their probe
    # chains (15 % of the slots are dead: a fifth of them find one)
    assert f2.base.used - used <= len(p2k) - len(back) - 200
    assert f2.base.count == len(keys) - len(gone) + len(p2k)
    copied = v2.folded(in_place=False)  # a copy leaves the dead keys out
    check(copied, ref, 2, np.concatenate([query, p2k]))
    assert copied.base.used == copied.base.count == len(ref.versions[2])


def test_deletions_keep_a_churning_table_from_growing():
    """Every patch deletes 5 % of the keys and adds as many new ones (the steady state of a
    table under a time to live): in 30 patches merged in place the view's slots never pass
    1.1x a fresh table's, because dead slots are reused and, once they are worth an
    extension, a copy (without them) replaces the extension."""
    rng = np.random.default_rng(12)
    keys, values = rows(rng, 0, fresh=40_000)
    view = VersionView.of_base(keys, values, 0)
    live, fresh_slots, copies = keys, view.base.capacity, 0
    for v in range(1, 31):
        gone = rng.choice(live, 2000, replace=False)
        new, nv = rows(rng, 0, fresh=2000)
        pk = np.concatenate([gone, new])
        pv = np.concatenate([np.zeros((len(gone), DIM), np.float32), nv])
        base = view.base
        view = view.patched(pk, pv, v).folded()
        copies += view.base is not base
        live = np.union1d(np.setdiff1d(live, gone), new)
        assert len(view) == len(live)
        slots = view.base.capacity + sum(e.capacity for e in view.extensions)
        assert slots <= 1.1 * fresh_slots, (v, slots, fresh_slots)
    vals, found = view.lookup(live)
    assert found.all() and vals.any(axis=1).all()
    assert 1 <= copies <= 10
