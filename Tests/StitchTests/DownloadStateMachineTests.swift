import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

/// The download's state machine (``DownloadStateMachine``) without sockets, files or a clock: its executors'
/// reports go in, actions come out. The rules of the developers' guide that decide what happens to bytes are
/// here as cases of the machine: a file is finished only when every segment is; progress counts only what the
/// store holds; a resume happens only on evidence and anything else restarts from zero, said plainly, never
/// spliced; a failing disk ends the download with the partial kept.
@Suite struct DownloadStateMachineTests {
    typealias Machine = DownloadStateMachine
    typealias Store = DownloadStateMachine.Store
    static let start = URL(string: "http://example.test/file.bin")!
    static let mib: Int64 = 1 << 20
    static let validators = Validators(
        etag: "\"v\"", lastModified: nil, date: nil, totalLength: 64 * mib, acceptRanges: true)

    static func machine(maxRestarts: Int = 3, maxRetries: Int = 5) -> Machine {
        var retry = RetryPolicy()
        retry.maxRetries = maxRetries
        return Machine(startURL: start, retry: retry, maxRedirects: 3, maxRestarts: maxRestarts)
    }

    static func report(
        _ verdict: HeadVerdict? = .accept(bodyStart: 0, validators: validators),
        _ result: Result<Void, TransportError> = .success(()), sink: AttemptReport.SinkOutcome = .none,
        written: Int64 = 64 * mib, end: Int64? = 64 * mib, saved: Int64 = 0, durable: Int64 = 0
    ) -> AttemptReport {
        AttemptReport(verdict: verdict, result: result, sink: sink, written: written, end: end, saved: saved, durable: durable)
    }

    /// What a download action is, in a form tests compare.
    static func describe(_ action: Machine.Action) -> String {
        switch action {
        case .requestWhole(let url): return "request \(url.absoluteString)"
        case .considerSplit: return "consider split"
        case .transfer(let split): return split ? "transfer split" : "transfer alone"
        case .redirected(let url): return "redirected \(url.absoluteString)"
        case .restart(let reason): return "restart: \(reason)"
        case .wait(let seconds, let attempt, let of, let reason): return "wait \(seconds) (\(attempt)/\(of)): \(reason)"
        case .finish: return "finish"
        case .fail(let error): return "fail \(error.code): \(error.message)"
        case .interrupted: return "interrupted"
        }
    }

    static func describe(_ action: Machine.LaneAction) -> String {
        switch action {
        case .again: return "again"
        case .redirected(let url): return "redirected \(url.absoluteString)"
        case .segmentDone: return "segment done"
        case .retire(let notice): return "retire" + (notice.map { ": \($0)" } ?? "")
        case .dropMirror(let why): return "drop mirror: \(why)"
        case .stop: return "stop"
        case .wait(let seconds, let attempt, let of, let reason, let checkpoint):
            return "wait \(seconds) (\(attempt)/\(of)): \(reason)" + (checkpoint ? " +checkpoint" : "")
        case .interrupted: return "interrupted"
        }
    }

    static func first(_ machine: inout Machine, _ report: AttemptReport, store: Store?, splitNow: Bool = false) -> String {
        describe(machine.firstRequestEnded(report, store: store, splitNow: splitNow, now: 1_700_000_000, jitter: 0))
    }

    static func lane(
        _ machine: inout Machine, _ slot: Int, _ report: AttemptReport, decisionError: DownloadError? = nil,
        sinkAttached: Bool = true, receiving: [Int] = []
    ) -> String {
        let running = Dictionary(
            uniqueKeysWithValues: receiving.map { ($0, LaneScheduler.Running(startedAt: 0, resumeOffset: 0, receiving: true)) })
        return describe(
            machine.laneRequestEnded(
                slot,
                .init(attempt: report, decisionError: decisionError, sinkAttached: sinkAttached),
                running: running, now: 1_700_000_000, jitter: 0))
    }

    /// Four segments of 16 MiB, each written up to `written[i]` MiB past its start.
    static func segments(_ written: [Int64] = [0, 0, 0, 0]) -> [Segment] {
        written.enumerated().map { index, done in
            Segment(start: Int64(index) * 16 * mib, end: Int64(index + 1) * 16 * mib, durable: (Int64(index) * 16 + done) * mib)
        }
    }

    /// A machine driven to a transfer over `lanes` lanes of a split part file, as the executor drives it.
    static func split(lanes: Int = 4, maxRestarts: Int = 3, maxRetries: Int = 5) -> Machine {
        var machine = Self.machine(maxRestarts: maxRestarts, maxRetries: maxRetries)
        startSplit(&machine, lanes: lanes)
        return machine
    }

