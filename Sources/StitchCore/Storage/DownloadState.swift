import Foundation

/// The state file beside a partial download (`NAME.stitch`): versioned JSON, rewritten atomically at each
/// durable checkpoint. Documented in docs/state-file.md.
struct DownloadState: Codable, Sendable, Hashable {
    /// The format this stitch writes.
    static let currentSchemaVersion = 3
    /// The formats it reads: 2 (written before proofs existed; upgraded at the next write) and 3.
    static let readableSchemaVersions = 2...3

    var schemaVersion: Int = DownloadState.currentSchemaVersion
    /// The URL the user asked for (before redirects).
    var url: String
    /// The user's extra request headers, as "Name: value".
    var headers: [String]
    var checksum: String?
    var validators: Validators
    /// The byte ranges of the file and, for each, how much of it is on stable storage. Together they cover the
    /// file without overlapping; new segments are only appended (their index is their live-record slot).
    var segments: [Segment]
    /// The size of the pieces whose checksums `pieces` records (a power of two, at least 1 MiB).
    var pieceSize: Int64 = PieceLayout.minimumPieceSize
    /// CRC32C of each piece known to be durable and correct, by piece index; nil where not (yet) recorded.
    var pieces: [UInt32?] = []
    /// CRC32C of the durable bytes no recorded piece covers, by range (format 3; empty in a format 2 state). Written
    /// by every state write of a ``PartStore``: then every durable byte lies in a recorded piece or in exactly one
    /// proof, and each proof lies within one piece and one segment's durable extent (``Proofs``).
    var proofs: [Proof] = []
    /// Set for a download that began from another program's partial download (`--adopt`); absent otherwise (and
    /// in state files written before it existed).
    var adoption: AdoptionRecord? = nil
    /// True for the partial of a newer file begun under ``DownloadRequest/ifNewer`` beside the destination's older
    /// one, which it replaces once complete; absent otherwise (a partial that may not replace a file there).
    var replacesDestination: Bool? = nil
    /// The boot that wrote this file; the live record is trusted only within the same boot.
    var bootID: String
    /// Pairs this state with its live record (hex); redrawn at every restart from zero.
    var liveNonce: String
    var updatedAt: Int64

    var nonce: UInt64 { UInt64(liveNonce, radix: 16) ?? 0 }

    /// Bytes on stable storage, over all segments.
    var durableBytes: Int64 { segments.reduce(0) { $0 + ($1.durable - $1.start) } }

    /// The durable bytes from offset 0 without a gap (what a single connection resumes from).
    var durablePrefix: Int64 {
        var end: Int64 = 0
        for segment in segments.sorted(by: { $0.start < $1.start }) {
            guard segment.start == end else { break }
            end = segment.durable
            guard segment.end == segment.durable else { break }
        }
        return end
    }

    /// Checks the invariants a reader relies on; returns what is wrong, or nil.
    func problem() -> String? {
        guard UInt64(liveNonce, radix: 16) != nil else { return "bad nonce" }
        guard !segments.isEmpty, segments.count <= LiveRecord.slotCount else { return "bad segment count" }
        let total = validators.totalLength
        if let total, total < 0 { return "negative length" }
        var previousEnd: Int64 = 0
        for (index, segment) in segments.sorted(by: { $0.start < $1.start }).enumerated() {
            guard segment.start >= 0, segment.durable >= segment.start else { return "impossible segment" }
            if index > 0, segment.start < previousEnd { return "overlapping segments" }
            if let end = segment.end {
                guard end >= segment.durable, end <= total ?? Int64.max else { return "impossible segment" }
                previousEnd = end
            } else {
                guard total == nil, segments.count == 1 else { return "open segment beside others" }
                previousEnd = Int64.max
            }
        }
        // With a known length the segments tile the file exactly.
        if let total {
            let sorted = segments.sorted { $0.start < $1.start }
            var expected: Int64 = 0
            for segment in sorted {
                guard segment.start == expected, let end = segment.end else { return "segments do not cover the file" }
                expected = end
            }
            guard expected == total else { return "segments do not cover the file" }
        }
        guard pieceSize >= PieceLayout.minimumPieceSize, pieceSize.nonzeroBitCount == 1 else { return "bad piece size" }
        // Rounded up without `total + pieceSize - 1`, which overflows for a length near Int64.max (found by
        // Fuzz/Targets/StateFile.swift).
        if let total, Int64(pieces.count) > total / pieceSize + (total % pieceSize == 0 ? 0 : 1) {
            return "too many pieces"
        }
        if total == nil, !pieces.isEmpty { return "pieces without a length" }
        if let problem = proofProblem() { return problem }
        return nil
    }

