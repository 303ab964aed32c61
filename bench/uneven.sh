#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in printf formats are markdown
# "Fast on uneven links" benchmark (issue 10): stitch -c N next to aria2c and
# axel on a loopback nginx where each connection gets its own rate limit.
# Not part of the test suite. See bench/README.md ("Uneven links").
#
#   bench/uneven.sh | tee uneven-result.md            # everything, about 6 minutes
#   SIZE_MIB=64 ROUNDS=3 bench/uneven.sh              # quick run
#   SECTIONS=uneven ROUNDS=9 bench/uneven.sh
#
# Sections (one run of the script measures all of those in SECTIONS), each on
# its own nginx port, each with stitch get -c N, aria2c -xN -sN -k1M, axel -n N:
#   uneven     `limit_rate` chosen per connection: SLOW_RATE on a connection
#              whose nginx serial number ($connection) ends in a digit of
#              SLOW_DIGITS (3 in 10 with 147), FAST_RATE on the others
#   even       `limit_rate FAST_RATE` on every connection
#   connlimit  `limit_conn` CONN_LIMIT per client address: requests beyond that
#              many in progress get 503; `limit_rate FAST_RATE` per connection
#
# Environment:
#   SECTIONS="uneven even connlimit"   sections to run
#   SIZE_MIB=256       size of the downloaded file in MiB (one random file for all sections)
#   ROUNDS=7           rounds in the uneven section; each round runs every tool once, and
#                      the order rotates by one tool from round to round
#   EVEN_ROUNDS=ROUNDS, CONNLIMIT_ROUNDS=ROUNDS   rounds in the other two sections
#   CONNECTIONS=8      N for every client (2..16; aria2c's -x stops at 16)
#   SLOW_RATE=2m       limit_rate of the slow connections (nginx syntax: 2m = 2 MiB/s)
#   FAST_RATE=20m      limit_rate of the fast connections, of the even port and of the
#                      connection-limited port
#   SLOW_DIGITS=147    last digits of $connection that make a connection slow
#   ALIGN=1            before each uneven run, open and close idle connections until the
#                      next serial ends in 0, so every client starts on the same pattern
#                      (its first 8 connections hold 3 slow ones); 0 = no alignment
#   CONN_LIMIT=2       concurrent requests per address on the connection-limited port
#   TOOLS="stitch aria2c axel"   clients, in this order in round 1
#   STITCH=...         stitch binary (default .build/release/stitch, built with
#                      `swift build -c release --product stitch` if missing; if STITCH is
#                      set explicitly and not executable, stitch is skipped)
#   NGINX=...          nginx binary (default: nginx in PATH, else /usr/sbin/nginx)
#   BENCH_TMPDIR=...   where the work dir is created (default ${TMPDIR:-/tmp});
#                      needs about 2 x SIZE_MIB free
#   RUN_TIMEOUT=600    seconds before a single download is killed
#   KEEP=1             keep the work dir (nginx config, logs, per-run logs) after the run
#
# The markdown report goes to stdout, progress to stderr. Exit status 1 if any
# run failed (exit status, timeout, missing output, wrong size or sha256);
# missed targets are reported as FAIL in the report but do not change the exit
# status.
set -euo pipefail
export LC_ALL=C # decimal point in $EPOCHREALTIME and awk output

prog=bench/uneven.sh
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
bench_args "$@"
bench_invocation SECTIONS SIZE_MIB ROUNDS EVEN_ROUNDS CONNLIMIT_ROUNDS CONNECTIONS SLOW_RATE FAST_RATE \
    SLOW_DIGITS ALIGN CONN_LIMIT TOOLS STITCH NGINX BENCH_TMPDIR RUN_TIMEOUT KEEP
cd "$repo"

