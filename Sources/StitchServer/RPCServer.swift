import CMicroHTTPD
import Foundation
public import StitchRPC
import StitchLocks
import Synchronization

/// The HTTP side of `stitch serve`: libmicrohttpd listens (one daemon per address, each with its own epoll thread)
/// and hands each `/jsonrpc` request to ``Aria2RPC`` in a task, with the connection suspended meanwhile, so a slow
/// call never holds a thread and MHD keeps serving the others. WebSocket upgrades are handed to the
/// ``WebSocketHub``.
///
/// Every request passes the ``AccessPolicy`` (Host, Origin, Sec-Fetch-Site) before anything else; bodies are
/// bounded while they arrive; GET may call only methods that change nothing.
public final class RPCServer: Sendable {
    public struct Configuration: Sendable {
        /// Where to listen: `HOST:PORT` (`[::1]:6800` for IPv6); port 0 picks a free one.
        public var addresses: [String] = ["127.0.0.1:6800", "[::1]:6800"]
        public var policy = AccessPolicy()
        /// The largest request body (and WebSocket message) accepted.
        public var maxRequestSize = 16 << 20
        /// The memory for one connection's request head (its headers and query); a larger head gets 431.
        public var maxHeaderBytes = 16 << 10
        public var maxConnections = 1_024
        /// Connections from one address at once (so one client cannot hold them all).
        public var maxConnectionsPerAddress = 256
        /// MHD's polling threads per address (each answers reads on its own; the machine's cores by default).
        public var threads = max(1, min(8, ProcessInfo.processInfo.activeProcessorCount))
        /// Seconds a connection may stay idle.
        public var connectionTimeout = 60
        public var maxWebSocketClients = 64
        /// The wrong-token throttle: the first delay, the longest, and the longest a request may wait for its turn
        /// (later ones are refused at once). See ``AuthThrottle``.
        public var wrongSecretDelays: (first: Duration, max: Duration, maxWait: Duration) = (
            .milliseconds(100), .seconds(5), .seconds(10)
        )
        /// PEM key and certificate: serve HTTPS and WSS instead.
        public var tls: (key: String, certificate: String)?
        public init() {}
    }

    let configuration: Configuration
    let rpc: Aria2RPC
    let hub: WebSocketHub
    let throttle: AuthThrottle
    private let core: Core
    /// Where each listener is bound (with the port it got).
    public let boundAddresses: [String]

    /// Starts listening on every address.
    /// - Throws: ``ServerError`` when an address cannot be parsed or bound.
    public init(rpc: Aria2RPC, configuration: Configuration, log: @escaping @Sendable (String) -> Void) throws {
        self.configuration = configuration
        self.rpc = rpc
        let delays = configuration.wrongSecretDelays
        let throttle = AuthThrottle(firstDelay: delays.first, maxDelay: delays.max, maxWait: delays.maxWait)
        self.throttle = throttle
        self.hub = WebSocketHub(
            rpc: rpc, throttle: throttle, maxClients: configuration.maxWebSocketClients,
            maxMessage: configuration.maxRequestSize, log: log)
        let core = Core(configuration: configuration, rpc: rpc, hub: hub, throttle: throttle, log: log)
        self.core = core
        var bound: [String] = []
        do {
            for address in configuration.addresses {
                bound.append(try core.listen(address))
            }
        } catch {
            core.stop()
            hub.stop()
            throw error
        }
        self.boundAddresses = bound
    }

    /// Changes the names `Host` may carry besides IP addresses and `localhost` (`--rpc-allow-host`), for the
    /// requests that arrive from now on.
    public func setAllowedHosts(_ names: [String]) {
        let allowed = AccessPolicy(allowedHosts: names).allowedHosts
        core.policy.withLock { $0.allowedHosts = allowed }
    }

    /// Sends a notification to every WebSocket client.
    public func broadcast(_ message: [UInt8]) { hub.broadcast(message) }

    /// Stops accepting, closes the WebSocket clients, lets the calls under way answer, and closes every listener.
    public func stop() async {
        core.quiesce()
        // The hub waits (up to its grace) for the answers of calls under way: on a thread of its own, not one of
        // the concurrency pool's, which those calls need.
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async { [hub] in
                hub.stop()
                continuation.resume()
            }
        }
        await core.drain()
        core.stop()
    }
}

