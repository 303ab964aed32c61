import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization
import StitchLocks

/// The download's state machine (``DownloadStateMachine``) and what the lanes' executor keeps beside it, under the
/// run's one lock (``DownloadRun/core``).
struct EngineCore {
    var machine: DownloadStateMachine
    /// The request running on each segment, so a slow one can be told to make way.
    var requests: [Int: LaneRequest] = [:]

    /// What the scheduler knows of the running requests.
    var running: [Int: LaneScheduler.Running] {
        requests.mapValues { request in
            LaneScheduler.Running(
                startedAt: request.startedAt, resumeOffset: request.plan.resumeOffset, receiving: request.receiving)
        }
    }
}

/// Fetches the unfinished segments of one download over one or several connections: every request of a download
/// that has bytes (or segments) to continue from is made here. A download on one connection is this transfer
/// with one lane (``onlySegment``); only its first requests — the ones that name the file, create the store and
/// decide whether to split — are made by ``DownloadRun`` before it hands over.
///
/// This is an executor: what each lane does is the download's state machine's (``DownloadStateMachine``, asked
/// under the run's lock): which segment an idle lane takes or steals, the plan of each request, what its end
/// comes to (ask again, retry after a pause, retire, stop every lane). The executor performs it: requests, splits
/// of the part file, replaced connections, events, pauses.
///
/// Each *lane* is a task that claims a segment, requests exactly its bytes (`Range: bytes=N-M` with `If-Range`),
/// writes them with `pwrite` at their offsets and records them in the segment's live-record slot. Every 206 is
/// checked against the validators and the range asked for; one mismatch stops every lane and the download
/// restarts from zero. A failing lane retries its own segment with backoff while the others go on.
///
/// Uneven links (a CDN whose edges differ, servers that cap some connections): a monitor samples every lane ten
/// times a second. A connection slower than a quarter of its peers' median over the last half second is noticed
/// within about half a second and replaced by a new one (the lane asks again from where it got to). A lane whose
/// segment is done takes over the end of the segment that would finish last (work stealing): the split point is
/// chosen from the two speeds so that both end together, and may fall inside a piece, so the slowest connection
/// keeps only what it will finish by then — the end game. What a cut-short request had in flight past the split
/// is received and dropped (at most ``stealSlack`` per steal, counted in ``discarded``). A lane refused with 429 or
/// 503, or out of retries, while other lanes are receiving is retired: the download goes on with fewer
/// connections.
///
/// Connections that get different versions of the file (the edges of a CDN with different copies: another ETag,
/// Last-Modified or length, or a 200 to a ranged `If-Range` request): when one lane's response is not the version
/// the download has while other lanes are left, the lane's response is dropped unread and the download goes on
/// with one connection — no replacements, no end-game takeovers (a new connection may reach another edge);
/// lanes retire as their requests end and the last one fetches the rest. Every kept byte came with the known
/// validators, so nothing is spliced. When the last lane meets another version too (the file changed for
/// everyone), the download restarts from zero as before.
///
/// Threads: lanes run on the engine's task group; their sinks on the transport thread. Shared state is behind the
/// run's lock; the sinks read only the stop flag (an atomic) and their segment's end (the store's lock).
final class SegmentedTransfer: Sendable {
    let store: PartStore
    /// The validators the download has; on one connection a response may add to them (see ``onlySegment``).
    var known: Validators { knownBox.withLock { $0 } }
    private let knownBox: Locked<Validators>
    /// One lane over the download's one segment: a download on one connection is this transfer with N = 1. The
    /// lane then asks as a resume does (a range from where the file got to, with `If-Range` or, without a strong
    /// validator, re-fetching an overlap to compare; no end), takes the body to its end (a longer one is too long,
    /// an unknown length ends with the response), keeps the running digest, saves what a response adds to the
    /// validators, and restarts in place on a 200 to its range (the new file's body is kept from byte 0).
    let onlySegment: Bool
    /// The download (its state machine, running digest and events).
    let owner: DownloadRun
    let request: DownloadRequest
    let options: DownloadOptions
    let transport: any HTTPTransport
    let clock: any DownloadClock
    let lanes: Int
    let emit: @Sendable (DownloadEvent) -> Void
    let checkpointer: Checkpointer?
    private var brokenError: DownloadError {
        DownloadError(.io, "an earlier write of \(store.paths.part) failed; stopping", resumable: true)
    }

