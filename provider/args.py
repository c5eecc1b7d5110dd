"""The inputs of the package's components, as a program in any Pulumi language sends them.

Each args class is a ``TypedDict`` (the provider hands a component its inputs as a dict
with these snake_case keys; the schema names them in camelCase). Its base
``keyed(<class name>)`` holds the inputs that are stack keys (``provider.keys``: type,
default, allowed values and description from the stack configuration); the attributes
below it are the other inputs, each with its type and, in the docstring after it, its
description (the SDK's analyzer reads both: no ``from __future__ import annotations`` here).

An input that decides what a component declares (a count, a mode, a name) is a plain
value; one that only flows into the declared objects (a namespace, an image, a URL, a
secret) is an ``Input``, so another resource's output can be passed. Structure that the
Python program hands from one component to the next (pod selectors, scrape targets) is
named here by the components' names (``Parts``): a remote component's outputs are known to
another component only after it is declared.
"""
from typing import NotRequired, TypedDict

import pulumi

from provider.keys import keyed


class EnvVar(TypedDict):
    """An environment variable of the pods: a plain value, or a key of a Secret
    (``secretKeyRef``)."""

    name: str
    """The variable's name, e.g. ``AWS_ENDPOINT_URL_S3``."""
    value: NotRequired[pulumi.Input[str]]
    """Its value (not with ``secretName``)."""
    secret_name: NotRequired[pulumi.Input[str]]
    """The Secret the value is read from (``ObjectStoreAccess.secretName`` or
    ``readSecretName``), instead of ``value``."""
    secret_key: NotRequired[str]
    """The key in that Secret; default: the variable's name."""


class Deployment(keyed("Deployment")):
    """Where and as what a component deploys, the same for every component of a stack."""

    namespace: pulumi.Input[str]
    """The Kubernetes namespace of every object (a DNS-1123 label): pass the Namespace's
    ``metadata.name`` so every object depends on it."""
    instance: str
    """The ``app.kubernetes.io/instance`` label of every object, ``elastic-ctr-<stack>`` in
    the Python program; the pod selectors include it."""
    image_pull_secrets: NotRequired[list[pulumi.Input[str]]]
    """Names of ``kubernetes.io/dockerconfigjson`` Secrets the pods pull their images with;
    default: none."""
    store_env: NotRequired[list[EnvVar]]
    """Environment of the containers that write to an object store (the trainers, the
    transfer): endpoint, region and the read-write keys; default: none."""
    store_read_env: NotRequired[list[EnvVar]]
    """The same for the containers that only read (cube agents, serving, pservers), with the
    read-only keys; default: none."""
    identity: NotRequired[dict[str, dict[str, str]]]
    """Workload identity: ``read`` / ``write`` -> annotations of the ServiceAccounts of the
    pods that reach the object store that way (e.g. ``eks.amazonaws.com/role-arn``);
    default: none."""
    credentials: NotRequired[pulumi.Input[dict[str, str]]]
    """Trust boundary (``cube-control``, ``fileserver-write``, ``fileserver-read``,
    ``tracking``) -> name of the Secret holding its credential: the ``secrets`` output of
    ``Credentials``, which has every boundary. A pod mounts those its role needs: required
    by the components that run pods (``FileServer``, ``TrackingServer``, ``TrainingJob``,
    ``CubeCluster``, ``CubeTransfer``, ``Serving``)."""
    scrape_annotations: NotRequired[bool]
    """Put ``prometheus.io/scrape``, ``port`` and ``path`` annotations on the pod templates
    (for ``monitoring: annotations``); default: false."""


class Parts(TypedDict):
    """The stack's components, by the names they were declared with: their pods' selectors
    (``app.kubernetes.io/name`` and ``instance``) and metrics endpoints follow from them.
    The cube's pods are selected by their role (``cube-server``), whatever the cube's name."""

    cube_transfer: str
    """The ``CubeTransfer``'s name."""
    serving: str
    """The ``Serving``'s name."""
    training_job: str
    """The ``TrainingJob``'s name."""
    file_server: NotRequired[str]
    """The ``FileServer``'s name; absent when the versions live on an object store."""
    tracking_server: NotRequired[str]
    """The ``TrackingServer``'s name; absent when the stack has none."""


class ImagesArgs(keyed("ImagesArgs")):
    """Inputs of ``Images``."""

    context: NotRequired[str]
    """Build context: a checkout of elastic-ctr (its ``Dockerfile`` and ``.dockerignore``);
    default: the package's own source directory."""
    tracking: NotRequired[bool]
    """Also build the ``tracking`` image (the MLflow server), for a stack with a
    ``TrackingServer``; default: false."""


class CredentialsArgs(keyed("CredentialsArgs")):
    """Inputs of ``Credentials``: a credential not set is generated once per stack."""

    deployment: Deployment
    """Where the Secrets go (namespace, instance)."""
    boundaries: NotRequired[list[str]]
    """The trust boundaries to hold a Secret for; default: all four (``cube-control``,
    ``fileserver-write``, ``fileserver-read``, ``tracking``), as the Python program has."""


class ObjectStoreAccessArgs(keyed("ObjectStoreAccessArgs")):
    """Inputs of ``ObjectStoreAccess``: the keys' Secrets of a stack whose versions live on
    an object store (the ``Deployment``'s ``storeEnv`` / ``storeReadEnv`` read them)."""

    deployment: Deployment
    """Where the Secrets go (namespace, instance)."""