public struct ServerError: Error, Sendable, CustomStringConvertible {
    public var description: String
}

/// One answer to an HTTP request.
struct HTTPAnswer: Sendable, Error {
    var status: UInt32
    var body: [UInt8]
    var contentType = "application/json-rpc"
    var headers: [(String, String)] = []
    /// Call `MHD_resume_connection` after storing it (the connection was suspended for it).
    var resumes = false

    /// - Parameter code: the JSON-RPC error code (by default -32600 for 413, aria2's 1 otherwise).
    static func refusal(_ status: Int, _ reason: String, code: Int? = nil) -> HTTPAnswer {
        let body = JSON.object([
            ("id", .null), ("jsonrpc", .string("2.0")),
            (
                "error",
                .object([("code", .integer(Int64(code ?? (status == 413 ? -32600 : 1)))), ("message", .string(reason))])
            ),
        ])
        return HTTPAnswer(status: UInt32(status), body: body.serialized)
    }
}

/// The state MHD's callbacks reach through their closure pointer.
final class Core: @unchecked Sendable {
    // `daemons` changes only in listen (before serving) and stop; the rest is immutable or locked.
    private var daemons: [OpaquePointer] = []
    private var addresses: [UnsafeMutableRawPointer] = []
    private var keys: [UnsafeMutablePointer<CChar>] = []
    let configuration: RPCServer.Configuration
    /// The access policy: its allowed host names change on a configuration reload (``RPCServer/setAllowedHosts(_:)``).
    let policy: Locked<AccessPolicy>
    let rpc: Aria2RPC
    let hub: WebSocketHub
    let throttle: AuthThrottle
    let log: @Sendable (String) -> Void
    /// Requests whose connection is suspended while their call runs; stopping waits for them.
    /// Requests suspended for their call (until resumed) and pending (until MHD says they completed: answer
    /// sent or client gone). Once `closed`, no request is suspended any more (keep-alive connections may still
    /// send some after ``quiesce()``): they get 503 at once, so `MHD_stop_daemon` never meets a suspended
    /// connection.
    private let inFlight = Locked<(suspended: Int, pending: Int, closed: Bool)>((0, 0, false))
    /// Cleared by ``quiesce()``: from then on MHD's accept policy callback refuses every new connection.
    let accepting = Atomic<Bool>(true)

    init(
        configuration: RPCServer.Configuration, rpc: Aria2RPC, hub: WebSocketHub, throttle: AuthThrottle,
        log: @escaping @Sendable (String) -> Void
    ) {
        self.configuration = configuration
        self.policy = Locked(configuration.policy)
        self.rpc = rpc
        self.hub = hub
        self.throttle = throttle
        self.log = log
    }

    /// Binds `address` and starts its MHD daemon; returns the address with its port.
    func listen(_ address: String) throws -> String {
        guard let (host, port) = Self.split(address) else {
            throw ServerError(description: "cannot listen on \(address.debugDescription): expected HOST:PORT")
        }
        var v4 = sockaddr_in()
        var v6 = sockaddr_in6()
        let storage: UnsafeMutableRawPointer
        var flags = UInt32(MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_EPOLL.rawValue)
            | UInt32(MHD_ALLOW_SUSPEND_RESUME.rawValue) | UInt32(MHD_ALLOW_UPGRADE.rawValue)
        if inet_pton(AF_INET, host, &v4.sin_addr) == 1 {
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = port.bigEndian
            storage = .allocate(byteCount: MemoryLayout<sockaddr_in>.size, alignment: 8)
            storage.storeBytes(of: v4, as: sockaddr_in.self)
        } else if inet_pton(AF_INET6, host, &v6.sin6_addr) == 1 {
            v6.sin6_family = sa_family_t(AF_INET6)
            v6.sin6_port = port.bigEndian
            storage = .allocate(byteCount: MemoryLayout<sockaddr_in6>.size, alignment: 8)
            storage.storeBytes(of: v6, as: sockaddr_in6.self)
            flags |= UInt32(MHD_USE_IPv6.rawValue)
        } else {
            throw ServerError(description: "cannot listen on \(address.debugDescription): \(host) is not an IP address")
        }
        addresses.append(storage)
        if configuration.tls != nil { flags |= UInt32(MHD_USE_TLS.rawValue) }
        let key = configuration.tls.map { strdup($0.key)! }
        let certificate = configuration.tls.map { strdup($0.certificate)! }
        if let key, let certificate { keys += [key, certificate] }
        var config = stitch_mhd_config(
            flags: flags, address: storage.assumingMemoryBound(to: sockaddr.self),
            connection_limit: UInt32(configuration.maxConnections),
            per_ip_connection_limit: UInt32(configuration.maxConnectionsPerAddress),
            connection_timeout: UInt32(configuration.connectionTimeout),
            memory_limit: configuration.maxHeaderBytes, thread_stack_size: 1 << 20,
            thread_pool_size: UInt32(configuration.threads),
            tls_key: key.map { UnsafePointer($0) }, tls_cert: certificate.map { UnsafePointer($0) })
        let context = Unmanaged.passUnretained(self).toOpaque()
        guard
            let daemon = stitch_mhd_start(
                &config, acceptPolicy, context, accessHandler, context, requestCompleted, context)
        else {
            let why = errno == EADDRINUSE ? "the address is in use" : String(cString: strerror(errno))
            throw ServerError(description: "cannot listen on \(address): \(why)")
        }
        daemons.append(daemon)
        let bound = stitch_mhd_port(daemon)
        return host.contains(":") ? "[\(host)]:\(bound)" : "\(host):\(bound)"
    }

