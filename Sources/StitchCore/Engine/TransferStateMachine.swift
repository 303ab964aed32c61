import Foundation

/// The lanes of one transfer of a download, as a pure state machine: which segment an idle lane takes or steals,
/// the plan of each request, what each request's end comes to. ``DownloadStateMachine`` carries it while a
/// transfer runs (its ``DownloadStateMachine/State/transferring(_:_:)`` state) and passes the lanes' events to
/// it; on one connection the lane's request sequence is the download's own (passed in as `first`). Unit tests:
/// DownloadStateMachineTests (through the download's machine, as the executor drives it).
///
/// The rules of a lane's request (see ``laneRequestEnded(_:_:running:now:jitter:first:unstable:)``):
/// - Once the transfer is stopping (a restart, a failure), nothing else happens.
/// - Files that could not be prepared for the body end the download.
/// - A verdict that the kept bytes cannot be trusted (a 200 to a range, a changed validator, a bad
///   `Content-Range`) stops every lane and the download restarts — unless another lane is left and the response
///   looked like another edge's version of the file: then the lane retires and the rest goes over one connection.
///   A download on one connection restarts in place on a 200 instead (the body is kept from byte 0); out of
///   restarts, it fails as unstable.
/// - Everything else is the lane's ``AttemptStateMachine``'s, except that a lane refused by the server (429, 503)
///   or out of retries retires while another lane is receiving.
struct TransferStateMachine: Sendable {
    let lanes: Int
    let split: Bool
    /// Which lane takes what, and which connections are replaced.
    var scheduler: LaneScheduler
    /// Lanes still working (not retired).
    var activeLanes: Int
    /// Why every lane stops, once one decided so.
    var stop: Stop?
    /// Each segment's request sequence (a lane's; on one connection the download's, passed in as `first`).
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

    /// The request sequence of segment `slot`: on one connection the download's own, else the lane's (from
    /// `source`, a mirror's URL, or the download's).
    private func attempts(
        _ slot: Int, first: AttemptStateMachine, source: URL? = nil, forRequest: Bool = false
    ) -> AttemptStateMachine {
        if alone { return first }
        // For a new request: a sequence begun at another source (a mirror dropped since) is not this request's.
        if let sequence = attempts[slot], !forRequest || sequence.startURL == source ?? first.startURL {
            return sequence
        }
        return AttemptStateMachine(
            startURL: source ?? first.startURL, policy: first.policy, maxRedirects: first.maxRedirects,
            scope: .connection)
    }


    private mutating func setAttempts(_ slot: Int, _ sequence: AttemptStateMachine, first: inout AttemptStateMachine) {
        if alone { first = sequence } else { attempts[slot] = sequence }
    }

    /// The download carries on without the calling lane after its response was another version of the file:
    /// while another lane is left, which either gets the known version (and the download goes on) or meets the
    /// other one too and retires in turn; the last lane restarts the download. The others retire as they go
    /// idle (``laneIdle(segments:running:now:)``). Returns whether this is the first such response (nil: the
    /// last lane).
    private mutating func keepOneVersion() -> Bool? {
        guard activeLanes > 1 else { return nil }
        activeLanes -= 1
        let first = !versionsDiffer
        versionsDiffer = true
        scheduler.versionsDiffer = true
        return first
    }

    /// Retires the calling lane if the download can go on without it: another lane is still working and one is
    /// receiving now.
    private mutating func retire(running: [Int: LaneScheduler.Running], except slot: Int) -> Bool {
        guard activeLanes > 1, running.contains(where: { $0.key != slot && $0.value.receiving }) else {
            return false
        }
        activeLanes -= 1
        return true
    }

    enum Stop: Sendable {
        case restart(RestartReason)
        case failure(DownloadError)
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
        guard stop == nil, !completedWhole else { return .stop }
        if versionsDiffer, activeLanes > 1 {
            activeLanes -= 1
            return .retire
        }
        switch scheduler.claim(segments: segments, running: running, now: now) {
        case .segment(let slot):
            return .fetch(slot)
        case .steal(let victim, let at, let replaceVictim):
            return .steal(victim: victim, at: at, replaceVictim: replaceVictim)
        case .none:
            return lanes == 1 || segments.allSatisfy(\.isComplete) ? .stop : .wait
        }
    }

