"""Stack keys for data and versions on an object store: the version root, the
store's endpoint and region, and the credentials, either as Pulumi secrets (rendered into a
Kubernetes Secret the pods read as ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) or as
a workload identity (a ServiceAccount with the cloud's annotation, no keys at all).

``StorageKeys`` is a base of ``infra.config.StackConfig`` (its keys are stack keys like
any other: ``Pulumi.yaml`` declares them, ``infra.config_load.parse`` validates them);
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
        "", description="Workload identity instead of keys: annotations of the writers' ServiceAccounts (trainer, transfer), "
                        "comma-separated key=value (IRSA: eks.amazonaws.com/role-arn=arn:aws:iam::ACCOUNT:role/NAME; "
                        "GKE: iam.gke.io/gcp-service-account=NAME@PROJECT.iam.gserviceaccount.com). Not with "
                        "storageAccessKeyId. These are the writers' (trainer, transfer); the readers' are "
                        "storageReadServiceAccountAnnotations.")
    storage_read_service_account_annotations: Annotations = Field(
        "", description="Workload identity of the readers (cube agents, serving, pservers): annotations of their "
                        "ServiceAccounts, bound to a read-only role (docs/security.md#s3-policies); required with "
                        "storageServiceAccountAnnotations.")

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
    "storageReadAccessKeyId": ("Read-only object-store access key id of the readers (cube agents, serving, "
                               "pservers), from the object-store-read-credentials Secret; required with "
                               "storageAccessKeyId (the read-write pair goes only to the trainer and the transfer).", 0),
    "storageReadSecretAccessKey": ("Read-only object-store secret key of the readers, set with "
                                   "storageReadAccessKeyId.", 0),
}
#: Secret key name in the Kubernetes Secret -> stack secret key
SECRET_ENV = {"AWS_ACCESS_KEY_ID": "storageAccessKeyId", "AWS_SECRET_ACCESS_KEY": "storageSecretAccessKey"}
#: the read-only pair's stack keys, in SECRET_ENV's order
READ_SECRET_ENV = {"AWS_ACCESS_KEY_ID": "storageReadAccessKeyId", "AWS_SECRET_ACCESS_KEY": "storageReadSecretAccessKey"}


def problems(raw: Mapping[str, Any]) -> list[str]:
    """The rules across the storage secrets and keys, one message per problem (values of
    secrets hidden)."""
    out = []
    for pair in (SECRET_ENV, READ_SECRET_ENV):
        keys = [k for k in pair.values() if raw.get(k)]
        if len(keys) == 1:
            missing = next(k for k in pair.values() if k not in keys)
            out.append(f"{PROJECT}:{keys[0]}: [secret] is set without {missing}; allowed: both or neither")
    keys = [k for k in SECRET_ENV.values() if raw.get(k)]
    read_keys = [k for k in READ_SECRET_ENV.values() if raw.get(k)]
    if bool(keys) != bool(read_keys):
        missing = "storageReadAccessKeyId/storageReadSecretAccessKey" if keys else "storageAccessKeyId/storageSecretAccessKey"
        out.append(f"{PROJECT}:{missing.split('/')[0]}: [secret] is not set; allowed: set with {missing.split('/')[1]} "
                   f"whenever {'the read-write' if keys else 'the read-only'} pair is (readers and writers get "
                   "separate keys)")
    identity, read_identity = (bool(raw.get("storageServiceAccountAnnotations")),
                               bool(raw.get("storageReadServiceAccountAnnotations")))
    if identity != read_identity:
        key = "storageReadServiceAccountAnnotations" if identity else "storageServiceAccountAnnotations"
        out.append(f"{PROJECT}:{key}: '' is invalid; allowed: annotations, set whenever "
                   f"{'storageServiceAccountAnnotations' if identity else 'storageReadServiceAccountAnnotations'} "
                   "is (readers and writers get separate identities)")
    if (keys or read_keys) and (identity or read_identity):
        out.append(f"{PROJECT}:storageServiceAccountAnnotations: {raw['storageServiceAccountAnnotations']!r} is "
                   "invalid; allowed: empty when storageAccessKeyId/storageSecretAccessKey are set (keys or a "
                   "workload identity, not both)")
    return out


class StorageSecrets:
    """The storage secrets as secret Outputs (``None`` when not set): ``access_key_id``,
    ``secret_access_key`` (read-write), ``read_access_key_id``, ``read_secret_access_key``."""

    def __init__(self, config) -> None:
        self.access_key_id = config.get_secret("storageAccessKeyId") or None
        self.secret_access_key = config.get_secret("storageSecretAccessKey") or None

        self.read_access_key_id = config.get_secret("storageReadAccessKeyId") or None
        self.read_secret_access_key = config.get_secret("storageReadSecretAccessKey") or None

    def env_secrets(self) -> Optional[dict[str, Any]]:
        """The read-write pair: ``{"AWS_ACCESS_KEY_ID": Output, "AWS_SECRET_ACCESS_KEY": Output}``, or None."""
        if self.access_key_id is None or self.secret_access_key is None:
            return None
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    def read_env_secrets(self) -> Optional[dict[str, Any]]:
        """The read-only pair, as :meth:`env_secrets`, or None."""
        if self.read_access_key_id is None or self.read_secret_access_key is None:
            return None
        return {"AWS_ACCESS_KEY_ID": self.read_access_key_id, "AWS_SECRET_ACCESS_KEY": self.read_secret_access_key}
