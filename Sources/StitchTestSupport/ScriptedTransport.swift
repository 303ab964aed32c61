import Foundation
public import Stitch
import Synchronization
import StitchLocks

/// An in-memory `HTTPTransport` for engine tests: no sockets, no libcurl. It serves one file the way nginx does
/// (`Range`, `If-Range` against its ETag or Last-Modified, `Content-Range`, `Accept-Ranges`) and misbehaves as the
/// test's script says, request by request: a temporary status, a body cut off after some bytes, a range ignored, a
/// new version of the file, a pause that lets the test interrupt the download at an exact byte count. Bodies are
/// delivered in chunks of the script's sizes, honouring the sink's pauses and aborts.
///
/// ```swift
/// let transport = ScriptedTransport(file: .random(size: 1 << 20, seed: 1, etag: "\"a\"")) { request, index in
///     index == 0 ? .serve(chunks: 4096...65536, cutAfter: 300_000) : .serve()
/// }
/// let result = try await Downloader(transport: transport).download(request)
/// ```
public final class ScriptedTransport: HTTPTransport, Sendable {
    /// What the script makes of one request.
    public enum Answer: Sendable {
        /// Serve it as nginx would, in chunks whose sizes are drawn from `chunks`; end the body with a network
        /// error after `cutAfter` body bytes, if given; at `rate` bytes a second of the request's clock, if given
        /// (after each chunk the body sleeps on that clock for the chunk's time).
        case serve(chunks: ClosedRange<Int> = 16_384...65_536, cutAfter: Int? = nil, rate: Double? = nil)
        /// Serve it, then hold the body after `bytes` bytes until the download is cancelled (`onHold` is called
        /// once the bytes are delivered: the test interrupts the download there).
        case hold(after: Int)
        /// Serve `after` bytes (at `rate` bytes a second of the request's clock, if given), then send nothing more: a
        /// stalled connection. It ends as a real transport's does, with ``TransportError/stalled(_:)`` once the
        /// request's ``TransportOptions/stallTimeout`` has passed on its clock (a ``ManualClock``: only as the test
        /// moves it), unless it is cancelled before.
        case stall(after: Int, rate: Double? = nil)
        /// Answer with this status and an empty body.
        case status(Int, retryAfter: String? = nil)
        /// Ignore the `Range` header: the whole file with 200.
        case wholeFile
        /// Publish `next` before answering (the file changed on the server), then serve.
        case newVersion(ServedFile)
    }

    /// A request as the transport saw it.
    public struct Seen: Sendable {
        public var range: String?
        public var ifRange: String?
        public var status: Int
        /// Body bytes delivered for it.
        public var delivered: Int
    }

    private struct State {
        var file: ServedFile
        var requests: [Seen] = []
        var random: SplitMix64
        var bodiesInFlight = 0
        /// Responses answered and not yet done with, and those asleep on a manual clock, by request index.
        var openResponses: Set<Int> = []
        var bodiesSleeping: Set<Int> = []
    }

    private let state: Locked<State>
    private let script: @Sendable (_ request: TransportRequest, _ index: Int) -> Answer
    /// Called (on the delivering task) when a `.hold` answer has delivered its bytes.
    public let onHold: @Sendable () -> Void

    /// - Parameters:
    ///   - file: what is served at any URL, until a `.newVersion` answer replaces it.
    ///   - seed: drives the chunk sizes.
    ///   - script: the answer to the `index`-th request (from 0).
    public init(
        file: ServedFile, seed: UInt64 = 1, onHold: @escaping @Sendable () -> Void = {},
        script: @escaping @Sendable (_ request: TransportRequest, _ index: Int) -> Answer
    ) {
        state = Locked(State(file: file, random: SplitMix64(seed: seed)))
        self.script = script
        self.onHold = onHold
    }

    /// The file now served.
    public var file: ServedFile { state.withLock { $0.file } }
    /// Every request so far, in order.
    public var requests: [Seen] { state.withLock { $0.requests } }
    /// Bodies being delivered now (in `receive(into:)`).
    public var bodiesInFlight: Int { state.withLock { $0.bodiesInFlight } }
    /// Whether every response answered and not yet done with (its body received, discarded or cancelled) is asleep
    /// on a ``ManualClock`` between two chunks: nothing of the download moves until that clock does.
    public var allResponsesAsleep: Bool { state.withLock { $0.openResponses.isSubset(of: $0.bodiesSleeping) } }
    /// Body bytes delivered over all requests.
    public var bytesDelivered: Int { state.withLock { $0.requests.reduce(0) { $0 + $1.delivered } } }

