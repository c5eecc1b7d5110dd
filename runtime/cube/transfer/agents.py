"""The transfer's side of the agent protocol (``runtime.cube.agent``): drive one replica
through a step with retries, a phase as a barrier over many replicas, the abort, and the
replicas' status.

Every step is a ``POST <agent>/<step>`` (download, reload, enable); download and reload
ask the agent to wait for the outcome (``"wait": s``) within the phase's deadline. A
connection error or a 409/5xx answer is retried (``tenacity``, exponential backoff 0.2-2 s)
up to ``retries`` attempts; a 400 is not (no retry fixes a bad request).
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from dataclasses import dataclass
from typing import Iterable, Optional

import requests
import tenacity

from runtime.cube.transfer.state import Phase, Plan
from runtime.formats.topology import Replica

log = logging.getLogger(__name__)

STEPS = {Phase.DOWNLOADING: "download", Phase.RELOADING: "reload", Phase.ENABLING: "enable"}
MAX_WAIT_S = 600.0  # the longest "wait" an agent accepts


class RolloutError(RuntimeError):
    """A rollout phase failed; ``phase`` names it, the message names the replicas."""

    def __init__(self, phase: Phase | str, message: str):
        phase = Phase(phase)
        super().__init__(f"{phase.value}: {message}")
        self.phase = phase


class PartialEnable(RolloutError):
    """Enabling failed after some replicas switched; ``enabled`` holds them."""

    def __init__(self, message: str, enabled: set[Replica]):
        super().__init__(Phase.ENABLING, message)
        self.enabled = enabled


class _Retry(RuntimeError):
    """A retryable failure of one replica's step."""


class _Fatal(RuntimeError):
    """A failure no retry can fix (a bad request)."""


@dataclass(frozen=True)
class Shipment:
    """What agents download for one rollout: per shard, the tar's URL (or path) and md5."""

    urls: list[str]
    md5s: list[str]


