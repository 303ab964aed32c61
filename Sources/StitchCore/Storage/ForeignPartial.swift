import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A partial download another program left at a destination, as `--adopt` finds it (docs/adopt.md): the bytes
/// that program claims to have, and how it says so.
struct ForeignPartial: Sendable, Hashable {
    /// Which program's bookkeeping the claim comes from.
    enum Origin: Sendable, Hashable {
        /// No control file: `wget -c` and `curl -C -` write the file from its first byte in order, so its bytes
        /// are `0..<size`.
        case prefix
        /// An aria2 control file (`FILE.aria2`) whose piece bitfield names the complete pieces.
        case aria2(pieceLength: Int64, totalLength: Int64)
    }

    var origin: Origin
    /// The size of the file at the destination.
    var size: Int64
    /// The byte ranges the program claims to have written, in order, not touching one another.
    var claimed: [Range<Int64>]

    var claimedBytes: Int64 { claimed.reduce(0) { $0 + Int64($1.count) } }

    /// What `--adopt` finds at `paths`.
    enum Inspection: Sendable, Hashable {
        /// Nothing to adopt: no file at the destination, an empty one, Stitch's own partial download beside it, or
        /// a file Stitch finished. The download goes on as it would without `--adopt`.
        case nothing
        /// Another program's partial download.
        case found(ForeignPartial)
    }

    /// aria2's control file beside `destination`.
    static func controlFile(of destination: String) -> String { destination + ".aria2" }

    /// Control files larger than this are not aria2's (a bitfield of 16 MiB covers 128 Mi pieces).
    static let maximumControlFileSize = 16 << 20

    /// Looks at the destination of `paths`. Throws when the destination is not a regular file, or when an aria2
    /// control file is there but cannot be read as one: then nothing may be adopted, nor replaced.
    static func inspect(_ paths: DownloadPaths) throws(DownloadError) -> Inspection {
        var info = stat()
        guard lstat(paths.destination, &info) == 0 else {
            if errno == ENOENT { return .nothing }
            throw .io("cannot look at", path: paths.destination, .current)
        }
        guard (info.st_mode & S_IFMT) == S_IFREG else {
            throw DownloadError(.invalidOption, "cannot adopt \(paths.destination): not a regular file")
        }
        // Stitch's own: a finished file, or a partial download with its state (a state without its part file is
        // an adoption cut short before its rename, and is done again).
        if CompletionMark.read(at: paths.destination) != nil { return .nothing }
        if access(paths.state, F_OK) == 0, access(paths.part, F_OK) == 0 { return .nothing }
        let size = Int64(info.st_size)
        guard info.st_nlink == 1 else {
            throw DownloadError(
                .invalidOption,
                "cannot adopt \(paths.destination): it has other names (hard links), which taking it over would change")
        }
        // Holes read as zeros and hold nothing any program wrote (a file cut, a preallocated file whose control
        // file is gone): never claimed.
        let holes = try holes(in: paths.destination, before: size)
        let control = controlFile(of: paths.destination)
        if let bytes = try readControlFile(control) {
            do throws(Aria2ControlFile.Problem) {
                let parsed = try Aria2ControlFile(parsing: bytes)
                let claimed = subtract(holes, from: parsed.completeRanges)
                if let last = claimed.last, last.upperBound > size {
                    throw Aria2ControlFile.Problem(
                        "it records bytes up to \(last.upperBound) but the file has \(size)")
                }
                return .found(
                    ForeignPartial(
                        origin: .aria2(pieceLength: parsed.pieceLength, totalLength: parsed.totalLength), size: size,
                        claimed: claimed))
            } catch {
                throw DownloadError(
                    .unusableState,
                    "cannot adopt \(paths.destination): \(control) is not a usable aria2 control file (\(error.why)); "
                        + "both are left as they are")
            }
        }
        guard size > 0 else { return .nothing }
        return .found(ForeignPartial(origin: .prefix, size: size, claimed: subtract(holes, from: [0..<size])))
    }

