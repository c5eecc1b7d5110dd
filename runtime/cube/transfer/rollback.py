"""Rollback and pinning: the transfer serves a chosen version instead of following
training, until the pin is lifted.

A pin (``state.Pin``) comes from ``POST /rollback {"version": V}`` (``elastic-ctr
rollback --to V``) or from ``--pin-version V`` (the stack's ``servedVersion``); ``POST
/rollback {"version": null}`` or a start without the flag (for a pin the flag set)
lifts it, and the donefiles are followed again from the served version (patches of its
base after it, or a newer base).

While a version is pinned, no other version is rolled out (nor a re-layout driven);
if the pinned version is not the served one, its chain (its base, then every patch of
that base up to it, in order, from the version's published SequenceFiles, each checked
against its manifest) is built into one base dict of version V (the builder's last
record of a key wins, so it holds exactly the rows the chain leaves), published under
``ROOT/cube/<dict>/<V>-chain/`` and rolled out to every shard x replica with the barriers
of a rollout: Downloading, Reloading, Enabling. Serving keeps answering the version it
serves (each server keeps it answerable beside the new one until the next load) and
switches once ``/dict/info`` announces V: no failed request. One base instead of the
chain's links replayed one by one: a server holds the served version and the one
before it, so replaying three links would drop the version serving still asks for.

Afterwards the served chain is that one base (key = the chain's base id), so the
patches of that base published after V apply on it when the pin is lifted. When the pin
is lifted with more than one version waiting, the newest one's chain is laid out the
same way (``catch_up``): one switch instead of patches enabled back to back faster than
serving follows (each load drops the version before the served one, which serving may
still be answering with).

Every function takes ``tr``, the ``runtime.cube.transfer.service.Transfer`` (its state,
lock, builder, agents and metrics).
"""
from __future__ import annotations

import logging
import shutil
import time
from typing import Optional

from runtime import storage
from runtime.cube.buildinfo import FILE as BUILD_FILE
from runtime.cube.buildinfo import BuildRecordError
from runtime.cube.transfer import planner, verify
from runtime.cube.transfer.agents import RolloutError
from runtime.cube.transfer.build import Build, list_inputs
from runtime.cube.transfer.state import Phase, Pin, Plan
from runtime.formats.donefile import DonefileRecord

log = logging.getLogger(__name__)

RETRY_S = 10.0  # seconds before a failed rollback is tried again


class RollbackError(ValueError):
    """A rollback target that cannot be served: unknown, or its chain is incomplete."""


def chain_of(target: int, bases: list[DonefileRecord], patches: list[DonefileRecord]) -> list[DonefileRecord]:
    """``target``'s chain: its base, then every patch of that base with an id up to
    ``target``, in id order. Raises ``RollbackError`` for an id in neither donefile or a
    patch whose base is not in the base donefile."""
    by_id = {r.id: r for r in bases}
    pat = {r.id: r for r in patches}
    if target in by_id:
        return [by_id[target]]
    if target not in pat:
        raise RollbackError(f"version {target} is in neither donefile")
    base = pat[target].key
    if base not in by_id:
        raise RollbackError(f"version {target} is a patch of base {base}, which is not in the base donefile")
    return [by_id[base]] + sorted((p for p in patches if p.key == base and p.id <= target), key=lambda p: p.id)


def set_pin(tr, version: Optional[int], by: str = "api") -> Optional[Pin]:
    """Pins ``version`` (None: lifts the pin) and persists it; the transfer's loop lays
    the version out at its next poll. Raises ``RollbackError`` for a version whose chain
    is not in the donefiles."""
    if version is not None:
        chain_of(int(version), tr._donefile("base"), tr._donefile("patch"))
    with tr.lock:
        st = tr.state.model_copy(deep=True)
        st.pin = None if version is None else Pin(version=int(version), by=by, at=time.time())
        if version is not None:
            st.retry_after.pop(_key(version), None)
        tr._commit(st)
    log.warning("%s", f"version {version} pinned ({by}): served until the pin is lifted" if version is not None
                else "pin lifted: following the donefiles again")
    if version is None:
        tr.catch_up = True
    return st.pin


