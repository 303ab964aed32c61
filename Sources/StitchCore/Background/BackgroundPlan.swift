// The pure parts of the background driver (docs/background-sessions.md): what a task is for, how a file is cut
// into ranges, and the verdict on a finished task. Table-tested in BackgroundPlanTests without sockets or files.

/// What a download task is asked for, written into its label (`taskDescription`) so that a relaunched driver can
/// tell which download, which generation of it and which bytes a task's file holds.
struct TaskLabel: Sendable, Hashable, CustomStringConvertible {
    enum Kind: String, Sendable, Hashable {
        /// The first bytes, asked for without a validator, to learn the length and the validators.
        case probe = "p"
        /// A range of a file whose strong validator is sent in `If-Range`.
        case range = "r"
        /// The whole file, from zero (no strong validator, or no ranges).
        case whole = "w"
    }

    static let prefix = "stitch1"

    var download: DownloadID
    /// The download's generation (its record's nonce): redrawn at each restart from zero, so that tasks of an
    /// earlier generation are recognisably stale.
    var nonce: String
    var kind: Kind
    var start: Int64
    /// One past the last byte asked for; nil for the whole file.
    var end: Int64?

    var description: String {
        "\(Self.prefix) \(download) \(nonce) \(kind.rawValue) \(start) \(end.map(String.init) ?? "*")"
    }

    init(download: DownloadID, nonce: String, kind: Kind, start: Int64, end: Int64?) {
        self.download = download
        self.nonce = nonce
        self.kind = kind
        self.start = start
        self.end = end
    }

    /// Parses a label; nil for anything that is not exactly one of ours.
    init?(parsing text: String) {
        let fields = text.split(separator: " ", omittingEmptySubsequences: false)
        guard fields.count == 6, fields[0] == Self.prefix, let download = DownloadID(String(fields[1])),
            fields[1].utf8.count == 16, !fields[2].isEmpty, fields[2].utf8.count <= 16,
            UInt64(fields[2], radix: 16) != nil, let kind = Kind(rawValue: String(fields[3])),
            let start = ContentRange.number(fields[4])
        else { return nil }
        let end: Int64?
        if fields[5] == "*" {
            end = nil
        } else {
            guard let value = ContentRange.number(fields[5]), value > start else { return nil }
            end = value
        }
        switch kind {
        case .probe: guard start == 0, end != nil else { return nil }
        case .range: guard end != nil else { return nil }
        case .whole: guard start == 0, end == nil else { return nil }
        }
        self.init(download: download, nonce: String(fields[2]), kind: kind, start: start, end: end)
    }

    /// The `Range` header this label's request sends, or nil for the whole file.
    var rangeHeader: String? {
        guard let end else { return nil }
        return "bytes=\(start)-\(end - 1)"
    }
}

/// The verdict on a finished task's head and file.
enum TaskVerdict: Sendable, Hashable {
    /// The first bytes of a file that can be fetched in validated ranges: the file holds `0..<fileSize`.
    case probed(Validators)
    /// The probe's answer cannot be continued in ranges (no strong validator, or no ranges): it is dropped and the
    /// whole file asked for in one task.
    case needsWholeFile(Validators)
    /// The whole file, from zero: the file is it (its length is `validators.totalLength`).
    case whole(Validators)
    /// Exactly the bytes asked for, of the known version.
    case range
    /// The file on the server is not the one the saved bytes are of: start again from zero.
    case restart(RestartReason)
    /// Not taken; worth asking again (a temporary status, a short or long file, a malformed answer), after the
    /// server's `Retry-After` if it sent one.
    case retry(String, retryAfter: String? = nil)
    /// Not taken; asking again would bring the same (a 404, a refused encoding).
    case fail(String)
}

