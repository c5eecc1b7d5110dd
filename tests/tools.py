"""Tools the test suite uses that `make install` may leave out: Debian's packages, which need
root (Chromium and chromedriver: `make browser`; Prometheus and promtool: `make prometheus`),
and the analyzers' venvs, which need Python 3.11 (.venv-nca, .venv-checkov). A test that
needs a missing one skips, naming it and how to get it; under `make test`, which installs
them all (scripts/check-prereqs.sh --all), the same test fails instead
(``ELASTIC_CTR_REQUIRE_TOOLS=1``, set by the Makefile's test target)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import pytest

#: set to 1 by `make test`: a missing tool fails the test that needs it
REQUIRE_ENV = "ELASTIC_CTR_REQUIRE_TOOLS"

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def need(paths: Iterable[str | os.PathLike], what: str, how: str) -> None:
    """Skips the calling test (fails it under ``make test``) unless every path exists:
    ``what`` names the tool, ``how`` how to get it."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if not missing:
        return
    msg = f"{what} is not installed ({', '.join(missing)}): {how}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1: make test installs it)", pytrace=False)
    pytest.skip(msg)


def need_browser() -> None:
    """Chromium and chromedriver, Debian's packages (Selenium drives them)."""
    need((CHROMIUM, CHROMEDRIVER), "Chromium", "make browser (apt-get: needs root or sudo)")
