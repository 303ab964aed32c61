#!/usr/bin/env bash
# The daemon under RPC load: `stitch serve` against `aria2c --enable-rpc`, same machine, same run.
#
# For each server, in alternating rounds: DOWNLOADS downloads run (one connection each, from a loopback nginx
# capped at RATE per connection so they stay active); their total throughput is measured unpolled for QUIET
# seconds, then for DURATION seconds while `wrk -t2 -c100` (bench/rpc.lua) alternates aria2.tellActive (the keys
# gid, status, totalLength, completedLength, downloadSpeed, connections) and aria2.getGlobalStat with the token,
# and WS_CLIENTS WebSocket clients (Python websocket-client) listen for notifications; then again for DURATION
# seconds at a fixed offered load of FIXED_RPS requests per second (each wrk connection waits before each request),
# where the two servers' latencies are compared at the same load rather than each at its own saturation.
#
# Reports per server the median and spread (min-max) of requests per second, p50 and p99 latency, errors, and
# polled/unpolled throughput; then stitch/aria2c ratios (rps: higher is better for stitch; p99: lower is).
#
#   ROUNDS=3 DOWNLOADS=50 RATE=1m QUIET=15 DURATION=60 WS_CLIENTS=20 FIXED_RPS=1000 bench/rpc.sh
#   STITCH_B=/path/to/other/stitch bench/rpc.sh     # also an A/B: a second stitch binary, stitch-b, in the same rounds
#
# Needs: wrk, aria2, nginx-light, python3 (websocket-client comes from PyPI into .build/aria2p-venv), and a
# release build (`swift build -c release`; STITCH=path overrides).
set -euo pipefail
export LC_ALL=C
prog=rpc.sh
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
bench_args "$@"
ROUNDS=${ROUNDS:-3}
DOWNLOADS=${DOWNLOADS:-50}
RATE=${RATE:-1m}
QUIET=${QUIET:-15}
DURATION=${DURATION:-60}
WS_CLIENTS=${WS_CLIENTS:-20}
FIXED_RPS=${FIXED_RPS:-1000}
need_posint ROUNDS DOWNLOADS QUIET DURATION WS_CLIENTS FIXED_RPS
need_commands wrk aria2c nginx python3
bench_invocation ROUNDS DOWNLOADS RATE QUIET DURATION WS_CLIENTS FIXED_RPS STITCH STITCH_B
STITCH=${STITCH:-$repo/.build/release/stitch}
STITCH_B=${STITCH_B:-}
[[ -x $STITCH ]] || die "no $STITCH (swift build -c release)"
[[ -z $STITCH_B || -x $STITCH_B ]] || die "STITCH_B=$STITCH_B is not an executable"
servers=(stitch aria2c)
[[ -z $STITCH_B ]] || servers=(stitch stitch-b aria2c)

# shellcheck source=scripts/aria2-venv.sh
source "$repo/scripts/aria2-venv.sh"
aria2_venv "$repo"