    /// The executor split a segment for a steal, and the calling lane fetches the new segment `slot`.
    mutating func stole(_ slot: Int) {
        scheduler.own(slot)
    }

    /// The lane is done with `slot`.
    mutating func released(_ slot: Int) {
        scheduler.release(slot)
        // On one connection the sequence is the download's own (passed in as `first`), kept across segments.
        if !alone { attempts[slot] = nil }
    }

    /// The next request for segment `slot` of `bounds` (where it is written to and where it ends; nil: unknown),
    /// and the URL to ask. Nil: the segment is done, or the lanes are stopping. `known`: the validators the
    /// download has; `overlapWindow`: what a resume without a validator re-fetches to compare.
    mutating func nextRequest(
        _ slot: Int, written: Int64, end: Int64?, known: Validators?, overlapWindow: Int64, first: AttemptStateMachine,
        source: URL? = nil
    ) -> (plan: RequestPlan, url: URL)? {
        guard stop == nil, !completedWhole else { return nil }
        if let end, written >= end { return nil }
        let plan: RequestPlan
        if alone {
            // As a resume does: a range from where the file got to, with If-Range or (no strong validator) an
            // overlap to compare; no end.
            plan = ResumePolicy.plan(offset: written, known: known, overlapWindow: overlapWindow)
        } else {
            // Several segments are only ever asked for with an end and If-Range; without them the bytes cannot
            // be checked: every lane stops and the download restarts.
            guard let end, let ifRange = known?.ifRange else {
                halt(.restart(.unverifiableSegments))
                return nil
            }
            plan = RequestPlan(rangeStart: written, resumeOffset: written, ifRange: ifRange, rangeEnd: end)
        }
        let sequence = attempts(slot, first: first, source: source, forRequest: true)
        if !alone { attempts[slot] = sequence }
        return (plan, sequence.url)
    }

    /// What one lane's request came to, as its executor saw it.
    struct LaneReport: Sendable {
        var attempt: AttemptReport
        /// The files could not be prepared for the body (a state write, a restart in place).
        var decisionError: DownloadError?
        /// The body's sink was attached (false: the head was refused, or a restart in place was not allowed).
        var sinkAttached = true
        /// The sink stopped for the run's sake (a halt, a broken store, a failed checkpoint), not of its own.
        var stoppedForRun = false
        /// The request went to a mirror (``MirrorSet``): its trouble drops the mirror, never the download.
        var mirror = false
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
        /// The lane's mirror is dropped for this reason; the lane asks the first source from now on.
        case dropMirror(String)
        /// The lanes are stopping (``stop``): the transfer's outcome says why.
        case stop
        /// Say that the lane retries, and wait (`checkpoint`: a durable checkpoint first, on one connection).
        case wait(seconds: Double, attempt: Int, of: Int, reason: String, checkpoint: Bool)
        /// The run is being interrupted.
        case interrupted
    }

