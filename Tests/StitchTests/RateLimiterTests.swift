import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

@Suite struct RateLimiterTests {

    // MARK: Simulation

    struct Outcome {
        /// Bytes accepted at times in `measureFrom..<until`.
        var bytes: Int64 = 0
        var waits = 0
        var smallestWait = Double.infinity
        var largestWait = -Double.infinity
    }

    /// `connections` simulated connections each offer `chunk`-byte pieces as fast as the limiter allows, from
    /// `from` to `until` (simulated seconds): a connection that is let through offers its next chunk at once; one
    /// told to wait asks again with the same chunk after exactly the wait. Connections with the same due time
    /// go in turn.
    static func simulate(
        _ limiter: RateLimiter, connections: Int, chunk: Int = 16 * 1024,
        from: Double = 0, until: Double, measureFrom: Double? = nil
    ) -> Outcome {
        var outcome = Outcome()
        var due = [Double](repeating: from, count: connections)
        let measureStart = measureFrom ?? from
        while true {
            let i = due.indices.min { due[$0] < due[$1] }!
            let now = due[i]
            guard now < until else { break }
            if let wait = limiter.take(chunk, now: now) {
                outcome.waits += 1
                outcome.smallestWait = min(outcome.smallestWait, wait)
                outcome.largestWait = max(outcome.largestWait, wait)
                due[i] = now + wait
            } else if now >= measureStart {
                outcome.bytes += Int64(chunk)
            }
            // Round-robin among equals: the one just served goes behind the others due at the same time.
            if due[i] == now { due[i] = now.nextUp }
        }
        return outcome
    }

