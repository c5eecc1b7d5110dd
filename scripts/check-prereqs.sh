#!/usr/bin/env bash
# check-prereqs.sh: what `make install` (and so `make demo`, `make test`) needs on this
# machine, checked before anything is installed; one line per missing piece.
#
#   required: Python 3.10 or newer ($PYTHON) with venv and its C headers, a C compiler ($CC,
#             else cc), and about 4 GB of free disk space (pip also needs to reach PyPI: not
#             checked here);
#   optional: Python 3.11 ($NCA_PYTHON: the network-config-analyzer and checkov venvs), root or
#             sudo with apt-get (Chromium and chromedriver, Prometheus), a Docker engine's
#             prerequisites (root, Debian: scripts/engine.sh). Without one, `make install`
#             leaves that piece out and the tests that need it skip, saying why; `make test`
#             (--all) requires them all.
#
# Usage: check-prereqs.sh [--all]
# Output: "check-prereqs: missing: ..." (required; exit 1 after all checks), "check-prereqs:
# optional: ..." (only without --all; with --all they are required), nothing else when all is well.
# Environment: PYTHON (default python3), NCA_PYTHON (default python3.11), CC (default cc),
# DEB_BIN (default /usr/bin: where Debian's packages put chromium, chromedriver, prometheus, promtool).
set -uo pipefail
ALL=0
[[ ${1:-} == --all ]] && ALL=1
PY=${PYTHON:-python3}
NCA_PY=${NCA_PYTHON:-python3.11}
CC_BIN=${CC:-cc}
DEB=${DEB_BIN:-/usr/bin}
missing=0

need() {  # need MESSAGE: a required piece is missing
    echo "check-prereqs: missing: $*" >&2
    missing=$((missing + 1))
}

optional() {  # optional MESSAGE: required with --all, else said and skipped
    if [[ $ALL -eq 1 ]]; then
        need "$* (make test needs it)"
    else
        echo "check-prereqs: optional: $*" >&2
    fi
}

# -- Python
if ! command -v "$PY" >/dev/null 2>&1; then
    need "Python 3.10 or newer as '$PY' (set PYTHON=/path/to/python3 to use another)"
else
    if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        need "Python 3.10 or newer: '$PY' is $("$PY" -c 'import platform; print(platform.python_version())' 2>/dev/null) (set PYTHON=...)"
    fi
    if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        need "Python's venv module with ensurepip for '$PY' (Debian/Ubuntu: apt-get install python3-venv)"
    fi
    inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
    if [[ -z $inc || ! -f $inc/Python.h ]]; then
        need "Python's C headers for '$PY' (Python.h; Debian/Ubuntu: apt-get install python3-dev): the cube kernel and the pserver's signal handler are C extensions"
    fi
fi

# -- C compiler
if ! command -v "$CC_BIN" >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
    need "a C compiler ('$CC_BIN' or gcc; Debian/Ubuntu: apt-get install gcc): the cube kernel and the pserver's signal handler are C extensions"
fi

# -- disk: the venvs (.venv about 2.3 GB with Paddle, the others under 1 GB) and pip's cache
free_kb=$(df -Pk . 2>/dev/null | awk 'NR == 2 {print $4}')
if [[ -n $free_kb && $free_kb -lt 4000000 ]]; then
    need "about 4 GB of free disk space here for the virtual environments ($((free_kb / 1024)) MB free)"
fi

# -- optional: Python 3.11 for network-config-analyzer and checkov (their own pins)
if ! command -v "$NCA_PY" >/dev/null 2>&1; then
    optional "Python 3.11 as '$NCA_PY' (set NCA_PYTHON=...) for .venv-nca and .venv-checkov: tests/infra/test_connectivity.py and tests/infra/test_checkov.py skip without them"
fi

# -- optional: root (or sudo) with apt-get for the Debian packages
if [[ $(id -u) -ne 0 ]] && ! sudo -n true >/dev/null 2>&1; then
    root="needs root or passwordless sudo"
elif ! command -v apt-get >/dev/null 2>&1; then
    root="needs apt-get (Debian or Ubuntu)"
else
    root=""
fi
if [[ -n $root ]] && [[ ! -x $DEB/chromium || ! -x $DEB/chromedriver ]]; then
    optional "Chromium and chromedriver (make browser: $root): tests/docs/test_browser.py and tests/tracking/test_browser.py skip without them"
fi
if [[ -n $root ]] && [[ ! -x $DEB/prometheus || ! -x $DEB/promtool ]]; then
    optional "Prometheus and promtool (make prometheus: $root): the alert rules' tests (tests/monitoring) skip without them"
fi

if [[ $missing -gt 0 ]]; then
    echo "check-prereqs: $missing missing piece(s): nothing was installed" >&2
    exit 1
fi
exit 0
