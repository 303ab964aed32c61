#!/usr/bin/env bash
# Shows stitch at work on this machine alone, no internet needed: a loopback nginx serves a 16 MiB file at 2 MiB/s,
# `stitch get` is killed with SIGKILL half-way, the same command is run again and resumes, and the result's
# SHA-256 is compared with the source's.
#
#   scripts/stitch.sh demo           # builds stitch first (and installs its Debian packages, as root)
#   STITCH=path/to/stitch scripts/demo.sh
#
# Needs nginx (nginx-light) and openssl, as the tests do. Everything happens in a temporary folder, removed at
# the end; exit status 0 only if the resumed file is byte-exact.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stitch=${STITCH:-$root/.build/release/stitch}
[[ -x $stitch ]] || { echo "demo.sh: no stitch at $stitch (run scripts/stitch.sh demo, or set STITCH)" >&2; exit 1; }
stitch=$(cd "$(dirname "$stitch")" && pwd)/$(basename "$stitch")  # the demo runs in a folder of its own
work=$(mktemp -d /tmp/stitch-demo.XXXXXX)
pid=""
cleanup() {
    [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null || true
    bash "$root/scripts/nginx.sh" stop "$work/nginx" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

say "starting a loopback web server (nginx) with a 16 MiB file, sent at 2 MiB/s"
eval "$(bash "$root/scripts/nginx.sh" start "$work/nginx" 2>/dev/null | grep -E '^NGINX_(SLOW_PORT|WWW)=')"
url="http://127.0.0.1:$NGINX_SLOW_PORT/medium.bin"
mkdir -p "$work/downloads"
cd "$work/downloads"
echo "  $url" >&2

say "stitch get $url -o demo.bin   (killed with SIGKILL after 4 MiB)"
"$stitch" get "$url" -o demo.bin &
pid=$!
for _ in $(seq 1 600); do
    written=$(stat -c %s demo.bin.part 2>/dev/null || echo 0)
    ((written >= 4 << 20)) && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
pid=""
printf '\n' >&2
echo "  killed. Left behind (no demo.bin yet: it appears only complete and verified):" >&2
ls -l "$work/downloads" | sed 's/^/    /' >&2
[[ ! -e demo.bin ]] || { echo "demo.sh: demo.bin exists after the kill" >&2; exit 1; }
[[ -s demo.bin.part ]] || { echo "demo.sh: the first run left no partial download to resume" >&2; exit 1; }

say "the same command again: it resumes where the killed one stopped"
"$stitch" get "$url" -o demo.bin

say "checking: SHA-256 of the server's file and of the download"
source_sum=$(sha256sum "$NGINX_WWW/medium.bin" | cut -d' ' -f1)
result_sum=$(sha256sum demo.bin | cut -d' ' -f1)
echo "  server:   $source_sum" >&2
echo "  download: $result_sum" >&2
if [[ $source_sum == "$result_sum" ]]; then
    echo "  identical: resumed after kill -9, byte-exact" >&2
else
    echo "demo.sh: the download differs from the source" >&2
    exit 1
fi
