"""Stack keys for who may reach what: the NetworkPolicies (on by default) and the
peers they admit (serving's clients, the tracking UI, the monitoring namespace), the file
server's LoadBalancer source ranges, and the per-boundary credentials a user may set
instead of the generated ones (``components.credentials``).

``SecurityKeys`` is a base of ``infra.config.StackConfig`` (its keys are stack keys like
any other: ``Pulumi.yaml`` declares them, ``infra.config_load.parse`` validates them);
``SECRETS`` joins ``infra.config.SECRETS`` and ``problems(raw)`` adds the rules across
keys. Peers are written as text: namespace names and CIDRs comma-separated, pod labels as
comma-separated ``key=value`` (``labels``).
"""
from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Mapping, Optional

import pulumi
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config_types import check as _check, pulumi_bool as _pulumi_bool
from runtime.role_specs import CUBE_CONTROL, FILES_READ, FILES_WRITE, TRACKING

PROJECT = "elastic-ctr"
_LABEL = re.compile(r"([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?=([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _items(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _is_cidr(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=True)
    except ValueError:
        return False
    return "/" in text


Labels = Annotated[str, _check(lambda v: all(_LABEL.fullmatch(p) for p in _items(v)),
                               "empty or comma-separated key=value pod labels, e.g. app=frontend")]
Namespaces = Annotated[str, _check(lambda v: all(len(p) <= 63 and _DNS_LABEL.fullmatch(p) for p in _items(v)),
                                   "empty or comma-separated namespace names (DNS-1123 labels)")]
Cidrs = Annotated[str, _check(lambda v: all(_is_cidr(p) for p in _items(v)),
                              "empty or comma-separated CIDRs with their prefix length, e.g. 10.0.0.0/8,192.0.2.7/32")]
Username = Annotated[str, _check(lambda v: bool(re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", v)),
                                 "a user name: 1-64 letters, digits, '_', '.', '-'")]


class SecurityKeys(BaseModel):
    """The network and credential keys of the stack (camelCase in Pulumi)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    network_policies: Annotated[bool, BeforeValidator(_pulumi_bool)] = Field(
        True, description="NetworkPolicies: deny all ingress to the stack's pods but the flows the pipeline uses "
                          "(docs/security.md has the table); false = none (every pod reachable from the whole "
                          "cluster).", json_schema_extra={"group": "security"})
    network_policy_egress: Annotated[bool, BeforeValidator(_pulumi_bool)] = Field(
        False, description="networkPolicies also deny the pods' outgoing connections but for the pipeline's flows, "
                            "DNS (port 53 in kube-system) and egressCidrs.")
    egress_cidrs: Cidrs = Field(
        "", description="networkPolicyEgress: the address ranges every pod may connect to (the object store, the "
                        "data's HTTP sources, an external tracking server), comma-separated CIDRs.")
    serving_client_namespaces: Namespaces = Field(
        "", description="Namespaces whose pods (with servingClientPodLabels) may call serving, comma-separated; "
                        "empty = the stack's own namespace.")
    serving_client_pod_labels: Labels = Field(
        "elastic-ctr.io/serving-client=true", description="Labels a pod needs to call serving (in "
        "servingClientNamespaces), comma-separated key=value; empty = every pod of those namespaces.")
    serving_client_cidrs: Cidrs = Field(
        "", description="Address ranges (outside the cluster's pods) that may call serving, comma-separated CIDRs.")
    tracking_ui_namespaces: Namespaces = Field(
        "", description="Namespaces of the pods with trackingUiPodLabels allowed to the tracking server (a UI "
                        "proxy), comma-separated; empty = the stack's own namespace.")
    tracking_ui_pod_labels: Labels = Field(
        "", description="Labels of the pods (e.g. an authenticating proxy) allowed to the tracking server's UI "
                        "besides the trainers and the transfer, comma-separated key=value; empty = none.")
    monitoring_namespace: Namespaces = Field(
        "monitoring", description="Namespace of the Prometheus that scrapes the stack (its pods reach every role's "
                                  "metrics port); empty = none.")
    file_server_source_ranges: Cidrs = Field(
        "", description="exposeFileServer: the address ranges its LoadBalancer admits (loadBalancerSourceRanges "
                        "and the NetworkPolicy's), comma-separated CIDRs; required when exposeFileServer is true.")
    tracking_username: Username = Field(
        "elastic-ctr", description="The MLflow (basic-auth) user the trainers and the transfer log in as; its "
                                   "password is trackingPassword, generated when not set.")

    def client_cidrs(self) -> list[str]:
        """``servingClientCidrs`` as a list."""
        return _items(self.serving_client_cidrs)

    def egress_ranges(self) -> list[str]:
        """``egressCidrs`` as a list."""
        return _items(self.egress_cidrs)

    def source_ranges(self) -> list[str]:
        """``fileServerSourceRanges`` as a list."""
        return _items(self.file_server_source_ranges)


def labels(text: str) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` -> ``{"k1": "v1", "k2": "v2"}`` (empty text -> ``{}``)."""
    return dict(p.split("=", 1) for p in _items(text))


def namespaces(text: str) -> list[str]:
    """Comma-separated namespace names as a list (empty text -> ``[]``)."""
    return _items(text)


#: boundary -> (stack key of its current credential, of its previous one)
BOUNDARY_KEYS: dict[str, tuple[str, str]] = {
    CUBE_CONTROL: ("cubeControlToken", "cubeControlTokenPrevious"),
    FILES_WRITE: ("uploadToken", "uploadTokenPrevious"),
    FILES_READ: ("fileServerReadToken", "fileServerReadTokenPrevious"),
    TRACKING: ("trackingPassword", ""),
}

#: secret keys (description, minimum length); ``uploadToken`` is ``infra.config``'s
SECRETS: dict[str, tuple[str, int]] = {
    "cubeControlToken": ("Bearer token the transfer presents to the cube servers' control ports and the agents "
                         "(stored in the cube-control Secret); empty = generated per stack (pulumi-random).", 16),
    "cubeControlTokenPrevious": ("The cube-control token being rotated out: accepted beside cubeControlToken "
                                 "while the new one rolls out (docs/security.md); empty = none.", 16),
    "uploadTokenPrevious": ("The upload token being rotated out, accepted beside uploadToken while the new one "
                            "rolls out; empty = none.", 16),
    "fileServerReadToken": ("Bearer token readers (agents, serving) present to a protected file server (GET and "
                            "listings); empty = generated per stack.", 16),
    "fileServerReadTokenPrevious": ("The read token being rotated out, accepted beside fileServerReadToken while "
                                    "the new one rolls out; empty = none.", 16),
    "trackingPassword": ("Password of trackingUsername on the MLflow server (basic auth; also its admin); empty = "
                         "generated per stack (with an external server, trackingUri, set it to that server's).", 16),
}


def problems(raw: Mapping[str, Any]) -> list[str]:
    """The rules across the security keys, one message per problem."""
    out = []
    expose = str(raw.get("exposeFileServer", "false")).strip().lower() == "true"
    if expose and not _items(str(raw.get("fileServerSourceRanges") or "")):
        out.append(f"{PROJECT}:fileServerSourceRanges: '' is invalid; allowed: comma-separated CIDRs (required when "
                   "exposeFileServer is true: a LoadBalancer open to every address publishes every version)")
    for current, previous in BOUNDARY_KEYS.values():
        if previous and raw.get(previous) and not raw.get(current):
            out.append(f"{PROJECT}:{previous}: [secret] is set without {current}; allowed: empty, or set with the "
                       "new credential in " + current)
    return out


class CredentialSecrets:
    """The user's credentials per boundary as secret Outputs (None when not set):
    ``current[boundary]``, ``previous[boundary]``."""

    def __init__(self, config: pulumi.Config) -> None:
        self.current: dict[str, Optional[pulumi.Output[str]]] = {}
        self.previous: dict[str, Optional[pulumi.Output[str]]] = {}
        for boundary, (cur, prev) in BOUNDARY_KEYS.items():
            self.current[boundary] = config.get_secret(cur) or None
            self.previous[boundary] = (config.get_secret(prev) or None) if prev else None
