"""CubeTransfer: watches the donefile and rolls each new version out to every cube instance.

A single-replica Deployment (``Recreate``: never two transfers driving the agents), a
Service on 8910 (``/dict/info``, ``/instance/status``, ``/dict/deploy/history``,
``/healthz``, ``/metrics``) and a PersistentVolumeClaim for its state, so a restarted pod
neither loses nor repeats a rollout. It mounts the topology ConfigMap; the pod template
carries the topology's checksum, so a resized cube rolls the transfer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext

PORT = 8910
NAME = "cube-transfer"
STATE_DIR = "/var/lib/cube-transfer"


@dataclass(frozen=True)
class CubeTransferArgs:
    """Inputs of :class:`CubeTransfer`.

    Attributes:
        deployment: namespace, instance, pull secrets.
        image: cube image reference.
        topology_configmap: name of the ConfigMap holding ``topology.json``.
        topology_checksum: sha256 of that file (pod-template annotation).
        root: ROOT of versions and donefiles (the file server's URL).
        upload_token_secret / upload_token_key: Secret with the token for publishing tars.
        cpu / memory: requests = limits. state_size: PVC size.
        storage_class: StorageClass name; ``None`` = cluster default.
        poll_interval_s: seconds between donefile polls.
    """

    deployment: DeployContext
    image: pulumi.Input[str]
    topology_configmap: pulumi.Input[str]
    topology_checksum: str
    root: str
    upload_token_secret: pulumi.Input[str]
    upload_token_key: str
    cpu: str
    memory: str
    state_size: str
    storage_class: Optional[str] = None
    poll_interval_s: int = 10


class CubeTransfer(pulumi.ComponentResource):
    """Outputs: ``url`` (in-cluster base URL), ``status_url`` (``/dict/info``)."""

    def __init__(self, name: str, args: CubeTransferArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:CubeTransfer", name, None, opts)
        dep = args.deployment
        lbls = common.labels(dep, NAME, "cube")
        sel = common.selector(lbls)

        pvc = k8s.core.v1.PersistentVolumeClaim(
            NAME,
            metadata=common.metadata(dep, NAME, lbls),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=["ReadWriteOnce"],
                storage_class_name=args.storage_class or None,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(
                    requests={"storage": args.state_size}),
            ),
            opts=dep.child_opts(self),
        )
        topo_vol, topo_mount = common.topology_volume(args.topology_configmap)
        tmp_vol, tmp_mount = common.tmp_volume()
        container = k8s.core.v1.ContainerArgs(
            name=NAME,
            image=args.image,
            image_pull_policy=dep.image_pull_policy,
            args=["cube", "transfer", "--topology", common.TOPOLOGY_FILE, "--root", args.root,
                  "--work-dir", STATE_DIR, "--host", "0.0.0.0", "--port", str(PORT),
                  "--poll-interval", str(args.poll_interval_s)],
            ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=PORT)],
            env=[*common.base_env(),
                 common.token_env(args.upload_token_secret, args.upload_token_key)],
            resources=common.resources(args.cpu, args.memory),
            readiness_probe=common.http_probe("/healthz", "http", period_s=5),
            liveness_probe=common.http_probe("/healthz", "http", failures=6),
            security_context=common.container_security(),
            volume_mounts=[k8s.core.v1.VolumeMountArgs(name="state", mount_path=STATE_DIR),
                           topo_mount, tmp_mount],
        )
        k8s.apps.v1.Deployment(
            NAME,
            metadata=common.metadata(dep, NAME, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=sel),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        labels=lbls,
                        annotations={"elastic-ctr.io/topology-sha256": args.topology_checksum}),
                    spec=k8s.core.v1.PodSpecArgs(
                        security_context=common.pod_security(),
                        image_pull_secrets=dep.pull_secrets() or None,
                        containers=[container],
                        volumes=[
                            k8s.core.v1.VolumeArgs(
                                name="state",
                                persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                                    claim_name=pvc.metadata.apply(lambda m: m.name))),
                            topo_vol, tmp_vol,
                        ],
                    ),
                ),
            ),
            opts=dep.child_opts(self),
        )
        k8s.core.v1.Service(
            NAME,
            metadata=common.metadata(dep, NAME, lbls),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=sel,
                ports=[k8s.core.v1.ServicePortArgs(name="http", port=PORT, target_port="http")],
            ),
            opts=dep.child_opts(self),
        )
        self.url = f"http://{dep.svc_host(NAME)}:{PORT}"
        self.status_url = f"{self.url}/dict/info"
        self.register_outputs({"url": self.url, "status_url": self.status_url})
