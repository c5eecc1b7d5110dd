"""Images: the trainer, cube and serving container images, built with Docker by Pulumi.

Each is a ``pulumi_docker.Image`` built from the repository's ``Dockerfile`` (its target
``<role>``) with the repository root as context, tagged ``<registry>/elastic-ctr-<role>:<tag>`` and pushed to
the registry; with no registry configured the images are built locally and not pushed
(for clusters that share the local Docker daemon, e.g. Docker Desktop or minikube's).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pulumi
import pulumi_docker as docker

ROLES = ("trainer", "cube", "serving")
#: the MLflow server's image (built only for a stack that deploys one: ``ImagesArgs.tracking``)
TRACKING = "tracking"
#: the Dockerfile targets serving's image may be built from (``ImagesArgs.serving_target``)
SERVING_TARGETS = ("serving", "serving-paddle")


@dataclass(frozen=True)
class ImagesArgs:
    """Inputs of :class:`Images`.

    Attributes:
        repo_root: build context (the repository root; see ``.dockerignore``).
        registry: registry and optional path prefix, e.g. ``ghcr.io/acme``; ``""`` = no push
            (a plain string: it decides whether the images are pushed).
        tag: image tag.
        username / password: registry credentials (``password`` a Pulumi secret), or None
            to use the Docker client's existing login.
        platform: target platform, e.g. ``linux/amd64`` (Paddle's wheels are x86-64).
        tracking: also build the ``tracking`` image (the MLflow server), for a stack that
            deploys one.
        serving_target: the Dockerfile target of serving's image: ``serving`` (ONNX Runtime,
            no Paddle) or ``serving-paddle`` (Paddle Inference too, for the dense backend
            ``paddle``); the image is named after the target.
    """

    repo_root: Path
    registry: str
    tag: pulumi.Input[str]
    username: Optional[pulumi.Input[str]] = None
    password: Optional[pulumi.Input[str]] = None
    platform: pulumi.Input[str] = "linux/amd64"
    tracking: bool = False
    serving_target: str = "serving"


def image_name(registry: str, role: str, tag: str) -> str:
    """``[<registry>/]elastic-ctr-<role>:<tag>``."""
    repo = f"elastic-ctr-{role}"
    return f"{registry.rstrip('/')}/{repo}:{tag}" if registry else f"{repo}:{tag}"


class Images(pulumi.ComponentResource):
    """Outputs ``trainer``, ``cube``, ``serving`` (and ``tracking``, or None): the references
    pods should run.

    When pushed, the reference is the registry digest (``repo@sha256:...``), so every
    rebuild rolls the pods; when not pushed, the local ``name:tag``. Children are named
    ``<name>-<role>``.
    """

    trainer: pulumi.Output[str]
    cube: pulumi.Output[str]
    serving: pulumi.Output[str]

    def __init__(self, name: str, args: ImagesArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("elastic-ctr:index:Images", name, None, opts)
        push = bool(args.registry)
        registry = None
        if push and args.username and args.password is not None:
            registry = docker.RegistryArgs(
                server=args.registry.split("/")[0], username=args.username,
                password=pulumi.Output.secret(args.password))
        self.refs: dict[str, pulumi.Output[str]] = {}
        from runtime.tracking import code_version

        commit = code_version()
        if args.serving_target not in SERVING_TARGETS:
            raise ValueError(f"serving_target {args.serving_target!r}: expected one of {', '.join(SERVING_TARGETS)}")
        for role in ROLES + ((TRACKING,) if args.tracking else ()):
            target = args.serving_target if role == "serving" else role
            image = docker.Image(
                f"{name}-{role}",
                image_name=pulumi.Output.from_input(args.tag).apply(lambda tag, t=target: image_name(args.registry, t, tag)),
                build=docker.DockerBuildArgs(
                    context=str(args.repo_root),
                    dockerfile=str(args.repo_root / "Dockerfile"),
                    target=target,
                    platform=args.platform,
                    # the code's version in the image (ELASTIC_CTR_GIT_COMMIT: the MLflow runs' tag)
                    args={"GIT_COMMIT": commit} if commit else None,
                ),
                registry=registry,
                skip_push=not push,
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.refs[role] = image.repo_digest if push else image.image_name
        self.trainer = self.refs["trainer"]
        self.cube = self.refs["cube"]
        self.serving = self.refs["serving"]
        self.tracking = self.refs.get(TRACKING)
        self.register_outputs(dict(self.refs))
