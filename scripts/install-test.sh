#!/usr/bin/env bash
# The .deb on a bare Debian 12 root (run as root): scripts/install-test.sh DEB [NGINX_DIR]
#
# mmdebstrap makes a minimal bookworm root (no Swift, no build package: checked), and the package goes in with
# `apt-get install ./stitch_*.deb`, its Depends pulled from Debian's archive, so a Depends missing from the .deb
# fails here. In the root: `stitch --version`, a `stitch get` from the loopback nginx byte-exact, the manual pages
# rendered, the bash completion loaded, the unit's ExecStart run as the stitch user inside bubblewrap with the
# unit's main sandboxing (a read-only system, the write path /var/lib/stitch, a private /tmp and /dev, no new
# privileges, its own IPC and host name) answering aria2.getVersion with the secret made at install and
# downloading, `systemctl reload`'s SIGHUP applied; the unit checked by `systemd-analyze verify` inside the root and
# `security --offline=true` (exposure at most 2.0); then `dpkg -r` and `dpkg --purge` leave what they promise.
# systemd cannot run as PID 1 here, so the unit itself is not started by systemd.
set -euo pipefail
deb=$(realpath "$1")
root_dir=$(cd "$(dirname "$0")/.." && pwd)
cd "$root_dir"
for tool in mmdebstrap bwrap systemd-analyze curl; do
    command -v "$tool" >/dev/null || { echo "install-test.sh: $tool is missing" >&2; exit 1; }
done
nginx_dir=${2:-}
work=$(mktemp -d /tmp/stitch-install-test.XXXXXX)
rootfs=$work/root
serve_pid=""
cleanup() {
    [[ -z $serve_pid ]] || kill "$serve_pid" 2>/dev/null || true
    for mount in proc dev/pts dev sys; do umount -l "$rootfs/$mount" 2>/dev/null || true; done
    [[ -n ${own_nginx:-} ]] && bash scripts/nginx.sh stop "$nginx_dir" >/dev/null 2>&1 || true
    # Never into a mount that is still there (the machine's /dev and /sys are bound into the root).
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
if [[ -z $nginx_dir ]]; then
    nginx_dir=$work/nginx
    own_nginx=1
    bash scripts/nginx.sh start "$nginx_dir" >/dev/null
fi
# shellcheck disable=SC1091
source "$nginx_dir/ports.env"
step() { echo "install-test: $*"; }
fail() { echo "install-test: FAILED: $*" >&2; exit 1; }

# A bookworm root with only what any Debian has, plus systemd (for systemd-analyze verify inside it), man-db and
# bash-completion (to read what the package installs); cached for the run's later stages.
cache=.build/rootfs-bookworm.tar
if [[ ! -s $cache ]]; then
    mkdir -p .build
    rm -rf .build/rootfs-bookworm.part.tar
    mmdebstrap --quiet --variant=minbase --include=systemd,man-db,bash-completion bookworm .build/rootfs-bookworm.part.tar
    mv .build/rootfs-bookworm.part.tar "$cache"
fi
mkdir -p "$rootfs"
tar -C "$rootfs" -xf "$cache"
for package in swiftlang libcurl4-openssl-dev libssl-dev libsqlite3-dev libmicrohttpd-dev libwslay-dev gcc pkg-config; do
    if chroot "$rootfs" dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
        fail "the bare root has the build package $package"
    fi
done
[[ ! -e $rootfs/usr/bin/swift ]] || fail "the bare root has swift"
step "bare bookworm root: no Swift, no build package"
mount -t proc proc "$rootfs/proc"
mount --bind /dev "$rootfs/dev"
mount --bind /dev/pts "$rootfs/dev/pts"
mount --bind /sys "$rootfs/sys"
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
in_root() { chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 HOME=/root "$@"; }

# Install, its Depends from the archive.
cp "$deb" "$rootfs/tmp/"
in_root apt-get update -qq
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "/tmp/$(basename "$deb")" \
    >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "apt-get install ./$(basename "$deb")"; }
