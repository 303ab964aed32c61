"""The differences between `stitch serve` and aria2c 1.36 that Stitch makes on purpose — the one place they are listed.

Each entry: (call label glob, answer path glob) -> a one-line reason, citing where docs/rpc.md says so. replay.py
matches every difference it finds against these (fnmatch, case-sensitive); anything else is UNEXPECTED and fails
the run. Only behaviour docs/rpc.md states belongs here; an entry that matched nothing in a run is printed at the end.

Paths: `http.status`, `http.content-type`, `answer` (result vs error vs no answer), `error.code`, `result.KEY...`
(`[]` for array elements), `[id=ID].…` inside a batch, `notification GID-NAME METHOD`, `exit`.
"""

INTENDED = {}


def intend(labels, paths, reason):
    for label in [labels] if isinstance(labels, str) else labels:
        for path in [paths] if isinstance(paths, str) else paths:
            INTENDED[(label, path)] = reason


# -- getGlobalOption: aria2c's start-up options that Stitch reports as absent (docs/rpc.md option table, "shows —")
GLOBAL = "getGlobalOption*"
intend(GLOBAL, [f"result.{k}" for k in (
    "console-log-level", "deferred-input", "dscp", "enable-color", "event-poll", "help", "human-readable", "no-conf",
    "quiet", "rlimit-nofile", "show-console-readout", "socket-recv-buffer-size", "stderr", "stop", "summary-interval",
    "truncate-console-readout")],
    "option table: aria2c's console and process options, shown as absent; stitch serve's are its command line")
intend(GLOBAL, [f"result.{k}" for k in ("dht-file-path", "dht-file-path6", "peer-agent", "peer-id-prefix",
                                        "show-files")],
       "option table: BitTorrent start-up options, shown as absent; Stitch downloads over HTTP and HTTPS only")
intend(GLOBAL, [f"result.{k}" for k in ("auto-save-interval", "save-session", "save-session-interval")],
       "option table: no session file, the catalog is written at every change (aria2c here runs with --save-session)")
intend(GLOBAL, "result.ca-certificate", "option table: certificates are checked against the system's trust store")
intend(GLOBAL, "result.conf-path", "option table: conf-path shown as absent (the daemon's configuration is its "
                                   "command line, --conf-path only when given)")
intend(GLOBAL, "result.disk-cache", "option table: writes go to the page cache, made durable at checkpoints")
intend(GLOBAL, "result.max-download-result", "option table: stopped downloads stay listed until removed or purged")
intend(GLOBAL, "result.netrc-path", "option table: the daemon reads no .netrc (no-netrc fixed true)")
intend(GLOBAL, "result.server-stat-timeout", "option table: Stitch keeps no server statistics")

# -- methods
intend("addMetalink", ["http.status", "answer"],
       "Methods: addTorrent and addMetalink answer 'not supported' (aria2c takes garbage Metalink and returns [])")

# -- the envelope (docs/rpc.md Envelope table)
intend("body a number", ["http.status", "error.code"],
       "Envelope: JSON that is not a call is -32600 (HTTP 400); aria2c answers -32700 Parse error (500)")
intend("empty batch", ["http.status", "answer"],
       "Envelope: an empty batch is -32600 (JSON-RPC 2.0); aria2c answers []")
intend("call without id", ["http.status", "answer"],
       "Coming from aria2: a call without an id is a JSON-RPC notification and gets no answer (aria2c: -32600)")
intend("ws call without id", "answer",
       "Coming from aria2: a call without an id is a JSON-RPC notification and gets no answer (aria2c: -32600)")
intend("batch with a call without id", "[[]id=null[]].answer",
       "Coming from aria2: a call without an id is a notification, so a batch has no answer for it (aria2c: -32600)")

# -- options (docs/rpc.md Options)
intend(["changeOption unknown option name", "changeGlobalOption unknown option name"], ["http.status", "answer"],
       "Coming from aria2: an option name that is not aria2's is refused by name (aria2c drops it and answers OK)")
intend("changeOption AriaNg empty split", ["http.status", "answer"],
       "Options: an empty value reads as unset (back to the default); aria2c refuses '' for a number")

# -- mirrors
intend("*G*", "*uris[].status",
       "Options: the engine does not split one file across mirrors yet, so the second mirror stays 'waiting'")

# -- transport and security (docs/rpc.md Transport, Security)
intend("GET a method that changes (saveSession)", ["http.status", "answer"],
       "Coming from aria2: a GET (and JSONP) may only read; aria2c runs any method from a GET")
intend("OPTIONS preflight", ["http.status", "http.content-type", "answer"],
       "Transport/Security: a preflight is answered only with --rpc-allow-origin-all; another Origin is refused "
       "(403, saying why); aria2c answers 200 without CORS headers, which a browser refuses too")

# -- the process
intend("exit after shutdown", "exit",
       "docs/rpc.md: aria2.shutdown saves every download's state and exits 0; aria2c exits 7 (unfinished downloads)")

# -- the envelope and paths
intend("batch with a non-object element", "[[]id=null[]].answer",
       "Envelope: JSON-RPC 2.0 answers each element that is not a call with -32600 (id null); aria2c drops them")
intend("POST to another path", ["http.status", "http.content-type", "answer"],
       "Transport: a path other than /jsonrpc (and the page's) is 404 with a JSON error naming /jsonrpc; aria2c: 400, "
       "empty body")
