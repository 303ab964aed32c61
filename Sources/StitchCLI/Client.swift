import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Stitch
import StitchRPC

/// `stitch add | ls | pause | resume | rm | stats | watch`: a client of a running `stitch serve`, over the aria2
/// JSON-RPC it speaks (docs/rpc.md), so the same commands drive aria2c itself.
///
/// Where the daemon is and its secret come from, first to last: `--rpc-url` and `--rpc-secret-file`; the
/// environment (`STITCH_RPC_URL`, `STITCH_RPC_SECRET`); the client config file (`STITCH_CLIENT_CONFIG`, else
/// `$XDG_CONFIG_HOME/stitch/client.toml`, else `~/.config/stitch/client.toml`); the default,
/// `http://127.0.0.1:6800/jsonrpc` without a secret.
enum Client {
    static let commands: Set<String> = ["add", "ls", "pause", "resume", "rm", "stats", "watch"]
    static let defaultURL = "http://127.0.0.1:6800/jsonrpc"

    /// The connection settings and the command's own arguments.
    struct Options {
        var rpcURL = Client.defaultURL
        var secret: String?
        var json = false
        var quiet = false
        var arguments: [String] = []
        /// `add`: aria2 options for every URL (dir, out, split, …).
        var downloadOptions: [(String, JSON)] = []
        /// `watch`: stop once nothing is active or waiting.
        var untilIdle = false
        /// `--rpc-url` as given; ``Client/parse(_:_:environment:)`` resolves ``rpcURL`` from it.
        var rpcURLGiven: String?
        /// `--rpc-secret-file` as given; ``Client/parse(_:_:environment:)`` reads ``secret`` from it.
        var secretFile: String?
    }

    static func run(_ command: String, _ arguments: [String]) async -> ExitStatus {
        let options: Options
        do {
            options = try parse(command, arguments, environment: ProcessInfo.processInfo.environment)
        } catch let error as UsageError {
            writeAll(STDERR_FILENO, "stitch: \(error.message)\nUsage: \(usage(command)); see 'stitch help client'\n")
            return .usage
        } catch {
            writeAll(STDERR_FILENO, "stitch: \(error)\n")
            return .usage
        }
        let output = Output(mode: options.json ? .json : options.quiet ? .quiet : .human)
        let client = RPCClient(url: options.rpcURL, secret: options.secret)
        do {
            switch command {
            case "add": return try await add(options, client, output)
            case "ls": return try await list(options, client, output)
            case "pause", "resume", "rm": return try await change(command, options, client, output)
            case "stats": return try await stats(client, output)
            default: return try await watch(options, client, output)
            }
        } catch let error as RPCClient.Failure {
            output.error(error.message)
            output.json("error", ["code": error.unreachable ? "unreachable" : "rpc", "message": error.message])
            return error.unreachable ? .temporaryFailure : .failure
        } catch {
            output.error("\(error)")
            return .failure
        }
    }

    static func usage(_ command: String) -> String {
        switch command {
        case "add": "stitch add URL... [-d DIR] [-o NAME] [-c N] [--checksum ALGO=HEX] [--limit-rate RATE] [-H HEADER]"
        case "pause", "resume", "rm": "stitch \(command) GID..."
        case "watch": "stitch watch [GID...] [--until-idle]"
        default: "stitch \(command)"
        }
    }

    // MARK: - Options

    /// Reads a client command's arguments (after the command's name), then where the daemon is and its secret:
    /// flag, environment, config file, default.
    static func parse(_ command: String, _ arguments: [String], environment: [String: String]) throws -> Options {
        var options = Options()
        try table(for: command).parse(arguments, into: &options) { options, argument in
            options.arguments.append(argument)
        }
        switch command {
        case "add" where options.arguments.isEmpty: throw UsageError("stitch add needs a URL")
        case "pause", "resume", "rm":
            if options.arguments.isEmpty { throw UsageError("stitch \(command) needs the GID of a download (see stitch ls)") }
        case "ls", "stats":
            if let extra = options.arguments.first { throw UsageError("unexpected argument '\(extra)'") }
        default: break
        }
        if command == "add" {
            options.arguments = options.arguments.map { CommandLineURL.assumingScheme($0).url }
        }

        let config = try ClientConfig.load(environment: environment)
        options.rpcURL =
            options.rpcURLGiven ?? environment["STITCH_RPC_URL"].flatMap { $0.isEmpty ? nil : $0 } ?? config.rpcURL
            ?? defaultURL
        guard let parsed = URL(string: options.rpcURL), ["http", "https"].contains(parsed.scheme ?? ""),
            parsed.host != nil
        else {
            throw UsageError("the daemon's address must be an http:// or https:// URL, not '\(options.rpcURL)'")
        }
        // Flag, environment, config file: the file's secret (from its own file or inline) comes last.
        if let secretFile = options.secretFile {
            options.secret = try readSecretFile(secretFile)
        } else if let secret = environment["STITCH_RPC_SECRET"], !secret.isEmpty {
            options.secret = secret
        } else if let file = config.secretFile {
            options.secret = try readSecretFile(file)
        } else {
            options.secret = config.secret
        }
        return options
    }

