"""The component arguments the stack's program and the provider's components both derive from the stack config.

``infra/program.py`` (``pulumi up``) and ``provider/components.py`` (the Pulumi package's
components) declare the same components from the same keys; what differs is only the
wiring between them (the version root, the upload token, the tracking server, the roles'
pod selectors), which the callers pass in.
"""

from __future__ import annotations

from typing import Any, Optional

from components.network_policies import Peers
from components.training_job import TrainingJobArgs
from infra import config_gates, config_lifecycle, config_security
from infra.config import StackConfig


def training_job_args(cfg: StackConfig, *, deployment: Any, image: Any, output: Any,
                      upload_token_secret: Optional[Any], upload_token_key: str, tracking_uri: Any,
                      tracking_job: str) -> TrainingJobArgs:
    """The training job's arguments: its keys of ``cfg`` (sizes, training flags, the data
    and its gates) and the wiring given (where it writes versions, the upload token's
    Secret, the tracking server and the job's name there)."""
    train = cfg.train_config()
    return TrainingJobArgs(
        deployment=deployment, image=image, queue=cfg.volcano_queue,
        pservers=cfg.pservers, trainers=cfg.trainers,
        pserver_cpu=cfg.pserver_cpu, pserver_memory=cfg.pserver_memory,
        trainer_cpu=cfg.trainer_cpu, trainer_memory=cfg.trainer_memory,
        epochs=cfg.epochs, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
        embedding_dim=cfg.embedding_dim, pserver_table_shards=cfg.pserver_table_shards,
        ps_mode=cfg.ps_mode, geo_k_steps=cfg.geo_k_steps, threads=cfg.trainer_threads,
        mode=cfg.training_mode, start_hour=cfg.data_start_hour or None, end_hour=cfg.data_end_hour or None,
        partition_minutes=cfg.partition_minutes, patch_every_seconds=cfg.patch_every_seconds,
        base_every_minutes=cfg.base_every_minutes, checkpoint_every_minutes=cfg.checkpoint_every_minutes,
        data_train=cfg.data_train(), data_test=cfg.data_test(),
        data_format=cfg.data_format, slot_file=cfg.slot_file or None,
        output=output, upload_token_secret=upload_token_secret, upload_token_key=upload_token_key,
        shared_storage_class=cfg.training_shared_storage_class or None,
        shared_size=cfg.training_shared_size, gate_args=config_gates.gate_argv(train),
        lifecycle_args=config_lifecycle.lifecycle_argv(train),
        tracking_uri=tracking_uri, tracking_experiment=cfg.tracking_experiment, tracking_job=tracking_job)


def network_policy_keys(cfg: StackConfig) -> dict[str, Any]:
    """The NetworkPolicies' arguments that come from ``cfg``'s security keys (who may reach
    the file server, serving and the tracking UI, the monitoring namespace, egress); the
    callers add the roles' selectors."""
    return dict(
        file_server_sources=cfg.source_ranges() if cfg.expose_file_server else [],
        serving_clients=Peers(
            namespaces=config_security.namespaces(cfg.serving_client_namespaces),
            pod_labels=config_security.labels(cfg.serving_client_pod_labels), cidrs=cfg.client_cidrs()),
        tracking_ui=Peers(
            namespaces=config_security.namespaces(cfg.tracking_ui_namespaces),
            pod_labels=config_security.labels(cfg.tracking_ui_pod_labels)) if cfg.tracking_ui_pod_labels else None,
        monitoring_namespace=cfg.monitoring_namespace or None,
        egress=cfg.network_policy_egress, egress_cidrs=cfg.egress_ranges())