class AgentClient:
    """Talks to the agents. ``retries``: attempts per replica and step;
    ``http_timeout_s``: for status calls and the abort; ``control``: the ``cube-control``
    credential presented on every command (``runtime.auth.Credential``, read at each
    command so a rotation needs no restart; None: none presented)."""

    def __init__(self, dict_name: str, retries: int = 3, http_timeout_s: float = 10.0, control=None):
        self.dict_name = dict_name
        self.control = control
        self.retries = max(1, retries)
        self.http_timeout_s = http_timeout_s
        self.http = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=64, pool_maxsize=64)
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)

    def _headers(self) -> dict[str, str] | None:
        return self.control.headers() if self.control is not None else None

    def drive(self, rep: Replica, step: str, plan: Plan, ship: Shipment, deadline: float) -> None:
        """One replica through ``step`` (download | reload | enable) of ``plan``, within
        ``deadline`` (monotonic s). Raises the last error."""
        v = plan.version
        if step == "download":
            body = {"url": ship.urls[rep.shard], "md5": ship.md5s[rep.shard], "version": v, "mode": plan.mode,
                    "base_version": plan.base_version, "dict_name": self.dict_name}
        else:
            body = {"version": v}

        def attempt() -> None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{step} not done within the phase timeout")
            if step != "enable":
                body["wait"] = max(0.0, min(left, MAX_WAIT_S))
            try:
                r = self.http.post(f"{rep.agent}/{step}", json=body, timeout=left + 5, headers=self._headers())
            except requests.RequestException as exc:
                raise _Retry(f"agent unreachable: {exc}") from exc
            if r.status_code == 200:
                return
            try:
                out = r.json()
            except ValueError:
                out = {"error": r.text[:300]}
            err = out.get("error") or out.get("state") or r.text[:300]
            if r.status_code == 202:
                raise TimeoutError(f"{step} still running at the phase timeout")
            if r.status_code == 400:
                raise _Fatal(f"HTTP 400: {err}")
            raise _Retry(f"HTTP {r.status_code}: {err}")

        tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries),
            wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
            retry=tenacity.retry_if_exception_type(_Retry),
            reraise=True,
            before_sleep=lambda rs: log.warning("%s %s of version %d: attempt %d failed (%s); retrying", rep.name,
                                                step, v, rs.attempt_number, rs.outcome.exception()),
        )(attempt)

    def barrier(self, phase: Phase, todo: list[Replica], plan: Plan, ship: Shipment, timeout_s: float,
                enabled: Optional[set[Replica]] = None) -> None:
        """Runs ``phase``'s step on every replica of ``todo`` concurrently; returns when all
        succeeded, raises ``RolloutError`` (naming the replicas) when any failed.
        ``enabled`` collects the replicas that succeeded (Enabling).

        Reloading runs in two waves (``reload_waves``): building a version's table costs a
        server CPU for seconds (a patch is applied to a copy of the served table), and a
        lookup that reaches a server doing it can wait past the cube client's timeout; with
        the waves every shard keeps at least one replica that is not reloading to answer."""
        step = STEPS[phase]
        v = plan.version
        if not todo:
            return
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        log.info("%s version=%d: 0/%d replicas", phase.value, v, len(todo))
        failures: list[str] = []
        done = 0
        waves = reload_waves(todo) if phase == Phase.RELOADING else [todo]
        with cf.ThreadPoolExecutor(max_workers=min(32, len(todo)), thread_name_prefix=step) as ex:
            for wave in waves:
                futs = {ex.submit(self.drive, rep, step, plan, ship, deadline): rep for rep in wave}
                for fut in cf.as_completed(futs):
                    rep = futs[fut]
                    try:
                        fut.result()
                        done += 1
                        if enabled is not None:
                            enabled.add(rep)
                    except Exception as exc:  # noqa: BLE001 - reported with the replica
                        failures.append(f"{rep.name} ({rep.agent}) {step}: {exc}")
                if failures:
                    break
        log.info("%s version=%d: %d/%d replicas, %d failed, %.2f s%s", phase.value, v, done, len(todo),
                 len(failures), time.monotonic() - t0, f" ({len(waves)} waves)" if len(waves) > 1 else "")
        if failures:
            raise RolloutError(phase, "; ".join(failures))

    def abort(self, replicas: Iterable[Replica], version: int) -> None:
        """Tells every agent ``bg_unload`` (best effort, concurrently)."""
        def unload(rep: Replica) -> None:
            try:
                r = self.http.post(f"{rep.agent}/bg_unload", json={"version": version}, timeout=self.http_timeout_s,
                                   headers=self._headers())
                if r.status_code != 200:
                    log.warning("%s bg_unload: HTTP %d %s", rep.name, r.status_code, r.text[:200])
            except requests.RequestException as exc:
                log.warning("%s bg_unload: %s", rep.name, exc)

        replicas = list(replicas)
        with cf.ThreadPoolExecutor(max_workers=min(32, len(replicas))) as ex:
            list(ex.map(unload, replicas))

    def status(self, rep: Replica, timeout_s: Optional[float] = None) -> dict:
        """The agent's ``GET /status``. Raises ``requests.RequestException`` or ``ValueError``."""
        r = self.http.get(f"{rep.agent}/status", timeout=timeout_s or self.http_timeout_s)
        r.raise_for_status()
        return r.json()

    def served(self, replicas: list[Replica]) -> dict[Replica, tuple[Optional[int], Optional[int]]]:
        """Each replica's ``(served version, server shard_num)`` (None where unknown)."""
        def one(rep: Replica):
            try:
                srv = self.status(rep).get("server") or {}
                return srv.get("version"), srv.get("shard_num")
            except (requests.RequestException, ValueError, AttributeError):
                return None, None

        with cf.ThreadPoolExecutor(max_workers=min(32, len(replicas))) as ex:
            return dict(zip(replicas, ex.map(one, replicas)))


def reload_waves(todo: list[Replica]) -> list[list[Replica]]:
    """``todo`` in at most two waves: the first ``ceil(r / 2)`` of each shard's ``r``
    replicas (by replica index), then the rest, so that a shard with two or more
    replicas always has one out of the wave. One wave when no shard has two."""
    by_shard: dict[int, list[Replica]] = {}
    for rep in todo:
        by_shard.setdefault(rep.shard, []).append(rep)
    first: list[Replica] = []
    second: list[Replica] = []
    for reps in by_shard.values():
        reps = sorted(reps, key=lambda i: i.replica)
        half = -(-len(reps) // 2)
        first += reps[:half]
        second += reps[half:]
    return [w for w in (first, second) if w]
