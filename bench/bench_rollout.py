"""Rollout time: donefile line -> every instance of S shards x R replicas enabled.

Starts, as processes on 127.0.0.1, a file server, S x R cube servers + agents and the
transfer (``runtime.local.cube.LocalCubeCluster``; the transfer reads ROOT
through the file server: JSON listing, input download, token PUT of the shard tars;
agents download over HTTP). Writes one version of ``--keys`` random uint64 keys x
``--dim`` float32 as SequenceFiles (the trainer's export layout), then appends its
donefile line and measures the wall time (s) until the transfer's ``/dict/info`` reports
that version served by every instance. The transfer polls the donefile every
``--poll-seconds`` s, which is part of the measured time.

Then, in the same run, a patch: ``--patch-fraction`` of the keys (1%: half of them new
values for existing keys, half new keys) as the next version's SequenceFiles and a
``patch.txt`` line on that base, timed the same way (the cube builds a delta dict and the
servers apply it over the base); the patched and untouched keys are checked.

Then a shard-count change of the served chain (base + patch), as ``pulumi up`` with a new
``cubeShards`` does it: a layout of ``--relayout-shards`` shards x R
replicas is started beside the serving one (empty), the transfer restarted on its
topology with the same work dir; ``relayout_seconds`` is the wall time from the restart
until ``/dict/info`` announces the served version laid out for the new shard count (the
chain rebuilt for it and enabled on every new instance: what a new serving pod's
readiness waits for), while the old layout keeps serving; then the old layout is
stopped and the patched and untouched keys are checked on the new one.

``--patch-sizes 20000,200000,1000000``: instead of the single patch and the re-layout,
patches of those row counts (half new values of base keys, half new keys), each on the
version before, timed the same way; for each, every cube server's RSS serving before it
(``VmRSS``) and its peak while the patch is downloaded, loaded, enabled (``VmHWM`` after
resetting it through ``/proc/<pid>/clear_refs``, and ``VmRSS`` sampled every 10 ms), and
the largest ratio peak / serving over the servers (and peak / RSS serving the base alone:
a server that keeps older copies shows it there). Line: ``rollout_patches keys=<n>
shards=<S> replicas=<R> base_seconds=<s> serving_rss_mib=<n> patch_<rows>_s=<s>
patch_<rows>_rss_ratio=<r> patch_<rows>_rss_ratio_to_base=<r> ...``.

Prints the transfer's phase durations, the value checks of a sample of keys, and one line:
``rollout keys=<n> shards=<S> replicas=<R> seconds=<s> patch_keys=<n> patch_seconds=<s>
relayout_shards=<S'> relayout_seconds=<s>`` (target on the 2-core machine: <= 15 s for
the 1M keys x 10 float32 base, 2 x 2).

Usage: ``python bench/bench_rollout.py [--keys 1000000 --dim 10 --shards 2 --replicas 2]
[--patch-sizes 20000,200000,1000000]``
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.local.cube import LocalCubeCluster  # noqa: E402
from runtime.cube.client import CubeClient  # noqa: E402
from runtime.formats.seqfile_writer import write_sequence_file  # noqa: E402


def run_rollout_bench(keys: int = 1_000_000, dim: int = 10, shards: int = 2, replicas: int = 2,
                      parts: int = 4, poll_interval_s: float = 0.2, workdir: str | None = None,
                      seed: int = 0, patch_fraction: float = 0.01, relayout_shards: int | None = None,
                      patch_sizes: list[int] | None = None) -> dict:
    """Runs the measurement; returns ``{"keys", "dim", "shards", "replicas", "seconds",
    "phases" (s per phase, from the transfer's history), "transfer_seconds", "patch_keys",
    "patch_seconds", "patch_phases", "relayout_shards", "relayout_seconds",
    "relayout_links" (per re-laid link: version, mode, s), "old_layout_stopped_seconds"
    (restart -> old layout stopped)}``; with ``patch_sizes``: ``"patches"`` (per size: rows,
    seconds, phases, serving_rss_mib, peak_rss_mib, rss_ratio, rss_ratio_to_base) instead
    of the patch and the re-layout (``patch_series``). No patch when ``patch_fraction`` is 0; no
    re-layout when ``relayout_shards`` is 0 or equals ``shards``; default ``shards + 1``).
    Raises ``AssertionError`` if the sampled values read back through CubeClient differ."""
    tmp = Path(workdir or tempfile.mkdtemp(prefix="bench_rollout_"))
    try:
        rng = np.random.default_rng(seed)
        k = np.unique(rng.integers(1, 1 << 63, keys + keys // 100, dtype=np.uint64))[:keys]
        rng.shuffle(k)
        v = rng.standard_normal((len(k), dim)).astype(np.float32)
        root = tmp / "root"
        vid = int(time.time())
        sparse = root / "versions" / str(vid) / "sparse"
        sparse.mkdir(parents=True)
        for i, sl in enumerate(np.array_split(np.arange(len(k)), parts)):
            write_sequence_file(sparse / f"part-{i:05d}", k[sl], v[sl])
        with LocalCubeCluster(tmp / "run", root, shards=shards, replicas=replicas,
                              poll_interval_s=poll_interval_s) as c:
            t0 = time.monotonic()
            c.publish_version(vid, vid, dim=dim, count=len(k))
            t1 = c.wait_version(vid, timeout_s=300, poll_s=0.02)
            seconds = t1 - t0
            hist = requests.get(f"{c.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
            last = hist[-1]
            with CubeClient.from_topology(c.topology, timeout_ms=5000) as client:
                idx = rng.choice(len(k), 10_000, replace=False)
                res = client.seek(k[idx])
                assert res.version == vid and res.found.all(), "keys missing after the rollout"
                np.testing.assert_array_equal(res.values, v[idx])
            out = {"keys": len(k), "dim": dim, "shards": shards, "replicas": replicas,
                   "seconds": round(seconds, 3), "phases": last.get("phases"),
                   "transfer_seconds": last.get("seconds"), "patch_keys": 0, "patch_seconds": None}
            if patch_sizes:
                out.update(patch_series(c, root, vid, k, v, patch_sizes, dim, rng))
                return out
            n_patch = int(len(k) * patch_fraction)
            if n_patch:
                changed = rng.choice(len(k), n_patch - n_patch // 2, replace=False)
                new = np.setdiff1d(np.unique(rng.integers(1, 1 << 63, n_patch, dtype=np.uint64)), k)[:n_patch // 2]
                pk = np.concatenate([k[changed], new])
                pv = rng.standard_normal((len(pk), dim)).astype(np.float32)
                pid = vid + 1
                psparse = root / "versions" / str(pid) / "sparse"
                psparse.mkdir(parents=True)
                write_sequence_file(psparse / "part-00000", pk, pv)
                t0 = time.monotonic()
                c.publish_version(pid, vid, patch=True, dim=dim, count=len(pk))
                t1 = c.wait_version(pid, timeout_s=300, poll_s=0.02)
                hist = requests.get(f"{c.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
                with CubeClient.from_topology(c.topology, timeout_ms=5000) as client:
                    res = client.seek(pk)
                    assert res.version == pid and res.found.all(), "patched keys missing"
                    np.testing.assert_array_equal(res.values, pv)
                    untouched = np.setdiff1d(np.arange(len(k)), changed)[:10_000]
                    res = client.seek(k[untouched])
                    np.testing.assert_array_equal(res.values, v[untouched])
                out.update(patch_keys=int(len(pk)), patch_seconds=round(t1 - t0, 3),
                           patch_phases=hist[-1].get("phases"), patch_transfer_seconds=hist[-1].get("seconds"))
            else:
                pk, pv, changed, pid = k[:0], v[:0], np.empty(0, np.int64), vid
            n_new = shards + 1 if relayout_shards is None else relayout_shards
            out.update(relayout_shards=None, relayout_seconds=None)
            if n_new and n_new != shards:
                out.update(relayout(c, n_new, replicas, pid, k, v, pk, pv, changed, rng))
        return out
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """``field`` of ``/proc/<pid>/status`` in MiB (0 when the process is gone)."""
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith(field + ":"):
                return int(ln.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PeakRss:
    """Peak RSS (MiB) of ``pids`` from ``start()`` to ``stop()``: ``VmHWM`` after writing
    5 to ``/proc/<pid>/clear_refs`` (resets it to the current RSS), and ``VmRSS`` sampled
    every ``every_s`` s (in case the reset is not allowed). ``stop()`` returns {pid: MiB}."""

    def __init__(self, pids, every_s: float = 0.01):
        self.pids, self.every_s = list(pids), every_s
        self.peak = {p: 0.0 for p in self.pids}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "PeakRss":
        for p in self.pids:
            try:
                Path(f"/proc/{p}/clear_refs").write_text("5")
            except OSError:
                pass
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in self.pids:
                self.peak[p] = max(self.peak[p], rss_mib(p))
            time.sleep(self.every_s)

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._t.join()
        return {p: max(self.peak[p], rss_mib(p), rss_mib(p, "VmHWM")) for p in self.pids}


def patch_series(c: LocalCubeCluster, root: Path, vid: int, k, v, sizes, dim: int, rng) -> dict:
    """Patches of ``sizes`` rows on cluster ``c`` serving base ``vid`` (``k``/``v``), each
    on the version before: seconds, Reloading seconds and RSS ratio per size (module
    docstring). Raises ``AssertionError`` if a patched value read back differs."""
    pids = [r.proc.pid for r in c.servers.values()]
    out, prev = [], vid
    time.sleep(1.0)
    base_rss = {p: rss_mib(p) for p in pids}  # serving the base alone
    for i, n in enumerate(sizes):
        changed = rng.choice(len(k), n - n // 2, replace=False)
        new = rng.integers(1, 1 << 63, n // 2, dtype=np.uint64)
        pk = np.unique(np.concatenate([k[changed], new]))
        pv = rng.standard_normal((len(pk), dim)).astype(np.float32)
        pid = vid + 1 + i
        psparse = root / "versions" / str(pid) / "sparse"
        psparse.mkdir(parents=True)
        for j, sl in enumerate(np.array_split(np.arange(len(pk)), max(1, len(pk) // (1 << 20) + 1))):
            write_sequence_file(psparse / f"part-{j:05d}", pk[sl], pv[sl])
        time.sleep(1.0)  # let the servers settle (freed memory returned) before the serving figure
        serving = {p: rss_mib(p) for p in pids}
        peak = PeakRss(pids).start()
        t0 = time.monotonic()
        c.publish_version(pid, vid, patch=True, dim=dim, count=len(pk))
        t1 = c.wait_version(pid, timeout_s=900, poll_s=0.02)
        peaks = peak.stop()
        hist = requests.get(f"{c.transfer_url}/dict/deploy/history", timeout=5).json()["history"][-1]
        with CubeClient.from_topology(c.topology, timeout_ms=5000) as client:
            sample = rng.choice(len(pk), min(len(pk), 10_000), replace=False)
            res = client.seek(pk[sample])
            assert res.version == pid and res.found.all(), "patched keys missing"
            np.testing.assert_array_equal(res.values, pv[sample])
        ratio = max(peaks[p] / serving[p] for p in pids if serving[p] > 0)
        to_base = max(peaks[p] / base_rss[p] for p in pids if base_rss[p] > 0)
        out.append({"rows": int(len(pk)), "seconds": round(t1 - t0, 3), "phases": hist.get("phases"),
                    "serving_rss_mib": round(max(serving.values())), "peak_rss_mib": round(max(peaks.values())),
                    "rss_ratio": round(ratio, 3), "rss_ratio_to_base": round(to_base, 3)})
        print(f"patch {len(pk):>8} rows after v{prev}: {t1 - t0:6.2f} s, phases {json.dumps(hist.get('phases'))}; "
              f"server RSS serving {max(serving.values()):.0f} MiB, peak {max(peaks.values()):.0f} MiB, "
              f"ratio {ratio:.3f} (to the RSS serving the base alone, {max(base_rss.values()):.0f} MiB: "
              f"{to_base:.3f})", flush=True)
        prev = pid
    return {"patches": out}


def relayout(c: LocalCubeCluster, n_new: int, replicas: int, served: int, k, v, pk, pv, changed, rng) -> dict:
    """The shard-count change of the module docstring on cluster ``c`` serving version
    ``served`` (base ``k``/``v``, patch ``pk``/``pv`` over rows ``changed`` of the base).
    Raises ``AssertionError`` if a sampled value read back on the new layout differs."""
    old = c.layout
    gen = c.start_layout(n_new, replicas)
    t0 = time.monotonic()
    c.restart_transfer(gen.topology_path)
    deadline = t0 + 600
    while True:
        c.group.check()
        info = c.info()
        if info.version_for(n_new) == served and info.relayout is None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"re-layout onto {n_new} shards not done after 600 s: {info}")
        time.sleep(0.02)
    seconds = time.monotonic() - t0
    hist = requests.get(f"{c.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
    links = [{"version": h["version"], "mode": h["mode"], "seconds": h.get("seconds"), "phases": h.get("phases")}
             for h in hist if (h.get("reason") or "").startswith("relayout")]
    codes = c.stop_layout(old)  # pulumi deletes the old layout last
    stopped = time.monotonic() - t0
    assert set(codes.values()) == {0}, f"old layout exit codes: {codes}"
    with CubeClient.from_topology(gen.topology, timeout_ms=5000) as client:
        if len(pk):
            res = client.seek(pk)
            assert res.version == served and res.found.all(), "patched keys missing after the re-layout"
            np.testing.assert_array_equal(res.values, pv)
        untouched = np.setdiff1d(rng.choice(len(k), 20_000, replace=False), changed)
        res = client.seek(k[untouched])
        assert res.version == served and res.found.all(), "keys missing after the re-layout"
        np.testing.assert_array_equal(res.values, v[untouched])
    return {"relayout_shards": n_new, "relayout_seconds": round(seconds, 3), "relayout_links": links,
            "old_layout_stopped_seconds": round(stopped, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--parts", type=int, default=4, help="SequenceFile part files (default 4)")
    ap.add_argument("--poll-seconds", type=float, default=0.2, help="transfer donefile poll (s)")
    ap.add_argument("--patch-fraction", type=float, default=0.01, help="keys in the patch / keys in the base")
    ap.add_argument("--relayout-shards", type=int, default=None,
                    help="shard count of the re-layout (default --shards + 1; 0: none)")
    ap.add_argument("--patch-sizes", default="",
                    help="comma-separated patch row counts: the patch series (RSS ratio) instead")
    args = ap.parse_args()
    sizes = [int(x) for x in args.patch_sizes.split(",") if x.strip()]
    r = run_rollout_bench(args.keys, args.dim, args.shards, args.replicas, args.parts, args.poll_seconds,
                          patch_fraction=args.patch_fraction, relayout_shards=args.relayout_shards,
                          patch_sizes=sizes)
    if sizes:
        print("base: transfer phases (s):", json.dumps(r["phases"]), "transfer total (s):", r["transfer_seconds"])
        print(f"rollout_patches keys={r['keys']} shards={r['shards']} replicas={r['replicas']} "
              f"base_seconds={r['seconds']:.2f} serving_rss_mib={r['patches'][0]['serving_rss_mib']} "
              + " ".join(f"patch_{p['rows']}_s={p['seconds']:.2f} patch_{p['rows']}_rss_ratio={p['rss_ratio']:.3f} "
                         f"patch_{p['rows']}_rss_ratio_to_base={p['rss_ratio_to_base']:.3f}" for p in r["patches"]))
        return 0
    print("base: transfer phases (s):", json.dumps(r["phases"]), "transfer total (s):", r["transfer_seconds"])
    if r["patch_keys"]:
        print("patch: transfer phases (s):", json.dumps(r["patch_phases"]), "transfer total (s):",
              r["patch_transfer_seconds"])
        print(f"base {r['keys']} keys: {r['seconds']:.2f} s; patch {r['patch_keys']} keys: {r['patch_seconds']:.2f} s "
              f"({r['seconds'] / max(r['patch_seconds'], 1e-9):.1f}x faster)")
    if r["relayout_seconds"] is not None:
        print(f"re-layout {r['shards']}->{r['relayout_shards']} shards: links", json.dumps(r["relayout_links"]))
        print(f"re-layout of the served chain onto {r['relayout_shards']} shards: {r['relayout_seconds']:.2f} s "
              f"(new layout serving; old layout stopped at {r['old_layout_stopped_seconds']:.2f} s)")
    print(f"rollout keys={r['keys']} shards={r['shards']} replicas={r['replicas']} seconds={r['seconds']:.2f} "
          f"patch_keys={r['patch_keys']} patch_seconds={r['patch_seconds'] if r['patch_seconds'] is not None else 'n/a'} "
          f"relayout_shards={r['relayout_shards'] or 'n/a'} "
          f"relayout_seconds={'n/a' if r['relayout_seconds'] is None else format(r['relayout_seconds'], '.2f')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
