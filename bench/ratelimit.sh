#!/usr/bin/env bash
# Rate-limit accuracy: one file from the loopback nginx with `--limit-rate`, over several connection counts, read
# through `--json`. Each progress event is stamped as it arrives (the events come about once a second).
#
# Reports per connection count, over the rounds: the achieved rate over the 10 s window that starts one second
# after the body starts (interpolated between events), as a ratio to the limit (1.00 is exact; the goal is within
# 5 %); the lowest and highest `speed` the events showed inside the window, as ratios to the limit; and the
# largest error of the ETA the events imply (bytes left / speed) against the time the download really had left,
# in seconds. A final line checks the saved file against the source.
#
#   ROUNDS=5 LIMIT=10M bench/ratelimit.sh
#   CONNECTIONS="1 4 8 auto" SIZE_MIB=160 bench/ratelimit.sh
#
# Needs: nginx-light, python3, a release build (`swift build -c release`; STITCH=path overrides). SIZE_MIB must
# hold more than 11 s at the limit (the default 160 MiB holds 16 s at 10 MiB/s).
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh
ROUNDS=${ROUNDS:-5}
LIMIT=${LIMIT:-10M}
SIZE_MIB=${SIZE_MIB:-160}
CONNECTIONS=${CONNECTIONS:-1 2 4 8 auto}
STITCH=${STITCH:-$root/.build/release/stitch}
BENCH_TMPDIR=${BENCH_TMPDIR:-/tmp}
[[ -x $STITCH ]] || { echo "ratelimit.sh: no $STITCH (swift build -c release)" >&2; exit 1; }
bench_loopback_file ratelimit limited.bin "$SIZE_MIB"
url="http://127.0.0.1:$NGINX_HTTP_PORT/limited.bin"

python3 - "$STITCH" "$url" "$work/out" "$LIMIT" "$ROUNDS" "$src_sha" $CONNECTIONS <<'EOF'
import hashlib, json, os, re, statistics, subprocess, sys, time

stitch, url, out, limit_text, rounds, want_sha = sys.argv[1:7]
connections = sys.argv[7:]
rounds = int(rounds)
units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)", limit_text.upper())
if not m:
    sys.exit(f"ratelimit.sh: LIMIT={limit_text} is not a number with an optional K, M or G")
limit = float(m.group(1)) * units[m.group(2)]

def run(count):
    """One download; returns the events as (arrival time, object) and the end time."""
    path = os.path.join(out, "limited.bin")
    for leftover in os.listdir(out):
        os.unlink(os.path.join(out, leftover))
    args = [stitch, "get", url, "-o", path, "--limit-rate", limit_text, "--json"]
    if count != "auto":
        args += ["-c", count]
    started = time.monotonic()
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    events = []
    for line in process.stdout:
        try:
            events.append((time.monotonic(), json.loads(line)))
        except ValueError:
            pass
    ended = time.monotonic()
    if process.wait() != 0:
        sys.exit(f"ratelimit.sh: stitch exited with {process.returncode} ({count} connections)")
    return events, started, ended, path

def bytes_at(points, t):
    """Bytes at time t, interpolated between progress events."""
    for (t0, b0), (t1, b1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else b1
    return None

results = {count: [] for count in connections}
checked = False
for round in range(rounds):
    order = connections if round % 2 == 0 else list(reversed(connections))
    for count in order:
        events, started, ended, path = run(count)
        if not checked:
            with open(path, "rb") as f:
                sha = hashlib.file_digest(f, "sha256").hexdigest()
            if sha != want_sha:
                sys.exit("ratelimit.sh: the saved file differs from the source")
            checked = True
        # The body starts with the first `response` event; progress events carry bytes and speed.
        start = next((t for t, e in events if e.get("event") == "response"), started)
        progress = [(t, e) for t, e in events if e.get("event") == "progress"]
        points = [(start, 0)] + [(t, e["bytes"]) for t, e in progress] + [(ended, events[-1][1].get("bytes", 0))]
        total = max(e.get("total", 0) for _, e in progress) if progress else 0
        points[-1] = (ended, total or points[-2][1])
        w0, w1 = start + 1, start + 11
        b0, b1 = bytes_at(points, w0), bytes_at(points, w1)
        if b0 is None or b1 is None:
            sys.exit(f"ratelimit.sh: the download ended before the window closed; raise SIZE_MIB")
        achieved = (b1 - b0) / 10
        inside = [e for t, e in progress if w0 <= t <= w1]
        speeds = [e["speed"] for e in inside] or [0]
        eta_errors = [abs((total - e["bytes"]) / e["speed"] - (ended - t)) for t, e in progress
                      if e["speed"] > 0 and total and t >= w0]
        results[count].append((achieved / limit, min(speeds) / limit, max(speeds) / limit,
                               max(eta_errors) if eta_errors else float("nan")))

def stats(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"

print(f"\nLimit {limit_text} ({limit / (1 << 20):.2f} MiB/s), {rounds} rounds; median (min–max) over the rounds.\n")
print("| connections | achieved / limit, 1–11 s | lowest speed shown / limit | highest speed shown / limit | worst ETA error (s) |")
print("|---|---|---|---|---|")
for count in connections:
    rows = results[count]
    print(f"| {count} | {stats([r[0] for r in rows])} | {stats([r[1] for r in rows])} | "
          f"{stats([r[2] for r in rows])} | {stats([r[3] for r in rows])} |")
print("\nThe saved file matched the source (checked in the first run).")
EOF
