import Foundation

/// The download-level decisions about connections, as pure functions: whether a download may be split once the
/// first response has named the file, what the probe of the first response concludes, and where the boundaries of
/// a split fall. No I/O: ``DownloadRun`` passes what the server said and what the options ask, says the notices,
/// and applies the split to the part file's state. Unit tests: SplitPolicyTests.
enum SplitPolicy {
    /// Why the rest of a run uses one connection, after several connections led to a restart or a disagreement.
    enum Failure: Sendable, Hashable {
        case rangesIgnored, restarted, versionsDiffer
    }

    /// Whether the first response allows a split, and what to tell the user if not (nil: nothing worth saying —
    /// one connection was all that was wanted, or the user did not ask for several).
    static func canSplit(
        _ validators: Validators, wanted: Int, asked: Int?, minimumSplitSize: Int64, failure: Failure?
    ) -> (allowed: Bool, notice: String?) {
        guard wanted > 1 else { return (false, nil) }
        switch failure {
        case .rangesIgnored:
            return (false, "the server ignored a range request; using one connection")
        case .restarted:
            return (false, "the download restarted twice while split; using one connection for the rest of this run")
        case .versionsDiffer:
            return (
                false,
                "the server's connections answered with different versions of the file; using one connection for "
                    + "the rest of this run"
            )
        case nil:
            break
        }
        guard let total = validators.totalLength, total >= 2 * minimumSplitSize else {
            guard let asked, asked > 1 else { return (false, nil) }
            return (
                false,
                validators.totalLength == nil
                    ? "the server does not say the file's length; using one connection"
                    : "the file is too small to split; using one connection"
            )
        }
        guard validators.acceptRanges, validators.ifRange != nil else {
            return (
                false,
                validators.acceptRanges
                    ? "the server gives no strong validator (ETag or Last-Modified) to check ranges with; using one connection"
                    : "the server does not accept range requests; using one connection"
            )
        }
        return (true, nil)
    }

    /// How long the first response is received before deciding to split (or until ``probeBytes``).
    static let probeSeconds = 0.01
    static let probeBytes: Int64 = 8 << 20

    /// What the probe of the first response concludes.
    enum ProbeVerdict: Sendable, Equatable {
        /// Not long enough yet.
        case wait
        /// One connection is fast enough on its own: say so and keep it.
        case keepOne(notice: String)
        /// Keep the one connection quietly: too little left to be worth more.
        case notWorthIt
        /// Split from where the response got to.
        case split
    }

    /// The probe's verdict once the first response has brought `offset` of `total` bytes in `elapsed` seconds.
    /// `lanes` is asked last, only when a split is otherwise worth it (asking may take connections from a
    /// host's cap).
    static func probe(
        offset: Int64, elapsed: Double, total: Int64, singleConnectionRate: Int64?, minimumSplitSize: Int64,
        lanes: () -> Int
    ) -> ProbeVerdict {
        guard elapsed >= probeSeconds || offset >= probeBytes else { return .wait }
        let rate = Double(offset) / max(elapsed, 1e-6)
        if let enough = singleConnectionRate, rate >= Double(enough), offset < total {
            return .keepOne(
                notice: "one connection already brings \(rateText(rate)); not splitting (more connections help "
                    + "only where a server caps each one)")
        }
        // Not worth it for what is left (and no connections taken from the host's cap for nothing).
        guard total - offset >= 2 * minimumSplitSize, lanes() > 1 else { return .notWorthIt }
        return .split
    }

    /// A speed as the progress line shows it: IEC units, one decimal (`2.0 MiB/s`).
    static func rateText(_ bytesPerSecond: Double) -> String {
        let units = ["B/s", "KiB/s", "MiB/s", "GiB/s"]
        var value = max(0, bytesPerSecond)
        var unit = 0
        while value >= 1024, unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(Int(value)) B/s" : String(format: "%.1f %@", value, units[unit])
    }

    /// Seconds after the probe's start at which a download the probe kept on one connection is looked at again
    /// (issue 14: a server that bursts, then throttles — nginx's `limit_rate` sends its first chunk at once —
    /// fooled the 10 ms probe into keeping one connection for a whole file at the throttled speed).
    static let reprobeSeconds: [Double] = [2, 10]

    /// The re-probe's verdict: split when the speed since the previous look (`bytes` in `seconds`) has fallen
    /// below half of what the probe saw, and what is left is worth more connections.
    /// A connection still at or above `singleConnectionRate` (what made the probe keep it) stays alone however far
    /// it fell from the probe's figure, which a 10 ms window can overstate.
    static func reprobe(
        bytes: Int64, seconds: Double, probeRate: Double, remaining: Int64, minimumSplitSize: Int64,
        singleConnectionRate: Int64? = nil
    ) -> Bool {
        guard seconds >= 0.5, remaining >= 2 * minimumSplitSize else { return false }
        let rate = Double(bytes) / seconds
        if let enough = singleConnectionRate, rate >= Double(enough) { return false }
        return rate < probeRate / 2
    }

    /// Where to cut `from..<total` into `lanes` parts: none smaller than `minimumSplitSize` (more lanes than that
    /// fit only share the parts), each boundary rounded up to a piece (to the minimum split when a piece is larger
    /// than a part), a boundary that rounding repeats skipped. Empty: no split.
    static func boundaries(
        from: Int64, total: Int64, lanes: Int, pieceSize: Int64, minimumSplitSize: Int64
    ) -> [Int64] {
        let remaining = total - from
        let minimum = max(1, minimumSplitSize)
        let parts = Int64(max(1, min(lanes, Int(remaining / minimum))))
        guard parts > 1 else { return [] }
        let part = remaining / parts
        let alignment = pieceSize <= part ? pieceSize : minimum
        var boundaries: [Int64] = []
        var previous = from
        for index in 1..<Int(parts) {
            let boundary = (from + part * Int64(index) + alignment - 1) / alignment * alignment
            guard boundary > previous, boundary < total else { continue }
            boundaries.append(boundary)
            previous = boundary
        }
        return boundaries
    }
}
