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
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "$prog" "$*" >&2; }

case ${1:-} in
-h | --help)
    sed -n '3,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    exit 0
    ;;
"") ;;
*) die "unexpected argument: $1 (configure with environment variables, see --help)" ;;
esac

invocation=""
for v in SIZE_MIB REPEAT STITCH TOOLS BENCH_TMPDIR RUN_TIMEOUT KEEP; do
    if [[ -n ${!v+x} ]]; then
        invocation+="$v=$(printf '%q' "${!v}") "
    fi
done
invocation+=$(printf '%q' "$0")

repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo"

SIZE_MIB=${SIZE_MIB:-1024}
REPEAT=${REPEAT:-3}
TOOLS=${TOOLS:-stitch stitch-c1 curl wget aria2c axel}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
KEEP=${KEEP:-0}
[[ $SIZE_MIB =~ ^[1-9][0-9]*$ ]] || die "SIZE_MIB must be a positive integer"
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive integer"
[[ $RUN_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "RUN_TIMEOUT must be a positive integer"

TIME=/usr/bin/time
[[ -x $TIME ]] || die "GNU time not found at $TIME (apt-get install time)"
command -v timeout >/dev/null || die "timeout (coreutils) not found"
command -v awk >/dev/null || die "awk not found"

# ---------------------------------------------------------------- tools
declare -A skip_reason=()
stitch_explicit=0
if [[ -n ${STITCH+x} ]]; then
    stitch_explicit=1
fi
STITCH=${STITCH:-.build/release/stitch}
[[ $STITCH == /* ]] || STITCH=$repo/$STITCH

resolve_stitch() {
    if [[ -x $STITCH ]]; then
        return 0
    fi
    if ((stitch_explicit)); then
        skip_reason[stitch]="STITCH=$STITCH is not an executable file"
        return 0
    fi
    if ! command -v swift >/dev/null 2>&1; then
        skip_reason[stitch]="$STITCH missing and no swift toolchain to build it"
        return 0
    fi
    note "building stitch: swift build -c release --product stitch"
    if swift build -c release --product stitch >&2 && [[ -x $STITCH ]]; then
        return 0
    fi
    skip_reason[stitch]="swift build -c release failed (or did not produce $STITCH)"
}

tool_binary() {
    case $1 in
    stitch | stitch-c1) printf '%s\n' "$STITCH" ;;
    *) printf '%s\n' "$1" ;;
    esac
}

selected=()
for t in $TOOLS; do
    case $t in
    stitch) resolve_stitch ;;
    stitch-c1) [[ -n ${skip_reason[stitch]:-} ]] && skip_reason[$t]=${skip_reason[stitch]} ;;
    curl | wget | aria2c | axel)
        if ! command -v "$t" >/dev/null 2>&1; then
            case $t in
            aria2c) skip_reason[$t]="aria2c not installed (apt-get install aria2)" ;;
            *) skip_reason[$t]="$t not installed (apt-get install $t)" ;;
            esac
        fi
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
    aria2c)
        printf '%s\n' aria2c --no-conf -q -x1 -s1 -j1 --file-allocation=none \
            --check-integrity=false --allow-overwrite=true --auto-file-renaming=false \
            --summary-interval=0 -d "$(dirname "$out")" -o "$(basename "$out")" "$url"
        ;;
    axel) printf '%s\n' axel -n 1 -q -o "$out" "$url" ;;
    esac
}

tool_version() {
    local out
    case $1 in
    stitch | stitch-c1) out=$(timeout 5 "$STITCH" --version 2>&1 </dev/null) || out="version unknown" ;;
    curl | wget | aria2c | axel) out=$("$1" --version 2>&1 </dev/null) || true ;;
    esac
    out=${out%%$'\n'*}
    printf '%s\n' "${out:-unknown}"
}

# ---------------------------------------------------------------- setup
base=${BENCH_TMPDIR:-${TMPDIR:-/tmp}}
mkdir -p "$base"
WORK=$(mktemp -d "$base/stitch-bench.XXXXXX")
NGX=$WORK/nginx
OUTDIR=$WORK/out
child=""
cleanup() {
    local rc=$?
    if [[ -n $child ]]; then
        kill -TERM "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    "$repo/scripts/nginx.sh" stop "$NGX" >/dev/null 2>&1 || true
    if [[ $KEEP == 1 ]]; then
        note "kept work dir $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

size_bytes=$((SIZE_MIB * 1024 * 1024))
avail_kib=$(df -Pk "$WORK" | awk 'NR == 2 { print $4 }')
need_kib=$((SIZE_MIB * 2 * 1024 + 64 * 1024))
((avail_kib >= need_kib)) ||
    die "not enough space in $WORK: need $((need_kib / 1024)) MiB, have $((avail_kib / 1024)) MiB (set BENCH_TMPDIR or SIZE_MIB)"

note "starting nginx in $NGX"
"$repo/scripts/nginx.sh" start "$NGX" >/dev/null
# shellcheck disable=SC1091
. "$NGX/ports.env"
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
    local tool=$1 r=$2 out=$OUTDIR/$1.out tfile=$WORK/time.txt log=$WORK/$1.$2.log
    local -a cmd
    mapfile -t cmd < <(tool_cmd "$tool" "$URL" "$out")
    rm -rf "${OUTDIR:?}"/* "${OUTDIR:?}"/.[!.]* 2>/dev/null || true
    sync
    local t0 t1 rc=0
    rm -f "$tfile"
    t0=$EPOCHREALTIME
    # timeout -> GNU time -> tool: time measures the tool itself; timeout
    # signals its whole process group on expiry or when it gets TERM. Run in
    # the background and `wait`, so INT/TERM traps fire without waiting for
    # the download to finish (cleanup then TERMs $child).
    timeout "$RUN_TIMEOUT" "$TIME" -f '%e %U %S %M' -o "$tfile" "${cmd[@]}" >"$log" 2>&1 </dev/null &
    child=$!
    wait "$child" || rc=$?
    child=""
    t1=$EPOCHREALTIME
    local line wall user sys rss status=ok
    line=$(tail -n 1 "$tfile" 2>/dev/null) || line=""
    read -r _ user sys rss <<<"$line" || true
    user=${user:-0} sys=${sys:-0} rss=${rss:-0}
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    if ((rc == 124)); then
        status="timeout"
    elif ((rc != 0)); then
        status="exit=$rc"
    elif [[ ! -f $out ]]; then
        status="no-output"
    elif [[ $(stat -c %s "$out") != "$size_bytes" ]]; then
        status="size=$(stat -c %s "$out")"
    elif ! cmp -s "$out" "$SRC"; then
        status="content-mismatch"
    fi
    if [[ $status != ok ]]; then
        failed[$tool]=1
        note "$tool run $r FAILED ($status); log: $(tail -n 3 "$log" | tr '\n' ' ')"
    else
        note "$tool run $r: ${wall}s wall, user ${user}s sys ${sys}s, rss ${rss} KiB"
    fi
    printf '%s %s %s %s %s %s %s\n' "$tool" "$r" "$wall" "$user" "$sys" "$rss" "$status" >>"$RESULTS"
    rm -rf "${OUTDIR:?}"/* "${OUTDIR:?}"/.[!.]* 2>/dev/null || true
}

# Untimed warm-up: write one copy of the file on the output filesystem so the
# first timed run does not pay for first-touch page allocation/writeback.
note "warm-up: copying the source once to the output dir"
cat "$SRC" >"$OUTDIR/warmup.bin"
rm -f "$OUTDIR/warmup.bin"
sync

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
    awk -v tool="$1" '
        $1 == tool && $7 == "ok" { n++; w[n] = $3; c[n] = $4 + $5; if ($6 > rss) rss = $6 }
        END {
            if (n == 0) { print "none"; exit }
            best = w[1]; for (i = 2; i <= n; i++) if (w[i] < best) best = w[i]
            # insertion sort for the median
            for (i = 2; i <= n; i++) { v = c[i]; j = i - 1; while (j > 0 && c[j] > v) { c[j + 1] = c[j]; j-- } c[j + 1] = v }
            med = (n % 2) ? c[(n + 1) / 2] : (c[n / 2] + c[n / 2 + 1]) / 2
            printf "%s %s %s %d\n", best, med, rss, n
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

ratio() { # ratio VALUE BASE
    awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "n/a" }'
}

cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
{
    printf '# Stitch download benchmark\n\n'
    printf 'Command: `%s`\n\n' "$invocation"
    printf -- '- Date: %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    printf -- '- Host: %s, %s CPUs (%s), kernel %s\n' "$(uname -n)" "$(nproc)" "${cpu_model:-unknown CPU}" "$(uname -r)"
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
            printf -- '- %s (%s): `%s`\n' "$t" "$(tool_version "$t")" "$(printf '%q ' "${cmd[@]}" | sed 's/ $//')"
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

if ((${#failed[@]} > 0)); then
    note "some runs failed: ${!failed[*]}"
    exit 1
fi
