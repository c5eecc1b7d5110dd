"""Process supervision for the local pipeline, local clusters and end-to-end tests.

Every process is started in its own session (so its children can be signalled as a
group) with stdout/stderr sent to a log file, and is stopped by its own PID: SIGTERM,
then SIGKILL after a grace period. Nothing else on the machine is touched.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

log = logging.getLogger(__name__)


class Terminated(KeyboardInterrupt):
    """Raised on the main thread when a launcher holding a ``ProcessGroup`` gets SIGTERM:
    the group's ``__exit__`` then stops every role it started (SIGTERM, grace, SIGKILL)
    and ``runtime.cli`` exits 0."""


class RoleFailed(RuntimeError):
    """A supervised process exited with a non-zero code (or too early).

    Attributes: ``name`` (role name), ``returncode`` (int), ``log_tail`` (str, the last
    lines of its log).
    """

    def __init__(self, name: str, returncode: int | None, log_tail: str):
        self.name, self.returncode, self.log_tail = name, returncode, log_tail
        super().__init__(
            f"role {name!r} failed (exit code {returncode}); last lines of its log:\n{log_tail}"
        )


#: the kernel's ephemeral port range (Linux); outgoing connections take their local port from it
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
#: the ports ``free_ports`` hands out lie in ``[low - SPAN, low)`` below the ephemeral range
SPAN = 12288
_rng = random.SystemRandom()  # not the seedable global one: two processes picking at once draw apart


def listen_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """``[first, end)``: the ports to hand out to listeners, just below the kernel's
    ephemeral range (``path``: its ``low high`` file), or None when it cannot be read or
    leaves fewer than ``SPAN`` ports above 1024 below it. A port the kernel picks by itself
    (``bind(host, 0)``) is ephemeral: until the role that is to listen on it binds it, an
    outgoing connection (a readiness probe, a client's pooled connection) may take it as
    its local port, and the role then fails with ``EADDRINUSE``; a bench run hit this."""
    try:
        with open(path) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (low - SPAN, low) if low - SPAN >= 1024 else None


def free_port(host: str = "127.0.0.1") -> int:
    """Returns a TCP port on ``host`` that was free at the time of the call (``free_ports``)."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``n`` distinct TCP ports on ``host`` that were free at the time of the call
    (held bound together while chosen), taken at random from ``listen_range`` (outside the
    ephemeral range, so no outgoing connection takes one before its listener binds it);
    where there is none, the kernel's choice. Raises ``OSError`` when ``host`` cannot be
    bound at all."""
    socks, ports = [], []
    span = listen_range()
    try:
        tries = 0
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            port = _rng.randrange(*span) if span is not None and tries < 64 * n else 0
            tries += 1
            try:
                s.bind((host, port))
            except OSError:
                if port == 0:
                    raise
                continue  # taken: another draw
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """True when a TCP connection to ``host:port`` succeeds within ``timeout_s`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_port(
    host: str,
    port: int,
    timeout_s: float = 60.0,
    proc: "subprocess.Popen | None" = None,
    name: str = "",
    log_path: Path | None = None,
) -> None:
    """Blocks until ``host:port`` accepts TCP connections.

    Raises ``RoleFailed`` if ``proc`` exits first, ``TimeoutError`` after ``timeout_s`` s.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        if proc is not None and proc.poll() is not None:
            raise RoleFailed(name or str(proc.args), proc.returncode, tail(log_path))
        time.sleep(0.05)
    raise TimeoutError(f"{name or 'process'}: {host}:{port} not listening after {timeout_s:.0f} s")


def tail(path: Path | None, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    if path is None or not Path(path).exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64 * 1024))
        data = f.read().decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-lines:])


@dataclass
class Role:
    """One supervised process: ``name``, the ``Popen`` handle and its ``log_path``."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    expect_exit: bool = False  # True for jobs that end by themselves (trainers, clients)
    port_file: Path | None = None  # where the role writes the ports it bound (runtime.bound_ports)


@dataclass
class ProcessGroup:
    """Starts processes, watches them, and stops every one it started (by PID).

    Use as a context manager: leaving the block (normally, on an exception or on
    Ctrl-C) stops every process still running.
    """

    log_dir: Path
    grace_s: float = 10.0
    roles: list[Role] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        expect_exit: bool = False,
        cwd: str | os.PathLike | None = None,
        port_file: bool = False,
    ) -> Role:
        """Starts ``argv`` as role ``name``; its output goes to ``<log_dir>/<name>.log``.

        ``env`` entries are added to this process's environment. With ``port_file``, the
        role is given ``--port-file <log_dir>/<name>.ports.json`` (``runtime.bound_ports``:
        start it on port 0 and read its ports with ``bound_ports(role)``). Returns the ``Role``.
        """
        from runtime import bound_ports

        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        ports_path = None
        if port_file:
            ports_path = self.log_dir / f"{name}.ports.json"
            ports_path.unlink(missing_ok=True)  # a previous run's
            argv = [*argv, bound_ports.FLAG, str(ports_path)]
        full_env = dict(os.environ)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        if env:
            full_env.update({k: str(v) for k, v in env.items()})
        logf = open(log_path, "ab")
        proc = subprocess.Popen(
            list(argv),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
        logf.close()
        role = Role(name, proc, log_path, expect_exit, ports_path)
        self.roles.append(role)
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(argv))
        return role

    def bound_ports(self, role: Role, timeout_s: float = 60.0, poll_s: float = 0.02) -> dict[str, int]:
        """The ports ``role`` (started with ``port_file``) bound, by name, once it wrote them:
        every port then accepts connections. Raises ``RoleFailed`` when the role exits first,
        ``TimeoutError`` after ``timeout_s`` s, ``ValueError`` for a role started without
        ``port_file``."""
        from runtime import bound_ports

        if role.port_file is None:
            raise ValueError(f"{role.name}: started without port_file")
        deadline = time.monotonic() + timeout_s
        while True:
            ports = bound_ports.read(role.port_file)
            if ports is not None:
                return ports
            if role.proc.poll() is not None:
                raise RoleFailed(role.name, role.proc.returncode, tail(role.log_path))
            if time.monotonic() > deadline:
                raise TimeoutError(f"{role.name}: no ports written to {role.port_file} after {timeout_s:.0f} s")
            time.sleep(poll_s)

    def check(self) -> None:
        """Raises ``RoleFailed`` for the first role that exited non-zero, or a long-running
        role (``expect_exit=False``) that exited at all."""
        for r in self.roles:
            rc = r.proc.poll()
            if rc is None:
                continue
            if rc != 0 or not r.expect_exit:
                raise RoleFailed(r.name, rc, tail(r.log_path))

    def wait(self, roles: Iterable[Role], timeout_s: float | None = None, poll_s: float = 0.2) -> None:
        """Waits until every role in ``roles`` has exited with code 0.

        Meanwhile checks every role of the group: raises ``RoleFailed`` as soon as any
        fails, ``TimeoutError`` after ``timeout_s`` seconds.
        """
        roles = list(roles)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self.check()
            if all(r.proc.poll() == 0 for r in roles):
                return
            if deadline is not None and time.monotonic() > deadline:
                names = [r.name for r in roles if r.proc.poll() is None]
                raise TimeoutError(f"roles still running after {timeout_s:.0f} s: {names}")
            time.sleep(poll_s)

    def stop(self, role: Role) -> None:
        """Stops one role: SIGTERM to its process group, SIGKILL after ``grace_s`` s."""
        p = role.proc
        if p.poll() is not None:
            return
        _signal_group(p.pid, signal.SIGTERM)
        try:
            p.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(p.pid, signal.SIGKILL)
            p.wait(5)

    def stop_all(self) -> None:
        """Stops every role still running, newest first (clients before servers)."""
        live = [r for r in reversed(self.roles) if r.proc.poll() is None]
        for r in live:
            _signal_group(r.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for r in live:
            try:
                r.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(r.proc.pid, signal.SIGKILL)
                r.proc.wait(5)

    def __enter__(self) -> "ProcessGroup":
        # A launcher stopped with SIGTERM must stop its roles (each runs in its own session,
        # so the signal does not reach them): raise Terminated, stop them in __exit__.
        self._prev_sigterm = None
        import threading

        if threading.current_thread() is threading.main_thread():
            self._prev_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _raise_terminated)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop_all()
        finally:
            if self._prev_sigterm is not None:
                signal.signal(signal.SIGTERM, self._prev_sigterm)


def _raise_terminated(_signum, _frame):
    raise Terminated()


def _signal_group(pid: int, sig: int) -> None:
    """Signals the process group led by ``pid`` (our own child, started in a new session)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:  # not a group leader after all: signal the process alone
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def self_command() -> list[str]:
    """argv prefix that runs this project's CLI with the current interpreter."""
    return [sys.executable, "-m", "runtime.cli"]
