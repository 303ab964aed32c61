import Foundation
import Synchronization
import StitchLocks

/// One call of ``Downloader/download(_:options:onEvent:)``: the one executor of the download's state machine
/// (``DownloadStateMachine``, asked under ``core``). It performs the machine's actions — the first connection's
/// request for the whole file, a transfer over one lane or several, restarts, waits, the end — and reports what
/// came of each. It decides nothing: the machines decide, ``LaneRequest`` judges every response head (one
/// decision for every request), ``RunFiles`` does the disk work and ``SplitControl`` keeps the split's state.
///
/// A transfer runs lanes on a task group. Each *lane* claims a segment (or steals the end of one: the machine
/// says which), requests exactly its bytes (`Range: bytes=N-M` with `If-Range`), and reports how each request
/// ended; its sink writes with `pwrite` at the segment's offsets and records them in the live record. Every 206 is
/// checked against the validators and the range asked for; a mismatch stops every lane and the download restarts
/// from zero. A failing lane retries its own segment with backoff while the others go on; one refused (429, 503)
/// or out of retries while others receive retires. A download on one connection is a transfer with one lane
/// (``LaneRequest/Role/alone``).
///
/// Uneven links (the monitor, slow connections replaced, steals and the end game, connections that get different
/// versions of the file) follow ``LaneScheduler`` and ``TransferStateMachine``; nothing is ever spliced.
///
/// Threads: the engine's task runs ``run()`` and the lanes; head decisions run on the decision pool, bodies on the
/// transport's thread (the sink: a `pwrite`, counters, and the probe's sample), disk work on the blocking pool.
/// Every field is a constant; what changes is behind the locks of the types it holds.
final class DownloadRun: Sendable {
    let context: RunContext
    let reporter: RunReporter
    let files: RunFiles
    let splits: SplitControl
    /// The download's state machine, with its lanes' requests beside it: the one lock this run's executor (its
    /// task, the lanes, the decisions and the monitor) takes to ask it. Under it no store's lock is taken, no
    /// connection cancelled and no caller's code run: the facts it needs are read before.
    let core: Locked<EngineCore>
    /// Why mirrors given were left out, said when the run starts.
    let rejectedMirrors: [String]

    init(
        request: DownloadRequest, options: DownloadOptions, transport: any HTTPTransport,
        clock: any DownloadClock, onEvent: @escaping @Sendable (DownloadEvent) -> Void
    ) throws(DownloadError) {
        let startURL = try validateURL(request.url)
        var request = request
        if request.ifNewer, case .directory(let directory) = request.destination {
            // The file asked about must be known before the request: named from the URL alone.
            let named = LaneRequest.path(in: directory, contentDisposition: nil, url: startURL)
            request.destination = .file(request.pathChoice(named).path)
        }
        // A mirror that is not an http(s) URL is left out (said when the run starts), never the download's end.
        var mirrors: [URL] = []
        var rejected: [String] = []
        for text in request.mirrors {
            do {
                let mirror = try validateURL(text)
                if mirror != startURL, !mirrors.contains(mirror) { mirrors.append(mirror) }
            } catch {
                rejected.append("mirror not used: \(error.message)")
            }
        }
        rejectedMirrors = rejected
        context = RunContext(
            request: request, options: options, transport: transport, clock: clock, startURL: startURL,
            mirrorURLs: mirrors)
        reporter = RunReporter(checkpointBytes: options.checkpointBytes, onEvent: onEvent)
        files = RunFiles(context: context, reporter: reporter)
        splits = SplitControl(options)
        core = Locked(
            EngineCore(
                machine: DownloadStateMachine(
                    startURL: startURL, retry: options.retry, maxRedirects: options.maxRedirects,
                    maxRestarts: options.maxRestarts)))
    }

    // MARK: The download's steps

    func run() async throws(DownloadError) -> DownloadResult {
        let outcome: Result<DownloadResult, DownloadError>
        do { outcome = .success(try await runSteps()) } catch { outcome = .failure(.wrapping(error)) }
        await files.endRun()
        // Every event the run sent has reached the caller before the result (or error) does, and none comes after.
        reporter.close()
        await reporter.drained()
        return try outcome.get()
    }

