#!/usr/bin/env bash
# HTTPS: one file over TLS from the loopback nginx on one connection, HTTP/2 as both ends negotiate it, stitch
# against curl, with curl writing to /dev/null as the ceiling (TLS and HTTP/2 alone, no file).
#
# Tools alternate within each round (the order reversed every other round); every run writes a fresh file that is
# checked against the source in the first round and by size after. Reports per tool the median wall time and CPU
# (user + system) with their spread (min–max), and ratios against curl (speed: above 1 is faster than curl; CPU:
# below 1 is cheaper).
#
#   ROUNDS=5 SIZE_MIB=1024 bench/https.sh
#   PROTOCOL=1.1 bench/https.sh    # HTTP/1.1 over TLS: nginx's TLS port without HTTP/2 (the one whose certificate
#                                  # names another host, so both tools skip verification: -k, a one-time cost)
#   STITCH_B=/path/to/other/stitch bench/https.sh     # also an A/B: a second stitch binary in the same rounds
#
# Needs: curl, nginx-light (http_ssl, http_v2), GNU time, a release build (`swift build -c release`; STITCH=path
# overrides) and 2 × SIZE_MIB free in BENCH_TMPDIR (default /tmp).
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh
ROUNDS=${ROUNDS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
STITCH=${STITCH:-$root/.build/release/stitch}
STITCH_B=${STITCH_B:-}
PROTOCOL=${PROTOCOL:-2}
[[ $PROTOCOL == 2 || $PROTOCOL == 1.1 ]] || { echo "https.sh: PROTOCOL must be 2 or 1.1" >&2; exit 1; }
BENCH_TMPDIR=${BENCH_TMPDIR:-/tmp}
[[ -x $STITCH ]] || { echo "https.sh: no $STITCH (swift build -c release)" >&2; exit 1; }
[[ -z $STITCH_B || -x $STITCH_B ]] || { echo "https.sh: STITCH_B=$STITCH_B is not an executable" >&2; exit 1; }
bench_loopback_file https https.bin "$SIZE_MIB"
out=$work/out/https.bin
if [[ $PROTOCOL == 2 ]]; then
    url="https://127.0.0.1:$NGINX_HTTPS_PORT/https.bin"
    curl_tls=(--cacert "$NGINX_CA_CERT")
    stitch_tls=(--ca-cert "$NGINX_CA_CERT")
else
    url="https://127.0.0.1:$NGINX_TLS_WRONG_HOST_PORT/https.bin"
    curl_tls=(-k)
    stitch_tls=(-k)
fi
protocol=$(curl -s "${curl_tls[@]}" -o /dev/null -w '%{http_version}' "$url")

tools=(curl stitch)
[[ -n $STITCH_B ]] && tools+=(stitch-b)
tools+=(curl-null)
declare -A walls cpus durable_walls machine_cpus

run() { # run TOOL ROUND
    local tool=$1 round=$2 times
    rm -rf "${work:?}/out/"*
    # Every run from the same state (as large.sh): nothing dirty left by the previous one, the page cache dropped
    # and the source read back in, so that no run pays for another's writeback or reclaim.
    sync
    [[ -w /proc/sys/vm/drop_caches ]] && echo 3 >/proc/sys/vm/drop_caches
    cat "$src" >/dev/null
    # The programs' own code, evicted by the drop, read back untimed (as large.sh).
    case $tool in
    curl | curl-null) curl --version >/dev/null ;;
    stitch) "$STITCH" --version >/dev/null ;;
    stitch-b) "$STITCH_B" --version >/dev/null ;;
    esac
    local busy_before started synced
    busy_before=$(machine_busy)
    case $tool in
    curl) times=$(/usr/bin/time -f "%e %U %S" curl -s "${curl_tls[@]}" -o "$out" "$url" 2>&1 >/dev/null) ;;
    curl-null) times=$(/usr/bin/time -f "%e %U %S" curl -s "${curl_tls[@]}" -o /dev/null "$url" 2>&1 >/dev/null) ;;
    stitch) times=$(/usr/bin/time -f "%e %U %S" "$STITCH" get -q -c 1 "${stitch_tls[@]}" "$url" -o "$out" 2>&1 >/dev/null) ;;
    stitch-b) times=$(/usr/bin/time -f "%e %U %S" "$STITCH_B" get -q -c 1 "${stitch_tls[@]}" "$url" -o "$out" 2>&1 >/dev/null) ;;
    esac
    times=$(tail -1 <<<"$times")
    # Until the bytes are on disk: curl leaves them dirty for the kernel to write after it exits (CPU no `time`
    # counts), stitch writes them back as it goes (counted as its own system time). The machine's busy CPU from
    # the start to the end of a `sync` after the run counts both the same way (nginx's share included, alike).
    started=$(date +%s.%N)
    sync
    synced=$(date +%s.%N)
    machine_cpus[$tool]+="$(awk -v a="$busy_before" -v b="$(machine_busy)" 'BEGIN { printf "%.2f", b - a }') "
    if [[ $tool != curl-null ]]; then
        local size
        size=$(stat -c %s "$out")
        [[ $size -eq $((SIZE_MIB << 20)) ]] || { echo "https.sh: $tool wrote $size bytes" >&2; exit 1; }
        if [[ $round -eq 1 ]]; then
            [[ $(sha256sum "$out" | cut -d' ' -f1) == "$src_sha" ]] || { echo "https.sh: $tool: wrong bytes" >&2; exit 1; }
        fi
    fi
    read -r wall user sys <<<"$times"
    walls[$tool]+="$wall "
    durable_walls[$tool]+="$(awk -v w="$wall" -v a="$started" -v b="$synced" 'BEGIN { printf "%.2f", w + b - a }') "
    cpus[$tool]+="$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }') "
    echo "https.sh: round $round $tool: ${wall} s wall, $user s user, $sys s sys" >&2
}

rounds_run "$ROUNDS" "${tools[@]}"

echo "### HTTPS: ${SIZE_MIB} MiB, one connection, HTTP/$protocol (curl's negotiation), $ROUNDS alternating rounds ($(date -u +%F))"
echo
rounds_table "$SIZE_MIB" "${tools[@]}"
echo
echo "curl-null is the ceiling: the same transfer written to /dev/null. Goal: stitch ≥ 1.1× curl's speed at ≤ curl's CPU."
echo
echo "Until the file is on disk (each run followed by \`sync\`): wall time to the end of the sync, and the machine's busy CPU"
echo "over that time (all processes and kernel threads: the writeback curl leaves to the kernel counted as stitch's is):"
echo
for tool in "${tools[@]}"; do walls[$tool]=${durable_walls[$tool]}; cpus[$tool]=${machine_cpus[$tool]}; done
rounds_table "$SIZE_MIB" "${tools[@]}" | sed 's/| CPU s, median/| machine CPU s, median/; s/| CPU vs curl |/| machine CPU vs curl |/'
