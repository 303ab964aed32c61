import Testing

@testable import Stitch
@testable import StitchCore

/// The speed people see (``SpeedMeter``): bytes over a window of seconds, whatever the bursts.
@Suite struct SpeedMeterTests {
    static let mib = Double(1 << 20)

    /// A steady 5 MiB/s sampled every quarter second reads 5 MiB/s once a tenth of a second has passed.
    @Test func steadyRateIsExact() {
        var meter = SpeedMeter()
        #expect(meter.bytesPerSecond == 0)
        for step in 0...40 {
            let time = Double(step) * 0.25
            meter.add(bytes: Int64(time * 5 * Self.mib), at: 100 + time)
            if step >= 1 { #expect(abs(meter.bytesPerSecond - 5 * Self.mib) < 1, "step \(step)") }
        }
        #expect(meter.secondsLeft(bytes: Int64(10 * 5 * Self.mib), total: Int64(20 * 5 * Self.mib)) == 10)
    }

    /// A server that sends a second's worth at once (nginx's limit_rate, 2 MiB/s): sampled every quarter second,
    /// most samples see no new bytes. Once the window is full the figure stays within a third of 2 MiB/s and is
    /// never 0 (the demo showed "0 B/s" for a download at 2 MiB/s).
    @Test func burstsAverageOut() {
        var meter = SpeedMeter(window: 3)
        var seen: [Double] = []
        for step in 0...80 {
            let time = Double(step) * 0.25
            let bursts = Int64(time) + 1  // one at 0 s, 1 s, 2 s, …
            meter.add(bytes: bursts * 2 << 20, at: time)
            if time >= 3 { seen.append(meter.bytesPerSecond) }
        }
        #expect(seen.allSatisfy { $0 > 2 * Self.mib * 2 / 3 && $0 < 2 * Self.mib * 4 / 3 }, "\(seen.map { $0 / Self.mib })")
        let sorted = seen.sorted()
        #expect(abs(sorted[sorted.count / 2] - 2 * Self.mib) < 0.1 * 2 * Self.mib)
    }

    /// Samples spanning under a tenth of a second give no figure yet (too short to mean anything); from a tenth on
    /// they do, so the first progress line after a body began (the CLI's sample at its start) has a speed.
    @Test func aTenthOfASecondIsEnough() {
        var meter = SpeedMeter()
        meter.add(bytes: 0, at: 50)
        meter.add(bytes: 1 << 20, at: 50.06)
        #expect(meter.bytesPerSecond == 0)
        #expect(!meter.hasMeasured)
        meter.add(bytes: 2 << 20, at: 50.125)
        #expect(abs(meter.bytesPerSecond - 16 * Self.mib) < 1)
        #expect(meter.hasMeasured)
    }

    /// Fewer bytes than before (a restart from zero) start afresh: the figure comes from the new bytes only.
    @Test func restartStartsTheWindowAgain() {
        var meter = SpeedMeter()
        for step in 0...8 { meter.add(bytes: Int64(step) * (8 << 20), at: Double(step)) }
        #expect(abs(meter.bytesPerSecond - 8 * Self.mib) < 1)
        meter.add(bytes: 0, at: 9)
        // Not the old figure while the new window is too short to measure.
        #expect(meter.bytesPerSecond == 0)
        #expect(!meter.hasMeasured)
        meter.add(bytes: 1 << 20, at: 10)
        #expect(abs(meter.bytesPerSecond - Self.mib) < 1)
        #expect(meter.hasMeasured)
        meter.reset()
        #expect(meter.bytesPerSecond == 0)
        #expect(!meter.hasMeasured)
        #expect(meter.secondsLeft(bytes: 0, total: 100) == nil)
    }
}