    public func start(_ request: TransportRequest) async -> Result<any TransportResponse, TransportError> {
        if Task.isCancelled { return .failure(.cancelled) }
        let range = request.headers["Range"]
        let ifRange = request.headers["If-Range"]
        // The request's place is taken here, under the same lock that reads it: requests made at once each get
        // their own index (the one their bytes are counted under), in the order they came.
        let (index, file) = state.withLock { state -> (Int, ServedFile) in
            state.requests.append(Seen(range: range, ifRange: ifRange, status: 0, delivered: 0))
            return (state.requests.count - 1, state.file)
        }
        var answer = script(request, index)
        var served = file
        if case .newVersion(let next) = answer {
            state.withLock { $0.file = next }
            served = next
            answer = .serve()
        }
        let head: ResponseHead
        var body: Range<Int> = 0..<0
        switch answer {
        case .status(let status, let retryAfter):
            var headers = HTTPHeaders([("Content-Length", "0")])
            if let retryAfter { headers.add(name: "Retry-After", value: retryAfter) }
            head = ResponseHead(status: status, headers: headers)
        case .serve, .hold, .stall, .wholeFile, .newVersion:
            let honoured = !Self.isWhole(answer) && served.acceptRanges && Self.validatorMatches(ifRange, served)
            if honoured, let range, let asked = Self.parse(range, count: served.data.count) {
                body = asked
                head = ResponseHead(status: 206, headers: Self.headers(for: served, body: asked, partial: true))
            } else if honoured, range != nil {
                head = ResponseHead(
                    status: 416, headers: HTTPHeaders([("Content-Range", "bytes */\(served.data.count)"), ("Content-Length", "0")]))
            } else {
                body = 0..<served.data.count
                head = ResponseHead(status: 200, headers: Self.headers(for: served, body: body, partial: false))
            }
        }
        let chunkSizes: ClosedRange<Int>
        var cutAfter: Int?
        var holdAfter: Int?
        var rate: Double?
        var stallAfter: Int?
        switch answer {
        case .serve(let chunks, let cut, let bytesPerSecond):
            chunkSizes = chunks
            cutAfter = cut
            rate = bytesPerSecond
        case .hold(let after):
            chunkSizes = 16_384...65_536
            holdAfter = after
        case .stall(let after, let bytesPerSecond):
            chunkSizes = 16_384...65_536
            stallAfter = after
            rate = bytesPerSecond
        default:
            chunkSizes = 16_384...65_536
        }
        let seed = state.withLock { state -> UInt64 in
            state.requests[index].status = head.status
            return state.random.next()
        }
        return .success(
            ScriptedResponse(
                head: head, data: served.data, body: body, chunkSizes: chunkSizes, cutAfter: cutAfter,
                holdAfter: holdAfter, stallAfter: stallAfter, stallTimeout: request.options.stallTimeout, rate: rate,
                clock: request.clock, seed: seed,
                transport: self, index: index))
    }

    fileprivate func responseOpened(_ opened: Bool, index: Int) {
        state.withLock { state in
            if opened { state.openResponses.insert(index) } else { state.openResponses.remove(index) }
        }
    }

    fileprivate func bodySleeping(_ sleeping: Bool, index: Int) {
        state.withLock { state in
            if sleeping { state.bodiesSleeping.insert(index) } else { state.bodiesSleeping.remove(index) }
        }
    }

    fileprivate func bodyStarted(_ started: Bool) {
        state.withLock { $0.bodiesInFlight += started ? 1 : -1 }
    }

    fileprivate func delivered(_ count: Int, index: Int) {
        state.withLock { $0.requests[index].delivered += count }
    }

    private static func isWhole(_ answer: Answer) -> Bool {
        if case .wholeFile = answer { return true }
        return false
    }

    private static func validatorMatches(_ ifRange: String?, _ file: ServedFile) -> Bool {
        guard let ifRange else { return true }
        if let etag = file.etag, !etag.hasPrefix("W/") { return ifRange == etag }
        if let modified = file.lastModified { return ifRange == modified }
        return false
    }

    /// `bytes=a-` or `bytes=a-b` within `count` bytes; nil when not satisfiable.
    private static func parse(_ header: String, count: Int) -> Range<Int>? {
        guard header.hasPrefix("bytes=") else { return nil }
        let parts = header.dropFirst(6).split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2, let first = Int(parts[0]), first < count else { return nil }
        let last = parts[1].isEmpty ? count - 1 : min(Int(parts[1]) ?? count - 1, count - 1)
        guard last >= first else { return nil }
        return first..<(last + 1)
    }

    private static func headers(for file: ServedFile, body: Range<Int>, partial: Bool) -> HTTPHeaders {
        // A Date well after Last-Modified: what makes Last-Modified a strong validator (RFC 9110 §8.8.2.2).
        var headers = HTTPHeaders([("Content-Length", "\(body.count)"), ("Date", ServedFile.httpDateNow())])
        if partial {
            headers.add(name: "Content-Range", value: "bytes \(body.lowerBound)-\(body.upperBound - 1)/\(file.data.count)")
        }
        if let etag = file.etag { headers.add(name: "ETag", value: etag) }
        if let modified = file.lastModified { headers.add(name: "Last-Modified", value: modified) }
        if file.acceptRanges { headers.add(name: "Accept-Ranges", value: "bytes") }
        return headers
    }
}

