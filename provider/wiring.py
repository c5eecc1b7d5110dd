"""From the package's inputs (``provider.args``) to the components' own arguments: the
``DeployContext`` of a ``Deployment``, the pods' environment of ``EnvVar`` lists, and the
pod selectors and scrape targets of the stack's ``Parts``.

The selectors and targets are those each component computes for itself (its
``selector`` / ``every_shard`` and ``scrape_targets``, which the Python program hands to
``NetworkPolicies`` and ``Monitoring``), derived here from the components' names with the
same helpers (``components.common.labels`` / ``selector``, ``runtime.role_specs``,
``components.monitoring.scrape_target``); tests/infra/test_construct.py compares the
policies and monitors declared both ways.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from components import common
from components.common import DeployContext
from components.cube_cluster import DATA_DIR as CUBE_DATA_DIR
from components.cube_transfer import STATE_DIR as TRANSFER_STATE_DIR
from components.file_server import ROOT as FILE_SERVER_ROOT
from components.monitoring import ScrapeTarget, scrape_target
from components.training_job import TASK_LABEL
from provider import keys
from runtime import role_specs
from runtime.role_specs import CREDENTIAL_BOUNDARIES

#: the label name every cube pod of a stack shares, every layout's (``CubeCluster.every_shard``)
CUBE_PODS = "cube-server"
#: the ``app.kubernetes.io/component`` label of each part's pods (``components.<part>``)
COMPONENT = {"file_server": "storage", "tracking_server": "tracking", "cube_transfer": "cube",
             "serving": "inference", "training_job": "training"}


def deploy_context(d: Mapping[str, Any], component: str) -> DeployContext:
    """The ``DeployContext`` of a ``Deployment`` input ``d`` (snake_case keys) of component
    ``component`` (named in errors). Raises ``pulumi.InputPropertiesError`` for a bad
    ``imagePullPolicy`` or ``EnvVar``."""
    keys.check("Deployment", d, path="deployment.")
    cfg = keys.stack_config("Deployment", d)
    return DeployContext(
        namespace=d["namespace"], instance=d["instance"],
        image_pull_secrets=tuple(d.get("image_pull_secrets") or ()), image_pull_policy=cfg.image_pull_policy,
        store_env=tuple(env_var(e, f"deployment.storeEnv[{i}]") for i, e in enumerate(d.get("store_env") or ())),
        store_read_env=tuple(env_var(e, f"deployment.storeReadEnv[{i}]")
                             for i, e in enumerate(d.get("store_read_env") or ())),
        identity={access: dict(annotations) for access, annotations in (d.get("identity") or {}).items()},
        credentials=credentials(d.get("credentials"), component),
        scrape_annotations=bool(d.get("scrape_annotations", False)))


def env_var(e: Mapping[str, Any], path: str) -> k8s.core.v1.EnvVarArgs:
    """The container environment entry of an ``EnvVar`` (a value, or a ``secretKeyRef``).
    Raises ``pulumi.InputPropertiesError`` naming ``path`` when it has both or neither."""
    if ("value" in e) == ("secret_name" in e):
        raise pulumi.InputPropertiesError(f"{path}: needs value or secretName, not both",
                                          [{"property_path": path, "reason": "needs value or secretName, not both"}])
    if "value" in e:
        return k8s.core.v1.EnvVarArgs(name=e["name"], value=e["value"])
    return k8s.core.v1.EnvVarArgs(name=e["name"], value_from=k8s.core.v1.EnvVarSourceArgs(
        secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=e["secret_name"], key=e.get("secret_key") or e["name"])))


def credentials(value: Any, component: str) -> dict[str, pulumi.Input[str]]:
    """Trust boundary -> Secret name from ``Deployment.credentials``: a map as given, or,
    when the map is another resource's output (``Credentials.secrets``, known only once
    that resource is declared), every boundary of ``CREDENTIAL_BOUNDARIES`` read from it;
    a boundary missing from it then fails the deployment with a ``KeyError`` naming it."""
    if value is None:
        return {}
    if not isinstance(value, pulumi.Output):
        return dict(value)

    def pick(boundary: str):
        def get(secrets: Mapping[str, str]) -> str:
            if boundary not in secrets:
                raise KeyError(f"{component}: deployment.credentials has no Secret for the trust boundary "
                               f"{boundary!r} (it has {sorted(secrets)}): pass Credentials.secrets")
            return secrets[boundary]
        return value.apply(get)

    return {boundary: pick(boundary) for boundary in CREDENTIAL_BOUNDARIES}


def pods(dep: DeployContext, name: str, component: str) -> dict[str, str]:
    """The selector of the pods of the component ``name`` (its ``app.kubernetes.io/name``
    and ``instance`` labels; ``components.common.selector``)."""
    return common.selector(common.labels(dep, name, component))


def every_shard(dep: DeployContext) -> dict[str, str]:
    """Every cube pod of the stack, every layout's (``CubeCluster.every_shard``)."""
    return pods(dep, CUBE_PODS, "cube")


def part_pods(dep: DeployContext, parts: Mapping[str, str], part: str) -> Optional[dict[str, str]]:
    """The selector of ``parts[part]``'s pods, or None when the stack has no such part."""
    name = parts.get(part)
    return None if name is None else pods(dep, name, COMPONENT[part])


def scrape_targets(dep: DeployContext, parts: Mapping[str, str]) -> list[ScrapeTarget]:
    """What Prometheus scrapes in a stack of ``parts``, in the Python program's order: the
    file server, the cube servers and agents, the transfer, serving, the training tasks (each
    the ``scrape_targets`` of its component)."""
    out = []
    files = part_pods(dep, parts, "file_server")
    if files is not None:
        out.append(scrape_target(role_specs.file_server(FILE_SERVER_ROOT), files))
    cube = every_shard(dep)
    out += [scrape_target(role_specs.cube_server(0, 1), cube),
            scrape_target(role_specs.cube_agent(f"{CUBE_DATA_DIR}/agent"), cube),
            scrape_target(role_specs.cube_transfer(common.TOPOLOGY_FILE, "", TRANSFER_STATE_DIR),
                          part_pods(dep, parts, "cube_transfer")),
            scrape_target(role_specs.serving(common.TOPOLOGY_FILE, "", "", common.TMP_DIR),
                          part_pods(dep, parts, "serving"))]
    job = part_pods(dep, parts, "training_job")
    out += [scrape_target(role_specs.ps_role(task), {**job, TASK_LABEL: task}, kind="pod")
            for task in ("pserver", "trainer")]
    return out
