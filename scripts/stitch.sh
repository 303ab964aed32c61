#!/usr/bin/env bash
# Sets up (Debian packages, release build) and runs stitch:  scripts/stitch.sh get URL [options]
# `scripts/stitch.sh demo` instead shows a download killed and resumed on a loopback server (scripts/demo.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v swift >/dev/null || export PATH="$PATH:/opt/swift/usr/bin"
bash "$root/scripts/install-deps.sh"
if [[ ! -x "$root/.build/release/stitch" || -n "$(find "$root/Sources" "$root/Package.swift" -newer "$root/.build/release/stitch" -print -quit)" ]]; then
    (cd "$root" && swift build -c release --product stitch >&2)
fi
if [[ ${1:-} == demo ]]; then
    STITCH="$root/.build/release/stitch" exec bash "$root/scripts/demo.sh"
fi
exec "$root/.build/release/stitch" "$@"
