"""The Pulumi program: validated stack config -> components -> stack outputs.

``build()`` declares everything and returns the stack outputs; ``infra/__main__.py``
exports them under ``pulumi up``, and ``infra/render.py`` runs it under mocks. The
components are named so that the dev stack's Kubernetes names read as the roles do
(``fileserver``, ``cube-<N>s-shard-<i>``, ``cube-transfer``, ``serving``, ``ctr-train``).

Order under ``pulumi up`` (explicit ``depends_on`` besides the data flow): the cube
layout's StatefulSets -> the transfer's Deployment -> serving's Deployment; resources
that left the program (an old cube layout) are deleted after all of them.
"""
from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from components import (CubeCluster, CubeClusterArgs, CubeTransfer, CubeTransferArgs, DeployContext, FileServer,
                        FileServerArgs, Images, ImagesArgs, Monitoring, MonitoringArgs, Serving, ServingArgs,
                        TrackingServer, TrackingServerArgs, TrainingJob, common)
from components.credentials import Credentials, CredentialsArgs
from components.network_policies import NetworkPolicies, NetworkPoliciesArgs
from components.training_job import TASK_LABEL
from components.object_store import ObjectStoreAccess, ObjectStoreAccessArgs
from infra import config_gates, config_monitoring, config_tracking
from infra.component_args import network_policy_keys, training_job_args
from infra.config import PROJECT, REPO_ROOT, StackConfig
from infra.config_load import Secrets, load
from infra.config_storage import annotations
from runtime import dense_backends
from runtime.role_specs import CREDENTIAL_BOUNDARIES

REGISTRY_SECRET = "registry-credentials"
TRAINING_JOB = "ctr-train"
#: the namespace's Pod Security Standards labels: every pod must pass ``restricted``
POD_SECURITY = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")}


