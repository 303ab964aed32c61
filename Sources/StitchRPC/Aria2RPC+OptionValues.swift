import Foundation
import Stitch
import StitchLocks

// aria2's options as front-ends read and send them: getOption and getGlobalOption report every option of
// aria2 (Aria2OptionTable.swift) with the value Stitch acts on; changeOption and changeGlobalOption take a whole
// option object, as a settings dialog sends it.
extension Aria2RPC {
    // MARK: Values

    /// What the values reported depend on besides a download: the manager's settings, the defaults for new
    /// downloads set over RPC, and the daemon's own settings.
    struct OptionContext: Sendable {
        var configuration: DownloadManager.Configuration
        /// Download options set with `changeGlobalOption`: what `addUri` gives a new download unless it says
        /// otherwise, as aria2's global options are its new downloads' template.
        var defaults: [String: String]
        /// The daemon's start-up settings (`rpc-listen-port`, `log`, …).
        var daemon: [String: String]
    }

    func optionContext() async -> OptionContext {
        let (defaults, daemon) = settings.withLock { ($0.defaults, $0.daemon) }
        return OptionContext(configuration: await manager.configuration, defaults: defaults, daemon: daemon)
    }

    /// The most connections the automatic choice opens: what `split` shows when Stitch chooses.
    static let automaticConnections = 4

    /// The text of an option's JSON value: a string as it is, a number or a boolean as aria2 writes them, an
    /// array of strings (aria2's `header`) as lines.
    static func optionText(_ name: String, _ value: JSON) throws -> String {
        switch value {
        case .string(let string): return string
        case .integer(let number): return String(number)
        case .bool(let flag): return flag ? "true" : "false"
        case .array(let items) where items.allSatisfy({ $0.string != nil }):
            return items.compactMap(\.string).joined(separator: "\n")
        default: throw Failure.aria2(Aria2Option.problem(name, "its value is not a string"))
        }
    }

    /// The value of a download option when the download has none of its own: the manager's.
    static func builtInValue(_ name: String, _ configuration: DownloadManager.Configuration) -> String? {
        switch name {
        case "split", "max-connection-per-server": String(configuration.connections ?? automaticConnections)
        case "max-download-limit": "0"
        case "min-split-size": String(configuration.minimumSplitSize)
        case "max-tries": tries(configuration.retry.maxRetries)
        case "retry-wait": seconds(configuration.retry.baseDelay)
        case "timeout": seconds(configuration.transport.stallTimeout)
        case "connect-timeout": seconds(configuration.transport.connectTimeout)
        case "user-agent": configuration.transport.userAgent
        case "allow-overwrite", "conditional-get": "false"
        case "dir": configuration.downloadDirectory
        default: nil
        }
    }

    static func tries(_ retries: Int) -> String { retries >= Int(Int32.max) - 1 ? "0" : String(retries + 1) }

    /// Whole seconds, as aria2 takes them (a fraction is shown as the next whole second).
    static func seconds(_ value: Double) -> String { String(Int64(min(max(value, 0), 1e9).rounded(.up))) }

    /// Header fields whose values are never shown back (a read may travel as a GET, even as JSONP).
    static let hiddenHeaders: Set<String> = ["authorization", "cookie", "proxy-authorization"]
    static let hidden = "(hidden)"

    /// Why credentials are never a default for new downloads.
    static let credentialDefault = "credentials are given per download: a default would send them to every server"

    /// The first field of `headers` that carries credentials, if any.
    static func credentialField(_ headers: HTTPHeaders) -> String? {
        headers.first { hiddenHeaders.contains($0.name.lowercased()) }?.name
    }

    /// The user of an `Authorization: Basic` header, and its password.
    static func basicCredentials(_ headers: HTTPHeaders) -> (user: String, password: String)? {
        guard let value = headers["Authorization"], value.lowercased().hasPrefix("basic "),
            let data = Data(base64Encoded: String(value.dropFirst(6)).trimmingCharacters(in: .whitespaces)),
            let pair = String(data: data, encoding: .utf8), let colon = pair.firstIndex(of: ":")
        else { return nil }
        return (String(pair[..<colon]), String(pair[pair.index(after: colon)...]))
    }

