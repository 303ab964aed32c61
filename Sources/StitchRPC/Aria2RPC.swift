import Foundation
import Synchronization
public import Stitch
import StitchLocks

/// aria2's JSON-RPC interface over a ``DownloadManager``: the JSON-RPC 2.0 envelope (single calls, batches,
/// `system.multicall`), the secret token, and the methods with aria2's parameter and result shapes (numbers as
/// strings, 16-hex-digit GIDs found by a unique prefix, the `keys` filter, negative offsets).
///
/// This is the layer a daemon's HTTP and WebSocket server hands request bodies to; it does no networking itself,
/// so every rule is a test without sockets. Bounded: the body is parsed with a nesting limit, batches and
/// multicalls have a maximum size, and nothing it is sent can make it write outside the manager's download
/// folder (`out` is a plain file name; `dir` is confined, links resolved: ``Confinement``).
///
/// Files: this one has the envelope and the calls that change something (through the manager actor);
/// Aria2RPC+Reading.swift the reads, answered from a view of the downloads (at once, on the caller's thread,
/// while the view is fresh); Aria2RPC+Options.swift `addUri` and aria2's options; Aria2RPC+Shapes.swift the
/// shapes of results and parameters.
///
/// Errors: the envelope's own (-32700 parse error, -32600 invalid request, -32602 `params` that is not an array)
/// as JSON-RPC defines them; an unknown method, a parameter missing or of the wrong type, and a method's failure as
/// aria2 answers them, code 1 with a message (HTTP 400).
public final class Aria2RPC: Sendable {
    /// The bounds on what one request may ask.
    public struct Limits: Sendable {
        /// Arrays and objects nested deeper than this are refused (a parse error).
        public var maxDepth = 32
        /// Calls in one batch, or in one `system.multicall`.
        public var maxCalls = 1_000
        public init() {}
    }

    public let manager: DownloadManager
    let secret: [UInt8]?
    let limits: Limits

