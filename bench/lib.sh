# shellcheck shell=bash
# shellcheck disable=SC2016 # backticks in printf formats are markdown
# shellcheck disable=SC2034,SC2154 # results for, and inputs from, the sourcing script
# Helpers shared by bench/run.sh and bench/segmented.sh. Sourced, not run: the
# script sets `prog`, `set -euo pipefail` and LC_ALL=C first. Uses the
# script's RUN_TIMEOUT and KEEP, and its `failed` array (bench_finish).

die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "$prog" "$*" >&2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
TIME=/usr/bin/time

# bench_args "$@": --help prints the script's header comment (line 3 up to
# `set -euo`); any other argument is an error.
bench_args() {
    case ${1:-} in
    -h | --help)
        sed -n '3,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
        exit 0
        ;;
    "") ;;
    *) die "unexpected argument: $1 (configure with environment variables, see --help)" ;;
    esac
}

# bench_invocation VAR...: sets `invocation` to the command line for the
# report: those VARs that are set, shell-quoted, then the script as invoked.
bench_invocation() {
    local v
    invocation=""
    for v in "$@"; do
        if [[ -n ${!v+x} ]]; then
            invocation+="$v=$(printf '%q' "${!v}") "
        fi
    done
    invocation+=$(printf '%q' "$0")
}

