#!/usr/bin/env bash
# Sets up (Debian packages, release build) and runs stitch:  scripts/stitch.sh get URL [options]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v swift >/dev/null || export PATH="$PATH:/opt/swift/usr/bin"
bash "$root/scripts/install-deps.sh"
if [[ ! -x "$root/.build/release/stitch" || -n "$(find "$root/Sources" "$root/Package.swift" -newer "$root/.build/release/stitch" -print -quit)" ]]; then
    (cd "$root" && swift build -c release --product stitch >&2)
fi
exec "$root/.build/release/stitch" "$@"
