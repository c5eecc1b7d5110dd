"""docs/layout.md, the layout of the tree, is generated from the packages' docstrings by
tools/layout.py: every package and module of runtime/, infra/, components/ and provider/ has
a docstring, and the committed page is what a fresh generation writes."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def layout():
    spec = importlib.util.spec_from_file_location("tools_layout", ROOT / "tools/layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_package_and_module_has_a_docstring(layout):
    assert layout.missing() == []


def test_layout_page_is_generated(layout):
    assert (ROOT / "docs/layout.md").read_text() == layout.generate(), \
        "docs/layout.md is stale: python tools/layout.py (make layout)"


def test_generation_lists_every_package_and_module(layout):
    labels = {line.split()[0] for line in layout.generate().split("## Packages and modules")[1].splitlines()
              if line.strip() and not line.startswith(" " * layout.WIDTH) and line != "```"}
    files = [p for pkg in layout.PACKAGES for p in (ROOT / pkg).rglob("*.py")
             if "__pycache__" not in p.parts and not layout.GENERATED.match(p.name)]
    assert {p.parent.name + "/" if p.name == "__init__.py" else p.name for p in files} == labels
    for name in ("builder/", "client/", "local/", "ps.py", "metrics/", "rules.py", "keys.py"):
        assert name in labels
    page = layout.generate()
    assert "_pb2" not in page  # generated at build time, not in the tree


def test_a_module_without_docstring_is_named(layout, tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The package.\n\nMore."""\n')
    (pkg / "sub" / "__init__.py").write_text('"""A subpackage, e.g. this one. It has two sentences."""\n')
    (pkg / "bare.py").write_text("x = 1\n")
    (pkg / "gen_pb2.py").write_text("x = 1\n")
    assert layout.missing(tmp_path, ("pkg",)) == ["pkg/bare.py"]
    page = layout.generate(tmp_path, ("pkg",))
    assert "pkg/" in page and "The package." in page and "More" not in page
    assert "A subpackage, e.g. this one." in page and "two sentences" not in page
    assert "gen_pb2" not in page


def test_check_fails_on_a_stale_page(layout, monkeypatch, tmp_path):
    stale = tmp_path / "layout.md"
    stale.write_text(layout.generate() + "a line by hand\n")
    monkeypatch.setattr(layout, "OUT", stale)  # absolute: ROOT / OUT is the file itself
    assert layout.main(["--check"]) == 1
    stale.write_text(layout.generate())
    assert layout.main(["--check"]) == 0