    static func split(_ address: String) -> (String, UInt16)? {
        guard let colon = address.lastIndex(of: ":"), let port = UInt16(address[address.index(after: colon)...])
        else { return nil }
        var host = String(address[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return host.isEmpty ? nil : (host, port)
    }

    /// Stops taking new connections: each is closed as MHD accepts it (its accept policy callback says no), until
    /// `MHD_stop_daemon` closes the listening sockets.
    ///
    /// Not `MHD_quiesce_daemon`: with a thread pool and epoll (libmicrohttpd 0.9.75) it aborted the process once
    /// under keep-alive polling ("Failed to remove listen FD from epoll set", in
    /// `DaemonTests.sigtermUnderKeepAlivePollingExitsCleanly`: SIGTERM ended the daemon with SIGABRT). The likely
    /// cause, read from the message and not checked against MHD's source: the quiesce marks the workers before it
    /// removes the listening socket from their epoll sets, and a worker woken in between removes it first.
    func quiesce() {
        accepting.store(false, ordering: .releasing)
    }

    /// Refuses to suspend any more requests, waits until none is suspended (MHD must not stop with one), and
    /// gives the answers on their way (`aria2.shutdown`'s own among them) up to two seconds to leave. Polls: this
    /// runs once, at the end.
    func drain() async {
        inFlight.withLock { $0.closed = true }
        while inFlight.withLock({ $0.suspended }) > 0 { try? await Task.sleep(for: .milliseconds(5)) }
        let grace = ContinuousClock.now + .seconds(2)
        while inFlight.withLock({ $0.pending }) > 0, ContinuousClock.now < grace {
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    func stop() {
        for daemon in daemons { MHD_stop_daemon(daemon) }
        daemons.removeAll()
        for storage in addresses { storage.deallocate() }
        addresses.removeAll()
        for key in keys { free(key) }
        keys.removeAll()
    }

    // MARK: Requests

    /// One request, from its head to its answer. MHD calls back for it on its one thread, in turn; only `answer`
    /// is handed over from the task that computes it.
    final class Exchange: @unchecked Sendable {
        var body: [UInt8] = []
        var tooLarge = false
        var started = false
        var refusal: HTTPAnswer?
        var isGet = false
        /// A 101 was queued and the hub's place is held until MHD hands over the socket (or the request ends
        /// without it, when the place is given back).
        var upgradePending = false
        /// Suspended for its call, and counted as pending in `inFlight` until the request completes.
        var counted = false
        /// The client's address, for the log.
        let peer: String
        /// What the wrong-token throttle counts by: the address, or an IPv6 address's /64.
        let key: String
        let answer = Locked<HTTPAnswer?>(nil)
        init(peer: String, key: String) {
            self.peer = peer
            self.key = key
        }
    }

    func access(
        _ connection: OpaquePointer, _ url: String, _ method: String, _ upload: UnsafePointer<CChar>?,
        _ size: UnsafeMutablePointer<Int>, _ slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    ) -> MHD_Result {
        guard let pointer = slot.pointee else {
            // The head has arrived: decide at once whether this request may go on.
            let (peer, key) = Self.peer(connection)
            let exchange = Exchange(peer: peer, key: key)
            slot.pointee = Unmanaged.passRetained(exchange).toOpaque()
            let result = begin(exchange, connection, url, method)
            // A refusal is answered at once, without reading a body that may never come (MHD closes the
            // connection after it).
            if result == .YES, let refusal = exchange.refusal { return queue(connection, refusal) }
            return result
        }
        let exchange = Unmanaged<Exchange>.fromOpaque(pointer).takeUnretainedValue()
        if size.pointee > 0 {
            if !exchange.tooLarge, let upload {
                if exchange.body.count + size.pointee > configuration.maxRequestSize {
                    exchange.tooLarge = true
                    exchange.body = []
                } else {
                    upload.withMemoryRebound(to: UInt8.self, capacity: size.pointee) {
                        exchange.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: size.pointee))
                    }
                }
            }
            size.pointee = 0
            return .YES
        }
        if let refusal = exchange.refusal { return queue(connection, refusal) }
        if exchange.tooLarge {
            return queue(connection, .refusal(413, "the request is larger than \(configuration.maxRequestSize) bytes "
                + "(--rpc-max-request-size)"))
        }
        if exchange.started {
            guard let answer = exchange.answer.withLock({ $0 }) else { return .NO }  // cannot happen: resumed
            return queue(connection, answer)
        }
        exchange.started = true
        let peer = exchange.peer
        let key = exchange.key
        // Taken once per request: a slowed client's turn is reserved here; one slowed too long is refused.
        guard let wait = throttle.admit(key) else {
            return queue(connection, .refusal(429, "too many wrong secrets from \(peer); try again later"))
        }
        let request: JSON
        let channel: Aria2RPC.Channel
        let callback: String?
        let call = exchange.isGet ? getCall(connection) : nil
        // JSONP is for pages of other origins (under --rpc-allow-origin-all) and old clients; this server's own
        // page has no use for it, and refusing it keeps `script-src 'self'` from covering an RPC answer.
        if call?.callback != nil, header(connection, "Sec-Fetch-Site")?.lowercased() == "same-origin" {
            return queue(connection, .refusal(400, "jsoncallback is not for this server's own pages"))
        }
        switch call.map(prepareGet) ?? preparePost(exchange.body) {
        case .failure(let answer):
            return queue(connection, answer)
        case .success(let prepared):
            (request, channel, callback) = prepared
        }
        exchange.body = []
        // Reads are answered here, on MHD's thread, from the RPC's fresh view: no task, no thread switch.
        if wait == .zero, let reply = rpc.handleImmediately(request, channel: channel) {
            settle(peer, key, reply)
            return queue(connection, wrap(reply.body ?? [], callback: callback, status: reply.status))
        }
        let work: @Sendable () async -> HTTPAnswer = { [self] in
            if wait > .zero { try? await Task.sleep(for: wait) }
            let reply = await rpc.handle(request, channel: channel)
            settle(peer, key, reply)
            return wrap(reply.body ?? [], callback: callback, status: reply.status)
        }
        let admitted = inFlight.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.suspended += 1
            state.pending += 1
            return true
        }
        guard admitted else {
            var closing = HTTPAnswer.refusal(503, "the server is stopping")
            closing.headers = [("Connection", "close")]
            return queue(connection, closing)
        }
        // Counted until MHD says the request is complete (its answer sent, or the client gone), not merely
        // resumed: stopping waits for the answers under way to leave, `aria2.shutdown`'s own among them.
        exchange.counted = true
        MHD_suspend_connection(connection)
        let resumable = UnsafeSendable(connection)
        Task {
            let answer = await work()
            exchange.answer.withLock { $0 = answer }
            MHD_resume_connection(resumable.value)
            self.inFlight.withLock { $0.suspended -= 1 }
        }
        return .YES
    }

    /// The first call for a request: path, method, the access policy, the declared size, WebSocket upgrades.
    private func begin(_ exchange: Exchange, _ connection: OpaquePointer, _ url: String, _ method: String)
        -> MHD_Result
    {
        let request = AccessPolicy.Request(
            host: header(connection, "Host"), origin: header(connection, "Origin"),
            fetchSite: header(connection, "Sec-Fetch-Site"))
        if url != "/jsonrpc", let asset = WebPage.asset(for: url) {
            if case .refuse(let status, let reason) = policy.withLock({ $0.checkHost(request) }) {
                log("refused a request for \(url) from \(exchange.peer): \(reason)")
                exchange.refusal = .refusal(status, reason)
            } else if method != "GET" && method != "HEAD" {
                exchange.refusal = .refusal(405, "method \(method) is not allowed for the page: use GET")
            } else {
                exchange.refusal = HTTPAnswer(
                    status: 200, body: asset.bytes, contentType: asset.contentType,
                    headers: WebPage.headers(host: request.host, secure: configuration.tls != nil))
            }
            return .YES
        }
        guard url == "/jsonrpc" else {
            exchange.refusal = .refusal(404, "not found: the page is at /, the RPC at /jsonrpc")
            return .YES
        }
        if case .refuse(let status, let reason) = policy.withLock({ $0.check(request) }) {
            log("refused a request from \(exchange.peer): \(reason)")
            exchange.refusal = .refusal(status, reason)
            return .YES
        }
        switch method {
        case "POST":
            if let length = header(connection, "Content-Length").flatMap(Int.init),
                length > configuration.maxRequestSize
            {
                exchange.refusal = .refusal(
                    413, "the request is larger than \(configuration.maxRequestSize) bytes (--rpc-max-request-size)")
            }
        case "GET":
            if header(connection, "Upgrade")?.lowercased() == "websocket" {
                return upgrade(exchange, connection)
            }
            exchange.isGet = true
        case "OPTIONS":
            // A CORS preflight: only with --rpc-allow-origin-all (the policy refused other origins already, and a
            // page of this server's own origin needs none).
            var answer = HTTPAnswer(status: 204, body: [])
            if configuration.policy.allowOriginAll {
                answer.headers = [
                    ("Access-Control-Allow-Origin", "*"), ("Access-Control-Allow-Methods", "POST, GET, OPTIONS"),
                    ("Access-Control-Allow-Headers", "Content-Type"), ("Access-Control-Max-Age", "1728000"),
                ]
            }
            exchange.refusal = answer
        default:
            exchange.refusal = .refusal(405, "method \(method) is not allowed: use POST or GET")
        }
        return .YES
    }

    private func upgrade(_ exchange: Exchange, _ connection: OpaquePointer) -> MHD_Result {
        guard header(connection, "Sec-WebSocket-Version") == "13", let key = header(connection, "Sec-WebSocket-Key"),
            !key.isEmpty, key.utf8.count <= 64
        else {
            exchange.refusal = .refusal(400, "a WebSocket upgrade needs Sec-WebSocket-Version 13 and a key")
            return .YES
        }
        guard hub.reserve() else {
            exchange.refusal = .refusal(
                503, "too many WebSocket clients (at most \(configuration.maxWebSocketClients))")
            return .YES
        }
        let context = Unmanaged.passUnretained(self).toOpaque()
        guard let response = MHD_create_response_for_upgrade(upgradeHandler, context) else {
            hub.release()
            return .NO
        }
        defer { MHD_destroy_response(response) }
        _ = MHD_add_response_header(response, "Upgrade", "websocket")
        _ = MHD_add_response_header(response, "Sec-WebSocket-Accept", WebSocketHub.accept(key: key))
        let result = MHD_queue_response(connection, 101, response)
        if result == .YES { exchange.upgradePending = true } else { hub.release() }
        return result
    }

    func upgraded(
        _ connection: OpaquePointer?, _ slot: UnsafeMutableRawPointer?, _ extra: UnsafePointer<CChar>?, _ count: Int,
        _ socket: Int32, _ handle: OpaquePointer?
    ) {
        let (peer, key) = connection.map(Self.peer) ?? ("?", "?")
        if let slot { Unmanaged<Exchange>.fromOpaque(slot).takeUnretainedValue().upgradePending = false }
        var bytes: [UInt8] = []
        if let extra, count > 0 {
            extra.withMemoryRebound(to: UInt8.self, capacity: count) {
                bytes = Array(UnsafeBufferPointer(start: $0, count: count))
            }
        }
        hub.adopt(socket: socket, handle: handle, extra: bytes, peer: peer, key: key)
    }

    private func getCall(_ connection: OpaquePointer) -> GetCall {
        GetCall(
            method: argument(connection, "method"), id: argument(connection, "id"),
            params: argument(connection, "params"), callback: argument(connection, "jsoncallback"))
    }

    struct GetCall: Sendable {
        var method: String?
        var id: String?
        var params: String?
        var callback: String?
    }

    private func preparePost(_ body: [UInt8]) -> Result<(JSON, Aria2RPC.Channel, String?), HTTPAnswer> {
        switch rpc.decode(body) {
        case .success(let request): return .success((request, .full, nil))
        case .failure(let reply): return .failure(HTTPAnswer(status: UInt32(reply.status), body: reply.body ?? [], headers: corsHeaders))
        }
    }

    /// aria2's GET form: `?method=M&id=I&params=<base64 of the JSON array>` (without `method`, `params` is a
    /// batch), answered as JSONP when `jsoncallback` names a function.
    private func prepareGet(_ call: GetCall) -> Result<(JSON, Aria2RPC.Channel, String?), HTTPAnswer> {
        if let callback = call.callback, !Self.isCallbackName(callback) {
            return .failure(.refusal(400, "jsoncallback must be a JavaScript name (letters, digits, _ $ .), at most 64"))
        }
        var params: JSON?
        if let text = call.params {
            // A `+` of the base64 may arrive as a space when the client did not percent-encode it.
            let base64 = text.replacingOccurrences(of: " ", with: "+")
            guard let data = Data(base64Encoded: base64, options: .ignoreUnknownCharacters)
                ?? Data(base64Encoded: Self.padded(base64.replacingOccurrences(of: "-", with: "+")
                    .replacingOccurrences(of: "_", with: "/")))
            else { return .failure(.refusal(400, "params is not base64", code: -32600)) }  // aria2's code
            switch rpc.decode(Array(data)) {
            case .success(let value): params = value
            case .failure(let reply): return .failure(wrap(reply.body ?? [], callback: call.callback, status: reply.status))
            }
        }
        let request: JSON
        if let method = call.method {
            var members: [(String, JSON)] = [("jsonrpc", .string("2.0")), ("method", .string(method))]
            members.append(("id", call.id.map(JSON.string) ?? .null))
            if let params { members.append(("params", params)) }
            request = .object(members)
        } else if let params {
            request = params
        } else {
            return .failure(.refusal(400, "a GET needs method= (and params=, base64 of a JSON array)", code: -32600))
        }
        return .success((request, .readOnly, call.callback))
    }

    /// Records whether the client's token was wrong (the throttle), and logs it.
    private func settle(_ peer: String, _ key: String, _ reply: Aria2RPC.Reply) {
        throttle.record(key, reply)
        if reply.unauthorized > 0 { log("\(reply.unauthorized) wrong secret(s) from \(peer)") }
        if reply.missingSecret > 0, let kept = throttle.logsMissingSecret(key) {
            log("\(reply.missingSecret) call(s) without the secret from \(peer)"
                + (kept > 0 ? " (and \(kept) such request(s) since the last such line)" : ""))
        }
    }

    /// The answer to a call: its body, or a JSONP script calling `callback` with it; with aria2's status.
    private func wrap(_ body: [UInt8], callback: String?, status: Int) -> HTTPAnswer {
        guard let callback else { return HTTPAnswer(status: UInt32(status), body: body, headers: corsHeaders) }
        return HTTPAnswer(
            status: UInt32(status), body: Array("\(callback)(".utf8) + body + Array(")".utf8),
            contentType: "text/javascript", headers: corsHeaders)
    }

    private var corsHeaders: [(String, String)] {
        configuration.policy.allowOriginAll ? [("Access-Control-Allow-Origin", "*")] : []
    }

    static func isCallbackName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, name.unicodeScalars.count <= 64 else { return false }
        func isLetter(_ c: Unicode.Scalar) -> Bool { ("a"..."z").contains(c) || ("A"..."Z").contains(c) || c == "_" || c == "$" }
        return isLetter(first) && name.unicodeScalars.allSatisfy { isLetter($0) || ("0"..."9").contains($0) || $0 == "." }
    }

