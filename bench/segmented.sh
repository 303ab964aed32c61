#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in printf formats are markdown
# Segmented-download benchmark: stitch --connections N next to aria2c, axel
# and curl on a loopback nginx, plus the accuracy of stitch --limit-rate.
# Not part of the test suite. See bench/README.md ("Segmented downloads").
#
#   bench/segmented.sh | tee segmented-result.md       # everything, ~2 minutes
#   SIZE_MIB=128 RATE_SECONDS=2 REPEAT=1 bench/segmented.sh   # quick run
#   SECTIONS="1 3" bench/segmented.sh
#
# Sections (one run of the script measures all of those in SECTIONS):
#   1  throttled server, nginx `limit_rate THROTTLE_RATE` per connection,
#      THROTTLE_SIZE_MIB file: stitch --connections N, aria2c -xN -sN -k1M,
#      axel -n N, curl (1 connection), stitch --connections 1
#   2  unthrottled server, SIZE_MIB file: stitch --connections 1 vs N, and the default (automatic)
#   3  unthrottled server: stitch --limit-rate R for each R in RATES, on a
#      file of R x RATE_SECONDS bytes (R = 1M -> 10 MiB with the default)
# stitch rows are skipped with a note when `stitch get --help` does not
# mention --connections (sections 1, 2) or --limit-rate (section 3).
#
# Environment:
#   SECTIONS="1 2 3"   sections to run
#   CONNECTIONS=8      N for the segmented clients (2..16; aria2c allows 16)
#   THROTTLE_RATE=20m  per-connection limit_rate of the throttled port (nginx
#                      syntax: 20m = 20 MiB/s, 500k = 500 KiB/s)
#   THROTTLE_SIZE_MIB=64   file size for section 1
#   SIZE_MIB=1024      file size for section 2
#   RATES="1M 10M 50M" --limit-rate values for section 3 (bytes/s, K/M/G = 1024 multiples)
#   RATE_SECONDS=10    intended duration of each section-3 download (decimals ok)
#   REPEAT=3           runs per client in sections 1 and 2 (round-robin)
#   RATE_REPEAT=1      runs per rate and client in section 3
#   TOOLS="stitch aria2c axel curl"   clients for section 1
#   RATE_TOOLS=stitch  clients for section 3 ("stitch curl" adds curl --limit-rate)
#   STITCH=...         stitch binary (default .build/release/stitch, built with
#                      `swift build -c release` if missing; if STITCH is set
#                      explicitly and not executable, stitch is skipped)
#   NGINX=...          nginx binary (default: nginx in PATH, else /usr/sbin/nginx)
#   BENCH_TMPDIR=...   where the work dir is created (default ${TMPDIR:-/tmp});
#                      needs about 2 x the largest file free
#   RUN_TIMEOUT=600    seconds before a single download is killed
#   KEEP=1             keep the work dir (and nginx config + logs) after the run
#
# The markdown report goes to stdout, progress to stderr. Exit status 1 if any
# run failed (exit status, timeout, wrong size or content); missed targets are
# reported as FAIL in the report but do not change the exit status.
set -euo pipefail
export LC_ALL=C # decimal point in $EPOCHREALTIME and awk output

prog=bench/segmented.sh
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
bench_args "$@"
bench_invocation SECTIONS CONNECTIONS THROTTLE_RATE THROTTLE_SIZE_MIB SIZE_MIB RATES RATE_SECONDS \
    REPEAT RATE_REPEAT TOOLS RATE_TOOLS STITCH NGINX BENCH_TMPDIR RUN_TIMEOUT KEEP
cd "$repo"

SECTIONS=${SECTIONS:-1 2 3}
CONNECTIONS=${CONNECTIONS:-8}
THROTTLE_RATE=${THROTTLE_RATE:-20m}
THROTTLE_SIZE_MIB=${THROTTLE_SIZE_MIB:-64}
SIZE_MIB=${SIZE_MIB:-1024}
RATES=${RATES:-1M 10M 50M}
RATE_SECONDS=${RATE_SECONDS:-10}
REPEAT=${REPEAT:-3}
RATE_REPEAT=${RATE_REPEAT:-1}
TOOLS=${TOOLS:-stitch aria2c axel curl}
RATE_TOOLS=${RATE_TOOLS:-stitch}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
KEEP=${KEEP:-0}
# Per-request burst of the throttled port: nginx sends at most this much per
# write before it sleeps for (bytes sent / rate), so each request gets about
# one chunk "for free" (default 2m would be 2 MiB per Range request).
THROTTLE_CHUNK=256k

