/// The decisions of one download above its requests, as a pure state machine: what comes next (the first
/// connection's requests, or a transfer over one lane or several), what a restart from zero costs (the restart
/// budget, and whether the rest of the run stays on one connection), when a restart in place is still allowed.
/// No I/O and no clock: ``DownloadRun`` passes what the part file holds and how a transfer ended, and performs the
/// returned step. The requests' own decisions are ``AttemptStateMachine``'s; the lanes' scheduling is
/// ``LaneScheduler``'s; whether and where to split is ``SplitPolicy``'s. Unit tests: DownloadStateMachineTests.
///
/// The rules:
/// - Until the part file holds bytes or several segments, the first connection asks for the whole file (it names
///   the file, creates the store, decides the split). From then on every request is a transfer's: over several
///   lanes when the file is split (or was just split, or a resumed partial is worth splitting), else one lane.
/// - A restart from zero is counted; more than `maxRestarts` and the download fails as unstable.
/// - After a restart while split: a server that ignored a range, connections that answered with different
///   versions, or a second such restart, keep the rest of the run on one connection.
struct DownloadStateMachine: Sendable {
    /// What the part file holds, as the machine needs it.
    struct Store: Sendable, Equatable {
        var segments: Int
        var written: Int64
    }

    /// What to do next.
    enum Step: Sendable, Equatable {
        /// A request for the whole file on the first connection.
        case firstRequest
        /// The download's segments over several lanes.
        case split
        /// The download's one segment over one lane.
        case alone
    }

    /// What a restart from zero comes to.
    enum RestartStep: Sendable, Equatable {
        /// Start over (the count is taken).
        case restart
        /// Out of restarts: the file kept changing.
        case unstable
    }

    let maxRestarts: Int
    /// Restarts from zero so far (in place or not).
    private(set) var restarts = 0
    /// Why the rest of this run uses one connection, if it does.
    private(set) var splittingFailed: SplitPolicy.Failure?
    private var restartsWhileSplit = 0

    init(maxRestarts: Int) {
        self.maxRestarts = maxRestarts
    }

    /// The next step for a part file in `store` (nil: none yet). `splitNow`: the first response was just split;
    /// `worthSplitting` is asked (once per run, by the caller) only for a resumed partial on one segment.
    func next(store: Store?, splitNow: Bool, worthSplitting: () -> Bool) -> Step {
        guard let store else { return .firstRequest }
        if splitNow || store.segments > 1 { return .split }
        guard store.written > 0 else { return .firstRequest }
        return worthSplitting() ? .split : .alone
    }

    /// A restart from zero for `reason`; `whileSplit`: it ended a transfer over several lanes, whose connections
    /// may have disagreed about the version (`connectionsDisagreed`).
    mutating func restart(_ reason: RestartReason, whileSplit: Bool = false, connectionsDisagreed: Bool = false)
        -> RestartStep
    {
        if whileSplit {
            restartsWhileSplit += 1
            noteSplitFailure(reason, connectionsDisagreed: connectionsDisagreed)
        }
        return take()
    }

    /// A transfer over several lanes ended complete, but its connections disagreed about the version.
    mutating func splitEnded(connectionsDisagreed: Bool) {
        if connectionsDisagreed { splittingFailed = .versionsDiffer }
    }

    /// A restart in place (a 200 with the whole file to the one connection's ranged request): whether one is left.
    mutating func restartInPlace() -> Bool {
        take() == .restart
    }

    /// Whether the restarts are used up (a response accepted after too many).
    var exhausted: Bool { restarts > maxRestarts }

    private mutating func take() -> RestartStep {
        restarts += 1
        return restarts > maxRestarts ? .unstable : .restart
    }

    private mutating func noteSplitFailure(_ reason: RestartReason, connectionsDisagreed: Bool) {
        if connectionsDisagreed || splittingFailed == .versionsDiffer {
            splittingFailed = .versionsDiffer  // kept: one connection from now on
        } else if reason == .rangeIgnored {
            splittingFailed = .rangesIgnored
        } else if restartsWhileSplit >= 2 {
            splittingFailed = .restarted
        }
    }
}