work=$(mktemp -d /tmp/stitch-bench-rpc.XXXXXX)
server_pid=""
cleanup() {
    [[ -z $server_pid ]] || kill "$server_pid" 2>/dev/null || true
    bash "$repo/scripts/nginx.sh" stop "$work/nginx" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
NGINX_SLOW_RATE=$RATE bash "$repo/scripts/nginx.sh" start "$work/nginx" >/dev/null
# shellcheck disable=SC1091
source "$work/nginx/ports.env"
size=$((256 << 20))
head -c "$size" /dev/urandom >"$NGINX_WWW/rpc-bench.bin"
url="http://127.0.0.1:$NGINX_SLOW_PORT/rpc-bench.bin"
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# round NAME: starts that server on a fresh folder, drives it, stops it; appends its JSON line to results.
round() {
    local name=$1 port dir
    port=$(free_port)
    dir=$work/dl-$name
    rm -rf "$dir" && mkdir -p "$dir"
    if [[ $name == stitch* ]]; then
        local binary=$STITCH
        [[ $name == stitch ]] || binary=$STITCH_B
        STITCH_RPC_SECRET=$secret "$binary" serve --dir "$dir" --rpc-listen "127.0.0.1:$port" \
            -j "$DOWNLOADS" -c 1 --max-connections-per-host "$DOWNLOADS" 2>"$work/$name.log" &
    else
        aria2c --enable-rpc --rpc-listen-port="$port" --rpc-secret="$secret" --dir="$dir" \
            --max-concurrent-downloads="$DOWNLOADS" --split=1 --max-connection-per-server=1 \
            --file-allocation=none --quiet --rpc-max-request-size=16M 2>"$work/$name.log" &
    fi
    server_pid=$!
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/jsonrpc" 2>/dev/null && break
        sleep 0.1
    done
    "$venv/bin/python" "$repo/bench/rpc_driver.py" "$name" "$port" "$secret" "$url" "$DOWNLOADS" "$QUIET" \
        "$DURATION" "$WS_CLIENTS" "$repo/bench/rpc.lua" "$FIXED_RPS" | tee -a "$work/results.jsonl"
    kill -TERM "$server_pid"
    wait "$server_pid" || true
    server_pid=""
    rm -rf "$dir"
}

# Each round starts with the next server in turn, so no server always runs first (or right after another).
for ((r = 1; r <= ROUNDS; r++)); do
    for ((i = 0; i < ${#servers[@]}; i++)); do
        round "${servers[(r - 1 + i) % ${#servers[@]}]}"
    done
done

python3 - "$work/results.jsonl" "$invocation" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
def stats(name, key):
    values = [r[key] for r in rows if r["server"] == name]
    return statistics.median(values), min(values), max(values)
names = [n for n in ("stitch", "stitch-b", "aria2c") if any(r["server"] == n for r in rows)]
print(f"\n{sys.argv[2]}  ({len(rows) // len(names)} rounds each, alternating)\n")
print("Flat out (each wrk connection sends its next request at once):\n")
print("| server | rps | p50 ms | p99 ms | errors | polled/unpolled throughput | unpolled MiB/s | downloads active |")
print("|---|---|---|---|---|---|---|---|")
for name in names:
    mine = [r for r in rows if r["server"] == name]
    ratio = [r["polled_MiBps"] / r["unpolled_MiBps"] for r in mine if r["unpolled_MiBps"] > 0]
    rps, p50, p99 = stats(name, "rps"), stats(name, "p50_ms"), stats(name, "p99_ms")
    unpolled = stats(name, "unpolled_MiBps")
    print(f"| {name} | {rps[0]:.0f} ({rps[1]:.0f}-{rps[2]:.0f}) | {p50[0]:.2f} ({p50[1]:.2f}-{p50[2]:.2f}) | "
          f"{p99[0]:.2f} ({p99[1]:.2f}-{p99[2]:.2f}) | {sum(r['errors'] for r in mine)} | "
          f"{statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f}) | {unpolled[0]:.1f} | "
          f"{min(r['active'] for r in mine)}-{max(r['active_after'] for r in mine)} |")
print("\nAt a fixed offered load (the same for both):\n")
print("| server | rps achieved | p50 ms | p99 ms | polled/unpolled throughput |")
print("|---|---|---|---|---|")
for name in names:
    mine = [r for r in rows if r["server"] == name]
    ratio = [r["fixed_polled_MiBps"] / r["unpolled_MiBps"] for r in mine if r["unpolled_MiBps"] > 0]
    rps, p50, p99 = stats(name, "fixed_rps"), stats(name, "fixed_p50_ms"), stats(name, "fixed_p99_ms")
    print(f"| {name} | {rps[0]:.0f} ({rps[1]:.0f}-{rps[2]:.0f}) | {p50[0]:.2f} ({p50[1]:.2f}-{p50[2]:.2f}) | "
          f"{p99[0]:.2f} ({p99[1]:.2f}-{p99[2]:.2f}) | "
          f"{statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f}) |")
s, a = stats("stitch", "rps")[0], stats("aria2c", "rps")[0]
ps, pa = stats("stitch", "p99_ms")[0], stats("aria2c", "p99_ms")[0]
fs, fa = stats("stitch", "fixed_p99_ms")[0], stats("aria2c", "fixed_p99_ms")[0]
print(f"\nstitch/aria2c requests per second: {s / a:.2f}x (higher is better for stitch); "
      f"p99 latency flat out: {ps / pa:.2f}x, at the fixed load: {fs / fa:.2f}x (lower is better for stitch)")
if "stitch-b" in names:
    b, pb = stats("stitch-b", "rps")[0], stats("stitch-b", "p99_ms")[0]
    print(f"stitch/stitch-b requests per second: {s / b:.2f}x; p99 latency: {ps / pb:.2f}x")
EOF
