"""One rollout of a version, driven through its phases: ``drive(transfer, plan)`` and its partial and failed ends.

Building (the builder), Deploying (the shard tars published), Downloading, Reloading and
Enabling (every agent through the step, a barrier each), Finished; a failure before
Enabling aborts (``_failed``: the previous version keeps serving), one during Enabling
leaves the rollout current (``_partial``: driven again at the next poll).
``runtime/cube/transfer/service.py``'s docstring has the whole loop; every function takes
its ``Transfer``.
"""
from __future__ import annotations

import logging
import time

from runtime.cube.transfer import planner
from runtime.cube.transfer.agents import PartialEnable, RolloutError
from runtime.cube.transfer.state import Phase, Plan
from runtime.cube.transfer.verify import VersionRefused
from runtime.formats.topology import Replica

log = logging.getLogger("runtime.cube.transfer.service")  # the transfer's lines, under one name


def _enter(tr, plan: Plan, phase: Phase) -> None:
    """Records that ``plan`` entered ``phase`` (state, metrics, the ``after_phase`` hook)."""
    with tr.lock:
        tr._commit(planner.at_phase(tr.state, plan, phase))
    tr.metrics.in_phase(phase.value.lower())
    if tr.after_phase:
        tr.after_phase(phase, plan)


def drive(tr, plan: Plan) -> dict:
    """Drives one rollout of ``tr`` (the ``Transfer``) through every phase (module
    docstring). Returns its history entry (``status`` finished | failed | partial) as JSON."""
    n = tr.shard_num
    resumed = plan.phase != Phase.TRIGGING
    with tr.lock:
        state, plan = planner.begin(tr.state, plan, time.time())
        tr._commit(state)
    v = plan.version
    rl = plan.relayout
    log.info("Trigging version=%d mode=%s key=%d base_version=%s attempt=%d%s%s", v, plan.mode, plan.key,
             plan.base_version, plan.attempt, " (resuming an interrupted rollout)" if resumed else "",
             f" ({plan.reason}, link {rl.link}/{rl.links})" if rl else "")
    t_start = time.monotonic()
    phases: dict[str, float] = {}
    enabled: set[Replica] = set()
    skip: set[Replica] = set()
    try:
        # replicas that already serve v on this layout (an interrupted Enabling) are done
        skip = {i for i, (have, shards) in tr.agents.served(tr.replicas).items() if have == v and shards == n}
        t = time.monotonic()
        _enter(tr, plan, Phase.BUILDING)
        build = tr.builder.build(plan)
        phases[Phase.BUILDING.value] = time.monotonic() - t
        log.info("Building version=%d finished: %s keys, %d shards, dim %s in %.2f s", v, build.count,
                 len(build.tars), build.dim, phases[Phase.BUILDING.value])
        t = time.monotonic()
        _enter(tr, plan, Phase.DEPLOYING)
        ship = tr.builder.publish(build, plan)
        phases[Phase.DEPLOYING.value] = time.monotonic() - t
        log.info("Deploying version=%d finished: %d shard tars published in %.2f s", v, len(ship.urls),
                 phases[Phase.DEPLOYING.value])
        todo = [i for i in tr.replicas if i not in skip]
        for phase in (Phase.DOWNLOADING, Phase.RELOADING, Phase.ENABLING):
            t = time.monotonic()
            _enter(tr, plan, phase)
            try:
                tr.agents.barrier(phase, todo, plan, ship, tr.phase_timeout_s,
                                    enabled if phase == Phase.ENABLING else None)
            except RolloutError as exc:
                if phase == Phase.ENABLING and (enabled or skip):
                    raise PartialEnable(str(exc), enabled | skip) from exc
                raise
            phases[phase.value] = time.monotonic() - t
    except PartialEnable as part:
        return _partial(tr, plan, part, phases, resumed)
    except Exception as exc:  # noqa: BLE001 - any failure aborts; the old version keeps serving
        return _failed(tr, plan, exc, phases, resumed)
    total = time.monotonic() - t_start
    now = time.time()
    with tr.lock:
        state, entry, events = planner.finished(
            tr.state, plan, shard_num=n, dim=build.dim, count=build.count, urls=ship.urls, md5s=ship.md5s,
            phases=phases, skipped=(i.name for i in skip), resumed=resumed, now=now, seconds=total)
        tr._commit(state)
    rec, tr._reported = tr.records.get(v), v
    tr.metrics.rollout_done("finished", total, phases)
    tr.metrics.served(v, rec.data_end if rec else None, rec.landed if rec else None, now)
    log.info("Finished version=%d mode=%s%s: %d replicas serve it, %.2f s (%s)", v, plan.mode,
             f" ({plan.reason})" if plan.reason else "", len(tr.replicas), total,
             ", ".join(f"{k} {s:.2f} s" for k, s in phases.items()))
    tr._emit(events)
    from runtime import tracking

    tracking.log_rollout(tr.tracker, v, plan.mode, total, phases,
                         now - rec.landed if rec is not None and rec.landed is not None else None)
    tr.builder.cleanup(keep_relayout=tr.state.relayout is not None)
    tr.prune()
    return entry.to_json()


def _partial(tr, plan: Plan, part: PartialEnable, phases: dict, resumed: bool) -> dict:
    with tr.lock:
        state, entry = planner.partial(tr.state, plan, error=str(part), shard_num=tr.shard_num,
                                       phases=phases, enabled=(i.name for i in part.enabled),
                                       resumed=resumed, now=time.time())
        tr._commit(state)
    tr.metrics.rollout_done("partial", None, phases)
    log.error("Enabling version=%d incomplete (%d/%d replicas switched): %s; driven again at the next poll",
              plan.version, len(part.enabled), len(tr.replicas), part)
    return entry.to_json()


def _failed(tr, plan: Plan, exc: Exception, phases: dict, resumed: bool) -> dict:
    """A rollout aborted: the previous version keeps serving; retried after its backoff,
    except a version refused for not matching its manifest (``VersionRefused``: given
    up at once, history ``refused``)."""
    err = str(exc) if isinstance(exc, RolloutError) else f"{plan.phase.value}: {type(exc).__name__}: {exc}"
    refused = isinstance(exc, VersionRefused)
    tr.agents.abort(tr.replicas, plan.version)
    tr.builder.discard(plan)  # a retry rebuilds from the inputs
    with tr.lock:
        state, entry = planner.failed(tr.state, plan, error=err, shard_num=tr.shard_num, phases=phases,
                                      resumed=resumed,
                                      max_rollout_attempts=1 if refused else tr.max_rollout_attempts,
                                      backoff_s=tr.rollout_backoff_s, now=time.time(),
                                      status="refused" if refused else "failed")
        tr._commit(state)
        served = state.served.version if state.served else None
    tr.metrics.rollout_done("refused" if refused else "failed", None, phases, given_up=bool(entry.given_up))
    log.error("Aborted version=%d%s attempt=%d/%d: %s; version %s keeps serving%s", plan.version,
              f" ({plan.reason})" if plan.reason else "", plan.attempt, tr.max_rollout_attempts, err, served,
              " (given up)" if entry.given_up else "")
    return entry.to_json()
