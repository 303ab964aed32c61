import Testing

@testable import Stitch
@testable import StitchCore

/// The download-level decisions about connections (``SplitPolicy``), without a server: whether the first response
/// allows a split (and what the user is told when not), what the probe concludes, where a split's boundaries fall.
@Suite struct SplitPolicyTests {
    static let mib: Int64 = 1 << 20

    static func validators(
        length: Int64? = 64 << 20, ranges: Bool = true, etag: String? = "\"v1\""
    ) -> Validators {
        Validators(etag: etag, lastModified: nil, date: nil, totalLength: length, acceptRanges: ranges)
    }

    @Test func splitAllowedOnlyWithEverythingRangesNeed() {
        let minimum = Self.mib
        func check(_ v: Validators, wanted: Int = 4, asked: Int? = 4, failure: SplitPolicy.Failure? = nil) -> (
            Bool, String?
        ) {
            let verdict = SplitPolicy.canSplit(v, wanted: wanted, asked: asked, minimumSplitSize: minimum, failure: failure)
            return (verdict.allowed, verdict.notice)
        }
        #expect(check(Self.validators()) == (true, nil))
        // One connection wanted: nothing to say.
        #expect(check(Self.validators(), wanted: 1) == (false, nil))
        // What is missing is said, when the user asked for several connections.
        #expect(check(Self.validators(length: nil)).1?.contains("does not say the file's length") == true)
        #expect(check(Self.validators(length: minimum)).1?.contains("too small to split") == true)
        #expect(check(Self.validators(length: minimum), asked: nil) == (false, nil), "automatic: quiet")
        #expect(check(Self.validators(ranges: false)).1?.contains("does not accept range requests") == true)
        #expect(check(Self.validators(etag: "W/\"weak\"")).1?.contains("no strong validator") == true)
        #expect(check(Self.validators(etag: nil)).0 == false)
        // After a failed split this run stays on one connection, and says why.
        #expect(check(Self.validators(), failure: .rangesIgnored).1?.contains("ignored a range request") == true)
        #expect(check(Self.validators(), failure: .restarted).1?.contains("restarted twice") == true)
        #expect(check(Self.validators(), failure: .versionsDiffer).1?.contains("different versions") == true)
        #expect(check(Self.validators(), failure: .versionsDiffer).0 == false)
    }