    private func runSteps() async throws -> DownloadResult {
        let request = context.request
        for notice in rejectedMirrors { reporter.emit(.notice(notice)) }
        if case .directory(let directory) = request.destination {
            // Into a folder the response names the file (`Content-Disposition`, a redirect's URL), but what an
            // earlier run of this URL left under the name the URL alone gives — a finished file, a partial with its
            // state, a part file finished but not renamed — is this download's: found before the request, it is
            // taken (claimed, then opened as a file destination's is), so a rerun asks nothing for a finished file
            // and resumes a partial with a range. Anything else there (another program's file, another URL's
            // partial) is left to the response's name and the path choice after it, as before. Three failing
            // lookups inline when nothing is there.
            let named = LaneRequest.path(in: directory, contentDisposition: nil, url: context.startURL)
            if PartialDownload.mayBeThere(DownloadPaths(destination: named)) {
                let (files, request) = (self.files, request)
                let open = { @Sendable () throws(DownloadError) -> DownloadResult? in
                    let paths = DownloadPaths(destination: named)
                    guard PartialDownload(paths).isADownload(of: request.owns), request.pathChoice(named).path == named
                    else { return nil }
                    return try files.openExistingOnThePool(paths)
                }
                if let done = try await offloaded(open) { return done }
            }
        }
        if case .file(let path) = request.destination {
            let paths = DownloadPaths(destination: absolutePath(path))
            if request.adopt, let found = try await ForeignAdoption(context: context, reporter: reporter).adopt(paths) {
                files.adoption = found
            }
            // What an earlier run left is looked at on the blocking pool: reopening may sync, read the state and
            // hash a prefix; an already complete file may be hashed against a checksum. With nothing there (the
            // usual first run) the two failing lookups are all it costs, here.
            if PartialDownload.mayBeThere(paths) {
                let files = self.files
                if let done = try await offloaded({ () throws(DownloadError) in try files.openExistingOnThePool(paths) }) {
                    return done
                }
            }
        }
        let ticker = reporter.startTicker(context.clock, interval: context.options.progressInterval)
        defer {
            ticker.cancel()
            reporter.close()
        }
        var action = nextStep()
        while true {
            Trace.note("\(request.url) run action \(action) priority \(Task.currentPriority)")
            switch action {
            case .requestWhole, .considerSplit, .transfer:
                // Before anything that asks the server; an action that ends the run, or a restart's discard of
                // bytes the machine no longer trusts, is done even when the run is being cancelled.
                if Task.isCancelled { throw files.interrupted() }
            default:
                break
            }
            switch action {
            case .requestWhole(let url):
                switch try await requestWhole(url) {
                case .next(let next): action = next
                case .complete(let done): return done
                }
            case .considerSplit:
                let (store, known) = (files.store, files.known)
                let didSplit = store.map { splits.resplit($0, known: known) } ?? false
                action = machine { $0.splitConsidered(didSplit) }
            case .transfer(let split):
                guard let store = files.store else {
                    throw DownloadError(.protocolViolation, "no part file to continue")
                }
                action = try await runTransfer(store, split: split)
            case .redirected(let url):
                reporter.emit(.redirected(to: url.absoluteString))
                action = nextStep()
            case .restart(let reason):
                try files.restart(reason, validators: nil)
                splits.reset()
                action = nextStep()
            case .wait(let delay, let attempt, let of, let reason):
                reporter.emit(.retrying(attempt: attempt, maxRetries: of, delay: delay, reason: reason))
                await files.checkpointOffPool()
                do { try await context.clock.sleep(seconds: delay) } catch { throw files.interrupted() }
                action = nextStep()
            case .finish:
                try await files.stopCheckpoints()
                // `finishing` is the last event (a caller's slot may go to another download now). No event after
                // it: once the file is renamed into place the download is over, and a late progress tick must not
                // reach the caller after (or while) the result is returned. Every event sent so far reaches the
                // caller before the rename: one who sees an event never finds the file already there.
                reporter.close(after: .finishing)
                await reporter.drained()
                return try await files.finish()
            case .fail(let error):
                await files.checkpointOffPool()
                throw error
            case .interrupted:
                throw files.interrupted()
            }
        }
    }

