#!/usr/bin/env bash
# Runs the library's test suites under AddressSanitizer (memory errors: out-of-bounds, use-after-free).
#
#   scripts/asan.sh [--filter REGEX]
#
# Leak checking is off by default (ASAN_OPTIONS=detect_leaks=0): LeakSanitizer reports the test servers that
# detached connection threads still reference when the test process exits — test support, not the library.
# Run with ASAN_OPTIONS=detect_leaks=1 to see them. Uses its own build directory (.build-asan).
set -euo pipefail
cd "$(dirname "$0")/.."
filter='SegmentedTests|DownloaderTests|DownloadManagerTests|PartStoreTests|RateLimiterTests|CatalogTests|HostileServerTests|InputListTests|ResumePolicyTests|CRC32CTests|ChecksumTests'
if [[ ${1:-} == --filter ]]; then filter=$2; fi
swift build --build-tests --sanitize=address --scratch-path .build-asan
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} \
    swift test --skip-build --sanitize=address --scratch-path .build-asan --filter "$filter"
