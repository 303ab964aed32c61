#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in printf formats are markdown
# Chaos soak: `stitch get -i LIST -j JOBS` on FILES downloads (some split in
# 4) against stitch-chaos-server, which injects random faults (drops, resets,
# stalls, 503 + Retry-After, ignored ranges, validator changes), while the
# stitch process is SIGKILLed and restarted at random, for DURATION seconds.
# Then the killing stops and a final run finishes the round (bounded by
# FINAL_TIMEOUT). Whenever a run finishes the whole list, the files are
# verified and a new round starts in a new, empty folder.
#
#   bench/chaos.sh                        # 10 minutes, 20 files, -j 8
#   DURATION=60 SEED=42 bench/chaos.sh    # quick check
#
# Report (markdown, stdout): downloads completed byte-exact (each file must
# equal one whole version the server served), restarts from zero with their
# reasons, lost (missing after the final run; must be 0), corrupt (matches no
# version; must be 0), and bytes fetched (server body bytes) / bytes needed.
# Exits 1 if anything was lost or corrupt (the work directory is then kept).
#
# Environment (all optional):
#   DURATION=600       seconds of killing and restarting
#   FILES=20 JOBS=8
#   KILL_MIN=0.5 KILL_MAX=5   seconds a run may live before its SIGKILL (uniform)
#   FAULT_RATE=0.15    probability that a request gets a fault
#   REPLACE_RATE=0.02  probability that a request makes the server replace the
#                      file (new content and ETag; at most MAX_VERSIONS per file)
#   MAX_VERSIONS=4
#   THROTTLE=2097152   per-response pace of the server in bytes/s (0: full speed),
#                      so a round lasts long enough to be killed mid-transfer
#   DAMAGE_RATE=0.05   probability, after each killed run, of damaging one state
#                      file (zero-filled, cut in half or garbage; replaced, as a
#                      file system would leave it) that has a previous generation
#                      beside it: the next run must fall back and still finish
#   SEED=1             seeds the server's files and faults and the kill delays
#   FINAL_TIMEOUT=300  seconds allowed for the final, unkilled run(s)
#   STITCH=...         stitch binary (default .build/release/stitch, built if missing)
#   CHAOS_SERVER=...   default .build/release/stitch-chaos-server, built if missing
#   BENCH_TMPDIR=...   where the work directory goes (default $TMPDIR or /tmp)
#   KEEP=1             keep the work directory (logs, outputs, server files)
set -euo pipefail
export LC_ALL=C
prog=chaos.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
bench_invocation DURATION FILES JOBS KILL_MIN KILL_MAX FAULT_RATE REPLACE_RATE MAX_VERSIONS THROTTLE DAMAGE_RATE SEED \
    FINAL_TIMEOUT STITCH CHAOS_SERVER BENCH_TMPDIR
