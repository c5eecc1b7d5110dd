"""Cube agent: runs beside one cube server and carries out the transfer's commands.

Commands (HTTP JSON; see docs/contracts.md, "Cube internals"), modelled on Paddle Serving's
cube-agent (download / reload / enable / status):

- ``POST /download {"url", "md5", "version", "mode": "base"|"delta", "base_version",
  "dict_name"?, "wait"?}``: downloads the shard tar (a URL or a local path) through
  ``runtime.storage.download``, which verifies the md5 before the file is kept, then
  unpacks it safely into ``<work_dir>/<dict>/<version>/`` (a member escaping that
  directory, a link, a device file or a truncated tar is an error; nothing partial is
  left behind).
- ``POST /reload {"version", "wait"?}``: asks the server to ``bg_load_base`` (or
  ``bg_load_patch`` for a delta) the unpacked directory and polls the server's
  ``GET /status`` until the background slot holds that version ``loaded`` (or ``failed``).
- ``POST /enable {"version"}``: asks the server to ``enable`` (atomic switch); then
  removes unpacked versions other than the one served and the previous one.
- ``POST /bg_unload``: the transfer's abort; forwards to the server and marks pending
  steps ``aborted``.
- ``GET /status``: every step's state (``idle|running|done|failed|aborted``), version,
  error and duration (s), plus the last step (``{"step", "state", "error"}`` at the top
  level) and the server's own status.
- ``GET /healthz``, ``GET /readyz``: liveness and readiness (``runtime.webserver``).

Download and reload run in a background thread (one step at a time): the command answers
``202`` while running, ``200`` when done, ``500`` with ``{"step", "error"}`` when failed.
``"wait": S`` makes the command block up to S seconds for the outcome (the transfer uses
this to avoid polling). Commands are idempotent: repeating a command for the version it
already completed answers ``200`` at once; a command for the version running answers
``202``; a different version while a step runs is ``409``. A download of a version already
downloaded with another md5 (the same version id built for another shard count: a
re-layout) is a new download, and it clears the finished ``reload``/``enable`` of that
version, so they load and switch the new files instead of answering ``200`` at once;
``enable`` switches whenever the server's background slot holds the version loaded, even
if the server already serves that version id (from another build).

HTTP: a Flask app served by ``runtime.webserver`` (one process, threads): the agent's
state lives in memory and control traffic is a few requests per rollout.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

from runtime import storage
from runtime.cube.buildinfo import parse_shard_tar_name

log = logging.getLogger(__name__)

STEPS = ("download", "reload", "enable")
TAR_BLOCK = 512  # bytes per tar block (POSIX ustar)


class AgentError(RuntimeError):
    """A command failed; ``step`` names the step (download, reload, enable, bg_unload)."""

    def __init__(self, step: str, message: str, http_status: int = 500):
        super().__init__(message)
        self.step, self.http_status = step, http_status


@dataclass
class StepState:
    """One step's state as reported by ``GET /status``. Times are unix seconds."""

    state: str = "idle"          # idle | running | done | failed | aborted
    version: int | None = None
    error: str | None = None
    started: float | None = None
    finished: float | None = None
    duration_s: float | None = None
    detail: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- tar safety


def check_tar_complete(path: str | os.PathLike) -> None:
    """Raises ``AgentError(step="download")`` unless ``path`` looks like a whole tar: a size
    that is a multiple of 512 bytes ending with the two zero blocks of the end-of-archive
    marker (POSIX.1-1988 ustar; GNU tar and Python's tarfile both write it). This catches
    a tar truncated at a member boundary, which tarfile itself would read as complete."""
    size = os.path.getsize(path)
    if size < 2 * TAR_BLOCK or size % TAR_BLOCK:
        raise AgentError("download", f"{path}: truncated tar ({size} bytes, not a whole number "
                                     f"of {TAR_BLOCK}-byte blocks with an end-of-archive marker)")
    with open(path, "rb") as f:
        # the end marker is two zero blocks, possibly followed by zero padding to a record
        f.seek(max(0, size - 20 * TAR_BLOCK))
        tailb = f.read()
    stripped = tailb.rstrip(b"\0")
    zeros = len(tailb) - len(stripped)
    if zeros < 2 * TAR_BLOCK:
        raise AgentError("download", f"{path}: truncated tar (no end-of-archive marker)")


