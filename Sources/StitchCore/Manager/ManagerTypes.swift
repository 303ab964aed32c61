/// Where a managed download stands. There are no transitional states: a download is one of these from the moment
/// an action returns. ``DownloadStatus/after(_:)`` is the whole transition table.
public enum DownloadStatus: Sendable, Hashable, CustomStringConvertible {
    /// Waiting for a free slot (the concurrency or per-host cap).
    case queued
    /// Transferring, or retrying after a network failure.
    case running
    /// Stopped by ``DownloadManager/pause(_:)``; ``DownloadManager/resumeAll()`` queues it again.
    case paused
    /// The file is at its destination, complete and verified.
    case completed
    /// Stopped by an error or by ``DownloadManager/cancel(_:)``; the partial data is kept when
    /// ``DownloadFailure/isResumable``, and ``DownloadManager/resume(_:)`` retries it.
    case failed(DownloadFailure)
    /// Gone from the manager (``DownloadManager/remove(_:deletingFiles:)``); the last state a stream reports.
    case removed

    /// The status in words, as messages show it (a failure with its message).
    public var description: String {
        switch self {
        case .queued: "queued"
        case .running: "running"
        case .paused: "paused"
        case .completed: "completed"
        case .failed(let failure): "failed: \(failure.message)"
        case .removed: "removed"
        }
    }

    /// The name stored in the catalog and shown by the CLI.
    public var name: String {
        switch self {
        case .queued: "queued"
        case .running: "running"
        case .paused: "paused"
        case .completed: "completed"
        case .failed: "failed"
        case .removed: "removed"
        }
    }

    /// The status after `action`, or nil when the action is not allowed from this status.
    ///
    /// | from \ action | start   | pause  | resume | cancel | complete  | fail   | remove  |
    /// |---------------|---------|--------|--------|--------|-----------|--------|---------|
    /// | queued        | running | paused | –      | failed | –         | –      | removed |
    /// | running       | –       | paused | –      | failed | completed | failed | removed |
    /// | paused        | –       | –      | queued | failed | –         | –      | removed |
    /// | completed     | –       | –      | –      | –      | –         | –      | removed |
    /// | failed        | –       | –      | queued | –      | –         | –      | removed |
    /// | removed       | –       | –      | –      | –      | –         | –      | –       |
    ///
    /// `start`, `complete` and `fail` are the manager's own; the others are what a user asks for.
    public func after(_ action: DownloadAction) -> DownloadStatus? {
        switch (self, action) {
        case (.queued, .start): .running
        case (.queued, .pause), (.running, .pause): .paused
        case (.paused, .resume), (.failed, .resume): .queued
        case (.queued, .cancel), (.running, .cancel), (.paused, .cancel): .failed(.cancelled)
        case (.running, .complete): .completed
        case (.running, .fail(let failure)): .failed(failure)
        case (.removed, _): nil
        case (_, .remove): .removed
        default: nil
        }
    }
}

/// What moves a download from one ``DownloadStatus`` to another.
public enum DownloadAction: Sendable, Hashable, CustomStringConvertible {
    /// `start`: the manager starts a queued download's transfer; `pause`, `resume`, `cancel`: a user asks for
    /// them (``DownloadManager/pause(_:)``, ``DownloadManager/resume(_:)``, ``DownloadManager/cancel(_:)``);
    /// `complete`: the manager has the file at its destination, complete and verified.
    case start, pause, resume, cancel, complete
    /// The manager stops a running download with this failure.
    case fail(DownloadFailure)
    /// A user removes the download (``DownloadManager/remove(_:deletingFiles:)``).
    case remove

    /// The action's name, as messages show it ("cannot pause a download that is completed").
    public var description: String {
        switch self {
        case .start: "start"
        case .pause: "pause"
        case .resume: "resume"
        case .cancel: "cancel"
        case .complete: "complete"
        case .fail: "fail"
        case .remove: "remove"
        }
    }

    /// Every action, with a sample failure: for tables and tests.
    public static let all: [DownloadAction] = [
        .start, .pause, .resume, .cancel, .complete, .fail(DownloadFailure(code: .io, message: "x")), .remove,
    ]
}

