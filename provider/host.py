"""The provider plugin: what ``pulumi package add`` and ``pulumi up`` run (``PulumiPlugin.yaml``
at the repository root; ``__main__.py`` there calls ``main``).

``ElasticCtrProvider`` is a ``pulumi.provider.Provider`` serving ``provider.schema``'s
schema (the analyzer's, completed with descriptions and secrets) and constructing the
components of ``provider.components`` with the Pulumi SDK's component provider
(``pulumi.provider.experimental.component.ComponentProvider``, which maps the inputs'
names and values onto the args dicts, as ``component_provider_host`` does). Before a
component is constructed, its inputs that are stack keys are checked with the keys' own
validators: the engine then shows every bad input at once, each with what it allows.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Optional

import pulumi
from pulumi.provider import ConstructResult, Provider
from pulumi.provider import main as serve
from pulumi.provider.experimental.component import ComponentProvider

import provider
from provider import keys
from provider.components import COMPONENTS
from provider.schema import args_class, package_schema


class ElasticCtrProvider(Provider):
    """The ``elastic-ctr`` package's provider: ``schema`` is ``package_schema()``'s JSON,
    ``construct`` builds a component of ``COMPONENTS`` from the engine's inputs."""

    def __init__(self) -> None:
        super().__init__(provider.version(), json.dumps(package_schema()))
        self._components = ComponentProvider(list(COMPONENTS), provider.NAME, version=provider.version())
        self._args = {provider.token(c.__name__): args_class(c).__name__ for c in COMPONENTS}

    def construct(self, name: str, resource_type: str, inputs: pulumi.Inputs,
                  options: Optional[pulumi.ResourceOptions] = None) -> ConstructResult:
        """Constructs component ``resource_type`` (``elastic-ctr:index:<Name>``) ``name`` from
        ``inputs`` (schema names, values as the engine sends them). Raises
        ``pulumi.InputPropertiesError`` listing every input a stack key's validators refuse,
        and what the SDK's component provider raises (a missing input, an unknown type)."""
        errors = self.problems(resource_type, inputs)
        if errors:
            raise pulumi.InputPropertiesError(
                f"{resource_type} {name}: " + "; ".join(f"{e['property_path']}: {e['reason']}" for e in errors),
                errors)
        return self._components.construct(name, resource_type, inputs, options)

    def problems(self, resource_type: str, inputs: pulumi.Inputs) -> list[dict[str, str]]:
        """The stack-key inputs of ``inputs`` (and of its ``deployment``) that their keys'
        validators refuse (``provider.keys.problems``); [] for an unknown type (the
        component provider names it)."""
        name = self._args.get(resource_type)
        if name is None:
            return []
        out = keys.problems(name, inputs)
        deployment: Any = inputs.get("deployment")
        if isinstance(deployment, dict):
            out += keys.problems("Deployment", deployment, path="deployment.")
        return out


def main(args: Optional[list[str]] = None) -> None:
    """Serves the provider over gRPC (``pulumi.provider.main``: the engine's address is the
    first argument; the port is printed on stdout)."""
    serve(ElasticCtrProvider(), sys.argv[1:] if args is None else args)
