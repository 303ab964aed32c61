import Foundation
import Synchronization
import StitchLocks

/// One request of a download, on lane `slot`: its plan, the engine's reading of its head, and its body's sink (the
/// engine's one ``SegmentSink``). Every request of every download is one of these, judged by the one head decision
/// below (``decide(_:)``), in one of three roles:
/// - ``Role/whole``: the first connection's request for the whole file (lane 0 before the file is known). It names
///   the file, creates the store, and decides whether to split: at once (its body is not needed), or after a
///   probe of its speed (the body flows meanwhile, and the split takes over from where it got to).
/// - ``Role/alone``: the download's one segment on one connection (N = 1). It asks as a resume does (a range from
///   where the file got to, with `If-Range` or, without a strong validator, re-fetching an overlap to compare; no
///   end), takes the body to the file's end (a longer one is too long, an unknown length ends with the response),
///   keeps the running digest, saves what a response adds to the validators, and restarts in place on a 200 to its
///   range (the new file's body is kept from byte 0).
/// - ``Role/segment``: one of several lanes, asking for exactly its segment's bytes; the segment's end may move
///   closer while the body flows (another lane took its tail).
///
/// Touched on the decision pool (the head) and the transport's thread (the body) during the request and by its
/// lane after it; the monitor reads the atomics and the sink's offset. Its own facts are behind a lock.
final class LaneRequest: Sendable {
    enum Role: Sendable, Equatable { case whole, alone, segment }

    /// How a request for the whole file ended before its body, for the run rather than the attempt's machine.
    enum Ending: Sendable {
        /// The file named by the response is already complete at its destination.
        case complete(DownloadResult)
        /// The response named a file whose partial an earlier run left: resume it with a proper range request.
        case resumeSaved
        /// The file was split: the lanes take over (this response's body stopped, or was never needed).
        case splitNow
    }

    private struct Facts {
        var verdict: HeadVerdict?
        var sink: SegmentSink?
        var decisionError: DownloadError?
        var ending: Ending?
        /// Where the body has to end (the file's length; nil: unknown), for a request for the whole file.
        var bodyEnd: Int64?
    }

    let run: DownloadRun
    let role: Role
    let slot: Int
    let plan: RequestPlan
    /// The validators the kept bytes came with, when the request was made.
    let known: Validators?
    let url: URL
    /// The transfer's lanes (nil for a request for the whole file, which runs before any transfer).
    let lanes: TransferLanes?
    /// The mirror asked (its index in ``MirrorSet/urls``), or nil: the first source.
    let mirror: Int?
    /// When this request was made, for the lane's speed.
    let startedAt: Double
    /// Set by the monitor: this connection is too slow; stop so the lane asks again on a new one.
    let replace = AtomicFlag()
    /// The response being received, so that a stalled one can be cut off (no bytes come to notice `replace`).
    private let response = Locked<(any TransportResponse)?>(nil)
    private let receivingFlag = Atomic<Bool>(false)
    private let facts = Locked(Facts())

    init(
        run: DownloadRun, role: Role, slot: Int, plan: RequestPlan, known: Validators?, url: URL,
        lanes: TransferLanes?, mirror: Int? = nil
    ) {
        self.mirror = mirror
        self.run = run
        self.role = role
        self.slot = slot
        self.plan = plan
        self.known = known
        self.url = url
        self.lanes = lanes
        startedAt = run.context.clock.uptime()
    }

    var verdict: HeadVerdict? { facts.withLock { $0.verdict } }
    var sink: SegmentSink? { facts.withLock { $0.sink } }
    var decisionError: DownloadError? { facts.withLock { $0.decisionError } }
    var ending: Ending? { facts.withLock { $0.ending } }
    var bodyEnd: Int64? { facts.withLock { $0.bodyEnd } }
    /// Where the body has got to.
    var offset: Int64 { sink?.offset ?? plan.resumeOffset }
    var reachedEnd: Bool { sink?.reachedEnd ?? false }
    /// The head was accepted and the body is flowing (what the slow-connection monitor may judge).
    var receiving: Bool { receivingFlag.load(ordering: .relaxed) }

