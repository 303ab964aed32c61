import Foundation

/// The decisions of one download, as one pure state machine with an explicit ``State`` and ``Action``, in the way
/// of async-http-client's connection pool: its executors report what happened (a request for the whole file
/// ended, a lane became idle, a lane's request ended, a transfer ended) and perform the returned action. It does
/// no I/O and has no clock of its own (the time and the jitter are passed in), so every rule is a unit test with
/// no sockets (DownloadStateMachineTests).
///
/// Two executors drive it, under one lock (``DownloadRun/core``): ``DownloadRun`` for the download's steps (the
/// first connection's requests, the transfer, restarts, the end) and ``SegmentedTransfer`` for its lanes (which
/// segment an idle lane takes, what each lane's requests come to). What it is made of:
/// - ``AttemptStateMachine``: what one request sequence does after each request (retry, backoff, redirect,
///   restart, fail) — the first connection's, and one per lane.
/// - ``LaneScheduler``: which segment an idle lane takes, steals and the end game, slow connections replaced.
/// - ``SplitPolicy``: whether to split, the probe's verdict, the split's boundaries (asked by the executor, which
///   applies them to the part file).
///
/// The rules of the download:
/// - Until the part file holds bytes or several segments, the first connection asks for the whole file (it names
///   the file, creates the store, decides the split). From then on every request is a transfer's: over several
///   lanes when the file is split (or was just split, or a resumed partial is worth splitting, asked once per
///   run), else over one lane. Several segments without a strong validator cannot be resumed by ranges: restart.
/// - A restart from zero is counted; more than `maxRestarts` and the download fails as unstable.
/// - After a restart while split: a server that ignored a range, connections that answered with different
///   versions, or a second such restart, keep the rest of the run on one connection.
/// - A transfer finishes the download only when every segment is complete (or a body of unknown length ended
///   complete); a transfer that ended otherwise without a failure is a failure, never a finished file.
///
/// The machine keeps one stored ``State``; each event switches on it. An event that does not fit the state (a
/// transfer's end with no transfer running, a lane's report before its transfer started) is the executor's
/// programming error: it stops a debug build (and so the tests) at once, and in a release build it ends the
/// download with a protocol-violation error rather than guess.
///
/// The rules of a lane's request (see ``laneRequestEnded(_:_:running:now:jitter:)``):
/// - Once the transfer is stopping (a restart, a failure), nothing else happens.
/// - Files that could not be prepared for the body end the download.
/// - A verdict that the kept bytes cannot be trusted (a 200 to a range, a changed validator, a bad
///   `Content-Range`) stops every lane and the download restarts — unless another lane is left and the response
///   looked like another edge's version of the file: then the lane retires and the rest goes over one connection.
///   A download on one connection restarts in place on a 200 instead (the body is kept from byte 0); out of
///   restarts, it fails as unstable.
/// - Everything else is the lane's ``AttemptStateMachine``'s, except that a lane refused by the server (429, 503)
///   or out of retries retires while another lane is receiving.
struct DownloadStateMachine: Sendable {
    // MARK: State and actions

    /// Where the download is: the one stored state. Every case carries what the run has learnt so far (``Run``);
    /// a transfer's carries its lanes too.
    enum State: Sendable {
        /// Nothing asked yet: the executor asks for the first step (``next(store:splitNow:)``).
        case opening(Run)
        /// The first connection asks for the whole file (``firstRequestEnded(_:store:splitNow:resumeSaved:cancelled:now:jitter:)``).
        case firstRequest(Run)
        /// Waiting out a backoff of the first connection; then the next step.
        case waiting(Run)
        /// The executor says where a redirect led, or discards the kept bytes for a restart; then the next step.
        case betweenSteps(Run)
        /// The executor decides whether a resumed partial on one segment is worth splitting (``splitConsidered(_:)``).
        case consideringSplit(Run)
        /// The executor prepares a transfer (a split made durable, reserved space, the connections granted) and
        /// starts it (``transferStarted(lanes:split:rateLimited:pieceSize:minimumSplitSize:)``).
        case preparingTransfer(Run, split: Bool)
        /// A transfer's lanes are running: their events, then ``transferEnded(allComplete:)``.
        case transferring(Run, Transfer)
        /// Every byte is there: the executor verifies and renames. Final.
        case finishing(Run)
        /// Final.
        case failed(Run)
        /// Final.
        case interrupted(Run)
        /// Only while an event changes a transfer in place (so its storage is not copied).
        case modifying
    }

