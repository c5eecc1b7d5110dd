#!/usr/bin/env bash
# Makes sure Debian's redis-server is installed (for bench/bench_cube.py); does nothing else.
# The benchmark starts its own redis-server on 127.0.0.1 (free port, persistence off).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    echo "redis-server present: $(redis-server --version)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
echo "installing redis-server (apt-get)"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server
redis-server --version
