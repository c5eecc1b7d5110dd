#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the browser test (tests/tracking/test_browser.py):
# Debian's `chromium` and `chromium-driver` packages (/usr/bin/chromium, /usr/bin/chromedriver).
# Selenium drives them (the dev extra); nothing is downloaded from a browser vendor's CDN.
# Does nothing when both are there. Needs root (or sudo) for apt-get.
set -euo pipefail
if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-browser.sh: needs root or sudo to apt-get install chromium chromium-driver" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver
