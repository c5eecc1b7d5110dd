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
    from runtime.cli import build_parser

    parser = build_parser()
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
    what it allows), then the secrets; the page's table of contents is hidden, so the
    tables get the width."""
    rows = config_rows()
    out = ["---\nhide:\n  - toc\n---\n\n# Stack configuration\n\n",
           "Generated at build time from `infra/config.py` (`StackConfig`, the model "
           "`make pulumi-yaml` writes `Pulumi.yaml`'s `config:` block from). Set a key with "
           "`pulumi config set <key> <value>` (stored as `elastic-ctr:<key>` in the stack file). "
           "The program checks every value before it declares anything and lists every "
           "problem at once, each naming the key, the value and what is allowed, e.g. "
           "`elastic-ctr:trainers: 0 is invalid; allowed: an integer in [1, 128]`. "
           "Rules across keys (e.g. `servingMaxReplicas` above `servingReplicas`, "
           "`trainerThreads` at most the trainer's CPUs, the training rules of "
           "`runtime/trainer/config.py`) are checked the same way.\n\n"]
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
            out += [f"| `{r['key']}` | {r['min_length'] or '-'} | {_escape(r['description'])} |\n"
                    for r in members]
        else:
            out.append("| key | type | default | description and allowed values |\n|---|---|---|---|\n")
            out += [f"| `{r['key']}` | {r['type']} | {_default(r['default'])} | {_escape(r['description'])}"
                    f"<br>**Allowed:** {_escape(r['allowed'])} |\n" for r in members]
        out.append("\n")
    return "".join(out)


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
    out = ["# Component package\n\n",
           f"Generated at build time from `provider/schema.json`, the schema of the `{schema['name']}` package "
           f"(version {schema['version']}) that `pulumi package add` generates an SDK from "
           "([Use from another language](../other-languages.md)). Inputs named like a stack key are that key: "
           "its description, allowed values and default are the [stack configuration](configuration.md)'s. "
           "**plain**: a value known when the program declares the component (not another resource's output); "
           "**secret**: kept secret in the state and the SDKs.\n\n"]
    for token, res in schema["resources"].items():
        out.append(f"## `{token.rsplit(':', 1)[1]}`\n\n`{token}`: {_cell(res['description'])}\n\n")
        required = set(res.get("requiredInputs", []))
        out.append("| input | type | description |\n|---|---|---|\n")
        out += [_package_row(name, prop, name in required) for name, prop in res["inputProperties"].items()]
        if res["properties"]:
            out.append("\n| output | type | description |\n|---|---|---|\n")
            out += [_package_row(name, prop, False) for name, prop in res["properties"].items()]
        out.append("\n")
    out.append("## Input types\n\n")
    for token, typ in schema["types"].items():
        required = set(typ.get("required", []))
        out.append(f"### `{token.rsplit(':', 1)[1]}`\n\n{_cell(typ.get('description', ''))}\n\n"
                   "| property | type | description |\n|---|---|---|\n")
        out += [_package_row(name, prop, name in required) for name, prop in typ.get("properties", {}).items()]
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


def _package_row(name: str, prop: dict, required: bool) -> str:
    marks = [m for m, on in (("required", required), ("plain", prop.get("plain")), ("secret", prop.get("secret")))
             if on]
    kind = _package_type(prop) + (f" ({', '.join(marks)})" if marks else "")
    return f"| `{name}` | {kind} | {_cell(prop.get('description', ''))} |\n"


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
