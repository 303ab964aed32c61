import Stitch
import StitchRPC

extension Client {
    /// The options every client command takes.
    static let commonOptions: [OptionSpec<Options>] = [
        .value(
            ["--rpc-url"], "URL", help: "the daemon's JSON-RPC endpoint (default http://127.0.0.1:6800/jsonrpc)"
        ) { options, use in options.rpcURLGiven = use.value },
        .value(["--rpc-secret-file"], "F", help: "the daemon's secret, read from F (never on the command line)") {
            options, use in
            options.secretFile = use.value
        },
        // aria2's option, refused with the reason (and never echoing the secret, given as a value or after `=`).
        .flag(["--rpc-secret"], help: nil) { _, _ in
            throw UsageError(
                "the secret is not taken on the command line (other users can read it in ps); use "
                    + "--rpc-secret-file FILE, STITCH_RPC_SECRET or the client config file")
        },
        .flag(["--json"], help: "one JSON object per line on stdout") { options, _ in options.json = true },
        .flag(["-q", "--quiet"], help: "no messages on stderr but errors") { options, _ in options.quiet = true },
    ]

    /// `add`'s options: each one an aria2 option for every URL added (`-o` is `out`, `-c` is `split`).
    static let addOptions: [OptionSpec<Options>] = [
        .value(["-d", "--dir"], "DIR", help: "save in DIR (aria2's dir)") { options, use in
            options.downloadOptions.append(("dir", .string(use.value)))
        },
        .value(["-o", "--output"], "NAME", help: "save as NAME (aria2's out)") { options, use in
            options.downloadOptions.append(("out", .string(use.value)))
        },
        .value(["-c", "--connections"], "N", help: "connections for the download, 1-16 (aria2's split)") {
            options, use in
            let range = DownloadOptions.connectionRange
            guard let count = Int(use.value), range.contains(count) else {
                throw UsageError(
                    "\(use.name) takes a number of connections from \(range.lowerBound) to \(range.upperBound), "
                        + "not '\(use.value)'")
            }
            options.downloadOptions.append(("split", .string("\(count)")))
            options.downloadOptions.append(("max-connection-per-server", .string("\(count)")))
        },
        .value(["--checksum"], "ALGO=HEX", help: "verify the file (sha-256, sha-512, sha-1, md5)") { options, use in
            options.downloadOptions.append(("checksum", .string(use.value)))
        },
        .value(["--limit-rate"], "RATE", help: "at most RATE bytes per second (500K, 2M)") { options, use in
            options.downloadOptions.append(("max-download-limit", .string(use.value)))
        },
        .value(["-H", "--header"], "'K: V'", help: "add a request header (repeatable)") { options, use in
            // One `header` option holding every -H, in order.
            let existing = options.downloadOptions.firstIndex { $0.0 == "header" }
            if let existing, case .array(let headers) = options.downloadOptions[existing].1 {
                options.downloadOptions[existing].1 = .array(headers + [.string(use.value)])
            } else {
                options.downloadOptions.append(("header", .array([.string(use.value)])))
            }
        },
    ]

    /// `watch`'s own option.
    static let watchOptions: [OptionSpec<Options>] = [
        .flag(["--until-idle"], help: "stop once nothing is active or waiting") { options, _ in
            options.untilIdle = true
        }
    ]

    /// The options `command` takes; any other is "unknown option 'X' for 'stitch COMMAND'".
    static func table(for command: String) -> OptionTable<Options> {
        let own = command == "add" ? addOptions : command == "watch" ? watchOptions : []
        return OptionTable(commonOptions + own) { "unknown option '\($0)' for 'stitch \(command)'" }
    }
}
