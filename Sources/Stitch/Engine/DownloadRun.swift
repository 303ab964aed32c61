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

/// One call of ``Downloader/download(_:options:onEvent:)``: the executor of the download's state machine
/// (``DownloadStateMachine``). It finds what is on disk, performs the machine's actions — the first connection's
/// requests for the whole file, the transfer over one lane or several (``SegmentedTransfer``, the lanes'
/// executor), restarts, waits, the end — and reports what came of each. It decides nothing the machine decides.
///
/// Threads: the engine's task runs `run()`. Each request has two phases: the transport hands over the response
/// head, and the engine decides what it means on the blocking pool (`decide`: it may open, reopen, preallocate or
/// hash files, which must never hold up the transport's thread that every transfer shares); then, while the body
/// streams, the transport thread feeds the request's ``SegmentSink`` (a `pwrite` and counters) and the engine task
/// waits. The awaits order the three, so the mutable fields below are never touched by two at once. The state
/// machine is behind ``core``, which the lanes share. Progress readers use the atomics only.
final class DownloadRun: @unchecked Sendable {
    let request: DownloadRequest
    let options: DownloadOptions
    let transport: any HTTPTransport
    let clock: any DownloadClock
    /// The caller's events: the transport thread, the engine task and the progress ticker all send; the caller's
    /// callback gets one at a time, on a queue of its own.
    private let events: EventChannel
    let startURL: URL

    // Across attempts.
    private var store: PartStore?
    private var checkpointer: Checkpointer?
    private var known: Validators?
    private var hasher: DigestHasher?
    private var resumedFrom: Int64 = 0
    /// What `--adopt` found at the destination (this run, or the run whose state this one continues); nil when the
    /// download did not begin from another program's partial.
    var adoption: AdoptionRecord?
    /// The download's state machine, with its lanes' requests beside it: the one lock this run's executors (this
    /// object's task, the lanes, the decisions and the monitor) take to ask it.
    let core: Locked<EngineCore>
    private var currentURL: URL

    // Per attempt, set by the delegate.
    private var plan = RequestPlan(rangeStart: nil, resumeOffset: 0, ifRange: nil)
    private var verdict: HeadVerdict?
    private var setupError: DownloadError?
    /// The attempt's body sink, once its head was accepted.
    private var sink: SegmentSink?
    /// Trouble the decision met before any body (space could not be reserved).
    private var attemptFailure: SegmentSink.Failure?
    private var switchToResume = false
    private var alreadyComplete: DownloadResult?
    /// Where the attempt's body has to end (the file's length; nil: unknown).
    private var limit: Int64?
    /// Set once the store's files are renamed into place or deleted: nothing may be written for it after.
    private var storeClosed = false
    /// Set once a store exists, so progress is never reported before the destination is.
    private let hasStore = Atomic<Bool>(false)

    // Read from anywhere.
    /// Body bytes received over every attempt and lane.
    private let counters: TransferCounters
    private let position = Atomic<Int64>(0)
    private let totalLength = Atomic<Int64>(-1)

    init(
        request: DownloadRequest, options: DownloadOptions, transport: any HTTPTransport,
        clock: any DownloadClock, onEvent: @escaping @Sendable (DownloadEvent) -> Void
    ) throws {
        self.request = request
        self.options = options
        self.transport = transport
        self.clock = clock
        events = EventChannel(onEvent)
        self.startURL = try validateURL(request.url)
        self.currentURL = startURL
        self.counters = TransferCounters(checkpointBytes: options.checkpointBytes)
        self.connections = ConnectionPlan(options)
        self.core = Locked(
            EngineCore(
                machine: DownloadStateMachine(
                    startURL: startURL, retry: options.retry, maxRedirects: options.maxRedirects,
                    maxRestarts: options.maxRestarts)))
        if let checksum = request.checksum { hasher = DigestHasher(checksum.algorithm) }
    }

    deinit {
        checkpointer?.stop()
    }

    // MARK: The executor

