"""FileServer: the HTTP file server holding versions, donefiles and cube shard tars.

Named after the component (``<name>``): a PersistentVolumeClaim (storage class and size from config), a single-replica
Deployment (``Recreate``: the volume is ReadWriteOnce), a Service (``LoadBalancer`` only
when asked to expose it, otherwise ``ClusterIP``) and the Secret holding the upload
bearer token (``<name>-upload-token``), which reaches pods only as
``ELASTIC_CTR_UPLOAD_TOKEN`` via secretKeyRef.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from components.monitoring import scrape_target
from runtime import role_specs

TOKEN_KEY = "token"
ROOT = "/srv/elastic-ctr"


@dataclass(frozen=True)
class FileServerArgs:
    """Inputs of :class:`FileServer`.

    Attributes:
        deployment: namespace, instance, pull secrets.
        image: serving image reference (the file server is a serving-package role).
        upload_token: the bearer token (a secret Output: it stays one).
        cpu / memory: requests = limits.
        storage_size: PVC size (quantity, e.g. ``20Gi``).
        storage_class: StorageClass name; ``None`` = the cluster default.
        expose: ``True`` = Service type LoadBalancer, else ClusterIP (a plain bool: it
            decides whether ``external_url`` waits for an ingress).
        source_ranges: with ``expose``, the CIDRs the LoadBalancer admits
            (``loadBalancerSourceRanges``); required then (``ValueError`` otherwise).
    """

    deployment: DeployContext
    image: pulumi.Input[str]
    upload_token: pulumi.Input[str]
    cpu: pulumi.Input[str]
    memory: pulumi.Input[str]
    storage_size: pulumi.Input[str]
    storage_class: Optional[pulumi.Input[str]] = None
    expose: bool = False
    source_ranges: Sequence[str] = ()


class FileServer(pulumi.ComponentResource):
    """Outputs: ``url`` (in-cluster), ``external_url`` (LoadBalancer ingress, or the in-cluster
    URL when not exposed or not yet assigned), ``token_secret`` / ``token_key``."""

    url: pulumi.Output[str]
    external_url: pulumi.Output[str]
    token_secret: pulumi.Output[str]
    token_key: str

    def __init__(self, name: str, args: FileServerArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:FileServer", name, None, opts)
        dep = args.deployment
        if args.expose and not args.source_ranges:
            raise ValueError(f"{name}: exposed without source ranges (a LoadBalancer open to every address)")
        lbls = common.labels(dep, name, "storage")
        sel = common.selector(lbls)
        secret_name = f"{name}-upload-token"

        self.secret = k8s.core.v1.Secret(
            secret_name,
            metadata=common.metadata(dep, secret_name, lbls),
            type="Opaque",
            string_data={TOKEN_KEY: pulumi.Output.secret(args.upload_token)},
            opts=common.child(self),
        )
        self.token_secret = self.secret.metadata.apply(lambda m: m.name)
        self.token_key = TOKEN_KEY

        pvc = common.volume_claim(self, dep, name, lbls, args.storage_size, args.storage_class)
        tmp_vol, tmp_mount = common.tmp_volume()
        # exposed: reads need the fileserver-read credential too (every reader presents it)
        spec = role_specs.file_server(ROOT, read_auth=args.expose)
        port = spec.port("http")
        container = common.container(
            spec, dep, args.image, env=[*common.base_env(), common.token_env(self.token_secret, TOKEN_KEY)],
            resources_=common.resources(args.cpu, args.memory),
            volume_mounts=[k8s.core.v1.VolumeMountArgs(name="files", mount_path=ROOT), tmp_mount])
        common.singleton_deployment(
            dep, name, lbls, container,
            [k8s.core.v1.VolumeArgs(
                name="files",
                persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                    claim_name=pvc.metadata.apply(lambda m: m.name))),
             tmp_vol, *common.credential_volumes(dep, spec)],
            parent=self, service_account=common.service_account(dep, name, self),
            pod_annotations=common.scrape_annotations(dep, spec) or None)
        #: what Prometheus scrapes (``components.monitoring``)
        self.scrape_targets = [scrape_target(spec, sel)]
        #: the pods' selector and port (``components.network_policies``)
        self.selector, self.port = sel, port
        self.service = k8s.core.v1.Service(
            name,
            metadata=common.metadata(dep, name, lbls),
            spec=k8s.core.v1.ServiceSpecArgs(
                type="LoadBalancer" if args.expose else "ClusterIP",
                load_balancer_source_ranges=list(args.source_ranges) if args.expose else None,
                selector=sel,
                ports=[k8s.core.v1.ServicePortArgs(name="http", port=port, target_port="http")],
            ),
            opts=common.child(self),
        )
        self.url = dep.svc_url(self.service.metadata.apply(lambda m: m.name), port)
        if args.expose:
            self.external_url = pulumi.Output.all(self.service.status, self.url).apply(
                lambda a: _ingress_url(a[0], port) or a[1])
        else:
            self.external_url = self.url
        self.register_outputs({"url": self.url, "external_url": self.external_url,
                               "token_secret": self.token_secret})


def _ingress_url(status, port: int) -> Optional[str]:
    """``http://<ip or hostname>:<port>`` of a LoadBalancer Service's first ingress, or None."""
    lb = getattr(status, "load_balancer", None) if status is not None else None
    ingress = getattr(lb, "ingress", None) or []
    if not ingress:
        return None
    host = ingress[0].ip or ingress[0].hostname
    return f"http://{host}:{port}" if host else None
