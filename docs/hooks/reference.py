"""mkdocs hook: the reference pages generated at build time, never written by hand nor
committed.

- ``reference/cli.md``: every ``elastic-ctr`` subcommand's ``--help``, rendered from the
  argparse parsers ``runtime.cli.build_parser()`` builds (the parsers the console script
  runs), 100 columns wide.
- ``reference/configuration.md``: every stack key, from the source ``make pulumi-yaml``
  uses: its Pulumi type, default, description, group and what it allows, the rows of
  ``infra.config_reference.config_rows()`` (the component package's input descriptions
  read the same rows).
- ``reference/package.md``: every component of the component package with its inputs and
  outputs (type, whether required, plain or secret, description) and its input types, from
  the committed package schema ``provider/schema.json`` (tests/infra/test_pulumi_package.py
  keeps it equal to the components' schema).

mkdocs loads this file through ``hooks:`` in ``mkdocs.yml`` and calls ``on_files``;
``tests/docs/test_site.py`` imports it by path and checks the pages name every subcommand
and every key.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
from pathlib import Path
from typing import Iterator, Optional

# the stack keys' rows: one source, shared with the component package's schema (provider.schema)
from infra.config_reference import allowed, config_rows  # noqa: F401  (tests/docs/test_site.py calls both)

#: generated page paths, relative to ``docs/``
CLI_PAGE = "reference/cli.md"
CONFIG_PAGE = "reference/configuration.md"
PACKAGE_PAGE = "reference/package.md"
#: ``--help`` width in columns (argparse reads ``$COLUMNS``)
HELP_COLUMNS = 100


def on_files(files, config):
    """mkdocs event: adds the generated pages to the site's files (mkdocs >= 1.6)."""
    from mkdocs.structure.files import File

    for path, text in ((CLI_PAGE, cli_page()), (CONFIG_PAGE, config_page()), (PACKAGE_PAGE, package_page())):
        files.append(File.generated(config, path, content=text))
    return files


