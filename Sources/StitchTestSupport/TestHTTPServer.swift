import Glibc
import StitchLocks

/// An error starting ``TestHTTPServer``.
public struct TestServerError: Error, Sendable, CustomStringConvertible {
    /// What went wrong.
    public let description: String

    init(_ description: String) {
        self.description = description
    }
}

/// A loopback HTTP/1.1 server for tests, with per-request fault injection.
///
/// The server listens on `127.0.0.1` with an ephemeral port as soon as it is created, and
/// handles each connection on its own thread. It serves in-memory ``ServedFile``s with correct
/// range, `If-Range`, `HEAD` and keep-alive handling (like nginx), unless a ``Fault`` chosen by
/// the path's ``FaultPolicy`` tells it to misbehave. Every request is recorded, and body bytes
/// sent are counted so tests can assert how much was (re-)fetched.
///
/// ```swift
/// let server = try TestHTTPServer()
/// defer { server.stop() }
/// server.serve("/file", file: .random(size: 1 << 20, seed: 1, etag: "\"v1\""),
///              faults: .onRequest(0, .dropAfter(1000)))
/// // ... download server.url("/file") ...
/// #expect(server.requests(for: "/file").count == 2)
/// ```
///
/// Paths are matched exactly against the request path with the query removed (no percent-decoding).
/// Unknown paths get 404. Call ``stop()`` when done (it is also called on deinit).
public final class TestHTTPServer: Sendable {
    private let core: ServerCore

    /// Starts a server on `127.0.0.1` with an ephemeral port.
    public init() throws(TestServerError) {
        PoolWatchdog.start()
        core = try ServerCore()
    }

    deinit {
        core.stop()
    }

    /// The TCP port the server listens on.
    public var port: Int { core.port }

    /// `http://127.0.0.1:<port>`.
    public var baseURL: String { "http://127.0.0.1:\(core.port)" }

    /// The absolute URL for `path` (which should start with `/`).
    public func url(_ path: String) -> String {
        baseURL + path
    }

    // MARK: Routes

    /// Serves `file` at `path` with the given fault policy, replacing whatever was there
    /// (file, faults, or redirect). The per-path request index keeps counting across replacements.
    public func serve(_ path: String, file: ServedFile, faults: FaultPolicy = .none) {
        core.state.withLock { $0.routes[path] = Route(kind: .file(file), faults: faults) }
    }

    /// Serves `file` at `path`, choosing a fault for every request with `faults(request, index)`,
    /// where `index` is the 0-based count of earlier requests to `path`.
    public func serve(
        _ path: String, file: ServedFile, faults: @escaping @Sendable (RecordedRequest, Int) -> Fault
    ) {
        serve(path, file: file, faults: FaultPolicy(faults))
    }

    /// Replaces the file at `path` but keeps its current fault policy (none if `path` was not a file).
    /// Use it to simulate the resource changing (new ETag, Last-Modified or length) between requests.
    public func replaceFile(_ path: String, with file: ServedFile) {
        core.state.withLock { state in
            let faults = state.routes[path]?.faults ?? .none
            state.routes[path] = Route(kind: .file(file), faults: faults)
        }
    }

    /// Changes the fault policy of `path` (kept if the file is later replaced with ``replaceFile(_:with:)``).
    public func setFaults(_ path: String, _ faults: FaultPolicy) {
        core.state.withLock { state in
            if let route = state.routes[path] {
                state.routes[path] = Route(kind: route.kind, faults: faults)
            }
        }
    }

    /// Makes `path` answer every request with a redirect to `location` (sent verbatim: a path
    /// such as `/b`, or an absolute URL, e.g. ``url(_:)``). Chains and loops (`/a`→`/b`→`/a`) are fine.
    public func redirect(from path: String, to location: String, status: Int = 302) {
        core.state.withLock {
            $0.routes[path] = Route(kind: .redirect(location: location, status: status), faults: .none)
        }
    }

    /// Stops serving `path` (later requests get 404).
    public func remove(_ path: String) {
        core.state.withLock { _ = $0.routes.removeValue(forKey: path) }
    }

