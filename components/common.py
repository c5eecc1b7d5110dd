"""Building blocks shared by every component: labels, security contexts, resources, probes,
environment and volumes.

Everything here returns plain ``pulumi_kubernetes`` argument objects, so each component
reads as a direct description of its Kubernetes objects.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from runtime.formats import topology
from runtime.role_specs import CREDENTIALS_DIR, CREDENTIALS_DIR_ENV, TRACKING, Probe, RoleSpec

PART_OF = "elastic-ctr"
#: UID/GID of the non-root ``app`` user the Dockerfiles create.
APP_UID = 10001
#: Mount point of the writable scratch volume every container gets (root FS is read-only).
TMP_DIR = "/tmp"
#: how a role reaches the object store: reading only (cube agents, serving, pservers) or
#: reading and writing (trainer, transfer); picks its keys and its identity's annotations
READ, WRITE = "read", "write"
#: file mode of every credential file a pod mounts (owner read only; the pod's fsGroup reads it too)
CREDENTIAL_MODE = 0o400
#: the files of the ``TRACKING`` Secret a pod mounts: the pipeline's MLflow login only (the Secret's
#: ``server-secret-key``, the MLflow server's own, reaches nothing through a volume;
#: ``components.credentials`` has the Secret's layout)
TRACKING_FILES = ("username", "password")


@dataclass(frozen=True)
class DeployContext:
    """Where and as what the components deploy; shared by all of them.

    Attributes:
        namespace: the Kubernetes namespace (a DNS-1123 label), an Input: pass the
            Namespace resource's ``metadata.name`` so every object depends on it.
        instance: value of ``app.kubernetes.io/instance`` (``<project>-<stack>``).
        image_pull_secrets: names of ``kubernetes.io/dockerconfigjson`` Secrets for pods.
        image_pull_policy: ``IfNotPresent`` | ``Always`` | ``Never``.
        store_env: environment of the containers that write to an object store (endpoint,
            region, the read-write keys through secretKeyRef; ``ObjectStoreAccess.env``).
        store_read_env: the same for the containers that only read (the read-only keys).
        identity: ``READ`` / ``WRITE`` -> annotations of the ServiceAccounts of the pods that
            reach the store that way (workload identity); empty = none.
        credentials: trust boundary (``runtime.role_specs.CREDENTIAL_BOUNDARIES``) -> name of
            the Secret holding its credential (``components.credentials``); a container mounts
            those its spec lists.
        scrape_annotations: put ``prometheus.io/*`` scrape annotations on the pod templates
            (stack key ``monitoring: annotations``; ``scrape_annotations``).
    """

    namespace: pulumi.Input[str]
    instance: str
    image_pull_secrets: Sequence[pulumi.Input[str]] = field(default_factory=tuple)
    image_pull_policy: pulumi.Input[str] = "IfNotPresent"
    store_env: Sequence[k8s.core.v1.EnvVarArgs] = field(default_factory=tuple)
    store_read_env: Sequence[k8s.core.v1.EnvVarArgs] = field(default_factory=tuple)
    identity: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    credentials: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    scrape_annotations: bool = False

    def svc_host(self, service: pulumi.Input[str]) -> pulumi.Output[str]:
        """Cluster DNS name of ``service`` in this namespace (``<svc>.<ns>.svc.cluster.local``)."""
        return pulumi.Output.concat(service, ".", self.namespace, ".svc.cluster.local")

    def svc_url(self, service: pulumi.Input[str], port: int) -> pulumi.Output[str]:
        """``http://<svc>.<ns>.svc.cluster.local:<port>``."""
        return pulumi.Output.concat("http://", self.svc_host(service), ":", str(port))

    def pull_secrets(self) -> list[k8s.core.v1.LocalObjectReferenceArgs]:
        """``imagePullSecrets`` entries for a pod spec."""
        return [k8s.core.v1.LocalObjectReferenceArgs(name=n) for n in self.image_pull_secrets]


def child(parent: pulumi.Resource, **kwargs) -> pulumi.ResourceOptions:
    """Options of a component's child: parented to it (dependencies flow through Inputs)."""
    return pulumi.ResourceOptions(parent=parent, **kwargs)


def labels(dep: DeployContext, name: str, component: str, **extra: str) -> dict[str, str]:
    """The recommended ``app.kubernetes.io/*`` labels (plus ``extra``).

    Args:
        name: the application, e.g. ``cube-server``.
        component: its role in the architecture, e.g. ``cube``, ``training``.
    """
    out = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": dep.instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": "pulumi",
    }
    out.update(extra)
    return out


def selector(all_labels: dict[str, str]) -> dict[str, str]:
    """The immutable subset of ``labels()`` used in selectors (name, instance and extras)."""
    return {
        k: v
        for k, v in all_labels.items()
        if k not in ("app.kubernetes.io/component", "app.kubernetes.io/part-of",
                     "app.kubernetes.io/managed-by")
    }


def metadata(dep: DeployContext, name: pulumi.Input[str], lbls: dict[str, str],
             annotations: Optional[dict[str, str]] = None) -> k8s.meta.v1.ObjectMetaArgs:
    """ObjectMeta with an explicit name (stable DNS) in the deployment's namespace."""
    return k8s.meta.v1.ObjectMetaArgs(
        name=name, namespace=dep.namespace, labels=lbls, annotations=annotations)


def scrape_annotations(dep: DeployContext, spec: RoleSpec) -> dict[str, str]:
    """The ``prometheus.io/scrape``, ``/port`` and ``/path`` pod annotations of role
    ``spec``'s metrics endpoint when ``dep.scrape_annotations`` (a Prometheus configured
    with the common pod-annotation scrape job reads them), else ``{}``; a pod annotates one
    port only (the first of its containers that calls this)."""
    if not dep.scrape_annotations or spec.metrics is None:
        return {}
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.port(spec.metrics.port)),
            "prometheus.io/path": spec.metrics.path}


def resources(cpu: str, memory: str) -> k8s.core.v1.ResourceRequirementsArgs:
    """Requests = limits (Guaranteed QoS): ``cpu`` e.g. ``"500m"``, ``memory`` e.g. ``"1Gi"``."""
    q = {"cpu": cpu, "memory": memory}
    return k8s.core.v1.ResourceRequirementsArgs(requests=dict(q), limits=dict(q))


def pod_security() -> k8s.core.v1.PodSecurityContextArgs:
    """Pod-level: non-root UID/GID 10001, volumes group-writable, RuntimeDefault seccomp."""
    return k8s.core.v1.PodSecurityContextArgs(
        run_as_non_root=True,
        run_as_user=APP_UID,
        run_as_group=APP_UID,
        fs_group=APP_UID,
        seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
    )


def container_security(read_only_root: bool = True) -> k8s.core.v1.SecurityContextArgs:
    """Container-level: no privilege escalation, all capabilities dropped, read-only root FS."""
    return k8s.core.v1.SecurityContextArgs(
        run_as_non_root=True,
        run_as_user=APP_UID,
        allow_privilege_escalation=False,
        read_only_root_filesystem=read_only_root,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
    )


def http_probe(path: str, port: str, period_s: int = 10, failures: int = 3,
               initial_delay_s: int = 0) -> k8s.core.v1.ProbeArgs:
    """An HTTP GET probe on a named container port."""
    return k8s.core.v1.ProbeArgs(
        http_get=k8s.core.v1.HTTPGetActionArgs(path=path, port=port),
        period_seconds=period_s, failure_threshold=failures, timeout_seconds=3,
        initial_delay_seconds=initial_delay_s or None,
    )


def tcp_probe(port: str, period_s: int = 10, failures: int = 3,
              initial_delay_s: int = 0) -> k8s.core.v1.ProbeArgs:
    """A TCP connect probe on a named container port (periods and delays in seconds)."""
    return k8s.core.v1.ProbeArgs(
        tcp_socket=k8s.core.v1.TCPSocketActionArgs(port=port),
        period_seconds=period_s, failure_threshold=failures, timeout_seconds=3,
        initial_delay_seconds=initial_delay_s or None)


def probe(p: Optional[Probe], period_s: int = 10, failures: int = 3,
          initial_delay_s: int = 0) -> Optional[k8s.core.v1.ProbeArgs]:
    """A role spec's probe (``runtime.role_specs.Probe``): HTTP GET of its path on its named
    port, or a TCP connect when it has no path; None for None."""
    if p is None:
        return None
    if p.path is None:
        return tcp_probe(p.port, period_s=period_s, failures=failures, initial_delay_s=initial_delay_s)
    return http_probe(p.path, p.port, period_s=period_s, failures=failures, initial_delay_s=initial_delay_s)


#: how long a role may take to answer its liveness endpoint the first time (s), and how often
#: the startup probe asks meanwhile
STARTUP_S, STARTUP_PERIOD_S = 300, 5


def container(spec: RoleSpec, dep: DeployContext, image: pulumi.Input[str], *, resources_: k8s.core.v1.ResourceRequirementsArgs,
              env: Sequence[k8s.core.v1.EnvVarArgs] = (), volume_mounts: Sequence[k8s.core.v1.VolumeMountArgs] = (),
              read_only_root: bool = True, readiness_period_s: int = 5, liveness_period_s: int = 10,
              liveness_failures: int = 6, liveness_delay_s: int = 0, startup_s: int = STARTUP_S,
              **extra) -> k8s.core.v1.ContainerArgs:
    """The container of role ``spec`` (``runtime.role_specs``): its name, ``args``, named
    ports and probes come from the spec, nothing else; the spec's fixed environment comes
    first, then ``env``. A role with a liveness probe also gets a startup probe on the same
    endpoint (every ``STARTUP_PERIOD_S`` s, up to ``startup_s`` s): liveness counts only once
    the process answered, so a slow start (Paddle's import, a model's load on a busy node)
    is not restarted. Each trust boundary of ``spec.credentials`` is mounted read-only at
    ``CREDENTIALS_DIR/<boundary>`` (``credential_volumes`` declares the pod's volumes) and
    ``ELASTIC_CTR_CREDENTIALS_DIR`` names that directory. ``extra``: more ``ContainerArgs``
    fields (e.g. ``lifecycle``). Raises ``ValueError`` naming the role and the boundary when
    ``dep`` has no Secret for one of ``spec.credentials``."""
    creds = [k8s.core.v1.VolumeMountArgs(name=_credential_volume(b), mount_path=f"{CREDENTIALS_DIR}/{b}",
                                         read_only=True) for b in _credentials(spec, dep)]
    cred_env = [k8s.core.v1.EnvVarArgs(name=CREDENTIALS_DIR_ENV, value=CREDENTIALS_DIR)] if creds else []
    return k8s.core.v1.ContainerArgs(
        name=spec.name,
        image=image,
        image_pull_policy=dep.image_pull_policy,
        args=list(spec.args),
        ports=[k8s.core.v1.ContainerPortArgs(name=n, container_port=p) for n, p in spec.ports] or None,
        env=[*(k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in spec.env), *cred_env, *env],
        resources=resources_,
        readiness_probe=probe(spec.readiness, period_s=readiness_period_s),
        liveness_probe=probe(spec.liveness, period_s=liveness_period_s, failures=liveness_failures,
                             initial_delay_s=liveness_delay_s),
        startup_probe=probe(spec.liveness, period_s=STARTUP_PERIOD_S,
                            failures=max(1, -(-startup_s // STARTUP_PERIOD_S))) if spec.liveness else None,
        security_context=container_security(read_only_root),
        volume_mounts=[*volume_mounts, *creds],
        **extra,
    )


def _credentials(spec: RoleSpec, dep: DeployContext) -> tuple[str, ...]:
    """``spec.credentials``, each checked to have a Secret in ``dep``."""
    missing = [b for b in spec.credentials if b not in dep.credentials]
    if missing:
        raise ValueError(f"{spec.name}: no Secret for the credentials {missing} it needs "
                         f"(the stack has {sorted(dep.credentials)})")
    return tuple(spec.credentials)


def _credential_volume(boundary: str) -> str:
    return f"credentials-{boundary}"


def credential_volumes(dep: DeployContext, *specs: RoleSpec) -> list[k8s.core.v1.VolumeArgs]:
    """The pod's Secret volumes of every trust boundary one of ``specs`` lists (each once, in
    first-listed order), files mode ``CREDENTIAL_MODE`` (of ``TRACKING``'s, ``TRACKING_FILES``
    only). Raises ``ValueError`` as ``container``."""
    seen: list[str] = []
    for spec in specs:
        seen += [b for b in _credentials(spec, dep) if b not in seen]
    return [k8s.core.v1.VolumeArgs(name=_credential_volume(b), secret=k8s.core.v1.SecretVolumeSourceArgs(
        secret_name=dep.credentials[b], default_mode=CREDENTIAL_MODE,
        items=[k8s.core.v1.KeyToPathArgs(key=k, path=k) for k in TRACKING_FILES] if b == TRACKING else None))
        for b in seen]


def service_account(dep: DeployContext, name: str, parent: pulumi.Resource,
                    access: Optional[str] = None) -> pulumi.Output[str]:
    """A ServiceAccount ``name`` of its own for one workload, with no API token mounted
    (``automountServiceAccountToken: false``: nothing here talks to the API server) and,
    for ``access`` ``READ`` / ``WRITE``, the workload identity's annotations of that access
    (``dep.identity``). Returns its name."""
    annotations = dict(dep.identity.get(access, {})) if access else {}
    sa = k8s.core.v1.ServiceAccount(
        name, metadata=metadata(dep, name, labels(dep, name, "identity"), annotations or None),
        automount_service_account_token=False, opts=child(parent))
    return sa.metadata.apply(lambda m: m.name)


def home_env() -> k8s.core.v1.EnvVarArgs:
    """``HOME`` on the writable /tmp (the root FS is read-only)."""
    return k8s.core.v1.EnvVarArgs(name="HOME", value=TMP_DIR)


def base_env(log_level: str = "INFO", dep: Optional[DeployContext] = None,
             access: str = READ) -> list[k8s.core.v1.EnvVarArgs]:
    """Environment every container gets: log level, HOME on the writable /tmp; with ``dep``
    (containers that read or write locations), its object-store variables too: the
    read-only keys for ``access`` ``READ``, the read-write ones for ``WRITE``."""
    store = () if dep is None else (dep.store_env if access == WRITE else dep.store_read_env)
    return [
        k8s.core.v1.EnvVarArgs(name="ELASTIC_CTR_LOG_LEVEL", value=log_level),
        home_env(),
        *store,
    ]


def token_env(secret_name: pulumi.Input[str], key: str) -> k8s.core.v1.EnvVarArgs:
    """``ELASTIC_CTR_UPLOAD_TOKEN`` from a Secret key (never a literal value)."""
    return k8s.core.v1.EnvVarArgs(
        name="ELASTIC_CTR_UPLOAD_TOKEN",
        value_from=k8s.core.v1.EnvVarSourceArgs(
            secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=secret_name, key=key)),
    )


def tmp_volume(size: str = "1Gi") -> tuple[k8s.core.v1.VolumeArgs, k8s.core.v1.VolumeMountArgs]:
    """The writable scratch emptyDir mounted at /tmp (root FS is read-only)."""
    return (
        k8s.core.v1.VolumeArgs(name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit=size)),
        k8s.core.v1.VolumeMountArgs(name="tmp", mount_path=TMP_DIR),
    )


def topology_volume(configmap_name: pulumi.Input[str]) -> tuple[k8s.core.v1.VolumeArgs,
                                                                  k8s.core.v1.VolumeMountArgs]:
    """The cube topology ConfigMap mounted read-only at /etc/elastic-ctr (``topology.json``,
    ``runtime.formats.topology``)."""
    return (
        k8s.core.v1.VolumeArgs(
            name="topology",
            config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=configmap_name)),
        k8s.core.v1.VolumeMountArgs(name="topology", mount_path=TOPOLOGY_DIR, read_only=True),
    )


TOPOLOGY_DIR = "/etc/elastic-ctr"
TOPOLOGY_FILE = f"{TOPOLOGY_DIR}/{topology.FILE}"


def volume_claim(parent: pulumi.Resource, dep: DeployContext, name: str, lbls: dict[str, str], size: pulumi.Input[str],
                 storage_class: Optional[str] = None, access_mode: str = "ReadWriteOnce") -> k8s.core.v1.PersistentVolumeClaim:
    """A PersistentVolumeClaim ``name`` of ``size`` (e.g. ``"10Gi"``), child of ``parent``
    (the cluster's default storage class when ``storage_class`` is empty)."""
    return k8s.core.v1.PersistentVolumeClaim(
        name,
        metadata=metadata(dep, name, lbls),
        spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
            access_modes=[access_mode],
            storage_class_name=storage_class or None,
            resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": size}),
        ),
        opts=child(parent),
    )


def singleton_deployment(dep: DeployContext, name: str, lbls: dict[str, str],
                         container: k8s.core.v1.ContainerArgs, volumes: list[k8s.core.v1.VolumeArgs],
                         parent: pulumi.Resource, service_account: pulumi.Input[str],
                         pod_annotations: Optional[dict[str, pulumi.Input[str]]] = None,
                         depends_on: Sequence[pulumi.Resource] = ()) -> k8s.apps.v1.Deployment:
    """A Deployment of one pod replaced by ``Recreate`` (the old pod is gone before the new
    one starts: its ReadWriteOnce claim or its single-writer state allows one at a time),
    selected by ``selector(lbls)``, running as ``service_account`` (no API token mounted),
    pod security and pull secrets as every role's; the file
    server, the cube transfer and the tracking server run this way. ``depends_on``: resources
    pulumi must have created/updated (and awaited) before this Deployment changes."""
    return k8s.apps.v1.Deployment(
        name,
        metadata=metadata(dep, name, lbls),
        spec=k8s.apps.v1.DeploymentSpecArgs(
            replicas=1,
            strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"),
            selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector(lbls)),
            template=k8s.core.v1.PodTemplateSpecArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(labels=lbls, annotations=pod_annotations),
                spec=k8s.core.v1.PodSpecArgs(
                    security_context=pod_security(),
                    image_pull_secrets=dep.pull_secrets() or None,
                    service_account_name=service_account,
                    automount_service_account_token=False,
                    containers=[container],
                    volumes=volumes,
                ),
            ),
        ),
        opts=child(parent, depends_on=list(depends_on) or None),
    )
