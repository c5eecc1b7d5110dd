"""The stack configuration reference's rows: every stack key with its Pulumi type, default,
description (``infra.pulumi_yaml.pulumi_yaml()``, the ``Pulumi.yaml`` declarations), group
(``StackConfig``'s fields) and what it allows, in the words of the validators ``parse()``
runs (``infra.config_types.check``'s text, the trainer's ``runtime.trainer.config.allowed``
for the training keys, Pulumi's booleans); secrets from ``infra.config.SECRETS``.

One source for every page and schema that describes a stack key: the docs' generated
``reference/configuration.md`` (``docs/hooks/reference.py``) and the component package's
input descriptions (``provider.schema``).
"""
from __future__ import annotations

import inspect


def allowed(alias: str) -> str:
    """What stack key ``alias`` (camelCase) accepts, in the words of the error ``parse()``
    gives for a wrong value. Raises ``LookupError`` for a constrained key whose text cannot
    be found (the validators changed shape: the page must not go silently blank)."""
    from pydantic.functional_validators import AfterValidator

    from infra import config as stack
    from runtime.trainer import config as train

    name, field = stack.FIELDS[alias]
    for meta in field.metadata:
        if isinstance(meta, AfterValidator):
            text = inspect.getclosurevars(meta.func).nonlocals.get("allowed")
            if not isinstance(text, str):
                raise LookupError(f"{alias}: its validator carries no 'allowed' text")
            return text
    if name in stack.TRAIN_KEYS:
        return train.allowed(stack.TRAIN_KEYS[name])
    if field.annotation is bool:
        return "true or false"
    if field.metadata:
        raise LookupError(f"{alias}: constrained by {field.metadata!r}, allowed text unknown")
    return "any text"


def config_rows() -> list[dict]:
    """One dict per stack key, in ``Pulumi.yaml``'s order: ``key``, ``type``, ``default``,
    ``description`` (from ``pulumi_yaml()``), ``secret`` (bool), ``group``, and either
    ``allowed`` (from ``StackConfig``'s validators) or, for a secret, ``min_length``
    (0: none). Raises ``LookupError`` when a key of ``infra.config.KEYS`` is not declared
    or a constrained key's allowed text cannot be found."""
    import yaml

    from infra import config as stack, pulumi_yaml

    declared = yaml.safe_load(pulumi_yaml.pulumi_yaml())["config"]
    rows, group = [], "where and what"
    for key, decl in declared.items():
        row = {"key": key, **decl, "secret": key in stack.SECRETS}
        if row["secret"]:
            row.update(group="secrets", min_length=stack.SECRETS[key][1])
        else:
            _, field = stack.FIELDS[key]
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            group = extra.get("group", group)
            row.update(group=group, allowed=allowed(key))
        rows.append(row)
    missing = set(stack.KEYS) - {r["key"] for r in rows}
    if missing:
        raise LookupError(f"keys missing from pulumi_yaml(): {sorted(missing)}")
    return rows