    /// A default pace, in body bytes per second, for every file response that has no
    /// ``Fault/throttle(bytesPerSecond:)`` of its own. Nil (the default) means full speed.
    public var throttle: Int? {
        get { core.state.withLock { $0.throttle } }
        set { core.state.withLock { $0.throttle = newValue } }
    }

    // MARK: Observations

    /// A snapshot of every request received so far, in arrival order.
    public var requests: [RecordedRequest] {
        core.state.withLock { $0.requests }
    }

    /// A snapshot of the requests received for `path` (query ignored), in arrival order.
    public func requests(for path: String) -> [RecordedRequest] {
        core.state.withLock { $0.requests.filter { $0.path == path } }
    }

    /// Total file-body bytes handed to the kernel (`send` succeeded) across all responses. Header,
    /// chunk-framing, and error/redirect body bytes are not counted. Exact once the client has
    /// received a complete response; while a write is in flight it may count bytes not yet accepted.
    /// Use ``waitUntilIdle(timeout:)`` first if a client aborted mid-transfer.
    public var bodyBytesSent: Int {
        core.state.withLock { $0.bodyBytes }
    }

    /// File-body bytes sent for `path` (see ``bodyBytesSent``).
    public func bodyBytesSent(for path: String) -> Int {
        core.state.withLock { $0.bodyBytesPerPath[path] ?? 0 }
    }

    /// The file responses sent for `path` (query ignored), in the order their requests arrived: what each
    /// request was answered with (status, the body's slice of the file) and how many of those body bytes were
    /// handed to the kernel (see ``bodyBytesSent``). Requests answered otherwise (404, 416, redirects, faults that
    /// replace the response) have none.
    public func responses(for path: String) -> [ServedResponse] {
        core.state.withLock { state in
            state.responses.values.filter { $0.request.path == path }.sorted { $0.request.serial < $1.request.serial }
        }
    }

    /// The number of TCP connections accepted so far.
    public var connectionCount: Int {
        core.state.withLock { $0.nextConnectionID }
    }

    // MARK: Concurrency

    /// TCP connections open right now (accepted and not yet closed by the server), busy or idle.
    /// A client's idle keep-alive connections count here; see ``activeRequests`` for those in use.
    public var openConnections: Int {
        core.state.withLock { $0.connections.count }
    }

    /// The most TCP connections that were open at once (see ``openConnections``).
    public var maxOpenConnections: Int {
        core.state.withLock { $0.maxOpenConnections }
    }

    /// Requests in flight right now: received, their response not yet wholly sent (a stalled or
    /// throttled response is in flight), and their client still connected. Idle keep-alive
    /// connections do not count.
    public var activeRequests: Int {
        core.state.withLock { state in state.inFlight.values.filter { !$0.gone && !peerHasHungUp($0.fd) }.count }
    }

    /// The most requests that were in flight at once (see ``activeRequests``), sampled whenever a
    /// request arrives. A response counts as over once its last byte is handed to the kernel, so a
    /// client's next request never overlaps its previous one; one whose client has already closed
    /// its connection (an aborted transfer the server has not noticed yet) never counts.
    public var maxActiveRequests: Int {
        core.state.withLock { $0.maxInFlight }
    }

    /// The most distinct paths that had requests in flight at once (sampled like ``maxActiveRequests``):
    /// with one path per download, the most downloads transferring at once, whatever their connections.
    public var maxActivePaths: Int {
        core.state.withLock { $0.maxInFlightPaths }
    }

    /// The most requests for `path` that were in flight at once (see ``maxActiveRequests``).
    public func maxActiveRequests(for path: String) -> Int {
        core.state.withLock { $0.maxInFlightPerPath[path] ?? 0 }
    }

    /// Samples the counts of requests in flight (``maxActiveRequests`` and the like) only after waiting up to
    /// `lag` for connections whose client is closing them, whenever a request arrives with more than `count`
    /// others' in flight: for a client whose transport closes a connection a little after its transfer has ended
    /// (``TransportBackend/connectionCloseLag``), so that the sample shows what the client holds. The wait ends as
    /// soon as enough have closed; a connection still open after it counts. Zero `lag`: sampled at once (as before
    /// any call).
    public func settleInFlightCount(above count: Int, within lag: Duration) {
        core.state.withLock { $0.settling = lag > .zero ? (count, lag) : nil }
    }

