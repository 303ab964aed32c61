import Foundation
import Glibc
import Synchronization

/// Fetches the unfinished segments of one download over several connections at once.
///
/// Each *lane* is a task that claims a segment, requests exactly its bytes (`Range: bytes=N-M` with `If-Range`),
/// writes them with `pwrite` at their offsets and records them in the segment's live-record slot. A lane whose
/// segment is done takes half of the largest remaining one (work stealing), split on a piece boundary, so no
/// byte is fetched twice except on retry. Every 206 is checked against the validators and the range asked for;
/// one mismatch stops every lane and the download restarts from zero. A failing lane retries its own segment with
/// backoff while the others go on.
///
/// Threads: lanes run on the engine's task group; their sinks on the transport thread. Shared state is behind one
/// lock; the sinks read only the stop flag (an atomic) and their segment's end (the store's lock).
final class SegmentedTransfer: Sendable {
    enum Outcome: Sendable {
        case complete
        case restart(RestartReason)
    }

    let store: PartStore
    let known: Validators
    let ifRange: String
    let startURL: URL
    let request: DownloadRequest
    let options: DownloadOptions
    let transport: any HTTPTransport
    let clock: any DownloadClock
    let lanes: Int
    let emit: @Sendable (DownloadEvent) -> Void
    let poke: @Sendable () -> Void
    let checkpointer: Checkpointer?
    private var brokenError: DownloadError {
        DownloadError(.io, "an earlier write of \(store.paths.part) failed; stopping", resumable: true)
    }

    private struct Shared {
        var owned: Set<Int> = []
        var stop: Stop?
        /// The sink of each running request, by segment, so a slow one can be told to make way.
        var sinks: [Int: LaneSink] = [:]
        /// Seconds in a row each segment's connection has been much slower than the others.
        var slowSeconds: [Int: Int] = [:]
        var lastWritten: [Int: Int64] = [:]
        /// Connections replaced so far; capped so that a server slow for everyone cannot cause churn.
        var replacements = 0
    }

    enum Stop: Sendable {
        case restart(RestartReason)
        case failure(DownloadError)
    }

    /// Bytes a running request may have in flight (socket buffers) when its range is cut short.
    static let stealSlack: Int64 = 2 << 20
    /// A segment whose connection will finish it sooner than this is left alone by idle lanes.
    static let stealMinimumSeconds = 1.0

    private let shared = Mutex(Shared())
    let stopped = Atomic<Bool>(false)
    /// Body bytes received over all lanes (progress and retry accounting).
    let received = Atomic<Int64>(0)
    private let sinceCheckpoint = Atomic<Int64>(0)
    private let finishedLanes = Atomic<Int>(0)

    init(
        store: PartStore, known: Validators, ifRange: String, startURL: URL, request: DownloadRequest,
        options: DownloadOptions, transport: any HTTPTransport, clock: any DownloadClock, lanes: Int,
        emit: @escaping @Sendable (DownloadEvent) -> Void,
        checkpointer: Checkpointer?
    ) {
        self.store = store
        self.known = known
        self.ifRange = ifRange
        self.startURL = startURL
        self.request = request
        self.options = options
        self.transport = transport
        self.clock = clock
        self.lanes = lanes
        self.emit = emit
        self.checkpointer = checkpointer
        self.poke = { checkpointer?.poke() }
    }

