/// The scheduling decisions of a download's lanes, as a pure state machine: which segment an idle lane takes,
/// where a steal cuts a running segment (the end game), which slow connections are replaced. No I/O and no clock of
/// its own: the executor (``DownloadRun``) passes the segments as written, the running requests and the time,
/// performs the returned work (a split of the part file, a replaced connection), and reports it back. Every rule
/// is a unit test (LaneSchedulerTests).
///
/// The rules:
/// - An idle lane takes the unowned unfinished segment that starts first.
/// - Else, under a rate limit (speeds say nothing), it takes half of the largest remainder that would keep its
///   connection busy for at least ``LaneTiming/stealMinimumSeconds`` more and is well above the in-flight
///   slack, on a piece boundary when the piece fits.
/// - Else it takes over the end of the segment that would finish last (work stealing): stalled or far slower than a
///   new connection would be, the victim keeps one granule and its connection is replaced; else the split point
///   lets both end together at their speeds; with nothing to weigh, halves. A victim fast enough to fill its socket
///   buffers is left alone unless a second or more is left. Splits fall on pieces for long tails, else on granules.
/// - Ten times a second the executor samples the receiving requests: a connection slower than a quarter of its
///   peers' median (at least 256 KiB/s) for two samples in a row, with something left to fetch, is replaced — not
///   under a rate limit, not once connections have answered with different versions, at most twice per lane.
struct LaneScheduler: Sendable {
    /// What the scheduler knows of a request in flight.
    struct Running: Sendable {
        /// When it was made (monotonic seconds) and where its body started.
        var startedAt: Double
        var resumeOffset: Int64
        /// Its head was accepted and the body is flowing.
        var receiving: Bool
    }

    /// The work for an idle lane.
    enum Work: Sendable, Equatable {
        /// Fetch this unowned segment.
        case segment(Int)
        /// Cut segment `victim` at `at` and fetch the new segment from there; replace the victim's connection if
        /// asked (it would otherwise sit on its last granule until its stall timeout).
        case steal(victim: Int, at: Int64, replaceVictim: Bool)
        /// Nothing worth taking now.
        case none
    }

    let lanes: Int
    let rateLimited: Bool
    let pieceSize: Int64
    let minimumSplitSize: Int64

    /// Segments a lane is fetching.
    private(set) var owned: Set<Int> = []
    /// The samples of each receiving request: (monotonic seconds, written offset), newest last.
    private var samples: [Int: [(Double, Int64)]] = [:]
    /// Each receiving request's speed (bytes/s) over the last ``LaneTiming/speedWindow``.
    private(set) var speeds: [Int: Double] = [:]
    /// Samples in a row each segment's connection has been much slower than its peers.
    private var slowTicks: [Int: Int] = [:]
    /// Connections replaced so far; capped so that a server slow for everyone cannot cause churn.
    private(set) var replacements = 0
    /// The last speeds of requests that ended (the newest eight): what a new request may expect.
    private var recentSpeeds: [Double] = []
    /// Connections answered with different versions: no replacements, no end-game replacements.
    var versionsDiffer = false

    init(lanes: Int, rateLimited: Bool, pieceSize: Int64, minimumSplitSize: Int64) {
        self.lanes = lanes
        self.rateLimited = rateLimited
        self.pieceSize = pieceSize
        self.minimumSplitSize = minimumSplitSize
    }

    // MARK: Work for an idle lane

    /// The next work for an idle lane. A `.segment` is owned at once; a `.steal` once the executor reports the new
    /// segment's slot (``own(_:)``), since the split may fail.
    mutating func claim(segments: [Segment], running: [Int: Running], now: Double) -> Work {
        if let free = segments.indices
            .filter({ !owned.contains($0) && !segments[$0].isComplete })
            .min(by: { segments[$0].start < segments[$1].start })
        {
            owned.insert(free)
            return .segment(free)
        }
        if rateLimited { return stealByHalves(segments: segments, running: running, now: now) }
        return steal(segments: segments, running: running, now: now)
    }