    /// Bytes a running request may have in flight (socket buffers) when its range is cut short: what the client's
    /// receive buffer and the server's send buffer hold, up to a few MiB on Linux's defaults (seen here: up to about
    /// 3 MiB on loopback with the machine loaded).
    static let stealSlack: Int64 = 4 << 20
    /// A segment whose connection will finish it sooner than this is left alone by idle lanes (a new request
    /// costs a round trip or two).
    static let stealMinimumSeconds = 0.2
    /// The same for a victim at least ``bufferFillingSpeed`` fast and not slow next to its thief.
    static let stealMinimumSecondsFast = 1.0
    /// A speed at which a connection may outrun the client's writes, so that its socket buffers fill.
    static let bufferFillingSpeed: Double = 48 * 1024 * 1024
    /// The smallest tail worth a request of its own, and the alignment of a split that falls inside a piece.
    static let stealGranule: Int64 = 64 << 10
    /// How often the monitor samples the lanes, and the window a speed is measured over.
    static let monitorInterval = 0.1
    static let speedWindow = 0.5
    /// A speed needs at least this much of a window.
    static let minimumSpeedWindow = 0.2
    /// A connection this many times slower than its peers' median is slow...
    static let slowFactor = 4.0
    /// ...and replaced after this many samples in a row (with the window, noticed within about half a second).
    static let slowTicksToReplace = 2

    /// Set once the state machine stops the lanes (read by the sinks on the transport thread).
    let stopped = Atomic<Bool>(false)
    /// The download's byte counters, shared with its other attempts.
    let counters: TransferCounters
    private let finishedLanes = Atomic<Int>(0)
    /// Wakes the monitor and the lanes waiting for work, on the clock's timer.
    private let beat = Beat()
    /// Wakes lanes that wait for work: on the monitor's beat, and at once when a lane lets go of a segment (the
    /// last one done, the waiting lanes end without waiting for a beat).
    private let idle = Beat()

    init(
        store: PartStore, known: Validators, split: Bool, request: DownloadRequest, options: DownloadOptions,
        transport: any HTTPTransport, clock: any DownloadClock, lanes: Int,
        emit: @escaping @Sendable (DownloadEvent) -> Void, checkpointer: Checkpointer?, counters: TransferCounters,
        owner: DownloadRun
    ) {
        self.store = store
        self.knownBox = Locked(known)
        self.onlySegment = lanes == 1 && !split
        self.owner = owner
        self.request = request
        self.options = options
        self.transport = transport
        self.clock = clock
        self.lanes = lanes
        self.emit = emit
        self.checkpointer = checkpointer
        self.counters = counters
    }

    /// Asks the download's state machine under the run's lock; once it stops the lanes, the sinks are told.
    private func withCore<T: Sendable>(_ body: (inout EngineCore) -> T) -> T {
        let (value, stopping) = owner.core.withLock { core in (body(&core), core.machine.stopping) }
        if stopping { stopped.store(true, ordering: .releasing) }
        return value
    }

    /// Runs the lanes until the state machine has no work left for them (every segment complete, or the lanes
    /// stopping for a restart or a failure: ``DownloadStateMachine/transferEnded(allComplete:)`` says which).
    /// - Throws: `CancellationError` when the task is cancelled.
    func run() async throws {
        Trace.note("\(request.url) transfer run lanes \(lanes) segments \(store.writtenSegments)")
        defer { Trace.note("\(request.url) transfer run ended") }
        // The monitor's beat, kept by the download's clock: it samples the lanes, and lanes with nothing to take
        // look again. Only with several lanes (one has no peers to compare, and no one to wait for); a transfer
        // over before the first beat costs no thread a wake-up.
        let beat = beat
        let idle = idle
        let timer = lanes > 1 ? clock.every(Self.monitorInterval) {
            beat.fire()
            idle.fire()
        } : nil
        defer {
            timer?.cancel()
            beat.end()
            idle.end()
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<lanes {
                group.addTask {
                    defer { self.finishedLanes.add(1, ordering: .releasing) }
                    try await self.lane()
                }
            }
            if lanes > 1 {
                group.addTask {
                    while self.finishedLanes.load(ordering: .acquiring) < self.lanes, await beat.next() {
                        self.monitor(now: self.clock.uptime())
                    }
                }
            }
            // The monitor waits for its beat; once every lane is done it is cancelled rather than waited for. After a halt the
            // lanes still sleeping in a backoff or waiting on a slow server are cancelled too.
            while try await group.next() != nil {
                if finishedLanes.load(ordering: .acquiring) >= lanes || stopped.load(ordering: .acquiring) {
                    group.cancelAll()
                }
            }
        }
    }

