"""NetworkPolicies: every pod of the stack's namespace denies ingress but for the flows the
pipeline uses (docs/security.md#networkpolicies has the table):

==================================  =====================================  =======================
from                                to                                     ports
==================================  =====================================  =======================
serving's clients (``Peers``)       serving                                http, grpc
serving                             cube servers (every layout)            data
transfer                            cube agents (every layout)             agent
serving                             transfer                               http
trainers, transfer, agents, serving file server                            http
file server's source ranges         file server (``exposeFileServer``)     http
trainers, transfer, tracking UI     tracking server                        http
the training job's pods             pservers; trainers                     paddle, gloo; paddle
monitoring namespace                each role's metrics port               (``RoleSpec.metrics``)
==================================  =====================================  =======================

Pods are selected by the labels their selectors use (``common.selector``) without the
per-shard label, so both cube layouts of a resize (``cube-<N>s``) and a surge serving pod
are covered by the same policies. The cube server's control port is reached only by the
agent beside it (loopback, no policy involved) and by the monitoring namespace for its
metrics; the pservers' gloo store and the trainers' paddle port (GEO mode's trainer to
trainer connection) only by the job's own pods.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from runtime.role_specs import PORTS

#: the label every namespace carries (Kubernetes >= 1.21), selecting a namespace by name
NAMESPACE_NAME = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Peers:
    """Who may open connections to a pod group: pods with ``pod_labels`` (empty: every pod)
    in ``namespaces`` (empty: the stack's own), and the address ranges ``cidrs``."""

    namespaces: Sequence[str] = ()
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    cidrs: Sequence[str] = ()

    def peers(self) -> list[k8s.networking.v1.NetworkPolicyPeerArgs]:
        """The NetworkPolicy ``from`` entries."""
        pods = k8s.meta.v1.LabelSelectorArgs(match_labels=dict(self.pod_labels) or None)
        ns = (k8s.meta.v1.LabelSelectorArgs(match_expressions=[k8s.meta.v1.LabelSelectorRequirementArgs(
            key=NAMESPACE_NAME, operator="In", values=sorted(self.namespaces))]) if self.namespaces else None)
        return [k8s.networking.v1.NetworkPolicyPeerArgs(pod_selector=pods, namespace_selector=ns),
                *_ip_blocks(self.cidrs)]


def _ip_blocks(cidrs: Sequence[str]) -> list[k8s.networking.v1.NetworkPolicyPeerArgs]:
    """One ``ipBlock`` peer per CIDR."""
    return [k8s.networking.v1.NetworkPolicyPeerArgs(ip_block=k8s.networking.v1.IPBlockArgs(cidr=c)) for c in cidrs]


@dataclass(frozen=True)
class NetworkPoliciesArgs:
    """Inputs of :class:`NetworkPolicies`: the pod selectors (``match_labels`` dicts) of each
    group, and the peers the stack admits from outside.

    Attributes:
        deployment: namespace, instance.
        cube_selector: every cube pod of the stack (every layout: no shard label).
        transfer_selector / serving_selector: the transfer's and serving's pods.
        job_selector: the training job's pods (both tasks; ``task_label`` tells them apart).
        files_selector / tracking_selector: the file server's and the tracking server's
            pods, or None when the stack has none.
        serving_clients: who may call serving.
        file_server_sources: CIDRs admitted to an exposed file server ([] = not exposed).
        tracking_ui: pods admitted to the tracking server besides the trainers and the
            transfer (a UI proxy), or None.
        monitoring_namespace: the namespace of the Prometheus that scrapes the stack, or None.
        task_label: the pod label naming a job pod's task (``pserver`` | ``trainer``).
    """

    deployment: DeployContext
    cube_selector: Mapping[str, str]
    transfer_selector: Mapping[str, str]
    serving_selector: Mapping[str, str]
    job_selector: Mapping[str, str]
    files_selector: Optional[Mapping[str, str]] = None
    tracking_selector: Optional[Mapping[str, str]] = None
    serving_clients: Peers = Peers()
    file_server_sources: Sequence[str] = ()
    tracking_ui: Optional[Peers] = None
    monitoring_namespace: Optional[str] = None
    task_label: str = "elastic-ctr.io/task"


class NetworkPolicies(pulumi.ComponentResource):
    """The default-deny policy ``<name>-default-deny`` and one policy per pod group
    (``<name>-<group>``) admitting its flows. Attribute ``policies``: group -> the
    NetworkPolicy (``default-deny`` included)."""

    def __init__(self, name: str, args: NetworkPoliciesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:NetworkPolicies", name, None, opts)
        self._name, self._dep = name, args.deployment
        self.policies: dict[str, k8s.networking.v1.NetworkPolicy] = {}
        self._policy("default-deny", {}, [])
        pserver = {**args.job_selector, args.task_label: "pserver"}
        trainer = {**args.job_selector, args.task_label: "trainer"}
        job = self._pods(args.job_selector)
        monitor = self._monitoring(args.monitoring_namespace)

        def metrics(role: str, port: str) -> list:
            """The monitoring namespace's rule to ``role``'s metrics port ``port`` ([] without one)."""
            return [(monitor, [PORTS[role][port]])] if monitor else []

        self._policy("serving", args.serving_selector, [
            (args.serving_clients.peers(), [PORTS["serving"]["http"], PORTS["serving"]["grpc"]]),
            *metrics("serving", "http")])
        self._policy("cube", args.cube_selector, [
            (self._pods(args.serving_selector), [PORTS["cube-server"]["data"]]),
            (self._pods(args.transfer_selector), [PORTS["cube-agent"]["agent"]]),
            *([(monitor, [PORTS["cube-server"]["http"], PORTS["cube-agent"]["agent"]])] if monitor else [])])
        self._policy("cube-transfer", args.transfer_selector, [
            (self._pods(args.serving_selector), [PORTS["cube-transfer"]["http"]]), *metrics("cube-transfer", "http")])
        if args.files_selector is not None:
            readers_writers = [*self._pods(trainer), *self._pods(args.transfer_selector),
                               *self._pods(args.cube_selector), *self._pods(args.serving_selector)]
            self._policy("fileserver", args.files_selector, [
                (readers_writers, [PORTS["fileserver"]["http"]]),
                *([(_ip_blocks(args.file_server_sources), [PORTS["fileserver"]["http"]])]
                  if args.file_server_sources else []),
                *metrics("fileserver", "http")])
        if args.tracking_selector is not None:
            loggers = [*self._pods(trainer), *self._pods(args.transfer_selector),
                       *(args.tracking_ui.peers() if args.tracking_ui else [])]
            self._policy("tracking", args.tracking_selector, [(loggers, [PORTS["tracking"]["http"]])])
        self._policy("pserver", pserver, [
            (job, [PORTS["pserver"]["paddle"], PORTS["pserver"]["gloo"]]), *metrics("pserver", "metrics")])
        self._policy("trainer", trainer, [(job, [PORTS["trainer"]["paddle"]]), *metrics("trainer", "metrics")])
        self.register_outputs({})

    @staticmethod
    def _pods(labels: Mapping[str, str]) -> list[k8s.networking.v1.NetworkPolicyPeerArgs]:
        """The pods of the stack's namespace with ``labels``."""
        return [k8s.networking.v1.NetworkPolicyPeerArgs(
            pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(labels)))]

    @staticmethod
    def _monitoring(namespace: Optional[str]) -> list[k8s.networking.v1.NetworkPolicyPeerArgs]:
        """Every pod of the monitoring namespace ([] for None)."""
        if not namespace:
            return []
        return [k8s.networking.v1.NetworkPolicyPeerArgs(
            namespace_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={NAMESPACE_NAME: namespace}),
            pod_selector=k8s.meta.v1.LabelSelectorArgs())]

    def _policy(self, group: str, pods: Mapping[str, str], rules: list) -> None:
        """A NetworkPolicy ``<name>-<group>`` over the pods with labels ``pods`` (all: ``{}``)
        admitting, per rule ``(peers, ports)``, TCP to ``ports`` from ``peers``."""
        name = f"{self._name}-{group}"
        dep = self._dep
        self.policies[group] = k8s.networking.v1.NetworkPolicy(
            name, metadata=common.metadata(dep, name, common.labels(dep, name, "network")),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(pods) or None),
                policy_types=["Ingress"],
                ingress=[k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                    from_=list(peers), ports=[k8s.networking.v1.NetworkPolicyPortArgs(protocol="TCP", port=p)
                                              for p in ports]) for peers, ports in rules] or None),
            opts=common.child(self))
