"""Helpers for the cube data-plane tests: data, builds and in-thread shard servers."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import requests

from runtime.cube.builder import build, part_name
from runtime.formats.seqfile import write_sequence_file
from runtime.cube.server import CubeServer

DICT = "emb"


def make_data(n: int, dim: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` unique random uint64 keys (full 64-bit range) and float32[n, dim] values."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**64 - 1, int(n * 1.1) + 16, dtype=np.uint64, endpoint=True))
    keys = rng.permutation(keys)[:n]
    return keys, rng.random((n, dim), dtype=np.float32)


def build_version(tmp: Path, keys, values, version: int, shard_num: int = 1, mode: str = "base",
                  base_version: int | None = None):
    """Writes one SequenceFile of (keys, values) and builds it; returns the BuildResult."""
    src = Path(tmp) / f"src-{version}"
    src.mkdir(parents=True, exist_ok=True)
    write_sequence_file(src / "part-00000", keys, values)
    return build([str(src)], Path(tmp) / "out", DICT, shard_num, version, mode=mode,
                 base_version=base_version)


def shard_dir(result, shard: int) -> str:
    return str(Path(result.output_dir) / part_name(DICT, shard))


def start_server(shard: int = 0, shard_num: int = 1, **kw) -> CubeServer:
    kw.setdefault("io_mode", os.environ.get("CUBE_TEST_IO_MODE", "epoll"))
    s = CubeServer(shard, shard_num, DICT, host="127.0.0.1", port=0, http_port=0, **kw)
    s.start()
    return s


def http(server: CubeServer) -> str:
    return f"http://127.0.0.1:{server.http_port}"


def wait_loaded(server: CubeServer, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = requests.get(http(server) + "/status", timeout=5).json()
        if st["bg_state"] != "loading":
            return st
        time.sleep(0.02)
    raise TimeoutError("background load did not finish")


def load(server: CubeServer, directory: str, version: int, base_version: int | None = None) -> dict:
    """Starts a background load via HTTP and waits for it; returns the final /status."""
    if base_version is None:
        r = requests.post(http(server) + "/bg_load_base", json={"dir": directory, "version": version}, timeout=5)
    else:
        r = requests.post(http(server) + "/bg_load_patch",
                          json={"dir": directory, "version": version, "base_version": base_version}, timeout=5)
    assert r.status_code == 202, r.text
    return wait_loaded(server)


def enable(server: CubeServer, version: int) -> requests.Response:
    return requests.post(http(server) + "/enable", json={"version": version}, timeout=5)


def load_and_enable(server: CubeServer, directory: str, version: int, base_version: int | None = None):
    st = load(server, directory, version, base_version)
    assert st["bg_state"] == "loaded", st
    r = enable(server, version)
    assert r.status_code == 200, r.text
