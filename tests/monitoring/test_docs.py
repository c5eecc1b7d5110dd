"""docs/monitoring.md keeps up with the code: every metric family a role exposes is named
there, and every alert's runbook section exists under the anchor its ``runbook_url`` names."""
from __future__ import annotations

import re
from pathlib import Path

from runtime.metrics import catalog
from runtime.metrics import rules

PAGE = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"


def test_every_metric_family_is_documented():
    text = PAGE.read_text()
    missing = []
    for _, name, typ, _ in catalog.families():
        if name.startswith("process_"):
            continue
        short = name.removeprefix("elastic_ctr_")
        if not any(f"`{s.removeprefix('elastic_ctr_')}" in text for s in catalog.series(name, typ) + (name,)):
            missing.append(short)
    assert not missing, f"not in docs/monitoring.md: {missing}"


def test_every_alert_has_its_runbook_section():
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", PAGE.read_text()))
    for alert in rules.alerts():
        assert alert.anchor in anchors, alert.name
        url = alert.rule()["annotations"]["runbook_url"]
        assert url == f"{rules.DOCS_SITE}monitoring.html#{alert.anchor}" and url.startswith("https://")
