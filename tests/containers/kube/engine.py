"""The Docker engine as the harness drives it: ``docker`` commands, the ``die`` events of
the run's containers, and container logs."""
from __future__ import annotations

import json
import subprocess
import threading
from typing import Callable, Optional

from tests.containers.kube.errors import HarnessError
from tests.containers.kube.objects import ContainerRun
from tests.containers.kube.store import LABEL


class Docker:
    """The ``docker`` client with ``env`` (``DOCKER_HOST``...) for the run ``run_id``."""

    def __init__(self, env: dict[str, str], run_id: str):
        self.env = dict(env)
        self.run_id = run_id
        self._events_proc: Optional[subprocess.Popen] = None

    def __call__(self, *args: str, timeout: float = 120, check: bool = True, env: Optional[dict] = None,
                 ) -> subprocess.CompletedProcess:
        """Runs ``docker ARGS`` (``env`` added to the client's environment: secrets go there,
        never on the command line). Raises HarnessError after ``timeout`` seconds, or on a
        non-zero exit with ``check``."""
        e = dict(self.env, **(env or {}))
        try:
            proc = subprocess.run(["docker", *args], env=e, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"docker {' '.join(args[:3])}... did not answer in {timeout:.0f} s") from exc
        if check and proc.returncode != 0:
            raise HarnessError(f"docker {' '.join(args[:4])}... exited {proc.returncode}: "
                               f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        return proc

    def watch_exits(self, on_exit: Callable[[str, int], None]) -> None:
        """Calls ``on_exit(container id, exit code)`` for each ``die`` event of the run's
        containers, from a daemon thread, until :meth:`stop_watching`."""
        self._events_proc = subprocess.Popen(
            ["docker", "events", "--filter", f"label={LABEL}={self.run_id}", "--filter", "type=container",
             "--filter", "event=die", "--format", "{{json .}}"],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

        def reader(proc: subprocess.Popen) -> None:
            for line in proc.stdout:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                cid = ev.get("id") or ev.get("Actor", {}).get("ID")
                code = int(ev.get("Actor", {}).get("Attributes", {}).get("exitCode", -1))
                on_exit(cid, code)

        threading.Thread(target=reader, args=(self._events_proc,), daemon=True, name="docker-events").start()

    def stop_watching(self) -> None:
        """Ends the events watcher, if one runs."""
        if self._events_proc is not None and self._events_proc.poll() is None:
            self._events_proc.terminate()
            try:
                self._events_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._events_proc.kill()

    def exit_state(self, c: ContainerRun) -> Optional[int]:
        """The exit code of ``c`` per ``docker inspect``, or None while it runs (a fallback to
        the events stream)."""
        proc = self("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", c.id, check=False)
        parts = proc.stdout.split()
        if proc.returncode == 0 and parts and parts[0] == "false":
            return int(parts[1])
        return None

    def save_log(self, c: ContainerRun) -> None:
        """Writes the container's output (timestamped; stderr after a ``[stderr]`` line) to
        ``c.log_path``."""
        if c.id is None:
            return
        c.log_path.parent.mkdir(parents=True, exist_ok=True)
        proc = self("logs", "--timestamps", c.id, check=False, timeout=60)
        c.log_path.write_text(proc.stdout + (("\n[stderr]\n" + proc.stderr) if proc.stderr else ""))

    def logs(self, c: ContainerRun) -> str:
        """The container's output so far (stdout then stderr); empty before it started."""
        if c.id is None:
            return ""
        proc = self("logs", c.id, check=False, timeout=60)
        return proc.stdout + proc.stderr

    def sweep(self) -> None:
        """Removes whatever container still carries this run's label."""
        left = self("ps", "-aq", "--filter", f"label={LABEL}={self.run_id}", check=False).stdout.split()
        for cid in left:
            self("rm", "-f", cid, check=False, timeout=60)


def tail(path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, or ``(no log)``."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