    static func expectWithin(
        _ percent: Double, achieved: Double, requested: Double, _ context: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let error = abs(achieved - requested) / requested
        #expect(
            error <= percent / 100,
            "\(context): achieved \(achieved) B/s for \(requested) B/s (\(error * 100) % off)",
            sourceLocation: sourceLocation)
    }

    @Test(arguments: [1_000_000, 10_000_000, 50_000_000] as [Int64], [1, 8])
    func achievedRateIsWithinFivePercent(rate: Int64, connections: Int) {
        let limiter = RateLimiter(bytesPerSecond: rate)
        let outcome = Self.simulate(limiter, connections: connections, until: 10)
        Self.expectWithin(
            5, achieved: Double(outcome.bytes) / 10, requested: Double(rate),
            "\(rate) B/s, \(connections) connections")
        #expect(outcome.waits > 0)
        #expect(outcome.smallestWait > 0, "a wait was \(outcome.smallestWait)")
        #expect(outcome.largestWait <= RateLimiter.maximumWait)
    }

    /// The rate that applies: the lower of a limiter's and the one it is nested within, only while enabled.
    @Test func limitingRateIsTheLowestEnabled() {
        let overall = RateLimiter(bytesPerSecond: 5_000_000)
        let own = RateLimiter(bytesPerSecond: 8_000_000, within: overall)
        #expect(own.limitingRate == 5_000_000)
        overall.isEnabled = false
        #expect(own.limitingRate == 8_000_000)
        own.isEnabled = false
        #expect(own.limitingRate == nil)
        overall.isEnabled = true
        #expect(own.limitingRate == 5_000_000)
    }

    @Test func oddChunkSizesKeepTheRate() {
        // Chunks of 1 byte to 64 KiB (beyond the default 64 KiB burst at this rate), offered as fast as allowed.
        let limiter = RateLimiter(bytesPerSecond: 300_000)
        var rng = SplitMix64(seed: 0x5EED)
        var now = 0.0
        var bytes: Int64 = 0
        while now < 10 {
            let chunk = Int.random(in: 1...(64 * 1024 + 100), using: &rng)
            while let wait = limiter.take(chunk, now: now) {
                #expect(wait > 0 && wait <= RateLimiter.maximumWait)
                now += wait
            }
            if now < 10 { bytes += Int64(chunk) }
        }
        Self.expectWithin(5, achieved: Double(bytes) / 10, requested: 300_000, "random chunks")
    }

    @Test(arguments: [(10_000_000, 2_000_000), (1_000_000, 20_000_000)] as [(Int64, Int64)])
    func rateChangeMidwayTakesEffect(before: Int64, after: Int64) {
        let limiter = RateLimiter(bytesPerSecond: before)
        let first = Self.simulate(limiter, connections: 4, until: 5)
        Self.expectWithin(5, achieved: Double(first.bytes) / 5, requested: Double(before), "before the change")

        limiter.bytesPerSecond = after
        #expect(limiter.bytesPerSecond == after)
        #expect(limiter.burst == RateLimiter.defaultBurst(forRate: after))
        // Paused connections ask again within `maximumWait`; everything from 5 s on counts.
        let second = Self.simulate(limiter, connections: 4, from: 5, until: 10)
        Self.expectWithin(5, achieved: Double(second.bytes) / 5, requested: Double(after), "after the change")
        #expect(second.smallestWait > 0)
    }

    // MARK: Bucket rules

    @Test func defaultBurst() {
        #expect(RateLimiter.defaultBurst(forRate: 1) == 65536)
        #expect(RateLimiter.defaultBurst(forRate: 655_360) == 65536)
        #expect(RateLimiter.defaultBurst(forRate: 1_000_000) == 100_000)
        #expect(RateLimiter(bytesPerSecond: 50_000_000).burst == 5_000_000)
        let explicit = RateLimiter(bytesPerSecond: 1000, burst: 4000)
        #expect(explicit.burst == 4000)
        explicit.bytesPerSecond = 10_000_000
        #expect(explicit.burst == 4000, "an explicit burst does not follow the rate")
    }

    @Test func startsFullThenPacesAtTheRate() throws {
        let limiter = RateLimiter(bytesPerSecond: 1000, burst: 3000)
        #expect(limiter.take(1000, now: 100) == nil)
        #expect(limiter.take(2000, now: 100) == nil)
        let wait = try #require(limiter.take(500, now: 100))
        #expect(abs(wait - 0.5) < 1e-9)
        #expect(limiter.take(500, now: 100.25) != nil)
        #expect(limiter.take(500, now: 100 + wait) == nil)
        #expect(limiter.take(0, now: 100.5) == nil, "zero bytes never wait")
    }

    @Test func takeLargerThanBurstWhenFullGoesIntoDebt() throws {
        let limiter = RateLimiter(bytesPerSecond: 1000, burst: 1000)
        #expect(limiter.take(400, now: 0) == nil)
        // 600 in the bucket: a 5000-byte chunk needs only a full bucket, 0.4 s away.
        let wait = try #require(limiter.take(5000, now: 0))
        #expect(abs(wait - 0.4) < 1e-9)
        #expect(limiter.take(5000, now: 0.4) == nil)
        // Now 4000 bytes in debt: one more byte needs 4.001 s, reported in steps of at most `maximumWait`.
        var now = 0.4
        var steps = 0
        while let wait = limiter.take(1, now: now) {
            #expect(wait > 0 && wait <= RateLimiter.maximumWait)
            now += wait
            steps += 1
        }
        #expect(abs(now - 4.401) < 1e-6)
        #expect(steps == 5)
    }

    @Test func idleTimeFillsOnlyUpToTheBurst() {
        let limiter = RateLimiter(bytesPerSecond: 1000, burst: 2000)
        #expect(limiter.take(2000, now: 0) == nil)
        #expect(limiter.take(2000, now: 3600) == nil)
        #expect(limiter.take(1, now: 3600) != nil)
    }

    @Test func clockGoingBackwardsAddsNothing() throws {
        let limiter = RateLimiter(bytesPerSecond: 1000, burst: 1000)
        #expect(limiter.take(1000, now: 10) == nil)
        let wait = try #require(limiter.take(500, now: 9))
        #expect(abs(wait - 0.5) < 1e-9)
        #expect(limiter.take(500, now: 10.25) != nil)
        #expect(limiter.take(500, now: 10.5) == nil)
    }

    @Test func loweringTheRateTrimsTheDefaultBurst() throws {
        let limiter = RateLimiter(bytesPerSecond: 10_000_000)  // burst 1 MB, full
        limiter.bytesPerSecond = 1_000_000  // burst 100 kB
        #expect(limiter.take(100_000, now: 0) == nil)
        let wait = try #require(limiter.take(1000, now: 0))
        #expect(abs(wait - 0.001) < 1e-9)
    }

    @Test func concurrentTakersShareOneBucket() async {
        // The clock stands still, so exactly the full bucket (100 kB) is handed out, whoever asks.
        let limiter = RateLimiter(bytesPerSecond: 1_000_000)
        let accepted = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var bytes = 0
                    for _ in 0..<1000 where limiter.take(1000, now: 0) == nil { bytes += 1000 }
                    return bytes
                }
            }
            return await group.reduce(0, +)
        }
        #expect(accepted == 100_000)
    }

    // MARK: Parsing

    @Test(
        arguments: [
            ("500K", 512_000), ("2M", 2_097_152), ("1.5M", 1_572_864), ("10m", 10_485_760),
            ("1G", 1_073_741_824), ("800", 800), ("800B", 800), ("800b/s", 800), ("800/s", 800),
            ("64KB/s", 65536), ("64kb/S", 65536), ("2MiB", 2_097_152), ("2mib/s", 2_097_152), ("0.5k", 512),
            ("1.25K", 1280), ("0800", 800), ("1T", 1 << 40), ("2.5", 2), ("8388607T", 8_388_607 << 40),
            ("9223372036854775807", Int64.max), ("1.000000000000000001G", 1 << 30),
        ] as [(String, Int64)])
    func parses(text: String, expected: Int64) {
        #expect(RateLimiter.parse(text) == expected, "\(text)")
    }

    @Test(
        arguments: [
            "", "0", "0K", "0.0M", "0.1", "-1", "-5M", "+5", " 5", "5 ", "5 K", "abc", "K", "B", "/s", "KB/s",
            "1.2.3", "1.", ".5", "1X", "1KK", "1e6", "5Mbit", "1,5M", "1P", "1i", "1iB",
            "9223372036854775808", "8388608T", "99999999999999999999", "18446744073709551616",
            "1.0000000000000000001", "٥", "5\n",
        ])
    func rejects(text: String) {
        #expect(RateLimiter.parse(text) == nil, "\(text.debugDescription)")
    }

    /// Sizes are read as rates are, without the rate's `/s`: a size written as a rate is refused.
    @Test func sizesAreRatesWithoutPerSecond() {
        for (text, bytes) in [("16M", Int64(16 << 20)), ("512K", 512 << 10), ("1.5MiB", 3 << 19), ("800b", 800), ("1G", 1 << 30)] {
            #expect(ByteSize.parse(text) == bytes, "\(text)")
            #expect(RateLimiter.parse(text) == bytes, "\(text)")
            #expect(RateLimiter.parse(text + "/s") == bytes, "\(text)/s")
            #expect(ByteSize.parse(text + "/s") == nil, "\(text)/s is a rate, not a size")
        }
        #expect(ByteSize.parse("0") == nil && ByteSize.parse("") == nil && ByteSize.parse("1X") == nil)
    }
}
