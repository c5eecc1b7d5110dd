"""mkdocs hook: the architecture diagram (``img/architecture.svg``), drawn at build time, never
committed: what runs where (the stack's workloads in its namespace, and what is outside it)
and who connects to whom, on which port.

The nodes are the roles of ``runtime.role_specs`` (their names and ``PORTS``); the arrows
are ``FLOWS``, each from the side that opens the connection to the one that listens.
``tests/docs/test_architecture.py`` checks ``FLOWS`` against the NetworkPolicies of the
rendered dev stack (``tests/golden/dev``): an arrow the stack does not allow, or a flow it
allows without an arrow, fails the test. The SVG is plain (boxes, lines, text: no script,
no web font), so the page shows it from ``file://`` too.
"""
from __future__ import annotations

import math
from html import escape
from typing import NamedTuple, Optional

from runtime.role_specs import PORTS

#: the generated image, relative to ``docs/``
IMAGE = "img/architecture.svg"

#: grid geometry (px)
COL_W, ROW_H, BOX_W, BOX_H, LEFT, TOP = 240, 108, 184, 62, 70, 20


class Node(NamedTuple):
    """A box: ``key`` (the name ``FLOWS`` and the test use), its title and up to two
    lines under it, its grid cell, and whether it is outside the stack's namespace."""

    key: str
    title: str
    lines: tuple[str, ...]
    col: float
    row: float
    outside: bool = False

    @property
    def center(self) -> tuple[float, float]:
        return LEFT + self.col * COL_W + BOX_W / 2, TOP + self.row * ROW_H + BOX_H / 2


def _ports(role: str, *names: str) -> str:
    return ", ".join(f"{n} {PORTS[role][n]}" for n in names)


NODES = {n.key: n for n in (
    Node("data", "partitions", ("ROOT/YYYYMMDD/HH/", "HTTP, S3, HDFS, files"), 0, 0, outside=True),
    Node("trainer", "trainers", ("Volcano Job task", _ports("trainer", "paddle")), 0, 1.35),
    Node("pserver", "pservers", ("Volcano Job task", _ports("pserver", "paddle", "gloo")), 1.3, 1.35),
    Node("fileserver", "file server", ("Deployment (or S3)", _ports("fileserver", "http")), 0, 2.7),
    Node("tracking", "tracking (MLflow)", ("Deployment", _ports("tracking", "http")), 1.3, 2.7),
    Node("transfer", "cube transfer", ("Deployment", _ports("cube-transfer", "http")), 1.3, 3.85),
    Node("cube", "cube: shard x replica", ("StatefulSet per shard", "server " + _ports("cube-server", "data")
                                                                    + ", " + _ports("cube-agent", "agent")), 0, 5),
    Node("serving", "serving", ("Deployment (+ HPA)", _ports("serving", "http", "grpc")), 1.3, 6.15),
    Node("clients", "clients", ("label elastic-ctr.io/", "serving-client=true"), 1.3, 7.5, outside=True),
    Node("monitoring", "Prometheus", ("namespace monitoring:", "every role's metrics port"), 2.6, 6.15, outside=True),
)}

#: who connects to whom: (from, to, what, bend): ``bend`` bows a line that would cross a box; a
#: pair listed both ways is one line with an arrowhead at each end (the entry with the label)
FLOWS: tuple[tuple[str, str, str, float], ...] = (
    ("trainer", "data", "reads partitions", 0),
    ("trainer", "pserver", "paddle, gloo", 0),
    ("pserver", "trainer", "", 0),
    ("pserver", "pserver", "gloo", 0),
    ("trainer", "trainer", "paddle (geo)", 0),
    ("trainer", "fileserver", "uploads a version", 0),
    ("trainer", "tracking", "runs, metrics", 0),
    ("transfer", "fileserver", "donefile, shard tars", 0),
    ("transfer", "tracking", "rollout runs", 0),
    ("transfer", "cube", "agents: roll out", 0),
    ("cube", "fileserver", "agent downloads", 0),
    ("serving", "cube", "lookups (data)", 0),
    ("serving", "transfer", "/dict/info", 0),
    ("serving", "fileserver", "dense model", -60),
    ("clients", "serving", "v2 REST, gRPC", 0),
    ("monitoring", "serving", "scrapes every role", 0),
)


def on_files(files, config):
    """mkdocs event: adds the generated diagram to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, IMAGE, content=svg()))
    return files


def _edge_point(node: Node, toward: tuple[float, float]) -> tuple[float, float]:
    """Where the line from ``node``'s center toward ``toward`` leaves its box."""
    cx, cy = node.center
    dx, dy = toward[0] - cx, toward[1] - cy
    if dx == dy == 0:
        return cx, cy
    sx = (BOX_W / 2) / abs(dx) if dx else math.inf
    sy = (BOX_H / 2) / abs(dy) if dy else math.inf
    s = min(sx, sy)
    return cx + dx * s, cy + dy * s


