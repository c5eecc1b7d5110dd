"""Stack keys for data and versions on an object store (issue 18): the version root, the
store's endpoint and region, and the credentials, either as Pulumi secrets (rendered into a
Kubernetes Secret the pods read as ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) or as
a workload identity (a ServiceAccount with the cloud's annotation, no keys at all).

``StorageKeys`` is a base of ``infra.config.StackConfig`` (its keys are stack keys like
any other: ``Pulumi.yaml`` declares them, ``infra.config.parse`` validates them);
``SECRETS`` joins ``infra.config.SECRETS`` and ``problems(raw)`` adds the rules that
involve them. The pods' environment follows botocore's standard variables
(``AWS_ENDPOINT_URL_S3``, ``AWS_DEFAULT_REGION``), which s3fs reads
(``runtime/objectstore.py``).
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config_types import check as _check

from runtime import objectstore

PROJECT = "elastic-ctr"
_ANNOTATION = re.compile(r"([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?=\S+")



def annotations(text: str) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` -> ``{"k1": "v1", "k2": "v2"}`` (empty text -> ``{}``)."""
    out = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


StoreRoot = Annotated[str, _check(lambda v: v == "" or objectstore.is_store(v),
                                  'empty (the file server) or an object-store location: s3://bucket/prefix, '
                                  'gs://bucket/prefix, hdfs://namenode:port/path, webhdfs://namenode:port/path')]
EndpointUrl = Annotated[str, _check(lambda v: v == "" or bool(re.fullmatch(r"https?://[A-Za-z0-9.-]+(:\d+)?/?", v)),
                                    "empty (the cloud's own endpoint) or http(s)://host[:port]")]
Region = Annotated[str, _check(lambda v: v == "" or bool(re.fullmatch(r"[a-z0-9-]{2,32}", v)),
                               "empty or a region name such as us-east-1")]
Annotations = Annotated[str, _check(lambda v: all(_ANNOTATION.fullmatch(p.strip())
                                                  for p in v.split(",") if p.strip()),
                                    "empty or comma-separated key=value annotations, e.g. "
                                    "eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/ctr")]


class StorageKeys(BaseModel):
    """The object-store keys of the stack (camelCase in Pulumi)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              protected_namespaces=())  # model_root is a stack key, not pydantic's

    model_root: StoreRoot = Field(
        "", description="Version root (donefiles, versions, cube shard tars) on an object store, e.g. "
                        "s3://bucket/ctr/model; the trainer publishes there, the transfer reads and publishes "
                        "there, agents and serving download from there, and the file server is not deployed. "
                        "Empty = the file server. dataSource may point at the same store (s3://bucket/ctr/hours).")
    storage_endpoint_url: EndpointUrl = Field(
        "", description="Endpoint of an S3-compatible store (MinIO, Ceph, OSS, BOS), set in the pods as "
                        "AWS_ENDPOINT_URL_S3; empty = AWS S3 itself.")
    storage_region: Region = Field("", description="Region of the store (AWS_DEFAULT_REGION in the pods); empty = "
                                                   "the SDK's default.")
    storage_service_account_annotations: Annotations = Field(
        "", description="Workload identity instead of keys: annotations of the ServiceAccount the pods run as, "
                        "comma-separated key=value (IRSA: eks.amazonaws.com/role-arn=arn:aws:iam::ACCOUNT:role/NAME; "
                        "GKE: iam.gke.io/gcp-service-account=NAME@PROJECT.iam.gserviceaccount.com). Not with "
                        "storageAccessKeyId.")

    def uses_store(self) -> bool:
        """True when the versions live on an object store (no file server)."""
        return bool(self.model_root)

    def env(self) -> dict[str, str]:
        """The plain (non-secret) environment of the pods that reach the store."""
        out = {}
        if self.storage_endpoint_url:
            out["AWS_ENDPOINT_URL_S3"] = self.storage_endpoint_url
        if self.storage_region:
            out["AWS_DEFAULT_REGION"] = self.storage_region
        return out


#: secret keys (description, minimum length): optional, set together, stored as secrets.
SECRETS: dict[str, tuple[str, int]] = {
    "storageAccessKeyId": ("Object-store access key id (pulumi config set --secret storageAccessKeyId ...); "
                           "reaches pods only as AWS_ACCESS_KEY_ID from the object-store-credentials Secret.", 0),
    "storageSecretAccessKey": ("Object-store secret key (pulumi config set --secret storageSecretAccessKey ...); "
                               "reaches pods only as AWS_SECRET_ACCESS_KEY from that Secret.", 0),
}
#: Secret key name in the Kubernetes Secret -> stack secret key
SECRET_ENV = {"AWS_ACCESS_KEY_ID": "storageAccessKeyId", "AWS_SECRET_ACCESS_KEY": "storageSecretAccessKey"}


def problems(raw: Mapping[str, Any]) -> list[str]:
    """The rules across the storage secrets and keys, one message per problem (values of
    secrets hidden)."""
    out = []
    keys = [k for k in SECRETS if raw.get(k)]
    if len(keys) == 1:
        missing = next(k for k in SECRETS if k not in keys)
        out.append(f"{PROJECT}:{keys[0]}: [secret] is set without {missing}; allowed: both or neither")
    if keys and raw.get("storageServiceAccountAnnotations"):
        out.append(f"{PROJECT}:storageServiceAccountAnnotations: {raw['storageServiceAccountAnnotations']!r} is "
                   "invalid; allowed: empty when storageAccessKeyId/storageSecretAccessKey are set (keys or a "
                   "workload identity, not both)")
    return out


class StorageSecrets:
    """The storage secrets as secret Outputs (``None`` when not set): ``access_key_id``,
    ``secret_access_key``."""

    def __init__(self, config) -> None:
        self.access_key_id = config.get_secret("storageAccessKeyId") or None
        self.secret_access_key = config.get_secret("storageSecretAccessKey") or None

    def env_secrets(self) -> Optional[dict[str, Any]]:
        """``{"AWS_ACCESS_KEY_ID": Output, "AWS_SECRET_ACCESS_KEY": Output}``, or None."""
        if self.access_key_id is None or self.secret_access_key is None:
            return None
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