    /// Where the download is, without what it carries: for traces, messages and tests.
    enum Phase: Sendable, Equatable {
        case opening, firstRequest, waiting, betweenSteps, consideringSplit, preparingTransfer
        case transferring(lanes: Int, split: Bool)
        case finishing, failed, interrupted
    }

    /// What the run has learnt, kept from state to state.
    struct Run: Sendable {
        /// The first connection's requests; on one connection, its one lane's too (the same sequence goes on).
        var first: AttemptStateMachine
        /// Restarts from zero so far (in place or not).
        var restarts = 0
        /// Why the rest of this run uses one connection, if it does.
        var splittingFailed: SplitPolicy.Failure?
        var restartsWhileSplit = 0
        /// Whether a resumed partial on one segment was considered for a split (asked once per run).
        var splitConsidered = false

        /// Counts a restart: whether the budget allows it.
        mutating func takeRestart(maxRestarts: Int) -> Bool {
            restarts += 1
            return restarts <= maxRestarts
        }

        /// The failure of a file that kept changing.
        var unstable: DownloadError {
            DownloadError(
                .unstableSource, "the file kept changing on the server (\(restarts - 1) restarts); try again later",
                resumable: false)
        }
    }

    /// What the download's executor does next.
    enum Action: Sendable {
        /// Ask for the whole file on the first connection.
        case requestWhole(URL)
        /// Ask whether the resumed partial on one segment is worth splitting now, and report it
        /// (``splitConsidered(_:)``).
        case considerSplit
        /// Run a transfer over the part file's segments: several lanes, or one.
        case transfer(split: Bool)
        /// A redirect was followed: say so.
        case redirected(URL)
        /// The kept bytes cannot be trusted: discard them and say why (the restart is counted).
        case restart(RestartReason)
        /// Say that the first connection retries, make a durable checkpoint, and wait.
        case wait(seconds: Double, attempt: Int, of: Int, reason: String)
        /// Every byte is there: verify, sync and rename into place.
        case finish
        /// The download ends with this error (the partial stays).
        case fail(DownloadError)
        /// The run is being interrupted.
        case interrupted
    }

    /// What the part file holds, as the machine needs it.
    struct Store: Sendable, Equatable {
        var segments: Int
        var written: Int64
        /// A strong validator to send as `If-Range` is known.
        var canCheckRanges: Bool = true
    }

    let maxRestarts: Int
    /// Where the download is: the machine's one stored state.
    private(set) var state: State

    init(startURL: URL, retry: RetryPolicy = RetryPolicy(), maxRedirects: Int = 10, maxRestarts: Int) {
        self.maxRestarts = maxRestarts
        state = .opening(
            Run(first: AttemptStateMachine(startURL: startURL, policy: retry, maxRedirects: maxRedirects, scope: .download)))
    }

    // MARK: Reading the state

    var phase: Phase {
        switch state {
        case .opening: .opening
        case .firstRequest: .firstRequest
        case .waiting: .waiting
        case .betweenSteps: .betweenSteps
        case .consideringSplit: .consideringSplit
        case .preparingTransfer: .preparingTransfer
        case .transferring(_, let transfer): .transferring(lanes: transfer.lanes, split: transfer.split)
        case .finishing: .finishing
        case .failed: .failed
        case .interrupted: .interrupted
        case .modifying: preconditionFailure("the state is read while an event changes it")
        }
    }

    /// What the run has learnt so far.
    var run: Run {
        switch state {
        case .opening(let run), .firstRequest(let run), .waiting(let run), .betweenSteps(let run),
            .consideringSplit(let run), .preparingTransfer(let run, _), .transferring(let run, _), .finishing(let run),
            .failed(let run), .interrupted(let run):
            return run
        case .modifying:
            preconditionFailure("the state is read while an event changes it")
        }
    }

    /// The running transfer's lanes, nil between transfers.
    var transfer: Transfer? {
        if case .transferring(_, let transfer) = state { return transfer }
        return nil
    }