# ---------------------------------------------------------------- CLI
@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.ArgumentParser, str]]:
    """Every subcommand parser under ``parser``, depth first in registration order, with
    the one-line help its parent lists it with (``""`` when none)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        seen = set()
        for name, sub in action.choices.items():
            if id(sub) in seen:  # an alias
                continue
            seen.add(id(sub))
            yield sub, helps.get(name, "")
            yield from subcommands(sub)


def cli_page() -> str:
    """Markdown: the top-level ``--help``, then one section per subcommand with its
    ``--help``, as the installed ``elastic-ctr`` prints them."""
    from runtime.cli import _ROLE_MODULES, build_parser

    parser = build_parser()
    listed = {sub.prog.split()[1] for sub, _ in subcommands(parser)}
    missing = sorted({c for cmds in _ROLE_MODULES.values() for c in cmds} - listed)
    if missing:  # build_parser leaves out a role whose packages are not installed
        raise RuntimeError(f"the command line page would lack {missing}: their modules' packages are not installed "
                           f"(docs/requirements.txt)")
    with _columns(HELP_COLUMNS):
        out = ["# Command line\n\n",
               "Generated at build time from the argparse parsers of `elastic-ctr` "
               "(`runtime/cli.py` and each role's `cli` module): what `--help` prints.\n\n",
               "Every role is a subcommand of the one console script; containers run the same "
               "subcommands. A location (`LOC`, `ROOT`) is a local path or glob, an HTTP(S) URL, "
               "or an object-store location (see [Object stores](../object-stores.md)).\n\n",
               f"## `{parser.prog}`\n\n", _fence(parser.format_help())]
        for sub, summary in subcommands(parser):
            out.append(f"## `{sub.prog}`\n\n")
            if summary and not sub.description:  # else --help opens with the description
                out.append(_escape(summary[0].upper() + summary[1:]) + ".\n\n")
            out.append(_fence(sub.format_help()))
    return "".join(out)


def _fence(text: str) -> str:
    return "```text\n" + text.rstrip() + "\n```\n\n"


# ---------------------------------------------------------------- stack configuration
def config_page() -> str:
    """Markdown: a table per group of stack keys (key, type, default, description and
    what it allows; each key its own anchor, ``#<key>``, and every other key a description
    names a link to it), then the secrets, then the stack outputs (``infra.outputs``); the
    page's table of contents is hidden, so the tables get the width."""
    from infra.outputs import STACK_OUTPUTS

    rows = config_rows()
    keys = {r["key"] for r in rows}
    out = ["---\nhide:\n  - toc\n---\n\n# Stack configuration\n\n",
           "Generated at build time from `infra/config.py` (`StackConfig`, the model "
           "`make pulumi-yaml` writes `Pulumi.yaml`'s `config:` block from). Set a key with "
           "`pulumi config set <key> <value>` (stored as `elastic-ctr:<key>` in the stack file). "
           "The program checks every value before it declares anything and lists every "
           "problem at once, each naming the key, the value and what is allowed, e.g. "
           "`elastic-ctr:trainers: 0 is invalid; allowed: an integer in [1, 128]`. "
           "Rules across keys (e.g. `servingMaxReplicas` above `servingReplicas`, "
           "`trainerThreads` at most the trainer's CPUs, the training rules of "
           "`runtime/trainer/config.py`) are checked the same way. Each key has its own anchor "
           "(`configuration.html#cubeShards`); what a stack gives back is under "
           "[Stack outputs](#stack-outputs).\n\n"]
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    secrets = groups.pop("secrets", [])
    for group, members in [*groups.items(), ("secrets", secrets)]:
        out.append(f"## {group[0].upper()}{group[1:]}\n\n")
        if group == "secrets":
            out.append("Never in `StackConfig`: each must be set with `--secret`, and reaches pods "
                       "only through a Kubernetes Secret. A plain-text value is refused.\n\n"
                       "| key | minimum length | description |\n|---|---:|---|\n")
            out += [f"| {_key_cell(r['key'])} | {r['min_length'] or '-'} | {_linked(_escape(r['description']), keys, r['key'])} |\n"
                    for r in members]
        else:
            out.append("| key | type | default | description and allowed values |\n|---|---|---|---|\n")
            out += [f"| {_key_cell(r['key'])} | {r['type']} | {_default(r['default'])} | "
                    f"{_linked(_escape(r['description']), keys, r['key'])}"
                    f"<br>**Allowed:** {_linked(_escape(r['allowed']), keys, r['key'])} |\n" for r in members]
        out.append("\n")
    out.append("## Stack outputs\n\n"
               "What `pulumi up` gives back (`infra/program.py`; `pulumi stack output NAME`, with `--json` for "
               "the structured ones). Without a cluster, `elastic-ctr render` writes the same values, computed "
               "under mocks, to `outputs.json`.\n\n"
               "| output | present | what it holds |\n|---|---|---|\n")
    out += [f"| [`{name}`](#output-{name}){{ #output-{name} }} | {when} | {_linked(what, keys)} |\n"
            for name, (when, what) in STACK_OUTPUTS.items()]
    out.append("\n")
    return "".join(out)


def _key_cell(key: str) -> str:
    """A key's cell: its name, linking to itself, with the anchor ``#<key>`` (attr_list)."""
    return f"[`{key}`](#{key}){{ #{key} }}"


#: a camelCase stack key named in running text (single-word keys such as ``trainers`` are
#: ordinary words too and stay text)
_KEY_WORD = re.compile(r"(?<![\w./#-])([a-z]+[A-Z]\w*)(?![\w-])")
_DOC_FILE = re.compile(r"(?<![\w/])docs/([a-z0-9-]+)\.md(#[a-z0-9-]+)?\b")
DOCS = Path(__file__).resolve().parents[1]


def _linked(text: str, keys: set[str], skip: str = "", page: str = "") -> str:
    """``text`` (Markdown) with every camelCase stack key in it (a code span holding only
    the key, or the bare word) a link to ``<page>#<key>``, except ``skip`` (the row's own),
    and every ``docs/<name>.md`` a link to that page."""
    def key(m: re.Match) -> str:
        name = m.group(1)
        return f"[{name}]({page}#{name})" if name in keys and name != skip else m.group(0)

    def code(m: re.Match) -> str:
        name = m.group(1)
        return f"[`{name}`]({page}#{name})" if name in keys and name != skip else m.group(0)

    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = _KEY_WORD.sub(key, parts[i])
    text = "`".join(parts)
    text = re.sub(r"(?<!\[)`([A-Za-z]+)`(?!\])", code, text)
    return _DOC_FILE.sub(lambda m: f"[{m.group(0)}](../{m.group(1)}.md{m.group(2) or ''})"
                         if (DOCS / f"{m.group(1)}.md").is_file() else m.group(0), text)


