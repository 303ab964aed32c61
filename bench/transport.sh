#!/usr/bin/env bash
# stitch's two transports against each other (issue 15): libcurl (the default) and URLSession (FoundationNetworking's
# data tasks, `--transport urlsession`), with curl as the reference, one connection each, from a loopback nginx.
#
#   1. As fast as each goes: SIZE_MIB (1024) of random bytes; wall time, CPU (user + system) per GiB, peak RSS.
#   2. A deliberately slow sink: `--limit-rate SLOW_RATE` (32M) on SLOW_MIB (256); the sink refuses what comes
#      faster than that. libcurl pauses the transfer; a URLSession data task can be neither paused nor promptly
#      cancelled, so that backend asks in windows of 8 MiB (Range + If-Range, one connection) and holds at most a
#      window and a half for the sink (docs/urlsession.md). Reports peak RSS, CPU, and what the server sent: requests
#      and body bytes (from nginx's access log), against the file's size.
#
# Every run: previous output removed, `sync`; tools alternate within each round (rounds_run). Reports the median and
# the spread (min–max) of each figure; ratios are against stitch over libcurl (speed above 1: faster than it; CPU
# and RSS above 1: costlier).
#
#   ROUNDS=5 bash bench/transport.sh
#   SIZE_MIB=512 SLOW_MIB=128 SLOW_RATE=16M ROUNDS=3 bash bench/transport.sh
#
# Needs: curl, nginx-light, GNU time, a release build (`swift build -c release`; STITCH=path overrides).
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh
ROUNDS=${ROUNDS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
SLOW_MIB=${SLOW_MIB:-256}
SLOW_RATE=${SLOW_RATE:-32M}
STITCH=${STITCH:-$root/.build/release/stitch}
BENCH_TMPDIR=${BENCH_TMPDIR:-/tmp}
[[ -x $STITCH ]] || { echo "transport.sh: no $STITCH (swift build -c release)" >&2; exit 1; }
"$STITCH" get --help 2>&1 | grep -q -- '--transport' || { echo "transport.sh: $STITCH has no --transport" >&2; exit 1; }
bench_loopback_file transport fast.bin "$SIZE_MIB"
head -c $((SLOW_MIB << 20)) "$src" >"$NGINX_WWW/slow.bin"
fast_sha=$src_sha
slow_sha=$(sha256sum "$NGINX_WWW/slow.bin" | cut -d' ' -f1)
access_log=$nginx_dir/logs/access.log
out=$work/out/file.bin

tools=(curl libcurl urlsession)
declare -A walls cpus rss requests sent

# run_one PART TOOL ROUND: PART is fast or slow.
run_one() {
    local part=$1 tool=$2 round=$3 file size sha limit=() times
    if [[ $part == fast ]]; then file=fast.bin size=$SIZE_MIB sha=$fast_sha; else file=slow.bin size=$SLOW_MIB sha=$slow_sha; fi
    local url="http://127.0.0.1:$NGINX_HTTP_PORT/$file"
    rm -rf "${work:?}/out/"*
    sync
    local lines_before
    lines_before=$(wc -l <"$access_log")
    case $tool in
    curl)
        [[ $part == fast ]] || limit=(--limit-rate "$SLOW_RATE")
        times=$(/usr/bin/time -f "%e %U %S %M" curl -s "${limit[@]}" -o "$out" "$url" 2>&1 >/dev/null)
        ;;
    libcurl | urlsession)
        [[ $part == fast ]] || limit=(--limit-rate "$SLOW_RATE")
        times=$(/usr/bin/time -f "%e %U %S %M" "$STITCH" get -q -c 1 --transport "$tool" "${limit[@]}" "$url" \
            -o "$out" 2>&1 >/dev/null)
        ;;
    esac
    times=$(tail -1 <<<"$times")
    [[ $(stat -c %s "$out") -eq $((size << 20)) ]] || { echo "transport.sh: $tool wrote $(stat -c %s "$out") bytes" >&2; exit 1; }
    if [[ $round -eq 1 ]]; then
        [[ $(sha256sum "$out" | cut -d' ' -f1) == "$sha" ]] || { echo "transport.sh: $tool: wrong bytes" >&2; exit 1; }
    fi
    # nginx logs a request when it ends; the last one of a run may land a moment after the client exits.
    sleep 0.2
    local counted
    counted=$(tail -n +$((lines_before + 1)) "$access_log" | grep " /$file " |
        awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^HTTP\/1\.[01]"$/) { n++; b += $(i + 2) } } END { printf "%d %.0f", n, b }')
    local wall user sys maxrss key=$part/$tool
    read -r wall user sys maxrss <<<"$times"
    walls[$key]+="$wall "
    cpus[$key]+="$(awk -v u="$user" -v s="$sys" -v m="$size" 'BEGIN { printf "%.3f", (u + s) * 1024 / m }') "
    rss[$key]+="$(awk -v k="$maxrss" 'BEGIN { printf "%.1f", k / 1024 }') "
    requests[$key]+="${counted% *} "
    sent[$key]+="$(awk -v b="${counted#* }" 'BEGIN { printf "%.1f", b / 1048576 }') "
    echo "transport.sh: $part round $round $tool: $wall s, $user s user, $sys s sys, $maxrss KiB, requests/bytes $counted" >&2
}

run() { run_one "$part" "$1" "$2"; }

table() { # table PART MIB
    local part=$1 mib=$2 base_w base_c base_r tool
    read -r base_w _ _ <<<"$(rounds_stats "${walls[$part/libcurl]}")"
    read -r base_c _ _ <<<"$(rounds_stats "${cpus[$part/libcurl]}")"
    read -r base_r _ _ <<<"$(rounds_stats "${rss[$part/libcurl]}")"
    echo "| tool | wall s | MB/s | CPU s per GiB | peak RSS MiB | requests | MiB sent | speed vs libcurl | CPU vs libcurl | RSS vs libcurl |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for tool in "${tools[@]}"; do
        local k=$part/$tool w wmin wmax c cmin cmax r rmin rmax q qmin qmax s smin smax
        read -r w wmin wmax <<<"$(rounds_stats "${walls[$k]}")"
        read -r c cmin cmax <<<"$(rounds_stats "${cpus[$k]}")"
        read -r r rmin rmax <<<"$(rounds_stats "${rss[$k]}")"
        read -r q qmin qmax <<<"$(rounds_stats "${requests[$k]}")"
        read -r s smin smax <<<"$(rounds_stats "${sent[$k]}")"
        local name=$tool
        [[ $tool == curl ]] || name="stitch over $tool"
        awk -v t="$name" -v w="$w" -v wmin="$wmin" -v wmax="$wmax" -v c="$c" -v cmin="$cmin" -v cmax="$cmax" \
            -v r="$r" -v rmin="$rmin" -v rmax="$rmax" -v q="$q" -v qmin="$qmin" -v qmax="$qmax" -v s="$s" \
            -v smin="$smin" -v smax="$smax" -v bw="$base_w" -v bc="$base_c" -v br="$base_r" -v mib="$mib" 'BEGIN {
            printf "| %s | %.2f (%.2f–%.2f) | %.0f | %.2f (%.2f–%.2f) | %.0f (%.0f–%.0f) | %g (%g–%g) | %.0f (%.0f–%.0f) | %.2f× | %.2f× | %.2f× |\n",
                t, w, wmin, wmax, mib * 1048576 / w / 1e6, c, cmin, cmax, r, rmin, rmax, q, qmin, qmax, s, smin, smax,
                bw / w, c / bc, r / br }'
    done
}

part=fast
rounds_run "$ROUNDS" "${tools[@]}"
part=slow
rounds_run "$ROUNDS" "${tools[@]}"

echo "### Transports: one connection from loopback nginx, $ROUNDS alternating rounds ($(date -u +%F))"
echo
echo "$SIZE_MIB MiB as fast as each goes (medians, spread in brackets):"
echo
table fast "$SIZE_MIB"
echo
echo "$SLOW_MIB MiB through a slow sink (\`--limit-rate $SLOW_RATE\`):"
echo
table slow "$SLOW_MIB"
