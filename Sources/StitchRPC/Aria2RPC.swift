import Foundation
import Synchronization
public import Stitch

/// aria2's JSON-RPC interface over a ``DownloadManager``: the JSON-RPC 2.0 envelope (single calls, batches,
/// `system.multicall`), the secret token, and the methods with aria2's parameter and result shapes (numbers as
/// strings, 16-hex-digit GIDs found by a unique prefix, the `keys` filter, negative offsets).
///
/// This is the layer a daemon's HTTP and WebSocket server hands request bodies to; it does no networking itself,
/// so every rule is a test without sockets. Bounded: the body is parsed with a nesting limit, batches and
/// multicalls have a maximum size, and nothing it is sent can make it write outside the manager's download
/// folder (`out` is a plain file name; `dir` is not accepted yet).
///
/// Errors: the envelope's own (-32700 parse error, -32600 invalid request, -32601 method not found, -32602
/// invalid params) as JSON-RPC defines them; a method's failure as aria2 does, code 1 with a message.
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
    private let secret: [UInt8]?
    private let limits: Limits

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

    private let onShutdown: (@Sendable () -> Void)?
    private let reservedFolder: String?
    /// `aria2.getSessionInfo`'s id: new for each server that runs.
    private let sessionID: String

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
        /// Calls in it refused for a wrong or missing secret (the server slows such clients down).
        public var unauthorized: Int
        /// Some call in it carried the right secret (a secret is set).
        public var authorized = false

        public init(body: [UInt8]?, unauthorized: Int = 0, authorized: Bool = false) {
            self.body = body
            self.unauthorized = unauthorized
            self.authorized = authorized
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
            return .failure(Reply(body: response.serialized))
        }
    }

    /// Handles one parsed request (a call or a batch).
    public func handle(_ request: JSON, channel: Channel) async -> Reply {
        let record = CallRecord(channel: channel)
        let body = await handle(request, record)
        return Reply(body: body, unauthorized: record.failures, authorized: record.authorized)
    }

    /// What the calls of one request share: how it came, and how its calls fared with the secret. Once one call
    /// of a request fails the secret, every later one that needs it fails too without a comparison, so a batch
    /// of guesses cannot tell which guess was right.
    final class CallRecord: @unchecked Sendable {  // used by one task at a time, in turn
        let channel: Channel
        var failures = 0
        var authorized = false
        init(channel: Channel) { self.channel = channel }
    }

    private func handle(_ request: JSON, _ record: CallRecord) async -> [UInt8]? {
        if case .array(let calls) = request {
            guard !calls.isEmpty else {
                return Self.errorResponse(id: .null, code: -32600, message: "Invalid Request: empty batch").serialized
            }
            guard calls.count <= limits.maxCalls else {
                return Self.errorResponse(
                    id: .null, code: -32600, message: "Invalid Request: more than \(limits.maxCalls) calls in a batch"
                ).serialized
            }
            var responses: [JSON] = []
            for call in calls {
                if let response = await handleCall(call, record) { responses.append(response) }
            }
            return responses.isEmpty ? nil : JSON.array(responses).serialized
        }
        return await handleCall(request, record)?.serialized
    }

    /// One call: its response, or nil for a notification (no `id`).
    private func handleCall(_ call: JSON, _ record: CallRecord) async -> JSON? {
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
    struct Failure: Error {
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
        guard Self.methods.contains(method) else { return .failure(Failure(code: -32601, message: "Method not found")) }
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

    private func call(_ method: String, _ params: [JSON]) async throws -> JSON {
        if method != "aria2.getGlobalOption", Self.readOnlyMethods.contains(method) {
            return try read(method, params, await refreshedView())
        }
        // Whatever it comes to, what readers see next is fetched again.
        defer { invalidate() }
        switch method {
        case "aria2.getVersion":
            return .object([
                ("version", .string(StitchVersion.string)),
                ("enabledFeatures", .array(["HTTPS", "Async DNS"].map(JSON.string))),
            ])
        case "aria2.addUri":
            return try await addUri(params)
        case "aria2.remove", "aria2.forceRemove":
            // aria2's "removed": stopped for good, listed by tellStopped until its result is removed; the partial
            // data stays.
            let id = try await gid(params, 0)
            try await manager.cancel(id)
            return .string("\(id)")
        case "aria2.pause", "aria2.forcePause":
            let id = try await gid(params, 0)
            try await manager.pause(id)
            return .string("\(id)")
        case "aria2.pauseAll", "aria2.forcePauseAll":
            await manager.pauseAll()
            return .string("OK")
        case "aria2.unpause":
            let id = try await gid(params, 0)
            guard await manager.download(id)?.status == .paused else {
                throw Failure.aria2("GID \(id) cannot be unpaused now: it is not paused")
            }
            try await manager.resume(id)
            return .string("\(id)")
        case "aria2.unpauseAll":
            await manager.resumeAll()
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
            guard params.count > 1, let url = params[1].string else {
                throw Failure(code: -32602, message: "Invalid params: stitch.updateSource takes a GID and a URL")
            }
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
                throw Failure(code: -32602, message: "Invalid params: how must be POS_SET, POS_CUR or POS_END")
            }
            let place: DownloadManager.QueuePosition
            switch how {
            case "POS_SET": place = .fromStart(position)
            case "POS_CUR": place = .fromCurrent(position)
            case "POS_END": place = .fromEnd(position)
            default: throw Failure(code: -32602, message: "Invalid params: how must be POS_SET, POS_CUR or POS_END")
            }
            return .integer(Int64(try await manager.move(id, to: place)))
        case "aria2.changeUri":
            // (gid, fileIndex, delUris, addUris[, position]) → [deleted, added], as aria2.
            let snapshot = try await snapshot(params, 0)
            guard try Self.int(params, 1, "fileIndex") == 1 else { throw Failure.aria2("fileIndex must be 1") }
            guard params.count > 3, let remove = params[2].array?.compactMap(\.string),
                let add = params[3].array?.compactMap(\.string)
            else { throw Failure(code: -32602, message: "Invalid params: changeUri takes delUris and addUris arrays") }
            for url in add { try Self.checkScheme(url) }
            var list = snapshot.mirrors.isEmpty ? [snapshot.url] : snapshot.mirrors
            var deleted = 0
            for url in remove {
                if let index = list.firstIndex(of: url) {
                    list.remove(at: index)
                    deleted += 1
                }
            }
            let fresh = add.filter { !list.contains($0) }
            let at = params.count > 4 ? min(max(0, try Self.int(params, 4, "position")), list.count) : list.count
            list.insert(contentsOf: fresh, at: at)
            guard !list.isEmpty else { throw Failure.aria2("a download needs at least one URI") }
            try await manager.setMirrors(snapshot.id, list)
            return .array([.integer(Int64(deleted)), .integer(Int64(fresh.count))])
        case "aria2.changeOption":
            let id = try await gid(params, 0)
            guard params.count > 1, let members = params[1].members else {
                throw Failure(code: -32602, message: "Invalid params: changeOption takes a GID and an object")
            }
            try await changeOption(id, members)
            return .string("OK")
        case "aria2.getGlobalOption":
            return await globalOptions()
        case "aria2.changeGlobalOption":
            guard let members = params.first?.members else {
                throw Failure(code: -32602, message: "Invalid params: changeGlobalOption takes an object")
            }
            try await changeGlobalOption(members)
            return .string("OK")
        case "aria2.purgeDownloadResult":
            for snapshot in await manager.downloads() where Self.isStopped(snapshot.status) {
                try? await manager.remove(snapshot.id)
            }
            return .string("OK")
        case "aria2.removeDownloadResult":
            let snapshot = try await snapshot(params, 0)
            guard Self.isStopped(snapshot.status) else {
                throw Failure.aria2("Could not remove download result of GID \(snapshot.id): it has not stopped")
            }
            try await manager.remove(snapshot.id)
            return .string("OK")
        case "aria2.saveSession":
            return .string("OK")  // the catalog is written at every change
        case "aria2.shutdown", "aria2.forceShutdown":
            guard let onShutdown else { throw Failure.aria2("this server cannot be shut down over RPC") }
            onShutdown()
            return .string("OK")
        default:
            throw Failure(code: -32601, message: "Method not found")
        }
    }

    private func snapshot(_ params: [JSON], _ index: Int) async throws -> DownloadSnapshot {
        let id = try await gid(params, index)
        guard let snapshot = await manager.download(id) else { throw Failure.aria2("GID \(id) is not found") }
        return snapshot
    }

    private func multicall(_ params: [JSON], _ record: CallRecord) async -> Result<JSON, Failure> {
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

    // MARK: Reading without the manager

    /// The downloads as a reader sees them: fetched from the manager at most ``viewAge`` ago, and again after
    /// every call that may change something (and whenever ``invalidate()`` is called, as the daemon does before
    /// each notification), so a client never reads an answer older than its own last change.
    struct View: Sendable {
        let all: [DownloadSnapshot]
        let index: [DownloadID: Int]
        let fetched: ContinuousClock.Instant
        /// Serialized results of the reads asked of this view, by method and parameters: a front-end polls the
        /// same few calls, so while the view lasts each is built once.
        let results = ResultCache()

        init(_ all: [DownloadSnapshot]) {
            self.all = all
            var index: [DownloadID: Int] = [:]
            for (offset, snapshot) in all.enumerated() { index[snapshot.id] = offset }
            self.index = index
            self.fetched = .now
        }
    }

    final class ResultCache: Sendable {
        let table = Mutex<[String: [UInt8]]>([:])
        static let capacity = 256
    }

    /// How old a view may be for reads answered at once (progress is reported ten times a second).
    public static let viewAge: Duration = .milliseconds(100)
    /// The view, and a count of invalidations: a view fetched across one is not kept (it may predate a change
    /// whose answer has already gone out).
    private let cache = Mutex<(view: View?, generation: UInt64)>((nil, 0))

    /// Forgets the view, so the next read asks the manager.
    public func invalidate() {
        cache.withLock {
            $0.view = nil
            $0.generation &+= 1
        }
    }

    private func refreshedView() async -> View {
        let generation = cache.withLock { $0.generation }
        let view = View(await manager.downloads())
        cache.withLock { if $0.generation == generation { $0.view = view } }
        return view
    }

    private func cachedView() -> View? {
        cache.withLock { cache in
            guard let current = cache.view, ContinuousClock.now - current.fetched < Self.viewAge else { return nil }
            return current
        }
    }

    /// Answers `request` on the caller's thread when every call in it only reads (and a fresh view is at hand);
    /// nil when it needs ``handle(_:channel:)``. What a server calls first, so a poll costs no task, no actor hop
    /// and no thread switch.
    public func handleImmediately(_ request: JSON, channel: Channel) -> Reply? {
        guard Self.onlyReads(request), let view = cachedView() else { return nil }
        let record = CallRecord(channel: channel)
        func answer(_ call: JSON, into out: inout [UInt8]) -> Bool {
            guard case .object = call, let method = call["method"]?.string else {
                Self.errorResponse(id: call["id"] ?? .null, code: -32600, message: "Invalid Request").write(into: &out)
                return true
            }
            let id = call["id"]
            let params: [JSON]
            switch call["params"] {
            case nil: params = []
            case .array(let values)?: params = values
            default:
                guard let id else { return false }
                Self.errorResponse(id: id, code: -32602, message: "Invalid params: not an array").write(into: &out)
                return true
            }
            let result = invokeReading(method, params, record, view)
            guard let id else { return false }
            switch result {
            case .success(let bytes):
                out.append(contentsOf: #"{"id":"#.utf8)
                id.write(into: &out)
                out.append(contentsOf: #","jsonrpc":"2.0","result":"#.utf8)
                out.append(contentsOf: bytes)
                out.append(UInt8(ascii: "}"))
            case .failure(let error):
                Self.errorResponse(id: id, code: error.code, message: error.message).write(into: &out)
            }
            return true
        }
        var out: [UInt8] = []
        out.reserveCapacity(1_024)
        if case .array(let calls) = request {
            guard !calls.isEmpty, calls.count <= limits.maxCalls else { return nil }  // the full path says why
            out.append(UInt8(ascii: "["))
            var any = false
            for call in calls {
                if any { out.append(UInt8(ascii: ",")) }
                let wrote = answer(call, into: &out)
                if !wrote, any { out.removeLast() }  // the comma before a notification
                any = any || wrote
            }
            out.append(UInt8(ascii: "]"))
            return Reply(body: any ? out : nil, unauthorized: record.failures, authorized: record.authorized)
        }
        return Reply(
            body: answer(request, into: &out) ? out : nil, unauthorized: record.failures, authorized: record.authorized)
    }

    /// Whether every call of `request` (batches and multicalls included) is a read that ``read`` answers.
    static func onlyReads(_ request: JSON) -> Bool {
        func reads(_ method: String?, _ params: JSON?) -> Bool {
            guard let method, readOnlyMethods.contains(method), method != "aria2.getGlobalOption" else { return false }
            guard method == "system.multicall" else { return true }
            guard let calls = params?.array?.first?.array, calls.count <= 1_000 else { return false }
            return calls.allSatisfy { $0["methodName"]?.string != "system.multicall" && reads($0["methodName"]?.string, nil) }
        }
        if case .array(let calls) = request {
            return calls.allSatisfy { reads($0["method"]?.string, $0["params"]) }
        }
        return reads(request["method"]?.string, request["params"])
    }

    private func invokeReading(_ method: String, _ params: [JSON], _ record: CallRecord, _ view: View)
        -> Result<[UInt8], Failure>
    {
        switch method {
        case "system.listMethods": return .success(JSON.array(Self.methods.map(JSON.string)).serialized)
        case "system.listNotifications": return .success(JSON.array(Self.notifications.map(JSON.string)).serialized)
        case "system.multicall":
            guard let calls = params.first?.array else {
                return .failure(Failure(code: -32602, message: "Invalid params: system.multicall takes an array of calls"))
            }
            var out: [UInt8] = [UInt8(ascii: "[")]
            for (index, call) in calls.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                let inner = call["params"]?.array ?? []
                switch invokeReading(call["methodName"]?.string ?? "", inner, record, view) {
                case .success(let bytes):
                    out.append(UInt8(ascii: "["))
                    out.append(contentsOf: bytes)
                    out.append(UInt8(ascii: "]"))
                case .failure(let failure):
                    JSON.object([("code", .integer(Int64(failure.code))), ("message", .string(failure.message))])
                        .write(into: &out)
                }
            }
            out.append(UInt8(ascii: "]"))
            return .success(out)
        default:
            break
        }
        var params = params
        if case .failure(let failure) = authorize(&params, record) { return .failure(failure) }
        let key = method + "\u{1}" + String(decoding: JSON.array(params).serialized, as: UTF8.self)
        if let hit = view.results.table.withLock({ $0[key] }) { return .success(hit) }
        do {
            let bytes = try read(method, params, view).serialized
            view.results.table.withLock { if $0.count < ResultCache.capacity { $0[key] = bytes } }
            return .success(bytes)
        } catch let failure as Failure {
            return .failure(failure)
        } catch {
            return .failure(.aria2("\(error)"))
        }
    }

    /// Checks and removes the `token:` parameter, counting the outcome in `record`.
    private func authorize(_ params: inout [JSON], _ record: CallRecord) -> Result<Void, Failure> {
        if let secret {
            guard record.failures == 0, let first = params.first?.string, first.hasPrefix("token:"),
                Self.constantTimeEquals(Array(first.utf8.dropFirst(6)), secret)
            else {
                record.failures += 1
                return .failure(.aria2("Unauthorized"))
            }
            record.authorized = true
            params.removeFirst()
        } else if let first = params.first?.string, first.hasPrefix("token:") {
            params.removeFirst()  // a client that always sends one
        }
        return .success(())
    }

    /// The methods that only read, answered from `view`.
    private func read(_ method: String, _ params: [JSON], _ view: View) throws -> JSON {
        func snapshot(_ index: Int) throws -> DownloadSnapshot { try Self.find(params, index, in: view) }
        switch method {
        case "aria2.getVersion":
            return .object([
                ("version", .string(StitchVersion.string)),
                ("enabledFeatures", .array(["HTTPS", "Async DNS"].map(JSON.string))),
            ])
        case "aria2.getSessionInfo":
            return .object([("sessionId", .string(sessionID))])
        case "aria2.tellStatus":
            return Self.status(try snapshot(0), keys: try Self.keys(params, 1))
        case "aria2.getUris":
            return Self.uris(try snapshot(0))
        case "aria2.getFiles":
            return Self.files(try snapshot(0))
        case "aria2.getPeers":
            _ = try snapshot(0)
            return .array([])
        case "aria2.getServers":
            let snapshot = try snapshot(0)
            guard snapshot.status == .running else { throw Failure.aria2("No active download for GID \(snapshot.id)") }
            let server: JSON = .object([
                ("uri", .string(snapshot.url)), ("currentUri", .string(snapshot.url)),
                ("downloadSpeed", .string(String(Int64(snapshot.progress.bytesPerSecond)))),
            ])
            return .array([.object([("index", .string("1")), ("servers", .array([server]))])])
        case "aria2.tellActive":
            let keys = try Self.keys(params, 0)
            return .array(view.all.filter { $0.status == .running }.map { Self.status($0, keys: keys) })
        case "aria2.tellWaiting", "aria2.tellStopped":
            let offset = try Self.int(params, 0, "offset")
            let count = try Self.int(params, 1, "num")
            let keys = try Self.keys(params, 2)
            let list =
                method == "aria2.tellWaiting"
                ? view.all.filter { $0.status == .queued || $0.status == .paused }
                : view.all.filter { Self.isStopped($0.status) }
            return .array(Self.window(list, offset: offset, count: count).map { Self.status($0, keys: keys) })
        case "stitch.tellAll":
            let keys = try Self.keys(params, 0)
            return .array(view.all.map { Self.status($0, keys: keys) })
        case "aria2.getOption":
            return Self.options(of: try snapshot(0))
        case "aria2.getGlobalStat":
            var speed = 0.0
            var active = 0
            var waiting = 0
            var stopped = 0
            for snapshot in view.all {
                switch snapshot.status {
                case .running:
                    active += 1
                    speed += snapshot.progress.bytesPerSecond
                case .queued, .paused: waiting += 1
                default: if Self.isStopped(snapshot.status) { stopped += 1 }
                }
            }
            return .object([
                ("downloadSpeed", .string(String(Int64(speed)))), ("uploadSpeed", .string("0")),
                ("numActive", .string(String(active))), ("numWaiting", .string(String(waiting))),
                ("numStopped", .string(String(stopped))), ("numStoppedTotal", .string(String(stopped))),
            ])
        default:
            throw Failure(code: -32601, message: "Method not found")
        }
    }

    /// The download `params[index]` names in `view`: 16 hex digits, or a prefix only one download's GID has.
    static func find(_ params: [JSON], _ index: Int, in view: View) throws -> DownloadSnapshot {
        guard index < params.count, let text = params[index].string, !text.isEmpty, text.count <= 16,
            text.allSatisfy(\.isHexDigit)
        else { throw Failure.aria2("a GID is 1 to 16 hex digits") }
        if text.count == 16, let id = DownloadID(text), let offset = view.index[id] { return view.all[offset] }
        let lowered = text.lowercased()
        let matches = view.all.filter { "\($0.id)".hasPrefix(lowered) }
        guard matches.count == 1 else {
            throw Failure.aria2(matches.isEmpty ? "GID \(text) is not found" : "GID \(text) is ambiguous")
        }
        return matches[0]
    }


    // MARK: addUri

    private func addUri(_ params: [JSON]) async throws -> JSON {
        guard let uris = params.first?.array, !uris.isEmpty else {
            throw Failure(code: -32602, message: "Invalid params: addUri takes an array of URIs")
        }
        let urls = try uris.map { uri -> String in
            guard let text = uri.string else { throw Failure(code: -32602, message: "Invalid params: a URI is not a string") }
            return text
        }
        for url in urls { try Self.checkScheme(url) }
        var options = DownloadManager.AddOptions()
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
            try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        }
        if let out = options.out {
            let base = await manager.configuration.downloadDirectory
            for path in [(options.directory ?? base) + "/" + out, (options.directory ?? base) + "/" + out + ".part"] {
                try Self.checkNotALink(path)
            }
        }
        // Several URIs are mirrors of one file, as in aria2: kept with the download and tried in turn.
        if urls.count > 1 { options.mirrors = urls }
        let id = try await manager.add(urls[0], options: options)
        if params.count > 2 {
            let position = try Self.int(params, 2, "position")
            if await manager.waitingQueue().contains(id) { try await manager.move(id, to: .fromStart(position)) }
        }
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
            guard let count = Int(text), (1...16).contains(count) else {
                throw Failure.aria2("option \(name): \(text) is not 1…16")
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
            guard let size = RateLimiter.parse(text), size >= 1 << 20, size <= 1 << 30 else {
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

    /// `changeOption`: what can change on a download that exists. Checked first, changed after: a refused option
    /// changes nothing. The folder and the file name are fixed once added.
    private func changeOption(_ id: DownloadID, _ members: [(String, JSON)]) async throws {
        guard let snapshot = await manager.download(id) else { throw Failure.aria2("GID \(id) is not found") }
        var options = DownloadManager.AddOptions()
        options.tuning = snapshot.tuning
        options.headers = snapshot.headers
        var rate: Int64?? = nil
        var connections: Int?? = nil
        var tuningChanged = false
        var headersChanged = false
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
            case "header", "user-agent", "referer":
                if name == "header", !headersChanged { options.headers = HTTPHeaders() }  // replaces, as aria2
                try Self.apply(name, value, to: &options)
                headersChanged = true
            case "dir", "out":
                throw Failure.aria2("option \(name) cannot be changed once the download is added")
            default:
                guard Self.ignoredOptions.contains(name) else {
                    throw Failure.aria2("option \(name) cannot be changed on a download that was added")
                }
            }
        }
        if let rate { try await manager.setRateLimit(id, rate) }
        if connections != nil || tuningChanged || headersChanged {
            try await manager.setOptions(
                id, connections: connections, tuning: tuningChanged ? options.tuning : nil,
                headers: headersChanged ? options.headers : nil)
        }
    }

    private func globalOptions() async -> JSON {
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
    private func changeGlobalOption(_ members: [(String, JSON)]) async throws {
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
                guard let count = Int(text), (1...16).contains(count) else {
                    throw Failure.aria2("option \(name): \(text) is not 1…16")
                }
                guard count == 16 else {
                    throw Failure.aria2(
                        "option max-connection-per-server is set per download in Stitch (split or "
                            + "max-connection-per-server in addUri); the daemon's cap over all downloads of a host is "
                            + "--max-connections-per-host")
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

    // MARK: Shapes

    /// The download `params[index]` names: 16 hex digits, or a prefix that only one download's GID has.
    private func gid(_ params: [JSON], _ index: Int) async throws -> DownloadID {
        guard index < params.count, let text = params[index].string, !text.isEmpty, text.count <= 16,
            text.allSatisfy(\.isHexDigit)
        else { throw Failure.aria2("a GID is 1 to 16 hex digits") }
        // A whole GID (what clients send nearly always) is one look-up; only a prefix needs the list.
        if text.count == 16, let id = DownloadID(text), await manager.download(id) != nil { return id }
        let lowered = text.lowercased()
        let matches = await manager.downloads().map(\.id).filter { "\($0)".hasPrefix(lowered) }
        guard matches.count == 1 else {
            throw Failure.aria2(matches.isEmpty ? "GID \(text) is not found" : "GID \(text) is ambiguous")
        }
        return matches[0]
    }

    static func int(_ params: [JSON], _ index: Int, _ name: String) throws -> Int {
        guard index < params.count, let value = params[index].integer, let int = Int(exactly: value) else {
            throw Failure(code: -32602, message: "Invalid params: \(name) must be an integer")
        }
        return int
    }

    static func keys(_ params: [JSON], _ index: Int) throws -> Set<String>? {
        guard index < params.count else { return nil }
        guard let names = params[index].array else {
            throw Failure(code: -32602, message: "Invalid params: keys must be an array of strings")
        }
        return Set(names.compactMap(\.string))
    }

    /// aria2's window of a list: from `offset` (negative: counted from the end, the list then read backwards)
    /// at most `count` entries.
    static func window<T>(_ list: [T], offset: Int, count: Int) -> [T] {
        guard count > 0, !list.isEmpty else { return [] }
        if offset >= 0 {
            guard offset < list.count else { return [] }
            return Array(list[offset..<min(list.count, offset + count)])
        }
        let start = list.count + offset  // -1 is the last
        guard start >= 0 else { return [] }
        return Array(list[max(0, start - count + 1)...start].reversed())
    }

    static func isStopped(_ status: DownloadStatus) -> Bool {
        if case .failed = status { return true }
        return status == .completed || status == .removed
    }

    /// aria2's name for a status.
    static func statusName(_ status: DownloadStatus) -> String {
        switch status {
        case .queued: "waiting"
        case .running: "active"
        case .paused: "paused"
        case .completed: "complete"
        case .failed(let failure): failure.code == .cancelled ? "removed" : "error"
        case .removed: "removed"
        }
    }

    /// A download as aria2's `tellStatus` shows it, limited to `keys` when given.
    static func status(_ snapshot: DownloadSnapshot, keys: Set<String>?) -> JSON {
        let total = snapshot.progress.total ?? 0
        let done = snapshot.progress.bytes
        let path = snapshot.path ?? ""
        let directory = Self.directory(of: snapshot)
        var members: [(String, JSON)] = [
            ("gid", .string("\(snapshot.id)")), ("status", .string(statusName(snapshot.status))),
            ("totalLength", .string(String(total))), ("completedLength", .string(String(done))),
            ("uploadLength", .string("0")),
            ("downloadSpeed", .string(String(Int64(snapshot.status == .running ? snapshot.progress.bytesPerSecond : 0)))),
            ("uploadSpeed", .string("0")),
            ("connections", .string(snapshot.status == .running ? "1" : "0")),
            ("dir", .string(directory)),
            (
                "files",
                .array([
                    .object([
                        ("index", .string("1")), ("path", .string(path)), ("length", .string(String(total))),
                        ("completedLength", .string(String(done))), ("selected", .string("true")),
                        ("uris", uris(snapshot)),
                    ])
                ])
            ),
        ]
        if case .failed(let failure) = snapshot.status {
            members.append(("errorCode", .string(String(aria2ErrorCode(failure)))))
            members.append(("errorMessage", .string(failure.message)))
        }
        guard let keys else { return .object(members) }
        return .object(members.filter { keys.contains($0.0) })
    }

    /// aria2's exit-status code for a failure, where one fits (1: unknown).
    static func aria2ErrorCode(_ failure: DownloadFailure) -> Int {
        switch failure.code {
        case .httpStatus: failure.httpStatus == 404 ? 3 : 22
        case .retriesExhausted: 2
        case .network: 19
        case .checksumMismatch: 32
        case .destinationExists: 13
        case .io: 16
        case .cancelled: 5
        default: 1
        }
    }

    /// Whether `given` equals `secret`, in a time that depends on the secret's length only: every byte of the
    /// secret is compared whatever `given` holds or how long it is, so neither where a guess first differs nor
    /// the secret's length shows.
    static func constantTimeEquals(_ given: [UInt8], _ secret: [UInt8]) -> Bool {
        var difference = UInt8(given.count == secret.count ? 0 : 1)
        given.withUnsafeBufferPointer { given in
            for index in 0..<secret.count {
                let byte = index < given.count ? given[index] : ~secret[index]
                difference |= byte ^ secret[index]
            }
        }
        return difference == 0
    }
}
