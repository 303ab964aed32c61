#!/usr/bin/env bash
#
# Many-small-files benchmark: `stitch get -i LIST -j N` next to `wget -i`,
# `curl -Z --parallel-max N` and `aria2c -i -j N`, fetching FILES files of
# SIZE_KIB KiB from a loopback nginx into an empty folder on the work
# directory's file system, REPEAT runs each, round-robin.
#
#   bench/batch.sh                        # 2000 x 100 KiB, -j 16, 3 runs
#   FILES=500 REPEAT=5 bench/batch.sh
#
# Each run gets a new, empty output folder; every file is checked against the
# source (sha256sum -c) after the run. stitch syncs each file and its folder
# before calling it done (its crash-safety promise); the others do not sync.
#
# Environment (all optional):
#   FILES=2000 SIZE_KIB=100 JOBS=16 REPEAT=3
#   TOOLS="stitch wget curl aria2c"
#   RUN_TIMEOUT=300    seconds before a run is killed
#   STITCH=...         stitch binary (default .build/release/stitch, built if missing)
#   BENCH_TMPDIR=...   where the work directory goes (default $TMPDIR or /tmp)
#   KEEP=1             keep the work directory
set -euo pipefail
export LC_ALL=C
prog=batch.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
bench_invocation FILES SIZE_KIB JOBS REPEAT TOOLS RUN_TIMEOUT STITCH BENCH_TMPDIR
FILES=${FILES:-2000}
SIZE_KIB=${SIZE_KIB:-100}
JOBS=${JOBS:-16}
REPEAT=${REPEAT:-3}
TOOLS=${TOOLS:-stitch wget curl aria2c}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
KEEP=${KEEP:-0}
need_posint FILES SIZE_KIB JOBS REPEAT RUN_TIMEOUT
need_commands timeout sha256sum split
stitch_init
failed=()

bench_workdir stitch-batchbench
need_space $((FILES * SIZE_KIB / 1024 + 1)) "FILES x SIZE_KIB"
start_nginx
src=$NGINX_WWW/batch
mkdir -p "$src"
note "creating $FILES files of $SIZE_KIB KiB"
head -c $((FILES * SIZE_KIB * 1024)) /dev/urandom | (cd "$src" && split -a 5 -d -b $((SIZE_KIB * 1024)) - f)
(cd "$src" && for f in f*; do mv "$f" "$f.bin"; done && sha256sum -- f*.bin >"$WORK/SHA256SUMS")
list=$WORK/list.txt
curlcfg=$WORK/curl.cfg
: >"$list"
: >"$curlcfg"
for f in "$src"/f*.bin; do
    url="http://127.0.0.1:$NGINX_HTTP_PORT/batch/${f##*/}"
    printf '%s\n' "$url" >>"$list"
    printf 'url = "%s"\n' "$url" >>"$curlcfg"
done

runnable=()
declare -A skip=()
for tool in $TOOLS; do
    case $tool in
    stitch)
        resolve_stitch
        if [[ -n $stitch_skip ]]; then skip[$tool]=$stitch_skip; else runnable+=("$tool"); fi
        ;;
    wget | curl | aria2c)
        reason=$(missing_reason "$tool")
        if [[ -n $reason ]]; then skip[$tool]=$reason; else runnable+=("$tool"); fi
        ;;
    *) die "unknown tool in TOOLS: $tool (known: stitch wget curl aria2c)" ;;
    esac
done
((${#runnable[@]})) || die "nothing to run"

# command TOOL OUT: the command line, one argument per line.
command_for() {
    local out=$2
    case $1 in
    stitch) printf '%s\n' "$STITCH" get -i "$list" -j "$JOBS" -d "$out" --quiet ;;
    wget) printf '%s\n' wget --no-config -q -i "$list" -P "$out" ;;
    curl) printf '%s\n' curl -q -s -S -Z --parallel-max "$JOBS" --output-dir "$out" --remote-name-all -K "$curlcfg" ;;
    aria2c)
        printf '%s\n' aria2c --no-conf -q -i "$list" -j "$JOBS" -d "$out" --file-allocation=none \
            --auto-file-renaming=false --allow-overwrite=true --summary-interval=0 --console-log-level=error
        ;;
    esac
}

