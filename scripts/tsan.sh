#!/usr/bin/env bash
# Runs the engine, storage and manager tests under ThreadSanitizer.
#
#   scripts/tsan.sh [--filter REGEX]
#
# Built with -DSTITCH_TSAN, which swaps Synchronization's Mutex for a pthread mutex in every target that uses one
# (Sources/Stitch/Support/SanitizerMutex.swift): on Linux the standard library's Mutex locks with futex calls in
# an uninstrumented module, so ThreadSanitizer cannot see it and reports every access it guards as a race.
# With the swap, a report is a real race. Tests run one at a time (--no-parallel): ThreadSanitizer slows
# everything several times over, and timing-based parts of the engine (slow-connection replacement, steals by
# time left) would otherwise see a machine far slower than any real one. Uses its own build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
filter='SegmentedTests|DownloaderTests|DownloadManagerTests|PartStoreTests|RateLimiterTests|CatalogTests'
# Left to the normal run: these bound the bytes a server pushed past a steal point by the kernel's socket buffers
# on a normally fast client; ThreadSanitizer's slowdown lets more pile up (they are about buffering, not threads).
skip='splitsIntoSegmentsAndIsByteExact|idleLaneStealsHalfOfTheSlowestSegmentOnAPieceBoundary'
if [[ ${1:-} == --filter ]]; then filter=$2; fi
swift build --build-tests --sanitize=thread -Xswiftc -DSTITCH_TSAN --scratch-path .build-tsan
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0} \
    swift test --skip-build --sanitize=thread --scratch-path .build-tsan --no-parallel --filter "$filter" --skip "$skip" 2>&1 | tee "$log" || status=$?
races=$(grep -c 'WARNING: ThreadSanitizer' "$log" || true)
echo "tsan.sh: $races ThreadSanitizer report(s); tests exited $status"
((races == 0)) || exit 1
exit "$status"