SECTIONS=${SECTIONS:-uneven even connlimit}
SIZE_MIB=${SIZE_MIB:-256}
ROUNDS=${ROUNDS:-7}
EVEN_ROUNDS=${EVEN_ROUNDS:-$ROUNDS}
CONNLIMIT_ROUNDS=${CONNLIMIT_ROUNDS:-$ROUNDS}
CONNECTIONS=${CONNECTIONS:-8}
SLOW_RATE=${SLOW_RATE:-2m}
FAST_RATE=${FAST_RATE:-20m}
SLOW_DIGITS=${SLOW_DIGITS:-147}
ALIGN=${ALIGN:-1}
CONN_LIMIT=${CONN_LIMIT:-2}
TOOLS=${TOOLS:-stitch aria2c axel}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
KEEP=${KEEP:-0}
# sendfile_max_chunk of every rate-limited port: nginx sends at most this much
# per write before it sleeps for (bytes sent / rate), so each request gets
# about one chunk "for free" (nginx's default, 2m, would be 2 MiB per request:
# a second's worth of a slow connection).
CHUNK=256k

need_posint SIZE_MIB ROUNDS EVEN_ROUNDS CONNLIMIT_ROUNDS CONN_LIMIT RUN_TIMEOUT
if ! [[ $CONNECTIONS =~ ^[1-9][0-9]*$ ]] || ((CONNECTIONS < 2 || CONNECTIONS > 16)); then
    die "CONNECTIONS must be 2..16"
fi
[[ $SLOW_RATE =~ ^[1-9][0-9]*[kKmM]?$ ]] || die "SLOW_RATE must look like 2m or 500k (nginx size)"
[[ $FAST_RATE =~ ^[1-9][0-9]*[kKmM]?$ ]] || die "FAST_RATE must look like 20m or 500k (nginx size)"
[[ $SLOW_DIGITS =~ ^[0-9]{1,10}$ ]] || die "SLOW_DIGITS must be digits, e.g. 147"
[[ $ALIGN == [01] ]] || die "ALIGN must be 0 or 1"
for s in $SECTIONS; do
    [[ $s == @(uneven|even|connlimit) ]] || die "unknown section in SECTIONS: $s (known: uneven even connlimit)"
done
[[ -n ${SECTIONS// /} ]] || die "SECTIONS is empty"
want_sec() { [[ " $SECTIONS " == *" $1 "* ]]; }
rows=()
for t in $TOOLS; do
    [[ $t == @(stitch|aria2c|axel) ]] || die "unknown tool in TOOLS: $t (known: stitch aria2c axel)"
    [[ " ${rows[*]-} " == *" $t "* ]] || rows+=("$t")
done
((${#rows[@]} > 0)) || die "TOOLS is empty"

# bytes per second of an nginx size (k, m = 1024 multiples)
parse_rate() {
    local n mult=1
    [[ $1 =~ ^([1-9][0-9]*)([kKmM]?)$ ]] || return 1
    n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in
    k | K) mult=1024 ;;
    m | M) mult=1048576 ;;
    esac
    printf '%s\n' $((n * mult))
}
slow_bps=$(parse_rate "$SLOW_RATE")
fast_bps=$(parse_rate "$FAST_RATE")
calc() { awk "BEGIN { $1 }"; }
mib() { calc "printf \"%.2f\", $1 / 1048576"; } # mib BYTES_PER_S -> MiB/s
slow_mib=$(mib "$slow_bps") fast_mib=$(mib "$fast_bps")
# first_slow: how many of the serials x0 .. x(CONNECTIONS-1) are slow
first_slow=0
for ((i = 0; i < CONNECTIONS; i++)); do
    [[ $SLOW_DIGITS != *$((i % 10))* ]] || first_slow=$((first_slow + 1))
done
ceiling=$(calc "printf \"%.1f\", $CONNECTIONS * $fast_bps / 1048576")
connlimit_ceiling=$(calc "printf \"%.1f\", $CONN_LIMIT * $fast_bps / 1048576")

need_commands timeout awk sha256sum

# ---------------------------------------------------------------- clients
declare -A row_skip=()
stitch_init

row_label() {
    case $1 in
    stitch) printf 'stitch -c %s\n' "$CONNECTIONS" ;;
    aria2c) printf 'aria2c -x%s -s%s -k1M\n' "$CONNECTIONS" "$CONNECTIONS" ;;
    axel) printf 'axel -n %s\n' "$CONNECTIONS" ;;
    esac
}

# row_cmd TOOL URL OUT: the command, one argument per line. stitch runs without
# --quiet so its notices (retries, restarts) land in the run's log; when stderr
# is not a terminal it prints only a few progress lines.
row_cmd() {
    case $1 in
    stitch) printf '%s\n' "$STITCH" get -c "$CONNECTIONS" "$2" -o "$3" ;;
    aria2c) aria2c_cmd "$3" "$2" -x"$CONNECTIONS" -s"$CONNECTIONS" -k1M ;;
    axel) printf '%s\n' axel -n "$CONNECTIONS" -q -o "$3" "$2" ;;
    esac
}

