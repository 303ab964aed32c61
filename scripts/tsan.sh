#!/usr/bin/env bash
# Runs every test suite under ThreadSanitizer: the library's engine, storage and manager suites in the test
# process (with the hostile-server suite, whose watchdogs need a machine not loaded by other tests), then the
# rest (CLI, crash and local-fault tests) side by side, whose `stitch` and harness child
# processes are built with the same sanitizer.
#
#   scripts/tsan.sh [--filter REGEX]
#
# Every target locks with StitchLocks' `Locked`, a pthread mutex that ThreadSanitizer intercepts (Synchronization's
# `Mutex` locks with futex calls in an uninstrumented module on Linux, which it could not see), so release and
# sanitized builds run the same lock code.
# The library suites run one test at a time (--no-parallel):
# ThreadSanitizer slows everything several times over, and timing-based parts of the engine (slow-connection
# replacement, steals by time left) would otherwise see a machine far slower than any real one. Every process
# writes its reports to a log file (TSAN_OPTIONS log_path), children included, whose stderr the tests capture;
# the script fails if any report was written. Uses its own build directory (.build-tsan).
set -euo pipefail
# The suite runs its tests side by side: ~1,400 descriptors at its peak (test servers, pipes, child processes).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cd "$(dirname "$0")/.."
command -v swift >/dev/null || export PATH="$PATH:/opt/swift/usr/bin"
library='SegmentedTests|DownloaderTests|DownloadManagerTests|PartStoreTests|RateLimiterTests|CatalogTests|HostileServerTests'
swift build --build-tests --sanitize=thread --scratch-path .build-tsan
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# log_path is always added: without it a child's reports would sit in stderr the tests capture and drop.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=0} log_path=$logs/report"
# Each run is bounded (scripts/bounded.sh: past the bound it prints the processes and the test process's
# threads, then stops it), so a hang fails here with what hung, not at CI's overall limit with nothing said.
bound=2400
run() { bash scripts/bounded.sh "$bound" swift test --skip-build --sanitize=thread --scratch-path .build-tsan "$@"; }
# At most 12 tests of a process at once, as in test.sh: started all together on the two-thread pool, each test's
# time bounds would count every other test's work (issue 30's note). A caller can set another width.
export SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH="${SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH:-12}"
status=0
if [[ ${1:-} == --filter ]]; then
    run --no-parallel --filter "$2" || status=$?
else
    bound=600
    run --no-parallel --filter "$library" || status=$?
    bound=1200
    run --skip "$library|MatrixTests|DaemonTests|PowerCut|PowerLossFS" || status=$?  # the matrix and the power cuts run once, in test.sh
    # The daemon's suite on its own: its instrumented `stitch serve` processes and their downloads would load the
    # machine under the crash tests' timing.
    bound=600
    run --filter DaemonTests || status=$?
fi
# Any report file counts (races, and also ERROR/FATAL/CHECK failures, which are not WARNING lines).
reports=$(cat "$logs"/report.* 2>/dev/null | grep -c 'WARNING: ThreadSanitizer' || true)
writers=$(find "$logs" -name 'report.*' -size +0 | wc -l)
echo "tsan.sh: $reports ThreadSanitizer warning(s), from $writers process(es) that wrote reports; tests exited $status"
if ((writers > 0)); then
    cat "$logs"/report.* >&2
    exit 1
fi
exit "$status"