    /// The first connection's requests (on one connection, its lane's too).
    var first: AttemptStateMachine { run.first }
    /// Restarts from zero so far (in place or not).
    var restarts: Int { run.restarts }
    /// Why the rest of this run uses one connection, if it does.
    var splittingFailed: SplitPolicy.Failure? { run.splittingFailed }
    /// Whether the restarts are used up.
    var exhausted: Bool { run.restarts > maxRestarts }

    // MARK: The download's steps

    /// The next step for a part file in `store` (nil: none yet), once the last action needed no report: at the
    /// start, after a redirect was said, a restart's discard, a backoff. `splitNow`: the first response was just
    /// split.
    mutating func next(store: Store?, splitNow: Bool = false) -> Action {
        switch state {
        case .opening(let run), .waiting(let run), .betweenSteps(let run):
            return step(run, store: store, splitNow: splitNow)
        default:
            return misfit("a next step")
        }
    }

    private mutating func step(_ run: Run, store: Store?, splitNow: Bool = false) -> Action {
        var run = run
        guard let store else { return act(.requestWhole(run.first.url), run) }
        if splitNow || store.segments > 1 {
            // A partial of several segments without a strong validator cannot be resumed by ranges.
            guard store.canCheckRanges else { return restart(.unverifiableSegments, run) }
            return act(.transfer(split: true), run)
        }
        guard store.written > 0 else { return act(.requestWhole(run.first.url), run) }
        // Asked once per run, and not after splitting failed in this run (a server that ignored a range, or whose
        // connections disagreed, would only do it again).
        if !run.splitConsidered, run.splittingFailed == nil {
            run.splitConsidered = true
            return act(.considerSplit, run)
        }
        return act(.transfer(split: false), run)
    }

    /// The answer to ``Action/considerSplit``: whether the partial was split into several segments.
    mutating func splitConsidered(_ didSplit: Bool) -> Action {
        guard case .consideringSplit(let run) = state else { return misfit("the answer to a split considered") }
        return act(.transfer(split: didSplit), run)
    }

    /// What the first connection's request for the whole file came to. `splitNow`: the probe split the file, the
    /// response was stopped for the lanes; `resumeSaved`: the response named a file whose partial an earlier run
    /// left, to be resumed with a proper range request; `cancelled`: the run is being interrupted.
    mutating func firstRequestEnded(
        _ report: AttemptReport, store: Store?, splitNow: Bool = false, resumeSaved: Bool = false,
        cancelled: Bool = false, now: Int64, jitter: Double
    ) -> Action {
        guard case .firstRequest(var run) = state else { return misfit("the end of a request for the whole file") }
        if splitNow { return step(run, store: store, splitNow: true) }
        if resumeSaved {
            run.first.resetURL()
            return step(run, store: store)
        }
        if cancelled { return act(.interrupted, run) }
        let decision = run.first.attemptEnded(report, now: now, jitter: jitter)
        switch decision {
        case .requestAgain:
            return step(run, store: store)
        case .follow(let url):
            return act(.redirected(url), run)
        case .restart(let reason):
            return restart(reason, run)
        case .complete:
            return act(.finish, run)
        case .interrupted:
            return act(.interrupted, run)
        case .fail(let error):
            return act(.fail(error), run)
        case .wait(let seconds, let attempt, let of, let reason):
            return act(.wait(seconds: seconds, attempt: attempt, of: of, reason: reason), run)
        }
    }

    /// A transfer starts over `lanes` lanes (the action was ``Action/transfer(split:)`` with the same `split`).
    mutating func transferStarted(lanes: Int, split: Bool, rateLimited: Bool, pieceSize: Int64, minimumSplitSize: Int64)
    {
        guard case .preparingTransfer(let run, split) = state, lanes >= 1 else {
            _ = misfit("the start of a transfer")
            return
        }
        state = .transferring(
            run,
            Transfer(
                lanes: lanes, split: split,
                scheduler: LaneScheduler(
                    lanes: lanes, rateLimited: rateLimited, pieceSize: pieceSize, minimumSplitSize: minimumSplitSize),
                activeLanes: lanes))
    }

