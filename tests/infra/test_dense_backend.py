"""The stack key ``denseBackend``: serving's ``--dense-backend`` in the rendered pods, the
image built for it (``serving``, without Paddle, for onnxruntime; ``serving-paddle`` for
paddle), and a bad value refused by name."""
from __future__ import annotations

import pytest

from components.images import Images, ImagesArgs
from infra.config import REPO_ROOT
from infra.render import run_program
from tests.infra.test_config import OK, errors_of


def _serving_args(r) -> list[str]:
    (dep,) = [d for d in r.by_kind("Deployment") if d.body["metadata"]["name"].endswith("serving")]
    (c,) = dep.body["spec"]["template"]["spec"]["containers"]
    return c["args"]


@pytest.mark.parametrize("overrides, backend", [((), "onnxruntime"), (("denseBackend=paddle",), "paddle")])
def test_dense_backend_key_reaches_servings_command_line(rendered, overrides, backend):
    args = _serving_args(rendered("dev", *overrides))
    assert args[args.index("--dense-backend") + 1] == backend


@pytest.mark.parametrize("target", ["serving", "serving-paddle"])
def test_dense_backend_paddle_builds_the_serving_paddle_target(target):
    def program():
        Images("images", ImagesArgs(repo_root=REPO_ROOT, registry="", tag="dev", serving_target=target))
        return {}

    resources, _ = run_program({}, set(), "dev", program=program)
    builds = {r["name"]: r["inputs"] for r in resources if r["type"] == "docker:index/image:Image"}
    assert builds["images-serving"]["build"]["target"] == target
    assert builds["images-serving"]["imageName"] == f"elastic-ctr-{target}:dev"
    assert builds["images-trainer"]["build"]["target"] == "trainer"


def test_dense_backend_images_refuse_an_unknown_serving_target():
    with pytest.raises(ValueError, match="serving_target 'serving-gpu': expected one of serving, serving-paddle"):
        run_program({}, set(), "dev", program=lambda: Images("images", ImagesArgs(
            repo_root=REPO_ROOT, registry="", tag="dev", serving_target="serving-gpu")) and {})


def test_dense_backend_bad_value_names_the_key_and_choices():
    errors = errors_of({**OK, "denseBackend": "tensorrt"})
    assert any("elastic-ctr:denseBackend: 'tensorrt' is invalid; allowed: onnxruntime | paddle" in e for e in errors), errors
