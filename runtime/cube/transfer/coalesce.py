"""Bounded lag: the patches queued at the transfer go out as one rollout.

When patches are published faster than they roll out, the planner
(``runtime.cube.transfer.planner``) would roll them out one by one, each paying the fixed
cost of a rollout, and the served version would fall further behind with every patch.
Instead, a patch rollout about to start takes every patch line queued behind it (same
base, above the served version, in the donefile's order, up to the first one given up)
and folds them into one (``runtime.formats.donefile.fold``): the rollout carries the
newest line's id, dense model and data time, its build reads every folded line's
SequenceFiles oldest first so that the newest row of a key wins, and the history, the
served chain and ``/dict/info`` name the folded ids (``coalesced``). The served lag is then
at most one rollout plus the time to build the rows published meanwhile, whatever the
rate of patches. The versions folded in are never served on their own: a client pinned
to one version per batch sees the served version jump from the last one served to the
newest, as it would if the trainer had exported once.

``--no-coalesce`` (``Transfer(coalesce=False)``) keeps one rollout per patch. A rollout
already under way, a re-layout link and a base are never widened; a widened rollout that
fails waits for its backoff like any other (keyed by its version, the newest line).
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

from runtime.cube.transfer.state import Phase, Plan, TransferState
from runtime.formats.donefile import DonefileRecord, fold


def widen(plan: Optional[Plan], patches: list[DonefileRecord], served_version: Optional[int],
          base_id: Optional[int], given_up: set[int], retry_after: dict[str, float], now: float,
          held: Optional[Callable[[DonefileRecord], bool]] = None) -> Optional[Plan]:
    """``plan`` with the patch lines queued behind it folded in (module docstring), or
    ``plan`` itself when there is nothing to fold or it must not be widened; None when the
    widened rollout failed before and waits for its backoff (``retry_after``: attempt key
    -> unix s). ``patches``: the patch donefile's lines in file order; ``served_version`` /
    ``base_id``: what is served; ``now``: unix s; ``held(rec)``: the model gate's verdict
    (a held patch inside the run is folded in, as the planner carries it; the run never
    ends on one, so a held version is never served)."""
    if (plan is None or plan.mode != "delta" or plan.reason or plan.relayout is not None or plan.coalesced
            or plan.phase != Phase.TRIGGING or served_version is None or plan.key != base_id):
        return plan
    run: list[DonefileRecord] = []
    for p in patches:
        if p.key != base_id or p.id < plan.version:  # held patches before it ride in plan.carry
            continue
        if p.id in given_up or (run and p.id <= run[-1].id):
            break
        run.append(p)
    while run and held is not None and held(run[-1]):
        run.pop()
    if len(run) < 2 or run[0].id != plan.version:
        return plan
    newest, ids, inputs = fold(run)
    wide = plan.model_copy(update={"version": newest.id, "input": newest.input, "model": newest.model,
                                   "coalesced": ids, "coalesced_inputs": inputs[:-1]})
    if now < retry_after.get(wide.akey, 0.0):
        return None
    return wide


def widen_planned(plan: Plan, st: TransferState, patches: list[DonefileRecord], now: float,
                  held: Optional[Callable[[DonefileRecord], bool]], log_once: Callable) -> Optional[Plan]:
    """``widen`` of the planner's ``plan`` against the transfer state ``st`` (served version,
    given-up ids, backoffs); ``log_once(key, level, msg, *args)`` logs the fold once."""
    served = st.served
    wide = widen(plan, patches, served.version if served else None, served.base_id if served else None,
                 set(st.given_up), st.retry_after, now, held=held)
    if wide is not None and wide.coalesced:
        log_once(("coalesce", wide.version, tuple(wide.coalesced)), logging.INFO, "Coalescing patches %s into the "
                 "rollout of patch %d (queued behind the served version %d)", wide.coalesced, wide.version,
                 served.version)
    return wide