    /// What `getOption` shows for `option` of the download `snapshot`; nil leaves it out.
    static func value(of option: Aria2Option, for snapshot: DownloadSnapshot, _ context: OptionContext) -> String? {
        switch option.shown {
        case .none: return nil
        case .value(let value): return value
        case .computed: break
        }
        let tuning = snapshot.tuning
        let configuration = context.configuration
        switch option.name {
        case "dir": return directory(of: snapshot)
        case "out":
            if case .file(let file) = snapshot.destination { return (file as NSString).lastPathComponent }
            return snapshot.path.map { ($0 as NSString).lastPathComponent }
        case "allow-overwrite": return snapshot.overwrite ? "true" : "false"
        case "conditional-get": return snapshot.ifNewer ? "true" : "false"
        case "checksum": return snapshot.checksum.map { "\($0)" }
        case "split", "max-connection-per-server":
            return snapshot.connections.map(String.init) ?? builtInValue(option.name, configuration)
        case "max-download-limit": return String(snapshot.rateLimit ?? 0)
        case "min-split-size": return String(tuning.minimumSplitSize ?? configuration.minimumSplitSize)
        case "max-tries": return tries(tuning.maxRetries ?? configuration.retry.maxRetries)
        case "retry-wait": return seconds(tuning.retryDelay ?? configuration.retry.baseDelay)
        case "timeout": return seconds(tuning.stallTimeout ?? configuration.transport.stallTimeout)
        case "connect-timeout": return seconds(tuning.connectTimeout ?? configuration.transport.connectTimeout)
        case "header":
            let lines = snapshot.headers.map {
                "\($0.name): \(hiddenHeaders.contains($0.name.lowercased()) ? hidden : $0.value)"
            }
            return lines.isEmpty ? nil : lines.joined(separator: "\n")
        case "user-agent": return snapshot.headers["User-Agent"] ?? configuration.transport.userAgent
        case "referer": return snapshot.headers["Referer"]
        case "http-user": return basicCredentials(snapshot.headers)?.user
        case "http-passwd": return basicCredentials(snapshot.headers) == nil ? nil : hidden
        case "all-proxy", "http-proxy", "https-proxy", "all-proxy-user", "http-proxy-user", "https-proxy-user",
            "all-proxy-passwd", "http-proxy-passwd", "https-proxy-passwd", "no-proxy":
            // The download's own, else the default it runs with.
            let own = snapshot.proxies
            let chosen = own.over(configuration.proxies)
            let kind = String(option.name.prefix { $0 != "-" })
            let proxy = kind == "all" ? chosen.all : kind == "http" ? chosen.http : kind == "https" ? chosen.https : nil
            if option.name == "no-proxy" { return chosen.noProxy }
            if option.name.hasSuffix("-user") { return proxy?.user }
            if option.name.hasSuffix("-passwd") { return proxy?.password == nil ? nil : hidden }
            return shownProxy(proxy)
        default: return builtInValue(option.name, configuration)
        }
    }

    /// What `getGlobalOption` shows for `option`; nil leaves it out.
    static func globalValue(of option: Aria2Option, _ context: OptionContext) -> String? {
        switch option.shown {
        case .none: return nil
        case .value(let value): return value
        case .computed: break
        }
        let configuration = context.configuration
        switch option.name {
        case "max-concurrent-downloads": return String(configuration.maxConcurrentDownloads)
        case "max-overall-download-limit": return String(configuration.rateLimit ?? 0)
        case "out", "checksum", "http-user", "http-passwd": return nil  // a download's own, never a default
        default:
            if option.scope == .download {
                let value = context.defaults[option.name] ?? builtInValue(option.name, configuration)
                // A secret is never shown back; a proxy's URL is shown without credentials (a config file's may
                // hold them).
                if option.isSecret, value != nil { return hidden }
                if ["all-proxy", "http-proxy", "https-proxy"].contains(option.name), let value {
                    return (try? TransportOptions.Proxy(parsing: value)).flatMap { shownProxy($0) }
                }
                return value
            }
            return context.daemon[option.name]
        }
    }

