// Every option of aria2c 1.36 (a Debian build: BitTorrent, Metalink, async DNS, TLS) and how Stitch treats it.
// docs/rpc.md's option table is this table (Aria2OptionTableTests keeps the two the same).

/// One of aria2's options as Stitch takes it: where aria2 has it, what kind of value it takes (aria2's ranges and
/// choices: a value outside them is malformed, as in aria2), what Stitch does with it, and what Stitch reports for
/// it when no download or setting of its own gives the value.
struct Aria2Option: Sendable {
    /// Where aria2 has the option.
    enum Scope: Sendable, Equatable {
        /// A download's option (aria2's *initial* options): `addUri`, `getOption`, `changeOption`, and in the
        /// global options the default for new downloads.
        case download
        /// The daemon's alone (`getGlobalOption`, `changeGlobalOption`).
        case global
        /// Set when aria2c starts: reported by `getGlobalOption`, changed by nothing.
        case startup
    }

    /// The value aria2 takes: a value of another shape is malformed (aria2's error, code 1).
    enum Kind: Sendable, Equatable {
        case bool
        case number(ClosedRange<Int64>)
        /// Bytes, with aria2's `K` and `M` (1024-based) taken.
        case size(ClosedRange<Int64>)
        case choice([String])
        /// A digest as `TYPE=HEX`.
        case checksum
        /// Lines (aria2's cumulative `header`): a string of lines or an array of them.
        case lines
        case text
    }

    /// What Stitch does with the option.
    enum Handling: Sendable, Equatable {
        /// Done as aria2 does: applied when a download is added, when it is changed, and globally as the default
        /// for new downloads (or the daemon's own setting).
        case applied
        /// Applied when a download is added; on a download that exists, a different value is refused.
        case addOnly
        /// Taken and changes nothing (the reason says why nothing is lost).
        case ignored
        /// Stitch does one thing, the value it reports; any other value is refused.
        case fixed
    }

    /// What Stitch reports for the option.
    enum Shown: Sendable, Equatable {
        /// Nothing: the option is absent from `getOption` and `getGlobalOption` (aria2 leaves out the options
        /// that are unset too). A value given for it equals "" (unset).
        case none
        /// This value, always.
        case value(String)
        /// The download's or the daemon's value, read when asked (``Aria2RPC``'s option values).
        case computed
    }

    let name: String
    let scope: Scope
    let kind: Kind
    let handling: Handling
    let shown: Shown
    /// Why Stitch does what it does (docs/rpc.md).
    let why: String

    init(_ name: String, _ scope: Scope, _ kind: Kind, _ handling: Handling, _ shown: Shown, _ why: String) {
        self.name = name
        self.scope = scope
        self.kind = kind
        self.handling = handling
        self.shown = shown
        self.why = why
    }

    /// The options by name.
    static let named: [String: Aria2Option] = Dictionary(uniqueKeysWithValues: table.map { ($0.name, $0) })

