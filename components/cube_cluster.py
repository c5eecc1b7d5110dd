"""CubeCluster: the sharded, replicated sparse-parameter service.

Each layout is a *layout* named by its shard count ``N``: ``<name>-<N>s``. Per shard
``i`` (0 <= i < N): a StatefulSet ``<name>-<N>s-shard-<i>`` (replicas = the replica count;
a ``cube-server`` and a ``cube-agent`` container sharing an emptyDir at ``/data``), its
headless Service (stable pod DNS) and a PodDisruptionBudget allowing one replica down at a
time. Plus the ``<name>-<N>s-topology`` ConfigMap (``topology.json``,
``runtime.formats.topology``) that the transfer and serving mount.

Why layouts: a key's shard is ``key % N``, so a server of one shard count can never
serve another's dicts. A new ``cubeShards`` therefore declares a new layout beside
the old one instead of restarting the old pods; the old layout's resources leave the
program, and ``pulumi up`` deletes them only after every create and update was awaited
(the transfer laid the served chain out on the new layout, every serving pod moved
to it; see README "Resize"). A new ``cubeReplicas`` updates the layout in place
(StatefulSet replicas, the ConfigMap's content and so its checksum).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from components.monitoring import scrape_target
from runtime import role_specs
from runtime.formats.topology import Topology

DATA_DIR = "/data"


def topology(namespace: str, shard_names: list[str], replicas: int,
             dict_name: str = role_specs.DICT_NAME) -> Topology:
    """The topology of ``shard_names`` StatefulSets (shard order) of ``replicas`` pods each.

    Addresses are StatefulSet pod DNS names,
    ``<sts>-<ordinal>.<headless svc>.<namespace>.svc.cluster.local``, with the roles' pod
    ports (``runtime.role_specs.replica_addresses``), so they are known before any pod
    exists and stay stable across restarts."""
    rows = [[role_specs.replica_addresses(f"{name}-{r}.{name}.{namespace}.svc.cluster.local")
             for r in range(replicas)] for name in shard_names]
    return Topology.build(dict_name, rows)


def layout_name(name: str, shards: int) -> str:
    """``<name>-<shards>s``: the prefix of every resource of one layout (e.g. ``cube-2s``).

    Raises ValueError for ``shards`` < 1."""
    if shards < 1:
        raise ValueError(f"shards: {shards} is not a shard count (>= 1)")
    return f"{name}-{shards}s"


@dataclass(frozen=True)
class CubeClusterArgs:
    """Inputs of :class:`CubeCluster`.

    Attributes:
        deployment: namespace, labels instance, pull secrets.
        image: cube image reference.
        shards: shard count (>= 1); keys go to shard ``key % shards``. A plain int: it is
            the number of StatefulSets declared.
        replicas: replicas per shard (>= 1). A plain int: it shapes the topology.
        server_cpu / server_memory: cube-server requests = limits (Kubernetes quantities).
        agent_cpu / agent_memory: cube-agent requests = limits.
        data_size: size limit of the shared emptyDir holding downloaded and loaded dicts.
        version_root: ROOT of the versions (the file server's URL or the store location): the
            agents download only under ``ROOT/cube/``, where the transfer publishes; None =
            no ``--version-root`` (the agent's own default).
    """

    deployment: DeployContext
    image: pulumi.Input[str]
    shards: int
    replicas: int
    server_cpu: pulumi.Input[str]
    server_memory: pulumi.Input[str]
    agent_cpu: pulumi.Input[str]
    agent_memory: pulumi.Input[str]
    data_size: pulumi.Input[str]
    version_root: Optional[pulumi.Input[str]] = None


class CubeCluster(pulumi.ComponentResource):
    """Cube servers and agents, shards x replicas, and the topology ConfigMap.

    Outputs: ``topology`` (the document, a dict), ``topology_configmap`` (ConfigMap name),
    ``topology_checksum`` (sha256 of ``topology.json``). Attributes for dependencies:
    ``statefulsets`` (the layout's StatefulSets, shard order; ``depends_on`` them to
    wait until pulumi-kubernetes has awaited every cube pod ready)."""

    topology: pulumi.Output[dict]
    topology_configmap: pulumi.Output[str]
    topology_checksum: pulumi.Output[str]

    def __init__(self, name: str, args: CubeClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:CubeCluster", name, None, opts)
        dep = args.deployment
        #: the layout's name prefix, ``<name>-<N>s`` (the shard count is in every name)
        self.layout = layout_name(name, args.shards)
        self.shard_names = [f"{self.layout}-shard-{i}" for i in range(args.shards)]
        topo = pulumi.Output.from_input(dep.namespace).apply(
            lambda ns: topology(ns, self.shard_names, args.replicas))
        self.topology = topo.apply(lambda t: t.model_dump())
        self.topology_checksum = topo.apply(lambda t: t.checksum())
        cm_name = f"{self.layout}-topology"
        self.configmap = k8s.core.v1.ConfigMap(
            cm_name,
            metadata=common.metadata(dep, cm_name, common.labels(dep, cm_name, "cube")),
            data={"topology.json": topo.apply(lambda t: t.to_json())},
            opts=common.child(self),
        )
        self.topology_configmap = self.configmap.metadata.apply(lambda m: m.name)
        # one identity for the cube pods of every layout (a resize leaves it alone): the agents
        # read the versions; no API token
        self.service_account = common.service_account(dep, name, self, common.READ)
        self.statefulsets = [self._shard(i, shard_name, args) for i, shard_name in enumerate(self.shard_names)]
        # every shard's headless Service (every layout's, during a resize), one monitor per role
        every_shard = common.selector(common.labels(dep, "cube-server", "cube"))
        #: the labels of every cube pod of the stack, every layout's (``components.network_policies``)
        self.every_shard = every_shard
        #: what Prometheus scrapes (``components.monitoring``): the servers' and the agents' endpoints
        self.scrape_targets = [scrape_target(role_specs.cube_server(0, args.shards), every_shard),
                               scrape_target(role_specs.cube_agent(f"{DATA_DIR}/agent"), every_shard)]
        self.register_outputs({"topology": self.topology, "topology_configmap": self.topology_configmap,
                               "topology_checksum": self.topology_checksum})

    def _shard(self, shard: int, name: str, args: CubeClusterArgs) -> k8s.apps.v1.StatefulSet:
        dep = args.deployment
        # the shard label names the StatefulSet: selectors stay unique with two clusters in a stack
        lbls = common.labels(dep, "cube-server", "cube", **{"elastic-ctr.io/shard": name})
        sel = common.selector(lbls)
        # the server loads only what its agent unpacked; the agent downloads only what was published
        server = role_specs.cube_server(shard, args.shards, data_dir=f"{DATA_DIR}/server",
                                        load_roots=[f"{DATA_DIR}/agent"])
        roots = [] if args.version_root is None else [pulumi.Output.from_input(args.version_root).apply(
            lambda r: r.rstrip("/") + "/cube/")]
        agent = role_specs.cube_agent(f"{DATA_DIR}/agent", version_roots=roots)

        k8s.core.v1.Service(
            name,
            metadata=common.metadata(dep, name, lbls),
            spec=k8s.core.v1.ServiceSpecArgs(
                cluster_ip="None",  # headless: per-pod DNS records
                publish_not_ready_addresses=True,  # the transfer reaches agents before data is loaded
                selector=sel,
                ports=[k8s.core.v1.ServicePortArgs(name=n, port=p, target_port=n)
                       for spec in (server, agent) for n, p in spec.ports],
            ),
            opts=common.child(self),
        )

        tmp_vol, tmp_mount = common.tmp_volume()
        data_mount = k8s.core.v1.VolumeMountArgs(name="cube-data", mount_path=DATA_DIR)
        server_c = common.container(server, dep, args.image, env=common.base_env(),
                                    resources_=common.resources(args.server_cpu, args.server_memory),
                                    volume_mounts=[data_mount, tmp_mount])
        agent_c = common.container(agent, dep, args.image, env=common.base_env(dep=dep),
                                   resources_=common.resources(args.agent_cpu, args.agent_memory),
                                   volume_mounts=[data_mount, tmp_mount])
        sts = k8s.apps.v1.StatefulSet(
            name,
            metadata=common.metadata(dep, name, lbls),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                service_name=name,
                replicas=args.replicas,
                pod_management_policy="Parallel",
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=sel),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    # the annotations name one port per pod: the server's (its agent is not scraped)
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels=lbls,
                                                        annotations=common.scrape_annotations(dep, server) or None),
                    spec=k8s.core.v1.PodSpecArgs(
                        security_context=common.pod_security(),
                        image_pull_secrets=dep.pull_secrets() or None,
                        service_account_name=self.service_account,
                        automount_service_account_token=False,
                        # replicas of one shard on different nodes where possible
                        affinity=k8s.core.v1.AffinityArgs(
                            pod_anti_affinity=k8s.core.v1.PodAntiAffinityArgs(
                                preferred_during_scheduling_ignored_during_execution=[
                                    k8s.core.v1.WeightedPodAffinityTermArgs(
                                        weight=100,
                                        pod_affinity_term=k8s.core.v1.PodAffinityTermArgs(
                                            topology_key="kubernetes.io/hostname",
                                            label_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=sel),
                                        ),
                                    )
                                ]
                            )
                        ),
                        containers=[server_c, agent_c],
                        volumes=[
                            k8s.core.v1.VolumeArgs(
                                name="cube-data",
                                empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit=args.data_size)),
                            tmp_vol,
                            *common.credential_volumes(dep, server, agent),
                        ],
                    ),
                ),
            ),
            opts=common.child(self),
        )
        k8s.policy.v1.PodDisruptionBudget(
            name,
            metadata=common.metadata(dep, name, lbls),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=sel),
            ),
            opts=common.child(self),
        )
        return sts
