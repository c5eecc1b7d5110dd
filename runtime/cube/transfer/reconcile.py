"""The transfer's reconcile: a replica that lags behind the served version (a server
restarted empty, a replica added by a resize) is driven alone through the links of the
served chain it lacks, from the tars already published (``Transfer.reconcile``, every
``--reconcile-every-seconds`` seconds and at start)."""
from __future__ import annotations

import logging
import time

import requests

from runtime.cube.transfer.agents import Shipment
from runtime.cube.transfer.state import Plan

log = logging.getLogger("runtime.cube.transfer.service")


def reconcile(transfer) -> list[str]:
    """Brings the lagging replicas of ``transfer`` (a ``runtime.cube.transfer.service.
    Transfer``; e.g. a server restarted empty) to the served version: each is driven alone through download -> reload -> enable of every link of the
    served chain it lacks, from the tars already published. Unreachable replicas are
    left alone (retried next time). Does nothing while a rollout is current or while
    the served chain is laid out for another shard count (a re-layout replaces it); a
    replica whose server runs with another ``--shard-num`` is skipped with a warning.
    Returns the replicas brought up to date. Errors are logged, never raised."""
    n = transfer.shard_num
    with transfer.lock:
        st = transfer.state
        chain = list(st.served_chain)
        if st.current is not None or st.served is None or not chain or st.served.version != chain[-1].version:
            return []
        if st.served_shard_num() not in (None, n):
            return []
        target = st.served.version
    links = [c.version for c in chain]
    fixed = []
    for rep in transfer.replicas:
        try:
            srv = transfer.agents.status(rep).get("server") or {}
            have, shards = srv.get("version"), srv.get("shard_num")
        except (requests.RequestException, ValueError, AttributeError):
            continue
        if shards is not None and int(shards) != n:
            transfer._log_once(("shard_num", rep.name, shards, n), logging.WARNING,
                           "%s: its server runs with --shard-num %s, the topology has %d shards; not "
                           "reconciled until it restarts with --shard-num %d", rep.name, shards, n, n)
            continue
        if have == target:
            continue
        start = links.index(have) + 1 if have in links else 0
        t0 = time.monotonic()
        log.warning("Reconciling %s: serves %s, not %d; driving it through %s", rep.name, have, target,
                    links[start:])
        try:
            for c in chain[start:]:
                plan = Plan(version=c.version, key=c.key if c.key is not None else c.version, mode=c.mode,
                            base_version=c.base_version, input=c.input or "", model=c.model, seen=time.time())
                ship = Shipment(urls=c.urls, md5s=c.md5s)
                deadline = time.monotonic() + transfer.phase_timeout_s
                for step in ("download", "reload", "enable"):
                    transfer.agents.drive(rep, step, plan, ship, deadline)
        except Exception as exc:  # noqa: BLE001 - retried at the next reconcile
            log.error("Reconciling %s failed: %s (retried later)", rep.name, exc)
            continue
        log.info("Reconciled %s to version %d in %.2f s", rep.name, target, time.monotonic() - t0)
        fixed.append(rep.name)
    return fixed
