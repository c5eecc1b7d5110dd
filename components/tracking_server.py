"""TrackingServer: an MLflow tracking server (``mlflow server``) the training job and the cube
transfer log to (``runtime.tracking``; their pods get ``MLFLOW_TRACKING_URI`` = ``url``).

Named after the component (``<name>``): a single-replica Deployment (``Recreate``: the
volume is ReadWriteOnce) running the ``tracking`` image (the Dockerfile's target: the full
``mlflow`` distribution; its entrypoint is ``mlflow``), a ClusterIP Service on its port (``runtime.role_specs.tracking_server``),
and where the stores live:

* by default a PersistentVolumeClaim mounted at ``STORE``: the backend store
  ``sqlite:////mlflow/mlflow.db`` and the artifacts ``/mlflow/artifacts``, served by the
  server itself (``--serve-artifacts``: clients need only HTTP);
* or, with ``backend_store_uri`` (a database URI such as
  ``postgresql://user:pw@host/db``, a secret), a Secret ``<name>-backend-store`` whose key
  reaches the pod only as ``MLFLOW_BACKEND_STORE_URI`` (secretKeyRef), and, with
  ``artifacts_destination`` (e.g. ``s3://bucket/mlflow``; the image must hold that
  store's client), no claim at all when both are set.

The server answers only the Host headers of its Service's names (``MLFLOW_SERVER_ALLOWED_HOSTS``:
DNS-rebinding protection of MLflow 3) and localhost (the probes, a port-forward).
Probes: ``GET /health``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from runtime import mlflow_auth, role_specs

STORE = "/mlflow"
#: where the basic-auth app's config file (``AUTH_INI``, from the ``<name>-auth`` ConfigMap) is mounted
AUTH_DIR, AUTH_INI = "/etc/mlflow-auth", "basic_auth.ini"
URI_KEY = "uri"


@dataclass(frozen=True)
class TrackingServerArgs:
    """Inputs of :class:`TrackingServer`.

    Attributes:
        deployment: namespace, instance, pull secrets.
        image: the tracking image reference.
        cpu / memory: requests = limits.
        storage_size: the claim's size (quantity, e.g. ``5Gi``), when a claim is needed.
        storage_class: StorageClass name; ``None`` = the cluster default.
        backend_store_uri: a database URI (secret Output), or None = SQLite on the claim.
        artifacts_destination: where artifacts go (URI), or None = the claim.
    """

    deployment: DeployContext
    image: pulumi.Input[str]
    cpu: pulumi.Input[str]
    memory: pulumi.Input[str]
    storage_size: pulumi.Input[str]
    storage_class: Optional[pulumi.Input[str]] = None
    backend_store_uri: Optional[pulumi.Input[str]] = None
    artifacts_destination: Optional[str] = None


class TrackingServer(pulumi.ComponentResource):
    """Outputs: ``url`` (in-cluster, ``http://<name>.<ns>.svc.cluster.local:5000``)."""

    url: pulumi.Output[str]

    def __init__(self, name: str, args: TrackingServerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:TrackingServer", name, None, opts)
        dep = args.deployment
        lbls = common.labels(dep, name, "tracking")
        sel = common.selector(lbls)
        env = [*common.base_env()]
        volumes, mounts = [], []
        tmp_vol, tmp_mount = common.tmp_volume()
        if args.backend_store_uri is not None:
            secret_name = f"{name}-backend-store"
            secret = k8s.core.v1.Secret(
                secret_name, metadata=common.metadata(dep, secret_name, lbls), type="Opaque",
                string_data={URI_KEY: pulumi.Output.secret(args.backend_store_uri)}, opts=common.child(self))
            env.append(k8s.core.v1.EnvVarArgs(name="MLFLOW_BACKEND_STORE_URI", value_from=k8s.core.v1.EnvVarSourceArgs(
                secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(
                    name=secret.metadata.apply(lambda m: m.name), key=URI_KEY))))
        else:
            env.append(k8s.core.v1.EnvVarArgs(name="MLFLOW_BACKEND_STORE_URI", value=f"sqlite:///{STORE}/mlflow.db"))
        # no background job runner (MLflow's GenAI jobs, unused here)
        env.append(k8s.core.v1.EnvVarArgs(name="MLFLOW_SERVER_ENABLE_JOB_EXECUTION", value="false"))
        env.append(k8s.core.v1.EnvVarArgs(name="MLFLOW_ARTIFACTS_DESTINATION",
                                          value=args.artifacts_destination or f"{STORE}/artifacts"))
        if args.backend_store_uri is None or args.artifacts_destination is None:
            pvc = common.volume_claim(self, dep, name, lbls, args.storage_size, args.storage_class)
            volumes.append(k8s.core.v1.VolumeArgs(
                name="store", persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                    claim_name=pvc.metadata.apply(lambda m: m.name))))
            mounts.append(k8s.core.v1.VolumeMountArgs(name="store", mount_path=STORE))
        # MLflow's own authentication when the stack has the tracking credential: its admin (the
        # pipeline's login) and CSRF secret from the Secret, its user store on the volume (else /tmp)
        auth = role_specs.TRACKING in dep.credentials
        spec = role_specs.tracking_server(basic_auth=auth)
        if auth:
            env += [k8s.core.v1.EnvVarArgs(name=var, value_from=k8s.core.v1.EnvVarSourceArgs(
                secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=dep.credentials[role_specs.TRACKING], key=key)))
                for var, key in mlflow_auth.TRACKING_SERVER_ENV]
            users = f"{STORE}/basic_auth.db" if mounts else f"{common.TMP_DIR}/basic_auth.db"
            cm_name = f"{name}-auth"
            cm = k8s.core.v1.ConfigMap(cm_name, metadata=common.metadata(dep, cm_name, lbls),
                                       data={AUTH_INI: mlflow_auth.tracking_auth_config(users)}, opts=common.child(self))
            volumes.append(k8s.core.v1.VolumeArgs(name="auth", config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
                name=cm.metadata.apply(lambda m: m.name))))
            mounts.append(k8s.core.v1.VolumeMountArgs(name="auth", mount_path=AUTH_DIR, read_only=True))
            env.append(k8s.core.v1.EnvVarArgs(name=mlflow_auth.TRACKING_AUTH_CONFIG_ENV, value=f"{AUTH_DIR}/{AUTH_INI}"))
        port = spec.port("http")
        host = dep.svc_host(name)
        env.append(k8s.core.v1.EnvVarArgs(name="MLFLOW_SERVER_ALLOWED_HOSTS", value=pulumi.Output.concat(
            name, ",", name, f":{port},", host, ",", host, f":{port},", name, ".", dep.namespace, f":{port},",
            f"localhost:{port},127.0.0.1:{port},localhost,127.0.0.1")))
        # a cold start (database migrations) takes ~20 s on 2 cores: liveness waits 60 s
        container = common.container(spec, dep, args.image, env=env, resources_=common.resources(args.cpu, args.memory),
                                     volume_mounts=[*mounts, tmp_mount], liveness_delay_s=60)
        common.singleton_deployment(dep, name, lbls, container, [*volumes, tmp_vol, *common.credential_volumes(dep, spec)],
                                    parent=self, service_account=common.service_account(dep, name, self))
        self.service = k8s.core.v1.Service(
            name,
            metadata=common.metadata(dep, name, lbls),
            spec=k8s.core.v1.ServiceSpecArgs(
                type="ClusterIP", selector=sel,
                ports=[k8s.core.v1.ServicePortArgs(name="http", port=port, target_port="http")]),
            opts=common.child(self),
        )
        self.url = dep.svc_url(self.service.metadata.apply(lambda m: m.name), port)
        #: the pod's labels (``components.network_policies``)
        self.selector = sel
        self.register_outputs({"url": self.url})


def tracking_env(uri: Optional[pulumi.Input[str]], experiment: str,
                 job: Optional[str] = None) -> list[k8s.core.v1.EnvVarArgs]:
    """``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME`` and, with ``job``, the job's name
    (``ELASTIC_CTR_JOB``: the training job's runs and the transfer's, a child of the job's
    run; ``runtime.tracking``) for a pod that logs (the training job, the transfer); empty
    when ``uri`` is None (tracking off)."""
    if uri is None:
        return []
    from runtime.tracking import JOB_ENV

    return [k8s.core.v1.EnvVarArgs(name="MLFLOW_TRACKING_URI", value=uri),
            k8s.core.v1.EnvVarArgs(name="MLFLOW_EXPERIMENT_NAME", value=experiment),
            *([k8s.core.v1.EnvVarArgs(name=JOB_ENV, value=job)] if job else [])]