    func run() async throws -> DownloadResult {
        let result: DownloadResult
        do {
            result = try await runSteps()
        } catch {
            await endRun()
            closeEvents()
            await events.drained()
            throw error
        }
        await endRun()
        // Every event the run sent has reached the caller before the result does, and none comes after.
        closeEvents()
        await events.drained()
        return result
    }

    /// The run is over, whatever the outcome: no more timed checkpoints, one last one for a partial that stays (an
    /// error that is not retried, a pause), and the next run may take the files. That checkpoint syncs: on the
    /// blocking pool, never a cooperative thread (which every download and the caller's tasks share).
    private func endRun() async {
        guard !storeClosed, store != nil else {
            checkpointer?.stop()
            store?.unlock()
            return
        }
        _ = try? await offloaded { [self] () throws(DownloadError) in
            checkpointer?.stop()
            try? store?.checkpoint()
            store?.unlock()
        }
    }

    private func runSteps() async throws -> DownloadResult {
        if case .file(let path) = request.destination {
            let paths = DownloadPaths(destination: absolutePath(path))
            if request.adopt { try await adoptForeignPartial(paths) }
            // What an earlier run left is looked at on the blocking pool: reopening may sync, read the state and
            // hash a prefix; an already complete file may be hashed against a checksum. With nothing there (the
            // usual first run) the two failing lookups are all it costs, here.
            if PartialDownload.mayBeThere(paths) {
                let open = { @Sendable [self] () throws(DownloadError) -> DownloadResult? in
                    do { return try openExisting(paths) } catch let error as DownloadError { throw error } catch {
                        throw DownloadError(.io, "\(error)")
                    }
                }
                if let done = try await offloaded(open) { return done }
            }
        }
        let ticker = startProgressTicker()
        defer {
            ticker.cancel()
            closeEvents()
        }

        // The executor of the download's state machine: it performs each action and reports what came of it.
        var action = machine { $0.next(store: storeFacts) }
        while true {
            Trace.note("\(request.url) run action \(action) priority \(Task.currentPriority)")
            switch action {
            case .requestWhole, .considerSplit, .transfer:
                // Before anything that asks the server; an action that ends the run, or a restart's discard of
                // bytes the machine no longer trusts, is done even when the run is being cancelled.
                if Task.isCancelled { throw try interrupted() }
            default:
                break
            }
            switch action {
            case .requestWhole(let url):
                // The whole file: nothing is kept yet. This request names the file, creates the store, and
                // decides whether to split.
                action = await requestWhole(url)
                if let setupError { throw setupError }
                if let alreadyComplete { return alreadyComplete }
            case .considerSplit:
                let didSplit = store.map(resplit) ?? false
                action = machine { $0.splitConsidered(didSplit) }
            case .transfer(let split):
                guard let store else { throw DownloadError(.protocolViolation, "no part file to continue") }
                action = try await runTransfer(store, split: split)
            case .redirected(let url):
                emit(.redirected(to: url.absoluteString))
                action = machine { $0.next(store: storeFacts) }
            case .restart(let reason):
                try discardForRestart(reason)
                action = machine { $0.next(store: storeFacts) }
            case .wait(let delay, let attempt, let of, let reason):
                emit(.retrying(attempt: attempt, maxRetries: of, delay: delay, reason: reason))
                await checkpointOffPool()
                do { try await clock.sleep(seconds: delay) } catch { throw try interrupted() }
                action = machine { $0.next(store: storeFacts) }
            case .finish:
                return try await finish()
            case .fail(let error):
                await checkpointOffPool()
                throw error
            case .interrupted:
                throw try interrupted()
            }
        }
    }

    /// Asks the state machine under the run's lock.
    private func machine<T: Sendable>(_ body: (inout DownloadStateMachine) -> T) -> T {
        core.withLock { body(&$0.machine) }
    }

    /// What the part file holds, for the state machine.
    private var storeFacts: DownloadStateMachine.Store? {
        store.map {
            .init(segments: $0.snapshot.segments.count, written: $0.written(0), canCheckRanges: known?.ifRange != nil)
        }
    }

