"""The dev stack's rendering equals tests/golden/dev (refresh: `make golden`)."""
from __future__ import annotations

import json
from pathlib import Path

from infra.render import DEPENDENCIES, dump

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "dev"
HINT = "the dev rendering changed; review it, then refresh with `make golden`"


def test_dev_rendering_matches_golden(rendered):
    r = rendered("dev")
    assert GOLDEN.is_dir(), f"{GOLDEN} missing: run `make golden`"
    expected = {p.name: p.read_text() for p in GOLDEN.glob("*.yaml")}
    actual = {m.filename: dump(m.body) for m in r.manifests}
    assert sorted(actual) == sorted(expected), HINT
    for name, text in actual.items():
        assert text == expected[name], f"{name}: {HINT}"
    outputs = json.loads((GOLDEN / "outputs.json").read_text())
    assert outputs == r.outputs, HINT
    assert json.loads((GOLDEN / DEPENDENCIES).read_text()) == r.dependencies(), HINT
