"""The serving benchmarks' shared setup: a synthetic version shaped like the trainer's
export on a local 2-shard cube (``served_version``) and ``elastic-ctr serve`` started over
it and awaited (``start_serving``). Used by ``bench_serving.py`` (``make bench-serving``),
``overload.py`` and ``bench_serving_peers.py`` (``make bench-serving-peers``).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runtime import proc, role_specs, storage  # noqa: E402
from runtime.serving.client import load_rows  # noqa: E402


def make_version(root: Path, vid: int, rows, dim: int = 9, exporter: Path = REPO) -> None:
    """Publishes version ``vid`` under ``root`` with the trainer's export (a seeded head of
    the default widths, an embedding for every feasign of ``rows`` but 1 in 7); ``exporter``:
    the checkout whose export runs (another one publishes a version its own readers take)."""
    keys = np.unique(rows.feasigns.ravel())
    keys = keys[np.arange(len(keys)) % 7 != 0]
    vals = np.random.default_rng(vid % 1000).normal(0, 0.1, (len(keys), dim)).astype(np.float32)
    root.mkdir(parents=True, exist_ok=True)
    np.savez(root / "table.npz", keys=keys, values=vals)
    subprocess.run([sys.executable, "-m", "runtime.trainer.export", "--root", str(root), "--version", str(vid),
                    "--table", str(root / "table.npz"), "--seed", "7"], check=True, capture_output=True, cwd=exporter,
                   env=dict(os.environ, PYTHONPATH=str(exporter)))


@dataclass
class ServedVersion:
    """What ``served_version`` sets up: ``tmp`` (the scratch directory), ``data`` (the
    generated test file, criteo text), ``rows`` (its parsed rows), ``root`` (the version
    root), ``vid`` (the version id) and ``cube`` (a running 2-shard
    ``LocalCubeCluster`` serving ``vid``)."""

    tmp: Path
    data: Path
    rows: object
    root: Path
    vid: int
    cube: object


@contextlib.contextmanager
def served_version(prefix: str, test_rows: int = 4096, rollout_timeout_s: float = 120.0, exporter: Path = REPO):
    """Generated rows (``test_rows`` of them, seed 3), a version published from them
    (``make_version``, id = the current Unix time) and a local cube of 2 shards x 1 replica
    with that version rolled out, in a temporary directory named ``prefix``*; yields a
    ``ServedVersion`` and removes it all on exit. Raises ``TimeoutError`` when the rollout
    takes longer than ``rollout_timeout_s`` (s). ``exporter``: ``make_version``'s."""
    from runtime.local.cube import LocalCubeCluster
    from runtime.trainer import generator

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        tmp = Path(tmp)
        generator.generate(tmp / "data", rows=10, test_rows=test_rows, seed=3)
        data = tmp / "data" / "test.txt"
        rows = load_rows([str(data)], "criteo")
        root = tmp / "root"
        vid = int(time.time())
        make_version(root, vid, rows, exporter=exporter)
        with LocalCubeCluster(tmp / "cube", root, shards=2, replicas=1) as cube:
            cube.wait_version(vid, timeout_s=rollout_timeout_s)
            yield ServedVersion(tmp, data, rows, root, vid, cube)


def start_serving(cube, work_dir: Path, workers: int, threads: int, grpc: bool = True, extra: tuple = (),
                  cube_timeout_ms: float = 2000.0, timeout_s: float = 120.0, name: str = "serving", **start_kw):
    """Starts ``elastic-ctr serve`` on 127.0.0.1 over ``cube`` (a ``LocalCubeCluster``)
    in its process group with ``workers`` worker processes x ``threads`` threads, a cube
    lookup timeout of ``cube_timeout_ms`` (default 2 s: a loaded machine must slow the
    figures down, not fail requests), its ports bound by itself (port 0), gRPC with ``grpc`` (else none) and
    ``extra`` arguments, as the group's role ``name``; ``start_kw`` goes to
    ``ProcessGroup.start`` (env, cwd).
    Returns ``(role, url, grpc_target)`` once ``/v2/health/ready`` answers 200 and the
    gRPC port accepts (``grpc_target`` None without ``grpc``). Raises ``TimeoutError``
    with the log's tail when it is not ready within ``timeout_s`` (s), and what
    ``ProcessGroup.check`` raises when a role of the group exits meanwhile."""
    spec = role_specs.serving(str(cube.topology_path), cube.root_url, cube.transfer_url, str(work_dir),
                              role_specs.LOOPBACK, 0, 0, workers=workers, threads=threads, grpc=grpc,
                              extra=["--cube-timeout-ms", str(cube_timeout_ms), *extra])
    role = cube.group.start(name, spec.argv(), port_file=True, **start_kw)
    deadline = time.monotonic() + timeout_s
    bound = cube.group.bound_ports(role, timeout_s)
    url = f"http://127.0.0.1:{bound['http']}"
    while time.monotonic() < deadline:
        cube.group.check()
        try:
            if storage.session().get(url + role_specs.V2_READY, timeout=2).status_code == 200:
                return role, url, f"127.0.0.1:{bound['grpc']}" if grpc else None
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise TimeoutError(f"serving not ready after {timeout_s:.0f} s:\n{proc.tail(role.log_path)}")