    /// One request for the whole file on the first connection; returns what the state machine makes of it.
    private func requestWhole(_ url: URL) async -> DownloadStateMachine.Action {
        plan = RequestPlan(rangeStart: nil, resumeOffset: 0, ifRange: nil)
        verdict = nil
        probe = nil
        setupError = nil
        sink = nil
        attemptFailure = nil
        switchToResume = false
        let before = store?.written(0) ?? 0
        let headers = ResumePolicy.requestHeaders(user: request.headers, plan: plan)
        currentURL = url
        let result = await attempt(
            TransportRequest(url: url.absoluteString, headers: headers, options: options.transport, clock: clock))
        let written = store?.written(0) ?? 0
        let report = AttemptReport(
            verdict: verdict, result: result, sink: sinkOutcome(), written: written, end: limit,
            saved: max(0, written - before), durable: store?.durable.load(ordering: .acquiring) ?? 0)
        // A response that ended complete is taken even if the run is being cancelled at that moment.
        var cancelled = false
        if case .failure(let error) = result, error.isCancelled || Task.isCancelled { cancelled = true }
        let splitNow = segmentNow
        segmentNow = false
        let facts = storeFacts
        let now = clock.now()
        return machine {
            $0.firstRequestEnded(
                report, store: facts, splitNow: splitNow, resumeSaved: switchToResume, cancelled: cancelled, now: now,
                jitter: Double.random(in: 0...1))
        }
    }

    /// The sink's trouble in this attempt, in the words of the state machine.
    private func sinkOutcome() -> AttemptReport.SinkOutcome {
        (sink?.failure ?? attemptFailure).map {
            $0.outcome(part: store?.paths.part ?? "", checkpointError: checkpointer?.error)
        } ?? .none
    }

    // MARK: Steps

    /// Looks at what an earlier run left at `paths` (``Reopening``) and takes a partial to resume. Returns a result
    /// if the file is already complete. On the blocking pool.
    private func openExisting(_ paths: DownloadPaths) throws -> DownloadResult? {
        let found = try Reopening(request: request, adoption: adoption, emit: { [self] in emit($0) }).open(paths)
        switch found {
        case .nothing(let kept):
            if adoption == nil { adoption = kept }
            return nil
        case .complete(let done):
            return done
        case .resume(let resumed):
            let store = resumed.store
            self.store = store
            adoption = resumed.adoption
            known = resumed.known
            resumedFrom = resumed.point.bytes
            position.store(resumed.point.bytes, ordering: .relaxed)
            if let total = resumed.total { totalLength.store(total, ordering: .relaxed) }
            if store.snapshot.segments.count == 1 {
                try hashPrefix(store, upTo: resumed.point.prefix)
            } else {
                hashFromDisk = true
            }
            startCheckpointer(store)
            emit(.destinationResolved(paths.destination))
            emit(.resuming(from: resumed.point.bytes, note: resumed.point.note))
            return nil
        }
    }

    /// Hashes the bytes already on disk once, so the running digest covers the whole file.
    private func hashPrefix(_ store: PartStore, upTo end: Int64) throws {
        guard let hasher, end > 0 else { return }
        hasher.reset()
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { chunk.deallocate() }
        var at: Int64 = 0
        while at < end {
            let want = Int(min(Int64(chunk.count), end - at))
            let got = store.read(into: UnsafeMutableRawBufferPointer(rebasing: chunk[0..<want]), at: at)
            guard got == want else { throw DownloadError(.io, "cannot read \(store.paths.part) to verify it") }
            hasher.update(UnsafeRawBufferPointer(rebasing: chunk[0..<got]))
            at += Int64(got)
        }
    }

    private func startCheckpointer(_ store: PartStore) {
        checkpointer = Checkpointer(store: store, interval: options.checkpointInterval, clock: clock)
        counters.resetCheckpointCount()
        hasStore.store(true, ordering: .releasing)
    }