# need_posint VAR...: each VAR must be a positive integer.
need_posint() {
    local v
    for v in "$@"; do
        [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer"
    done
}

# need_commands CMD...: GNU time at $TIME and each CMD must exist.
need_commands() {
    local c hint
    [[ -x $TIME ]] || die "GNU time not found at $TIME (apt-get install time)"
    for c in "$@"; do
        hint=""
        [[ $c != timeout ]] || hint=" (coreutils)"
        command -v "$c" >/dev/null || die "$c$hint not found"
    done
}

# ---------------------------------------------------------------- clients
# stitch_init: makes STITCH absolute (default .build/release/stitch) and
# remembers whether the user set it. Call after bench_invocation.
stitch_init() {
    stitch_explicit=0
    if [[ -n ${STITCH+x} ]]; then
        stitch_explicit=1
    fi
    STITCH=${STITCH:-.build/release/stitch}
    [[ $STITCH == /* ]] || STITCH=$repo/$STITCH
}

# resolve_stitch: builds the default stitch if it is missing. Sets
# `stitch_skip` to why stitch cannot run, or to "" when it can.
resolve_stitch() {
    stitch_skip=""
    if [[ -x $STITCH ]]; then
        return 0
    fi
    if ((stitch_explicit)); then
        stitch_skip="STITCH=$STITCH is not an executable file"
        return 0
    fi
    if ! command -v swift >/dev/null 2>&1; then
        stitch_skip="$STITCH missing and no swift toolchain to build it"
        return 0
    fi
    note "building stitch: swift build -c release --product stitch"
    if swift build -c release --product stitch >&2 && [[ -x $STITCH ]]; then
        return 0
    fi
    stitch_skip="swift build -c release failed (or did not produce $STITCH)"
}

# missing_reason TOOL: why TOOL cannot run (not installed), or nothing.
missing_reason() {
    command -v "$1" >/dev/null 2>&1 && return 0
    case $1 in
    aria2c) printf '%s\n' "aria2c not installed (apt-get install aria2)" ;;
    *) printf '%s\n' "$1 not installed (apt-get install $1)" ;;
    esac
}

# tool_version TOOL: first line of its --version (stitch, stitch-*: $STITCH).
tool_version() {
    local out
    case $1 in
    stitch | stitch-*) out=$(timeout 5 "$STITCH" --version 2>&1 </dev/null) || out="version unknown" ;;
    floor) out="bench/tools/durable-floor.c, cc $(cc -dumpversion 2>/dev/null)" ;;
    *) out=$("$1" --version 2>&1 </dev/null) || true ;;
    esac
    out=${out%%$'\n'*}
    printf '%s\n' "${out:-unknown}"
}

# aria2c_cmd OUT URL OPTION...: aria2c with OPTIONs (after -q) fetching URL to
# OUT, ignoring any user config, one argument per line.
aria2c_cmd() {
    local out=$1 url=$2
    shift 2
    printf '%s\n' aria2c --no-conf -q "$@" -j1 --file-allocation=none \
        --check-integrity=false --allow-overwrite=true --auto-file-renaming=false \
        --summary-interval=0 -d "$(dirname "$out")" -o "$(basename "$out")" "$url"
}

# ---------------------------------------------------------------- work dir, nginx
# bench_workdir PREFIX: creates WORK under BENCH_TMPDIR (default
# ${TMPDIR:-/tmp}), sets NGX (nginx dir) and OUTDIR, and installs the traps:
# on exit, Ctrl-C included, kill the running download, stop nginx and remove
# WORK (KEEP=1 keeps it).
bench_workdir() {
    local base=${BENCH_TMPDIR:-${TMPDIR:-/tmp}}
    mkdir -p "$base"
    WORK=$(mktemp -d "$base/$1.XXXXXX")
    NGX=$WORK/nginx
    OUTDIR=$WORK/out
    child=""
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

bench_cleanup() {
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

# need_space MIB HINT: WORK's filesystem needs 2 x MIB + 64 MiB free.
need_space() {
    local avail_kib need_kib=$(($1 * 2 * 1024 + 64 * 1024))
    avail_kib=$(df -Pk "$WORK" | awk 'NR == 2 { print $4 }')
    ((avail_kib >= need_kib)) ||
        die "not enough space in $WORK: need $((need_kib / 1024)) MiB, have $((avail_kib / 1024)) MiB ($2)"
}

# start_nginx [VAR=VALUE...]: scripts/nginx.sh start NGX with those extra
# environment settings (e.g. NGINX_THROTTLE_RATE), then loads its ports.env.
start_nginx() {
    note "starting nginx in $NGX"
    env "$@" "$repo/scripts/nginx.sh" start "$NGX" >/dev/null
    # shellcheck disable=SC1091
    . "$NGX/ports.env"
}

# ---------------------------------------------------------------- runs
clean_out() { rm -rf "${OUTDIR:?}"/* "${OUTDIR:?}"/.[!.]* 2>/dev/null || true; }

# warm_up SRC: one untimed copy of SRC into OUTDIR, deleted again, then sync,
# so the first timed run does not pay for first-touch page allocation.
warm_up() {
    cat "$1" >"$OUTDIR/warmup.bin"
    rm -f "$OUTDIR/warmup.bin"
    sync
}

# timed_run LOG CMD...: runs timeout RUN_TIMEOUT -> GNU time -> CMD (output to
# LOG). Sets run_rc, run_wall (s, from $EPOCHREALTIME, µs resolution),
# run_user, run_sys (s) and run_rss (KiB) as GNU time measured CMD itself.
timed_run() {
    local log=$1 tfile=$WORK/time.txt t0 t1 line
    shift
    run_rc=0
    rm -f "$tfile"
    t0=$EPOCHREALTIME
    # timeout -> GNU time -> tool: time measures the tool itself; timeout
    # signals its whole process group on expiry or when it gets TERM. Run in
    # the background and `wait`, so INT/TERM traps fire without waiting for
    # the download to finish (bench_cleanup then TERMs $child).
    timeout "$RUN_TIMEOUT" "$TIME" -f '%e %U %S %M' -o "$tfile" "$@" >"$log" 2>&1 </dev/null &
    child=$!
    wait "$child" || run_rc=$?
    child=""
    t1=$EPOCHREALTIME
    line=$(tail -n 1 "$tfile" 2>/dev/null) || line=""
    run_user="" run_sys="" run_rss=""
    read -r _ run_user run_sys run_rss <<<"$line" || true
    run_user=${run_user:-0} run_sys=${run_sys:-0} run_rss=${run_rss:-0}
    run_wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
}

# output_status RC OUT SIZE SRC: ok, timeout, exit=N, no-output, size=N or
# content-mismatch for a download that exited with RC and should have written
# SIZE bytes equal to SRC to OUT.
output_status() {
    local rc=$1 out=$2 size=$3 src=$4
    if ((rc == 124)); then
        echo timeout
    elif ((rc != 0)); then
        echo "exit=$rc"
    elif [[ ! -f $out ]]; then
        echo no-output
    elif [[ $(stat -c %s "$out") != "$size" ]]; then
        echo "size=$(stat -c %s "$out")"
    elif ! cmp -s "$out" "$src"; then
        echo content-mismatch
    else
        echo ok
    fi
}

# ---------------------------------------------------------------- report
# awk function median(a, n): median of a[1..n] (sorts a in place).
AWK_MEDIAN='
    function median(a, n,    i, j, v) {
        for (i = 2; i <= n; i++) { v = a[i]; j = i - 1; while (j > 0 && a[j] > v) { a[j + 1] = a[j]; j-- } a[j + 1] = v }
        return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }'

ratio() { # ratio VALUE BASE
    awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "n/a" }'
}

# report_head TITLE: the report's title, command line, date and host.
report_head() {
    local cpu_model
    cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
    printf '# %s\n\n' "$1"
    printf 'Command: `%s`\n\n' "$invocation"
    printf -- '- Date: %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    printf -- '- Host: %s, %s CPUs (%s), kernel %s\n' "$(uname -n)" "$(nproc)" "${cpu_model:-unknown CPU}" "$(uname -r)"
}

# cmd_line LABEL TOOL CMD...: "- LABEL (TOOL's version): `CMD`", shell-quoted.
cmd_line() {
    local label=$1 tool=$2 q
    shift 2
    q=$(printf '%q ' "$@")
    printf -- '- %s (%s): `%s`\n' "$label" "$(tool_version "$tool")" "${q% }"
}

# bench_finish: exit status 1 (with a note) if any run failed.
bench_finish() {
    if ((${#failed[@]} > 0)); then
        note "some runs failed: ${!failed[*]}"
        exit 1
    fi
}

# Alternating rounds against curl (large.sh, https.sh). The caller defines `run TOOL ROUND`, which appends each
# run's seconds to the associative arrays walls[TOOL] and cpus[TOOL] (space-separated).

# rounds_run ROUNDS TOOL...: every tool once a round, the order reversed every other round, so that no tool always
# runs first (after the source was read, say).
rounds_run() {
    local rounds=$1 round i tool
    shift
    local tools=("$@") order
    for round in $(seq "$rounds"); do
        if ((round % 2)); then order=("${tools[@]}"); else order=(); for ((i = ${#tools[@]} - 1; i >= 0; i--)); do order+=("${tools[i]}"); done; fi
        for tool in "${order[@]}"; do run "$tool" "$round"; done
    done
}

# rounds_stats "v1 v2 ...": "median min max".
rounds_stats() {
    tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 } END {
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f %.2f %.2f", m, v[1], v[NR] }'
}

# rounds_table MIB TOOL...: the markdown table of medians with their spread, MB/s for MIB MiB, and ratios against
# curl (speed: above 1 is faster than curl; CPU: below 1 is cheaper).
rounds_table() {
    local mib=$1 curl_wall curl_cpu tool w wmin wmax c cmin cmax
    shift
    read -r curl_wall _ _ <<<"$(rounds_stats "${walls[curl]}")"
    read -r curl_cpu _ _ <<<"$(rounds_stats "${cpus[curl]}")"
    echo "| tool | wall s, median (min–max) | MB/s | CPU s, median (min–max) | speed vs curl | CPU vs curl |"
    echo "|---|---|---|---|---|---|"
    for tool in "$@"; do
        read -r w wmin wmax <<<"$(rounds_stats "${walls[$tool]}")"
        read -r c cmin cmax <<<"$(rounds_stats "${cpus[$tool]}")"
        awk -v t="$tool" -v w="$w" -v wmin="$wmin" -v wmax="$wmax" -v c="$c" -v cmin="$cmin" -v cmax="$cmax" \
            -v cw="$curl_wall" -v cc="$curl_cpu" -v mib="$mib" 'BEGIN {
            printf "| %s | %.2f (%.2f–%.2f) | %.0f | %.2f (%.2f–%.2f) | %.2f× | %.2f× |\n",
                t, w, wmin, wmax, mib * 1048576 / w / 1e6, c, cmin, cmax, cw / w, (cc > 0 ? c / cc : 0) }'
    done
}

# bench_loopback_file NAME FILE SIZE_MIB: a work folder under BENCH_TMPDIR (default /tmp) with an out/ folder, the
# loopback nginx started in it (its ports.env sourced), and SIZE_MIB MiB of random bytes at $NGINX_WWW/FILE; nginx
# is stopped and the folder removed on exit. Sets work, nginx_dir, src and src_sha. Run from the repository root.
bench_loopback_file() {
    local name=$1 file=$2 size=$3
    work=$(mktemp -d "${BENCH_TMPDIR:-/tmp}/stitch-bench-$name.XXXXXX")
    nginx_dir=$work/nginx
    mkdir -p "$nginx_dir" "$work/out"
    trap 'bash scripts/nginx.sh stop "$nginx_dir" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
    bash scripts/nginx.sh start "$nginx_dir" >/dev/null
    # shellcheck disable=SC1091
    source "$nginx_dir/ports.env"
    src=$NGINX_WWW/$file
    echo "$name.sh: creating a $size MiB random file" >&2
    head -c $((size << 20)) /dev/urandom >"$src"
    src_sha=$(sha256sum "$src" | cut -d' ' -f1)
}

# The machine's busy CPU seconds so far (every process and kernel thread: user, nice, system, irq, softirq).
machine_busy() { awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { printf "%.2f", ($2 + $3 + $4 + $7 + $8) / hz }' /proc/stat; }