/// Why a download failed, as kept in the catalog.
public struct DownloadFailure: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of failure this is (``DownloadError/code``).
    public var code: DownloadError.Code
    /// One line for people.
    public var message: String
    /// Whether ``DownloadManager/resume(_:)`` continues from the saved partial data.
    public var isResumable: Bool
    /// The HTTP status involved, if any.
    public var httpStatus: Int?
    /// What can be done about it (``DownloadError/remedy``); not kept in the catalog.
    public var remedy: DownloadError.Remedy?

    /// A failure with these fields; resumable unless said otherwise.
    public init(
        code: DownloadError.Code, message: String, isResumable: Bool = true, httpStatus: Int? = nil,
        remedy: DownloadError.Remedy? = nil
    ) {
        self.code = code
        self.message = message
        self.isResumable = isResumable
        self.httpStatus = httpStatus
        self.remedy = remedy
    }

    init(_ error: DownloadError) {
        self.init(
            code: error.code, message: error.message, isResumable: error.isResumable, httpStatus: error.httpStatus,
            remedy: error.remedy)
    }

    /// Stopped by ``DownloadManager/cancel(_:)``.
    public static let cancelled = DownloadFailure(
        code: .cancelled, message: "cancelled; the partial download is kept", isResumable: true)

    /// The ``message``.
    public var description: String { message }
}

/// Why a ``DownloadManager`` call was refused.
///
/// Compare with the static members (`error == .closed`, `error == .unknownDownload(id)`); the kinds are not a
/// public enum, so that new ones can be added without breaking a caller's `switch` (as async-http-client's
/// `HTTPClientError`).
public struct DownloadManagerError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What was refused, and what it concerned.
    enum Code: Sendable, Hashable {
        case unknownDownload(DownloadID)
        case illegalTransition(from: DownloadStatus, action: DownloadAction)
        case pathInUse(String, by: DownloadID)
        case invalidRequest(String)
        case catalog(String)
        case closed
    }

    /// Why the call was refused.
    let code: Code

    init(_ code: Code) { self.code = code }

    /// No download has this id (never added, or removed).
    public static func unknownDownload(_ id: DownloadID) -> Self { Self(.unknownDownload(id)) }
    /// The action is not allowed from the download's status (see ``DownloadStatus/after(_:)``).
    public static func illegalTransition(from status: DownloadStatus, action: DownloadAction) -> Self {
        Self(.illegalTransition(from: status, action: action))
    }
    /// Another download of this manager already writes to `path`.
    public static func pathInUse(_ path: String, by owner: DownloadID) -> Self { Self(.pathInUse(path, by: owner)) }
    /// The URL, a header or an option is malformed; `message` says which and why.
    public static func invalidRequest(_ message: String) -> Self { Self(.invalidRequest(message)) }
    /// The catalog could not be read or written.
    public static func catalog(_ message: String) -> Self { Self(.catalog(message)) }
    /// The manager was closed.
    public static let closed = Self(.closed)

    /// Whether the call was refused because the request was malformed (``invalidRequest(_:)``), whatever the
    /// message.
    public var isInvalidRequest: Bool {
        if case .invalidRequest = code { return true }
        return false
    }

    /// Whether the catalog could not be read or written (``catalog(_:)``), whatever the message. After `pause`,
    /// `resume` or `cancel` it means the change was made but not saved: a manager opened after a crash may not
    /// know it.
    public var isCatalogFailure: Bool {
        if case .catalog = code { return true }
        return false
    }

    /// The path another download already writes to, when the refusal is ``pathInUse(_:by:)``.
    public var pathInUse: String? {
        if case .pathInUse(let path, _) = code { return path }
        return nil
    }

    /// The reason in words, as messages show it.
    public var description: String {
        switch code {
        case .unknownDownload(let id): "no download with id \(id)"
        case .illegalTransition(let from, let action): "cannot \(action) a download that is \(from.name)"
        case .pathInUse(let path, let id): "\(path) is already the destination of download \(id)"
        case .invalidRequest(let message): message
        case .catalog(let message): "catalog: \(message)"
        case .closed: "the download manager is closed"
        }
    }
}

/// Bytes, speed and time left of a managed download, as its events report them.
public struct TransferProgress: Sendable, Hashable {
    /// Bytes written to the part file.
    public var bytes: Int64
    /// The complete length, if the server said it.
    public var total: Int64?
    /// Bytes that would survive a power cut.
    public var durableBytes: Int64
    /// Smoothed download speed in bytes per second (0 until measured).
    public var bytesPerSecond: Double
    /// Seconds to go at the smoothed speed, when both the length and a speed are known.
    public var secondsLeft: Double?
    /// The byte ranges written, in order, touching ones joined (a piece map: aria2's `bitfield`); empty while
    /// unknown.
    public var writtenRanges: [Range<Int64>] = []
    /// The size of the pieces the download is checked in; nil while unknown.
    public var pieceLength: Int64?
    /// Requests transferring while it runs (each over a connection of its own).
    public var connections = 0

