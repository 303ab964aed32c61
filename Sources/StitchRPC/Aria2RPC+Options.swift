import Foundation
import Stitch

// addUri, aria2's options (supported, ignored, refused), changeOption and the global options.
extension Aria2RPC {
    // MARK: addUri

    func addUri(_ params: [JSON]) async throws -> JSON {
        guard let uris = params.first?.array, !uris.isEmpty else {
            throw Failure(code: -32602, message: "Invalid params: addUri takes an array of URIs")
        }
        let urls = try uris.map { uri -> String in
            guard let text = uri.string else { throw Failure(code: -32602, message: "Invalid params: a URI is not a string") }
            return text
        }
        for url in urls { try Self.checkScheme(url) }
        var options = DownloadManager.AddOptions()
        options.reuseExisting = false  // aria2 adds a new download (a new GID, `NAME.1.EXT`) for a URL it holds
        if params.count > 1 {
            guard let members = params[1].members else {
                throw Failure(code: -32602, message: "Invalid params: options must be an object")
            }
            let base = await manager.configuration.downloadDirectory
            for (name, value) in members { try Self.apply(name, value, to: &options, base: base) }
            let user = members.first { $0.0 == "http-user" }?.1.string
            let password = members.first { $0.0 == "http-passwd" }?.1.string
            if user != nil || password != nil {
                let pair = Array("\(user ?? ""):\(password ?? "")".utf8)
                options.headers.add(name: "Authorization", value: "Basic " + Data(pair).base64EncodedString())
            }
            if let reservedFolder {
                // Compared with links resolved: `dir` may name the folder through another path to it.
                let target = Confinement.resolvedPath(options.directory ?? base)
                let root = Confinement.resolved(base)
                let reserved = (root == "/" ? "" : root) + "/" + reservedFolder
                if target == reserved || target.hasPrefix(reserved + "/") || (target == root && options.out == reservedFolder) {
                    throw Failure.aria2("\(reservedFolder) in the download folder is the daemon's own; choose another name")
                }
            }
        }
        if let folder = options.directory {
            // Made here, inside the served folder (checked by `apply`), as aria2 makes its `dir`.
            try? DownloadPaths.createFolder(folder)
        }
        if let out = options.out {
            let base = await manager.configuration.downloadDirectory
            for path in [(options.directory ?? base) + "/" + out, (options.directory ?? base) + "/" + out + ".part"] {
                try Self.checkNotALink(path)
            }
        }
        // Several URIs are mirrors of one file, as in aria2: kept with the download and tried in turn.
        if urls.count > 1 { options.mirrors = urls }
        // Read before the add: a bad position adds nothing. The add and the move are one step of the manager.
        if params.count > 2 { options.position = .fromStart(try Self.int(params, 2, "position")) }
        let id = try await manager.add(urls[0], options: options)
        return .string("\(id)")
    }

