#!/usr/bin/env bash
# What the daemon's web page costs: stitch serve's CPU with no page and with PAGES pages open (headless
# Chromium, Selenium from PyPI in .build/selenium-venv), STOPPED stopped and ACTIVE active downloads, in
# alternating rounds; the size of one poll's answer; the time to draw the first list. bench/page.py does the work.
#
#   ROUNDS=5 DURATION=20 PAGES=3 STOPPED=1000 ACTIVE=5 bench/page.sh
#
# Needs: chromium, chromium-driver, nginx-light, python3-venv, and a release build (`swift build -c release`;
# STITCH=path overrides).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stitch=${STITCH:-.build/release/stitch}
[[ -x $stitch ]] || { echo "page.sh: no $stitch (swift build -c release)" >&2; exit 1; }
venv=.build/selenium-venv
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import selenium" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "selenium==4.40.0"
fi
nginx_dir=$(mktemp -d /tmp/stitch-bench-page-nginx.XXXXXX)
trap 'bash scripts/nginx.sh stop "$nginx_dir" >/dev/null 2>&1 || true; rm -rf "$nginx_dir"' EXIT
bash scripts/nginx.sh start "$nginx_dir" >/dev/null
"$venv/bin/python" bench/page.py "$stitch" "$nginx_dir"
