#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in printf formats are markdown
# Loopback download benchmark: stitch vs curl, wget, aria2c, axel.
# Not part of the test suite. See bench/README.md.
#
#   bench/run.sh                      # 1 GiB file, 3 runs per tool
#   SIZE_MIB=64 REPEAT=5 bench/run.sh
#   STITCH=/path/to/stitch TOOLS="stitch curl" bench/run.sh
#
# Environment:
#   SIZE_MIB=1024     size of the downloaded file in MiB
#   REPEAT=3          runs per tool (best wall time, median CPU, max RSS reported)
#   STITCH=...        stitch binary (default .build/release/stitch, built with
#                     `swift build -c release` if missing; if STITCH is set
#                     explicitly and not executable, stitch is skipped)
#   TOOLS="stitch stitch-c1 curl wget aria2c axel"   tools to run, in this order
#                     (stitch = its default connection count; stitch-c1 = --connections 1)
#   BENCH_TMPDIR=...  where the work dir (source file + outputs) is created
#                     (default ${TMPDIR:-/tmp}); needs about 2 x SIZE_MIB free
#   RUN_TIMEOUT=600   seconds before a single download is killed
#   KEEP=1            keep the work dir (and nginx logs) after the run
#
# The markdown report goes to stdout, progress to stderr:
#   bench/run.sh | tee bench-result.md
set -euo pipefail
export LC_ALL=C # decimal point in $EPOCHREALTIME and awk output

prog=bench/run.sh
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
bench_args "$@"
bench_invocation SIZE_MIB REPEAT STITCH TOOLS BENCH_TMPDIR RUN_TIMEOUT KEEP
cd "$repo"

SIZE_MIB=${SIZE_MIB:-1024}
REPEAT=${REPEAT:-3}
TOOLS=${TOOLS:-stitch stitch-c1 curl wget aria2c axel}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
KEEP=${KEEP:-0}
need_posint SIZE_MIB REPEAT RUN_TIMEOUT
need_commands timeout awk

# ---------------------------------------------------------------- tools
declare -A skip_reason=()
stitch_init

selected=()
for t in $TOOLS; do
    case $t in
    stitch)
        resolve_stitch
        [[ -z $stitch_skip ]] || skip_reason[stitch]=$stitch_skip
        ;;
    stitch-c1) [[ -n ${skip_reason[stitch]:-} ]] && skip_reason[$t]=${skip_reason[stitch]} ;;
    curl | wget | aria2c | axel)
        r=$(missing_reason "$t")
        [[ -z $r ]] || skip_reason[$t]=$r
        ;;
    *) die "unknown tool in TOOLS: $t (known: stitch stitch-c1 curl wget aria2c axel)" ;;
    esac
    selected+=("$t")
done
((${#selected[@]} > 0)) || die "TOOLS is empty"

# Writes the command for tool $1 downloading $2 to $3, one argument per line.
tool_cmd() {
    local tool=$1 url=$2 out=$3
    case $tool in
    stitch) printf '%s\n' "$STITCH" get "$url" -o "$out" --quiet ;;
    stitch-c1) printf '%s\n' "$STITCH" get "$url" -o "$out" --quiet --connections 1 ;;
    curl) printf '%s\n' curl -q -s -o "$out" "$url" ;;
    wget) printf '%s\n' wget --no-config -q -O "$out" "$url" ;;
    aria2c) aria2c_cmd "$out" "$url" -x1 -s1 ;;
    axel) printf '%s\n' axel -n 1 -q -o "$out" "$url" ;;
    esac
}

# ---------------------------------------------------------------- setup
bench_workdir stitch-bench
size_bytes=$((SIZE_MIB * 1024 * 1024))
need_space "$SIZE_MIB" "set BENCH_TMPDIR or SIZE_MIB"
# shellcheck disable=SC2119 # no extra nginx settings
start_nginx
SRC=$NGINX_WWW/big.bin
note "creating ${SIZE_MIB} MiB random file"
head -c "$size_bytes" /dev/urandom >"$SRC"
src_sha=$(sha256sum "$SRC" | awk '{ print $1 }') # also pulls it into the page cache
sync
URL=http://127.0.0.1:$NGINX_HTTP_PORT/big.bin
mkdir -p "$OUTDIR"

# ---------------------------------------------------------------- runs
# Per-run results: "tool run wall user sys rss_kib status"
RESULTS=$WORK/results.txt
: >"$RESULTS"
declare -A failed=()

run_one() {
    local tool=$1 r=$2 out=$OUTDIR/$1.out log=$WORK/$1.$2.log status
    local -a cmd
    mapfile -t cmd < <(tool_cmd "$tool" "$URL" "$out")
    clean_out
    sync
    timed_run "$log" "${cmd[@]}"
    status=$(output_status "$run_rc" "$out" "$size_bytes" "$SRC")
    if [[ $status != ok ]]; then
        failed[$tool]=1
        note "$tool run $r FAILED ($status); log: $(tail -n 3 "$log" | tr '\n' ' ')"
    else
        note "$tool run $r: ${run_wall}s wall, user ${run_user}s sys ${run_sys}s, rss ${run_rss} KiB"
    fi
    printf '%s %s %s %s %s %s %s\n' "$tool" "$r" "$run_wall" "$run_user" "$run_sys" "$run_rss" "$status" >>"$RESULTS"
    clean_out
}

