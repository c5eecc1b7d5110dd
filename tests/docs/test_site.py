"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict``
(a broken page, nav entry, link or anchor fails), its generated reference pages
(docs/hooks/reference.py) name every ``elastic-ctr`` subcommand and every stack key with
what the code says, and the README, the docs and the code (docstrings and comments) hold no
history: no dates, commit hashes, issue numbers or accounts of earlier states (CHANGELOG.md is
the one place history belongs)."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import AfterValidator

ROOT = Path(__file__).resolve().parents[2]
#: a date (2026-11-27) or a commit hash (7-40 hex digits with a letter and a digit)
DATED = re.compile(r"20\d\d-[01]\d-[0-3]\d|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
#: an account of history: an issue number, or an earlier state of the code or of the tree
HISTORY = re.compile(r"(?i)\bissue \d|\bpreviously\b|\bformerly\b|\bwas replaced\b|\bbefore (?:this|the) change\b"
                     r"|\btoday's main\b|\bnow uses\b|\bused to be\b|\bearlier state\b|\bdeleting commit\b"
                     r"|\bthis tree\b|\bold tree\b")
#: the code scanned for history (every .py file, docstrings and comments alike)
CODE_DIRS = ("runtime", "infra", "components", "provider", "bench", "tools")
#: data that the patterns match: (path, text on the line)
CODE_DATA = {("infra/render.py", "_SECRET_SIG = "), ("infra/render.py", "_SIG_KEY = "),
             ("runtime/cube/agent/sources.py", '"0123456789abcdef"'),
             ("runtime/formats/features.py", 'b"0123456789abcdef"'),
             ("runtime/trainer/generator.py", 'b"0123456789abcdef"')}
README_MAX_LINES = 300


def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs/hooks/reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hook():
    return _hook()


def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_dir"] == "site"  # make docs; .gitignore
    for page in ("reference/cli", "reference/configuration", "contracts", "benchmarks", "security"):
        assert (site / f"{page}.html").is_file(), page  # page URLs (use_directory_urls: false): file:// works
    assert not (site / "hooks").exists(), "the hook module must not be published"
    cli = (site / "reference/cli.html").read_text()
    assert "elastic-ctr cube transfer" in cli and "--topology" in cli


def test_cli_page_has_every_subcommand_help(hook):
    from runtime.cli import build_parser

    page = hook.cli_page()
    parsers = [p for p, _ in hook.subcommands(build_parser())]
    progs = [p.prog for p in parsers]
    for prog in ("elastic-ctr train", "elastic-ctr cube server", "elastic-ctr serve", "elastic-ctr render"):
        assert prog in progs
    for parser in parsers:
        assert f"## `{parser.prog}`" in page
        for action in parser._actions:  # every option of every subcommand is on the page
            for option in action.option_strings:
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", page), (parser.prog, option)
    assert len(set(progs)) == len(progs)


def test_subcommands_walks_nested_parsers(hook):
    root = argparse.ArgumentParser(prog="x")
    sub = root.add_subparsers()
    a = sub.add_parser("a", help="the a", aliases=["aa"])
    a.add_subparsers().add_parser("b", help="the b")
    assert [(p.prog, h) for p, h in hook.subcommands(root)] == [("x a", "the a"), ("x a b", "the b")]


def test_config_page_has_every_key_as_declared(hook):
    from infra import config as stack, pulumi_yaml

    declared = yaml.safe_load(pulumi_yaml.pulumi_yaml())["config"]
    rows = {r["key"]: r for r in hook.config_rows()}
    assert set(rows) == set(stack.KEYS) == set(declared)
    page = hook.config_page()
    for key, decl in declared.items():
        line = next(l for l in page.splitlines() if l.startswith(f"| [`{key}`](#{key}){{ #{key} }} |"))
        assert hook._linked(hook._escape(decl["description"]), set(rows), key) in line, key
        if key not in stack.SECRETS:
            assert f"| {decl['type']} | {hook._default(decl['default'])} |" in line, key
            assert f"**Allowed:** {hook._linked(hook._escape(rows[key]['allowed']), set(rows), key)} |" in line, key
    assert (r"| [`cubeShards`](#cubeShards){ #cubeShards } | integer | `2` |" in page
            and r"**Allowed:** an integer in \[1, 64\] |" in page)
    assert "**Allowed:** async \\| async-merged \\| geo |" in page
    assert "| [`exposeFileServer`](#exposeFileServer){ #exposeFileServer } | boolean | `false` |" in page
    assert "**Allowed:** true or false |" in page
    assert "| [`uploadToken`](#uploadToken){ #uploadToken } | 16 |" in page
    assert page.index("## Secrets") > page.index("## Serving")
    # a key another key's description names is a link to it; ordinary words are not
    line = next(l for l in page.splitlines() if l.startswith("| [`servingMaxReplicas`]"))
    assert "greater than [servingReplicas](#servingReplicas)" in line
    assert "[trainers](#trainers)" not in page and "[monitoring](#monitoring)" not in page


def test_linked_makes_links_of_keys_and_pages_only(hook):
    keys = {"cubeShards", "servingReplicas", "trainers"}
    assert hook._linked("with cubeShards and trainers", keys) == "with [cubeShards](#cubeShards) and trainers"
    assert hook._linked("`cubeShards` x `other`", keys, page="c.md") == "[`cubeShards`](c.md#cubeShards) x `other`"
    assert hook._linked("cubeShards itself", keys, skip="cubeShards") == "cubeShards itself"
    assert hook._linked("see docs/security.md#s3-policies.", keys) == \
        "see [docs/security.md#s3-policies](../security.md#s3-policies)."
    assert hook._linked("docs/no-such-page.md", keys) == "docs/no-such-page.md"


def test_every_stack_output_is_listed(hook):
    """The outputs the program exports (the dev stack, and with an object store as the
    model root) are the ones infra/outputs.py describes, and the page lists each."""
    from infra.outputs import STACK_OUTPUTS
    from infra.render import render

    exported = set(render("dev").outputs) | set(render("dev", ["modelRoot=s3://ctr-bucket/model"]).outputs)
    assert exported == set(STACK_OUTPUTS)
    page = hook.config_page()
    for name in STACK_OUTPUTS:
        assert f"| [`{name}`](#output-{name}){{ #output-{name} }} |" in page, name


def test_allowed_refuses_a_validator_without_its_text(hook, monkeypatch):
    """A constrained key whose allowed text cannot be found fails the build, rather than
    showing nothing."""
    from infra import config as stack

    name, field = stack.FIELDS["cubeShards"]
    bare = copy.copy(field)
    bare.metadata = [AfterValidator(lambda v: v)]
    monkeypatch.setitem(stack.FIELDS, "cubeShards", (name, bare))
    with pytest.raises(LookupError, match="cubeShards"):
        hook.allowed("cubeShards")


def test_generated_pages_are_not_committed():
    assert not (ROOT / "docs/reference").exists(), "docs/reference/ is generated at build time"


def test_readme_is_short_and_undated():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES
    assert [l for l in lines if DATED.search(l)] == []
    assert "make demo" in text and "make test" in text
    for target in re.findall(r"\]\((docs/[^)#\s]+)", text):  # links into the site resolve
        assert (ROOT / target).is_file(), target


def test_docs_are_undated():
    dated = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "docs").glob("*.md"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if DATED.search(line) or HISTORY.search(line)]
    assert dated == []