    /// Restarts the maxima (``maxOpenConnections``, ``maxActiveRequests``, ``maxActivePaths`` and the
    /// per-path maxima) from the current values.
    public func resetConcurrencyMaxima() {
        core.state.withLock { state in
            state.maxOpenConnections = state.connections.count
            let live = state.inFlight.values.filter { !$0.gone && !peerHasHungUp($0.fd) }
            state.maxInFlight = live.count
            state.maxInFlightPaths = Set(live.map(\.path)).count
            state.maxInFlightPerPath = [:]
            for entry in live { state.maxInFlightPerPath[entry.path, default: 0] += 1 }
        }
    }

    /// Waits until ``openConnections`` is at most `count`. Returns false on timeout.
    public func waitForOpenConnections(atMost count: Int, timeout: Duration = .seconds(60)) -> Bool {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while openConnections > count {
            if clock.now >= deadline { return false }
            usleep(1000)
        }
        return true
    }

    // MARK: Synchronisation

    /// Releases every response currently stalled by ``Fault/stallAfter(_:then:)`` or
    /// ``Fault/stallBeforeHeaders(then:)``. Stalls reached later block until the next call.
    /// Returns how many stalls were released.
    @discardableResult
    public func releaseStalls() -> Int {
        core.state.withLock { state in
            let count = state.stalls.count
            for fd in state.stalls.values { signalPipe(fd) }
            state.stalls.removeAll()
            return count
        }
    }

    /// Waits until a response reaches a stall point, consuming one stall event (so the n-th call
    /// returns for the n-th stall, even if it was reached before the call). Returns false on timeout.
    public func waitForStall(timeout: Duration = .seconds(60)) -> Bool {
        core.progress.wait(timeout: timeout) { progress in
            guard progress.stallsReached > progress.stallsAwaited else { return false }
            progress.stallsAwaited += 1
            return true
        }
    }

    /// Waits until at least `count` requests in total have been received. Returns false on timeout.
    public func waitForRequests(_ count: Int, timeout: Duration = .seconds(60)) -> Bool {
        core.progress.wait(timeout: timeout) { $0.requestCount >= count }
    }

    /// Waits until no response is being written (a stalled response counts as being written), so
    /// that counters such as ``bodyBytesSent`` are settled. Returns false on timeout.
    public func waitUntilIdle(timeout: Duration = .seconds(60)) -> Bool {
        core.progress.wait(timeout: timeout) { $0.activeResponses == 0 }
    }

    /// Stops the server: closes the listener and every live connection, ends stalls and throttled
    /// transfers, and waits for all server threads to finish. Idempotent. Do not call it from a
    /// fault closure (it would wait for its own thread).
    public func stop() {
        core.stop()
    }
}

/// One file response of ``TestHTTPServer`` (see ``TestHTTPServer/responses(for:)``).
public struct ServedResponse: Sendable {
    /// The request it answered.
    public var request: RecordedRequest
    /// 200 or 206 (or whatever a ``Fault/wrongContentRange(_:)`` made it).
    public var status: Int
    /// Where its body starts in the file, and how many bytes it was to carry (0 for HEAD).
    public var bodyStart: Int
    public var bodyLength: Int
    /// Body bytes handed to the kernel so far (exact once the server is idle; see ``TestHTTPServer/bodyBytesSent``).
    public var bodyBytesSent: Int
}

// MARK: - Core

/// What a path serves.
struct Route: Sendable {
    enum Kind: Sendable {
        case file(ServedFile)
        case redirect(location: String, status: Int)
    }

    var kind: Kind
    var faults: FaultPolicy
}

/// Server state guarded by a `Locked`.
struct ServerState: Sendable {
    var routes: [String: Route] = [:]
    var requests: [RecordedRequest] = []
    var requestsPerPath: [String: Int] = [:]
    var bodyBytes = 0
    var bodyBytesPerPath: [String: Int] = [:]
    /// File responses by request serial.
    var responses: [Int: ServedResponse] = [:]
    /// Live connection descriptors by connection id (shut down by `stop`).
    var connections: [Int: Int32] = [:]
    var maxOpenConnections = 0
    /// Connections with a response in progress, by connection id.
    var inFlight: [Int: InFlight] = [:]
    var maxInFlight = 0
    var maxInFlightPaths = 0
    var maxInFlightPerPath: [String: Int] = [:]
    var nextConnectionID = 0
    /// Write ends of the wake-up pipes of responses currently stalled, by stall id.
    var stalls: [Int: Int32] = [:]
    var nextStallID = 0
    var throttle: Int?
    var stopped = false
    /// See ``TestHTTPServer/settleInFlightCount(above:within:)``.
    var settling: (above: Int, lag: Duration)?
}