    /// aria2c 1.36's options, sorted by name.
    static let table: [Aria2Option] = [
        Aria2Option(
            "all-proxy", .download, .text, .applied, .computed,
            "the proxy for every URL without one of its own (http://, https://, socks5://, socks5h://; credentials in the URL are moved to all-proxy-user and all-proxy-passwd)"),
        Aria2Option(
            "all-proxy-passwd", .download, .text, .applied, .computed,
            "all-proxy's password; kept in memory only (not in the catalog), shown as (hidden)"),
        Aria2Option(
            "all-proxy-user", .download, .text, .applied, .computed,
            "all-proxy's user name"),
        Aria2Option(
            "allow-overwrite", .download, .bool, .addOnly, .computed,
            "replace a file at the destination that Stitch did not leave; set when the download is added"),
        Aria2Option(
            "allow-piece-length-change", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "always-resume", .download, .bool, .fixed, .value("false"),
            "a resume that cannot be proven starts over from zero, said plainly; Stitch never fails a "
                + "download for it"),
        Aria2Option(
            "async-dns", .download, .bool, .ignored, .value("true"),
            "names are resolved off the transfer's thread already"),
        Aria2Option(
            "async-dns-server", .startup, .text, .ignored, .none,
            "names are resolved by the system's resolver"),
        Aria2Option(
            "auto-file-renaming", .download, .bool, .fixed, .value("true"),
            "a name taken in the folder becomes NAME.1.EXT, NAME.2.EXT, …"),
        Aria2Option(
            "auto-save-interval", .startup, .number(0...600), .ignored, .none,
            "every change is saved when it is made"),
        Aria2Option(
            "bt-detach-seed-only", .startup, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-enable-hook-after-hash-check", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-enable-lpd", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-exclude-tracker", .download, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-external-ip", .download, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-force-encryption", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-hash-check-seed", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("bt-keep-alive-interval", .startup, .number(1...120), .ignored, .none, "hidden in aria2c too"),
        Aria2Option(
            "bt-load-saved-metadata", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-lpd-interface", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-max-open-files", .global, .number(1...Int64.max), .ignored, .value("100"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-max-peers", .download, .number(0...Int64.max), .ignored, .value("55"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-metadata-only", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-min-crypto-level", .download, .choice(["plain", "arc4"]), .ignored, .value("plain"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-prioritize-piece", .download, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-remove-unselected-file", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-request-peer-speed-limit", .download, .size(0...Int64.max), .ignored, .value("51200"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("bt-request-timeout", .startup, .number(1...600), .ignored, .none, "hidden in aria2c too"),
        Aria2Option(
            "bt-require-crypto", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-save-metadata", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-seed-unverified", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-stop-timeout", .download, .number(0...Int64.max), .ignored, .value("0"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("bt-timeout", .startup, .number(1...600), .ignored, .none, "hidden in aria2c too"),
        Aria2Option(
            "bt-tracker", .download, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-tracker-connect-timeout", .download, .number(1...600), .ignored, .value("60"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-tracker-interval", .download, .number(0...Int64.max), .ignored, .value("0"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "bt-tracker-timeout", .download, .number(1...600), .ignored, .value("60"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "ca-certificate", .startup, .text, .fixed, .none,
            "certificates are checked against the system's trust store"),
        Aria2Option("certificate", .startup, .text, .fixed, .none, "client certificates are not supported"),
        Aria2Option("check-certificate", .startup, .bool, .fixed, .value("true"), "certificates are always checked"),
        Aria2Option(
            "check-integrity", .download, .bool, .ignored, .value("true"),
            "a partial's pieces are checked (CRC-32C) before it is resumed, and a given checksum before the "
                + "file is renamed into place"),
        Aria2Option(
            "checksum", .download, .checksum, .addOnly, .computed,
            "checked before the file is renamed into place; set when the download is added"),
        Aria2Option(
            "conditional-get", .download, .bool, .addOnly, .computed,
            "fetch only when the server's file is newer than the one at the destination (If-None-Match with the "
                + "ETag it came with, If-Modified-Since); set when the download is added"),
        Aria2Option("conf-path", .startup, .text, .fixed, .none, "the daemon's configuration is its command line"),
        Aria2Option("connect-timeout", .download, .number(1...600), .applied, .computed, "seconds allowed to connect"),
        Aria2Option(
            "console-log-level", .startup, .choice(["debug", "info", "notice", "warn", "error"]), .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "content-disposition-default-utf8", .download, .bool, .ignored, .value("false"),
            "a Content-Disposition name is read as RFC 6266 says (filename* in UTF-8 first)"),
        Aria2Option("continue", .download, .bool, .ignored, .value("true"), "a partial with proof is always resumed"),
        Aria2Option(
            "daemon", .startup, .bool, .fixed, .value("false"),
            "stitch serve runs in the foreground; a service manager runs it in the background"),
        Aria2Option(
            "deferred-input", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "dht-entry-point", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "dht-entry-point6", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "dht-file-path", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "dht-file-path6", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("dht-listen-addr", .startup, .text, .ignored, .none, "hidden in aria2c too"),
        Aria2Option(
            "dht-listen-addr6", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "dht-listen-port", .startup, .text, .ignored, .value("6881-6999"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "dht-message-timeout", .startup, .number(1...60), .ignored, .value("10"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "dir", .download, .text, .addOnly, .computed,
            "the download's folder, inside the served one; set when the download is added"),
        Aria2Option("disable-ipv6", .startup, .bool, .fixed, .value("false"), "IPv6 is used where the system has it"),
        Aria2Option(
            "disk-cache", .startup, .size(0...Int64.max), .ignored, .none,
            "writes go to the page cache and are made durable at checkpoints"),
        Aria2Option("dns-timeout", .startup, .number(1...60), .ignored, .none, "hidden in aria2c too"),
        Aria2Option(
            "download-result", .global, .choice(["default", "full", "hide"]), .ignored, .value("default"),
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option("dry-run", .download, .bool, .fixed, .value("false"), "every download writes its file"),
        Aria2Option(
            "dscp", .startup, .number(0...Int64.max), .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option("enable-async-dns6", .download, .bool, .ignored, .none, "deprecated; aria2c ignores it too"),
        Aria2Option(
            "enable-color", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "enable-dht", .startup, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "enable-dht6", .startup, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "enable-http-keep-alive", .download, .bool, .ignored, .value("true"),
            "connections are kept open and reused"),
        Aria2Option(
            "enable-http-pipelining", .download, .bool, .ignored, .value("false"),
            "requests are not pipelined"),
        Aria2Option(
            "enable-mmap", .download, .bool, .ignored, .value("false"),
            "files are written with pwrite, never mapped"),
        Aria2Option(
            "enable-peer-exchange", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("enable-rpc", .startup, .bool, .fixed, .value("true"), "the RPC is what stitch serve serves"),
        Aria2Option(
            "event-poll", .startup, .choice(["epoll", "poll", "select"]), .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "file-allocation", .download, .choice(["none", "prealloc", "trunc", "falloc"]), .ignored, .value("falloc"),
            "the file's space is reserved (fallocate) where the file system allows it"),
        Aria2Option(
            "follow-metalink", .download, .choice(["true", "mem", "false"]), .ignored, .value("false"),
            "Metalink: Stitch reads no Metalink"),
        Aria2Option(
            "follow-torrent", .download, .choice(["true", "mem", "false"]), .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "force-save", .download, .bool, .ignored, .value("true"),
            "every download, finished ones too, stays in the catalog until it is removed"),
        Aria2Option(
            "force-sequential", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option("ftp-passwd", .download, .text, .ignored, .none, "FTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "ftp-pasv", .download, .bool, .ignored, .value("true"),
            "FTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("ftp-proxy", .download, .text, .ignored, .none, "FTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "ftp-proxy-passwd", .download, .text, .ignored, .none,
            "FTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "ftp-proxy-user", .download, .text, .ignored, .none,
            "FTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "ftp-reuse-connection", .download, .bool, .ignored, .value("true"),
            "FTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "ftp-type", .download, .choice(["binary", "ascii"]), .ignored, .value("binary"),
            "FTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("ftp-user", .download, .text, .ignored, .none, "FTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "gid", .download, .text, .addOnly, .none,
            "16 hex digits, refused when another download has it; Stitch chooses one otherwise"),
        Aria2Option(
            "hash-check-only", .download, .bool, .fixed, .value("false"),
            "a download with a checksum is downloaded and checked; `stitch verify` checks a file alone"),
        Aria2Option(
            "header", .download, .lines, .applied, .computed,
            "request headers, one per line (replaces the download's)"),
        Aria2Option(
            "help", .startup, .text, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "http-accept-gzip", .download, .bool, .ignored, .value("false"),
            "Stitch always asks for the identity encoding: a compressed body cannot be resumed by range"),
        Aria2Option(
            "http-auth-challenge", .download, .bool, .ignored, .value("false"),
            "credentials go with the first request"),
        Aria2Option("http-no-cache", .download, .bool, .ignored, .value("false"), "no Cache-Control is sent"),
        Aria2Option(
            "http-passwd", .download, .text, .applied, .computed,
            "with http-user, an Authorization: Basic header; shown as (hidden)"),
        Aria2Option(
            "http-proxy", .download, .text, .applied, .computed,
            "the proxy for http:// URLs, over all-proxy"),
        Aria2Option(
            "http-proxy-passwd", .download, .text, .applied, .computed,
            "http-proxy's password; kept in memory only (not in the catalog), shown as (hidden)"),
        Aria2Option(
            "http-proxy-user", .download, .text, .applied, .computed,
            "http-proxy's user name"),
        Aria2Option(
            "http-user", .download, .text, .applied, .computed,
            "with http-passwd, an Authorization: Basic header"),
        Aria2Option(
            "https-proxy", .download, .text, .applied, .computed,
            "the proxy for https:// URLs, over all-proxy"),
        Aria2Option(
            "https-proxy-passwd", .download, .text, .applied, .computed,
            "https-proxy's password; kept in memory only (not in the catalog), shown as (hidden)"),
        Aria2Option(
            "https-proxy-user", .download, .text, .applied, .computed,
            "https-proxy's user name"),
        Aria2Option(
            "human-readable", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "index-out", .download, .lines, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "input-file", .startup, .text, .fixed, .none,
            "an aria2 session named at start (input-file in the configuration file, or on the command line) is imported once"),
        Aria2Option("interface", .startup, .text, .fixed, .none, "connections follow the system's routing"),
        Aria2Option(
            "keep-unfinished-download-result", .global, .bool, .ignored, .value("true"),
            "stopped downloads stay listed until removeDownloadResult or purgeDownloadResult"),
        Aria2Option(
            "listen-port", .startup, .text, .ignored, .value("6881-6999"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "load-cookies", .startup, .text, .fixed, .computed,
            "read when stitch serve starts (from its command line or its configuration file); sent where they match"),
        Aria2Option("log", .global, .text, .fixed, .computed, "the daemon's log file, set when it starts"),
        Aria2Option(
            "log-level", .global, .choice(["debug", "info", "notice", "warn", "error"]), .fixed, .computed,
            "debug or notice, set when the daemon starts"),
        Aria2Option(
            "lowest-speed-limit", .download, .size(0...Int64.max), .ignored, .value("0"),
            "a connection slower than the others is replaced and one that stalls is retried (timeout); a "
                + "download never fails for its speed"),
        Aria2Option(
            "max-concurrent-downloads", .global, .number(1...Int64.max), .applied, .computed,
            "downloads transferring at once; one whose bytes are in gives its slot to the next while it is synced "
                + "and renamed, so `tellActive` may list up to twice as many for a moment"),
        Aria2Option(
            "max-connection-per-server", .download, .number(1...16), .applied, .computed,
            "connections for a download, 1…16: with split, the smaller of the two"),
        Aria2Option(
            "max-download-limit", .download, .size(0...Int64.max), .applied, .computed,
            "this download's own limit, within the overall one"),
        Aria2Option(
            "max-download-result", .global, .number(0...Int64.max), .ignored, .none,
            "stopped downloads stay listed until removeDownloadResult or purgeDownloadResult"),
        Aria2Option(
            "max-file-not-found", .download, .number(0...Int64.max), .ignored, .value("0"),
            "a missing file fails the download at once; each mirror is tried once"),
        Aria2Option("max-http-pipelining", .startup, .number(1...8), .ignored, .none, "hidden in aria2c too"),
        Aria2Option("max-mmap-limit", .download, .size(0...Int64.max), .ignored, .value("0"), "files are never mapped"),
        Aria2Option(
            "max-overall-download-limit", .global, .size(0...Int64.max), .applied, .computed,
            "the limit over every download"),
        Aria2Option(
            "max-overall-upload-limit", .global, .size(0...Int64.max), .ignored, .value("0"),
            "Stitch uploads nothing"),
        Aria2Option(
            "max-resume-failure-tries", .download, .number(0...Int64.max), .ignored, .value("0"),
            "see always-resume"),
        Aria2Option(
            "max-tries", .download, .number(0...Int64.max), .applied, .computed,
            "attempts before the download fails (0: no end)"),
        Aria2Option(
            "max-upload-limit", .download, .size(0...Int64.max), .ignored, .value("0"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("metalink-base-uri", .download, .text, .ignored, .none, "Metalink: Stitch reads no Metalink"),
        Aria2Option(
            "metalink-enable-unique-protocol", .download, .bool, .ignored, .value("false"),
            "Metalink: Stitch reads no Metalink"),
        Aria2Option("metalink-file", .startup, .text, .ignored, .none, "Metalink: Stitch reads no Metalink"),
        Aria2Option("metalink-language", .download, .text, .ignored, .none, "Metalink: Stitch reads no Metalink"),
        Aria2Option("metalink-location", .download, .text, .ignored, .none, "Metalink: Stitch reads no Metalink"),
        Aria2Option("metalink-os", .download, .text, .ignored, .none, "Metalink: Stitch reads no Metalink"),
        Aria2Option(
            "metalink-preferred-protocol", .download,
            .choice(["http", "https", "ftp", "none"]), .ignored, .value("none"),
            "Metalink: Stitch reads no Metalink"),
        Aria2Option("metalink-version", .download, .text, .ignored, .none, "Metalink: Stitch reads no Metalink"),
        Aria2Option(
            "min-split-size", .download, .size(1_048_576...1_073_741_824), .applied, .computed,
            "the smallest range a split makes"),
        Aria2Option(
            "min-tls-version", .startup, .choice(["TLSv1.1", "TLSv1.2", "TLSv1.3"]), .fixed, .value("TLSv1.2"),
            "TLS 1.2 or later"),
        Aria2Option("multiple-interface", .startup, .text, .fixed, .none, "connections follow the system's routing"),
        Aria2Option("netrc-path", .startup, .text, .ignored, .none, "see no-netrc"),
        Aria2Option(
            "no-conf", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "no-file-allocation-limit", .download, .size(0...Int64.max), .ignored, .value("0"),
            "every file's space is reserved, whatever its size"),
        Aria2Option(
            "no-netrc", .download, .bool, .fixed, .value("true"),
            "the daemon reads no .netrc: give credentials with http-user and http-passwd or a header"),
        Aria2Option(
            "no-proxy", .download, .text, .applied, .computed,
            "hosts reached directly (curl's list: names with their subdomains, addresses, CIDR ranges, *)"),
        Aria2Option(
            "on-bt-download-complete", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "on-download-complete", .startup, .text, .fixed, .none,
            "the daemon runs no commands; a WebSocket client gets the notifications"),
        Aria2Option(
            "on-download-error", .startup, .text, .fixed, .none,
            "the daemon runs no commands; a WebSocket client gets the notifications"),
        Aria2Option(
            "on-download-pause", .startup, .text, .fixed, .none,
            "the daemon runs no commands; a WebSocket client gets the notifications"),
        Aria2Option(
            "on-download-start", .startup, .text, .fixed, .none,
            "the daemon runs no commands; a WebSocket client gets the notifications"),
        Aria2Option(
            "on-download-stop", .startup, .text, .fixed, .none,
            "the daemon runs no commands; a WebSocket client gets the notifications"),
        Aria2Option(
            "optimize-concurrent-downloads", .global, .text, .ignored, .value("false"),
            "max-concurrent-downloads is kept as set"),
        Aria2Option(
            "out", .download, .text, .addOnly, .computed,
            "the file's name inside dir; set when the download is added"),
        Aria2Option("parameterized-uri", .download, .bool, .fixed, .value("false"), "URIs are taken as they are"),
        Aria2Option(
            "pause", .download, .bool, .ignored, .none,
            "addUri only (the download is added paused); changeOption ignores it, as aria2c does: aria2.pause "
                + "pauses"),
        Aria2Option(
            "pause-metadata", .download, .bool, .ignored, .value("false"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "peer-agent", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("peer-connection-timeout", .startup, .number(1...600), .ignored, .none, "hidden in aria2c too"),
        Aria2Option(
            "peer-id-prefix", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "piece-length", .download, .size(1_048_576...1_073_741_824), .fixed, .value("1048576"),
            "pieces are 1 MiB, the unit of Stitch's checks"),
        Aria2Option("private-key", .startup, .text, .fixed, .none, "client certificates are not supported"),
        Aria2Option(
            "proxy-method", .download, .choice(["get", "tunnel"]), .ignored, .value("get"),
            "an http:// URL goes through an HTTP proxy as a GET, an https:// one through a CONNECT tunnel; tunnel is taken and not done"),
        Aria2Option(
            "quiet", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "realtime-chunk-checksum", .download, .bool, .ignored, .value("true"),
            "each piece's CRC-32C is recorded as it is written"),
        Aria2Option("referer", .download, .text, .applied, .computed, "a Referer header (* is ignored)"),
        Aria2Option("remote-time", .download, .bool, .fixed, .value("false"), "the file keeps the time it was written"),
        Aria2Option(
            "remove-control-file", .download, .bool, .ignored, .value("false"),
            "Stitch's state file goes once the file is complete (and aria2's control file of an adopted "
                + "partial)"),
        Aria2Option(
            "retry-wait", .download, .number(0...600), .applied, .computed,
            "seconds before the first retry, then doubling"),
        Aria2Option("reuse-uri", .download, .bool, .ignored, .value("true"), "a URI that worked is used again"),
        Aria2Option(
            "rlimit-nofile", .startup, .number(1...Int64.max), .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "rpc-allow-origin-all", .startup, .bool, .fixed, .computed,
            "set when the daemon starts"),
        Aria2Option("rpc-certificate", .startup, .text, .fixed, .none, "set when the daemon starts"),
        Aria2Option("rpc-listen-all", .startup, .bool, .fixed, .computed, "set when the daemon starts"),
        Aria2Option(
            "rpc-listen-port", .startup, .number(1024...65535), .fixed, .computed,
            "set when the daemon starts"),
        Aria2Option(
            "rpc-max-request-size", .startup, .size(0...Int64.max), .fixed, .computed,
            "set when the daemon starts"),
        Aria2Option(
            "rpc-passwd", .startup, .text, .fixed, .none,
            "deprecated in aria2c: the secret is the only credential"),
        Aria2Option("rpc-private-key", .startup, .text, .fixed, .none, "set when the daemon starts"),
        Aria2Option(
            "rpc-save-upload-metadata", .download, .bool, .ignored, .value("true"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "rpc-secret", .startup, .text, .fixed, .none,
            "set when the daemon starts; never shown"),
        Aria2Option(
            "rpc-secure", .startup, .bool, .fixed, .computed,
            "set when the daemon starts (a certificate and key)"),
        Aria2Option(
            "rpc-user", .startup, .text, .fixed, .none,
            "deprecated in aria2c: the secret is the only credential"),
        Aria2Option("save-cookies", .global, .text, .fixed, .none, "cookies are not kept yet"),
        Aria2Option("save-not-found", .download, .bool, .ignored, .value("true"), "see force-save"),
        Aria2Option(
            "save-session", .global, .text, .ignored, .none,
            "the catalog keeps every download and is written at every change; nothing to save"),
        Aria2Option(
            "save-session-interval", .startup, .number(0...Int64.max), .ignored, .none,
            "every change is saved when it is made"),
        Aria2Option(
            "seed-ratio", .download, .text, .ignored, .value("1.0"),
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "seed-time", .download, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "select-file", .download, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("select-least-used-host", .startup, .bool, .ignored, .none, "hidden in aria2c too"),
        Aria2Option("server-stat-if", .startup, .text, .ignored, .none, "Stitch keeps no server statistics"),
        Aria2Option("server-stat-of", .global, .text, .ignored, .none, "Stitch keeps no server statistics"),
        Aria2Option(
            "server-stat-timeout", .startup, .number(0...2_147_483_647), .ignored, .none,
            "Stitch keeps no server statistics"),
        Aria2Option(
            "show-console-readout", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "show-files", .startup, .bool, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "socket-recv-buffer-size", .startup, .size(0...16_777_216), .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "split", .download, .number(1...Int64.max), .applied, .computed,
            "connections for a download, 1…16 (shown as 4, the most the automatic choice opens, when Stitch "
                + "chooses)"),
        Aria2Option(
            "ssh-host-key-md", .download, .checksum, .ignored, .none,
            "SFTP: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option("startup-idle-time", .startup, .number(1...60), .ignored, .none, "hidden in aria2c too"),
        Aria2Option(
            "stderr", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "stop", .startup, .number(0...2_147_483_647), .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "stop-with-process", .startup, .number(0...Int64.max), .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "stream-piece-selector", .download,
            .choice(["default", "inorder", "random", "geom"]), .ignored, .value("default"),
            "the file is split into even ranges and idle connections take over the end of slower ones"),
        Aria2Option(
            "summary-interval", .startup, .number(0...2_147_483_647), .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "timeout", .download, .number(1...600), .applied, .computed,
            "seconds a transfer may stall before it is retried"),
        Aria2Option(
            "torrent-file", .startup, .text, .ignored, .none,
            "BitTorrent: Stitch downloads over HTTP and HTTPS only"),
        Aria2Option(
            "truncate-console-readout", .startup, .bool, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
        Aria2Option(
            "uri-selector", .download, .choice(["inorder", "feedback", "adaptive"]), .ignored, .value("inorder"),
            "mirrors are tried in the order given"),
        Aria2Option(
            "use-head", .download, .bool, .ignored, .value("false"),
            "no HEAD request: the first GET's answer is judged"),
        Aria2Option("user-agent", .download, .text, .applied, .computed, "the User-Agent header"),
        Aria2Option(
            "version", .startup, .text, .ignored, .none,
            "aria2c's console and process; stitch serve's own are its command-line options"),
    ]
}