    /// Stops this request so the lane asks again on a new connection: at the next chunk, and at once if the
    /// connection has gone silent.
    func replaceNow() {
        replace.set()
        response.withLock { $0 }?.cancel()
    }

    /// The request (see ``performAttempt(_:on:hook:started:decide:)``), as a transport request: as lanes, unless the
    /// user asked for HTTP/2 streams of one connection.
    func perform() async -> Result<Void, TransportError> {
        let context = run.context
        let headers = ResumePolicy.requestHeaders(user: context.userHeaders(for: url), plan: plan)
        let request = TransportRequest(
            url: url.absoluteString, headers: headers, options: context.options.transport,
            lane: context.options.http2Streams || role != .segment ? nil : slot, clock: context.clock)
        defer { response.withLock { $0 = nil } }
        let (result, error) = await performAttempt(
            request, on: context.transport, hook: context.options.headDecisionHook,
            started: { [self] started in
                response.withLock { $0 = started }
                if replace.isSet { started.cancel() }
            },
            decide: { [self] head throws(DownloadError) in try decide(head) })
        facts.withLock { $0.decisionError = error }
        // Every byte of this body hashed before the request counts as ended: the next one may restart the digest,
        // and the finish reads it.
        await sink?.follower?.drained()
        if case .success = result { sink?.checkPart() }
        return result
    }

    /// The sink's trouble in this request, in the words of the attempt's machine: the one mapping of every request.
    /// `stoppedForRun`: the sink stopped for the run's sake (a halt, a broken store, a failed checkpoint), never a
    /// failure of its own.
    func sinkOutcome(_ result: Result<Void, TransportError>) -> (AttemptReport.SinkOutcome, stoppedForRun: Bool) {
        let sink = self.sink
        if let failure = sink?.failure {
            return (
                failure.outcome(part: sink?.store.paths.part ?? "", checkpointError: run.files.checkpointError), false
            )
        }
        if sink?.reachedEnd == true { return (.reachedEnd, false) }  // the next request re-reads the end
        if replace.isSet, Self.endedByUs(result) { return (.replaced, false) }  // ask again on a new connection
        if case .failure(let error) = result, error.isAbortedBySink, case .accept = verdict, role != .whole {
            return (.none, true)
        }
        return (.none, false)
    }

    /// Whether a request ended because the engine stopped it (a replacement cut it off, or its sink said stop),
    /// rather than failing on its own (which is counted and retried with backoff even if a replacement was asked).
    static func endedByUs(_ result: Result<Void, TransportError>) -> Bool {
        switch result {
        case .success: return false
        case .failure(let error): return error.isCancelled || error.isAbortedBySink
        }
    }

    // MARK: The head decision