/// A response in progress on a connection.
struct InFlight: Sendable {
    var fd: Int32
    var path: String
    /// Set once the server saw the client close the connection.
    var gone = false
}

/// Whether the peer of a connected socket has closed it (or it failed), without blocking.
/// Only for descriptors in ``ServerState/inFlight``, checked under the state lock (so never a
/// recycled descriptor: a connection leaves `inFlight` before its descriptor is closed).
func peerHasHungUp(_ fd: Int32) -> Bool {
    var entry = pollfd(fd: fd, events: pollReadHangUp, revents: 0)
    guard poll(&entry, 1, 0) > 0 else { return false }
    return entry.revents & (pollReadHangUp | Int16(POLLHUP) | Int16(POLLERR) | Int16(POLLNVAL)) != 0
}

/// Counters that threads wait on, guarded by a `Condition`.
struct Progress: Sendable {
    var stallsReached = 0
    var stallsAwaited = 0
    var requestCount = 0
    var activeResponses = 0
    var liveThreads = 0
}

/// The shared engine behind ``TestHTTPServer``; server threads hold this, not the public object,
/// so the public object's deinit can stop the server.
final class ServerCore: Sendable {
    static let headerLimit = 64 * 1024

    let listenFD: Int32
    let port: Int
    /// A pipe that becomes (and stays) readable once the server stops.
    let stopSignal: (read: Int32, write: Int32)
    let state = Locked(ServerState())
    let progress = Condition(Progress())
    /// Set once `stop()` has finished closing the listener and the stop pipe.
    private let closed = Locked(false)

    init() throws(TestServerError) {
        let listener = try makeLoopbackListener()
        guard let signal = makePipe() else {
            closeDescriptor(listener.fd)
            throw TestServerError("pipe() failed: errno \(errno)")
        }
        listenFD = listener.fd
        port = listener.port
        stopSignal = signal
        progress.update { $0.liveThreads += 1 }
        if !spawnThread({ [self] in acceptLoop() }) {
            progress.update { $0.liveThreads -= 1 }
            closeDescriptor(listenFD)
            closeDescriptor(signal.read)
            closeDescriptor(signal.write)
            throw TestServerError("could not start the accept thread")
        }
    }