need_posint SIZE_MIB THROTTLE_SIZE_MIB REPEAT RATE_REPEAT RUN_TIMEOUT
if ! [[ $CONNECTIONS =~ ^[1-9][0-9]*$ ]] || ((CONNECTIONS < 2 || CONNECTIONS > 16)); then
    die "CONNECTIONS must be 2..16"
fi
[[ $THROTTLE_RATE =~ ^[1-9][0-9]*[kKmM]?$ ]] || die "THROTTLE_RATE must look like 20m or 500k (nginx size)"
if ! [[ $RATE_SECONDS =~ ^[0-9]+(\.[0-9]+)?$ ]] || ! awk -v s="$RATE_SECONDS" 'BEGIN { exit !(s > 0) }'; then
    die "RATE_SECONDS must be a positive number"
fi
want_sec() { [[ " $SECTIONS " == *" $1 "* ]]; }
for s in $SECTIONS; do
    [[ $s == [123] ]] || die "unknown section in SECTIONS: $s (known: 1 2 3)"
done
[[ -n ${SECTIONS// /} ]] || die "SECTIONS is empty"

# bytes per second of a size with an optional K/M/G suffix (1024 multiples)
parse_rate() {
    local v=$1 n mult=1
    [[ $v =~ ^([1-9][0-9]*)([kKmMgG]?)$ ]] || return 1
    n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in
    k | K) mult=1024 ;;
    m | M) mult=1048576 ;;
    g | G) mult=1073741824 ;;
    esac
    printf '%s\n' $((n * mult))
}
throttle_bps=$(parse_rate "$THROTTLE_RATE")
declare -A rate_bps=()
rate_list=()
if want_sec 3; then
    for R in $RATES; do
        rate_bps[$R]=$(parse_rate "$R") || die "bad rate in RATES: $R (want e.g. 500K, 2M, 10M)"
        rate_list+=("$R")
    done
    ((${#rate_list[@]} > 0)) || die "RATES is empty"
fi

need_commands timeout awk cmp sha256sum

# ---------------------------------------------------------------- clients
# Rows are keyed: stitch_n stitch_1 aria2c_n axel_n curl (sections 1 and 2), stitch_auto (section 2),
# stitch_rate curl_rate (section 3). Each row belongs to one tool.
declare -A tool_skip=() row_skip=()
stitch_init

row_tool() {
    case $1 in
    stitch*) echo stitch ;;
    aria2c*) echo aria2c ;;
    axel*) echo axel ;;
    curl*) echo curl ;;
    *) die "internal: unknown row $1" ;;
    esac
}

row_label() {
    case $1 in
    stitch_n) printf 'stitch --connections %s\n' "$CONNECTIONS" ;;
    stitch_1) printf 'stitch --connections 1\n' ;;
    stitch_auto) printf 'stitch (default: automatic)\n' ;;
    aria2c_n) printf 'aria2c -x%s -s%s -k1M\n' "$CONNECTIONS" "$CONNECTIONS" ;;
    axel_n) printf 'axel -n %s\n' "$CONNECTIONS" ;;
    curl) printf 'curl\n' ;;
    stitch_rate) printf 'stitch --limit-rate\n' ;;
    curl_rate) printf 'curl --limit-rate\n' ;;
    esac
}

# Writes the command of row $1 downloading $2 to $3 (rate $4), one argument per line.
row_cmd() {
    local key=$1 url=$2 out=$3 rate=${4:-}
    case $key in
    stitch_n) printf '%s\n' "$STITCH" get "$url" -o "$out" --quiet --connections "$CONNECTIONS" ;;
    stitch_1) printf '%s\n' "$STITCH" get "$url" -o "$out" --quiet --connections 1 ;;
    stitch_auto) printf '%s\n' "$STITCH" get "$url" -o "$out" --quiet ;;
    stitch_rate) printf '%s\n' "$STITCH" get "$url" -o "$out" --quiet --limit-rate "$rate" ;;
    curl) printf '%s\n' curl -q -s -o "$out" "$url" ;;
    curl_rate) printf '%s\n' curl -q -s --limit-rate "$rate" -o "$out" "$url" ;;
    aria2c_n) aria2c_cmd "$out" "$url" -x"$CONNECTIONS" -s"$CONNECTIONS" -k1M ;;
    axel_n) printf '%s\n' axel -n "$CONNECTIONS" -q -o "$out" "$url" ;;
    esac
}

