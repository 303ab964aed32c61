#!/usr/bin/env bash
# A cross-site page attacks `stitch serve` in headless Chromium (Debian's chromium): Tests/browser/cross_site.py.
# test.sh runs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=$(swift build --show-bin-path)
python3 Tests/browser/cross_site.py "$bin/stitch"