    /// Asks the state machine under the run's lock.
    func machine<T: Sendable>(_ body: (inout DownloadStateMachine) -> T) -> T {
        core.withLock { body(&$0.machine) }
    }

    /// The machine's next step for what the part file holds now (read before its lock is taken).
    private func nextStep(splitNow: Bool = false) -> DownloadStateMachine.Action {
        let facts = files.machineFacts
        return machine { $0.next(store: facts, splitNow: splitNow) }
    }

    private enum WholeEnd { case next(DownloadStateMachine.Action), complete(DownloadResult) }

    /// One request for the whole file on the first connection (lane 0, ``LaneRequest/Role/whole``); returns what
    /// the state machine makes of it, or the result when the file it named is already complete. A decision that
    /// could not prepare the files (a store that cannot be made) ends the run with its error.
    private func requestWhole(_ url: URL) async throws -> WholeEnd {
        splits.reset()
        let before = files.store?.written(0) ?? 0
        let request = LaneRequest(
            run: self, role: .whole, slot: 0,
            plan: RequestPlan(rangeStart: nil, resumeOffset: 0, ifRange: nil, condition: files.condition),
            known: files.known, url: url, lanes: nil)
        let result = await counted(request)
        // A response that ended complete is taken even if the run is being cancelled at that moment.
        var cancelled = false
        if case .failure(let error) = result, error.isCancelled || Task.isCancelled { cancelled = true }
        if let error = request.decisionError {
            // The files could not be prepared: that is the run's end, unless it is being interrupted anyway.
            throw cancelled ? files.interrupted() : error
        }
        let ending = request.ending
        if case .complete(let done)? = ending { return .complete(done) }
        let store = files.store
        let written = store?.written(0) ?? 0
        let report = AttemptReport(
            verdict: request.verdict, result: result, sink: request.sinkOutcome(result).0, written: written,
            end: request.bodyEnd, saved: max(0, written - before), durable: store?.durable.load(ordering: .acquiring) ?? 0)
        var splitNow = splits.takeSplitNow()
        var resumeSaved = false
        switch ending {
        case .splitNow?: splitNow = true
        case .resumeSaved?: resumeSaved = true
        case .complete?, nil: break
        }
        let facts = files.machineFacts
        let now = context.clock.now()
        let jitter = Double.random(in: 0...1)
        return .next(
            machine {
                $0.firstRequestEnded(
                    report, store: facts, splitNow: splitNow, resumeSaved: resumeSaved, cancelled: cancelled, now: now,
                    jitter: jitter)
            })
    }

    /// A 200 with the whole (new) file to the one connection's ranged request: restarts from zero in place, the
    /// body kept from its first byte. False when the restarts are used up (the download then fails as unstable).
    /// On the decision pool.
    func restartInPlace(_ reason: RestartReason, validators: Validators) throws(DownloadError) -> Bool {
        guard machine({ $0.restartInPlace() }), files.store != nil else { return false }
        try files.restart(reason, validators: validators)
        return true
    }

    /// The first response's probe at `offset` (``SplitControl/sampled(at:store:known:now:reporter:allowed:)``): true
    /// when the download splits now. On the transport's thread, from the sink.
    func probeSampled(at offset: Int64) -> Bool {
        guard let store = files.store, let known = files.known else { return false }
        return splits.sampled(at: offset, store: store, known: known, now: context.clock.uptime(), reporter: reporter) {
            [self] in machine { $0.splittingFailed } == nil
        }
    }

    // MARK: A transfer

