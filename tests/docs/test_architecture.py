"""The architecture diagram (docs/hooks/architecture.py) draws what the stack allows: its
arrows are the flows the rendered dev stack's NetworkPolicies admit (tests/golden/dev),
no more and no fewer, and every box names a role's ports as ``runtime.role_specs`` has them."""
from __future__ import annotations

import importlib.util
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from runtime.role_specs import PORTS

ROOT = Path(__file__).resolve().parents[2]
NAME, TASK, NS = "app.kubernetes.io/name", "elastic-ctr.io/task", "kubernetes.io/metadata.name"
#: the pod groups of the rendered NetworkPolicies -> the diagram's boxes
GROUPS = {"serving": "serving", "cube-transfer": "transfer", "cube-server": "cube", "fileserver": "fileserver",
          "tracking": "tracking"}


def _hook():
    spec = importlib.util.spec_from_file_location("docs_architecture_hook", ROOT / "docs/hooks/architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _boxes(labels: dict) -> set[str]:
    """The diagram boxes a pod selector's ``matchLabels`` select."""
    if labels.get("elastic-ctr.io/serving-client") == "true":
        return {"clients"}
    name = labels.get(NAME)
    if name == "ctr-train":
        return {labels[TASK]} if TASK in labels else {"trainer", "pserver"}
    return {GROUPS[name]}


def allowed_flows() -> set[tuple[str, str]]:
    """(from, to) of every ingress rule of the dev stack's NetworkPolicies."""
    out = set()
    for f in sorted((ROOT / "tests/golden/dev").glob("01-networkpolicy-*.yaml")):
        doc = yaml.safe_load(f.read_text())
        targets = _boxes(doc["spec"]["podSelector"].get("matchLabels") or {}) if doc["spec"]["podSelector"] else set()
        for rule in doc["spec"].get("ingress") or []:
            for peer in rule.get("from") or []:
                if (peer.get("namespaceSelector") or {}).get("matchLabels", {}).get(NS) == "monitoring":
                    sources = {"monitoring"}
                else:
                    sources = _boxes(peer["podSelector"].get("matchLabels") or {})
                out |= {(s, t) for s in sources for t in targets}
    return out


def test_the_arrows_are_the_flows_the_network_policies_allow():
    hook = _hook()
    drawn = {(a, b) for a, b, _, _ in hook.FLOWS}
    allowed = allowed_flows()
    outside = {k for k, n in hook.NODES.items() if n.outside and k != "clients"}
    # Prometheus scrapes every role: one arrow stands for all its flows
    scraped = {t for s, t in allowed if s == "monitoring"}
    assert scraped == {k for k, n in hook.NODES.items() if not n.outside} - {"tracking"}
    assert {(a, b) for a, b in drawn if not {a, b} & outside} == {(s, t) for s, t in allowed if s != "monitoring"}
    assert ("trainer", "data") in drawn and ("monitoring", "serving") in drawn


def test_the_boxes_name_the_role_specs_ports():
    hook = _hook()
    text = " ".join(" ".join(n.lines) for n in hook.NODES.values())
    for role, port in (("serving", "http"), ("serving", "grpc"), ("cube-transfer", "http"), ("fileserver", "http"),
                       ("cube-server", "data"), ("cube-agent", "agent"), ("tracking", "http"), ("pserver", "gloo")):
        assert f"{port} {PORTS[role][port]}" in text, (role, port)


def test_the_svg_is_well_formed_and_plain():
    svg = _hook().svg()
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert "<script" not in svg and "http://" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert len(re.findall(r'class="box', svg)) == len(_hook().NODES)