def safe_extract(tar_path: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Unpacks ``tar_path`` into the new directory ``dest`` (which must not exist).

    Every member is checked before anything is written: regular files and directories
    only, relative names that stay inside ``dest`` (no absolute path, no ``..``, no link,
    no device). Unpacks into a temporary sibling directory renamed to ``dest`` at the end,
    so ``dest`` appears whole or not at all. Returns the member names.

    Raises ``AgentError(step="download")`` naming the tar and the offending member, or
    for a truncated/corrupt tar.
    """
    tar_path, dest = Path(tar_path), Path(dest)
    check_tar_complete(tar_path)
    tmp = dest.parent / f".{dest.name}.unpack-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    root = tmp.resolve()
    try:
        try:
            with tarfile.open(tar_path, "r:") as tf:
                members = tf.getmembers()
                for m in members:
                    name = m.name
                    if not (m.isfile() or m.isdir()):
                        raise AgentError("download", f"{tar_path}: member {name!r} is not a regular "
                                                     "file or directory (links and devices are refused)")
                    if name.startswith("/") or os.path.isabs(name) or ".." in Path(name).parts:
                        raise AgentError("download", f"{tar_path}: member {name!r} escapes the "
                                                     "unpack directory")
                    target = (root / name).resolve()
                    if target != root and root not in target.parents:
                        raise AgentError("download", f"{tar_path}: member {name!r} escapes the "
                                                     "unpack directory")
                # the checks above are ours (clear errors); the "data" filter is a second guard
                # where this Python has it (3.11.4+, 3.10.12+; Debian bookworm's 3.11.2 has not)
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(root, members=members, filter="data")
                else:
                    for m in members:  # files and directories only, checked above
                        m.mode = (m.mode & 0o755) | (0o700 if m.isdir() else 0o600)
                        m.uid = m.gid = 0
                        m.uname = m.gname = ""
                    tf.extractall(root, members=members, numeric_owner=False)
                # tarfile reads member data lazily: a short member raises ReadError above
        except tarfile.TarError as exc:
            raise AgentError("download", f"{tar_path}: corrupt or truncated tar: {exc}") from exc
        except EOFError as exc:
            raise AgentError("download", f"{tar_path}: truncated tar: {exc}") from exc
        for m in members:
            if m.isfile():
                got = (root / m.name).stat().st_size
                if got != m.size:
                    raise AgentError("download", f"{tar_path}: member {m.name!r} truncated "
                                                 f"({got} of {m.size} bytes)")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return [m.name for m in members]
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def dict_dir_of(unpacked: Path) -> Path:
    """The directory to hand to the server: the tar's single top-level directory
    (``<dict>_part<i>/``, as the builder writes it) or the unpack root itself."""
    entries = [p for p in unpacked.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return unpacked


# --------------------------------------------------------------------------- the agent


class Agent:
    """The agent's state and commands; the HTTP layer is ``create_app``.

    Args:
        server_http: the cube server's HTTP control URL (``http://127.0.0.1:8901``).
        work_dir: where tars are downloaded and unpacked (``<work_dir>/<dict>/<version>/``).
        load_timeout_s: how long ``reload`` waits for the server's background load (s).
        poll_s: interval of the server ``/status`` polls during reload (s).
        keep: unpacked versions kept after an enable (served + previous = 2).
    """

    def __init__(self, server_http: str, work_dir: str | os.PathLike, load_timeout_s: float = 300.0,
                 poll_s: float = 0.05, keep: int = 2, http_timeout_s: float = 10.0):
        self.server_http = server_http.rstrip("/")
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.load_timeout_s, self.poll_s, self.keep = load_timeout_s, poll_s, keep
        self.http_timeout_s = http_timeout_s
        self.steps: dict[str, StepState] = {s: StepState() for s in STEPS}
        self.last_step: str | None = None
        # per downloaded version: {"dir", "dict_name", "mode", "base_version", "md5", "url"}
        self.versions: dict[int, dict] = {}
        self.enabled: list[int] = []  # versions enabled, oldest first
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None
        self._closing = False
        self._http = requests.Session()
        self._load_state()

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

    # ---------------------------------------------------------------- running steps

    def _begin(self, step: str, version: int, restart_failed: bool = True) -> tuple[int, dict | None]:
        """Decides what a command does (under the lock). Returns ``(http_status, body)``
        when it is answered at once, or ``(0, None)`` when the caller must start it."""
        st = self.steps[step]
        busy = [s for s, v in self.steps.items() if v.state == "running"]
        if st.version == version and st.state == "done":
            return 200, asdict(st) | {"step": step}
        if st.version == version and st.state == "running":
            return 202, asdict(st) | {"step": step}
        if busy:
            other = self.steps[busy[0]]
            return 409, {"step": step, "error": f"agent busy: {busy[0]} of version {other.version} "
                                                f"is running"}
        self.steps[step] = StepState(state="running", version=version, started=time.time())
        self.last_step = step
        return 0, None

    def _finish(self, step: str, version: int, error: str | None, detail: dict | None = None,
                state: str | None = None) -> None:
        with self._cond:
            st = self.steps[step]
            if st.version != version or st.state == "aborted":
                return
            st.finished = time.time()
            st.duration_s = round(st.finished - (st.started or st.finished), 3)
            st.state = state or ("failed" if error else "done")
            st.error = error
            if detail:
                st.detail = detail
            self._cond.notify_all()

    def _run_async(self, step: str, version: int, fn: Callable[[], dict | None],
                   wait_s: float) -> tuple[int, dict]:
        """Runs ``fn`` in a background thread as ``step`` of ``version``; waits up to
        ``wait_s`` seconds for the outcome. Returns ``(http_status, body)``."""
        with self._lock:
            code, body = self._begin(step, version)
            if code:
                if code == 202 and wait_s > 0:
                    pass  # fall through to waiting below
                else:
                    return code, body  # type: ignore[return-value]
            else:
                def target() -> None:
                    try:
                        detail = fn()
                        self._finish(step, version, None, detail)
                    except AgentError as exc:
                        log.error("%s of version %s failed: %s", step, version, exc)
                        self._finish(step, version, str(exc))
                    except Exception as exc:  # noqa: BLE001 - reported, never crashes the agent
                        log.exception("%s of version %s failed", step, version)
                        self._finish(step, version, f"{type(exc).__name__}: {exc}")

                self._worker = threading.Thread(target=target, name=f"agent-{step}", daemon=True)
                self._worker.start()
        return self._wait(step, version, wait_s)

    def _wait(self, step: str, version: int, wait_s: float) -> tuple[int, dict]:
        deadline = time.monotonic() + max(0.0, wait_s)
        with self._cond:
            while True:
                st = self.steps[step]
                if st.version != version:
                    return 409, {"step": step, "error": f"{step} now runs version {st.version}"}
                if st.state != "running":
                    break
                if self._closing:
                    return 503, {"step": step, "error": "the agent is shutting down"}
                left = deadline - time.monotonic()
                if left <= 0:
                    return 202, asdict(st) | {"step": step}
                self._cond.wait(min(left, 1.0))
            body = asdict(st) | {"step": step}
        if st.state == "done":
            return 200, body
        return 500, body

    def shutdown(self) -> None:
        """The process is stopping: commands waiting for a step's outcome answer 503 now
        (the transfer retries), so no request is left hanging."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

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
            if prev and prev["md5"] != str(md5).lower():
                for step in STEPS:
                    st = self.steps[step]
                    if st.version == version and st.state == "done":
                        self.steps[step] = StepState()

        def run() -> dict:
            vdir = self.work_dir / dict_name / str(version)
            vdir.mkdir(parents=True, exist_ok=True)
            tar_path = vdir / (name if name.endswith(".tar") else "shard.tar")
            t0 = time.monotonic()
            try:
                storage.download(url, tar_path, md5=str(md5).lower())
            except storage.LocationError as exc:
                raise AgentError("download", str(exc)) from exc
            t1 = time.monotonic()
            members = safe_extract(tar_path, vdir / "data")
            tar_path.unlink()  # the unpacked copy is what the server loads
            ddir = dict_dir_of(vdir / "data")
            with self._lock:
                self.versions[version] = {"dir": str(ddir), "dict_name": dict_name, "mode": mode,
                                          "base_version": None if base_version is None else int(base_version),
                                          "md5": str(md5).lower(), "url": url}
                self._save_state()
            log.info("downloaded version %d from %s (%.2f s) and unpacked %d members (%.2f s) into %s",
                     version, url, t1 - t0, len(members), time.monotonic() - t1, ddir)
            return {"dir": str(ddir), "members": len(members), "url": url}

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
            if info["mode"] == "delta":
                path, body = "/bg_load_patch", {"dir": info["dir"], "version": version,
                                                "base_version": info["base_version"]}
            else:
                path, body = "/bg_load_base", {"dir": info["dir"], "version": version}
            self._server_post("reload", path, body)
            deadline = time.monotonic() + self.load_timeout_s
            while True:
                st = self.server_status()
                if st.get("bg_version") == version and st.get("bg_state") == "loaded":
                    return {"keys": st.get("keys"), "server_version": st.get("version")}
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
            r = self._http.post(url, json=body, timeout=self.http_timeout_s)
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
            version = info.get("base_version") if info and info.get("mode") == "delta" else None
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
            vdir = self.work_dir / info["dict_name"] / str(v)
            shutil.rmtree(vdir, ignore_errors=True)
            removed.append(str(vdir))
        if removed:
            log.info("removed old versions: %s", ", ".join(removed))
        return removed

    def _load_state(self) -> None:
        """Reads ``<work_dir>/agent_state.json`` (versions unpacked, versions enabled) so a
        restarted agent knows what it may clean and what it can reload without a download."""
        path = self.work_dir / "agent_state.json"
        if not path.exists():
            return
        try:
            st = json.loads(path.read_text())
            self.versions = {int(k): v for k, v in st.get("versions", {}).items() if Path(v["dir"]).is_dir()}
            self.enabled = [int(v) for v in st.get("enabled", [])]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s unreadable (%s): starting with an empty state; nothing will be cleaned "
                        "that this agent did not unpack itself", path, exc)

    def _save_state(self) -> None:
        """Writes the state file atomically (temp file + rename); caller holds the lock."""
        path = self.work_dir / "agent_state.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"versions": {str(k): v for k, v in self.versions.items()},
                                   "enabled": self.enabled}))
        os.replace(tmp, path)