    /// The decision after a request of segment `slot` ended as `report` says; `running` are the lanes' requests
    /// in flight (a lane may retire only while another is receiving).
    mutating func laneRequestEnded(
        _ slot: Int, _ report: LaneReport, running: [Int: LaneScheduler.Running], now: Int64, jitter: Double,
        first: inout AttemptStateMachine, unstable: DownloadError
    ) -> LaneAction {
        // A response with the download's version, even one that ends after a stop: with another version seen,
        // the connections disagreed (the file did not change for everyone).
        if case .accept = report.attempt.verdict, !alone, !report.mirror { acceptedKnownVersion = true }
        guard stop == nil else { return .stop }
        if let error = report.decisionError {
            halt(.failure(error))
            return .stop
        }
        if report.mirror, let why = Self.mirrorDifference(report.attempt.verdict) {
            attempts[slot] = nil  // the lane's next request goes to the first source
            return .dropMirror(why)
        }
        switch report.attempt.verdict {
        case .restartWithBody where alone:
            // Restarted in place, the body kept from byte 0; without a sink, the restarts are used up.
            if !report.sinkAttached {
                halt(.failure(unstable))
                return .stop
            }
        case .restart(let why), .restartWithBody(let why, _):
            if Self.isAnotherVersion(why), let isFirst = keepOneVersion() {
                return .retire(
                    notice: isFirst
                        ? "\(why) on one connection: the server's connections may answer with different versions "
                            + "(edges of a CDN?); keeping only the bytes of the version this download has and "
                            + "continuing with one connection" : nil)
            }
            halt(.restart(why))
            return .stop
        default:
            break
        }
        if report.stoppedForRun { return .again }
        var sequence = attempts(slot, first: first)
        let action = sequence.attemptEnded(report.attempt, now: now, jitter: jitter)
        setAttempts(slot, sequence, first: &first)
        switch action {
        case .complete where report.attempt.end == nil:
            completedWhole = true  // an unknown length: the response's end is the file's
            return .segmentDone
        case .follow(let url) where alone:
            return .redirected(url)
        case .requestAgain, .follow, .complete:
            return .again
        case .restart(let why):
            // (A mirror's body that failed its own digest is in the file: the download starts over.)
            halt(.restart(why))
            return .stop
        case .interrupted:
            return .interrupted
        case .fail(let error) where report.mirror && error.code != .io:
            // (A local write failure is the download's, whichever server the bytes came from.)
            attempts[slot] = nil
            return .dropMirror(error.message)
        case .fail(let error):
            // Out of retries (or refused) while other connections bring the file: this one is not needed.
            let refusedOrSpent =
                error.code == .retriesExhausted || error.code == .network
                || error.httpStatus.map(Self.isRefusal) == true
            if refusedOrSpent, retire(running: running, except: slot) {
                return .retire(notice: "\(error.message); continuing with \(activeLanes) connection(s)")
            }
            halt(.failure(error))
            return .stop
        case .wait(let seconds, let attempt, let of, let reason):
            // A server that refuses extra connections (429, 503; nginx limit_conn) gets fewer of them.
            // (Not for a mirror's refusal: the first server's connections are not the ones refused.)
            if case .retry(let status, _) = report.attempt.verdict, Self.isRefusal(status), !report.mirror,
                retire(running: running, except: slot)
            {
                return .retire(
                    notice: "the server refused an extra connection (\(reason)); continuing with "
                        + "\(activeLanes)")
            }
            return .wait(seconds: seconds, attempt: attempt, of: of, reason: reason, checkpoint: alone)
        }
    }

    /// One sample of the receiving requests (see ``LaneScheduler/sample(segments:running:now:)``): the slots
    /// whose connections are to be replaced.
    mutating func sample(segments: [Segment], running: [Int: LaneScheduler.Running], now: Double) -> [Int] {
        scheduler.sample(segments: segments, running: running, now: now)
    }

    /// A request on `slot` ended (see ``LaneScheduler/requestEnded(_:wholeSpeed:)``).
    mutating func requestEnded(_ slot: Int, wholeSpeed: Double?) {
        scheduler.requestEnded(slot, wholeSpeed: wholeSpeed)
    }

    /// Restart reasons that one edge of a CDN with another copy of the file would give.
    static func isAnotherVersion(_ reason: RestartReason) -> Bool {
        switch reason {
        case .etagChanged, .lastModifiedChanged, .lengthChanged, .digestChanged, .rangeIgnored: true
        default: false
        }
    }

    /// Why a mirror's response shows it does not serve the proven file (nothing of its body is taken): any
    /// verdict that would restart or refuse the download's own.
    static func mirrorDifference(_ verdict: HeadVerdict?) -> String? {
        switch verdict {
        case .restart(let why)?, .restartWithBody(let why, _)?: why.description
        case .refused(let why)?: why
        default: nil
        }
    }

    /// Statuses with which a server turns away a connection it will not serve now.
    static func isRefusal(_ status: Int) -> Bool { status == 429 || status == 503 }
}
