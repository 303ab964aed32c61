import Foundation
import StitchLocks

/// What one run decides about splitting, and the part file's splits made for it: how many connections
/// (``ConnectionPlan``, granted once per run), whether the first response may be split (``SplitPolicy``), the
/// first response's probe (``SplitProbe``) and whether it split the file. The rules are in those pure types; this
/// keeps their state for the run, behind a lock taken only to read or set it (never while a store's lock is
/// asked for, never with the state machine's lock held); the caller's connection grant is asked under a lock of
/// its own.
final class SplitControl: Sendable {
    private struct State {
        var connections: ConnectionPlan
        /// The first response of a download that may be split, while its speed is measured (and then watched, if
        /// the probe kept one connection): sampled after each write of that response, on the transport's thread.
        var probe: SplitProbe?
        /// The first response was split (by the probe, or at once): the lanes take over from where it got to.
        var splitNow = false
    }

    private let state: Locked<State>
    private let options: DownloadOptions

    init(_ options: DownloadOptions) {
        self.options = options
        state = Locked(State(connections: ConnectionPlan(options)))
    }

    /// How many connections this download should use, given what the server said (the grant is asked once).
    /// The grant is the caller's code: it runs under ``granting`` only (one ask at a time), never the state's lock.
    func lanes(for validators: Validators) -> Int {
        let grant = options.connectionGrant
        return granting.withLock { _ in
            var plan = state.withLock { $0.connections }
            let lanes = plan.lanes(for: validators, grant: grant)
            state.withLock { $0.connections = plan }
            return lanes
        }
    }

    /// Held while the connections are granted (see ``lanes(for:)``).
    private let granting = Locked(())

    /// Whether to split the first response: more than one connection wanted and the server gave what ranges need
    /// (``SplitPolicy/canSplit(_:wanted:asked:minimumSplitSize:failure:)``); the notice says why not when that is
    /// worth saying.
    func canSplit(_ validators: Validators, failure: SplitPolicy.Failure?) -> (Bool, notice: String?) {
        let wanted = state.withLock { $0.connections.wanted(for: validators) }
        return SplitPolicy.canSplit(
            validators, wanted: wanted, asked: options.connections, minimumSplitSize: options.minimumSplitSize,
            failure: failure)
    }

    /// Whether the first response is received a moment first (probed) rather than split at once.
    var probes: Bool { options.connections == nil && options.singleConnectionRate != nil }

    /// Whether the first response is being probed (its sink samples the probe after each write).
    var isProbing: Bool { state.withLock { $0.probe != nil } }

    /// Starts probing the first response, a file of `total` bytes, at `now`.
    func startProbe(total: Int64, now: Double) {
        let probe = SplitProbe(
            started: now, total: total, singleConnectionRate: options.singleConnectionRate,
            minimumSplitSize: options.minimumSplitSize)
        state.withLock { $0.probe = probe }
    }

    /// No probe: a new first request, or a restart.
    func reset() {
        state.withLock {
            $0.probe = nil
            $0.splitNow = false
        }
    }

    /// Samples the first response's probe once it has reached `offset` at `now` (``SplitProbe``), and acts on the
    /// verdict: says why one connection is kept, or splits the rest of `store` from `offset` (the file the probe
    /// measured, `known` still describing it; `allowed`: splitting not given up for this run). Returns true when the
    /// download splits now (the response stops; the lanes continue from its offset). On the transport's thread,
    /// from the sink: the probe is taken out of the lock to be sampled, and events go through the event queue.
    func sampled(
        at offset: Int64, store: PartStore, known: Validators, now: Double, reporter: RunReporter,
        allowed: () -> Bool
    ) -> Bool {
        guard var probe = state.withLock({ $0.probe }), !probe.isDone else { return false }
        let limiter = options.rateLimiter
        let total = probe.total
        let verdict = probe.sample(
            offset: offset, now: now,
            splittable: { known.totalLength == total && known.acceptRanges && known.ifRange != nil && allowed() },
            limitingRate: { limiter?.limitingRate }, lanes: { lanes(for: known) })
        state.withLock { $0.probe = probe }
        switch verdict {
        case .none:
            return false
        case .keepOne(let notice):
            reporter.emit(.notice(notice), fromTransport: true)
            return false
        case .split(let slowdown):
            guard split(store, total: total, lanes: lanes(for: known)) else { return false }
            if let slowdown {
                reporter.emit(
                    .notice(slowdown.notice(connections: store.snapshot.segments.count)), fromTransport: true)
            }
            reporter.announce(total: total)
            markSplitNow()
            return true
        }
    }

    /// Records that the first response was split; read once by ``takeSplitNow()``.
    func markSplitNow() { state.withLock { $0.splitNow = true } }

    /// Whether the first response was split, once.
    func takeSplitNow() -> Bool {
        state.withLock { state in
            defer { state.splitNow = false }
            return state.splitNow
        }
    }

    /// Cuts what remains of the single segment (from its written offset to `total`) into `lanes` segments on
    /// piece boundaries (``SplitPolicy/boundaries(from:total:lanes:pieceSize:minimumSplitSize:)``); returns whether
    /// the file has several segments now.
    func split(_ store: PartStore, total: Int64, lanes: Int) -> Bool {
        var slot = 0
        let boundaries = SplitPolicy.boundaries(
            from: store.written(0), total: total, lanes: lanes, pieceSize: store.pieceSize,
            minimumSplitSize: options.minimumSplitSize)
        for boundary in boundaries {
            guard let next = store.split(slot, at: boundary) else { break }
            slot = next
        }
        return store.snapshot.segments.count > 1
    }

    /// Whether a resumed single-segment partial should continue over several connections (asked once, at the
    /// start of the run: ``ConnectionPlan/resplit(known:written:grant:)``); splits it if so.
    func resplit(_ store: PartStore, known: Validators?) -> Bool {
        guard store.snapshot.segments.count == 1, let total = known?.totalLength else { return false }
        let written = store.written(0)
        let grant = options.connectionGrant
        let lanes = granting.withLock { _ in
            var plan = state.withLock { $0.connections }
            let lanes = plan.resplit(known: known, written: written, grant: grant)
            state.withLock { $0.connections = plan }
            return lanes
        }
        guard let lanes else { return false }
        return split(store, total: total, lanes: lanes)
    }
}
