"""The package's components: the components of ``components/`` as a program in any Pulumi
language declares them (``elastic-ctr:index:<Name>``).

Each class here is the component of the same name (a subclass: the same type token, the
same children, the same Kubernetes objects) taking the language-neutral inputs of
``provider.args`` and turning them into the component's own arguments the way the Python
program (``infra/program.py``) turns the stack configuration into them. Its annotated
attributes are the component's outputs in the schema, each described by the docstring after
it (the SDK's analyzer reads both: no ``from __future__ import annotations`` here).
"""
import dataclasses
from pathlib import Path
from typing import Any, Optional

import pulumi

from components import (credentials, cube_cluster, cube_transfer, file_server, images, monitoring, network_policies,
                        object_store, serving, tracking_server, training_job)
from infra import config, config_gates, config_monitoring, config_security, config_storage
from infra.component_args import network_policy_keys, training_job_args
from infra.config import REPO_ROOT
from provider import keys, wiring
from provider.args import (CredentialsArgs, CubeClusterArgs, CubeTransferArgs, EnvVar, FileServerArgs, ImagesArgs,
                           MonitoringArgs, NetworkPoliciesArgs, ObjectStoreAccessArgs, ServingArgs, TrackingServerArgs,
                           TrainingJobArgs)
from runtime import dense_backends
from runtime.role_specs import CREDENTIAL_BOUNDARIES
from runtime.trainer.config import TrainConfigError