for t in "${rows[@]}"; do
    if [[ $t == stitch ]]; then
        resolve_stitch
        if [[ -n $stitch_skip ]]; then
            row_skip[stitch]=$stitch_skip
        elif ! timeout 10 "$STITCH" get --help 2>&1 </dev/null | grep -q -e '--connections'; then
            row_skip[stitch]="\`stitch get --help\` does not mention --connections (not implemented in this build)"
        fi
    else
        r=$(missing_reason "$t")
        [[ -z $r ]] || row_skip[$t]=$r
    fi
    [[ -z ${row_skip[$t]:-} ]] || note "skipping $(row_label "$t"): ${row_skip[$t]}"
done
run_rows=()
for t in "${rows[@]}"; do
    [[ -n ${row_skip[$t]:-} ]] || run_rows+=("$t")
done
((${#run_rows[@]} > 0)) || die "no client can run (see the notes above)"

# ---------------------------------------------------------------- setup
bench_workdir stitch-uneven
need_space "$SIZE_MIB" "set BENCH_TMPDIR or a smaller SIZE_MIB"
mkdir -p "$OUTDIR" "$WORK/logs"

# scripts/nginx.sh with three optional ports: the throttled port is the even
# one, plus the uneven and the connection-limited ports. Its access log ends
# in conn=$connection (the connection serial; unique with its one worker).
start_nginx NGINX_THROTTLE_RATE="$FAST_RATE" NGINX_THROTTLE_CHUNK="$CHUNK" \
    NGINX_UNEVEN=1 NGINX_UNEVEN_SLOW_RATE="$SLOW_RATE" NGINX_UNEVEN_FAST_RATE="$FAST_RATE" \
    NGINX_UNEVEN_SLOW_DIGITS="$SLOW_DIGITS" NGINX_UNEVEN_CHUNK="$CHUNK" \
    NGINX_CONNLIMIT="$CONN_LIMIT" NGINX_CONNLIMIT_RATE="$FAST_RATE" NGINX_CONNLIMIT_CHUNK="$CHUNK"
declare -A port=([uneven]=$NGINX_UNEVEN_PORT [even]=$NGINX_THROTTLE_PORT [connlimit]=$NGINX_CONNLIMIT_PORT)
ACCESS_LOG=$NGINX_ACCESS_LOG WWW=$NGINX_WWW

NAME=big.bin
SRC=$WWW/$NAME
BYTES=$((SIZE_MIB * 1048576))
note "creating $NAME ($BYTES bytes, random)"
head -c "$BYTES" /dev/urandom >"$SRC"
SRC_SHA=$(sha256sum "$SRC" | awk '{ print $1 }')
warm_up "$SRC"

# "sec tool round wall user sys rss_kib conns reqs n503 slow_conns slow_pct status"
RESULTS=$WORK/results.txt
NOTICES=$WORK/notices.txt # "sec<TAB>notice" per stitch stderr line that is not progress
FAILS=$WORK/failures.md
: >"$RESULTS" && : >"$NOTICES" && : >"$FAILS"
declare -A failed=()

# last_serial: the connection serial of the last access-log line.
last_serial() { tail -n 1 "$ACCESS_LOG" | sed -n 's/.* conn=\([0-9]*\)$/\1/p'; }

# align PORT: makes the next connection to PORT get a serial ending in 0. A
# HEAD request shows the current serial in the access log; each connection
# opened and closed without a request then takes one serial (nginx numbers a
# connection when it accepts it, in the order of the port's listen queue).
align() {
    local p=$1 tag=align$RANDOM$RANDOM s="" i n
    (
        exec 3<>"/dev/tcp/127.0.0.1/$p" || exit 1
        printf 'HEAD /small.bin?%s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$tag" >&3
        cat <&3 >/dev/null
    ) 2>/dev/null || die "align: no answer on port $p"
    for ((i = 0; i < 50; i++)); do
        s=$(grep -F "?$tag " "$ACCESS_LOG" | sed -n 's/.* conn=\([0-9]*\)$/\1/p' | tail -n 1)
        [[ -z $s ]] || break
        sleep 0.02
    done
    [[ -n $s ]] || die "align: the request is not in the access log"
    n=$(((10 - (s + 1) % 10) % 10))
    for ((i = 0; i < n; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || die "align: cannot connect to port $p"
    done
    sleep 0.05 # let nginx accept (and close) them
}

# sha_status RC OUT: ok, timeout, exit=N, no-output, size=N or sha256-mismatch.
sha_status() {
    local rc=$1 out=$2
    if ((rc == 124)); then
        echo timeout
    elif ((rc != 0)); then
        echo "exit=$rc"
    elif [[ ! -f $out ]]; then
        echo no-output
    elif [[ $(stat -c %s "$out") != "$BYTES" ]]; then
        echo "size=$(stat -c %s "$out")"
    elif [[ $(sha256sum "$out" | awk '{ print $1 }') != "$SRC_SHA" ]]; then
        echo sha256-mismatch
    else
        echo ok
    fi
}

# clean_log LOG: the run's output without progress lines (\r-separated) or blanks.
clean_log() {
    tr '\r' '\n' <"$1" | sed -e 's/[[:space:]]*$//' | grep -v -E '^$|^ *[0-9]+% \[' || true
}

# run_one SEC TOOL ROUND
run_one() {
    local sec=$1 t=$2 r=$3 p=${port[$1]}
    local url=http://127.0.0.1:$p/$NAME dir=$OUTDIR/$1.$2.$3 log=$WORK/logs/$1.$2.$3.log
    local out n0 status stats q
    local -a cmd
    out=$dir/$t.out
    mkdir -p "$dir" # a fresh output dir per run: no .part, .stitch or .aria2 left from before
    mapfile -t cmd < <(row_cmd "$t" "$url" "$out")
    sync
    [[ $sec != uneven || $ALIGN != 1 ]] || align "$p"
    n0=$(wc -l <"$ACCESS_LOG")
    timed_run "$log" "${cmd[@]}"
    status=$(sha_status "$run_rc" "$out")
    # nginx logs a request when it ends; give aborted ones a moment.
    sleep 0.25
    # conns reqs n503 slow_conns slow_pct: distinct connections, requests, 503
    # answers, connections with a slow serial, % of the body bytes sent on them.
    stats=$(tail -n "+$((n0 + 1))" "$ACCESS_LOG" |
        awk -v f="/$NAME " -v port="port=$p" -v digits="$SLOW_DIGITS" -v uneven="$([[ $sec == uneven ]] && echo 1 || echo 0)" '
            index($0, f) && index($0, port) {
                c = $NF; sub(/^conn=/, "", c); n++
                if ($7 == 503) e++
                if (!(c in seen)) { seen[c] = 1; nc++; if (uneven && index(digits, substr(c, length(c)))) ns++ }
                b += $8; if (uneven && index(digits, substr(c, length(c)))) sb += $8
            }
            END { printf "%d %d %d %d %.1f\n", nc, n, e, ns, (b > 0) ? 100 * sb / b : 0 }')
    read -r conns reqs n503 slow slowpct <<<"$stats"
    if [[ $t == stitch ]]; then
        # Not its stdout (the path) nor "saved PATH (SIZE)"; retry delays vary, so they are blanked.
        clean_log "$log" | awk -v s="$sec" -v o="$out" '$0 != o && index($0, "saved " o " (") != 1 {
                sub(/ in [0-9.]+s$/, " in …s"); print s "\t" $0 }' >>"$NOTICES"
    fi
    if [[ $status != ok ]]; then
        failed["$sec $(row_label "$t")"]=1
        q=$(printf '%q ' "${cmd[@]}")
        {
            printf -- '- %s, %s, round %s: **%s** after %s s\n\n' "$sec" "$(row_label "$t")" "$r" "$status" "$run_wall"
            printf '  `%s`\n\n' "${q% }"
            printf '  ```\n%s\n  ```\n\n' "$(clean_log "$log" | tail -n 8 | sed 's/^/  /')"
        } >>"$FAILS"
        note "[$sec] $(row_label "$t") round $r FAILED ($status); log: $(clean_log "$log" | tail -n 3 | tr '\n' ' ')"
    else
        q=""
        [[ $sec != uneven ]] || q=", $slow slow ($slowpct% of the bytes)"
        [[ $sec != connlimit ]] || q=", $n503 × 503"
        note "[$sec] $(row_label "$t") round $r: ${run_wall}s, $conns conn / $reqs req$q"
    fi
    printf '%s %s %s %s %s %s %s %s %s %s %s %s %s\n' "$sec" "$t" "$r" "$run_wall" "$run_user" "$run_sys" "$run_rss" \
        "$conns" "$reqs" "$n503" "$slow" "$slowpct" "$status" >>"$RESULTS"
    rm -rf "$dir"
}

# run_section SEC ROUNDS: ROUNDS rounds of every client, the order rotated by one each round.
run_section() {
    local sec=$1 n=$2 r i k=${#run_rows[@]}
    for ((r = 1; r <= n; r++)); do
        for ((i = 0; i < k; i++)); do
            run_one "$sec" "${run_rows[$(((i + r - 1) % k))]}" "$r"
        done
    done
}

want_sec uneven && run_section uneven "$ROUNDS"
want_sec even && run_section even "$EVEN_ROUNDS"
want_sec connlimit && run_section connlimit "$CONNLIMIT_ROUNDS"

# ---------------------------------------------------------------- report
# summarize SEC TOOL -> "ok runs med_wall min_wall max_wall med_cpu max_rss med_conns med_reqs med_503 med_slow med_slowpct" or "none"
summarize() {
    awk -v sec="$1" -v t="$2" "$AWK_MEDIAN"'
        $1 == sec && $2 == t { runs++ }
        $1 == sec && $2 == t && $13 == "ok" {
            n++; w[n] = $4; c[n] = $5 + $6; cn[n] = $8; rq[n] = $9; e[n] = $10; sl[n] = $11; sp[n] = $12
            if ($7 > rss) rss = $7
            if (n == 1 || $4 < lo) lo = $4
            if ($4 > hi) hi = $4
        }
        END {
            if (n == 0) { print "none " runs + 0; exit }
            printf "%d %d %.3f %.3f %.3f %.2f %d %g %g %g %g %.1f\n", n, runs, median(w, n), lo, hi, median(c, n), rss,
                median(cn, n), median(rq, n), median(e, n), median(sl, n), median(sp, n)
        }' "$RESULTS"
}

verdict() { # verdict CONDITION-AWK-EXPR
    if awk "BEGIN { exit !($1) }"; then echo PASS; else echo FAIL; fi
}

declare -A wall=() mibs=()
# section_table SEC: the per-client table; fills wall[] and mibs[] (median) for SEC.
section_table() {
    local sec=$1 t s ok runs med lo hi cpu rss cn rq e sl sp extra_h="" extra_sep="" extra name
    wall=() mibs=()
    case $sec in
    uneven) extra_h=" slow conns | % bytes on slow |" extra_sep="---:|---:|" ;;
    connlimit) extra_h=" 503 answers |" extra_sep="---:|" ;;
    esac
    printf '| client | ok runs | wall s (median) | min–max s | MiB/s (median) | TCP conns | requests |%s CPU s | peak RSS MiB |\n' "$extra_h"
    printf '|---|---:|---:|---:|---:|---:|---:|%s---:|---:|\n' "$extra_sep"
    for t in "${rows[@]}"; do
        name=$(row_label "$t")
        if [[ -n ${row_skip[$t]:-} ]]; then
            printf '| %s | skipped |\n' "$name"
            continue
        fi
        s=$(summarize "$sec" "$t")
        if [[ $s == none* ]]; then
            printf '| %s | 0 of %s | FAILED |\n' "$name" "${s#none }"
            continue
        fi
        read -r ok runs med lo hi cpu rss cn rq e sl sp <<<"$s"
        wall[$t]=$med
        mibs[$t]=$(calc "printf \"%.1f\", $SIZE_MIB / $med")
        case $sec in
        uneven) extra=" $sl | $sp |" ;;
        connlimit) extra=" $e |" ;;
        *) extra="" ;;
        esac
        ((ok == runs)) || name+=" (some runs failed)"
        printf '| %s | %s of %s | %s | %s–%s | %s | %s | %s |%s %s | %s |\n' "$name" "$ok" "$runs" "$med" "$lo" "$hi" \
            "${mibs[$t]}" "$cn" "$rq" "$extra" "$cpu" "$(calc "printf \"%.1f\", $rss / 1024")"
    done
}