    /// What is wrong with `proofs`, or nil: each must be a non-empty range within one segment's durable extent and
    /// (with a known length) within one piece, in order without overlapping, and there may be no more than a state
    /// written by a checkpoint can hold.
    private func proofProblem() -> String? {
        guard !proofs.isEmpty else { return nil }
        guard proofs.count <= Proofs.maximumCount else { return "too many proofs" }
        let durable = segments.filter { $0.durable > $0.start }.sorted { $0.start < $1.start }
        var previousEnd: Int64 = 0
        for proof in proofs {
            guard proof.start >= previousEnd, proof.end > proof.start else { return "impossible proof" }
            guard durable.contains(where: { $0.start <= proof.start && proof.end <= $0.durable }) else {
                return "proof outside the durable bytes"
            }
            if validators.totalLength != nil, proof.start / pieceSize != (proof.end - 1) / pieceSize {
                return "proof across pieces"
            }
            previousEnd = proof.end
        }
        return nil
    }
}

/// The CRC32C of the bytes `start..<end` of the part file, as they were when a checkpoint made them durable.
struct Proof: Codable, Sendable, Hashable {
    var start: Int64
    var end: Int64
    var crc: UInt32
}

extension DownloadState {
    /// Decodes format 2 (which has no `proofs`) and format 3 (which must have them).
    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        schemaVersion = try container.decode(Int.self, forKey: .schemaVersion)
        url = try container.decode(String.self, forKey: .url)
        headers = try container.decode([String].self, forKey: .headers)
        checksum = try container.decodeIfPresent(String.self, forKey: .checksum)
        validators = try container.decode(Validators.self, forKey: .validators)
        segments = try container.decode([Segment].self, forKey: .segments)
        pieceSize = try container.decode(Int64.self, forKey: .pieceSize)
        pieces = try container.decode([UInt32?].self, forKey: .pieces)
        proofs = schemaVersion < 3 ? [] : try container.decode([Proof].self, forKey: .proofs)
        adoption = try container.decodeIfPresent(AdoptionRecord.self, forKey: .adoption)
        replacesDestination = try container.decodeIfPresent(Bool.self, forKey: .replacesDestination)
        bootID = try container.decode(String.self, forKey: .bootID)
        liveNonce = try container.decode(String.self, forKey: .liveNonce)
        updatedAt = try container.decode(Int64.self, forKey: .updatedAt)
    }
}

/// What `--adopt` found where a download began: which program's partial it was, and whether its bytes are the
/// ones being continued (`kept`) or the download started from zero beside it and replaces it when complete.
struct AdoptionRecord: Codable, Sendable, Hashable {
    enum Origin: String, Codable, Sendable, Hashable {
        /// `wget -c` or `curl -C -`: the file alone.
        case prefix
        /// aria2c: the file and `FILE.aria2`, which is removed when the download ends.
        case aria2
    }

    var origin: Origin
    var kept: Bool
}

/// A byte range of the download: `start..<end` (open-ended while the length is unknown), of which
/// `start..<durable` is on stable storage.
struct Segment: Codable, Sendable, Hashable {
    var start: Int64
    var end: Int64?
    var durable: Int64

    var isComplete: Bool { end.map { durable >= $0 } ?? false }
}

/// How a download's bytes are cut into checksummed pieces.
enum PieceLayout {
    static let minimumPieceSize: Int64 = 1 << 20
    /// At most this many pieces, so the state file stays small for any size.
    static let maximumPieces: Int64 = 4096