    /// How a transfer ended, once every lane is done: `allComplete`, every segment is written to its end.
    mutating func transferEnded(allComplete: Bool) -> Action {
        guard case .transferring(var run, let transfer) = state else { return misfit("the end of a transfer") }
        let disagreed = transfer.connectionsDisagree
        switch transfer.stop {
        case .restart(let reason):
            // A server that ignored a range, or whose connections answer with different versions, gets one
            // connection from now on; so does one that made a split download restart twice (a single change may
            // split again).
            if transfer.split {
                run.restartsWhileSplit += 1
                if disagreed || run.splittingFailed == .versionsDiffer {
                    run.splittingFailed = .versionsDiffer  // kept: one connection from now on
                } else if reason == .rangeIgnored {
                    run.splittingFailed = .rangesIgnored
                } else if run.restartsWhileSplit >= 2 {
                    run.splittingFailed = .restarted
                }
            }
            return restart(reason, run)
        case .failure(let error):
            return act(.fail(error), run)
        case nil:
            break
        }
        guard transfer.completedWhole || allComplete else {
            return act(.fail(DownloadError(.protocolViolation, "segments left unfinished", resumable: true)), run)
        }
        if transfer.split, disagreed { run.splittingFailed = .versionsDiffer }
        return act(.finish, run)
    }

    /// A restart in place (a 200 with the whole file to the one connection's ranged request): whether one is left.
    mutating func restartInPlace() -> Bool {
        let maxRestarts = maxRestarts
        return inTransfer("a restart in place") { run, transfer in
            guard transfer.alone else { return false }
            return run.takeRestart(maxRestarts: maxRestarts)
        } ?? false
    }

    /// The failure of a file that kept changing.
    var unstable: DownloadError { run.unstable }

    /// Hands `action` to the executor: the state becomes what it will be doing.
    private mutating func act(_ action: Action, _ run: Run) -> Action {
        switch action {
        case .requestWhole: state = .firstRequest(run)
        case .considerSplit: state = .consideringSplit(run)
        case .transfer(let split): state = .preparingTransfer(run, split: split)
        case .redirected, .restart: state = .betweenSteps(run)
        case .wait: state = .waiting(run)
        case .finish: state = .finishing(run)
        case .fail: state = .failed(run)
        case .interrupted: state = .interrupted(run)
        }
        return action
    }

    /// Counts a restart from zero and hands it over, or fails as unstable once the budget is spent.
    private mutating func restart(_ reason: RestartReason, _ run: Run) -> Action {
        var run = run
        guard run.takeRestart(maxRestarts: maxRestarts) else { return act(.fail(run.unstable), run) }
        run.first.resetURL()
        return act(.restart(reason), run)
    }

    /// An event that does not fit the state: the executor broke the machine's protocol. A debug build stops here;
    /// a release build ends the download with the reason (never guessing what the bytes are).
    private mutating func misfit(_ event: String) -> Action {
        let message = "\(event) does not fit the download's state (\(phaseText))"
        assertionFailure(message)
        let error = DownloadError(.protocolViolation, "internal error: \(message)", resumable: true)
        if case .modifying = state { return .fail(error) }
        return act(.fail(error), run)
    }

    private var phaseText: String {
        if case .modifying = state { return "modifying" }
        return "\(phase)"
    }

    /// Runs a lane's event on the running transfer, in place. Nil (and a ``misfit(_:)``) with no transfer running.
    @discardableResult
    private mutating func inTransfer<T>(_ event: String, _ body: (inout Run, inout Transfer) -> T) -> T? {
        guard case .transferring(var run, var transfer) = state else {
            _ = misfit(event)
            return nil
        }
        state = .modifying
        let value = body(&run, &transfer)
        state = .transferring(run, transfer)
        return value
    }

    // MARK: The transfer's lanes

    /// What a transfer's lanes share.
    struct Transfer: Sendable {
        let lanes: Int
        let split: Bool
        /// Which lane takes what, and which connections are replaced.
        var scheduler: LaneScheduler
        /// Lanes still working (not retired).
        var activeLanes: Int
        /// Why every lane stops, once one decided so.
        var stop: Stop?
        /// Each segment's request sequence (a lane's; on one connection the download's ``Run/first``).
        var attempts: [Int: AttemptStateMachine] = [:]
        /// Set once connections answered with different versions of the file: the rest goes over one connection.
        var versionsDiffer = false
        /// Set once a lane's response was the version the download has.
        var acceptedKnownVersion = false
        /// Set when a response of unknown length ended complete: its segment has no end to say so.
        var completedWhole = false