    private func acceptLoop() {
        defer { progress.update { $0.liveThreads -= 1 } }
        while true {
            var fds = [
                pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0),
                pollfd(fd: stopSignal.read, events: Int16(POLLIN), revents: 0),
            ]
            if poll(&fds, 2, -1) < 0 {
                if errno == EINTR { continue }
                return
            }
            if fds[1].revents != 0 { return }
            guard fds[0].revents != 0 else { continue }
            let fd = accept(listenFD, nil, nil)
            if fd < 0 {
                // Back off briefly on persistent errors such as EMFILE instead of spinning.
                if errno != EINTR, errno != ECONNABORTED {
                    var stopFD = [pollfd(fd: stopSignal.read, events: Int16(POLLIN), revents: 0)]
                    _ = poll(&stopFD, 1, 10)
                }
                continue
            }
            setCloseOnExec(fd)
            setNoDelay(fd)
            let id: Int? = state.withLock { state in
                if state.stopped { return nil }
                let id = state.nextConnectionID
                state.nextConnectionID += 1
                state.connections[id] = fd
                state.maxOpenConnections = max(state.maxOpenConnections, state.connections.count)
                return id
            }
            guard let id else {
                closeDescriptor(fd)
                return
            }
            progress.update { $0.liveThreads += 1 }
            let started = spawnThread { [self] in
                ConnectionHandler(core: self, fd: fd, id: id).run()
                progress.update { $0.liveThreads -= 1 }
            }
            if !started {
                progress.update { $0.liveThreads -= 1 }
                state.withLock { _ = $0.connections.removeValue(forKey: id) }
                closeDescriptor(fd)
            }
        }
    }

    /// Records a request and returns it with the route it maps to.
    func record(_ head: RequestHead, connectionID: Int, indexOnConnection: Int) -> (RecordedRequest, Route?) {
        let (path, query) = splitTarget(head.target)
        let result = state.withLock { state in
            let index = state.requestsPerPath[path, default: 0]
            state.requestsPerPath[path] = index + 1
            let request = RecordedRequest(
                serial: state.requests.count, index: index, method: head.method, target: head.target,
                path: path, query: query, version: head.version, headers: head.headers,
                connectionID: connectionID, indexOnConnection: indexOnConnection)
            state.requests.append(request)
            return (request, state.routes[path])
        }
        progress.update { $0.requestCount += 1 }
        return result
    }

    /// Marks the response to a request just recorded on connection `id` as in flight, and samples the
    /// maxima. Other in-flight responses whose client has hung up do not count (their threads may not
    /// have noticed yet): a client closes an aborted connection before it opens the next one.
    func beginResponse(connectionID id: Int, fd: Int32, path: String) {
        let (settling, others) = state.withLock { state in
            (state.settling, state.inFlight.filter { $0.key != id && !$0.value.gone }.map(\.value.fd))
        }
        if let settling, others.count + 1 > settling.above {
            awaitHangUps(of: others, count: others.count + 1 - settling.above, within: settling.lag)
        }
        state.withLock { state in
            state.inFlight[id] = InFlight(fd: fd, path: path)
            for (other, entry) in state.inFlight where other != id && !entry.gone && peerHasHungUp(entry.fd) {
                state.inFlight[other]?.gone = true
            }
            let live = state.inFlight.values.filter { !$0.gone }
            state.maxInFlight = max(state.maxInFlight, live.count)
            state.maxInFlightPaths = max(state.maxInFlightPaths, Set(live.map(\.path)).count)
            let onPath = live.filter { $0.path == path }.count
            state.maxInFlightPerPath[path] = max(state.maxInFlightPerPath[path] ?? 0, onPath)
        }
    }

    /// Ends the in-flight response of connection `id` (idempotent). Called just before the client can
    /// see the response end (its last byte, or the connection closing).
    /// Waits until `count` of the connections `fds` have been closed by their client, or `lag` has passed. A
    /// descriptor closed and reused meanwhile only makes the wait longer: the sample after it reads the live set
    /// again, under the lock.
    private func awaitHangUps(of fds: [Int32], count: Int, within lag: Duration) {
        let deadline = ContinuousClock.now + lag
        var open = fds
        var closed = 0
        while closed < count, !open.isEmpty {
            let left = deadline - ContinuousClock.now
            let (seconds, attoseconds) = left.components
            let milliseconds = max(0, Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000))
            var entries = open.map { pollfd(fd: $0, events: pollReadHangUp, revents: 0) }
            let ready = poll(&entries, nfds_t(entries.count), milliseconds)
            if ready < 0, errno == EINTR { continue }
            let hungUp = pollReadHangUp | Int16(POLLHUP) | Int16(POLLERR) | Int16(POLLNVAL)
            let still = entries.filter { $0.revents & hungUp == 0 }.map(\.fd)
            closed += open.count - still.count
            open = still
            if ready <= 0 { return }  // the lag is over (or poll failed): what is open counts
        }
    }

    func endResponse(connectionID id: Int) {
        state.withLock { _ = $0.inFlight.removeValue(forKey: id) }
    }

    func stop() {
        let first = state.withLock { state in
            if state.stopped { return false }
            state.stopped = true
            // Shut down under the lock: a connection thread removes its fd here before closing it,
            // so we can never shut down a recycled descriptor.
            for fd in state.connections.values { _ = shutdown(fd, Int32(SHUT_RDWR)) }
            return true
        }
        if first { signalPipe(stopSignal.write) }
        _ = progress.wait(timeout: nil) { $0.liveThreads == 0 }
        closed.withLock { closed in
            guard !closed else { return }
            closed = true
            closeDescriptor(listenFD)
            closeDescriptor(stopSignal.read)
            closeDescriptor(stopSignal.write)
        }
    }
}