    /// Discards what is kept for a restart from zero (the state machine counted it) and says why.
    private func discardForRestart(_ reason: RestartReason) throws {
        emit(.restarting(reason))
        resumedFrom = 0  // nothing kept: the result must not report a resume
        try store?.restart(validators: .none)
        hasher?.reset()
        probe = nil
        known = nil
        position.store(0, ordering: .relaxed)
        counters.resetCheckpointCount()
        currentURL = startURL
    }

    /// A durable checkpoint now (a retry's pause is a good moment), on the blocking pool: it syncs, and many
    /// downloads retrying at once must not hold the few cooperative threads.
    private func checkpointOffPool() async {
        guard let store, !storeClosed else { return }
        _ = try? await offloaded { () throws(DownloadError) in try store.checkpoint() }
    }

    /// Saves the state durably and describes the interruption.
    private func interrupted() throws -> DownloadError {
        checkpointer?.stop()
        // A failed last checkpoint still leaves the earlier ones and the live record: report the interruption.
        try? store?.checkpoint()
        let saved = store?.durable.load(ordering: .acquiring) ?? 0
        return DownloadError(
            .cancelled, "interrupted; \(saved) bytes saved", resumable: store != nil,
            remedy: store != nil ? .rerun(.resume) : nil)
    }

    private func finish() async throws -> DownloadResult {
        // Stopping waits for a checkpoint in progress (syncs): not on a cooperative thread. Most small downloads
        // end with none running, and need no other thread for it.
        if let checkpointer, !checkpointer.stopIfIdle() {
            try await offloaded { () throws(DownloadError) in checkpointer.stop() }
        }
        // No event after this point: once the file is renamed into place the download is over, and a late
        // progress tick must not reach the caller after (or while) the result is returned. Every event sent so
        // far reaches the caller before the rename: one who sees an event never finds the file already there.
        closeEvents()
        await events.drained()
        guard let store else { throw DownloadError(.protocolViolation, "no response body") }
        let bytes = store.writtenBytes
        // Every byte was written, so the file has no hole: one means another program cut the file under the run
        // (FinishPolicy). One lseek, once the length is right: metadata only, cheap enough for a cooperative thread.
        if let refusal = FinishPolicy.written(
            bytes: bytes, announced: known?.totalLength, stateLength: store.snapshot.validators.totalLength,
            holes: { store.holes(before: bytes) }, pieceSize: store.pieceSize, paths: store.paths)
        {
            try await dispose(store, refusal)
        }
        var verified: ExpectedChecksum?
        if let expected = request.checksum, let hasher {
            // Several connections wrote out of order: the digest is the file's, read on the blocking pool.
            let digest =
                hashFromDisk
                ? try await offloaded { () throws(DownloadError) in
                    try FileOperations.digest(ofFileAt: store.paths.part, expected.algorithm, length: bytes)
                } : hasher.finalize()
            if let refusal = FinishPolicy.digest(
                digest, expected: expected, adoptedKept: store.snapshot.adoption?.kept == true,
                overwrite: request.overwrite, paths: store.paths)
            {
                try await dispose(store, refusal)
            }
            verified = expected
        }
        storeClosed = true
        // Two syncs and a rename: blocking calls that must not hold one of the few cooperative threads, or a
        // list of small files syncs two at a time instead of letting the file system commit them together.
        let url = request.url
        let aria2 = adoption?.origin == .aria2
        try await offloaded { () throws(DownloadError) in
            try store.finish(url: url, length: bytes)
            // aria2's control file of a partial this download adopted (left by a crash between the adoption's
            // rename and its removal) or replaced: it describes a file that is no longer there.
            if aria2 { ForeignPartial.removeControlFile(of: store.paths.destination) }
        }
        return DownloadResult(
            destination: store.paths.destination, bytes: bytes,
            bytesTransferred: counters.received.load(ordering: .relaxed), resumedFrom: resumedFrom,
            alreadyComplete: false, checksum: verified)
    }