    /// Judges a response head and prepares the files for its body: the one head decision of every request. Runs
    /// on the decision pool (it may create, reopen, restart or preallocate files, and read the overlap to compare).
    private func decide(_ head: ResponseHead) throws(DownloadError) -> HeadDecision {
        if lanes?.stopped.load(ordering: .relaxed) == true { return .abort }
        let verdict = ResumePolicy.evaluate(head, plan: plan, known: known)
        facts.withLock { $0.verdict = verdict }
        let start: Int64
        let validators: Validators
        var restarted = false
        switch verdict {
        case .accept(let bodyStart, let fresh):
            start = bodyStart
            validators = fresh
        case .restartWithBody(let reason, let fresh) where role == .alone:
            guard try run.restartInPlace(reason, validators: fresh) else { return .abort }
            start = 0
            validators = fresh
            restarted = true
        case .restart, .restartWithBody, .malformed, .refused:
            // (A request for the whole file is never ranged, so it cannot meet a 200 to a range.)
            return .abort
        case .notModified(let why):
            // The file at the destination is the server's: the run ends with it untouched.
            guard role == .whole, let unchanged = run.files.unchanged(why) else { return .abort }
            facts.withLock { $0.ending = .complete(unchanged) }
            return .abort
        case .complete, .redirect, .retry, .fail:
            return .discard
        }
        let files = run.files
        switch role {
        case .segment:
            return .receive(
                attach(segmentSink(start: start, validators: known ?? validators, partCheck: run.files.checksParts ? Self.partCheck(head, whole: known?.digest) : nil)))
        case .whole:
            if let ending = try prepareWhole(head, validators: validators) {
                facts.withLock { $0.ending = ending }
                return .abort
            }
        case .alone:
            // What the response added to the validators, saved before its body is written (a restart in place
            // saved them already).
            if !restarted, validators != known, let store = files.store { try store.update(validators: validators) }
            files.known = validators
            lanes?.adopt(validators)
        }
        guard let store = files.store else { return .abort }
        // Bytes before the resume offset are compared with the disk, not written (a resume without a validator).
        let verifyEnd = start == 0 ? 0 : plan.resumeOffset
        if let total = validators.totalLength, let error = store.preallocate(totalLength: total) {
            throw DownloadError.io("cannot reserve space for", path: store.paths.part, error)
        }
        var pieces: PieceHasher?
        if let total = validators.totalLength {
            var hasher = PieceHasher(pieceSize: store.pieceSize, total: total)
            hasher.start(at: max(start, verifyEnd), segmentStart: 0, store: store)
            pieces = hasher
        }
        let context = run.context
        let follower = HashFollower(
            store: store, from: max(start, verifyEnd), digest: files.runningDigest,
            lost: { [files] in files.hashFromDisk() }, hook: context.options.hashHook)
        let probing = role == .whole && run.splits.isProbing
        let lanes = self.lanes
        let run = self.run
        let afterWrite: (@Sendable (Int64) -> Bool)? = probing ? { @Sendable offset in run.probeSampled(at: offset) } : nil
        let shouldStop: @Sendable () -> Bool = { lanes?.stopped.load(ordering: .relaxed) ?? false }
        let sink = SegmentSink(
            store: store, slot: slot, bound: .fileLength(validators.totalLength), offset: start,
            verifyEnd: verifyEnd, rateLimiter: context.options.rateLimiter, clock: context.clock,
            checkpointer: files.checkpointer, counters: run.reporter.counters, pieces: pieces, follower: follower,
            // The probe's sample only while the first response is probed.
            shouldStop: shouldStop, afterWrite: afterWrite,
            canRequestRest: validators.canResume, beforeOverlapRead: context.options.overlapReadHook,
            partCheck: run.files.checksParts ? Self.partCheck(head, whole: known?.digest ?? validators.digest) : nil)
        facts.withLock { $0.bodyEnd = validators.totalLength }
        run.reporter.announce(total: validators.totalLength)
        if role == .whole { run.reporter.position.store(start, ordering: .relaxed) }
        run.reporter.emit(.receiving(status: head.status, offset: max(start, verifyEnd), total: validators.totalLength))
        return .receive(attach(sink))
    }

    private func attach(_ sink: SegmentSink) -> SegmentSink {
        facts.withLock { $0.sink = sink }
        receivingFlag.store(true, ordering: .relaxed)
        return sink
    }

    /// A lane's sink: exactly its segment, whose end may move closer while the body flows.
    /// What a 206's `Content-Digest` says of its bytes, if it says anything that can be checked: not when it is
    /// the digest announced for the whole file (`whole`), which a server that labels it wrongly sends with every part.
    static func partCheck(_ head: ResponseHead, whole: AnnouncedDigest?) -> SegmentSink.PartCheck? {
        guard let announced = AnnouncedDigest.part(of: head),
            whole.map({ $0.algorithm != announced.algorithm || $0.hex != announced.hex }) ?? true,
            let expected = try? ExpectedChecksum(parsing: announced.text),
            let range = head.headers["Content-Range"].flatMap(ContentRange.init(parsing:)),
            let first = range.first, let last = range.last
        else { return nil }
        return SegmentSink.PartCheck(expected: expected, first: first, count: last - first + 1)
    }

    private func segmentSink(start: Int64, validators: Validators, partCheck: SegmentSink.PartCheck?) -> SegmentSink {
        let store = lanes!.store
        var pieces = PieceHasher(pieceSize: store.pieceSize, total: validators.totalLength)
        pieces.start(at: start, segmentStart: store.segmentStart(slot), store: store)
        let lanes = self.lanes
        let replace = self.replace
        return SegmentSink(
            store: store, slot: slot, bound: .segmentEnd(requestEnd: plan.rangeEnd ?? Int64.max), offset: start,
            rateLimiter: run.context.options.rateLimiter, clock: run.context.clock,
            checkpointer: run.files.checkpointer, counters: run.reporter.counters, pieces: pieces, follower: nil,
            shouldStop: { lanes?.stopped.load(ordering: .relaxed) == true || replace.isSet },
            canRequestRest: validators.canResume, partCheck: partCheck)
    }

