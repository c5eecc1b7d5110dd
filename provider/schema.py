"""The package schema: what ``pulumi package add`` generates each language's SDK from.

Generated from the components' annotations by the Pulumi SDK's analyzer
(``pulumi.provider.experimental.analyzer.Analyzer`` and ``schema.generate_schema``, as
``component_provider_host`` does), then completed with what annotations cannot carry:

* the description of every input that is a stack key (``provider.keys``): the stack
  configuration reference's words (``infra.config_reference.config_rows``: description,
  allowed values, default) and the key's name;
* ``secret: true`` on every input that is a secret stack key, and on the outputs that hold
  secrets (``SECRET_OUTPUTS``);
* the package's description, keywords, license and display name.

``provider/schema.json`` is this schema, committed; ``make pulumi-schema`` writes it and
tests/infra/test_pulumi_package.py fails when it differs from a fresh one. The provider
serves ``package_schema()`` itself (``provider.host``).

``python -m provider.schema [--check]`` writes the file (or exits 1 when it is stale).
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from pulumi.provider.experimental.analyzer import Analyzer
from pulumi.provider.experimental.schema import generate_schema

import provider
from provider import keys
from provider.components import COMPONENTS

SCHEMA_FILE = Path(__file__).resolve().parent / "schema.json"
#: the command that rewrites ``SCHEMA_FILE`` (named by the test that compares it)
REGENERATE = "make pulumi-schema"
#: component -> its outputs that hold secrets
SECRET_OUTPUTS = {"Credentials": ("values",)}
KEYWORDS = ["pulumi", "kubernetes", "category/utility", "kind/component", "ctr", "recommendation", "paddlepaddle",
            "volcano"]


def args_class(component: type) -> type:
    """The args class of ``component`` (its ``__init__``'s ``args`` annotation)."""
    return inspect.get_annotations(component.__init__)["args"]


def check_annotations(component: type) -> None:
    """Raises ``TypeError`` naming the attribute when an annotation the analyzer would read
    for ``component`` is a string: an output of the base component (``components/``, whose
    annotations are postponed) that the package's class does not declare itself."""
    import pulumi

    for cls in component.__mro__:
        if cls in (object, pulumi.Resource, pulumi.ComponentResource):
            continue
        for attr, ann in inspect.get_annotations(cls).items():
            if isinstance(ann, str) and not attr.startswith("_") and attr not in inspect.get_annotations(component):
                raise TypeError(f"{cls.__module__}.{cls.__qualname__}.{attr} is an output the package's "
                                f"{component.__qualname__} does not declare: annotate it there, with its description "
                                f"(provider/components.py), then run {REGENERATE}")


def _rows() -> dict[str, dict]:
    from infra.config_reference import config_rows

    return {r["key"]: r for r in config_rows()}


def describe(key: str, doc: str | None, rows: dict[str, dict]) -> str:
    """The description of an input that is stack key ``key``: the stack configuration
    reference's description, what it allows and its default (a secret: its minimum length),
    then ``doc`` (the input's own docstring, if any) and the key's name."""
    row = rows[key]
    parts = [row["description"].rstrip()]
    if row["secret"]:
        if row["min_length"]:
            parts.append(f"At least {row['min_length']} characters.")
    else:
        default = row["default"]
        shown = "empty" if default == "" else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        parts.append(f"Allowed: {row['allowed']}. Default: {shown}.")
    if doc:
        parts.append(doc.strip())
    parts.append(f"Stack key `{key}`.")
    return " ".join(parts)


def _complete(properties: dict[str, Any], name: str, rows: dict[str, dict]) -> None:
    """Describes (and marks secret) the properties of ``properties`` that are stack keys of
    ``keys.KEYS[name]``."""
    for key in keys.KEYS.get(name, ()):
        prop = properties[key]
        prop["description"] = describe(key, prop.get("description"), rows)
        if keys.is_secret(key):
            prop["secret"] = True


def markdown(text: str) -> str:
    """A docstring as a schema description (Markdown): dedented, each paragraph on one line,
    reStructuredText's double backquotes as Markdown's single ones."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs).replace("``", "`")


def _tidy(node: Any, parent: str | None = None) -> None:
    """Every description of ``node`` (a schema, walked in place) as Markdown; an array's
    items and a map's values lose the description the analyzer copies from their property."""
    if isinstance(node, dict):
        own = markdown(node["description"]) if isinstance(node.get("description"), str) else None
        if own is not None:
            node["description"] = own
            if own == parent:
                del node["description"]
        for key, value in node.items():
            _tidy(value, own if key in ("items", "additionalProperties") else None)
    elif isinstance(node, list):
        for value in node:
            _tidy(value)


def package_schema() -> dict[str, Any]:
    """The package schema (a dict, as ``schema.json`` holds it). Raises ``TypeError`` (see
    ``check_annotations``) or the analyzer's errors for an input or output it cannot type."""
    for component in COMPONENTS:
        check_annotations(component)
    analysis = Analyzer(provider.NAME).analyze(list(COMPONENTS))
    spec = generate_schema(provider.NAME, provider.version(), None, analysis["component_definitions"],
                           analysis["type_definitions"],
                           sorted(analysis["dependencies"], key=lambda d: f"{d.name}{d.version}")).to_json()
    _tidy(spec)
    rows = _rows()
    for component in COMPONENTS:
        resource = spec["resources"][provider.token(component.__name__)]
        _complete(resource["inputProperties"], args_class(component).__name__, rows)
        for output in SECRET_OUTPUTS.get(component.__name__, ()):
            resource["properties"][output]["secret"] = True
    for token, typ in spec["types"].items():
        _complete(typ.get("properties", {}), token.rsplit(":", 1)[1], rows)
    out = {"name": spec.pop("name"), "displayName": "elastic-ctr", "version": spec.pop("version"),
           "description": provider.DESCRIPTION, "keywords": KEYWORDS, "license": "Apache-2.0"}
    out.update(spec)
    return out


def text(schema: dict[str, Any]) -> str:
    """``schema`` as ``schema.json``'s text (2-space indents, a final newline)."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Writes ``SCHEMA_FILE`` (``--check``: exits 1, saying so, when it differs)."""
    parser = argparse.ArgumentParser(prog="python -m provider.schema", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is stale")
    args = parser.parse_args(argv)
    fresh = text(package_schema())
    if args.check:
        if not SCHEMA_FILE.is_file() or SCHEMA_FILE.read_text() != fresh:
            print(f"{SCHEMA_FILE} differs from the components' schema: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    SCHEMA_FILE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
