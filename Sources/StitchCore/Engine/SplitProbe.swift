import Foundation

/// The probe of a first response that may be split, then the re-probe of one the probe kept on one connection, as
/// a pure machine: each speed sample (where the response has got to, and when) is an event, and the verdict says
/// whether to split now. No clock and no I/O of its own: the executor samples after each write of the first
/// response and performs the split (``SplitPolicy`` has the rules of each look). Unit tests: SplitProbeTests.
///
/// 1. Probing: once the response has run ``SplitPolicy/probeSeconds`` (or brought ``SplitPolicy/probeBytes``), the
///    probe's verdict: split from where it got to, keep one connection quietly (too little left), or keep it and
///    say so (one connection already brings `singleConnectionRate`) — then watch it.
/// 2. Watching: at each of ``SplitPolicy/reprobeSeconds`` after the start, the speed since the previous look; far
///    below the probe's, split the rest — unless a rate limit explains the speed.
/// 3. Done: no more looks (a verdict was reached, or the response is no longer one that may be split).
struct SplitProbe: Sendable, Equatable {
    enum Stage: Sendable, Equatable {
        case probing
        /// The probe kept one connection at `probeRate`; the last look was at `lastTime`, at `lastOffset`; the
        /// next is ``SplitPolicy/reprobeSeconds``[`next`].
        case watching(probeRate: Double, lastTime: Double, lastOffset: Int64, next: Int)
        case done
    }

    /// What one sample comes to.
    enum Verdict: Sendable, Equatable {
        /// Nothing to do: go on receiving.
        case none
        /// Keep the one connection, and say why.
        case keepOne(notice: String)
        /// Split the rest from the sampled offset. `slowdown`: the re-probe's reason (the connection slowed), to
        /// say with the number of connections the split made; nil for the probe's own split.
        case split(slowdown: Slowdown?)
    }

    /// A connection that slowed far below what the probe saw.
    struct Slowdown: Sendable, Equatable {
        var rate: Double
        var probeRate: Double

        /// What the user is told once the rest is split over `connections`.
        func notice(connections: Int) -> String {
            "the connection slowed to \(SplitPolicy.rateText(rate)) (the first moments brought "
                + "\(SplitPolicy.rateText(probeRate))); splitting the rest over \(connections) connections"
        }
    }

    /// When the response started (the clock's uptime) and the file's length it announced.
    let started: Double
    let total: Int64
    let singleConnectionRate: Int64?
    let minimumSplitSize: Int64
    private(set) var stage = Stage.probing

    init(started: Double, total: Int64, singleConnectionRate: Int64?, minimumSplitSize: Int64) {
        self.started = started
        self.total = total
        self.singleConnectionRate = singleConnectionRate
        self.minimumSplitSize = minimumSplitSize
    }

    /// Whether samples still matter (the executor stops sampling once done).
    var isDone: Bool { stage == .done }

    /// One sample: the response has reached `offset` at `now`. `splittable` is asked only when a look is due:
    /// whether the response is still one that may be split (the length probed, ranges and a strong validator, and
    /// splitting not given up for this run). `limitingRate` (asked only at a look of the re-probe): a rate limit in force, which explains a slow
    /// connection (more connections would share it). `lanes` is asked last, only when a split is otherwise worth it
    /// (asking may take connections from a host's cap).
    mutating func sample(
        offset: Int64, now: Double, splittable: () -> Bool, limitingRate: () -> Int64?, lanes: () -> Int
    ) -> Verdict {
        switch stage {
        case .done:
            return .none
        case .probing:
            let elapsed = now - started
            guard elapsed >= SplitPolicy.probeSeconds || offset >= SplitPolicy.probeBytes else { return .none }
            stage = .done
            guard splittable() else { return .none }
            let verdict = SplitPolicy.probe(
                offset: offset, elapsed: elapsed, total: total, singleConnectionRate: singleConnectionRate,
                minimumSplitSize: minimumSplitSize, lanes: lanes)
            switch verdict {
            case .wait, .notWorthIt:
                return .none
            case .keepOne(let notice):
                stage = .watching(
                    probeRate: Double(offset) / max(elapsed, 1e-6), lastTime: now, lastOffset: offset, next: 0)
                return .keepOne(notice: notice)
            case .split:
                return .split(slowdown: nil)
            }
        case .watching(let probeRate, let lastTime, let lastOffset, let next):
            guard now - started >= SplitPolicy.reprobeSeconds[next] else { return .none }
            let bytes = offset - lastOffset
            let seconds = now - lastTime
            stage =
                next + 1 < SplitPolicy.reprobeSeconds.count
                ? .watching(probeRate: probeRate, lastTime: now, lastOffset: offset, next: next + 1) : .done
            // A rate limit that explains the speed (within a factor of two of the limit) is no reason to split:
            // more connections would share the same limit. One far above the speed (`--limit-rate 100M` against a
            // line capped at 2 MiB/s) explains nothing.
            if let limitingRate = limitingRate(), seconds > 0, Double(bytes) / seconds >= Double(limitingRate) / 2 { return .none }
            guard splittable(),
                SplitPolicy.reprobe(
                    bytes: bytes, seconds: seconds, probeRate: probeRate, remaining: total - offset,
                    minimumSplitSize: minimumSplitSize, singleConnectionRate: singleConnectionRate),
                lanes() > 1
            else { return .none }
            stage = .done
            return .split(slowdown: Slowdown(rate: Double(bytes) / seconds, probeRate: probeRate))
        }
    }
}