    /// The holes of the file at `path` below `size` (`SEEK_HOLE`/`SEEK_DATA`; none where the file system cannot say).
    static func holes(in path: String, before size: Int64) throws(DownloadError) -> [Range<Int64>] {
        let fd = retryingOnInterrupt { open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        guard fd >= 0 else { throw .io("cannot read", path: path, .current) }
        defer { close(fd) }
        return fileHoles(fd, before: size)
    }

    /// `claimed` less `holes` (both in order, not overlapping among themselves).
    static func subtract(_ holes: [Range<Int64>], from claimed: [Range<Int64>]) -> [Range<Int64>] {
        var result: [Range<Int64>] = []
        for range in claimed {
            var pieces = [range]
            for hole in holes where hole.overlaps(range) {
                pieces = pieces.flatMap { piece -> [Range<Int64>] in
                    guard hole.overlaps(piece) else { return [piece] }
                    var kept: [Range<Int64>] = []
                    if piece.lowerBound < hole.lowerBound { kept.append(piece.lowerBound..<hole.lowerBound) }
                    if hole.upperBound < piece.upperBound { kept.append(hole.upperBound..<piece.upperBound) }
                    return kept
                }
            }
            result += pieces
        }
        return result
    }

    private static func readControlFile(_ path: String) throws(DownloadError) -> [UInt8]? {
        try readSmallFile(
            path, what: "aria2 control file", maximumSize: maximumControlFileSize, noFollow: true,
            tooLarge: DownloadError(
                .unusableState, "cannot adopt: \(path) is too large for an aria2 control file; it is left as it is"))
    }

    /// Reads `count` bytes of the destination at `offset` (fewer at its end).
    static func read(_ paths: DownloadPaths, at offset: Int64, count: Int) throws(DownloadError) -> [UInt8] {
        let fd = retryingOnInterrupt { open(paths.destination, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        guard fd >= 0 else { throw .io("cannot read", path: paths.destination, .current) }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let n = bytes.withUnsafeMutableBytes { buffer in
                retryingOnInterrupt { pread(fd, buffer.baseAddress! + done, count - done, off_t(offset) + off_t(done)) }
            }
            if n < 0 { throw .io("cannot read", path: paths.destination, .current) }
            if n == 0 { break }
            done += n
        }
        return Array(bytes[0..<done])
    }

    /// Makes the partial Stitch's, so that a crash at any instant leaves either the foreign partial as it was or a
    /// Stitch partial download whose state claims only durable bytes:
    ///
    /// 1. the destination's data is synced (the other program may have left it in the page cache only);
    /// 2. `state` is written (fsynced, renamed into place, the folder synced) while no part file exists, which
    ///    makes it inert: a state without its part file is not resumed, and the next `--adopt` does this again;
    /// 3. the destination is renamed to the part file, and the folder synced: now it is a Stitch partial;
    /// 4. the aria2 control file, if any, is removed (a crash before leaves it beside a Stitch partial; it is
    ///    removed when the download ends).
    static func takeOver(_ paths: DownloadPaths, state: DownloadState) throws(DownloadError) {
        let fd = retryingOnInterrupt { open(paths.destination, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        guard fd >= 0 else { throw .io("cannot open", path: paths.destination, .current) }
        let synced = syncData(fd) == 0
        let syncError = Errno.current
        close(fd)
        guard synced else { throw .io("cannot sync", path: paths.destination, syncError) }
        // A live record an earlier run left beside the state would be paired with the new nonce never, but is
        // removed so that nothing stale sits beside the adopted download.
        unlink(paths.live)
        // A part file there without a state: another run's small download (no state file before its first
        // checkpoint) if that run holds its lock — not replaced — else what such a run left, which would start
        // over anyway.
        if access(paths.part, F_OK) == 0 {
            guard !PartialDownload(paths).partIsHeldByAnotherRun else {
                throw DownloadError(
                    .io,
                    "\(paths.destination) is being downloaded by another stitch run; wait for it to end or stop it",
                    resumable: true)
            }
            unlink(paths.part)
        }
        try StateFile.write(state, to: paths.state, previous: paths.previousState, generation: .remove)
        guard rename(paths.destination, paths.part) == 0 else {
            let error = Errno.current
            throw .io("cannot rename \(paths.destination) to", path: paths.part, error)
        }
        try syncDirectory(containing: paths.part)
        removeControlFile(of: paths.destination)
    }

    /// Removes the state an adoption cut short left (a state file with no part file beside it), once the partial
    /// is not to be adopted after all: the download that starts from zero must not find it.
    static func discardInertState(_ paths: DownloadPaths) throws(DownloadError) {
        guard access(paths.state, F_OK) == 0, access(paths.part, F_OK) != 0 else { return }
        for sidecar in paths.sidecars { unlink(sidecar) }
        try syncDirectory(containing: paths.state)
    }

    /// Removes aria2's control file beside `destination`, if there is one (it describes a file that is now
    /// Stitch's), making the removal durable.
    static func removeControlFile(of destination: String) {
        let control = controlFile(of: destination)
        guard unlink(control) == 0 else { return }
        try? syncDirectory(containing: control)
    }
}

/// aria2's control file (`FILE.aria2`), version 1, as aria2's technical notes document it. All integers are
/// big-endian:
///
/// ```
/// VER(2) EXT(4) INFO_HASH_LENGTH(4) INFO_HASH PIECE_LENGTH(4) TOTAL_LENGTH(8) UPLOAD_LENGTH(8)
/// BITFIELD_LENGTH(4) BITFIELD NUM_IN_FLIGHT_PIECE(4)
/// then per in-flight piece: INDEX(4) LENGTH(4) PIECE_BITFIELD_LENGTH(4) PIECE_BITFIELD
/// ```
///
/// Version 0 (host byte order, aria2 before 1.0) is refused: its integers' order cannot be known. Only pieces
/// complete in `BITFIELD` (bit 7 of the first byte is piece 0) are taken; in-flight pieces are fetched again, but
/// their records are checked, so that a damaged file is refused instead of half-read.
struct Aria2ControlFile: Sendable, Hashable {
    struct Problem: Error {
        var why: String
        init(_ why: String) { self.why = why }
    }

    var pieceLength: Int64
    var totalLength: Int64
    /// One flag per piece.
    var complete: [Bool]

    init(parsing bytes: [UInt8]) throws(Problem) {
        var at = 0
        func take(_ count: Int, _ what: String) throws(Problem) -> ArraySlice<UInt8> {
            guard count >= 0, bytes.count - at >= count else { throw Problem("it ends inside its \(what)") }
            defer { at += count }
            return bytes[at..<(at + count)]
        }
        func number(_ count: Int, _ what: String) throws(Problem) -> UInt64 {
            try take(count, what).reduce(0) { $0 << 8 | UInt64($1) }
        }
        let version = try number(2, "version")
        guard version == 1 else {
            throw Problem(
                version == 0
                    ? "format version 0 (host byte order) is not supported" : "unknown format version \(version)")
        }
        _ = try number(4, "extension flags")
        let infoHashLength = try number(4, "info hash length")
        guard infoHashLength == 0 else { throw Problem("it belongs to a BitTorrent download") }
        let pieceLength = try number(4, "piece length")
        let totalLength = try number(8, "total length")
        _ = try number(8, "upload length")
        let bitfieldLength = try number(4, "bitfield length")
        guard pieceLength > 0 else { throw Problem("its piece length is 0") }
        guard totalLength > 0, totalLength < 1 << 62 else { throw Problem("its total length is \(totalLength)") }
        let pieces = totalLength / pieceLength + (totalLength % pieceLength == 0 ? 0 : 1)
        guard bitfieldLength == (pieces + 7) / 8 else {
            throw Problem("its bitfield has \(bitfieldLength) bytes for \(pieces) pieces")
        }
        let bitfield = try take(Int(bitfieldLength), "bitfield")
        var complete = [Bool](repeating: false, count: Int(pieces))
        for index in 0..<Int(bitfieldLength) * 8 {
            let set = bitfield[bitfield.startIndex + index / 8] & (0x80 >> UInt8(index % 8)) != 0
            if index < complete.count {
                complete[index] = set
            } else if set {
                throw Problem("its bitfield marks pieces past the file's end")
            }
        }
        let inFlight = try number(4, "in-flight piece count")
        guard inFlight <= pieces else { throw Problem("it has \(inFlight) in-flight pieces of \(pieces)") }
        for _ in 0..<inFlight {
            let index = try number(4, "in-flight piece index")
            let length = try number(4, "in-flight piece length")
            let blocksLength = try number(4, "in-flight piece bitfield length")
            guard index < pieces, length <= pieceLength else { throw Problem("an in-flight piece is out of range") }
            _ = try take(Int(blocksLength), "in-flight piece bitfield")
        }
        guard at == bytes.count else { throw Problem("\(bytes.count - at) bytes follow its last record") }
        self.pieceLength = Int64(pieceLength)
        self.totalLength = Int64(totalLength)
        self.complete = complete
    }

    /// The byte ranges of the complete pieces, runs of neighbours joined, in order.
    var completeRanges: [Range<Int64>] {
        var ranges: [Range<Int64>] = []
        for (index, done) in complete.enumerated() where done {
            let start = Int64(index) * pieceLength
            let end = min(start + pieceLength, totalLength)
            if let last = ranges.last, last.upperBound == start {
                ranges[ranges.count - 1] = last.lowerBound..<end
            } else {
                ranges.append(start..<end)
            }
        }
        return ranges
    }
}
