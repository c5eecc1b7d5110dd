"""`elastic-ctr render`: writes one file per resource, replaces stale ones, reports errors."""
from __future__ import annotations

import json

from runtime.cli import main


def test_render_writes_manifests_and_outputs(tmp_path, capsys):
    out = tmp_path / "dev"
    out.mkdir()
    (out / "05-statefulset-cube-3s-shard-9.yaml").write_text("stale")
    (out / "README.txt").write_text("kept")
    assert main(["render", "--stack", "dev", "--set", "cubeShards=3", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert "05-statefulset-cube-3s-shard-2.yaml" in names
    assert "05-statefulset-cube-3s-shard-9.yaml" not in names and "README.txt" in names
    # 21 + the training-shared PVC + the tracking server's Deployment, Service and PVC + monitoring:
    # 5 ServiceMonitors, 2 PodMonitors, a PrometheusRule and 4 dashboards' ConfigMaps
    # + security: 8 NetworkPolicies, 7 ServiceAccounts (one per workload, the cube layout's one), 4 credentials Secrets,
    # the tracking server's basic-auth ConfigMap
    assert len([n for n in names if n.endswith(".yaml")]) == 57
    outputs = json.loads((out / "outputs.json").read_text())
    assert outputs["servingUrl"] == "http://serving.elastic-ctr-dev.svc.cluster.local:8000"
    assert outputs["servingGrpcTarget"] == "serving.elastic-ctr-dev.svc.cluster.local:8001"
    assert "57 manifests for stack dev" in capsys.readouterr().out


def test_render_reports_config_errors(tmp_path, capsys):
    rc = main(["render", "--stack", "dev", "--set", "trainers=0", "--set", "cubeReplicas=99",
               "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "elastic-ctr:trainers: 0 is invalid; allowed: an integer in [1, 128]" in err
    assert "elastic-ctr:cubeReplicas: 99 is invalid; allowed: an integer in [1, 16]" in err
    assert not (tmp_path / "x").exists()


def test_render_unknown_stack(capsys):
    assert main(["render", "--stack", "nope"]) == 2
    assert "Pulumi.nope.yaml" in capsys.readouterr().err
