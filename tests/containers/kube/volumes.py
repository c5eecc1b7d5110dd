"""Pod volumes as host directories: configMap / secret -> files written on the host
(``items``, ``defaultMode``) and mounted read-only; emptyDir -> a fresh directory per pod
(removed when the pod is deleted); persistentVolumeClaim -> one directory per claim, shared
by every pod that mounts it (StatefulSet volumeClaimTemplates: claim ``<tpl>-<pod>``, kept
across pod replacement). Directories are owned ``runAsUser:fsGroup``, mode 2775."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from tests.containers.kube.errors import HarnessError, UnsupportedField
from tests.containers.kube.objects import Pod
from tests.containers.kube.store import Store


def own(path: Path, uid: Optional[int], gid: Optional[int], mode: int = 0o2775) -> None:
    """Creates ``path`` (and parents), owned ``uid:gid`` (None: unchanged), with ``mode``."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid if uid is not None else -1, gid if gid is not None else -1)
    os.chmod(path, mode)


def pod_volumes(store: Store, pod: Pod) -> dict[str, tuple[Path, bool]]:
    """Prepares the pod's volumes (its spec's and the plugins'); returns volume name ->
    (host path, read-only). Raises HarnessError for a claim, ConfigMap or Secret not
    rendered, UnsupportedField for a volume type or emptyDir medium not played."""
    psc = pod.spec.get("securityContext") or {}
    uid, fsgroup = psc.get("runAsUser"), psc.get("fsGroup", psc.get("runAsGroup"))
    out: dict[str, tuple[Path, bool]] = {}
    for i, v in enumerate(pod.spec.get("volumes", []) + pod.extra_volumes):
        path = f"{pod.name}.spec.volumes[{i}]"
        name = v["name"]
        if "emptyDir" in v:
            medium = v["emptyDir"].get("medium", "")
            if medium not in ("", None):
                raise UnsupportedField(f"{path}.emptyDir.medium={medium!r}")
            d = pod.dir / "volumes" / name
            own(d, uid, fsgroup)
            out[name] = (d, False)
        elif "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]["claimName"]
            if claim not in store.claims:
                raise HarnessError(f"{path}: claim {claim!r} is not among the rendered claims")
            d = store.claims[claim]
            if not d.exists():
                own(d, uid, fsgroup)
            else:
                os.chown(d, -1, fsgroup if fsgroup is not None else -1)
            out[name] = (d, bool(v["persistentVolumeClaim"].get("readOnly")))
        elif "configMap" in v or "secret" in v:
            src = v.get("configMap") or v.get("secret")
            ref = src.get("name") or src.get("secretName")
            objects = store.configmaps if "configMap" in v else store.secrets
            if ref not in objects:
                if src.get("optional"):
                    data = {}
                else:
                    raise HarnessError(f"{path}: {'ConfigMap' if 'configMap' in v else 'Secret'} {ref!r} not rendered")
            else:
                data = objects[ref]
            d = pod.dir / "volumes" / name
            d.mkdir(parents=True, exist_ok=True)
            mode = src.get("defaultMode", 0o644)
            items = src.get("items") or [{"key": k, "path": k} for k in data]
            for it in items:
                f = d / it["path"]
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(data[it["key"]])
                # as the kubelet's volume ownership does for these read-only volumes: with an fsGroup,
                # the group owns the file and may read it (a 0400 Secret file reads as 0440)
                os.chmod(f, it.get("mode", mode) | (0o440 if fsgroup is not None else 0))
                if fsgroup is not None:
                    os.chown(f, 0, fsgroup)
            os.chmod(d, 0o755)
            out[name] = (d, True)
        else:
            raise UnsupportedField(f"{path}", "a volume type the harness cannot play")
    return out


def remove_empty_dirs(pod: Pod) -> None:
    """What the kubelet does with a deleted pod's emptyDirs (claims stay)."""
    vols = pod.dir / "volumes"
    for v in pod.spec.get("volumes", []):
        if "emptyDir" in v:
            shutil.rmtree(vols / v["name"], ignore_errors=True)


def volume_dir(store: Store, pod: Pod, volume: str) -> Path:
    """The host directory of the pod's volume ``volume``; KeyError when it has none."""
    for v in pod.spec.get("volumes", []):
        if v["name"] == volume:
            if "persistentVolumeClaim" in v:
                return store.claims[v["persistentVolumeClaim"]["claimName"]]
            return pod.dir / "volumes" / volume
    raise KeyError(f"{pod.name}: no volume {volume}")