    /// aria2's option `name` (values are strings in aria2; numbers and booleans are taken too).
    /// - Parameter base: the served folder that `dir` must stay inside; nil refuses `dir`.
    static func apply(
        _ name: String, _ value: JSON, to options: inout DownloadManager.AddOptions, base: String? = nil
    ) throws {
        let text: String
        switch value {
        case .string(let string): text = string
        case .integer(let number): text = String(number)
        case .bool(let flag): text = flag ? "true" : "false"
        case .array where name == "header": text = ""
        default: throw Failure.aria2("option \(name): not a string")
        }
        func flag() throws -> Bool {
            switch text {
            case "true": return true
            case "false": return false
            default: throw Failure.aria2("option \(name): expected true or false, not \(text)")
            }
        }
        switch name {
        case "out":
            // A file name in the download folder: no folders, nothing that could lead outside it.
            guard !text.isEmpty, !text.contains("/"), text != ".", text != "..", !text.contains("\u{0}") else {
                throw Failure.aria2("option out: \(text.debugDescription) must be a file name (no folders)")
            }
            options.out = text
        case "split", "max-connection-per-server":
            // aria2 opens min(split, max-connection-per-server) connections to one server.
            let range = DownloadOptions.connectionRange
            guard let count = Int(text), range.contains(count) else {
                throw Failure.aria2("option \(name): \(text) is not \(range.lowerBound)…\(range.upperBound)")
            }
            options.connections = min(count, options.connections ?? count)
        case "max-tries":
            guard let tries = Int(text), tries >= 0 else { throw Failure.aria2("option max-tries: \(text) is not ≥ 0") }
            options.tuning.maxRetries = tries == 0 ? Int(Int32.max) : tries - 1  // aria2: 0 is unlimited
        case "retry-wait":
            guard let seconds = Double(text), (0...600).contains(seconds) else {
                throw Failure.aria2("option retry-wait: \(text) is not 0…600 seconds")
            }
            options.tuning.retryDelay = seconds
        case "timeout", "connect-timeout":
            guard let seconds = Double(text), seconds >= 1, seconds <= 600 else {
                throw Failure.aria2("option \(name): \(text) is not 1…600 seconds")
            }
            if name == "timeout" { options.tuning.stallTimeout = seconds } else { options.tuning.connectTimeout = seconds }
        case "min-split-size":
            guard let size = ByteSize.parse(text), size >= 1 << 20, size <= 1 << 30 else {
                throw Failure.aria2("option min-split-size: \(text) is not 1M…1024M")
            }
            options.tuning.minimumSplitSize = size
        case "user-agent":
            guard !text.isEmpty, !text.contains(where: { $0.isNewline || $0 == "\u{0}" }) else {
                throw Failure.aria2("option user-agent: not a header value")
            }
            options.headers.add(name: "User-Agent", value: text)
        case "checksum":
            do { options.checksum = try ExpectedChecksum(parsing: text) } catch {
                throw Failure.aria2("option checksum: \(error.message)")
            }
        case "header":
            let lines = value.array?.compactMap(\.string) ?? [text]
            for line in lines {
                guard let (field, content) = Downloader.parseHeaderLine(line) else {
                    throw Failure.aria2("option header: \(line.debugDescription) is not a header")
                }
                options.headers.add(name: field, value: content)
            }
        case "max-download-limit":
            if text == "0" {
                options.rateLimit = nil
            } else {
                guard let rate = RateLimiter.parse(text) else { throw Failure.aria2("option \(name): \(text) is not a rate") }
                options.rateLimit = rate
            }
        case "pause":
            options.paused = try flag()
        case "allow-overwrite":
            options.overwrite = try flag()
        case "continue":
            _ = try flag()  // always: a partial with proof is resumed
        case "dir":
            guard let base else { throw Failure.aria2("option dir is not accepted here") }
            options.directory = try Confinement.folder(text, within: base)
        case "referer":
            guard !text.contains(where: { $0.isNewline || $0 == "\u{0}" }) else {
                throw Failure.aria2("option referer: not a header value")
            }
            if text != "*" { options.headers.add(name: "Referer", value: text) }  // `*`: aria2's "the URI itself"
        case "http-user", "http-passwd":
            break  // combined into one Authorization header by addUri
        default:
            guard ignoredOptions.contains(name) else {
                throw Failure.aria2("option \(name) is not supported by Stitch (docs/rpc.md lists the options)")
            }
        }
    }

    /// aria2 options that Stitch takes and ignores because ignoring them cannot change what is downloaded or
    /// where: BitTorrent and Metalink settings, and knobs for what Stitch always does its own way (it always
    /// saves its state, never asks for gzip, allocates and verifies as it must). Every other unknown option is
    /// refused by name. docs/rpc.md has the table.
    public static let ignoredOptions: Set<String> = [
        "always-resume", "async-dns", "auto-file-renaming", "bt-enable-hook-after-hash-check", "bt-enable-lpd",
        "bt-exclude-tracker", "bt-external-ip", "bt-force-encryption", "bt-hash-check-seed", "bt-load-saved-metadata",
        "bt-max-open-files", "bt-max-peers", "bt-metadata-only", "bt-min-crypto-level", "bt-prioritize-piece",
        "bt-remove-unselected-file", "bt-request-peer-speed-limit", "bt-require-crypto", "bt-save-metadata",
        "bt-seed-unverified", "bt-stop-timeout", "bt-tracker", "bt-tracker-connect-timeout", "bt-tracker-interval",
        "bt-tracker-timeout", "check-integrity", "conditional-get", "content-disposition-default-utf8",
        "disk-cache", "enable-dht", "enable-dht6", "enable-http-keep-alive", "enable-http-pipelining",
        "enable-mmap", "enable-peer-exchange", "file-allocation", "follow-metalink", "follow-torrent",
        "force-save", "http-accept-gzip", "http-no-cache", "index-out", "lowest-speed-limit",
        "max-concurrent-downloads", "max-overall-download-limit",
        "max-file-not-found", "max-mmap-limit", "max-resume-failure-tries", "max-upload-limit",
        "metalink-base-uri", "metalink-enable-unique-protocol", "metalink-language", "metalink-location",
        "metalink-os", "metalink-preferred-protocol", "metalink-version", "no-file-allocation-limit",
        "no-want-digest-header", "pause-metadata", "piece-length", "proxy-method", "realtime-chunk-checksum",
        "remote-time", "remove-control-file", "reuse-uri", "rpc-save-upload-metadata", "seed-ratio", "seed-time",
        "select-file", "server-stat-of", "stream-piece-selector", "uri-selector",
    ]

