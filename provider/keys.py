"""Inputs that are stack keys: a package component's input named like a stack key
(``servingReplicas``, ``uploadToken``) is that key, with its type, default, allowed values
and description from the stack configuration (``infra.config``; the descriptions are the
rows of ``infra.config_reference``, the words of the stack configuration reference).

``keyed(name)`` builds the ``TypedDict`` of the stack keys that ``KEYS[name]`` lists, the base
of the args class ``name`` (``provider.args``), so the SDK's analyzer reads their types from
the same annotations as the other inputs: a plain ``int``, ``float``, ``bool`` or ``str``
(a choice of strings is a ``str``) for a key of ``StackConfig``, an ``Input[str]`` for a
secret key (``infra.config.SECRETS``). Every key is optional (its stack default) unless
``REQUIRED[name]`` lists it.

``problems()`` checks values with each key's own validators and reports them in the words
of ``parse()``; ``stack_config()`` turns an args dict into a ``StackConfig`` holding those
values (the others at their defaults), whose helpers (``source_ranges()``,
``thresholds()``, ``train_config()``, ...) the components' translation uses as the Python
program does.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated, Any, Literal, Mapping, NotRequired, TypedDict, get_args, get_origin

import pulumi
from pydantic import TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from infra import config, config_gates, config_lifecycle, config_security
from infra.config_reference import allowed

#: args class (or input type) name -> the stack keys among its inputs (camelCase, as set
#: with ``pulumi config set``); the translation in ``provider.components`` reads each one
KEYS: dict[str, tuple[str, ...]] = {
    "Deployment": ("imagePullPolicy",),
    "ImagesArgs": ("imageRegistry", "imageTag", "buildPlatform", "registryUsername", "registryPassword",
                   "denseBackend"),
    "CredentialsArgs": ("trackingUsername",
                        *(k for pair in config_security.BOUNDARY_KEYS.values() for k in pair if k)),
    "ObjectStoreAccessArgs": ("storageEndpointUrl", "storageRegion", "storageAccessKeyId", "storageSecretAccessKey",
                              "storageReadAccessKeyId", "storageReadSecretAccessKey"),
    "FileServerArgs": ("fileServerCpu", "fileServerMemory", "fileServerStorageSize", "storageClass",
                       "exposeFileServer", "fileServerSourceRanges", "uploadToken"),
    "TrackingServerArgs": ("trackingCpu", "trackingMemory", "trackingStorageSize", "storageClass",
                           "trackingBackendStoreUri", "trackingArtifactsDestination"),
    "TrainingJobArgs": ("volcanoQueue", "pservers", "trainers", "pserverCpu", "pserverMemory", "trainerCpu",
                        "trainerMemory", "epochs", "batchSize", "learningRate", "embeddingDim", "pserverTableShards",
                        "psMode", "geoKSteps", "trainerThreads", "trainingMode", "dataStartHour", "dataEndHour",
                        "partitionMinutes", "patchEverySeconds", "baseEveryMinutes", "checkpointEveryMinutes",
                        "dataSource", "dataTestSource", "dataFormat", "slotFile", "trainingSharedStorageClass",
                        "trainingSharedSize", "trackingExperiment", "dataSchema",
                        *(to_camel(k) for k in config_gates.TRAIN_KEYS),
                        *(to_camel(k) for k in config_lifecycle.TRAIN_KEYS)),
    "CubeClusterArgs": ("cubeShards", "cubeReplicas", "cubeServerCpu", "cubeServerMemory", "cubeAgentCpu",
                        "cubeAgentMemory", "cubeDataSize"),
    "CubeTransferArgs": ("transferCpu", "transferMemory", "transferStorageSize", "storageClass", "servedVersion",
                         "keepVersions", "trackingExperiment", "modelGate",
                         *(to_camel(k) for k in config_gates.MODEL_GATE_FLAGS)),
    "ServingArgs": ("servingReplicas", "servingMaxReplicas", "servingTargetCpuUtilization", "servingAutoscaleMetric",
                    "servingTargetInflight", "servingWorkers", "denseBackend", "dataFormat", "slotFile",
                    "servingCpu", "servingMemory"),
    "NetworkPoliciesArgs": ("networkPolicyEgress", "egressCidrs", "servingClientNamespaces", "servingClientPodLabels",
                            "servingClientCidrs", "trackingUiNamespaces", "trackingUiPodLabels",
                            "monitoringNamespace", "exposeFileServer", "fileServerSourceRanges"),
    "MonitoringArgs": ("monitoring", "monitoringLabels", "monitoringRunbookUrl", "grafanaDashboards",
                       "freshnessSloSeconds", "rolloutMaxSeconds", "servingErrorRatio", "servingP99Ms",
                       "servingUnavailablePerSecond", "trainerStallSeconds", "pserverBudgetRows",
                       "cubeShardBudgetKeys"),
}
#: stack keys that are no component's input: what a program in another language does instead
NOT_INPUTS: dict[str, str] = {
    "namespace": "the program declares the Namespace (a kubernetes:core/v1:Namespace) and passes its name as "
                 "each Deployment's namespace",
    "modelRoot": "the versionRoot inputs take the version root: the FileServer's url, or the object-store location",
    "trackingServer": "the program declares a TrackingServer, or not",
    "trackingUri": "the trackingUri inputs of TrainingJob and CubeTransfer take the TrackingServer's url or an "
                   "external server's",
    "networkPolicies": "the program declares NetworkPolicies, or not",
    "storageServiceAccountAnnotations": "the Deployment's identity takes them: its write entry",
    "storageReadServiceAccountAnnotations": "the Deployment's identity takes them: its read entry",
}
#: args class name -> the stack keys it requires (no default applies)
REQUIRED: dict[str, frozenset[str]] = {"FileServerArgs": frozenset({"uploadToken"})}


def field_name(key: str) -> str:
    """The Python (snake_case) name of stack key ``key``: ``StackConfig``'s field, or the
    secret key's words (``cubeControlToken`` -> ``cube_control_token``). Raises
    ``KeyError`` for a key the stack does not have."""
    if key in config.FIELDS:
        return config.FIELDS[key][0]
    if key in config.SECRETS:
        return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()
    raise KeyError(f"{key!r} is not a stack key (infra.config.KEYS)")


def python_type(key: str) -> Any:
    """The annotation of stack key ``key`` as a package input: ``pulumi.Input[str]`` for a
    secret, else its field's plain type (``Literal`` choices: their type). Raises
    ``TypeError`` for a field of another type."""
    if key in config.SECRETS:
        return pulumi.Input[str]
    ann = config.FIELDS[key][1].annotation
    if get_origin(ann) is Literal:
        ann = type(get_args(ann)[0])
    if ann not in (int, float, bool, str):
        raise TypeError(f"stack key {key}: {ann!r} is not int, float, bool or str")
    return ann


def keyed(name: str) -> type:
    """The ``TypedDict`` of the stack keys ``KEYS[name]`` (snake_case keys, see
    ``field_name``), each ``NotRequired`` unless in ``REQUIRED[name]``. Raises ``KeyError``
    for a name without keys or a key the stack does not have."""
    required = REQUIRED.get(name, frozenset())
    fields = {field_name(k): (python_type(k) if k in required else NotRequired[python_type(k)]) for k in KEYS[name]}
    return TypedDict(f"{name}StackKeys", fields)  # type: ignore[operator]


def is_secret(key: str) -> bool:
    """True for a secret stack key (its input is a secret: ``secret: true`` in the schema)."""
    return key in config.SECRETS


@lru_cache(maxsize=None)
def _adapter(key: str) -> TypeAdapter:
    _, f = config.FIELDS[key]
    return TypeAdapter(Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation)


def problems(name: str, values: Mapping[str, Any], path: str = "") -> list[dict[str, str]]:
    """The values of ``KEYS[name]`` in ``values`` (camelCase stack key -> value) that the
    key's validators refuse, and the required ones missing, as
    ``{"property_path": ..., "reason": ...}`` (``pulumi.InputPropertyErrorDetails``), the
    reason in ``parse()``'s words: ``0 is invalid; allowed: an integer in [1, 100]``. A
    secret's value is never shown; secrets and unset keys are not checked further (an
    ``Output`` is known only later)."""
    out = []
    for key in KEYS[name]:
        where = f"{path}{key}"
        value = values.get(key)
        if value is None:
            if key in REQUIRED.get(name, ()):
                out.append({"property_path": where, "reason": f"required, not set ({describe_short(key)})"})
            continue
        if is_secret(key):
            continue
        if isinstance(value, pulumi.Output):
            out.append({"property_path": where, "reason": "an Output is invalid; allowed: a plain value (it decides "
                                                          "what the component declares)"})
            continue
        try:
            _adapter(key).validate_python(value)
        except ValidationError:
            out.append({"property_path": where, "reason": f"{value!r} is invalid; allowed: {allowed(key)}"})
    return out


def describe_short(key: str) -> str:
    """The first sentence of stack key ``key``'s description."""
    text = config.SECRETS[key][0] if key in config.SECRETS else config.FIELDS[key][1].description or ""
    return text.split(". ")[0].rstrip(".")


def check(name: str, args: Mapping[str, Any], path: str = "") -> None:
    """Raises ``pulumi.InputPropertiesError`` listing ``problems()`` of ``args`` (the args
    dict of ``name``: snake_case keys, as the component receives it)."""
    errors = problems(name, {k: args.get(field_name(k)) for k in KEYS[name]}, path)
    if errors:
        raise pulumi.InputPropertiesError(
            f"{name}: " + "; ".join(f"{e['property_path']}: {e['reason']}" for e in errors), errors)


def stack_config(name: str, args: Mapping[str, Any]) -> config.StackConfig:
    """A ``StackConfig`` holding the values of ``KEYS[name]`` that ``args`` (snake_case) sets,
    checked and converted by each key's validators (``2.0`` from the wire is ``2``), every
    other key at its default; the cross-key rules of ``StackConfig`` are not applied (the
    component's translation applies those that concern it). Raises
    ``pulumi.InputPropertiesError`` as ``check``."""
    check(name, args)
    values = {}
    for key in KEYS[name]:
        if key in config.FIELDS and args.get(field_name(key)) is not None:
            values[field_name(key)] = _adapter(key).validate_python(args[field_name(key)])
    return config.StackConfig.model_construct(**values)
