#!/usr/bin/env bash
# Installs the Debian packages Stitch builds and tests with (run as root). Safe to rerun.
#   build:  libcurl4-openssl-dev (HTTP transport), libssl-dev (libcrypto: checksums), libsqlite3-dev (catalog),
#           libmicrohttpd-dev + libwslay-dev (stitch serve: HTTP and WebSocket), pkg-config
#   tests:  nginx-light + openssl (loopback integration server, self-signed certificate), curl, time,
#           gcc + libc6-dev (build Tests/Shims/eintr_shim.c, the LD_PRELOAD shim of InterruptedWriteTests),
#           chromium + chromium-driver (scripts/browser.sh: the web page and a cross-site attack in headless
#           Chromium, driven by Selenium), python3-venv (Selenium and aria2p from PyPI), nodejs (the page's
#           logic tests), gdb (a test that waited in vain prints every thread's stack), iproute2 (the demo's
#           offline run brings up loopback in a network namespace of its own), python3-pyte (a terminal emulator:
#           the progress view's tests read the screen a pty shows, Tests/pty/screen.py), wget + aria2 (--adopt's
#           tests take over partials that real wget -c, curl -C - and aria2c runs leave), fuse3 + libfuse3-dev (the
#           power-cut tests' file system, Tests/PowerLoss/plfs.c, built by the tests with cc and pkg-config), man-db +
#           zsh + fish (ManualTests: the generated manual pages render, each shell reads its completion),
#           tinyproxy + microsocks (ProxyTests: downloads through a real HTTP proxy, CONNECT and SOCKS5; started by
#           the tests on loopback, the packages' own services never used), squid-openssl (SquidProxyTests: a caching
#           proxy reached over TLS, an https:// proxy with a certificate of its own CA; its service never used)
#   package: dpkg-dev (dpkg-shlibdeps) + lintian (scripts/package.sh), mmdebstrap + bubblewrap + systemd (the
#           install test's bare Debian root, the unit's sandbox, systemd-analyze)
set -euo pipefail
packages=(libcurl4-openssl-dev libssl-dev libsqlite3-dev libmicrohttpd-dev libwslay-dev pkg-config ca-certificates nginx-light openssl curl time gcc
    libc6-dev chromium chromium-driver python3-venv nodejs gdb iproute2 python3-pyte wget aria2 fuse3 libfuse3-dev man-db zsh fish
    tinyproxy microsocks squid-openssl
    dpkg-dev lintian mmdebstrap bubblewrap systemd)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "install-deps.sh: missing ${missing[*]}; run as root (or: sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