class FileServerArgs(keyed("FileServerArgs")):
    """Inputs of ``FileServer``."""

    deployment: Deployment
    """Namespace, instance, pull secrets, credentials."""
    image: pulumi.Input[str]
    """The cube image's reference (``Images.cube``: the file server is one of its roles)."""


class TrackingServerArgs(keyed("TrackingServerArgs")):
    """Inputs of ``TrackingServer``."""

    deployment: Deployment
    """Namespace, instance, pull secrets, credentials (with ``tracking``'s, MLflow's basic
    authentication is on)."""
    image: pulumi.Input[str]
    """The tracking image's reference (``Images.tracking``)."""


class TrainingJobArgs(keyed("TrainingJobArgs")):
    """Inputs of ``TrainingJob``."""

    deployment: Deployment
    """Namespace, instance, pull secrets, credentials, object-store environment."""
    image: pulumi.Input[str]
    """The trainer image's reference (``Images.trainer``)."""
    version_root: pulumi.Input[str]
    """ROOT the trainer exports versions and donefiles to: the ``FileServer``'s ``url``, or
    an object-store location."""
    upload_token_secret: NotRequired[pulumi.Input[str]]
    """The Secret holding the file server's upload token (``FileServer.tokenSecret``);
    absent when the version root is an object store."""
    upload_token_key: NotRequired[pulumi.Input[str]]
    """Its key (``FileServer.tokenKey``); default: ``token``."""
    tracking_uri: NotRequired[pulumi.Input[str]]
    """``MLFLOW_TRACKING_URI`` of the trainers: the ``TrackingServer``'s ``url`` or an
    external server; absent = no tracking."""
    tracking_job: NotRequired[str]
    """The job's name in MLflow (``ELASTIC_CTR_JOB``: the parent run of the trainers' and the
    transfer's runs); default: ``<instance>-<name>``."""


class CubeClusterArgs(keyed("CubeClusterArgs")):
    """Inputs of ``CubeCluster``."""

    deployment: Deployment
    """Namespace, instance, pull secrets, credentials, object-store environment."""
    image: pulumi.Input[str]
    """The cube image's reference (``Images.cube``)."""
    version_root: NotRequired[pulumi.Input[str]]
    """ROOT of the versions (the ``FileServer``'s ``url`` or the object-store location): the
    agents download only under ``ROOT/cube/``, where the transfer publishes; absent = the
    agent's own default."""


class CubeTransferArgs(keyed("CubeTransferArgs")):
    """Inputs of ``CubeTransfer``. Declare it with ``dependsOn`` the ``CubeCluster``: a
    topology change reaches it once every cube pod is ready."""

    deployment: Deployment
    """Namespace, instance, pull secrets, credentials, object-store environment."""
    image: pulumi.Input[str]
    """The cube image's reference (``Images.cube``)."""
    topology_configmap: pulumi.Input[str]
    """The ConfigMap holding ``topology.json`` (``CubeCluster.topologyConfigmap``)."""
    topology_checksum: pulumi.Input[str]
    """Its sha256 (``CubeCluster.topologyChecksum``): a new topology rolls the pod."""
    version_root: pulumi.Input[str]
    """ROOT of the versions and donefiles (the ``FileServer``'s ``url`` or the object-store
    location)."""
    upload_token_secret: NotRequired[pulumi.Input[str]]
    """The Secret holding the file server's upload token (``FileServer.tokenSecret``), for
    publishing the shard tars; absent when the version root is an object store."""
    upload_token_key: NotRequired[pulumi.Input[str]]
    """Its key (``FileServer.tokenKey``); default: ``token``."""
    tracking_uri: NotRequired[pulumi.Input[str]]
    """``MLFLOW_TRACKING_URI`` of the transfer (each rollout's phases and seconds); absent =
    no tracking."""
    tracking_job: NotRequired[str]
    """The training job's name in MLflow (``TrainingJob``'s ``trackingJob``): the transfer's
    runs are children of its run; absent = none."""


class ServingArgs(keyed("ServingArgs")):
    """Inputs of ``Serving``. Declare it with ``dependsOn`` the ``CubeCluster`` and the
    ``CubeTransfer``: serving rolls to a new topology only after both were awaited."""

    deployment: Deployment
    """Namespace, instance, pull secrets, credentials, object-store environment."""
    image: pulumi.Input[str]
    """The serving image's reference (``Images.serving``)."""
    topology_configmap: pulumi.Input[str]
    """The ConfigMap holding ``topology.json`` (``CubeCluster.topologyConfigmap``)."""
    topology_checksum: pulumi.Input[str]
    """Its sha256 (``CubeCluster.topologyChecksum``): a new topology rolls the pods."""
    version_root: pulumi.Input[str]
    """ROOT of the versions (the ``FileServer``'s ``url`` or the object-store location)."""
    transfer_url: pulumi.Input[str]
    """Base URL of the cube transfer (``CubeTransfer.url``): which version is laid out."""


class NetworkPoliciesArgs(keyed("NetworkPoliciesArgs")):
    """Inputs of ``NetworkPolicies``."""

    deployment: Deployment
    """Namespace and instance (the policies select the stack's pods by it)."""
    parts: Parts
    """The components whose pods the policies select, by name."""


class MonitoringArgs(keyed("MonitoringArgs")):
    """Inputs of ``Monitoring``."""

    deployment: Deployment
    """Namespace and instance."""
    parts: Parts
    """The components whose metrics are scraped, by name (a ServiceMonitor or PodMonitor
    per role with ``monitoring: prometheus-operator``)."""
