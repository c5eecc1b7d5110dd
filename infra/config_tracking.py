"""Stack keys for MLflow tracking: the tracking server in the stack (on by default,
off with ``trackingServer: false``), its resources and stores, or an external server's URI,
and the experiment the training job and the cube transfer log to (``runtime.tracking``).

``TrackingKeys`` is a base of ``infra.config.StackConfig`` (its keys are stack keys like any
other: ``Pulumi.yaml`` declares them, ``infra.config_load.parse`` validates them); ``SECRETS``
joins ``infra.config.SECRETS`` (``trackingBackendStoreUri``: a database URI holds a
password) and ``TrackingSecrets`` reads it as a secret Output.

``tracking_uri(cfg, server_url)``: the URI the pods get (``MLFLOW_TRACKING_URI``): the
stack's server, else ``trackingUri``, else none (no tracking).
"""
from __future__ import annotations

import re
from typing import Annotated, Optional

import pulumi
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config_types import check as _check, pulumi_bool as _pulumi_bool




HttpUri = Annotated[str, _check(lambda v: v == "" or bool(re.fullmatch(r"https?://[A-Za-z0-9.-]+(:\d+)?(/\S*)?", v)),
                                "empty or an MLflow server's http(s)://host[:port][/path]")]
ArtifactUri = Annotated[str, _check(lambda v: v == "" or bool(re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", v)),
                                    "empty (the server's volume) or a URI such as s3://bucket/mlflow")]
Experiment = Annotated[str, _check(lambda v: 0 < len(v) <= 200 and v.strip() == v,
                                   "an experiment name, 1-200 characters, no surrounding spaces")]
Quantity = Annotated[str, _check(lambda v: bool(re.fullmatch(r"\d+(\.\d+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?", v)),
                                 "a Kubernetes quantity (e.g. 500m, 1Gi)")]

#: secret keys: (description, minimum length)
SECRETS: dict[str, tuple[str, int]] = {
    "trackingBackendStoreUri": (
        "Database URI of the tracking server's backend store (e.g. postgresql://user:password@host:5432/mlflow; "
        "pulumi config set --secret trackingBackendStoreUri ...); reaches the server's pod only through a Secret. "
        "Empty = SQLite on the server's volume.", 0),
}


class TrackingKeys(BaseModel):
    """The tracking keys of the stack (camelCase in Pulumi)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    tracking_server: Annotated[bool, BeforeValidator(_pulumi_bool)] = Field(
        True, description="Deploy an MLflow tracking server (the tracking image) that the training job and the cube "
                          "transfer log to (MLFLOW_TRACKING_URI); false = none (trackingUri may name an external one).")
    tracking_uri: HttpUri = Field(
        "", description="An external MLflow server the pods log to when trackingServer is false; empty = no tracking "
                        "then.")
    tracking_experiment: Experiment = Field(
        "elastic-ctr", description="MLflow experiment of the training job's and the transfer's runs "
                                   "(MLFLOW_EXPERIMENT_NAME).")
    tracking_artifacts_destination: ArtifactUri = Field(
        "", description="Where the tracking server stores artifacts (e.g. s3://bucket/mlflow); empty = its volume.")
    tracking_storage_size: Quantity = Field(
        "5Gi", description="Size of the tracking server's volume (SQLite backend store and artifacts).")
    tracking_cpu: Quantity = Field("500m", description="CPU of the tracking server.")
    tracking_memory: Quantity = Field("1Gi", description="Memory of the tracking server.")


class TrackingSecrets:
    """``backend_store_uri``: the ``trackingBackendStoreUri`` secret Output, or None."""

    def __init__(self, config: pulumi.Config):
        self.backend_store_uri = config.get_secret("trackingBackendStoreUri") or None


def tracking_uri(cfg: TrackingKeys, server_url: Optional[pulumi.Input[str]]) -> Optional[pulumi.Input[str]]:
    """The URI the logging pods get: the stack's server's, else ``trackingUri``, else None."""
    if cfg.tracking_server:
        return server_url
    return cfg.tracking_uri or None
