"""The site is published where the alerts link: .github/workflows/docs.yml builds it with
`make docs` (the docs' own packages only) on pushes to main and deploys it to GitHub Pages;
mkdocs.yml's site_url is the runbooks' base (runtime/metrics/rules.py)."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from runtime.metrics import rules

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github/workflows/docs.yml"


def _workflow() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def _uses(job: dict) -> dict[str, dict]:
    return {s["uses"].split("@")[0]: s for s in job["steps"] if "uses" in s}


def test_the_workflow_builds_with_make_docs_and_deploys_to_pages():
    wf = _workflow()
    assert wf["on"]["push"]["branches"] == ["main"] and "workflow_dispatch" in wf["on"]
    for path in ("docs/**", "mkdocs.yml", ".github/workflows/docs.yml"):
        assert path in wf["on"]["push"]["paths"], path
    assert wf["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    build, deploy = wf["jobs"]["build"], wf["jobs"]["deploy"]
    runs = [s["run"] for s in build["steps"] if "run" in s]
    assert any(re.match(r"make docs\b", r) for r in runs), runs
    site_dir = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_dir"]
    assert _uses(build)["actions/upload-pages-artifact"]["with"]["path"] == site_dir
    assert "actions/checkout" in _uses(build) and "actions/configure-pages" in _uses(build)
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert "actions/deploy-pages" in _uses(deploy)
    for job in (build, deploy):  # every action pinned to a major version
        assert all(re.fullmatch(r"[\w-]+/[\w-]+@v\d+", s["uses"]) for s in job["steps"] if "uses" in s)


def test_site_url_is_where_the_alerts_link():
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert cfg["site_url"] == rules.DOCS_SITE and cfg["site_url"].startswith("https://")
    assert cfg["use_directory_urls"] is False  # monitoring.html, as RUNBOOK_PAGE names it


def test_make_docs_needs_only_the_docs_packages():
    """`make docs` installs docs/requirements.txt into its own venv, not `make install`'s
    (Paddle, the browser, Prometheus); its mkdocs ranges are the dev extra's."""
    make = (ROOT / "Makefile").read_text()
    target = re.search(r"^docs: (.*)$", make, re.M).group(1).split()
    assert target == ["$(DOCS_VENV)/.installed"], target
    assert "-r docs/requirements.txt" in make
    docs = {l.split(">")[0].split("<")[0].split("=")[0]: l for l in (ROOT / "docs/requirements.txt").read_text().splitlines()
            if l and not l.startswith(("#", "-r"))}
    dev = {l.split(">")[0].split("<")[0].split("=")[0]: l for l in (ROOT / "requirements/dev.txt").read_text().splitlines()
           if l and not l.startswith(("#", "-r"))}
    assert set(docs) == {"mkdocs", "mkdocs-material"} and all(docs[k] == dev[k] for k in docs)