/// One response of ``ScriptedTransport``.
final class ScriptedResponse: TransportResponse, Sendable {
    let head: ResponseHead
    private let data: [UInt8]
    private let body: Range<Int>
    private let chunkSizes: ClosedRange<Int>
    private let cutAfter: Int?
    private let holdAfter: Int?
    private let stallAfter: Int?
    private let stallTimeout: Double
    private let rate: Double?
    private let clock: any DownloadClock
    private let seed: UInt64
    private let transport: ScriptedTransport
    private let index: Int
    private let cancelled = Atomic<Bool>(false)
    private let closed = Atomic<Bool>(false)

    init(
        head: ResponseHead, data: [UInt8], body: Range<Int>, chunkSizes: ClosedRange<Int>, cutAfter: Int?,
        holdAfter: Int?, stallAfter: Int?, stallTimeout: Double, rate: Double?, clock: any DownloadClock, seed: UInt64,
        transport: ScriptedTransport, index: Int
    ) {
        self.head = head
        self.data = data
        self.body = body
        self.chunkSizes = chunkSizes
        self.cutAfter = cutAfter
        self.holdAfter = holdAfter
        self.stallAfter = stallAfter
        self.stallTimeout = stallTimeout
        self.rate = rate
        self.clock = clock
        self.seed = seed
        self.transport = transport
        self.index = index
        transport.responseOpened(true, index: index)
    }

    func receive(into sink: any BodySink) async -> Result<Void, TransportError> {
        // Cancelled before: nothing taken, as the real transports answer (`TransportResponse.cancel()`).
        if cancelled.load(ordering: .acquiring) { return .failure(.cancelled) }
        transport.bodyStarted(true)
        defer {
            transport.bodyStarted(false)
            close()
        }
        var random = SplitMix64(seed: seed)
        var offset = body.lowerBound
        var sent = 0
        var held = false
        while offset < body.upperBound {
            if Task.isCancelled || cancelled.load(ordering: .acquiring) { return .failure(.cancelled) }
            if let cutAfter, sent >= cutAfter { return .failure(.partialBody("the scripted connection closed early")) }
            if let holdAfter, sent >= holdAfter, !held {
                held = true
                transport.onHold()
                while !Task.isCancelled && !cancelled.load(ordering: .acquiring) {
                    try? await Task.sleep(for: .milliseconds(1))
                }
                return .failure(.cancelled)
            }
            if let stallAfter, sent >= stallAfter {
                // Stalled: nothing more until cancelled, or until the stall timeout has passed on the clock (looking
                // again every 50 ms of it).
                let since = clock.uptime()
                while !cancelled.load(ordering: .acquiring) {
                    if clock.uptime() - since >= stallTimeout {
                        return .failure(.stalled("no byte in \(stallTimeout) s (scripted)"))
                    }
                    guard await pause(seconds: min(0.05, stallTimeout)) else { break }
                }
                return .failure(.cancelled)
            }
            var count = min(Int.random(in: chunkSizes, using: &random), body.upperBound - offset)
            if let cutAfter { count = min(count, max(1, cutAfter - sent)) }
            if let stallAfter { count = min(count, max(1, stallAfter - sent)) }
            if let holdAfter, !held { count = min(count, max(1, holdAfter - sent)) }
            let decision = data.withUnsafeBytes { bytes in
                sink.receive(UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + count)]))
            }
            switch decision {
            case .accepted:
                offset += count
                sent += count
                transport.delivered(count, index: index)
                if let rate, !(await pause(seconds: Double(count) / rate)) { return .failure(.cancelled) }
            case .wait(let duration):
                let seconds = Double(duration.components.seconds) + Double(duration.components.attoseconds) * 1e-18
                if !(await pause(seconds: max(0.001, seconds))) { return .failure(.cancelled) }
            case .abort:
                return .failure(.abortedBySink)
            }
            await Task.yield()
        }
        return .success(())
    }

    /// Waits on the test's ``ManualClock`` when the request has one; else in real time (a clock that only records
    /// retries, such as a test's fake, would return at once and turn every pause into a busy loop). False when
    /// cancelled.
    private func pause(seconds: Double) async -> Bool {
        if let manual = clock as? ManualClock {
            transport.bodySleeping(true, index: index)
            defer { transport.bodySleeping(false, index: index) }
            return (try? await manual.sleep(seconds: seconds)) != nil
        }
        try? await Task.sleep(for: .milliseconds(max(1, Int64(seconds * 1000))))
        return !Task.isCancelled
    }

    deinit {
        close()
    }

    /// Done with: counted once (a body received, discarded, cancelled, or the response dropped).
    private func close() {
        if !closed.exchange(true, ordering: .acquiringAndReleasing) { transport.responseOpened(false, index: index) }
    }

    func discard() async -> Result<Void, TransportError> {
        defer { close() }
        return cancelled.load(ordering: .acquiring) ? .failure(.cancelled) : .success(())
    }

    func cancel() {
        defer { close() }
        cancelled.store(true, ordering: .releasing)
    }
}
