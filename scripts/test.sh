#!/usr/bin/env bash
# Runs the whole test suite: a warning-free build, then `swift test` with a loopback nginx started for the
# integration tests (stopped on exit). Extra arguments go to `swift test` (e.g. --filter CrashTests).
set -euo pipefail
# The suite runs its tests side by side: ~1,400 descriptors at its peak (test servers, pipes, child processes).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v swift >/dev/null || export PATH="$PATH:/opt/swift/usr/bin"
bash scripts/install-deps.sh

nginx_dir=$(mktemp -d /tmp/stitch-test-nginx.XXXXXX)
cleanup() {
    bash scripts/nginx.sh stop "$nginx_dir" >/dev/null 2>&1 || true
    rm -rf "$nginx_dir"
}
trap cleanup EXIT
bash scripts/nginx.sh start "$nginx_dir" >/dev/null
export STITCH_NGINX_DIR="$nginx_dir"
# The engine keeps a trace in memory, which a test that waited in vain prints (with every thread's stack).
export STITCH_TRACE=1
# At most 12 tests of a process at once (Swift Testing starts every test together otherwise). All of them share the
# concurrency pool's two threads, so each test's bounds (a 60 s watchdog, a 30 s wait for a stall) counted the CPU
# work of every other test queued before its next step. Under two busy loops the main run failed with 21 and 33
# such issues; at 12 it passed twice, faster (100-105 s against 109-128 s). The variable is Swift Testing's (6.3).
export SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH="${SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH:-12}"

# Swift 6 strict concurrency must stay warning-free.
build_log=$(mktemp)
swift build --build-tests 2>&1 | tee "$build_log"
if grep -E '^/.*: warning:' "$build_log" | grep -v '/.build/' >/dev/null; then
    echo "test.sh: the build has warnings (see above)" >&2
    exit 1
fi
rm -f "$build_log"

if (($# > 0)); then
    swift test --skip-build "$@"
else
    # Each run is bounded (scripts/bounded.sh), so a hang fails here saying what hung.
    # The combination matrix (MatrixTests: 433 cases, about two minutes, many stitch processes at once) runs on its
    # own after the rest, so neither loads the machine under the other's timing-sensitive tests.
    # URLSessionTransportTests runs in the build without libcurl below, on a quiet machine: it needs the loopback
    # server to outrun a rate-limited sink, which the whole suite's load has prevented (one request in 30 s).
    bash scripts/bounded.sh 900 swift test --skip-build --skip MatrixTests --skip URLSessionTransportTests --skip PowerCut --skip PowerLossFS
    bash scripts/bounded.sh 600 swift test --skip-build --filter MatrixTests
    # Power cuts (docs/power-loss.md): stitch on a FUSE file system that keeps only what was synced, cut, rebooted
    # and rerun; on their own, since each trial mounts a file system and runs stitch several times (about five
    # minutes). They fail, never skip, without FUSE.
    if [[ ! -c /dev/fuse ]]; then
        echo "test.sh: /dev/fuse is missing: the power-cut stage needs FUSE (fuse3, libfuse3-dev)" >&2
        exit 1
    fi
    bash scripts/bounded.sh 900 swift test --skip-build --filter 'PowerLossFSTests|PowerCutTests|PowerCutServeTests'
    # The build without the Libcurl trait (no libcurl headers; every download over URLSession) and its tests:
    # the engine's suites over URLSession, then URLSessionTransportTests on a quiet machine.
    bash scripts/test-without-libcurl.sh
    # The README's offline demo, with the network cut off (a namespace with only loopback) where that is allowed.
    if unshare -n true 2>/dev/null; then
        STITCH=.build/debug/stitch unshare -n sh -c 'ip link set lo up && bash scripts/demo.sh'
    else
        echo "test.sh: cannot make a network namespace here; the demo runs with the network as it is" >&2
        STITCH=.build/debug/stitch bash scripts/demo.sh
    fi
    # A real aria2 client (aria2p from PyPI, in a virtual environment) drives `stitch serve`.
    bash scripts/aria2p.sh "$nginx_dir"
    # The same calls to aria2c 1.36 (Debian's aria2) and to stitch serve, answers compared by shape (intended
    # differences: Tests/aria2conformance/intended.py); then aioaria2 (PyPI) drives stitch serve.
    bash scripts/bounded.sh 600 bash scripts/conformance.sh "$nginx_dir"
    # The web page in headless Chromium (its logic under Node, a cross-site attack, the page driven by Selenium).
    bash scripts/browser.sh "$nginx_dir"
fi
