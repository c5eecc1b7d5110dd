"""Running a runbook of the documentation (``docs/runbooks/*.md``) as written: its ``bash``
blocks, in order, as one script, with ``kubectl`` played on the container harness
(``kubectl_shim.py``) and the host's ``elastic-ctr`` (the test's venv) on ``PATH``; the
page's own variable lines (``NS=...``) get the values of the run."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.containers import kubectl_shim

REPO = Path(__file__).resolve().parents[2]
SHIM = Path(kubectl_shim.__file__)


def bash_blocks(page: Path) -> list[str]:
    """The page's ```` ```bash ```` blocks, in order."""
    return re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M)


def script(page: Path, values: dict[str, str]) -> str:
    """The page's bash blocks as one script, each ``NAME=...`` line of ``values``' names given
    its value (the rest of those lines, a comment, is kept); raises ``KeyError`` for a name the
    page does not set."""
    text = "\n".join(bash_blocks(page))
    for name, value in values.items():
        text, n = re.subn(rf"^{name}=\S+", f"{name}={value}", text, flags=re.M)
        if not n:
            raise KeyError(f"{page.name} sets no {name}=")
    return text


def kubectl_lines(page: Path) -> list[list[str]]:
    """The ``kubectl`` command lines of the page's bash blocks, as words (quotes removed,
    variables left as they are): what the shim must play."""
    import shlex

    out = []
    for block in bash_blocks(page):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"\||&&|;|&$", line.split(" #")[0].strip()):
                part = re.sub(r"\s\d*>&?\s*\S+", "", part)  # redirections
                words = shlex.split(part, posix=True)
                if words[:1] == ["kubectl"]:
                    out.append(words)
    return out


def run(page: Path, values: dict[str, str], state: Path, home: Path, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Runs ``script(page, values)`` with ``bash -euo pipefail`` in ``home`` (also ``$HOME``),
    ``kubectl`` the shim over ``state`` (``kubectl_shim.write_state``), the test's Python
    environment first on ``PATH``."""
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"#!/bin/sh\ncd {REPO} && exec {sys.executable} -m tests.containers.kubectl_shim \"$@\"\n")
    kubectl.chmod(0o755)
    env = {**os.environ, "HOME": str(home), kubectl_shim.STATE_ENV: str(state),
           "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("ELASTIC_CTR_CREDENTIALS_DIR", None)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script(page, values)], cwd=home, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
