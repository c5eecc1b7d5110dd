"""The cube agent's step machine: one step (download, reload, enable) runs at a time, in a
background thread; a command for the step and version already done answers 200, for the
one running 202, for another version while a step runs 409 (``runtime/cube/agent``'s
package docstring has the protocol).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

log = logging.getLogger("runtime.cube.agent")

STEPS = ("download", "reload", "enable")


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


class StepMachine:
    """The steps' states (``steps``, ``last_step``) and how a command runs one; the
    commands are ``runtime.cube.agent.commands.Agent``'s. ``_lock`` guards the states;
    ``_cond`` (on it) wakes the commands waiting for an outcome."""

    def __init__(self) -> None:
        self.steps: dict[str, StepState] = {s: StepState() for s in STEPS}
        self.last_step: str | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None
        self._closing = False

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
        self.step_finished(step, st)

    def step_finished(self, step: str, st: StepState) -> None:
        """Called once a step ended (``st.state`` done or failed; ``st.detail``); the agent
        counts it in its metrics."""

    def _run_async(self, step: str, version: int, fn: Callable[[], dict | None],
                   wait_s: float) -> tuple[int, dict]:
        """Runs ``fn`` in a background thread as ``step`` of ``version``; waits up to
        ``wait_s`` seconds for the outcome. Returns ``(http_status, body)``."""
        with self._lock:
            if self._closing:  # a step started now would outlive the process (the transfer retries)
                return 503, {"step": step, "error": "the agent is shutting down"}
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

    @property
    def closing(self) -> bool:
        """Whether ``shutdown`` was called."""
        return self._closing

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
        (the transfer retries), so no request is left hanging; no new step starts (503),
        and a running reload stops waiting for the server (``closing``)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
