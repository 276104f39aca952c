#!/bin/sh
# Install Debian's chromium for the headless HTML report test (tests/reports/test_html.py).
# Idempotent: does nothing when a chromium binary is already on PATH.
set -eu
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
command -v chromium >/dev/null 2>&1
