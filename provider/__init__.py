"""elastic-ctr's Pulumi component package: the components of ``components/`` for a Pulumi
program in any language (TypeScript, Go, C#, Java, YAML, Python), through the SDK that
``pulumi package add`` generates from the package schema.

- ``provider.args``: the components' inputs as such a program sends them; ``provider.keys``:
  the inputs that are stack keys (type, default, allowed values, description);
- ``provider.components``: the package's components (type tokens
  ``elastic-ctr:index:<Name>``), each the component of ``components/`` of that name;
- ``provider.schema``: the package schema (committed as ``provider/schema.json``);
- ``provider.host``: the provider plugin Pulumi runs (``PulumiPlugin.yaml``, ``__main__.py``).

The package's name is the project's, ``elastic-ctr``; its version is the installed
project's (``pyproject.toml``).
"""
from __future__ import annotations

from importlib.metadata import version as _dist_version

NAME = "elastic-ctr"
DESCRIPTION = ("A CTR recommendation pipeline on Kubernetes as Pulumi components: PaddlePaddle parameter-server "
               "training (a Volcano Job), the cube sparse-parameter service and its transfer, Open Inference "
               "Protocol serving, a file server, MLflow tracking, monitoring and NetworkPolicies.")


def version() -> str:
    """The package's version: the installed ``elastic-ctr`` distribution's (semver)."""
    return _dist_version(NAME)


def token(component: str) -> str:
    """The type token of ``component``: ``elastic-ctr:index:<component>``."""
    return f"{NAME}:index:{component}"
