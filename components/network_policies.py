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

With ``egress`` the pods' outgoing connections are denied too but for the same flows seen
from their sources, DNS (UDP and TCP 53 to the ``kube-system`` namespace) and the
``egress_cidrs`` (the object store, the data's HTTP sources, an external tracking server).

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
        egress: also deny egress but for the flows, DNS and ``egress_cidrs``.
        egress_cidrs: CIDRs every pod may connect to (any port) when ``egress``.
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
    egress: bool = False
    egress_cidrs: Sequence[str] = ()


class NetworkPolicies(pulumi.ComponentResource):
    """The default-deny policy ``<name>-default-deny`` and one policy per pod group
    (``<name>-<group>``) admitting its flows; with ``egress`` also ``<name>-egress`` (the
    stack's pods, by their instance label: egress denied but DNS and the CIDRs) and ``<name>-<group>-egress`` (a group's flows from its side).
    Attribute ``policies``: group -> the NetworkPolicy (``default-deny`` included)."""

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
        if args.egress:
            self._egress(args, pserver, trainer)
        self.register_outputs({})

    def _egress(self, args: NetworkPoliciesArgs, pserver: dict, trainer: dict) -> None:
        """The egress policies: DNS and ``egress_cidrs`` for every pod, then each source
        group's flows (the ingress flows above, seen from their sources)."""
        # the stack's pods only (the instance label): a client in the namespace keeps its egress
        stack = {"app.kubernetes.io/instance": self._dep.instance}
        dns = [k8s.networking.v1.NetworkPolicyPeerArgs(namespace_selector=k8s.meta.v1.LabelSelectorArgs(
            match_labels={NAMESPACE_NAME: "kube-system"}))]
        self._policy("egress", stack, [(dns, [(53, "UDP"), (53, "TCP")]),
                                       *([(_ip_blocks(args.egress_cidrs), [])] if args.egress_cidrs else [])],
                     types=["Egress"])
        flows: dict[str, tuple[Mapping[str, str], list]] = {
            "serving": (args.serving_selector, [(args.cube_selector, [PORTS["cube-server"]["data"]]),
                                                (args.transfer_selector, [PORTS["cube-transfer"]["http"]])]),
            "cube-transfer": (args.transfer_selector, [(args.cube_selector, [PORTS["cube-agent"]["agent"]])]),
            "cube": (args.cube_selector, []),
            **{task: (sel, [(pserver, [PORTS["pserver"]["paddle"], PORTS["pserver"]["gloo"]]),
                            (trainer, [PORTS["trainer"]["paddle"]])]) for task, sel in (("pserver", pserver),
                                                                                      ("trainer", trainer))},
        }
        if args.files_selector is not None:
            for group in ("trainer", "cube-transfer", "cube", "serving"):
                flows[group][1].append((args.files_selector, [PORTS["fileserver"]["http"]]))
        if args.tracking_selector is not None:
            for group in ("trainer", "cube-transfer"):
                flows[group][1].append((args.tracking_selector, [PORTS["tracking"]["http"]]))
        for group, (pods, to) in flows.items():
            self._policy(f"{group}-egress", pods, [(self._pods(dst), ports) for dst, ports in to], types=["Egress"])

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

    def _policy(self, group: str, pods: Mapping[str, str], rules: list, types: Sequence[str] = ("Ingress",)) -> None:
        """A NetworkPolicy ``<name>-<group>`` over the pods with labels ``pods`` (all: ``{}``)
        of ``types``; per rule ``(peers, ports)`` it admits connections to ``ports`` (a port
        number: TCP, or ``(number, protocol)``; none: every port) from ``peers`` (an Ingress
        policy) or to them (an Egress one)."""
        name = f"{self._name}-{group}"
        dep = self._dep

        def ports_(ports: list) -> Optional[list]:
            out = [k8s.networking.v1.NetworkPolicyPortArgs(
                protocol=p[1] if isinstance(p, tuple) else "TCP", port=p[0] if isinstance(p, tuple) else p)
                for p in ports]
            return out or None

        egress = types == ["Egress"]
        self.policies[group] = k8s.networking.v1.NetworkPolicy(
            name, metadata=common.metadata(dep, name, common.labels(dep, name, "network")),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(pods) or None),
                policy_types=list(types),
                ingress=None if egress else ([k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                    from_=list(peers), ports=ports_(ports)) for peers, ports in rules] or None),
                egress=([k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=list(peers), ports=ports_(ports))
                         for peers, ports in rules] or None) if egress else None),
            opts=common.child(self))
