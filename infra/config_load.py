"""Reading a stack's configuration: ``parse`` (the raw ``elastic-ctr:*`` keys -> ``StackConfig``, every problem listed) and ``load`` (the running stack's keys and ``Secrets``).

``load()`` reads the running stack's config through ``pulumi.Config`` and validates every
key before the program declares anything: one ``ConfigError`` lists every problem, each
naming the key (``elastic-ctr:<key>``), the value and what is allowed. Secrets
(``uploadToken``, ``registryPassword``) never enter ``StackConfig``: they must be stored as
secrets, their length is checked, and the program takes them as secret Outputs
(``pulumi.Config.require_secret``) end to end. The keys themselves are
``infra.config``'s.
"""
from __future__ import annotations

import difflib
from typing import Any, Mapping

import pulumi
from pydantic import ValidationError

from infra import config_monitoring, config_security, config_storage, config_tracking
from infra.config import FIELDS, KEYS, PROJECT, REQUIRED_SECRETS, SECRETS, TRAIN_KEYS, ConfigError, StackConfig
from runtime.trainer import config as train


def unknown_keys(keys) -> list[str]:
    """One error per key this program does not know, with the closest known key."""
    out = []
    for key in sorted(set(keys) - set(KEYS)):
        close = difflib.get_close_matches(key, KEYS, n=1)
        out.append(f"{PROJECT}:{key}: unknown key" + (f" (did you mean {PROJECT}:{close[0]}?)" if close else ""))
    return out


def _allowed(key: str) -> str:
    """What a key allows, from its validators (for messages about wrong types)."""
    _, f = FIELDS[key]
    return {int: "an integer", bool: "a boolean", float: "a decimal number"}.get(f.annotation, "a string")


def parse(raw: Mapping[str, Any], secret_keys: frozenset[str] | set[str] = frozenset()) -> StackConfig:
    """Validates ``raw`` (camelCase key without the ``elastic-ctr:`` prefix -> value as Pulumi
    passes it, a string; ``int``/``bool`` accepted too; secret keys with their values) and
    returns the ``StackConfig`` (without the secrets). ``secret_keys``: the keys stored as
    Pulumi secrets. Missing keys take their defaults.

    Raises ``ConfigError`` listing every invalid, missing or unknown key, each with its
    value (secrets hidden) and what is allowed."""
    errors = [*unknown_keys(raw), *config_storage.problems(raw), *config_monitoring.problems(raw),
              *config_security.problems(raw)]
    for key, (_, min_len) in SECRETS.items():
        value = raw.get(key)
        if not value:
            if key in REQUIRED_SECRETS and not raw.get("modelRoot"):
                errors.append(f"{PROJECT}:{key}: required, not set ({SECRETS[key][0]})")
            continue
        if key not in secret_keys:
            errors.append(f"{PROJECT}:{key}: [value hidden] is stored in plain text; allowed: a secret "
                          f"(pulumi config set --secret {key} ...)")
        if len(value) < min_len:
            errors.append(f"{PROJECT}:{key}: [secret, {len(value)} characters] is invalid; allowed: at least "
                          f"{min_len} characters")
    if raw.get("registryPassword") and not (raw.get("imageRegistry") and raw.get("registryUsername")):
        errors.append(f"{PROJECT}:registryPassword: [secret] is set without imageRegistry and registryUsername; "
                      "allowed: empty, or set together with both")
    values = {k: v for k, v in raw.items() if k in FIELDS and v is not None}
    cfg = None
    try:
        cfg = StackConfig.model_validate(values)
    except ValidationError as exc:
        for err in exc.errors():
            if not err["loc"]:  # the cross-key check
                for key, value, allowed in err["ctx"]["error"].args[0].problems:
                    errors.append(f"{PROJECT}:{key}: {value!r} is invalid; allowed: {allowed}")
                continue
            key = str(err["loc"][0])
            value = err.get("input")
            name = FIELDS[key][0]
            if FIELDS[key][1].annotation in (int, float) and isinstance(value, str):
                value = _coerced(value)
            if err["type"] == "value_error":
                errors.append(f"{PROJECT}:{key}: {value!r} is invalid; allowed: {err['ctx']['error']}")
            elif name in TRAIN_KEYS and not isinstance(value, str) or err["type"] == "literal_error":
                # a training key out of the trainer's range or choices: the trainer's words
                errors.append(f"{PROJECT}:{key}: {value!r} is invalid; allowed: {train.allowed(TRAIN_KEYS[name])}")
            else:
                errors.append(f"{PROJECT}:{key}: {value!r} is not {_allowed(key)}")
    if errors:
        raise ConfigError(errors)
    return cfg


def _coerced(text: str):
    """How a numeric string reads (``"0"`` -> 0), for messages."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


class Secrets:
    """The stack's secrets as secret Outputs: ``upload_token`` (``Output[str]``; None with
    ``modelRoot``, where no file server is deployed) and
    ``registry_password`` (``Output[str]`` or None when not set)."""

    def __init__(self, config: pulumi.Config):
        self.upload_token = config.get_secret("uploadToken") or None
        self.registry_password = config.get_secret("registryPassword") or None
        self.storage = config_storage.StorageSecrets(config)
        self.tracking = config_tracking.TrackingSecrets(config)
        self.credentials = config_security.CredentialSecrets(config)


def load() -> tuple[StackConfig, Secrets]:
    """Reads the running stack's config (``elastic-ctr:*``) through ``pulumi.Config`` and
    validates it. Must run inside a Pulumi program (real or mocked). Raises
    ``ConfigError``."""
    config = pulumi.Config(PROJECT)
    raw: dict[str, Any] = {key: config.get(key) for key in FIELDS}
    secret_keys = set()
    for key in SECRETS:
        full = f"{PROJECT}:{key}"
        # read once, only to check it is stored as a secret and long enough; resources take
        # the value as a secret Output (Secrets)
        raw[key] = pulumi.runtime.get_config(full)
        if pulumi.runtime.is_config_secret(full) or full in pulumi.runtime.get_config_secret_keys_env():
            secret_keys.add(key)
    prefix = f"{PROJECT}:"
    for full in pulumi.runtime.get_config_env():  # keys the stack sets that the program does not know
        if full.startswith(prefix) and full[len(prefix):] not in KEYS:
            raw[full[len(prefix):]] = ""
    return parse({k: v for k, v in raw.items() if v is not None}, secret_keys), Secrets(config)