enum BackgroundPlan {
    /// Judges a finished task: its label, the final response head, the size of its file, and the validators the
    /// download's saved bytes were judged against (nil before the probe). Only what `evaluate` of the engine would
    /// accept for the same request is taken, plus the size check that a file (unlike a stream) allows.
    static func judge(_ label: TaskLabel, head: ResponseHead?, fileSize: Int64, known: Validators?) -> TaskVerdict {
        guard let head else { return .retry("no response") }
        let status = head.status
        if status == 200 || status == 206, let problem = head.headers.bodyFramingProblem { return .fail(problem) }
        switch status {
        case 200, 206: break
        case 408, 429, 500...599: return .retry("the server answered \(status)", retryAfter: head.headers["Retry-After"])
        case 416 where label.kind == .range: return .restart(.rangeNotSatisfiable)
        case 416 where label.kind == .probe:
            // An empty file: no byte to ask for. Its answer's body (an error page) is not the file.
            guard head.headers["Content-Range"].flatMap(ContentRange.init(parsing:))?.completeLength == 0 else {
                return .fail("the server answered 416")
            }
            var validators = Validators(from: head)
            validators.totalLength = 0
            return .whole(validators)
        default: return .fail("the server answered \(status)")
        }
        let fresh = Validators(from: head)
        switch label.kind {
        case .whole:
            guard status == 200 else { return .retry("a partial response (206) to a request for the whole file") }
            if let length = fresh.totalLength, length != fileSize {
                return .retry("the body has \(fileSize) of the \(length) bytes announced")
            }
            var validators = fresh
            validators.totalLength = fileSize
            return .whole(validators)
        case .probe:
            let asked = label.end!
            if status == 200 {
                if let length = fresh.totalLength, length != fileSize {
                    return .retry("the body has \(fileSize) of the \(length) bytes announced")
                }
                var validators = fresh
                validators.totalLength = fileSize
                return .whole(validators)
            }
            let header = head.headers["Content-Range"] ?? ""
            guard let range = ContentRange(parsing: header), range.first == 0, let last = range.last,
                let total = range.completeLength, last < total, last + 1 == min(asked, total)
            else { return .retry("the server's Content-Range (\(header.isEmpty ? "none" : header)) does not match the request") }
            guard fileSize == last + 1 else {
                return .retry("the body has \(fileSize) of the \(last + 1) bytes announced")
            }
            var validators = fresh
            validators.acceptRanges = true
            // A file the probe brought whole needs no validator to continue it.
            if total == fileSize { return .whole(validators) }
            return validators.ifRange == nil ? .needsWholeFile(validators) : .probed(validators)
        case .range:
            let start = label.start
            let end = label.end!
            if status == 200 {
                return .restart(ResumePolicy.change(from: known, to: fresh) ?? .rangeIgnored)
            }
            let header = head.headers["Content-Range"] ?? ""
            guard let range = ContentRange(parsing: header), range.first == start, range.last == end - 1,
                let total = range.completeLength, total == known?.totalLength
            else {
                // Another length is another file; another span of this one is a server not answering what was asked.
                if let total = ContentRange(parsing: header)?.completeLength, let old = known?.totalLength,
                    total != old
                {
                    return .restart(.lengthChanged(old: old, new: total))
                }
                return .restart(.contentRangeMismatch(header))
            }
            if let change = ResumePolicy.change(from: known, to: fresh) { return .restart(change) }
            guard fileSize == end - start else {
                return .retry("the body has \(fileSize) of the \(end - start) bytes asked for")
            }
            return .range
        }
    }

    /// The ranges to cut `start..<total` into: each at least `rangeSize` bytes (rounded up to whole pieces), no
    /// more than `maximumRanges` of them, each boundary on a piece boundary where `start` is on one.
    static func ranges(from start: Int64, to total: Int64, rangeSize: Int64, pieceSize: Int64, maximumRanges: Int)
        -> [Range<Int64>]
    {
        guard start < total else { return [] }
        let rest = total - start
        let count = Int64(max(1, maximumRanges))
        var step = max(rangeSize, rest / count + (rest % count == 0 ? 0 : 1), 1)
        step = (step / pieceSize + (step % pieceSize == 0 ? 0 : 1)) * pieceSize
        var cuts: [Range<Int64>] = []
        var at = start
        while at < total {
            let next = total - at > step ? at + step : total
            cuts.append(at..<next)
            at = next
        }
        return cuts
    }

    /// The ranges still to fetch: each segment's bytes past its durable extent.
    static func missing(_ segments: [Segment]) -> [Range<Int64>] {
        segments.compactMap { segment in
            guard let end = segment.end, segment.durable < end else { return nil }
            return segment.durable..<end
        }.sorted { $0.lowerBound < $1.lowerBound }
    }

    /// What to do with the tasks a session reports after a relaunch, given the download's generation and the ranges
    /// it still needs: the tasks to keep (one per needed range), the tasks to cancel (stale generations, unknown
    /// ranges, duplicates), and the ranges that need a new task.
    static func reconcile(
        tasks: [(taskID: Int, label: TaskLabel)], download: DownloadID, nonce: String, kind: TaskLabel.Kind,
        needed: [Range<Int64>]
    ) -> (keep: [Int: TaskLabel], cancel: [Int], create: [Range<Int64>]) {
        var keep: [Int: TaskLabel] = [:]
        var cancel: [Int] = []
        var covered: Set<Int64> = []
        let wanted = Dictionary(needed.map { ($0.lowerBound, $0) }, uniquingKeysWith: { first, _ in first })
        for (taskID, label) in tasks.sorted(by: { $0.taskID < $1.taskID }) where label.download == download {
            let matches =
                label.nonce == nonce && label.kind == kind && !covered.contains(label.start)
                && (kind != .range || wanted[label.start].map { $0.upperBound == label.end } == true)
            if matches {
                keep[taskID] = label
                covered.insert(label.start)
            } else {
                cancel.append(taskID)
            }
        }
        let create = needed.filter { !covered.contains($0.lowerBound) }
        return (keep, cancel, create)
    }
}
