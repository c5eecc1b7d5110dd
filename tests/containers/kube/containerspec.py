"""A rendered container as a ``docker run`` command line, and THE ONE REWRITE.

All containers share the host's network namespace (``--network host``), whereas in
Kubernetes each pod has its own. So that a role that binds "all interfaces" or talks to a
sibling container over the pod's loopback behaves as in its own namespace, each whole-token
``0.0.0.0``, ``127.0.0.1`` and ``localhost`` in a container's ``args`` and ``env`` values
ONLY (never ``command``, files, ConfigMaps or probes) becomes the pod's ``127.0.0.x``;
every rewrite is recorded (``Store.rewrites``) and logged. A ``command`` holding one of
these tokens is refused (``UnsupportedField``).

Security context: runAsUser/runAsGroup -> ``--user uid[:gid]``; fsGroup and
supplementalGroups -> ``--group-add``; runAsNonRoot checked (uid 0 refused, as the kubelet
refuses); readOnlyRootFilesystem -> ``--read-only``; capabilities -> ``--cap-drop`` /
``--cap-add``; allowPrivilegeEscalation false -> ``--security-opt no-new-privileges``;
seccompProfile RuntimeDefault = Docker's default profile. ``limits.memory`` ->
``--memory`` and ``--memory-swap`` (bytes).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from tests.containers.kube import env as kenv
from tests.containers.kube.engine import Docker
from tests.containers.kube.errors import HarnessError, UnsupportedField
from tests.containers.kube.objects import ContainerRun, Pod
from tests.containers.kube.records import Rewrite
from tests.containers.kube.store import CLUSTER_DOMAIN, LABEL, Store

_QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|k|K|M|G|T|)$")
_FACTORS = {"": 1, "k": 1000, "K": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4,
            "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4}


def quantity_bytes(text: str, path: str) -> int:
    """A Kubernetes memory quantity (``"1Gi"``, ``"500M"``) in bytes; UnsupportedField
    naming ``path`` when it cannot be parsed."""
    m = _QUANTITY.match(str(text))
    if not m:
        raise UnsupportedField(f"{path}={text!r}", "a memory quantity the harness cannot parse")
    return int(float(m.group(1)) * _FACTORS[m.group(2)])


#: the tokens the one rewrite replaces (whole tokens only: 10.0.0.0, 127.0.0.12, localhost.x stay)
_REWRITE_RE = re.compile(r"(?<![\w.])(0\.0\.0\.0|127\.0\.0\.1)(?![\w.]*\d)|(?<![\w.-])localhost(?![\w-]|\.\w)")


def rewrite_value(value: str, pod_ip: str) -> str:
    """``value`` with ``0.0.0.0``, ``127.0.0.1`` and ``localhost`` (whole tokens) -> ``pod_ip``."""
    return _REWRITE_RE.sub(pod_ip, value)


def identity(pod: Pod, c: dict) -> tuple[Optional[int], Optional[int], list[int]]:
    """(uid, gid, supplementary groups) of container ``c`` (its securityContext over the pod's)."""
    psc, csc = pod.spec.get("securityContext") or {}, c.get("securityContext") or {}
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    gid = csc.get("runAsGroup", psc.get("runAsGroup"))
    groups = ([psc["fsGroup"]] if psc.get("fsGroup") is not None else []) + list(psc.get("supplementalGroups") or [])
    return uid, gid, groups


def _record_rewrite(store: Store, pod: Pod, cr: ContainerRun, fld: str, before: str, after: str) -> None:
    rw = Rewrite(pod.name, cr.name, fld, before, after)
    with store.lock:
        store.rewrites.append(rw)
    store.log(f"rewrite {rw}")


def docker_run_args(store: Store, docker: Docker, pod: Pod, cr: ContainerRun, vols: dict[str, tuple[Path, bool]],
                    hosts: dict[str, str], image_map: Optional[dict[str, str]] = None,
                    ) -> tuple[list[str], dict[str, str]]:
    """The ``docker run -d ...`` arguments of ``cr`` (``vols``: volume name -> (host path,
    read-only), from ``volumes.pod_volumes``; ``hosts``: the cluster DNS table;
    ``image_map``: rendered image -> image run instead) and the client environment holding
    the Secret-sourced variables (passed by name only, never on the command line)."""
    c = cr.spec
    kind = "initContainers" if cr.init else "containers"
    cpath = f"{pod.name}.spec.{kind}[{cr.name}]"
    psc, csc = pod.spec.get("securityContext") or {}, c.get("securityContext") or {}
    args = ["run", "-d", "--name", cr.docker_name, "--label", f"{LABEL}={store.run_id}",
            "--label", f"{LABEL}.pod={pod.name}", "--label", f"{LABEL}.container={cr.name}",
            "--network", "host", "--hostname", pod.hostname]
    own = [pod.hostname]
    if pod.subdomain:
        own.insert(0, f"{pod.hostname}.{pod.subdomain}.{store.namespace}.svc.{CLUSTER_DOMAIN}")
    table = {**hosts, **{n: pod.ip for n in own}}
    for name, ip in sorted(table.items()):
        args += ["--add-host", f"{name}:{ip}"]
    uid, gid, groups = identity(pod, c)
    if csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
        effective = uid
        if effective is None:
            user = docker("image", "inspect", "--format", "{{.Config.User}}", c["image"]).stdout.strip()
            effective = int(user.split(":")[0]) if user.split(":")[0].isdigit() else (0 if user in ("", "root") else None)
        if effective == 0:
            raise HarnessError(f"{cpath}: runAsNonRoot but the container would run as uid 0 "
                               "(the kubelet refuses to start it)")
    if uid is not None:
        args += ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]
    for g in groups:
        args += ["--group-add", str(g)]
    if csc.get("privileged"):
        raise UnsupportedField(f"{cpath}.securityContext.privileged=true")
    if csc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    caps = csc.get("capabilities") or {}
    for cap in caps.get("drop") or []:
        args += ["--cap-drop", cap]
    for cap in caps.get("add") or []:
        args += ["--cap-add", cap]
    if csc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        raise UnsupportedField(f"{cpath}.securityContext.seccompProfile.type={seccomp!r}")
    mem = ((c.get("resources") or {}).get("limits") or {}).get("memory")
    if mem:
        b = quantity_bytes(mem, f"{cpath}.resources.limits.memory")
        args += ["--memory", f"{b}b", "--memory-swap", f"{b}b"]
    for i, p in enumerate(c.get("ports") or []):
        if p.get("protocol", "TCP") != "TCP":
            raise UnsupportedField(f"{cpath}.ports[{i}].protocol={p['protocol']!r}")
    for i, m in enumerate(list(c.get("volumeMounts") or []) + pod.extra_mounts):
        if m["name"] not in vols:
            raise HarnessError(f"{cpath}.volumeMounts[{i}]: no volume {m['name']!r}")
        src, ro = vols[m["name"]]
        if m.get("subPath"):
            src = src / m["subPath"]
            src.mkdir(parents=True, exist_ok=True)
        spec = f"{src}:{m['mountPath']}" + (":ro" if ro or m.get("readOnly") else "")
        args += ["-v", spec]
    if c.get("workingDir"):
        args += ["-w", c["workingDir"]]
    # environment (the one rewrite applies to values), secrets through the client's env
    pairs, secret_names = kenv.resolve(store, pod, c, cpath)
    client_env: dict[str, str] = {}
    final: dict[str, str] = {}
    for name, value in pairs:
        new = rewrite_value(value, pod.ip)
        if new != value:
            _record_rewrite(store, pod, cr, f"env {name}", value, new)
        final[name] = new
    for name, value in final.items():
        if name in secret_names:
            client_env[name] = value
            args += ["-e", name]
        else:
            args += ["-e", f"{name}={value}"]
    command = [kenv.expand(str(x), final) for x in (c.get("command") or [])]
    for i, x in enumerate(command):
        if rewrite_value(x, pod.ip) != x:
            raise UnsupportedField(f"{cpath}.command[{i}]={x!r}",
                                   "holds 0.0.0.0/127.0.0.1/localhost, which the harness rewrites only in args "
                                   "and env")
    cargs = []
    for i, x in enumerate(c.get("args") or []):
        x = kenv.expand(str(x), final)
        new = rewrite_value(x, pod.ip)
        if new != x:
            _record_rewrite(store, pod, cr, f"args[{i}]", x, new)
        cargs.append(new)
    image = (image_map or {}).get(c["image"], c["image"])
    if image != c["image"]:
        store.log(f"{pod.name}/{cr.name}: image {c['image']} SUBSTITUTED by {image}")
    if command:
        args += ["--entrypoint", command[0], image, *command[1:], *cargs]
    else:
        args += [image, *cargs]
    return args, client_env