def apply_flag(tr, pin_version: Optional[int]) -> None:
    """At start: ``--pin-version`` pins its version; without it, a pin the flag set
    earlier is lifted (a pin set through the API stays)."""
    pin = tr.state.pin
    if pin_version is not None:
        if pin is None or pin.version != pin_version or pin.by != "flag":
            with tr.lock:
                st = tr.state.model_copy(deep=True)
                st.pin = Pin(version=int(pin_version), by="flag", at=time.time())
                tr._commit(st)
            log.warning("version %d pinned by --pin-version", pin_version)
    elif pin is not None and pin.by == "flag":
        set_pin(tr, None, "flag")


def catch_up(tr) -> Optional[dict]:
    """After a pin is lifted: when more than one version waits to be rolled out, lays
    out the newest one's chain as one base (module docstring) and returns its history
    entry; None when at most one waits (the planner rolls it out as usual)."""
    bases, patches = tr._donefile("base"), tr._donefile("patch")
    with tr.lock:
        st = tr.state
        served = st.served
        given_up = set(st.given_up)
    if served is None or not bases:
        return None
    base = bases[-1].id if bases[-1].id > served.base_id else served.base_id
    mine = [p.id for p in patches if p.key == base]
    target = max(mine, default=base)
    if target <= served.version:
        return None
    try:
        chain = chain_of(target, bases, patches)
    except RollbackError:
        return None
    waiting = [r.id for r in chain if r.id > served.version] if base == served.base_id else [r.id for r in chain]
    if len(waiting) <= 1 or given_up & {r.id for r in chain}:
        return None
    log.info("Catching up: %d versions wait after the pin was lifted; laying out %d's chain as one base",
             len(waiting), target)
    return lay_out(tr, target, reason=f"catch up to {target}")


def _key(version: Optional[int]) -> str:
    return f"rollback:{version}"


def hold(tr) -> Optional[dict]:
    """One poll while a version is pinned: nothing when it is served; else its chain is
    laid out (``lay_out``). Returns the history entry of a rollback done or failed."""
    with tr.lock:
        st = tr.state
        pin = st.pin
        if pin is None:
            return None
        if st.served is not None and st.served.version == pin.version and st.current is None:
            return None
        if time.time() < st.retry_after.get(_key(pin.version), 0.0):
            return None
        cur = st.current
    if cur is not None:  # an interrupted rollout of another version: dropped, the pin wins
        tr.agents.abort(tr.replicas, cur.version)
        with tr.lock:
            st = tr.state.model_copy(deep=True)
            st.current = None
            tr._commit(st)
        log.warning("Dropping the interrupted rollout of version %d: version %d is pinned", cur.version, pin.version)
    return lay_out(tr, pin.version)