    /// `secret`: the token every call must carry as its first parameter (`token:SECRET`), as aria2's
    /// `--rpc-secret`; nil for none.
    /// - Parameters:
    ///   - reservedFolder: a name in the download folder that `dir` and `out` may not use (the daemon's own
    ///     state).
    ///   - onShutdown: what `aria2.shutdown` and `aria2.forceShutdown` do (called after the reply is made); nil
    ///     refuses them.
    public init(
        manager: DownloadManager, secret: String?, limits: Limits = Limits(), reservedFolder: String? = nil,
        onShutdown: (@Sendable () -> Void)? = nil
    ) {
        self.manager = manager
        self.reservedFolder = reservedFolder
        self.secret = secret.map { Array($0.utf8) }
        self.limits = limits
        self.onShutdown = onShutdown
        var generator = SystemRandomNumberGenerator()
        self.sessionID = (0..<20).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }
            .joined()
    }

    let onShutdown: (@Sendable () -> Void)?
    let reservedFolder: String?

    /// What the option methods keep: the defaults for new downloads set over RPC, and the daemon's start-up
    /// settings that `getGlobalOption` reports.
    struct Settings: Sendable {
        var defaults: [String: String] = [:]
        var daemon: [String: String] = [:]
        /// Whether the cap on connections to one host follows `max-concurrent-downloads` (at least 16).
        var hostCapFollows = false
    }
    let settings = Locked(Settings())

    /// The daemon's start-up settings, by aria2's option names (`rpc-listen-port`, `rpc-secure`, `log`, …), as
    /// `getGlobalOption` reports them.
    public func reportDaemonOptions(_ options: [String: String]) {
        settings.withLock { $0.daemon = options }
    }

    /// Makes a change of `max-concurrent-downloads` set the manager's cap on connections to one host to at least
    /// as many (16 at the least), so that that many downloads from one server can run at once: what a daemon does
    /// when it was given no cap of its own.
    public func hostCapFollowsConcurrency(_ follows: Bool = true) {
        settings.withLock { $0.hostCapFollows = follows }
    }
    /// `aria2.getSessionInfo`'s id: new for each server that runs.
    let sessionID: String

    /// The methods this interface answers, as `system.listMethods` lists them.
    public static let methods: [String] = [
        "aria2.addUri", "aria2.addTorrent", "aria2.addMetalink", "aria2.remove", "aria2.forceRemove", "aria2.pause",
        "aria2.pauseAll", "aria2.forcePause", "aria2.forcePauseAll", "aria2.unpause", "aria2.unpauseAll",
        "aria2.tellStatus", "aria2.getUris", "aria2.getFiles", "aria2.getPeers", "aria2.getServers",
        "aria2.tellActive", "aria2.tellWaiting", "aria2.tellStopped", "aria2.changePosition", "aria2.changeUri",
        "aria2.getOption", "aria2.changeOption", "aria2.getGlobalOption", "aria2.changeGlobalOption",
        "aria2.getGlobalStat", "aria2.purgeDownloadResult", "aria2.removeDownloadResult", "aria2.getVersion",
        "aria2.getSessionInfo", "aria2.shutdown", "aria2.forceShutdown", "aria2.saveSession", "system.multicall",
        "system.listMethods", "system.listNotifications", "stitch.tellAll", "stitch.retry", "stitch.updateSource",
    ]

    /// The notifications a WebSocket client may receive.
    public static let notifications: [String] = [
        "aria2.onDownloadStart", "aria2.onDownloadPause", "aria2.onDownloadStop", "aria2.onDownloadComplete",
        "aria2.onDownloadError",
    ]

    // MARK: The envelope

    /// What one request body came to.
    public struct Reply: Sendable, Error {
        /// The response body; nil when nothing is to be sent (only notifications, calls without an `id`).
        public var body: [UInt8]?
        /// Calls in it refused for a wrong secret (the server slows such clients down).
        public var unauthorized: Int
        /// Calls in it refused for carrying no secret at all. Not a guess, so not slowed down: a page of another
        /// site can make a browser open the daemon's own page, whose first calls carry none, and must not get the
        /// user's own clients slowed down by it.
        public var missingSecret = 0
        /// Some call in it carried the right secret (a secret is set).
        public var authorized = false
        /// The HTTP status aria2 answers it with: 200, or for one call that failed 400 (a method's failure, an
        /// invalid request), 404 (no such method in JSON-RPC's code) or 500 (a parse error, invalid params). A
        /// batch is 200 whatever its calls came to.
        public var status = 200

        public init(
            body: [UInt8]?, unauthorized: Int = 0, missingSecret: Int = 0, authorized: Bool = false, status: Int = 200
        ) {
            self.body = body
            self.unauthorized = unauthorized
            self.missingSecret = missingSecret
            self.authorized = authorized
            self.status = status
        }

        /// aria2's HTTP status for a response with this error code (nil: a result).
        static func status(forError code: Int?) -> Int {
            switch code {
            case nil: 200
            case 1, -32600: 400
            case -32601: 404
            default: 500
            }
        }
    }

    /// How a request arrived, which limits what it may do.
    public enum Channel: Sendable {
        /// A POST body or a WebSocket message: any method.
        case full
        /// An HTTP GET (`?method=…&params=<base64>`), which a web page of any site can make a browser send
        /// (`<script>`, `<img>`) without the `Origin` header: only methods that change nothing.
        case readOnly
    }

    /// Handles one request body (a call or a batch) and returns the response body; nil when nothing is to be
    /// sent (only notifications, calls without an `id`).
    public func handle(_ body: [UInt8]) async -> [UInt8]? { await handle(body, channel: .full).body }

    /// Handles one request body that arrived over `channel`.
    public func handle(_ body: [UInt8], channel: Channel) async -> Reply {
        switch decode(body) {
        case .success(let request): return await handle(request, channel: channel)
        case .failure(let reply): return reply
        }
    }

    /// A request body parsed within the bounds, or the parse error's reply.
    public func decode(_ body: [UInt8]) -> Result<JSON, Reply> {
        do {
            return .success(try JSON.parse(body, maxDepth: limits.maxDepth))
        } catch {
            let response = Self.errorResponse(id: .null, code: -32700, message: "Parse error: \(error)")
            return .failure(Reply(body: response.serialized, status: Reply.status(forError: -32700)))
        }
    }

    /// Handles one parsed request (a call or a batch).
    public func handle(_ request: JSON, channel: Channel) async -> Reply {
        let record = CallRecord(channel: channel)
        let (body, status) = await handle(request, record)
        return Reply(
            body: body, unauthorized: record.failures, missingSecret: record.missing, authorized: record.authorized,
            status: status)
    }

    /// What the calls of one request share: how it came, and how its calls fared with the secret. Once one call
    /// of a request fails the secret, every later one that needs it fails too without a comparison, so a batch
    /// of guesses cannot tell which guess was right.
    final class CallRecord: @unchecked Sendable {  // used by one task at a time, in turn
        let channel: Channel
        var failures = 0
        var missing = 0
        var authorized = false
        init(channel: Channel) { self.channel = channel }
    }

    func handle(_ request: JSON, _ record: CallRecord) async -> (body: [UInt8]?, status: Int) {
        if case .array(let calls) = request {
            guard !calls.isEmpty else {
                let error = Self.errorResponse(id: .null, code: -32600, message: "Invalid Request: empty batch")
                return (error.serialized, Reply.status(forError: -32600))
            }
            guard calls.count <= limits.maxCalls else {
                let error = Self.errorResponse(
                    id: .null, code: -32600, message: "Invalid Request: more than \(limits.maxCalls) calls in a batch")
                return (error.serialized, Reply.status(forError: -32600))
            }
            var responses: [JSON] = []
            for call in calls {
                if let response = await handleCall(call, record) { responses.append(response) }
            }
            return (responses.isEmpty ? nil : JSON.array(responses).serialized, 200)
        }
        let response = await handleCall(request, record)
        return (response?.serialized, Reply.status(forError: response?["error"]?["code"]?.integer.map { Int($0) }))
    }

    /// One call: its response, or nil for a notification (no `id`).
    func handleCall(_ call: JSON, _ record: CallRecord) async -> JSON? {
        guard case .object = call, let method = call["method"]?.string else {
            return Self.errorResponse(id: call["id"] ?? .null, code: -32600, message: "Invalid Request")
        }
        let id = call["id"]
        let params: [JSON]
        switch call["params"] {
        case nil: params = []
        case .array(let values)?: params = values
        default:
            return id.map { Self.errorResponse(id: $0, code: -32602, message: "Invalid params: not an array") }
        }
        let result = await invoke(method, params, record)
        guard let id else { return nil }
        switch result {
        case .success(let value):
            return .object([("id", id), ("jsonrpc", .string("2.0")), ("result", value)])
        case .failure(let error):
            return Self.errorResponse(id: id, code: error.code, message: error.message)
        }
    }

    static func errorResponse(id: JSON, code: Int, message: String) -> JSON {
        .object([
            ("id", id), ("jsonrpc", .string("2.0")),
            ("error", .object([("code", .integer(Int64(code))), ("message", .string(message))])),
        ])
    }

    /// A method's failure.
    struct Failure: Error, CustomStringConvertible {
        var description: String { message }
        var code: Int
        var message: String
        /// aria2's code for a method's failure.
        static func aria2(_ message: String) -> Failure { Failure(code: 1, message: message) }
    }

    // MARK: Methods

    /// Methods that change nothing: the only ones an HTTP GET may call (see ``Channel/readOnly``).
    public static let readOnlyMethods: Set<String> = [
        "aria2.tellStatus", "aria2.getUris", "aria2.getFiles", "aria2.getPeers", "aria2.getServers",
        "aria2.tellActive", "aria2.tellWaiting", "aria2.tellStopped", "aria2.getOption", "aria2.getGlobalOption",
        "aria2.getGlobalStat", "aria2.getVersion", "aria2.getSessionInfo", "system.listMethods",
        "system.listNotifications", "system.multicall", "stitch.tellAll",
    ]

    /// The reads that need the manager's settings: answered through it, not from the view.
    static let optionReads: Set<String> = ["aria2.getOption", "aria2.getGlobalOption"]

    /// aria2's methods for BitTorrent and Metalink, which Stitch answers with "not supported".
    static let unsupportedMethods: Set<String> = ["aria2.addTorrent", "aria2.addMetalink"]

    func invoke(_ method: String, _ params: [JSON], _ record: CallRecord) async -> Result<JSON, Failure> {
        if case .readOnly = record.channel, !Self.readOnlyMethods.contains(method) {
            return .failure(
                Failure(code: 1, message: "\(method) changes downloads and is refused over GET; send it in a POST"))
        }
        switch method {
        case "system.listMethods":
            return .success(.array(Self.methods.map(JSON.string)))
        case "system.listNotifications":
            return .success(.array(Self.notifications.map(JSON.string)))
        case "system.multicall":
            return await multicall(params, record)
        default:
            break
        }
        if Self.unsupportedMethods.contains(method) {
            return .failure(.aria2("\(method) is not supported: Stitch downloads over HTTP and HTTPS only"))
        }
        // aria2's answer (its clients show the message), not JSON-RPC's -32601.
        guard Self.methods.contains(method) else { return .failure(.aria2("No such method: \(method)")) }
        var params = params
        if case .failure(let failure) = authorize(&params, record) { return .failure(failure) }
        do {
            return .success(try await call(method, params))
        } catch let failure as Failure {
            return .failure(failure)
        } catch let error as DownloadManagerError {
            return .failure(.aria2(error.description))
        } catch {
            return .failure(.aria2("\(error)"))
        }
    }

    func call(_ method: String, _ params: [JSON]) async throws -> JSON {
        if !Self.optionReads.contains(method), Self.readOnlyMethods.contains(method) {
            // A fresh view is as good as a new one: every change invalidates it.
            let view: View
            if let cached = cachedView() { view = cached } else { view = await refreshedView() }
            return try read(method, params, view)
        }
        // Whatever it comes to, what readers see next is fetched again.
        defer { invalidate() }
        switch method {
        case "aria2.addUri":
            return try await addUri(params)
        case "aria2.remove", "aria2.forceRemove":
            // As aria2: an active download is stopped for good and listed by tellStopped as removed until its
            // result is removed; a waiting or paused one is dropped at once (no result is kept). The partial data
            // stays either way.
            let snapshot = try await snapshot(params, 0)
            switch snapshot.status {
            case .queued, .paused: try await manager.remove(snapshot.id)
            default: try await manager.cancel(snapshot.id)
            }
            return .string("\(snapshot.id)")
        case "aria2.pause", "aria2.forcePause":
            let id = try await gid(params, 0)
            try await manager.pause(id)
            return .string("\(id)")
        case "aria2.pauseAll", "aria2.forcePauseAll":
            try await manager.pauseAll()
            return .string("OK")
        case "aria2.unpause":
            let id = try await gid(params, 0)
            guard await manager.download(id)?.status == .paused else {
                throw Failure.aria2("GID \(id) cannot be unpaused now: it is not paused")
            }
            try await manager.resume(id)
            return .string("\(id)")
        case "aria2.unpauseAll":
            try await manager.resumeAll()
            return .string("OK")
        case "stitch.retry":
            let id = try await gid(params, 0)
            guard case .failed(let failure)? = await manager.download(id)?.status, failure.code != .cancelled else {
                throw Failure.aria2("GID \(id) has not failed; only a failed download is retried")
            }
            try await manager.resume(id)
            return .string("\(id)")
        case "stitch.updateSource":
            let id = try await gid(params, 0)
            guard params.count > 1, let url = params[1].string else { throw Self.badParameter(params, 1, "a URL") }
            try Self.checkScheme(url)
            var headers: HTTPHeaders?
            if params.count > 2 {
                var options = DownloadManager.AddOptions()
                try Self.apply("header", params[2], to: &options)
                headers = options.headers
            }
            try await manager.updateSource(id, url: url, headers: headers)
            return .string("\(id)")
        case "aria2.changePosition":
            let id = try await gid(params, 0)
            let position = try Self.int(params, 1, "pos")
            guard let how = params.count > 2 ? params[2].string : nil else {
                throw Self.badParameter(params, 2, "how is POS_SET, POS_CUR or POS_END")
            }
            let place: DownloadManager.QueuePosition
            switch how {
            case "POS_SET": place = .fromStart(position)
            case "POS_CUR": place = .fromCurrent(position)
            case "POS_END": place = .fromEnd(position)
            default: throw Failure.aria2("Illegal argument: how is POS_SET, POS_CUR or POS_END, not \(how.debugDescription)")
            }
            return .integer(Int64(try await manager.move(id, to: place)))
        case "aria2.changeUri":
            // (gid, fileIndex, delUris, addUris[, position]) → [deleted, added], as aria2.
            let id = try await gid(params, 0)
            guard try Self.int(params, 1, "fileIndex") == 1 else { throw Failure.aria2("fileIndex must be 1") }
            guard params.count > 2, let remove = params[2].array?.compactMap(\.string) else {
                throw Self.badParameter(params, 2, "delUris is an array of URIs")
            }
            guard params.count > 3, let add = params[3].array?.compactMap(\.string) else {
                throw Self.badParameter(params, 3, "addUris is an array of URIs")
            }
            for url in add { try Self.checkScheme(url) }
            let position = params.count > 4 ? try Self.int(params, 4, "position") : nil
            // The edit runs inside the manager, on the list as it is then: two clients' edits both stay.
            let (deleted, added) = try await manager.editMirrors(id) { list -> (Int, Int) in
                var deleted = 0
                for url in remove {
                    if let index = list.firstIndex(of: url) {
                        list.remove(at: index)
                        deleted += 1
                    }
                }
                let fresh = add.filter { !list.contains($0) }
                list.insert(contentsOf: fresh, at: position.map { min(max(0, $0), list.count) } ?? list.count)
                return (deleted, fresh.count)
            }
            return .array([.integer(Int64(deleted)), .integer(Int64(added))])
        case "aria2.changeOption":
            let id = try await gid(params, 0)
            guard params.count > 1, let members = params[1].members else {
                throw Self.badParameter(params, 1, "the options are an object")
            }
            try await changeOption(id, members)
            return .string("OK")
        case "aria2.getGlobalOption":
            return await globalOptions()
        case "aria2.getOption":
            let snapshot = try await snapshot(params, 0)
            return Self.options(of: snapshot, await optionContext())
        case "aria2.changeGlobalOption":
            guard let members = params.first?.members else { throw Self.badParameter(params, 0, "the options are an object") }
            try await settingsGate.run { try await changeGlobalOption(members) }
            return .string("OK")
        case "aria2.purgeDownloadResult":
            for snapshot in await manager.downloads() where Self.isStopped(snapshot.status) {
                if (try? await manager.remove(snapshot.id)) != nil { droppedResults.add(1, ordering: .relaxed) }
            }
            return .string("OK")
        case "aria2.removeDownloadResult":
            let snapshot = try await snapshot(params, 0)
            guard Self.isStopped(snapshot.status) else {
                throw Failure.aria2("Could not remove download result of GID \(snapshot.id): it has not stopped")
            }
            try await manager.remove(snapshot.id)
            droppedResults.add(1, ordering: .relaxed)
            return .string("OK")
        case "aria2.saveSession":
            return .string("OK")  // the catalog is written at every change
        case "aria2.shutdown", "aria2.forceShutdown":
            guard let onShutdown else { throw Failure.aria2("this server cannot be shut down over RPC") }
            onShutdown()
            return .string("OK")
        default:
            throw Failure.aria2("No such method: \(method)")
        }
    }

    func snapshot(_ params: [JSON], _ index: Int) async throws -> DownloadSnapshot {
        let id = try await gid(params, index)
        guard let snapshot = await manager.download(id) else { throw Failure.aria2("GID \(id) is not found") }
        return snapshot
    }

    func multicall(_ params: [JSON], _ record: CallRecord) async -> Result<JSON, Failure> {
        guard let calls = params.first?.array else {
            return .failure(Failure(code: -32602, message: "Invalid params: system.multicall takes an array of calls"))
        }
        guard calls.count <= limits.maxCalls else {
            return .failure(Failure(code: -32602, message: "Invalid params: more than \(limits.maxCalls) calls"))
        }
        var results: [JSON] = []
        for call in calls {
            guard let method = call["methodName"]?.string, method != "system.multicall" else {
                results.append(.object([("code", .integer(1)), ("message", .string("invalid call in system.multicall"))]))
                continue
            }
            let inner = call["params"]?.array ?? []
            switch await invoke(method, inner, record) {
            case .success(let value): results.append(.array([value]))
            case .failure(let failure):
                results.append(.object([("code", .integer(Int64(failure.code))), ("message", .string(failure.message))]))
            }
        }
        return .success(.array(results))
    }

    /// The view of the downloads that reads are answered from, and a count of invalidations: a view fetched
    /// across one is not kept (it may predate a change whose answer has already gone out). See
    /// Aria2RPC+Reading.swift.
    let cache = Locked<(view: View?, generation: UInt64)>((nil, 0))
    /// Stopped downloads whose results were removed since the daemon started: `getGlobalStat`'s `numStoppedTotal`
    /// counts them, as aria2's counts every download stopped in its session.
    let droppedResults = Atomic<Int>(0)
    /// One change of the global options at a time: `changeGlobalOption` and a configuration reload each keep, then
    /// apply, several settings; interleaved, the running daemon and what the catalog keeps would disagree.
    let settingsGate = AsyncGate()

    /// Runs `body` while no `changeGlobalOption` runs (the daemon's configuration reload).
    public func changingSettings<T>(_ body: () async throws -> T) async rethrows -> T {
        try await settingsGate.run(body)
    }
}