class Images(images.Images):
    """The trainer, cube, serving (and tracking) container images, built with Docker from
    elastic-ctr's Dockerfile and pushed to ``imageRegistry`` (not pushed without one);
    serving's from the ``serving-paddle`` target with ``denseBackend: paddle``."""

    trainer: pulumi.Output[str]
    """The trainer image's reference (a registry digest when pushed, else ``name:tag``)."""
    cube: pulumi.Output[str]
    """The cube image's reference (cube roles and the file server)."""
    serving: pulumi.Output[str]
    """The serving image's reference."""
    tracking: pulumi.Output[Optional[str]]
    """The tracking image's reference, when ``tracking`` is set."""

    def __init__(self, name: str, args: ImagesArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("ImagesArgs", args)
        super().__init__(name, images.ImagesArgs(
            repo_root=Path(args.get("context") or REPO_ROOT), registry=cfg.image_registry, tag=cfg.image_tag,
            username=cfg.registry_username or None, password=args.get("registry_password"),
            platform=cfg.build_platform, tracking=bool(args.get("tracking", False)),
            serving_target="serving-paddle" if cfg.dense_backend == dense_backends.PADDLE else "serving"), opts)


class Credentials(credentials.Credentials):
    """One Secret per trust boundary (``<name>-<boundary>``) holding its credential: the
    one given, else generated once per stack; the pods of the roles that check or present
    it mount it."""

    secrets: pulumi.Output[dict[str, str]]
    """Trust boundary -> the Secret's name: a ``Deployment``'s ``credentials``."""
    values: pulumi.Output[dict[str, str]]
    """Trust boundary -> its current credential (secret)."""

    def __init__(self, name: str, args: CredentialsArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("CredentialsArgs", args)
        secret = {key: args.get(keys.field_name(key)) for key in keys.KEYS["CredentialsArgs"] if keys.is_secret(key)}
        super().__init__(name, credentials.CredentialsArgs(
            deployment=wiring.deploy_context(args["deployment"], "Credentials"),
            boundaries=tuple(args.get("boundaries") or CREDENTIAL_BOUNDARIES),
            current={b: secret[cur] for b, (cur, _) in config_security.BOUNDARY_KEYS.items()},
            previous={b: secret[prev] if prev else None for b, (_, prev) in config_security.BOUNDARY_KEYS.items()},
            tracking_username=cfg.tracking_username), opts)


class ObjectStoreAccess(object_store.ObjectStoreAccess):
    """How the pods reach an object store holding the data and the versions: with keys, a
    Secret of the read-write pair (``<name>-credentials``, for the trainers and the transfer)
    and one of the read-only pair (``<name>-read-credentials``, for the readers); with a
    workload identity (the ``Deployment``'s ``identity``), none."""

    env: pulumi.Output[list[EnvVar]]
    """The writers' environment: a ``Deployment``'s ``storeEnv``."""
    read_env: pulumi.Output[list[EnvVar]]
    """The readers' environment: a ``Deployment``'s ``storeReadEnv``."""
    secret_name: pulumi.Output[Optional[str]]
    """The read-write pair's Secret (keys ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``)."""
    read_secret_name: pulumi.Output[Optional[str]]
    """The read-only pair's Secret (the same keys)."""

    def __init__(self, name: str, args: ObjectStoreAccessArgs,
                 opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("ObjectStoreAccessArgs", args)

        def pair(stack_keys: dict[str, str]) -> Optional[dict[str, Any]]:
            values = {var: args.get(keys.field_name(key)) for var, key in stack_keys.items()}
            return values if all(v is not None for v in values.values()) else None

        super().__init__(name, object_store.ObjectStoreAccessArgs(
            deployment=wiring.deploy_context(args["deployment"], "ObjectStoreAccess"), env=cfg.env(),
            secret_env=pair(config_storage.SECRET_ENV), read_secret_env=pair(config_storage.READ_SECRET_ENV)), opts)
        self.secret_name, self.read_secret_name = _secret_name(self.env), _secret_name(self.read_env)
        self.env, self.read_env = [_env_var(e) for e in self.env], [_env_var(e) for e in self.read_env]


def _env_var(e) -> dict[str, Any]:
    """An ``EnvVarArgs`` as the schema's ``EnvVar`` (camelCase keys)."""
    if e.value_from is None:
        return {"name": e.name, "value": e.value}
    ref = e.value_from.secret_key_ref
    return {"name": e.name, "secretName": ref.name, "secretKey": ref.key}


def _secret_name(env) -> Optional[pulumi.Input[str]]:
    """The Secret the entries of ``env`` read from, or None when none does."""
    return next((e.value_from.secret_key_ref.name for e in env if e.value_from is not None), None)


class FileServer(file_server.FileServer):
    """The file server hosting what training produced (versions, donefiles, shard tars):
    a Deployment of one pod on a PersistentVolumeClaim, its Service (LoadBalancer with
    ``exposeFileServer``) and the upload token's Secret."""

    url: pulumi.Output[str]
    """In-cluster URL: the version root of the other components."""
    external_url: pulumi.Output[str]
    """The LoadBalancer's URL when exposed (once assigned), else ``url``."""
    token_secret: pulumi.Output[str]
    """The Secret holding the upload token."""
    token_key: pulumi.Output[str]
    """Its key."""

    def __init__(self, name: str, args: FileServerArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("FileServerArgs", args)
        super().__init__(name, file_server.FileServerArgs(
            deployment=wiring.deploy_context(args["deployment"], "FileServer"), image=args["image"],
            upload_token=args["upload_token"], cpu=cfg.file_server_cpu, memory=cfg.file_server_memory,
            storage_size=cfg.file_server_storage_size, storage_class=cfg.storage_class or None,
            expose=cfg.expose_file_server, source_ranges=cfg.source_ranges()), opts)


class TrackingServer(tracking_server.TrackingServer):
    """An MLflow tracking server the training job and the cube transfer log to: a
    Deployment of one pod, its Service and, unless both stores are elsewhere, a claim."""

    url: pulumi.Output[str]
    """In-cluster URL (``MLFLOW_TRACKING_URI`` of the trainers and the transfer)."""

    def __init__(self, name: str, args: TrackingServerArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("TrackingServerArgs", args)
        super().__init__(name, tracking_server.TrackingServerArgs(
            deployment=wiring.deploy_context(args["deployment"], "TrackingServer"), image=args["image"],
            cpu=cfg.tracking_cpu, memory=cfg.tracking_memory, storage_size=cfg.tracking_storage_size,
            storage_class=cfg.storage_class or None, backend_store_uri=args.get("tracking_backend_store_uri"),
            artifacts_destination=cfg.tracking_artifacts_destination or None), opts)


class TrainingJob(training_job.TrainingJob):
    """PaddlePaddle parameter-server training as one gang-scheduled Volcano Job (tasks
    ``pserver`` and ``trainer``) and the ReadWriteMany claim its pods share."""

    job_name: pulumi.Output[str]
    """The Volcano Job's name."""
    min_available: pulumi.Output[int]
    """Its ``minAvailable``: pservers + trainers."""
    shared_claim: pulumi.Output[str]
    """The shared claim's name."""

    def __init__(self, name: str, args: TrainingJobArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("TrainingJobArgs", args)
        try:
            cfg.train_config()
        except TrainConfigError as exc:
            errors = [{"property_path": config.KEY_OF.get(p.field, p.field),
                       "reason": p.render(lambda f: config.KEY_OF.get(f, f))} for p in exc.problems]
            raise pulumi.InputPropertiesError("TrainingJob: " + "; ".join(e["reason"] for e in errors), errors)
        dep = wiring.deploy_context(args["deployment"], "TrainingJob")
        super().__init__(name, training_job_args(
            cfg, deployment=dep, image=args["image"], output=args["version_root"],
            upload_token_secret=args.get("upload_token_secret"),
            upload_token_key=args.get("upload_token_key", file_server.TOKEN_KEY),
            tracking_uri=args.get("tracking_uri"),
            tracking_job=args.get("tracking_job") or f"{dep.instance}-{name}"), opts)


class CubeCluster(cube_cluster.CubeCluster):
    """The cube: ``cubeShards`` StatefulSets (layout ``<name>-<shards>s``) of
    ``cubeReplicas`` pods each (a cube server and its agent), their headless Services and
    PodDisruptionBudgets, and the topology ConfigMap the transfer and serving mount."""

    topology: pulumi.Output[dict[str, Any]]
    """The topology document (``topology.json``): every shard's replica addresses."""
    topology_configmap: pulumi.Output[str]
    """The topology ConfigMap's name."""
    topology_checksum: pulumi.Output[str]
    """The sha256 of ``topology.json``."""

    def __init__(self, name: str, args: CubeClusterArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("CubeClusterArgs", args)
        super().__init__(name, cube_cluster.CubeClusterArgs(
            deployment=wiring.deploy_context(args["deployment"], "CubeCluster"), image=args["image"],
            shards=cfg.cube_shards, replicas=cfg.cube_replicas,
            server_cpu=cfg.cube_server_cpu, server_memory=cfg.cube_server_memory,
            agent_cpu=cfg.cube_agent_cpu, agent_memory=cfg.cube_agent_memory,
            data_size=cfg.cube_data_size, version_root=args.get("version_root")), opts)


class CubeTransfer(cube_transfer.CubeTransfer):
    """The cube transfer: watches the donefile and rolls each version out to every shard
    x replica (a Deployment of one pod, its state claim and Service)."""

    url: pulumi.Output[str]
    """In-cluster base URL (serving's ``transferUrl``)."""
    status_url: pulumi.Output[str]
    """The served version's status (``/dict/info``)."""

    def __init__(self, name: str, args: CubeTransferArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("CubeTransferArgs", args)
        super().__init__(name, cube_transfer.CubeTransferArgs(
            deployment=wiring.deploy_context(args["deployment"], "CubeTransfer"), image=args["image"],
            topology_configmap=args["topology_configmap"], topology_checksum=args["topology_checksum"],
            root=args["version_root"], upload_token_secret=args.get("upload_token_secret"),
            upload_token_key=args.get("upload_token_key", file_server.TOKEN_KEY),
            cpu=cfg.transfer_cpu, memory=cfg.transfer_memory,
            state_size=cfg.transfer_storage_size, storage_class=cfg.storage_class or None,
            pin_version=cfg.pin_version(), keep_versions=cfg.keep_versions,
            gate_args=config_gates.transfer_argv(cfg), tracking_uri=args.get("tracking_uri"),
            tracking_experiment=cfg.tracking_experiment, tracking_job=args.get("tracking_job")), opts)


class Serving(serving.Serving):
    """Serving: the Open Inference Protocol v2 over REST and gRPC (a Deployment, its
    Service, and with ``servingMaxReplicas`` a HorizontalPodAutoscaler)."""

    url: pulumi.Output[str]
    """In-cluster REST base URL."""
    grpc_target: pulumi.Output[str]
    """In-cluster ``host:port`` of the gRPC endpoint."""
    autoscaled: pulumi.Output[bool]
    """Whether a HorizontalPodAutoscaler scales the Deployment."""

    def __init__(self, name: str, args: ServingArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("ServingArgs", args)
        super().__init__(name, serving.ServingArgs(
            deployment=wiring.deploy_context(args["deployment"], "Serving"), image=args["image"],
            topology_configmap=args["topology_configmap"], topology_checksum=args["topology_checksum"],
            model_root=args["version_root"], transfer_url=args["transfer_url"], replicas=cfg.serving_replicas,
            max_replicas=cfg.serving_max_replicas, target_cpu_utilization=cfg.serving_target_cpu_utilization,
            autoscale_metric=cfg.serving_autoscale_metric, target_inflight=cfg.serving_target_inflight,
            workers=cfg.serving_workers, dense_backend=cfg.dense_backend, data_format=cfg.data_format,
            slot_file=cfg.slot_file or None,
            cpu=cfg.serving_cpu, memory=cfg.serving_memory), opts)


class NetworkPolicies(network_policies.NetworkPolicies):
    """NetworkPolicies: every pod of the stack denies ingress but for the pipeline's flows
    (with ``networkPolicyEgress``, egress too but for them, DNS and ``egressCidrs``)."""

    def __init__(self, name: str, args: NetworkPoliciesArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("NetworkPoliciesArgs", args)
        dep = wiring.deploy_context(args["deployment"], "NetworkPolicies")
        parts = args["parts"]
        super().__init__(name, network_policies.NetworkPoliciesArgs(
            deployment=dep, task_label=training_job.TASK_LABEL, cube_selector=wiring.every_shard(dep),
            transfer_selector=wiring.part_pods(dep, parts, "cube_transfer"),
            serving_selector=wiring.part_pods(dep, parts, "serving"),
            job_selector=wiring.part_pods(dep, parts, "training_job"),
            files_selector=wiring.part_pods(dep, parts, "file_server"),
            tracking_selector=wiring.part_pods(dep, parts, "tracking_server"),
            **network_policy_keys(cfg)), opts)


class Monitoring(monitoring.Monitoring):
    """How a cluster's Prometheus finds every role's metrics (a ServiceMonitor or PodMonitor
    per role with ``monitoring: prometheus-operator``), the SLO alerts' PrometheusRule and the
    Grafana dashboards' ConfigMaps."""

    monitors: pulumi.Output[list[str]]
    """The ServiceMonitors' and PodMonitors' names."""
    rule: pulumi.Output[Optional[str]]
    """The PrometheusRule's name, with ``monitoring: prometheus-operator``."""
    dashboards: pulumi.Output[list[str]]
    """The dashboards' ConfigMaps' names."""

    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        cfg = keys.stack_config("MonitoringArgs", args)
        dep = wiring.deploy_context(args["deployment"], "Monitoring")
        super().__init__(name, monitoring.MonitoringArgs(
            deployment=dep, mode=cfg.monitoring, targets=wiring.scrape_targets(dep, args["parts"]),
            labels=config_monitoring.labels(cfg.monitoring_labels),
            thresholds=dataclasses.replace(cfg.thresholds(), pserver_budget_rows=cfg.pserver_budget_rows,
                                           cube_shard_budget_keys=cfg.cube_shard_budget_keys),
            runbook_url=cfg.monitoring_runbook_url, dashboards=cfg.grafana_dashboards), opts)


#: every component of the package, in the order of the stack configuration reference's parts
COMPONENTS: tuple[type[pulumi.ComponentResource], ...] = (
    Images, Credentials, ObjectStoreAccess, FileServer, TrackingServer, TrainingJob, CubeCluster, CubeTransfer,
    Serving, NetworkPolicies, Monitoring)