def build(config: Optional[tuple[StackConfig, Secrets]] = None) -> dict[str, Any]:
    """Declares every resource of the stack; returns the stack outputs (name -> Input).

    Args:
        config: validated config and secrets; ``None`` = read and validate the running
            stack's (raises :class:`infra.config.ConfigError` before anything is declared).
    """
    cfg, secrets = load() if config is None else config
    instance = f"{PROJECT}-{pulumi.get_stack()}"

    images = Images("images", ImagesArgs(
        repo_root=REPO_ROOT, registry=cfg.image_registry, tag=cfg.image_tag,
        username=cfg.registry_username or None, password=secrets.registry_password,
        platform=cfg.build_platform, tracking=cfg.tracking_server,
        serving_target="serving-paddle" if cfg.dense_backend == dense_backends.PADDLE else "serving"))

    ns = k8s.core.v1.Namespace(
        cfg.namespace,
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=cfg.namespace,
            labels={**common.labels(DeployContext(namespace=cfg.namespace, instance=instance), PROJECT, "namespace"),
                    **POD_SECURITY}))
    namespace = ns.metadata.apply(lambda m: m.name)
    pull_secrets: tuple[pulumi.Input[str], ...] = ()
    if secrets.registry_password is not None:
        ctx = DeployContext(namespace=namespace, instance=instance)
        sec = k8s.core.v1.Secret(
            REGISTRY_SECRET,
            metadata=common.metadata(ctx, REGISTRY_SECRET, common.labels(ctx, REGISTRY_SECRET, "images")),
            type="kubernetes.io/dockerconfigjson",
            string_data={".dockerconfigjson": secrets.registry_password.apply(
                lambda pw: _dockerconfig(cfg.image_registry, cfg.registry_username, pw))})
        pull_secrets = (sec.metadata.apply(lambda m: m.name),)
    scrape = cfg.monitoring == "annotations"
    dep = DeployContext(namespace=namespace, instance=instance, image_pull_secrets=pull_secrets,
                        image_pull_policy=cfg.image_pull_policy, scrape_annotations=scrape)
    storage_class = cfg.storage_class or None
    store_env: tuple = ()
    store_read_env: tuple = ()
    store_secrets = secrets.storage.env_secrets()
    if cfg.env() or store_secrets:
        store = ObjectStoreAccess("object-store", ObjectStoreAccessArgs(
            deployment=dep, env=cfg.env(), secret_env=store_secrets,
            read_secret_env=secrets.storage.read_env_secrets()))
        store_env, store_read_env = tuple(store.env), tuple(store.read_env)
    # a Secret per trust boundary, whatever the stack deploys: a role's spec lists the boundaries it
    # may use (e.g. the trainer FILES_WRITE with the versions on an object store too)
    creds = Credentials("credentials", CredentialsArgs(
        deployment=dep, boundaries=CREDENTIAL_BOUNDARIES, current=secrets.credentials.current,
        previous=secrets.credentials.previous, tracking_username=cfg.tracking_username))
    dep = DeployContext(namespace=namespace, instance=instance, image_pull_secrets=pull_secrets,
                        image_pull_policy=cfg.image_pull_policy, store_env=store_env, store_read_env=store_read_env,
                        identity={common.WRITE: annotations(cfg.storage_service_account_annotations),
                                  common.READ: annotations(cfg.storage_read_service_account_annotations)},
                        credentials=creds.secrets, scrape_annotations=scrape)

    files = None if cfg.uses_store() else FileServer("fileserver", FileServerArgs(
        deployment=dep, image=images.cube, upload_token=secrets.upload_token,
        cpu=cfg.file_server_cpu, memory=cfg.file_server_memory,
        storage_size=cfg.file_server_storage_size, storage_class=storage_class,
        expose=cfg.expose_file_server, source_ranges=cfg.source_ranges()))
    # the version root: the file server, or the object store (then nothing uploads with a token)
    root = files.url if files else cfg.model_root
    token_secret, token_key = (files.token_secret, files.token_key) if files else (None, "")
    tracker = TrackingServer("tracking", TrackingServerArgs(
        deployment=dep, image=images.tracking, cpu=cfg.tracking_cpu, memory=cfg.tracking_memory,
        storage_size=cfg.tracking_storage_size, storage_class=storage_class,
        backend_store_uri=secrets.tracking.backend_store_uri,
        artifacts_destination=cfg.tracking_artifacts_destination or None)) if cfg.tracking_server else None
    track = {"tracking_uri": config_tracking.tracking_uri(cfg, tracker.url if tracker else None),
             "tracking_experiment": cfg.tracking_experiment,
             # one job's name for the trainers' runs and the transfer's (a child of the job's run)
             "tracking_job": f"{instance}-{TRAINING_JOB}"}

    training = TrainingJob(TRAINING_JOB, training_job_args(
        cfg, deployment=dep, image=images.trainer, output=root, upload_token_secret=token_secret,
        upload_token_key=token_key, tracking_uri=track["tracking_uri"],
        tracking_job=track["tracking_job"]))

    cube = CubeCluster("cube", CubeClusterArgs(
        deployment=dep, image=images.cube, shards=cfg.cube_shards, replicas=cfg.cube_replicas,
        server_cpu=cfg.cube_server_cpu, server_memory=cfg.cube_server_memory,
        agent_cpu=cfg.cube_agent_cpu, agent_memory=cfg.cube_agent_memory,
        data_size=cfg.cube_data_size, version_root=root))

    transfer = CubeTransfer("cube-transfer", CubeTransferArgs(
        deployment=dep, image=images.cube, topology_configmap=cube.topology_configmap,
        topology_checksum=cube.topology_checksum, root=root,
        upload_token_secret=token_secret, upload_token_key=token_key,
        cpu=cfg.transfer_cpu, memory=cfg.transfer_memory,
        state_size=cfg.transfer_storage_size, storage_class=storage_class,
        pin_version=cfg.pin_version(), keep_versions=cfg.keep_versions,
        wait_for=cube.statefulsets, gate_args=config_gates.transfer_argv(cfg), **track))

    serving = Serving("serving", ServingArgs(
        deployment=dep, image=images.serving, topology_configmap=cube.topology_configmap,
        topology_checksum=cube.topology_checksum, model_root=root,
        transfer_url=transfer.url, replicas=cfg.serving_replicas,
        max_replicas=cfg.serving_max_replicas,
        target_cpu_utilization=cfg.serving_target_cpu_utilization,
        autoscale_metric=cfg.serving_autoscale_metric, target_inflight=cfg.serving_target_inflight,
        workers=cfg.serving_workers, dense_backend=cfg.dense_backend, data_format=cfg.data_format,
        slot_file=cfg.slot_file or None, cpu=cfg.serving_cpu, memory=cfg.serving_memory,
        wait_for=[*cube.statefulsets, transfer.deployment]))

    if cfg.network_policies:
        NetworkPolicies("network", NetworkPoliciesArgs(
            deployment=dep, task_label=TASK_LABEL, cube_selector=cube.every_shard, transfer_selector=transfer.selector,
            serving_selector=serving.selector, job_selector=training.selector,
            files_selector=files.selector if files else None, tracking_selector=tracker.selector if tracker else None,
            **network_policy_keys(cfg)))

    monitoring = Monitoring("monitoring", MonitoringArgs(
        deployment=dep, mode=cfg.monitoring,
        targets=[*(files.scrape_targets if files else []), *cube.scrape_targets, *transfer.scrape_targets,
                 *serving.scrape_targets, *training.scrape_targets],
        labels=config_monitoring.labels(cfg.monitoring_labels),
        thresholds=dataclasses.replace(cfg.thresholds(), pserver_budget_rows=cfg.pserver_budget_rows,
                                       cube_shard_budget_keys=cfg.cube_shard_budget_keys),
        runbook_url=cfg.monitoring_runbook_url, dashboards=cfg.grafana_dashboards))

    return {
        "namespace": namespace,
        "servingUrl": serving.url,
        "servingGrpcTarget": serving.grpc_target,
        **({"fileServerUrl": files.external_url, "fileServerClusterUrl": files.url} if files else
           {"modelRoot": root}),
        "transferStatusUrl": transfer.status_url,
        "cubeTopology": cube.topology,
        "trainingJob": pulumi.Output.concat(namespace, "/", training.job_name),
        "images": images.refs,
        **({"trackingUrl": tracker.url} if tracker else {}),
        "monitoring": pulumi.Output.all(monitoring.monitors, monitoring.rule, monitoring.dashboards).apply(
            lambda a: {"mode": cfg.monitoring, "monitors": a[0], "rule": a[1], "dashboards": a[2]}),
    }


def _dockerconfig(registry: str, username: str, password: str) -> str:
    """``.dockerconfigjson`` text for one registry host."""
    host = registry.split("/")[0]
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return json.dumps({"auths": {host: {"username": username, "password": password, "auth": auth}}}, sort_keys=True)
