"""``CubeServer``: one shard of one dict, its data plane (``lookups.py``: ``LookupServer``),
versions (``versions.py``) and HTTP control app (``app.py``) put together, with their lifecycle."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from runtime.cube import protocol
from runtime.role_specs import ANY_HOST, PORTS
from runtime.cube.kernel import KERNEL
from runtime.cube.server.app import create_control_app
from runtime.cube.server.lookups import LookupServer, warm_kernel
from runtime.cube.server.versions import Versions

log = logging.getLogger(__name__)


class CubeServer:
    """One shard server: shard ``shard`` of ``shard_num`` of dict ``dict_name``.

    ``port``: the data plane's TCP port, ``http_port``: the control app's (0 = any free;
    after ``start()`` both hold the bound ports). ``data_dir``: where the enabled chain is
    recorded (``versions.py``; None: not recorded). ``max_keys``: largest batch accepted.
    ``verify``: check dicts' crc32 on load. ``io_mode``: "epoll" or "threads". ``guard``: the
    control app's credential check (``runtime.auth.Guard``; None: none). ``load_roots``:
    the directories loads may come from (``Versions``; None: any). Raises
    ``ValueError`` for a shard out of range or another ``io_mode``. ``start()`` binds both
    ports and starts the threads; ``stop()`` closes them."""

    def __init__(self, shard: int, shard_num: int, dict_name: str, host: str = ANY_HOST,
                 port: int = PORTS["cube-server"]["data"], http_port: int = PORTS["cube-server"]["http"],
                 data_dir: str | None = None,
                 max_keys: int = protocol.DEFAULT_MAX_KEYS, verify: bool = True, io_mode: str = "epoll",
                 guard=None, load_roots=None):
        if not 0 <= shard < shard_num:
            raise ValueError(f"shard {shard} out of range for shard_num {shard_num}")
        self.shard, self.shard_num, self.dict_name = shard, shard_num, dict_name
        self.host, self.http_port = host, http_port
        self.data_dir = Path(data_dir) if data_dir else None
        self.max_keys, self.verify, self.io_mode = max_keys, verify, io_mode
        self.versions = Versions(dict_name, shard, shard_num, self.data_dir, verify, load_roots)
        self.lookups = LookupServer(self.versions, host, port, max_keys, io_mode)
        self.guard = guard
        self._http = None  # runtime.web.wsgi.WebServer of the control app
        self.started = time.time()

    @property
    def port(self) -> int:
        """The data plane's TCP port (the bound one after ``start()``)."""
        return self.lookups.port

    def start(self) -> None:
        """Binds both ports, starts serving, then reloads the recorded chain (if any).
        Raises ``OSError`` when a port cannot be bound."""
        from runtime.web.wsgi import WebServer

        self.lookups.listen()
        self._http = WebServer(create_control_app(self, self.guard), self.host, self.http_port, threads=4, name="cube-server")
        self.http_port = self._http.port
        self.lookups.serve()
        self._http.start()
        warm_kernel()
        self.versions.restore()
        log.info("cube server %s shard %d/%d: data plane %s:%d, HTTP %s:%d, kernel %s, pid %d",
                 self.dict_name, self.shard, self.shard_num, self.host, self.port, self.host,
                 self.http_port, KERNEL.name, os.getpid())

    def unready(self, reason: str = "stopping") -> None:
        """Readiness false (``GET /readyz`` answers 503 with ``reason``); serving goes on."""
        if self._http is not None:
            self._http.ready, self._http.reason = False, reason

    def stop(self, grace_s: float = 0.0) -> None:
        """Stops serving; idempotent. ``grace_s`` > 0 is a graceful stop: readiness false,
        no new data-plane connection, every request already received (a frame partly
        received too) is answered, each connection is closed once nothing on it is
        unanswered, for up to ``grace_s`` s; then the HTTP port stops (its requests in
        flight finish) and any connection left is shut. ``grace_s`` 0: all at once."""
        if self._http is not None and self._http.ready:
            self.unready("stopping")
        self.lookups.drain(grace_s)
        self.lookups.halt()
        if self._http is not None:
            self._http.stop()
        self.lookups.close()

    def status(self) -> dict:
        """``GET /status``: shard, shard_num, dict_name, the versions' state
        (``Versions.status``), kernel, open connections and the data plane's counters."""
        return {"shard": self.shard, "shard_num": self.shard_num, "dict_name": self.dict_name,
                **self.versions.status(), "kernel": KERNEL.name,
                "connections": self.lookups.connections, **self.counters()}

    def counters(self) -> dict:
        """The data plane's counters: ``{"requests", "keys_looked_up", "hits", "errors":
        {status name: count}}`` (``LookupServer.counters``)."""
        return self.lookups.counters()
