#!/usr/bin/env bash
# Drives `stitch serve` with aria2p (from PyPI, in a virtual environment under .build/) against the loopback
# nginx: scripts/aria2p.sh [NGINX_DIR]. Without NGINX_DIR, starts its own nginx. test.sh runs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=scripts/aria2-venv.sh
source scripts/aria2-venv.sh
aria2_venv "$root"
nginx_dir=${1:-}
if [[ -z $nginx_dir ]]; then
    nginx_dir=$(mktemp -d /tmp/stitch-aria2p-nginx.XXXXXX)
    trap 'bash scripts/nginx.sh stop "$nginx_dir" >/dev/null 2>&1 || true; rm -rf "$nginx_dir"' EXIT
    bash scripts/nginx.sh start "$nginx_dir" >/dev/null
fi
bin=$(swift build --show-bin-path)
"$venv/bin/python" Tests/aria2p/drive.py "$bin/stitch" "$nginx_dir"