    /// The re-probe splits a download the probe kept on one connection when the speed since the previous look
    /// has fallen below half of the probe's, and enough is left; a connection that holds its speed, or a tail
    /// too short for two minimum splits, stays as it is. Looks happen at 2 s and 10 s.
    @Test func reprobeVerdicts() {
        let probeRate = Double(200 << 20)  // nginx's unthrottled first chunk
        func look(_ bytes: Int64, in seconds: Double, remaining: Int64 = 32 << 20) -> Bool {
            SplitPolicy.reprobe(
                bytes: bytes, seconds: seconds, probeRate: probeRate, remaining: remaining, minimumSplitSize: Self.mib)
        }
        #expect(look(4 << 20, in: 2))  // throttled to 2 MiB/s after the burst: split
        #expect(!look(300 << 20, in: 2))  // still fast
        #expect(!look(101 << 20, in: 1))  // just above half: keep
        #expect(look(99 << 20, in: 1))  // just below half: split
        #expect(!look(4 << 20, in: 2, remaining: 2 * Self.mib - 1))  // too little left
        #expect(!look(0, in: 0))
        #expect(!look(1 << 20, in: 0.01), "a look over a moment (a stall before it) says nothing")
        // Fallen from an overstated probe figure but still above what made the probe keep one connection: kept.
        #expect(!SplitPolicy.reprobe(
            bytes: 300 << 20, seconds: 2, probeRate: Double(320 << 20), remaining: 64 << 20,
            minimumSplitSize: Self.mib, singleConnectionRate: 128 << 20))
        #expect(SplitPolicy.reprobe(
            bytes: 4 << 20, seconds: 2, probeRate: Double(320 << 20), remaining: 64 << 20,
            minimumSplitSize: Self.mib, singleConnectionRate: 128 << 20))
        #expect(SplitPolicy.reprobeSeconds == [2, 10])
    }

    @Test func probeVerdicts() {
        var asked = 0
        func probe(offset: Int64, elapsed: Double, total: Int64 = 64 << 20, rate: Int64? = 128 << 20) -> SplitPolicy
            .ProbeVerdict
        {
            SplitPolicy.probe(
                offset: offset, elapsed: elapsed, total: total, singleConnectionRate: rate, minimumSplitSize: Self.mib,
                lanes: {
                    asked += 1
                    return 4
                })
        }
        // Too soon and too little: wait.
        #expect(probe(offset: 1000, elapsed: 0.001) == .wait)
        // 8 MiB in 1 ms: far above 128 MiB/s — keep one connection, saying how fast it is.
        guard case .keepOne(let notice) = probe(offset: 8 << 20, elapsed: 0.001) else {
            Issue.record("expected keepOne")
            return
        }
        #expect(notice.contains("GiB/s"), "one unit system, as the progress line: \(notice)")
        // 1 MiB in 20 ms (50 MiB/s): split.
        #expect(probe(offset: Self.mib, elapsed: 0.02) == .split)
        // No rate given: split whatever the speed.
        #expect(probe(offset: 8 << 20, elapsed: 0.001, rate: nil) == .split)
        // Less than two minimum splits left: not worth it, and the lanes were never asked for.
        let before = asked
        #expect(probe(offset: 63 << 20, elapsed: 1, total: 64 << 20) == .notWorthIt)
        #expect(asked == before, "no connections taken from a host's cap for nothing")
    }

    @Test func boundariesFallOnPieces() {
        let mib = Self.mib
        // 8 MiB over 4: every 2 MiB.
        #expect(SplitPolicy.boundaries(from: 0, total: 8 * mib, lanes: 4, pieceSize: mib, minimumSplitSize: mib)
            == [2 * mib, 4 * mib, 6 * mib])
        // More lanes than minimum splits fit: 12 parts of 1 MiB for 16 lanes.
        #expect(SplitPolicy.boundaries(from: 0, total: 12 * mib, lanes: 16, pieceSize: mib, minimumSplitSize: mib)
            == (1..<12).map { Int64($0) * mib })
        // From where the probe got to, rounded up to pieces.
        #expect(SplitPolicy.boundaries(from: 300_000, total: 8 * mib, lanes: 2, pieceSize: mib, minimumSplitSize: mib)
            == [5 * mib])
        // A piece larger than a part: boundaries on the minimum split.
        #expect(
            SplitPolicy.boundaries(from: 0, total: 8 * mib, lanes: 4, pieceSize: 4 * mib, minimumSplitSize: mib)
                == [2 * mib, 4 * mib, 6 * mib])
        // Too small to split, or one lane: none.
        #expect(SplitPolicy.boundaries(from: 0, total: mib + 1, lanes: 4, pieceSize: mib, minimumSplitSize: mib).isEmpty)
        #expect(SplitPolicy.boundaries(from: 0, total: 64 * mib, lanes: 1, pieceSize: mib, minimumSplitSize: mib).isEmpty)
        // Every boundary inside the range and increasing.
        for lanes in 2...12 {
            let cuts = SplitPolicy.boundaries(
                from: 123_456, total: 50 * mib + 7, lanes: lanes, pieceSize: mib, minimumSplitSize: 3 * mib)
            #expect(cuts == cuts.sorted() && Set(cuts).count == cuts.count)
            #expect(cuts.allSatisfy { $0 > 123_456 && $0 < 50 * mib + 7 && $0 % mib == 0 })
            #expect(cuts.count <= lanes - 1)
        }
    }
}
