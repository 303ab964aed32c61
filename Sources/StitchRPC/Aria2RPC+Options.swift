import Foundation
import Stitch
import StitchLocks

// addUri, aria2's options (supported, ignored, refused), changeOption and the global options.
extension Aria2RPC {
    // MARK: addUri

    /// - Parameters:
    ///   - importing: an entry of an aria2 session (``importSession(_:source:)``): a URL the manager holds for the
    ///     same place is that download, and a partial aria2c left (`FILE` with `FILE.aria2`) is adopted.
    ///   - nameFromURI: with `importing` and no `out`, look for aria2c's partial under the name aria2c gives the
    ///     URI (false when another entry of the session would name the same file).
    func addUri(_ params: [JSON], importing: Bool = false, nameFromURI: Bool = true) async throws -> JSON {
        guard let uris = params.first?.array else { throw Self.badParameter(params, 0, "an array of URIs") }
        guard !uris.isEmpty else { throw Failure.aria2("URI is not provided.") }
        let urls = try uris.map { uri -> String in
            guard let text = uri.string else { throw Self.badParameter(params, 0, "a URI is not a string") }
            return text
        }
        for url in urls { try Self.checkScheme(url) }
        var options = DownloadManager.AddOptions()
        // aria2 adds a new download (a new GID, `NAME.1.EXT`) for a URL it holds; an import finds it.
        options.reuseExisting = importing
        var members: [(String, JSON)] = []
        if params.count > 1 {
            guard let given = params[1].members else { throw Self.badParameter(params, 1, "the options are an object") }
            guard given.count <= Self.maxOptionKeys else {
                throw Failure.aria2("an option object has at most \(Self.maxOptionKeys) keys, not \(given.count)")
            }
            members = given
        }
        let base = await manager.configuration.downloadDirectory
        try applyDefaults(to: &options, given: Set(members.map(\.0)), base: base)
        for (name, value) in members { try Self.apply(name, value, to: &options, base: base) }
        // The call's proxy credentials, given apart from its URLs, go on the call's own proxies only: a default's
        // credentials stay with the default proxy (the manager's, chosen when the download runs), never sent to a
        // proxy a caller names.
        var credentialTexts: [String: String] = [:]
        for (name, value) in members where Self.proxyCredentialNames.contains(name) {
            credentialTexts[name] = try Self.optionText(name, value)
        }
        Self.applyProxyCredentials(credentialTexts, to: &options.proxies)
        let user = members.first { $0.0 == "http-user" }?.1.string.flatMap { $0.isEmpty ? nil : $0 }
        let password = members.first { $0.0 == "http-passwd" }?.1.string.flatMap { $0.isEmpty ? nil : $0 }
        // getOption's placeholder is not the password: credentials copied from it are left out.
        if password != Self.hidden, user != nil || password != nil {
            let pair = Array("\(user ?? ""):\(password ?? "")".utf8)
            options.headers.add(name: "Authorization", value: "Basic " + Data(pair).base64EncodedString())
        }
        let folder = options.directory ?? base
        if importing {
            // aria2c's partial: FILE and its control file FILE.aria2, named by `out` or by the URI as aria2c names it.
            let name = options.out ?? (nameFromURI ? Self.aria2Name(urls[0]) : nil)
            if let name, FileManager.default.fileExists(atPath: folder + "/" + name + ".aria2") {
                options.out = name
                options.adopt = true
            }
        }
        if let reservedFolder {
            // Compared with links resolved: `dir` may name the folder through another path to it.
            let target = Confinement.resolvedPath(folder + (options.out.map { "/" + $0 } ?? ""))
            let root = Confinement.resolved(base)
            let reserved = (root == "/" ? "" : root) + "/" + reservedFolder
            if target == reserved || target.hasPrefix(reserved + "/") {
                throw Failure.aria2("\(reservedFolder) in the download folder is the daemon's own; choose another name")
            }
        }
        var folders = options.directory.map { [$0] } ?? []
        if let out = options.out, out.contains("/") {
            // `out`'s folders, with their links resolved, must lie inside the served folder too.
            let parent = (folder + "/" + out as NSString).deletingLastPathComponent
            do { folders.append(try Confinement.folder(parent, within: base)) } catch {
                throw Failure.aria2("option out: \(out.debugDescription) leads outside the served folder \(base)")
            }
        }
        // Read before anything is made: a bad position adds nothing. The add and the move are one step of the
        // manager.
        if params.count > 2 { options.position = .fromStart(try Self.int(params, 2, "position")) }
        if let out = options.out {
            for path in [folder + "/" + out, folder + "/" + out + ".part"] { try Self.checkNotALink(path) }
        }
        // Made here, inside the served folder (checked by `apply` and above), as aria2 makes its `dir`; the ones
        // made are removed again if the add fails (when still empty), so a refused add leaves nothing.
        var made: [String] = []
        for wanted in folders {
            var missing: [String] = []
            var path = wanted
            while path.count > 1, !FileManager.default.fileExists(atPath: path) {
                missing.append(path)
                path = (path as NSString).deletingLastPathComponent
            }
            try? DownloadPaths.createFolder(wanted)
            made += missing
        }
        // Several URIs are mirrors of one file, as in aria2: kept with the download and tried in turn.
        if urls.count > 1 { options.mirrors = urls }
        do {
            let id = try await manager.add(urls[0], options: options)
            return .string("\(id)")
        } catch {
            // Deepest first; a folder something else has filled meanwhile stays.
            for path in made.sorted(by: { $0.count > $1.count }) { rmdir(path) }
            throw error
        }
    }

