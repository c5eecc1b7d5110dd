"""Stack configuration: read once into a typed, frozen :class:`StackConfig`, validated first.

The set of keys, their types and defaults are declared once, in ``Pulumi.yaml``; this
module adds the allowed ranges and cross-key rules. :func:`parse` checks every key and
raises one :class:`ConfigError` listing every problem, each naming the key, the value
and what is allowed, before the program declares a single resource.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import yaml

PROJECT = "elastic-ctr"
REPO_ROOT = Path(__file__).resolve().parent.parent
PROJECT_FILE = REPO_ROOT / "Pulumi.yaml"


class ConfigError(ValueError):
    """Invalid stack configuration; ``errors`` holds one message per problem."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid stack configuration:\n" + "\n".join(f"  - {e}" for e in errors))


class SecretStr:
    """A secret config value: never shown by ``repr``/``str``; :meth:`reveal` returns it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The plain value (wrap it in ``pulumi.Output.secret`` before use)."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "SecretStr('[secret]')"

    __str__ = __repr__


@dataclass(frozen=True)
class StackConfig:
    """Every key of ``Pulumi.yaml``'s ``config:`` block (camelCase there, snake_case here).

    Quantities (``*_cpu``, ``*_memory``, ``*_size``) are Kubernetes quantity strings,
    e.g. ``500m`` CPU, ``512Mi`` memory. Data locations are tuples of strings.
    """

    namespace: str
    image_registry: str
    image_tag: str
    image_pull_policy: str
    build_platform: str
    registry_username: str
    registry_password: SecretStr
    upload_token: SecretStr
    volcano_queue: str
    storage_class: str
    file_server_storage_size: str
    transfer_storage_size: str
    training_shared_storage_class: str
    training_shared_size: str
    expose_file_server: bool
    pservers: int
    trainers: int
    epochs: int
    batch_size: int
    learning_rate: str
    embedding_dim: int
    sparse_shards: int
    data_source: tuple[str, ...]
    data_test_source: tuple[str, ...]
    data_format: str
    slot_file: str
    cube_shards: int
    cube_replicas: int
    cube_data_size: str
    serving_replicas: int
    serving_max_replicas: int
    serving_target_cpu_utilization: int
    serving_workers: int
    pserver_cpu: str
    pserver_memory: str
    trainer_cpu: str
    trainer_memory: str
    cube_server_cpu: str
    cube_server_memory: str
    cube_agent_cpu: str
    cube_agent_memory: str
    transfer_cpu: str
    transfer_memory: str
    file_server_cpu: str
    file_server_memory: str
    serving_cpu: str
    serving_memory: str


def snake(key: str) -> str:
    """``cubeShards`` -> ``cube_shards``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def camel(field_name: str) -> str:
    """``cube_shards`` -> ``cubeShards``."""
    head, *rest = field_name.split("_")
    return head + "".join(p.capitalize() for p in rest)


@lru_cache(maxsize=None)
def _schema_cached(path: str) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(Path(path).read_text())
    return dict(doc.get("config") or {})


def project_schema(path: Path = PROJECT_FILE) -> dict[str, dict[str, Any]]:
    """The ``config:`` block of ``Pulumi.yaml``: key -> {type, default?, description, secret?}."""
    return _schema_cached(str(path))


# ---------------------------------------------------------------- value checks
_CPU = re.compile(r"^(?:(\d+)m|(\d+(?:\.\d+)?))$")
_BYTES = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REGISTRY = re.compile(r"^[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)*$")
_STORAGE_CLASS = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def cpu_cores(q: str) -> Optional[float]:
    """Cores of a CPU quantity (``"500m"`` -> 0.5, ``"2"`` -> 2.0), or None if malformed."""
    m = _CPU.match(q)
    if not m:
        return None
    return int(m.group(1)) / 1000 if m.group(1) is not None else float(m.group(2))


def byte_size(q: str) -> Optional[int]:
    """Bytes of a memory/storage quantity (``"1Gi"`` -> 1073741824), or None if malformed."""
    m = _BYTES.match(q)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


_GI = 2**30
# key -> (min, max) for integers
INT_RANGES: dict[str, tuple[int, int]] = {
    "pservers": (1, 32), "trainers": (1, 128), "epochs": (1, 1000), "batchSize": (1, 65536),
    "embeddingDim": (1, 512), "sparseShards": (1, 256), "cubeShards": (1, 64),
    "cubeReplicas": (1, 16), "servingReplicas": (1, 100), "servingMaxReplicas": (0, 200),
    "servingTargetCpuUtilization": (10, 100), "servingWorkers": (1, 64),
}
CPU_KEYS = ("pserverCpu", "trainerCpu", "cubeServerCpu", "cubeAgentCpu", "transferCpu",
            "fileServerCpu", "servingCpu")
