#!/usr/bin/env bash
# Power-cut soak: TRIALS downloads of every kind PowerCutTests knows (get, get -c 4 --checksum, get -c 4 with a
# steal, --limit-rate, -i, --adopt, the background driver), each on Tests/PowerLoss/plfs.c (a FUSE file system that
# keeps only what was synced), cut at a seeded byte count or operation count with torn writeback (3 in 4) or on a
# disk that lies to fdatasync (1 in 4), one in three cut again during its recovery, then rerun to the end and checked
# (byte-exact, the destination only ever the complete file, nothing the cut left durable fetched again).
#
#   bench/powercut.sh                  # 200 trials (about 5 minutes here)
#   TRIALS=1000 SEED=7 bench/powercut.sh
#
# Prints the trials, cuts, failures and the bytes refetched against the non-durable extent; exits 1 on a failure.
# Runs the debug build's stitch: the reboot's new boot id (STITCH_TEST_BOOT_ID) is read by debug builds only.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v swift >/dev/null || export PATH="$PATH:/opt/swift/usr/bin"
[[ -c /dev/fuse ]] || { echo "bench/powercut.sh: no /dev/fuse here; the power-cut file system needs FUSE" >&2; exit 1; }
swift build --build-tests >/dev/null
log=$(mktemp)
status=0
STITCH_POWERCUT_SOAK="${TRIALS:-200}" STITCH_TEST_SEED="${SEED:-1}" \
    swift test --skip-build --filter 'PowerCutTests/soak' >"$log" 2>&1 || status=$?
grep -E '^PowerCutTests' "$log" || true
if ((status != 0)); then
    grep -E 'recorded an issue|↳' "$log" | head -40 >&2
    echo "bench/powercut.sh: failures (full log: $log)" >&2
    exit 1
fi
rm -f "$log"