    /// The file name aria2c gives a download of `uri` without `out`: the last segment of its path, percent-decoded
    /// (nil when there is none, or it is no plain file name).
    static func aria2Name(_ uri: String) -> String? {
        guard let components = URLComponents(string: uri) else { return nil }
        let name = (components.percentEncodedPath.split(separator: "/").last.map(String.init) ?? "").removingPercentEncoding
        guard let name, !name.isEmpty, name != ".", name != "..", !name.contains("/"), !name.contains("\u{0}") else {
            return nil
        }
        return name
    }

    /// aria2's option `name` (values are strings in aria2; numbers and booleans are taken too). An empty value
    /// is no value: the default stays.
    /// - Parameter base: the served folder that `dir` must stay inside; nil refuses `dir`.
    static func apply(
        _ name: String, _ value: JSON, to options: inout DownloadManager.AddOptions, base: String? = nil
    ) throws {
        let text = try optionText(name, value)
        guard !text.isEmpty else { return }
        func flag() throws -> Bool {
            switch text {
            case "true": return true
            case "false": return false
            default: throw Failure.aria2("option \(name): expected true or false, not \(text)")
            }
        }
        switch name {
        case "out":
            // A file name in the download folder, or a path below it (its folders are made, as aria2 makes them):
            // nothing absolute, no `.` or `..`; addUri checks the folders' links.
            let components = text.split(separator: "/", omittingEmptySubsequences: false)
            guard !text.hasPrefix("/"), !text.contains("\u{0}"),
                components.allSatisfy({ !$0.isEmpty && $0 != "." && $0 != ".." })
            else {
                throw Failure.aria2(
                    "option out: \(text.debugDescription) must be a file name or a path inside the folder (no '..')")
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
            for line in text.split(separator: "\n").map(String.init) where !line.isEmpty {
                guard let (field, content) = Downloader.parseHeaderLine(line) else {
                    throw Failure.aria2("option header: \(line.debugDescription) is not a header")
                }
                // getOption's placeholder for a hidden value is not a value: a header copied from it is left out.
                if hiddenHeaders.contains(field.lowercased()), content == hidden { continue }
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
        case "gid":
            // aria2's rule: exactly 16 hex digits, not all zero.
            guard text.utf8.count == 16, let id = DownloadID(text), id.rawValue != 0 else {
                throw Failure.aria2("option gid: \(text.debugDescription) is not 16 hex digits")
            }
            options.id = id
        case "allow-overwrite":
            options.overwrite = try flag()
        case "conditional-get":
            options.ifNewer = try flag()
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
        case "all-proxy", "http-proxy", "https-proxy":
            let proxy: TransportOptions.Proxy
            do { proxy = try TransportOptions.Proxy(parsing: text) } catch {
                throw Failure.aria2("option \(name): \(error)")
            }
            switch name {
            case "all-proxy": options.proxies.all = proxy
            case "http-proxy": options.proxies.http = proxy
            default: options.proxies.https = proxy
            }
        case "no-proxy":
            guard !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
                throw Failure.aria2("option no-proxy: host names separated by commas, without control characters")
            }
            options.proxies.noProxy = text
        case _ where proxyCredentialNames.contains(name):
            break  // set on their proxy by applyProxyCredentials, whatever the order they came in
        default:
            guard let option = Aria2Option.named[name] else {
                throw Failure.aria2("option \(name) is not an option of aria2 (docs/rpc.md lists them)")
            }
            try option.check(text)
            // A daemon's option is not a download's: aria2 ignores it in addUri too.
            guard option.scope == .download, option.handling == .fixed else { return }
            let shown: String? = if case .value(let value) = option.shown { value } else { nil }
            guard option.same(text, shown) else {
                throw Failure.aria2("option \(name): Stitch cannot do \(option.shown(text)): \(option.why)")
            }
        }
    }

    // MARK: Proxies

    /// The options naming a proxy's user or password.
    static let proxyCredentialNames: Set<String> = [
        "all-proxy-user", "all-proxy-passwd", "http-proxy-user", "http-proxy-passwd", "https-proxy-user",
        "https-proxy-passwd",
    ]

    /// The options set when a download is added whose defaults the configuration file and changeGlobalOption set.
    static let defaultableAtAdd: Set<String> = ["allow-overwrite", "conditional-get"]

    /// Gives each proxy of `proxies` the user and password `texts` name for it (`all-proxy-user`, …); an empty value
    /// or getOption's placeholder leaves what it has. Credentials for a proxy not named are dropped.
    static func applyProxyCredentials(_ texts: [String: String], to proxies: inout DownloadManager.Proxies) {
        for kind in DownloadManager.Proxies.Kind.allCases {
            let user = texts[kind.rawValue + "-proxy-user"]
            // Empty and the placeholder leave the password as it is here (proxyChange removes an emptied one).
            let password = texts[kind.rawValue + "-proxy-passwd"].flatMap { $0.isEmpty || $0 == hidden ? nil : $0 }
            proxies.setCredentials(kind, user: user, password: password)
        }
    }

    /// The proxy options: set as defaults they are the manager's proxies (``DownloadManager/Configuration/proxies``),
    /// applied when a download runs, not copied into each download.
    static let proxyOptionNames: Set<String> = proxyCredentialNames.union([
        "all-proxy", "http-proxy", "https-proxy", "no-proxy",
    ])

    /// The proxies the defaults name (the configuration file's and changeGlobalOption's), with their credentials.
    func proxyDefaults() -> DownloadManager.Proxies {
        let defaults = settings.withLock { $0.defaults }
        var proxies = DownloadManager.Proxies()
        for name in ["all-proxy", "http-proxy", "https-proxy"] {
            guard let text = defaults[name], !text.isEmpty else { continue }
            var scratch = DownloadManager.AddOptions()
            guard (try? Self.apply(name, .string(text), to: &scratch)) != nil else { continue }
            proxies = scratch.proxies.over(proxies)
        }
        if let noProxy = defaults["no-proxy"], !noProxy.isEmpty { proxies.noProxy = noProxy }
        Self.applyProxyCredentials(defaults.filter { Self.proxyCredentialNames.contains($0.key) }, to: &proxies)
        return proxies
    }

    /// Gives the manager the proxies the defaults name now.
    public func applyProxyDefaults() async {
        try? await manager.setProxies(proxyDefaults())
    }

    /// A proxy as getOption shows it: its URL without credentials; nil for none.
    static func shownProxy(_ proxy: TransportOptions.Proxy?) -> String? {
        guard let proxy, !proxy.url.isEmpty else { return nil }
        return proxy.url
    }

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

    /// A download's URIs as aria2 lists them: the one in use (`used`) first once the download has started, then the
    /// others in their order (`waiting`); before it starts, all `waiting` in their order.
    static func uris(_ snapshot: DownloadSnapshot) -> JSON {
        let all = snapshot.mirrors.isEmpty ? [snapshot.url] : snapshot.mirrors
        let started: Bool
        switch snapshot.status {
        case .queued, .paused: started = snapshot.progress.bytes > 0
        case .running, .completed, .failed, .removed: started = true
        }
        func entry(_ uri: String, _ status: String) -> JSON { .object([("uri", .string(uri)), ("status", .string(status))]) }
        guard started, let used = all.firstIndex(of: snapshot.url) else { return .array(all.map { entry($0, "waiting") }) }
        return .array([entry(all[used], "used")] + all.indices.filter { $0 != used }.map { entry(all[$0], "waiting") })
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

    static func directory(of snapshot: DownloadSnapshot) -> String {
        switch snapshot.destination {
        case .directory(let folder): return folder
        case .file(let file):
            guard let slash = file.lastIndex(of: "/") else { return "." }
            return slash == file.startIndex ? "/" : String(file[..<slash])
        }
    }
}
