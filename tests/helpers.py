"""Helpers shared by the test packages (fixtures that start and stop things live in the
conftest.py files): cube data and in-thread shard servers, in-process stand-ins for the
cube control plane, versions written by the trainer's own export, a fake cube client, and
lookups of rendered manifests."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests
from flask import Flask, jsonify, request

from runtime.cube.buildinfo import part_name
from runtime.cube.builder import build
from runtime.cube.server import CubeServer
from runtime.formats import features
from runtime.formats.seqfile import read_sequence_file
from runtime.formats.seqfile_writer import write_sequence_file
from runtime.web.wsgi import WebServer

# ----------------------------------------------------------------------------- cube data plane
DICT = "emb"


def wait_until(pred, timeout_s: float = 5.0, every_s: float = 0.02) -> bool:
    """Calls ``pred`` every ``every_s`` s until it is true or ``timeout_s`` s have passed;
    returns its last value (as a bool)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return bool(pred())
        time.sleep(every_s)
    return True


def make_data(n: int, dim: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` unique random uint64 keys (full 64-bit range) and float32[n, dim] values."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**64 - 1, int(n * 1.1) + 16, dtype=np.uint64, endpoint=True))
    keys = rng.permutation(keys)[:n]
    return keys, rng.random((n, dim), dtype=np.float32)


def build_version(tmp: Path, keys, values, version: int, shard_num: int = 1, mode: str = "base",
                  base_version: int | None = None):
    """Writes one SequenceFile of (keys, values) and builds it; returns its BuildRecord."""
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


# ----------------------------------------------------------------------------- cube rollouts
def write_version(root, vid, keys, values, parts=2):
    """The trainer's export layout: ROOT/versions/<vid>/sparse/part-NNNNN SequenceFiles."""
    sparse = root / "versions" / str(vid) / "sparse"
    sparse.mkdir(parents=True, exist_ok=True)
    for i, sl in enumerate(np.array_split(np.arange(len(keys)), parts)):
        write_sequence_file(sparse / f"part-{i:05d}", keys[sl], values[sl])
    return sorted(sparse.iterdir())


def table_from_files(files) -> dict[int, np.ndarray]:
    out = {}
    for f in files:
        k, v = read_sequence_file(str(f))
        out.update(zip(k.tolist(), v))
    return out


def check_all(client, expected: dict[int, np.ndarray], version: int) -> None:
    keys = np.fromiter(expected.keys(), np.uint64, len(expected))
    want = np.stack([expected[k] for k in keys.tolist()])
    res = client.seek(keys)
    assert res.version == version
    assert res.found.all(), f"{(~res.found).sum()} keys missing"
    np.testing.assert_array_equal(res.values, want)
    missing = client.seek(np.array([1, 3, 5], np.uint64) + np.uint64(1 << 62))
    assert not missing.found.any() and not missing.values.any()


# ----------------------------------------------------------------------------- cube control plane
class ThreadedApp:
    """Serves ``app`` on ``127.0.0.1:<free port>`` in a daemon thread; ``url`` is its base."""

    def __init__(self, app):
        self.server = WebServer(app, threads=8, name="test").start()
        self.port = self.server.port
        self.url = self.server.url

    def close(self) -> None:
        self.server.stop()


class FakeServer:
    """In-memory cube server control plane. ``fail_load``: versions whose load fails;
    ``load_delay_s``: seconds a load takes. ``loads``: dirs loaded, in order."""

    def __init__(self, shard: int = 0, load_delay_s: float = 0.0, shard_num: int = 2):
        self.shard = shard
        self.shard_num = shard_num
        self.version = None
        self.prev_version = None
        self.bg_version = None
        self.bg_state = "empty"
        self.bg_error = None
        self.keys = 0
        self.lineage: list[int] = []
        self.bg_lineage: list[int] = []
        self.fail_load: set[int] = set()
        self.load_delay_s = load_delay_s
        self.loads: list[str] = []
        self.enables: list[int] = []
        self.unloads = 0
        self.lock = threading.Lock()
        self.app = self._make_app()
        self.http = ThreadedApp(self.app)
        self.url = self.http.url

    def status(self) -> dict:
        return {"shard": self.shard, "shard_num": self.shard_num, "dict_name": "d", "version": self.version,
                "prev_version": self.prev_version, "bg_version": self.bg_version,
                "bg_state": self.bg_state, "bg_error": self.bg_error, "keys": self.keys, "dim": 2,
                "lineage": list(self.lineage)}

    def _load(self, d: str, version: int) -> None:
        time.sleep(self.load_delay_s)
        with self.lock:
            if self.bg_version != version:
                return
            if version in self.fail_load or not Path(d).is_dir():
                self.bg_state, self.bg_error = "failed", f"cannot load {d}"
                return
            meta = Path(d) / "meta.json"
            if meta.exists():
                m = json.loads(meta.read_text())
                if (m["shard"], m["shard_num"], m["version"]) != (self.shard, self.shard_num, version):
                    self.bg_state, self.bg_error = "failed", (
                        f"{d} holds shard {m['shard']}/{m['shard_num']} version {m['version']}, expected "
                        f"{self.shard}/{self.shard_num} version {version}")
                    return
            self.loads.append(d)
            self.bg_state = "loaded"

    def _make_app(self) -> Flask:
        app = Flask("fake-cube-server")

        @app.get("/status")
        def status():
            with self.lock:
                return jsonify(self.status())

        @app.post("/bg_load_base")
        @app.post("/bg_load_patch")
        def bg_load():
            b = request.get_json()
            if request.path.endswith("patch") and b.get("base_version") != self.version:
                return jsonify(error=f"base {b.get('base_version')} is not served ({self.version})"), 409
            with self.lock:
                self.bg_version, self.bg_state, self.bg_error = int(b["version"]), "loading", None
                patch = request.path.endswith("patch")
                self.bg_lineage = (self.lineage if patch else []) + [int(b["version"])]
            threading.Thread(target=self._load, args=(b["dir"], int(b["version"])), daemon=True).start()
            return jsonify(ok=True), 202

        @app.post("/enable")
        def enable():
            v = int(request.get_json()["version"])
            with self.lock:
                if self.bg_version != v or self.bg_state != "loaded":
                    if self.version == v:
                        return jsonify(version=v, changed=False)
                    return jsonify(error=f"version {v} is not loaded"), 409
                self.prev_version, self.version = self.version, v
                self.lineage = self.bg_lineage
                self.bg_version, self.bg_state = None, "empty"
                self.enables.append(v)
            return jsonify(ok=True)

        @app.post("/bg_unload")
        def bg_unload():
            with self.lock:
                self.bg_version, self.bg_state, self.bg_error = None, "empty", None
                self.unloads += 1
            return jsonify(ok=True)

        return app

    def restart(self, shard_num: int | None = None) -> None:
        """As if the server process restarted (empty), with ``--shard-num shard_num``."""
        with self.lock:
            if shard_num is not None:
                self.shard_num = shard_num
            self.version = self.prev_version = self.bg_version = self.bg_error = None
            self.bg_state, self.keys, self.lineage, self.bg_lineage = "empty", 0, [], []
            self.loads, self.enables = [], []

    def close(self) -> None:
        self.http.close()


# ----------------------------------------------------------------------------- serving
SERVING_DIM = 4
LAYERS = (16,)
#: the two versions the serving tests publish
V1, V2 = 1_700_000_001, 1_700_000_002


def publish(root, version: int) -> None:
    """Appends ``version``'s base line to ``root``'s donefile (its files must be there)."""
    from runtime.formats import donefile

    donefile.append(str(root), "base", donefile.base_record(version, dim=SERVING_DIM, count=1))


def export_version(root: Path, version: int, table: dict, seed: int, layers=LAYERS, base: int | None = None) -> Path:
    """Publishes ``version`` under ``root`` (its embeddings: ``table``, feasign ->
    float32[dim]) with the trainer's export, as a patch of ``base`` when given; returns
    its dense directory."""
    keys = np.array(sorted(table), dtype=np.uint64)
    values = np.stack([table[int(k)] for k in keys]).astype(np.float32)
    npz = Path(root) / f".table-{version}.npz"
    Path(root).mkdir(parents=True, exist_ok=True)
    np.savez(npz, keys=keys, values=values)
    r = subprocess.run([sys.executable, "-m", "runtime.trainer.export", "--root", str(root), "--version",
                        str(version), "--seed", str(seed), "--table", str(npz), "--layers", ",".join(map(str, layers)),
                        *(["--base", str(base)] if base is not None else [])],
                       capture_output=True, text=True, timeout=180, env=dict(os.environ, GLOG_minloglevel="2"))
    npz.unlink()
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(root) / "versions" / str(version) / "dense"


def make_table(rows_feasigns: np.ndarray, seed: int, dim: int = SERVING_DIM, drop_every: int = 7) -> dict:
    """Random embeddings for the feasigns of some rows (every ``drop_every``-th key left
    out, so lookups also meet missing keys)."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rows_feasigns.ravel())
    return {int(k): rng.normal(0, 0.5, dim).astype(np.float32) for i, k in enumerate(keys) if i % drop_every}


@contextlib.contextmanager
def cube_serving_lines(tmp: Path, lines: list[str], version: int, shards: int = 1):
    """A version exported from the Criteo ``lines`` (``make_table``'s embeddings for their
    feasigns) rolled out to a local cube of ``shards`` x 1 replica under ``tmp``: yields
    ``(cube, batch)`` (``runtime.local.cube.LocalCubeCluster``, the parsed lines)."""
    from runtime.local.cube import LocalCubeCluster

    batch = features.parse_criteo_lines(lines)
    root = tmp / "root"
    export_version(root, version, make_table(batch.feasigns, 3), seed=5)
    with LocalCubeCluster(tmp / "cube", root, shards=shards, replicas=1) as cube:
        cube.wait_version(version, timeout_s=120)
        yield cube, batch


def serving_args(cube, work_dir: Path, workers: int, threads: int, extra: tuple[str, ...] = (),
                 port: int = 0, grpc_port: int = 0) -> list[str]:
    """``elastic-ctr serve``'s arguments on 127.0.0.1 over ``cube`` (a ``LocalCubeCluster``),
    from the role's spec (``runtime.role_specs.serving``); ports 0 by default (serving binds
    them: start it with ``port_file`` and read them with ``ProcessGroup.bound_ports``)."""
    from runtime import role_specs

    return list(role_specs.serving(str(cube.topology_path), cube.root_url, cube.transfer_url, str(work_dir),
                                   host="127.0.0.1", port=port, grpc_port=grpc_port, workers=workers,
                                   threads=threads, extra=extra).args)


@contextlib.contextmanager
def refusing_ports(n: int = 1):
    """``n`` ports of 127.0.0.1 that refuse every connection while the block runs (each
    bound by a socket that never listens, so no process can take it meanwhile): the
    address of a peer that is down. Yields the list of port numbers."""
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def restore_environ(saved: dict) -> None:
    """Puts back the environment variables ``saved`` recorded (name -> value, None: was
    unset), after a session fixture changed them for the processes it starts."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def start_serving(cube, work_dir: Path, ready=None, workers: int = 1, threads: int = 2,
                  timeout_s: float = 120.0) -> str:
    """Starts ``elastic-ctr serve`` (from its role spec) over ``cube`` (a
    ``LocalCubeCluster``) in the cube's process group, on ports it binds itself, and waits
    until ``ready(url)`` is true (default: ``/v2/health/ready`` answers 200). Returns its
    base URL. Raises ``proc.RoleFailed`` when a role exits, ``AssertionError`` after
    ``timeout_s`` s."""
    from runtime import proc

    role = cube.group.start("serving", proc.self_command() + serving_args(cube, work_dir, workers=workers,
                                                                           threads=threads), port_file=True)
    url = f"http://127.0.0.1:{cube.group.bound_ports(role, timeout_s)['http']}"
    ready = ready or (lambda u: requests.get(u + "/v2/health/ready", timeout=2).status_code == 200)
    deadline = time.monotonic() + timeout_s
    while True:
        cube.group.check()
        try:
            if ready(url):
                return url
        except (requests.ConnectionError, requests.Timeout):
            pass
        assert time.monotonic() < deadline, "serving not ready"
        time.sleep(0.2)


class PredictLoad:
    """``threads`` clients POSTing ``{"lines": lines}`` to ``url``'s ``/predict`` back to back
    (10 ms apart) from ``start()`` to ``stop()``: each answer's ``(model version,
    probabilities)`` goes to ``on_answer`` (an ``AssertionError`` it raises counts as a
    failure); ``errors`` holds every failure (HTTP status, connection error)."""

    def __init__(self, url: str, lines: list[str], on_answer, threads: int = 2):
        self.url, self.lines, self.on_answer = url, lines, on_answer
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def start(self) -> "PredictLoad":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _run(self) -> None:
        s = requests.Session()
        while not self._stop.is_set():
            try:
                r = s.post(self.url + "/predict", json={"lines": self.lines}, timeout=10)
                if r.status_code != 200:
                    self.errors.append(f"HTTP {r.status_code}: {r.text[:200]}")
                    continue
                body = r.json()
                self.on_answer(int(body["model_version"]), body["probabilities"])
            except (requests.RequestException, AssertionError) as exc:
                self.errors.append(repr(exc)[:300])
            time.sleep(0.01)


class FakeCube:
    """In-memory stand-in for ``runtime.cube.client.CubeClient``: tables per version.

    ``seek(keys, version)`` -> object with ``values`` float32[m,dim] (zeros where
    missing), ``found`` bool[m], ``version``. Raises ``ConnectionError`` when ``down``
    or the version is not held. Records (version, number of keys) per call in ``calls``.
    """

    def __init__(self, tables: dict[int, dict], dim: int = SERVING_DIM):
        self.tables = tables
        self.dim = dim
        self.down = False
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def seek(self, keys: np.ndarray, version: int | None = None):
        if self.down:
            raise ConnectionError("no replica of shard 0 answers")
        if version is None:
            version = max(self.tables)
        if version not in self.tables:
            raise ConnectionError(f"version {version} not held")
        t = self.tables[version]
        vals = np.zeros((len(keys), self.dim), np.float32)
        found = np.zeros(len(keys), bool)
        for i, k in enumerate(keys.tolist()):
            v = t.get(k)
            if v is not None:
                vals[i] = v
                found[i] = True
        with self.lock:
            self.calls.append((version, len(keys)))

        class R:
            pass

        r = R()
        r.values, r.found, r.version = vals, found, version
        return r


def offline_predict(model_dir: Path, table: dict, dense_raw: np.ndarray, fs: np.ndarray) -> np.ndarray:
    """Predictions of an exported dense model for rows, computed without serving:
    embeddings from ``table`` (missing = 0), the model's predictor directly. float32[n]."""
    from runtime.inference import DensePredictor

    pred = DensePredictor(model_dir)
    n, dim = fs.shape[0], pred.dim
    emb = np.stack([table.get(int(k), np.zeros(dim, np.float32)) for k in fs.T.ravel()]).astype(np.float32)
    return pred.predict(features.normalize_dense(dense_raw), emb.reshape(fs.shape[1] * n, dim)).ravel()


class CliProcess:
    """``elastic-ctr <argv>`` (``python -m runtime.cli``) as a subprocess with one math
    thread, its merged stdout/stderr collected line by line by a thread."""

    def __init__(self, argv: list[str], cwd: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                     env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout_s: float = 120.0) -> None:
        """Waits until a line contains ``needle``; AssertionError with the last lines if not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not any(needle in ln for ln in self.lines):
            time.sleep(0.1)
        assert any(needle in ln for ln in self.lines), f"no {needle!r} in:\n" + "".join(self.lines[-30:])

    def wait(self, timeout_s: float = 120.0) -> int:
        """The exit code (waits for the output to be read too)."""
        rc = self.proc.wait(timeout=timeout_s)
        self._reader.join(5)
        return rc

    def stop(self) -> None:
        """Stops the process if it still runs (SIGTERM, then SIGKILL after 10 s): a test that
        failed half way leaves nothing behind."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# ----------------------------------------------------------------------------- rendered manifests
#: the Kubernetes version manifests are validated against (kubernetes-validate 1.37.0
#: ships schemas 1.25-1.37); the oldest release the stack supports.
K8S_VERSION = "1.31.0"


def flag(args: list[str], name: str) -> str:
    """The value after ``name`` in a container's ``args``; AssertionError if absent."""
    assert name in args, f"{name} not in {args}"
    return args[args.index(name) + 1]