    /// Runs a transfer of the part file's segments: over several lanes (`split`), or the download's one segment
    /// over one lane. Returns what the state machine makes of its end.
    private func runTransfer(_ store: PartStore, split: Bool) async throws -> DownloadStateMachine.Action {
        let count: Int
        let known = files.known
        if split, let known {
            count = max(1, splits.lanes(for: known))
            files.hashFromDisk()
            // Space reserved and the split durable before any lane writes, so a crash in the first second keeps
            // every lane's bytes (disk work: on the blocking pool).
            let total = known.totalLength
            try await offloaded { () throws(DownloadError) in
                if let total, let error = store.preallocate(totalLength: total) {
                    throw DownloadError.io("cannot reserve space for", path: store.paths.part, error)
                }
                try store.checkpoint(force: true)
            }
        } else {
            count = 1
        }
        let options = context.options
        let rateLimited = options.rateLimiter?.isLimiting ?? false
        let pieceSize = store.pieceSize
        let refused = machine {
            $0.transferStarted(
                lanes: count, split: split, rateLimited: rateLimited, pieceSize: pieceSize,
                minimumSplitSize: options.minimumSplitSize)
        }
        if let refused { return refused }
        let mirrors = split ? mirrorSet(lanes: count, known: known, left: (known?.totalLength ?? 0) - store.writtenBytes) : nil
        let lanes = TransferLanes(
            store: store, count: count, alone: count == 1 && !split, known: known ?? store.snapshot.validators,
            mirrors: mirrors)
        do {
            try await runLanes(lanes)
        } catch is CancellationError {
            throw files.interrupted()
        }
        // On one connection a response may have added to the validators.
        if lanes.alone { files.known = lanes.known }
        let allComplete = store.writtenSegments.allSatisfy(\.isComplete)
        return machine { $0.transferEnded(allComplete: allComplete) }
    }

    /// The mirrors a split transfer of `lanes` lanes fetches from beside the first source: only with a second lane
    /// for them, a strong validator and a length to prove them against, and a file worth the samples.
    private func mirrorSet(lanes: Int, known: Validators?, left: Int64) -> MirrorSet? {
        let advertised = files.advertisedMirrors.filter { $0 != context.startURL && !context.mirrorURLs.contains($0) }
        let urls = context.mirrorURLs + advertised
        // Worth the samples only with several times their bytes left to fetch.
        let samples = Int64(Adoption.minimumSamples) * Adoption.sampleBytes
        guard !urls.isEmpty, lanes >= 2, let known, known.ifRange != nil, known.totalLength != nil, left >= 4 * samples
        else { return nil }
        if !advertised.isEmpty {
            reporter.emit(
                .notice(
                    "the server advertises \(advertised.count) other server(s) of the file (Link: rel=duplicate): "
                        + "each is used only once proven"))
        }
        // Each mirror needs a lane of its own: as many as the lanes allow, in the order given.
        return MirrorSet(urls: Array(urls.prefix(lanes - 1)))
    }

    /// Proves mirror `index` of the transfer (``MirrorProof``) and settles it; says what came of it.
    private func prove(_ index: Int, _ mirrors: MirrorSet, known: Validators) async {
        let url = mirrors.urls[index]
        guard let total = known.totalLength else {
            mirrors.settle(index, validators: nil, why: "the file's length is not known")
            return
        }
        let reporter = self.reporter
        let outcome = await MirrorProof(context: context, emit: { reporter.emit($0) })
            .prove(url, in: mirrors, total: total)
        switch outcome {
        case .proven(let validators, let samples, let bytes):
            if mirrors.settle(index, validators: validators) {
                reporter.emit(
                    .notice(
                        "mirror \(url.absoluteString) joins: \(samples) samples (\(bytes / 1024) KiB) spread over the "
                            + "file match the first source's bytes"))
            }
        case .differs(let why):
            // Cut short because the transfer ended: nothing to say.
            if Task.isCancelled { mirrors.settle(index, validators: nil, why: why) } else { dropMirror(index, mirrors, why: why) }
        }
    }

    /// Takes the first source's samples the mirrors are compared with (``MirrorSet/setReference(_:)``).
    private func takeReference(_ mirrors: MirrorSet, known: Validators) async {
        guard let total = known.totalLength else { return mirrors.setReference(nil) }
        let reporter = self.reporter
        do {
            mirrors.setReference(
                try await MirrorProof(context: context, emit: { reporter.emit($0) }).reference(known: known, total: total))
        } catch {
            if !Task.isCancelled {
                reporter.emit(.notice("mirrors not used: no samples of the first source to prove them by (\(error.message))"))
            }
            mirrors.setReference(nil)
        }
    }