# --------------------------------------------------------------------------- HTTP


def create_app(agent: Agent):
    """The agent's Flask app (routes in the module docstring)."""
    from flask import Flask, jsonify, request

    app = Flask("cube-agent")

    def body() -> dict:
        data = request.get_json(silent=True)
        return data if isinstance(data, dict) else {}

    def wait_of(data: dict) -> float:
        try:
            return max(0.0, min(float(data.get("wait", 0) or 0), 600.0))
        except (TypeError, ValueError):
            return 0.0

    @app.get("/status")
    def status():
        return jsonify(agent.status())

    @app.post("/download")
    def download():
        data = body()
        code, out = agent.download(data, wait_of(data))
        return jsonify(out), code

    @app.post("/reload")
    def reload():
        data = body()
        code, out = agent.reload(data, wait_of(data))
        return jsonify(out), code

    @app.post("/enable")
    def enable():
        code, out = agent.enable(body())
        return jsonify(out), code

    @app.post("/bg_unload")
    def bg_unload():
        code, out = agent.bg_unload()
        return jsonify(out), code

    return app


def main(args) -> int:
    """``elastic-ctr cube agent``: serves the agent until SIGTERM, then readiness false,
    ``--drain-seconds`` still answering, requests in flight finish, exit code 0; a step in
    progress is abandoned (the transfer drives it again, on this agent after its restart or
    on the rollout's retry)."""
    from runtime.webserver import WebServer, serve_forever

    agent = Agent(args.server_http, args.work_dir, load_timeout_s=args.load_timeout)
    server = WebServer(create_app(agent), args.host, args.port, threads=8, name="cube-agent")
    return serve_forever(server, on_stop=agent.shutdown, drain_s=args.drain_seconds)
