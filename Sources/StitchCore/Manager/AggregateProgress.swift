/// The progress of many downloads together, for one overall progress bar and a line of counts
/// (``DownloadManager/aggregateProgress()``, ``DownloadList/aggregate``).
///
/// Every download the manager holds is counted in ``count`` and in the count of its status. The bytes, the
/// totals and ``fractionCompleted`` are those of the downloads still meant to finish or finished — queued,
/// running, paused and completed ones — and leave failed ones out (a cancelled download is failed): they move
/// no further until resumed, and would keep the bar below 1 for ever. A paused download counts, so the bar
/// shows what is left to do while it waits. ``bytesPerSecond`` is that of the running downloads.
public struct AggregateProgress: Sendable, Hashable {
    /// Bytes done over the downloads counted (queued, running, paused and completed ones).
    public var bytes: Int64 = 0
    /// The summed lengths of the counted downloads whose length is known (``TransferProgress/total``).
    public var totalBytes: Int64 = 0
    /// Bytes done over the counted downloads whose length is known: ``fractionCompleted``'s numerator, each
    /// download's part capped at its length.
    public var bytesOfKnownTotal: Int64 = 0
    /// Counted downloads whose length is not known yet (queued ones that never started, servers that do not
    /// say): a progress bar may show them as indeterminate.
    public var unknownTotalCount = 0
    /// The summed speed of the running downloads, in bytes per second.
    public var bytesPerSecond: Double = 0
    /// Every download the manager holds, whatever its status.
    public var count = 0
    /// Downloads waiting for a slot (``DownloadStatus/queued``).
    public var queued = 0
    /// Downloads transferring (``DownloadStatus/running``).
    public var running = 0
    /// Downloads stopped by ``DownloadManager/pause(_:)`` (``DownloadStatus/paused``).
    public var paused = 0
    /// Downloads whose file is at its destination (``DownloadStatus/completed``).
    public var completed = 0
    /// Downloads stopped by an error or cancelled (``DownloadStatus/failed(_:)``); left out of the bytes.
    public var failed = 0

    /// Nothing counted: no downloads.
    public init() {}

    /// The progress of `downloads` together, counted as the type's documentation says (removed ones are left
    /// out entirely).
    public init(_ downloads: some Sequence<DownloadSnapshot>) {
        self.init(statuses: downloads.lazy.map { ($0.status, $0.progress) })
    }

    init(statuses: some Sequence<(DownloadStatus, TransferProgress)>) {
        for (status, progress) in statuses {
            switch status {
            case .queued: queued += 1
            case .running: running += 1
            case .paused: paused += 1
            case .completed: completed += 1
            case .failed: failed += 1
            case .removed: continue
            }
            count += 1
            if case .failed = status { continue }
            if status == .running { bytesPerSecond += progress.bytesPerSecond }
            bytes += progress.bytes
            if let total = progress.total, total >= 0 {
                totalBytes += total
                bytesOfKnownTotal += min(max(progress.bytes, 0), total)
            } else {
                unknownTotalCount += 1
            }
        }
    }

    /// The share done of the counted downloads whose length is known (``bytesOfKnownTotal`` over
    /// ``totalBytes``), from 0 to 1: nil when no counted download has a known length, 1 when all those lengths are
    /// zero. Downloads of unknown length are not in it (see ``unknownTotalCount``).
    public var fractionCompleted: Double? {
        guard count - failed - unknownTotalCount > 0 else { return nil }
        guard totalBytes > 0 else { return 1 }
        return min(1, max(0, Double(bytesOfKnownTotal) / Double(totalBytes)))
    }

    /// Downloads queued or running: those the manager still works on.
    public var active: Int { queued + running }
}