    /// Drops mirror `index` for `why`, said once. The other lanes' requests to it still receiving are cut short (their
    /// bytes so far kept: the proven version, by If-Range) and go on with the first source: a mirror that is
    /// dropped sends nothing more.
    private func dropMirror(_ index: Int, _ mirrors: MirrorSet, why: String, lanes: TransferLanes? = nil) {
        guard mirrors.settle(index, validators: nil, why: why) else { return }
        if let lanes {
            let asking = withCore(lanes) { core in core.requests.values.filter { $0.mirror == index } }
            for request in asking { request.replaceNow() }
        }
        reporter.emit(
            .notice(
                "mirror \(mirrors.urls[index].absoluteString) dropped: \(why); its connections go on with the first "
                    + "source"))
    }

    /// Asks the state machine under the run's lock; once it stops the lanes, their sinks are told.
    private func withCore<T: Sendable>(_ lanes: TransferLanes, _ body: (inout EngineCore) -> T) -> T {
        let (value, stopping) = core.withLock { core in (body(&core), core.machine.stopping) }
        if stopping { lanes.stopped.store(true, ordering: .releasing) }
        return value
    }

    /// Runs the lanes until the state machine has no work left for them (every segment complete, or the lanes
    /// stopping for a restart or a failure: ``DownloadStateMachine/transferEnded(allComplete:)`` says which).
    /// - Throws: `CancellationError` when the task is cancelled.
    private func runLanes(_ lanes: TransferLanes) async throws {
        let url = context.request.url
        Trace.note("\(url) transfer run lanes \(lanes.count) segments \(lanes.store.writtenSegments)")
        defer { Trace.note("\(url) transfer run ended") }
        // The monitor's beat, kept by the download's clock: it samples the lanes, and lanes with nothing to take
        // look again. Only with several lanes (one has no peers to compare, and no one to wait for); a transfer
        // over before the first beat costs no thread a wake-up.
        let (beat, idle) = (lanes.beat, lanes.idle)
        let timer =
            lanes.count > 1
            ? context.clock.every(LaneTiming.monitorInterval) {
                beat.fire()
                idle.fire()
            } : nil
        defer {
            timer?.cancel()
            beat.end()
            idle.end()
        }
        defer { lanes.mirrors?.dropUnsettled() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            if let mirrors = lanes.mirrors {
                let known = lanes.known
                // The first source's samples, while the mirrors' are taken; its lanes wait for them (below).
                group.addTask { await self.takeReference(mirrors, known: known) }
                for index in mirrors.urls.indices {
                    group.addTask { await self.prove(index, mirrors, known: known) }
                }
            }
            for id in 0..<lanes.count {
                group.addTask {
                    defer { lanes.finished.add(1, ordering: .releasing) }
                    try await self.lane(lanes, id: id)
                }
            }
            if lanes.count > 1 {
                group.addTask {
                    while lanes.finished.load(ordering: .acquiring) < lanes.count, await beat.next() {
                        self.monitor(lanes, now: self.context.clock.uptime())
                    }
                }
            }
            // The monitor waits for its beat; once every lane is done it is cancelled rather than waited for. After
            // a halt the lanes still sleeping in a backoff or waiting on a slow server are cancelled too.
            while try await group.next() != nil {
                if lanes.finished.load(ordering: .acquiring) >= lanes.count
                    || lanes.stopped.load(ordering: .acquiring)
                {
                    group.cancelAll()
                }
            }
        }
    }

    /// What an idle lane does once the state machine's work is performed.
    private enum Claim: Sendable { case fetch(Int), wait, done }

    /// The next work for an idle lane, as the state machine says; a steal's split is made here. Claims are made one
    /// at a time (``TransferLanes/claiming``), so no other lane's steal splits the file between the reading of its
    /// segments and the split; the store's lock is never taken under the machine's, nor a connection cancelled.
    private func claim(_ lanes: TransferLanes) -> Claim {
        let store = lanes.store
        return lanes.claiming.withLock { _ in
            let segments = store.writtenSegments
            let now = context.clock.uptime()
            let work = withCore(lanes) { core in
                core.machine.laneIdle(segments: segments, running: core.running, now: now)
            }
            switch work {
            case .fetch(let slot):
                return .fetch(slot)
            case .steal(let victim, let at, let replaceVictim):
                Trace.note("\(context.request.url) steal from \(victim) at \(at) replace \(replaceVictim)")
                guard let slot = store.split(victim, at: at) else { return .wait }
                let replaced = withCore(lanes) { core -> LaneRequest? in
                    core.machine.stole(slot)
                    return replaceVictim ? core.requests[victim] : nil
                }
                // Not counted against the monitor's cap: the end game replaces at most one connection per steal.
                replaced?.replaceNow()
                return .fetch(slot)
            case .wait:
                return .wait
            case .stop, .retire:
                return .done
            }
        }
    }