# speed RATIO of OTHER's median wall to stitch's: > 1 means stitch is faster.
speedup() { ratio "${wall[$2]:-}" "${wall[$1]:-}"; }

print_commands() { # SEC
    local t q
    local -a cmd
    for t in "${rows[@]}"; do
        if [[ -n ${row_skip[$t]:-} ]]; then
            printf -- '- %s: skipped: %s\n' "$(row_label "$t")" "${row_skip[$t]}"
        else
            mapfile -t cmd < <(row_cmd "$t" "http://127.0.0.1:${port[$1]}/$NAME" "$OUTDIR/$1.$t.ROUND/$t.out")
            cmd_line "$(row_label "$t")" "$t" "${cmd[@]}"
        fi
    done
}

print_notices() { # SEC: stitch's messages in that section, with counts
    local sec=$1
    [[ -n ${wall[stitch]:-} || -n ${failed["$sec $(row_label stitch)"]:-} ]] || return 0
    if ! grep -q "^$sec"$'\t' "$NOTICES"; then
        printf '\nstitch printed no messages besides its progress lines and "saved …" in this section.\n'
        return 0
    fi
    printf '\nstitch'"'"'s messages on stderr in this section (all runs, "in …s" = the delay, which varies):\n\n'
    printf '| count | message |\n|---:|---|\n'
    awk -F '\t' -v s="$sec" '$1 == s { c[$2]++ } END { for (m in c) printf "%d\t%s\n", c[m], m }' "$NOTICES" |
        sort -t $'\t' -k1,1nr -k2 | head -n 20 | while IFS=$'\t' read -r n m; do
        printf '| %s | `%s` |\n' "$n" "${m//|/\\|}"
    done
}

