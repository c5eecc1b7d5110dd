"""Construct parity: the package's components built by its provider's ``construct`` under
Pulumi's mocks, from inputs as a program in another language sends them (a Pulumi YAML
program run by tests/infra/package_program.py: schema names, numbers as doubles, other
resources' outputs as Outputs), declare what the Python program declares for the same
settings: the same resources (URNs), the same Kubernetes manifests and the same stack
outputs, compared with its rendering (``infra.render``).

Three programs: ``examples/yaml/Pulumi.yaml`` (the dev stack), and two variants of it here
that take the other paths (versions on an object store with keys, or with a workload
identity; an external tracking server; scrape annotations; egress policies; an
autoscaler on in-flight requests; continuous training with the data gate; a pinned
version; the model gate off; Paddle's dense backend; three cube shards)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from infra.render import SECRET_PLACEHOLDER, run_program, stack_config, to_manifest
from tests.infra.package_program import YamlProgram

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "Pulumi.yaml"
PROJECT = "elastic-ctr"

#: variant A: versions on an object store reached with keys, everything else off the defaults
STORE_OVERRIDES = ["modelRoot=s3://ctr-bucket/model", "storageEndpointUrl=http://minio.storage:9000",
                   "storageRegion=eu-west-1", "dataSource=s3://ctr-bucket/hours", "trainingMode=continuous",
                   "dataStartHour=20261120/00", "dataSchema=s3://ctr-bucket/schemas/ctr.yaml", "gateWindow=12",
                   "trackingServer=false", "trackingUri=http://mlflow.example.org:5000", "trackingExperiment=ctr",
                   "monitoring=annotations", "servingMaxReplicas=6", "servingAutoscaleMetric=inflight",
                   "servingTargetInflight=16", "networkPolicyEgress=true", "egressCidrs=10.0.0.0/8,192.0.2.7/32",
                   "servingClientNamespaces=frontend,batch", "servingClientPodLabels=app=ranker",
                   "servingClientCidrs=198.51.100.0/24", "trackingUiPodLabels=app=proxy", "monitoringNamespace=prom",
                   "servedVersion=1795929686", "keepVersions=5", "modelGate=false", "modelGateAucDrop=0.1",
                   "denseBackend=paddle", "cubeShards=3", "imagePullPolicy=Always", "psMode=async-merged", "pserverTableShards=4",
                   "featureMinCount=5", "featureTtlHours=72"]
STORE_SECRETS = {"storageAccessKeyId": "AKIA-write-0123456789", "storageSecretAccessKey": "write-secret-0123456789",
                 "storageReadAccessKeyId": "AKIA-read-0123456789", "storageReadSecretAccessKey": "read-secret-0123456"}
STORE_PROGRAM = """
name: elastic-ctr-store
runtime: yaml
config:
  storageAccessKeyId: {type: string, secret: true}
  storageSecretAccessKey: {type: string, secret: true}
  storageReadAccessKeyId: {type: string, secret: true}
  storageReadSecretAccessKey: {type: string, secret: true}
variables:
  instance: elastic-ctr-${pulumi.stack}
  root: s3://ctr-bucket/model
  deployment:
    namespace: ${ns.metadata.name}
    instance: ${instance}
    imagePullPolicy: Always
    credentials: ${credentials.secrets}
    scrapeAnnotations: true
    storeEnv:
      - {name: AWS_DEFAULT_REGION, value: eu-west-1}
      - {name: AWS_ENDPOINT_URL_S3, value: "http://minio.storage:9000"}
      - {name: AWS_ACCESS_KEY_ID, secretName: "${store.secretName}"}
      - {name: AWS_SECRET_ACCESS_KEY, secretName: "${store.secretName}"}
    storeReadEnv:
      - {name: AWS_DEFAULT_REGION, value: eu-west-1}
      - {name: AWS_ENDPOINT_URL_S3, value: "http://minio.storage:9000"}
      - {name: AWS_ACCESS_KEY_ID, secretName: "${store.readSecretName}", secretKey: AWS_ACCESS_KEY_ID}
      - {name: AWS_SECRET_ACCESS_KEY, secretName: "${store.readSecretName}"}
  parts: {trainingJob: ctr-train, cubeTransfer: cube-transfer, serving: serving}