    /// Ten times a second: each running request's speed over the last half second; a connection slower than a
    /// quarter of its peers' median for two samples in a row is dropped and its lane asks again on a new
    /// connection. Not under a rate limit, which makes connections slow on purpose. (The rules are the scheduler's.)
    private func monitor(_ lanes: TransferLanes, now: Double) {
        let segments = lanes.store.writtenSegments
        let slow = withCore(lanes) { core in
            core.machine.sample(segments: segments, running: core.running, now: now).compactMap { slot in
                Trace.note("\(context.request.url) monitor replaces \(slot) speeds \(core.machine.laneSpeeds)")
                return core.requests[slot]
            }
        }
        for request in slow { request.replaceNow() }
    }

    /// Registers the request running on lane `slot` (nil: its request ended). Only this lane registers its slot.
    private func register(_ request: LaneRequest?, for slot: Int, _ lanes: TransferLanes) {
        guard request == nil else {
            withCore(lanes) { $0.requests[slot] = request }
            return
        }
        // What a new request may expect: this one's speed over its last window, or (too short a request for a
        // window) over its whole life; read before the machine's lock is taken (the request's offset is its sink's).
        let now = context.clock.uptime()
        let whole = withCore(lanes) { $0.requests[slot] }.flatMap { request -> Double? in
            let elapsed = now - request.startedAt
            let bytes = request.offset - request.plan.resumeOffset
            return elapsed > 0.01 && bytes >= LaneTiming.stealGranule ? Double(bytes) / elapsed : nil
        }
        withCore(lanes) { core in
            core.machine.requestEnded(slot, wholeSpeed: whole)
            core.requests[slot] = nil
        }
    }

    // MARK: One lane

    private func lane(_ lanes: TransferLanes, id: Int) async throws {
        // A mirror's lane waits for its proof; a lane whose mirror is not proven (or is dropped later) goes on with
        // the first source, as any other lane (so no mirror ever leaves the download short of connections).
        let mirror = lanes.mirrors.flatMap { $0.mirror(ofLane: id) }
        if let mirror, let mirrors = lanes.mirrors {
            // Dropped, it joins the first source: after that source's samples, as its own lanes do.
            if await mirrors.proof(mirror) == nil { _ = await mirrors.reference() }
        } else if let mirrors = lanes.mirrors {
            // The first source's lanes start once its samples are taken: its server may limit connections.
            _ = await mirrors.reference()
        }
        while true {
            let claimed = claim(lanes)
            Trace.note("\(context.request.url) lane claim \(claimed)")
            switch claimed {
            case .done:
                // Nothing left to fetch: a mirror still being proven is not needed.
                lanes.mirrors?.dropUnsettled()
                return
            case .wait:
                // Nothing worth taking now: wait while others finish, in case one turns slow (the end game).
                if lanes.count > 1 {
                    guard await lanes.idle.next() else { return }
                } else {
                    do { try await context.clock.sleep(seconds: LaneTiming.monitorInterval) } catch { return }
                }
            case .fetch(let slot):
                defer {
                    withCore(lanes) { $0.machine.released(slot) }
                    lanes.idle.fire()
                }
                do {
                    if try await fetch(slot, lanes, mirror: mirror) == .retired { return }
                } catch is CancellationError where lanes.stopped.load(ordering: .acquiring) {
                    return  // cancelled because another lane halted the run: that halt is the outcome
                }
            }
        }
    }

    /// Performs `request`, counted among the requests in flight while it runs.
    private func counted(_ request: LaneRequest) async -> Result<Void, TransportError> {
        reporter.requestsInFlight.add(1, ordering: .relaxed)
        defer { reporter.requestsInFlight.subtract(1, ordering: .relaxed) }
        return await request.perform()
    }

    /// How a lane's work on one segment ended.
    private enum LaneEnd { case done, retired }

