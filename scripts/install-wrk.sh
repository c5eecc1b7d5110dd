#!/usr/bin/env bash
# wrk, the C HTTP load generator of make bench-serving-peers (bench/wrk_load.py): Debian's
# `wrk` package (/usr/bin/wrk, with its LuaJIT for bench/wrk_post.lua). Nothing is built or
# downloaded from elsewhere. Does nothing when wrk is there. Needs root (or sudo) for apt-get.
set -euo pipefail
if command -v wrk >/dev/null; then
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-wrk.sh: needs root or sudo to apt-get install wrk" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends wrk
