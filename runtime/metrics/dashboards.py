"""The Grafana dashboards (data files: ``monitoring/dashboards/*.json``, Grafana's dashboard
JSON model, one file per dashboard): the pipeline overview and one per role group
(serving, cube, training). The stack ships each as a ConfigMap labelled for Grafana's
dashboard sidecar (``components/monitoring.py``); the tests evaluate every panel's query
against a real Prometheus (``tests/monitoring``) and check that each names metrics that
exist (``runtime.metrics.catalog``).

Queries use the dashboard's variables: ``$datasource`` (a Prometheus), ``$namespace`` (the
stack's namespace; "All" is ``.*``, which also matches the local pipeline's series, which
have no namespace), and Grafana's ``$__rate_interval`` and ``$__range``; ``expand``
replaces them for an evaluation outside Grafana.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

#: where the dashboard files live (in the repository)
DIR = Path(__file__).resolve().parents[2] / "monitoring" / "dashboards"


class DashboardError(ValueError):
    """A dashboard file is not what this module reads; the message names the file and the panel."""


@dataclass(frozen=True)
class Query:
    """One query of one panel: ``dashboard`` (uid), ``panel`` (title), ``ref`` (refId), ``expr``."""

    dashboard: str
    panel: str
    ref: str
    expr: str


def files(directory: Path = DIR) -> list[Path]:
    """The dashboard files, sorted by name."""
    return sorted(directory.glob("*.json"))


def load(path: Path) -> dict:
    """One dashboard's JSON model. Raises ``DashboardError`` naming the file when it is not
    a dashboard with a ``uid``, a ``title`` and panels whose targets all have an ``expr``."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DashboardError(f"{path}: not a JSON file ({exc})") from None
    for key in ("uid", "title", "panels"):
        if not doc.get(key):
            raise DashboardError(f"{path}: no {key!r}")
    for p in panels(doc):
        for t in p.get("targets") or []:
            if not isinstance(t.get("expr"), str) or not t["expr"].strip():
                raise DashboardError(f"{path}: panel {p.get('title')!r} target {t.get('refId')}: no expr")
        if not p.get("targets"):
            raise DashboardError(f"{path}: panel {p.get('title')!r} has no query")
    return doc


def panels(doc: dict) -> Iterator[dict]:
    """Every panel of ``doc`` that shows data (rows' nested panels included, rows left out)."""
    for p in doc.get("panels", []):
        if p.get("type") == "row":
            yield from (q for q in p.get("panels", []) if q.get("type") != "row")
        else:
            yield p


def queries(directory: Path = DIR) -> list[Query]:
    """Every panel query of every dashboard."""
    out = []
    for f in files(directory):
        doc = load(f)
        for p in panels(doc):
            for t in p["targets"]:
                out.append(Query(doc["uid"], p["title"], t.get("refId", ""), t["expr"]))
    return out


def expand(expr: str, rate_interval: str = "1m", range_: str = "1h", namespace: str = ".*") -> str:
    """``expr`` with the dashboards' variables replaced (``$__rate_interval``, ``$__range``,
    ``$namespace``) for an evaluation outside Grafana."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
            .replace("$namespace", namespace))


def configmap_data(directory: Path = DIR) -> dict[str, dict[str, str]]:
    """``{uid: {"<uid>.json": text}}``: one ConfigMap's data per dashboard (Grafana's
    sidecar loads each key as a dashboard file)."""
    out = {}
    for f in files(directory):
        doc = load(f)
        out[doc["uid"]] = {f"{doc['uid']}.json": json.dumps(doc, indent=1, sort_keys=True)}
    return out