resources:
  ns:
    type: kubernetes:core/v1:Namespace
    name: elastic-ctr-dev
    properties:
      metadata:
        name: elastic-ctr-dev
        labels:
          app.kubernetes.io/name: elastic-ctr
          app.kubernetes.io/instance: ${instance}
          app.kubernetes.io/component: namespace
          app.kubernetes.io/part-of: elastic-ctr
          app.kubernetes.io/managed-by: pulumi
          pod-security.kubernetes.io/enforce: restricted
          pod-security.kubernetes.io/audit: restricted
          pod-security.kubernetes.io/warn: restricted
  images:
    type: elastic-ctr:index:Images
    properties: {imageTag: dev, denseBackend: paddle}
  store:
    type: elastic-ctr:index:ObjectStoreAccess
    name: object-store
    properties:
      deployment: {namespace: "${ns.metadata.name}", instance: "${instance}", imagePullPolicy: Always,
                   scrapeAnnotations: true}
      storageEndpointUrl: http://minio.storage:9000
      storageRegion: eu-west-1
      storageAccessKeyId: ${storageAccessKeyId}
      storageSecretAccessKey: ${storageSecretAccessKey}
      storageReadAccessKeyId: ${storageReadAccessKeyId}
      storageReadSecretAccessKey: ${storageReadSecretAccessKey}
  credentials:
    type: elastic-ctr:index:Credentials
    properties:
      deployment: {namespace: "${ns.metadata.name}", instance: "${instance}", imagePullPolicy: Always,
                   scrapeAnnotations: true}
  training:
    type: elastic-ctr:index:TrainingJob
    name: ctr-train
    properties:
      deployment: ${deployment}
      image: ${images.trainer}
      versionRoot: ${root}
      trackingUri: http://mlflow.example.org:5000
      trackingExperiment: ctr
      pservers: 1
      trainers: 2
      epochs: 1
      batchSize: 512
      pserverCpu: 500m
      pserverMemory: 1Gi
      trainerCpu: "1"
      trainerMemory: 2Gi
      psMode: async-merged
      pserverTableShards: 4
      trainingMode: continuous
      dataSource: s3://ctr-bucket/hours
      dataStartHour: 20261120/00
      dataSchema: s3://ctr-bucket/schemas/ctr.yaml
      gateWindow: 12
      featureMinCount: 5
      featureTtlHours: 72
  cube:
    type: elastic-ctr:index:CubeCluster
    properties:
      deployment: ${deployment}
      image: ${images.cube}
      versionRoot: ${root}
      cubeShards: 3
      cubeReplicas: 2
      cubeServerCpu: 250m
      cubeServerMemory: 512Mi
      cubeAgentCpu: 100m
      cubeAgentMemory: 256Mi
      cubeDataSize: 2Gi
  transfer:
    type: elastic-ctr:index:CubeTransfer
    name: cube-transfer
    properties:
      deployment: ${deployment}
      image: ${images.cube}
      topologyConfigmap: ${cube.topologyConfigmap}
      topologyChecksum: ${cube.topologyChecksum}
      versionRoot: ${root}
      trackingUri: http://mlflow.example.org:5000
      trackingExperiment: ctr
      trackingJob: ${instance}-ctr-train
      transferCpu: 500m
      transferMemory: 1Gi
      servedVersion: "1795929686"
      keepVersions: 5
      modelGate: false
      modelGateAucDrop: 0.1
    options:
      dependsOn: ["${cube}"]
  serving:
    type: elastic-ctr:index:Serving
    properties:
      deployment: ${deployment}
      image: ${images.serving}
      topologyConfigmap: ${cube.topologyConfigmap}
      topologyChecksum: ${cube.topologyChecksum}
      versionRoot: ${root}
      transferUrl: ${transfer.url}
      servingReplicas: 2
      servingMaxReplicas: 6
      servingAutoscaleMetric: inflight
      servingTargetInflight: 16
      denseBackend: paddle
      servingCpu: 500m
      servingMemory: 1Gi
    options:
      dependsOn: ["${cube}", "${transfer}"]
  network:
    type: elastic-ctr:index:NetworkPolicies
    properties:
      deployment: ${deployment}
      parts: ${parts}
      networkPolicyEgress: true
      egressCidrs: 10.0.0.0/8,192.0.2.7/32
      servingClientNamespaces: frontend,batch
      servingClientPodLabels: app=ranker
      servingClientCidrs: 198.51.100.0/24
      trackingUiPodLabels: app=proxy
      monitoringNamespace: prom
  monitoring:
    type: elastic-ctr:index:Monitoring
    properties:
      deployment: ${deployment}
      parts: ${parts}
      monitoring: annotations
