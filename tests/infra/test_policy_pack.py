"""The policy pack (policy/, ``pulumi preview --policy-pack policy``) run offline: each
policy's own validate function over the rendered resources (the Kubernetes provider's
inputs, as a preview hands them to the pack). The dev and prod stacks pass; a rendering
spoilt in one way per policy fails that policy with a message naming the resource and the fix."""
from __future__ import annotations

import copy
from typing import Optional

import pytest
from pulumi_policy import ResourceValidationArgs, ResourceValidationPolicy, StackValidationArgs
from pulumi_policy.policy import PolicyResource

from infra.render import to_manifest
from policy.elastic_ctr_policies import POLICIES

PROD_CONFIG = {"images-by-digest": {"required": True}}


def resources(r) -> list[tuple[str, str, dict]]:
    """``(type, name, props)`` of every Kubernetes resource of a rendering."""
    return [(x["type"], x["name"], copy.deepcopy(to_manifest(x).body)) for x in r.resources
            if x["type"].startswith("kubernetes:") and to_manifest(x) is not None]


def violations(res: list[tuple[str, str, dict]], config: Optional[dict] = None) -> dict[str, list[str]]:
    """policy name -> the messages it reported over ``res``."""
    config = config or {}
    out: dict[str, list[str]] = {p.name: [] for p in POLICIES}
    for p in POLICIES:
        def report(message, urn=None, _name=p.name):
            out[_name].append(message)

        cfg = {**{k: v.get("default") for k, v in ((p.config_schema.properties if p.config_schema else {}) or {}).items()},
               **config.get(p.name, {})}
        if isinstance(p, ResourceValidationPolicy):
            for typ, name, props in res:
                p.validate(ResourceValidationArgs(typ, props, f"urn:{name}", name, None, None, cfg), report)
        else:
            policy_resources = [PolicyResource(typ, props, f"urn:{name}", name, None, None, None, [], {})
                                for typ, name, props in res]
            p.validate(StackValidationArgs(policy_resources, cfg), report)
    return out


@pytest.mark.parametrize("stack, config", [("dev", None), ("prod", PROD_CONFIG)])
def test_dev_and_prod_pass_every_policy(rendered, stack, config):
    assert {k: v for k, v in violations(resources(rendered(stack)), config).items() if v} == {}


def _pod(res, kind: str, name: str) -> dict:
    (props,) = [p for t, n, p in res if t.endswith(f":{kind}") and n == name]
    return props["spec"]["template"]["spec"]


def _spoil(res, policy: str) -> str:
    """Breaks ``res`` (in place) the way ``policy`` forbids; returns the resource the message must name."""
    serving = _pod(res, "Deployment", "serving")
    c = serving["containers"][0]
    if policy == "container-limits":
        del c["resources"]["limits"]
    elif policy == "no-latest-tag":
        c["image"] = "elastic-ctr-serving:latest"
    elif policy == "images-by-digest":
        c["image"] = "registry.example.com/elastic-ctr/elastic-ctr-serving:0.1.0"
    elif policy == "no-token-automount":
        serving["automountServiceAccountToken"] = True
    elif policy == "non-root":
        c["securityContext"]["runAsNonRoot"] = False
    elif policy == "read-only-root-fs":
        c["securityContext"]["readOnlyRootFilesystem"] = False
    elif policy == "no-open-load-balancer":
        (props,) = [p for t, n, p in res if t.endswith(":Service") and n == "fileserver"]
        props["spec"]["type"] = "LoadBalancer"
        return "Service/fileserver"
    elif policy == "secrets-by-reference":
        c["env"].append({"name": "ELASTIC_CTR_UPLOAD_TOKEN", "value": "in-clear"})
    elif policy == "pods-selected-by-network-policy":
        res[:] = [x for x in res if not x[0].endswith(":NetworkPolicy")]
    else:
        raise AssertionError(f"no spoiler for {policy}")
    return "Deployment/serving"


@pytest.mark.parametrize("policy", [p.name for p in POLICIES])
def test_a_spoilt_rendering_fails_with_the_resource_and_the_fix(rendered, policy):
    # prod's (images by digest) for the digest policy; dev's for the others (a :latest image is not a digest either)
    stack, config = ("prod", PROD_CONFIG) if policy == "images-by-digest" else ("dev", None)
    res = resources(rendered(stack))
    target = _spoil(res, policy)
    found = violations(res, config)
    assert found[policy], f"{policy} passed a spoilt rendering"
    assert any(m.startswith(f"{target}: ") and "; fix: " in m for m in found[policy]), found[policy]
    # the other policies do not fire for it (each checks one thing)
    assert {k for k, v in found.items() if v} == {policy}


def test_the_volcano_jobs_tasks_are_checked(rendered):
    res = resources(rendered("dev"))
    (job,) = [p for t, _, p in res if t == "kubernetes:batch.volcano.sh/v1alpha1:Job"]
    job["spec"]["tasks"][0]["template"]["spec"]["automountServiceAccountToken"] = True
    (msg,) = violations(res)["no-token-automount"]
    assert msg.startswith("Job/ctr-train: spec.tasks[0].template.spec.automountServiceAccountToken is not false")