    /// Progress with these values; by default nothing done, no length and no speed.
    public init(
        bytes: Int64 = 0, total: Int64? = nil, durableBytes: Int64 = 0, bytesPerSecond: Double = 0,
        secondsLeft: Double? = nil, writtenRanges: [Range<Int64>] = [], pieceLength: Int64? = nil,
        connections: Int = 0
    ) {
        self.bytes = bytes
        self.total = total
        self.durableBytes = durableBytes
        self.bytesPerSecond = bytesPerSecond
        self.secondsLeft = secondsLeft
        self.writtenRanges = writtenRanges
        self.pieceLength = pieceLength
        self.connections = connections
    }

    /// Which pieces of `pieceLength` are written whole: piece 0 first (nil while the length or the pieces are
    /// unknown).
    public var writtenPieces: [Bool]? {
        guard let total, let pieceLength, pieceLength > 0, total >= 0 else { return nil }
        // Divisions that cannot overflow, whatever length a server announced.
        func pieces(_ bytes: Int64) -> Int64 { bytes / pieceLength + (bytes % pieceLength == 0 ? 0 : 1) }
        // At most a million: a state's pieces are far fewer (4,096), a crafted one is not drawn.
        guard pieces(total) <= 1 << 20 else { return nil }
        let count = Int(pieces(total))
        var map = [Bool](repeating: false, count: count)
        for range in writtenRanges where range.lowerBound >= 0 {
            // Pieces whose every byte lies in the range (the last piece ends at the file's end).
            var piece = Int(pieces(range.lowerBound))
            while piece < count {
                let start = Int64(piece) * pieceLength  // below total: no overflow
                guard start + min(pieceLength, total - start) <= range.upperBound else { break }
                map[piece] = true
                piece += 1
            }
        }
        return map
    }

    /// The share of the file done, from 0 to 1 (`bytes / total`, clamped): nil while the length is unknown, 1 for
    /// a zero-byte file. For a progress bar; bytes beyond a wrong `total` never make it more than 1.
    public var fractionCompleted: Double? {
        guard let total, total >= 0 else { return nil }
        guard total > 0 else { return 1 }
        return min(1, max(0, Double(bytes) / Double(total)))
    }
}

/// One download as the manager sees it at a moment.
public struct DownloadSnapshot: Sendable, Hashable, Identifiable {
    /// The download's identifier.
    public var id: DownloadID
    /// The URL it downloads from now.
    public var url: String
    /// Extra request headers, sent on every request.
    public var headers: HTTPHeaders
    /// The path given when added: a file, or the folder the file is named into.
    public var destination: Destination
    /// The file's path once known (with a folder, after the first response).
    public var path: String?
    /// Where it stands.
    public var status: DownloadStatus
    /// Bytes, speed and time left.
    public var progress: TransferProgress
    /// Higher runs first; equal priorities run in ``position`` order.
    public var priority: Int
    /// Its place among the downloads of its ``priority``: lower starts first.
    public var position: Int64
    /// The digest the finished file is verified against, if one was given.
    public var checksum: ExpectedChecksum?
    /// Seconds since the epoch.
    public var addedAt: Double
    /// This download's own limit in bytes per second (within the manager's), if it has one.
    public var rateLimit: Int64? = nil
    /// Every URL of the file, the current one (``url``) among them.
    public var mirrors: [String] = []
    /// This download's own engine settings.
    public var tuning = DownloadManager.Tuning()
    /// The connections it was given (``DownloadManager/AddOptions/connections``); nil for the manager's choice.
    public var connections: Int? = nil
    /// Whether it may replace a file at its destination that Stitch did not leave
    /// (``DownloadManager/AddOptions/overwrite``).
    public var overwrite = false
    /// Whether it is fetched only if newer than the file at its destination
    /// (``DownloadManager/AddOptions/ifNewer``).
    public var ifNewer = false
    /// Its own proxies (``DownloadManager/AddOptions/proxies``), credentials included: a caller that shows them
    /// hides the passwords.
    public var proxies = DownloadManager.Proxies()
    /// The last problem it met, in plain words: the reason of its last retry or restart from zero, or its
    /// failure; nil when none.
    public var lastProblem: String? = nil
    /// Once it completed: the digest of the whole file the server announced and the file matched, as
    /// `FIELD algorithm=hex` (`Repr-Digest sha-256=…`); nil when the server announced none (not kept across a
    /// restart of the manager).
    public var verifiedDigest: String? = nil
}