    /// Does what ``FinishPolicy`` decided with a part file that is not renamed into place, on the blocking pool,
    /// and throws why.
    private func dispose(_ store: PartStore, _ refusal: FinishPolicy.Refusal) async throws -> Never {
        if refusal.disposal == .discard { storeClosed = true }
        let disposal = refusal.disposal
        if disposal == .keep { throw refusal.error }  // nothing to do on the disk
        try await offloaded { () throws(DownloadError) in
            switch disposal {
            case .keep: break
            case .invalidate(let pieces): try store.invalidate(pieces: pieces)
            case .discard: store.discard()
            }
        }
        throw refusal.error
    }

    /// Hands `event` to the caller's `onEvent` (see ``EventChannel``): at once from the engine's tasks, through the
    /// run's event queue from the transport's thread (`fromTransport`).
    func emit(_ event: DownloadEvent, fromTransport: Bool = false) {
        events.send(event, fromTransport: fromTransport)
    }

    private var eventsOpen: Bool { events.isOpen }

    private func closeEvents() {
        events.close()
    }

    /// Progress every `progressInterval`, timed by the shared clock (a download over before its first tick costs
    /// no thread a wake-up). Each tick is emitted from a task: computing progress takes the store's lock, which a
    /// checkpoint's sync may hold, and the clock's thread must not wait (nor resolve the weak reference to this
    /// run: it could be the last one, and the run's deinit would run there).
    ///
    /// At most one tick task per download, waiting or running: on a machine too busy to run them, or while a
    /// sync holds the store's lock, ticks are dropped, not queued up on cooperative threads.
    private func startProgressTicker() -> any ClockTimer {
        let ticks = ProgressTicks(self)
        return clock.every(options.progressInterval) { ticks.fire() }
    }

    private final class ProgressTicks: Sendable {
        private let busy = Atomic<Bool>(false)
        private let run: Locked<WeakRun>

        struct WeakRun {
            weak var run: DownloadRun?
        }

        init(_ run: DownloadRun) { self.run = Locked(WeakRun(run: run)) }

        func fire() {
            guard !busy.exchange(true, ordering: .acquiringAndReleasing) else { return }
            Task { [self] in
                defer { busy.store(false, ordering: .releasing) }
                // Not once the run is finishing: the final syncs hold the store's lock, and this is a cooperative
                // thread.
                guard let run = run.withLock({ $0.run }), run.hasStore.load(ordering: .acquiring), run.eventsOpen
                else { return }
                run.emit(.progress(run.progress))
            }
        }
    }

    var progress: DownloadProgress {
        let total = totalLength.load(ordering: .relaxed)
        // Durable first, then written: a restart in between can only make written smaller, so clamp.
        let opened = hasStore.load(ordering: .acquiring)
        // With several connections the lanes write, not this object's sink: the store knows for all of them.
        let durable = opened ? store?.durable.load(ordering: .acquiring) ?? 0 : 0
        let bytes = opened ? store?.writtenBytes ?? 0 : position.load(ordering: .relaxed)
        return DownloadProgress(bytes: bytes, total: total >= 0 ? total : nil, durableBytes: min(durable, bytes))
    }

    // MARK: Several connections

    /// Set once the first response has been probed and the download split over several connections: the
    /// transfer stops and the lanes take over from where it got to.
    private var segmentNow = false

    /// The first response of a download that may be split, while its speed is measured (and then watched, if the
    /// probe kept one connection): sampled after each write of that response, on the transport's thread.
    private var probe: SplitProbe?

