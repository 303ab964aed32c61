import Stitch

enum Help {
    static let main = """
        stitch \(StitchVersion.string) — resumable, crash-safe HTTP(S) downloads

        USAGE:
          stitch get URL [options]       download URL (rerun the same command to resume)
          stitch get --resume DEST       continue the partial download saved at DEST
          stitch get URL URL… | -i FILE  several downloads at once (-j N), resumable the same way
          stitch verify DEST             check a partial download's pieces; damaged ones are fetched again
          stitch serve --dir DIR         a download daemon that aria2 clients drive (JSON-RPC, WebSocket)
          stitch add URL… | ls | pause GID | resume GID | rm GID | stats | watch
                                         drive a running 'stitch serve' (see 'stitch help client')
          stitch --version
          stitch help [get | serve | client]

        'stitch URL…' is 'stitch get URL…'; a URL without a scheme is taken as http://.
        Run 'stitch get --help' or 'stitch serve --help' for the options.
        """

    static let client = """
        USAGE: stitch add URL… [-d DIR] [-o NAME] [-c N] [--checksum ALGO=HEX] [--limit-rate RATE] [-H HEADER]
               stitch ls | stats
               stitch pause GID… | resume GID… | rm GID…
               stitch watch [GID…] [--until-idle]

        Commands for a running 'stitch serve' (or aria2c: they speak its JSON-RPC). 'add' prints each new
        download's GID; 'ls' lists every download (active, waiting, stopped); 'rm' removes a download, or the
        result of one that ended; 'watch' shows progress as 'get' does, until the GIDs given have ended (exit 0
        if all completed), until nothing is active or waiting (--until-idle), or until Ctrl-C (exit 130) — the
        downloads carry on in the daemon either way.

        OPTIONS (every command):
              --rpc-url URL         the daemon's JSON-RPC endpoint (default http://127.0.0.1:6800/jsonrpc)
              --rpc-secret-file F   the daemon's secret, read from F (never on the command line)
              --json                one JSON object per line on stdout
          -q, --quiet               no messages on stderr but errors

        Otherwise STITCH_RPC_URL and STITCH_RPC_SECRET, then the config file ($STITCH_CLIENT_CONFIG, else
        $XDG_CONFIG_HOME/stitch/client.toml, else ~/.config/stitch/client.toml) with the keys rpc-url,
        rpc-secret-file and rpc-secret, one 'key = "value"' per line.

        EXIT STATUS: 0 done; 1 the daemon refused (unknown GID, wrong secret) or a watched download failed;
        64 usage; 75 the daemon could not be reached; 130 watch interrupted.
        """

    static let get = """
        USAGE: stitch get URL [-o PATH | -d DIR] [options]
               stitch get --resume DEST [options]
               stitch get URL URL… | -i FILE [-j N] [-d DIR] [options]

        Downloads URL. Data goes to DEST.part with its state in DEST.stitch; DEST appears only when the
        file is complete and verified. After any interruption (network, Ctrl-C, kill -9, power cut) the
        same command continues where it stopped. A URL without a scheme is taken as http:// (with a note).

        OPTIONS:
          -o, --output PATH         save to PATH; '-o -' writes to standard output, in order, over one
                                    connection: a dropped connection continues (with a strong validator), but
                                    it never restarts from zero and cannot be resumed later (nothing on disk)
          -d, --dir DIR             save in DIR (created with its parents), named from Content-Disposition or
                                    the URL (default: .)
              --resume DEST         continue the download saved at DEST (URL, headers and checksum come from
                                    DEST.stitch; give TLS options again; a header given replaces the saved one)
              --checksum ALGO=HEX   verify the file (sha-256, sha-512, sha-1, md5)
          -c, --connections N       TCP connections for one file, 1-16 (default: 1 per 16 MiB, at most 4, and
                                    one when a first connection already brings 128 MiB/s; always one when the
                                    server gives no ranges or no strong validator)
              --streams             over HTTPS, carry the connections as HTTP/2 streams of one TCP connection
              --transport NAME      libcurl (the default when built with it) or urlsession (Foundation's; no -k,
                                    --ca-cert, --netrc or --streams)
              --limit-rate RATE     at most RATE bytes per second over all connections (500K, 2M, 1.5M; K = 1024)
              --retries N           give up after N failed attempts in a row that saved < 16 KiB in all (default 5)
              --timeout SECS        a transfer getting < 1 KiB in SECS seconds is retried (default 30)
              --connect-timeout SECS  time allowed to connect, TLS included (default 30)
          -H, --header 'K: V'       add a request header (repeatable)
              --ca-cert FILE        trust the certificates in FILE (PEM) instead of the system store
          -k, --insecure            do not verify TLS certificates
          -u, --user USER[:PASSWORD]
                                    HTTP Basic credentials for the URL's host only (not sent on a redirect
                                    elsewhere, never saved); without :PASSWORD it is asked for on the terminal
              --netrc, --netrc-file FILE
                                    credentials per host from ~/.netrc or FILE (-u wins for its host)
              --overwrite           replace an existing DEST, or a partial download that cannot be resumed
              --adopt               with -o FILE: take over a partial FILE that wget -c, curl -C - or aria2c
                                    left, once the server proves it (a strong validator and samples of FILE
                                    that match); else download it again and replace FILE when complete
          -i, --input-file FILE     download the URLs listed in FILE (aria2c's format: indented out=, dir=,
                                    checksum=, header=, split= lines; '-' reads stdin)
          -j, --jobs N              with several URLs or -i: downloads at once, 1-256 (default 5)
          -q, --quiet               no progress output
              --json                one JSON object per line on stdout (see docs/cli.md)
          -h, --help                this help

        EXIT STATUS:
          0 done (or already complete; with several, all of them)   1 failed   64 usage error   74 local I/O error
          75 network failures or temporary HTTP errors (408, 429, 5xx) outlasted --retries (rerun to resume)
          130 interrupted by SIGINT (state saved; rerun to resume)
          143 terminated by SIGTERM (state saved; rerun to resume)
        """

