"""A container's environment as the kubelet builds it: Service links, ``envFrom``, ``env``
(``value`` with ``$(VAR)`` expansion, ``fieldRef``, ``secretKeyRef``, ``configMapKeyRef``),
then the Volcano plugins' variables, in that order."""
from __future__ import annotations

import re

from tests.containers.kube import dns
from tests.containers.kube.errors import HarnessError, UnsupportedField
from tests.containers.kube.objects import Pod
from tests.containers.kube.store import Store

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes; an unknown reference stays as is)."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return _VAR_REF.sub(sub, value)


def resolve(store: Store, pod: Pod, c: dict, cpath: str) -> tuple[list[tuple[str, str]], set[str]]:
    """The environment of container ``c`` (a rendered container dict; ``cpath`` names it in
    errors), resolved; returns (pairs in order, names whose values came from Secrets).
    Raises HarnessError for a reference not rendered (and not optional), UnsupportedField
    for a ``fieldRef`` other than ``status.podIP``, ``metadata.name``, ``metadata.namespace``."""
    env: dict[str, str] = {}
    secret_names: set[str] = set()
    if pod.spec.get("enableServiceLinks", True):
        env.update(dns.service_links(store))
    for i, ef in enumerate(c.get("envFrom") or []):
        prefix = ef.get("prefix", "")
        if "configMapRef" in ef:
            ref = ef["configMapRef"]
            data = store.configmaps.get(ref["name"])
        else:
            ref = ef["secretRef"]
            data = store.secrets.get(ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise HarnessError(f"{cpath}.envFrom[{i}]: {ref['name']!r} not rendered")
        for k, v in data.items():
            env[prefix + k] = v
            if "secretRef" in ef:
                secret_names.add(prefix + k)
    for i, e in enumerate(list(c.get("env") or []) + pod.extra_env):
        name = e["name"]
        if "valueFrom" not in e:
            env[name] = expand(str(e.get("value", "")), env)
            continue
        vf = e["valueFrom"]
        if "fieldRef" in vf:
            fp = vf["fieldRef"]["fieldPath"]
            values = {"status.podIP": pod.ip, "metadata.name": pod.name, "metadata.namespace": store.namespace}
            if fp not in values:
                raise UnsupportedField(f"{cpath}.env[{i}].valueFrom.fieldRef.fieldPath={fp!r}")
            env[name] = values[fp]
        else:
            is_secret = "secretKeyRef" in vf
            ref = vf["secretKeyRef"] if is_secret else vf["configMapKeyRef"]
            objects = store.secrets if is_secret else store.configmaps
            data = objects.get(ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise HarnessError(f"{cpath}.env[{i}] ({name}): {ref['name']}/{ref['key']} not rendered")
            env[name] = data[ref["key"]]
            if is_secret:
                secret_names.add(name)
    return list(env.items()), secret_names