    // MARK: - Commands

    static func add(_ options: Options, _ client: RPCClient, _ output: Output) async throws -> ExitStatus {
        for url in options.arguments {
            var params: [JSON] = [.array([.string(url)])]
            if !options.downloadOptions.isEmpty { params.append(.object(options.downloadOptions)) }
            let gid = try await client.call("aria2.addUri", params).string ?? "?"
            output.json("added", ["gid": gid, "url": url])
            if output.mode != .json { output.result("\(gid)\n") }
            output.message("added \(url) as \(gid)")
        }
        return .success
    }

    /// Every download the daemon knows: active, then waiting, then stopped.
    static let keys = JSON.array(
        ["gid", "status", "totalLength", "completedLength", "downloadSpeed", "files", "errorMessage"].map(JSON.string))

    /// The three lists in one `system.multicall`, so a download that moves from waiting to active between two
    /// calls is neither missed nor listed twice.
    static func everything(_ client: RPCClient) async throws -> [JSON] {
        let results = try await client.multicall([
            ("aria2.tellActive", [keys]),
            ("aria2.tellWaiting", [.integer(0), .integer(10_000), keys]),
            ("aria2.tellStopped", [.integer(0), .integer(10_000), keys]),
        ])
        return results.flatMap { $0.array ?? [] }
    }

    static func list(_ options: Options, _ client: RPCClient, _ output: Output) async throws -> ExitStatus {
        let downloads = try await everything(client)
        if output.mode == .json {
            for download in downloads { output.json("download", Item(download).fields) }
            return .success
        }
        var rows = [["gid", "status", "done", "size", "speed", "name"]]
        for download in downloads.map(Item.init) {
            let done = download.total.map { $0 > 0 ? "\(download.completed * 100 / $0)%" : "-" } ?? "-"
            rows.append([
                download.gid, download.status, done, download.total.map(Output.bytes) ?? "-",
                download.status == "active" ? "\(Output.bytes(download.speed))/s" : "-", download.name,
            ])
        }
        output.result(DisplayWidth.table(rows) + "\n")
        return .success
    }

    static func change(_ command: String, _ options: Options, _ client: RPCClient, _ output: Output) async throws -> ExitStatus {
        var failed = false
        for gid in options.arguments {
            do {
                switch command {
                case "pause": _ = try await client.call("aria2.pause", [.string(gid)])
                case "resume": _ = try await client.call("aria2.unpause", [.string(gid)])
                default:
                    // A finished or failed download is a result to remove; a live one is removed (its partial goes).
                    let status = try await client.call("aria2.tellStatus", [.string(gid), .array([.string("status")])])
                    if ["complete", "error", "removed"].contains(status["status"]?.string ?? "") {
                        _ = try await client.call("aria2.removeDownloadResult", [.string(gid)])
                    } else {
                        _ = try await client.call("aria2.remove", [.string(gid)])
                    }
                }
                let done = ["pause": "paused", "resume": "resumed", "rm": "removed"][command] ?? command
                output.message("\(done) \(gid)")
                output.json(done, ["gid": gid])
            } catch let error as RPCClient.Failure where !error.unreachable {
                failed = true
                output.error("\(gid): \(error.message)")
                output.json("error", ["gid": gid, "code": "rpc", "message": error.message])
            }
        }
        return failed ? .failure : .success
    }

    static func stats(_ client: RPCClient, _ output: Output) async throws -> ExitStatus {
        let stat = try await client.call("aria2.getGlobalStat")
        func number(_ key: String) -> Int64 { stat[key]?.string.flatMap { Int64($0) } ?? 0 }
        if output.mode == .json {
            output.json(
                "stats",
                ["active": number("numActive"), "waiting": number("numWaiting"), "stopped": number("numStopped"),
                 "download_speed": number("downloadSpeed")])
        } else {
            output.result(
                "\(number("numActive")) active, \(number("numWaiting")) waiting, \(number("numStopped")) stopped; "
                    + "\(Output.bytes(number("downloadSpeed")))/s\n")
        }
        return .success
    }