def _default(value) -> str:
    if value == "":
        return "(empty)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


# ---------------------------------------------------------------- component package
def package_page(schema_file: Optional[Path] = None) -> str:
    """Markdown: the component package's components (description, then an inputs table and
    an outputs table: name, type, description) and its input types, from ``schema_file``
    (default ``provider/schema.json``)."""
    schema = json.loads((schema_file or Path(__file__).resolve().parents[2] / "provider" / "schema.json").read_text())
    keys = {r["key"] for r in config_rows()}
    out = ["# Component package\n\n",
           f"Generated at build time from `provider/schema.json`, the schema of the `{schema['name']}` package "
           f"(version {schema['version']}) that `pulumi package add` generates an SDK from "
           "([Use from another language](../other-languages.md)). Inputs named like a stack key are that key: "
           "its description, allowed values and default are the [stack configuration](configuration.md)'s. "
           "**plain**: a value known when the program declares the component (not another resource's output); "
           "**secret**: kept secret in the state and the SDKs.\n\n"]
    for token, res in schema["resources"].items():
        out.append(f"## `{token.rsplit(':', 1)[1]}`\n\n`{token}`: {_linked(_cell(res['description']), keys, page=CONFIG)}\n\n")
        required = set(res.get("requiredInputs", []))
        out.append("| input | type | description |\n|---|---|---|\n")
        out += [_package_row(name, prop, name in required, keys) for name, prop in res["inputProperties"].items()]
        if res["properties"]:
            out.append("\n| output | type | description |\n|---|---|---|\n")
            out += [_package_row(name, prop, False, keys) for name, prop in res["properties"].items()]
        out.append("\n")
    out.append("## Input types\n\n")
    for token, typ in schema["types"].items():
        required = set(typ.get("required", []))
        out.append(f"### `{token.rsplit(':', 1)[1]}`\n\n{_linked(_cell(typ.get('description', '')), keys, page=CONFIG)}\n\n"
                   "| property | type | description |\n|---|---|---|\n")
        out += [_package_row(name, prop, name in required, keys) for name, prop in typ.get("properties", {}).items()]
        out.append("\n")
    return "".join(out)


def _package_type(prop: dict) -> str:
    if prop.get("$ref", "").startswith("pulumi.json#/"):
        return prop["$ref"].rsplit("/", 1)[1].lower()  # Pulumi's own: any, archive, asset, json
    if "$ref" in prop:
        name = prop["$ref"].rsplit(":", 1)[1]
        return f"[{name}](#{name.lower()})"
    kind = prop["type"]
    if kind == "array":
        return f"list of {_package_type(prop['items'])}"
    if kind == "object" and "additionalProperties" in prop:
        return f"map of {_package_type(prop['additionalProperties'])}"
    return kind


#: the stack configuration page, from the package page
CONFIG = "configuration.md"


def _package_row(name: str, prop: dict, required: bool, keys: set[str] = frozenset()) -> str:
    """A table row of an input or output: its name (a link to the stack key it is, if
    any), type and marks, description (stack keys named in it linked)."""
    marks = [m for m, on in (("required", required), ("plain", prop.get("plain")), ("secret", prop.get("secret")))
             if on]
    kind = _package_type(prop) + (f" ({', '.join(marks)})" if marks else "")
    cell = f"[`{name}`]({CONFIG}#{name})" if name in keys else f"`{name}`"
    return f"| {cell} | {kind} | {_linked(_cell(prop.get('description', '')), keys, page=CONFIG)} |\n"


def _cell(text: str) -> str:
    """Markdown text (code spans kept) for a table cell: outside code spans, pipes, emphasis
    and link markers escaped and ``<`` / ``>`` as entities; on one line."""
    parts = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else p.translate(_CELL) for i, p in enumerate(parts))


_CELL = str.maketrans({**{c: "\\" + c for c in "\\|*_`[]"}, "<": "&lt;", ">": "&gt;"})


def _escape(text: str) -> str:
    """Markdown-safe text for a table cell: pipes, emphasis and link markers escaped, ``<``
    and ``>`` as entities, on one line."""
    return " ".join(text.translate(_CELL).split())
