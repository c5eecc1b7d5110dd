"""Serving: the Open Inference Protocol (v2) prediction server.

Named after the component (``<name>``): a Deployment (``servingReplicas`` pods, rolling updates without dropping capacity), a
ClusterIP Service with ``http`` (8000, REST) and ``grpc`` (8001,
``inference.GRPCInferenceService``) ports and, when ``max_replicas`` > ``replicas``, a
HorizontalPodAutoscaler (autoscaling/v2) on CPU utilization, or (``autoscale_metric``
``inflight``) on the in-flight inference requests per pod, a ``Pods`` metric
(``elastic_ctr_serving_inflight_requests``) that the Prometheus adapter serves through
the custom metrics API (docs/monitoring.md has its rule). Probes use the v2 health
endpoints. The pod template carries the topology checksum, so a resized cube rolls it.
The Deployment depends on ``wait_for`` (the cube layout's StatefulSets and the
transfer's Deployment): under ``pulumi up`` serving rolls to a new topology only after
both were awaited, one pod at a time (``maxSurge`` 1, ``maxUnavailable`` 0), a new pod
ready only once its topology's cube serves a version; pulumi awaits the rollout before it
deletes what left the program (an old cube layout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from components.monitoring import scrape_target
from runtime import dense_backends, role_specs
from runtime.metrics.serving import INFLIGHT

#: seconds a deleted serving pod keeps answering before its SIGTERM (preStop), while the
#: endpoints controller and every node's kube-proxy stop routing new connections to it;
#: without it, connections opened in that window are refused (measured by the container
#: test: 8 refused connections in the first second after a deletion)
PRE_STOP_S = 5
#: how long ``pulumi up`` awaits the serving rollout (pulumi-kubernetes's default is 10
#: minutes): after a new ``cubeShards`` a new pod is ready only once the transfer has laid
#: the served chain out on the new layout, which grows with the dict (README "Resize");
#: a rollout still running at the timeout fails the update before the old layout is
#: deleted, so it keeps serving and a second ``pulumi up`` goes on
ROLLOUT_TIMEOUT = "30m"


@dataclass(frozen=True)
class ServingArgs:
    """Inputs of :class:`Serving`.

    Attributes:
        deployment: namespace, instance, pull secrets.
        image: serving image reference.
        topology_configmap / topology_checksum: the cube topology ConfigMap and its sha256.
        model_root: ROOT of versions (the file server's URL).
        transfer_url: base URL of the cube transfer.
        replicas: pod count (the HPA's minimum when autoscaling).
        max_replicas: HPA maximum; ``0`` (or <= ``replicas``) = no HPA. ``replicas`` and
            ``max_replicas`` are plain ints: they decide whether an HPA is declared.
        target_cpu_utilization: HPA target, percent of the CPU request.
        autoscale_metric: ``cpu`` or ``inflight`` (the HPA's metric); target_inflight: the
            in-flight requests per pod it aims at (``inflight``).
        workers: WSGI worker processes per pod.
        dense_backend: what runs the dense network (``runtime.dense_backends``: ``onnxruntime``
            or ``paddle``, whose image must hold Paddle: the ``serving-paddle`` target).
        data_format / slot_file: raw-line format ``/predict`` accepts (as in training).
        cpu / memory: requests = limits.
        wait_for: resources the Deployment depends on (``depends_on``).
    """

    deployment: DeployContext
    image: pulumi.Input[str]
    topology_configmap: pulumi.Input[str]
    topology_checksum: pulumi.Input[str]
    model_root: pulumi.Input[str]
    transfer_url: pulumi.Input[str]
    replicas: int
    cpu: pulumi.Input[str]
    memory: pulumi.Input[str]
    data_format: pulumi.Input[str] = "criteo"
    slot_file: Optional[pulumi.Input[str]] = None
    max_replicas: int = 0
    target_cpu_utilization: pulumi.Input[int] = 70
    autoscale_metric: str = "cpu"
    target_inflight: int = 8
    workers: pulumi.Input[int] = 2
    dense_backend: str = dense_backends.DEFAULT
    wait_for: Sequence[pulumi.Resource] = ()


class Serving(pulumi.ComponentResource):
    """Outputs: ``url`` (in-cluster REST base URL), ``grpc_target`` (in-cluster
    ``host:port`` of the gRPC endpoint), ``autoscaled`` (bool)."""

    url: pulumi.Output[str]
    grpc_target: pulumi.Output[str]
    autoscaled: pulumi.Output[bool]

    def __init__(self, name: str, args: ServingArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:Serving", name, None, opts)
        dep = args.deployment
        lbls = common.labels(dep, name, "inference")
        sel = common.selector(lbls)
        topo_vol, topo_mount = common.topology_volume(args.topology_configmap)
        tmp_vol, tmp_mount = common.tmp_volume()
        spec = role_specs.serving(common.TOPOLOGY_FILE, args.model_root, args.transfer_url,
                                  f"{common.TMP_DIR}/models", workers=pulumi.Output.from_input(args.workers).apply(str),
                                  data_format=args.data_format, slot_file=args.slot_file,
                                  dense_backend=args.dense_backend)
        port, grpc_port = spec.port("http"), spec.port("grpc")
        container = common.container(
            spec, dep, args.image, env=common.base_env(dep=dep), resources_=common.resources(args.cpu, args.memory),
            volume_mounts=[topo_mount, tmp_mount],
            lifecycle=k8s.core.v1.LifecycleArgs(pre_stop=k8s.core.v1.LifecycleHandlerArgs(
                exec_=k8s.core.v1.ExecActionArgs(command=["sleep", str(PRE_STOP_S)]))))
        autoscaled = args.max_replicas > args.replicas
        deployment = k8s.apps.v1.Deployment(
            name,
            metadata=common.metadata(dep, name, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=args.replicas,
                strategy=k8s.apps.v1.DeploymentStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(
                        max_surge=1, max_unavailable=0)),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=sel),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        labels=lbls,
                        annotations={"elastic-ctr.io/topology-sha256": args.topology_checksum,
                                     **common.scrape_annotations(dep, spec)}),
                    spec=k8s.core.v1.PodSpecArgs(
                        security_context=common.pod_security(),
                        image_pull_secrets=dep.pull_secrets() or None,
                        service_account_name=common.service_account(dep, name, self, common.READ),
                        automount_service_account_token=False,
                        containers=[container],
                        volumes=[topo_vol, tmp_vol, *common.credential_volumes(dep, spec)],
                    ),
                ),
            ),
            # with an HPA, later `pulumi up`s must not reset the autoscaler's count
            opts=common.child(self, ignore_changes=["spec.replicas"] if autoscaled else None,
                              depends_on=list(args.wait_for) or None,
                              custom_timeouts=pulumi.CustomTimeouts(create=ROLLOUT_TIMEOUT, update=ROLLOUT_TIMEOUT)),
        )
        service = k8s.core.v1.Service(
            name,
            metadata=common.metadata(dep, name, lbls),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=sel,
                ports=[k8s.core.v1.ServicePortArgs(name="http", port=port, target_port="http"),
                       k8s.core.v1.ServicePortArgs(name="grpc", port=grpc_port, target_port="grpc",
                                                   app_protocol="grpc")],
            ),
            opts=common.child(self),
        )
        if autoscaled:
            k8s.autoscaling.v2.HorizontalPodAutoscaler(
                name,
                metadata=common.metadata(dep, name, lbls),
                spec=k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgs(
                    scale_target_ref=k8s.autoscaling.v2.CrossVersionObjectReferenceArgs(
                        api_version="apps/v1", kind="Deployment",
                        name=deployment.metadata.apply(lambda m: m.name)),
                    min_replicas=args.replicas,
                    max_replicas=args.max_replicas,
                    metrics=[_hpa_metric(args)],
                ),
                opts=common.child(self),
            )
        self.url = dep.svc_url(service.metadata.apply(lambda m: m.name), port)
        self.grpc_target = pulumi.Output.concat(
            dep.svc_host(service.metadata.apply(lambda m: m.name)), ":", str(grpc_port))
        self.autoscaled = pulumi.Output.from_input(autoscaled)
        #: what Prometheus scrapes (``components.monitoring``)
        self.scrape_targets = [scrape_target(spec, sel)]
        #: the pods' labels (``components.network_policies``)
        self.selector = sel
        self.register_outputs({"url": self.url, "grpc_target": self.grpc_target,
                               "autoscaled": self.autoscaled})


def _hpa_metric(args: ServingArgs) -> k8s.autoscaling.v2.MetricSpecArgs:
    """The HPA's metric: CPU utilization, or the average in-flight requests per pod."""
    if args.autoscale_metric == "inflight":
        return k8s.autoscaling.v2.MetricSpecArgs(
            type="Pods",
            pods=k8s.autoscaling.v2.PodsMetricSourceArgs(
                metric=k8s.autoscaling.v2.MetricIdentifierArgs(name=INFLIGHT),
                target=k8s.autoscaling.v2.MetricTargetArgs(type="AverageValue",
                                                           average_value=str(args.target_inflight))))
    if args.autoscale_metric != "cpu":
        raise ValueError(f"autoscale_metric {args.autoscale_metric!r}: cpu or inflight")
    return k8s.autoscaling.v2.MetricSpecArgs(
        type="Resource",
        resource=k8s.autoscaling.v2.ResourceMetricSourceArgs(
            name="cpu",
            target=k8s.autoscaling.v2.MetricTargetArgs(type="Utilization",
                                                       average_utilization=args.target_cpu_utilization)))