step "installed: $(in_root dpkg-query -W -f='${Package} ${Version} (Depends: ${Depends})' stitch)"
version=$(in_root stitch --version)
[[ $version == "stitch "*"(commit "*")" ]] || fail "stitch --version said '$version'"
step "$version"
in_root getent passwd stitch >/dev/null || fail "no stitch user"
owner=$(in_root stat -c '%U %a' /etc/stitch/rpc-secret)
[[ $owner == "stitch 600" ]] || fail "the secret is not stitch's alone: $owner"
owner=$(in_root stat -c '%U %a' /var/lib/stitch/downloads)
[[ $owner == "stitch 750" ]] || fail "/var/lib/stitch/downloads: $owner"
step "user stitch, /var/lib/stitch/downloads (0750) and a 0600 secret made"

# A download from the loopback nginx (the root shares the machine's network).
head -c 3000000 /dev/urandom >"$NGINX_WWW/install-test.bin"
in_root stitch get -q "http://127.0.0.1:$NGINX_HTTP_PORT/install-test.bin" -o /root/install-test.bin
cmp "$NGINX_WWW/install-test.bin" "$rootfs/root/install-test.bin" || fail "stitch get: the file differs"
step "stitch get: 3,000,000 bytes, byte-exact"

# The manual pages and the completion.
in_root man -P cat stitch 2>/dev/null | grep -q "stitch get" || fail "man stitch"
in_root man -P cat 8 stitch-serve 2>/dev/null | grep -q "SIGHUP" || fail "man 8 stitch-serve"
in_root bash -c 'source /usr/share/bash-completion/bash_completion; _completion_loader stitch; complete -p stitch' \
    | grep -q "_stitch" || fail "the bash completion does not load"
step "man stitch, man 8 stitch-serve render; the bash completion loads"

# The unit: verified inside the root, scored offline.
in_root systemd-analyze verify /lib/systemd/system/stitch.service /usr/lib/systemd/user/stitch.service \
    >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "systemd-analyze verify"; }
[[ ! -s $work/verify.log ]] || { cat "$work/verify.log"; fail "systemd-analyze verify printed something"; }
exposure=$(systemd-analyze security --offline=true "$rootfs/lib/systemd/system/stitch.service" 2>/dev/null \
    | sed -n 's/.*Overall exposure level for stitch.service: \([0-9.]*\).*/\1/p')
awk -v e="$exposure" 'BEGIN { exit !(e != "" && e <= 2.0) }' || fail "exposure '$exposure' is above 2.0"
step "systemd-analyze verify: clean; security --offline=true: exposure $exposure"

# The unit's ExecStart, as the stitch user, inside bubblewrap with the unit's main sandboxing; its port from the
# configuration file, as a user would set it.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo "rpc-listen-port=$port" >>"$rootfs/etc/stitch/stitch.conf"
exec_start=$(sed -n 's/^ExecStart=//p' "$rootfs/lib/systemd/system/stitch.service")
# shellcheck disable=SC2086
bwrap --ro-bind "$rootfs" / --bind "$rootfs/var/lib/stitch" /var/lib/stitch --tmpfs /tmp --dev /dev --proc /proc \
    --unshare-ipc --unshare-uts --unshare-pid --die-with-parent --new-session \
    /usr/bin/setpriv --reuid=stitch --regid=stitch --clear-groups --no-new-privs $exec_start \
    >"$work/serve.log" 2>&1 &
serve_pid=$!
secret=$(cat "$rootfs/etc/stitch/rpc-secret")
rpc() {
    curl -s --max-time 10 -H 'Content-Type: application/json' "http://127.0.0.1:$port/jsonrpc" \
        -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$1\",\"params\":[\"token:$secret\"${2:+,$2}]}"
}
for _ in $(seq 100); do
    grep -q "serving" "$work/serve.log" && break
    kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log"; fail "stitch serve ended"; }
    sleep 0.1
done
answer=$(rpc aria2.getVersion)
[[ $answer == *'"version"'* ]] || { cat "$work/serve.log"; fail "aria2.getVersion: $answer"; }
[[ $(curl -s --max-time 10 "http://127.0.0.1:$port/jsonrpc" -H 'Content-Type: application/json' \
    -d '{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion","params":["token:wrong"]}') == *'"error"'* ]] \
    || fail "a wrong secret was taken"