declare -A wall=() cpu=() rss=() status=()
mkdir -p "$OUTDIR"
for ((run = 1; run <= REPEAT; run++)); do
    for tool in "${runnable[@]}"; do
        out=$OUTDIR/$tool.$run
        mkdir -p "$out"
        sync
        mapfile -t cmd < <(command_for "$tool" "$out")
        timed_run "$WORK/$tool.$run.log" "${cmd[@]}"
        if ((run_rc == 124)); then
            st=timeout
        elif ((run_rc != 0)); then
            st="exit=$run_rc"
        elif ! (cd "$out" && sha256sum --quiet -c "$WORK/SHA256SUMS" >/dev/null 2>&1); then
            st="content-mismatch ($(find "$out" -maxdepth 1 -name 'f*.bin' | wc -l) files)"
        else
            st=ok
        fi
        [[ $st == ok ]] || failed[$tool.$run]=$st
        wall[$tool]+="$run_wall "
        cpu[$tool]+="$(awk -v u="$run_user" -v s="$run_sys" 'BEGIN { printf "%.2f", u + s }') "
        rss[$tool]=$(((${rss[$tool]:-0} > run_rss) ? ${rss[$tool]:-0} : run_rss))
        status[$tool]+="$st "
        note "run $run $tool: ${run_wall}s ($st)"
        rm -rf "$out"
    done
done

median_of() { tr ' ' '\n' <<<"$1" | awk 'NF' | awk "$AWK_MEDIAN"'{ a[NR] = $1 } END { printf "%.3f", median(a, NR) }'; }
best_of() { tr ' ' '\n' <<<"$1" | awk 'NF' | sort -g | head -n 1; }

report_head "Many small files: $FILES x $SIZE_KIB KiB from loopback nginx"
printf -- '- Runs per client: %s (round-robin); wall = median, CPU = median user+sys, RSS = max\n' "$REPEAT"
printf -- '- Output: an empty folder on %s (%s)\n\n' "$(df -P "$WORK" | awk 'NR == 2 { print $6 }')" \
    "$(stat -f -c %T "$WORK")"
for tool in "${runnable[@]}"; do
    mapfile -t cmd < <(command_for "$tool" OUT)
    cmd_line "$tool" "$tool" "${cmd[@]}"
done
for tool in "${!skip[@]}"; do printf -- '- %s skipped: %s\n' "$tool" "${skip[$tool]}"; done
printf '\n| client | wall s (median) | best s | vs wget (median) | CPU s | peak RSS MiB | runs |\n'
printf '|---|---:|---:|---:|---:|---:|---|\n'
base=""
[[ -n ${wall[wget]:-} ]] && base=$(median_of "${wall[wget]}")
for tool in "${runnable[@]}"; do
    m=$(median_of "${wall[$tool]}")
    printf '| %s | %s | %s | %s | %s | %.1f | %s|\n' "$tool" "$m" "$(best_of "${wall[$tool]}")" \
        "$([[ -n $base ]] && ratio "$m" "$base" || echo n/a)" "$(median_of "${cpu[$tool]}")" \
        "$(awk -v k="${rss[$tool]}" 'BEGIN { print k / 1024 }')" "${status[$tool]}"
done
if [[ -n $base && -n ${wall[stitch]:-} ]]; then
    m=$(median_of "${wall[stitch]}")
    r=$(ratio "$m" "$base")
    verdict=$(awk -v r="$r" 'BEGIN { print (r <= 0.9) ? "PASS" : "FAIL" }')
    printf '\nTarget: stitch wall <= 0.9 x wget: %s s vs %s s = %s -> **%s**\n' "$m" "$base" "$r" "$verdict"
fi
bench_finish