    /// The daemon's downloads as `get` shows a list: a summary line and a line per active download, redrawn in
    /// place (plain lines every 5 s off a terminal, a progress event per download each second with --json). With
    /// GIDs, until each of them has ended (exit 0 if all completed); with --until-idle, until nothing is active
    /// or waiting; otherwise until interrupted.
    static func watch(_ options: Options, _ client: RPCClient, _ output: Output) async throws -> ExitStatus {
        let signals = SignalCatcher()
        let watched = Set(options.arguments)
        var lastPlain = 0.0
        var lastJSON = 0.0
        while signals.received == 0 {
            let items: [Item]
            if watched.isEmpty {
                items = try await everything(client).map(Item.init)
            } else {
                // Each asked for by its GID, as the daemon matches them (an unknown one fails the watch).
                items = try await client.multicall(options.arguments.map { ("aria2.tellStatus", [.string($0), keys]) })
                    .map(Item.init)
            }
            let live = items.filter { ["active", "waiting", "paused"].contains($0.status) }
            let active = items.filter { $0.status == "active" }
            let now = monotonicSeconds()
            if output.mode == .json, now - lastJSON >= 1 {
                lastJSON = now
                for item in active { output.json("progress", item.fields) }
            }
            let speed = active.reduce(Int64(0)) { $0 + $1.speed }
            let summary = "[\(active.count) active, \(items.count { $0.status == "waiting" }) waiting, "
                + "\(items.count { $0.status == "complete" }) complete"
                + (items.contains { $0.status == "error" } ? ", \(items.count { $0.status == "error" }) failed" : "")
                + "]  \(Output.bytes(speed))/s"
            if output.isTTY {
                var lines = [summary]
                if let size = output.terminalSize {
                    let room = size.rows / 2 - 1
                    let width = Output.width(size)
                    for item in active.prefix(max(0, room)) {
                        lines.append(
                            ProgressLine(name: item.name, bytes: item.completed, total: item.total, speed: Double(item.speed))
                                .render(width: width))
                    }
                }
                output.show(lines)
            } else if now - lastPlain >= 5 {
                lastPlain = now
                output.plainLine(summary)
            }
            let finished = watched.isEmpty ? options.untilIdle && items.allSatisfy { !["active", "waiting"].contains($0.status) }
                : live.isEmpty
            if finished {
                output.endProgressLine()
                let failures = items.filter { $0.status != "complete" }
                for item in failures where !watched.isEmpty {
                    output.message("\(item.gid) \(item.status)\(item.error.map { ": \($0)" } ?? "")", always: true)
                }
                return watched.isEmpty || failures.isEmpty ? .success : .failure
            }
            try? await Task.sleep(for: .milliseconds(500))
        }
        output.endProgressLine()
        // Interrupted: the downloads carry on in the daemon, but what was watched for did not happen.
        return signals.received == SIGTERM ? .terminated : .interrupted
    }

    /// A download as `tellStatus` shows it (aria2's numbers are strings).
    struct Item {
        var gid: String
        var status: String
        var total: Int64?
        var completed: Int64
        var speed: Int64
        var name: String
        var path: String?
        var error: String?

        init(_ json: JSON) {
            func number(_ key: String) -> Int64? { json[key]?.string.flatMap { Int64($0) } }
            gid = json["gid"]?.string ?? "?"
            status = json["status"]?.string ?? "?"
            let total = number("totalLength") ?? 0
            self.total = total > 0 ? total : nil
            completed = number("completedLength") ?? 0
            speed = number("downloadSpeed") ?? 0
            let file = json["files"]?.array?.first
            path = file?["path"]?.string.flatMap { $0.isEmpty ? nil : $0 }
            let uri = file?["uris"]?.array?.first?["uri"]?.string
            name = path.map { ($0 as NSString).lastPathComponent } ?? uri ?? gid
            error = json["errorMessage"]?.string.flatMap { $0.isEmpty ? nil : $0 }
        }

        var fields: [String: Any] {
            var fields: [String: Any] = ["gid": gid, "status": status, "bytes": completed, "speed": speed, "name": name]
            if let total { fields["total"] = total }
            if let path { fields["path"] = path }
            if let error { fields["error"] = error }
            return fields
        }
    }
}

/// The client config file: `key = value` lines (TOML's simple form: a value may be quoted; `#` starts a comment).
/// Keys: `rpc-url`, `rpc-secret-file`, `rpc-secret` (the file should then be readable by its owner only).
struct ClientConfig {
    var rpcURL: String?
    var secretFile: String?
    var secret: String?

