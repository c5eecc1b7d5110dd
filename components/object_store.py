"""ObjectStoreAccess: how the pods reach an object store holding the data and the versions
(``modelRoot: s3://...``, issue 18).

Named after the component (``<name>``): with access keys (stack secrets), a Secret
``<name>-credentials`` holding ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (its
payload is redacted by the render) that pods read through secretKeyRef; with a workload
identity (IRSA, GKE Workload Identity), a ServiceAccount ``<name>`` carrying the cloud's
annotations and no keys. The endpoint of an S3-compatible store and the region are plain
variables (``AWS_ENDPOINT_URL_S3``, ``AWS_DEFAULT_REGION``), the ones botocore (and so
s3fs, ``runtime/objectstore.py``) reads.
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
        secret_env: variable name -> secret Output (the access keys), or None.
        service_account_annotations: annotations of the workload-identity ServiceAccount;
            empty = no ServiceAccount (pods keep the namespace's default).
    """

    deployment: DeployContext
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Optional[Mapping[str, pulumi.Input[str]]] = None
    service_account_annotations: Mapping[str, str] = field(default_factory=dict)


class ObjectStoreAccess(pulumi.ComponentResource):
    """Outputs: ``env`` (``EnvVarArgs`` for the containers: plain values and secretKeyRefs),
    ``service_account`` (the ServiceAccount's name, or None)."""

    env: list[Any]
    service_account: Optional[pulumi.Output[str]]

    def __init__(self, name: str, args: ObjectStoreAccessArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:ObjectStoreAccess", name, None, opts)
        dep = args.deployment
        env = [k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in sorted(args.env.items())]
        if args.secret_env:
            sec_name = f"{name}-credentials"
            sec = k8s.core.v1.Secret(
                sec_name, metadata=common.metadata(dep, sec_name, common.labels(dep, name, "storage")),
                type="Opaque", string_data=dict(args.secret_env), opts=common.child(self))
            secret = sec.metadata.apply(lambda m: m.name)
            env += [k8s.core.v1.EnvVarArgs(name=k, value_from=k8s.core.v1.EnvVarSourceArgs(
                secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=secret, key=k))) for k in sorted(args.secret_env)]
        self.env = env
        self.service_account = None
        if args.service_account_annotations:
            sa = k8s.core.v1.ServiceAccount(
                name, metadata=common.metadata(dep, name, common.labels(dep, name, "storage"),
                                               dict(args.service_account_annotations)),
                opts=common.child(self))
            self.service_account = sa.metadata.apply(lambda m: m.name)
        self.register_outputs({"service_account": self.service_account})