    /// What an idle lane does once the state machine's work is performed.
    private enum Claim: Sendable { case fetch(Int), wait, done }

    /// The next work for an idle lane, as the state machine says; a steal's split is made here, in the part
    /// file's state, under the same lock.
    private func claim() -> Claim {
        withCore { core in
            switch core.machine.laneIdle(segments: store.writtenSegments, running: core.running, now: clock.uptime()) {
            case .fetch(let slot):
                return .fetch(slot)
            case .steal(let victim, let at, let replaceVictim):
                Trace.note(
                    "\(request.url) steal from \(victim) at \(at) replace \(replaceVictim) speeds \(core.machine.laneSpeeds)")
                guard let slot = store.split(victim, at: at) else { return .wait }
                core.machine.stole(slot)
                if replaceVictim {
                    // Not counted against the monitor's cap: the end game replaces at most one connection per steal.
                    core.requests[victim]?.replaceNow()
                }
                return .fetch(slot)
            case .wait:
                return .wait
            case .stop, .retire:
                return .done
            }
        }
    }

    /// How long a request that started at `start` at time `started` would take to reach `end` at its speed so far;
    /// infinite when it has no speed yet to judge by (under a tenth of a second old, or nothing written).
    static func secondsLeft(from start: Int64, at started: Double, written: Int64, end: Int64, now: Double) -> Double {
        let elapsed = now - started
        let done = written - start
        guard elapsed >= 0.1, done > 0 else { return .infinity }
        return Double(end - written) / (Double(done) / elapsed)
    }

    /// Ten times a second: each running request's speed over the last half second; a connection slower than a
    /// quarter of its peers' median for two samples in a row is dropped and its lane asks again on a new
    /// connection (a slow path, a capped connection, an overloaded server behind a balancer). Not under a rate
    /// limit, which makes connections slow on purpose. (The rules are the scheduler's.)
    private func monitor(now: Double) {
        let segments = store.writtenSegments
        withCore { core in
            for slot in core.machine.sample(segments: segments, running: core.running, now: now) {
                Trace.note("\(request.url) monitor replaces \(slot) speeds \(core.machine.laneSpeeds)")
                core.requests[slot]?.replaceNow()
            }
        }
    }

    private func register(_ request: LaneRequest?, for slot: Int) {
        withCore { core in
            if request == nil {
                // What a new request may expect: this one's speed over its last window, or (too short a request
                // for a window) over its whole life.
                let whole = core.requests[slot].flatMap { request -> Double? in
                    let elapsed = clock.uptime() - request.startedAt
                    let bytes = request.offset - request.plan.resumeOffset
                    return elapsed > 0.01 && bytes >= Self.stealGranule ? Double(bytes) / elapsed : nil
                }
                core.machine.requestEnded(slot, wholeSpeed: whole)
            }
            core.requests[slot] = request
        }
    }

    // MARK: One lane

    private func lane() async throws {
        while true {
            let claimed = claim()
            Trace.note("\(request.url) lane claim \(claimed)")
            switch claimed {
            case .done:
                return
            case .wait:
                // Nothing worth taking now: wait while others finish, in case one turns slow (the end game).
                if lanes > 1 {
                    guard await idle.next() else { return }
                } else {
                    do { try await clock.sleep(seconds: Self.monitorInterval) } catch { return }
                }
            case .fetch(let slot):
                defer {
                    withCore { $0.machine.released(slot) }
                    idle.fire()
                }
                do {
                    if try await fetch(slot) == .retired { return }
                } catch is CancellationError where stopped.load(ordering: .acquiring) {
                    return  // cancelled because another lane halted the run: that halt is the outcome
                }
            }
        }
    }