best_other() { # faster (smaller median wall) of axel and aria2c: prints the tool, or nothing
    local t best=""
    for t in axel aria2c; do
        [[ -n ${wall[$t]:-} ]] || continue
        if [[ -z $best ]] || awk -v a="${wall[$t]}" -v b="${wall[$best]}" 'BEGIN { exit !(a < b) }'; then
            best=$t
        fi
    done
    printf '%s\n' "$best"
}

report_uneven() {
    local b tgt r
    printf '\n## 1. Uneven link\n\n'
    printf -- '- Server: nginx `limit_rate $rate; limit_rate_after 0; sendfile_max_chunk %s;` with `map $connection $rate { "~[%s]$" %s; default %s; }`: a connection whose serial ends in %s gets %s MiB/s, every other one %s MiB/s, for its whole life (each keep-alive request again)\n' \
        "$CHUNK" "$SLOW_DIGITS" "$SLOW_RATE" "$FAST_RATE" "$(sed 's/./&, /g; s/, $//' <<<"$SLOW_DIGITS")" "$slow_mib" "$fast_mib"
    if [[ $ALIGN == 1 ]]; then
        printf -- '- Aligned: before each run, idle connections are opened and closed until the next serial ends in 0, so each client meets the same pattern: %s of the serials x0–x%s are slow. Later connections fall where they fall\n' "$first_slow" "$((CONNECTIONS - 1))"
    else
        printf -- '- Not aligned (ALIGN=0): where the pattern starts depends on how many connections came before\n'
    fi
    printf -- '- Ceiling as the issue defines it: %s × %s MiB/s = **%s MiB/s**. A client that keeps %s connections, %s of them slow, is capped at %s MiB/s; beating that means leaving slow connections for new ones\n' \
        "$CONNECTIONS" "$fast_mib" "$ceiling" "$CONNECTIONS" "$first_slow" \
        "$(calc "printf \"%.1f\", (($CONNECTIONS - $first_slow) * $fast_bps + $first_slow * $slow_bps) / 1048576")"
    printf -- '- Rounds: %s\n\n' "$ROUNDS"
    print_commands uneven
    printf '\n'
    section_table uneven
    printf '\nTargets (ratios of median wall times, **> 1 = stitch faster**):\n\n'
    if [[ -z ${wall[stitch]:-} ]]; then
        printf -- '- not measured: no successful stitch run\n'
    else
        b=$(best_other)
        if [[ -n $b ]]; then
            r=$(speedup stitch "$b")
            printf -- '- stitch vs the faster of axel and aria2c (%s, %s s): %s s / %s s = **%s** (target ≥ 1.20) → **%s**\n' \
                "$(row_label "$b")" "${wall[$b]}" "${wall[$b]}" "${wall[stitch]}" "$r" "$(verdict "$r >= 1.2")"
            for b in axel aria2c; do
                [[ -n ${wall[$b]:-} ]] || continue
                printf -- '  - vs %s alone: %s\n' "$(row_label "$b")" "$(speedup stitch "$b")"
            done
        else
            printf -- '- stitch vs the faster of axel and aria2c: not measured (neither ran)\n'
        fi
        r=$(ratio "${mibs[stitch]}" "$ceiling")
        tgt=$(calc "printf \"%.1f\", 0.75 * $ceiling")
        printf -- '- stitch vs the ceiling: %s MiB/s / %s MiB/s = **%s** (target ≥ 0.75, i.e. %s MiB/s) → **%s**\n' \
            "${mibs[stitch]}" "$ceiling" "$r" "$tgt" "$(verdict "$r >= 0.75")"
    fi
    print_notices uneven
}

