"""Credentials: one Secret per trust boundary of the stack (``runtime.role_specs``:
``CUBE_CONTROL``, ``FILES_WRITE``, ``FILES_READ``, ``TRACKING``), which the pods of the
roles that check or present it mount (``common.container``, ``common.credential_volumes``)
at ``CREDENTIALS_DIR/<boundary>``.

Named ``<name>-<boundary>`` (e.g. ``credentials-cube-control``). A token boundary's Secret
holds ``current`` and, while a rotation rolls out, ``previous`` (both accepted by the
checking role; docs/security.md has the steps); ``TRACKING``'s holds ``username`` and
``password`` (MLflow basic auth) and ``server-secret-key`` (the MLflow server's CSRF secret,
always generated). Each value is the user's (a secret stack key,
``infra.config_security.BOUNDARY_KEYS``), else a ``pulumi_random.RandomPassword`` of
``LENGTH`` alphanumeric characters made once per stack and kept, as a secret, in the stack's
state. Every value stays a Pulumi secret (redacted in the render).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from components import common
from components.common import TRACKING_FILES, DeployContext
from runtime.role_specs import CREDENTIAL_BOUNDARIES, TRACKING

#: characters of a generated credential ([A-Za-z0-9]: about 190 bits)
LENGTH = 32
#: the file (Secret key) of a token boundary's credential and of the one being rotated out
CURRENT, PREVIOUS = "current", "previous"
#: the files (Secret keys) of ``TRACKING``: the pipeline's MLflow user (the server's admin), and
#: the MLflow server's own CSRF secret (``--app-name basic-auth`` needs one), generated
(USERNAME, PASSWORD), SERVER_SECRET = TRACKING_FILES, "server-secret-key"


@dataclass(frozen=True)
class CredentialsArgs:
    """Inputs of :class:`Credentials`.

    Attributes:
        deployment: namespace, instance.
        boundaries: the trust boundaries the stack has (a subset of
            ``CREDENTIAL_BOUNDARIES``; e.g. no file-server ones without a file server).
        current: boundary -> the user's credential (secret Output) or None = generated.
        previous: boundary -> the credential being rotated out, or None.
        tracking_username: the MLflow user (``TRACKING``'s ``username``).
    """

    deployment: DeployContext
    boundaries: Sequence[str]
    current: Mapping[str, Optional[pulumi.Input[str]]] = field(default_factory=dict)
    previous: Mapping[str, Optional[pulumi.Input[str]]] = field(default_factory=dict)
    tracking_username: str = "elastic-ctr"


class Credentials(pulumi.ComponentResource):
    """Outputs: ``secrets`` (boundary -> the Secret's name: ``DeployContext.credentials``),
    ``values`` (boundary -> the current credential, a secret Output; e.g. the file server's
    upload token Secret uses ``FILES_WRITE``'s). Raises ``ValueError`` for a boundary not in
    ``CREDENTIAL_BOUNDARIES``."""

    secrets: dict[str, pulumi.Output[str]]
    values: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: CredentialsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:Credentials", name, None, opts)
        unknown = sorted(set(args.boundaries) - set(CREDENTIAL_BOUNDARIES))
        if unknown:
            raise ValueError(f"credentials: unknown trust boundaries {unknown} (known: {CREDENTIAL_BOUNDARIES})")
        dep = args.deployment
        self.secrets, self.values = {}, {}
        for boundary in args.boundaries:
            sec_name = f"{name}-{boundary}"
            value = args.current.get(boundary)
            if value is None:
                value = random.RandomPassword(sec_name, length=LENGTH, special=False, opts=common.child(self)).result
            value = pulumi.Output.secret(value)
            if boundary == TRACKING:
                server_secret = random.RandomPassword(f"{sec_name}-server", length=LENGTH, special=False,
                                                      opts=common.child(self)).result
                data = {USERNAME: pulumi.Output.from_input(args.tracking_username), PASSWORD: value,
                        SERVER_SECRET: pulumi.Output.secret(server_secret)}
            else:
                data = {CURRENT: value}
                if args.previous.get(boundary) is not None:
                    data[PREVIOUS] = pulumi.Output.secret(args.previous[boundary])
            sec = k8s.core.v1.Secret(
                sec_name, metadata=common.metadata(dep, sec_name, common.labels(dep, sec_name, "credentials")),
                type="Opaque", string_data=data, opts=common.child(self))
            self.secrets[boundary] = sec.metadata.apply(lambda m: m.name)
            self.values[boundary] = value
        self.register_outputs({"secrets": self.secrets})
