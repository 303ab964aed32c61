import Testing

@testable import Stitch
@testable import StitchCore

/// The lanes' scheduling rules (``LaneScheduler``), without sockets, files or a clock: which segment an idle lane
/// takes, where the end game cuts a running segment, which slow connections are replaced.
@Suite struct LaneSchedulerTests {
    static let mib: Int64 = 1 << 20

    static func scheduler(lanes: Int = 4, rateLimited: Bool = false) -> LaneScheduler {
        LaneScheduler(lanes: lanes, rateLimited: rateLimited, pieceSize: mib, minimumSplitSize: mib)
    }

    static func running(_ slots: [Int], startedAt: Double = 0, receiving: Bool = true) -> [Int: LaneScheduler.Running] {
        Dictionary(uniqueKeysWithValues: slots.map { ($0, .init(startedAt: startedAt, resumeOffset: 0, receiving: receiving)) })
    }

    /// A segment `start..<end` written up to `written`.
    static func segment(_ start: Int64, _ end: Int64, _ written: Int64) -> Segment {
        Segment(start: start * mib, end: end * mib, durable: written * mib)
    }

    /// Idle lanes take the unowned unfinished segments first, the earliest first; a released unfinished segment is
    /// taken again.
    @Test func freeSegmentsFirstInOrder() {
        var scheduler = Self.scheduler()
        let segments = [Self.segment(0, 2, 2), Self.segment(4, 6, 4), Self.segment(2, 4, 2)]
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(2))
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(1))
        #expect(scheduler.owned == [1, 2])
        scheduler.release(2)
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(2))
    }

    /// A connection that has brought nothing for a window is stalled: the thief takes all but its last granule
    /// (rounded up to a piece, the tail being long) and the victim's connection is replaced. Once connections have
    /// answered with different versions, no connection is replaced: the steal halves instead.
    @Test func stalledVictimKeepsAGranuleAndIsReplaced() {
        var scheduler = Self.scheduler(lanes: 2)
        var segments = [Self.segment(0, 64, 10)]
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(0))
        let running = Self.running([0])
        #expect(scheduler.sample(segments: segments, running: running, now: 0).isEmpty)
        #expect(scheduler.sample(segments: segments, running: running, now: 0.3).isEmpty)
        #expect(scheduler.speeds[0] == 0)
        #expect(
            scheduler.claim(segments: segments, running: running, now: 0.3)
                == .steal(victim: 0, at: 11 * Self.mib, replaceVictim: true))
        scheduler.versionsDiffer = true
        segments[0].durable = 10 * Self.mib
        #expect(
            scheduler.claim(segments: segments, running: running, now: 0.3)
                == .steal(victim: 0, at: 37 * Self.mib, replaceVictim: false))
    }

    /// With speeds to weigh, the split lets the victim and the thief end together: at equal speeds, half of what
    /// is left (on a piece boundary); against a thief three times as fast, a quarter. The thief's speed is what the
    /// lane that finished got; with none known, halves.
    @Test(arguments: [(nil, 28), (12, 28), (36, 18)] as [(Int64?, Int64)])
    func bothEndTogether(thiefMiBPerSecond: Int64?, splitAtMiB: Int64) {
        var scheduler = Self.scheduler(lanes: 2)
        var segments = [Self.segment(0, 48, 2), Self.segment(48, 64, 48)]
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(0))
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(1))
        segments[1].durable = 64 * Self.mib
        if let thiefMiBPerSecond { scheduler.requestEnded(1, wholeSpeed: Double(thiefMiBPerSecond * Self.mib)) }
        scheduler.release(1)
        let running = Self.running([0])
        _ = scheduler.sample(segments: segments, running: running, now: 0)
        segments[0].durable = 8 * Self.mib
        _ = scheduler.sample(segments: segments, running: running, now: 0.5)
        #expect(scheduler.speeds[0] == Double(12 * Self.mib))
        #expect(
            scheduler.claim(segments: segments, running: running, now: 0.5)
                == .steal(victim: 0, at: splitAtMiB * Self.mib, replaceVictim: false))
    }

    /// A connection that stalled right after a burst still has the burst's speed in its window, and it is the only
    /// one sampled (the others finished between two samples). It is judged against what the finished lanes got,
    /// never against itself: far slower than them, it keeps a granule and is replaced. (Compared with itself it
    /// kept half, then half of that, down to a piece it sat on until its stall timeout: the end game's one job.)
    @Test func stalledAfterABurstIsNotComparedWithItself() {
        var scheduler = Self.scheduler(lanes: 2)
        var segments = [Self.segment(0, 48, 0), Self.segment(48, 96, 48)]
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(0))
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(1))
        let running = Self.running([0])
        _ = scheduler.sample(segments: segments, running: running, now: 0)
        segments[0].durable = Self.mib / 8
        _ = scheduler.sample(segments: segments, running: running, now: 0.25)
        #expect(scheduler.speeds[0] == Double(Self.mib / 2))
        segments[1].durable = 96 * Self.mib
        scheduler.requestEnded(1, wholeSpeed: Double(300 * Self.mib))
        scheduler.release(1)
        #expect(
            scheduler.claim(segments: segments, running: running, now: 0.3)
                == .steal(victim: 0, at: Self.mib, replaceVictim: true))
    }

    /// Not worth a request: a tail not well above what the victim has in flight, a request too young to have a
    /// speed, and a connection fast enough to fill its socket buffers with less than a second left. With more than
    /// a second left the fast one is cut too.
    @Test func stealsThatAreNotWorthIt() {
        var scheduler = Self.scheduler(lanes: 2)
        var segments = [Self.segment(0, 64, 60)]
        #expect(scheduler.claim(segments: segments, running: [:], now: 0) == .segment(0))
        let running = Self.running([0])
        // Too young to measure: presumed fine.
        #expect(scheduler.claim(segments: segments, running: running, now: 0.1) == .none)
        // A fast connection (100 MiB/s) with 0.5 s left.
        segments = [Self.segment(0, 64, 4)]
        _ = scheduler.sample(segments: segments, running: running, now: 0)
        segments[0].durable = 14 * Self.mib
        _ = scheduler.sample(segments: segments, running: running, now: 0.1)
        segments[0].durable = 14 * Self.mib + 50 * Self.mib / 2  // keep the window covered
        _ = scheduler.sample(segments: segments, running: running, now: 0.35)
        let fast = scheduler.speeds[0] ?? 0
        #expect(fast >= Double(48 * Self.mib), "\(fast)")
        let left = Double(segments[0].end! - segments[0].durable) / fast
        #expect(left < LaneTiming.stealMinimumSecondsFast)
        #expect(scheduler.claim(segments: segments, running: running, now: 0.35) == .none)
        // A tail below two granules plus the slack: never.
        var small = Self.scheduler(lanes: 2)
        let tail = [Segment(start: 0, end: 5 * Self.mib, durable: 5 * Self.mib - 100_000)]
        _ = small.claim(segments: tail, running: [:], now: 0)
        #expect(small.claim(segments: tail, running: Self.running([0]), now: 5) == .none)
    }

    /// Under a rate limit speeds say nothing: half of the largest remainder that keeps its connection busy long
    /// enough, on a piece boundary; a remainder below two minimum splits plus the slack is left alone.
    @Test func underARateLimitStealsByHalves() {
        var scheduler = Self.scheduler(lanes: 2, rateLimited: true)
        let segments = [Self.segment(0, 32, 0), Self.segment(32, 40, 34)]
        _ = scheduler.claim(segments: segments, running: [:], now: 0)
        _ = scheduler.claim(segments: segments, running: [:], now: 0)
        #expect(scheduler.owned == [0, 1])
        let running = Self.running([0, 1], startedAt: 0)
        #expect(
            scheduler.claim(segments: segments, running: running, now: 1)
                == .steal(victim: 0, at: 16 * Self.mib, replaceVictim: false))
        // And no connection is ever replaced under a rate limit, however slow.
        _ = scheduler.sample(segments: segments, running: running, now: 1)
        #expect(scheduler.sample(segments: segments, running: running, now: 1.3).isEmpty)
    }

    /// A connection slower than a quarter of its peers' median for two samples in a row is replaced — once; its
    /// peers are not; not while connections answer with different versions; at most twice per lane in all.
    @Test func slowConnectionIsReplacedAfterTwoSamples() {
        var scheduler = Self.scheduler(lanes: 3)
        var segments = [Self.segment(0, 20, 0), Self.segment(20, 40, 20), Self.segment(40, 60, 40)]
        for _ in 0..<3 { _ = scheduler.claim(segments: segments, running: [:], now: 0) }
        let running = Self.running([0, 1, 2])
        func advance(_ fast: Int64, _ slow: Int64) {
            segments[0].durable += fast
            segments[1].durable += fast
            segments[2].durable += slow
        }
        #expect(scheduler.sample(segments: segments, running: running, now: 0).isEmpty)
        advance(3 * Self.mib, 100_000)
        #expect(scheduler.sample(segments: segments, running: running, now: 0.3).isEmpty, "one slow sample")
        advance(1 * Self.mib, 30_000)
        #expect(scheduler.sample(segments: segments, running: running, now: 0.4) == [2])
        #expect(scheduler.replacements == 1)
        #expect(scheduler.speeds[2] == nil, "the new connection starts without a speed")

        var differing = Self.scheduler(lanes: 3)
        differing.versionsDiffer = true
        var same = [Self.segment(0, 20, 0), Self.segment(20, 40, 20), Self.segment(40, 60, 40)]
        for _ in 0..<3 { _ = differing.claim(segments: same, running: [:], now: 0) }
        for step in 1...5 {
            same[0].durable += 3 * Self.mib
            same[1].durable += 3 * Self.mib
            #expect(differing.sample(segments: same, running: running, now: Double(step) * 0.3).isEmpty)
        }
    }

    /// The cap: however many samples, no more than two replacements per lane.
    @Test func replacementsAreCapped() {
        var scheduler = Self.scheduler(lanes: 2)
        var segments = [Self.segment(0, 500, 0), Self.segment(500, 1000, 500), Self.segment(1000, 1500, 1000)]
        for _ in 0..<3 { _ = scheduler.claim(segments: segments, running: [:], now: 0) }
        let running = Self.running([0, 1, 2])
        var replaced = 0
        for step in 0..<60 {
            segments[0].durable += 2 * Self.mib
            segments[1].durable += 2 * Self.mib
            replaced += scheduler.sample(segments: segments, running: running, now: Double(step) * 0.1).count
        }
        #expect(replaced == 4 && scheduler.replacements == 4, "\(replaced)")
    }
}
