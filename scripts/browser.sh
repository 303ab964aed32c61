#!/usr/bin/env bash
# The daemon's web page and its browser-facing security, in headless Chromium (Debian's chromium and
# chromium-driver) against the loopback nginx: scripts/browser.sh [NGINX_DIR] [PAGE_TEST ...]. test.sh runs it.
#   1. Tests/web/logic.test.mjs: the page's formatting and state logic, under Node's test runner.
#   2. Tests/browser/cross_site.py: a page of another site attacks the daemon; everything must fail.
#   3. Tests/browser/page.py: the page itself, driven by Selenium (PyPI, in a virtual environment under .build/);
#      screenshots go to .build/test-output/browser/.
# Without NGINX_DIR, starts its own nginx.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
node --test --test-reporter=spec Tests/web/
venv=.build/selenium-venv
# 4.40.0: the newest whose dependencies the package index here has (4.52 wants a certifi it lacks).
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import selenium" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "selenium==4.40.0"
fi
nginx_dir=${1:-}
[[ $# -gt 0 ]] && shift
if [[ -z $nginx_dir ]]; then
    nginx_dir=$(mktemp -d /tmp/stitch-browser-nginx.XXXXXX)
    trap 'bash scripts/nginx.sh stop "$nginx_dir" >/dev/null 2>&1 || true; rm -rf "$nginx_dir"' EXIT
    bash scripts/nginx.sh start "$nginx_dir" >/dev/null
fi
bin=$(swift build --show-bin-path)
python3 Tests/browser/cross_site.py "$bin/stitch"
out=.build/test-output/browser
rm -rf "$out"
"$venv/bin/python" Tests/browser/page.py "$bin/stitch" "$nginx_dir" "$out" "$@"
