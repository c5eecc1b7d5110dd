"""What the transfer does next, as pure functions of its state and the donefiles.

Donefile rules (the protocol of Paddle Serving's cube-transfer; lines:
``runtime.formats.donefile``):

- base.txt: the last valid line is the newest base. It is rolled out when its id is above
  the served base id (older bases in between are skipped).
- patch.txt: the lines whose ``key`` is the served base and whose ``id`` is above the
  served version, in file order, one rollout each. A patch naming another base (neither
  the served one nor a newer base about to go out) is refused once (history
  ``refused``). A given-up patch holds back the later patches of its base: they would be
  applied without its changes. A version the model gate holds (``held``:
  ``runtime.cube.transfer.model_gate``) is not rolled out: a held base is passed over
  (its patches wait for a newer base), a held patch's rows go out with the next patch of
  its base that passes (``Plan.carry``).
- A pending re-layout (the served chain laid out for another shard count than the
  topology's: a new cube layout beside the serving one) comes first: the served
  base, then each of its patches up to the served version, rebuilt for the new count,
  same ids. Versions published meanwhile (bases and patches) are HELD until its last link
  is enabled, then rolled out on the new layout only: the previous layout keeps the
  version it serves, untouched, until it is deleted. Only a given-up re-layout (its
  chain cannot be rebuilt) lets a newer base through, which replaces the chain. Back to
  the previous shard count before the re-layout ended: the previous layout is served
  again as it was (``Relayout.before``), nothing is rebuilt.

Every function takes the state and returns a new one (the input is never modified), with
``Event``s for the caller to log (once per ``key``) and count. The caller persists the
state and does the I/O.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from runtime.cube.transfer.state import (ChainLink, HistoryEntry, Phase, Plan, Relayout, RelayoutLink,
                                         RelayoutRef, Served, TransferState)
from runtime.formats.donefile import DonefileRecord

#: the longest wait between two attempts of a failed rollout (s)
MAX_BACKOFF_S = 300.0


@dataclass(frozen=True)
class Event:
    """Something to log: ``level`` (logging), ``message``; ``key``: log it once per key
    (None: every time); ``counter``: a rollout outcome to count (refused, failed)."""

    level: int
    message: str
    key: Optional[tuple] = None
    counter: Optional[str] = None


@dataclass
class Decision:
    """The next rollout (``plan``, None: nothing to do now), the new ``state``, whether it
    changed (``changed``: persist it) and the ``events``."""

    state: TransferState
    plan: Optional[Plan] = None
    changed: bool = False
    events: list[Event] = field(default_factory=list)


def relayout_name(version: int, shard_num: int) -> str:
    """Build/publish directory of a re-layout of ``version`` for ``shard_num`` shards:
    ``<version>-<shard_num>shards`` (an original rollout uses ``<version>``)."""
    return f"{version}-{shard_num}shards"


def _plan(rec: DonefileRecord, mode: str, base_version: Optional[int], now: float) -> Plan:
    return Plan(version=rec.id, key=rec.key, mode=mode, base_version=base_version, input=rec.input,
                model=rec.model, seen=now)


def next_rollout(state: TransferState, bases: list[DonefileRecord], patches: list[DonefileRecord],
                 shard_num: int, max_rollout_attempts: int, now: float,
                 held: Optional[Callable[[DonefileRecord], bool]] = None) -> Decision:
    """The rollout to do (or resume) now, for a topology of ``shard_num`` shards (module
    docstring). ``now``: unix s; ``held(rec)``: the model gate's verdict (None: none held)."""
    held = held or (lambda rec: False)
    d = Decision(state=state.model_copy(deep=True))
    st = d.state
    cur = st.current
    if cur is not None:
        have = st.served_shard_num()
        # an interrupted rollout that cannot work on this topology any more: a re-layout for
        # another shard count, or a patch on a base that is laid out for another count
        if (cur.relayout and cur.relayout.to != shard_num) or (
                not cur.relayout and cur.mode == "delta" and have is not None and have != shard_num):
            d.events.append(Event(logging.WARNING, f"Dropping the interrupted rollout of version {cur.version} "
                                  f"({cur.reason or cur.mode}): the topology now has {shard_num} shards"))
            st.current, d.changed = None, True
        else:
            d.plan = cur.model_copy(deep=True)
            return d
    served = st.served
    blocking = False
    if served is not None:
        blocking = _relayout_next(d, bases, patches, shard_num, now)
        served = st.served  # a re-layout dropped on the way back restores the previous one
        if blocking and not (st.relayout is not None and st.relayout.given_up):
            return d  # held: nothing new goes out until the served chain is laid out anew
    given_up = set(st.given_up)
    if bases:
        newest = bases[-1]
        if (served is None or newest.id > served.base_id) and newest.id not in given_up and not held(newest):
            d.plan = _ready(st, _plan(newest, "base", None, now), now)
            return d
        if newest.id in given_up:
            d.events.append(Event(logging.ERROR, f"base {newest.id} was given up after {max_rollout_attempts} "
                                  "failed rollouts; waiting for a newer base", key=("gaveup", newest.id)))
    if served is None or blocking:
        return d  # patches wait until the served chain is laid out for this topology
    base_ids = {b.id for b in bases}
    carry: list[DonefileRecord] = []  # held patches of the served base, in order
    for p in patches:
        if p.id <= served.version:
            continue
        if p.key != served.base_id:
            if p.key > served.base_id and p.key in base_ids:
                continue  # for a newer base; rolled out after that base
            _refuse(d, p, now)
            continue
        if p.id in given_up:
            d.events.append(Event(logging.ERROR, f"patch {p.id} was given up; later patches of base "
                                  f"{served.base_id} are held back (they would be applied without its "
                                  "changes) until a new base", key=("gaveup", p.id)))
            return d
        if held(p):
            carry.append(p)
            continue
        plan = _plan(p, "delta", served.version, now)
        plan.carry, plan.carry_versions = [c.input for c in carry], [c.id for c in carry]
        d.plan = _ready(st, plan, now)
        return d
    return d