    /// Runs the lanes until every segment is complete, a restart is needed, or a failure ends the download.
    /// - Throws: ``DownloadError``, or `CancellationError` when the task is cancelled.
    func run() async throws -> Outcome {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<lanes {
                group.addTask {
                    defer { self.finishedLanes.add(1, ordering: .releasing) }
                    try await self.lane()
                }
            }
            if lanes > 2 {
                group.addTask {
                    while self.finishedLanes.load(ordering: .acquiring) < self.lanes, !Task.isCancelled {
                        try? await Task.sleep(for: .seconds(1))
                        self.replaceSlowConnections()
                    }
                }
            }
            // The monitor sleeps; once every lane is done it is cancelled rather than waited for. After a halt the
            // lanes still sleeping in a backoff or waiting on a slow server are cancelled too.
            while try await group.next() != nil {
                if finishedLanes.load(ordering: .acquiring) >= lanes || stopped.load(ordering: .acquiring) {
                    group.cancelAll()
                }
            }
        }
        switch shared.withLock({ $0.stop }) {
        case .restart(let reason): return .restart(reason)
        case .failure(let error): throw error
        case nil: break
        }
        guard store.writtenSegments.allSatisfy(\.isComplete) else {
            throw DownloadError(.protocolViolation, "segments left unfinished", resumable: true)
        }
        return .complete
    }

    private func halt(_ stop: Stop) {
        shared.withLock { state in
            if state.stop == nil { state.stop = stop }
        }
        stopped.store(true, ordering: .releasing)
    }

    /// The next segment for a lane: an unowned unfinished one, else half of the largest remaining one.
    private func claim() -> Int? {
        shared.withLock { state -> Int? in
            guard state.stop == nil else { return nil }
            let segments = store.writtenSegments
            if let free = segments.indices
                .filter({ !state.owned.contains($0) && !segments[$0].isComplete })
                .min(by: { segments[$0].start < segments[$1].start })
            {
                state.owned.insert(free)
                return free
            }
            let pieceSize = store.pieceSize
            let minimum = max(options.minimumSplitSize, 1)
            let victims = state.owned.compactMap { slot -> (Int, Int64, Int64)? in
                guard let end = segments[slot].end else { return nil }
                return (slot, segments[slot].durable, end)
            }
            // The victim's request still runs to its old end, so what the server already sent past the split
            // point is received and dropped: only a remainder well above that in-flight slack is worth halving,
            // and only one that would take its connection a while yet (a steal costs a new request and closes
            // the victim's connection; lanes about to finish anyway gain nothing).
            let now = monotonicNow()
            let worthIt = victims.filter { slot, written, end in
                end - written >= 2 * minimum + Self.stealSlack
                    && secondsLeft(state.sinks[slot], written: written, end: end, now: now) >= Self.stealMinimumSeconds
            }
            guard let (victim, written, end) = worthIt.max(by: { $0.2 - $0.1 < $1.2 - $1.1 }) else { return nil }
            // Split in the middle, on a piece boundary when the piece fits (so each piece has one writer).
            var at = written + (end - written) / 2
            let alignment = pieceSize <= (end - written) / 2 ? pieceSize : minimum
            at = (at + alignment - 1) / alignment * alignment
            guard at > written, at < end, let slot = store.split(victim, at: at) else { return nil }
            state.owned.insert(slot)
            return slot
        }
    }

    /// How long the request on a segment would take to reach `end` at its speed so far; infinite when it has no
    /// speed yet to judge by (not started, or under a tenth of a second old).
    private func secondsLeft(_ sink: LaneSink?, written: Int64, end: Int64, now: Double) -> Double {
        guard let sink else { return .infinity }
        return Self.secondsLeft(from: sink.plan.resumeOffset, at: sink.startedAt, written: written, end: end, now: now)
    }

    static func secondsLeft(from start: Int64, at started: Double, written: Int64, end: Int64, now: Double) -> Double {
        let elapsed = now - started
        let done = written - start
        guard elapsed >= 0.1, done > 0 else { return .infinity }
        return Double(end - written) / (Double(done) / elapsed)
    }

    /// Once a second: a connection under a quarter of the median speed for three seconds in a row is dropped and
    /// its lane asks again on a new connection (a slow path or an overloaded server behind a balancer).
    private func replaceSlowConnections() {
        let segments = store.writtenSegments
        shared.withLock { state in
            guard options.rateLimiter == nil, state.replacements < lanes * 2 else { return }
            var speeds: [Int: Int64] = [:]
            for (slot, sink) in state.sinks where slot < segments.count && sink.receiving {
                let now = segments[slot].durable
                // The first second of a response is its baseline, not a sample: connecting and the first byte
                // are not slowness.
                if let before = state.lastWritten[slot] { speeds[slot] = now - before }
                state.lastWritten[slot] = now
            }
            guard speeds.count >= 3 else { return }
            let sorted = speeds.values.sorted()
            let median = sorted[sorted.count / 2]
            guard median >= 64 * 1024 else { return }
            for (slot, speed) in speeds {
                if speed * 4 < median {
                    state.slowSeconds[slot, default: 0] += 1
                    if state.slowSeconds[slot, default: 0] >= 3, let sink = state.sinks[slot] {
                        sink.replace.store(true, ordering: .releasing)
                        state.replacements += 1
                        state.slowSeconds[slot] = 0
                        state.lastWritten[slot] = nil
                    }
                } else {
                    state.slowSeconds[slot] = 0
                }
            }
        }
    }

    private func register(_ sink: LaneSink?, for slot: Int) {
        shared.withLock { state in
            state.sinks[slot] = sink
            if sink == nil {
                state.lastWritten[slot] = nil
                state.slowSeconds[slot] = nil
            }
        }
    }

    private func release(_ slot: Int) {
        shared.withLock { _ = $0.owned.remove(slot) }
    }

    // MARK: One lane

    private func lane() async throws {
        while !stopped.load(ordering: .acquiring), let slot = claim() {
            defer { release(slot) }
            do {
                try await fetch(slot)
            } catch is CancellationError where stopped.load(ordering: .acquiring) {
                return  // cancelled because another lane halted the run: that halt is the outcome
            }
        }
    }

    /// Fetches segment `slot` to its (possibly shrinking) end, retrying its own failures.
    private func fetch(_ slot: Int) async throws {
        var machine = AttemptStateMachine(
            startURL: startURL, policy: options.retry, maxRedirects: options.maxRedirects, scope: .connection)
        while !stopped.load(ordering: .acquiring) {
            try Task.checkCancellation()
            if let failure = checkpointer?.error ?? (store.isBroken ? brokenError : nil) {
                halt(.failure(failure))
                return
            }
            let start = store.written(slot)
            guard let end = store.end(slot), start < end else { return }
            let plan = RequestPlan(rangeStart: start, resumeOffset: start, ifRange: ifRange, rangeEnd: end)
            let sink = LaneSink(transfer: self, slot: slot, plan: plan, known: known)
            let headers = ResumePolicy.requestHeaders(user: request.headers, plan: plan)
            var transportOptions = options.transport
            transportOptions.separateConnection = !options.http2Streams
            register(sink, for: slot)
            let result = await sink.perform(
                TransportRequest(url: machine.url.absoluteString, headers: headers, options: transportOptions),
                on: transport)
            register(nil, for: slot)
            if stopped.load(ordering: .acquiring) { return }
            try Task.checkCancellation()

            // Every verdict that means the bytes cannot be trusted stops every lane: the download restarts.
            switch sink.verdict {
            case .restart(let why), .restartWithBody(let why, _):
                halt(.restart(why))
                return
            default:
                break
            }
            var outcome = AttemptReport.SinkOutcome.none
            if let failure = sink.failure {
                outcome = .storageFailed(DownloadError.io("cannot write", path: store.paths.part, failure))
            } else if sink.reachedEnd {
                outcome = .reachedEnd  // the loop re-reads the end: done, or shrunk by a split
            } else if sink.replace.load(ordering: .acquiring) {
                emit(.notice("replacing a slow connection"))
                outcome = .replaced  // not a failure: ask again on a new connection
            } else if case .failure(let error) = result, error.isAbortedByDelegate, case .accept = sink.verdict {
                // The sink stopped for the run's sake (a halt, a broken store, a failed checkpoint): the loop's
                // checks above say which; never a failure of its own.
                continue
            }
            let written = store.written(slot)
            let report = AttemptReport(
                verdict: sink.verdict, result: result, sink: outcome, written: written, end: store.end(slot) ?? end,
                saved: max(0, written - start), durable: store.durable.load(ordering: .acquiring))
            switch machine.attemptEnded(report, now: clock.now(), jitter: Double.random(in: 0...1)) {
            case .requestAgain, .follow, .complete:
                continue  // the loop re-reads the end: done, or more to ask for
            case .restart(let why):
                halt(.restart(why))
                return
            case .interrupted:
                throw CancellationError()
            case .fail(let error):
                halt(.failure(error))
                return
            case .wait(let delay, let attempt, let of, let reason):
                emit(.retrying(attempt: attempt, maxRetries: of, delay: delay, reason: reason))
                try await clock.sleep(seconds: delay)
            }
        }
    }

    /// Called by sinks for every chunk written: checkpoint pokes by volume.
    fileprivate func wrote(_ count: Int) {
        received.add(Int64(count), ordering: .relaxed)
        if sinceCheckpoint.add(Int64(count), ordering: .relaxed).newValue >= options.checkpointBytes {
            sinceCheckpoint.store(0, ordering: .relaxed)
            poke()
        }
    }
}

