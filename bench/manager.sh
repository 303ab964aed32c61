#!/usr/bin/env bash
#
# A download manager holding many downloads: the time and peak memory to open
# its catalog and restore every download (the cost a restarted process pays
# before it can resume anything). Uses the release build of the
# stitch-manager-harness program (Tests/Harness/ManagerHarness).
#
#   bench/manager.sh                 # 10,000 downloads, 5 opens
#   COUNT=50000 REPEAT=3 bench/manager.sh
#
# Environment (all optional):
#   COUNT=10000   downloads in the catalog (added paused, in one batch)
#   REPEAT=5      opens measured (median reported)
#   HARNESS=...   the harness binary (default .build/release/stitch-manager-harness, built if missing)
#   BENCH_TMPDIR=...  where the work directory goes (default $TMPDIR or /tmp)
#   KEEP=1        keep the work directory
set -euo pipefail
export LC_ALL=C
prog=manager.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
bench_invocation COUNT REPEAT HARNESS BENCH_TMPDIR
COUNT=${COUNT:-10000}
REPEAT=${REPEAT:-5}
KEEP=${KEEP:-0}
RUN_TIMEOUT=600
need_posint COUNT REPEAT
need_commands timeout
HARNESS=${HARNESS:-$repo/.build/release/stitch-manager-harness}
if [[ ! -x $HARNESS ]]; then
    note "building: swift build -c release --product stitch-manager-harness"
    (cd "$repo" && swift build -c release --product stitch-manager-harness >&2)
fi
failed=()
bench_workdir stitch-managerbench
mkdir -p "$WORK/manager" "$WORK/downloads"

timed_run "$WORK/fill.log" "$HARNESS" --directory "$WORK/manager" --downloads "$WORK/downloads" --fill "$COUNT"
((run_rc == 0)) || die "filling the catalog failed: $(cat "$WORK/fill.log")"
fill_line=$(grep '^filled' "$WORK/fill.log")
catalog_kib=$(du -k "$WORK/manager" | awk 'END { print $1 }')

opens=() rss_max=0 restored=""
for ((run = 1; run <= REPEAT; run++)); do
    timed_run "$WORK/open.$run.log" "$HARNESS" --directory "$WORK/manager" --downloads "$WORK/downloads" --open
    ((run_rc == 0)) || { failed[open.$run]="exit=$run_rc"; continue; }
    line=$(grep '^restored [0-9]* in' "$WORK/open.$run.log")
    restored=$(awk '{ print $2 }' <<<"$line")
    [[ $restored == "$COUNT" ]] || failed[open.$run]="restored $restored of $COUNT"
    opens+=("$run_wall")
    ((run_rss > rss_max)) && rss_max=$run_rss
    note "open $run: ${run_wall}s wall, $((run_rss / 1024)) MiB ($line)"
done
((${#opens[@]})) || die "no open succeeded"
median=$(printf '%s\n' "${opens[@]}" | awk "$AWK_MEDIAN"'{ a[NR] = $1 } END { printf "%.3f", median(a, NR) }')

report_head "Download manager: open and restore $COUNT downloads"
printf -- '- Harness: `%s` (%s)\n' "$HARNESS" "release build"
printf -- '- Filling: %s (one batch); catalog on disk: %s KiB\n' "$fill_line" "$catalog_kib"
printf -- '- Opens: %s, process wall time each (start, open the catalog, restore all, list all, close, exit)\n\n' "$REPEAT"
printf '| downloads | open+restore s (median) | all runs | peak RSS MiB |\n|---:|---:|---|---:|\n'
printf '| %s | %s | %s | %.1f |\n' "$COUNT" "$median" "${opens[*]}" "$(awk -v k="$rss_max" 'BEGIN { print k / 1024 }')"
t_open=$(awk -v m="$median" 'BEGIN { print (m <= 1.0) ? "PASS" : "FAIL" }')
t_rss=$(awk -v k="$rss_max" 'BEGIN { print (k <= 64 * 1024) ? "PASS" : "FAIL" }')
printf '\nTargets: open-and-restore <= 1 s: %s s -> **%s**; RSS <= 64 MiB: %.1f MiB -> **%s**\n' \
    "$median" "$t_open" "$(awk -v k="$rss_max" 'BEGIN { print k / 1024 }')" "$t_rss"
bench_finish