    /// A download's options as `getOption` shows them: every download option of aria2 with a value, sorted by
    /// name, values as strings.
    static func options(of snapshot: DownloadSnapshot, _ context: OptionContext) -> JSON {
        .object(
            Aria2Option.table.compactMap { option in
                guard option.scope == .download else { return nil }
                return value(of: option, for: snapshot, context).map { (option.name, JSON.string($0)) }
            })
    }

    func globalOptions() async -> JSON {
        let context = await optionContext()
        return .object(
            Aria2Option.table.compactMap { option in
                Self.globalValue(of: option, context).map { (option.name, JSON.string($0)) }
            })
    }

    // MARK: Changes

    /// At most this many keys in one option object (aria2 has 206 options).
    static let maxOptionKeys = 1_000

    /// The options of an option object, each with its value read and checked: a name that is not aria2's goes to
    /// `refused`; a malformed value, or more than ``maxOptionKeys`` keys, throws.
    static func read(_ members: [(String, JSON)], refused: inout [String]) throws -> [(Aria2Option, String)] {
        guard members.count <= maxOptionKeys else {
            throw Failure.aria2("an option object has at most \(maxOptionKeys) keys, not \(members.count)")
        }
        var read: [(Aria2Option, String)] = []
        for (name, value) in members {
            guard let option = Aria2Option.named[name] else {
                refused.append("\(name) (not an option of aria2)")
                continue
            }
            let text = try optionText(name, value)
            try option.check(text)
            read.append((option, text))
        }
        return read
    }

    /// The refusal of changes Stitch cannot make, naming every key (at most 20, then how many more).
    static func refusal(_ refused: [String]) -> Failure {
        let named = refused.prefix(20).joined(separator: "; ")
        let more = refused.count > 20 ? "; and \(refused.count - 20) more" : ""
        return .aria2(
            "nothing was changed: Stitch cannot make \(refused.count == 1 ? "this change" : "these changes"): \(named)\(more)"
        )
    }

    /// `changeOption`: a whole option object, as a settings dialog sends it. A value equal to what `getOption`
    /// shows changes nothing; an empty value unsets (the default for new downloads comes back); an ignored
    /// option is taken; a daemon's option is not a download's and is passed over, as aria2 does. A malformed value
    /// fails the call; a change Stitch cannot make (an option it does one way, or the folder and name once added)
    /// refuses it, naming every such key. Either way nothing is changed; otherwise every change is made in one
    /// step of the manager (a running download goes on from its bytes with them).
    func changeOption(_ id: DownloadID, _ members: [(String, JSON)]) async throws {
        var refused: [String] = []
        let read = try Self.read(members, refused: &refused)
        guard let snapshot = await manager.download(id) else { throw Failure.aria2("GID \(id) is not found") }
        switch snapshot.status {
        case .queued, .running, .paused: break
        case .completed, .failed, .removed:
            // aria2's answer: only a download in the queue has options to change.
            throw Failure.aria2("Cannot change option for GID#\(id): it has stopped")
        }
        let context = await optionContext()
        var changes: [String: String] = [:]
        for (option, text) in read {
            let name = option.name
            guard option.scope == .download,
                !option.same(text, Self.value(of: option, for: snapshot, context))
            else { continue }
            switch option.handling {
            case .ignored: continue
            case .fixed, .addOnly: refused.append("\(name) (\(option.why))")
            case .applied: changes[name] = text.isEmpty ? context.defaults[name] ?? "" : text
            }
        }
        guard refused.isEmpty else { throw Self.refusal(refused) }
        guard !changes.isEmpty else { return }
        let change = try Self.downloadChange(changes, snapshot: snapshot)
        if change.connections != nil || change.tuning != nil || change.headers != nil || change.proxies != nil {
            try await manager.setOptions(
                id, connections: change.connections, editTuning: change.tuning,
                editHeaders: change.headers, editProxies: change.proxies)
        }
        if let rate = change.rate { try await manager.setRateLimit(id, rate) }
    }

    /// What a set of option changes comes to for the manager.
    struct DownloadChange: Sendable {
        var connections: Int??
        var rate: Int64??
        var tuning: (@Sendable (inout DownloadManager.Tuning) -> Void)?
        var headers: (@Sendable (inout HTTPHeaders) -> Void)?
        var proxies: (@Sendable (inout DownloadManager.Proxies) -> Void)?
    }

