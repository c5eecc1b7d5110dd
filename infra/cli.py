"""``elastic-ctr render``: the stack's Kubernetes manifests, rendered offline under mocks."""
from __future__ import annotations

import argparse

from runtime.cli import HelpFormatter
import sys
from pathlib import Path


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds the ``render`` subcommand to the top-level parser."""
    p = sub.add_parser(
        "render", formatter_class=HelpFormatter,
        help="render a stack's Kubernetes manifests offline (Pulumi mocks; no cluster needed)",
        description="Runs the Pulumi program under mocks with Pulumi.yaml defaults, "
        "Pulumi.<stack>.yaml and --set overrides, and writes one YAML file per Kubernetes "
        "resource (secrets redacted) plus outputs.json.",
    )
    p.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (camelCase, e.g. cubeShards=4); repeatable")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default: rendered/<stack>; with --diff-against, "
                   "nothing is written unless --out is given)")
    p.add_argument("--diff-against", type=Path, default=None, metavar="DIR",
                   help="print what `pulumi up` would do to go from the rendering in DIR to this "
                   "one, as `pulumi preview --diff` words it (create/update/replace/delete with "
                   "the changed paths; infra/preview.py)")
    p.set_defaults(handler=_render)


def _render(args: argparse.Namespace) -> int:
    from infra.config import ConfigError
    from infra.render import RenderError, render, write

    try:
        rendering = render(args.stack, args.overrides)
    except (ConfigError, RenderError) as exc:
        print(f"elastic-ctr render: {exc}", file=sys.stderr)
        return 2
    if args.diff_against is not None:
        from infra import preview
        from infra.config import REPO_ROOT

        try:
            before = preview.load_dir(args.diff_against)
        except (OSError, ValueError) as exc:
            print(f"elastic-ctr render: --diff-against: {exc}", file=sys.stderr)
            return 2
        mutable = preview.configmap_mutable(REPO_ROOT / f"Pulumi.{args.stack}.yaml")
        print(preview.report(before, rendering, configmap_mutable=mutable))
        if args.out is None:
            return 0
    out = args.out or Path("rendered") / args.stack
    write(rendering, out)
    kinds: dict[str, int] = {}
    for m in rendering.manifests:
        kinds[m.kind] = kinds.get(m.kind, 0) + 1
    summary = ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items()))
    print(f"{len(rendering.manifests)} manifests for stack {args.stack} in {out} ({summary})")
    return 0
