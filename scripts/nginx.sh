#!/usr/bin/env bash
# Loopback nginx for Stitch integration tests (and bench/run.sh, bench/segmented.sh, bench/uneven.sh).
#
#   scripts/nginx.sh start DIR   # create DIR, cert, test files, start nginx
#   scripts/nginx.sh stop DIR    # stop it (safe to call twice / if never started)
#
# `start` writes DIR/ports.env (KEY=VALUE lines, no quoting, also printed on
# stdout so `eval "$(scripts/nginx.sh start DIR)"` works):
#   NGINX_HTTP_PORT   plain HTTP/1.1
#   NGINX_HTTPS_PORT  HTTPS, HTTP/2 via ALPN (and HTTP/1.1)
#   NGINX_SLOW_PORT   plain HTTP with limit_rate (NGINX_SLOW_RATE per connection)
#   NGINX_SLOW_RATE   e.g. 2m (nginx size syntax; 2m = 2 MiB/s)
#   NGINX_CA_CERT     DIR/cert.pem, self-signed, its own CA (IP:127.0.0.1, DNS:localhost)
#   NGINX_TLS_EXPIRED_PORT     HTTPS with a certificate from that CA that expired in 2020
#   NGINX_TLS_WRONG_HOST_PORT  HTTPS with a valid certificate from that CA for DNS:wrong.example only
#   NGINX_WWW         DIR/www (document root)
#   NGINX_AUTH_USER, NGINX_AUTH_PASSWORD   HTTP Basic credentials that /auth/ on NGINX_HTTP_PORT requires (the
#                     document root again); the password has a colon, which -u must split after the user name only
#   NGINX_DIR, NGINX_PID_FILE, NGINX_ACCESS_LOG, NGINX_ERROR_LOG
# and, only when NGINX_THROTTLE_RATE is set (after the lines above):
#   NGINX_THROTTLE_PORT   plain HTTP with limit_rate NGINX_THROTTLE_RATE per request
#   NGINX_THROTTLE_RATE   the rate, as given
#   NGINX_THROTTLE_CHUNK  its sendfile_max_chunk, only when NGINX_THROTTLE_CHUNK is set
# only when NGINX_UNEVEN=1 (after those):
#   NGINX_UNEVEN_PORT         plain HTTP whose limit_rate depends on the connection: a connection whose
#                             serial number ($connection) ends in one of NGINX_UNEVEN_SLOW_DIGITS gets
#                             NGINX_UNEVEN_SLOW_RATE, every other one NGINX_UNEVEN_FAST_RATE (fixed for
#                             the connection's life, each keep-alive request gets it again)
#   NGINX_UNEVEN_SLOW_RATE, NGINX_UNEVEN_FAST_RATE, NGINX_UNEVEN_SLOW_DIGITS, NGINX_UNEVEN_CHUNK
#                             the settings, as used (defaults filled in)
# only when NGINX_CONNLIMIT is set (after those):
#   NGINX_CONNLIMIT_PORT      plain HTTP with `limit_conn` NGINX_CONNLIMIT per client address:
#                             requests beyond that many in progress at once get 503 (limit_conn_status)
#   NGINX_CONNLIMIT           that number, as given
#   NGINX_CONNLIMIT_RATE, NGINX_CONNLIMIT_CHUNK   its limit_rate and sendfile_max_chunk, only when
#                             NGINX_CONNLIMIT_RATE is set
# DIR/www holds small.bin (1 MiB random), medium.bin (16 MiB random),
# empty.bin (0 bytes) and SHA256SUMS (check with `cd DIR/www && sha256sum -c SHA256SUMS`).
# Files already present with the right size are kept (a second `start` after
# `stop` serves the same bytes).  nginx sends ETag, Last-Modified and
# Accept-Ranges: bytes for static files by default and honours Range requests.
# The access log records the Range request header and the protocol of every request,
# and the connection serial number (conn=, last field; unique with the one worker).
#
# Environment knobs (all optional):
#   NGINX=/path/to/nginx      nginx binary (default: nginx in PATH, else /usr/sbin/nginx)
#   NGINX_SLOW_RATE=2m        limit_rate for the slow port
#   NGINX_THROTTLE_RATE=20m   adds a fourth, throttled port with this limit_rate (default: none)
#   NGINX_THROTTLE_CHUNK=256k sendfile_max_chunk of that port: nginx sends up to this much
#                             per write before each pause, so it is the unthrottled burst at the
#                             start of every request (default: nginx's own, 2m)
#   NGINX_UNEVEN=1            adds the uneven port (default: none). Its knobs:
#     NGINX_UNEVEN_SLOW_RATE=2m     limit_rate of the slow connections
#     NGINX_UNEVEN_FAST_RATE=20m    limit_rate of the others
#     NGINX_UNEVEN_SLOW_DIGITS=147  last digits of $connection that make a connection slow: with 147,
#                                   3 in 10 (any 8 consecutive connections hold 2 or 3 slow ones)
#     NGINX_UNEVEN_CHUNK=256k       its sendfile_max_chunk (limit_rate_after is 0), so a request gets
#                                   at most this much before its first pause instead of nginx's 2m
#   NGINX_CONNLIMIT=2         adds the connection-limited port allowing this many concurrent requests
#                             (so connections) per client address, 503 for the rest (default: none)
#   NGINX_CONNLIMIT_RATE=20m  limit_rate per connection on that port (default: none, unthrottled)
#   NGINX_CONNLIMIT_CHUNK=256k   its sendfile_max_chunk when NGINX_CONNLIMIT_RATE is set (default 256k)
#   NGINX_START_TIMEOUT=15    seconds to wait for nginx to answer
#
# Runs as root (workers then run as root too, so a mode-700 mktemp DIR is fine)
# or as an ordinary user (no `user` directive; everything lives in DIR).
# Needs: bash, coreutils, openssl (1.1 or 3.x: `openssl ca` backdates), nginx with http_ssl + http_v2 (nginx-light).
set -euo pipefail