def build_chain(tr, chain: list[DonefileRecord], target: int) -> Build:
    """Builds ``chain`` (base first) into one base dict of version ``target`` under
    ``<work_dir>/build/chains/`` (a finished one is reused). Raises ``RolloutError``
    (``verify.VersionRefused`` for a link that does not match its manifest)."""
    b = tr.builder
    out_root = b.work_dir / "build" / "chains"
    vdir = out_root / b.dict_name / str(target)
    if (vdir / BUILD_FILE).exists():
        try:
            return b._read(vdir)
        except (OSError, BuildRecordError, RolloutError):
            shutil.rmtree(vdir, ignore_errors=True)
    fetched = b.work_dir / "inputs" / f"chain-{target}"
    inputs: list[str] = []
    try:
        for rec in chain:
            man = verify.load_manifest(b.root, rec)
            loc = storage.join(b.root, rec.input)
            try:
                listed = list_inputs(loc)
            except storage.LocationError as exc:
                raise RolloutError(Phase.BUILDING, f"input of version {rec.id} (chain of {target}): {exc}") from exc
            local = listed
            if any(storage.is_remote(i) for i in listed):
                local = b._fetch(listed, fetched / str(rec.id), rec.id)
            if man is not None:
                verify.check_sparse(man, loc, listed, local, rec.count)
                if rec.id == target:
                    verify.check_dense(man, b.root, rec, b.work_dir / "verify")
            inputs += local
        try:
            b.build_fn(inputs, str(out_root), b.dict_name, b.shard_num, target, "base", None)
        except Exception as exc:  # noqa: BLE001 - reported as the rollback's error
            shutil.rmtree(vdir, ignore_errors=True)
            raise RolloutError(Phase.BUILDING, f"chain of version {target}: {type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(fetched, ignore_errors=True)
    try:
        return b._read(vdir)
    except (OSError, BuildRecordError) as exc:
        raise RolloutError(Phase.BUILDING, f"chain of version {target}: no readable build record: {exc}") from exc


def lay_out(tr, target: int, reason: Optional[str] = None) -> dict:
    """Rolls ``target``'s chain out as one base to every shard x replica (module
    docstring); ``reason``: its history entry's (default ``rollback to <target>``).
    Returns its history entry (``finished`` or ``failed``; a failure is retried after
    ``RETRY_S`` while the version is pinned). Never raises for a failed rollback."""
    reason = reason or f"rollback to {target}"
    now = time.time()
    n = tr.shard_num
    phases: dict[str, float] = {}
    t_start = time.monotonic()
    plan = None
    try:
        if tr.state.relayout is not None:
            raise RollbackError("a re-layout for a new shard count is in progress; roll back once it ends")
        chain = chain_of(target, tr._donefile("base"), tr._donefile("patch"))
        last = chain[-1]
        plan = Plan(version=target, key=chain[0].id, mode="base", input=last.input, model=last.model, seen=now,
                    attempt=1, started=now, reason=reason)
        tr.laying_out = plan
        log.info("Rollback to version=%d: chain %s", target, [r.id for r in chain])
        skip = {i for i, (have, shards) in tr.agents.served(tr.replicas).items() if have == target and shards == n}
        t = time.monotonic()
        tr.laying_out = plan = plan.model_copy(update={"phase": Phase.BUILDING})
        build = build_chain(tr, chain, target)
        phases[Phase.BUILDING.value] = time.monotonic() - t
        t = time.monotonic()
        ship = tr.builder.publish(build, plan, name=f"{target}-chain")
        phases[Phase.DEPLOYING.value] = time.monotonic() - t
        todo = [i for i in tr.replicas if i not in skip]
        enabled: set = set()
        for phase in (Phase.DOWNLOADING, Phase.RELOADING, Phase.ENABLING):
            t = time.monotonic()
            tr.laying_out = plan = plan.model_copy(update={"phase": phase})
            tr.metrics.in_phase(phase.value.lower())
            tr.agents.barrier(phase, todo, plan, ship, tr.phase_timeout_s, enabled if phase == Phase.ENABLING else None)
            phases[phase.value] = time.monotonic() - t
    except Exception as exc:  # noqa: BLE001 - the served version keeps serving; retried later
        tr.laying_out = None
        return _failed(tr, target, plan, exc, phases, now, reason)
    total = time.monotonic() - t_start
    done = time.time()
    with tr.lock:
        st, entry, _ = planner.finished(tr.state, plan, shard_num=n, dim=build.dim, count=build.count,
                                        urls=ship.urls, md5s=ship.md5s, phases=phases,
                                        skipped=(i.name for i in skip), resumed=False, now=done, seconds=total)
        base = chain[0].id
        st.served = st.served.model_copy(update={"base_id": base, "patch_id": None if target == base else target})
        st.served_chain[-1] = st.served_chain[-1].model_copy(update={"key": base})
        tr._commit(st)
        tr.laying_out = None
    rec = tr.records.get(target)
    tr.metrics.rollout_done("finished", total, phases)
    tr.metrics.served(target, rec.data_end if rec else None, rec.landed if rec else None, done)
    log.info("Finished version=%d (%s: chain of %d links as one base): %d replicas serve it, %.2f s",
             target, reason, len(chain), len(tr.replicas), total)
    chains = tr.builder.work_dir / "build" / "chains" / tr.dict_name
    for old in (chains.iterdir() if chains.is_dir() else []):
        if old.name != str(target):
            shutil.rmtree(old, ignore_errors=True)
    tr.prune()
    return entry.to_json()


def _failed(tr, target: int, plan: Optional[Plan], exc: Exception, phases: dict, now: float, reason: str) -> dict:
    from runtime.cube.transfer.state import HistoryEntry

    err = str(exc) if isinstance(exc, (RolloutError, RollbackError)) else f"{type(exc).__name__}: {exc}"
    if plan is not None:
        tr.agents.abort(tr.replicas, target)
    with tr.lock:
        st = tr.state.model_copy(deep=True)
        st.retry_after[_key(target)] = time.time() + RETRY_S
        entry = HistoryEntry(version=target, mode="base", status="failed", key=plan.key if plan else None,
                             started=now, finished=time.time(), reason=reason, error=err,
                             phases={k: round(s, 3) for k, s in phases.items()}, shard_num=tr.shard_num)
        st.add_history(entry)
        tr._commit(st)
        served = st.served.version if st.served else None
    tr.metrics.rollout_done("failed", None, phases)
    log.error("Aborted version=%d (%s): %s; version %s keeps serving", target, reason, err, served)
    return entry.to_json()


def request_rollback(transfer_url: str, version: Optional[int], wait_s: float = 300.0, poll_s: float = 0.5) -> int:
    """``elastic-ctr rollback``: ``POST <transfer_url>/rollback {"version": version}``
    with the ``cube-control`` credential of ``$ELASTIC_CTR_CREDENTIALS_DIR`` (none sent
    when it is not configured: an ``--insecure-no-auth`` transfer), None lifting the pin;
    then, for a version, waits up to ``wait_s`` seconds until ``/dict/info`` serves it.
    Prints what happened; returns 0 (done), 1 (refused, failed or not served in time) or 2
    (the transfer unreachable, or the credential missing or wrong: HTTP 401/403)."""
    import sys

    import requests

    from runtime import auth, role_specs
    from runtime.formats.dict_info import DictInfoError, fetch_dict_info

    url = transfer_url.rstrip("/") + "/rollback"
    headers = auth.Credential(role_specs.CUBE_CONTROL).headers()
    try:
        r = storage.session().post(url, json={"version": version}, headers=headers, timeout=10)
    except requests.RequestException as exc:
        from runtime.errors import connection_reason

        print(f"elastic-ctr rollback: error: --transfer-url {transfer_url}: unreachable ({connection_reason(exc)}); "
              f"on a cluster, port-forward the transfer first (docs: Rollback on a cluster)", file=sys.stderr)
        return 2
    if r.status_code != 202:
        try:
            why = r.json().get("error")
        except ValueError:
            why = r.text[:200]
        hint = ""
        if r.status_code in (401, 403):
            hint = (f" (the {role_specs.CUBE_CONTROL} credential is read from "
                    f"{auth.credentials_dir() / role_specs.CUBE_CONTROL}/current: set "
                    f"${role_specs.CREDENTIALS_DIR_ENV} to the directory holding it)")
        print(f"elastic-ctr rollback: refused: HTTP {r.status_code}: {why}{hint}", file=sys.stderr)
        return 2 if r.status_code in (401, 403) else 1
    if version is None:
        print(f"pin lifted: the transfer follows the donefiles again (serving {r.json().get('served')})")
        return 0
    deadline = time.monotonic() + max(0.0, wait_s)
    print(f"version {version} pinned (serving {r.json().get('served')}); waiting until every replica serves it")
    while True:
        try:
            info = fetch_dict_info(transfer_url, timeout_s=5, session=storage.session())
        except DictInfoError as exc:
            info, err = None, str(exc)
        if info is not None:
            if info.version == version:
                print(f"version {version} is served (pinned; `elastic-ctr rollback --follow` to follow training)")
                return 0
            last = info.last_rollout
            if last is not None and last.version == version and last.status == "failed":
                err = f"the rollback failed: {last.error} (retried by the transfer)"
            else:
                err = f"serving {info.version}"
        if wait_s <= 0:
            return 0
        if time.monotonic() >= deadline:
            print(f"elastic-ctr rollback: version {version} not served after {wait_s:.0f} s: {err}", file=sys.stderr)
            return 1
        time.sleep(poll_s)