report_even() {
    local r
    printf '\n## 2. Evenly capped link\n\n'
    printf -- '- Server: nginx `limit_rate %s; sendfile_max_chunk %s;` on every connection (scripts/nginx.sh'"'"'s throttled port); ceiling %s × %s = %s MiB/s\n' \
        "$FAST_RATE" "$CHUNK" "$CONNECTIONS" "$fast_mib" "$ceiling"
    printf -- '- Rounds: %s\n\n' "$EVEN_ROUNDS"
    print_commands even
    printf '\n'
    section_table even
    printf '\nTarget (ratio of median wall times, **> 1 = stitch faster**):\n\n'
    if [[ -n ${wall[stitch]:-} && -n ${wall[axel]:-} ]]; then
        r=$(speedup stitch axel)
        printf -- '- stitch vs axel -n %s: %s s / %s s = **%s** (target ≥ 0.95) → **%s**\n' "$CONNECTIONS" "${wall[axel]}" "${wall[stitch]}" "$r" "$(verdict "$r >= 0.95")"
    else
        printf -- '- stitch vs axel: not measured (a row is missing)\n'
    fi
    [[ -z ${wall[stitch]:-} || -z ${wall[aria2c]:-} ]] ||
        printf -- '- stitch vs aria2c (for reference): %s\n' "$(speedup stitch aria2c)"
    [[ -z ${mibs[stitch]:-} ]] ||
        printf -- '- stitch vs the ceiling: %s / %s = %s\n' "${mibs[stitch]}" "$ceiling" "$(ratio "${mibs[stitch]}" "$ceiling")"
    print_notices even
}