    static func padded(_ base64: String) -> String {
        base64 + String(repeating: "=", count: (4 - base64.count % 4) % 4)
    }

    private func queue(_ connection: OpaquePointer, _ answer: HTTPAnswer) -> MHD_Result {
        let response = answer.body.withUnsafeBytes {
            MHD_create_response_from_buffer($0.count, UnsafeMutableRawPointer(mutating: $0.baseAddress),
                .RESPMEM_MUST_COPY)
        }
        guard let response else { return .NO }
        defer { MHD_destroy_response(response) }
        if !answer.body.isEmpty || answer.status != 204 {
            _ = MHD_add_response_header(response, "Content-Type", answer.contentType)
        }
        _ = MHD_add_response_header(response, "Cache-Control", "no-store")
        _ = MHD_add_response_header(response, "X-Content-Type-Options", "nosniff")
        for (name, value) in answer.headers { _ = MHD_add_response_header(response, name, value) }
        return MHD_queue_response(connection, answer.status, response)
    }

    private func header(_ connection: OpaquePointer, _ name: String) -> String? {
        MHD_lookup_connection_value(connection, .HEADER_KIND, name).map { String(cString: $0) }
    }

    private func argument(_ connection: OpaquePointer, _ name: String) -> String? {
        MHD_lookup_connection_value(connection, .GET_ARGUMENT_KIND, name).map { String(cString: $0) }
    }