    /// Samples the probe once the first response has reached `offset`. Returns true when the download splits now
    /// (the transfer stops; the lanes continue from its offset), false to go on with this connection. Runs on the
    /// transport's thread, from the sink.
    private func endProbe(at offset: Int64) -> Bool {
        guard var probe, !probe.isDone, let store else { return false }
        let known = self.known
        let total = probe.total
        let verdict = probe.sample(
            offset: offset, now: clock.uptime(),
            splittable: { [self] in
                guard let known else { return false }
                return known.totalLength == total && known.acceptRanges && known.ifRange != nil
                    && machine({ $0.splittingFailed }) == nil
            },
            limitingRate: { [options] in options.rateLimiter?.limitingRate },
            lanes: { [self] in known.map { lanes(for: $0) } ?? 1 })
        self.probe = probe
        switch verdict {
        case .none:
            return false
        case .keepOne(let notice):
            emit(.notice(notice), fromTransport: true)
            return false
        case .split(let slowdown):
            guard let known else { return false }
            split(store, total: probe.total, lanes: lanes(for: known))
            guard store.snapshot.segments.count > 1 else { return false }
            if let slowdown {
                emit(.notice(slowdown.notice(connections: store.snapshot.segments.count)), fromTransport: true)
            }
            totalLength.store(probe.total, ordering: .relaxed)
            segmentNow = true
            return true
        }
    }

    /// The running digest did not see the bytes in order (several connections): hash the file at the end.
    private var hashFromDisk = false

    /// How many connections this download uses (``ConnectionPlan``): the grant is asked once per run.
    private var connections: ConnectionPlan

    /// How many connections this download should use, given what the server said.
    private func lanes(for validators: Validators) -> Int {
        connections.lanes(for: validators, grant: options.connectionGrant)
    }

    /// Whether to split now: more than one connection wanted and the server gave what ranges need (see
    /// ``SplitPolicy/canSplit(_:wanted:asked:minimumSplitSize:failure:)``); says why not when that is worth saying.
    private func shouldSegment(_ validators: Validators, status: Int) -> Bool {
        let (allowed, notice) = SplitPolicy.canSplit(
            validators, wanted: connections.wanted(for: validators), asked: options.connections,
            minimumSplitSize: options.minimumSplitSize, failure: machine { $0.splittingFailed })
        if let notice { emit(.notice(notice)) }
        return allowed
    }

    /// Cuts what remains of the single segment (from its written offset to `total`) into `lanes` segments on
    /// piece boundaries (``SplitPolicy/boundaries(from:total:lanes:pieceSize:minimumSplitSize:)``).
    private func split(_ store: PartStore, total: Int64, lanes: Int) {
        var slot = 0
        let boundaries = SplitPolicy.boundaries(
            from: store.written(0), total: total, lanes: lanes, pieceSize: store.pieceSize,
            minimumSplitSize: options.minimumSplitSize)
        for boundary in boundaries {
            guard let next = store.split(slot, at: boundary) else { break }
            slot = next
        }
    }

    /// Whether a resumed single-segment partial should continue over several connections (asked once, at the
    /// start of the run: ``ConnectionPlan/resplit(known:written:grant:)``); splits it if so.
    private func resplit(_ store: PartStore) -> Bool {
        guard store.snapshot.segments.count == 1, let total = known?.totalLength,
            let lanes = connections.resplit(known: known, written: store.written(0), grant: options.connectionGrant)
        else { return false }
        split(store, total: total, lanes: lanes)
        return store.snapshot.segments.count > 1
    }

    /// Runs a transfer of the part file's segments: over several lanes (`split`), or the download's one segment
    /// over one lane (a download on one connection). Returns what the state machine makes of its end.
    private func runTransfer(_ store: PartStore, split: Bool) async throws -> DownloadStateMachine.Action {
        let lanes: Int
        if split, let known {
            lanes = max(1, self.lanes(for: known))
            hashFromDisk = true
            // Space reserved and the split durable before any lane writes, so a crash in the first second keeps
            // every lane's bytes (disk work: on the blocking pool).
            let total = known.totalLength
            try await offloaded { () throws(DownloadError) in
                if let total, let error = store.preallocate(totalLength: total) {
                    throw DownloadError.io("cannot reserve space for", path: store.paths.part, error)
                }
                try store.checkpoint(force: true)
            }
            Trace.note("\(request.url) split checkpoint done")
        } else {
            lanes = 1
        }
        let minimumSplitSize = options.minimumSplitSize
        let rateLimited = options.rateLimiter?.isLimiting ?? false
        let refused = machine {
            $0.transferStarted(
                lanes: lanes, split: split, rateLimited: rateLimited, pieceSize: store.pieceSize,
                minimumSplitSize: minimumSplitSize)
        }
        if let refused { return refused }
        let transfer = SegmentedTransfer(
            store: store, known: known ?? store.snapshot.validators, split: split, request: request,
            options: options, transport: transport, clock: clock, lanes: lanes,
            emit: { [self] event in emit(event) }, checkpointer: checkpointer, counters: counters, owner: self)
        do {
            try await transfer.run()
        } catch is CancellationError {
            throw try interrupted()
        }
        // On one connection a response may have added to the validators.
        if !split { known = transfer.known }
        let allComplete = store.writtenSegments.allSatisfy(\.isComplete)
        return machine { $0.transferEnded(allComplete: allComplete) }
    }