    /// 1 MiB, doubled until the file has at most `maximumPieces` pieces.
    static func pieceSize(forTotal total: Int64?) -> Int64 {
        var size = minimumPieceSize
        guard let total else { return size }
        // `total / size` rounded up without `total + size - 1`, which overflows for a hostile length near Int64.max.
        while total / size + (total % size == 0 ? 0 : 1) > maximumPieces { size *= 2 }
        return size
    }
}

enum StateFile {
    /// Larger than any state file we write; a bigger file is not ours.
    static let maximumSize = 1 << 20

    /// The previous generation's state to resume from when the state file at `paths` is damaged: one that reads
    /// cleanly, beside a part file. (Without a length it has no piece checksums, so it proves no byte: the download
    /// starts over, but as the download of the URL it names.) None when the state file is in another format (a
    /// newer stitch's, not a damaged one).
    static func fallback(for paths: DownloadPaths) -> DownloadState? {
        guard isDamaged(paths.state), let previous = try? read(paths.previousState), access(paths.part, F_OK) == 0
        else { return nil }
        return previous
    }

    /// Whether the file at `path` is there but unreadable as a state — not one that reads, and not one of another
    /// format (a JSON object declaring another `schemaVersion`, which a newer stitch wrote).
    static func isDamaged(_ path: String) -> Bool {
        do {
            _ = try read(path)
            return false
        } catch {
            guard error.code == .unusableState else { return false }
        }
        struct VersionProbe: Decodable { var schemaVersion: Int }
        var info = stat()
        guard stat(path, &info) == 0, Int(info.st_size) <= maximumSize,
            let data = FileManager.default.contents(atPath: path),
            let version = (try? JSONDecoder().decode(VersionProbe.self, from: data))?.schemaVersion
        else { return true }
        return DownloadState.readableSchemaVersions.contains(version)
    }

    /// Reads the state at `path`; `nil` if there is none.
    static func read(_ path: String) throws(DownloadError) -> DownloadState? {
        guard
            let bytes = try readSmallFile(
                path, what: "state file", maximumSize: maximumSize,
                tooLarge: DownloadError(.unusableState, "\(path) is not a Stitch state file (too large)"))
        else { return nil }
        struct VersionProbe: Decodable { var schemaVersion: Int }
        let decoder = JSONDecoder()
        guard let probe = try? decoder.decode(VersionProbe.self, from: Data(bytes)) else {
            throw DownloadError(.unusableState, "\(path) is corrupt (not a Stitch state file)")
        }
        guard DownloadState.readableSchemaVersions.contains(probe.schemaVersion) else {
            throw DownloadError(
                .unusableState,
                "\(path) has state format \(probe.schemaVersion); this stitch reads format \(DownloadState.currentSchemaVersion) "
                    + "(and format 2, which it upgrades)"
            )
        }
        do {
            let state = try decoder.decode(DownloadState.self, from: Data(bytes))
            if let problem = state.problem() {
                throw DownloadError(.unusableState, "\(path) is corrupt (\(problem))")
            }
            return state
        } catch let error as DownloadError {
            throw error
        } catch {
            throw DownloadError(.unusableState, "\(path) is corrupt (\(describe(error)))")
        }
    }

    /// What a state write does with the previous generation (``DownloadPaths/previousState``).
    enum PreviousGeneration {
        /// The file being replaced becomes the previous generation: it describes the same bytes.
        case keep
        /// Any previous generation is removed: the new state describes other bytes (a start from zero).
        case remove
        /// The previous generation is left as it is: the file being replaced is damaged, and the previous one
        /// is what the new state was rebuilt from.
        case leave
    }

