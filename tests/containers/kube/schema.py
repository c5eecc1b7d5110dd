"""Which rendered fields the harness plays, which it knowingly ignores (and why), and the
check that refuses any other field before a container starts.

``SCHEMA`` maps each kind the harness plays to its known fields: ``PLAY`` (played; the
player checks the value), an ignore tuple (a reason from ``IGNORED``) or a nested schema
(dict = object, ``[x]`` = list of x). Field names are the Kubernetes API's (camelCase).
"""
from __future__ import annotations

from typing import Any

from tests.containers.kube.errors import UnsupportedField

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
    "Pod.spec.serviceAccountName":
        "no API server and no cloud identity: the pod's identity grants nothing here (each workload's own "
        "ServiceAccount is checked offline: tests/infra/test_security.py)",
    "Pod.spec.automountServiceAccountToken":
        "no API server, so no token is ever mounted (the rendered false is checked offline: "
        "tests/infra/test_security.py, the policy pack)",
    "ServiceAccount": "no API server: a ServiceAccount grants nothing here (checked offline: tests/infra/test_security.py)",
    "NetworkPolicy":
        "the containers share one engine network with no policy enforcement; what the policies admit is "
        "checked offline by network-config-analyzer (tests/infra/test_connectivity.py)",
    "Service.spec.loadBalancerSourceRanges": "a LoadBalancer's outside address is not played (Service.spec.type)",
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
    "Deployment.spec.revisionHistoryLimit": "no rollback: old ReplicaSets are not kept (Cluster.apply)",
    "Deployment.spec.minReadySeconds": "a pod counts as available once ready (Cluster.apply)",
    "StatefulSet.spec.persistentVolumeClaimRetentionPolicy": "claims are kept for the whole run",
    "PodDisruptionBudget":
        "limits voluntary evictions through the eviction API; the harness deletes pods directly (as "
        "`kubectl delete pod`), which a PDB does not block; the tests delete one replica at a time anyway",
    "HorizontalPodAutoscaler": "no metrics server: the declared replicas (the HPA minimum) run",
    "ServiceMonitor": "no Prometheus Operator: checked against its CRD offline (tests/infra/test_validate.py)",
    "PodMonitor": "no Prometheus Operator: checked against its CRD offline (tests/infra/test_validate.py)",
    "PrometheusRule": "no Prometheus Operator: its rules run in tests/monitoring (promtool, a live Prometheus)",
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
        "serviceAccountName": ig("Pod.spec.serviceAccountName"),
        "automountServiceAccountToken": ig("Pod.spec.automountServiceAccountToken"),
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
            "loadBalancerSourceRanges": ig("Service.spec.loadBalancerSourceRanges"),
            "ports": [{"name": PLAY, "port": PLAY, "targetPort": PLAY,
                       "protocol": ig("Service.spec.ports.protocol"),
                       "appProtocol": ig("Service.spec.ports.appProtocol")}]}},
        "Deployment": {**head, "spec": {"replicas": PLAY, "selector": selector, "template": template,
                                        "strategy": {"type": PLAY, "rollingUpdate": {"maxSurge": PLAY,
                                                                                      "maxUnavailable": PLAY}},
                                        "revisionHistoryLimit": ig("Deployment.spec.revisionHistoryLimit"),
                                        "minReadySeconds": ig("Deployment.spec.minReadySeconds")}},
        "StatefulSet": {**head, "spec": {
            "serviceName": PLAY, "replicas": PLAY, "podManagementPolicy": PLAY, "selector": selector,
            "template": template,
            "volumeClaimTemplates": [{"metadata": {"name": PLAY, "labels": PLAY}, "spec": pvc_spec}],
            "updateStrategy": {"type": PLAY, "rollingUpdate": {"partition": PLAY}},
            "persistentVolumeClaimRetentionPolicy": ig("StatefulSet.spec.persistentVolumeClaimRetentionPolicy")}},
        "PodDisruptionBudget": ig("PodDisruptionBudget"),
        "HorizontalPodAutoscaler": ig("HorizontalPodAutoscaler"),
        **{kind: ig(kind) for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ServiceAccount",
                                       "NetworkPolicy")},
        "Job": {**head, "spec": {
            "schedulerName": ig("Job.spec.schedulerName"), "queue": ig("Job.spec.queue"),
            "minAvailable": PLAY, "maxRetry": ig("Job.spec.maxRetry"), "policies": ig("Job.spec.policies"),
            "plugins": {"svc": PLAY, "env": PLAY},
            "tasks": [{"name": PLAY, "replicas": PLAY, "minAvailable": PLAY, "template": template,
                       "policies": [{"event": PLAY, "action": PLAY}]}]}},
    }


SCHEMA = _schema()


def validate(body: dict, where: str) -> list[tuple[str, str]]:
    """Checks every field of one manifest (``where`` names it, e.g. ``Job/ctr-train``) against
    ``SCHEMA``. Returns the ignored ``(path, reason)`` pairs; raises
    :class:`UnsupportedField` for an unknown field or kind, or a Job that is not Volcano's."""
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