/// The transfer delegate of one lane's request. Touched only on the transport thread during the request and by
/// the lane after it (the await orders the two).
final class LaneSink: BodySink, @unchecked Sendable {
    let transfer: SegmentedTransfer
    let slot: Int
    let plan: RequestPlan
    let known: Validators
    var verdict: HeadVerdict?
    var offset: Int64 = 0
    var reachedEnd = false
    var failure: Errno?
    var pieces: PieceHasher?
    /// When this request was made and where it started, for the lane's speed.
    let startedAt = monotonicNow()
    /// Set by the monitor: this connection is too slow; stop so the lane asks again on a new one.
    let replace = Atomic<Bool>(false)
    /// The head was accepted and the body is flowing (what the slow-connection monitor may judge).
    var receiving: Bool { receivingFlag.load(ordering: .relaxed) }
    private let receivingFlag = Atomic<Bool>(false)

    init(transfer: SegmentedTransfer, slot: Int, plan: RequestPlan, known: Validators) {
        self.transfer = transfer
        self.slot = slot
        self.plan = plan
        self.known = known
    }

    /// One request for the lane's range: the head, the decision (on the blocking pool: it may read the partial
    /// piece before `start` from disk), then the body into this sink.
    func perform(_ request: TransportRequest, on transport: any HTTPTransport) async -> Result<Void, TransportError> {
        let response: any TransportResponse
        switch await transport.start(request) {
        case .failure(let error): return .failure(error)
        case .success(let started): response = started
        }
        let options = transfer.options
        let decision =
            (try? await offloadedDecision { [self] () throws(DownloadError) in
                options.headDecisionHook?()
                return decide(response.head)
            }) ?? .abort
        switch decision {
        case .receive: return await response.receive(into: self)
        case .discard: return await response.discard()
        case .abort:
            response.cancel()
            return .failure(.abortedByDelegate)
        }
    }