    static let verify = """
        USAGE: stitch verify DEST [--json]

        Re-reads every byte of the partial download at DEST that its state counts as durable, against the
        checksums (CRC32C) recorded as they became durable, and marks every damaged piece as not downloaded:
        the next 'stitch get' of DEST fetches only those pieces again. Finds torn or rotted writes after a crash
        without asking the server.

        EXIT STATUS: 0 no damage   1 damaged pieces found (and marked)   64 no partial download at DEST
        """

    static let serve = """
        USAGE: stitch serve --dir DIR [options]

        Runs a download daemon on DIR until SIGTERM, SIGINT or an RPC shutdown (everything is saved; exit 0).
        Clients speak aria2's JSON-RPC at /jsonrpc (POST, GET, WebSocket): aria2p, AriaNg, webui-aria2.
        Its own web page is at / (http://127.0.0.1:6800/ by default).
        After a kill -9 or a reboot, the next start on DIR has every download back in its state and order.
        The catalog lives in DIR/.stitch; nothing is written outside DIR.

        OPTIONS:
          -d, --dir DIR                  the folder to download into (required)
              --rpc-listen ADDR          listen on HOST:PORT, [V6]:PORT or a bare PORT (repeatable; default
                                         127.0.0.1:6800 and [::1]:6800); beyond loopback a secret is required
              --rpc-listen-port PORT     aria2's spelling: both loopback addresses on PORT
              --rpc-secret-file FILE     the token clients send as "token:SECRET" (or set STITCH_RPC_SECRET;
                                         never on the command line)
              --rpc-allow-origin-all     let web pages of any origin call (needs a secret)
              --rpc-allow-host NAME      accept Host: NAME (a LAN name); IP addresses and localhost always are
              --rpc-certificate FILE     serve HTTPS and WSS with this PEM certificate …
              --rpc-private-key FILE     … and this PEM key
              --rpc-max-request-size N   the largest request body or WebSocket message (default 16M)
              --rpc-max-websocket-clients N  WebSocket clients at once (default 64)
          -j, --max-concurrent-downloads N   downloads at once (default 5)
              --max-overall-download-limit RATE   all downloads together at most RATE (500K, 2M; 0: none)
              --max-connections-per-host N        connections to one host over all downloads (default 16)
          -c, --split N                  connections per download, 1-16 (default: chosen per file)
              --log FILE                 also append the log to FILE
          -v, --verbose                  log debug lines too

        EXIT STATUS: 0 stopped cleanly   1 could not start (address in use, DIR served already)
          64 usage error (or listening beyond loopback without a secret)   74 cannot create DIR
        """
}