    /// The executor split a segment for a steal and the calling lane fetches `slot`.
    mutating func own(_ slot: Int) { owned.insert(slot) }

    /// The lane is done with `slot`.
    mutating func release(_ slot: Int) { owned.remove(slot) }

    private typealias Constants = LaneTiming

    /// What a new connection may expect, judged without `victim`: the median of the other receiving requests'
    /// speeds, else of the requests that ended lately. Never the victim's own speed: a stalled connection sampled
    /// while its last burst landed would otherwise be compared with itself, look as fast as a new connection, and
    /// keep half of its segment (then half again, down to a piece it sits on until its stall timeout).
    private func thiefSpeed(excluding victim: Int) -> Double? {
        let peers = speeds.filter { $0.key != victim && $0.value > 0 }.map(\.value).sorted()
        if !peers.isEmpty { return peers[peers.count / 2] }
        let recent = recentSpeeds.sorted()
        return recent.isEmpty ? nil : recent[recent.count / 2]
    }

    private func steal(segments: [Segment], running: [Int: Running], now: Double) -> Work {
        // The victim: the segment that would take longest to finish. A request with a measured speed is judged by
        // it; one too young to measure is presumed fine; one that has brought nothing measurable for a window, or
        // a segment whose lane waits to retry, may never finish.
        var best: (slot: Int, written: Int64, end: Int64, speed: Double?, left: Double)?
        for slot in owned.sorted() where slot < segments.count {
            guard let end = segments[slot].end else { continue }
            let written = segments[slot].durable
            let remaining = end - written
            let speed = speeds[slot]
            if speed == nil, let request = running[slot], now - request.startedAt < Constants.speedWindow { continue }
            // Worth a request only if the tail is well above what the victim has in flight when cut short.
            let inFlight = speed.map { min(Double(Constants.stealSlack), $0 * 0.1) } ?? Double(Constants.stealSlack)
            guard Double(remaining) >= Double(2 * Constants.stealGranule) + inFlight else { continue }
            let left = speed.map { $0 > 0 ? Double(remaining) / $0 : .infinity } ?? .infinity
            // A connection faster than the client can write may have its socket buffers full (megabytes); cutting
            // it short wastes all of that: worth it only for a long tail. A slower one (a capped connection, a far
            // edge), or one slow next to its thief, holds little in flight: that is what the end game is for.
            let thief = thiefSpeed(excluding: slot)
            let fast = speed.map { victimSpeed in
                victimSpeed >= Constants.bufferFillingSpeed && !(thief.map { victimSpeed * 2 < $0 } ?? false)
            } ?? false
            guard left >= (fast ? Constants.stealMinimumSecondsFast : Constants.stealMinimumSeconds) else { continue }
            if best == nil || left > best!.left || (left == best!.left && remaining > best!.end - best!.written) {
                best = (slot, written, end, speed, left)
            }
        }
        guard let victim = best else { return .none }
        let thief = thiefSpeed(excluding: victim.slot)
        let remaining = victim.end - victim.written
        var at: Int64
        var replaceVictim = false
        if !versionsDiffer, let victimSpeed = victim.speed,
            victimSpeed * Constants.slowFactor < (thief ?? 0) || victimSpeed == 0
        {
            // Stalled, or far slower than a new connection would be: the thief takes all but a granule, and the
            // victim's connection is replaced so that it does not sit on that granule until its stall timeout.
            at = victim.written + 1
            replaceVictim = true
        } else if let victimSpeed = victim.speed, let newSpeed = thief, victimSpeed + newSpeed > 0 {
            // Both end together: the victim keeps its share at the two speeds, and at least what it has in flight.
            let keep = Double(remaining) * victimSpeed / (victimSpeed + newSpeed)
            let inFlight = min(Double(Constants.stealSlack), victimSpeed * 0.1) + Double(Constants.stealGranule)
            at = victim.written + Int64(max(keep, inFlight))
        } else {
            // Nothing to weigh (no speeds yet, or a lane waiting to retry): halves.
            at = victim.written + remaining / 2
        }
        // On a piece boundary when the tail is large (each piece then has one writer); else on a granule.
        let alignment = victim.end - at >= 2 * pieceSize ? pieceSize : Constants.stealGranule
        at = (at + alignment - 1) / alignment * alignment
        guard at > victim.written, at <= victim.end - Constants.stealGranule else { return .none }
        return .steal(victim: victim.slot, at: at, replaceVictim: replaceVictim)
    }