    private func decide(_ head: ResponseHead) -> DownloadRun.HeadDecision {
        if transfer.stopped.load(ordering: .relaxed) { return .abort }
        let verdict = ResumePolicy.evaluate(head, plan: plan, known: known)
        self.verdict = verdict
        switch verdict {
        case .accept(let start, _):
            offset = start
            let store = transfer.store
            var hasher = PieceHasher(pieceSize: store.pieceSize, total: known.totalLength)
            hasher.start(at: start, segmentStart: store.segmentStart(slot), store: store)
            pieces = hasher
            receivingFlag.store(true, ordering: .relaxed)
            return .receive
        case .restart, .restartWithBody:
            return .abort
        case .complete, .redirect, .retry, .fail:
            return .discard
        case .malformed, .refused:
            return .abort
        }
    }

    func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
        // Once stopped, never again for this response (see DownloadRun.receive).
        if closed { return .abort }
        let decision = decide(bytes)
        if decision == .abort { closed = true }
        return decision
    }

    private var closed = false

    private func decide(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
        if transfer.stopped.load(ordering: .relaxed) || replace.load(ordering: .relaxed) || transfer.store.isBroken
            || transfer.checkpointer?.hasFailed.load(ordering: .relaxed) == true
        {
            return .abort
        }
        // The rate limit is shared by every connection (and download) holding the same limiter.
        if let limiter = transfer.options.rateLimiter, let wait = limiter.take(bytes.count, now: monotonicNow()) {
            return .pause(seconds: wait)
        }
        return write(bytes) ? .accepted : .abort
    }

    private func write(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let end = transfer.store.end(slot) else { return false }
        let room = end - offset
        if room <= 0 {
            reachedEnd = true
            return false
        }
        let count = Int(min(Int64(bytes.count), room))
        let data = UnsafeRawBufferPointer(rebasing: bytes[0..<count])
        if let error = transfer.store.write(data, at: offset) {
            failure = error
            return false
        }
        pieces?.consume(data, at: offset, store: transfer.store)
        offset += Int64(count)
        transfer.store.noteWritten(slot, offset)
        transfer.wrote(count)
        if count < bytes.count || offset >= end {
            reachedEnd = true
            // At the end it asked for, the response is over: let it finish so the connection is kept for the
            // lane's next range. Cut short by a split, the server is still sending: stop it.
            return count == bytes.count && offset == plan.rangeEnd
        }
        return true
    }
}