    /// Reads `changes` (option name → its new text, "" to unset) of a download's applied options.
    static func downloadChange(_ changes: [String: String], snapshot: DownloadSnapshot) throws -> DownloadChange {
        var change = DownloadChange()
        func parsed(_ name: String) throws -> DownloadManager.AddOptions? {
            guard let text = changes[name], !text.isEmpty else { return nil }
            var options = DownloadManager.AddOptions()
            try apply(name, .string(text), to: &options)
            return options
        }
        // Connections: aria2 opens the smaller of split and max-connection-per-server.
        let counts = try ["split", "max-connection-per-server"].filter { changes[$0] != nil }.map {
            try parsed($0)?.connections
        }
        if !counts.isEmpty { change.connections = .some(counts.contains(nil) ? nil : counts.compactMap { $0 }.min()) }
        if changes["max-download-limit"] != nil { change.rate = .some(try parsed("max-download-limit")?.rateLimit) }
        var tuning = DownloadManager.Tuning()
        var unset: Set<String> = []
        for name in ["max-tries", "retry-wait", "timeout", "connect-timeout", "min-split-size"]
        where changes[name] != nil {
            guard let options = try parsed(name) else {
                unset.insert(name)
                continue
            }
            let given = options.tuning
            tuning.maxRetries = given.maxRetries ?? tuning.maxRetries
            tuning.retryDelay = given.retryDelay ?? tuning.retryDelay
            tuning.stallTimeout = given.stallTimeout ?? tuning.stallTimeout
            tuning.connectTimeout = given.connectTimeout ?? tuning.connectTimeout
            tuning.minimumSplitSize = given.minimumSplitSize ?? tuning.minimumSplitSize
        }
        if tuning != DownloadManager.Tuning() || !unset.isEmpty {
            let set = tuning
            let cleared = unset
            change.tuning = { current in
                if cleared.contains("max-tries") { current.maxRetries = nil }
                if cleared.contains("retry-wait") { current.retryDelay = nil }
                if cleared.contains("timeout") { current.stallTimeout = nil }
                if cleared.contains("connect-timeout") { current.connectTimeout = nil }
                if cleared.contains("min-split-size") { current.minimumSplitSize = nil }
                if let value = set.maxRetries { current.maxRetries = value }
                if let value = set.retryDelay { current.retryDelay = value }
                if let value = set.stallTimeout { current.stallTimeout = value }
                if let value = set.connectTimeout { current.connectTimeout = value }
                if let value = set.minimumSplitSize { current.minimumSplitSize = value }
            }
        }
        change.headers = try headerChange(changes, parsed: parsed)
        change.proxies = try proxyChange(changes)
        return change
    }

    /// The proxies' change: a URL replaces (empty: unset), `no-proxy` likewise, then the credentials are set on
    /// their proxies (getOption's placeholder keeps the password).
    private static func proxyChange(
        _ changes: [String: String]
    ) throws -> (@Sendable (inout DownloadManager.Proxies) -> Void)? {
        let urlNames = ["all-proxy", "http-proxy", "https-proxy"]
        guard (urlNames + ["no-proxy"]).contains(where: { changes[$0] != nil })
            || proxyCredentialNames.contains(where: { changes[$0] != nil })
        else { return nil }
        var urls: [String: TransportOptions.Proxy?] = [:]
        for name in urlNames {
            guard let text = changes[name] else { continue }
            if text.isEmpty {
                urls[name] = .some(nil)
                continue
            }
            var scratch = DownloadManager.AddOptions()
            try apply(name, .string(text), to: &scratch)
            urls[name] = .some(scratch.proxies.proxy(for: name == "https-proxy" ? "https:" : "http:"))
        }
        if let text = changes["no-proxy"], !text.isEmpty {
            var scratch = DownloadManager.AddOptions()
            try apply("no-proxy", .string(text), to: &scratch)
        }
        let noProxy = changes["no-proxy"].map { $0.isEmpty ? nil : $0 }
        let credentials = changes.filter { proxyCredentialNames.contains($0.key) }
        let given = urls
        return { proxies in
            if let value = given["all-proxy"] { proxies.all = value }
            if let value = given["http-proxy"] { proxies.http = value }
            if let value = given["https-proxy"] { proxies.https = value }
            if let noProxy { proxies.noProxy = noProxy }
            // A URL given anew without credentials keeps none; credentials given apart are set on it.
            applyProxyCredentials(credentials, to: &proxies)
            for kind in DownloadManager.Proxies.Kind.allCases where credentials[kind.rawValue + "-proxy-passwd"] == "" {
                proxies.setCredentials(kind, user: nil, password: "")  // an emptied password removes it
            }
        }
    }