report_connlimit() {
    local ok runs s
    printf '\n## 3. Server refusing extra connections\n\n'
    printf -- '- Server: nginx `limit_conn_zone $binary_remote_addr …; limit_conn … %s; limit_conn_status 503; limit_rate %s; sendfile_max_chunk %s;`: at most %s requests in progress per address, 503 (190-byte HTML body) for the others; ceiling %s × %s = %s MiB/s\n' \
        "$CONN_LIMIT" "$FAST_RATE" "$CHUNK" "$CONN_LIMIT" "$CONN_LIMIT" "$fast_mib" "$connlimit_ceiling"
    printf -- '- Rounds: %s\n\n' "$CONNLIMIT_ROUNDS"
    print_commands connlimit
    printf '\n'
    section_table connlimit
    printf '\nTarget: every stitch run ends with the right file'
    if [[ -n ${row_skip[stitch]:-} ]]; then
        printf ': not measured (stitch skipped)\n'
    else
        s=$(summarize connlimit stitch)
        if [[ $s == none* ]]; then
            ok=0 runs=${s#none }
        else
            read -r ok runs _ <<<"$s"
        fi
        printf ': %s of %s → **%s**\n' "$ok" "$runs" "$( ((ok == runs && runs > 0)) && echo PASS || echo FAIL)"
    fi
    if [[ -n ${wall[stitch]:-} ]]; then
        printf '\n- stitch vs the ceiling: %s / %s = %s\n' "${mibs[stitch]}" "$connlimit_ceiling" "$(ratio "${mibs[stitch]}" "$connlimit_ceiling")"
        [[ -z ${wall[aria2c]:-} ]] || printf -- '- stitch vs aria2c (ratio of median wall times, > 1 = stitch faster): %s\n' "$(speedup stitch aria2c)"
        [[ -z ${wall[axel]:-} ]] || printf -- '- stitch vs axel (same): %s\n' "$(speedup stitch axel)"
    fi
    print_notices connlimit
}

{
    report_head "Stitch benchmark: uneven links (issue 10)"
    printf -- '- Source: %s (commit %s%s)\n' "$repo" "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        "$(git -C "$repo" diff --quiet HEAD -- 2>/dev/null || echo ", with uncommitted changes")"
    printf -- '- File: %s MiB (%s bytes) random, sha256 %s\n' "$SIZE_MIB" "$BYTES" "$SRC_SHA"
    printf -- '- Server: loopback nginx (scripts/nginx.sh, 1 worker, sendfile, keep-alive), plain HTTP/1.1\n'
    printf -- '- Each round runs every client once; the order rotates by one client per round (round 1: %s). Median, min and max are over the rounds\n' "${run_rows[*]}"
    printf -- '- Every run writes to a new, empty output dir (so no .part, .stitch or .aria2 file from an earlier run), deleted after it, then `sync`. Every output is checked: exit status, size and sha256 against the source\n'
    printf -- '- aria2c gets `--file-allocation=none --allow-overwrite=true --auto-file-renaming=false --check-integrity=false -j1 --no-conf` so it neither preallocates nor renames; stitch runs without `--quiet` so its messages are kept\n'
    printf -- '- MiB/s = %s MiB ÷ median wall time (process start to exit, `$EPOCHREALTIME`); CPU s = median user+sys (GNU time); TCP conns, requests = distinct connections and requests for the file in the nginx access log (median over the runs)\n' "$SIZE_MIB"
    want_sec uneven && report_uneven
    want_sec even && report_even
    want_sec connlimit && report_connlimit
    if [[ -s $FAILS ]]; then
        printf '\n## Failed runs\n\n'
        cat "$FAILS"
    fi
    printf '\n## Raw runs\n\n'
    printf '| section | client | round | wall s | user s | sys s | peak RSS KiB | TCP conns | requests | 503s | slow conns | %% bytes slow | status |\n'
    printf '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n'
    while read -r sec t r w u sy rss cn rq e sl sp status; do
        [[ $sec == uneven ]] || sl=– sp=–
        [[ $sec == connlimit ]] || e=–
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$sec" "$(row_label "$t")" "$r" "$w" "$u" "$sy" "$rss" \
            "$cn" "$rq" "$e" "$sl" "$sp" "$status"
    done <"$RESULTS"
}

bench_finish
