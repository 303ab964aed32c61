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
        \(OptionTable(Client.commonOptions).help(column: 28))

        Otherwise STITCH_RPC_URL and STITCH_RPC_SECRET, then the config file ($STITCH_CLIENT_CONFIG, else
        $XDG_CONFIG_HOME/stitch/client.toml, else ~/.config/stitch/client.toml) with the keys rpc-url,
        rpc-secret-file and rpc-secret, one 'key = "value"' per line.

        OPTIONS (add):
        \(OptionTable(Client.addOptions).help(column: 28))

        OPTIONS (watch):
        \(OptionTable(Client.watchOptions).help(column: 28))

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
        \(GetOptions.table.help(column: 28))

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
        \(Serve.table.help(column: 33))

        EXIT STATUS: 0 stopped cleanly   1 could not start (address in use, DIR served already)
          64 usage error (or listening beyond loopback without a secret)   74 cannot create DIR
        """
}