    /// The headers' change: `header` replaces the list (a hidden field sent back as shown keeps its value), then
    /// `user-agent`, `referer` and the credentials set or remove their fields.
    private static func headerChange(
        _ changes: [String: String], parsed: (String) throws -> DownloadManager.AddOptions?
    ) throws -> (@Sendable (inout HTTPHeaders) -> Void)? {
        let names = ["header", "user-agent", "referer", "http-user", "http-passwd"]
        guard names.contains(where: { changes[$0] != nil }) else { return nil }
        // Read here, not through `apply`, which leaves the placeholders out: here they keep the values they stand for.
        let list: [(String, String)]? = try changes["header"].map { text in
            try text.split(separator: "\n").filter { !$0.isEmpty }.map { line in
                guard let pair = Downloader.parseHeaderLine(String(line)) else {
                    throw Failure.aria2("option header: \(String(line).debugDescription) is not a header")
                }
                return pair
            }
        }
        var fields: [(String, String?)] = []
        for (option, field) in [("user-agent", "User-Agent"), ("referer", "Referer")] where changes[option] != nil {
            fields.append((field, try parsed(option)?.headers[field]))
        }
        let user = changes["http-user"]
        let password = changes["http-passwd"]
        let fieldsToSet = fields
        return { headers in
            let old = headers
            if let list {
                // A hidden field sent back as shown keeps its value; one that had none is left out.
                headers = HTTPHeaders(
                    list.compactMap { name, value in
                        guard hiddenHeaders.contains(name.lowercased()), value == hidden else { return (name, value) }
                        return old[name].map { (name, $0) }
                    })
            }
            func set(_ name: String, _ value: String?) {
                var pairs = headers.map { ($0.name, $0.value) }.filter { $0.0.lowercased() != name.lowercased() }
                if let value { pairs.append((name, value)) }
                headers = HTTPHeaders(pairs)
            }
            for (name, value) in fieldsToSet { set(name, value) }
            if user != nil || password != nil {
                let current = basicCredentials(old)
                let newUser = user ?? current?.user ?? ""
                let newPassword = password == hidden ? current?.password ?? "" : password ?? current?.password ?? ""
                set(
                    "Authorization",
                    newUser.isEmpty && newPassword.isEmpty
                        ? nil : "Basic " + Data("\(newUser):\(newPassword)".utf8).base64EncodedString())
            }
        }
    }