    /// From a state that asks for the next step: a part file of several segments goes over `lanes` lanes.
    static func startSplit(_ machine: inout Machine, lanes: Int) {
        #expect(describe(machine.next(store: Store(segments: 4, written: 0))) == "transfer split")
        machine.transferStarted(lanes: lanes, split: true, rateLimited: false, pieceSize: mib, minimumSplitSize: mib)
        #expect(machine.phase == .transferring(lanes: lanes, split: true))
    }

    /// A machine driven to a transfer of a resumed partial over one connection.
    static func alone(maxRestarts: Int = 3) -> Machine {
        var machine = Self.machine(maxRestarts: maxRestarts)
        #expect(describe(machine.next(store: Store(segments: 1, written: 10))) == "consider split")
        #expect(describe(machine.splitConsidered(false)) == "transfer alone")
        machine.transferStarted(lanes: 1, split: false, rateLimited: false, pieceSize: mib, minimumSplitSize: mib)
        #expect(machine.phase == .transferring(lanes: 1, split: false))
        return machine
    }

    /// What an idle lane does; `young`: segments whose requests started just now (too young to judge).
    static func idle(_ machine: inout Machine, _ segments: [Segment], young: [Int] = []) -> Machine.LaneWork {
        let running = Dictionary(
            uniqueKeysWithValues: young.map { ($0, LaneScheduler.Running(startedAt: 0, resumeOffset: 0, receiving: true)) })
        return machine.laneIdle(segments: segments, running: running, now: 0)
    }

    static func ask(
        _ machine: inout Machine, _ slot: Int, written: Int64, end: Int64?, known: Validators?, overlapWindow: Int64
    ) -> (plan: RequestPlan, url: URL)? {
        machine.nextRequest(slot, written: written, end: end, known: known, overlapWindow: overlapWindow)
    }

    static func restartInPlace(_ machine: inout Machine) -> Bool { machine.restartInPlace() }

    /// A lane's request with the download's version, cut short at a split point.
    static func accepted(_ machine: inout Machine, _ slot: Int) -> String {
        lane(&machine, slot, report(sink: .reachedEnd, written: mib, end: mib))
    }

    // MARK: The download's steps

    /// Nothing kept: the whole file on the first connection. Several segments: lanes (or, without a validator to
    /// check them with, a restart). Bytes on one segment: asked once whether to split, then one lane.
    @Test func nextStep() {
        func first(_ store: Store?, splitNow: Bool = false) -> (String, Machine.Phase) {
            var machine = Self.machine()
            #expect(machine.phase == .opening)
            return (Self.describe(machine.next(store: store, splitNow: splitNow)), machine.phase)
        }
        #expect(first(nil) == ("request \(Self.start)", .firstRequest))
        #expect(first(Store(segments: 1, written: 0)) == ("request \(Self.start)", .firstRequest))
        #expect(first(Store(segments: 1, written: 0), splitNow: true) == ("transfer split", .preparingTransfer))
        #expect(first(Store(segments: 4, written: 0)) == ("transfer split", .preparingTransfer))
        #expect(first(Store(segments: 1, written: 10)) == ("consider split", .consideringSplit))

        var machine = Self.machine()
        #expect(Self.describe(machine.next(store: Store(segments: 1, written: 10))) == "consider split")
        #expect(Self.describe(machine.splitConsidered(false)) == "transfer alone")
        machine.transferStarted(lanes: 1, split: false, rateLimited: false, pieceSize: Self.mib, minimumSplitSize: Self.mib)
        machine.halt(.restart(.lengthChanged(old: 1, new: 2)))
        #expect(Self.describe(machine.transferEnded(allComplete: false)).hasPrefix("restart: "))
        // Asked once per run.
        #expect(Self.describe(machine.next(store: Store(segments: 1, written: 10))) == "transfer alone")
        #expect(machine.restarts == 1)

        // After splitting failed in this run (here: a range ignored), a partial on one segment is not considered
        // for a split again: it continues on one connection.
        var failed = Self.split()
        failed.halt(.restart(.rangeIgnored))
        #expect(Self.describe(failed.transferEnded(allComplete: false)).hasPrefix("restart: "))
        #expect(failed.splittingFailed == .rangesIgnored)
        #expect(Self.describe(failed.next(store: Store(segments: 1, written: 10))) == "transfer alone")

        var untrusting = Self.machine()
        let untrusted = untrusting.next(store: Store(segments: 4, written: 5, canCheckRanges: false))
        #expect(Self.describe(untrusted).hasPrefix("restart: "), "\(Self.describe(untrusted))")
        #expect(untrusting.restarts == 1 && untrusting.phase == .betweenSteps)
    }

