"""``Pulumi.yaml`` generated from the stack configuration's one definition
(``infra.config.StackConfig`` and its secret keys): ``make pulumi-yaml`` writes it,
tests/infra/test_config.py checks the committed file equals it, and the docs' stack
configuration reference reads the declarations from it."""
from __future__ import annotations

from infra import config

_HEADER = """\
# elastic-ctr: CTR training (Paddle PS on Volcano) -> cube sparse-parameter service -> serving.
# Generated from infra/config.py by infra/pulumi_yaml.py (make pulumi-yaml); edit the model there, not this file.
# Every key the program reads is declared here with its type, default and description.
# Stack files set them as `elastic-ctr:<key>`; `pulumi config set <key> <value>` does that.
# Ranges and cross-key rules are checked by infra/config.py before anything is declared;
# the training keys' by the trainer's own model (runtime/trainer/config.py, TrainConfig).
name: elastic-ctr
description: CTR recommendation pipeline (Paddle parameter-server training, cube sparse-parameter service, serving) on Kubernetes
runtime:
  name: python
  options:
    toolchain: pip
    virtualenv: .venv
main: infra/
config:
"""


def pulumi_yaml() -> str:
    """The text of ``Pulumi.yaml``: the project and a ``config:`` entry per key (type,
    default, description; secrets with an empty default, checked by ``parse``)."""
    import yaml

    def entry(key: str, decl: dict) -> str:
        text = yaml.safe_dump({key: decl}, sort_keys=False, width=10**6, allow_unicode=True)
        return "".join(f"  {line}\n" for line in text.splitlines())

    out = [_HEADER, "  # --- where and what ---\n"]
    for alias, (_, f) in config.FIELDS.items():
        group = (f.json_schema_extra or {}).get("group") if isinstance(f.json_schema_extra, dict) else None
        if group:
            out.append(f"  # --- {group} ---\n")
        typ = {int: "integer", bool: "boolean"}.get(f.annotation, "string")
        default = str(f.default) if f.annotation is float else f.default
        out.append(entry(alias, {"type": typ, "default": default, "description": f.description}))
        if alias == "registryUsername":  # the secrets, declared beside the registry user
            for key, (description, _) in config.SECRETS.items():
                out.append(entry(key, {"type": "string", "default": "", "description": description}))
    return "".join(out)


if __name__ == "__main__":  # make pulumi-yaml
    import sys

    sys.stdout.write(pulumi_yaml())
