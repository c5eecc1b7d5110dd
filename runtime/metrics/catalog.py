"""Every metric the pipeline exposes, gathered from the roles' own definitions (nothing is
listed twice): each role's metrics are made as the role makes them and their families
read back, with the series a family gives in the text format (``_total``, ``_bucket`` /
``_sum`` / ``_count``), Prometheus' own ``up`` and the recording rules' names. Used by the
tests that check every dashboard query and alert expression (``unknown_metrics``) and by
docs/monitoring.md's metric table (``families``).
"""
from __future__ import annotations

import re
from typing import Iterable, Optional

#: series Prometheus adds to every target itself
SYNTHETIC = ("up", "scrape_duration_seconds", "scrape_samples_scraped")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan", "atan2"}


def _registries() -> dict[str, object]:
    """``{job: registry}`` of every role, made as the roles make them (role spec names)."""
    from prometheus_client import CollectorRegistry

    from runtime.cube.server.core import CubeServer
    from runtime.metrics.cube import AgentMetrics, server_registry
    from runtime.metrics.fileserver import FileServerMetrics
    from runtime.metrics.trainer import TrainerMetrics
    from runtime.metrics.transfer import TransferMetrics
    from runtime.metrics import serving as serving_metrics

    serving_cls = getattr(serving_metrics, "ServingMetrics", None) or getattr(serving_metrics, "Metrics")
    pserver = CollectorRegistry()
    from prometheus_client import ProcessCollector

    ProcessCollector(registry=pserver)  # the pserver exporter's (the pserver's process)
    server = CubeServer(0, 1, "catalog", host="127.0.0.1", port=0, http_port=0)
    return {"trainer": TrainerMetrics().registry, "pserver": pserver, "cube-server": server_registry(server),
            "cube-agent": AgentMetrics().registry, "cube-transfer": TransferMetrics().registry,
            "fileserver": FileServerMetrics().registry, "serving": serving_cls().registry}


def families() -> list[tuple[str, str, str, str]]:
    """``(job, family name, type, help)`` of every role's families (``process_*`` once)."""
    out, seen = [], set()
    for job, reg in _registries().items():
        for fam in reg.collect():
            if fam.name.startswith("process_"):
                if fam.name in seen:
                    continue
                job_of = "every role"
            else:
                job_of = job
            seen.add(fam.name)
            out.append((job_of, fam.name, fam.type, fam.documentation))
    return out


def series(name: str, typ: str) -> tuple[str, ...]:
    """The series names a family of ``typ`` named ``name`` gives in the text format."""
    if typ == "counter":
        return (name + "_total",)
    if typ == "histogram":
        return (name + "_bucket", name + "_sum", name + "_count")
    if typ == "summary":
        return (name, name + "_sum", name + "_count")
    return (name,)


def series_names() -> set[str]:
    """Every series name a query may name: the roles', Prometheus' own, the recording rules'."""
    from runtime.metrics.rules import recording_rules

    names = {s for _, name, typ, _ in families() for s in series(name, typ)}
    return names | set(SYNTHETIC) | {r["record"] for r in recording_rules()}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (string literals, label matchers,
    ranges, grouping labels, functions and keywords left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    out = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        if word.lower() in _KEYWORDS or e[m.end():].lstrip().startswith("("):
            continue
        out.add(word)
    return out


def unknown_metrics(expr: str, known: Optional[Iterable[str]] = None) -> set[str]:
    """The metric names ``expr`` selects that no role exposes (``known``: default
    ``series_names()``)."""
    known = set(known) if known is not None else series_names()
    return metric_names(expr) - known