DURATION=${DURATION:-600}
FILES=${FILES:-20}
JOBS=${JOBS:-8}
KILL_MIN=${KILL_MIN:-0.5}
KILL_MAX=${KILL_MAX:-5}
FAULT_RATE=${FAULT_RATE:-0.15}
REPLACE_RATE=${REPLACE_RATE:-0.02}
MAX_VERSIONS=${MAX_VERSIONS:-4}
THROTTLE=${THROTTLE:-2097152}
SEED=${SEED:-1}
FINAL_TIMEOUT=${FINAL_TIMEOUT:-300}
KEEP=${KEEP:-0}
need_posint DURATION FILES JOBS MAX_VERSIONS SEED FINAL_TIMEOUT
[[ $THROTTLE =~ ^[0-9]+$ ]] || die "THROTTLE must be a non-negative integer"
for v in KILL_MIN KILL_MAX FAULT_RATE REPLACE_RATE; do
    [[ ${!v} =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "$v must be a non-negative number"
done
kill_min_ms=$(awk -v s="$KILL_MIN" 'BEGIN { printf "%d", s * 1000 }')
kill_max_ms=$(awk -v s="$KILL_MAX" 'BEGIN { printf "%d", s * 1000 }')
((kill_min_ms >= 1 && kill_max_ms >= kill_min_ms)) || die "need 0 < KILL_MIN <= KILL_MAX"
need_commands timeout sha256sum jq
stitch_init
CHAOS_SERVER=${CHAOS_SERVER:-.build/release/stitch-chaos-server}
[[ $CHAOS_SERVER == /* ]] || CHAOS_SERVER=$repo/$CHAOS_SERVER
resolve_stitch
[[ -z $stitch_skip ]] || die "$stitch_skip"
if [[ ! -x $CHAOS_SERVER ]]; then
    note "building the server: swift build -c release --product stitch-chaos-server"
    (cd "$repo" && swift build -c release --product stitch-chaos-server >&2) || die "building stitch-chaos-server failed"
    [[ -x $CHAOS_SERVER ]] || die "$CHAOS_SERVER missing after the build"
fi

bench_workdir stitch-chaos
server=""
chaos_cleanup() {
    local rc=$?
    if [[ -n $child ]]; then
        kill -KILL "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
        child=""
    fi
    stop_server
    (exit "$rc")
    bench_cleanup
}
stop_server() {
    if [[ -n $server ]]; then
        kill -TERM "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        server=""
    fi
}
trap chaos_cleanup EXIT

SRV=$WORK/server
LOGS=$WORK/logs
mkdir -p "$SRV" "$LOGS" "$WORK/out" "$WORK/tmp"
need_space $((FILES * 24 * 2)) "FILES x up to 24 MiB, two rounds"
note "starting $CHAOS_SERVER ($FILES files, seed $SEED, fault rate $FAULT_RATE)"
"$CHAOS_SERVER" --files "$FILES" --seed "$SEED" --fault-rate "$FAULT_RATE" --replace-rate "$REPLACE_RATE" \
    --max-versions "$MAX_VERSIONS" --throttle "$THROTTLE" --port-file "$SRV/port" --dir "$SRV" \
    2>"$LOGS/server.err" &
server=$!
for _ in $(seq 600); do
    [[ -s $SRV/port ]] && break
    kill -0 "$server" 2>/dev/null || die "the server exited: $(cat "$LOGS/server.err")"
    sleep 0.1
done
[[ -s $SRV/port ]] || die "the server did not write its port file"
list=$SRV/list.txt
mapfile -t names < <(sed -n 's/^  out=//p' "$list")
((${#names[@]} == FILES)) || die "list.txt names ${#names[@]} files, expected $FILES"

RANDOM=$SEED
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

DAMAGE_RATE=${DAMAGE_RATE:-0.05}
damage_ppm=$(awk -v r="$DAMAGE_RATE" 'BEGIN { printf "%d", r * 1000000 }')
damaged=0
runs=0 kills=0 round=1 rounds_done=0
completed=0 corrupt=0 lost=0 bytes_needed=0 leftovers=0
declare -A exits=()
problems=()
out=$WORK/out/round$round

# run_stitch LOG [LIMIT_MS]: one `stitch get` over the list into $out, SIGKILLed
# after LIMIT_MS ms if given and still running. Sets run_rc (137 when killed).
run_stitch() {
    local log=$1 limit=${2:-} sleeper
    runs=$((runs + 1))
    TMPDIR=$WORK/tmp "$STITCH" get -i "$list" -j "$JOBS" -d "$out" --retries 1000 --timeout 5 --json \
        >"$log" 2>"$log.err" </dev/null &
    child=$!
    run_rc=0
    if [[ -n $limit ]]; then
        sleep "$(awk -v ms="$limit" 'BEGIN { printf "%.3f", ms / 1000 }')" &
        sleeper=$!
        wait -n "$child" "$sleeper" 2>/dev/null || true
        if kill -0 "$child" 2>/dev/null; then
            kill -KILL "$child" 2>/dev/null || true
            kills=$((kills + 1))
        fi
        kill "$sleeper" 2>/dev/null || true
        wait "$sleeper" 2>/dev/null || true
    fi
    # (2>/dev/null: no "Killed" job message from bash)
    wait "$child" 2>/dev/null || run_rc=$?
    child=""
    exits[$run_rc]=$((${exits[$run_rc]:-0} + 1))
}

# damage_a_state: with probability DAMAGE_RATE, damages one state file of the
# round that has a previous generation (DEST.stitch.prev) beside it. Replaced,
# not rewritten in place: a crash between the two renames of a checkpoint can
# leave both names on one inode for a moment, and damage to both is beyond
# what any fallback can repair (the run then refuses, keeping the partial).
damage_a_state() {
    (((RANDOM * 32768 + RANDOM) % 1000000 < damage_ppm)) || return 0
    local f size
    local -a candidates=()
    for f in "$out"/*.stitch; do
        [[ -f $f && -f $f.prev ]] && candidates+=("$f")
    done
    ((${#candidates[@]})) || return 0
    f=${candidates[RANDOM % ${#candidates[@]}]}
    size=$(stat -c %s "$f")
    case $((RANDOM % 3)) in
    0) head -c "$size" /dev/zero >"$f.damaged" ;;
    1) head -c $((size / 2)) "$f" >"$f.damaged" ;;
    *) head -c "$size" /dev/urandom >"$f.damaged" ;;
    esac
    mv -f "$f.damaged" "$f"
    damaged=$((damaged + 1))
}

# verify_round: checks every file of the round in $out against every
# version the server recorded for it. A missing file is lost. Deletes the
# round's folder when every file was fine.
verify_round() {
    local name f sum bad=$((lost + corrupt))
    for name in "${names[@]}"; do
        f=$out/$name
        if [[ ! -f $f ]]; then
            lost=$((lost + 1))
            problems+=("round $round: $name lost (missing)")
            continue
        fi
        sum=$(sha256sum <"$f")
        sum=${sum%% *}
        if grep -q "^$sum " "$SRV/versions/$name"; then
            completed=$((completed + 1))
            bytes_needed=$((bytes_needed + $(stat -c %s "$f")))
        else
            corrupt=$((corrupt + 1))
            problems+=("round $round: $name corrupt (sha256 $sum, size $(stat -c %s "$f"), matches no version)")
        fi
    done
    # Side files (.part, .stitch) left behind by completed downloads.
    leftovers=$((leftovers + $(find "$out" -type f ! -name '*.bin' | wc -l)))
    rounds_done=$((rounds_done + 1))
    # A clean round's files are not needed any more (a 10-minute run makes dozens of rounds).
    if ((lost + corrupt == bad)); then rm -rf "$out"; fi
}

t0=$(now_ms)
end=$((t0 + DURATION * 1000))
note "killing and restarting stitch for $DURATION s (work dir $WORK)"
while (($(now_ms) < end)); do
    delay=$((kill_min_ms + (RANDOM * 32768 + RANDOM) % (kill_max_ms - kill_min_ms + 1)))
    left=$((end - $(now_ms)))
    ((delay <= left)) || delay=$left
    ((delay > 0)) || break
    run_stitch "$LOGS/run-$(printf %05d $((runs + 1))).jsonl" "$delay"
    ((run_rc == 0)) || damage_a_state
    if ((run_rc == 0)); then
        note "round $round finished after $runs runs ($kills kills so far); verifying"
        verify_round
        round=$((round + 1))
        out=$WORK/out/round$round
    fi
done

note "final run(s): no more kills, at most $FINAL_TIMEOUT s"
final_end=$(($(now_ms) + FINAL_TIMEOUT * 1000))
final_rc=""
while (($(now_ms) < final_end)); do
    left_s=$(((final_end - $(now_ms) + 999) / 1000))
    run_stitch "$LOGS/run-$(printf %05d $((runs + 1)))-final.jsonl" $((left_s * 1000))
    final_rc=$run_rc
    ((run_rc == 0)) && break
done
[[ $final_rc == 0 ]] || problems+=("the final run did not finish in $FINAL_TIMEOUT s (last status $final_rc)")
verify_round
elapsed=$(awk -v a="$t0" -v b="$(now_ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }')

stop_server
stat_of() { awk -v k="$1" '$1 == k { print $2; found = 1 } END { if (!found) print 0 }' "$SRV/server-stats.txt"; }
[[ -f $SRV/server-stats.txt ]] || die "the server wrote no stats"
fetched=$(stat_of body_bytes_sent)

# Restarts from zero and their reasons: batch mode reports them as `notice`
# events "starting over: REASON" (single mode as `restart` events). Quoted
# values (ETags) and numbers are folded so equal reasons group.
reasons=$(cat "$LOGS"/run-*.jsonl | jq -rR '
    fromjson? | select(.event == "restart" or (.event == "notice" and (.message | test("starting over|restarting"))))
    | (.reason // (.message | sub("^starting over: "; "")))' |
    sed -E 's/"[^"]*"/"…"/g; s/[0-9]+/N/g' | sort | uniq -c | sort -rn)
restarts=$(printf '%s\n' "$reasons" | awk 'NF { n += $1 } END { print n + 0 }')
fallbacks=$(cat "$LOGS"/run-*.jsonl | jq -rR 'fromjson? | select(.event == "notice") | .message' |
    grep -c 'resuming from the checkpoint before it' || true)
notices=$(cat "$LOGS"/run-*.jsonl | jq -rR 'fromjson? | select(.event == "notice") | .message' |
    grep -v -E 'starting over|restarting' | sed -E 's/"[^"]*"/"…"/g; s/[0-9]+(\.[0-9]+)?/N/g; s/: .*//' |
    sort | uniq -c | sort -rn | head -n 12)
errors=$(cat "$LOGS"/run-*.jsonl | jq -rR 'fromjson? | select(.event == "error") | .message' |
    sed -E 's/"[^"]*"/"…"/g; s/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -n 12)

((lost + corrupt == 0)) || KEEP=1

report_head "Stitch chaos soak"
printf -- '- stitch: %s (`get -i LIST -j %s --retries 1000 --timeout 5 --json`)\n' "$(tool_version stitch)" "$JOBS"
printf -- '- Server: stitch-chaos-server, %s files (%s split=4), seed %s, fault rate %s, validator-change rate %s (≤ %s versions per file), throttle %s B/s per response\n' \
    "$FILES" "$(grep -c '^  split=4' "$list")" "$SEED" "$FAULT_RATE" "$REPLACE_RATE" "$MAX_VERSIONS" "$THROTTLE"
printf -- '- Kills: SIGKILL after %s–%s s for %s s, then final run(s) bounded by %s s; total %s s; state damage rate %s\n\n' \
    "$KILL_MIN" "$KILL_MAX" "$DURATION" "$FINAL_TIMEOUT" "$elapsed" "$DAMAGE_RATE"
printf '## Result\n\n| measure | value |\n|---|---:|\n'
printf '| rounds (full lists) verified | %s |\n' "$rounds_done"
printf '| downloads completed byte-exact | %s |\n' "$completed"
printf '| **lost** (missing after the final run) | **%s** |\n' "$lost"
printf '| **corrupt** (matches no served version) | **%s** |\n' "$corrupt"
printf '| restarts from zero (with a stated reason) | %s |\n' "$restarts"
printf '| stitch runs / SIGKILLs | %s / %s |\n' "$runs" "$kills"
printf '| state files damaged / resumes that fell back on the previous one | %s / %s |\n' "$damaged" "$fallbacks"
printf '| bytes fetched (server body bytes) | %s |\n' "$fetched"
printf '| bytes needed (sizes of the completed files) | %s |\n' "$bytes_needed"
printf '| fetched ÷ needed | %s |\n' "$(ratio "$fetched" "$bytes_needed")"
printf '| side files left next to completed files | %s |\n\n' "$leftovers"
printf '## Run exit statuses\n\n| status | runs |\n|---|---:|\n'
for rc in "${!exits[@]}"; do
    label=$rc
    ((rc != 137)) || label="137 (SIGKILL)"
    printf '| %s | %s |\n' "$label" "${exits[$rc]}"
done | sort -n -t'|' -k2
printf '\n## Server\n\n| counter | value |\n|---|---:|\n'
for k in requests connections fault_drop fault_reset fault_stall fault_status503 fault_ignoreRange fault_validatorChange; do
    printf '| %s | %s |\n' "$k" "$(stat_of "$k")"
done
printf '\n## Restart reasons\n\n'
if [[ -n $reasons ]]; then
    printf '| count | reason |\n|---:|---|\n'
    printf '%s\n' "$reasons" | awk 'NF { n = $1; sub(/^ *[0-9]+ /, ""); printf "| %s | %s |\n", n, $0 }'
else
    printf 'none\n'
fi
printf '\n## Other notices (top 12, text before the first colon)\n\n'
if [[ -n $notices ]]; then
    printf '| count | notice |\n|---:|---|\n'
    printf '%s\n' "$notices" | awk 'NF { n = $1; sub(/^ *[0-9]+ /, ""); printf "| %s | %s |\n", n, $0 }'
else
    printf 'none\n'
fi
if [[ -n $errors ]]; then
    printf '\n## Download errors reported (a later run resumed them)\n\n| count | message |\n|---:|---|\n'
    printf '%s\n' "$errors" | awk 'NF { n = $1; sub(/^ *[0-9]+ /, ""); printf "| %s | %s |\n", n, $0 }'
fi
if ((${#problems[@]})); then
    printf '\n## Problems\n\n'
    printf -- '- %s\n' "${problems[@]}"
    printf '\nLogs kept in `%s` (logs/, out/, server/versions/).\n' "$WORK"
fi
if ((lost + corrupt > 0)); then
    note "LOST $lost, CORRUPT $corrupt: work dir kept at $WORK"
    exit 1
fi