def historic_lines(root: Path = ROOT) -> list[str]:
    """``path:line`` of every line of the code under ``CODE_DIRS`` that dates itself or tells
    history, but for the data in ``CODE_DATA``."""
    out = []
    for d in CODE_DIRS:
        for p in sorted((root / d).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            if "__pycache__" in p.parts or "_pb2" in p.name:
                continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if (DATED.search(line) or HISTORY.search(line)) and not any(
                        rel == path and text in line for path, text in CODE_DATA):
                    out.append(f"{rel}:{i}: {line.strip()}")
    return out


def test_code_holds_no_history():
    assert historic_lines() == []


def test_code_scan_finds_a_planted_line(tmp_path):
    for d in CODE_DIRS:
        (tmp_path / d).mkdir()
    (tmp_path / "runtime/a.py").write_text('"""A module."""\n# the loader previously read it twice\n')
    (tmp_path / "bench/b.py").write_text('X = 1  # measured 2026-11-27 at 24bfae1\n')
    (tmp_path / "infra/render.py").write_text('_SIG_KEY = "4dabf18193072939515e22adb298388d"\n')
    (tmp_path / "tools/c.py").write_text('"""Hour 20261120/00, as issue 12 asked."""\n')
    assert sorted(historic_lines(tmp_path)) == ["bench/b.py:1: X = 1  # measured 2026-11-27 at 24bfae1",
                                        "runtime/a.py:2: # the loader previously read it twice",
                                        'tools/c.py:1: """Hour 20261120/00, as issue 12 asked."""']


def test_dated_pattern_catches_dates_and_hashes():
    assert DATED.search("measured 2026-11-27") and DATED.search("at `24bfae1`")
    assert not DATED.search("hour 20261120/00, 1048576 rows, deadbeef")
    assert HISTORY.search("as issue 37 asks") and HISTORY.search("uvicorn, this tree")
    assert not HISTORY.search("a feasign the trainer no longer holds")