/// What the manager reports as downloads move.
public enum DownloadManagerEvent: Sendable, Hashable {
    /// A download was added; its snapshot at that moment.
    case added(DownloadSnapshot)
    /// The download moved to this status.
    case statusChanged(DownloadID, DownloadStatus)
    /// At most about ten a second per download.
    case progress(DownloadID, TransferProgress)
    /// The file's final path is known.
    case pathResolved(DownloadID, String)
    /// The bytes kept could not be trusted (the file changed, the server ignored a range, …): the download
    /// starts over from zero, for this reason.
    case restarting(DownloadID, RestartReason)
    /// A failure the download may recover from: it asks again after `delay` seconds (retry `attempt` of
    /// `maxRetries`).
    case retrying(DownloadID, attempt: Int, maxRetries: Int, delay: Double, reason: String)
    /// The file was already complete at its destination: nothing was fetched.
    case alreadyComplete(DownloadID)
    /// Something else worth telling that changes nothing (a fallback, a connection replaced or retired).
    case notice(DownloadID, String)

    /// The download the event is about.
    public var id: DownloadID {
        switch self {
        case .added(let snapshot): snapshot.id
        case .statusChanged(let id, _), .progress(let id, _), .pathResolved(let id, _), .notice(let id, _),
            .restarting(let id, _), .retrying(let id, _, _, _, _), .alreadyComplete(let id):
            id
        }
    }
}

/// A download's speed for people: the bytes over the last few seconds divided by the time they took.
///
/// A moving window rather than an average of instant rates: servers and rate limits deliver in bursts (nginx's
/// `limit_rate` sends a second's worth at once), so two samples half a second apart may see no new bytes at all
/// and an average of instant rates drops to `0 B/s` and back. Over a window of a few seconds the figure is what
/// the bytes on disk say. Used by ``DownloadManager``'s snapshots and by the `stitch` progress lines.
public struct SpeedMeter: Sendable {
    /// How far back the speed looks, in seconds.
    public var window: Double
    /// Bytes per second over the window; 0 until samples span a tenth of a second.
    public private(set) var bytesPerSecond: Double = 0
    /// Whether samples have spanned a tenth of a second since the meter began (or was reset): until then
    /// ``bytesPerSecond`` is 0 for want of a measurement, not because nothing arrives.
    public private(set) var hasMeasured = false
    /// (bytes, monotonic seconds), oldest first; the oldest is at or just beyond the window's start.
    private var samples: [(bytes: Int64, time: Double)] = []

    /// A meter looking `window` seconds back.
    public init(window: Double = 3) {
        self.window = window
    }

    /// Records that `bytes` were done at `time` (monotonic seconds). Fewer bytes than before (a restart from
    /// zero) start the window afresh, with no speed until it is measured again.
    public mutating func add(bytes: Int64, at time: Double) {
        if let last = samples.last, bytes < last.bytes || time < last.time { reset() }
        if let last = samples.last, time - last.time < 0.05, samples.count > 1 {
            samples[samples.count - 1] = (bytes, time)
        } else {
            samples.append((bytes, time))
        }
        // Keep one sample at or beyond the window's start, so the span always covers the window once it can.
        while samples.count > 2, time - samples[1].time >= window { samples.removeFirst() }
        guard let first = samples.first, time - first.time >= 0.1 else { return }
        bytesPerSecond = Double(bytes - first.bytes) / (time - first.time)
        hasMeasured = true
    }

    /// Forgets every sample (the download stopped).
    public mutating func reset() {
        bytesPerSecond = 0
        hasMeasured = false
        samples.removeAll()
    }

    /// Seconds until `total` at the current speed; nil without a total or a speed.
    public func secondsLeft(bytes: Int64, total: Int64?) -> Double? {
        guard let total, bytesPerSecond > 0 else { return nil }
        return Double(max(0, total - bytes)) / bytesPerSecond
    }
}
