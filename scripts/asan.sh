#!/usr/bin/env bash
# Runs every test suite under AddressSanitizer (memory errors: out-of-bounds, use-after-free, double free) —
# the library, the `stitch` executable the CLI tests run (built with the same sanitizer), and the manager.
#
#   scripts/asan.sh [--filter REGEX]
#
# Two `swift test` runs, the library's engine/storage/manager suites and then the rest (CLI, crash and local-fault
# tests): together the hostile-server watchdogs (20 s) can fire on two cores under ASan's slowdown with dozens of
# child processes competing. Leak checking is off (ASAN_OPTIONS=detect_leaks=0): LeakSanitizer reports the test
# servers that detached connection threads still reference when the test process exits — test support, not the
# library. Run with ASAN_OPTIONS=detect_leaks=1 to see them. Uses its own build directory (.build-asan) and the
# nginx of scripts/test.sh when STITCH_NGINX_DIR names one (otherwise the tests start their own).
set -euo pipefail
# The suite runs its tests side by side: ~1,400 descriptors at its peak (test servers, pipes, child processes).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cd "$(dirname "$0")/.."
command -v swift >/dev/null || export PATH="$PATH:/opt/swift/usr/bin"
library='SegmentedTests|DownloaderTests|DownloadManagerTests|PartStoreTests|RateLimiterTests|CatalogTests|HostileServerTests|InputListTests|ResumePolicyTests|CRC32CTests|ChecksumTests'
swift build --build-tests --sanitize=address --scratch-path .build-asan
# Every process writes its reports to a file (log_path), children included: a child's report would otherwise
# sit in stderr the tests capture, behind an exit status (1) that some tests expect from stitch anyway.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}:log_path=$logs/report"
# Each run is bounded (scripts/bounded.sh: past the bound it prints the processes and the test process's
# threads, then stops it), so a hang fails here with what hung, not at CI's overall limit with nothing said.
bound=2400
run() { bash scripts/bounded.sh "$bound" swift test --skip-build --sanitize=address --scratch-path .build-asan "$@"; }
# At most 12 tests of a process at once, as in test.sh: started all together on the two-thread pool, each test's
# time bounds would count every other test's work (issue 30's note). A caller can set another width.
export SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH="${SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH:-12}"
status=0
if [[ ${1:-} == --filter ]]; then
    run --filter "$2" || status=$?
else
    bound=600
    run --filter "$library" || status=$?
    bound=1200
    run --skip "$library|MatrixTests|DaemonTests|PowerCut|PowerLossFS" || status=$?  # the matrix and the power cuts run once, in test.sh
    # The daemon's suite on its own: its instrumented `stitch serve` processes and their downloads would load the
    # machine under the crash tests' timing.
    bound=600
    run --filter DaemonTests || status=$?
fi
writers=$(find "$logs" -name 'report.*' -size +0 | wc -l)
echo "asan.sh: $writers process(es) wrote AddressSanitizer reports; tests exited $status"
if ((writers > 0)); then
    cat "$logs"/report.* >&2
    exit 1
fi
exit "$status"