    /// What the first response means for the files: the store created (named by the response, in a folder) or
    /// its validators saved, and the split decided. Returns how the request ends instead of taking the body:
    /// the file is already complete, a saved partial is to be resumed, or the file was split at once.
    private func prepareWhole(_ head: ResponseHead, validators: Validators) throws(DownloadError) -> Ending? {
        let files = run.files
        if run.context.request.useAdvertisedMirrors {
            // Metalink/HTTP's other servers of the file, resolved against this response's URL, http(s) only.
            // Checked as a URL given would be; none with credentials in it.
            let advertised = LinkHeader.targets(of: head, relation: "duplicate").compactMap {
                URL(string: $0, relativeTo: url)?.absoluteURL
            }.compactMap { try? validateURL($0.absoluteString) }.filter { $0.user == nil && $0.password == nil && $0 != url }
            files.advertisedMirrors = Array(advertised.prefix(4))
        }
        do {
            if files.store == nil {
                if let ending = try createStore(head: head, validators: validators) { return ending }
            } else {
                try files.update(validators: validators)
            }
        } catch let error as DownloadError {
            throw error
        } catch {
            throw DownloadError(.io, "\(error)")
        }
        files.known = validators
        guard let store = files.store, let total = validators.totalLength else { return nil }
        let (allowed, notice) = run.splits.canSplit(validators, failure: run.machine { $0.splittingFailed })
        if let notice { run.reporter.emit(.notice(notice)) }
        guard allowed else { return nil }
        if run.splits.probes {
            // Receive a moment first: the split happens (from where this response got to) unless one connection
            // turns out to be fast enough on its own.
            run.splits.startProbe(total: total, now: run.context.clock.uptime())
        } else if run.splits.lanes(for: validators) > 1 {
            // Split now and let the lanes request exact ranges; this response's bytes are not needed.
            _ = run.splits.split(store, total: total, lanes: run.splits.lanes(for: validators))
            run.reporter.announce(total: total)
            return .splitNow
        }
        return nil
    }

    /// The path of a file named in `directory` by a response's `Content-Disposition`, else by `url`'s path.
    static func path(in directory: String, contentDisposition: String?, url: URL) -> String {
        // Leave room for the longest sidecar suffix, or `NAME.stitch-live` would exceed NAME_MAX.
        let limit = FileNaming.maxNameBytes - DownloadPaths.longestSuffixBytes
        let resolved = FileNaming.resolve(contentDisposition: contentDisposition, urlPath: url.path)
        let name =
            resolved.utf8.count <= limit ? resolved : FileNaming.truncated(Array(resolved.unicodeScalars), maxBytes: limit)
        return absolutePath(directory.hasSuffix("/") ? directory + name : directory + "/" + name)
    }

    /// Creates the part file and state once the first usable response names the resource. Returns how the
    /// request ends instead when a saved partial to resume was found, or the file is already complete.
    private func createStore(head: ResponseHead, validators: Validators) throws -> Ending? {
        let request = run.context.request
        let files = run.files
        let path: String
        var vacant = false
        switch request.destination {
        case .file(let file):
            path = absolutePath(file)
        case .directory(let directory):
            let named = Self.path(in: directory, contentDisposition: head.headers["Content-Disposition"], url: url)
            let choice = request.pathChoice(named)
            path = choice.path
            // The choice looked just now and found nothing there: nothing to reopen (the look again would only
            // repeat its failing lookups). `create` looks again under the part file's lock.
            vacant = choice.vacant
            if !vacant {
                if let done = try files.openExisting(DownloadPaths(destination: path)) { return .complete(done) }
                if files.store != nil { return .resumeSaved }
            }
        }
        try files.create(at: path, validators: validators, vacant: vacant)
        return nil
    }
}