prog=${0##*/}
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "$prog" "$*" >&2; }
usage() {
    printf 'usage: %s start DIR | stop DIR\n' "$prog" >&2
    exit 2
}

[[ $# -eq 2 ]] || usage
cmd=$1
dir_arg=$2
[[ -n $dir_arg ]] || usage

find_nginx() {
    if [[ -n ${NGINX:-} ]]; then
        [[ -x $NGINX ]] || die "NGINX=$NGINX is not executable"
        printf '%s\n' "$NGINX"
    elif command -v nginx >/dev/null 2>&1; then
        command -v nginx
    elif [[ -x /usr/sbin/nginx ]]; then
        printf '%s\n' /usr/sbin/nginx
    else
        die "nginx not found (apt-get install nginx-light)"
    fi
}

# Prints the pid of the nginx master serving DIR, or nothing.
running_pid() {
    local dir=$1 pid cmdline
    [[ -f $dir/nginx.pid ]] || return 0
    pid=$(<"$dir/nginx.pid") || return 0
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    [[ -r /proc/$pid/cmdline ]] || return 0
    # Guard against pid reuse: the master's argv mentions our config file.
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 0
    [[ $cmdline == *nginx* && $cmdline == *"$dir/nginx.conf"* ]] || return 0
    printf '%s\n' "$pid"
}

# True while PID exists and is not a zombie (our daemonized nginx is reparented
# to PID 1, which may reap it late or never, e.g. in containers without init).
alive() {
    local state
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

do_stop() {
    local dir=$1 pid i
    pid=$(running_pid "$dir")
    if [[ -z $pid ]]; then
        rm -f "$dir/nginx.pid"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true # TERM = fast shutdown, does not wait for slow transfers
    for ((i = 0; i < 100; i++)); do
        alive "$pid" || break
        sleep 0.1
    done
    if alive "$pid"; then
        note "nginx (pid $pid) did not exit after TERM; sending KILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
    fi
    rm -f "$dir/nginx.pid"
}

# HTTP/1.0 HEAD over bash's /dev/tcp; succeeds if the port answers "HTTP/1.x 200".
http_ok() {
    local port=$1 line
    (
        exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
        printf 'HEAD /small.bin HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
        IFS= read -r -t 3 line <&3 || exit 1
        [[ $line == HTTP/1.?\ 200* ]]
    ) 2>/dev/null
}

# True if something accepts connections on 127.0.0.1:PORT.
port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Fills file $1 with $2 random bytes unless it already has that size.
make_file() {
    local path=$1 size=$2
    if [[ -f $path && $(stat -c %s "$path") == "$size" ]]; then
        return 0
    fi
    head -c "$size" /dev/urandom >"$path.tmp"
    mv -f "$path.tmp" "$path"
}

make_cert() {
    local dir=$1
    if [[ -s $dir/cert.pem && -s $dir/key.pem ]] &&
        openssl x509 -in "$dir/cert.pem" -noout -checkend 86400 >/dev/null 2>&1; then
        return 0
    fi
    # Own config file: independent of /etc/ssl/openssl.cnf. The certificate is
    # both the server certificate and the CA to pass to --ca-cert/--cacert.
    cat >"$dir/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
x509_extensions = v3
prompt = no
[dn]
CN = localhost
[v3]
basicConstraints = critical, CA:TRUE
keyUsage = critical, digitalSignature, keyEncipherment, keyCertSign
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
EOF
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 30 \
        -config "$dir/openssl.cnf" -keyout "$dir/key.pem.tmp" -out "$dir/cert.pem.tmp" \
        >"$dir/logs/openssl.log" 2>&1 ||
        { cat "$dir/logs/openssl.log" >&2; die "openssl failed to create the certificate"; }
    chmod 600 "$dir/key.pem.tmp"
    mv -f "$dir/key.pem.tmp" "$dir/key.pem"
    mv -f "$dir/cert.pem.tmp" "$dir/cert.pem"
}

# Two server certificates signed by DIR/cert.pem for the TLS failure tests: expired.pem (valid only in
# January 2020, for 127.0.0.1 and localhost) and wronghost.pem (valid now, for DNS:wrong.example only).
# Both share leafkey.pem. `openssl ca` is the one OpenSSL 3.0 command that sets a notBefore in the past.
make_leaf_certs() {
    local dir=$1 ca=$1/ca
    if [[ -s $dir/expired.pem && -s $dir/wronghost.pem && -s $dir/leafkey.pem && $dir/expired.pem -nt $dir/cert.pem ]] &&
        openssl x509 -in "$dir/wronghost.pem" -noout -checkend 86400 >/dev/null 2>&1; then
        return 0
    fi
    rm -rf "$ca" && mkdir -p "$ca" && : >"$ca/index.txt" && echo 1000 >"$ca/serial"
    cat >"$ca/ca.cnf" <<EOF
[ca]
default_ca = test
[test]
database = $ca/index.txt
serial = $ca/serial
new_certs_dir = $ca
certificate = $dir/cert.pem
private_key = $dir/key.pem
default_md = sha256
policy = any
unique_subject = no
copy_extensions = none
[any]
commonName = supplied
[expired]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
authorityKeyIdentifier = keyid
subjectAltName = IP:127.0.0.1, DNS:localhost
[wronghost]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
authorityKeyIdentifier = keyid
subjectAltName = DNS:wrong.example
EOF
    {
        openssl genrsa -out "$ca/leafkey.pem" 2048 &&
            openssl req -new -key "$ca/leafkey.pem" -subj "/CN=stitch expired test" -out "$ca/expired.csr" &&
            openssl ca -batch -config "$ca/ca.cnf" -extensions expired -startdate 20200101000000Z \
                -enddate 20200201000000Z -in "$ca/expired.csr" -out "$ca/expired.pem" &&
            openssl req -new -key "$ca/leafkey.pem" -subj "/CN=wrong.example" -out "$ca/wronghost.csr" &&
            openssl ca -batch -config "$ca/ca.cnf" -extensions wronghost -days 30 \
                -in "$ca/wronghost.csr" -out "$ca/wronghost.pem"
    } >"$dir/logs/openssl-leaf.log" 2>&1 ||
        { cat "$dir/logs/openssl-leaf.log" >&2; die "openssl failed to create the test server certificates"; }
    chmod 600 "$ca/leafkey.pem"
    mv -f "$ca/leafkey.pem" "$dir/leafkey.pem"
    mv -f "$ca/wronghost.pem" "$dir/wronghost.pem"
    mv -f "$ca/expired.pem" "$dir/expired.pem"
}

# write_conf DIR HTTP HTTPS SLOW RATE EXPIRED WRONG_HOST [THROTTLE_PORT THROTTLE_RATE [THROTTLE_CHUNK]]
write_conf() {
    local dir=$1 http=$2 https=$3 slow=$4 rate=$5 expired=$6 wronghost=$7 throttle=${8:-} trate=${9:-} tchunk=${10:-}
    local user_line=""
    if [[ $(id -u) -eq 0 ]]; then
        # Default worker user (nobody) could not read a mode-700 temp dir.
        user_line="user root;"
    fi
    cat >"$dir/nginx.conf" <<EOF
# Generated by scripts/nginx.sh; started as: nginx -p $dir -c $dir/nginx.conf
$user_line
daemon on;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;

events {
    worker_connections 512;
}

http {
    types {
        application/octet-stream bin;
        text/plain txt;
    }
    default_type application/octet-stream;

    log_format stitch '\$remote_addr [\$time_local] "\$request" \$status \$body_bytes_sent '
                      'port=\$server_port proto=\$server_protocol range="\$http_range" '
                      'if_range="\$http_if_range" ua="\$http_user_agent" rt=\$request_time conn=\$connection';
    access_log $dir/logs/access.log stitch;

    client_body_temp_path $dir/tmp/client_body;
    proxy_temp_path       $dir/tmp/proxy;
    fastcgi_temp_path     $dir/tmp/fastcgi;
    uwsgi_temp_path       $dir/tmp/uwsgi;
    scgi_temp_path        $dir/tmp/scgi;

    sendfile on;
    tcp_nopush on;
    keepalive_timeout 30s;
    server_tokens off;

    # ETag, Last-Modified and "Accept-Ranges: bytes" are nginx defaults for static files.
    etag on;

    ssl_certificate     $dir/cert.pem;
    ssl_certificate_key $dir/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;

    server {
        listen 127.0.0.1:$http;
        server_name localhost 127.0.0.1;
        root $dir/www;
        location /auth/ {
            auth_basic "stitch tests";
            auth_basic_user_file $dir/htpasswd;
            alias $dir/www/;
        }
    }

    server {
        listen 127.0.0.1:$https ssl http2;
        server_name localhost 127.0.0.1;
        root $dir/www;
    }

    server {
        listen 127.0.0.1:$slow;
        server_name localhost 127.0.0.1;
        root $dir/www;
        limit_rate $rate;
    }

    # TLS failures: an expired certificate, and one for another host name.
    server {
        listen 127.0.0.1:$expired ssl;
        server_name localhost 127.0.0.1;
        root $dir/www;
        ssl_certificate     $dir/expired.pem;
        ssl_certificate_key $dir/leafkey.pem;
    }

    server {
        listen 127.0.0.1:$wronghost ssl;
        server_name localhost 127.0.0.1;
        root $dir/www;
        ssl_certificate     $dir/wronghost.pem;
        ssl_certificate_key $dir/leafkey.pem;
    }
EOF
    if [[ -n $throttle ]]; then
        cat >>"$dir/nginx.conf" <<EOF

    # limit_rate applies to each request (so to each connection of a segmented client).
    server {
        listen 127.0.0.1:$throttle;
        server_name localhost 127.0.0.1;
        root $dir/www;
        limit_rate $trate;${tchunk:+
        sendfile_max_chunk $tchunk;}
    }
EOF
    fi
}

# write_uneven_conf DIR PORT SLOW_RATE FAST_RATE SLOW_DIGITS CHUNK: appends the uneven port.
write_uneven_conf() {
    cat >>"$1/nginx.conf" <<EOF

    # Uneven link: the rate is chosen per connection, by the last digit of its serial number.
    map \$connection \$stitch_uneven_rate {
        "~[$5]\$" $3;
        default $4;
    }

    server {
        listen 127.0.0.1:$2;
        server_name localhost 127.0.0.1;
        root $1/www;
        limit_rate \$stitch_uneven_rate;
        limit_rate_after 0;
        sendfile_max_chunk $6;
    }
EOF
}

# write_connlimit_conf DIR PORT N [RATE CHUNK]: appends the connection-limited port.
write_connlimit_conf() {
    cat >>"$1/nginx.conf" <<EOF

    # At most N requests in progress per client address; the rest get 503.
    limit_conn_zone \$binary_remote_addr zone=stitch_connlimit:1m;

    server {
        listen 127.0.0.1:$2;
        server_name localhost 127.0.0.1;
        root $1/www;
        limit_conn stitch_connlimit $3;
        limit_conn_status 503;${4:+
        limit_rate $4;
        sendfile_max_chunk $5;}
    }
EOF
}

# N (default 3) distinct random ports below Linux's default ephemeral range
# (32768-60999) that nobody is listening on right now, on one line.
pick_ports() {
    local n=${1:-3} p tries=0
    local -a ports=()
    while ((${#ports[@]} < n)); do
        ((++tries < 1000)) || die "could not find free ports"
        p=$((20000 + RANDOM % 12000))
        [[ " ${ports[*]-} " == *" $p "* ]] && continue
        port_busy "$p" && continue
        ports+=("$p")
    done
    printf '%s\n' "${ports[*]}"
}

# The NGINX_THROTTLE_* settings lines of ports.env (not the port) for RATE [CHUNK].
throttle_env() {
    [[ -z $1 ]] || printf 'NGINX_THROTTLE_RATE=%s\n' "$1"
    [[ -z ${2:-} ]] || printf 'NGINX_THROTTLE_CHUNK=%s\n' "$2"
}

# The NGINX_UNEVEN_* settings lines of ports.env (not the port) for SLOW FAST DIGITS CHUNK.
uneven_env() {
    printf 'NGINX_UNEVEN_SLOW_RATE=%s\nNGINX_UNEVEN_FAST_RATE=%s\nNGINX_UNEVEN_SLOW_DIGITS=%s\nNGINX_UNEVEN_CHUNK=%s\n' "$@"
}

# The NGINX_CONNLIMIT settings lines of ports.env (not the port) for N [RATE CHUNK].
connlimit_env() {
    printf 'NGINX_CONNLIMIT=%s\n' "$1"
    [[ -z ${2:-} ]] || printf 'NGINX_CONNLIMIT_RATE=%s\nNGINX_CONNLIMIT_CHUNK=%s\n' "$2" "$3"
}

# True when the nginx for DIR answers on every port: DIR HTTP HTTPS SLOW EXPIRED WRONG_HOST [EXTRA...],
# EXTRA being the optional plain-HTTP ports in use (throttled, uneven, connection-limited).
all_answer() {
    local p
    [[ -n $(running_pid "$1") ]] && http_ok "$2" && http_ok "$4" && port_busy "$3" && port_busy "$5" &&
        port_busy "$6" || return 1
    for p in "${@:7}"; do
        http_ok "$p" || return 1
    done
}

# The credentials /auth/ requires (fixed: tests read them from ports.env).
auth_user=stitch
auth_password='pa:ss-w0rd'

do_start() {
    local dir=$1 nginx rate timeout pid attempt http https slow i ok
    local trate tchunk throttle="" expired wronghost nports=5
    local uneven_on uslow ufast udigits uchunk uneven=""
    local climit crate cchunk connlimit=""
    local -a ports extra=()
    nginx=$(find_nginx)
    rate=${NGINX_SLOW_RATE:-2m}
    [[ $rate =~ ^[0-9]+[kKmMgG]?$ ]] || die "bad NGINX_SLOW_RATE=$rate (want e.g. 2m, 500k)"
    trate=${NGINX_THROTTLE_RATE:-}
    tchunk=${NGINX_THROTTLE_CHUNK:-}
    if [[ -n $trate ]]; then
        [[ $trate =~ ^[0-9]+[kKmMgG]?$ ]] || die "bad NGINX_THROTTLE_RATE=$trate (want e.g. 20m, 500k)"
        nports=$((nports + 1))
    fi
    if [[ -n $tchunk ]]; then
        [[ -n $trate ]] || die "NGINX_THROTTLE_CHUNK needs NGINX_THROTTLE_RATE"
        [[ $tchunk =~ ^[1-9][0-9]*[kKmMgG]?$ ]] || die "bad NGINX_THROTTLE_CHUNK=$tchunk (want e.g. 256k)"
    fi
    uneven_on=${NGINX_UNEVEN:-}
    [[ -z $uneven_on || $uneven_on == [01] ]] || die "bad NGINX_UNEVEN=$uneven_on (want 1 or 0)"
    [[ $uneven_on == 1 ]] || uneven_on=""
    uslow=${NGINX_UNEVEN_SLOW_RATE:-2m}
    ufast=${NGINX_UNEVEN_FAST_RATE:-20m}
    udigits=${NGINX_UNEVEN_SLOW_DIGITS:-147}
    uchunk=${NGINX_UNEVEN_CHUNK:-256k}
    if [[ -n $uneven_on ]]; then
        [[ $uslow =~ ^[1-9][0-9]*[kKmMgG]?$ ]] || die "bad NGINX_UNEVEN_SLOW_RATE=$uslow (want e.g. 2m, 500k)"
        [[ $ufast =~ ^[1-9][0-9]*[kKmMgG]?$ ]] || die "bad NGINX_UNEVEN_FAST_RATE=$ufast (want e.g. 20m)"
        [[ $udigits =~ ^[0-9]{1,10}$ ]] || die "bad NGINX_UNEVEN_SLOW_DIGITS=$udigits (want last digits, e.g. 147)"
        [[ $uchunk =~ ^[1-9][0-9]*[kKmMgG]?$ ]] || die "bad NGINX_UNEVEN_CHUNK=$uchunk (want e.g. 256k)"
        nports=$((nports + 1))
    fi
    climit=${NGINX_CONNLIMIT:-}
    crate=${NGINX_CONNLIMIT_RATE:-}
    cchunk=""
    if [[ -n $climit ]]; then
        [[ $climit =~ ^[1-9][0-9]*$ ]] || die "bad NGINX_CONNLIMIT=$climit (want a positive integer)"
        nports=$((nports + 1))
    fi
    if [[ -n $crate ]]; then
        [[ -n $climit ]] || die "NGINX_CONNLIMIT_RATE needs NGINX_CONNLIMIT"
        [[ $crate =~ ^[1-9][0-9]*[kKmMgG]?$ ]] || die "bad NGINX_CONNLIMIT_RATE=$crate (want e.g. 20m)"
        cchunk=${NGINX_CONNLIMIT_CHUNK:-256k}
        [[ $cchunk =~ ^[1-9][0-9]*[kKmMgG]?$ ]] || die "bad NGINX_CONNLIMIT_CHUNK=$cchunk (want e.g. 256k)"
    elif [[ -n ${NGINX_CONNLIMIT_CHUNK:-} ]]; then
        die "NGINX_CONNLIMIT_CHUNK needs NGINX_CONNLIMIT_RATE"
    fi
    timeout=${NGINX_START_TIMEOUT:-15}

    # Already running for this DIR and answering? Then start is a no-op.
    pid=$(running_pid "$dir")
    if [[ -n $pid && -f $dir/ports.env ]]; then
        http=$(sed -n 's/^NGINX_HTTP_PORT=//p' "$dir/ports.env")
        # An older ports.env (no TLS failure ports) means an nginx started by an older script.
        if [[ -n $http ]] && http_ok "$http" && grep -q '^NGINX_TLS_WRONG_HOST_PORT=' "$dir/ports.env" &&
            grep -q '^NGINX_AUTH_USER=' "$dir/ports.env"; then
            # An optional port asked for with other settings (or missing) needs a restart.
            if [[ (-z $trate || $(grep -E '^NGINX_THROTTLE_(RATE|CHUNK)=' "$dir/ports.env") == "$(throttle_env "$trate" "$tchunk")") &&
                (-z $uneven_on || $(grep -E '^NGINX_UNEVEN_(SLOW_RATE|FAST_RATE|SLOW_DIGITS|CHUNK)=' "$dir/ports.env") == "$(uneven_env "$uslow" "$ufast" "$udigits" "$uchunk")") &&
                (-z $climit || $(grep -E '^NGINX_CONNLIMIT(_RATE|_CHUNK)?=' "$dir/ports.env") == "$(connlimit_env "$climit" "$crate" "$cchunk")") ]]; then
                note "nginx already running for $dir (pid $pid)"
                cat "$dir/ports.env"
                return 0
            fi
            note "nginx running for $dir (pid $pid) has other throttle, uneven or connection-limit settings; restarting it"
        fi
    fi
    [[ -z $pid ]] || do_stop "$dir"

    command -v openssl >/dev/null 2>&1 || die "openssl not found (apt-get install openssl)"
    mkdir -p "$dir/www" "$dir/logs" "$dir/tmp"

    make_cert "$dir"
    make_leaf_certs "$dir"
    printf '%s:%s\n' "$auth_user" "$(openssl passwd -apr1 "$auth_password")" >"$dir/htpasswd"
    make_file "$dir/www/small.bin" $((1 << 20))
    make_file "$dir/www/medium.bin" $((16 << 20))
    : >"$dir/www/empty.bin.tmp" && mv -f "$dir/www/empty.bin.tmp" "$dir/www/empty.bin"
    (cd "$dir/www" && sha256sum small.bin medium.bin empty.bin >SHA256SUMS.tmp && mv -f SHA256SUMS.tmp SHA256SUMS)

    ok=""
    for ((attempt = 1; attempt <= 8; attempt++)); do
        read -r -a ports < <(pick_ports "$nports")
        http=${ports[0]} https=${ports[1]} slow=${ports[2]} expired=${ports[3]} wronghost=${ports[4]}
        ports=("${ports[@]:5}")
        extra=()
        throttle="" uneven="" connlimit=""
        if [[ -n $trate ]]; then throttle=${ports[0]} && ports=("${ports[@]:1}") && extra+=("$throttle"); fi
        if [[ -n $uneven_on ]]; then uneven=${ports[0]} && ports=("${ports[@]:1}") && extra+=("$uneven"); fi
        if [[ -n $climit ]]; then connlimit=${ports[0]} && extra+=("$connlimit"); fi
        write_conf "$dir" "$http" "$https" "$slow" "$rate" "$expired" "$wronghost" "$throttle" "$trate" "$tchunk"
        [[ -z $uneven ]] || write_uneven_conf "$dir" "$uneven" "$uslow" "$ufast" "$udigits" "$uchunk"
        [[ -z $connlimit ]] || write_connlimit_conf "$dir" "$connlimit" "$climit" "$crate" "$cchunk"
        printf '}\n' >>"$dir/nginx.conf"
        rm -f "$dir/nginx.pid"
        : >"$dir/logs/start.log"
        # nginx binds all listen sockets before daemonizing, so a zero exit
        # means the ports are ours. A bind race with another process makes
        # it fail ("Address already in use") and we retry with new ports.
        if "$nginx" -p "$dir" -c "$dir/nginx.conf" -e "$dir/logs/error.log" \
            >"$dir/logs/start.log" 2>&1; then
            ok=1
            break
        fi
        if grep -q 'Address already in use' "$dir/logs/start.log" "$dir/logs/error.log" 2>/dev/null; then
            note "port collision (attempt $attempt), retrying with other ports"
            : >"$dir/logs/error.log"
            continue
        fi
        cat "$dir/logs/start.log" >&2
        tail -n 20 "$dir/logs/error.log" >&2 2>/dev/null || true
        die "nginx failed to start (config: $dir/nginx.conf)"
    done
    [[ -n $ok ]] || die "nginx failed to start: ports kept colliding"

    # Wait until the master wrote its pid and every port answers.
    for ((i = 0; i < timeout * 10; i++)); do
        if all_answer "$dir" "$http" "$https" "$slow" "$expired" "$wronghost" "${extra[@]}"; then
            break
        fi
        sleep 0.1
    done
    if ! all_answer "$dir" "$http" "$https" "$slow" "$expired" "$wronghost" "${extra[@]}"; then
        tail -n 20 "$dir/logs/error.log" >&2 2>/dev/null || true
        do_stop "$dir"
        i=$(IFS=/ && printf '%s' "${extra[*]}")
        die "nginx did not answer on 127.0.0.1:$http/$https/$slow${i:+/$i} within ${timeout}s"
    fi

    cat >"$dir/ports.env.tmp" <<EOF
NGINX_HTTP_PORT=$http
NGINX_HTTPS_PORT=$https
NGINX_SLOW_PORT=$slow
NGINX_SLOW_RATE=$rate
NGINX_CA_CERT=$dir/cert.pem
NGINX_TLS_EXPIRED_PORT=$expired
NGINX_TLS_WRONG_HOST_PORT=$wronghost
NGINX_WWW=$dir/www
NGINX_AUTH_USER=$auth_user
NGINX_AUTH_PASSWORD=$auth_password
NGINX_DIR=$dir
NGINX_PID_FILE=$dir/nginx.pid
NGINX_ACCESS_LOG=$dir/logs/access.log
NGINX_ERROR_LOG=$dir/logs/error.log
EOF
    if [[ -n $throttle ]]; then
        { printf 'NGINX_THROTTLE_PORT=%s\n' "$throttle" && throttle_env "$trate" "$tchunk"; } >>"$dir/ports.env.tmp"
    fi
    if [[ -n $uneven ]]; then
        { printf 'NGINX_UNEVEN_PORT=%s\n' "$uneven" && uneven_env "$uslow" "$ufast" "$udigits" "$uchunk"; } >>"$dir/ports.env.tmp"
    fi
    if [[ -n $connlimit ]]; then
        { printf 'NGINX_CONNLIMIT_PORT=%s\n' "$connlimit" && connlimit_env "$climit" "$crate" "$cchunk"; } >>"$dir/ports.env.tmp"
    fi
    mv -f "$dir/ports.env.tmp" "$dir/ports.env"
    note "nginx running (pid $(running_pid "$dir")): http=$http https+h2=$https slow($rate/s)=$slow${throttle:+ throttled($trate/s${tchunk:+, chunk $tchunk})=$throttle}${uneven:+ uneven($uslow/s on conn serials ending in [$udigits], else $ufast/s, chunk $uchunk)=$uneven}${connlimit:+ connlimit($climit per address, 503${crate:+, $crate/s, chunk $cchunk})=$connlimit} www=$dir/www"
    cat "$dir/ports.env"
}

case $cmd in
start)
    mkdir -p "$dir_arg" || die "cannot create $dir_arg"
    dir=$(cd "$dir_arg" && pwd -P)
    # ports.env is read by non-shell parsers too, so values stay unquoted.
    [[ $dir =~ ^[A-Za-z0-9/._+@,:-]+$ ]] ||
        die "DIR must be a path without spaces or shell metacharacters: $dir"
    do_start "$dir"
    ;;
stop)
    if [[ ! -d $dir_arg ]]; then
        exit 0
    fi
    dir=$(cd "$dir_arg" && pwd -P)
    do_stop "$dir"
    ;;
*)
    usage
    ;;
esac
