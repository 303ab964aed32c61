#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in printf formats are markdown
# Mirrors benchmark: one file from two loopback servers at once (stitch get --mirror), each server capped as a
# whole (nginx `limit_conn 2` per client and `limit_rate` per connection: at most 2 × RATE per server), against
# one server alone with the same connection count. Not part of the test suite. See bench/README.md ("Mirrors").
#
#   bench/mirrors.sh | tee mirrors-result.md          # ~2 minutes
#   SIZE_MIB=64 ROUNDS=3 bench/mirrors.sh             # quick run
#
# Rows (every row uses -c CONNECTIONS; all run once a round, the order reversed every other round):
#   A          server A alone (its two allowed connections; the others are refused with 503 and retire)
#   A+B        server A with B as a mirror, B as fast as A (the same bytes, another ETag)
#   S          server S alone: as A, at RATE / SLOW_FACTOR per connection
#   A+S        server A with the slow S as a mirror
# Targets (issue 36): A+B ≥ 1.8 × A; A+S ≥ 0.9 × (A + S), the summed speed of the two alone.
#
# Environment:
#   SIZE_MIB=256       file size
#   RATE=20m           limit_rate per connection of A and B (nginx syntax)
#   SLOW_FACTOR=4      S's limit_rate is RATE / SLOW_FACTOR
#   CONNECTIONS=4      stitch -c
#   ROUNDS=5           alternating rounds
#   STITCH=...         stitch binary (default .build/release/stitch, built if missing)
#   BENCH_TMPDIR=...   where the work dir is created (default ${TMPDIR:-/tmp}); needs about 4 × SIZE_MIB free
#   RUN_TIMEOUT=600    seconds before one download is killed
set -euo pipefail
export LC_ALL=C

prog=bench/mirrors.sh
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
bench_args "$@"
bench_invocation SIZE_MIB RATE SLOW_FACTOR CONNECTIONS ROUNDS STITCH BENCH_TMPDIR RUN_TIMEOUT
cd "$repo"

SIZE_MIB=${SIZE_MIB:-256}
RATE=${RATE:-20m}
SLOW_FACTOR=${SLOW_FACTOR:-4}
CONNECTIONS=${CONNECTIONS:-4}
ROUNDS=${ROUNDS:-5}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
KEEP=${KEEP:-0}
need_posint SIZE_MIB SLOW_FACTOR CONNECTIONS ROUNDS RUN_TIMEOUT
[[ $RATE =~ ^([1-9][0-9]*)([kKmM]?)$ ]] || die "RATE must look like 20m or 500k (nginx size)"
rate_num=${BASH_REMATCH[1]} rate_unit=${BASH_REMATCH[2]}
((rate_num % SLOW_FACTOR == 0)) || die "RATE's number must divide by SLOW_FACTOR"
SLOW_RATE=$((rate_num / SLOW_FACTOR))$rate_unit
need_commands nginx timeout sha256sum
stitch_init
resolve_stitch
[[ -z $stitch_skip ]] || die "$stitch_skip"

bench_workdir stitch-mirrorbench
need_space $((SIZE_MIB * 4)) "set BENCH_TMPDIR or a smaller SIZE_MIB"
mkdir -p "$OUTDIR"

# Three nginx servers of their own (their own limit_conn zones): A and B at RATE, S at SLOW_RATE.
declare -A port=()
for name in A B S; do
    rate=$RATE
    [[ $name != S ]] || rate=$SLOW_RATE
    dir=$WORK/nginx-$name
    mkdir -p "$dir"
    NGINX_CONNLIMIT=2 NGINX_CONNLIMIT_RATE=$rate "$repo/scripts/nginx.sh" start "$dir" >/dev/null 2>&1
    # shellcheck disable=SC1091
    port[$name]=$(. "$dir/ports.env" && echo "$NGINX_CONNLIMIT_PORT")
