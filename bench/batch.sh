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
# Two references run in the same rounds: curl-null (curl -Z writing every file
# to /dev/null: the ceiling of fetching alone) and curl+sync (curl -Z, then
# `sync`: the same files made durable afterwards, as stitch makes them durable
# as it goes). A third, floor (bench/tools/durable-floor.c, built with cc), has
# no network at all: JOBS threads each create NAME.part, write SIZE_KIB, fsync
# it, rename it into place and fsync the folder, FILES times: the least any
# client that keeps stitch's promise pays the file system. The goal compares stitch with curl: wall <= curl's, CPU (user +
# sys of the process) <= 1.25 x curl's.
#
# Environment (all optional):
#   FILES=2000 SIZE_KIB=100 JOBS=16 REPEAT=3
#   TOOLS="stitch wget curl aria2c"
#   RUN_TIMEOUT=300    seconds before a run is killed
#   STITCH=...         stitch binary (default .build/release/stitch, built if missing)
#   BENCH_TMPDIR=...   where the work directory goes (default $TMPDIR or /tmp)
#   STITCH_B=...       a second stitch binary, run as stitch-b in the same rounds (an A/B)
#   KEEP=1             keep the work directory
#
# Every run's output stays until the script ends (about FILES x SIZE_KIB x clients x REPEAT on the disk): on ext4
# without a journal (this project's VM) a file created within a minute of many deletions scans past each deleted
# inode first (ext4's recently_deleted check), and removing one run's 2,000 files before the next made every
# client's time swing 2-3x with what the run before it had deleted.
set -euo pipefail
export LC_ALL=C
prog=batch.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
bench_invocation FILES SIZE_KIB JOBS REPEAT TOOLS RUN_TIMEOUT STITCH STITCH_B BENCH_TMPDIR
FILES=${FILES:-2000}
SIZE_KIB=${SIZE_KIB:-100}
JOBS=${JOBS:-16}
REPEAT=${REPEAT:-3}
TOOLS=${TOOLS:-stitch curl curl-null curl+sync floor wget aria2c}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
KEEP=${KEEP:-0}
STITCH_B=${STITCH_B:-}
[[ -z $STITCH_B || -x $STITCH_B ]] || die "STITCH_B=$STITCH_B is not an executable"
[[ -n $STITCH_B ]] && TOOLS="$TOOLS stitch-b"
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
nullcfg=$WORK/curl-null.cfg
: >"$list"
: >"$curlcfg"
: >"$nullcfg"
for f in "$src"/f*.bin; do
    url="http://127.0.0.1:$NGINX_HTTP_PORT/batch/${f##*/}"
    printf '%s\n' "$url" >>"$list"
    printf 'url = "%s"\n' "$url" >>"$curlcfg"
    printf 'url = "%s"\noutput = "/dev/null"\n' "$url" >>"$nullcfg"
done

runnable=()
declare -A skip=()
for tool in $TOOLS; do
    case $tool in
    stitch)
        resolve_stitch
        if [[ -n $stitch_skip ]]; then skip[$tool]=$stitch_skip; else runnable+=("$tool"); fi
        ;;
    stitch-b) runnable+=("$tool") ;;
    curl-null | curl+sync)
        reason=$(missing_reason curl)
        if [[ -n $reason ]]; then skip[$tool]=$reason; else runnable+=("$tool"); fi
        ;;
    floor)
        reason=$(missing_reason cc)
        if [[ -z $reason ]]; then
            floor_bin=$WORK/durable-floor
            cc -O2 -pthread -o "$floor_bin" "$repo/bench/tools/durable-floor.c" || reason="cc could not build bench/tools/durable-floor.c"
        fi
        if [[ -n $reason ]]; then skip[$tool]=$reason; else runnable+=("$tool"); fi
        ;;
    wget | curl | aria2c)
        reason=$(missing_reason "$tool")
        if [[ -n $reason ]]; then skip[$tool]=$reason; else runnable+=("$tool"); fi
        ;;
    *) die "unknown tool in TOOLS: $tool (known: stitch curl curl-null curl+sync floor wget aria2c; stitch-b with STITCH_B)" ;;
    esac
