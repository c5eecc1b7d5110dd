"""In-process stand-ins for the cube control plane's tests (agent, transfer).

``FakeServer``: a cube server's HTTP control API (docs/contracts.md, "Cube internals")
held in memory: ``bg_load_*`` "loads" a directory (a ``meta.json`` in it, when there is
one, must name this server's ``shard``/``shard_num`` and the version, as the real server
checks a dict's meta), ``enable`` switches versions (200 for the version already served
when the background slot does not hold it, as the real server). ``restart(shard_num)``
is a server restarted empty, possibly with a new ``--shard-num``. ``ThreadedApp`` serves any
WSGI app on 127.0.0.1 in a thread (``runtime.webserver``, as the roles do), stopped by ``close()``.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from flask import Flask, jsonify, request

from runtime.webserver import WebServer


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