    /// Replaces the state at `path` so that a crash or power cut at any instant leaves either the old or the
    /// new file: write a temporary file, fsync it, rename it over, fsync the directory.
    ///
    /// With `previous`, before the rename: `.keep` hard-links the current file to `path.lnk` and renames that over
    /// `previous`, so `previous` is always a whole state file, the older or the newer one (best effort — a file
    /// system without hard links keeps no previous generation); `.remove` unlinks `previous`. The directory sync
    /// makes either durable with the new state.
    static func write(
        _ state: DownloadState, to path: String, previous: String? = nil, generation: PreviousGeneration = .keep
    ) throws(DownloadError) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        let data: Data
        do { data = try encoder.encode(state) } catch {
            throw DownloadError(.io, "cannot encode state: \(error)")
        }
        let temporary = path + ".tmp"
        try writeSynced(data, to: temporary, what: "state file")
        if let previous {
            switch generation {
            case .keep:
                let link = path + ".lnk"
                var linked = systemLink(path, link) == 0
                if !linked && errno == EEXIST {  // left by a crash here
                    unlink(link)
                    linked = systemLink(path, link) == 0
                }
                // Not linked (no state yet, or no hard links here): `previous` stays as it was. Renaming a name
                // over another name of the same file (a crash between the two renames) does nothing: unlink it.
                if linked && (rename(link, previous) != 0 || access(link, F_OK) == 0) { unlink(link) }
            case .remove:
                unlink(previous)
            case .leave:
                break
            }
        }
        guard rename(temporary, path) == 0 else {
            let error = Errno.current
            unlink(temporary)
            throw .io("cannot replace state file", path: path, error)
        }
        try syncDirectory(containing: path)
    }

    private static func describe(_ error: any Error) -> String {
        if case DecodingError.keyNotFound(let key, _) = error { return "missing \(key.stringValue)" }
        if case DecodingError.typeMismatch(_, let context) = error {
            return "bad value at \(context.codingPath.map(\.stringValue).joined(separator: "."))"
        }
        return "unreadable"
    }
}

/// The whole file at `path` (nil when there is none), read in chunks; `tooLarge` once it passes `maximumSize`
/// bytes (a state file, a control file: small files whose size a damaged or hostile one must not decide).
func readSmallFile(
    _ path: String, what: String, maximumSize: Int, noFollow: Bool = false, tooLarge: @autoclosure () -> DownloadError
) throws(DownloadError) -> [UInt8]? {
    let fd = retryingOnInterrupt { open(path, O_RDONLY | O_CLOEXEC | (noFollow ? O_NOFOLLOW : 0)) }
    if fd < 0 {
        if errno == ENOENT { return nil }
        throw .io("cannot read \(what)", path: path, .current)
    }
    defer { close(fd) }
    var bytes = [UInt8]()
    var chunk = [UInt8](repeating: 0, count: 64 * 1024)
    while true {
        let n = chunk.withUnsafeMutableBytes { buffer in
            retryingOnInterrupt { systemRead(fd, buffer.baseAddress, buffer.count) }
        }
        if n < 0 { throw .io("cannot read \(what)", path: path, .current) }
        if n == 0 { return bytes }
        bytes += chunk[0..<n]
        if bytes.count > maximumSize { throw tooLarge() }
    }
}

/// Writes `data` to a new file at `path` (replacing one there) and fsyncs it: the first half of an atomic replace,
/// whose caller then renames the file over the old one and syncs the directory. On failure the file is removed.
func writeSynced(_ data: Data, to path: String, what: String) throws(DownloadError) {
    let fd = retryingOnInterrupt { open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600) }
    guard fd >= 0 else { throw .io("cannot write \(what)", path: path, .current) }
    var failure: Errno?
    data.withUnsafeBytes { buffer in
        var done = 0
        while done < buffer.count {
            let n = retryingOnInterrupt { systemWrite(fd, buffer.baseAddress! + done, buffer.count - done) }
            if n <= 0 {
                failure = n < 0 ? .current : .noSpace
                return
            }
            done += n
        }
    }
    if failure == nil && syncFile(fd) != 0 { failure = .current }
    close(fd)
    if let failure {
        unlink(path)
        throw .io("cannot write \(what)", path: path, failure)
    }
}

/// fsyncs the directory holding `path`, making a rename or unlink in it durable.
func syncDirectory(containing path: String) throws(DownloadError) {
    try syncDirectory(parentDirectory(of: path))
}
