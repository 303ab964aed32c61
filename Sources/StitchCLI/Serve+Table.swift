import Stitch

extension Serve {
    /// `stitch serve`'s options, in the order its help lists them (aria2c's names where it has them).
    static let table = OptionTable<Given>([
        .value(["-d", "--dir"], "DIR", help: "the folder to download into (required)") { given, use in
            given.directory = use.value
        },
        .value(
            ["--rpc-listen"], "ADDR",
            help: """
                listen on HOST:PORT, [V6]:PORT or a bare PORT (repeatable; default
                127.0.0.1:6800 and [::1]:6800); beyond loopback a secret is required
                """
        ) { given, use in given.listen.append(use.value) },
        .value(["--rpc-listen-port"], "PORT", help: "aria2's spelling: both loopback addresses on PORT") {
            given, use in
            let port = try count(use, 0...65_535)
            given.listen += ["127.0.0.1:\(port)", "[::1]:\(port)"]
        },
        .value(
            ["--rpc-secret-file"], "FILE",
            help: """
                the token clients send as "token:SECRET" (or set STITCH_RPC_SECRET;
                never on the command line)
                """
        ) { given, use in given.secretFile = use.value },
        // aria2c's option, refused with the reason (and never echoing the secret, given as a value or after `=`).
        .flag(["--rpc-secret"], help: nil) { _, _ in
            throw UsageError(
                "the secret is not taken on the command line (other users can read it in ps); put it in a "
                    + "file for --rpc-secret-file FILE, or set STITCH_RPC_SECRET")
        },
        .flag(["--rpc-allow-origin-all"], help: "let web pages of any origin call (needs a secret)") { given, _ in
            given.allowOriginAll = true
        },
        .value(
            ["--rpc-allow-host"], "NAME",
            help: "accept Host: NAME (a LAN name); IP addresses and localhost always are"
        ) { given, use in given.allowHosts.append(use.value) },
        .value(["--rpc-certificate"], "FILE", help: "serve HTTPS and WSS with this PEM certificate …") {
            given, use in
            given.certificate = use.value
        },
        .value(["--rpc-private-key"], "FILE", help: "… and this PEM key") { given, use in
            given.privateKey = use.value
        },
        .value(
            ["--rpc-max-request-size"], "N", help: "the largest request body or WebSocket message (default 16M)"
        ) { given, use in
            guard let size = ByteSize.parse(use.value), size >= 1_024, size <= 1 << 30 else {
                throw UsageError("--rpc-max-request-size takes a size from 1K to 1G (16M, 512K), not '\(use.value)'")
            }
            given.maxRequestSize = Int(size)
        },
        .value(["--rpc-max-websocket-clients"], "N", help: "WebSocket clients at once (default 64)") { given, use in
            given.maxWebSockets = try count(use, 1...10_000)
        },
        .value(["-j", "--max-concurrent-downloads"], "N", help: "downloads at once (default 5)") { given, use in
            given.maxConcurrent = try count(use, 1...1_000)
        },
        .value(
            ["--max-overall-download-limit"], "RATE",
            help: "all downloads together at most RATE (500K, 2M; 0: none)"
        ) { given, use in
            guard use.value != "0" else {
                given.rate = 0  // none, and given: it wins over a file's and what was set over RPC
                return
            }
            guard let rate = RateLimiter.parse(use.value) else {
                throw UsageError(
                    "--max-overall-download-limit takes a rate (500K, 2M, 0 for none), not '\(use.value)'")
            }
            given.rate = rate
        },
        .value(
            ["--max-connections-per-host"], "N",
            help: "connections to one host over all downloads (default: -j, 16 at least)"
        ) { given, use in
            given.perHost = try count(use, 1...4_096)
        },
        .value(
            ["-c", "--split"], "N", aliases: ["--connections"],
            help: "connections per download, 1-16 (default: chosen per file)"
        ) { given, use in
            given.connections = try count(use, DownloadOptions.connectionRange)
        },
        .value(["--log"], "FILE", help: "also append the log to FILE") { given, use in given.logFile = use.value },
        .value(
            ["-i", "--input-file"], "FILE",
            help: "import an aria2 session file (aria2c --save-session's) once: its downloads join the queue"
        ) { given, use in given.inputFile = use.value },
        .value(
            ["--load-cookies"], "FILE",
            help: "send the cookies of FILE (Netscape format) with every matching request"
        ) { given, use in given.cookieFile = use.value },
        .value(
            ["--conf-path"], "FILE",
            help: "read settings from FILE in aria2.conf's syntax (name=value lines); the command line wins"
        ) { given, use in given.confPath = use.value },
        .flag(["-v", "--verbose"], help: "log debug lines too") { given, _ in given.verbose = true },
    ])

    /// A whole number in `range`, or a usage error naming the option as given.
    private static func count(_ use: OptionUse, _ range: ClosedRange<Int>) throws -> Int {
        guard let number = Int(use.value), range.contains(number) else {
            throw UsageError("\(use.name) takes a number \(range.lowerBound)-\(range.upperBound), not '\(use.value)'")
        }
        return number
    }
}