        /// Whether some connections answered with the download's version and others with another: not a file that
        /// changed for everyone (then every lane meets the new version), so splitting again would meet it again.
        var connectionsDisagree: Bool { versionsDiffer && acceptedKnownVersion }

        /// Whether the transfer is the download's one segment on one connection (N = 1).
        var alone: Bool { lanes == 1 && !split }

        /// Stops every lane for `stop` (the first reason stands).
        mutating func halt(_ stop: Stop) {
            if self.stop == nil { self.stop = stop }
        }

        /// The request sequence of segment `slot`: on one connection the download's own, else the lane's.
        func attempts(_ slot: Int, _ run: Run) -> AttemptStateMachine {
            if alone { return run.first }
            return attempts[slot]
                ?? AttemptStateMachine(
                    startURL: run.first.startURL, policy: run.first.policy, maxRedirects: run.first.maxRedirects,
                    scope: .connection)
        }

        mutating func setAttempts(_ slot: Int, _ sequence: AttemptStateMachine, _ run: inout Run) {
            if alone { run.first = sequence } else { attempts[slot] = sequence }
        }

        /// The download carries on without the calling lane after its response was another version of the file:
        /// while another lane is left, which either gets the known version (and the download goes on) or meets the
        /// other one too and retires in turn; the last lane restarts the download. The others retire as they go
        /// idle (``laneIdle(segments:running:now:)``). Returns whether this is the first such response (nil: the
        /// last lane).
        mutating func keepOneVersion() -> Bool? {
            guard activeLanes > 1 else { return nil }
            activeLanes -= 1
            let first = !versionsDiffer
            versionsDiffer = true
            scheduler.versionsDiffer = true
            return first
        }

        /// Retires the calling lane if the download can go on without it: another lane is still working and one is
        /// receiving now.
        mutating func retire(running: [Int: LaneScheduler.Running], except slot: Int) -> Bool {
            guard activeLanes > 1, running.contains(where: { $0.key != slot && $0.value.receiving }) else {
                return false
            }
            activeLanes -= 1
            return true
        }
    }

    enum Stop: Sendable {
        case restart(RestartReason)
        case failure(DownloadError)
    }

    /// Whether the lanes are stopping.
    var stopping: Bool { transfer?.stop != nil }

    /// Stops every lane for `stop` (the first reason stands).
    mutating func halt(_ stop: Stop) {
        inTransfer("a stop of the lanes") { _, transfer in transfer.halt(stop) }
    }

    /// What an idle lane does.
    enum LaneWork: Sendable, Equatable {
        /// Fetch this segment (unowned and unfinished).
        case fetch(Int)
        /// Cut segment `victim` at `at`, report the new segment (``stole(_:)``) and fetch it; replace the victim's
        /// connection if asked.
        case steal(victim: Int, at: Int64, replaceVictim: Bool)
        /// Nothing worth taking now: wait a moment in case a connection turns slow (the end game).
        case wait
        /// The lane is done (nothing left, or the lanes are stopping).
        case stop
        /// The lane retires: connections answered with different versions and another lane is left.
        case retire
    }

    /// The work for an idle lane, given the segments as written and the requests running.
    mutating func laneIdle(segments: [Segment], running: [Int: LaneScheduler.Running], now: Double) -> LaneWork {
        inTransfer("an idle lane") { _, transfer in
            guard transfer.stop == nil, !transfer.completedWhole else { return .stop }
            if transfer.versionsDiffer, transfer.activeLanes > 1 {
                transfer.activeLanes -= 1
                return .retire
            }
            switch transfer.scheduler.claim(segments: segments, running: running, now: now) {
            case .segment(let slot):
                return .fetch(slot)
            case .steal(let victim, let at, let replaceVictim):
                return .steal(victim: victim, at: at, replaceVictim: replaceVictim)
            case .none:
                return transfer.lanes == 1 || segments.allSatisfy(\.isComplete) ? .stop : .wait
            }
        } ?? .stop
    }