outputs:
  servingUrl: ${serving.url}
  modelRoot: ${root}
  transferStatusUrl: ${transfer.statusUrl}
"""


def python_program(overrides=(), secrets=None):
    """The Python program's registrations and outputs for stack dev + ``overrides`` (+ the
    secret keys ``secrets``, stored as secrets)."""
    config, secret_keys = stack_config("dev", overrides)
    for key, value in (secrets or {}).items():
        config[f"{PROJECT}:{key}"] = value
        secret_keys.add(f"{PROJECT}:{key}")
    return run_program(config, secret_keys, "dev")


def package_program(doc: dict, config: dict):
    """The package's registrations and outputs for the Pulumi YAML program ``doc``, and the
    program (its ``constructed`` inputs)."""
    program = YamlProgram(doc, config, "dev")
    registrations, outputs = run_program({}, set(), "dev", program=program.run)
    return registrations, outputs, program


def manifests(registrations) -> dict[str, dict]:
    out = {}
    for m in (to_manifest(r) for r in registrations):
        if m is not None:
            assert m.filename not in out, m.filename
            out[m.filename] = m.body
    return out


def assert_same(python, package):
    """Same resources (URNs and types), manifests and options (replaceOnChanges,
    ignoreChanges, timeouts) as the Python program."""
    (py_regs, py_out), (pkg_regs, pkg_out) = python, package
    assert sorted(r["urn"] for r in pkg_regs) == sorted(r["urn"] for r in py_regs)
    py_m, pkg_m = manifests(py_regs), manifests(pkg_regs)
    assert sorted(pkg_m) == sorted(py_m)
    for name in py_m:
        assert pkg_m[name] == py_m[name], name
    py_opts = {r["urn"]: r["options"] for r in py_regs}
    for r in pkg_regs:
        assert r["options"] == py_opts[r["urn"]], r["urn"]
    return py_out, pkg_out


@pytest.fixture(scope="module")
def dev():
    regs, outputs, program = package_program(yaml.safe_load(EXAMPLE.read_text()), {"uploadToken": SECRET_PLACEHOLDER})
    return python_program(), (regs, outputs), program


def test_construct_yaml_example_declares_the_dev_stack(dev):
    python, package, _ = dev
    py_out, pkg_out = assert_same(python, package)
    assert len(manifests(package[0])) >= 50
    assert json.loads(json.dumps(pkg_out)) == py_out  # every stack output of the Python program, equal


def test_construct_gets_wire_shaped_inputs_and_builds_each_component_under_its_token(dev):
    _, (regs, _), program = dev
    types = {typ for typ, _, _ in program.constructed}
    assert types == {f"elastic-ctr:index:{c}" for c in ("Images", "Credentials", "FileServer", "TrackingServer",
                                                         "TrainingJob", "CubeCluster", "CubeTransfer", "Serving",
                                                         "NetworkPolicies", "Monitoring")}
    serving = next(inputs for typ, _, inputs in program.constructed if typ.endswith(":Serving"))
    assert serving["servingReplicas"] == 2.0 and isinstance(serving["servingReplicas"], float)  # a double
    assert "topologyConfigmap" in serving and "topology_configmap" not in serving  # schema names
    registered = {r["type"] for r in regs}
    assert types <= registered


def test_construct_object_store_variant_matches_the_python_program():
    python = python_program(STORE_OVERRIDES, STORE_SECRETS)
    regs, outputs, program = package_program(yaml.safe_load(STORE_PROGRAM), STORE_SECRETS)
    py_out, pkg_out = assert_same(python, (regs, outputs))
    for key in ("servingUrl", "modelRoot", "transferStatusUrl"):
        assert pkg_out[key] == py_out[key], key
    assert any(t.endswith(":ObjectStoreAccess") for t, _, _ in program.constructed)
    kinds = {m.split("-")[1] for m in manifests(regs)}
    assert "horizontalpodautoscaler" in kinds and "servicemonitor" not in kinds  # inflight HPA; annotations
    job = json.dumps(manifests(regs)["09-job-ctr-train.yaml"])
    assert '"--feature-min-count", "5"' in job and "--gate-window" in job  # the lifecycle's and data gate's flags


def test_construct_workload_identity_variant_matches_the_python_program():
    overrides = ["modelRoot=s3://ctr-bucket/model", "dataSource=s3://ctr-bucket/hours", "dataTestSource=s3://t/x",
                 "storageServiceAccountAnnotations=eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/ctr",
                 "storageReadServiceAccountAnnotations=eks.amazonaws.com/role-arn=arn:aws:iam::123456789012:role/r",
                 "networkPolicies=false", "grafanaDashboards=false", "trackingServer=false",
                 "monitoring=prometheus-operator", "monitoringLabels=release=kps,team=ctr", "freshnessSloSeconds=7200",
                 "servingP99Ms=50", "pserverBudgetRows=1000000", "cubeShardBudgetKeys=100000"]
    doc = yaml.safe_load(STORE_PROGRAM)
    deployment = {"namespace": "${ns.metadata.name}", "instance": "${instance}",
                  "credentials": "${credentials.secrets}", "identity": {
                      "write": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/ctr"},
                      "read": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/r"}}}
    doc["config"], doc["variables"]["deployment"] = {}, deployment
    resources = doc["resources"]
    for key in ("store", "network"):
        del resources[key]
    resources["images"]["properties"] = {"imageTag": "dev"}
    resources["credentials"]["properties"]["deployment"] = {"namespace": "${ns.metadata.name}",
                                                            "instance": "${instance}"}
    resources["training"]["properties"] = {k: v for k, v in resources["training"]["properties"].items()
                                           if k not in ("trackingUri", "trackingExperiment", "psMode", "pserverTableShards",
                                                        "trainingMode", "dataStartHour", "dataSchema", "gateWindow",
                                                        "featureMinCount", "featureTtlHours")}
    resources["training"]["properties"]["dataTestSource"] = "s3://t/x"
    resources["cube"]["properties"]["cubeShards"] = 2
    resources["transfer"]["properties"] = {k: v for k, v in resources["transfer"]["properties"].items()
                                           if not k.startswith(("tracking", "served", "keep", "modelGate"))}
    resources["serving"]["properties"] = {k: v for k, v in resources["serving"]["properties"].items()
                                          if not k.startswith(("servingMax", "servingAuto", "servingTarget", "dense"))}
    resources["monitoring"]["properties"] = {
        "deployment": "${deployment}", "parts": "${parts}", "monitoring": "prometheus-operator",
        "grafanaDashboards": False, "monitoringLabels": "release=kps,team=ctr", "freshnessSloSeconds": 7200,
        "servingP99Ms": 50, "pserverBudgetRows": 1000000, "cubeShardBudgetKeys": 100000}
    regs = package_program(doc, {})[0]
    assert_same(python_program(overrides), (regs, {}))
    rule = manifests(regs)["10-prometheusrule-monitoring-rules.yaml"]
    text = json.dumps(rule)
    assert "ElasticCtrPserverTableOverBudget" in text and "> 1e+06" in text  # the budgets' alerts
    assert "ElasticCtrCubeShardOverBudget" in text and rule["metadata"]["labels"]["release"] == "kps"


def test_construct_credentials_output_without_a_boundary_is_refused_naming_it():
    """``deployment.credentials`` given as another resource's output (``Credentials.secrets``)
    is read per trust boundary; one it lacks fails the deployment, naming the boundary."""
    import pulumi

    from provider import wiring

    def program():
        creds = wiring.credentials(pulumi.Output.from_input({"cube-control": "credentials-cube-control"}), "Serving")
        assert sorted(creds) == ["cube-control", "fileserver-read", "fileserver-write", "tracking"]
        return {"cube": creds["cube-control"], "tracking": creds["tracking"]}

    with pytest.raises(Exception, match="Serving: deployment.credentials has no Secret for the trust boundary "
                                        "'(tracking|fileserver-write|fileserver-read)' \\(it has \\['cube-control'\\]\\)"):
        run_program({}, set(), "dev", program=program)