    /// `changeGlobalOption`: a whole option object (or one key, as AriaNg sends). A download option sets the
    /// default for new downloads (aria2's global options are their template); `max-concurrent-downloads` and
    /// `max-overall-download-limit` change the daemon's; a value equal to what `getGlobalOption` shows changes
    /// nothing. Malformed values and changes Stitch cannot make refuse the call, naming every such key; nothing
    /// is changed then.
    func changeGlobalOption(_ members: [(String, JSON)]) async throws {
        var refused: [String] = []
        let read = try Self.read(members, refused: &refused)
        let context = await optionContext()
        var defaults: [String: String?] = [:]
        var changes: [@Sendable (DownloadManager) async throws -> Void] = []
        var daemonTexts: [String: String] = [:]
        for (option, text) in read {
            let name = option.name
            guard !option.same(text, Self.globalValue(of: option, context)) else { continue }
            // getOption's placeholder for a secret is not a value: sent back, it changes nothing.
            if option.isSecret, text == Self.hidden { continue }
            switch (option.handling, option.scope) {
            case (.ignored, _): continue
            case (.applied, .global):
                changes.append(try daemonChange(name, text))
                daemonTexts[name] = text
            case (.applied, .download) where name != "http-user" && name != "http-passwd",
                (.addOnly, .download) where Self.defaultableAtAdd.contains(name):
                if !text.isEmpty {
                    var scratch = DownloadManager.AddOptions()
                    try Self.apply(name, .string(text), to: &scratch)  // checked as addUri will take it
                    if let field = Self.credentialField(scratch.headers) {
                        refused.append("\(name) (\(field): \(Self.credentialDefault))")
                        continue
                    }
                    if name.hasSuffix("-proxy"), TransportOptions.Proxy.hasCredentials(text) {
                        // Kept in the catalog, the URL must hold no password: it goes in NAME-passwd (memory only).
                        refused.append("\(name) (give its credentials with \(name)-user and \(name)-passwd)")
                        continue
                    }
                }
                defaults[name] = .some(text.isEmpty ? nil : text)
            case (.applied, _):
                refused.append("\(name) (\(Self.credentialDefault))")
            case (.addOnly, _):
                refused.append(
                    "\(name) (\(name == "dir" ? "the served folder is set when stitch serve starts; give dir per download" : "it is given per download"))"
                )
            case (.fixed, _):
                refused.append("\(name) (\(option.why))")
            }
        }
        guard refused.isEmpty else { throw Self.refusal(refused) }
        // Kept first, so a restart has what the client was told is set; then made.
        var kept: [String: String?] = [:]
        // A password is not kept (the catalog is no place for it): after a restart it is given again.
        for (name, value) in defaults where !(Aria2Option.named[name]?.isSecret ?? false) {
            kept[Self.keptPrefix + name] = .some(value)
        }
        for (name, text) in daemonTexts { kept[Self.keptPrefix + name] = .some(text.isEmpty ? nil : text) }
        try await manager.keepSettings(kept)
        for change in changes { try await change(manager) }
        if !defaults.isEmpty {
            settings.withLock { settings in
                for (name, value) in defaults { settings.defaults[name] = value }
            }
            if defaults.keys.contains(where: Self.proxyOptionNames.contains) { await applyProxyDefaults() }
        }
    }

    /// The catalog's keys for the global options set over RPC (``DownloadManager/keepSettings(_:)``).
    static let keptPrefix = "rpc.option."

    /// Restores the global options set over RPC before a restart (kept in the catalog by `changeGlobalOption`),
    /// except those named in `overridden` (given on the command line, which wins). Returns a line for each one it
    /// could not take back (a kept value this version refuses), for the log.
    public func restoreKeptOptions(overriddenBy overridden: Set<String>) async -> [String] {
        let kept: [String: String]
        do { kept = try await manager.keptSettings() } catch { return ["cannot read the options kept: \(error)"] }
        var problems: [String] = []
        var defaults: [String: String] = [:]
        for (key, text) in kept.sorted(by: { $0.key < $1.key }) where key.hasPrefix(Self.keptPrefix) {
            let name = String(key.dropFirst(Self.keptPrefix.count))
            guard !overridden.contains(name) else { continue }
            do {
                guard let option = Aria2Option.named[name] else { throw Failure.aria2("not an option of aria2") }
                try option.check(text)
                if option.scope == .global {
                    try await daemonChange(name, text)(manager)
                } else {
                    var scratch = DownloadManager.AddOptions()
                    try Self.apply(name, .string(text), to: &scratch)
                    defaults[name] = text
                }
            } catch {
                problems.append("the option \(name)=\(text) set over RPC is not taken back: \(error)")
            }
        }
        settings.withLock { $0.defaults.merge(defaults) { _, kept in kept } }
        await applyProxyDefaults()
        return problems
    }

