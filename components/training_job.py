"""TrainingJob: Paddle parameter-server training as one gang-scheduled Volcano Job.

Tasks ``pserver`` (P replicas) and ``trainer`` (T replicas), ``minAvailable = P + T`` so
the job starts only when every pod can run. Volcano's ``svc`` plugin gives each pod a
stable hostname and sets ``VC_PSERVER_HOSTS``; the ``env`` plugin sets ``VC_TASK_INDEX``;
``runtime/trainer/roles.py`` derives the Paddle environment contract from them, so no
pod-listing RBAC is needed. A pod evicted or failed restarts the whole job (PS training
cannot lose a member); the trainer task completing completes the job.

Named after the component: the Job is ``<name>``, labelled ``app.kubernetes.io/name:
<name>`` (component ``training``) like every component's objects; each pod adds
``elastic-ctr.io/task: pserver|trainer``. At export the PSERVERS write the
sparse table into a directory trainer 0 names, on their own file system, and trainer 0
reads it back: so both tasks mount one ReadWriteMany PersistentVolumeClaim
(``<name>-shared``) at ``/shared`` and ``train`` gets
``--table-dir /shared/table`` (each save uses a fresh subdirectory, removed after the
export). The claim needs an RWX-capable StorageClass (NFS, CephFS, EFS, Filestore; on a
single-node dev cluster the default hostPath provisioner works).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from components.monitoring import scrape_target
from components.tracking_server import tracking_env
from runtime import role_specs

GENERATED = "generated"
#: the pod label naming a pod's task (pserver | trainer)
TASK_LABEL = "elastic-ctr.io/task"
DATA_DIR = "/data"
#: where both tasks mount the ReadWriteMany claim ``<name>-shared`` (the sparse-table save)
SHARED_DIR = "/shared"
#: ``train --table-dir``: the pservers save the table here, trainer 0 reads it back
TABLE_DIR = f"{SHARED_DIR}/table"
#: ``train --state-dir`` (continuous mode): the state file and checkpoints a restarted job resumes from
STATE_DIR = f"{SHARED_DIR}/state"
#: ``train --work-dir``: rows are staged and passes run here (the root file system is read-only)
WORK_DIR = f"{DATA_DIR}/work"


@dataclass(frozen=True)
class TrainingJobArgs:
    """Inputs of :class:`TrainingJob`.

    Attributes:
        deployment: namespace, instance, pull secrets.
        image: trainer image reference.
        queue: Volcano queue name.
        pservers / trainers: task replica counts (>= 1); plain ints: ``minAvailable`` is
            their sum. The training flags and data locations are plain values too: they
            are the pods' command line.
        pserver_cpu / pserver_memory / trainer_cpu / trainer_memory: requests = limits.
        epochs, batch_size, learning_rate, embedding_dim, pserver_table_shards, ps_mode,
            geo_k_steps, threads: training flags (``train --ps-mode``, ``--threads``, ...).
        mode: ``batch`` | ``continuous``; start_hour / end_hour (``YYYYMMDD/HH`` or None):
            with a start hour ``data_train[0]`` is a partition root (``--data-root``);
            partition_minutes: the partitions' period (``train --partition-minutes``);
            patch_every_seconds / base_every_minutes / checkpoint_every_minutes: the
            continuous job's export, base and checkpoint cadences (``runtime.trainer.cadence``);
            gate_args: the data gate's flags (``infra.config_gates``; ``--data-schema``,
            ``--gate-*``); lifecycle_args: the feature lifecycle's (``infra.config_lifecycle``;
            ``--feature-*``, ``--shrink-every-minutes``). A continuous job
            does not complete before its end hour; a failed or evicted pod restarts the
            whole job, which resumes from ``/shared/state`` (``train --state-dir``).
        data_train / data_test: data locations (paths, globs, URLs), or ``("generated",)``
            for data generated in the pod by ``elastic-ctr data generate``.
        data_format: ``criteo`` | ``slot``; ``slot_file`` required for ``slot``.
        output: ROOT the trainer exports to (the file server's URL).
        upload_token_secret / upload_token_key: Secret holding the upload token (None: the
            version root is an object store, reached with ``deployment.store_env``).
        shared_storage_class: StorageClass of the ``training-shared`` ReadWriteMany claim
            (must support RWX); ``None`` = the cluster default.
        shared_size: its requested size, a Kubernetes quantity (e.g. ``"5Gi"``); holds one
            sparse-table save (text, gzip) at a time.
        scratch_size: size limit of each pod's ``/data`` emptyDir.
        tracking_uri / tracking_experiment: the trainers' ``MLFLOW_TRACKING_URI`` and
            ``MLFLOW_EXPERIMENT_NAME``; tracking_job: the job's name (``ELASTIC_CTR_JOB``: the
            runs' names and parent) (``runtime.tracking``); None = no tracking.
    """

    deployment: DeployContext
    image: pulumi.Input[str]
    queue: pulumi.Input[str]
    pservers: int
    trainers: int
    pserver_cpu: pulumi.Input[str]
    pserver_memory: pulumi.Input[str]
    trainer_cpu: pulumi.Input[str]
    trainer_memory: pulumi.Input[str]
    epochs: int
    batch_size: int
    learning_rate: float
    embedding_dim: int
    pserver_table_shards: int
    data_train: Sequence[str]
    data_test: Sequence[str]
    data_format: str
    output: pulumi.Input[str]
    upload_token_secret: Optional[pulumi.Input[str]]
    upload_token_key: pulumi.Input[str]
    slot_file: Optional[str] = None
    ps_mode: str = "async"
    geo_k_steps: int = 100
    threads: int = 1
    mode: str = "batch"
    start_hour: Optional[str] = None
    end_hour: Optional[str] = None
    partition_minutes: int = 60
    patch_every_seconds: int = 0
    base_every_minutes: int = 1440
    checkpoint_every_minutes: int = 1440
    shared_storage_class: Optional[pulumi.Input[str]] = None
    shared_size: pulumi.Input[str] = "5Gi"
    scratch_size: pulumi.Input[str] = "10Gi"
    tracking_uri: Optional[pulumi.Input[str]] = None
    tracking_experiment: str = "elastic-ctr"
    tracking_job: Optional[str] = None
    gate_args: Sequence[str] = ()
    lifecycle_args: Sequence[str] = ()


class TrainingJob(pulumi.ComponentResource):
    """The Volcano Job and the ReadWriteMany claim its pods share.

    Outputs: ``job_name``, ``min_available``, ``shared_claim`` (the claim's name)."""

    job_name: pulumi.Output[str]
    min_available: pulumi.Output[int]
    shared_claim: pulumi.Output[str]

    def __init__(self, name: str, args: TrainingJobArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:TrainingJob", name, None, opts)
        dep = args.deployment
        lbls = common.labels(dep, name, "training")
        claim = f"{name}-shared"
        # Not part of the Job's spec, so a new run (other scale) keeps the claim.
        self.shared_pvc = common.volume_claim(self, dep, claim, common.labels(dep, claim, "training"), args.shared_size,
                                              args.shared_storage_class, access_mode="ReadWriteMany")
        self.shared_claim = self.shared_pvc.metadata.apply(lambda m: m.name)
        # one identity per task: the trainers write versions, the pservers only read data
        accounts = {task: common.service_account(dep, f"{name}-{task}", self, access)
                    for task, access in (("pserver", common.READ), ("trainer", common.WRITE))}
        spec = {
            "schedulerName": "volcano",
            "queue": args.queue,
            "minAvailable": args.pservers + args.trainers,
            # a continuous job runs for days: a pod lost now and then must not end it
            "maxRetry": 3 if args.mode == "batch" else 1000,
            "policies": [
                {"event": "PodEvicted", "action": "RestartJob"},
                {"event": "PodFailed", "action": "RestartJob"},
            ],
            "plugins": {"svc": [], "env": []},
            "tasks": [
                {
                    "name": "pserver",
                    "replicas": args.pservers,
                    "template": self._template(args, "pserver", lbls, self.shared_claim, accounts["pserver"]),
                },
                {
                    "name": "trainer",
                    "replicas": args.trainers,
                    "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                    "template": self._template(args, "trainer", lbls, self.shared_claim, accounts["trainer"]),
                },
            ],
        }
        self.job = k8s.apiextensions.CustomResource(
            name,
            api_version="batch.volcano.sh/v1alpha1",
            kind="Job",
            metadata=common.metadata(dep, name, lbls),
            spec=spec,
            # A Volcano Job's spec is mostly immutable: a changed scale is a new run.
            opts=common.child(self, replace_on_changes=["spec"], delete_before_replace=True),
        )
        self.job_name = self.job.metadata.apply(lambda m: m["name"] if isinstance(m, dict) else m.name)
        self.min_available = pulumi.Output.from_input(args.pservers + args.trainers)
        #: the labels of the job's pods, both tasks (``TASK_LABEL`` tells them apart; ``components.network_policies``)
        self.selector = common.selector(lbls)
        #: what Prometheus scrapes (``components.monitoring``): each task's pods (Volcano's, no Service of ours)
        self.scrape_targets = [scrape_target(role_specs.ps_role(task), {**common.selector(lbls), TASK_LABEL: task},
                                             kind="pod") for task in ("pserver", "trainer")]
        self.register_outputs({"job_name": self.job_name, "min_available": self.min_available,
                               "shared_claim": self.shared_claim})

    @staticmethod
    def _template(args: TrainingJobArgs, task: str, lbls: dict[str, str],
                  claim: pulumi.Input[str], account: pulumi.Input[str]) -> k8s.core.v1.PodTemplateSpecArgs:
        """Pod template of ``task`` (``pserver`` | ``trainer``), labelled ``lbls`` plus
        ``elastic-ctr.io/task: <task>``, running as ServiceAccount ``account``."""
        dep = args.deployment
        is_trainer = task == "trainer"
        generated = list(args.data_train) == [GENERATED]
        cmd = _train_args(args, generated)
        # ports, probes and the environment contract's fixed part (pserver 0 serves Paddle's gloo
        # HTTP store on ``gloo``: trainer barriers; ``runtime.trainer.roles``)
        spec = role_specs.ps_role(task, args=cmd)
        env = []
        if is_trainer:
            # A pserver's endpoint must be its own entry of the endpoint list, which Volcano's
            # VC_PSERVER_HOSTS gives as host names: runtime.trainer.roles derives a pserver's
            # POD_IP from it, so a pserver must not get the pod IP here (it would not match).
            env.append(k8s.core.v1.EnvVarArgs(
                name="POD_IP", value_from=k8s.core.v1.EnvVarSourceArgs(
                    field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="status.podIP"))))
        env += common.base_env(dep=dep, access=common.WRITE if is_trainer else common.READ)
        if is_trainer:  # the trainers log to MLflow (runtime.tracking); pservers never do
            env += tracking_env(args.tracking_uri, args.tracking_experiment, args.tracking_job)
        if is_trainer and args.upload_token_secret is not None:  # only trainer 0 uploads; pservers never see it
            env.append(common.token_env(args.upload_token_secret, args.upload_token_key))
        cpu, mem = ((args.trainer_cpu, args.trainer_memory) if is_trainer
                    else (args.pserver_cpu, args.pserver_memory))
        resources = common.resources(cpu, mem)
        tmp_vol, tmp_mount = common.tmp_volume()
        data_mount = k8s.core.v1.VolumeMountArgs(name="data", mount_path=DATA_DIR)
        shared_mount = k8s.core.v1.VolumeMountArgs(name="shared", mount_path=SHARED_DIR)
        # Paddle writes under the working directory (logs, RPC temp files): keep the root FS
        # writable for training only; everything else runs read-only. Only the pservers are
        # probed (the trainers complete).
        container = common.container(spec, dep, args.image, env=env, resources_=resources,
                                     volume_mounts=[data_mount, tmp_mount, shared_mount], read_only_root=False,
                                     readiness_period_s=10, liveness_period_s=20, liveness_delay_s=60)
        init_containers = None
        if generated:
            # every role checks its inputs before it starts (``train`` resolves --data-train and
            # --data-test, a pserver too), so the pservers need the files as well
            init_containers = [k8s.core.v1.ContainerArgs(
                name="generate-data",
                image=args.image,
                image_pull_policy=dep.image_pull_policy,
                # writes DATA_DIR/train.txt and test.txt (same seed in every pod: same data)
                args=list(role_specs.data_generate(DATA_DIR)),
                env=[common.home_env()],
                resources=resources,
                security_context=common.container_security(),
                volume_mounts=[data_mount, tmp_mount],
            )]
        return k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels={**lbls, TASK_LABEL: task},
                                                annotations=common.scrape_annotations(dep, spec) or None),
            spec=k8s.core.v1.PodSpecArgs(
                restart_policy="Never",  # failures are handled by the job's policies
                security_context=common.pod_security(),
                image_pull_secrets=dep.pull_secrets() or None,
                service_account_name=account,
                automount_service_account_token=False,
                init_containers=init_containers,
                containers=[container],
                volumes=[
                    k8s.core.v1.VolumeArgs(
                        name="data",
                        empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit=args.scratch_size)),
                    tmp_vol,
                    k8s.core.v1.VolumeArgs(
                        name="shared",
                        persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                            claim_name=claim)),
                    *common.credential_volumes(dep, spec),
                ],
            ),
        )


