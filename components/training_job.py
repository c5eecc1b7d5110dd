"""TrainingJob: Paddle parameter-server training as one gang-scheduled Volcano Job.

Tasks ``pserver`` (P replicas) and ``trainer`` (T replicas), ``minAvailable = P + T`` so
the job starts only when every pod can run. Volcano's ``svc`` plugin gives each pod a
stable hostname and sets ``VC_PSERVER_HOSTS``; the ``env`` plugin sets ``VC_TASK_INDEX``;
``runtime/trainer/roles.py`` derives the Paddle environment contract from them, so no
pod-listing RBAC is needed. A pod evicted or failed restarts the whole job (PS training
cannot lose a member); the trainer task completing completes the job.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext

PADDLE_PORT = 8200
JOB_NAME = "ctr-train"
GENERATED = "generated"
DATA_DIR = "/data"


@dataclass(frozen=True)
class TrainingJobArgs:
    """Inputs of :class:`TrainingJob`.

    Attributes:
        deployment: namespace, instance, pull secrets.
        image: trainer image reference.
        queue: Volcano queue name.
        pservers / trainers: task replica counts (>= 1).
        pserver_cpu / pserver_memory / trainer_cpu / trainer_memory: requests = limits.
        epochs, batch_size, learning_rate, embedding_dim, sparse_shards: training flags.
        data_train / data_test: data locations (paths, globs, URLs), or ``("generated",)``
            for data generated in the pod by ``elastic-ctr data generate``.
        data_format: ``criteo`` | ``slot``; ``slot_file`` required for ``slot``.
        output: ROOT the trainer exports to (the file server's URL).
        upload_token_secret / upload_token_key: Secret holding the upload token.
    """

    deployment: DeployContext
    image: pulumi.Input[str]
    queue: str
    pservers: int
    trainers: int
    pserver_cpu: str
    pserver_memory: str
    trainer_cpu: str
    trainer_memory: str
    epochs: int
    batch_size: int
    learning_rate: str
    embedding_dim: int
    sparse_shards: int
    data_train: Sequence[str]
    data_test: Sequence[str]
    data_format: str
    output: str
    upload_token_secret: pulumi.Input[str]
    upload_token_key: str
    slot_file: Optional[str] = None
    scratch_size: str = "10Gi"


class TrainingJob(pulumi.ComponentResource):
    """The Volcano Job. Outputs: ``job_name``, ``min_available``."""

    def __init__(self, name: str, args: TrainingJobArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:TrainingJob", name, None, opts)
        dep = args.deployment
        lbls = common.labels(dep, "trainer", "training")
        self.min_available = args.pservers + args.trainers
        spec = {
            "schedulerName": "volcano",
            "queue": args.queue,
            "minAvailable": self.min_available,
            "maxRetry": 3,
            "policies": [
                {"event": "PodEvicted", "action": "RestartJob"},
                {"event": "PodFailed", "action": "RestartJob"},
            ],
            "plugins": {"svc": [], "env": []},
            "tasks": [
                {
                    "name": "pserver",
                    "replicas": args.pservers,
                    "template": self._template(args, "pserver", lbls),
                },
                {
                    "name": "trainer",
                    "replicas": args.trainers,
                    "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                    "template": self._template(args, "trainer", lbls),
                },
            ],
        }
        self.job = k8s.apiextensions.CustomResource(
            JOB_NAME,
            api_version="batch.volcano.sh/v1alpha1",
            kind="Job",
            metadata=common.metadata(dep, JOB_NAME, lbls),
            spec=spec,
            # A Volcano Job's spec is mostly immutable: a changed scale is a new run.
            opts=dep.child_opts(self, replace_on_changes=["spec"], delete_before_replace=True),
        )
        self.job_name = JOB_NAME
        self.register_outputs({"job_name": self.job_name, "min_available": self.min_available})

    @staticmethod
    def _template(args: TrainingJobArgs, task: str, lbls: dict) -> dict:
        """Pod template of ``task`` (``pserver`` | ``trainer``) as a plain manifest dict."""
        dep = args.deployment
        is_trainer = task == "trainer"
        generated = list(args.data_train) == [GENERATED]
        data_train = [f"{DATA_DIR}/train.txt"] if generated else list(args.data_train)
        data_test = [f"{DATA_DIR}/test.txt"] if generated else list(args.data_test)
        cmd = ["train", "--data-train", *data_train, "--data-test", *data_test,
               "--format", args.data_format]
        if args.slot_file:
            cmd += ["--slot-file", args.slot_file]
        cmd += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
                "--lr", args.learning_rate, "--embedding-dim", str(args.embedding_dim),
                "--sparse-shards", str(args.sparse_shards), "--output", args.output]

        env = [
            {"name": "TRAINING_ROLE", "value": "TRAINER" if is_trainer else "PSERVER"},
            {"name": "PADDLE_PORT", "value": str(PADDLE_PORT)},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "ELASTIC_CTR_LOG_LEVEL", "value": "INFO"},
            {"name": "HOME", "value": common.TMP_DIR},
        ]
        if is_trainer:  # only trainer 0 uploads; pservers never see the token
            env.append({"name": "ELASTIC_CTR_UPLOAD_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": args.upload_token_secret, "key": args.upload_token_key}}})
        cpu, mem = ((args.trainer_cpu, args.trainer_memory) if is_trainer
                    else (args.pserver_cpu, args.pserver_memory))
        security = {
            "runAsNonRoot": True, "runAsUser": common.APP_UID,
            "allowPrivilegeEscalation": False,
            # Paddle writes under the working directory (logs, RPC temp files): keep the
            # root FS writable for training only; everything else runs read-only.
            "readOnlyRootFilesystem": False,
            "capabilities": {"drop": ["ALL"]},
        }
        container = {
            "name": task,
            "image": args.image,
            "imagePullPolicy": dep.image_pull_policy,
            "args": cmd,
            "env": env,
            "ports": [{"name": "paddle", "containerPort": PADDLE_PORT}],
            "resources": {"requests": {"cpu": cpu, "memory": mem},
                          "limits": {"cpu": cpu, "memory": mem}},
            "securityContext": security,
            "volumeMounts": [{"name": "data", "mountPath": DATA_DIR},
                             {"name": "tmp", "mountPath": common.TMP_DIR}],
        }
        if not is_trainer:
            container["readinessProbe"] = {"tcpSocket": {"port": "paddle"},
                                           "periodSeconds": 10, "timeoutSeconds": 3}
            container["livenessProbe"] = {"tcpSocket": {"port": "paddle"}, "periodSeconds": 20,
                                          "timeoutSeconds": 3, "failureThreshold": 6,
                                          "initialDelaySeconds": 60}
        pod: dict = {
            "restartPolicy": "Never",  # failures are handled by the job's policies
            "securityContext": {"runAsNonRoot": True, "runAsUser": common.APP_UID,
                                "runAsGroup": common.APP_UID, "fsGroup": common.APP_UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": [
                {"name": "data", "emptyDir": {"sizeLimit": args.scratch_size}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            ],
        }
        if is_trainer and generated:
            pod["initContainers"] = [{
                "name": "generate-data",
                "image": args.image,
                "imagePullPolicy": dep.image_pull_policy,
                # writes DATA_DIR/train.txt and test.txt (same seed in every pod: same data)
                "args": ["data", "generate", "--out", DATA_DIR],
                "env": [{"name": "HOME", "value": common.TMP_DIR}],
                "resources": container["resources"],
                "securityContext": {**security, "readOnlyRootFilesystem": True},
                "volumeMounts": container["volumeMounts"],
            }]
        if dep.image_pull_secrets:
            pod["imagePullSecrets"] = [{"name": n} for n in dep.image_pull_secrets]
        return {"metadata": {"labels": {**lbls, "elastic-ctr.io/task": task}}, "spec": pod}
