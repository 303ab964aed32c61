#!/usr/bin/env bash
# Runs a command with a time bound, so a hang fails its stage with what was hanging instead of running into CI's
# overall limit with nothing said.
#
#   scripts/bounded.sh SECONDS COMMAND [ARG...]
#
# The command runs in a process group of its own. Past the bound this prints the group's processes (a tree with
# each one's age and state) and every thread's stack of each test process (gdb, bounded too), then stops the
# group (SIGTERM, SIGKILL 10 s later) and exits 124, as timeout(1) does. Otherwise it exits with the command's
# status.
set -uo pipefail
if (($# < 2)) || [[ $1 == *[!0-9]* ]]; then
    echo "usage: scripts/bounded.sh SECONDS COMMAND [ARG...]" >&2
    exit 2
fi
limit=$1
shift
setsid "$@" &
pid=$!
# The group leader is the command (setsid makes it so): its group is every process it started.
stop_group() {
    kill -TERM -- "-$pid" 2>/dev/null
    for _ in $(seq 10); do
        kill -0 -- "-$pid" 2>/dev/null || return 0
        sleep 1
    done
    kill -KILL -- "-$pid" 2>/dev/null
}
# Stopped itself (CI's own limit, ^C): the command's group goes too, which setsid took out of ours.
trap 'stop_group; exit 143' TERM
trap 'stop_group; exit 130' INT
waited=0
while kill -0 "$pid" 2>/dev/null && ((waited < limit)); do
    sleep 1
    waited=$((waited + 1))
done
if kill -0 "$pid" 2>/dev/null && ((waited >= limit)); then
    echo "bounded.sh: '$*' is still running after $limit s; stopping it. Its processes:" >&2
    ps -o pid,ppid,etimes,stat,args --forest -g "$pid" >&2 || ps -eo pid,ppid,etimes,stat,args --forest >&2
    for test in $(pgrep -g "$pid" -f 'xctest|PackageTests' || true); do
        echo "bounded.sh: threads of $test:" >&2
        timeout 60 gdb -p "$test" -batch -ex 'thread apply all bt 12' 2>&1 | grep -E '^(Thread|#)' >&2 || true
    done
    stop_group
    wait "$pid" 2>/dev/null
    exit 124
fi
wait "$pid"
status=$?
# What the command left running in its group (a child it did not stop) goes with it.
stop_group
exit "$status"