done
stop_servers() { for name in A B S; do "$repo/scripts/nginx.sh" stop "$WORK/nginx-$name" >/dev/null 2>&1 || true; done; }
trap 'stop_servers; bench_cleanup' EXIT

note "creating a $SIZE_MIB MiB random file on each server"
head -c $((SIZE_MIB << 20)) /dev/urandom >"$WORK/nginx-A/www/m.bin"
for name in B S; do
    cp "$WORK/nginx-A/www/m.bin" "$WORK/nginx-$name/www/m.bin"
    # Another modification time: another ETag (nginx's is the time and the length), as between real mirrors.
    touch -d "-$((RANDOM % 1000 + 10)) minutes" "$WORK/nginx-$name/www/m.bin"
done
sha=$(sha256sum "$WORK/nginx-A/www/m.bin" | cut -d' ' -f1)
warm_up "$WORK/nginx-A/www/m.bin"

url() { printf 'http://127.0.0.1:%s/m.bin' "${port[$1]}"; }
declare -A walls=() cpus=()
failed=0
run() { # run ROW ROUND
    local row=$1 round=$2 out=$OUTDIR/m.bin log=$WORK/$1.$2.log
    local -a cmd=("$STITCH" get "$(url "${row:0:1}")" -o "$out" -c "$CONNECTIONS" --quiet)
    [[ ${#row} -lt 3 ]] || cmd+=(--mirror "$(url "${row:2:1}")")
    clean_out
    sync
    timed_run "$log" "${cmd[@]}"
    if [[ $run_rc != 0 ]] || [[ $(sha256sum "$out" 2>/dev/null | cut -d' ' -f1) != "$sha" ]]; then
        note "$row round $round FAILED (exit $run_rc): $(tail -n 3 "$log" | tr '\n' ' ')"
        failed=1
    else
        note "$row round $round: ${run_wall}s"
    fi
    walls[$row]+="$run_wall "
    cpus[$row]+="$(awk -v u="$run_user" -v s="$run_sys" 'BEGIN { printf "%.2f", u + s }') "
    clean_out
}
rounds_run "$ROUNDS" A A+B S A+S

mbs() { awk -v w="$1" -v mib="$SIZE_MIB" 'BEGIN { printf "%.1f", mib * 1048576 / w / 1e6 }'; }
echo "### Mirrors: $SIZE_MIB MiB, -c $CONNECTIONS, $ROUNDS alternating rounds ($(date -u +%F))"
echo
echo "Each server: nginx \`limit_conn 2\` per client (503 beyond) and \`limit_rate\` per connection — A and B"
echo "$RATE/s, S $SLOW_RATE/s — so at most 2 × its rate per server. The machine's limit on loopback is far above."
echo
echo "| row | wall s, median (min–max) | MB/s (median) | CPU s, median |"
echo "|---|---|---|---|"
declare -A speed=()
for row in A A+B S A+S; do
    read -r w wmin wmax <<<"$(rounds_stats "${walls[$row]}")"
    read -r c _ _ <<<"$(rounds_stats "${cpus[$row]}")"
    speed[$row]=$(mbs "$w")
    echo "| $row | $w ($wmin–$wmax) | ${speed[$row]} | $c |"
done
echo
awk -v ab="${speed[A+B]}" -v a="${speed[A]}" -v as="${speed[A+S]}" -v s="${speed[S]}" 'BEGIN {
    r1 = ab / a; r2 = as / (a + s)
    printf "- two equal mirrors vs one alone (same -c): **%.2f×** (target ≥ 1.8: %s)\n", r1, (r1 >= 1.8 ? "met" : "NOT met")
    printf "- fast + slow vs the sum of the two alone: **%.2f** (target ≥ 0.9: %s)\n", r2, (r2 >= 0.9 ? "met" : "NOT met") }'
echo
echo "Command: \`$invocation\`; stitch $(tool_version stitch)."
exit "$failed"
