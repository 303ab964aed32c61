#!/usr/bin/env bash
# Drives `stitch serve` with aria2p (from PyPI, in a virtual environment under .build/) against the loopback
# nginx: scripts/aria2p.sh [NGINX_DIR]. Without NGINX_DIR, starts its own nginx. test.sh runs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=.build/aria2p-venv
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import aria2p" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "aria2p==0.12.3"
fi
nginx_dir=${1:-}
if [[ -z $nginx_dir ]]; then
    nginx_dir=$(mktemp -d /tmp/stitch-aria2p-nginx.XXXXXX)
    trap 'bash scripts/nginx.sh stop "$nginx_dir" >/dev/null 2>&1 || true; rm -rf "$nginx_dir"' EXIT
    bash scripts/nginx.sh start "$nginx_dir" >/dev/null
fi
bin=$(swift build --show-bin-path)
"$venv/bin/python" Tests/aria2p/drive.py "$bin/stitch" "$nginx_dir"
