import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

/// The probe of a first response and the re-probe of one kept on one connection (``SplitProbe``), sample by
/// sample, with the time passed in: when each look happens, what it concludes, what it asks and when it stops.
@Suite struct SplitProbeTests {
    static let mib: Int64 = 1 << 20

    static func probe(total: Int64 = 64 << 20, enough: Int64? = 128 << 20) -> SplitProbe {
        SplitProbe(started: 0, total: total, singleConnectionRate: enough, minimumSplitSize: mib)
    }

    /// Counts how often the lanes were asked (asking may take connections from a host's cap).
    final class Asked: @unchecked Sendable {
        var lanes = 0
        var splittable = 0
    }

    static func sample(
        _ probe: inout SplitProbe, _ offset: Int64, at seconds: Double, splittable: Bool = true,
        limit: Int64? = nil, lanes: Int = 4, asked: Asked = Asked()
    ) -> SplitProbe.Verdict {
        probe.sample(
            offset: offset, now: seconds,
            splittable: {
                asked.splittable += 1
                return splittable
            }, limitingRate: { limit },
            lanes: {
                asked.lanes += 1
                return lanes
            })
    }

    /// Too early and too little: nothing, and nothing asked. Then one look: split from where the response got
    /// to, and no more looks after it.
    @Test func theProbeSplitsOnce() {
        var probe = Self.probe(enough: nil)
        let asked = Asked()
        #expect(Self.sample(&probe, 1000, at: 0.001, asked: asked) == .none)
        #expect(probe.stage == .probing && asked.splittable == 0 && asked.lanes == 0)
        #expect(Self.sample(&probe, Self.mib, at: 0.02, asked: asked) == .split(slowdown: nil))
        #expect(probe.isDone && asked.lanes == 1)
        #expect(Self.sample(&probe, 2 * Self.mib, at: 2.5, asked: asked) == .none)
        #expect(asked.splittable == 1 && asked.lanes == 1)
    }

    /// ``SplitPolicy/probeBytes`` brought before the probe's time is a look too.
    @Test func enoughBytesAreALook() {
        var probe = Self.probe(enough: nil)
        #expect(Self.sample(&probe, SplitPolicy.probeBytes, at: 0.001) == .split(slowdown: nil))
    }

    /// A response no longer splittable (another length, no validator, splitting given up) ends the probe quietly;
    /// one with too little left keeps one connection quietly, without asking for lanes; one lane granted is no
    /// split either.
    @Test func noSplitEndsTheProbe() {
        var gone = Self.probe()
        let asked = Asked()
        #expect(Self.sample(&gone, Self.mib, at: 0.02, splittable: false, asked: asked) == .none)
        #expect(gone.isDone && asked.lanes == 0)

        var small = Self.probe(total: 3 * Self.mib / 2, enough: nil)
        #expect(Self.sample(&small, 0, at: 0.02, asked: asked) == .none)
        #expect(small.isDone && asked.lanes == 0)

        var oneLane = Self.probe(enough: nil)
        #expect(Self.sample(&oneLane, Self.mib, at: 0.02, lanes: 1) == .none)
        #expect(oneLane.isDone)
    }

    /// A connection already fast enough is kept (said once), then looked at again at 2 s and 10 s: still fast,
    /// nothing; fallen below half of the probe's speed (and below what made it keep one), the rest is split and
    /// the slowdown said with both speeds.
    @Test func aKeptConnectionIsWatched() {
        var probe = Self.probe(total: 1 << 30, enough: 100 << 20)
        // 4 MiB in 20 ms: 200 MiB/s.
        guard case .keepOne(let notice) = Self.sample(&probe, 4 * Self.mib, at: 0.02) else {
            Issue.record("not kept: \(probe.stage)")
            return
        }
        #expect(notice.hasPrefix("one connection already brings 200.0 MiB/s"))
        let probeRate = Double(4 * Self.mib) / 0.02
        #expect(probe.stage == .watching(probeRate: probeRate, lastTime: 0.02, lastOffset: 4 * Self.mib, next: 0))
        #expect(Self.sample(&probe, 8 * Self.mib, at: 1.9) == .none, "not yet time for the first look")
        // 1.98 s later it had brought 396 MiB at the same speed: kept.
        #expect(Self.sample(&probe, 400 * Self.mib, at: 2) == .none)
        guard case .watching(_, _, _, 1) = probe.stage else {
            Issue.record("\(probe.stage)")
            return
        }
        // 8 s later, only 16 MiB more: 2 MiB/s, far below.
        let verdict = Self.sample(&probe, 416 * Self.mib, at: 10)
        #expect(verdict == .split(slowdown: .init(rate: Double(2 << 20), probeRate: probeRate)))
        #expect(probe.isDone)
        if case .split(let slowdown?) = verdict {
            #expect(
                slowdown.notice(connections: 4)
                    == "the connection slowed to 2.0 MiB/s (the first moments brought 200.0 MiB/s); splitting the rest "
                    + "over 4 connections")
        }
    }

    /// A rate limit that explains the slow speed is no reason to split (the looks go on); one far above the speed
    /// explains nothing. After the last look, no more.
    @Test func aRateLimitExplainsASlowConnection() {
        var limited = Self.probe(total: 1 << 30, enough: 100 << 20)
        _ = Self.sample(&limited, 4 * Self.mib, at: 0.02)
        let asked = Asked()
        // 2 MiB/s under a 3 MiB/s limit: explained.
        #expect(Self.sample(&limited, 4 * Self.mib + 4 * Self.mib - 81_920, at: 2, limit: 3 << 20, asked: asked) == .none)
        #expect(asked.splittable == 0)
        // The second look, 2 MiB/s again, under a limit of 100 MiB/s: split.
        let second = Self.sample(&limited, 8 * Self.mib - 81_920 + 16 * Self.mib, at: 10, limit: 100 << 20)
        guard case .split(let slowdown?) = second else {
            Issue.record("\(second)")
            return
        }
        #expect(slowdown.rate == Double(2 << 20))

        var explained = Self.probe(total: 1 << 30, enough: 100 << 20)
        _ = Self.sample(&explained, 4 * Self.mib, at: 0.02)
        _ = Self.sample(&explained, 8 * Self.mib, at: 2, limit: 3 << 20)
        #expect(Self.sample(&explained, 24 * Self.mib, at: 10, limit: 3 << 20) == .none)
        #expect(explained.isDone, "two looks, then none")
        #expect(Self.sample(&explained, 25 * Self.mib, at: 30) == .none)
    }
}