gid=$(rpc aria2.addUri "[\"http://127.0.0.1:$NGINX_HTTP_PORT/install-test.bin\"],{\"out\":\"served.bin\"}" \
    | sed -n 's/.*"result":"\([0-9a-f]*\)".*/\1/p')
[[ -n $gid ]] || fail "aria2.addUri"
for _ in $(seq 200); do
    [[ $(rpc aria2.tellStatus "\"$gid\",[\"status\"]") == *complete* ]] && break
    sleep 0.1
done
cmp "$NGINX_WWW/install-test.bin" "$rootfs/var/lib/stitch/downloads/served.bin" || fail "the served download differs"
[[ $(in_root stat -c %U /var/lib/stitch/downloads/served.bin) == stitch ]] || fail "served.bin is not stitch's"
# ExecReload: SIGHUP reads the file again.
echo "max-concurrent-downloads=7" >>"$rootfs/etc/stitch/stitch.conf"
daemon_pid=$(pgrep -f -n '^/usr/bin/stitch serve --dir /var/lib/stitch/downloads')
kill -HUP "$daemon_pid"
for _ in $(seq 100); do grep -q "again and applied" "$work/serve.log" && break; sleep 0.1; done
[[ $(rpc aria2.getGlobalOption) == *'"max-concurrent-downloads":"7"'* ]] || fail "the reload did not apply"
# The sandbox is in force: the system is read-only and /tmp private to the daemon.
bwrap --ro-bind "$rootfs" / --bind "$rootfs/var/lib/stitch" /var/lib/stitch --tmpfs /tmp --dev /dev --proc /proc \
    /usr/bin/setpriv --reuid=stitch --regid=stitch --clear-groups --no-new-privs /bin/sh -c \
    'touch /usr/x 2>/dev/null && exit 1; touch /var/lib/stitch/.probe && rm /var/lib/stitch/.probe' \
    || fail "the sandbox is not what the unit asks"
kill -TERM "$daemon_pid"  # as systemd stops it (bubblewrap passes the daemon's exit status on)
wait "$serve_pid" || fail "stitch serve did not stop cleanly: $(tail -3 "$work/serve.log")"
serve_pid=""
step "ExecStart as user stitch in the sandbox: getVersion with the secret, a download byte-exact, reload applied"
sed -n 's/^/install-test:   serve: /p' "$work/serve.log" | head -6

# Removal keeps everything but the program; purge removes the user, the secret, the config and the catalog, and
# keeps the downloads.
in_root dpkg -r stitch >/dev/null
[[ ! -e $rootfs/usr/bin/stitch ]] || fail "dpkg -r left the binary"
[[ -e $rootfs/etc/stitch/stitch.conf && -e $rootfs/etc/stitch/rpc-secret ]] || fail "dpkg -r removed the config"
[[ -e $rootfs/var/lib/stitch/downloads/served.bin && -d $rootfs/var/lib/stitch/downloads/.stitch ]] \
    || fail "dpkg -r removed downloads or the catalog"
in_root getent passwd stitch >/dev/null || fail "dpkg -r removed the user"
step "dpkg -r: the program gone; config, secret, catalog, downloads and user kept"
purge=$(in_root dpkg --purge stitch 2>&1)
[[ $purge == *"downloaded files are kept"* ]] || fail "dpkg --purge did not say the downloads are kept: $purge"
[[ ! -e $rootfs/etc/stitch ]] || fail "dpkg --purge left /etc/stitch: $(ls -A "$rootfs/etc/stitch")"
[[ ! -e $rootfs/var/lib/stitch/downloads/.stitch ]] || fail "dpkg --purge left the catalog"
cmp "$NGINX_WWW/install-test.bin" "$rootfs/var/lib/stitch/downloads/served.bin" || fail "dpkg --purge touched the downloads"
! in_root getent passwd stitch >/dev/null || fail "dpkg --purge left the user"
step "dpkg --purge: user, secret, config and catalog gone; the downloaded file kept (\"$(echo "$purge" | grep kept)\")"
echo "install-test: passed"
