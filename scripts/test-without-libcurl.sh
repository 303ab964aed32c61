#!/usr/bin/env bash
# The build without the package's Libcurl trait (issue 15): `swift build --disable-default-traits` has no CCurl
# target, needs no libcurl headers, and sends every download over URLSession (FoundationNetworking, which loads its
# own libcurl at run time). Builds it in .build-nocurl with libcurl's headers and pkg-config file hidden (a mount
# namespace of its own, where one can be made: as root in CI), checks that no libcurl module went into it, then runs
# its tests: every suite that does not depend on the transport, the engine's suites over URLSession, and the
# combination matrix with this build's stitch (over URLSession).
#
# Every StitchTests suite runs over URLSession (the hostile server's scenarios, the segmented transfers, the manager
# included), and every StitchCLITests suite with this build's stitch: the tests of libcurl-only options (--ca-cert,
# -k, netrc, --streams) check instead that they are refused plainly, and the keep-alive counts are the libcurl
# backend's own (StitchUnderTest in Tests/StitchCLITests/CLITestSupport.swift). docs/urlsession.md, "What is tested
# over it".
#
#   STITCH_NGINX_DIR=DIR bash scripts/test-without-libcurl.sh     # DIR: a running scripts/nginx.sh (test.sh starts one)
set -euo pipefail
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v swift >/dev/null || export PATH="$PATH:/opt/swift/usr/bin"
build=.build-nocurl
build_command="swift build --disable-default-traits --build-path $build --build-tests"

log=$(mktemp)
empty=""
trap 'rm -f "$log"; [[ -z $empty ]] || rmdir "$empty" 2>/dev/null || true' EXIT
headers=$(dirname "$(find /usr/include -path '*/curl/curl.h' -print -quit 2>/dev/null || true)")
pc=$(pkg-config --variable=pcfiledir libcurl 2>/dev/null || true)
if [[ $headers != . && -n $pc ]] && unshare -m true 2>/dev/null; then
    empty=$(mktemp -d)
    echo "test-without-libcurl.sh: building with $headers and $pc/libcurl.pc hidden"
    # The commands the namespace runs are fixed strings; the paths go in as arguments.
    unshare -m bash -c 'mount --bind "$1" "$2" && mount --bind /dev/null "$3/libcurl.pc" && test ! -e "$2/curl.h" && shift 3 && "$@"' \
        hide "$empty" "$headers" "$pc" $build_command 2>&1 | tee "$log"
else
    # Then only the check on the build's commands below shows that no libcurl module went in.
    echo "test-without-libcurl.sh: WARNING: cannot hide libcurl's headers here (headers: $headers," \
        "pkg-config: ${pc:-none}; unshare -m needs root); building with them visible" >&2
    $build_command 2>&1 | tee "$log"
fi
if grep -E '^/.*: warning:' "$log" | grep -v "/$build/" >/dev/null; then
    echo "test-without-libcurl.sh: the build has warnings (see above)" >&2
    exit 1
fi
# The build's own record of its commands (written by the build above; `swift test` below re-plans it with the same
# traits, so every call here says --disable-default-traits).
description=$build/debug/description.json
[[ -s $description ]] || { echo "test-without-libcurl.sh: no $description to check" >&2; exit 1; }
if grep -q 'CCurl' "$description"; then
    echo "test-without-libcurl.sh: the build without the Libcurl trait still has the CCurl module" >&2
    exit 1
fi

# Over URLSession by default in this build (TransportBackend.default). A hang must not take the CI run's time.
# At most SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH tests at once (test.sh sets 12): with all of StitchTests'
# ~480 started together, every transfer's callbacks queued on the URLSession backend's one queue and a few stall
# timeouts fired on healthy transfers (docs/urlsession.md), which once split this run into three processes.
export SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH="${SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH:-12}"
timeout 1200 swift test --skip-build --disable-default-traits --build-path "$build" --filter 'StitchTests\.' \
    --skip URLSessionTransportTests
# On its own: it needs the loopback server to outrun a rate-limited sink, which other tests' load can prevent.
timeout 300 swift test --skip-build --disable-default-traits --build-path "$build" --filter URLSessionTransportTests
# The CLI suites with this build's stitch (the daemon's included); the matrix on its own below. Needs STITCH_NGINX_DIR.
# The power cuts run in test.sh, over libcurl: what they check is the order of writes and syncs, the same here.
timeout 900 swift test --skip-build --disable-default-traits --build-path "$build" --filter 'StitchCLITests\.' \
    --skip MatrixTests --skip PowerCut --skip PowerLossFS
# Rule 6's combination matrix (433 cases) with this build's stitch binary, so every download goes over URLSession:
# the same checks as over libcurl (byte-exact, If-Range, connection counts, nothing saved fetched again, the
# bytes sent within docs/overlap.md's bound, the achieved rate). Needs STITCH_NGINX_DIR.
timeout 900 swift test --skip-build --disable-default-traits --build-path "$build" --filter MatrixTests