    /// Fetches segment `slot` to its (possibly shrinking) end, retrying its own failures; or gives it back and
    /// retires the lane when the state machine says the download goes on without it.
    private func fetch(_ slot: Int, _ lanes: TransferLanes, mirror lanesMirror: Int? = nil) async throws -> LaneEnd {
        let store = lanes.store
        while !lanes.stopped.load(ordering: .acquiring) {
            try Task.checkCancellation()
            if let failure = files.checkpointError
                ?? (store.isBroken
                    ? DownloadError(.io, "an earlier write of \(store.paths.part) failed; stopping", resumable: true)
                    : nil)
            {
                withCore(lanes) { $0.machine.halt(.failure(failure)) }
                return .done
            }
            let start = store.written(slot)
            let end = store.end(slot)
            // A mirror's ranges are asked with its own validator, and its answers checked against it; once it is
            // dropped (or was never proven), the lane asks the first source.
            let proven = lanesMirror.flatMap { index in lanes.mirrors?.validators(index).map { (index, $0) } }
            let mirror = proven?.0
            let source = mirror.flatMap { lanes.mirrors?.urls[$0] }
            let known = proven?.1 ?? lanes.known
            let overlapWindow = context.options.overlapWindow
            guard
                let (plan, url) = withCore(lanes, {
                    $0.machine.nextRequest(
                        slot, written: start, end: end, known: known, overlapWindow: overlapWindow, source: source)
                })
            else { return .done }
            let request = LaneRequest(
                run: self, role: lanes.alone ? .alone : .segment, slot: slot, plan: plan, known: known, url: url,
                lanes: lanes, mirror: mirror)
            register(request, for: slot, lanes)
            // Dropped between the look at its validators and the registration: the drop's cut missed this one.
            if let mirror, lanes.mirrors?.isDropped(mirror) == true { request.replaceNow() }
            let result = await counted(request)
            register(nil, for: slot, lanes)
            if lanes.stopped.load(ordering: .acquiring) { return .done }
            try Task.checkCancellation()

            let (outcome, stoppedForRun) = request.sinkOutcome(result)
            let written = store.written(slot)
            // Read again: a split may have moved it, and a restart in place gives it the new file's length (none,
            // for a body of unknown length).
            let endNow = store.end(slot)
            let report = DownloadStateMachine.LaneReport(
                attempt: AttemptReport(
                    verdict: request.verdict, result: result, sink: outcome, written: written, end: endNow,
                    saved: max(0, written - start), durable: store.durable.load(ordering: .acquiring)),
                decisionError: request.decisionError, sinkAttached: request.sink != nil,
                stoppedForRun: stoppedForRun, mirror: mirror != nil)
            let now = context.clock.now()
            let jitter = Double.random(in: 0...1)
            let action = withCore(lanes) { core in
                core.machine.laneRequestEnded(slot, report, running: core.running, now: now, jitter: jitter)
            }
            Trace.note("\(context.request.url) lane \(slot) request ended \(result) -> \(action)")
            switch action {
            case .again:
                // Not said when the request was cut because its mirror was dropped (said once, by the drop).
                if case .replaced = outcome, !(mirror.map { lanes.mirrors?.isDropped($0) ?? false } ?? false) {
                    reporter.emit(.notice("replacing a slow connection"))
                }
            case .redirected(let next):
                reporter.emit(.redirected(to: next.absoluteString))
            case .segmentDone, .stop:
                return .done
            case .retire(let notice):
                if let notice { reporter.emit(.notice(notice)) }
                return .retired
            case .dropMirror(let why):
                // The lane goes on with the first source (its next request).
                if let mirror, let mirrors = lanes.mirrors { dropMirror(mirror, mirrors, why: why, lanes: lanes) }
            case .interrupted:
                throw CancellationError()
            case .wait(let delay, let attempt, let of, let reason, let checkpoint):
                reporter.emit(.retrying(attempt: attempt, maxRetries: of, delay: delay, reason: reason))
                // A retry's pause is a good moment for a durable checkpoint (off the cooperative threads).
                if checkpoint, !store.isBroken { await files.checkpointOffPool() }
                try await context.clock.sleep(seconds: delay)
            }
        }
        return .done
    }
}