def _ready(st: TransferState, plan: Plan, now: float) -> Optional[Plan]:
    """``plan``, or None while a failed rollout of it waits for its backoff."""
    return None if now < st.retry_after.get(plan.akey, 0.0) else plan


def _refuse(d: Decision, rec: DonefileRecord, now: float) -> None:
    st = d.state
    if rec.id in st.refused:
        return
    st.refused.append(rec.id)
    del st.refused[:-1000]
    served = st.served
    msg = (f"patch {rec.id} refused: its base {rec.key} is not the served base "
           f"{served.base_id if served else None} (served version {served.version if served else None})")
    st.add_history(HistoryEntry(version=rec.id, mode="delta", key=rec.key, status="refused", error=msg,
                                started=now, finished=now))
    d.events.append(Event(logging.WARNING, msg, counter="refused"))
    d.changed = True


def relayout_links(st: TransferState, bases: list[DonefileRecord],
                   patches: list[DonefileRecord]) -> list[RelayoutLink]:
    """The links of the served chain to roll out again, base first: from the served chain
    (links record their donefile fields since re-layouts exist; older ones are looked up
    in the donefiles by id), else rebuilt from the donefiles (the served base's line, then
    its patches up to the served version, in file order). Raises ``ValueError`` naming
    the version whose line is missing."""
    served = st.served
    assert served is not None
    target, base_id = served.version, served.base_id
    chain: list[ChainLink] = list(st.served_chain)
    by_id = {("base", b.id): b for b in bases}
    by_id.update({("delta", p.id): p for p in patches})
    if not chain or chain[-1].version != target:
        lines = [b for b in bases if b.id == base_id][-1:]
        lines += [p for p in patches if p.key == base_id and base_id < p.id <= target]
        chain, prev = [], None
        for i, rec in enumerate(lines):
            chain.append(ChainLink(version=rec.id, mode="base" if i == 0 else "delta", base_version=prev))
            prev = rec.id
        if not chain or chain[0].mode != "base" or chain[-1].version != target:
            raise ValueError(f"the donefile has no base line {base_id} and patch lines up to {target}")
    links = []
    for c in chain:
        rec = by_id.get((c.mode, c.version))
        inp = c.input or (rec.input if rec else None)
        if not inp:
            raise ValueError(f"no input for {c.mode} {c.version}: its line is not in donefile/"
                             f"{'base' if c.mode == 'base' else 'patch'}.txt")
        key = c.version if c.mode == "base" else (c.key or (rec.key if rec else None) or base_id)
        links.append(RelayoutLink(version=c.version, mode=c.mode, key=key, base_version=c.base_version,
                                  input=inp, model=c.model or (rec.model if rec else None),
                                  coalesced=list(c.coalesced), coalesced_inputs=list(c.coalesced_inputs)))
    return links


