"""The alerts' runbook links open: every ``runbook_url`` of a stack's PrometheusRule is an
absolute URL into the published documentation site (mkdocs.yml's ``site_url``), whose
monitoring page has the anchor; a stack setting ``monitoringRunbookUrl`` to anything but an
absolute http(s) URL is refused, naming the key and what is allowed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from infra.config import ConfigError
from infra.config_load import parse
from runtime.metrics import rules

ROOT = Path(__file__).resolve().parents[2]
OK = {"uploadToken": "t" * 32}


def _site_url() -> str:
    # mkdocs.yml holds no YAML tags mkdocs alone knows (safe_load reads it)
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_url"]


def test_the_default_runbook_page_is_the_published_monitoring_page():
    assert rules.DOCS_SITE == _site_url()
    assert rules.RUNBOOK_PAGE == _site_url() + "monitoring.html"  # use_directory_urls: false
    assert parse(OK, {"uploadToken"}).monitoring_runbook_url == rules.RUNBOOK_PAGE


def test_the_rendered_prometheus_rule_links_absolute_runbook_anchors():
    """The dev stack (monitoring: prometheus-operator) as the golden rendering holds it."""
    rule_file = next((ROOT / "tests/golden/dev").glob("*-prometheusrule-*.yaml"))
    doc = yaml.safe_load(rule_file.read_text())
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", (ROOT / "docs/monitoring.md").read_text()))
    urls = [r["annotations"]["runbook_url"] for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert urls and len(urls) == sum(1 for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r)
    for url in urls:
        page, _, anchor = url.partition("#")
        assert page == rules.RUNBOOK_PAGE and page.startswith("https://"), url
        assert anchor in anchors, url


@pytest.mark.parametrize("value", ["docs/monitoring.md", "/monitoring.html", "ftp://h/m.html",
                                   "https://h/monitoring.html#served-data-stale", "https:///m.html"])
def test_a_runbook_url_that_does_not_open_is_refused(value):
    with pytest.raises(ConfigError) as exc:
        parse({**OK, "monitoringRunbookUrl": value}, {"uploadToken"})
    assert any(e.startswith(f"elastic-ctr:monitoringRunbookUrl: {value!r}") or
               e.startswith(f"elastic-ctr:monitoringRunbookUrl: {value}") for e in exc.value.errors), exc.value.errors
    assert "an absolute http(s) URL" in " ".join(exc.value.errors)


def test_a_site_of_ones_own_is_taken():
    cfg = parse({**OK, "monitoringRunbookUrl": "https://docs.example.com/ctr/monitoring.html"}, {"uploadToken"})
    rule = rules.rule_groups(runbook=cfg.monitoring_runbook_url)[1]["rules"][0]
    assert rule["annotations"]["runbook_url"].startswith("https://docs.example.com/ctr/monitoring.html#")
