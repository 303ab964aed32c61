import Foundation

/// The decisions of one download, as one pure state machine with an explicit ``State`` and ``Action``, in the way
/// of async-http-client's connection pool: its executors report what happened (a request for the whole file
/// ended, a lane became idle, a lane's request ended, a transfer ended) and perform the returned action. It does
/// no I/O and has no clock of its own (the time and the jitter are passed in), so every rule is a unit test with
/// no sockets (DownloadStateMachineTests).
///
/// One executor drives it, under one lock (``DownloadRun/core``): ``DownloadRun`` performs the download's steps
/// (the first connection's requests, the transfer, restarts, the end) and its lanes' work (which segment an idle
/// lane takes, what each lane's requests come to). What it is made of:
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
/// The lanes of a running transfer have their own machine (``TransferStateMachine``), carried in the
/// ``State/transferring(_:_:)`` state; their events pass through this one, which checks that a transfer runs.
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
    /// Nil once the transfer runs; the failure (a ``misfit(_:)``) when none was asked for, to be acted on instead.
    @discardableResult
    mutating func transferStarted(lanes: Int, split: Bool, rateLimited: Bool, pieceSize: Int64, minimumSplitSize: Int64)
        -> Action?
    {
        guard case .preparingTransfer(let run, split) = state, lanes >= 1 else {
            return misfit("the start of a transfer")
        }
        state = .transferring(
            run,
            Transfer(
                lanes: lanes, split: split,
                scheduler: LaneScheduler(
                    lanes: lanes, rateLimited: rateLimited, pieceSize: pieceSize, minimumSplitSize: minimumSplitSize),
                activeLanes: lanes))
        return nil
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
        guard case .transferring(_, let transfer) = state, transfer.alone else {
            // Only the one connection's lane keeps a 200's body from its first byte; several lanes restart whole.
            _ = misfit("a restart in place")
            return false
        }
        let maxRestarts = maxRestarts
        return inTransfer("a restart in place") { run, _ in run.takeRestart(maxRestarts: maxRestarts) } ?? false
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

    // MARK: The transfer's lanes (``TransferStateMachine``)

    typealias Transfer = TransferStateMachine
    typealias Stop = TransferStateMachine.Stop
    typealias LaneWork = TransferStateMachine.LaneWork
    typealias LaneReport = TransferStateMachine.LaneReport
    typealias LaneAction = TransferStateMachine.LaneAction

    /// Whether the lanes are stopping.
    var stopping: Bool { transfer?.stop != nil }
    /// Whether the transfer is the download's one segment on one connection (N = 1).
    var alone: Bool { transfer?.alone ?? false }
    /// Each receiving request's speed as last sampled (for traces).
    var laneSpeeds: [Int: Double] { transfer?.scheduler.speeds ?? [:] }

    /// See ``TransferStateMachine/halt(_:)``.
    mutating func halt(_ stop: Stop) {
        inTransfer("a stop of the lanes") { _, transfer in transfer.halt(stop) }
    }

    /// See ``TransferStateMachine/laneIdle(segments:running:now:)``.
    mutating func laneIdle(segments: [Segment], running: [Int: LaneScheduler.Running], now: Double) -> LaneWork {
        inTransfer("an idle lane") { _, transfer in
            transfer.laneIdle(segments: segments, running: running, now: now)
        } ?? .stop
    }

    /// See ``TransferStateMachine/stole(_:)``.
    mutating func stole(_ slot: Int) {
        inTransfer("a steal") { _, transfer in transfer.stole(slot) }
    }

    /// See ``TransferStateMachine/released(_:)``.
    mutating func released(_ slot: Int) {
        inTransfer("a released segment") { _, transfer in transfer.released(slot) }
    }

    /// See ``TransferStateMachine/nextRequest(_:written:end:known:overlapWindow:first:)``.
    mutating func nextRequest(
        _ slot: Int, written: Int64, end: Int64?, known: Validators?, overlapWindow: Int64, source: URL? = nil
    ) -> (plan: RequestPlan, url: URL)? {
        inTransfer("a lane's next request") { run, transfer in
            transfer.nextRequest(
                slot, written: written, end: end, known: known, overlapWindow: overlapWindow, first: run.first,
                source: source)
        } ?? nil
    }


    /// See ``TransferStateMachine/laneRequestEnded(_:_:running:now:jitter:first:unstable:)``: on one connection the
    /// lane's request sequence is the download's own (``Run/first``).
    mutating func laneRequestEnded(
        _ slot: Int, _ report: LaneReport, running: [Int: LaneScheduler.Running], now: Int64, jitter: Double
    ) -> LaneAction {
        inTransfer("the end of a lane's request") { run, transfer in
            let unstable = run.unstable
            return transfer.laneRequestEnded(
                slot, report, running: running, now: now, jitter: jitter, first: &run.first, unstable: unstable)
        } ?? .stop
    }

    /// See ``TransferStateMachine/sample(segments:running:now:)``.
    mutating func sample(segments: [Segment], running: [Int: LaneScheduler.Running], now: Double) -> [Int] {
        inTransfer("a sample of the lanes") { _, transfer in
            transfer.sample(segments: segments, running: running, now: now)
        } ?? []
    }

    /// See ``TransferStateMachine/requestEnded(_:wholeSpeed:)``.
    mutating func requestEnded(_ slot: Int, wholeSpeed: Double?) {
        inTransfer("the end of a lane's connection") { _, transfer in
            transfer.requestEnded(slot, wholeSpeed: wholeSpeed)
        }
    }
}

extension RestartReason {
    /// Several segments without a strong validator to send as `If-Range`: their bytes cannot be checked by ranges.
    static let unverifiableSegments = RestartReason.untrustedPartial(
        "the saved segments cannot be checked without a validator; starting over")
}