done
((${#runnable[@]})) || die "nothing to run"

# command TOOL OUT: the command line, one argument per line.
command_for() {
    local out=$2
    case $1 in
    stitch) printf '%s\n' "$STITCH" get -i "$list" -j "$JOBS" -d "$out" --quiet ;;
    stitch-b) printf '%s\n' "$STITCH_B" get -i "$list" -j "$JOBS" -d "$out" --quiet ;;
    wget) printf '%s\n' wget --no-config -q -i "$list" -P "$out" ;;
    curl) printf '%s\n' curl -q -s -S -Z --parallel-max "$JOBS" --output-dir "$out" --remote-name-all -K "$curlcfg" ;;
    curl-null) printf '%s\n' curl -q -s -S -Z --parallel-max "$JOBS" -K "$nullcfg" ;;
    floor) printf '%s\n' "$floor_bin" "$out" "$FILES" $((SIZE_KIB * 1024)) "$JOBS" ;;
    curl+sync)
        printf '%s\n' sh -c 'curl -q -s -S -Z --parallel-max "$1" --output-dir "$2" --remote-name-all -K "$3" && sync' \
            sh "$JOBS" "$out" "$curlcfg"
        ;;
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
        elif [[ $tool == curl-null || $tool == floor ]]; then
            st=ok  # nothing fetched to check: /dev/null, or the floor's own bytes
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
    cmd_line "$tool" "${tool%%[-+]*}" "${cmd[@]}"
done
for tool in "${!skip[@]}"; do printf -- '- %s skipped: %s\n' "$tool" "${skip[$tool]}"; done
spread_of() { tr ' ' '\n' <<<"$1" | awk 'NF' | sort -g | awk '{ a[NR] = $1 } END { printf "%.3f–%.3f", a[1], a[NR] }'; }
printf '\n| client | wall s, median (min–max) | vs curl | CPU s, median (min–max) | CPU vs curl | peak RSS MiB | runs |\n'
printf '|---|---:|---:|---:|---:|---:|---|\n'
base_wall="" base_cpu=""
[[ -n ${wall[curl]:-} ]] && base_wall=$(median_of "${wall[curl]}") && base_cpu=$(median_of "${cpu[curl]}")
for tool in "${runnable[@]}"; do
    m=$(median_of "${wall[$tool]}")
    c=$(median_of "${cpu[$tool]}")
    printf '| %s | %s (%s) | %s | %s (%s) | %s | %.1f | %s|\n' "$tool" "$m" "$(spread_of "${wall[$tool]}")" \
        "$([[ -n $base_wall ]] && ratio "$m" "$base_wall" || echo n/a)" "$c" "$(spread_of "${cpu[$tool]}")" \
        "$([[ -n $base_cpu ]] && ratio "$c" "$base_cpu" || echo n/a)" \
        "$(awk -v k="${rss[$tool]}" 'BEGIN { print k / 1024 }')" "${status[$tool]}"
done
printf '\nRatios are medians over medians; lower is better for stitch. CPU is the process tree'"'"'s user + sys (curl+sync: sh, curl\nand sync; the kernel'"'"'s own writeback threads are not counted for any tool).\n'
if [[ -n $base_wall && -n ${wall[stitch]:-} ]]; then
    m=$(median_of "${wall[stitch]}")
    c=$(median_of "${cpu[stitch]}")
    rw=$(ratio "$m" "$base_wall")
    rc=$(ratio "$c" "$base_cpu")
    verdict=$(awk -v w="$rw" -v c="$rc" 'BEGIN { print (w <= 1.0 && c <= 1.25) ? "PASS" : "FAIL" }')
    printf '\nGoal: stitch wall <= curl, CPU <= 1.25 x curl: wall %s x, CPU %s x -> **%s**\n' "$rw" "$rc" "$verdict"
fi
bench_finish