    // MARK: Options and shapes

    static func checkScheme(_ url: String) throws {
        let scheme = url.prefix { $0 != ":" }.lowercased()
        guard scheme == "http" || scheme == "https", url.contains("://") else {
            throw Failure.aria2("\(url.debugDescription) is refused: only http and https URLs are downloaded")
        }
    }

    /// Refuses a destination that is a symbolic link (it could lead outside the served folder).
    static func checkNotALink(_ path: String) throws {
        var info = stat()
        if lstat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFLNK {
            throw Failure.aria2("\(path) is a symbolic link; refusing to write through it")
        }
    }

    static func uris(_ snapshot: DownloadSnapshot) -> JSON {
        let all = snapshot.mirrors.isEmpty ? [snapshot.url] : snapshot.mirrors
        return .array(all.map { .object([("uri", .string($0)), ("status", .string($0 == snapshot.url ? "used" : "waiting"))]) })
    }

    static func files(_ snapshot: DownloadSnapshot) -> JSON {
        let total = snapshot.progress.total ?? 0
        return .array([
            .object([
                ("index", .string("1")), ("path", .string(snapshot.path ?? "")), ("length", .string(String(total))),
                ("completedLength", .string(String(snapshot.progress.bytes))), ("selected", .string("true")),
                ("uris", uris(snapshot)),
            ])
        ])
    }

    /// A download's options as aria2's `getOption` shows them (values are strings).
    static func options(of snapshot: DownloadSnapshot) -> JSON {
        var members: [(String, JSON)] = [("dir", .string(directory(of: snapshot)))]
        if case .file(let file) = snapshot.destination {
            members.append(("out", .string((file as NSString).lastPathComponent)))
        }
        members.append(("max-download-limit", .string(String(snapshot.rateLimit ?? 0))))
        if let checksum = snapshot.checksum { members.append(("checksum", .string("\(checksum)"))) }
        // Credentials are not shown back (a read may travel as GET, even as JSONP).
        let hidden: Set<String> = ["authorization", "cookie", "proxy-authorization"]
        let headers = snapshot.headers.map {
            JSON.string("\($0.name): \(hidden.contains($0.name.lowercased()) ? "(hidden)" : $0.value)")
        }
        if !headers.isEmpty { members.append(("header", .array(headers))) }
        let tuning = snapshot.tuning
        if let retries = tuning.maxRetries { members.append(("max-tries", .string(String(retries + 1)))) }
        if let wait = tuning.retryDelay { members.append(("retry-wait", .string(String(Int(wait))))) }
        if let timeout = tuning.stallTimeout { members.append(("timeout", .string(String(Int(timeout))))) }
        if let timeout = tuning.connectTimeout { members.append(("connect-timeout", .string(String(Int(timeout))))) }
        if let size = tuning.minimumSplitSize { members.append(("min-split-size", .string(String(size)))) }
        members.append(("pause", .string(snapshot.status == .paused ? "true" : "false")))
        return .object(members)
    }

