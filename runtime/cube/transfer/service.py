"""The transfer's loop: poll the donefiles, roll each new version out to every shard x
replica through the phases (each a barrier), bring lagging replicas back, report.

A rollout of version V (one at a time): Building (the builder, ``build.py``), Deploying
(the shard tars published), Downloading, Reloading, Enabling (every agent driven through
the step, ``agents.py``; nothing is enabled until every replica has loaded), Finished (V
is the served version; ``phases.py`` drives one rollout). A failure before Enabling
aborts: every agent unloads, the previous version keeps serving, V is retried after its
backoff and given up after ``max_rollout_attempts`` (``planner.failed``). A failure
during Enabling (some replicas switched) cannot be undone: the rollout stays current and
is driven again at every poll until every replica serves V (those already serving it are
skipped). No rollout starts while a reachable server runs with another ``--shard-num``
than the topology's (its pod has not restarted yet after a resize; ``/dict/info``
``waiting_for``).

Reconciling: at start and every ``reconcile_interval_s`` a replica serving something
other than the served version (a server restarted empty, a replica added by a resize) is
driven alone through the links of the served chain it lacks, from the tars already
published; the client's version-checked failover keeps it out of traffic meanwhile.

A new shard count (a new cube layout beside the serving one, ``planner``): the
served chain is laid out again on the new topology while the previous layout keeps
serving, untouched; versions published meanwhile are held until it ends, and
``/dict/info`` keeps announcing the previous layout's version and shard count until then.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import requests

from runtime import storage
from runtime.cube.transfer import coalesce, phases, planner, retention, rollback
from runtime.cube.transfer.agents import AgentClient
from runtime.cube.transfer.build import Builder, BuildFn, default_build
from runtime.cube.transfer.model_gate import ModelGate, Thresholds as ModelGateThresholds
from runtime.formats.dict_info import DictInfo, LastRollout, RelayoutInfo, RolloutInfo
from runtime.cube.transfer.planner import Event
from runtime.cube.transfer.state import STATE_FILE, HistoryEntry, Phase, Plan, TransferState
from runtime.formats import donefile
from runtime.formats.topology import Replica, Topology
from runtime.metrics.transfer import TransferMetrics

log = logging.getLogger(__name__)


class Transfer:
    """The transfer's state machine; ``poll_once`` does one donefile check and at most one
    rollout, ``run`` loops until ``stop`` is set.

    Args:
        topology: a ``runtime.formats.topology`` source (path, document or ``Topology``).
        root: version root (directory or URL); donefiles under ``ROOT/donefile/``.
        work_dir: builds, downloaded inputs and ``transfer_state.json``.
        publish_url: base from which agents download ``cube/<dict>/<V>/...`` (default root).
        token: upload token for a URL root.
        poll_interval_s, phase_timeout_s, rollout_backoff_s, reconcile_interval_s: seconds
            (backoff doubled per attempt, at most 300; reconcile 0 = never).
        retries: attempts per replica and phase; max_rollout_attempts: rollouts per version.
        dict_name: default the topology's. build_fn: the builder (``build.default_build``).
        control: the ``cube-control`` credential presented to the agents
            (``runtime.auth.Credential``; None: none).
        model_gate: the model gate's thresholds (``model_gate.Thresholds``; default on).
        pin_version: the version to serve instead of following the donefiles (``rollback``;
            None: follow them, lifting a pin this flag set before).
        keep_versions: published versions kept under the root (``retention``; 0 = all).
        coalesce: fold the patches queued behind a patch rollout into it
            (``runtime.cube.transfer.coalesce``); False: one rollout per patch.

    Raises ``state.StateError`` for an unreadable state file, ``TopologyError``.
    """

    def __init__(self, topology, root: str, work_dir: str | os.PathLike, publish_url: Optional[str] = None,
                 token: Optional[str] = None, poll_interval_s: float = 2.0, phase_timeout_s: float = 300.0,
                 retries: int = 3, max_rollout_attempts: int = 3, rollout_backoff_s: float = 10.0,
                 reconcile_interval_s: float = 30.0, dict_name: Optional[str] = None,
                 build_fn: Optional[BuildFn] = None, http_timeout_s: float = 10.0, control=None,
                 model_gate: Optional[ModelGateThresholds] = None, pin_version: Optional[int] = None,
                 keep_versions: int = 0, coalesce: bool = True):
        self.topology = Topology.load(topology)
        self.dict_name = dict_name or self.topology.dict_name
        self.replicas = list(self.topology.all_replicas())
        self.shard_num = self.topology.shard_num
        self.root = str(root)
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.poll_interval_s = poll_interval_s
        self.coalesce = coalesce
        self.phase_timeout_s = phase_timeout_s
        self.max_rollout_attempts = max(1, max_rollout_attempts)
        self.rollout_backoff_s = max(0.0, rollout_backoff_s)
        self.reconcile_interval_s = reconcile_interval_s
        self.builder = Builder(self.root, self.work_dir, self.dict_name, self.shard_num, publish_url or self.root,
                               token, build_fn or default_build)
        self.agents = AgentClient(self.dict_name, retries, http_timeout_s, control)
        self.state_path = self.work_dir / STATE_FILE
        self.lock = threading.RLock()
        self.state = TransferState.load(self.state_path)
        self.stop = threading.Event()
        self.last_poll: Optional[float] = None
        self.last_error: Optional[str] = None
        self.waiting_for: list[str] = []  # replicas whose server runs with another --shard-num
        self._logged: set[tuple] = set()
        self.after_phase: Optional[Callable[[Phase, Plan], None]] = None  # test hook
        self.metrics = TransferMetrics()
        self.records: dict[int, donefile.DonefileRecord] = {}  # the donefiles' lines by version id
        self.builder.records = self.records  # a version whose line names a manifest is verified
        self._reported: Optional[int] = None  # the served version whose data time the metrics have
        from runtime import tracking  # MLflow only when $MLFLOW_TRACKING_URI is set

        self.tracker = tracking.start_transfer(str(self.work_dir), self.dict_name)
        self.gate = ModelGate(self.root, model_gate or ModelGateThresholds(), on_held=self._held)
        self._newly_held: list[tuple[donefile.DonefileRecord, list[str]]] = []
        if self.state.served is not None:
            self.metrics.version.set(self.state.served.version)
        self.keep_versions = max(0, int(keep_versions))
        self.deleted: set[int] = set()  # versions removed by retention
        self.catch_up = False  # a pin was lifted: a backlog goes out as one base (rollback.catch_up)
        self.laying_out: Optional[Plan] = None  # a rollback in progress (rollback.lay_out), for /dict/info
        rollback.apply_flag(self, pin_version)

    # ---------------------------------------------------------------- plumbing

    @property
    def build_fn(self) -> BuildFn:
        return self.builder.build_fn

    @build_fn.setter
    def build_fn(self, fn: BuildFn) -> None:
        self.builder.build_fn = fn

    def _commit(self, state: TransferState) -> None:
        """Makes ``state`` current and persists it."""
        with self.lock:
            self.state = state
            state.save(self.state_path)

    def _emit(self, events: list[Event]) -> None:
        for e in events:
            if e.key is not None:
                if e.key in self._logged:
                    continue
                self._logged.add(e.key)
            log.log(e.level, "%s", e.message)
            if e.counter:
                self.metrics.rollout_done(e.counter, None, {})

    def _log_once(self, key: tuple, level: int, msg: str, *args) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)

    def _donefile(self, kind: str) -> list[donefile.DonefileRecord]:
        loc = donefile.location(self.root, kind)
        try:
            text = storage.read_bytes(loc).decode("utf-8", "replace")
        except storage.LocationError as exc:
            if storage.is_remote(loc) and not isinstance(exc, storage.LocationNotFound):
                self._log_once(("read", loc, str(exc)), logging.WARNING, "donefile %s: %s", loc, exc)
            return []
        records, errors = donefile.parse(text)
        self.records.update((r.id, r) for r in records)
        for n, why, line in errors:
            key = ("malformed", loc, n, line)
            if key not in self._logged:
                self.metrics.malformed.inc()
            self._log_once(key, logging.WARNING, "donefile %s line %d skipped: %s: %r", loc, n, why, line)
        return records

    # ---------------------------------------------------------------- the loop

    def next_plan(self) -> Optional[Plan]:
        """The next rollout to do (or resume), or None; applies what planning decided
        (refused patches, a re-layout started or dropped)."""
        with self.lock:
            state = self.state
        bases, patches = self._donefile("base"), self._donefile("patch")
        now = time.time()
        d = planner.next_rollout(state, bases, patches, self.shard_num, self.max_rollout_attempts, now,
                                 held=self.gate.held)
        if d.changed:
            self._commit(d.state)
        self._emit(d.events)
        if self._newly_held:
            self._record_held()
        plan = d.plan
        if self.coalesce and plan is not None:
            plan = coalesce.widen_planned(plan, d.state, patches, now, self.gate.held, self._log_once)
        return plan

    def _held(self, rec: donefile.DonefileRecord, reasons: list[str]) -> None:
        """The model gate held ``rec`` (recorded after planning: ``_record_held``)."""
        self._newly_held.append((rec, reasons))

    def _record_held(self) -> None:
        """Records the versions the model gate held (``model_gate`` module docstring): the
        state's ``held`` and history, the metric, the MLflow tag."""
        now = time.time()
        with self.lock:
            st = self.state.model_copy(deep=True)
            for rec, why in self._newly_held:
                if rec.id in st.held:
                    continue  # judged again after a restart
                st.held.append(rec.id)
                del st.held[:-1000]
                st.add_history(HistoryEntry(version=rec.id, mode="delta" if rec.key != rec.id else "base",
                                            key=rec.key, status="held", error="; ".join(why), started=now,
                                            finished=now))
                self.metrics.versions_held.inc()
                self.tracker.set_tags({f"version.{rec.id}.held": "; ".join(why)[:4000]})
            self._newly_held = []
            self._commit(st)

    def poll_once(self) -> Optional[dict]:
        """One donefile check and at most one rollout. Returns the history entry of the
        rollout done (None if there was nothing to do). Never raises for a failed rollout."""
        self.metrics.polls.inc()
        self.last_poll = time.time()
        self.metrics.last_poll.set(self.last_poll)
        if self.state.pin is not None:  # a pinned version is served; nothing else goes out
            return rollback.hold(self)
        if self.catch_up:
            self.catch_up = False
            entry = rollback.catch_up(self)
            if entry is not None:
                return entry
        plan = self.next_plan()
        if plan is None:
            self.waiting_for = []
            self._count_pending()
            return None
        n = self.shard_num
        self.waiting_for = sorted(i.name for i, (_, shards) in self.agents.served(self.replicas).items()
                                  if shards is not None and int(shards) != n)
        self._count_pending()
        if self.waiting_for:
            self._log_once(("waiting", plan.version, n, tuple(self.waiting_for)), logging.WARNING,
                           "version %d%s waits: %s run with another --shard-num than the topology's %d "
                           "(not restarted yet?)", plan.version, f" ({plan.reason})" if plan.reason else "",
                           ", ".join(self.waiting_for), n)
            return None
        return self.rollout(plan)

    def _count_pending(self) -> None:
        """``pending_versions`` and ``held_versions`` (``runtime.metrics.transfer``) from the
        donefiles' lines read by the last poll; the served version's data time after a start."""
        with self.lock:
            served, relayout = self.state.served, self.state.relayout
        v = served.version if served else 0
        pending = sum(1 for r in self.records.values() if r.id > v)
        self.metrics.pending.set(pending)
        self.metrics.held.set(pending if relayout is not None or self.waiting_for else 0)
        if served is not None and self._reported != v and v in self.records:  # served before a restart
            rec, self._reported = self.records[v], v
            self.metrics.served(v, rec.data_end, rec.landed, served.enabled_at or time.time(), new=False)

    def run(self) -> None:
        """Polls until ``stop`` is set; an unexpected error is logged and the loop goes on."""
        log.info("transfer: dict %s, %d shards x %s replicas, root %s, poll every %.1f s", self.dict_name,
                 self.shard_num, "/".join(str(len(s.replicas)) for s in self.topology.shards), self.root,
                 self.poll_interval_s)
        next_reconcile = time.monotonic()  # at once: a replica added by a resize starts empty
        while not self.stop.is_set():
            try:
                while self.poll_once() is not None and not self.stop.is_set():
                    pass  # a rollout happened: look again at once (patches queued behind it)
                if self.reconcile_interval_s > 0 and time.monotonic() >= next_reconcile:
                    self.reconcile()
                    next_reconcile = time.monotonic()  # at once: a replica added by a resize starts empty
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - the watcher must survive anything
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("transfer poll failed")
            self.stop.wait(self.poll_interval_s)
        self.tracker.close()

    # ---------------------------------------------------------------- a rollout

    def rollout(self, plan: Plan) -> dict:
        """Drives one rollout through every phase (``phases.drive``, module docstring).
        Returns its history entry (``status`` finished | failed | partial) as JSON."""
        return phases.drive(self, plan)

    def prune(self) -> list[int]:
        """Retention (``retention.prune``) after a rollout; never fails the caller."""
        try:
            return retention.prune(self)
        except Exception:  # noqa: BLE001 - retried after the next rollout
            log.exception("retention failed")
            return []

    # ---------------------------------------------------------------- reconcile

    def reconcile(self) -> list[str]:
        """Brings lagging replicas to the served version (``reconcile.reconcile``); returns
        the replicas brought up to date. Errors are logged, never raised."""
        from runtime.cube.transfer.reconcile import reconcile

        return reconcile(self)

    # ---------------------------------------------------------------- HTTP views

    def info(self) -> DictInfo:
        """``GET /dict/info`` (``runtime.formats.dict_info``): ``version`` is the id every
        replica of a complete layout serves (None before the first rollout; serving
        follows it) and ``served_shard_num`` the shard count of that layout; ``shard_num``
        the topology's. During a re-layout they stay those of the layout served before it
        (``Relayout.before``: the previous layout, which keeps serving it) until its
        last link is enabled on the new one: a link in between is never announced.
        ``relayout``: None or its progress; ``waiting_for``: replicas whose server runs
        with another ``--shard-num``."""
        with self.lock:
            st = self.state
            served = st.served
            served_shard_num = st.served_shard_num()
            if st.relayout is not None and st.relayout.before is not None:
                served, served_shard_num = st.relayout.before, st.relayout.before.shard_num
            cur = st.current or self.laying_out  # a rollback's plan is not persisted as current
            last = st.history[-1] if st.history else None
            rl = st.relayout
            return DictInfo(
                dict_name=self.dict_name, version=served.version if served else None,
                base_id=served.base_id if served else None, patch_id=served.patch_id if served else None,
                shard_num=self.shard_num, replica_num=min(len(s.replicas) for s in self.topology.shards),
                replicas=[len(s.replicas) for s in self.topology.shards],
                dim=served.dim if served else None, count=served.count if served else None,
                model=served.model if served else None, enabled_at=served.enabled_at if served else None,
                status="rolling_out" if cur else ("serving" if served else "empty"),
                rollout=None if cur is None else RolloutInfo(
                    version=cur.version, mode=cur.mode, phase=cur.phase.value, attempt=cur.attempt,
                    started=cur.started, reason=cur.reason, coalesced=list(cur.coalesced)),
                served_shard_num=served_shard_num,
                relayout=None if rl is None else RelayoutInfo(
                    from_=rl.from_, to=rl.to, target=rl.target, done=rl.next, links=len(rl.links),
                    given_up=rl.given_up, error=rl.error),
                waiting_for=list(self.waiting_for),
                last_rollout=None if last is None else LastRollout(
                    version=last.version, status=last.status, error=last.error, reason=last.reason,
                    coalesced=list(last.coalesced or [])),
                last_poll=self.last_poll, last_error=self.last_error, held=list(st.held[-20:]),
                pinned=st.pin.version if st.pin else None)

    def replica_status(self) -> dict:
        """``GET /instance/status`` (Paddle Serving cube-transfer's path): every replica's agent status (queried now, 2 s timeout)."""
        import concurrent.futures as cf

        def one(rep: Replica) -> dict:
            out = {"shard": rep.shard, "replica": rep.replica, "agent": rep.agent, "server": rep.server}
            try:
                st = self.agents.status(rep, timeout_s=2.0)
                srv = st.get("server") or {}
                out.update(reachable=True, version=srv.get("version"), bg_version=srv.get("bg_version"),
                           bg_state=srv.get("bg_state"), step=st.get("step"), state=st.get("state"),
                           error=st.get("error") or srv.get("error"))
            except (requests.RequestException, ValueError) as exc:
                out.update(reachable=False, error=str(exc))
            return out

        with cf.ThreadPoolExecutor(max_workers=min(32, len(self.replicas))) as ex:
            rows = list(ex.map(one, self.replicas))
        with self.lock:
            served = self.state.served.version if self.state.served else None
        return {"dict_name": self.dict_name, "version": served, "replicas": rows,
                "consistent": all(r.get("version") == served for r in rows)}

    def history(self) -> list[dict]:
        """``GET /dict/deploy/history``: the last rollouts and refusals, oldest first."""
        with self.lock:
            return [h.to_json() for h in self.state.history]
