import Foundation
import Synchronization
import Stitch
import StitchLocks

// The read path: answers to calls that change nothing, from a view of the downloads, at once when it is fresh.
extension Aria2RPC {
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
        let table = Locked<(results: [String: [UInt8]], bytes: Int)>(([:], 0))
        /// At most this many results, and this many bytes of them, per view.
        static let capacity = 256
        static let byteCapacity = 8 << 20

        func get(_ key: String) -> [UInt8]? { table.withLock { $0.results[key] } }

        func put(_ key: String, _ bytes: [UInt8]) {
            table.withLock { table in
                guard table.results.count < Self.capacity, table.bytes + bytes.count <= Self.byteCapacity,
                    table.results[key] == nil
                else { return }
                table.results[key] = bytes
                table.bytes += bytes.count
            }
        }
    }

    /// How old a view may be for reads answered at once (progress is reported ten times a second).
    public static let viewAge: Duration = .milliseconds(100)
    /// Forgets the view, so the next read asks the manager.
    public func invalidate() {
        cache.withLock {
            $0.view = nil
            $0.generation &+= 1
        }
    }

    func refreshedView() async -> View {
        let generation = cache.withLock { $0.generation }
        let view = View(await manager.downloads())
        cache.withLock { if $0.generation == generation { $0.view = view } }
        return view
    }

    /// The view when it is fresh enough to answer from at once.
    func cachedView() -> View? {
        cache.withLock { cache in
            guard let current = cache.view, ContinuousClock.now - current.fetched < Self.viewAge else { return nil }
            return current
        }
    }

    /// Answers `request` on the caller's thread when every call in it only reads (and a fresh view is at hand);
    /// nil when it needs ``handle(_:channel:)``. What a server calls first, so a poll costs no task, no actor hop
    /// and no thread switch.
    public func handleImmediately(_ request: JSON, channel: Channel) -> Reply? {
        guard Self.onlyReads(request, maxCalls: limits.maxCalls), let view = cachedView() else { return nil }
        let record = CallRecord(channel: channel)
        var errorCode: Int?
        func answer(_ call: JSON, into out: inout [UInt8]) -> Bool {
            guard case .object = call, let method = call["method"]?.string else {
                Self.errorResponse(id: call["id"] ?? .null, code: -32600, message: "Invalid Request").write(into: &out)
                errorCode = -32600
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
                errorCode = -32602
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
                errorCode = error.code
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
            return Reply(
                body: any ? out : nil, unauthorized: record.failures, missingSecret: record.missing,
                authorized: record.authorized)
        }
        let answered = answer(request, into: &out)
        return Reply(
            body: answered ? out : nil, unauthorized: record.failures, missingSecret: record.missing,
            authorized: record.authorized, status: Reply.status(forError: errorCode))
    }

    /// Whether every call of `request` (batches and multicalls included) is a read that ``read`` answers.
    static func onlyReads(_ request: JSON, maxCalls: Int) -> Bool {
        func reads(_ method: String?, _ params: JSON?) -> Bool {
            guard let method, readOnlyMethods.contains(method), !optionReads.contains(method) else { return false }
            guard method == "system.multicall" else { return true }
            guard let calls = params?.array?.first?.array, calls.count <= maxCalls else { return false }
            return calls.allSatisfy { $0["methodName"]?.string != "system.multicall" && reads($0["methodName"]?.string, nil) }
        }
        if case .array(let calls) = request {
            return calls.allSatisfy { reads($0["method"]?.string, $0["params"]) }
        }
        return reads(request["method"]?.string, request["params"])
    }

    func invokeReading(_ method: String, _ params: [JSON], _ record: CallRecord, _ view: View)
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
        if let hit = view.results.get(key) { return .success(hit) }
        do {
            let bytes = try read(method, params, view).serialized
            view.results.put(key, bytes)
            return .success(bytes)
        } catch let failure as Failure {
            return .failure(failure)
        } catch {
            return .failure(.aria2("\(error)"))
        }
    }

    /// Checks and removes the `token:` parameter, counting the outcome in `record`.
    func authorize(_ params: inout [JSON], _ record: CallRecord) -> Result<Void, Failure> {
        if let secret {
            // No token at all is no guess: refused, not counted (the throttle slows wrong tokens only).
            if record.failures == 0, params.first?.string?.hasPrefix("token:") != true {
                record.missing += 1
                return .failure(.aria2("Unauthorized"))
            }
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
    func read(_ method: String, _ params: [JSON], _ view: View) throws -> JSON {
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
            let snapshot = try snapshot(0)
            let keys = try Self.keys(params, 1)
            guard case .object(var members) = Self.status(snapshot, keys: keys) else { return .null }
            members += Self.details(snapshot, keys: keys)
            return .object(members)
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
            // One entry per connection transferring, as aria2 lists them, the speed shared among them.
            let count = max(1, snapshot.progress.connections)
            let server: JSON = .object([
                ("uri", .string(snapshot.url)), ("currentUri", .string(snapshot.url)),
                ("downloadSpeed", .string(String(Int64(snapshot.progress.bytesPerSecond) / Int64(count)))),
            ])
            return .array([
                .object([("index", .string("1")), ("servers", .array(Array(repeating: server, count: count)))])
            ])
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
                ("numStopped", .string(String(stopped))),
                ("numStoppedTotal", .string(String(stopped + droppedResults.load(ordering: .relaxed)))),
            ])
        default:
            throw Failure.aria2("No such method: \(method)")
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

    /// Stitch's extra keys in `tellStatus` (aria2 clients ignore them): `stitch.lastProblem` in plain words,
    /// `stitch.segments` (each range with how far it is on stable storage and how far written, numbers as strings)
    /// and `stitch.validators`, and once finished `stitch.verifiedDigest` (the digest the server announced that the
    /// file matched, `Repr-Digest sha-256=…`). Read from the download's state file, so only for one download at a
    /// time.
    static func details(_ snapshot: DownloadSnapshot, keys: Set<String>?) -> [(String, JSON)] {
        func wanted(_ key: String) -> Bool { keys.map { $0.contains(key) } ?? true }
        var members: [(String, JSON)] = []
        if wanted("stitch.lastProblem"), let problem = snapshot.lastProblem {
            members.append(("stitch.lastProblem", .string(problem)))
        }
        if wanted("stitch.verifiedDigest"), let digest = snapshot.verifiedDigest {
            members.append(("stitch.verifiedDigest", .string(digest)))
        }
        guard wanted("stitch.segments") || wanted("stitch.validators") else { return members }
        var segments: [JSON] = []
        var validators: [(String, JSON)] = []
        if snapshot.status == .completed, let total = snapshot.progress.total {
            segments = [segment(0, total, total, total)]
        } else if let path = snapshot.path, let saved = try? Downloader.savedDownload(at: path) {
            segments = saved.segments.map { segment($0.start, $0.end, $0.durable, $0.written) }
            if let etag = saved.etag { validators.append(("etag", .string(etag))) }
            if let modified = saved.lastModified { validators.append(("lastModified", .string(modified))) }
        }
        if wanted("stitch.segments") { members.append(("stitch.segments", .array(segments))) }
        if wanted("stitch.validators") { members.append(("stitch.validators", .object(validators))) }
        return members
    }

    private static func segment(_ start: Int64, _ end: Int64?, _ durable: Int64, _ written: Int64) -> JSON {
        .object([
            ("start", .string(String(start))), ("end", .string(end.map(String.init) ?? "")),
            ("durable", .string(String(durable))), ("written", .string(String(written))),
        ])
    }
}
