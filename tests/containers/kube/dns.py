"""Cluster DNS, Service links and Service endpoints, as the containers and a node's proxy see
them.

DNS is a table of ``--add-host`` entries, the same in every container: StatefulSet pods
``<pod>.<serviceName>[.<ns>[.svc[.cluster.local]]]``, Volcano ``svc``-plugin pods
``<job>-<task>-<i>.<job>`` (+ the same longer forms), and Services ``<svc>[.<ns>[.svc[...]]]``
-> the address of ONE pod of the Service (the first slot the selector matches; a
replacement takes its predecessor's slot, so the name keeps reaching a live pod).
"""
from __future__ import annotations

import time

from tests.containers.kube.objects import Pod
from tests.containers.kube.store import CLUSTER_DOMAIN, Store


def hosts(store: Store, quiet: bool = False) -> dict[str, str]:
    """name -> address, the cluster DNS a container started now sees (deleted pods have no
    record); ``quiet``: do not log the Service lines (``Cluster.apply`` recomputes the
    table before each pod it starts)."""
    ns, dom = store.namespace, CLUSTER_DOMAIN
    out: dict[str, str] = {}

    def forms(base: str, ip: str) -> None:
        for n in (base, f"{base}.{ns}", f"{base}.{ns}.svc", f"{base}.{ns}.svc.{dom}"):
            out[n] = ip

    for p in store.pods.values():
        if p.subdomain and not p.deleted:
            forms(f"{p.hostname}.{p.subdomain}", p.ip)
    for name, svc in store.services.items():
        sel = svc["spec"].get("selector")
        pods = sorted(store.selected(sel), key=lambda p: p.slot) if sel else []
        if pods:
            forms(name, pods[0].ip)
            if not quiet:
                store.log(f"DNS: Service {name} -> {pods[0].name} ({pods[0].ip})"
                          + (f" (one of {len(pods)} pods)" if len(pods) > 1 else ""))
    for w in store.workloads.values():  # the Volcano svc plugin's headless Service <job>
        if w.kind == "Job" and "svc" in (w.body["spec"].get("plugins") or {}) and w.name not in store.services:
            forms(w.name, store.slot_ip(w.slots[0]))
    return out


def service_links(store: Store) -> list[tuple[str, str]]:
    """The ``<SVC>_SERVICE_HOST``, ``<SVC>_PORT...`` variables the kubelet sets for every
    non-headless Service (pointing at the Service's first pod)."""
    out = []
    for name, svc in sorted(store.services.items()):
        if svc["spec"].get("clusterIP") == "None":
            continue
        pods = sorted(store.selected(svc["spec"].get("selector") or {}), key=lambda p: p.slot)
        if not pods:
            continue
        ip, n = pods[0].ip, name.upper().replace("-", "_")
        ports = svc["spec"].get("ports", [])
        out += [(f"{n}_SERVICE_HOST", ip), (f"{n}_SERVICE_PORT", str(ports[0]["port"]))]
        for p in ports:
            if p.get("name"):
                out.append((f"{n}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}", str(p["port"])))
        out.append((f"{n}_PORT", f"tcp://{ip}:{ports[0]['port']}"))
        for p in ports:
            pre = f"{n}_PORT_{p['port']}_TCP"
            out += [(pre, f"tcp://{ip}:{p['port']}"), (f"{pre}_PROTO", "tcp"), (f"{pre}_PORT", str(p["port"])),
                    (f"{pre}_ADDR", ip)]
    return out


def endpoints(store: Store, service: str, propagation_s: float = 0.0) -> list[Pod]:
    """The Service's endpoints as a node's proxy sees them (slot order): pods the selector
    matches that are ready and not terminating (every running one with
    ``publishNotReadyAddresses``). ``propagation_s``: a pod being deleted stays listed that
    long (s) after its deletion began if it was ready then (the endpoints controller and
    kube-proxy take about a second to route away from it)."""
    svc = store.services[service]
    now = time.monotonic()
    pods = [p for p in store.pods.values() if all(p.labels.get(k) == v for k, v in
                                                   (svc["spec"].get("selector") or {}).items())]
    out = []
    for p in pods:
        lagging = (p.terminating and p.ready_when_deleted and p.terminating_since is not None
                   and now - p.terminating_since < propagation_s and any(c.running for c in p.containers))
        if lagging:
            out.append(p)
        elif p.deleted or p.terminating:
            continue
        elif svc["spec"].get("publishNotReadyAddresses"):
            if p.phase == "Running":
                out.append(p)
        elif p.ready:
            out.append(p)
    return sorted(out, key=lambda p: p.slot)
