#!/usr/bin/env bash
# aria2 conformance: Tests/aria2conformance/replay.py sends the same JSON-RPC calls to the real aria2c (1.36) and
# to `stitch serve` and compares the shapes of the answers (intended differences: Tests/aria2conformance/intended.py);
# then Tests/aria2conformance/aioaria2_drive.py drives `stitch serve` with aioaria2 (from PyPI, in the virtual
# environment under .build/ that scripts/aria2p.sh makes) and asserts every result and notification.
#   scripts/conformance.sh [NGINX_DIR]     without NGINX_DIR, starts its own nginx
#   STITCH=path/to/stitch                  the binary to test (default: swift build --show-bin-path)/stitch
#   ARIA2C=path/to/aria2c                  default /usr/bin/aria2c (apt-get install aria2)
# Exits non-zero on any unexpected difference or failed assertion (both parts always run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=scripts/aria2-venv.sh
source scripts/aria2-venv.sh
aria2_venv "$root"
aria2c=${ARIA2C:-/usr/bin/aria2c}
[[ -x $aria2c ]] || { echo "conformance.sh: $aria2c not found (apt-get install aria2)" >&2; exit 1; }
nginx_dir=${1:-}
if [[ -z $nginx_dir ]]; then
    nginx_dir=$(mktemp -d /tmp/stitch-conformance-nginx.XXXXXX)
    trap 'bash scripts/nginx.sh stop "$nginx_dir" >/dev/null 2>&1 || true; rm -rf "$nginx_dir"' EXIT
    bash scripts/nginx.sh start "$nginx_dir" >/dev/null
fi
if [[ -n ${STITCH:-} ]]; then
    stitch=$STITCH
else
    stitch=$(swift build --show-bin-path)/stitch
fi
status=0
"$venv/bin/python" Tests/aria2conformance/replay.py "$stitch" "$nginx_dir" --aria2c "$aria2c" || status=1
"$venv/bin/python" Tests/aria2conformance/aioaria2_drive.py "$stitch" "$nginx_dir" || status=1
exit $status