def _arrow(a: Node, b: Node, label: str, bend: float, both: bool = False) -> str:
    if a.key == b.key:  # among the pods of one task: a loop above the box
        x, y = a.center[0] + BOX_W / 4, TOP + a.row * ROW_H
        return (f'<path d="M {x - 12} {y} C {x - 30} {y - 34}, {x + 30} {y - 34}, {x + 12} {y}" class="flow" '
                f'marker-end="url(#arrow)"/><text x="{x + 24}" y="{y - 18}" class="label">{escape(label)}</text>')
    (ax, ay), (bx, by) = a.center, b.center
    mx, my = (ax + bx) / 2, (ay + by) / 2 + bend
    p0, p1 = _edge_point(a, (mx, my)), _edge_point(b, (mx, my))
    path = f"M {p0[0]:.1f} {p0[1]:.1f} Q {mx:.1f} {my + bend:.1f} {p1[0]:.1f} {p1[1]:.1f}"
    lx, ly = (p0[0] + 2 * mx + p1[0]) / 4, (p0[1] + 2 * (my + bend) + p1[1]) / 4
    dashed = " dashed" if a.outside and a.key == "monitoring" else ""
    if abs(p1[0] - p0[0]) < 1:  # vertical: the label beside the line
        text = f'<text x="{lx + 6:.1f}" y="{ly + 4:.1f}" class="label">{escape(label)}</text>'
    else:
        text = f'<text x="{lx:.1f}" y="{ly - 5:.1f}" class="label" text-anchor="middle">{escape(label)}</text>'
    start = ' marker-start="url(#arrow)"' if both else ""
    return f'<path d="{path}" class="flow{dashed}" marker-end="url(#arrow)"{start}/>' + text


def _box(n: Node) -> str:
    x, y = LEFT + n.col * COL_W, TOP + n.row * ROW_H
    cls = "box outside" if n.outside else "box"
    text = [f'<text x="{x + BOX_W / 2}" y="{y + 20}" class="title" text-anchor="middle">{escape(n.title)}</text>']
    text += [f'<text x="{x + BOX_W / 2}" y="{y + 37 + 14 * i}" class="small" text-anchor="middle">{escape(t)}</text>'
             for i, t in enumerate(n.lines)]
    return f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="8" class="{cls}"/>' + "".join(text)


def svg(title: Optional[str] = "elastic-ctr: what runs where, and who connects to whom") -> str:
    """The diagram as SVG text (UTF-8): the namespace's frame, the Volcano Job's frame, one
    box per ``NODES`` entry, one arrow per ``FLOWS`` entry."""
    width = LEFT + max(n.col for n in NODES.values()) * COL_W + BOX_W + 20
    height = TOP + max(n.row for n in NODES.values()) * ROW_H + BOX_H + 20
    inside = [n for n in NODES.values() if not n.outside]
    x0 = LEFT + min(n.col for n in inside) * COL_W - 50
    x1 = LEFT + max(n.col for n in inside) * COL_W + BOX_W + 24
    y0 = TOP + min(n.row for n in inside) * ROW_H - 70
    y1 = TOP + max(n.row for n in inside) * ROW_H + BOX_H + 22
    job = [NODES["trainer"], NODES["pserver"]]
    jx0, jx1 = LEFT + job[0].col * COL_W - 14, LEFT + job[1].col * COL_W + BOX_W + 14
    jy0, jy1 = TOP + job[0].row * ROW_H - 40, TOP + job[0].row * ROW_H + BOX_H + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
           f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{escape(title or "")}">',
           "<style>"
           ".box{fill:#eef2fb;stroke:#3f51b5;stroke-width:1.5}.outside{fill:#f6f6f6;stroke:#888;stroke-dasharray:5 3}"
           ".frame{fill:none;stroke:#3f51b5;stroke-width:1;stroke-dasharray:8 4}"
           ".flow{fill:none;stroke:#333;stroke-width:1.3}.dashed{stroke-dasharray:4 3}"
           "text{font-family:sans-serif;fill:#222}.title{font-size:14px;font-weight:bold}"
           ".small{font-size:11px}.label{font-size:11px;fill:#444;paint-order:stroke;stroke:#fff;stroke-width:3px}"
           ".frametitle{font-size:12px;fill:#3f51b5}"
           "</style>",
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#333"/></marker></defs>',
           f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" rx="12" class="frame"/>',
           f'<text x="{x0 + 10}" y="{y1 - 24}" class="frametitle">the stack\'s namespace: Pod Security restricted,</text>',
           f'<text x="{x0 + 10}" y="{y1 - 9}" class="frametitle">NetworkPolicies admit only these arrows</text>',
           f'<rect x="{jx0}" y="{jy0}" width="{jx1 - jx0}" height="{jy1 - jy0}" rx="10" class="frame"/>',
           f'<text x="{jx0 + 6}" y="{jy1 - 6}" class="frametitle">Volcano Job ctr-train</text>']
    out += [_box(n) for n in NODES.values()]
    pairs = {(a, b) for a, b, _, _ in FLOWS}
    for a, b, label, bend in FLOWS:
        if a != b and (b, a) in pairs and not label:
            continue  # drawn with its reverse, which carries the label
        out.append(_arrow(NODES[a], NODES[b], label, bend, both=a != b and (b, a) in pairs))
    out.append("</svg>\n")
    return "".join(out)
