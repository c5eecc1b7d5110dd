"""ObjectStoreAccess: how the pods reach an object store holding the data and the versions
(``modelRoot: s3://...``), with readers and writers kept apart.

Named after the component (``<name>``): with access keys (stack secrets), two Secrets,
``<name>-credentials`` (the read-write pair: the trainer and the transfer) and
``<name>-read-credentials`` (the read-only pair: cube agents, serving, pservers), each
holding ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (payloads redacted by the
render) that pods read through secretKeyRef. With a workload identity (IRSA, GKE Workload
Identity) there are no keys: each workload's own ServiceAccount (``common.service_account``)
carries the writers' or the readers' annotations. The endpoint of an S3-compatible store and
the region are plain variables (``AWS_ENDPOINT_URL_S3``, ``AWS_DEFAULT_REGION``), the ones
botocore (and so s3fs, ``runtime/objectstore.py``) reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext


@dataclass(frozen=True)
class ObjectStoreAccessArgs:
    """Inputs of :class:`ObjectStoreAccess`.

    Attributes:
        deployment: namespace, instance.
        env: plain variables for every pod that reaches the store (name -> value).
        secret_env: variable name -> secret Output of the read-write pair, or None.
        read_secret_env: the same for the read-only pair, or None.
    """

    deployment: DeployContext
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Optional[Mapping[str, pulumi.Input[str]]] = None
    read_secret_env: Optional[Mapping[str, pulumi.Input[str]]] = None


class ObjectStoreAccess(pulumi.ComponentResource):
    """Outputs: ``env`` (the writers' ``EnvVarArgs``: plain values and secretKeyRefs to the
    read-write Secret), ``read_env`` (the readers': to the read-only Secret)."""

    env: list[Any]
    read_env: list[Any]

    def __init__(self, name: str, args: ObjectStoreAccessArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:ObjectStoreAccess", name, None, opts)
        plain = [k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in sorted(args.env.items())]
        self.env = plain + self._secret(args.deployment, f"{name}-credentials", name, args.secret_env)
        self.read_env = plain + self._secret(args.deployment, f"{name}-read-credentials", name, args.read_secret_env)
        self.register_outputs({})

    def _secret(self, dep: DeployContext, sec_name: str, name: str,
                values: Optional[Mapping[str, pulumi.Input[str]]]) -> list[k8s.core.v1.EnvVarArgs]:
        """A Secret ``sec_name`` of ``values`` and the secretKeyRefs to it ([] for None)."""
        if not values:
            return []
        sec = k8s.core.v1.Secret(
            sec_name, metadata=common.metadata(dep, sec_name, common.labels(dep, name, "storage")),
            type="Opaque", string_data={k: pulumi.Output.secret(v) for k, v in values.items()},
            opts=common.child(self))
        secret = sec.metadata.apply(lambda m: m.name)
        return [k8s.core.v1.EnvVarArgs(name=k, value_from=k8s.core.v1.EnvVarSourceArgs(
            secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=secret, key=k))) for k in sorted(values)]
