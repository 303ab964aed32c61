#!/usr/bin/env bash
# Large files: one connection, plain HTTP, a file bigger than the page cache lets sit dirty (5 GiB here, where
# vm.dirty_ratio is 20 % of 24 GiB), stitch against curl, with dd writing the same size from /dev/zero as a
# reference (not a strict ceiling: dd leaves everything dirty and syncs once at the end).
#
# Every run starts from the same state: the previous output removed, `sync`, the page cache dropped, then the
# source file read once so nginx serves it from memory for every tool alike, and the tool's program started once
# untimed (`--version`): the cache drop also evicts the programs' own code, and reading stitch's (with the Swift
# runtime and Foundation as shared libraries in a plain build) back from the disk took about 100 ms here against
# curl's 35 -- a cost of the first start after boot, not of the download; it is measured and printed on its own.
# Tools alternate within each round. Reports per tool the median wall time and CPU (user + system) with their
# spread (min–max), and ratios against curl (speed: above 1 is faster than curl; CPU: below 1 is cheaper).
#
# The machine's limits run in the same rounds: curl-null (curl to /dev/null: the network and the receiving alone)
# and dd (the same size from /dev/zero with one fdatasync at the end: the disk through the page cache). The
# closing lines set stitch against them and against curl + sync (issue 35's goals).
#
#   ROUNDS=5 SIZE_MIB=5120 bench/large.sh
#   STITCH_B=/path/to/other/stitch bench/large.sh     # also an A/B: a second stitch binary in the same rounds
#   RATE=100m SIZE_MIB=1024 bench/large.sh            # a link slower than the disk (nginx limit_rate per
#                                                     # connection): stitch against plain curl by the user's clock
#
# Needs: root (to drop the page cache), curl, nginx-light, GNU time, a release build (`swift build -c release`;
# STITCH=path overrides) and 2 × SIZE_MIB free in BENCH_TMPDIR (default /tmp).
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh
ROUNDS=${ROUNDS:-5}
SIZE_MIB=${SIZE_MIB:-5120}
STITCH=${STITCH:-$root/.build/release/stitch}
STITCH_B=${STITCH_B:-}
RATE=${RATE:-}
BENCH_TMPDIR=${BENCH_TMPDIR:-/tmp}
[[ $(id -u) -eq 0 ]] || { echo "large.sh: needs root (drop_caches)" >&2; exit 1; }
[[ -x $STITCH ]] || { echo "large.sh: no $STITCH (swift build -c release)" >&2; exit 1; }
[[ -z $STITCH_B || -x $STITCH_B ]] || { echo "large.sh: STITCH_B=$STITCH_B is not an executable" >&2; exit 1; }
# On tmpfs there is no disk: syncs, the advice and drop_caches do nothing, and the figures would be RAM's.
fstype=$(stat -f -c %T "$BENCH_TMPDIR")
[[ $fstype != tmpfs && $fstype != ramfs ]] || { echo "large.sh: $BENCH_TMPDIR is $fstype; set BENCH_TMPDIR to a disk" >&2; exit 1; }
[[ -n $RATE ]] && export NGINX_THROTTLE_RATE=$RATE
bench_loopback_file large large.bin "$SIZE_MIB"
url="http://127.0.0.1:$NGINX_HTTP_PORT/large.bin"
[[ -n $RATE ]] && url="http://127.0.0.1:$NGINX_THROTTLE_PORT/large.bin"
out=$work/out/large.bin

tools=(curl stitch)
[[ -n $STITCH_B ]] && tools+=(stitch-b)
[[ -z $RATE ]] && tools+=(curl-null dd)
declare -A walls cpus durable_walls machine_cpus rss cold

# The program a tool runs, started untimed after the cache drop.
program() {
    case $1 in
    curl | curl-null) echo curl ;;
    stitch) echo "$STITCH" ;;
    stitch-b) echo "$STITCH_B" ;;
    dd) echo dd ;;
    esac
}