note "warm-up: copying the source once to the output dir"
warm_up "$SRC"

# Round-robin over tools so drift (thermal, background load) hits all of them alike.
for ((r = 1; r <= REPEAT; r++)); do
    for t in "${selected[@]}"; do
        [[ -z ${skip_reason[$t]:-} ]] || continue
        run_one "$t" "$r"
    done
done

# ---------------------------------------------------------------- report
# summary: tool best_wall median_cpu max_rss_kib ok_runs
summarize() {
    awk -v tool="$1" "$AWK_MEDIAN"'
        $1 == tool && $7 == "ok" { n++; w[n] = $3; c[n] = $4 + $5; if ($6 > rss) rss = $6 }
        END {
            if (n == 0) { print "none"; exit }
            best = w[1]; for (i = 2; i <= n; i++) if (w[i] < best) best = w[i]
            printf "%s %s %s %d\n", best, median(c, n), rss, n
        }' "$RESULTS"
}

declare -A mbps=() cpug=() rssm=()
gib=$(awk -v b="$size_bytes" 'BEGIN { printf "%.6f", b / 1073741824 }')
for t in "${selected[@]}"; do
    [[ -z ${skip_reason[$t]:-} ]] || continue
    s=$(summarize "$t")
    [[ $s != none ]] || continue
    read -r best med rss _ <<<"$s"
    mbps[$t]=$(awk -v b="$size_bytes" -v w="$best" 'BEGIN { printf "%.1f", (w > 0) ? b / 1e6 / w : 0 }')
    cpug[$t]=$(awk -v c="$med" -v g="$gib" 'BEGIN { printf "%.3f", c / g }')
    rssm[$t]=$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')
done

{
    report_head "Stitch download benchmark"
    printf -- '- File: %s MiB (%s bytes) random, sha256 %s\n' "$SIZE_MIB" "$size_bytes" "$src_sha"
    printf -- '- Server: loopback nginx (scripts/nginx.sh, 1 worker, sendfile), plain HTTP/1.1 %s\n' "$URL"
    printf -- '- Runs per tool: %s (round-robin); wall = best run, CPU = median user+sys, RSS = max peak RSS\n' "$REPEAT"
    printf -- '- Outputs written to %s (same filesystem as the source), deleted + `sync` before every run; one untimed warm-up copy first\n' "$OUTDIR"
    printf '\n## Commands\n\n'
    for t in "${selected[@]}"; do
        if [[ -n ${skip_reason[$t]:-} ]]; then
            printf -- '- %s: skipped: %s\n' "$t" "${skip_reason[$t]}"
        else
            mapfile -t cmd < <(tool_cmd "$t" "$URL" "$OUTDIR/$t.out")
            cmd_line "$t" "$t" "${cmd[@]}"
        fi
    done
    printf '\n## Results\n\n'
    printf '| tool | MB/s | CPU-s per GiB | peak RSS MiB | throughput vs curl | CPU vs curl | RSS vs curl |\n'
    printf '|---|---:|---:|---:|---:|---:|---:|\n'
    for t in "${selected[@]}"; do
        if [[ -n ${skip_reason[$t]:-} ]]; then
            printf '| %s | skipped | | | | | |\n' "$t"
        elif [[ -z ${mbps[$t]:-} ]]; then
            printf '| %s | FAILED | | | | | |\n' "$t"
        else
            if [[ -n ${mbps[curl]:-} ]]; then
                tr_=$(ratio "${mbps[$t]}" "${mbps[curl]}")
                cr_=$(ratio "${cpug[$t]}" "${cpug[curl]}")
                rr_=$(ratio "${rssm[$t]}" "${rssm[curl]}")
            else
                tr_=n/a cr_=n/a rr_=n/a
            fi
            suffix=""
            [[ -z ${failed[$t]:-} ]] || suffix=" (some runs failed)"
            printf '| %s%s | %s | %s | %s | %s | %s | %s |\n' "$t" "$suffix" "${mbps[$t]}" "${cpug[$t]}" "${rssm[$t]}" "$tr_" "$cr_" "$rr_"
        fi
    done
    printf '\nMB/s = 10^6 bytes per second of the best wall time. Ratios are tool / curl: throughput > 1 is faster than curl, CPU and RSS < 1 use less than curl.\n'
    for t in "${selected[@]}"; do
        [[ -z ${skip_reason[$t]:-} ]] || printf '\nNote: %s skipped: %s\n' "$t" "${skip_reason[$t]}"
    done
    printf '\n## Raw runs\n\n'
    printf '| tool | run | wall s | user s | sys s | peak RSS KiB | status |\n'
    printf '|---|---:|---:|---:|---:|---:|---|\n'
    awk '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }' "$RESULTS"
}

bench_finish