    static func path(environment: [String: String]) -> String {
        if let path = environment["STITCH_CLIENT_CONFIG"], !path.isEmpty { return path }
        let base = environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? ((environment["HOME"] ?? NSHomeDirectory()) + "/.config")
        return base + "/stitch/client.toml"
    }

    static func load(environment: [String: String]) throws -> ClientConfig {
        let path = path(environment: environment)
        guard let data = FileManager.default.contents(atPath: path) else { return ClientConfig() }
        var config = ClientConfig()
        // \.isNewline, not "\n": a file with CRLF line ends has "\r\n" characters, which "\n" never matches.
        for (number, raw) in String(decoding: data, as: UTF8.self)
            .split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated()
        {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix("[") { continue }
            guard let equals = line.firstIndex(of: "=") else {
                throw UsageError("\(path): line \(number + 1): expected key = value")
            }
            let key = line[..<equals].trimmingCharacters(in: .whitespaces)
            var value = line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
            if value.hasPrefix("\"") {
                guard let close = value.dropFirst().firstIndex(of: "\"") else {
                    throw UsageError("\(path): line \(number + 1): unterminated string")
                }
                value = String(value[value.index(after: value.startIndex)..<close])
            } else if let hash = value.firstIndex(of: "#") {
                value = value[..<hash].trimmingCharacters(in: .whitespaces)
            }
            switch key {
            case "rpc-url": config.rpcURL = value
            case "rpc-secret-file": config.secretFile = value
            case "rpc-secret": config.secret = value
            default: throw UsageError("\(path): line \(number + 1): unknown key '\(key)' (rpc-url, rpc-secret-file, rpc-secret)")
            }
        }
        return config
    }
}

/// One aria2 JSON-RPC call at a time over HTTP POST, with the secret as `token:…` in front of the parameters.
struct RPCClient {
    let url: String
    let secret: String?

    struct Failure: Error {
        var message: String
        /// The daemon could not be reached at all (not running, wrong address).
        var unreachable: Bool
    }

    /// Several calls in one `system.multicall`; the results in order, or the first call's error.
    func multicall(_ calls: [(String, [JSON])]) async throws -> [JSON] {
        let list = calls.map { method, params -> JSON in
            var all = params
            if let secret { all.insert(.string("token:" + secret), at: 0) }
            return .object([("methodName", .string(method)), ("params", .array(all))])
        }
        let results = try await send("system.multicall", [.array(list)]).array ?? []
        return try results.map { result in
            // Each result is [value], or a fault object.
            if let value = result.array?.first { return value }
            throw Self.failure(result, method: calls.first?.0 ?? "system.multicall")
        }
    }

    func call(_ method: String, _ params: [JSON] = []) async throws -> JSON {
        var all = params
        if let secret { all.insert(.string("token:" + secret), at: 0) }
        return try await send(method, all)
    }

    private static func failure(_ error: JSON, method: String) -> Failure {
        let message = error["message"]?.string ?? "error"
        return Failure(
            message: message == "Unauthorized"
                ? "the daemon refused the secret (Unauthorized): --rpc-secret-file or STITCH_RPC_SECRET"
                : "\(method): \(message)",
            unreachable: false)
    }

    private func send(_ method: String, _ params: [JSON]) async throws -> JSON {
        let body = JSON.object([
            ("jsonrpc", .string("2.0")), ("id", .string("stitch")), ("method", .string(method)),
            ("params", .array(params)),
        ]).serialized
        var request = URLRequest(url: URL(string: url)!)
        request.httpMethod = "POST"
        request.httpBody = Data(body)
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.timeoutInterval = 30
        let data: Data
        let response: URLResponse
        do {
            (data, response) = try await URLSession.shared.data(for: request)
        } catch {
            throw Failure(
                message: "cannot reach stitch serve at \(url): \(error.localizedDescription) (is it running? "
                    + "--rpc-url, STITCH_RPC_URL or \(ClientConfig.path(environment: ProcessInfo.processInfo.environment)) say where)",
                unreachable: true)
        }
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard let reply = try? JSON.parse(Array(data)) else {
            throw Failure(message: "\(url) answered HTTP \(status), not JSON-RPC: is it stitch serve?", unreachable: false)
        }
        if let error = reply["error"] { throw Self.failure(error, method: method) }
        guard let result = reply["result"] else {
            throw Failure(message: "\(method): the reply has no result", unreachable: false)
        }
        return result
    }
}
