"""A test harness that runs a rendered elastic-ctr stack as Docker containers, the way
Kubernetes (and Volcano) would run it on one node.

Input: the manifests ``infra.render.render(stack, overrides)`` returns (or the files
``elastic-ctr render --stack NAME --out DIR`` writes). Every pod of every workload becomes
one Docker container per (init) container, from the image the manifest names, with exactly
the rendered command, args and environment. Nothing is added to a container's command line
beyond what the kubelet and the container runtime would add, with ONE exception (below).

How each Kubernetes concept is played
-------------------------------------
* **Pod network.** Each pod gets its own loopback address ``127.0.0.x`` (allocated in
  workload order; ``Cluster.ip(pod)``). Containers run with ``--network host`` (no Docker
  network is ever created), so "the pod IP" is an address the container can bind and every
  other container and the host can reach. ``fieldRef status.podIP`` is that address.
* **THE ONE REWRITE.** All containers share the host's network namespace, whereas in
  Kubernetes each pod has its own. So that a role that binds "all interfaces" or talks to a
  sibling container over the pod's loopback behaves as in its own namespace, the harness
  rewrites, in a container's ``args`` and in its ``env`` values ONLY (never ``command``,
  files, ConfigMaps or probes), each whole-token occurrence of

    - the bind-all address ``0.0.0.0``,
    - the in-pod loopback references ``127.0.0.1`` and ``localhost``

  to that pod's ``127.0.0.x``. Every rewrite is logged (``Cluster.rewrites`` and the harness
  log: pod, container, field, before, after). A ``command`` containing one of these tokens is
  refused (``UnsupportedField``), since leaving it would break the isolation silently.
  A role that binds ``0.0.0.0`` *by itself* (not from its args/env) still binds every
  address; two pods doing so on one port collide, as they would never in Kubernetes. That is
  reported as a failure of the pod, never worked around.
* **Cluster DNS** as ``--add-host`` entries (the same table in every container, plus the
  pod's own hostname): StatefulSet pods ``<pod>.<serviceName>.<ns>.svc.cluster.local`` and its
  short forms ``<pod>.<serviceName>[.<ns>[.svc]]``; Volcano ``svc``-plugin pods
  ``<job>-<task>-<i>.<job>`` (+ the same longer forms); Services ``<svc>``, ``<svc>.<ns>``,
  ``<svc>.<ns>.svc``, ``<svc>.<ns>.svc.cluster.local`` -> the address of ONE pod of the
  Service: the harness picks the first pod (slot 0) the selector matches. For a Service
  backed by several pods (``serving``) in-cluster clients therefore always reach slot 0's
  pod; a replacement pod takes over the address slot of the pod it replaces, so a Service
  name keeps reaching a live pod, as a ClusterIP would. The entries exist from the start
  (a headless Service without ``publishNotReadyAddresses`` would only list ready pods).
  Service links (``<SVC>_SERVICE_HOST`` ...) are set as the kubelet sets them.
* **Pods, init containers, restart.** A pod's init containers run one after the other to
  completion (exit 0) before its containers start; containers start together. Container
  hostname = pod hostname (``--hostname``). No container is ever restarted: an exit of a
  ``restartPolicy: Always`` container, or a liveness probe failing ``failureThreshold``
  times, is recorded in ``Cluster.errors`` (the kubelet would restart it; a test asserts
  there is none) instead of being hidden by a restart.
* **Security context.** runAsUser/runAsGroup -> ``--user uid[:gid]``; fsGroup and
  supplementalGroups -> ``--group-add``; runAsNonRoot checked (uid 0 refused, as the kubelet
  refuses); readOnlyRootFilesystem -> ``--read-only``; capabilities -> ``--cap-drop``/
  ``--cap-add``; allowPrivilegeEscalation false -> ``--security-opt no-new-privileges``;
  seccompProfile RuntimeDefault = Docker's default profile.
* **Volumes.** configMap / secret -> files written on the host (``items``, ``defaultMode``)
  and mounted read-only; emptyDir -> a fresh host directory per pod (removed when the pod is
  deleted); persistentVolumeClaim -> one host directory per claim, shared by every pod that
  mounts the claim; StatefulSet volumeClaimTemplates -> claim ``<tpl>-<pod>`` (kept across
  pod replacement). Host directories are owned ``runAsUser:fsGroup`` mode 2775. All live
  under the harness work directory (a pytest ``tmp_path``).
* **Resources.** ``limits.memory`` -> ``--memory`` (and ``--memory-swap``): a role over its
  limit is OOM-killed as in Kubernetes.
* **Probes** (readinessProbe, livenessProbe, startupProbe; httpGet, tcpSocket, grpc, exec) are
  run against the pod address as the kubelet does (initialDelaySeconds, periodSeconds,
  timeoutSeconds, successThreshold, failureThreshold; HTTP 200-399 is success). Pod
  readiness = every container ready; ``Cluster.ready(pod)``, ``Cluster.endpoints(service)``
  (ready and not terminating, or every pod with ``publishNotReadyAddresses``; optionally a
  deleted pod stays listed ``propagation_s`` seconds, as kube-proxy lags the endpoints).
* **Deleting a pod the Kubernetes way** (``Cluster.delete_pod``): the pod is marked
  terminating (it leaves every Service's endpoints at once), preStop hooks run (exec,
  httpGet, sleep), then SIGTERM (``docker kill --signal TERM``) to every container, and
  SIGKILL to whatever still runs ``terminationGracePeriodSeconds`` (default 30) after the
  deletion began. Exit codes, times and readiness transitions are returned. The owning
  Deployment/StatefulSet controller then creates the replacement (Deployment: new name,
  same address slot; StatefulSet: same name, same claims, fresh emptyDirs).
  ``Cluster.kill_pod`` is the crash variant (SIGKILL at once).
* **Controllers.** Deployment and StatefulSet ``replicas`` pods (StatefulSet
  ``podManagementPolicy: OrderedReady`` starts ordinal by ordinal, each once the previous
  one is ready; ``Parallel`` all at once).
* **Volcano Job** (``batch.volcano.sh/v1alpha1``): pods ``<job>-<task>-<i>`` of every task are
  created together and started at one barrier (gang start; ``minAvailable`` must be
  satisfiable by the tasks' replicas). ``svc`` plugin: hostname ``<pod>`` + subdomain
  ``<job>``, env ``VC_<TASK>_HOSTS`` (comma-separated ``<pod>.<job>``) and ``VC_<TASK>_NUM``
  for every task, and the ConfigMap ``<job>-svc`` mounted at ``/etc/volcano`` (files
  ``<task>.host``, newline-separated, plus the ``VC_*`` keys), in containers and init
  containers, exactly as the plugin does. ``env`` plugin: ``VC_TASK_INDEX`` and
  ``VK_TASK_INDEX``. Task policy ``TaskCompleted -> CompleteJob``: once every pod of that
  task exited 0, every other running pod of the job is deleted the Kubernetes way and the
  job is ``Completed``. A failed pod makes the job ``Failed`` (see below).

Images: the rendered image must exist in the engine (no registry); ``image_map`` substitutes
another image for a rendered one (to try a fix before it is in the tree), logged loudly.

What it knowingly does not play (``IGNORED``, each with why that is safe here) is listed in
``IGNORED``; any other field fails with ``UnsupportedField`` naming its path, before any
container starts.
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import logging
import os
import random
import re
import secrets as _secrets
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import yaml

log = logging.getLogger("tests.containers.kube")

LABEL = "elastic-ctr-harness"
CLUSTER_DOMAIN = "cluster.local"
DEFAULT_GRACE_S = 30
REDACTED = "[redacted]"  # infra.render.REDACTED: a Secret value the rendering hides

# ----------------------------------------------------------------------------- field allow-lists
PLAY = "play"


def _ign(reason: str) -> tuple[str, str]:
    return ("ignore", reason)


#: Fields the harness knowingly does not play, and why that is safe for what the tests check.
IGNORED: dict[str, str] = {
    "metadata.annotations":
        "annotations drive no kubelet behaviour here (the topology checksum only rolls pods when it changes)",
    "Pod.spec.affinity": "one node: every (anti-)affinity is trivially satisfied or only preferred",
    "Pod.spec.nodeSelector": "one node",
    "Pod.spec.tolerations": "one node without taints",
    "Pod.spec.imagePullSecrets": "no registry: images must be present in the engine (checked)",
    "Pod.spec.priorityClassName": "no preemption on one node with every pod fitting",
    "Pod.spec.securityContext.fsGroupChangePolicy": "host directories are created with the right owner",
    "Container.imagePullPolicy": "no registry: the local image built from this tree is used (checked present)",
    "Container.resources.requests": "scheduling input only; one node, nothing is scheduled away",
    "Container.resources.limits.cpu":
        "CFS quotas would only slow the run on a 2-core machine shared by every pod; behaviour is unchanged",
    "Container.terminationMessagePath": "the harness reads container logs instead",
    "Container.terminationMessagePolicy": "the harness reads container logs instead",
    "Probe.terminationGracePeriodSeconds": "liveness failures never restart here (recorded as errors)",
    "Volume.emptyDir.sizeLimit": "an eviction threshold, not a file-system limit; the test data is small",
    "PersistentVolumeClaim.spec.accessModes":
        "every pod is on one node, where ReadWriteOnce and ReadWriteMany both allow sharing",
    "PersistentVolumeClaim.spec.resources": "capacity of a host directory is not enforced; the test data is small",
    "PersistentVolumeClaim.spec.storageClassName": "one host-directory provisioner",
    "Service.spec.type": "in-cluster traffic uses the Service name; LoadBalancer only adds an outside address",
    "Service.spec.ports.appProtocol": "a hint for proxies/meshes; no effect on plain TCP",
    "Service.spec.ports.protocol": "TCP only (checked: another protocol is refused)",
    "Deployment.spec.strategy":
        "the harness never changes a pod template; a deleted pod is replaced at once under both strategies",
    "Deployment.spec.revisionHistoryLimit": "no rollouts of templates",
    "Deployment.spec.minReadySeconds": "no rollouts of templates",
    "StatefulSet.spec.updateStrategy": "no rollouts of templates",
    "StatefulSet.spec.persistentVolumeClaimRetentionPolicy": "claims are kept for the whole run",
    "PodDisruptionBudget":
        "limits voluntary evictions through the eviction API; the harness deletes pods directly (as "
        "`kubectl delete pod`), which a PDB does not block; the tests delete one replica at a time anyway",
    "HorizontalPodAutoscaler": "no metrics server: the declared replicas (the HPA minimum) run",
    "Secret.type": "Opaque payloads are played; a dockerconfigjson Secret only feeds image pulls (none)",
    "Job.spec.schedulerName": "the harness is the scheduler (gang start is played)",
    "Job.spec.queue": "one queue, no quota contention",
    "Job.spec.maxRetry": "job restarts are not played: a failed pod fails the run (tests assert none fails)",
    "Job.spec.policies":
        "PodFailed/PodEvicted -> RestartJob is not played: the harness evicts nothing and a failed pod "
        "fails the run instead of restarting the job, so a restart can never hide a defect",
}


def _schema():
    """The known fields of each kind: PLAY (played, values checked by the player), an
    ignore tuple (allow-listed above), or a nested schema (dict = object, [x] = list of x)."""
    ig = lambda key: _ign(IGNORED[key])  # noqa: E731
    handler = {"exec": {"command": PLAY},
               "httpGet": {"path": PLAY, "port": PLAY, "host": PLAY, "scheme": PLAY, "httpHeaders": PLAY},
               "sleep": {"seconds": PLAY}}
    probe = {"httpGet": {"path": PLAY, "port": PLAY, "host": PLAY, "scheme": PLAY, "httpHeaders": PLAY},
             "tcpSocket": {"port": PLAY, "host": PLAY}, "grpc": {"port": PLAY, "service": PLAY},
             "exec": {"command": PLAY}, "initialDelaySeconds": PLAY, "periodSeconds": PLAY,
             "timeoutSeconds": PLAY, "successThreshold": PLAY, "failureThreshold": PLAY,
             "terminationGracePeriodSeconds": ig("Probe.terminationGracePeriodSeconds")}
    key_ref = {"name": PLAY, "key": PLAY, "optional": PLAY}
    container = {
        "name": PLAY, "image": PLAY, "command": PLAY, "args": PLAY, "workingDir": PLAY,
        "env": [{"name": PLAY, "value": PLAY, "valueFrom": {
            "fieldRef": {"fieldPath": PLAY, "apiVersion": PLAY},
            "secretKeyRef": key_ref, "configMapKeyRef": key_ref}}],
        "envFrom": [{"prefix": PLAY, "configMapRef": {"name": PLAY, "optional": PLAY},
                     "secretRef": {"name": PLAY, "optional": PLAY}}],
        "ports": [{"name": PLAY, "containerPort": PLAY, "protocol": PLAY}],
        "volumeMounts": [{"name": PLAY, "mountPath": PLAY, "readOnly": PLAY, "subPath": PLAY}],
        "securityContext": {"runAsUser": PLAY, "runAsGroup": PLAY, "runAsNonRoot": PLAY,
                            "readOnlyRootFilesystem": PLAY, "allowPrivilegeEscalation": PLAY,
                            "privileged": PLAY, "capabilities": {"drop": PLAY, "add": PLAY},
                            "seccompProfile": {"type": PLAY}},
        "resources": {"requests": ig("Container.resources.requests"),
                      "limits": {"memory": PLAY, "cpu": ig("Container.resources.limits.cpu")}},
        "readinessProbe": probe, "livenessProbe": probe, "startupProbe": probe,
        "lifecycle": {"preStop": handler, "postStart": handler},
        "imagePullPolicy": ig("Container.imagePullPolicy"),
        "terminationMessagePath": ig("Container.terminationMessagePath"),
        "terminationMessagePolicy": ig("Container.terminationMessagePolicy"),
    }
    volume = {"name": PLAY,
              "configMap": {"name": PLAY, "items": [{"key": PLAY, "path": PLAY, "mode": PLAY}],
                            "defaultMode": PLAY, "optional": PLAY},
              "secret": {"secretName": PLAY, "items": [{"key": PLAY, "path": PLAY, "mode": PLAY}],
                         "defaultMode": PLAY, "optional": PLAY},
              "emptyDir": {"medium": PLAY, "sizeLimit": ig("Volume.emptyDir.sizeLimit")},
              "persistentVolumeClaim": {"claimName": PLAY, "readOnly": PLAY}}
    pod_spec = {
        "containers": [container], "initContainers": [container], "volumes": [volume],
        "restartPolicy": PLAY, "terminationGracePeriodSeconds": PLAY, "hostname": PLAY, "subdomain": PLAY,
        "enableServiceLinks": PLAY,
        "securityContext": {"runAsUser": PLAY, "runAsGroup": PLAY, "runAsNonRoot": PLAY, "fsGroup": PLAY,
                            "supplementalGroups": PLAY, "seccompProfile": {"type": PLAY},
                            "fsGroupChangePolicy": ig("Pod.spec.securityContext.fsGroupChangePolicy")},
        "affinity": ig("Pod.spec.affinity"), "nodeSelector": ig("Pod.spec.nodeSelector"),
        "tolerations": ig("Pod.spec.tolerations"), "imagePullSecrets": ig("Pod.spec.imagePullSecrets"),
        "priorityClassName": ig("Pod.spec.priorityClassName"),
    }
    meta = {"name": PLAY, "namespace": PLAY, "labels": PLAY, "annotations": ig("metadata.annotations")}
    template = {"metadata": {"labels": PLAY, "annotations": ig("metadata.annotations")}, "spec": pod_spec}
    selector = {"matchLabels": PLAY}
    pvc_spec = {"accessModes": ig("PersistentVolumeClaim.spec.accessModes"),
                "resources": ig("PersistentVolumeClaim.spec.resources"),
                "storageClassName": ig("PersistentVolumeClaim.spec.storageClassName"), "volumeMode": PLAY}
    head = {"apiVersion": PLAY, "kind": PLAY, "metadata": meta}
    return {
        "Namespace": {**head, "metadata": {"name": PLAY, "labels": PLAY, "annotations": ig("metadata.annotations")}},
        "Secret": {**head, "type": ig("Secret.type"), "data": PLAY, "stringData": PLAY},
        "ConfigMap": {**head, "data": PLAY, "binaryData": PLAY},
        "PersistentVolumeClaim": {**head, "spec": pvc_spec},
        "Service": {**head, "spec": {
            "selector": PLAY, "clusterIP": PLAY, "publishNotReadyAddresses": PLAY,
            "type": ig("Service.spec.type"),
            "ports": [{"name": PLAY, "port": PLAY, "targetPort": PLAY,
                       "protocol": ig("Service.spec.ports.protocol"),
                       "appProtocol": ig("Service.spec.ports.appProtocol")}]}},
        "Deployment": {**head, "spec": {"replicas": PLAY, "selector": selector, "template": template,
                                        "strategy": ig("Deployment.spec.strategy"),
                                        "revisionHistoryLimit": ig("Deployment.spec.revisionHistoryLimit"),
                                        "minReadySeconds": ig("Deployment.spec.minReadySeconds")}},
        "StatefulSet": {**head, "spec": {
            "serviceName": PLAY, "replicas": PLAY, "podManagementPolicy": PLAY, "selector": selector,
            "template": template,
            "volumeClaimTemplates": [{"metadata": {"name": PLAY, "labels": PLAY}, "spec": pvc_spec}],
            "updateStrategy": ig("StatefulSet.spec.updateStrategy"),
            "persistentVolumeClaimRetentionPolicy": ig("StatefulSet.spec.persistentVolumeClaimRetentionPolicy")}},
        "PodDisruptionBudget": ig("PodDisruptionBudget"),
        "HorizontalPodAutoscaler": ig("HorizontalPodAutoscaler"),
        "Job": {**head, "spec": {
            "schedulerName": ig("Job.spec.schedulerName"), "queue": ig("Job.spec.queue"),
            "minAvailable": PLAY, "maxRetry": ig("Job.spec.maxRetry"), "policies": ig("Job.spec.policies"),
            "plugins": {"svc": PLAY, "env": PLAY},
            "tasks": [{"name": PLAY, "replicas": PLAY, "minAvailable": PLAY, "template": template,
                       "policies": [{"event": PLAY, "action": PLAY}]}]}},
    }


SCHEMA = _schema()


class HarnessError(RuntimeError):
    """The harness cannot do what was asked (engine error, timeout, bad input)."""


class UnsupportedField(HarnessError):
    """A rendered field the harness does not know how to play; ``path`` names it."""

    def __init__(self, path: str, why: str = "not known to the harness (and not in kube.IGNORED)"):
        super().__init__(f"{path}: {why}")
        self.path = path


def validate(body: dict, where: str) -> list[tuple[str, str]]:
    """Checks every field of one manifest against ``SCHEMA``. Returns the ignored
    ``(path, reason)`` pairs; raises :class:`UnsupportedField` for an unknown field."""
    kind = body.get("kind")
    if kind not in SCHEMA:
        raise UnsupportedField(f"{where}.kind={kind!r}", "a kind the harness does not know how to play")
    if kind == "Job" and body.get("apiVersion") != "batch.volcano.sh/v1alpha1":
        raise UnsupportedField(f"{where}.apiVersion={body.get('apiVersion')!r}", "only Volcano's Job is played")
    ignored: list[tuple[str, str]] = []

    def walk(value: Any, schema: Any, path: str) -> None:
        if schema == PLAY:
            return
        if isinstance(schema, tuple):
            ignored.append((path, schema[1]))
            return
        if isinstance(schema, list):
            if not isinstance(value, list):
                raise UnsupportedField(path, f"expected a list, got {type(value).__name__}")
            for i, item in enumerate(value):
                walk(item, schema[0], f"{path}[{i}]")
            return
        if not isinstance(value, dict):
            raise UnsupportedField(path, f"expected an object, got {type(value).__name__}")
        for key, sub in value.items():
            if key not in schema:
                raise UnsupportedField(f"{path}.{key}")
            walk(sub, schema[key], f"{path}.{key}")

    walk(body, SCHEMA[kind], where)
    return ignored


# ----------------------------------------------------------------------------- small helpers
_QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|k|K|M|G|T|)$")
_FACTORS = {"": 1, "k": 1000, "K": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4,
            "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4}


def quantity_bytes(text: str, path: str) -> int:
    m = _QUANTITY.match(str(text))
    if not m:
        raise UnsupportedField(f"{path}={text!r}", "a memory quantity the harness cannot parse")
    return int(float(m.group(1)) * _FACTORS[m.group(2)])


#: the tokens the one rewrite replaces (whole tokens only: 10.0.0.0, 127.0.0.12, localhost.x stay)
_REWRITE_RE = re.compile(r"(?<![\w.])(0\.0\.0\.0|127\.0\.0\.1)(?![\w.]*\d)|(?<![\w.-])localhost(?![\w-]|\.\w)")


def rewrite_value(value: str, pod_ip: str) -> str:
    """``value`` with ``0.0.0.0``, ``127.0.0.1`` and ``localhost`` (whole tokens) -> ``pod_ip``."""
    return _REWRITE_RE.sub(pod_ip, value)


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes; an unknown reference stays as is)."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return _VAR_REF.sub(sub, value)


def _rand(n: int) -> str:
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


# ----------------------------------------------------------------------------- records
@dataclass
class Rewrite:
    pod: str
    container: str
    field: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.pod}/{self.container} {self.field}: {self.before!r} -> {self.after!r}"


@dataclass
class ContainerExit:
    container: str
    exit_code: Optional[int]
    seconds: Optional[float]      # from the start of the termination to the exit
    sigkilled: bool
    first_not_ready_s: Optional[float] = None  # readiness endpoint first failed (fast watcher)
    kubelet_not_ready_s: Optional[float] = None  # the kubelet-view readiness turned false


@dataclass
class Termination:
    pod: str
    reason: str
    grace_s: float
    containers: list[ContainerExit] = field(default_factory=list)
    replacement: Optional[str] = None

    @property
    def clean(self) -> bool:
        return all(c.exit_code == 0 and not c.sigkilled for c in self.containers)

    def summary(self) -> str:
        parts = []
        for c in self.containers:
            s = f"{c.container}: exit {c.exit_code} after {c.seconds:.2f} s" if c.seconds is not None \
                else f"{c.container}: exit {c.exit_code}"
            if c.sigkilled:
                s += " (SIGKILL)" if self.reason == "kill" else " (SIGKILL after the grace period)"
            if c.first_not_ready_s is not None:
                s += f", readiness false at {c.first_not_ready_s:.2f} s"
            parts.append(s)
        return f"{self.pod} ({self.reason}, grace {self.grace_s:.0f} s): " + "; ".join(parts)


class ContainerRun:
    """One container of one pod: its Docker container and what the kubelet tracks."""

    def __init__(self, pod: "Pod", spec: dict, init: bool):
        self.pod, self.spec, self.init = pod, spec, init
        self.name = spec["name"]
        self.docker_name = f"ectr-{pod.cluster.run_id}-{pod.name}-{self.name}-{pod.uid[:5]}"
        self.id: Optional[str] = None
        self.started_at: Optional[float] = None
        self.exited_at: Optional[float] = None
        self.exit_code: Optional[int] = None
        self.ready = False
        self.started_ok = False  # startupProbe passed (or none)
        self.ready_history: list[tuple[float, bool]] = []
        self.exited = threading.Event()
        self.log_path = pod.cluster.workdir / "logs" / pod.name / f"{self.name}-{pod.uid[:5]}.log"

    @property
    def running(self) -> bool:
        return self.id is not None and not self.exited.is_set()

    def set_ready(self, value: bool) -> None:
        if value != self.ready:
            self.ready = value
            self.ready_history.append((time.monotonic(), value))
            self.pod.cluster._log(f"{self.pod.name}/{self.name}: ready={value}")


class Pod:
    def __init__(self, cluster: "Cluster", name: str, owner: "Workload", slot: int, spec: dict, labels: dict,
                 hostname: str, subdomain: Optional[str], extra_env: Optional[list] = None,
                 extra_volumes: Optional[list] = None, extra_mounts: Optional[list] = None, index: int = 0):
        self.cluster, self.name, self.owner, self.slot = cluster, name, owner, slot
        self.spec, self.labels, self.hostname, self.subdomain = spec, labels, hostname, subdomain
        self.index = index
        self.task: Optional[str] = None  # Volcano task name
        self.uid = hashlib.sha1(f"{name}{time.time_ns()}{random.random()}".encode()).hexdigest()
        self.extra_env = extra_env or []
        self.extra_volumes = extra_volumes or []
        self.extra_mounts = extra_mounts or []
        self.dir = cluster.workdir / "pods" / f"{name}-{self.uid[:8]}"
        self.phase = "Pending"
        self.error: Optional[str] = None
        self.terminating = False
        self.terminating_since: Optional[float] = None
        self.ready_when_deleted = False
        self.deleted = False
        self.created_at = time.monotonic()
        self.init_containers = [ContainerRun(self, c, True) for c in spec.get("initContainers", [])]
        self.containers = [ContainerRun(self, c, False) for c in spec["containers"]]
        self.thread: Optional[threading.Thread] = None
        self.probers: list[threading.Thread] = []
        self.stop_probing = threading.Event()

    @property
    def ip(self) -> str:
        return self.cluster.slot_ip(self.slot)

    @property
    def ready(self) -> bool:
        return self.phase == "Running" and not self.terminating and all(c.ready for c in self.containers)

    @property
    def grace_s(self) -> float:
        return float(self.spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))

    def container(self, name: str) -> ContainerRun:
        for c in self.init_containers + self.containers:
            if c.name == name:
                return c
        raise KeyError(f"{self.name}: no container {name}")

    def __repr__(self) -> str:
        return f"Pod({self.name} {self.ip} {self.phase}{' terminating' if self.terminating else ''})"


@dataclass
class Workload:
    kind: str  # Deployment | StatefulSet | Job
    name: str
    body: dict
    pods: list[Pod] = field(default_factory=list)
    phase: str = "Pending"  # Job: Pending, Running, Completed, Failed
    completion: list[Termination] = field(default_factory=list)  # Job: CompleteJob's deletions
    slots: list[int] = field(default_factory=list)


# ----------------------------------------------------------------------------- the cluster
class Cluster:
    """A rendered stack run as containers. Use as a context manager (``cleanup`` at exit).

    Args:
        manifests: manifest bodies (dicts), an ``infra.render.Rendering``, or a directory of
            rendered ``NN-*.yaml`` files.
        workdir: where host directories, volumes and logs go (a pytest ``tmp_path``).
        docker_env: the environment the ``docker`` client runs with (``DOCKER_HOST``).
        secret_values: ``{(secret, key): value}`` for values the rendering redacted; others
            get a random value (consistent for every pod of the run).
        ip_prefix / first_ip: pod addresses ``<prefix><first_ip + slot>``.
    """

    def __init__(self, manifests: Any, workdir: Path, docker_env: dict[str, str], *,
                 run_id: Optional[str] = None, secret_values: Optional[dict] = None,
                 ip_prefix: str = "127.0.0.", first_ip: int = 101, echo: Optional[Callable[[str], None]] = None,
                 image_map: Optional[dict[str, str]] = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.docker_env = dict(docker_env)
        self.run_id = run_id or _rand(6)
        self.ip_prefix, self.first_ip = ip_prefix, first_ip
        self.echo = echo
        self.lock = threading.RLock()
        self.log_file = open(self.workdir / "harness.log", "a", buffering=1)
        self.rewrites: list[Rewrite] = []
        self.errors: list[str] = []
        self.events: list[str] = []
        self.ignored: list[tuple[str, str]] = []
        self.terminations: list[Termination] = []
        self.all_containers: list[ContainerRun] = []
        self._exits: dict[str, tuple[int, float]] = {}
        self._by_id: dict[str, ContainerRun] = {}
        self._events_proc: Optional[subprocess.Popen] = None
        self._stopping = threading.Event()
        self._next_slot = 0
        self.namespace = "default"
        self.secrets: dict[str, dict[str, str]] = {}
        self.configmaps: dict[str, dict[str, str]] = {}
        self.claims: dict[str, Path] = {}
        self.services: dict[str, dict] = {}
        self.workloads: dict[str, Workload] = {}
        self.pods: dict[str, Pod] = {}
        self._secret_values = dict(secret_values or {})
        #: rendered image -> image run instead (to try a fix before it is in the tree; logged)
        self.image_map = dict(image_map or {})
        self._load(self._bodies(manifests))

    # ------------------------------------------------------------------ manifests
    @staticmethod
    def _bodies(manifests: Any) -> list[tuple[str, dict]]:
        if hasattr(manifests, "manifests"):  # infra.render.Rendering
            return [(m.filename, m.body) for m in manifests.manifests]
        if isinstance(manifests, (str, Path)):
            d = Path(manifests)
            return [(p.name, yaml.safe_load(p.read_text())) for p in sorted(d.glob("[0-9][0-9]-*.yaml"))]
        return [(f"manifest[{i}]", b) for i, b in enumerate(manifests)]

    def _load(self, bodies: list[tuple[str, dict]]) -> None:
        for where, body in bodies:
            self.ignored += validate(body, f"{body.get('kind')}/{body.get('metadata', {}).get('name')}")
        namespaces = [b["metadata"]["name"] for _, b in bodies if b["kind"] == "Namespace"]
        if namespaces:
            self.namespace = namespaces[0]
        for _, b in bodies:
            ns = b.get("metadata", {}).get("namespace")
            if b["kind"] != "Namespace" and ns and ns != self.namespace:
                raise UnsupportedField(f"{b['kind']}/{b['metadata']['name']}.metadata.namespace={ns!r}",
                                       f"one namespace per run ({self.namespace})")
        for _, b in bodies:
            kind, name = b["kind"], b["metadata"]["name"]
            if kind == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in (b.get("data") or {}).items()}
                data.update(b.get("stringData") or {})
                for k, v in data.items():
                    if v == REDACTED:
                        data[k] = self._secret_values.get((name, k)) or _secrets.token_hex(24)
                self.secrets[name] = data
            elif kind == "ConfigMap":
                data = dict(b.get("data") or {})
                for k, v in (b.get("binaryData") or {}).items():
                    data[k] = base64.b64decode(v).decode("latin-1")
                self.configmaps[name] = data
            elif kind == "PersistentVolumeClaim":
                mode = (b.get("spec") or {}).get("volumeMode", "Filesystem")
                if mode != "Filesystem":
                    raise UnsupportedField(f"PersistentVolumeClaim/{name}.spec.volumeMode={mode!r}")
                self.claims[name] = self.workdir / "claims" / name
            elif kind == "Service":
                self._check_service(b)
                self.services[name] = b
            elif kind in ("Deployment", "StatefulSet", "Job"):
                self.workloads[name] = Workload(kind, name, b)
        for w in self.workloads.values():
            self._plan(w)

    def _check_service(self, b: dict) -> None:
        for i, p in enumerate(b["spec"].get("ports", [])):
            if p.get("protocol", "TCP") != "TCP":
                raise UnsupportedField(f"Service/{b['metadata']['name']}.spec.ports[{i}].protocol={p['protocol']!r}")
            target = p.get("targetPort", p["port"])
            if isinstance(target, int) and target != p["port"]:
                raise UnsupportedField(
                    f"Service/{b['metadata']['name']}.spec.ports[{i}].targetPort={target}",
                    f"differs from port {p['port']}: Service names resolve to pod addresses, so ports cannot "
                    "be translated")

    def _alloc_slot(self) -> int:
        slot = self._next_slot
        self._next_slot += 1
        if self.first_ip + slot > 254:
            raise HarnessError("out of pod addresses")
        return slot

    def slot_ip(self, slot: int) -> str:
        return f"{self.ip_prefix}{self.first_ip + slot}"

    def _template_labels(self, w: Workload, template: dict, path: str) -> dict:
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        sel = ((w.body["spec"].get("selector") or {}).get("matchLabels")) or {}
        if any(labels.get(k) != v for k, v in sel.items()):
            raise HarnessError(f"{path}: selector {sel} does not match the template labels {labels}")
        return labels

    def _plan(self, w: Workload) -> None:
        spec = w.body["spec"]
        if w.kind == "Deployment":
            self._template_labels(w, spec["template"], f"Deployment/{w.name}")
            for _ in range(int(spec.get("replicas", 1))):
                w.slots.append(self._alloc_slot())
        elif w.kind == "StatefulSet":
            self._template_labels(w, spec["template"], f"StatefulSet/{w.name}")
            policy = spec.get("podManagementPolicy", "OrderedReady")
            if policy not in ("OrderedReady", "Parallel"):
                raise UnsupportedField(f"StatefulSet/{w.name}.spec.podManagementPolicy={policy!r}")
            for _ in range(int(spec.get("replicas", 1))):
                w.slots.append(self._alloc_slot())
        else:  # Volcano Job
            plugins = spec.get("plugins") or {}
            for name, args in plugins.items():
                if args:
                    raise UnsupportedField(f"Job/{w.name}.spec.plugins.{name}={args!r}", "plugin arguments")
            total = 0
            for t in spec["tasks"]:
                for j, p in enumerate(t.get("policies") or []):
                    if (p.get("event"), p.get("action")) != ("TaskCompleted", "CompleteJob"):
                        raise UnsupportedField(f"Job/{w.name}.spec.tasks[{t['name']}].policies[{j}]={p}",
                                               "only TaskCompleted -> CompleteJob is played")
                total += int(t.get("replicas", 1))
                for _ in range(int(t.get("replicas", 1))):
                    w.slots.append(self._alloc_slot())
            if int(spec.get("minAvailable", total)) > total:
                raise HarnessError(f"Job/{w.name}: minAvailable {spec['minAvailable']} > {total} pods: "
                                   "the gang would never be scheduled")
        for p in self._make_pods(w):
            self.pods[p.name] = p
            w.pods.append(p)

    def _make_pods(self, w: Workload, only_slot: Optional[int] = None) -> list[Pod]:
        """The pods of ``w`` (all, or the one of ``only_slot``: a replacement)."""
        spec = w.body["spec"]
        out = []
        if w.kind == "Deployment":
            tpl = spec["template"]
            h = hashlib.sha256(json.dumps(tpl, sort_keys=True).encode()).hexdigest()[:9]
            for slot in w.slots:
                if only_slot is not None and slot != only_slot:
                    continue
                name = f"{w.name}-{h}-{_rand(5)}"
                out.append(Pod(self, name, w, slot, json.loads(json.dumps(tpl["spec"])),
                               dict(tpl["metadata"].get("labels") or {}), hostname=name, subdomain=None))
        elif w.kind == "StatefulSet":
            tpl = spec["template"]
            for i, slot in enumerate(w.slots):
                if only_slot is not None and slot != only_slot:
                    continue
                name = f"{w.name}-{i}"
                pod_spec = json.loads(json.dumps(tpl["spec"]))
                for vct in spec.get("volumeClaimTemplates") or []:
                    claim = f"{vct['metadata']['name']}-{name}"
                    self.claims.setdefault(claim, self.workdir / "claims" / claim)
                    pod_spec.setdefault("volumes", []).append(
                        {"name": vct["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
                out.append(Pod(self, name, w, slot, pod_spec, dict(tpl["metadata"].get("labels") or {}),
                               hostname=name, subdomain=spec["serviceName"], index=i))
        else:
            plugins = spec.get("plugins") or {}
            tasks = spec["tasks"]
            hosts = {t["name"]: [f"{w.name}-{t['name']}-{i}.{w.name}" for i in range(int(t.get("replicas", 1)))]
                     for t in tasks}
            svc_cm = f"{w.name}-svc"
            if "svc" in plugins:
                data = {}
                for t in tasks:
                    key = t["name"].replace("-", "_")
                    data[f"{key}.host"] = "\n".join(hosts[t["name"]])
                    data[f"VC_{key.upper()}_HOSTS"] = ",".join(hosts[t["name"]])
                    data[f"VC_{key.upper()}_NUM"] = str(len(hosts[t["name"]]))
                self.configmaps[svc_cm] = data
            slots = iter(w.slots)
            for t in tasks:
                for i in range(int(t.get("replicas", 1))):
                    slot = next(slots)
                    if only_slot is not None and slot != only_slot:
                        continue
                    name = f"{w.name}-{t['name']}-{i}"
                    env, vols, mounts = [], [], []
                    if "svc" in plugins:
                        for t2 in tasks:
                            key = t2["name"].replace("-", "_").upper()
                            for var in (f"VC_{key}_HOSTS", f"VC_{key}_NUM"):
                                env.append({"name": var, "valueFrom": {"configMapKeyRef": {"name": svc_cm, "key": var}}})
                        vols.append({"name": svc_cm, "configMap": {"name": svc_cm}})
                        mounts.append({"name": svc_cm, "mountPath": "/etc/volcano"})
                    if "env" in plugins:
                        env += [{"name": "VK_TASK_INDEX", "value": str(i)}, {"name": "VC_TASK_INDEX", "value": str(i)}]
                    labels = {**(t["template"].get("metadata", {}).get("labels") or {}),
                              "volcano.sh/job-name": w.name, "volcano.sh/task-spec": t["name"]}
                    out.append(Pod(self, name, w, slot, json.loads(json.dumps(t["template"]["spec"])), labels,
                                   hostname=name, subdomain=w.name if "svc" in plugins else None,
                                   extra_env=env, extra_volumes=vols, extra_mounts=mounts, index=i))
                    out[-1].task = t["name"]
        return out

    # ------------------------------------------------------------------ DNS, services
    def selected(self, selector: dict) -> list[Pod]:
        return [p for p in self.pods.values() if not p.deleted and all(p.labels.get(k) == v for k, v in selector.items())]

    def _hosts(self) -> dict[str, str]:
        """name -> address, the cluster DNS the containers see."""
        ns, dom = self.namespace, CLUSTER_DOMAIN
        out: dict[str, str] = {}

        def forms(base: str, ip: str) -> None:
            for n in (base, f"{base}.{ns}", f"{base}.{ns}.svc", f"{base}.{ns}.svc.{dom}"):
                out[n] = ip

        for p in self.pods.values():
            if p.subdomain:
                forms(f"{p.hostname}.{p.subdomain}", p.ip)
        for name, svc in self.services.items():
            sel = svc["spec"].get("selector")
            pods = sorted(self.selected(sel), key=lambda p: p.slot) if sel else []
            if pods:
                forms(name, pods[0].ip)
                self._log(f"DNS: Service {name} -> {pods[0].name} ({pods[0].ip})"
                          + (f" (one of {len(pods)} pods)" if len(pods) > 1 else ""))
        for w in self.workloads.values():  # the Volcano svc plugin's headless Service <job>
            if w.kind == "Job" and "svc" in (w.body["spec"].get("plugins") or {}) and w.name not in self.services:
                forms(w.name, self.slot_ip(w.slots[0]))
        return out

    def _service_links(self) -> list[tuple[str, str]]:
        out = []
        for name, svc in sorted(self.services.items()):
            if svc["spec"].get("clusterIP") == "None":
                continue
            pods = sorted(self.selected(svc["spec"].get("selector") or {}), key=lambda p: p.slot)
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

    def endpoints(self, service: str, propagation_s: float = 0.0) -> list[Pod]:
        """The Service's endpoints as a node's proxy sees them: pods the selector matches
        that are ready and not terminating (every running one with
        ``publishNotReadyAddresses``). ``propagation_s``: a pod being deleted stays listed
        that long after its deletion began if it was ready then (the endpoints controller and
        kube-proxy take about a second to route away from it)."""
        svc = self.services[service]
        now = time.monotonic()
        pods = [p for p in self.pods.values() if all(p.labels.get(k) == v for k, v in
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

    # ------------------------------------------------------------------ docker
    def docker(self, *args: str, timeout: float = 120, check: bool = True, env: Optional[dict] = None,
               ) -> subprocess.CompletedProcess:
        e = dict(self.docker_env, **(env or {}))
        try:
            proc = subprocess.run(["docker", *args], env=e, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"docker {' '.join(args[:3])}... did not answer in {timeout:.0f} s") from exc
        if check and proc.returncode != 0:
            raise HarnessError(f"docker {' '.join(args[:4])}... exited {proc.returncode}: "
                               f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        return proc

    def _log(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        with self.lock:
            self.events.append(line)
            self.log_file.write(line + "\n")
        log.info("%s", msg)

    def _error(self, msg: str) -> None:
        with self.lock:
            self.errors.append(msg)
        self._log("ERROR " + msg)

    def _watch_events(self) -> None:
        self._events_proc = subprocess.Popen(
            ["docker", "events", "--filter", f"label={LABEL}={self.run_id}", "--filter", "type=container",
             "--filter", "event=die", "--format", "{{json .}}"],
            env=self.docker_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

        def reader(proc: subprocess.Popen) -> None:
            for line in proc.stdout:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                cid = ev.get("id") or ev.get("Actor", {}).get("ID")
                code = int(ev.get("Actor", {}).get("Attributes", {}).get("exitCode", -1))
                self._on_exit(cid, code)

        threading.Thread(target=reader, args=(self._events_proc,), daemon=True, name="docker-events").start()

    def _on_exit(self, cid: str, code: int) -> None:
        with self.lock:
            now = time.monotonic()
            self._exits[cid] = (code, now)
            c = self._by_id.get(cid)
        if c is not None and not c.exited.is_set():
            c.exit_code, c.exited_at = code, now
            c.set_ready(False)
            c.exited.set()
            self._log(f"{c.pod.name}/{c.name}: exited {code}")
            self._save_log(c)
            c.pod.cluster._on_container_exit(c)

    def _poll_exit(self, c: ContainerRun) -> None:
        """Fallback to the events stream: ``docker inspect`` the container's state."""
        if c.id is None or c.exited.is_set():
            return
        proc = self.docker("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", c.id, check=False)
        parts = proc.stdout.split()
        if proc.returncode == 0 and parts and parts[0] == "false":
            self._on_exit(c.id, int(parts[1]))

    def _save_log(self, c: ContainerRun) -> None:
        if c.id is None:
            return
        c.log_path.parent.mkdir(parents=True, exist_ok=True)
        proc = self.docker("logs", "--timestamps", c.id, check=False, timeout=60)
        c.log_path.write_text(proc.stdout + (("\n[stderr]\n" + proc.stderr) if proc.stderr else ""))

    def logs(self, pod: str, container: Optional[str] = None) -> str:
        """The container's output so far (stdout and stderr)."""
        p = self.pods[pod]
        c = p.container(container) if container else p.containers[0]
        if c.id is None:
            return ""
        proc = self.docker("logs", c.id, check=False, timeout=60)
        return proc.stdout + proc.stderr

    # ------------------------------------------------------------------ volumes, env
    def _own(self, path: Path, uid: Optional[int], gid: Optional[int], mode: int = 0o2775) -> None:
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, uid if uid is not None else -1, gid if gid is not None else -1)
        os.chmod(path, mode)

    def _identity(self, pod: Pod, c: dict) -> tuple[Optional[int], Optional[int], list[int]]:
        psc, csc = pod.spec.get("securityContext") or {}, c.get("securityContext") or {}
        uid = csc.get("runAsUser", psc.get("runAsUser"))
        gid = csc.get("runAsGroup", psc.get("runAsGroup"))
        groups = ([psc["fsGroup"]] if psc.get("fsGroup") is not None else []) + list(psc.get("supplementalGroups") or [])
        return uid, gid, groups

    def _volumes(self, pod: Pod) -> dict[str, tuple[Path, bool]]:
        """volume name -> (host path, read-only)."""
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
                self._own(d, uid, fsgroup)
                out[name] = (d, False)
            elif "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                if claim not in self.claims:
                    raise HarnessError(f"{path}: claim {claim!r} is not among the rendered claims")
                d = self.claims[claim]
                if not d.exists():
                    self._own(d, uid, fsgroup)
                else:
                    os.chown(d, -1, fsgroup if fsgroup is not None else -1)
                out[name] = (d, bool(v["persistentVolumeClaim"].get("readOnly")))
            elif "configMap" in v or "secret" in v:
                src = v.get("configMap") or v.get("secret")
                ref = src.get("name") or src.get("secretName")
                store = self.configmaps if "configMap" in v else self.secrets
                if ref not in store:
                    if src.get("optional"):
                        store_data = {}
                    else:
                        raise HarnessError(f"{path}: {'ConfigMap' if 'configMap' in v else 'Secret'} {ref!r} not rendered")
                else:
                    store_data = store[ref]
                d = pod.dir / "volumes" / name
                d.mkdir(parents=True, exist_ok=True)
                mode = src.get("defaultMode", 0o644)
                items = src.get("items") or [{"key": k, "path": k} for k in store_data]
                for it in items:
                    f = d / it["path"]
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text(store_data[it["key"]])
                    os.chmod(f, it.get("mode", mode))
                    if fsgroup is not None:
                        os.chown(f, 0, fsgroup)
                os.chmod(d, 0o755)
                out[name] = (d, True)
            else:
                raise UnsupportedField(f"{path}", "a volume type the harness cannot play")
        return out

    def _env(self, pod: Pod, c: dict, cpath: str) -> tuple[list[tuple[str, str]], set[str]]:
        """The container's environment in Kubernetes' order (service links, envFrom, env,
        plugin env), resolved; returns (pairs, names that came from Secrets)."""
        env: dict[str, str] = {}
        secret_names: set[str] = set()
        if pod.spec.get("enableServiceLinks", True):
            env.update(self._service_links())
        for i, ef in enumerate(c.get("envFrom") or []):
            prefix = ef.get("prefix", "")
            if "configMapRef" in ef:
                ref = ef["configMapRef"]
                data = self.configmaps.get(ref["name"])
            else:
                ref = ef["secretRef"]
                data = self.secrets.get(ref["name"])
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
                values = {"status.podIP": pod.ip, "metadata.name": pod.name, "metadata.namespace": self.namespace}
                if fp not in values:
                    raise UnsupportedField(f"{cpath}.env[{i}].valueFrom.fieldRef.fieldPath={fp!r}")
                env[name] = values[fp]
            else:
                is_secret = "secretKeyRef" in vf
                ref = vf["secretKeyRef"] if is_secret else vf["configMapKeyRef"]
                store = self.secrets if is_secret else self.configmaps
                data = store.get(ref["name"])
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise HarnessError(f"{cpath}.env[{i}] ({name}): {ref['name']}/{ref['key']} not rendered")
                env[name] = data[ref["key"]]
                if is_secret:
                    secret_names.add(name)
        return list(env.items()), secret_names

    def _port(self, c: dict, port: Any, where: str) -> int:
        if isinstance(port, int):
            return port
        if isinstance(port, str) and port.isdigit():
            return int(port)
        for p in c.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise HarnessError(f"{where}: no container port named {port!r}")

    # ------------------------------------------------------------------ starting containers
    def _docker_run_args(self, pod: Pod, cr: ContainerRun, vols: dict, hosts: dict) -> tuple[list[str], dict]:
        c = cr.spec
        kind = "initContainers" if cr.init else "containers"
        cpath = f"{pod.name}.spec.{kind}[{cr.name}]"
        psc, csc = pod.spec.get("securityContext") or {}, c.get("securityContext") or {}
        args = ["run", "-d", "--name", cr.docker_name, "--label", f"{LABEL}={self.run_id}",
                "--label", f"{LABEL}.pod={pod.name}", "--label", f"{LABEL}.container={cr.name}",
                "--network", "host", "--hostname", pod.hostname]
        own = [pod.hostname]
        if pod.subdomain:
            own.insert(0, f"{pod.hostname}.{pod.subdomain}.{self.namespace}.svc.{CLUSTER_DOMAIN}")
        table = {**hosts, **{n: pod.ip for n in own}}
        for name, ip in sorted(table.items()):
            args += ["--add-host", f"{name}:{ip}"]
        uid, gid, groups = self._identity(pod, c)
        if csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            effective = uid
            if effective is None:
                user = self.docker("image", "inspect", "--format", "{{.Config.User}}", c["image"]).stdout.strip()
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
        pairs, secret_names = self._env(pod, c, cpath)
        client_env: dict[str, str] = {}
        final: dict[str, str] = {}
        for name, value in pairs:
            new = rewrite_value(value, pod.ip)
            if new != value:
                self._rewrite(pod, cr, f"env {name}", value, new)
            final[name] = new
        for name, value in final.items():
            if name in secret_names:
                client_env[name] = value
                args += ["-e", name]
            else:
                args += ["-e", f"{name}={value}"]
        command = [expand(str(x), final) for x in (c.get("command") or [])]
        for i, x in enumerate(command):
            if rewrite_value(x, pod.ip) != x:
                raise UnsupportedField(f"{cpath}.command[{i}]={x!r}",
                                       "holds 0.0.0.0/127.0.0.1/localhost, which the harness rewrites only in args "
                                       "and env")
        cargs = []
        for i, x in enumerate(c.get("args") or []):
            x = expand(str(x), final)
            new = rewrite_value(x, pod.ip)
            if new != x:
                self._rewrite(pod, cr, f"args[{i}]", x, new)
            cargs.append(new)
        image = self.image_map.get(c["image"], c["image"])
        if image != c["image"]:
            self._log(f"{pod.name}/{cr.name}: image {c['image']} SUBSTITUTED by {image}")
        if command:
            args += ["--entrypoint", command[0], image, *command[1:], *cargs]
        else:
            args += [image, *cargs]
        return args, client_env

    def _rewrite(self, pod: Pod, cr: ContainerRun, fld: str, before: str, after: str) -> None:
        rw = Rewrite(pod.name, cr.name, fld, before, after)
        with self.lock:
            self.rewrites.append(rw)
        self._log(f"rewrite {rw}")

    def _start_container(self, pod: Pod, cr: ContainerRun, vols: dict, hosts: dict) -> None:
        args, client_env = self._docker_run_args(pod, cr, vols, hosts)
        proc = self.docker(*args, env=client_env, timeout=120)
        cid = proc.stdout.strip().splitlines()[-1]
        with self.lock:
            cr.id, cr.started_at = cid, time.monotonic()
            self._by_id[cid] = cr
            self.all_containers.append(cr)
            early = self._exits.get(cid)
        self._log(f"{pod.name}/{cr.name}: started {cr.docker_name} ({cid[:12]}) on {pod.ip}")
        if early:
            self._on_exit(cid, early[0])

    def _run_pod(self, pod: Pod, gang: Optional[threading.Barrier] = None) -> None:
        try:
            pod.dir.mkdir(parents=True, exist_ok=True)
            vols = self._volumes(pod)
            hosts = self._hosts_cache
            if gang is not None:
                gang.wait(timeout=600)
            for cr in pod.init_containers:
                if pod.terminating:
                    return
                self._start_container(pod, cr, vols, hosts)
                self._wait_exit(cr, timeout=None)
                if cr.exit_code != 0:
                    pod.phase = "Failed"
                    pod.error = f"init container {cr.name} exited {cr.exit_code}"
                    self._error(f"{pod.name}: {pod.error}; log tail:\n{_tail(cr.log_path)}")
                    return
            if pod.terminating:
                return
            for cr in pod.containers:
                self._start_container(pod, cr, vols, hosts)
            pod.phase = "Running"
            for cr in pod.containers:
                hook = ((cr.spec.get("lifecycle") or {}).get("postStart"))
                if hook:
                    self._run_handler(pod, cr, hook, 60, "postStart")
                self._start_probers(pod, cr)
        except Exception as exc:  # noqa: BLE001 - recorded: the test reads Cluster.errors
            pod.phase = "Failed"
            pod.error = f"{type(exc).__name__}: {exc}"
            self._error(f"{pod.name}: could not start: {pod.error}")

    def _wait_exit(self, cr: ContainerRun, timeout: Optional[float]) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not cr.exited.is_set():
            if self._stopping.is_set() and cr.id is None:
                return False
            step = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
            if cr.exited.wait(step):
                break
            self._poll_exit(cr)
            if deadline is not None and time.monotonic() >= deadline:
                return cr.exited.is_set()
        return True

    def _on_container_exit(self, cr: ContainerRun) -> None:
        pod = cr.pod
        if cr.init or pod.terminating or self._stopping.is_set():
            return
        policy = pod.spec.get("restartPolicy", "Always")
        if policy == "Always" or (policy == "OnFailure" and cr.exit_code != 0):
            self._error(f"{pod.name}/{cr.name} exited {cr.exit_code} on its own (restartPolicy {policy}: the kubelet "
                        f"would restart it; not played); log tail:\n{_tail(cr.log_path)}")
        if all(c.exited.is_set() for c in pod.containers):
            pod.phase = "Succeeded" if all(c.exit_code == 0 for c in pod.containers) else "Failed"
            self._log(f"{pod.name}: {pod.phase}")
            if pod.phase == "Failed":
                self._error(f"{pod.name}: Failed ({', '.join(f'{c.name} exit {c.exit_code}' for c in pod.containers)}); "
                            f"log tail:\n{_tail(pod.containers[0].log_path)}")

    # ------------------------------------------------------------------ probes and hooks
    def _probe_once(self, pod: Pod, cr: ContainerRun, probe: dict, timeout: float) -> tuple[bool, str]:
        where = f"{pod.name}/{cr.name} probe"
        try:
            if "httpGet" in probe:
                g = probe["httpGet"]
                if g.get("scheme", "HTTP") != "HTTP":
                    raise UnsupportedField(f"{where}.httpGet.scheme={g['scheme']!r}")
                host = g.get("host") or pod.ip
                conn = http.client.HTTPConnection(host, self._port(cr.spec, g["port"], where), timeout=timeout)
                try:
                    headers = {h["name"]: h["value"] for h in g.get("httpHeaders") or []}
                    headers.setdefault("User-Agent", "kube-probe/1.31")
                    conn.request("GET", g.get("path", "/"), headers=headers)
                    r = conn.getresponse()
                    r.read()
                    return 200 <= r.status < 400, f"HTTP {r.status}"
                finally:
                    conn.close()
            if "tcpSocket" in probe:
                t = probe["tcpSocket"]
                with socket.create_connection((t.get("host") or pod.ip, self._port(cr.spec, t["port"], where)),
                                              timeout=timeout):
                    return True, "connected"
            if "grpc" in probe:
                return self._grpc_probe(pod.ip, int(probe["grpc"]["port"]), probe["grpc"].get("service", ""), timeout)
            if "exec" in probe:
                r = self.docker("exec", cr.id, *probe["exec"]["command"], check=False, timeout=timeout + 5)
                return r.returncode == 0, f"exit {r.returncode}"
        except (OSError, http.client.HTTPException) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        raise UnsupportedField(f"{where}", "no handler the harness knows (httpGet, tcpSocket, grpc, exec)")

    @staticmethod
    def _grpc_probe(host: str, port: int, service: str, timeout: float) -> tuple[bool, str]:
        try:
            import grpc
        except ImportError as exc:  # pragma: no cover - grpcio is a test dependency of serving
            raise UnsupportedField("probe.grpc", "grpcio is not installed on the host") from exc
        req = b"" if not service else b"\x0a" + bytes([len(service.encode())]) + service.encode()
        with grpc.insecure_channel(f"{host}:{port}") as ch:
            call = ch.unary_unary("/grpc.health.v1.Health/Check")
            try:
                resp = call(req, timeout=timeout)
            except grpc.RpcError as exc:
                return False, str(exc.code())
        return resp == b"\x08\x01", f"status bytes {resp!r}"  # SERVING = 1

    def _start_probers(self, pod: Pod, cr: ContainerRun) -> None:
        spec = cr.spec
        startup = spec.get("startupProbe")
        if not startup:
            cr.started_ok = True
        if not spec.get("readinessProbe"):
            # no readiness probe: ready once started (and the startup probe passed)
            if cr.started_ok:
                cr.set_ready(True)
        kinds = [k for k in ("startupProbe", "readinessProbe", "livenessProbe") if spec.get(k)]
        for kind in kinds:
            t = threading.Thread(target=self._prober, args=(pod, cr, kind), daemon=True,
                                 name=f"probe-{pod.name}-{cr.name}-{kind}")
            pod.probers.append(t)
            t.start()

    def _prober(self, pod: Pod, cr: ContainerRun, kind: str) -> None:
        try:
            self._probe_loop(pod, cr, kind)
        except Exception as exc:  # noqa: BLE001 - recorded: the test reads Cluster.errors
            self._error(f"{pod.name}/{cr.name} {kind}: {type(exc).__name__}: {exc}")

    def _probe_loop(self, pod: Pod, cr: ContainerRun, kind: str) -> None:
        probe = cr.spec[kind]
        period = float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        fail_n = int(probe.get("failureThreshold", 3))
        ok_n = int(probe.get("successThreshold", 1))
        delay = float(probe.get("initialDelaySeconds", 0))
        if pod.stop_probing.wait(delay):
            return
        oks = fails = 0
        while cr.running and not pod.stop_probing.is_set():
            if kind != "startupProbe" and not cr.started_ok:
                if pod.stop_probing.wait(0.2):
                    return
                continue
            ok, why = self._probe_once(pod, cr, probe, timeout)
            if not cr.running:
                return
            oks, fails = (oks + 1, 0) if ok else (0, fails + 1)
            if kind == "readinessProbe":
                if not cr.ready and oks >= ok_n:
                    cr.set_ready(True)
                elif cr.ready and fails >= fail_n:
                    self._log(f"{pod.name}/{cr.name}: readiness probe failed {fails}x ({why})")
                    cr.set_ready(False)
            elif kind == "livenessProbe":
                if fails >= fail_n and not pod.terminating:
                    self._error(f"{pod.name}/{cr.name}: liveness probe failed {fails}x ({why}): the kubelet would "
                                "restart the container (not played)")
                    fails = 0
            else:  # startupProbe
                if ok:
                    cr.started_ok = True
                    if not cr.spec.get("readinessProbe"):
                        cr.set_ready(True)
                    return
                if fails >= fail_n:
                    self._error(f"{pod.name}/{cr.name}: startup probe failed {fails}x ({why}): the kubelet would "
                                "restart the container (not played)")
                    return
            pod.stop_probing.wait(period)

    def _run_handler(self, pod: Pod, cr: ContainerRun, hook: dict, budget_s: float, what: str) -> None:
        t0 = time.monotonic()
        if "exec" in hook:
            r = self.docker("exec", cr.id, *hook["exec"]["command"], check=False, timeout=max(1.0, budget_s))
            self._log(f"{pod.name}/{cr.name}: {what} exec exited {r.returncode}")
        elif "httpGet" in hook:
            g = hook["httpGet"]
            try:
                conn = http.client.HTTPConnection(g.get("host") or pod.ip, self._port(cr.spec, g["port"], what),
                                                  timeout=max(1.0, budget_s))
                conn.request("GET", g.get("path", "/"))
                r = conn.getresponse()
                r.read()
                self._log(f"{pod.name}/{cr.name}: {what} httpGet -> {r.status}")
            except (OSError, http.client.HTTPException) as exc:
                self._log(f"{pod.name}/{cr.name}: {what} httpGet failed: {exc}")
        elif "sleep" in hook:
            time.sleep(min(float(hook["sleep"]["seconds"]), budget_s))
        self._log(f"{pod.name}/{cr.name}: {what} hook took {time.monotonic() - t0:.2f} s")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Cluster":
        """Creates the claims' directories and starts every workload (all at once, as the
        API server would accept them; Volcano gangs at one barrier)."""
        for w in self.workloads.values():
            for c in (p for pod in w.pods for p in pod.spec.get("initContainers", []) + pod.spec["containers"]):
                image = self.image_map.get(c["image"], c["image"])
                if self.docker("image", "inspect", "--format", "{{.Id}}", image, check=False).returncode != 0:
                    raise HarnessError(f"{w.kind}/{w.name}: image {image} is not in the engine (no registry "
                                       "to pull from: build it first)")
        self._check_addresses_free()
        self._hosts_cache = self._hosts()
        self._watch_events()
        for w in self.workloads.values():
            self._start_workload(w)
        return self

    def _check_addresses_free(self) -> None:
        """Refuses to start if something already listens on a pod address's ports."""
        busy = []
        for p in self.pods.values():
            for c in p.spec["containers"]:
                for port in c.get("ports") or []:
                    with socket.socket() as s:
                        s.settimeout(0.2)
                        if s.connect_ex((p.ip, int(port["containerPort"]))) == 0:
                            busy.append(f"{p.ip}:{port['containerPort']}")
        if busy:
            raise HarnessError(f"addresses in use before the start (another run?): {busy}")

    def _start_workload(self, w: Workload) -> None:
        if w.kind == "Job":
            gang = threading.Barrier(len(w.pods))
            w.phase = "Running"
            for p in w.pods:
                self._spawn(p, gang)
            threading.Thread(target=self._job_controller, args=(w,), daemon=True, name=f"job-{w.name}").start()
        elif w.kind == "StatefulSet" and w.body["spec"].get("podManagementPolicy", "OrderedReady") == "OrderedReady":
            def ordered() -> None:
                for p in w.pods:
                    self._spawn(p)
                    while not p.ready and not self._stopping.is_set() and p.phase != "Failed":
                        time.sleep(0.2)
            threading.Thread(target=ordered, daemon=True).start()
        else:
            for p in w.pods:
                self._spawn(p)

    def _spawn(self, pod: Pod, gang: Optional[threading.Barrier] = None) -> None:
        self._log(f"{pod.name}: created ({pod.owner.kind}/{pod.owner.name}, {pod.ip})")
        pod.thread = threading.Thread(target=self._run_pod, args=(pod, gang), daemon=True, name=f"pod-{pod.name}")
        pod.thread.start()

    def _job_controller(self, w: Workload) -> None:
        completing = {t["name"] for t in w.body["spec"]["tasks"]
                      if any(p.get("action") == "CompleteJob" for p in t.get("policies") or [])}
        while not self._stopping.is_set():
            pods = [p for p in w.pods if not p.deleted]
            if any(p.phase == "Failed" for p in pods):
                w.phase = "Failed"
                bad = [p.name for p in pods if p.phase == "Failed"]
                self._error(f"Job/{w.name}: Failed (pods {bad}; PodFailed -> RestartJob is not played)")
                for p in pods:
                    if p.phase in ("Running", "Pending") and not p.terminating:
                        w.completion.append(self.delete_pod(p.name, replace=False, reason="job failed"))
                return
            done_tasks = {t for t in completing
                          if all(p.phase == "Succeeded" for p in pods if getattr(p, "task", None) == t)}
            if done_tasks or all(p.phase == "Succeeded" for p in pods):
                why = f"TaskCompleted({','.join(sorted(done_tasks))}) -> CompleteJob" if done_tasks else "all succeeded"
                self._log(f"Job/{w.name}: {why}")
                w.phase = "Completing"
                for p in pods:
                    if p.phase in ("Running", "Pending") and not p.terminating:
                        w.completion.append(self.delete_pod(p.name, replace=False, reason="CompleteJob"))
                w.phase = "Completed"
                return
            time.sleep(0.5)

    def delete_pod(self, name: str, *, replace: bool = True, grace_s: Optional[float] = None,
                   watch_readiness_s: Optional[float] = None, reason: str = "delete") -> Termination:
        """Deletes a pod the Kubernetes way and waits until it is gone (module docstring).
        ``watch_readiness_s``: also probe each container's readiness endpoint at this
        interval during the termination, recording when it first fails. With ``replace``
        the owning Deployment/StatefulSet creates its replacement (``Termination.replacement``)."""
        pod = self.pods[name]
        grace = pod.grace_s if grace_s is None else grace_s
        term = Termination(name, reason, grace)
        t0 = time.monotonic()
        pod.ready_when_deleted = pod.ready
        pod.terminating_since = t0
        pod.terminating = True
        self._log(f"{name}: deleting ({reason}, grace {grace:.0f} s)")
        running = [c for c in pod.containers if c.running]
        first_fail: dict[str, float] = {}
        watchers = []
        if watch_readiness_s:
            for c in running:
                probe = c.spec.get("readinessProbe")
                if not probe:
                    continue

                def watch(c=c, probe=probe) -> None:
                    while c.running and c.name not in first_fail:
                        ok, _ = self._probe_once(pod, c, probe, 1.0)
                        if not ok and c.running:
                            first_fail[c.name] = time.monotonic() - t0
                            return
                        time.sleep(watch_readiness_s)
                watchers.append(threading.Thread(target=watch, daemon=True))
        for t in watchers:
            t.start()

        def stop(c: ContainerRun) -> None:
            hook = (c.spec.get("lifecycle") or {}).get("preStop")
            if hook:
                self._run_handler(pod, c, hook, grace - (time.monotonic() - t0), "preStop")
            if c.running:
                self.docker("kill", "--signal", "TERM", c.id, check=False)
                self._log(f"{name}/{c.name}: SIGTERM")

        threads = [threading.Thread(target=stop, args=(c,), daemon=True) for c in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=grace + 5)
        sigkilled = set()
        for c in running:
            left = grace - (time.monotonic() - t0)
            if not self._wait_exit(c, timeout=max(0.0, left)):
                self._log(f"{name}/{c.name}: still running {grace:.0f} s after the deletion: SIGKILL")
                self.docker("kill", "--signal", "KILL", c.id, check=False)
                sigkilled.add(c.name)
                self._wait_exit(c, timeout=30)
        for t in watchers:
            t.join(timeout=2)
        for c in pod.containers:
            if c not in running and c.id is None:
                continue
            kub = next((ts - t0 for ts, r in c.ready_history if not r and ts >= t0), None)
            term.containers.append(ContainerExit(
                c.name, c.exit_code, (c.exited_at - t0) if (c in running and c.exited_at) else None,
                c.name in sigkilled, first_fail.get(c.name), kub))
        self._finish_delete(pod)
        self._log(f"terminated: {term.summary()}")
        with self.lock:
            self.terminations.append(term)
        if replace and pod.owner.kind in ("Deployment", "StatefulSet"):
            term.replacement = self._replace(pod).name
        return term

    def kill_pod(self, name: str, *, replace: bool = True) -> Termination:
        """A crash: SIGKILL to every container at once (no grace, no hook), then the
        controller's replacement (StatefulSet: same name and claims, fresh emptyDirs)."""
        pod = self.pods[name]
        term = Termination(name, "kill", 0.0)
        t0 = time.monotonic()
        pod.ready_when_deleted = pod.ready
        pod.terminating_since = t0
        pod.terminating = True
        running = [c for c in pod.containers if c.running]
        for c in running:
            self.docker("kill", "--signal", "KILL", c.id, check=False)
        for c in running:
            self._wait_exit(c, timeout=30)
            term.containers.append(ContainerExit(c.name, c.exit_code, (c.exited_at or t0) - t0, True))
        self._finish_delete(pod)
        self._log(f"killed: {term.summary()}")
        with self.lock:
            self.terminations.append(term)
        if replace and pod.owner.kind in ("Deployment", "StatefulSet"):
            term.replacement = self._replace(pod).name
        return term

    def _finish_delete(self, pod: Pod) -> None:
        pod.stop_probing.set()
        pod.deleted = True
        if pod.phase in ("Running", "Pending"):
            pod.phase = "Succeeded" if all(c.exit_code == 0 for c in pod.containers if c.id) else "Failed"
        for c in pod.init_containers + pod.containers:
            if c.id and c.exited.is_set() and not c.log_path.exists():
                self._save_log(c)
        # the kubelet removes a deleted pod's emptyDirs (claims stay)
        vols = pod.dir / "volumes"
        for v in pod.spec.get("volumes", []):
            if "emptyDir" in v:
                shutil.rmtree(vols / v["name"], ignore_errors=True)

    def _replace(self, old: Pod) -> Pod:
        w = old.owner
        new = self._make_pods(w, only_slot=old.slot)[0]
        with self.lock:
            w.pods.append(new)
            if old.name == new.name:
                self.pods[f"{old.name}@{old.uid[:8]}"] = old  # keep the deleted one under another key
            self.pods[new.name] = new
        self._log(f"{w.kind}/{w.name}: replacing {old.name} with {new.name}")
        self._spawn(new)
        return new

    def shutdown(self, *, watch_readiness_s: Optional[float] = None) -> list[Termination]:
        """Deletes every running pod the Kubernetes way, all at once (no replacements)."""
        live = [p for k, p in self.pods.items() if "@" not in k and not p.deleted and not p.terminating
                and any(c.running for c in p.containers)]
        out: list[Termination] = []
        threads = []
        lock = threading.Lock()

        def one(p: Pod) -> None:
            t = self.delete_pod(p.name, replace=False, reason="shutdown", watch_readiness_s=watch_readiness_s)
            with lock:
                out.append(t)
        for p in live:
            threads.append(threading.Thread(target=one, args=(p,), daemon=True))
            threads[-1].start()
        for t in threads:
            t.join(timeout=max(p.grace_s for p in live) + 60 if live else 1)
        return sorted(out, key=lambda t: t.pod)

    def cleanup(self) -> None:
        """Removes every container this run created (by id, then a sweep by this run's
        label) after saving its log, and ends the events watcher."""
        self._stopping.set()
        for p in list(self.pods.values()):
            p.stop_probing.set()
        for c in list(self.all_containers):
            if c.id is None:
                continue
            if not c.log_path.exists() or c.running:
                self._save_log(c)
            self.docker("rm", "-f", c.id, check=False, timeout=60)
        left = self.docker("ps", "-aq", "--filter", f"label={LABEL}={self.run_id}", check=False).stdout.split()
        for cid in left:
            self.docker("rm", "-f", cid, check=False, timeout=60)
        if self._events_proc is not None and self._events_proc.poll() is None:
            self._events_proc.terminate()
            try:
                self._events_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._events_proc.kill()
        self.log_file.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    # ------------------------------------------------------------------ queries
    def live_pods(self, owner: Optional[str] = None) -> list[Pod]:
        return [p for k, p in self.pods.items() if "@" not in k and not p.deleted
                and (owner is None or p.owner.name == owner)]

    def ip(self, pod: str) -> str:
        return self.pods[pod].ip

    def ready(self, pod: str) -> bool:
        return self.pods[pod].ready

    def volume_dir(self, pod: str, volume: str) -> Path:
        p = self.pods[pod]
        for v in p.spec.get("volumes", []):
            if v["name"] == volume:
                if "persistentVolumeClaim" in v:
                    return self.claims[v["persistentVolumeClaim"]["claimName"]]
                return p.dir / "volumes" / volume
        raise KeyError(f"{pod}: no volume {volume}")

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout_s: float, every_s: float = 0.5,
                 fail_on_errors: bool = True) -> Any:
        """Polls ``predicate`` until truthy (returned); raises ``HarnessError`` after
        ``timeout_s`` or at once when a pod failed (``Cluster.errors``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if fail_on_errors and self.errors:
                raise HarnessError(f"waiting for {what}: {len(self.errors)} error(s):\n" + "\n".join(self.errors))
            if time.monotonic() > deadline:
                raise HarnessError(f"{what}: not after {timeout_s:.0f} s; pods: "
                                   + ", ".join(f"{p.name} {p.phase}{' ready' if p.ready else ''}"
                                               for p in self.live_pods()))
            time.sleep(every_s)

    def wait_ready(self, names: Iterable[str], timeout_s: float) -> None:
        names = list(names)
        self.wait_for(f"pods ready {names}", lambda: all(self.pods[n].ready for n in names), timeout_s)

    def status(self) -> str:
        rows = []
        for p in sorted(self.live_pods(), key=lambda p: p.slot):
            cs = ", ".join(f"{c.name}:{'ready' if c.ready else ('exit ' + str(c.exit_code) if c.exited.is_set() else 'not-ready')}"
                           for c in p.containers)
            rows.append(f"{p.name:42s} {p.ip:15s} {p.phase:10s} {cs}")
        return "\n".join(rows)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