    // MARK: For the one lane of a download on one connection (on the decision pool)

    /// The digest that sees every byte in order from 0, unless the bytes came over several connections.
    var runningDigest: DigestHasher? { hashFromDisk ? nil : hasher }

    /// A 200 with the whole (new) file to the one connection's ranged request: restarts from zero in place, the
    /// body kept from its first byte. False when the restarts are used up (the download then fails as unstable).
    func restartInPlace(_ reason: RestartReason, validators: Validators) throws(DownloadError) -> Bool {
        guard machine({ $0.restartInPlace() }) else { return false }
        emit(.restarting(reason))
        resumedFrom = 0  // nothing kept: the result must not report a resume
        guard let store else { return false }
        try store.restart(validators: validators)
        hasher?.reset()
        counters.resetCheckpointCount()
        known = validators
        return true
    }

    /// The one connection's body starts flowing at `offset`.
    func receiving(status: Int, offset: Int64, validators: Validators) {
        totalLength.store(validators.totalLength ?? -1, ordering: .relaxed)
        emit(.receiving(status: status, offset: offset, total: validators.totalLength))
    }

    // MARK: One attempt

    /// One request (see ``performAttempt(_:on:hook:started:decide:)``); a decision that could not prepare the
    /// files (a store that cannot be made) ends the run with its error.
    private func attempt(_ request: TransportRequest) async -> Result<Void, TransportError> {
        let (result, error) = await performAttempt(
            request, on: transport, hook: options.headDecisionHook, decide: { [self] head in decide(head) })
        if let error { setupError = error }
        return result
    }

    /// Judges a response head and prepares the files for its body. Runs on the blocking pool.
    private func decide(_ head: ResponseHead) -> HeadDecision {
        let verdict = ResumePolicy.evaluate(head, plan: plan, known: known)
        self.verdict = verdict
        switch verdict {
        case .accept(let start, let validators):
            do {
                if store == nil {
                    guard try createStore(head: head, validators: validators) else { return .abort }
                } else if validators != known {
                    try store?.update(validators: validators)
                }
            } catch {
                setupError = error as? DownloadError ?? DownloadError(.io, "\(error)")
                return .abort
            }
            known = validators
            if let store, let total = validators.totalLength, shouldSegment(validators, status: head.status) {
                if options.connections == nil, options.singleConnectionRate != nil {
                    // Receive a moment first: the split happens (from where this response got to) unless one
                    // connection turns out to be fast enough on its own.
                    probe = SplitProbe(
                        started: clock.uptime(), total: total, singleConnectionRate: options.singleConnectionRate,
                        minimumSplitSize: options.minimumSplitSize)
                } else if lanes(for: validators) > 1 {
                    // Split now and let the lanes request exact ranges; this response's bytes are not needed.
                    split(store, total: total, lanes: lanes(for: validators))
                    totalLength.store(total, ordering: .relaxed)
                    segmentNow = true
                    return .abort
                }
            }
            return begin(at: start, validators: validators, status: head.status)
        case .restart, .restartWithBody:
            // (A request for the whole file is never ranged, so it cannot meet a 200 to a range.)
            return .abort
        case .complete, .redirect, .retry, .fail:
            return .discard
        case .malformed, .refused:
            return .abort
        }
    }