    /// Each receiving request's speed as last sampled (for traces).
    var laneSpeeds: [Int: Double] { transfer?.scheduler.speeds ?? [:] }

    /// The executor split a segment for a steal, and the calling lane fetches the new segment `slot`.
    mutating func stole(_ slot: Int) {
        inTransfer("a steal") { _, transfer in transfer.scheduler.own(slot) }
    }

    /// The lane is done with `slot`.
    mutating func released(_ slot: Int) {
        inTransfer("a released segment") { _, transfer in
            transfer.scheduler.release(slot)
            // On one connection the sequence is the download's own (``Run/first``), kept across segments.
            if !transfer.alone { transfer.attempts[slot] = nil }
        }
    }

    /// The next request for segment `slot` of `bounds` (where it is written to and where it ends; nil: unknown),
    /// and the URL to ask. Nil: the segment is done, or the lanes are stopping. `known`: the validators the
    /// download has; `overlapWindow`: what a resume without a validator re-fetches to compare.
    mutating func nextRequest(
        _ slot: Int, written: Int64, end: Int64?, known: Validators?, overlapWindow: Int64
    ) -> (plan: RequestPlan, url: URL)? {
        inTransfer("a lane's next request") { run, transfer -> (plan: RequestPlan, url: URL)? in
            guard transfer.stop == nil, !transfer.completedWhole else { return nil }
            if let end, written >= end { return nil }
            let plan: RequestPlan
            if transfer.alone {
                // As a resume does: a range from where the file got to, with If-Range or (no strong validator) an
                // overlap to compare; no end.
                plan = ResumePolicy.plan(offset: written, known: known, overlapWindow: overlapWindow)
            } else {
                // Several segments are only ever asked for with an end and If-Range; without them the bytes cannot
                // be checked: every lane stops and the download restarts.
                guard let end, let ifRange = known?.ifRange else {
                    transfer.halt(.restart(.unverifiableSegments))
                    return nil
                }
                plan = RequestPlan(rangeStart: written, resumeOffset: written, ifRange: ifRange, rangeEnd: end)
            }
            return (plan, transfer.attempts(slot, run).url)
        } ?? nil
    }

    /// Whether the transfer is the download's one segment on one connection (N = 1).
    var alone: Bool { transfer?.alone ?? false }

    /// What one lane's request came to, as its executor saw it.
    struct LaneReport: Sendable {
        var attempt: AttemptReport
        /// The files could not be prepared for the body (a state write, a restart in place).
        var decisionError: DownloadError?
        /// The body's sink was attached (false: the head was refused, or a restart in place was not allowed).
        var sinkAttached = true
        /// The sink stopped for the run's sake (a halt, a broken store, a failed checkpoint), not of its own.
        var stoppedForRun = false
    }

    /// What a lane does after a request.
    enum LaneAction: Sendable, Equatable {
        /// Ask again for what is left of the segment (done, or shrunk by a split: the executor re-reads its end).
        case again
        /// A redirect was followed on the download's one connection: say so, and ask again.
        case redirected(URL)
        /// The segment is done.
        case segmentDone
        /// The lane retires and says why (`notice`; nil: said already); the others carry on.
        case retire(notice: String?)
        /// The lanes are stopping (``stopping``): the transfer's outcome says why.
        case stop
        /// Say that the lane retries, and wait (`checkpoint`: a durable checkpoint first, on one connection).
        case wait(seconds: Double, attempt: Int, of: Int, reason: String, checkpoint: Bool)
        /// The run is being interrupted.
        case interrupted
    }

