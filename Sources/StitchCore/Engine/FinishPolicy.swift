import Foundation

/// What the end of a download decides, as pure functions: whether the written part file may be renamed into place
/// and, when it may not, what becomes of it. The executor reads the facts (the length written, the file's holes,
/// the digest) and performs the disposal on the blocking pool. Unit tests: FinishPolicyTests.
///
/// The rules (rule 1: a file at the destination is complete and verified):
/// - Fewer or more bytes than the server announced: not finished; everything is kept for a resume.
/// - A hole in a file whose every byte was written: another program cut the file under the run, and what it lost
///   reads as zeros. The pieces the holes touch are marked not downloaded (the rest is kept) when the file's length
///   is known; without a length nothing can be kept by pieces, and the part file is discarded.
/// - A digest that does not match the checksum asked for: the part file is discarded — unless its bytes came with
///   another program's partial that the user had before (`--adopt`), which is kept unless the user asked to
///   overwrite.
enum FinishPolicy {
    /// What becomes of the part file when the download cannot finish.
    enum Disposal: Sendable, Equatable {
        /// Kept as it is.
        case keep
        /// These pieces are marked not downloaded; the rest is kept.
        case invalidate(pieces: [Int])
        /// The part file and its state are deleted.
        case discard
    }

    /// Why the part file is not renamed into place, and what becomes of it.
    struct Refusal: Error, Sendable {
        var error: DownloadError
        var disposal: Disposal
    }

    /// The check of what was written: `bytes` written, `announced` the length the download's validators say,
    /// `stateLength` the one the part file's state records, `holes` reads the file's holes before `bytes` (asked
    /// only once the length is right: it costs a call into the file system).
    static func written(
        bytes: Int64, announced: Int64?, stateLength: Int64?, holes readHoles: () -> [Range<Int64>], pieceSize: Int64,
        paths: DownloadPaths
    ) -> Refusal? {
        if let announced, bytes != announced {
            return Refusal(
                error: DownloadError(
                    .protocolViolation, "have \(bytes) bytes but the server said the file has \(announced)",
                    resumable: true, remedy: .rerun(.resume)),
                disposal: .keep)
        }
        let holes = readHoles()
        guard !holes.isEmpty else { return nil }
        let lost = holes.reduce(Int64(0)) { $0 + Int64($1.count) }
        var disposal = Disposal.discard
        if let stateLength, stateLength == bytes, pieceSize > 0 {
            var damaged = Set<Int>()
            for hole in holes where !hole.isEmpty {
                for piece in Int(hole.lowerBound / pieceSize)...Int((hole.upperBound - 1) / pieceSize) {
                    damaged.insert(piece)
                }
            }
            disposal = .invalidate(pieces: damaged.sorted())
        }
        return Refusal(
            error: DownloadError(
                .io,
                "\(paths.part) lost \(lost) bytes while downloading (another program truncated it); nothing was "
                    + "saved at \(paths.destination)",
                resumable: true, remedy: .rerun(.downloadAgain)),
            disposal: disposal)
    }

    /// The check of the file's digest against the one the server announced for it (`field`: `Repr-Digest`,
    /// `Content-Digest` or `Digest`). A mismatch is not a wrong file: nothing is renamed into place, and the part
    /// file is kept (its pieces can be checked against the checksums recorded as they were saved, which tells the
    /// disk's fault from the server's) until the user asks to download it again.
    static func announced(
        _ digest: [UInt8], expected: ExpectedChecksum, field: String, overwrite: Bool, paths: DownloadPaths
    ) -> Refusal? {
        guard !expected.matches(digest) else { return nil }
        let got = "\(expected.algorithm.name)=\(ExpectedChecksum.hexString(digest))"
        if overwrite {
            // Asked to download it again: these bytes go, and the next run starts from zero.
            return Refusal(
                error: DownloadError(
                    .checksumMismatch,
                    "the file does not match the digest the server announced (\(field) \(expected), got \(got)): the "
                        + "downloaded data was deleted and nothing was saved at \(paths.destination)"),
                disposal: .discard)
        }
        return Refusal(
            error: DownloadError(
                .checksumMismatch,
                "the file does not match the digest the server announced (\(field) \(expected), got \(got)): it is "
                    + "kept as \(paths.part), and nothing was saved at \(paths.destination)",
                remedy: .overwrite(.downloadAgain)),
            disposal: .keep)
    }

    /// The check of the file's digest against the checksum asked for. `adoptedKept`: the bytes came with another
    /// program's partial the user had before; `overwrite`: the user asked to replace what is there.
    static func digest(
        _ digest: [UInt8], expected: ExpectedChecksum, adoptedKept: Bool, overwrite: Bool, paths: DownloadPaths
    ) -> Refusal? {
        guard !expected.matches(digest) else { return nil }
        let got = "\(expected.algorithm.name)=\(ExpectedChecksum.hexString(digest))"
        if adoptedKept, !overwrite {
            return Refusal(
                error: DownloadError(
                    .checksumMismatch,
                    "checksum mismatch: expected \(expected), got \(got); the file was continued from another "
                        + "program's partial download, which may differ from the server's between the samples "
                        + "compared: it is kept as \(paths.part), and nothing was saved at \(paths.destination)",
                    remedy: .overwrite(.downloadAgain)),
                disposal: .keep)
        }
        return Refusal(
            error: DownloadError(
                .checksumMismatch,
                "checksum mismatch: expected \(expected), got \(got); the downloaded data was deleted and nothing "
                    + "was saved at \(paths.destination)"),
            disposal: .discard)
    }
}
