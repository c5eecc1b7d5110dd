"""checkov (Bridgecrew's IaC scanner, in .venv-checkov: ``make install``) on the dev and prod
renderings, written to YAML files as ``elastic-ctr render`` writes them: no failed check
outside tests/infra/checkov-baseline.yaml, where each entry gives its reason, and no entry
there that no longer fails (the baseline only shrinks)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.config import REPO_ROOT
from infra.render import write
from tests import tools

CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"
BASELINE = Path(__file__).resolve().parent / "checkov-baseline.yaml"


def failed_checks(rendering, out: Path) -> set[tuple[str, str]]:
    """``{(check id, "Kind/name")}`` of checkov's failed Kubernetes checks on ``rendering``."""
    tools.need([CHECKOV], "checkov", "make .venv-checkov/.installed (needs Python 3.11: NCA_PYTHON)")
    write(rendering, out)
    for extra in out.glob("*.json"):  # outputs.json, dependencies.json: not manifests
        extra.unlink()
    proc = subprocess.run([str(CHECKOV), "-d", str(out), "--framework", "kubernetes", "--quiet", "--compact",
                           "-o", "json", "--skip-download"], capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert reports and all(r["summary"]["parsing_errors"] == 0 for r in reports), proc.stdout[-2000:]
    out_set = set()
    for r in reports:
        for f in r["results"]["failed_checks"]:
            kind, _, name = f["resource"].split(".", 2)  # Kind.namespace.name
            out_set.add((f["check_id"], f"{kind}/{name}"))
    return out_set


def baseline(stack: str) -> dict[tuple[str, str], str]:
    entries = yaml.safe_load(BASELINE.read_text())
    for e in entries:
        assert str(e.get("reason", "")).strip(), f"{BASELINE.name}: {e} has no reason"
    return {(e["check"], e["resource"]): e["reason"] for e in entries if stack in e["stacks"]}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_failed_check_outside_the_baseline(rendered, stack, tmp_path):
    failed = failed_checks(rendered(stack), tmp_path / stack)
    accepted = baseline(stack)
    assert not failed - set(accepted), f"checkov fails on {stack} outside {BASELINE.name}: {sorted(failed - set(accepted))}"
    assert not set(accepted) - failed, (f"{BASELINE.name}: these entries no longer fail on {stack}, remove them: "
                                        f"{sorted(set(accepted) - failed)}")


def test_checkov_sees_pods_no_network_policy_selects(rendered, tmp_path):
    """The scan is not vacuous: without the NetworkPolicies checkov's graph check fails every workload."""
    failed = failed_checks(rendered("dev", "networkPolicies=false"), tmp_path / "open")
    # checkov names the pods of a workload Pod/<workload>.<its labels>
    unselected = {res.split("/", 1)[1].split(".", 1)[0] for check, res in failed if check == "CKV2_K8S_6"}
    assert {"serving", "cube-2s-shard-0", "cube-transfer", "fileserver", "tracking"} <= unselected, failed