sec1_rows=() sec2_rows=() sec3_rows=()
if want_sec 1; then
    for key in stitch_n aria2c_n axel_n curl stitch_1; do
        t=$(row_tool "$key")
        [[ " $TOOLS " == *" $t "* ]] && sec1_rows+=("$key")
    done
    for t in $TOOLS; do
        [[ $t == @(stitch|aria2c|axel|curl) ]] || die "unknown tool in TOOLS: $t (known: stitch aria2c axel curl)"
    done
    ((${#sec1_rows[@]} > 0)) || die "TOOLS selects no client for section 1"
fi
want_sec 2 && sec2_rows=(stitch_1 stitch_n stitch_auto)
if want_sec 3; then
    for t in $RATE_TOOLS; do
        case $t in
        stitch | curl) sec3_rows+=("${t}_rate") ;;
        *) die "unknown tool in RATE_TOOLS: $t (known: stitch curl)" ;;
        esac
    done
    ((${#sec3_rows[@]} > 0)) || die "RATE_TOOLS is empty"
fi
all_rows=("${sec1_rows[@]}" "${sec2_rows[@]}" "${sec3_rows[@]}")

declare -A used_tools=()
for key in "${all_rows[@]}"; do
    used_tools[$(row_tool "$key")]=1
done
for t in aria2c axel curl; do
    [[ -n ${used_tools[$t]:-} ]] || continue
    r=$(missing_reason "$t")
    [[ -z $r ]] || tool_skip[$t]=$r
done
stitch_help=""
if [[ -n ${used_tools[stitch]:-} ]]; then
    resolve_stitch
    [[ -z $stitch_skip ]] || tool_skip[stitch]=$stitch_skip
    if [[ -z ${tool_skip[stitch]:-} ]]; then
        stitch_help=$(timeout 10 "$STITCH" get --help 2>&1 </dev/null) || true
    fi
fi
stitch_has_connections=no stitch_has_limit_rate=no
grep -q -e '--connections' <<<"$stitch_help" && stitch_has_connections=yes
grep -q -e '--limit-rate' <<<"$stitch_help" && stitch_has_limit_rate=yes
for key in "${all_rows[@]}"; do
    t=$(row_tool "$key")
    if [[ -n ${tool_skip[$t]:-} ]]; then
        row_skip[$key]=${tool_skip[$t]}
    elif [[ $key == stitch_[1n] && $stitch_has_connections == no ]]; then
        row_skip[$key]="\`stitch get --help\` does not mention --connections (not implemented in this build)"
    elif [[ $key == stitch_rate && $stitch_has_limit_rate == no ]]; then
        row_skip[$key]="\`stitch get --help\` does not mention --limit-rate (not implemented in this build)"
    fi
done
declare -A noted=()
for key in "${all_rows[@]}"; do
    [[ -z ${noted[$key]:-} && -n ${row_skip[$key]:-} ]] || continue
    noted[$key]=1
    note "skipping $(row_label "$key"): ${row_skip[$key]}"
done

# ---------------------------------------------------------------- setup
max_mib=0
want_sec 1 && ((THROTTLE_SIZE_MIB > max_mib)) && max_mib=$THROTTLE_SIZE_MIB
want_sec 2 && ((SIZE_MIB > max_mib)) && max_mib=$SIZE_MIB
if want_sec 3; then
    for R in "${rate_list[@]}"; do
        m=$(awk -v b="${rate_bps[$R]}" -v s="$RATE_SECONDS" 'BEGIN { printf "%d", b * s / 1048576 + 1 }')
        ((m > max_mib)) && max_mib=$m
    done
fi

bench_workdir stitch-segbench
need_space "$max_mib" "set BENCH_TMPDIR or smaller sizes"
mkdir -p "$OUTDIR" "$WORK/logs"

# scripts/nginx.sh with its optional throttled port: plain port (sections 2
# and 3) and a port with `limit_rate THROTTLE_RATE; sendfile_max_chunk
# THROTTLE_CHUNK;` (section 1). Its access log ends in conn=$connection (the
# connection serial, unique with its one worker), which lets run_one count the
# TCP connections and requests each client really used.
start_nginx NGINX_THROTTLE_RATE="$THROTTLE_RATE" NGINX_THROTTLE_CHUNK="$THROTTLE_CHUNK"
PLAIN_PORT=$NGINX_HTTP_PORT THROTTLED_PORT=$NGINX_THROTTLE_PORT
ACCESS_LOG=$NGINX_ACCESS_LOG WWW=$NGINX_WWW

RESULTS=$WORK/results.txt # "sec key run wall user sys rss_kib conns reqs status"
: >"$RESULTS"
declare -A failed=() file_desc=()

# make_src NAME BYTES: random file in the document root, hashed (which also
# pulls it into the page cache), plus the untimed warm-up copy.
make_src() {
    local name=$1 bytes=$2 path=$WWW/$1 sha
    note "creating $name ($bytes bytes, random)"
    head -c "$bytes" /dev/urandom >"$path"
    sha=$(sha256sum "$path" | awk '{ print $1 }')
    file_desc[$name]="$bytes bytes, sha256 $sha"
    warm_up "$path"
}

# run_one SEC KEY RUN FILE PORT [RATE]
run_one() {
    local sec=$1 key=$2 r=$3 name=$4 port=$5 rate=${6:-}
    local src=$WWW/$name url=http://127.0.0.1:$5/$4 out=$OUTDIR/$2.out
    local log=$WORK/logs/$1.$2.$3.log size n0 status conns reqs
    local -a cmd
    size=$(stat -c %s "$src")
    mapfile -t cmd < <(row_cmd "$key" "$url" "$out" "$rate")
    clean_out
    sync
    n0=$(wc -l <"$ACCESS_LOG")
    timed_run "$log" "${cmd[@]}"
    status=$(output_status "$run_rc" "$out" "$size" "$src")
    # nginx logs a request when it ends; give aborted ones a moment. The last
    # field of a log line is conn=SERIAL.
    sleep 0.25
    read -r conns reqs < <(tail -n "+$((n0 + 1))" "$ACCESS_LOG" |
        awk -v f="/$name " 'index($0, f) { if (!($NF in seen)) { seen[$NF] = 1; c++ } n++ }
                            END { printf "%d %d\n", c, n }')
    if [[ $status != ok ]]; then
        failed["$(row_label "$key")"]=1
        note "[$sec] $(row_label "$key") ${rate:+$rate }run $r FAILED ($status); log: $(tail -n 3 "$log" | tr '\n' ' ')"
    else
        note "[$sec] $(row_label "$key") ${rate:+$rate }run $r: ${run_wall}s wall, user ${run_user}s sys ${run_sys}s, rss ${run_rss} KiB, $conns conn / $reqs req"
    fi
    printf '%s %s %s %s %s %s %s %s %s %s\n' "$sec" "$key" "$r" "$run_wall" "$run_user" "$run_sys" "$run_rss" "$conns" "$reqs" "$status" >>"$RESULTS"
    clean_out
}

# ---------------------------------------------------------------- runs
if want_sec 1; then
    f1=throttled.bin
    make_src "$f1" $((THROTTLE_SIZE_MIB * 1048576))
    for ((r = 1; r <= REPEAT; r++)); do
        for key in "${sec1_rows[@]}"; do
            [[ -z ${row_skip[$key]:-} ]] || continue
            run_one 1 "$key" "$r" "$f1" "$THROTTLED_PORT"
        done
    done
    rm -f "$WWW/$f1"
fi

if want_sec 2; then
    f2=big.bin
    n_run=0
    for key in "${sec2_rows[@]}"; do
        [[ -n ${row_skip[$key]:-} ]] || n_run=$((n_run + 1))
    done
    if ((n_run > 0)); then
        make_src "$f2" $((SIZE_MIB * 1048576))
        for ((r = 1; r <= REPEAT; r++)); do
            for key in "${sec2_rows[@]}"; do
                [[ -z ${row_skip[$key]:-} ]] || continue
                run_one 2 "$key" "$r" "$f2" "$PLAIN_PORT"
            done
        done
        rm -f "$WWW/$f2"
    fi
fi

declare -A rate_bytes=()
if want_sec 3; then
    for R in "${rate_list[@]}"; do
        rate_bytes[$R]=$(awk -v b="${rate_bps[$R]}" -v s="$RATE_SECONDS" 'BEGIN { printf "%d", b * s }')
        n_run=0
        for key in "${sec3_rows[@]}"; do
            [[ -n ${row_skip[$key]:-} ]] || n_run=$((n_run + 1))
        done
        ((n_run > 0)) || continue
        f3=rate-$R.bin
        make_src "$f3" "${rate_bytes[$R]}"
        for ((r = 1; r <= RATE_REPEAT; r++)); do
            for key in "${sec3_rows[@]}"; do
                [[ -z ${row_skip[$key]:-} ]] || continue
                run_one "3:$R" "$key" "$r" "$f3" "$PLAIN_PORT" "$R"
            done
        done
        rm -f "$WWW/$f3"
    done
fi

# ---------------------------------------------------------------- report
# summarize SEC KEY -> "min_wall median_wall max_wall median_cpu max_rss max_conns max_reqs ok_runs" or "none"
summarize() {
    awk -v sec="$1" -v key="$2" "$AWK_MEDIAN"'
        $1 == sec && $2 == key && $10 == "ok" {
            n++; w[n] = $4; c[n] = $5 + $6
            if ($7 > rss) rss = $7; if ($8 > conns) conns = $8; if ($9 > reqs) reqs = $9
        }
        END {
            if (n == 0) { print "none"; exit }
            mc = median(c, n); mw = median(w, n)
            printf "%s %s %s %s %d %d %d %d\n", w[1], mw, w[n], mc, rss, conns, reqs, n
        }' "$RESULTS"
}

calc() { awk "BEGIN { $1 }"; }
verdict() { # verdict CONDITION-AWK-EXPR
    if awk "BEGIN { exit !($1) }"; then echo PASS; else echo FAIL; fi
}

# Fills mbps[] cpug[] rssm[] conns[] reqs[] for SEC over ROWS, file of BYTES.
declare -A mbps=() cpug=() rssm=() conns=() reqs=()
collect() {
    local sec=$1 bytes=$2 key s w_min c_med rss cn rq
    shift 2
    mbps=() cpug=() rssm=() conns=() reqs=()
    for key in "$@"; do
        [[ -z ${row_skip[$key]:-} ]] || continue
        s=$(summarize "$sec" "$key")
        [[ $s != none ]] || continue
        read -r w_min _ _ c_med rss cn rq _ <<<"$s"
        mbps[$key]=$(calc "printf \"%.1f\", ($w_min > 0) ? $bytes / 1e6 / $w_min : 0")
        cpug[$key]=$(calc "printf \"%.3f\", $c_med / ($bytes / 1073741824)")
        rssm[$key]=$(calc "printf \"%.1f\", $rss / 1024")
        conns[$key]=$cn reqs[$key]=$rq
    done
}

row_name() { # label plus "(some runs failed)"
    local l
    l=$(row_label "$1")
    if [[ -n ${failed[$l]:-} ]]; then
        printf '%s (some runs failed)\n' "$l"
    else
        printf '%s\n' "$l"
    fi
}

print_commands() { # SEC-DESCRIPTION PORT FILE RATE ROWS...
    local port=$1 name=$2 rate=$3 key
    shift 3
    local -a cmd
    for key in "$@"; do
        if [[ -n ${row_skip[$key]:-} ]]; then
            printf -- '- %s: skipped: %s\n' "$(row_label "$key")" "${row_skip[$key]}"
        else
            mapfile -t cmd < <(row_cmd "$key" "http://127.0.0.1:$port/$name" "$OUTDIR/$key.out" "$rate")
            cmd_line "$(row_label "$key")" "$(row_tool "$key")" "${cmd[@]}"
        fi
    done
}

report_sec1() {
    local bytes=$((THROTTLE_SIZE_MIB * 1048576)) key single="" single_from="" nx tgt ceiling
    collect 1 "$bytes" "${sec1_rows[@]}"
    if [[ -n ${mbps[curl]:-} ]]; then
        single=${mbps[curl]} single_from=curl
    elif [[ -n ${mbps[stitch_1]:-} ]]; then
        single=${mbps[stitch_1]} single_from="stitch --connections 1"
    fi
    nx=""
    [[ -z $single ]] || nx=$(calc "printf \"%.1f\", $CONNECTIONS * $single")
    printf '\n## 1. Per-connection-throttled server\n\n'
    printf -- '- File: %s MiB, %s\n' "$THROTTLE_SIZE_MIB" "${file_desc[$f1]}"
    printf -- '- Server: nginx `limit_rate %s; sendfile_max_chunk %s;` (per request, so per connection): at most %s MB/s per connection, %s MB/s for %s connections\n' \
        "$THROTTLE_RATE" "$THROTTLE_CHUNK" "$(calc "printf \"%.2f\", $throttle_bps / 1e6")" \
        "$(calc "printf \"%.2f\", $CONNECTIONS * $throttle_bps / 1e6")" "$CONNECTIONS"
    printf -- '- Runs per client: %s (round-robin); MB/s from the best run\n\n' "$REPEAT"
    print_commands "$THROTTLED_PORT" "$f1" "" "${sec1_rows[@]}"
    printf '\n| client | MB/s | vs curl | vs axel -n %s | vs %s × single | CPU-s per GiB | peak RSS MiB | TCP conns | requests |\n' "$CONNECTIONS" "$CONNECTIONS"
    printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
    for key in "${sec1_rows[@]}"; do
        if [[ -n ${row_skip[$key]:-} ]]; then
            printf '| %s | skipped | | | | | | | |\n' "$(row_label "$key")"
        elif [[ -z ${mbps[$key]:-} ]]; then
            printf '| %s | FAILED | | | | | | | |\n' "$(row_label "$key")"
        else
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$(row_name "$key")" "${mbps[$key]}" \
                "$(ratio "${mbps[$key]}" "${mbps[curl]:-}")" "$(ratio "${mbps[$key]}" "${mbps[axel_n]:-}")" \
                "$(ratio "${mbps[$key]}" "$nx")" "${cpug[$key]}" "${rssm[$key]}" "${conns[$key]}" "${reqs[$key]}"
        fi
    done
    ceiling=$(calc "printf \"%.1f\", $CONNECTIONS * $throttle_bps / 1e6")
    printf '\nTargets:\n\n'
    printf -- '- nominal ceiling for %s connections (%s × limit_rate): %s MB/s. nginx rounds each pause down to whole ms (a few %% faster in practice), and the first %s of every request is not throttled, so many short Range requests also beat it\n' \
        "$CONNECTIONS" "$CONNECTIONS" "$ceiling" "$THROTTLE_CHUNK"
    if [[ -n $single ]]; then
        printf -- '- single-connection rate (%s): %s MB/s; %s × single = **%s MB/s**\n' "$single_from" "$single" "$CONNECTIONS" "$nx"
    else
        printf -- '- single-connection rate: not measured (no curl or stitch --connections 1 result)\n'
    fi
    if [[ -n ${mbps[stitch_n]:-} ]]; then
        if [[ -n $single ]]; then
            tgt=$(calc "printf \"%.1f\", 0.9 * $nx")
            printf -- '- stitch --connections %s ≥ 0.9 × %s × single (%s MB/s): %s MB/s = %s × (%s × single) → **%s**\n' \
                "$CONNECTIONS" "$CONNECTIONS" "$tgt" "${mbps[stitch_n]}" "$(ratio "${mbps[stitch_n]}" "$nx")" "$CONNECTIONS" \
                "$(verdict "${mbps[stitch_n]} >= $tgt")"
        fi
        if [[ -n ${mbps[axel_n]:-} ]]; then
            tgt=$(calc "printf \"%.1f\", 1.2 * ${mbps[axel_n]}")
            printf -- '- stitch --connections %s ≥ 1.2 × axel -n %s (%s MB/s): %s MB/s = %s × axel → **%s**%s\n' \
                "$CONNECTIONS" "$CONNECTIONS" "$tgt" "${mbps[stitch_n]}" "$(ratio "${mbps[stitch_n]}" "${mbps[axel_n]}")" \
                "$(verdict "${mbps[stitch_n]} >= $tgt")" \
                "$(awk -v t="$tgt" -v c="$ceiling" 'BEGIN { if (t > c) print " (1.2 × axel is above the nominal ceiling)" }')"
        else
            printf -- '- stitch ≥ 1.2 × axel: not measured (no axel result)\n'
        fi
    else
        printf -- '- stitch --connections %s: not measured%s\n' "$CONNECTIONS" "${row_skip[stitch_n]:+ (skipped: ${row_skip[stitch_n]})}"
    fi
    printf '\nMB/s = 10^6 bytes/s of the best run. "vs" columns are ratios of MB/s. TCP conns / requests: distinct connections and requests for the file in the nginx access log (largest over the runs).\n'
}

report_sec2() {
    local bytes=$((SIZE_MIB * 1048576)) key b=stitch_1 n=stitch_n
    printf '\n## 2. Unthrottled server, stitch --connections 1 vs %s\n\n' "$CONNECTIONS"
    if [[ -z ${f2:-} || -z ${file_desc[$f2]:-} ]]; then
        printf 'Not measured: stitch skipped: %s\n' "${row_skip[stitch_n]:-no runnable client}"
        return 0
    fi
    collect 2 "$bytes" "${sec2_rows[@]}"
    printf -- '- File: %s MiB, %s; plain HTTP/1.1, no rate limit\n' "$SIZE_MIB" "${file_desc[$f2]}"
    printf -- '- Runs per client: %s (round-robin); MB/s from the best run, CPU = median user+sys, RSS = max peak RSS\n\n' "$REPEAT"
    print_commands "$PLAIN_PORT" "$f2" "" "${sec2_rows[@]}"
    printf '\n| client | MB/s | CPU-s per GiB | peak RSS MiB | TCP conns | requests | MB/s vs 1 conn | CPU vs 1 conn | RSS vs 1 conn |\n'
    printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
    for key in "${sec2_rows[@]}"; do
        if [[ -n ${row_skip[$key]:-} ]]; then
            printf '| %s | skipped | | | | | | | |\n' "$(row_label "$key")"
        elif [[ -z ${mbps[$key]:-} ]]; then
            printf '| %s | FAILED | | | | | | | |\n' "$(row_label "$key")"
        else
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$(row_name "$key")" "${mbps[$key]}" "${cpug[$key]}" \
                "${rssm[$key]}" "${conns[$key]}" "${reqs[$key]}" "$(ratio "${mbps[$key]}" "${mbps[$b]:-}")" \
                "$(ratio "${cpug[$key]}" "${cpug[$b]:-}")" "$(ratio "${rssm[$key]}" "${rssm[$b]:-}")"
        fi
    done
    printf '\nTargets:\n\n'
    if [[ -n ${mbps[$n]:-} && -n ${mbps[$b]:-} ]]; then
        printf -- '- segmented never slower (MB/s ratio ≥ 1.00): %s → **%s**\n' "$(ratio "${mbps[$n]}" "${mbps[$b]}")" \
            "$(verdict "${mbps[$n]} >= ${mbps[$b]}")"
        printf -- '- CPU within 10%% (CPU-s per GiB ratio ≤ 1.10): %s → **%s**\n' "$(ratio "${cpug[$n]}" "${cpug[$b]}")" \
            "$(verdict "${cpug[$n]} <= 1.10 * ${cpug[$b]}")"
        if [[ -n ${mbps[stitch_auto]:-} ]]; then
            printf -- '- the default (automatic: it would use 4 connections for this size, but first checks whether one is enough): MB/s %s × one connection → **%s**, CPU %s × → **%s**\n' \
                "$(ratio "${mbps[stitch_auto]}" "${mbps[$b]}")" "$(verdict "${mbps[stitch_auto]} >= 0.97 * ${mbps[$b]}")" \
                "$(ratio "${cpug[stitch_auto]}" "${cpug[$b]}")" "$(verdict "${cpug[stitch_auto]} <= 1.10 * ${cpug[$b]}")"
        fi
    else
        printf -- '- not measured (a row is missing)\n'
    fi
}

report_sec3() {
    local R key s w_min w_med w_max n req_mib ach worst
    printf '\n## 3. --limit-rate accuracy (unthrottled server)\n\n'
    printf -- '- File per rate: rate × %s s (random); plain HTTP/1.1, no server-side limit\n' "$RATE_SECONDS"
    printf -- '- Runs per rate: %s; achieved = file size ÷ median wall time (process start to exit); K/M = 1024 multiples\n\n' "$RATE_REPEAT"
    print_commands "$PLAIN_PORT" "rate-R.bin" "R" "${sec3_rows[@]}"
    printf '\n| client | --limit-rate | requested MiB/s | file MiB | runs | wall s (median) | achieved MiB/s | achieved / requested | worst run | target ±5%% |\n'
    printf '|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n'
    for R in "${rate_list[@]}"; do
        req_mib=$(calc "printf \"%.3f\", ${rate_bps[$R]} / 1048576")
        for key in "${sec3_rows[@]}"; do
            if [[ -n ${row_skip[$key]:-} ]]; then
                printf '| %s | %s | %s | | | skipped | | | | |\n' "$(row_label "$key")" "$R" "$req_mib"
                continue
            fi
            s=$(summarize "3:$R" "$key")
            if [[ $s == none ]]; then
                printf '| %s | %s | %s | | | FAILED | | | | |\n' "$(row_label "$key")" "$R" "$req_mib"
                continue
            fi
            read -r w_min w_med w_max _ _ _ _ n <<<"$s"
            ach=$(calc "printf \"%.3f\", ${rate_bytes[$R]} / $w_med / 1048576")
            # worst run: the one whose achieved rate is furthest from requested
            worst=$(calc "a = ${rate_bytes[$R]} / $w_min / ${rate_bps[$R]}; b = ${rate_bytes[$R]} / $w_max / ${rate_bps[$R]};
                           printf \"%.3f\", ((a - 1) ^ 2 > (b - 1) ^ 2) ? a : b")
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | **%s** |\n' "$(row_name "$key")" "$R" "$req_mib" \
                "$(calc "printf \"%.1f\", ${rate_bytes[$R]} / 1048576")" "$n" "$w_med" "$ach" \
                "$(calc "printf \"%.3f\", $ach / $req_mib")" "$worst" \
                "$(verdict "$worst >= 0.95 && $worst <= 1.05")"
        done
    done
    printf '\nTarget: every run within 5%% of the requested rate ("worst run" is the run furthest from 1.000). A short RATE_SECONDS makes start-up time and any initial burst weigh more.\n'
}

{
    report_head "Stitch segmented-download benchmark"
    printf -- '- Server: loopback nginx (scripts/nginx.sh: 1 worker, sendfile, HTTP/1.1): plain port %s, throttled port %s\n' \
        "$PLAIN_PORT" "$THROTTLED_PORT"
    if [[ -n ${used_tools[stitch]:-} ]]; then
        if [[ -n ${tool_skip[stitch]:-} ]]; then
            printf -- '- stitch: skipped: %s\n' "${tool_skip[stitch]}"
        else
            printf -- '- stitch: %s (%s); `get --help` mentions --connections: %s, --limit-rate: %s\n' \
                "$(tool_version stitch)" "$STITCH" "$stitch_has_connections" "$stitch_has_limit_rate"
        fi
    fi
    printf -- '- Every output is checked (exit status, size, `cmp` with the source) and deleted + `sync` before the next run\n'
    want_sec 1 && report_sec1
    want_sec 2 && report_sec2
    want_sec 3 && report_sec3
    printf '\n## Raw runs\n\n'
    printf '| section | client | run | wall s | user s | sys s | peak RSS KiB | TCP conns | requests | status |\n'
    printf '|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n'
    while read -r sec key r wall user sys rss cn rq status; do
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$sec" "$(row_label "$key")" "$r" "$wall" "$user" "$sys" "$rss" "$cn" "$rq" "$status"
    done <"$RESULTS"
}

bench_finish
