"""The pinned versions (requirements/constraints.txt) cover every requirement and sit within
its supported range, so the pins and the ranges cannot drift apart. (The Dockerfile is
checked by building it: tests/containers.)"""
from __future__ import annotations

import re
from pathlib import Path

from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]


def _names(path: Path) -> dict[str, str]:
    """requirement name (normalized) -> its specifier text, from a requirements file."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            m = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)", line)  # name, extras, specifier
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(3).strip()
    return out


def test_constraints_pin_every_requirement_within_its_range():
    pins = _names(REPO / "requirements" / "constraints.txt")
    assert all(spec.startswith("==") for spec in pins.values()), pins
    # tritonclient.txt, kserve.txt, nca.txt and checkov.txt pin their own venvs (the test client's, the
    # benchmark peer's, the analyzers'; exact versions already, outside the project's constraints)
    own_venvs = ("tritonclient.txt", "kserve.txt", "nca.txt", "checkov.txt")
    files = sorted(p for p in (REPO / "requirements").glob("*.txt") if p.name not in ("constraints.txt", *own_venvs))
    assert {p.name for p in files} >= {"base.txt", "paddle.txt", "serving.txt", "cube.txt", "infra.txt", "dev.txt"}
    for f in files:
        for name, spec in _names(f).items():
            assert name in pins, f"{f.name}: {name} has no pin in constraints.txt"
            assert SpecifierSet(spec).contains(pins[name][2:], prereleases=True), (f.name, name, spec, pins[name])
