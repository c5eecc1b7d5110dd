"""The cube agent's commands (download, reload, enable, bg_unload, status) on one cube
server, and its state file ``<work_dir>/agent_state.json`` (``runtime.cube.agent.state``:
versions unpacked, versions enabled). Protocol: ``runtime/cube/agent``'s package docstring.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import requests

from runtime import storage
from runtime.cube.agent.state import FILE as STATE_FILE
from runtime.cube.agent.state import AgentState, Unpacked
from runtime.cube.agent.steps import STEPS, AgentError, StepMachine, StepState
from runtime.cube.agent.sources import SourceRefused, roots_or_none
from runtime.cube.agent.tarsafe import dict_dir_of, safe_extract
from runtime.cube.buildinfo import parse_shard_tar_name
from runtime.formats.statefile import StateError

log = logging.getLogger("runtime.cube.agent")


class Agent(StepMachine):
    """The agent's state and commands; the HTTP layer is ``create_app``.

    Args:
        server_http: the cube server's HTTP control URL (``http://127.0.0.1:8901``).
        work_dir: where tars are downloaded and unpacked (``<work_dir>/<dict>/<version>/``).
        load_timeout_s: how long ``reload`` waits for the server's background load (s).
        poll_s: interval of the server ``/status`` polls during reload (s).
        keep: unpacked versions kept after an enable (served + previous = 2).
        control: the ``cube-control`` credential presented to the server's control port
            (``runtime.auth.Credential``; None: none presented).
        version_roots: where downloads may come from (``runtime.cube.agent.sources``: a
            URL outside them is refused 400 before any connection; the md5 must be the one
            published beside the tar; no redirect followed). ``()``: any http(s) or store
            URL, never a local path, md5 published. None: no check (a library use: tests).
    """

    def __init__(self, server_http: str, work_dir: str | os.PathLike, load_timeout_s: float = 300.0,
                 poll_s: float = 0.05, keep: int = 2, http_timeout_s: float = 10.0,
                 control=None, version_roots=None):
        super().__init__()
        self.server_http = server_http.rstrip("/")
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.load_timeout_s, self.poll_s, self.keep = load_timeout_s, poll_s, keep
        self.http_timeout_s = http_timeout_s
        self.control = control
        self.sources = roots_or_none(version_roots)
        # per downloaded version: what was unpacked where (``Unpacked``)
        self.versions: dict[int, Unpacked] = {}
        self.enabled: list[int] = []  # versions enabled, oldest first
        self._http = requests.Session()
        from runtime.metrics.cube import AgentMetrics

        self.metrics = AgentMetrics()
        self._load_state()
        self.metrics.version.set(self.enabled[-1] if self.enabled else 0)

    def step_finished(self, step: str, st: StepState) -> None:
        """A step's seconds, result and bytes (``detail["bytes"]``) into ``metrics``."""
        self.metrics.step_done(step, st.duration_s or 0.0, st.state == "done", int(st.detail.get("bytes") or 0))
        if step == "enable" and st.state == "done" and st.version is not None:
            self.metrics.version.set(st.version)

    # ---------------------------------------------------------------- status

    def status(self) -> dict:
        """The agent's status (JSON-serializable); never raises."""
        with self._lock:
            steps = {k: asdict(v) for k, v in self.steps.items()}
            last = self.last_step
            out: dict[str, Any] = {
                "server_http": self.server_http,
                "work_dir": str(self.work_dir),
                "steps": steps,
                "enabled": list(self.enabled),
                "version": self.enabled[-1] if self.enabled else None,
                "downloaded": sorted(self.versions),
            }
        if last:
            out.update(step=last, state=steps[last]["state"], error=steps[last]["error"],
                       step_version=steps[last]["version"])
        else:
            out.update(step=None, state="idle", error=None, step_version=None)
        try:
            out["server"] = self.server_status()
        except AgentError as exc:
            out["server"] = {"error": str(exc)}
        return out

    def server_status(self) -> dict:
        """The server's ``GET /status``; ``AgentError(step="status")`` if unreachable."""
        try:
            r = self._http.get(f"{self.server_http}/status", timeout=self.http_timeout_s)
        except requests.RequestException as exc:
            raise AgentError("status", f"cube server {self.server_http} unreachable: {exc}") from exc
        if r.status_code != 200:
            raise AgentError("status", f"cube server {self.server_http}/status: HTTP {r.status_code} "
                                       f"{r.text[:200]}")
        return r.json()

    # ---------------------------------------------------------------- commands

    def download(self, req: dict, wait_s: float = 0.0) -> tuple[int, dict]:
        """``POST /download``: see the module docstring. Returns ``(http_status, body)``."""
        try:
            url = str(req["url"])
            version = int(req["version"])
        except (KeyError, TypeError, ValueError) as exc:
            return 400, {"step": "download", "error": f"bad request: need url and integer version ({exc})"}
        md5 = req.get("md5")
        if not md5:
            return 400, {"step": "download", "error": "bad request: md5 is required (nothing is "
                                                      "loaded unverified)"}
        if self.sources is not None:
            try:
                url = self.sources.check(url)
            except SourceRefused as exc:
                log.warning("download of version %s refused: %s", version, exc)
                return 400, {"step": "download", "error": f"refused: {exc}"}
        mode = str(req.get("mode", "base"))
        if mode not in ("base", "delta"):
            return 400, {"step": "download", "error": f"bad request: mode {mode!r} is not base|delta"}
        base_version = req.get("base_version")
        if mode == "delta" and base_version is None:
            return 400, {"step": "download", "error": "bad request: a delta needs base_version"}
        name = url.rstrip("/").rsplit("/", 1)[-1]
        parsed = parse_shard_tar_name(name)
        dict_name = str(req.get("dict_name") or (parsed[0] if parsed else "dict"))
        if "/" in dict_name or dict_name in ("", ".", ".."):
            return 400, {"step": "download", "error": f"bad request: dict_name {dict_name!r}"}
        with self._lock:
            # a repeated download of the same version with another md5 is a new download (a
            # re-layout): the reload and enable done for the old files no longer count
            prev = self.versions.get(version)
            if prev and prev.md5 != str(md5).lower():
                for step in STEPS:
                    st = self.steps[step]
                    if st.version == version and st.state == "done":
                        self.steps[step] = StepState()

        def run() -> dict:
            vdir = self.work_dir / dict_name / str(version)
            vdir.mkdir(parents=True, exist_ok=True)
            tar_path = vdir / (name if name.endswith(".tar") else "shard.tar")
            t0 = time.monotonic()
            checked = self.sources is not None
            try:
                if checked:  # the md5 published beside the tar, which the request's must equal
                    published = self.sources.published_md5(url)
                    if published != str(md5).lower():
                        raise AgentError("download", f"{url}: the request's md5 {md5} is not the published "
                                                     f"{published}: nothing downloaded")
                storage.download(url, tar_path, md5=str(md5).lower(), follow_redirects=not checked)
            except (storage.LocationError, SourceRefused) as exc:
                raise AgentError("download", str(exc)) from exc
            t1 = time.monotonic()
            nbytes = tar_path.stat().st_size
            members = safe_extract(tar_path, vdir / "data")
            tar_path.unlink()  # the unpacked copy is what the server loads
            ddir = dict_dir_of(vdir / "data")
            with self._lock:
                self.versions[version] = Unpacked(
                    dir=str(ddir), dict_name=dict_name, mode=mode,
                    base_version=None if base_version is None else int(base_version), md5=str(md5).lower(), url=url)
                self._save_state()
            log.info("downloaded version %d from %s (%.2f s) and unpacked %d members (%.2f s) into %s",
                     version, url, t1 - t0, len(members), time.monotonic() - t1, ddir)
            return {"dir": str(ddir), "members": len(members), "url": url, "bytes": nbytes}

        return self._run_async("download", version, run, wait_s)

    def reload(self, req: dict, wait_s: float = 0.0) -> tuple[int, dict]:
        """``POST /reload``: background-loads a downloaded version into the server."""
        try:
            version = int(req["version"])
        except (KeyError, TypeError, ValueError) as exc:
            return 400, {"step": "reload", "error": f"bad request: need integer version ({exc})"}
        with self._lock:
            info = self.versions.get(version)
            st = self.steps["reload"]
            done = st.version == version and st.state == "done"
        if info is None:
            return 409, {"step": "reload", "error": f"version {version} is not downloaded"}
        if done:  # answered "done" only while the server still holds the version
            try:
                srv = self.server_status()
            except AgentError as exc:
                return 503, {"step": "reload", "error": str(exc)}
            if not (srv.get("version") == version or (srv.get("bg_version") == version
                                                       and srv.get("bg_state") == "loaded")):
                with self._lock:
                    if self.steps["reload"].state == "done":
                        self.steps["reload"].state = "idle"

        def run() -> dict:
            if info.mode == "delta":
                path, body = "/bg_load_patch", {"dir": info.dir, "version": version,
                                                "base_version": info.base_version}
            else:
                path, body = "/bg_load_base", {"dir": info.dir, "version": version}
            self._server_post("reload", path, body)
            deadline = time.monotonic() + self.load_timeout_s
            while True:
                if self.closing:  # the process is stopping: no more polls of the server
                    raise AgentError("reload", f"reload of version {version} abandoned: the agent is shutting down")
                st = self.server_status()
                if st.get("bg_version") == version and st.get("bg_state") == "loaded":
                    nbytes = sum(f.stat().st_size for f in Path(info.dir).iterdir() if f.is_file())
                    return {"keys": st.get("keys"), "server_version": st.get("version"), "bytes": nbytes}
                if st.get("bg_version") == version and st.get("bg_state") == "failed":
                    raise AgentError("reload", f"cube server {self.server_http} failed to load "
                                               f"version {version}: {st.get('bg_error')}")
                with self._lock:
                    if self.steps["reload"].state == "aborted":
                        raise AgentError("reload", f"reload of version {version} aborted")
                if time.monotonic() > deadline:
                    raise AgentError("reload", f"cube server {self.server_http}: version {version} "
                                               f"not loaded after {self.load_timeout_s:.0f} s "
                                               f"(bg_state {st.get('bg_state')})")
                time.sleep(self.poll_s)

        return self._run_async("reload", version, run, wait_s)

    def enable(self, req: dict) -> tuple[int, dict]:
        """``POST /enable``: switches the server to a loaded version (synchronous)."""
        try:
            version = int(req["version"])
        except (KeyError, TypeError, ValueError) as exc:
            return 400, {"step": "enable", "error": f"bad request: need integer version ({exc})"}
        try:
            st = self.server_status()
        except AgentError as exc:
            return 503, {"step": "enable", "error": str(exc)}
        if st.get("version") != version and not (st.get("bg_version") == version
                                                 and st.get("bg_state") == "loaded"):
            return 409, {"step": "enable", "error": f"version {version} is not loaded in the server "
                                                    f"(bg_version {st.get('bg_version')}, "
                                                    f"bg_state {st.get('bg_state')})"}
        with self._lock:
            code, body = self._begin("enable", version)
            if code == 200:
                self.steps["enable"].state = "running"  # re-enable: the server is checked again
            elif code:
                return code, body  # type: ignore[return-value]
        try:
            # the bg slot may hold the same version id built anew (a re-layout): switch to it
            if st.get("version") != version or (st.get("bg_version") == version
                                                and st.get("bg_state") == "loaded"):
                self._server_post("enable", "/enable", {"version": version})
        except AgentError as exc:
            self._finish("enable", version, str(exc))
            with self._lock:
                return 500, asdict(self.steps["enable"]) | {"step": "enable"}
        with self._lock:
            if version in self.enabled:  # enabled again (a re-layout): now the newest
                self.enabled.remove(version)
            self.enabled.append(version)
            self.enabled = self.enabled[-16:]
            self._save_state()
        self._finish("enable", version, None)
        try:
            self.cleanup()
        except OSError as exc:  # cleaning is best effort; never fails an enable
            log.warning("cleaning old versions under %s: %s", self.work_dir, exc)
        with self._lock:
            return 200, asdict(self.steps["enable"]) | {"step": "enable"}

    def bg_unload(self) -> tuple[int, dict]:
        """``POST /bg_unload``: the transfer aborted; drop the server's background slot."""
        with self._cond:
            for name, st in self.steps.items():
                # a running step stops; a finished reload no longer holds (the slot is dropped)
                if st.state == "running" or (name == "reload" and st.state == "done"):
                    st.state, st.error = "aborted", "aborted by bg_unload"
                    st.finished = time.time()
            self._cond.notify_all()
        try:
            self._server_post("bg_unload", "/bg_unload", {})
        except AgentError as exc:
            return 500, {"step": "bg_unload", "error": str(exc)}
        return 200, {"step": "bg_unload", "state": "done"}

    def _server_post(self, step: str, path: str, body: dict) -> dict:
        url = f"{self.server_http}{path}"
        try:
            r = self._http.post(url, json=body, timeout=self.http_timeout_s,
                                headers=self.control.headers() if self.control is not None else None)
        except requests.RequestException as exc:
            raise AgentError(step, f"cube server {url} unreachable: {exc}") from exc
        if r.status_code >= 300:
            try:
                err = r.json().get("error", r.text)
            except ValueError:
                err = r.text
            raise AgentError(step, f"cube server {url}: HTTP {r.status_code}: {str(err)[:300]}")
        try:
            return r.json()
        except ValueError:
            return {}

    def _chain(self, version: int | None) -> list[int]:
        """``version`` and the versions it is built on (a delta's base_version, and so on)."""
        out: list[int] = []
        while version is not None and version not in out:
            out.append(version)
            info = self.versions.get(version)
            version = info.base_version if info and info.mode == "delta" else None
        return out

    def cleanup(self) -> list[str]:
        """Removes the unpacked versions no longer needed. Kept: the last ``keep`` enabled
        versions with everything they are built on (base + patches: the server reloads
        that chain after a restart; its ``/status`` ``lineage`` is honoured too), and any
        version downloaded after the served one or in use by a running step. Only versions
        this agent unpacked (recorded in its state file) are ever removed. Returns the
        removed directories."""
        try:
            lineage = [int(v) for v in (self.server_status().get("lineage") or [])]
        except AgentError:
            return []  # cannot tell what the server needs: remove nothing
        with self._lock:
            keep = set(lineage)
            for v in self.enabled[-self.keep:]:
                keep |= set(self._chain(v))
            served = self.enabled[-1] if self.enabled else None
            keep |= {v for v in self.versions if served is not None and v > served}
            keep |= {st.version for st in self.steps.values() if st.state == "running" and st.version is not None}
            drop = {v: info for v, info in self.versions.items() if v not in keep}
            for v in drop:
                self.versions.pop(v)
            self._save_state()
        removed = []
        for v, info in sorted(drop.items()):
            vdir = self.work_dir / info.dict_name / str(v)
            shutil.rmtree(vdir, ignore_errors=True)
            removed.append(str(vdir))
        if removed:
            log.info("removed old versions: %s", ", ".join(removed))
        return removed

    def _load_state(self) -> None:
        """Reads ``<work_dir>/agent_state.json`` (``AgentState``: versions unpacked, versions
        enabled) so a restarted agent knows what it may clean and what it can reload without
        a download; an unreadable file is logged and the agent starts empty."""
        path = self.work_dir / STATE_FILE
        try:
            st = AgentState.load(path)
        except StateError as exc:
            log.warning("%s (starting with an empty state; nothing will be cleaned that this agent did not "
                        "unpack itself)", exc)
            return
        if st is not None:
            self.versions = {v: u for v, u in st.versions.items() if Path(u.dir).is_dir()}
            self.enabled = list(st.enabled)

    def _save_state(self) -> None:
        """Writes the state file atomically (``StateFile.save``); caller holds the lock."""
        AgentState(versions=self.versions, enabled=self.enabled).save(self.work_dir / STATE_FILE)