    /// A first request whose response the probe split goes over lanes; a partial found once the response named
    /// the file is resumed (with a fresh redirect chain); cancellation wins over anything the report says.
    @Test func firstRequestEnds() {
        /// A machine whose first connection asks for the whole file.
        func asking() -> Machine {
            var machine = Self.machine()
            #expect(Self.describe(machine.next(store: nil)) == "request \(Self.start)")
            return machine
        }
        var probed = asking()
        let split = Self.first(&probed, Self.report(written: 3 * Self.mib), store: Store(segments: 4, written: 3), splitNow: true)
        #expect(split == "transfer split")

        var machine = asking()
        let redirected = Self.first(&machine, Self.report(.redirect(location: "/b")), store: nil)
        #expect(redirected == "redirected http://example.test/b")
        #expect(machine.phase == .betweenSteps)
        #expect(Self.describe(machine.next(store: nil)) == "request http://example.test/b")
        let resumed = machine.firstRequestEnded(
            Self.report(), store: Store(segments: 1, written: 10), resumeSaved: true, now: 0, jitter: 0)
        #expect(Self.describe(resumed) == "consider split")
        #expect(machine.first.url == Self.start)

        var cancelledMachine = asking()
        let cancelled = cancelledMachine.firstRequestEnded(Self.report(), store: nil, cancelled: true, now: 0, jitter: 0)
        #expect(Self.describe(cancelled) == "interrupted")
        #expect(cancelledMachine.phase == .interrupted)

        var finished = asking()
        #expect(Self.first(&finished, Self.report(), store: Store(segments: 1, written: 64)) == "finish")
        #expect(finished.phase == .finishing)
    }

    /// Retries wait on the injected clock (the delay is the policy's, with the jitter passed in) and ask the start
    /// URL again; what is saved by then decides the next step.
    @Test func firstRequestRetries() {
        var machine = Self.machine()
        _ = machine.next(store: nil)
        _ = Self.first(&machine, Self.report(.redirect(location: "/b")), store: nil)
        #expect(Self.describe(machine.next(store: nil)) == "request http://example.test/b")
        let wait = Self.first(&machine, Self.report(.retry(status: 503, retryAfter: nil)), store: nil)
        #expect(wait == "wait 0.5 (1/5): HTTP 503 Service Unavailable")
        #expect(machine.phase == .waiting)
        #expect(Self.describe(machine.next(store: nil)) == "request \(Self.start)")
        // A body that ended early with bytes saved continues on one lane, not with the whole file again.
        let early = Self.first(
            &machine, Self.report(.accept(bodyStart: 0, validators: Self.validators), .failure(.init(.partialBody, "cut")), written: Self.mib, saved: Self.mib),
            store: Store(segments: 1, written: Self.mib))
        #expect(early.hasPrefix("wait "), "\(early)")
        #expect(Self.describe(machine.next(store: Store(segments: 1, written: Self.mib))) == "consider split")
    }

    /// More restarts than allowed (in place or not, whichever connection met them) and the download fails as
    /// unstable.
    @Test func restartBudget() {
        var machine = Self.machine(maxRestarts: 2)
        _ = machine.next(store: nil)
        #expect(Self.first(&machine, Self.report(.restart(.rangeIgnored)), store: nil).hasPrefix("restart: "))
        #expect(Self.describe(machine.next(store: Store(segments: 1, written: 10))) == "consider split")
        #expect(Self.describe(machine.splitConsidered(false)) == "transfer alone")
        machine.transferStarted(lanes: 1, split: false, rateLimited: false, pieceSize: Self.mib, minimumSplitSize: Self.mib)
        #expect(Self.restartInPlace(&machine))
        #expect(!machine.exhausted)
        machine.halt(.restart(.rangeNotSatisfiable))
        let third = Self.describe(machine.transferEnded(allComplete: false))
        #expect(third == "fail unstableSource: the file kept changing on the server (2 restarts); try again later")
        #expect(machine.phase == .failed && machine.exhausted)
        // Restarts outside a split never keep the run on one connection.
        #expect(machine.splittingFailed == nil)
    }