    /// `changeOption`: what can change on a download that exists. Checked first, changed after (in one step of
    /// the manager, the settings given replacing only themselves): a refused option changes nothing. The folder
    /// and the file name are fixed once added.
    func changeOption(_ id: DownloadID, _ members: [(String, JSON)]) async throws {
        var options = DownloadManager.AddOptions()
        var rate: Int64?? = nil
        var connections: Int?? = nil
        var tuningChanged = false
        var replaceHeaders = false
        var fields = HTTPHeaders()
        var fieldsGiven = false
        let tunable: Set<String> = ["max-tries", "retry-wait", "timeout", "connect-timeout", "min-split-size"]
        for (name, value) in members {
            switch name {
            case "max-download-limit":
                try Self.apply(name, value, to: &options)
                rate = .some(options.rateLimit)
            case "split", "max-connection-per-server":
                options.connections = connections ?? nil
                try Self.apply(name, value, to: &options)
                connections = .some(options.connections)
            case _ where tunable.contains(name):
                try Self.apply(name, value, to: &options)
                tuningChanged = true
            case "header":
                try Self.apply(name, value, to: &options)  // the list replaces the download's headers, as aria2
                replaceHeaders = true
            case "user-agent", "referer":
                var one = DownloadManager.AddOptions()
                try Self.apply(name, value, to: &one)
                for field in one.headers { fields.add(name: field.name, value: field.value) }
                fieldsGiven = true
            case "dir", "out":
                throw Failure.aria2("option \(name) cannot be changed once the download is added")
            default:
                guard Self.ignoredOptions.contains(name) else {
                    throw Failure.aria2("option \(name) cannot be changed on a download that was added")
                }
            }
        }
        // The options first: they refuse a finished download before the rate is set.
        if connections != nil || tuningChanged || replaceHeaders || fieldsGiven {
            try await manager.setOptions(
                id, connections: connections, tuning: tuningChanged ? options.tuning : nil,
                headers: replaceHeaders ? options.headers : nil, headerFields: fieldsGiven ? fields : nil)
        }
        if let rate { try await manager.setRateLimit(id, rate) }
    }

    func globalOptions() async -> JSON {
        let configuration = await manager.configuration
        return .object([
            ("dir", .string(configuration.downloadDirectory)),
            ("max-concurrent-downloads", .string(String(configuration.maxConcurrentDownloads))),
            ("max-overall-download-limit", .string(String(configuration.rateLimit ?? 0))),
            ("max-connection-per-server", .string("16")),  // the most one download opens
            // aria2 clients read a number: the configured count, or 4, the most the automatic choice opens.
            ("split", .string(String(configuration.connections ?? 4))),
            ("max-tries", .string(String(configuration.retry.maxRetries + 1))),
            ("continue", .string("true")),
        ])
    }

    /// `changeGlobalOption`: every option is checked before any is changed.
    func changeGlobalOption(_ members: [(String, JSON)]) async throws {
        var changes: [@Sendable (DownloadManager) async throws -> Void] = []
        for (name, value) in members {
            let text = value.string ?? value.integer.map(String.init) ?? ""
            switch name {
            case "max-concurrent-downloads":
                guard let count = Int(text), (1...1_000).contains(count) else {
                    throw Failure.aria2("option \(name): \(text) is not 1…1000")
                }
                changes.append { try await $0.setMaxConcurrentDownloads(count) }
            case "max-overall-download-limit":
                let rate: Int64?
                if text == "0" {
                    rate = nil
                } else {
                    guard let parsed = RateLimiter.parse(text) else {
                        throw Failure.aria2("option \(name): \(text) is not a rate")
                    }
                    rate = parsed
                }
                changes.append { try await $0.setRateLimit(rate) }
            case "max-connection-per-server":
                // aria2's is each download's default; Stitch caps a download at 16 and chooses below that itself.
                let range = DownloadOptions.connectionRange
                guard let count = Int(text), range.contains(count) else {
                    throw Failure.aria2("option \(name): \(text) is not \(range.lowerBound)…\(range.upperBound)")
                }
                guard count == range.upperBound else {
                    throw Failure.aria2(
                        "option max-connection-per-server is set per download in Stitch (split or "
                            + "max-connection-per-server in addUri); the daemon's cap over all downloads of a host is "
                            + "set when it starts")
                }
            default:
                throw Failure.aria2("option \(name) cannot be changed while the server runs")
            }
        }
        for change in changes { try await change(manager) }
    }

    static func directory(of snapshot: DownloadSnapshot) -> String {
        switch snapshot.destination {
        case .directory(let folder): return folder
        case .file(let file):
            guard let slash = file.lastIndex(of: "/") else { return "." }
            return slash == file.startIndex ? "/" : String(file[..<slash])
        }
    }
}