def _relayout_next(d: Decision, bases: list[DonefileRecord], patches: list[DonefileRecord], n: int,
                   now: float) -> bool:
    """Plans the next link of a re-layout into ``d.plan``. Returns True while a re-layout
    is pending (the served chain is not laid out for ``n`` shards: patches must wait);
    ``d.plan`` stays None while its backoff runs or once it is given up."""
    st = d.state
    served = st.served
    have = st.served_shard_num()
    rl = st.relayout
    if rl is not None and rl.to != n:
        back = rl.before is not None and rl.before.shard_num == n and rl.before.version == rl.target
        if back or (have == n and served is not None and served.version == rl.target):
            if back:  # the previous layout still serves it: its record and chain again
                st.served, st.served_chain = rl.before.model_copy(deep=True), list(rl.before_chain)
                served, have = st.served, n
            d.events.append(Event(logging.INFO, f"Re-layout {rl.from_}->{rl.to} shards dropped: the topology is "
                                  f"back to {n} shards, on which version {rl.target} is served"))
            rl = st.relayout = None
        else:
            d.events.append(Event(logging.WARNING, f"Re-layout of version {rl.target} restarted for {n} shards "
                                  f"(it was for {rl.to})"))
            rl.from_ = rl.before.shard_num if rl.before is not None else have
            rl.to, rl.next, rl.started = n, 0, now
            if rl.links:  # the chain to the target, as found when it started (not given up for that)
                rl.given_up, rl.error = False, None
        d.changed = True
    if rl is None:
        if served is None or have is None or have == n:
            return False
        rl = Relayout(from_=have, to=n, target=served.version, started=now, before=served.model_copy(deep=True),
                      before_chain=[c.model_copy(deep=True) for c in st.served_chain])
        if rl.before.shard_num is None:
            rl.before.shard_num = have
        try:
            rl.links = relayout_links(st, bases, patches)
        except ValueError as exc:
            rl.given_up, rl.error = True, f"cannot re-lay out version {served.version}: {exc}"
            st.add_history(HistoryEntry(version=served.version, mode="base", status="failed",
                                        reason=f"relayout {have}->{n} shards", error=rl.error, given_up=True,
                                        started=now, finished=now))
            d.events.append(Event(logging.ERROR, f"Re-layout {have}->{n} shards: {rl.error}; waiting for a new base",
                                  counter="failed"))
        else:
            d.events.append(Event(logging.WARNING, f"Re-layout: version {served.version} is served on {have} shards, "
                                  f"the topology has {n}; rolling its chain {[c.version for c in rl.links]} out "
                                  f"again for {n} shards (the {have}-shard layout keeps serving it meanwhile; versions "
                                  "published meanwhile wait)"))
        st.relayout = rl
        d.changed = True
    if rl.given_up:
        d.events.append(Event(logging.ERROR, f"re-layout of version {rl.target} for {n} shards was given up "
                              f"({rl.error}); waiting for a newer base", key=("relayout-gaveup", rl.target, n)))
        return True
    link = rl.links[rl.next]
    key = f"relayout-{n}:{link.version}"
    if now < st.retry_after.get(key, 0.0):
        return True
    d.plan = Plan(version=link.version, key=link.key, mode=link.mode, base_version=link.base_version,
                  input=link.input, model=link.model, seen=now, attempt_key=key,
                  coalesced=list(link.coalesced), coalesced_inputs=list(link.coalesced_inputs),
                  reason=f"relayout {rl.from_}->{n} shards",
                  relayout=RelayoutRef(from_=rl.from_, to=n, target=rl.target, link=rl.next + 1,
                                       links=len(rl.links)))
    return True


# ------------------------------------------------------------------------------ outcomes


def begin(st: TransferState, plan: Plan, now: float) -> tuple[TransferState, Plan]:
    """A rollout of ``plan`` starts (or resumes): its attempt is counted and it becomes
    ``current``."""
    st = st.model_copy(deep=True)
    plan = plan.model_copy(deep=True)
    plan.attempt = st.attempts.get(plan.akey, 0) + 1
    st.attempts[plan.akey] = plan.attempt
    plan.started = now
    st.current = plan
    return st, plan


def at_phase(st: TransferState, plan: Plan, phase: Phase) -> TransferState:
    """``plan`` reached ``phase`` (persisted, so a restart resumes from there)."""
    st = st.model_copy(deep=True)
    plan.phase = phase
    st.current = plan.model_copy(deep=True)
    return st


