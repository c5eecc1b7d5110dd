"""Cube transfer: watches the donefile and rolls every new version out to all instances.

Modelled on the reference cube-transfer (``../shared/notes/cube.md``), but it runs
continuously and keeps its HTTP API.

Donefile rules (layout and line format: docs/contracts.md, "A version on the file server"):

- ``ROOT/donefile/base.txt``: the last valid line is the newest base. It is deployed when
  its id is above the served base id (older bases in between are skipped).
- ``ROOT/donefile/patch.txt``: the lines whose ``key`` is the served base id and whose
  ``id`` is above the served version, in file order, one rollout each. A patch whose
  ``key`` names another base (not the served one, not a newer base about to be
  deployed) is refused: logged once and recorded in the history as ``refused``.
- A malformed line (not JSON, not an object, ``id``/``key``/``input`` missing or not
  integers) is logged once and skipped; the transfer keeps running.

A rollout of version V (one at a time), phases as in the reference:

1. ``Building``: the SequenceFiles at the line's ``input`` (resolved against ROOT; a
   directory, a glob, or a file-server directory listed through its JSON listing and
   downloaded) -> ``runtime.cube.builder.build`` -> per-shard tar + md5 under
   ``<work_dir>/build/<dict>/<V>/``.
2. ``Deploying``: the tars, their ``.md5`` and ``build.json`` published under
   ``ROOT/cube/<dict>/<V>/`` (PUT with the upload token for a URL root, an atomic copy
   for a directory). Agents download them from ``--publish-url`` (default ROOT).
3. ``Downloading``, 4. ``Reloading``, 5. ``Enabling``: every shard x replica agent is
   driven through the step; each phase is a barrier over all instances (nothing is
   enabled until every instance has loaded). Each instance gets ``retries`` attempts per
   phase (``tenacity``, exponential backoff) within the phase's timeout (s).
6. ``Finished``: the served version becomes V.

Failure in Building, Deploying, Downloading or Reloading aborts the rollout: every agent
is told ``bg_unload`` and the previous version keeps serving. The version is retried at
the next polls, ``rollout_backoff_s`` after the failure (doubled per attempt, at most
300 s, so an agent restarting for a minute does not use the attempts up), up to
``max_rollout_attempts`` times, then given up (a later base
supersedes it; a given-up patch blocks the later patches of its base, since they would
be applied without its changes). A failure during Enabling (some instances switched, not
all) cannot be undone: the rollout stays current and is re-driven at every poll until
every instance serves V (instances already serving V are skipped).

Reconciling: every ``reconcile_interval_s`` the transfer checks every instance; one
serving something other than the served version (a server restarted empty) is driven
alone through the links of the served chain (base, then patches) it lacks, from the tars
already published. It stands aside while the served version is laid out for another shard
count than the topology's (its published tars do not fit the servers), and it skips (with
a warning, once) an instance whose server runs with another ``--shard-num`` than the
topology's shard count: only restarting that server fixes it.

Re-layout (resize): the served record holds ``shard_num``, the shard count its version
was built for (older state files: the number of md5s in the served chain's last link).
When the topology's shard count differs from it (checked at every poll, so also right
after a restart with a new topology), the transfer rolls the served chain out again for
the new layout, one link per rollout through the normal phases and barriers: the base
(same version id, rebuilt from its donefile ``input`` with the new ``shard_num``), then
each patch of the chain in order, up to and including the served version. Each link's
Finished makes it the served version (so ``/dict/info`` ``version`` goes back to the base
id and forward again: it is always the version every instance serves, on the new layout);
``/dict/info`` ``relayout`` and history entries (``"reason": "relayout 2->4 shards"``)
say what is going on. Re-layout builds go to ``<work_dir>/build/relayout-<N>shards/`` and
are published under ``ROOT/cube/<dict>/<V>-<N>shards/``, so they never overwrite the tars
of the same version id for another shard count. A newer base in the donefile supersedes
a pending re-layout (it is built for the new layout anyway); patches wait until the
re-layout is done. A failed re-layout link is retried after its backoff (doubled per
attempt, at most 300 s) and never given up, since without it the cube serves nothing;
its attempts and backoff are counted apart from the version's original rollout. The
re-layout is given up only when its links cannot be found (the served base's donefile
line is gone); the cube then waits for a newer base.

No rollout (re-layout or not) starts while a reachable server reports another
``shard_num`` than the topology's: its pod has not restarted with the new
``--shard-num`` yet, it would refuse the new dicts. The transfer waits (logged once,
``/dict/info`` ``waiting_for``), without using an attempt up.

State (``<work_dir>/transfer_state.json``, written to a temp file, fsynced and renamed)
holds the served version, the rollout in progress with its phase, attempts and the
history. A restarted transfer resumes the rollout in progress from its start
(idempotently: a finished build is reused, agents answer repeated commands at once,
instances already serving V are skipped) and never redeploys a finished version.

HTTP (Flask behind waitress): ``GET /healthz``, ``GET /dict/info`` (serving reads its
``version``), ``GET /instance/status``, ``GET /dict/deploy/history``, ``GET /metrics``.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import requests
import tenacity

from runtime import storage

log = logging.getLogger(__name__)

PHASES = ("Building", "Deploying", "Downloading", "Reloading", "Enabling", "Finished")
STATE_FILE = "transfer_state.json"
HISTORY_MAX = 200


class RolloutError(RuntimeError):
    """A rollout failed; ``phase`` names the phase, the message names the instance/input."""

    def __init__(self, phase: str, message: str):
        super().__init__(f"{phase}: {message}")
        self.phase = phase


# --------------------------------------------------------------------------- topology


@dataclass(frozen=True)
class Instance:
    """One shard x replica: the agent's URL, the server's data (host:port) and HTTP URL."""

    shard: int
    replica: int
    agent: str
    server: str = ""
    http: str = ""

    @property
    def name(self) -> str:
        return f"shard{self.shard}/replica{self.replica}"


def load_topology(source: str | os.PathLike | dict) -> tuple[str, list[list[Instance]]]:
    """Reads the topology JSON (docs/contracts.md): ``{"dict_name", "shards": [{"shard",
    "replicas": [{"server", "http", "agent"}]}]}``. Returns ``(dict_name, shards)`` where
    ``shards[i]`` lists shard i's replicas. Raises ``ValueError`` naming the file and the
    problem (shards out of order, a replica without an agent, no shards)."""
    where = "topology" if isinstance(source, dict) else str(source)
    if isinstance(source, dict):
        topo = source
    else:
        try:
            topo = json.loads(Path(source).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: cannot read topology: {exc}") from exc
    try:
        dict_name = str(topo["dict_name"])
        shards = []
        for i, sh in enumerate(topo["shards"]):
            if int(sh.get("shard", i)) != i:
                raise ValueError(f"shards must be listed in shard order: entry {i} is shard {sh.get('shard')}")
            reps = []
            for j, rep in enumerate(sh["replicas"]):
                if not rep.get("agent"):
                    raise ValueError(f"shard {i} replica {j} has no agent URL")
                reps.append(Instance(i, j, str(rep["agent"]).rstrip("/"), str(rep.get("server", "")),
                                     str(rep.get("http", "")).rstrip("/")))
            if not reps:
                raise ValueError(f"shard {i} has no replicas")
            shards.append(reps)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{where}: malformed topology: missing or bad {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    if not shards:
        raise ValueError(f"{where}: no shards")
    return dict_name, shards


# --------------------------------------------------------------------------- donefile


# parse_donefile lives in runtime.storage (one parser for every donefile reader).
parse_donefile = storage.parse_donefile


# --------------------------------------------------------------------------- state


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes JSON to ``path`` through a fsynced temp file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _empty_state() -> dict:
    return {"served": None, "current": None, "attempts": {}, "retry_after": {}, "given_up": [], "refused": [],
            "history": [], "relayout": None}


def relayout_name(version: int, shard_num: int) -> str:
    """The build/publish directory name of a re-layout of ``version`` for ``shard_num``
    shards: ``<version>-<shard_num>shards`` (an original rollout uses ``<version>``)."""
    return f"{version}-{shard_num}shards"


# --------------------------------------------------------------------------- inputs


def list_inputs(location: str, timeout_s: float = 30.0) -> list[str]:
    """The SequenceFile part files at ``location``: a local file, directory or glob, or a
    file-server directory URL listed through its JSON listing (``GET <dir>/?format=json``
    -> ``{"entries": [{"name", "type", "size"}]}``). Names starting with ``.`` or ``_``
    (``_SUCCESS``, temp files) and ``.crc``/``.md5`` files are skipped. Raises
    ``storage.LocationError`` naming the location if nothing is found."""
    def keep(name: str) -> bool:
        return not name.startswith((".", "_")) and not name.endswith((".crc", ".md5"))

    if storage.is_url(location):
        url = location.rstrip("/") + "/?format=json"
        try:
            r = storage.session().get(url, timeout=timeout_s, headers={"Accept": "application/json"})
        except requests.RequestException as exc:
            raise storage.LocationError(f"{location}: listing unreachable ({exc})") from exc
        if r.status_code == 404:
            raise storage.LocationError(f"{location}: no such directory (HTTP 404)")
        if r.status_code >= 400:
            raise storage.LocationError(f"{location}: listing failed: HTTP {r.status_code}")
        try:
            entries = r.json()["entries"]
        except (ValueError, KeyError, TypeError) as exc:
            raise storage.LocationError(f"{location}: not a JSON directory listing ({exc})") from exc
        files = sorted(storage.join(location.rstrip("/") + "/", e["name"]) for e in entries
                       if e.get("type") == "file" and keep(str(e["name"])))
    else:
        files = [f for f in storage.expand(location) if keep(os.path.basename(f))]
    if not files:
        raise storage.LocationError(f"{location}: no SequenceFile part files")
    return files


# --------------------------------------------------------------------------- transfer


def _default_build(inputs, output_dir, dict_name, shard_num, version, mode, base_version):
    from runtime.cube import builder

    return builder.build(inputs, output_dir, dict_name, shard_num, version, mode=mode,
                         base_version=base_version)


class Transfer:
    """The transfer's state machine; ``poll_once`` does one donefile check and at most one
    rollout, ``run`` loops until ``stop`` is set.

    Args:
        topology: path or dict (see ``load_topology``).
        root: version root (directory or URL).
        work_dir: builds, downloaded inputs and ``transfer_state.json``.
        publish_url: base from which agents download ``cube/<dict>/<V>/...`` (default root).
        token: upload bearer token for a URL root.
        poll_interval_s, phase_timeout_s: seconds.
        retries: attempts per instance and phase; max_rollout_attempts: rollouts per version.
        rollout_backoff_s: wait before retrying a failed rollout (s; doubled per attempt, <= 300).
        reconcile_interval_s: how often ``run`` checks for lagging instances (s; 0 = never).
        build_fn: ``(inputs, output_dir, dict_name, shard_num, version, mode, base_version)``,
            writing the builder's layout (docs/contracts.md); default ``builder.build``.
    """

    def __init__(self, topology, root: str, work_dir: str | os.PathLike, publish_url: str | None = None,
                 token: str | None = None, poll_interval_s: float = 2.0, phase_timeout_s: float = 300.0,
                 retries: int = 3, max_rollout_attempts: int = 3, rollout_backoff_s: float = 10.0,
                 reconcile_interval_s: float = 30.0,
                 dict_name: str | None = None,
                 build_fn: Callable | None = None, http_timeout_s: float = 10.0):
        topo_dict, self.shards = load_topology(topology)
        self.dict_name = dict_name or topo_dict
        self.instances = [inst for reps in self.shards for inst in reps]
        self.root = str(root)
        self.publish_url = publish_url or self.root
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.poll_interval_s = poll_interval_s
        self.phase_timeout_s = phase_timeout_s
        self.retries = max(1, retries)
        self.max_rollout_attempts = max(1, max_rollout_attempts)
        self.rollout_backoff_s = max(0.0, rollout_backoff_s)
        self.reconcile_interval_s = reconcile_interval_s
        self.http_timeout_s = http_timeout_s
        self.build_fn = build_fn or _default_build
        self.state_path = self.work_dir / STATE_FILE
        self.lock = threading.RLock()
        self.state = self._load_state()
        self.stop = threading.Event()
        self.last_poll: float | None = None
        self.last_error: str | None = None
        self.waiting_for: list[str] = []  # instances whose server runs with another --shard-num
        self._logged_errors: set[tuple] = set()
        self._http = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=64, pool_maxsize=64)
        self._http.mount("http://", adapter)
        self._http.mount("https://", adapter)
        self.after_phase: Callable[[str, dict], None] | None = None  # test hook
        self._init_metrics()

    # ---------------------------------------------------------------- state

    def _load_state(self) -> dict:
        if not self.state_path.exists():
            return _empty_state()
        try:
            st = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as exc:
            # refuse to guess: an unreadable state could make us redeploy or skip versions
            raise RuntimeError(f"{self.state_path}: unreadable transfer state ({exc}); fix or remove it") from exc
        base = _empty_state()
        base.update(st)
        return base

    def _save(self) -> None:
        with self.lock:
            write_json_atomic(self.state_path, self.state)

    def _history(self, entry: dict) -> None:
        with self.lock:
            self.state["history"].append(entry)
            del self.state["history"][:-HISTORY_MAX]

    # ---------------------------------------------------------------- metrics

    def _init_metrics(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.m_version = Gauge("cube_transfer_served_version", "version id served by every instance",
                               registry=self.registry)
        self.m_rollouts = Counter("cube_transfer_rollouts", "rollouts by outcome", ["status"],
                                  registry=self.registry)
        self.m_phase = Gauge("cube_transfer_phase_seconds", "duration of the last rollout's phases (s)",
                             ["phase"], registry=self.registry)
        self.m_rollout_s = Gauge("cube_transfer_last_rollout_seconds",
                                 "donefile line seen -> every instance enabled, last rollout (s)",
                                 registry=self.registry)
        self.m_malformed = Counter("cube_transfer_donefile_malformed_lines",
                                   "malformed donefile lines skipped (each counted once)",
                                   registry=self.registry)
        self.m_polls = Counter("cube_transfer_polls", "donefile polls", registry=self.registry)
        served = self.state.get("served") or {}
        if served.get("version") is not None:
            self.m_version.set(served["version"])

    # ---------------------------------------------------------------- donefile -> plan

    def _read_donefile(self, name: str) -> list[dict]:
        loc = storage.join(self.root, f"donefile/{name}")
        try:
            text = storage.read_bytes(loc).decode("utf-8", "replace")
        except storage.LocationError as exc:
            if storage.is_url(loc) and "HTTP 404" not in str(exc):
                self._log_once(("read", loc, str(exc)), logging.WARNING, "donefile %s: %s", loc, exc)
            return []
        recs, errors = parse_donefile(text, loc)
        for n, why, line in errors:
            key = ("malformed", loc, n, line)
            if key not in self._logged_errors:
                self.m_malformed.inc()
            self._log_once(key, logging.WARNING, "donefile %s line %d skipped: %s: %r", loc, n, why, line)
        return recs

    def _log_once(self, key: tuple, level: int, msg: str, *args) -> None:
        if key in self._logged_errors:
            return
        self._logged_errors.add(key)
        log.log(level, msg, *args)

    def served_shard_num(self) -> int | None:
        """The shard count the served version was rolled out for: the served record's
        ``shard_num``, else (state written before it was recorded) the number of shard md5s
        in the served chain's last link; None when nothing is served or it is unknown."""
        with self.lock:
            served = self.state.get("served") or {}
            if served.get("shard_num") is not None:
                return int(served["shard_num"])
            chain = self.state.get("served_chain") or []
            if served.get("version") is not None and chain and chain[-1].get("version") == served["version"]:
                return len(chain[-1].get("md5s") or []) or None
            return None

    def next_plan(self) -> dict | None:
        """The next rollout to do (or resume), or None. Records refused patches. A pending
        re-layout (see the module docstring) comes after a newer base and before patches."""
        n = len(self.shards)
        with self.lock:
            cur = self.state.get("current")
            if cur:
                rl = cur.get("relayout")
                have = self.served_shard_num()
                # an interrupted rollout that cannot work on this topology any more: a re-layout
                # for another shard count, or a patch on a base that is laid out for another
                if (rl and int(rl["to"]) != n) or (not rl and cur.get("mode") == "delta"
                                                   and have is not None and have != n):
                    log.warning("Dropping the interrupted rollout of version %d (%s): the topology now has "
                                "%d shards", cur["version"], cur.get("reason") or cur.get("mode"), n)
                    self.state["current"] = None
                    self._save()
                else:
                    return dict(cur)
            served = self.state.get("served") or {}
            given_up = set(self.state.get("given_up", []))
        bases = self._read_donefile("base.txt")
        patches = self._read_donefile("patch.txt")
        served_version = served.get("version")
        served_base = served.get("base_id")
        if bases:
            newest = bases[-1]
            if (served_base is None or newest["id"] > served_base) and newest["id"] not in given_up:
                return self._plan(newest, "base", None)
            if newest["id"] in given_up:
                self._log_once(("gaveup", newest["id"]), logging.ERROR,
                               "base %d was given up after %d failed rollouts; waiting for a newer base",
                               newest["id"], self.max_rollout_attempts)
        if served_version is None:
            return None
        blocking, plan = self._relayout_next(bases, patches)
        if blocking:
            return plan  # patches wait until the served chain is laid out for this topology
        base_ids = {b["id"] for b in bases}
        for p in patches:
            if p["id"] <= served_version:
                continue
            if p["key"] != served_base:
                if p["key"] > served_base and p["key"] in base_ids:
                    continue  # for a newer base; deployed after that base
                self._refuse(p, served)
                continue
            if p["id"] in given_up:
                self._log_once(("gaveup", p["id"]), logging.ERROR,
                               "patch %d was given up; later patches of base %d are held back "
                               "(they would be applied without its changes) until a new base",
                               p["id"], served_base)
                return None
            return self._plan(p, "delta", served_version)
        return None

    def _plan(self, rec: dict, mode: str, base_version: int | None) -> dict | None:
        with self.lock:
            after = self.state.get("retry_after", {}).get(str(rec["id"]), 0)
        if time.time() < after:
            return None  # a failed rollout of this version waits for its backoff
        return {"version": rec["id"], "key": rec["key"], "mode": mode, "base_version": base_version,
                "input": rec["input"], "model": rec.get("model"), "phase": "Trigging",
                "seen": time.time(), "attempt": 0}

    # ---------------------------------------------------------------- re-layout

    def _relayout_links(self, served: dict, bases: list[dict], patches: list[dict]) -> list[dict]:
        """The links of the served chain to roll out again: ``[{"version", "mode", "key",
        "base_version", "input", "model"}]``, base first. Taken from the served chain (its
        links record ``input`` since re-layouts exist; older ones are looked up in the
        donefile by id), else rebuilt from the donefile (the served base's line, then its
        patches up to the served version, in file order). Raises ``ValueError`` naming the
        version whose donefile line is missing."""
        target, base_id = served["version"], served.get("base_id")
        chain = list(self.state.get("served_chain") or [])
        by_id = {("base", b["id"]): b for b in bases}
        by_id.update({("delta", p["id"]): p for p in patches})
        if not chain or chain[-1].get("version") != target:
            lines = [b for b in bases if b["id"] == base_id][-1:]
            lines += [p for p in patches if p["key"] == base_id and base_id < p["id"] <= target]
            chain, prev = [], None
            for i, rec in enumerate(lines):
                chain.append({"version": rec["id"], "mode": "base" if i == 0 else "delta", "base_version": prev})
                prev = rec["id"]
            if not chain or chain[0]["mode"] != "base" or chain[-1]["version"] != target:
                raise ValueError(f"the donefile has no base line {base_id} and patch lines up to {target}")
        links = []
        for c in chain:
            v, mode = int(c["version"]), c["mode"]
            rec = by_id.get((mode, v)) or {}
            inp = c.get("input") or rec.get("input")
            if not inp:
                raise ValueError(f"no input for {mode} {v}: its line is not in donefile/"
                                 f"{'base' if mode == 'base' else 'patch'}.txt")
            links.append({"version": v, "mode": mode,
                          "key": v if mode == "base" else int(c.get("key") or rec.get("key") or base_id),
                          "base_version": c.get("base_version"), "input": inp,
                          "model": c.get("model") or rec.get("model")})
        return links

    def _relayout_next(self, bases: list[dict], patches: list[dict]) -> tuple[bool, dict | None]:
        """Plans the next link of a re-layout. Returns ``(blocking, plan)``: ``blocking``
        is True while a re-layout is pending (the served chain is not laid out for the
        topology's shard count; patches must wait), ``plan`` the link to roll out now (None
        while its backoff runs, or once the re-layout is given up)."""
        n = len(self.shards)
        with self.lock:
            served = self.state.get("served") or {}
            have = self.served_shard_num()
            rl = self.state.get("relayout")
            if rl and int(rl["to"]) != n:
                if have == n and served.get("version") == rl["target"]:
                    log.info("Re-layout %s->%s shards dropped: the topology is back to %d shards, on which "
                             "version %d is served", rl["from"], rl["to"], n, rl["target"])
                    rl = self.state["relayout"] = None
                else:
                    log.warning("Re-layout of version %d restarted for %d shards (it was for %s)",
                                rl["target"], n, rl["to"])
                    rl.update({"from": have, "to": n, "next": 0, "given_up": False, "error": None,
                               "started": time.time()})
                self._save()
            if rl is None:
                if served.get("version") is None or have is None or have == n:
                    return False, None
                rl = {"from": have, "to": n, "target": served["version"], "links": [], "next": 0,
                      "given_up": False, "error": None, "started": time.time()}
                try:
                    rl["links"] = self._relayout_links(served, bases, patches)
                except ValueError as exc:
                    rl.update(given_up=True, error=f"cannot re-lay out version {served['version']}: {exc}")
                    self._history({"version": served["version"], "mode": "base", "status": "failed",
                                   "reason": f"relayout {have}->{n} shards", "error": rl["error"],
                                   "given_up": True, "started": time.time(), "finished": time.time()})
                    self.m_rollouts.labels("failed").inc()
                    log.error("Re-layout %d->%d shards: %s; waiting for a new base", have, n, rl["error"])
                else:
                    log.warning("Re-layout: version %d is served on %d shards, the topology has %d; rolling "
                                "its chain %s out again for %d shards (nothing serves until its base is "
                                "enabled everywhere)", served["version"], have, n,
                                [c["version"] for c in rl["links"]], n)
                self.state["relayout"] = rl
                self._save()
            if rl.get("given_up"):
                self._log_once(("relayout-gaveup", rl["target"], n), logging.ERROR,
                               "re-layout of version %d for %d shards was given up (%s); waiting for a "
                               "newer base", rl["target"], n, rl.get("error"))
                return True, None
            i = int(rl["next"])
            link = rl["links"][i]
            key = f"relayout-{n}:{link['version']}"
            if time.time() < self.state.get("retry_after", {}).get(key, 0):
                return True, None
            reason = f"relayout {rl['from']}->{n} shards"
            return True, {"version": link["version"], "key": link["key"], "mode": link["mode"],
                          "base_version": link["base_version"], "input": link["input"], "model": link.get("model"),
                          "phase": "Trigging", "seen": time.time(), "attempt": 0, "attempt_key": key,
                          "reason": reason, "relayout": {"from": rl["from"], "to": n, "target": rl["target"],
                                                         "link": i + 1, "links": len(rl["links"])}}

    def _refuse(self, rec: dict, served: dict) -> None:
        with self.lock:
            if rec["id"] in self.state["refused"]:
                return
            self.state["refused"].append(rec["id"])
            del self.state["refused"][:-1000]
            msg = (f"patch {rec['id']} refused: its base {rec['key']} is not the served base "
                   f"{served.get('base_id')} (served version {served.get('version')})")
            log.warning(msg)
            self._history({"version": rec["id"], "mode": "delta", "key": rec["key"], "status": "refused",
                           "error": msg, "started": time.time(), "finished": time.time()})
            self.m_rollouts.labels("refused").inc()
            self._save()

    # ---------------------------------------------------------------- loop

    def poll_once(self) -> dict | None:
        """One donefile check and at most one rollout. Returns the history entry of the
        rollout done (None if there was nothing to do). Never raises for a failed rollout."""
        self.m_polls.inc()
        self.last_poll = time.time()
        plan = self.next_plan()
        if plan is None:
            self.waiting_for = []
            return None
        n = len(self.shards)
        self.waiting_for = sorted(i.name for i, (_, shards) in self._instance_versions().items()
                                  if shards is not None and int(shards) != n)
        if self.waiting_for:
            self._log_once(("waiting", plan["version"], n, tuple(self.waiting_for)), logging.WARNING,
                           "version %d%s waits: %s run with another --shard-num than the topology's %d "
                           "(not restarted yet?)", plan["version"],
                           f" ({plan['reason']})" if plan.get("reason") else "", ", ".join(self.waiting_for), n)
            return None
        return self.rollout(plan)

    def run(self) -> None:
        """Polls until ``stop`` is set; an unexpected error is logged and the loop goes on."""
        log.info("transfer: dict %s, %d shards x %s replicas, root %s, poll every %.1f s",
                 self.dict_name, len(self.shards), "/".join(str(len(r)) for r in self.shards),
                 self.root, self.poll_interval_s)
        next_reconcile = time.monotonic() + self.reconcile_interval_s
        while not self.stop.is_set():
            try:
                while self.poll_once() is not None and not self.stop.is_set():
                    pass  # a rollout happened: look again at once (patches queued behind it)
                if self.reconcile_interval_s > 0 and time.monotonic() >= next_reconcile:
                    self.reconcile()
                    next_reconcile = time.monotonic() + self.reconcile_interval_s
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - the watcher must survive anything
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("transfer poll failed")
            self.stop.wait(self.poll_interval_s)

    # ---------------------------------------------------------------- rollout

    def rollout(self, plan: dict) -> dict:
        """Drives one rollout through every phase (see module docstring). Returns its
        history entry (``status`` finished | failed | partial)."""
        v, mode = plan["version"], plan["mode"]
        n = len(self.shards)
        resumed = plan.get("phase") not in (None, "Trigging")
        akey = plan.get("attempt_key") or str(v)
        reason = plan.get("reason")
        with self.lock:
            attempts = self.state["attempts"].get(akey, 0) + 1
            self.state["attempts"][akey] = attempts
            plan["attempt"] = attempts
            plan["started"] = time.time()
            self.state["current"] = plan
            self._save()
        t_start = time.monotonic()
        phases: dict[str, float] = {}
        log.info("Trigging version=%d mode=%s key=%d base_version=%s attempt=%d%s%s", v, mode, plan["key"],
                 plan["base_version"], attempts, " (resuming an interrupted rollout)" if resumed else "",
                 f" ({reason}, link {plan['relayout']['link']}/{plan['relayout']['links']})" if reason else "")
        entry = {"version": v, "mode": mode, "key": plan["key"], "base_version": plan["base_version"],
                 "attempt": attempts, "started": plan["started"], "resumed": resumed, "shard_num": n}
        if reason:
            entry.update(reason=reason, relayout=dict(plan["relayout"]))
        enabled: set[Instance] = set()
        try:
            # instances that already serve v on this layout (an interrupted Enabling) are done
            skip = {i for i, (have, shards) in self._instance_versions().items() if have == v and shards == n}
            t = time.monotonic()
            self._set_phase(plan, "Building")
            build = self._build(plan)
            phases["Building"] = time.monotonic() - t
            log.info("Building version=%d finished: %d keys, %d shards, dim %s in %.2f s", v,
                     build.get("count", -1), len(build["shards"]), build.get("dim"), phases["Building"])
            t = time.monotonic()
            self._set_phase(plan, "Deploying")
            urls = self._publish(build, v, plan)
            phases["Deploying"] = time.monotonic() - t
            log.info("Deploying version=%d finished: %d shard tars published in %.2f s", v, len(urls),
                     phases["Deploying"])
            todo = [i for i in self.instances if i not in skip]
            for phase, step in (("Downloading", "download"), ("Reloading", "reload")):
                t = time.monotonic()
                self._set_phase(plan, phase)
                self._barrier(phase, step, todo, plan, urls, build)
                phases[phase] = time.monotonic() - t
            t = time.monotonic()
            self._set_phase(plan, "Enabling")
            try:
                self._barrier("Enabling", "enable", todo, plan, urls, build, enabled=enabled)
            except RolloutError:
                if enabled or skip:
                    raise _Partial(enabled | skip)
                raise
            phases["Enabling"] = time.monotonic() - t
        except _Partial as part:
            err = str(part.__context__ or part)
            entry.update(status="partial", finished=time.time(), error=err, phases=phases,
                         enabled=sorted(i.name for i in part.enabled))
            log.error("Enabling version=%d incomplete (%d/%d instances switched): %s; re-driven at the "
                      "next poll", v, len(part.enabled), len(self.instances), err)
            with self.lock:
                self._history(entry)
                self.m_rollouts.labels("partial").inc()
                self._save()
            return entry
        except Exception as exc:  # noqa: BLE001 - any failure aborts; the old version keeps serving
            err = str(exc) if isinstance(exc, RolloutError) else f"{plan.get('phase')}: {type(exc).__name__}: {exc}"
            self._abort(v)
            # a retry rebuilds from the inputs (a resumed *interrupted* rollout reuses the build)
            shutil.rmtree(self._build_root(plan) / self.dict_name / str(v), ignore_errors=True)
            with self.lock:
                gave_up = attempts >= self.max_rollout_attempts and not reason  # re-layouts: never
                if gave_up and v not in self.state["given_up"]:
                    self.state["given_up"].append(v)
                backoff = min(300.0, self.rollout_backoff_s * 2 ** (attempts - 1))
                self.state.setdefault("retry_after", {})[akey] = time.time() + backoff
                self.state["current"] = None
                entry.update(status="failed", finished=time.time(), error=err, phases=phases,
                             given_up=gave_up)
                self._history(entry)
                self.m_rollouts.labels("failed").inc()
                self._save()
            log.error("Aborted version=%d%s attempt=%d/%d: %s; version %s keeps serving%s", v,
                      f" ({reason})" if reason else "", attempts, self.max_rollout_attempts, err,
                      (self.state.get("served") or {}).get("version"), " (given up)" if gave_up else "")
            return entry
        total = time.monotonic() - t_start
        with self.lock:
            served_before = self.state.get("served") or {}
            self.state["served"] = {
                "version": v, "base_id": v if mode == "base" else plan["key"],
                "patch_id": None if mode == "base" else v, "dim": build.get("dim"),
                "count": build.get("count") if mode == "base" else served_before.get("count"),
                "model": plan.get("model"), "enabled_at": time.time(), "shard_num": n}
            # what an instance needs to be brought to the served version (see reconcile), and
            # what a re-layout rebuilds it from
            link = {"version": v, "mode": mode, "base_version": plan["base_version"], "urls": urls,
                    "md5s": [sh["md5"] for sh in build["shards"]], "key": plan["key"],
                    "input": plan.get("input"), "model": plan.get("model"), "shard_num": n}
            chain = [] if mode == "base" else list(self.state.get("served_chain") or [])
            self.state["served_chain"] = chain + [link]
            self.state["current"] = None
            rl = self.state.get("relayout")
            relayout_done = False
            if reason and rl and int(rl["to"]) == n:
                rl["next"] = int(rl["next"]) + 1
                if rl["next"] >= len(rl["links"]):
                    self.state["relayout"], relayout_done = None, True
            elif mode == "base" and rl:
                log.info("Re-layout of version %s superseded by base %d, rolled out for %d shards",
                         rl.get("target"), v, n)
                self.state["relayout"] = None
            entry.update(status="finished", finished=time.time(), seconds=round(total, 3),
                         since_seen=round(time.time() - plan.get("seen", plan["started"]), 3),
                         phases={k: round(s, 3) for k, s in phases.items()}, count=build.get("count"),
                         skipped=sorted(i.name for i in skip))
            self._history(entry)
            self.m_rollouts.labels("finished").inc()
            self.m_version.set(v)
            self.m_rollout_s.set(total)
            for k, s in phases.items():
                self.m_phase.labels(k).set(s)
            self._save()
        log.info("Finished version=%d mode=%s%s: %d instances serve it, %.2f s (%s)", v, mode,
                 f" ({reason})" if reason else "", len(self.instances), total,
                 ", ".join(f"{k} {s:.2f} s" for k, s in phases.items()))
        if relayout_done:
            log.info("Re-layout finished: version %d is served on %d shards", v, n)
        self._cleanup_builds()
        return entry

    def _set_phase(self, plan: dict, phase: str) -> None:
        with self.lock:
            plan["phase"] = phase
            self.state["current"] = plan
            self._save()
        if self.after_phase:
            self.after_phase(phase, plan)

    # Building ----------------------------------------------------------------------

    def _build_root(self, plan: dict) -> Path:
        """The builder's ``output_dir`` for ``plan``: ``<work_dir>/build``, or for a
        re-layout ``<work_dir>/build/relayout-<N>shards`` (never the original's build)."""
        if plan.get("relayout"):
            return self.work_dir / "build" / f"relayout-{int(plan['relayout']['to'])}shards"
        return self.work_dir / "build"

    def _build(self, plan: dict) -> dict:
        v = plan["version"]
        out = self._build_root(plan)
        vdir = out / self.dict_name / str(v)
        meta = vdir / "build.json"
        if meta.exists():  # a finished build of an interrupted rollout: reuse it
            try:
                build = json.loads(meta.read_text())
                if int(build.get("shard_num", -1)) == len(self.shards) and all(
                        self._tar_path(vdir, s).exists() for s in build["shards"]):
                    log.info("Building version=%d: reusing the finished build in %s", v, vdir)
                    return self._normalize_build(build, vdir)
            except (OSError, ValueError, KeyError, TypeError):
                pass
            shutil.rmtree(vdir, ignore_errors=True)
        location = storage.join(self.root, plan["input"])
        try:
            inputs = list_inputs(location)
        except storage.LocationError as exc:
            raise RolloutError("Building", f"input of version {v}: {exc}") from exc
        tmp_inputs = None
        if any(storage.is_url(i) for i in inputs):
            tmp_inputs = self.work_dir / "inputs" / str(v)
            shutil.rmtree(tmp_inputs, ignore_errors=True)
            local = [str(tmp_inputs / u.rstrip("/").rsplit("/", 1)[-1]) for u in inputs]
            t = time.monotonic()
            try:  # part files in parallel (I/O bound)
                with cf.ThreadPoolExecutor(max_workers=min(4, len(inputs))) as ex:
                    list(ex.map(storage.download, inputs, local))
            except storage.LocationError as exc:
                shutil.rmtree(tmp_inputs, ignore_errors=True)
                raise RolloutError("Building", f"input of version {v}: {exc}") from exc
            log.info("Building version=%d: downloaded %d part files (%d bytes) in %.2f s", v, len(local),
                     sum(os.path.getsize(p) for p in local), time.monotonic() - t)
            inputs = local
        log.info("Building version=%d mode=%s from %d part files at %s", v, plan["mode"], len(inputs), location)
        try:
            self.build_fn(inputs, str(out), self.dict_name, len(self.shards), v, plan["mode"],
                          plan["base_version"])
        except Exception as exc:  # noqa: BLE001 - a bad input must not kill the transfer
            shutil.rmtree(vdir, ignore_errors=True)
            raise RolloutError("Building", f"version {v} from {location}: {type(exc).__name__}: {exc}") from exc
        finally:
            if tmp_inputs is not None:
                shutil.rmtree(tmp_inputs, ignore_errors=True)
        try:
            build = json.loads(meta.read_text())
        except (OSError, ValueError) as exc:
            raise RolloutError("Building", f"version {v}: builder wrote no readable {meta}: {exc}") from exc
        return self._normalize_build(build, vdir)

    def _tar_path(self, vdir: Path, shard: dict) -> Path:
        tar = shard.get("tar") or f"{self.dict_name}_part{shard['shard']}.tar"
        p = Path(tar)
        return p if p.is_absolute() else vdir / p.name

    def _normalize_build(self, build: dict, vdir: Path) -> dict:
        shards = sorted(build["shards"], key=lambda s: int(s["shard"]))
        if [int(s["shard"]) for s in shards] != list(range(len(self.shards))):
            raise RolloutError("Building", f"{vdir}/build.json: shards {[s['shard'] for s in shards]} do not "
                                           f"match the topology's {len(self.shards)}")
        for s in shards:
            s["tar_path"] = str(self._tar_path(vdir, s))
            if not s.get("md5"):
                md5f = Path(s["tar_path"] + ".md5")
                s["md5"] = md5f.read_text().split()[0] if md5f.exists() else storage.md5_file(s["tar_path"])
        build["shards"] = shards
        build["dir"] = str(vdir)
        return build

    # Deploying ---------------------------------------------------------------------

    def _publish(self, build: dict, v: int, plan: dict | None = None) -> list[str]:
        """Publishes each shard tar (+ .md5) and build.json under ROOT/cube/<dict>/<v>/
        (a re-layout: ROOT/cube/<dict>/<v>-<N>shards/, see ``relayout_name``); returns the
        agents' download URL (or path) per shard. Raises ``RolloutError("Deploying")``."""
        name = relayout_name(v, int(plan["relayout"]["to"])) if plan and plan.get("relayout") else str(v)
        rel = f"cube/{self.dict_name}/{name}"
        urls = []
        files = []
        for s in build["shards"]:
            tar = Path(s["tar_path"])
            files += [tar, Path(str(tar) + ".md5")]
            urls.append(storage.join(self.publish_url, f"{rel}/{tar.name}"))
        files = [f for f in files if f.exists()]
        meta = Path(build["dir"]) / "build.json"

        def put(f: Path) -> None:
            storage.upload(f, storage.join(self.root, f"{rel}/{f.name}"), self.token)

        try:  # in parallel (I/O bound); build.json last, once the tars are in place
            with cf.ThreadPoolExecutor(max_workers=min(4, len(files))) as ex:
                list(ex.map(put, files))
            if meta.exists():
                put(meta)
        except (storage.LocationError, OSError) as exc:
            raise RolloutError("Deploying", f"publishing version {v} under {storage.join(self.root, rel)}: {exc}") from exc
        return urls

    # Downloading / Reloading / Enabling --------------------------------------------

    def _barrier(self, phase: str, step: str, todo: list[Instance], plan: dict, urls: list[str],
                 build: dict, enabled: set | None = None) -> None:
        """Runs ``step`` on every instance in ``todo`` concurrently; returns when all
        succeeded, raises ``RolloutError`` (naming the instances) when any failed."""
        v = plan["version"]
        t0 = time.monotonic()
        deadline = t0 + self.phase_timeout_s
        log.info("%s version=%d: 0/%d instances", phase, v, len(todo))
        failures: list[str] = []
        done = 0
        if not todo:
            return
        with cf.ThreadPoolExecutor(max_workers=min(32, len(todo)), thread_name_prefix=step) as ex:
            futs = {ex.submit(self._drive, inst, step, plan, urls, build, deadline): inst for inst in todo}
            for fut in cf.as_completed(futs):
                inst = futs[fut]
                try:
                    fut.result()
                    done += 1
                    if enabled is not None:
                        enabled.add(inst)
                except Exception as exc:  # noqa: BLE001
                    failures.append(f"{inst.name} ({inst.agent}) {step}: {exc}")
        dt = time.monotonic() - t0
        log.info("%s version=%d: %d/%d instances, %d failed, %.2f s", phase, v, done, len(todo),
                 len(failures), dt)
        if failures:
            raise RolloutError(phase, "; ".join(failures))

    def _drive(self, inst: Instance, step: str, plan: dict, urls: list[str], build: dict,
               deadline: float) -> None:
        """One instance through one step, with ``retries`` attempts (exponential backoff
        0.2-2 s) inside the phase deadline. Raises the last error."""
        v = plan["version"]
        if step == "download":
            body = {"url": urls[inst.shard], "md5": build["shards"][inst.shard]["md5"], "version": v, "mode": plan["mode"],
                    "base_version": plan["base_version"], "dict_name": self.dict_name}
        else:
            body = {"version": v}

        def attempt() -> None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{step} not done within the phase timeout {self.phase_timeout_s:.0f} s")
            if step != "enable":
                body["wait"] = max(0.0, min(left, 600.0))
            try:
                r = self._http.post(f"{inst.agent}/{step}", json=body, timeout=left + 5)
            except requests.RequestException as exc:
                raise _Retry(f"agent unreachable: {exc}") from exc
            try:
                out = r.json()
            except ValueError:
                out = {"error": r.text[:300]}
            if r.status_code == 200:
                return
            err = out.get("error") or out.get("state") or r.text[:300]
            if r.status_code == 202:
                raise TimeoutError(f"{step} still running at the phase timeout")
            if r.status_code == 400:
                raise _Fatal(f"HTTP 400: {err}")
            raise _Retry(f"HTTP {r.status_code}: {err}")

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries),
            wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
            retry=tenacity.retry_if_exception_type(_Retry),
            reraise=True,
            before_sleep=lambda rs: log.warning("%s %s of version %d: attempt %d failed (%s); retrying",
                                                inst.name, step, v, rs.attempt_number,
                                                rs.outcome.exception()),
        )
        retrying(attempt)

    def _abort(self, v: int) -> None:
        """Tells every agent ``bg_unload`` (best effort, concurrently)."""
        def unload(inst: Instance) -> None:
            try:
                r = self._http.post(f"{inst.agent}/bg_unload", json={"version": v}, timeout=self.http_timeout_s)
                if r.status_code != 200:
                    log.warning("%s bg_unload: HTTP %d %s", inst.name, r.status_code, r.text[:200])
            except requests.RequestException as exc:
                log.warning("%s bg_unload: %s", inst.name, exc)

        with cf.ThreadPoolExecutor(max_workers=min(32, len(self.instances))) as ex:
            list(ex.map(unload, self.instances))

    def _instance_versions(self) -> dict[Instance, tuple[int | None, int | None]]:
        """Each instance's ``(served version, server shard_num)`` from its agent's status
        (None where unknown)."""
        def one(inst: Instance):
            try:
                r = self._http.get(f"{inst.agent}/status", timeout=self.http_timeout_s)
                srv = (r.json().get("server") or {}) if r.status_code == 200 else {}
                return srv.get("version"), srv.get("shard_num")
            except (requests.RequestException, ValueError, AttributeError):
                return None, None

        with cf.ThreadPoolExecutor(max_workers=min(32, len(self.instances))) as ex:
            return dict(zip(self.instances, ex.map(one, self.instances)))

    def reconcile(self) -> list[str]:
        """Brings a lagging instance (e.g. a restarted server that came back empty) to the
        served version: it is driven alone through download -> reload -> enable of each
        link of the served chain (the base, then every patch) it lacks, from the tars
        already published. Unreachable instances are left alone (retried next time).
        Does nothing while a rollout is current or while the served chain is laid out for
        another shard count than the topology's (a re-layout replaces it). An instance whose
        server runs with another ``--shard-num`` is skipped with a warning (its server must
        restart). Returns the instances brought up to date. Errors are logged, never raised."""
        n = len(self.shards)
        with self.lock:
            served = self.state.get("served") or {}
            chain = list(self.state.get("served_chain") or [])
            if self.state.get("current") or not chain or served.get("version") != chain[-1]["version"]:
                return []
            if self.served_shard_num() not in (None, n):
                return []
        target = served["version"]
        fixed = []
        for inst in self.instances:
            try:
                r = self._http.get(f"{inst.agent}/status", timeout=self.http_timeout_s)
                srv = (r.json().get("server") or {}) if r.status_code == 200 else {"version": target}
                have, shards = srv.get("version"), srv.get("shard_num")
            except (requests.RequestException, ValueError, AttributeError):
                continue
            if shards is not None and int(shards) != n:
                self._log_once(("shard_num", inst.name, shards, n), logging.WARNING,
                               "%s: its server runs with --shard-num %s, the topology has %d shards; not "
                               "reconciled until it restarts with --shard-num %d", inst.name, shards, n, n)
                continue
            if have == target:
                continue
            links = [c["version"] for c in chain]
            start = links.index(have) + 1 if have in links else 0
            t0 = time.monotonic()
            log.warning("Reconciling %s: serves %s, not %d; driving it through %s", inst.name, have, target,
                        links[start:])
            try:
                for c in chain[start:]:
                    plan = {"version": c["version"], "mode": c["mode"], "base_version": c["base_version"]}
                    build = {"shards": [{"md5": m} for m in c["md5s"]]}
                    deadline = time.monotonic() + self.phase_timeout_s
                    for step in ("download", "reload", "enable"):
                        self._drive(inst, step, plan, c["urls"], build, deadline)
            except Exception as exc:  # noqa: BLE001
                log.error("Reconciling %s failed: %s (retried later)", inst.name, exc)
                continue
            log.info("Reconciled %s to version %d in %.2f s", inst.name, target, time.monotonic() - t0)
            fixed.append(inst.name)
        return fixed

    def _cleanup_builds(self) -> None:
        """Keeps the served build and the one before it under ``<work_dir>/build``; removes
        the re-layout builds (``build/relayout-*``) once no re-layout is pending."""
        d = self.work_dir / "build" / self.dict_name
        if d.is_dir():
            versions = sorted((int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit()))
            for old in versions[:-2]:
                shutil.rmtree(d / str(old), ignore_errors=True)
        with self.lock:
            pending = self.state.get("relayout") or (self.state.get("current") or {}).get("relayout")
        if not pending:
            for p in (self.work_dir / "build").glob("relayout-*shards"):
                shutil.rmtree(p, ignore_errors=True)

    # ---------------------------------------------------------------- HTTP views

    def info(self) -> dict:
        """``GET /dict/info``: ``version`` is the id every instance serves (None before the
        first rollout); ``shard_num`` the topology's shard count, ``served_shard_num`` the
        one the served version was rolled out for (they differ until a re-layout is done);
        ``relayout``: None, or the pending re-layout ``{"from", "to", "target", "done",
        "links", "given_up", "error"}`` (shard counts, the version id it restores, links
        finished / total); ``waiting_for``: instances whose server runs with another
        ``--shard-num`` (the next rollout waits for them to restart)."""
        with self.lock:
            served = dict(self.state.get("served") or {})
            cur = self.state.get("current")
            last = self.state["history"][-1] if self.state["history"] else None
            rl = self.state.get("relayout")
            relayout = None if not rl else {
                "from": rl.get("from"), "to": rl.get("to"), "target": rl.get("target"), "done": rl.get("next"),
                "links": len(rl.get("links") or []), "given_up": bool(rl.get("given_up")), "error": rl.get("error")}
            served_shards = self.served_shard_num()
        return {"dict_name": self.dict_name, "version": served.get("version"),
                "base_id": served.get("base_id"), "patch_id": served.get("patch_id"),
                "shard_num": len(self.shards), "replica_num": min(len(r) for r in self.shards),
                "replicas": [len(r) for r in self.shards], "dim": served.get("dim"),
                "count": served.get("count"), "model": served.get("model"),
                "enabled_at": served.get("enabled_at"),
                "status": "rolling_out" if cur else ("serving" if served else "empty"),
                "rollout": None if not cur else {k: cur.get(k) for k in ("version", "mode", "phase", "attempt",
                                                                        "started", "reason")},
                "served_shard_num": served_shards, "relayout": relayout, "waiting_for": list(self.waiting_for),
                "last_rollout": None if not last else {k: last.get(k) for k in ("version", "status", "error",
                                                                               "reason")},
                "last_poll": self.last_poll, "last_error": self.last_error}

    def instance_status(self) -> dict:
        """``GET /instance/status``: every instance's agent status (queried now, 2 s timeout)."""
        def one(inst: Instance) -> dict:
            out = {"shard": inst.shard, "replica": inst.replica, "agent": inst.agent, "server": inst.server}
            try:
                r = self._http.get(f"{inst.agent}/status", timeout=2.0)
                st = r.json()
                srv = st.get("server") or {}
                out.update(reachable=True, version=srv.get("version"), bg_version=srv.get("bg_version"),
                           bg_state=srv.get("bg_state"), step=st.get("step"), state=st.get("state"),
                           error=st.get("error") or srv.get("error"))
            except (requests.RequestException, ValueError) as exc:
                out.update(reachable=False, error=str(exc))
            return out

        with cf.ThreadPoolExecutor(max_workers=min(32, len(self.instances))) as ex:
            rows = list(ex.map(one, self.instances))
        served = (self.state.get("served") or {}).get("version")
        return {"dict_name": self.dict_name, "version": served, "instances": rows,
                "consistent": all(r.get("version") == served for r in rows)}

    def history(self) -> list[dict]:
        with self.lock:
            return list(self.state["history"])


