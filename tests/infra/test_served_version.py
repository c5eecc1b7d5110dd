"""The stack keys ``servedVersion`` (pin / rollback) and ``keepVersions`` (retention):
validated, passed to the cube transfer as flags, and shown in the preview as an update
of the transfer's Deployment only."""
from __future__ import annotations

import pytest

from infra import preview
from infra.config import ConfigError
from infra.config_load import parse
from tests.helpers import flag


def _transfer_args(rendering) -> list[str]:
    (dep,) = [m for m in rendering.manifests if m.kind == "Deployment" and m.name == "cube-transfer"]
    (c,) = dep.body["spec"]["template"]["spec"]["containers"]
    return list(c["args"])


def test_served_version_pins_the_transfer_and_shows_in_the_preview(rendered):
    before, pinned = rendered("dev"), rendered("dev", "servedVersion=1795869144")
    assert "--pin-version" not in _transfer_args(before)
    assert flag(_transfer_args(pinned), "--pin-version") == "1795869144"
    steps = {(s.op, s.kind, s.name): s.paths for s in preview.preview(before, pinned, True)}
    assert list(steps) == [("update", "Deployment", "cube-transfer")]
    (paths,) = steps.values()
    assert any(p.startswith("spec.template.spec.containers[0].args") for p in paths), paths
    # unset again: back to following training
    assert {(s.op, s.kind, s.name) for s in preview.preview(pinned, before, True)} == {
        ("update", "Deployment", "cube-transfer")}


def test_keep_versions_flag(rendered):
    assert flag(_transfer_args(rendered("dev", "keepVersions=24")), "--keep-versions") == "24"
    assert "--keep-versions" not in _transfer_args(rendered("dev"))


@pytest.mark.parametrize("key,value,why", [
    ("servedVersion", "'v12'", "empty (follow training) or a version id (digits)"),
    ("keepVersions", "-1", "an integer in [0, 100000]"),
])
def test_bad_values_are_named(key, value, why):
    with pytest.raises(ConfigError) as err:
        parse({key: value.strip("'")})
    assert f"elastic-ctr:{key}: {value} is invalid; allowed: {why}" in str(err.value)