def _entry(plan: Plan, shard_num: int, resumed: bool) -> HistoryEntry:
    e = HistoryEntry(version=plan.version, mode=plan.mode, key=plan.key, base_version=plan.base_version,
                     attempt=plan.attempt, started=plan.started, resumed=resumed, shard_num=shard_num)
    if plan.coalesced:
        e.coalesced = list(plan.coalesced)
    if plan.reason:
        e.reason = plan.reason
        e.relayout = plan.relayout.model_dump(by_alias=True) if plan.relayout else None
    return e


def finished(st: TransferState, plan: Plan, *, shard_num: int, dim: Optional[int], count: Optional[int],
             urls: list[str], md5s: list[str], phases: dict[str, float], skipped: Iterable[str],
             resumed: bool, now: float, seconds: float) -> tuple[TransferState, HistoryEntry, list[Event]]:
    """Every replica serves ``plan``'s version: it becomes the served version, its link
    extends the served chain (a base starts a new one), a re-layout moves on."""
    st = st.model_copy(deep=True)
    events: list[Event] = []
    before = st.served
    st.served = Served(version=plan.version, base_id=plan.version if plan.mode == "base" else plan.key,
                       patch_id=None if plan.mode == "base" else plan.version, dim=dim,
                       count=count if plan.mode == "base" else (before.count if before else None),
                       model=plan.model, enabled_at=now, shard_num=shard_num)
    link = ChainLink(version=plan.version, mode=plan.mode, base_version=plan.base_version, urls=urls, md5s=md5s,
                     key=plan.key, input=plan.input, model=plan.model, shard_num=shard_num,
                     coalesced=list(plan.coalesced), coalesced_inputs=list(plan.coalesced_inputs))
    st.served_chain = ([] if plan.mode == "base" else st.served_chain) + [link]
    st.current = None
    rl = st.relayout
    if plan.reason and rl is not None and rl.to == shard_num:
        rl.next += 1
        if rl.next >= len(rl.links):
            st.relayout = None
            events.append(Event(logging.INFO, f"Re-layout finished: version {plan.version} is served on "
                                f"{shard_num} shards"))
    elif plan.mode == "base" and rl is not None:
        events.append(Event(logging.INFO, f"Re-layout of version {rl.target} superseded by base {plan.version}, "
                            f"rolled out for {shard_num} shards"))
        st.relayout = None
    entry = _entry(plan, shard_num, resumed)
    entry.status, entry.finished = "finished", now
    entry.seconds = round(seconds, 3)
    entry.since_seen = round(now - plan.seen, 3)
    entry.phases = {k: round(s, 3) for k, s in phases.items()}
    entry.count, entry.skipped = count, sorted(skipped)
    st.add_history(entry)
    return st, entry, events


def failed(st: TransferState, plan: Plan, *, error: str, shard_num: int, phases: dict[str, float],
           resumed: bool, max_rollout_attempts: int, backoff_s: float,
           now: float, status: str = "failed") -> tuple[TransferState, HistoryEntry]:
    """The rollout aborted before any replica switched: it waits for its backoff (doubled
    per attempt, at most ``MAX_BACKOFF_S``), and after ``max_rollout_attempts`` it is
    given up (never a re-layout link: without it the cube serves nothing). ``status``:
    the history entry's (``refused``: the version is not whole)."""
    st = st.model_copy(deep=True)
    gave_up = plan.attempt >= max_rollout_attempts and not plan.reason
    if gave_up and plan.version not in st.given_up:
        st.given_up.append(plan.version)
    st.retry_after[plan.akey] = now + min(MAX_BACKOFF_S, backoff_s * 2 ** (plan.attempt - 1))
    st.current = None
    entry = _entry(plan, shard_num, resumed)
    entry.status, entry.finished, entry.error, entry.phases, entry.given_up = status, now, error, phases, gave_up
    st.add_history(entry)
    return st, entry


def partial(st: TransferState, plan: Plan, *, error: str, shard_num: int, phases: dict[str, float],
            enabled: Iterable[str], resumed: bool, now: float) -> tuple[TransferState, HistoryEntry]:
    """Enabling failed after some replicas switched: it cannot be undone, so the rollout
    stays ``current`` and is driven again at the next poll."""
    st = st.model_copy(deep=True)
    entry = _entry(plan, shard_num, resumed)
    entry.status, entry.finished, entry.error, entry.phases = "partial", now, error, phases
    entry.enabled = sorted(enabled)
    st.add_history(entry)
    return st, entry