    /// How a lane's work on one segment ended.
    private enum LaneEnd { case done, retired }

    /// Fetches segment `slot` to its (possibly shrinking) end, retrying its own failures; or gives it back and
    /// retires the lane when the state machine says the download goes on without it.
    private func fetch(_ slot: Int) async throws -> LaneEnd {
        while !stopped.load(ordering: .acquiring) {
            try Task.checkCancellation()
            if let failure = checkpointer?.error ?? (store.isBroken ? brokenError : nil) {
                withCore { $0.machine.halt(.failure(failure)) }
                return .done
            }
            let start = store.written(slot)
            let end = store.end(slot)
            let known = self.known
            let overlapWindow = options.overlapWindow
            guard
                let (plan, url) = withCore({
                    $0.machine.nextRequest(slot, written: start, end: end, known: known, overlapWindow: overlapWindow)
                })
            else { return .done }
            let laneRequest = LaneRequest(transfer: self, slot: slot, plan: plan, known: known)
            let headers = ResumePolicy.requestHeaders(user: request.headers, plan: plan)
            register(laneRequest, for: slot)
            // As lanes, unless the user asked for HTTP/2 streams of one connection.
            let result = await laneRequest.perform(
                TransportRequest(
                    url: url.absoluteString, headers: headers, options: options.transport,
                    lane: options.http2Streams || onlySegment ? nil : slot, clock: clock),
                on: transport)
            register(nil, for: slot)
            if stopped.load(ordering: .acquiring) { return .done }
            try Task.checkCancellation()

            var outcome = AttemptReport.SinkOutcome.none
            var stoppedForRun = false
            if let failure = laneRequest.failure {
                outcome = failure.outcome(part: store.paths.part, checkpointError: checkpointer?.error)
            } else if laneRequest.reachedEnd {
                outcome = .reachedEnd  // the next request re-reads the end: done, or shrunk by a split
            } else if laneRequest.replace.isSet, Self.endedByUs(result) {
                outcome = .replaced  // not a failure: ask again on a new connection
            } else if case .failure(let error) = result, error.isAbortedBySink, case .accept = laneRequest.verdict {
                // The sink stopped for the run's sake (a halt, a broken store, a failed checkpoint): the checks
                // above say which; never a failure of its own.
                stoppedForRun = true
            }
            let written = store.written(slot)
            // Read again: a split may have moved it, and a restart in place gives it the new file's length (none,
            // for a body of unknown length).
            let endNow = store.end(slot)
            let report = DownloadStateMachine.LaneReport(
                attempt: AttemptReport(
                    verdict: laneRequest.verdict, result: result, sink: outcome, written: written, end: endNow,
                    saved: max(0, written - start), durable: store.durable.load(ordering: .acquiring)),
                decisionError: laneRequest.decisionError, sinkAttached: laneRequest.sink != nil,
                stoppedForRun: stoppedForRun)
            let now = clock.now()
            let jitter = Double.random(in: 0...1)
            let action = withCore { core in
                core.machine.laneRequestEnded(slot, report, running: core.running, now: now, jitter: jitter)
            }
            Trace.note("\(request.url) lane \(slot) request ended \(result) -> \(action)")
            switch action {
            case .again:
                if case .replaced = outcome { emit(.notice("replacing a slow connection")) }
            case .redirected(let next):
                emit(.redirected(to: next.absoluteString))
            case .segmentDone, .stop:
                return .done
            case .retire(let notice):
                if let notice { emit(.notice(notice)) }
                return .retired
            case .interrupted:
                throw CancellationError()
            case .wait(let delay, let attempt, let of, let reason, let checkpoint):
                emit(.retrying(attempt: attempt, maxRetries: of, delay: delay, reason: reason))
                // A retry's pause is a good moment for a durable checkpoint (off the cooperative threads).
                if checkpoint, !store.isBroken {
                    let store = self.store
                    _ = try? await offloaded { () throws(DownloadError) in try store.checkpoint() }
                }
                try await clock.sleep(seconds: delay)
            }
        }
        return .done
    }

