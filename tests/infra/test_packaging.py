"""Static checks of the Dockerfiles, .dockerignore and the preview workflow (no Docker here)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("role", ["trainer", "cube", "serving"])
def test_dockerfile(role):
    text = (REPO / "runtime" / role / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), base  # pinned slim 3.11 tag
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    assert "requirements/runtime.txt" in text
    assert "-c requirements/constraints.txt" in text  # exact versions the tests ran with
    assert re.search(r"useradd .*--uid 10001", text, re.S)
    assert text.rstrip().splitlines()[-3:] == [
        "USER 10001:10001", 'ENTRYPOINT ["elastic-ctr"]', 'CMD ["--help"]']
    assert ("paddlepaddle" in text) == (role == "cube")  # cube filters Paddle out


def _names(path: Path) -> dict[str, str]:
    """requirement name (normalized) -> its specifier text, from a requirements file."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            m = re.match(r"([A-Za-z0-9_.-]+)(.*)", line)
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2).strip()
    return out


def test_constraints_pin_every_requirement_within_its_range():
    """Every package the requirement files name has an exact version in constraints.txt,
    and that version satisfies the file's range (so the pins and ranges cannot drift)."""
    from packaging.specifiers import SpecifierSet

    pins = _names(REPO / "requirements" / "constraints.txt")
    assert all(spec.startswith("==") for spec in pins.values()), pins
    for f in ("runtime.txt", "infra.txt", "dev.txt"):
        for name, spec in _names(REPO / "requirements" / f).items():
            assert name in pins, f"{f}: {name} has no pin in constraints.txt"
            assert SpecifierSet(spec).contains(pins[name][2:], prereleases=True), (f, name, spec, pins[name])
    make = (REPO / "Makefile").read_text()
    assert "-c requirements/constraints.txt" in make


def test_dockerignore_keeps_the_context_small():
    lines = [ln for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert lines[0] == "*"  # allow-list: .venv, runs, tests, data, .git all excluded
    assert {"!runtime/", "!requirements/"} <= set(lines)


def test_preview_workflow():
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "preview.yml").read_text())
    assert "pull_request" in wf[True]  # YAML 1.1 reads the key `on` as True
    steps = wf["jobs"]["preview"]["steps"]
    (pulumi,) = [s for s in steps if str(s.get("uses", "")).startswith("pulumi/actions@")]
    assert pulumi["with"]["command"] == "preview" and pulumi["with"]["diff"] is True
    assert pulumi["with"]["comment-on-pr"] is True
    assert set(wf["jobs"]["preview"]["strategy"]["matrix"]["stack"]) == {"dev", "prod"}
    assert wf["permissions"]["pull-requests"] == "write"