class _Retry(RuntimeError):
    """A retryable failure of one instance's step."""


class _Fatal(RuntimeError):
    """A failure no retry can fix (a bad request)."""


class _Partial(Exception):
    """Enabling failed after some instances switched (carries them)."""

    def __init__(self, enabled: set):
        super().__init__("partial enable")
        self.enabled = enabled


# --------------------------------------------------------------------------- HTTP + main


def create_app(transfer: Transfer):
    """The transfer's Flask app (routes in the module docstring)."""
    from flask import Flask, Response, jsonify
    from prometheus_client import generate_latest, CONTENT_TYPE_LATEST

    app = Flask("cube-transfer")

    @app.get("/healthz")
    def healthz():
        return jsonify(ok=True)

    @app.get("/dict/info")
    def dict_info():
        return jsonify(transfer.info())

    @app.get("/instance/status")
    def instance_status():
        return jsonify(transfer.instance_status())

    @app.get("/dict/deploy/history")
    def history():
        return jsonify(history=transfer.history())

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(transfer.registry), mimetype=CONTENT_TYPE_LATEST)

    return app


def main(args) -> int:
    """``elastic-ctr cube transfer``: serves HTTP in a thread and polls until SIGTERM."""
    from waitress import create_server

    token = storage.read_token(args.upload_token_file)
    tr = Transfer(args.topology, args.root, args.work_dir, publish_url=args.publish_url, token=token,
                  poll_interval_s=args.poll_interval, phase_timeout_s=args.phase_timeout,
                  retries=args.retries, max_rollout_attempts=args.max_rollout_attempts,
                  rollout_backoff_s=args.rollout_backoff, reconcile_interval_s=args.reconcile_interval,
                  dict_name=args.dict_name)
    if args.once:
        while tr.poll_once() is not None:
            pass
        return 0
    server = create_server(create_app(tr), host=args.host, port=args.port, threads=4, ident="cube-transfer")
    threading.Thread(target=server.run, daemon=True, name="http").start()
    log.info("cube-transfer listening on http://%s:%d", args.host, args.port)

    def _stop(*_):
        tr.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    tr.run()
    server.close()
    return 0
