"""Components are reusable: two of each in one stack, named differently, declare distinct
resources (Pulumi names and Kubernetes names) with selectors that do not overlap."""
from __future__ import annotations

from collections import Counter

import pytest

from components import (CubeCluster, CubeClusterArgs, CubeTransfer, CubeTransferArgs, DeployContext, FileServer,
                        FileServerArgs, Images, ImagesArgs, Serving, ServingArgs, TrainingJob, TrainingJobArgs)
from infra.config import REPO_ROOT
from infra.render import run_program, to_manifest


def _two_of_each() -> dict:
    import pulumi

    from runtime.role_specs import CREDENTIAL_BOUNDARIES

    # the credentials' Secrets are the stack's (components.credentials): shared by both of each
    dep = DeployContext(namespace="ns", instance="elastic-ctr-test",
                        credentials={b: f"credentials-{b}" for b in CREDENTIAL_BOUNDARIES})
    out = {}
    for tag in ("a", "b"):
        images = Images(f"images-{tag}", ImagesArgs(repo_root=REPO_ROOT, registry="", tag=tag))
        files = FileServer(f"files-{tag}", FileServerArgs(
            deployment=dep, image=images.cube, upload_token=pulumi.Output.secret("t" * 32), cpu="1", memory="1Gi",
            storage_size="1Gi"))
        TrainingJob(f"train-{tag}", TrainingJobArgs(
            deployment=dep, image=images.trainer, queue="default", pservers=1, trainers=2, pserver_cpu="1",
            pserver_memory="1Gi", trainer_cpu="1", trainer_memory="1Gi", epochs=1, batch_size=512, learning_rate=0.002,
            embedding_dim=9, pserver_table_shards=8, data_train=["generated"], data_test=[], data_format="criteo",
            output=files.url, upload_token_secret=files.token_secret, upload_token_key=files.token_key))
        cube = CubeCluster(f"cube-{tag}", CubeClusterArgs(
            deployment=dep, image=images.cube, shards=2, replicas=2, server_cpu="1", server_memory="1Gi",
            agent_cpu="1", agent_memory="1Gi", data_size="1Gi"))
        transfer = CubeTransfer(f"transfer-{tag}", CubeTransferArgs(
            deployment=dep, image=images.cube, topology_configmap=cube.topology_configmap,
            topology_checksum=cube.topology_checksum, root=files.url, upload_token_secret=files.token_secret,
            upload_token_key=files.token_key, cpu="1", memory="1Gi", state_size="1Gi"))
        serving = Serving(f"serving-{tag}", ServingArgs(
            deployment=dep, image=images.serving, topology_configmap=cube.topology_configmap,
            topology_checksum=cube.topology_checksum, model_root=files.url, transfer_url=transfer.url, replicas=1,
            cpu="1", memory="1Gi"))
        out[tag] = {"serving": serving.url, "transfer": transfer.url, "files": files.url, "topology": cube.topology}
    return out


@pytest.fixture(scope="module")
def stack():
    return run_program({}, set(), "test", program=_two_of_each)


def test_two_of_each_component_declare_distinct_resources(stack):
    resources, outputs = stack
    components = Counter(x["type"] for x in resources if x["type"].startswith("elastic-ctr:index:"))
    assert components == {f"elastic-ctr:index:{n}": 2 for n in
                          ("Images", "FileServer", "TrainingJob", "CubeCluster", "CubeTransfer", "Serving")}
    manifests = [m for m in (to_manifest(x) for x in resources) if m is not None]
    keys = [(m.kind, m.name) for m in manifests]
    assert len(keys) == len(set(keys)), [k for k, n in Counter(keys).items() if n > 1]
    pulumi_names = [(x["type"], x["name"]) for x in resources]
    assert len(pulumi_names) == len(set(pulumi_names))
    assert {m.name for m in manifests if m.kind == "StatefulSet"} == {
        "cube-a-2s-shard-0", "cube-a-2s-shard-1", "cube-b-2s-shard-0", "cube-b-2s-shard-1"}
    # outputs are Outputs resolved per component, pointing at that component's Services
    assert outputs["a"]["serving"] == "http://serving-a.ns.svc.cluster.local:8000"
    assert outputs["b"]["transfer"] == "http://transfer-b.ns.svc.cluster.local:8910"
    assert outputs["a"]["topology"]["shards"][1]["replicas"][0]["server"] == (
        "cube-a-2s-shard-1-0.cube-a-2s-shard-1.ns.svc.cluster.local:8900")


def test_selectors_do_not_overlap(stack):
    """No Service or workload of one instance selects the pods of another."""
    resources, _ = stack
    manifests = [m for m in (to_manifest(x) for x in resources) if m is not None]
    pods = []  # (owner, pod labels)
    selectors = []  # (owner, selector)
    for m in manifests:
        spec = m.body.get("spec", {})
        if m.kind in ("Deployment", "StatefulSet"):
            pods.append((m.name, spec["template"]["metadata"]["labels"]))
            selectors.append((f"{m.kind}/{m.name}", spec["selector"]["matchLabels"], m.name))
        elif m.kind == "Service" and spec.get("selector"):
            selectors.append((f"Service/{m.name}", spec["selector"], m.name))
    for owner, sel, name in selectors:
        matched = {pod for pod, labels in pods if all(labels.get(k) == v for k, v in sel.items())}
        assert matched == {name}, (owner, matched)