run() { # run TOOL ROUND
    local tool=$1 round=$2 times
    rm -rf "${work:?}/out/"*
    sync
    echo 3 >/proc/sys/vm/drop_caches
    cat "$src" >/dev/null
    local busy_before started synced before_start
    before_start=$(date +%s.%N)
    "$(program "$tool")" --version >/dev/null
    cold[$tool]+="$(awk -v a="$before_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }') "
    busy_before=$(machine_busy)
    local format="%e %U %S %M"
    case $tool in
    curl) times=$(/usr/bin/time -f "$format" curl -s -o "$out" "$url" 2>&1 >/dev/null) ;;
    curl-null) times=$(/usr/bin/time -f "$format" curl -s -o /dev/null "$url" 2>&1 >/dev/null) ;;
    stitch) times=$(/usr/bin/time -f "$format" "$STITCH" get -q -c 1 "$url" -o "$out" 2>&1 >/dev/null) ;;
    stitch-b) times=$(/usr/bin/time -f "$format" "$STITCH_B" get -q -c 1 "$url" -o "$out" 2>&1 >/dev/null) ;;
    dd) times=$(/usr/bin/time -f "$format" dd if=/dev/zero of="$out" bs=1M count="$SIZE_MIB" conv=fdatasync \
        status=none 2>&1 >/dev/null) ;;
    esac
    times=$(tail -1 <<<"$times")
    # Until the bytes are on disk (as https.sh): curl leaves them dirty for the kernel's flusher threads, on CPU
    # that `time` does not count; stitch makes them durable as it goes, on its own system time. A `sync` after the
    # run and the machine's busy CPU over both count the same work for every tool.
    started=$(date +%s.%N)
    sync
    synced=$(date +%s.%N)
    machine_cpus[$tool]+="$(awk -v a="$busy_before" -v b="$(machine_busy)" 'BEGIN { printf "%.2f", b - a }') "
    local size
    [[ $tool == curl-null ]] || size=$(stat -c %s "$out")
    [[ $tool == curl-null || $size -eq $((SIZE_MIB << 20)) ]] || { echo "large.sh: $tool wrote $size bytes" >&2; exit 1; }
    if [[ $round -eq 1 && $tool != dd && $tool != curl-null ]]; then
        [[ $(sha256sum "$out" | cut -d' ' -f1) == "$src_sha" ]] || { echo "large.sh: $tool: wrong bytes" >&2; exit 1; }
    fi
    read -r wall user sys maxrss <<<"$times"
    walls[$tool]+="$wall "
    rss[$tool]+="$((maxrss / 1024)) "
    durable_walls[$tool]+="$(awk -v w="$wall" -v a="$started" -v b="$synced" 'BEGIN { printf "%.2f", w + b - a }') "
    cpus[$tool]+="$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }') "
    echo "large.sh: round $round $tool: ${wall} s wall, $user s user, $sys s sys" >&2
}

rounds_run "$ROUNDS" "${tools[@]}"

echo "### Large file: ${SIZE_MIB} MiB, one connection, plain HTTP${RATE:+ at $RATE/s (nginx limit_rate)}, $ROUNDS alternating rounds ($(date -u +%F))"
echo
rounds_table "$SIZE_MIB" "${tools[@]}"
echo
[[ -z $RATE ]] && echo "Limits from the same rounds: curl-null is curl writing to /dev/null (the network and the receiving alone), dd writes the same size from /dev/zero with one fdatasync at the end ($fstype at $BENCH_TMPDIR)."
echo
echo "Peak RSS MiB (max over the rounds): $(for tool in "${tools[@]}"; do printf '%s %s; ' "$tool" "$(rounds_stats "${rss[$tool]}" | awk '{ print $3 }')"; done)"
echo "Start of each program after the cache drop (untimed above; median s): $(for tool in "${tools[@]}"; do printf '%s %s; ' "$tool" "$(rounds_stats "${cold[$tool]}" | awk '{ print $1 }')"; done)"
echo
if [[ -n $RATE ]]; then
    read -r sw _ _ <<<"$(rounds_stats "${walls[stitch]}")"
    read -r cw _ _ <<<"$(rounds_stats "${walls[curl]}")"
    awk -v s="$sw" -v c="$cw" 'BEGIN { printf "By the user'"'"'s clock stitch (file durable) is %.3f× plain curl'"'"'s speed (file dirty in the page cache); goal >= 0.98\n", c / s }'
    exit 0
fi
echo "Until the file is on disk (each run followed by \`sync\`): wall time to the end of the sync, and the machine's busy CPU"
echo "over that time (all processes and kernel threads: the writeback curl leaves to the kernel counted as stitch's is):"
echo
for tool in "${tools[@]}"; do walls[$tool]=${durable_walls[$tool]}; cpus[$tool]=${machine_cpus[$tool]}; done
rounds_table "$SIZE_MIB" "${tools[@]}" | sed 's/| CPU s, median/| machine CPU s, median/; s/| CPU vs curl |/| machine CPU vs curl |/'
echo
read -r stitch_durable _ _ <<<"$(rounds_stats "${durable_walls[stitch]}")"
read -r curl_durable _ _ <<<"$(rounds_stats "${durable_walls[curl]}")"
read -r dd_wall _ _ <<<"$(rounds_stats "${durable_walls[dd]}")"
read -r null_wall _ _ <<<"$(rounds_stats "${durable_walls[curl-null]}")"
read -r stitch_cpu _ _ <<<"$(rounds_stats "${machine_cpus[stitch]}")"
read -r curl_cpu _ _ <<<"$(rounds_stats "${machine_cpus[curl]}")"
awk -v s="$stitch_durable" -v c="$curl_durable" -v d="$dd_wall" -v n="$null_wall" -v sc="$stitch_cpu" -v cc="$curl_cpu" 'BEGIN {
    limit = (d > n) ? d : n
    printf "Against the machine (medians): stitch %.2f s until durable; the slower limit is %s at %.2f s: **%.2f×** it (goal <= 1.25).\n",
        s, (d > n) ? "dd" : "curl-null", limit, s / limit
    printf "Against curl + sync: **%.2f×** its speed (goal >= 1.3) at **%.2f×** its machine CPU (goal <= 1).\n", c / s, sc / cc }'