    private func stealByHalves(segments: [Segment], running: [Int: Running], now: Double) -> Work {
        let minimum = max(minimumSplitSize, 1)
        let victims = owned.sorted().compactMap { slot -> (Int, Int64, Int64)? in
            guard slot < segments.count, let end = segments[slot].end else { return nil }
            return (slot, segments[slot].durable, end)
        }
        let worthIt = victims.filter { slot, written, end in
            guard end - written >= 2 * minimum + Constants.stealSlack else { return false }
            // No request running (a lane waiting to retry): it may take any time.
            guard let request = running[slot] else { return true }
            return LaneTiming.secondsLeft(
                from: request.resumeOffset, at: request.startedAt, written: written, end: end, now: now)
                >= Constants.stealMinimumSeconds
        }
        guard let (victim, written, end) = worthIt.max(by: { $0.2 - $0.1 < $1.2 - $1.1 }) else { return .none }
        var at = written + (end - written) / 2
        let alignment = pieceSize <= (end - written) / 2 ? pieceSize : minimum
        at = (at + alignment - 1) / alignment * alignment
        guard at > written, at < end else { return .none }
        return .steal(victim: victim, at: at, replaceVictim: false)
    }

    // MARK: Samples

    /// One sample of every receiving request's written offset (`segments` as written now). Returns the slots whose
    /// connections are to be replaced.
    mutating func sample(segments: [Segment], running: [Int: Running], now: Double) -> [Int] {
        for (slot, request) in running where slot < segments.count && request.receiving {
            var kept = samples[slot, default: []]
            kept.append((now, segments[slot].durable))
            // Keep the newest sample at least a window old, so the window is always covered.
            while kept.count > 2, now - kept[1].0 >= Constants.speedWindow { kept.removeFirst() }
            samples[slot] = kept
            if let first = kept.first, now - first.0 >= Constants.minimumSpeedWindow {
                speeds[slot] = Double(kept.last!.1 - first.1) / (now - first.0)
            }
        }
        guard !rateLimited, !versionsDiffer, replacements < lanes * 2, speeds.count >= 2 else { return [] }
        var replace: [Int] = []
        for slot in speeds.keys.sorted() {
            guard let speed = speeds[slot] else { continue }  // replaced earlier in this loop
            // The live table: a connection replaced earlier in this loop is no longer anyone's peer.
            let peers = speeds.filter { $0.key != slot }.map(\.value).sorted()
            guard !peers.isEmpty else { continue }
            let median = peers[peers.count / 2]
            guard slot < segments.count, running[slot] != nil, let end = segments[slot].end, median >= 256 * 1024
            else { continue }
            // Worth a new connection only with something left to fetch.
            if speed * Constants.slowFactor < median, end - segments[slot].durable >= 4 * Constants.stealGranule {
                slowTicks[slot, default: 0] += 1
                if slowTicks[slot, default: 0] >= Constants.slowTicksToReplace, replacements < lanes * 2 {
                    replace.append(slot)
                    replacements += 1
                    slowTicks[slot] = nil
                    samples[slot] = nil
                    speeds[slot] = nil
                }
            } else {
                slowTicks[slot] = nil
            }
        }
        return replace
    }

    /// A request on `slot` ended; `wholeSpeed` is its speed over its life (when long enough to say): what a new
    /// request may expect, with its last window's speed preferred.
    mutating func requestEnded(_ slot: Int, wholeSpeed: Double?) {
        if let last = speeds[slot] ?? wholeSpeed {
            recentSpeeds.append(last)
            if recentSpeeds.count > 8 { recentSpeeds.removeFirst() }
        }
        samples[slot] = nil
        speeds[slot] = nil
        slowTicks[slot] = nil
    }
}