    /// The decision after a request of segment `slot` ended as `report` says; `running` are the lanes' requests
    /// in flight (a lane may retire only while another is receiving).
    mutating func laneRequestEnded(
        _ slot: Int, _ report: LaneReport, running: [Int: LaneScheduler.Running], now: Int64, jitter: Double
    ) -> LaneAction {
        inTransfer("the end of a lane's request") { run, transfer -> LaneAction in
            // A response with the download's version, even one that ends after a stop: with another version seen,
            // the connections disagreed (the file did not change for everyone).
            if case .accept = report.attempt.verdict, !transfer.alone { transfer.acceptedKnownVersion = true }
            guard transfer.stop == nil else { return .stop }
            if let error = report.decisionError {
                transfer.halt(.failure(error))
                return .stop
            }
            switch report.attempt.verdict {
            case .restartWithBody where transfer.alone:
                // Restarted in place, the body kept from byte 0; without a sink, the restarts are used up.
                if !report.sinkAttached {
                    transfer.halt(.failure(run.unstable))
                    return .stop
                }
            case .restart(let why), .restartWithBody(let why, _):
                if Self.isAnotherVersion(why), let first = transfer.keepOneVersion() {
                    return .retire(
                        notice: first
                            ? "\(why) on one connection: the server's connections may answer with different versions "
                                + "(edges of a CDN?); keeping only the bytes of the version this download has and "
                                + "continuing with one connection" : nil)
                }
                transfer.halt(.restart(why))
                return .stop
            default:
                break
            }
            if report.stoppedForRun { return .again }
            var sequence = transfer.attempts(slot, run)
            let action = sequence.attemptEnded(report.attempt, now: now, jitter: jitter)
            transfer.setAttempts(slot, sequence, &run)
            switch action {
            case .complete where report.attempt.end == nil:
                transfer.completedWhole = true  // an unknown length: the response's end is the file's
                return .segmentDone
            case .follow(let url) where transfer.alone:
                return .redirected(url)
            case .requestAgain, .follow, .complete:
                return .again
            case .restart(let why):
                transfer.halt(.restart(why))
                return .stop
            case .interrupted:
                return .interrupted
            case .fail(let error):
                // Out of retries (or refused) while other connections bring the file: this one is not needed.
                let refusedOrSpent =
                    error.code == .retriesExhausted || error.code == .network
                    || error.httpStatus.map(Self.isRefusal) == true
                if refusedOrSpent, transfer.retire(running: running, except: slot) {
                    return .retire(notice: "\(error.message); continuing with \(transfer.activeLanes) connection(s)")
                }
                transfer.halt(.failure(error))
                return .stop
            case .wait(let seconds, let attempt, let of, let reason):
                // A server that refuses extra connections (429, 503; nginx limit_conn) gets fewer of them.
                if case .retry(let status, _) = report.attempt.verdict, Self.isRefusal(status),
                    transfer.retire(running: running, except: slot)
                {
                    return .retire(
                        notice: "the server refused an extra connection (\(reason)); continuing with "
                            + "\(transfer.activeLanes)")
                }
                return .wait(seconds: seconds, attempt: attempt, of: of, reason: reason, checkpoint: transfer.alone)
            }
        } ?? .stop
    }

    /// One sample of the receiving requests (see ``LaneScheduler/sample(segments:running:now:)``): the slots
    /// whose connections are to be replaced.
    mutating func sample(segments: [Segment], running: [Int: LaneScheduler.Running], now: Double) -> [Int] {
        inTransfer("a sample of the lanes") { _, transfer in
            transfer.scheduler.sample(segments: segments, running: running, now: now)
        } ?? []
    }

    /// A request on `slot` ended (see ``LaneScheduler/requestEnded(_:wholeSpeed:)``).
    mutating func requestEnded(_ slot: Int, wholeSpeed: Double?) {
        inTransfer("the end of a lane's connection") { _, transfer in
            transfer.scheduler.requestEnded(slot, wholeSpeed: wholeSpeed)
        }
    }

    /// Restart reasons that one edge of a CDN with another copy of the file would give.
    static func isAnotherVersion(_ reason: RestartReason) -> Bool {
        switch reason {
        case .etagChanged, .lastModifiedChanged, .lengthChanged, .rangeIgnored: true
        default: false
        }
    }

    /// Statuses with which a server turns away a connection it will not serve now.
    static func isRefusal(_ status: Int) -> Bool { status == 429 || status == 503 }
}

extension RestartReason {
    /// Several segments without a strong validator to send as `If-Range`: their bytes cannot be checked by ranges.
    static let unverifiableSegments = RestartReason.untrustedPartial(
        "the saved segments cannot be checked without a validator; starting over")
}