    /// The client's address without its port (for the log), and what the throttle counts by: the address, or
    /// for IPv6 its /64 (one machine commonly has a whole /64 to rotate through).
    static func peer(_ connection: OpaquePointer) -> (String, String) {
        guard let address = stitch_mhd_client_address(connection) else { return ("?", "?") }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        switch Int32(address.pointee.sa_family) {
        case AF_INET:
            var v4 = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr }
            inet_ntop(AF_INET, &v4, &text, socklen_t(text.count))
            let peer = text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            return (peer, peer)
        case AF_INET6:
            var v6 = address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_addr }
            inet_ntop(AF_INET6, &v6, &text, socklen_t(text.count))
            let peer = text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            let prefix = withUnsafeBytes(of: &v6) { Array($0.prefix(8)) }
            if prefix.allSatisfy({ $0 == 0 }) { return (peer, peer) }  // ::1, v4-mapped: the whole address
            return (peer, prefix.map { String(format: "%02x", $0) }.joined() + "/64")
        default:
            return ("?", "?")
        }
    }

    func completed(_ slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?) {
        guard let slot, let pointer = slot.pointee else { return }
        let exchange = Unmanaged<Exchange>.fromOpaque(pointer)
        // The 101 never reached the client (it went away first): the hub's place is free again.
        if exchange.takeUnretainedValue().upgradePending { hub.release() }
        if exchange.takeUnretainedValue().counted { inFlight.withLock { $0.pending -= 1 } }
        exchange.release()
        slot.pointee = nil
    }
}

/// A value handed to a task that MHD's rules, not the type system, make safe (a connection pointer that only
/// `MHD_resume_connection` touches).
struct UnsafeSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

private let accessHandler: MHD_AccessHandlerCallback = {
    context, connection, url, method, _, upload, size, slot in
    guard let context, let connection, let url, let method, let size, let slot else { return .NO }
    let core = Unmanaged<Core>.fromOpaque(context).takeUnretainedValue()
    return core.access(connection, String(cString: url), String(cString: method), upload, size, slot)
}

private let acceptPolicy: MHD_AcceptPolicyCallback = { context, _, _ in
    guard let context else { return .NO }
    return Unmanaged<Core>.fromOpaque(context).takeUnretainedValue().accepting.load(ordering: .acquiring) ? .YES : .NO
}

private let requestCompleted: MHD_RequestCompletedCallback = { context, _, slot, _ in
    guard let context else { return }
    Unmanaged<Core>.fromOpaque(context).takeUnretainedValue().completed(slot)
}

private let upgradeHandler: MHD_UpgradeHandler = { context, connection, slot, extra, count, socket, handle in
    guard let context else { return }
    Unmanaged<Core>.fromOpaque(context).takeUnretainedValue().upgraded(connection, slot, extra, count, socket, handle)
}