    /// An event that does not fit the state is the executor's programming error, and a debug build (a test) stops
    /// at once: a transfer's end with no transfer running, a lane's report before its transfer started, the first
    /// request's end during a transfer, a transfer started as another than the one asked for. The same events in
    /// their order run through.
    @Test func anEventThatDoesNotFitStopsADebugBuild() async {
        await #expect(processExitsWith: .failure) {
            var machine = DownloadStateMachine(startURL: URL(string: "http://example.test/f")!, maxRestarts: 3)
            _ = machine.transferEnded(allComplete: true)
        }
        await #expect(processExitsWith: .failure) {
            var machine = DownloadStateMachine(startURL: URL(string: "http://example.test/f")!, maxRestarts: 3)
            _ = machine.next(store: nil)
            _ = machine.nextRequest(0, written: 0, end: nil, known: nil, overlapWindow: 0)
        }
        await #expect(processExitsWith: .failure) {
            var machine = DownloadStateMachine(startURL: URL(string: "http://example.test/f")!, maxRestarts: 3)
            _ = machine.next(store: .init(segments: 4, written: 0))
            machine.transferStarted(lanes: 4, split: true, rateLimited: false, pieceSize: 1 << 20, minimumSplitSize: 1 << 20)
            let report = AttemptReport(result: .success(()), written: 0, saved: 0, durable: 0)
            _ = machine.firstRequestEnded(report, store: nil, now: 0, jitter: 0)
        }
        await #expect(processExitsWith: .failure) {
            var machine = DownloadStateMachine(startURL: URL(string: "http://example.test/f")!, maxRestarts: 3)
            _ = machine.next(store: .init(segments: 4, written: 0))
            machine.transferStarted(lanes: 1, split: false, rateLimited: false, pieceSize: 1 << 20, minimumSplitSize: 1 << 20)
        }
        await #expect(processExitsWith: .failure) {
            // A restart in place is the one connection's; several lanes restart whole.
            var machine = DownloadStateMachine(startURL: URL(string: "http://example.test/f")!, maxRestarts: 3)
            _ = machine.next(store: .init(segments: 4, written: 0))
            machine.transferStarted(lanes: 4, split: true, rateLimited: false, pieceSize: 1 << 20, minimumSplitSize: 1 << 20)
            _ = machine.restartInPlace()
        }
        await #expect(processExitsWith: .success) {
            var machine = DownloadStateMachine(startURL: URL(string: "http://example.test/f")!, maxRestarts: 3)
            _ = machine.next(store: .init(segments: 4, written: 0))
            let started = machine.transferStarted(
                lanes: 4, split: true, rateLimited: false, pieceSize: 1 << 20, minimumSplitSize: 1 << 20)
            precondition(started == nil)
            _ = machine.nextRequest(0, written: 0, end: nil, known: nil, overlapWindow: 0)
            _ = machine.transferEnded(allComplete: true)
        }
    }

    // MARK: A file is complete before it is finished (rule 1)

    /// A transfer finishes the download only when every segment is written to its end, or a body of unknown
    /// length ended complete. Lanes that stopped with work left are a failure with the partial kept.
    @Test func finishedOnlyWhenEverySegmentIs() {
        var machine = Self.split()
        let unfinished = machine.transferEnded(allComplete: false)
        #expect(Self.describe(unfinished) == "fail protocolViolation: segments left unfinished")
        if case .fail(let error) = unfinished { #expect(error.isResumable) }
        #expect(machine.phase == .failed)

        var complete = Self.split()
        #expect(Self.describe(complete.transferEnded(allComplete: true)) == "finish")

        var unknownLength = Self.alone()
        let done = Self.lane(&unknownLength, 0, Self.report(written: 5000, end: nil))
        #expect(done == "segment done")
        #expect(Self.idle(&unknownLength, [Segment(start: 0, end: nil, durable: 5000)]) == .stop)
        #expect(Self.describe(unknownLength.transferEnded(allComplete: false)) == "finish")
    }

    // MARK: Resume only on evidence (rule 3)

    /// Every verdict that the kept bytes cannot be trusted stops every lane, and the download restarts from zero
    /// with the reason said: a 200 to a range, a changed validator or length, a bad Content-Range, a 416 over an
    /// incomplete file, an overlap that no longer matches. Nothing is asked or kept after it.
    @Test(arguments: [
        HeadVerdict.restartWithBody(.rangeIgnored, validators: validators),
        .restart(.etagChanged(old: "\"v\"", new: "\"w\"")),
        .restart(.lengthChanged(old: 64 << 20, new: 65 << 20)),
        .restart(.contentRangeMismatch("bytes 0-9/64")),
        .restart(.rangeNotSatisfiable),
    ])
    func untrustedBytesRestartEveryLane(_ verdict: HeadVerdict) {
        var machine = Self.split(lanes: 1)
        #expect(Self.idle(&machine, Self.segments()) == .fetch(0))
        #expect(Self.lane(&machine, 0, Self.report(verdict)) == "stop")
        #expect(machine.stopping)
        #expect(Self.ask(&machine, 1, written: 16 * Self.mib, end: 32 * Self.mib, known: Self.validators, overlapWindow: 0) == nil)
        #expect(Self.idle(&machine, Self.segments()) == .stop)
        #expect(Self.lane(&machine, 1, Self.report()) == "stop", "nothing else happens once stopping")
        let end = Self.describe(machine.transferEnded(allComplete: false))
        #expect(end.hasPrefix("restart: "), "\(end)")
        #expect(machine.restarts == 1 && machine.phase == .betweenSteps)
        #expect(Self.describe(machine.next(store: Store(segments: 1, written: 0))) == "request \(Self.start)")
        #expect(machine.phase == .firstRequest)
    }

    /// With other lanes left, only a response that looks like another edge's version of the file (another
    /// validator or length, a 200 to the range) retires its lane; a bad Content-Range or a 416 restarts the
    /// download whatever the other lanes do.
    @Test(arguments: [
        (HeadVerdict.restartWithBody(.rangeIgnored, validators: validators), true),
        (.restart(.etagChanged(old: "\"v\"", new: "\"w\"")), true),
        (.restart(.lastModifiedChanged(old: "a", new: "b")), true),
        (.restart(.lengthChanged(old: 64 << 20, new: 65 << 20)), true),
        (.restart(.contentRangeMismatch("bytes 0-9/64")), false),
        (.restart(.rangeNotSatisfiable), false),
    ])
    func onlyAnotherVersionRetiresALane(_ verdict: HeadVerdict, _ anotherVersion: Bool) {
        var machine = Self.split(lanes: 3)
        let action = Self.lane(&machine, 0, Self.report(verdict), receiving: [1, 2])
        if anotherVersion {
            #expect(action.hasPrefix("retire: "), "\(action)")
            #expect(!machine.stopping)
        } else {
            #expect(action == "stop")
            #expect(Self.describe(machine.transferEnded(allComplete: false)).hasPrefix("restart: "))
        }
    }

    /// Bytes re-fetched to check a resume without a validator that differ from the disk restart the download.
    @Test func overlapMismatchRestarts() {
        var machine = Self.alone()
        #expect(Self.lane(&machine, 0, Self.report(sink: .overlapMismatch(at: 4096))) == "stop")
        #expect(Self.describe(machine.transferEnded(allComplete: false)).hasPrefix("restart: the bytes before offset 4096"))
    }

    /// One connection's request plans: a resume with `If-Range` from where the file got to, or (no strong
    /// validator) an overlap to compare and no `If-Range`. Several segments: exactly the segment's range.
    @Test func requestPlans() {
        var alone = Self.alone()
        let strong = alone.nextRequest(0, written: 1000, end: nil, known: Self.validators, overlapWindow: 64)
        #expect(strong?.plan == RequestPlan(rangeStart: 1000, resumeOffset: 1000, ifRange: "\"v\""))
        let weak = Validators(etag: nil, lastModified: nil, date: nil, totalLength: 5000, acceptRanges: true)
        let overlap = alone.nextRequest(0, written: 1000, end: 5000, known: weak, overlapWindow: 64)
        #expect(overlap?.plan == RequestPlan(rangeStart: 936, resumeOffset: 1000, ifRange: nil))
        #expect(Self.ask(&alone, 0, written: 5000, end: 5000, known: weak, overlapWindow: 64) == nil)

        var split = Self.split()
        let ranged = split.nextRequest(1, written: 17 * Self.mib, end: 32 * Self.mib, known: Self.validators, overlapWindow: 64)
        #expect(ranged?.plan == RequestPlan(rangeStart: 17 * Self.mib, resumeOffset: 17 * Self.mib, ifRange: "\"v\"", rangeEnd: 32 * Self.mib))
        #expect(ranged?.url == Self.start)
        // Several segments without a validator to check them with: every lane stops and the download restarts.
        #expect(Self.ask(&split, 1, written: 17 * Self.mib, end: 32 * Self.mib, known: weak, overlapWindow: 64) == nil)
        #expect(split.stopping)
        #expect(Self.describe(split.transferEnded(allComplete: false)).hasPrefix("restart: the saved segments cannot be checked"))
    }

    /// On one connection a 200 to the range restarts in place (the body kept from byte 0, the restart counted by
    /// the decision); when the restarts were used up the decision attached no sink and the download fails as
    /// unstable, never keeping old bytes.
    @Test func oneConnectionRestartsInPlace() {
        var machine = Self.alone(maxRestarts: 1)
        #expect(Self.restartInPlace(&machine))
        let kept = Self.lane(&machine, 0, Self.report(.restartWithBody(.rangeIgnored, validators: Self.validators)))
        #expect(kept == "again", "the body written from byte 0 to the end: the next request finds the segment done")
        #expect(!machine.stopping)
        #expect(!Self.restartInPlace(&machine))
        let refused = Self.lane(&machine, 0, Self.report(.restartWithBody(.rangeIgnored, validators: Self.validators)), sinkAttached: false)
        #expect(refused == "stop")
        #expect(Self.describe(machine.transferEnded(allComplete: false)).hasPrefix("fail unstableSource"))
    }

    /// Connections answering with another version of the file (CDN edges) while other lanes are left: the lane
    /// retires (said once), the others retire as they go idle, the last one fetches the rest; when it meets
    /// another version too, the download restarts. A split that restarts this way, or completes with
    /// disagreeing connections, keeps the rest of the run on one connection.
    @Test func anotherVersionKeepsOne() {
        var machine = Self.split(lanes: 3)
        for slot in 0..<3 { #expect(Self.idle(&machine, Self.segments()) == .fetch(slot)) }
        #expect(Self.accepted(&machine, 0) == "again")
        let changed = HeadVerdict.restart(.etagChanged(old: "\"v\"", new: "\"w\""))
        let firstRetire = Self.lane(&machine, 1, Self.report(changed))
        #expect(firstRetire.hasPrefix("retire: the file changed on the server (ETag \"v\" → \"w\") on one connection"))
        machine.released(1)
        #expect(Self.idle(&machine, Self.segments()) == .retire, "an idle lane retires")
        #expect(Self.lane(&machine, 2, Self.report(changed)) == "stop", "the last lane restarts")
        #expect(Self.describe(machine.transferEnded(allComplete: false)).hasPrefix("restart: "))
        #expect(machine.splittingFailed == .versionsDiffer)

        var completed = Self.split(lanes: 2)
        #expect(Self.accepted(&completed, 1) == "again")
        #expect(Self.lane(&completed, 0, Self.report(changed)).hasPrefix("retire: "))
        #expect(Self.describe(completed.transferEnded(allComplete: true)) == "finish")
        #expect(completed.splittingFailed == .versionsDiffer)
    }

    /// The lane that had the download's version may report after the last lane met another version and stopped
    /// the transfer: the connections still disagreed, so the rest of the run keeps one connection.
    @Test func disagreementSeenAfterTheStop() {
        var machine = Self.split(lanes: 2)
        let changed = HeadVerdict.restart(.etagChanged(old: "\"v\"", new: "\"w\""))
        #expect(Self.lane(&machine, 1, Self.report(changed), receiving: [0]).hasPrefix("retire: "))
        #expect(Self.lane(&machine, 0, Self.report(changed)) == "stop")
        #expect(Self.accepted(&machine, 0) == "stop", "nothing else happens once stopping")
        _ = machine.transferEnded(allComplete: false)
        #expect(machine.splittingFailed == .versionsDiffer)

        var changedForEveryone = Self.split(lanes: 2)
        _ = Self.lane(&changedForEveryone, 1, Self.report(changed), receiving: [0])
        _ = Self.lane(&changedForEveryone, 0, Self.report(changed))
        _ = changedForEveryone.transferEnded(allComplete: false)
        #expect(changedForEveryone.splittingFailed == nil, "the file changed for every connection: it may split again")
    }

    /// A request the engine cut short itself is asked again at once and never counts as a failure: a replaced
    /// slow connection, or a sink stopped for the run's sake (a retry count that would otherwise run out).
    @Test func requestsCutShortByTheEngineAreNotFailures() {
        var machine = Self.split(lanes: 2, maxRetries: 0)
        let accept = HeadVerdict.accept(bodyStart: 0, validators: Self.validators)
        let cut = Self.report(accept, .failure(.abortedBySink), written: Self.mib, end: 16 * Self.mib)
        for _ in 0..<3 {
            let replaced = Self.lane(
                &machine, 0, Self.report(accept, .failure(.cancelled), sink: .replaced, written: Self.mib, end: 16 * Self.mib))
            #expect(replaced == "again")
            let stopped = machine.laneRequestEnded(0, .init(attempt: cut, stoppedForRun: true), running: [:], now: 0, jitter: 0)
            #expect(stopped == .again)
        }
        #expect(!machine.stopping)
        // Without the engine's own reason the same cut is a failure (no retries here: the download ends).
        #expect(Self.lane(&machine, 0, cut) == "stop")
    }

    /// After restarts while split: a server that ignored a range keeps one connection at once, a changed file may
    /// split again once, a second restart while split keeps one connection.
    @Test func troubleWhileSplit() {
        var machine = Self.split(maxRestarts: 5)
        machine.halt(.restart(.rangeIgnored))
        _ = machine.transferEnded(allComplete: false)
        #expect(machine.splittingFailed == .rangesIgnored)

        var changing = Self.split(maxRestarts: 5)
        changing.halt(.restart(.lengthChanged(old: 1, new: 2)))
        _ = changing.transferEnded(allComplete: false)
        #expect(changing.splittingFailed == nil)
        #expect(Self.describe(changing.next(store: Store(segments: 1, written: 10))) == "consider split")
        #expect(Self.describe(changing.splitConsidered(false)) == "transfer alone")
        changing.transferStarted(lanes: 1, split: false, rateLimited: false, pieceSize: Self.mib, minimumSplitSize: Self.mib)
        changing.halt(.restart(.lengthChanged(old: 2, new: 3)))
        _ = changing.transferEnded(allComplete: false)
        #expect(changing.splittingFailed == nil, "a restart on one connection is not one while split")
        Self.startSplit(&changing, lanes: 4)
        changing.halt(.restart(.lengthChanged(old: 3, new: 4)))
        _ = changing.transferEnded(allComplete: false)
        #expect(changing.splittingFailed == .restarted)
        #expect(changing.restarts == 3)
    }

    // MARK: Progress only for what could not be lost (rule 2)

    /// Giving up offers a rerun only when bytes are durable, whatever was received or written: a rerun resumes
    /// from the durable extent and the written record, never from bytes in flight.
    @Test(arguments: [(Int64(0), false), (4096, true)])
    func aRerunIsOfferedOnlyForDurableBytes(durable: Int64, offered: Bool) {
        var machine = Self.machine(maxRetries: 0)
        _ = machine.next(store: nil)
        let dropped = Self.report(
            .accept(bodyStart: 0, validators: Self.validators), .failure(.network("reset")), written: Self.mib,
            saved: Self.mib, durable: durable)
        let action = machine.firstRequestEnded(dropped, store: Store(segments: 1, written: Self.mib), now: 0, jitter: 0)
        guard case .fail(let error) = action else {
            Issue.record("\(Self.describe(action))")
            return
        }
        #expect((error.remedy != nil) == offered, "\(error.message)")
        #expect(error.isResumable == offered)
        #expect(error.message.contains("bytes saved") == offered, "\(error.message)")
    }

    // MARK: A failing disk ends the download, the partial kept (rule 4)

    /// A failed write or checkpoint, or files that could not be prepared for a body, stop every lane and end the
    /// download with that error; no retry, no restart (the bytes are fine, the disk is not).
    @Test func storageFailureEndsTheDownload() {
        let full = DownloadError.io("cannot write", path: "/d/f.part", Errno(rawValue: ENOSPC))
        var machine = Self.split(lanes: 2)
        #expect(Self.lane(&machine, 0, Self.report(sink: .storageFailed(full)), receiving: [1]) == "stop")
        let end = machine.transferEnded(allComplete: false)
        #expect(Self.describe(end) == "fail \(full.code): \(full.message)")
        #expect(machine.restarts == 0)

        var decision = Self.alone()
        let cannot = DownloadError(.io, "cannot save download state", resumable: true)
        #expect(Self.lane(&decision, 0, Self.report(), decisionError: cannot) == "stop")
        #expect(Self.describe(decision.transferEnded(allComplete: false)) == "fail io: cannot save download state")
    }

    /// The first reason to stop stands: a failure after a restart does not replace it.
    @Test func firstStopStands() {
        var machine = Self.split()
        machine.halt(.restart(.rangeIgnored))
        machine.halt(.failure(DownloadError(.io, "late")))
        #expect(Self.describe(machine.transferEnded(allComplete: false)).hasPrefix("restart: "))
    }

    // MARK: Lanes

    /// A lane refused by the server (503) or out of retries retires while another lane is receiving; alone it
    /// waits and retries (on one connection with a durable checkpoint first), or fails.
    @Test func refusedLanesRetire() {
        var machine = Self.split(lanes: 3)
        let refused = Self.report(.retry(status: 503, retryAfter: nil))
        #expect(Self.lane(&machine, 1, refused, receiving: [0]).hasPrefix("retire: the server refused an extra connection"))
        #expect(Self.lane(&machine, 2, refused) == "wait 0.5 (1/5): HTTP 503 Service Unavailable")
        #expect(machine.transfer?.activeLanes == 2)

        var spent = Self.split(lanes: 2, maxRetries: 0)
        let dropped = Self.report(.accept(bodyStart: 0, validators: Self.validators), .failure(.init(.network, "reset")), written: 0)
        #expect(Self.lane(&spent, 1, dropped, receiving: [0]).hasPrefix("retire: giving up after 0 retries on one connection"))
        #expect(Self.lane(&spent, 0, dropped) == "stop", "the last lane out of retries ends the download")
        #expect(Self.describe(spent.transferEnded(allComplete: false)).hasPrefix("fail retriesExhausted"))

        var alone = Self.alone()
        #expect(Self.lane(&alone, 0, refused) == "wait 0.5 (1/5): HTTP 503 Service Unavailable +checkpoint")
    }

    /// Redirects: said on the download's one connection, followed quietly by lanes; each lane has its own
    /// sequence, and a new segment starts from the start URL.
    @Test func redirectsPerLane() {
        var alone = Self.alone()
        #expect(Self.lane(&alone, 0, Self.report(.redirect(location: "/c"))) == "redirected http://example.test/c")
        #expect(alone.first.url.absoluteString == "http://example.test/c", "one connection continues the download's own")

        var machine = Self.split(lanes: 2)
        #expect(Self.lane(&machine, 0, Self.report(.redirect(location: "/c"))) == "again")
        let next = machine.nextRequest(0, written: 0, end: 16 * Self.mib, known: Self.validators, overlapWindow: 0)
        #expect(next?.url.absoluteString == "http://example.test/c")
        let other = machine.nextRequest(1, written: 16 * Self.mib, end: 32 * Self.mib, known: Self.validators, overlapWindow: 0)
        #expect(other?.url == Self.start)
        machine.released(0)
        let again = machine.nextRequest(0, written: 0, end: 16 * Self.mib, known: Self.validators, overlapWindow: 0)
        #expect(again?.url == Self.start)
    }

    /// Idle lanes take free segments, then wait for the end game; with one lane or everything written, they stop.
    /// A steal is reported back once the executor has split the part file.
    @Test func idleLanes() {
        var machine = Self.split(lanes: 2)
        let segments = Self.segments([16, 16, 3, 16])
        #expect(Self.idle(&machine, segments) == .fetch(2))
        #expect(Self.idle(&machine, segments, young: [2]) == .wait, "too young to judge: presumed fine")
        #expect(Self.idle(&machine, Self.segments([16, 16, 16, 16])) == .stop)
        var one = Self.split(lanes: 1)
        #expect(Self.idle(&one, Self.segments([16, 16, 16, 16])) == .stop)
        #expect(Self.idle(&one, segments) == .fetch(2))
        #expect(Self.idle(&one, segments, young: [2]) == .stop, "one lane never waits for an end game")
        one.released(2)
        #expect(Self.idle(&one, segments) == .fetch(2), "a released unfinished segment is taken again")
    }

    /// A whole download over lanes, as the executors drive it: the first response splits, the lanes fetch their
    /// segments (one cut short by a split asks again), every segment completes, the download finishes.
    @Test func aWholeSplitDownload() {
        var machine = Self.machine()
        #expect(Self.describe(machine.next(store: nil)) == "request \(Self.start)")
        let split = Self.first(&machine, Self.report(written: Self.mib, saved: Self.mib), store: Store(segments: 4, written: Self.mib), splitNow: true)
        #expect(split == "transfer split")
        machine.transferStarted(lanes: 4, split: true, rateLimited: false, pieceSize: Self.mib, minimumSplitSize: Self.mib)
        #expect(machine.phase == .transferring(lanes: 4, split: true))
        var segments = Self.segments([1, 0, 0, 0])
        for slot in 0..<4 { #expect(Self.idle(&machine, segments) == .fetch(slot)) }
        #expect(Self.lane(&machine, 3, Self.report(sink: .reachedEnd, written: 60 * Self.mib, end: 60 * Self.mib)) == "again")
        for slot in 0..<4 {
            segments[slot].durable = segments[slot].end!
            #expect(Self.lane(&machine, slot, Self.report(written: segments[slot].end!, end: segments[slot].end!)) == "again")
            #expect(Self.ask(&machine, slot, written: segments[slot].end!, end: segments[slot].end!, known: Self.validators, overlapWindow: 0) == nil)
            machine.released(slot)
        }
        #expect(Self.idle(&machine, segments) == .stop)
        #expect(Self.describe(machine.transferEnded(allComplete: true)) == "finish")
        #expect(machine.phase == .finishing && machine.transfer == nil)
    }
}
