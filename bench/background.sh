#!/usr/bin/env bash
# The download-task driver (`BackgroundDownloads`, issue 15) against stitch's two transports, one download each from
# a loopback nginx: SIZE_MIB (1024) of random bytes as fast as each goes.
#
#   - stitch over libcurl (`stitch get -c 1`), the reference;
#   - stitch over URLSession data tasks (`--transport urlsession`);
#   - the driver over FoundationNetworking's download tasks (`stitch-background-bench`, ranges of RANGE_MIB (64)):
#     each range goes to the session's temporary file, is judged, then copied into DEST.part and synced, so every
#     byte is written twice.
#
# Per tool: wall time, CPU (user + system) per GiB, peak RSS (GNU time), requests and MiB sent (nginx's log). Every
# run: previous output removed, `sync`; tools alternate within each round. Medians, spread (min–max) in brackets;
# ratios against stitch over libcurl (speed above 1: faster; CPU and RSS above 1: costlier).
#
#   ROUNDS=5 bash bench/background.sh
#
# Needs: nginx-light, GNU time, a release build (`swift build -c release --product stitch --product
# stitch-background-bench`; STITCH= and BACKGROUND= override the paths).
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh
ROUNDS=${ROUNDS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
RANGE_MIB=${RANGE_MIB:-64}
STITCH=${STITCH:-$root/.build/release/stitch}
BACKGROUND=${BACKGROUND:-$root/.build/release/stitch-background-bench}
BENCH_TMPDIR=${BENCH_TMPDIR:-/tmp}
[[ -x $STITCH ]] || { echo "background.sh: no $STITCH (swift build -c release --product stitch)" >&2; exit 1; }
[[ -x $BACKGROUND ]] || { echo "background.sh: no $BACKGROUND (swift build -c release --product stitch-background-bench)" >&2; exit 1; }
bench_loopback_file background file.bin "$SIZE_MIB"
access_log=$nginx_dir/logs/access.log
out=$work/out/file.bin
url="http://127.0.0.1:$NGINX_HTTP_PORT/file.bin"
# FoundationNetworking leaves its temporary files in TMPDIR; each run gets its own, removed after.
session_tmp=$work/session-tmp

tools=(libcurl urlsession download-tasks)
declare -A walls cpus rss requests sent

run() {
    local tool=$1 round=$2 times
    rm -rf "${work:?}/out/"* "$work/state" "$session_tmp"
    mkdir -p "$session_tmp"
    sync
    local lines_before
    lines_before=$(wc -l <"$access_log")
    case $tool in
    libcurl | urlsession)
        times=$(/usr/bin/time -f "%e %U %S %M" "$STITCH" get -q -c 1 --transport "$tool" "$url" -o "$out" 2>&1 >/dev/null)
        ;;
    download-tasks)
        times=$(TMPDIR=$session_tmp/ /usr/bin/time -f "%e %U %S %M" "$BACKGROUND" "$url" "$out" "$work/state" "$RANGE_MIB" 2>&1 >/dev/null)
        ;;
    esac
    times=$(tail -1 <<<"$times")
    [[ $(stat -c %s "$out") -eq $((SIZE_MIB << 20)) ]] || { echo "background.sh: $tool wrote $(stat -c %s "$out") bytes" >&2; exit 1; }
    if [[ $round -eq 1 ]]; then
        [[ $(sha256sum "$out" | cut -d' ' -f1) == "$src_sha" ]] || { echo "background.sh: $tool: wrong bytes" >&2; exit 1; }
    fi
    sleep 0.2
    local counted
    counted=$(tail -n +$((lines_before + 1)) "$access_log" | grep " /file.bin " |
        awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^HTTP\/1\.[01]"$/) { n++; b += $(i + 2) } } END { printf "%d %.0f", n, b }')
    local wall user sys maxrss
    read -r wall user sys maxrss <<<"$times"
    walls[$tool]+="$wall "
    cpus[$tool]+="$(awk -v u="$user" -v s="$sys" -v m="$SIZE_MIB" 'BEGIN { printf "%.3f", (u + s) * 1024 / m }') "
    rss[$tool]+="$(awk -v k="$maxrss" 'BEGIN { printf "%.1f", k / 1024 }') "
    requests[$tool]+="${counted% *} "
    sent[$tool]+="$(awk -v b="${counted#* }" 'BEGIN { printf "%.1f", b / 1048576 }') "
    echo "background.sh: round $round $tool: $wall s, $user s user, $sys s sys, $maxrss KiB, requests/bytes $counted" >&2
}

rounds_run "$ROUNDS" "${tools[@]}"

read -r base_w _ _ <<<"$(rounds_stats "${walls[libcurl]}")"
read -r base_c _ _ <<<"$(rounds_stats "${cpus[libcurl]}")"
read -r base_r _ _ <<<"$(rounds_stats "${rss[libcurl]}")"
echo "### Download tasks: $SIZE_MIB MiB from loopback nginx, $ROUNDS alternating rounds ($(date -u +%F))"
echo
echo "| tool | wall s | MB/s | CPU s per GiB | peak RSS MiB | requests | MiB sent | speed vs libcurl | CPU vs libcurl | RSS vs libcurl |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for tool in "${tools[@]}"; do
    read -r w wmin wmax <<<"$(rounds_stats "${walls[$tool]}")"
    read -r c cmin cmax <<<"$(rounds_stats "${cpus[$tool]}")"
    read -r r rmin rmax <<<"$(rounds_stats "${rss[$tool]}")"
    read -r q qmin qmax <<<"$(rounds_stats "${requests[$tool]}")"
    read -r s smin smax <<<"$(rounds_stats "${sent[$tool]}")"
    case $tool in
    download-tasks) name="BackgroundDownloads (download tasks, $RANGE_MIB MiB ranges)" ;;
    *) name="stitch over $tool" ;;
    esac
    awk -v t="$name" -v w="$w" -v wmin="$wmin" -v wmax="$wmax" -v c="$c" -v cmin="$cmin" -v cmax="$cmax" \
        -v r="$r" -v rmin="$rmin" -v rmax="$rmax" -v q="$q" -v qmin="$qmin" -v qmax="$qmax" -v s="$s" \
        -v smin="$smin" -v smax="$smax" -v bw="$base_w" -v bc="$base_c" -v br="$base_r" -v mib="$SIZE_MIB" 'BEGIN {
        printf "| %s | %.2f (%.2f–%.2f) | %.0f | %.2f (%.2f–%.2f) | %.0f (%.0f–%.0f) | %g (%g–%g) | %.0f (%.0f–%.0f) | %.2f× | %.2f× | %.2f× |\n",
            t, w, wmin, wmax, mib * 1048576 / w / 1e6, c, cmin, cmax, r, rmin, rmax, q, qmin, qmax, s, smin, smax,
            bw / w, c / bc, r / br }'
done