CPU_RANGE = (0.01, 64.0)  # cores
MEMORY_KEYS = ("pserverMemory", "trainerMemory", "cubeServerMemory", "cubeAgentMemory",
               "transferMemory", "fileServerMemory", "servingMemory")
MEMORY_RANGE = (64 * 2**20, 512 * _GI)  # 64Mi .. 512Gi
STORAGE_KEYS = ("fileServerStorageSize", "transferStorageSize", "cubeDataSize", "trainingSharedSize")
STORAGE_RANGE = (2**20, 64 * 2**40)  # 1Mi .. 64Ti
CHOICES: dict[str, tuple[str, ...]] = {
    "dataFormat": ("criteo", "slot"),
    "imagePullPolicy": ("IfNotPresent", "Always", "Never"),
    "buildPlatform": ("linux/amd64", "linux/arm64"),
}
SECRET_KEYS = ("uploadToken", "registryPassword")
LOCATION_KEYS = ("dataSource", "dataTestSource")  # comma-separated lists
MIN_TOKEN_LEN = 16


def _locations(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def parse(raw: Mapping[str, Any], secret_keys: frozenset[str] | set[str] = frozenset(),
          schema: Optional[Mapping[str, Mapping[str, Any]]] = None) -> StackConfig:
    """Builds and validates a :class:`StackConfig`.

    Args:
        raw: camelCase key (no ``elastic-ctr:`` prefix) -> value as Pulumi passes it (a
            string; ``int``/``bool`` are accepted too). Missing keys take the defaults of
            ``Pulumi.yaml``.
        secret_keys: the keys whose values were stored as Pulumi secrets.
        schema: the ``config:`` block (default: ``Pulumi.yaml``'s).

    Raises:
        ConfigError: listing every invalid, missing or unknown key, each with its value and
            the allowed range.
    """
    schema = project_schema() if schema is None else schema
    errors: list[str] = []
    unknown = sorted(set(raw) - set(schema))
    for key in unknown:
        close = difflib.get_close_matches(key, list(schema), n=1)
        hint = f" (did you mean {PROJECT}:{close[0]}?)" if close else ""
        errors.append(f"{PROJECT}:{key}: unknown key{hint}")

    values: dict[str, Any] = {}
    for key, decl in schema.items():
        if key in raw and raw[key] is not None:
            value = raw[key]
        elif "default" in decl:
            value = decl["default"]
        else:
            errors.append(f"{PROJECT}:{key}: required, not set ({decl.get('description', '')})")
            continue
        typ = decl.get("type", "string")
        try:
            values[key] = _coerce(value, typ)
        except ValueError:
            errors.append(f"{PROJECT}:{key}: {value!r} is not a{'n' if typ == 'integer' else ''} "
                          f"{typ}")

    for key in LOCATION_KEYS:
        if key in values:
            values[key] = _locations(values[key])

    def check(key: str, ok: Callable[[Any], bool], allowed: str) -> None:
        if key in values and not ok(values[key]):
            errors.append(f"{PROJECT}:{key}: {values[key]!r} is invalid; allowed: {allowed}")

    for key, (lo, hi) in INT_RANGES.items():
        check(key, lambda v, lo=lo, hi=hi: lo <= v <= hi, f"an integer in [{lo}, {hi}]")
    for key in CPU_KEYS:
        check(key, lambda v: (c := cpu_cores(v)) is not None and CPU_RANGE[0] <= c <= CPU_RANGE[1],
              "a CPU quantity from 10m to 64 (e.g. 500m, 2)")
    for key in MEMORY_KEYS:
        check(key, lambda v: (b := byte_size(v)) is not None
              and MEMORY_RANGE[0] <= b <= MEMORY_RANGE[1],
              "a memory quantity from 64Mi to 512Gi (e.g. 512Mi, 4Gi)")
    for key in STORAGE_KEYS:
        check(key, lambda v: (b := byte_size(v)) is not None
              and STORAGE_RANGE[0] <= b <= STORAGE_RANGE[1],
              "a storage quantity from 1Mi to 64Ti (e.g. 20Gi)")
    for key, choices in CHOICES.items():
        check(key, lambda v, c=choices: v in c, " | ".join(choices))
    check("namespace", lambda v: len(v) <= 63 and bool(_DNS_LABEL.match(v)),
          "a DNS-1123 label: lowercase letters, digits and '-', at most 63 characters")
    check("volcanoQueue", lambda v: len(v) <= 63 and bool(_DNS_LABEL.match(v)),
          "a Volcano queue name (DNS-1123 label)")
    for key in ("storageClass", "trainingSharedStorageClass"):
        check(key, lambda v: v == "" or (len(v) <= 253 and bool(_STORAGE_CLASS.match(v))),
              "empty or a StorageClass name (lowercase DNS subdomain)")
    check("imageTag", lambda v: bool(_TAG.match(v)),
          "a Docker tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
    check("imageRegistry", lambda v: v == "" or bool(_REGISTRY.match(v)),
          "empty or host[:port][/path], lowercase, e.g. ghcr.io/acme")
    check("learningRate", lambda v: _float_in(v, 0.0, 1.0), "a decimal number in (0, 1]")
    check("dataSource", lambda v: len(v) > 0, '"generated" or comma-separated locations')

    # cross-key rules
    if values.get("servingMaxReplicas", 0) and "servingReplicas" in values:
        if values["servingMaxReplicas"] <= values["servingReplicas"]:
            errors.append(
                f"{PROJECT}:servingMaxReplicas: {values['servingMaxReplicas']} is invalid; "
                f"allowed: 0 (no autoscaler) or more than servingReplicas "
                f"({values['servingReplicas']}), at most {INT_RANGES['servingMaxReplicas'][1]}")
    if values.get("dataFormat") == "slot" and not values.get("slotFile"):
        errors.append(f"{PROJECT}:slotFile: '' is invalid; allowed: a slot-list location "
                      "(required when dataFormat is slot)")
    generated = values.get("dataSource") == ("generated",)
    if "dataSource" in values and not generated and not values.get("dataTestSource"):
        errors.append(f"{PROJECT}:dataTestSource: '' is invalid; allowed: comma-separated "
                      "locations (required unless dataSource is \"generated\")")
    if generated and values.get("dataFormat") == "slot":
        errors.append(f"{PROJECT}:dataFormat: 'slot' is invalid with dataSource \"generated\"; "
                      "allowed: criteo (the generator writes Criteo TSV)")

    token = values.get("uploadToken")
    if token is not None:
        if len(token) < MIN_TOKEN_LEN:
            errors.append(f"{PROJECT}:uploadToken: [secret, {len(token)} characters] is invalid; "
                          f"allowed: at least {MIN_TOKEN_LEN} characters")
    password = values.get("registryPassword", "")
    if password:
        if not values.get("imageRegistry") or not values.get("registryUsername"):
            errors.append(f"{PROJECT}:registryPassword: [secret] is set without imageRegistry and "
                          "registryUsername; allowed: empty, or set together with both")
    for key in SECRET_KEYS:
        if values.get(key) and key not in secret_keys:
            errors.append(f"{PROJECT}:{key}: [value hidden] is stored in plain text; allowed: a "
                          f"secret (pulumi config set --secret {key} ...)")

    if errors:
        raise ConfigError(errors)
    kwargs = {snake(k): v for k, v in values.items()}
    for key in SECRET_KEYS:
        kwargs[snake(key)] = SecretStr(kwargs[snake(key)])
    names = {f.name for f in fields(StackConfig)}
    missing = names - set(kwargs)
    if missing:  # Pulumi.yaml and StackConfig out of step: a programming error
        raise AssertionError(f"Pulumi.yaml lacks keys for StackConfig fields {sorted(missing)}")
    return StackConfig(**{k: v for k, v in kwargs.items() if k in names})


def _coerce(value: Any, typ: str) -> Any:
    """Pulumi passes every config value as a string; convert by the declared type."""
    if typ == "integer":
        if isinstance(value, bool):
            raise ValueError(value)
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise ValueError(value)
        return int(text)
    if typ == "boolean":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in ("true", "false"):
            raise ValueError(value)
        return text == "true"
    text = "" if value is None else str(value)
    if typ == "string" and text != text.strip():
        raise ValueError(value)
    return text


def _float_in(text: str, lo: float, hi: float) -> bool:
    try:
        x = float(text)
    except ValueError:
        return False
    return lo < x <= hi


def load() -> StackConfig:
    """Reads the running stack's config (``elastic-ctr:*``) and validates it.

    Must run inside a Pulumi program (real or mocked). Raises :class:`ConfigError`.
    """
    from pulumi.runtime import config as rc

    prefix = f"{PROJECT}:"
    all_config = {**rc.get_config_env(), **rc.CONFIG.get()}
    raw = {k[len(prefix):]: v for k, v in all_config.items() if k.startswith(prefix)}
    # the language host passes secret key names in PULUMI_CONFIG_SECRET_KEYS; mocks via
    # set_all_config(secret_keys=...)
    env_secrets = set(rc.get_config_secret_keys_env())
    secrets = {k for k in raw if rc.is_config_secret(prefix + k) or prefix + k in env_secrets}
    return parse(raw, secrets)