    /// Whether a request ended because the engine stopped it (a replacement cut it off, or its sink said stop),
    /// rather than failing on its own (which is counted and retried with backoff even if a replacement was asked).
    static func endedByUs(_ result: Result<Void, TransportError>) -> Bool {
        switch result {
        case .success: return false
        case .failure(let error): return error.isCancelled || error.isAbortedBySink
        }
    }

    /// What a response on the download's one connection added to the validators.
    fileprivate func adopt(_ validators: Validators) {
        knownBox.withLock { $0 = validators }
    }
}

/// A beat that tasks wait for: ``fire()`` (on a clock's timer thread: it only resumes continuations) wakes every
/// task waiting in ``next()``. Ended, or the waiting task cancelled, `next()` returns false.
final class Beat: Sendable {
    private struct State {
        var waiters: [UInt64: CheckedContinuation<Bool, Never>] = [:]
        var nextID: UInt64 = 0
        var ended = false
    }
    private let state = Locked(State())

    func fire() {
        let waiters = state.withLock { state in
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters.values { waiter.resume(returning: true) }
    }

    func end() {
        let waiters = state.withLock { state in
            state.ended = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters.values { waiter.resume(returning: false) }
    }

    /// Waits for the next beat: true when it came, false once ended or when the task is cancelled.
    func next() async -> Bool {
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let waiting = state.withLock { state in
                    guard !state.ended, !Task.isCancelled else { return false }
                    state.waiters[id] = continuation
                    return true
                }
                if !waiting { continuation.resume(returning: false) }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume(returning: false)
        }
    }
}

/// One request of a lane: its plan, the engine's reading of its head, and its body's sink (the engine's one
/// ``SegmentSink``). Touched only on the decision pool and the transport thread during the request and by the
/// lane after it (the awaits order them); the monitor reads the atomics and the sink's offset.
final class LaneRequest: @unchecked Sendable {
    let transfer: SegmentedTransfer
    let slot: Int
    let plan: RequestPlan
    let known: Validators
    var verdict: HeadVerdict?
    /// The body's sink, once the head was accepted.
    private(set) var sink: SegmentSink?
    /// What the decision could not do (prepare the files).
    private(set) var decisionError: DownloadError?
    /// When this request was made, for the lane's speed.
    let startedAt: Double
    /// Set by the monitor: this connection is too slow; stop so the lane asks again on a new one.
    let replace = AtomicFlag()
    /// The response being received, so that a stalled one can be cut off (no bytes come to notice `replace`).
    private let response = Locked<(any TransportResponse)?>(nil)

    /// Where the body has got to.
    var offset: Int64 { sink?.offset ?? plan.resumeOffset }
    var reachedEnd: Bool { sink?.reachedEnd ?? false }
    var failure: SegmentSink.Failure? { sink?.failure }

    /// Stops this request so the lane asks again on a new connection: at the next chunk, and at once if the
    /// connection has gone silent.
    func replaceNow() {
        replace.set()
        response.withLock { $0 }?.cancel()
    }
    /// The head was accepted and the body is flowing (what the slow-connection monitor may judge).
    var receiving: Bool { receivingFlag.load(ordering: .relaxed) }
    private let receivingFlag = Atomic<Bool>(false)

    init(transfer: SegmentedTransfer, slot: Int, plan: RequestPlan, known: Validators) {
        self.transfer = transfer
        self.slot = slot
        self.plan = plan
        self.known = known
        startedAt = transfer.clock.uptime()
    }

    /// One request for the lane's range (see ``performAttempt(_:on:hook:started:decide:)``); the decision may
    /// read the partial piece before the range's start from disk.
    func perform(_ request: TransportRequest, on transport: any HTTPTransport) async -> Result<Void, TransportError> {
        defer { response.withLock { $0 = nil } }
        let (result, error) = await performAttempt(
            request, on: transport, hook: transfer.options.headDecisionHook,
            started: { [self] started in
                response.withLock { $0 = started }
                if replace.isSet { started.cancel() }
            },
            decide: { [self] head throws(DownloadError) in
                transfer.onlySegment ? try decideAlone(head) : decide(head)
            })
        decisionError = error
        return result
    }