    /// Sets up the attempt's sink for the whole file's body (`start` is 0).
    private func begin(at start: Int64, validators: Validators, status: Int) -> HeadDecision {
        guard let store else { return .abort }
        if let total = validators.totalLength, let error = store.preallocate(totalLength: total) {
            attemptFailure = .write(error)
            return .abort
        }
        limit = validators.totalLength
        var pieces: PieceHasher?
        if let total = validators.totalLength {
            var hasher = PieceHasher(pieceSize: store.pieceSize, total: total)
            hasher.start(at: start, segmentStart: 0, store: store)
            pieces = hasher
        }
        let sink = SegmentSink(
            store: store, slot: 0, bound: .fileLength(validators.totalLength), offset: start,
            rateLimiter: options.rateLimiter, clock: clock, checkpointer: checkpointer, counters: counters,
            digest: hasher,
            pieces: pieces,
            // Only while the first response is probed; the sink lives no longer than this run.
            afterWrite: probe == nil ? nil : { [unowned self] offset in endProbe(at: offset) },
            canRequestRest: validators.canResume)
        self.sink = sink
        totalLength.store(validators.totalLength ?? -1, ordering: .relaxed)
        position.store(start, ordering: .relaxed)
        emit(.receiving(status: status, offset: start, total: validators.totalLength))
        return .receive(sink)
    }

    /// Creates the part file and state once the first usable response names the resource. Returns false when
    /// the transfer must stop instead (a saved partial to resume was found, or the file is already complete).
    private func createStore(head: ResponseHead, validators: Validators) throws -> Bool {
        let path: String
        switch request.destination {
        case .file(let file):
            path = absolutePath(file)
        case .directory(let directory):
            // Leave room for the longest sidecar suffix, or `NAME.stitch-live` would exceed NAME_MAX.
            let name = FileNaming.truncated(
                Array(
                    FileNaming.resolve(
                        contentDisposition: head.headers["Content-Disposition"], urlPath: currentURL.path
                    ).unicodeScalars),
                maxBytes: FileNaming.maxNameBytes - DownloadPaths.longestSuffixBytes)
            let named = absolutePath(directory.hasSuffix("/") ? directory + name : directory + "/" + name)
            path = request.choosePath?(named) ?? named
            let paths = DownloadPaths(destination: path)
            if let done = try openExisting(paths) {
                alreadyComplete = done
                return false
            }
            if store != nil {
                switchToResume = true  // resume the saved partial with a proper range request
                return false
            }
        }
        let store = try PartStore.create(
            paths: DownloadPaths(destination: path), url: request.url,
            headers: request.headers.map { "\($0.name): \($0.value)" },
            checksum: request.checksum?.description, validators: validators, adoption: adoption)
        self.store = store
        startCheckpointer(store)
        emit(.destinationResolved(path))
        return true
    }
}

func statusText(_ status: Int) -> String {
    switch status {
    case 400: return "Bad Request"
    case 401: return "Unauthorized"
    case 403: return "Forbidden"
    case 404: return "Not Found"
    case 405: return "Method Not Allowed"
    case 408: return "Request Timeout"
    case 410: return "Gone"
    case 416: return "Range Not Satisfiable"
    case 429: return "Too Many Requests"
    case 500: return "Internal Server Error"
    case 502: return "Bad Gateway"
    case 503: return "Service Unavailable"
    case 504: return "Gateway Timeout"
    default: return ""
    }
}

/// Runs blocking file-system work (syncs, renames) on ``BlockingPool``'s threads instead of a cooperative one.
/// Not cancellable: once started, the work completes.
func offloaded<T: Sendable>(_ work: @escaping @Sendable () throws(DownloadError) -> T) async throws(DownloadError) -> T {
    try await BlockingPool.shared.run(work)
}

/// Runs a response-head decision (and the disk work it may need) on ``BlockingPool/decisions``.
func offloadedDecision<T: Sendable>(
    _ work: @escaping @Sendable () throws(DownloadError) -> T
) async throws(DownloadError) -> T {
    try await BlockingPool.decisions.run(work)
}
