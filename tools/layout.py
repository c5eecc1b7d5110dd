"""Writes docs/layout.md, the layout of the tree: a hand-written part for the files and
folders that are not Python packages (``HEADER``), then every package and module of
``runtime/``, ``infra/``, ``components/`` and ``provider/`` with the summary of its
docstring (read with ``ast``, nothing is imported).

Usage, from the project's root: ``python tools/layout.py`` writes docs/layout.md;
``python tools/layout.py --check`` exits 1 when docs/layout.md differs from a fresh
generation or a package or module has no docstring (tests/docs/test_layout.py runs both
checks).
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the Python trees listed module by module
PACKAGES = ("runtime", "infra", "components", "provider")
OUT = Path("docs/layout.md")
#: files that are generated at build time and not in the repository (.gitignore)
GENERATED = re.compile(r".*_pb2(_grpc)?\.py$")
#: the width of the name column, and of a line
WIDTH = 34
LINE = 110

HEADER = """\
# Layout of the tree

The tree is laid out by concern: each role's code under `runtime/` (each cube component its own
package), every shared contract under `runtime/formats/`, every Prometheus definition under
`runtime/metrics/`, every local harness under `runtime/local/`; the Pulumi program in `infra/`
and `components/`, the component package in `provider/`. This page is generated from the
packages' docstrings by `python tools/layout.py` (`make layout`); the test
`tests/docs/test_layout.py` fails when a package or module has no docstring or when this page
differs from a fresh generation.

```
Pulumi.yaml, Pulumi.dev.yaml, Pulumi.prod.yaml   project (config block generated from infra/config.py), stacks
Dockerfile        one image per role: --target trainer | cube | serving | tracking (mlflow server)
mkdocs.yml        this site (make docs)
PulumiPlugin.yaml, __main__.py, requirements.txt  run provider/ as the Pulumi plugin
examples/         programs using the component package: yaml, typescript, go (the dev stack)
policy/           the Pulumi policy pack (elastic_ctr_policies.py; prod.json: the prod stack's settings)
schemas/          the data schema of the generated CTR rows (ctr.yaml)
monitoring/       data files: the Grafana dashboards (dashboards/*.json: runtime/metrics/dashboards.py)
tests/            unit, component, rendered-manifest, process-level end-to-end; helpers.py;
                  lifecycle/ (SIGTERM per role), containers/ (images, the stack as containers:
                  the kube/ harness), monitoring/ (promtool, the live test), docs/ (this site)
scripts/          engine.sh (Docker engine), base-image.sh, build-images.sh (make images),
                  install-browser.sh (chromium + chromedriver for the browser test),
                  install-prometheus.sh, install-wrk.sh (wrk, the load generator of
                  make bench-serving-peers), check-prereqs.sh, run-tests.sh
tools/            layout.py (this page)
bench/            benchmarks (print figures; not tests)
docs/             this site: guides, contracts.md, training.md, benchmarks, design; hooks/
                  generates the command-line, stack-configuration and component-package
                  reference at build time
requirements/     base, paddle, serving, cube (the roles' extras), tracking (mlflow-skinny),
                  tracking-server (mlflow, matplotlib), infra, s3, dev: ranges;
                  constraints.txt: the exact versions tested (make constraints refreshes it);
                  tritonclient.txt, kserve.txt: the exact versions of the Triton test client's
                  and the KServe benchmark peer's own venvs
```

Where each shared contract lives, and who writes and reads it: [Contracts](contracts.md).

## Packages and modules

"""


def summary(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    para = " ".join(l.strip() for l in doc.strip().split("\n\n", 1)[0].splitlines())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.(\s|$)", para)
    return para[: m.start() + 1] if m else para


def docstring(path: Path) -> str | None:
    """``path``'s module docstring, or None."""
    return ast.get_docstring(ast.parse(path.read_text(), str(path)))


def entries(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[tuple[int, str, Path]]:
    """``(depth, name, file)`` for every package (its ``__init__.py``, name ending in ``/``)
    and module under ``packages``, a package's own modules before its subpackages."""
    out: list[tuple[int, str, Path]] = []

    def walk(d: Path, depth: int) -> None:
        out.append((depth, d.name + "/", d / "__init__.py"))
        files = sorted(p for p in d.iterdir() if p.suffix == ".py" and p.name != "__init__.py"
                       and not GENERATED.match(p.name))
        out.extend((depth + 1, p.name, p) for p in files)
        for sub in sorted(p for p in d.iterdir() if (p / "__init__.py").is_file()):
            walk(sub, depth + 1)

    for name in packages:
        walk(root / name, 0)
    return out


def missing(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The packages and modules under ``packages`` without a docstring (paths from ``root``)."""
    return [str(p.relative_to(root)) for _, _, p in entries(root, packages) if not docstring(p)]


def generate(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> str:
    """docs/layout.md's text."""
    lines = []
    for depth, name, path in entries(root, packages):
        label = "  " * depth + name
        text = textwrap.wrap(summary(docstring(path) or ""), LINE - WIDTH, break_on_hyphens=False) or [""]
        lines.append(f"{label:<{WIDTH}}{text[0]}".rstrip())
        lines += [" " * WIDTH + more for more in text[1:]]
    return HEADER + "```\n" + "\n".join(lines) + "\n```\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/layout.py", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when docs/layout.md is stale or a docstring is missing")
    args = ap.parse_args(argv)
    absent = missing()
    for path in absent:
        print(f"{path}: no docstring", file=sys.stderr)
    text = generate()
    out = ROOT / OUT
    if args.check:
        stale = not out.is_file() or out.read_text() != text
        if stale:
            print(f"{OUT} differs from a fresh generation: python tools/layout.py", file=sys.stderr)
        return 1 if stale or absent else 0
    out.write_text(text)
    print(f"wrote {OUT}")
    return 1 if absent else 0


if __name__ == "__main__":
    sys.exit(main())
