"""CubeTransfer: watches the donefile and rolls each new version out to every cube instance.

Named after the component (``<name>``): a single-replica Deployment (``Recreate``: never two transfers driving the agents), a
Service on 8910 (``/dict/info``, ``/instance/status``, ``/dict/deploy/history``,
``/healthz``, ``/metrics``) and a PersistentVolumeClaim for its state, so a restarted pod
neither loses nor repeats a rollout. It mounts the topology ConfigMap; the pod template
carries the topology's checksum, so a resized cube rolls the transfer. Its Deployment
depends on ``wait_for`` (the cube layout's StatefulSets): under ``pulumi up`` a new
layout is created and awaited ready before the transfer moves to it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from components.monitoring import scrape_target
from components.tracking_server import tracking_env
from runtime import role_specs

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
        upload_token_secret / upload_token_key: Secret with the token for publishing tars
            (None: the root is an object store, reached with ``deployment.store_env``).
        cpu / memory: requests = limits. state_size: PVC size.
        storage_class: StorageClass name; ``None`` = cluster default.
        poll_interval_s: seconds between donefile polls.
        gate_args: the model gate's flags (``infra.config_gates.transfer_argv``).
        pin_version: the version to serve instead of following training (``--pin-version``;
            the stack's ``servedVersion``); None: follow training.
        keep_versions: published versions kept under the root (``--keep-versions``; 0 = all).
        tracking_uri / tracking_experiment: ``MLFLOW_TRACKING_URI`` and
            ``MLFLOW_EXPERIMENT_NAME``; tracking_job: the job's name (``ELASTIC_CTR_JOB``: the
            runs' names and parent) of the transfer (each rollout's phases and seconds;
            ``runtime.tracking``); None = no tracking.
        wait_for: resources the Deployment depends on (``depends_on``), e.g.
            ``CubeCluster.statefulsets``: a topology change reaches the transfer only after
            pulumi awaited them.
    """

    deployment: DeployContext
    image: pulumi.Input[str]
    topology_configmap: pulumi.Input[str]
    topology_checksum: pulumi.Input[str]
    root: pulumi.Input[str]
    upload_token_secret: Optional[pulumi.Input[str]]
    upload_token_key: pulumi.Input[str]
    cpu: pulumi.Input[str]
    memory: pulumi.Input[str]
    state_size: pulumi.Input[str]
    storage_class: Optional[pulumi.Input[str]] = None
    poll_interval_s: int = 10
    pin_version: Optional[int] = None
    keep_versions: int = 0
    tracking_uri: Optional[pulumi.Input[str]] = None
    tracking_experiment: str = "elastic-ctr"
    tracking_job: Optional[str] = None
    gate_args: Sequence[str] = ()
    wait_for: Sequence[pulumi.Resource] = ()


class CubeTransfer(pulumi.ComponentResource):
    """Outputs: ``url`` (in-cluster base URL), ``status_url`` (``/dict/info``). Attribute
    ``deployment``: its Deployment (what serving waits for)."""

    url: pulumi.Output[str]
    status_url: pulumi.Output[str]

    def __init__(self, name: str, args: CubeTransferArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:CubeTransfer", name, None, opts)
        dep = args.deployment
        lbls = common.labels(dep, name, "cube")
        sel = common.selector(lbls)

        pvc = common.volume_claim(self, dep, name, lbls, args.state_size, args.storage_class)
        topo_vol, topo_mount = common.topology_volume(args.topology_configmap)
        tmp_vol, tmp_mount = common.tmp_volume()
        spec = role_specs.cube_transfer(common.TOPOLOGY_FILE, args.root, STATE_DIR,
                                        poll_interval_s=args.poll_interval_s, pin_version=args.pin_version,
                                        keep_versions=args.keep_versions, extra=tuple(args.gate_args))
        container = common.container(
            spec, dep, args.image,
            env=[*common.base_env(dep=dep, access=common.WRITE),
                 *([common.token_env(args.upload_token_secret, args.upload_token_key)]
                   if args.upload_token_secret is not None else []),
                 *tracking_env(args.tracking_uri, args.tracking_experiment, args.tracking_job)],
            resources_=common.resources(args.cpu, args.memory),
            volume_mounts=[k8s.core.v1.VolumeMountArgs(name="state", mount_path=STATE_DIR), topo_mount, tmp_mount],
        )
        self.deployment = common.singleton_deployment(
            dep, name, lbls, container,
            [k8s.core.v1.VolumeArgs(
                name="state",
                persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                    claim_name=pvc.metadata.apply(lambda m: m.name))),
             topo_vol, tmp_vol, *common.credential_volumes(dep, spec)],
            parent=self, service_account=common.service_account(dep, name, self, common.WRITE),
            pod_annotations={"elastic-ctr.io/topology-sha256": args.topology_checksum,
                             **common.scrape_annotations(dep, spec)},
            depends_on=args.wait_for)
        #: what Prometheus scrapes (``components.monitoring``)
        self.scrape_targets = [scrape_target(spec, sel)]
        #: the pod's labels (``components.network_policies``)
        self.selector = sel
        service = k8s.core.v1.Service(
            name,
            metadata=common.metadata(dep, name, lbls),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=sel,
                ports=[k8s.core.v1.ServicePortArgs(name=n, port=p, target_port=n) for n, p in spec.ports],
            ),
            opts=common.child(self),
        )
        self.url = dep.svc_url(service.metadata.apply(lambda m: m.name), spec.port("http"))
        self.status_url = pulumi.Output.concat(self.url, "/dict/info")
        self.register_outputs({"url": self.url, "status_url": self.status_url})