def _train_args(args: TrainingJobArgs, generated: bool) -> list[pulumi.Input[str]]:
    """The ``train`` command line both tasks run: the job's ``TrainConfig`` written by
    ``runtime.role_specs.train_argv`` (``output`` known at deploy time), then the data
    gate's flags (continuous jobs) and the lifecycle's."""
    from runtime.trainer.config import TrainConfig

    data_train = [f"{DATA_DIR}/train.txt"] if generated else list(args.data_train)
    data_test = [f"{DATA_DIR}/test.txt"] if generated else list(args.data_test)
    hourly = bool(args.start_hour)
    continuous = hourly and args.mode == "continuous"
    cfg = TrainConfig(
        data_train=[] if hourly else data_train, data_test=[] if hourly and generated else data_test,
        data_root=data_train[0] if hourly else None, start_hour=args.start_hour or None,
        end_hour=(args.end_hour or None) if hourly else None, partition_minutes=args.partition_minutes,
        mode="continuous" if continuous else "batch", state_dir=STATE_DIR if continuous else None,
        patch_every_seconds=args.patch_every_seconds, base_every_minutes=args.base_every_minutes,
        checkpoint_every_minutes=args.checkpoint_every_minutes, format=args.data_format, slot_file=args.slot_file,
        epochs=args.epochs, batch_size=args.batch_size, lr=args.learning_rate, embedding_dim=args.embedding_dim,
        pserver_table_shards=args.pserver_table_shards, table_dir=TABLE_DIR, work_dir=WORK_DIR, threads=args.threads,
        ps_mode=args.ps_mode, geo_k_steps=args.geo_k_steps)
    extra = [*(args.gate_args if continuous else ()), *args.lifecycle_args]
    return role_specs.train_argv(cfg, output=args.output) + extra
