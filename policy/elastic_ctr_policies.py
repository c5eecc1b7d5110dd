"""The policies of the elastic-ctr policy pack (``pulumi preview --policy-pack policy``;
``__main__.py`` registers them, mandatory): what a platform team's review asks of every
Kubernetes object the program declares.

Each policy's ``validate`` reads a resource's ``props`` (the Kubernetes provider's inputs:
the manifest's fields, camelCase) and reports one violation per problem, naming the
resource (``Kind/name``), what is wrong and the fix. A value unknown during a preview
(e.g. the digest of an image not yet pushed) stops that policy for that resource with the
SDK's "can't run policy" note (its proxy raises ``UnknownValueError``); ``pulumi up``
checks it again with the value known.

Pod specs are found in every workload kind the stack uses: Deployment, StatefulSet,
DaemonSet, ReplicaSet, Job and CronJob (batch), Pod, and the Volcano Job's
``spec.tasks[].template``.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterator, Mapping, Optional

from pulumi_policy import (EnforcementLevel, PolicyConfigSchema, ResourceValidationArgs, ResourceValidationPolicy,
                           StackValidationArgs, StackValidationPolicy)

Report = Callable[..., None]
#: containers whose root file system stays writable (Paddle writes under its working directory)
WRITABLE_ROOT = ("pserver", "trainer")
#: environment variable names that hold a secret: only through a Secret reference
SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|ACCESS_KEY|API_KEY|PRIVATE_KEY)", re.I)
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def _kind(resource_type: str) -> str:
    """``kubernetes:apps/v1:Deployment`` -> ``Deployment``."""
    return resource_type.rsplit(":", 1)[-1]


def _where(resource_type: str, props: Mapping[str, Any], name: str = "") -> str:
    """``Kind/metadata.name`` of a resource (its Pulumi name when the manifest has none)."""
    meta = props.get("metadata") or {}
    return f"{_kind(resource_type)}/{meta.get('name') or name}"


def pod_specs(resource_type: str, props: Mapping[str, Any]) -> Iterator[tuple[str, dict, dict]]:
    """``(path, pod template metadata, pod spec)`` of every pod a resource declares."""
    if not resource_type.startswith("kubernetes:"):
        return
    kind, spec = _kind(resource_type), props.get("spec") or {}
    if resource_type == "kubernetes:core/v1:Pod":
        yield "spec", props.get("metadata") or {}, spec
    elif resource_type == "kubernetes:batch.volcano.sh/v1alpha1:Job":
        for i, task in enumerate(spec.get("tasks") or []):
            t = task.get("template") or {}
            yield f"spec.tasks[{i}].template.spec", t.get("metadata") or {}, t.get("spec") or {}
    elif kind == "CronJob":
        t = ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}
        yield "spec.jobTemplate.spec.template.spec", t.get("metadata") or {}, t.get("spec") or {}
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job") and "template" in spec:
        t = spec.get("template") or {}
        yield "spec.template.spec", t.get("metadata") or {}, t.get("spec") or {}


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, dict]]:
    for field in ("initContainers", "containers"):
        for c in pod.get(field) or []:
            yield field, c


# ---------------------------------------------------------------- per-resource checks
def _limits(args: ResourceValidationArgs, report: Report) -> None:
    for path, _, pod in pod_specs(args.resource_type, args.props):
        for field, c in _containers(pod):
            limits = ((c.get("resources") or {}).get("limits")) or {}
            missing = [k for k in ("cpu", "memory") if k not in limits]
            if missing:
                report(f"{_where(args.resource_type, args.props, args.name)}: {path}.{field} '{c.get('name')}' has no "
                       f"limits.{'/'.join(missing)}; fix: set resources.requests and resources.limits "
                       "(components.common.resources)")


def _images(args: ResourceValidationArgs) -> Iterator[tuple[str, str, Any]]:
    for path, _, pod in pod_specs(args.resource_type, args.props):
        for field, c in _containers(pod):
            yield f"{path}.{field} '{c.get('name')}'", _where(args.resource_type, args.props, args.name), c.get("image")


def _no_latest(args: ResourceValidationArgs, report: Report) -> None:
    for where, res, image in _images(args):
        if not isinstance(image, str):
            continue  # no image: not this policy's concern
        tail = image.rsplit("/", 1)[-1]
        if "@" not in tail and (":" not in tail or tail.endswith(":latest")):
            report(f"{res}: {where} image {image!r} is :latest or untagged; fix: a fixed tag (imageTag) or a "
                   "digest")


def _by_digest(args: ResourceValidationArgs, report: Report) -> None:
    if not (args.get_config() or {}).get("required", False):
        return
    for where, res, image in _images(args):
        if isinstance(image, str) and not _DIGEST.search(image):
            report(f"{res}: {where} image {image!r} is not pinned by digest; fix: deploy the pushed image's "
                   "repoDigest (components.images, imageRegistry set)")


def _no_automount(args: ResourceValidationArgs, report: Report) -> None:
    res = _where(args.resource_type, args.props, args.name)
    if args.resource_type == "kubernetes:core/v1:ServiceAccount":
        if args.props.get("automountServiceAccountToken") is not False:
            report(f"{res}: automountServiceAccountToken is not false; fix: set it false (components.common."
                   "service_account); a workload that needs the API gets a Role with only the needed verbs")
    for path, _, pod in pod_specs(args.resource_type, args.props):
        if pod.get("automountServiceAccountToken") is not False:
            report(f"{res}: {path}.automountServiceAccountToken is not false; fix: set it false and run the pod "
                   "as its own ServiceAccount (serviceAccountName)")
        if not pod.get("serviceAccountName"):
            report(f"{res}: {path} runs as the namespace's default ServiceAccount; fix: a ServiceAccount of its "
                   "own (components.common.service_account)")


def _non_root(args: ResourceValidationArgs, report: Report) -> None:
    res = _where(args.resource_type, args.props, args.name)
    for path, _, pod in pod_specs(args.resource_type, args.props):
        psc = pod.get("securityContext") or {}
        for field, c in _containers(pod):
            sc = c.get("securityContext") or {}
            non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
            uid = sc.get("runAsUser", psc.get("runAsUser"))
            if non_root is not True or uid == 0:
                report(f"{res}: {path}.{field} '{c.get('name')}' may run as root (runAsNonRoot {non_root}, "
                       f"runAsUser {uid}); fix: runAsNonRoot true and a non-zero runAsUser "
                       "(components.common.pod_security)")
            if sc.get("allowPrivilegeEscalation") is not False or sc.get("privileged"):
                report(f"{res}: {path}.{field} '{c.get('name')}' allows privilege escalation; fix: "
                       "allowPrivilegeEscalation false (components.common.container_security)")


def _read_only_root(args: ResourceValidationArgs, report: Report) -> None:
    writable = (args.get_config() or {}).get("writableRootContainers", list(WRITABLE_ROOT))
    res = _where(args.resource_type, args.props, args.name)
    for path, _, pod in pod_specs(args.resource_type, args.props):
        for field, c in _containers(pod):
            if c.get("name") in writable:
                continue
            if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
                report(f"{res}: {path}.{field} '{c.get('name')}' has a writable root file system; fix: "
                       "readOnlyRootFilesystem true and an emptyDir where it writes (components.common.tmp_volume)")


def _load_balancer(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != "kubernetes:core/v1:Service":
        return
    spec = args.props.get("spec") or {}
    if spec.get("type") == "LoadBalancer" and not spec.get("loadBalancerSourceRanges"):
        report(f"{_where(args.resource_type, args.props, args.name)}: a LoadBalancer open to every address; fix: "
               "spec.loadBalancerSourceRanges (e.g. fileServerSourceRanges), or type ClusterIP")


def _secret_refs(args: ResourceValidationArgs, report: Report) -> None:
    res = _where(args.resource_type, args.props, args.name)
    for path, _, pod in pod_specs(args.resource_type, args.props):
        for field, c in _containers(pod):
            for e in c.get("env") or []:
                if SECRET_NAME.search(e.get("name", "")) and "value" in e:
                    report(f"{res}: {path}.{field} '{c.get('name')}' sets {e['name']} as a literal value; fix: "
                           "valueFrom.secretKeyRef, or a Secret volume (components.credentials)")
                ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
                if SECRET_NAME.search(e.get("name", "")) and ref:
                    report(f"{res}: {path}.{field} '{c.get('name')}' reads {e['name']} from ConfigMap "
                           f"{ref.get('name')}; fix: a Secret (valueFrom.secretKeyRef)")


# ---------------------------------------------------------------- stack check
def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a pod's labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        ok = {"In": lambda: labels.get(key) in values, "NotIn": lambda: labels.get(key) not in values,
              "Exists": lambda: key in labels, "DoesNotExist": lambda: key not in labels}.get(op)
        if ok is None or not ok():
            return False
    return True


def _selected(args: StackValidationArgs, report: Report) -> None:
    policies = [(r.props.get("metadata") or {}, (r.props.get("spec") or {}).get("podSelector") or {})
                for r in args.resources if r.resource_type == "kubernetes:networking.k8s.io/v1:NetworkPolicy"]
    for r in args.resources:
        namespace = (r.props.get("metadata") or {}).get("namespace")
        for path, meta, _ in pod_specs(r.resource_type, r.props):
            labels = meta.get("labels") or {}
            if not any(m.get("namespace") == namespace and _matches(sel, labels) for m, sel in policies):
                report(f"{_where(r.resource_type, r.props, r.name)}: the pods of {path} (labels {labels}) are "
                       "selected by no NetworkPolicy; fix: networkPolicies true (components.network_policies), "
                       "or a policy selecting them")


def _policy(name: str, description: str, validate, schema: Optional[dict] = None) -> ResourceValidationPolicy:
    return ResourceValidationPolicy(
        name=name, description=description, validate=validate, enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema(properties=schema) if schema else None)


POLICIES = [
    _policy("container-limits", "Every container and init container has CPU and memory limits.", _limits),
    _policy("no-latest-tag", "No image is :latest or untagged.", _no_latest),
    _policy("images-by-digest", "With required (the prod stack's policy config), every image is pinned by digest.",
            _by_digest, {"required": {"type": "boolean", "default": False}}),
    _policy("no-token-automount", "No pod mounts a ServiceAccount token; every pod runs as a ServiceAccount of its "
                                  "own.", _no_automount),
    _policy("non-root", "Every container runs as non-root without privilege escalation.", _non_root),
    _policy("read-only-root-fs", "Every container's root file system is read-only, but those listed in "
                                 "writableRootContainers.", _read_only_root,
            {"writableRootContainers": {"type": "array", "items": {"type": "string"},
                                        "default": list(WRITABLE_ROOT)}}),
    _policy("no-open-load-balancer", "No LoadBalancer Service without loadBalancerSourceRanges.", _load_balancer),
    _policy("secrets-by-reference", "Secrets reach containers only through Secret references.", _secret_refs),
    StackValidationPolicy(name="pods-selected-by-network-policy",
                          description="Every pod is selected by a NetworkPolicy of its namespace.",
                          validate=_selected, enforcement_level=EnforcementLevel.MANDATORY),
]