    /// A change of the daemon's own setting `name`.
    func daemonChange(_ name: String, _ text: String) throws -> @Sendable (DownloadManager) async throws -> Void {
        switch name {
        case "max-concurrent-downloads":
            guard let count = Int(text), (1...1_000).contains(count) else {
                throw Failure.aria2(Aria2Option.problem(name, "\(text.debugDescription) is not 1…1000"))
            }
            let follow = settings.withLock { $0.hostCapFollows }
            return { manager in
                try await manager.setMaxConcurrentDownloads(count)
                if follow { try await manager.setMaxConnectionsPerHost(max(16, count)) }
            }
        case "max-overall-download-limit":
            var scratch = DownloadManager.AddOptions()
            try Self.apply("max-download-limit", .string(text.isEmpty ? "0" : text), to: &scratch)
            let rate = scratch.rateLimit
            return { try await $0.setRateLimit(rate) }
        default:
            throw Failure.aria2("option \(name) cannot be changed while the server runs")
        }
    }

    /// The defaults `changeGlobalOption` set for new downloads, applied to an `addUri`'s options where it gives
    /// none of its own.
    func applyDefaults(to options: inout DownloadManager.AddOptions, given: Set<String>, base: String) throws {
        let defaults = settings.withLock { $0.defaults }
        // split and max-connection-per-server are one setting: either given keeps both defaults out.
        let connectionsGiven = given.contains("split") || given.contains("max-connection-per-server")
        for (name, text) in defaults.sorted(by: { $0.key < $1.key })
        where !given.contains(name) && !Self.proxyOptionNames.contains(name) {
            if connectionsGiven, name == "split" || name == "max-connection-per-server" { continue }
            try Self.apply(name, .string(text), to: &options, base: base)
        }
    }
}

extension Aria2Option {
    /// aria2's message for a malformed value (its clients show it), with what was wrong.
    static func problem(_ name: String, _ detail: String) -> String {
        "We encountered a problem while processing the option '--\(name)': \(detail)."
    }

    /// Checks a value against aria2's kind of the option: a malformed one fails with aria2's message naming the
    /// option and the value. An empty value (unset) always passes.
    func check(_ text: String) throws {
        guard !text.isEmpty else { return }
        func fail(_ detail: String) -> Aria2RPC.Failure {
            .aria2(Self.problem(name, "\(shown(text)) \(detail)"))
        }
        switch kind {
        case .bool:
            guard text == "true" || text == "false" else { throw fail("is not true or false") }
        case .number(let range):
            guard let number = Int64(text), range.contains(number) else {
                throw fail("is not a number in \(Self.describe(range))")
            }
        case .size(let range):
            guard let size = Self.size(text), range.contains(size) else {
                throw fail("is not a size in \(Self.describe(range)) (bytes, or with K or M)")
            }
        case .choice(let choices):
            guard choices.contains(text) else { throw fail("is not one of \(choices.joined(separator: ", "))") }
        case .checksum:
            guard (try? ExpectedChecksum(parsing: text)) != nil else { throw fail("is not TYPE=HEX (sha-256=…)") }
        case .lines, .text:
            guard !text.contains("\u{0}") else { throw fail("holds a NUL") }
        }
    }

    /// Whether the option's value is a password or a secret: never repeated in a message or a log.
    var isSecret: Bool { name.hasSuffix("passwd") || name == "rpc-secret" }

    /// A value as a message may repeat it: quoted, or `(hidden)` for a secret.
    func shown(_ text: String) -> String { isSecret ? Aria2RPC.hidden : text.debugDescription }

    static func describe(_ range: ClosedRange<Int64>) -> String {
        range.upperBound == .max ? "\(range.lowerBound) or more" : "\(range.lowerBound)…\(range.upperBound)"
    }

    /// A size as aria2 writes it (bytes, `K`, `M`), or with Stitch's units.
    static func size(_ text: String) -> Int64? { text == "0" ? 0 : ByteSize.parse(text) }

    /// Whether `text` is the value `current` shows (nil: unset, which "" is too): numbers and sizes by value,
    /// lines by their non-empty lines, the rest as written.
    func same(_ text: String, _ current: String?) -> Bool {
        guard let current else { return text.isEmpty }
        switch kind {
        case .number: return Int64(text).map { $0 == Int64(current) } ?? false
        case .size: return Self.size(text).map { $0 == Self.size(current) } ?? false
        case .lines:
            func lines(_ value: String) -> [Substring] { value.split(separator: "\n").filter { !$0.isEmpty } }
            return lines(text) == lines(current)
        default: return text == current
        }
    }
}