    /// The head of the only segment's request on the download's one connection: as ``decide(_:)``, and what a
    /// download on one connection does besides (see ``SegmentedTransfer/onlySegment``). Runs on the decision pool.
    private func decideAlone(_ head: ResponseHead) throws(DownloadError) -> HeadDecision {
        if transfer.stopped.load(ordering: .relaxed) { return .abort }
        let verdict = ResumePolicy.evaluate(head, plan: plan, known: known)
        self.verdict = verdict
        let store = transfer.store
        let start: Int64
        let validators: Validators
        switch verdict {
        case .accept(let bodyStart, let fresh):
            if fresh != known { try store.update(validators: fresh) }
            start = bodyStart
            validators = fresh
        case .restartWithBody(let reason, let fresh):
            guard try transfer.owner.restartInPlace(reason, validators: fresh) else { return .abort }
            start = 0
            validators = fresh
        case .restart, .malformed, .refused:
            return .abort
        case .complete, .redirect, .retry, .fail:
            return .discard
        }
        transfer.adopt(validators)
        let verifyEnd = start == 0 ? 0 : plan.resumeOffset
        var pieces: PieceHasher?
        if let total = validators.totalLength {
            var hasher = PieceHasher(pieceSize: store.pieceSize, total: total)
            hasher.start(at: max(start, verifyEnd), segmentStart: 0, store: store)
            pieces = hasher
        }
        if let total = validators.totalLength, let error = store.preallocate(totalLength: total) {
            throw DownloadError.io("cannot reserve space for", path: store.paths.part, error)
        }
        let transfer = self.transfer
        let sink = SegmentSink(
            store: store, slot: slot, bound: .fileLength(validators.totalLength), offset: start,
            verifyEnd: verifyEnd, rateLimiter: transfer.options.rateLimiter, clock: transfer.clock,
            checkpointer: transfer.checkpointer,
            counters: transfer.counters, digest: transfer.owner.runningDigest, pieces: pieces,
            shouldStop: { transfer.stopped.load(ordering: .relaxed) }, canRequestRest: validators.canResume,
            beforeOverlapRead: transfer.options.overlapReadHook)
        self.sink = sink
        receivingFlag.store(true, ordering: .relaxed)
        transfer.owner.receiving(status: head.status, offset: max(start, verifyEnd), validators: validators)
        return .receive(sink)
    }

    private func decide(_ head: ResponseHead) -> HeadDecision {
        if transfer.stopped.load(ordering: .relaxed) { return .abort }
        let verdict = ResumePolicy.evaluate(head, plan: plan, known: known)
        self.verdict = verdict
        switch verdict {
        case .accept(let start, _):
            let store = transfer.store
            var pieces = PieceHasher(pieceSize: store.pieceSize, total: known.totalLength)
            pieces.start(at: start, segmentStart: store.segmentStart(slot), store: store)
            let transfer = self.transfer
            let replace = self.replace
            let sink = SegmentSink(
                store: store, slot: slot, bound: .segmentEnd(requestEnd: plan.rangeEnd ?? Int64.max),
                offset: start, rateLimiter: transfer.options.rateLimiter, clock: transfer.clock,
                checkpointer: transfer.checkpointer,
                counters: transfer.counters, pieces: pieces,
                shouldStop: {
                    transfer.stopped.load(ordering: .relaxed) || replace.isSet
                }, canRequestRest: known.canResume)
            self.sink = sink
            receivingFlag.store(true, ordering: .relaxed)
            return .receive(sink)
        case .restart, .restartWithBody:
            return .abort
        case .complete, .redirect, .retry, .fail:
            return .discard
        case .malformed, .refused:
            return .abort
        }
    }
}

/// A flag one thread sets and others read, shareable by reference (a closure can hold it).
final class AtomicFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}
