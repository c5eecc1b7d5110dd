#!/usr/bin/env bash
# Prometheus and promtool (Debian's `prometheus` package: /usr/bin/prometheus, /usr/bin/promtool)
# for the alert rules' unit tests (`promtool check rules`, `promtool test rules`:
# tests/monitoring) and the live test and `make demo DEMO_ARGS=--prometheus`, where the
# project starts its own Prometheus on 127.0.0.1 (runtime/local/prometheus_server.py). The
# package's own service (prometheus.service, :9090) is not used: on a host run by systemd the
# install starts it, so this script stops and disables it again (a container has none).
# Does nothing when both binaries are there. Needs root (or sudo) for apt-get.
set -euo pipefail
if [[ -x /usr/bin/prometheus && -x /usr/bin/promtool ]]; then
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-prometheus.sh: needs root or sudo to apt-get install prometheus" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
APT=(-o DPkg::Lock::Timeout=300)
$SUDO apt-get "${APT[@]}" update -q
$SUDO apt-get "${APT[@]}" install -y -q --no-install-recommends prometheus
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
  $SUDO systemctl disable --now prometheus.service prometheus-node-exporter.service 2>/dev/null || true
fi
