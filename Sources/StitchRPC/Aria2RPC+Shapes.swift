import Foundation
import Stitch

// aria2's shapes: GIDs, parameters, windows of lists, statuses, error codes.
extension Aria2RPC {
    // MARK: Shapes

    /// The download `params[index]` names: 16 hex digits, or a prefix that only one download's GID has.
    func gid(_ params: [JSON], _ index: Int) async throws -> DownloadID {
        guard index < params.count, let text = params[index].string, !text.isEmpty, text.count <= 16,
            text.allSatisfy(\.isHexDigit)
        else { throw Failure.aria2("a GID is 1 to 16 hex digits") }
        // A whole GID (what clients send nearly always) is one look-up; only a prefix needs the list.
        if text.count == 16, let id = DownloadID(text), await manager.download(id) != nil { return id }
        let lowered = text.lowercased()
        let matches = await manager.downloads().map(\.id).filter { "\($0)".hasPrefix(lowered) }
        guard matches.count == 1 else {
            throw Failure.aria2(matches.isEmpty ? "GID \(text) is not found" : "GID \(text) is ambiguous")
        }
        return matches[0]
    }

    /// aria2's answer to a parameter that is missing or of the wrong type (code 1, HTTP 400), with what it should
    /// be.
    static func badParameter(_ params: [JSON], _ index: Int, _ what: String) -> Failure {
        Failure.aria2(
            "The parameter at \(index) \(index < params.count ? "has wrong type" : "is required but missing"): \(what)")
    }

    static func int(_ params: [JSON], _ index: Int, _ name: String) throws -> Int {
        guard index < params.count, let value = params[index].integer, let int = Int(exactly: value) else {
            throw badParameter(params, index, "\(name) is an integer")
        }
        return int
    }

    static func keys(_ params: [JSON], _ index: Int) throws -> Set<String>? {
        guard index < params.count else { return nil }
        guard let names = params[index].array else { throw badParameter(params, index, "keys is an array of strings") }
        return Set(names.compactMap(\.string))
    }

    /// aria2's window of a list: from `offset` (negative: counted from the end, the list then read backwards)
    /// at most `count` entries.
    static func window<T>(_ list: [T], offset: Int, count: Int) -> [T] {
        guard count > 0, !list.isEmpty else { return [] }
        if offset >= 0 {
            guard offset < list.count else { return [] }
            return Array(list[offset..<(offset + min(count, list.count - offset))])  // no overflow for a huge count
        }
        let start = list.count + offset  // -1 is the last
        guard start >= 0 else { return [] }
        return Array(list[(start - min(count - 1, start))...start].reversed())
    }

    static func isStopped(_ status: DownloadStatus) -> Bool {
        if case .failed = status { return true }
        return status == .completed || status == .removed
    }

    /// aria2's name for a status.
    static func statusName(_ status: DownloadStatus) -> String {
        switch status {
        case .queued: "waiting"
        case .running: "active"
        case .paused: "paused"
        case .completed: "complete"
        case .failed(let failure): failure.code == .cancelled ? "removed" : "error"
        case .removed: "removed"
        }
    }

    /// A download as aria2's `tellStatus` shows it, limited to `keys` when given.
    static func status(_ snapshot: DownloadSnapshot, keys: Set<String>?) -> JSON {
        let total = snapshot.progress.total ?? 0
        let done = snapshot.progress.bytes
        let path = snapshot.path ?? ""
        let directory = Self.directory(of: snapshot)
        // The piece map only when asked for: a list poll with keys (AriaNg's) draws none.
        let drawsPieces = keys.map { $0.contains("bitfield") || $0.contains("numPieces") } ?? true
        let pieces = drawsPieces ? snapshot.progress.writtenPieces : nil
        let connections = snapshot.status == .running ? String(snapshot.progress.connections) : "0"
        let pieceLength: Int64 = snapshot.progress.pieceLength ?? defaultPieceLength
        var members: [(String, JSON)] = [
            ("gid", .string("\(snapshot.id)")), ("status", .string(statusName(snapshot.status))),
            ("totalLength", .string(String(total))), ("completedLength", .string(String(done))),
            ("uploadLength", .string("0")),
            ("downloadSpeed", .string(String(Int64(snapshot.status == .running ? snapshot.progress.bytesPerSecond : 0)))),
            ("uploadSpeed", .string("0")),
            ("connections", .string(connections)), ("numPieces", .string(String(pieces?.count ?? 0))),
            ("pieceLength", .string(String(pieceLength))),
            ("dir", .string(directory)),
            (
                "files",
                .array([
                    .object([
                        ("index", .string("1")), ("path", .string(path)), ("length", .string(String(total))),
                        ("completedLength", .string(String(done))), ("selected", .string("true")),
                        ("uris", uris(snapshot)),
                    ])
                ])
            ),
        ]
        // aria2 leaves the bitfield out until the download has pieces.
        if let pieces, !pieces.isEmpty { members.append(("bitfield", .string(bitfield(pieces)))) }
        // As aria2: a finished download has code 0, a removed one 31 (both with an empty message), a failed one
        // its code and what went wrong.
        switch snapshot.status {
        case .failed(let failure):
            members.append(("errorCode", .string(String(aria2ErrorCode(failure)))))
            members.append(("errorMessage", .string(failure.code == .cancelled ? "" : failure.message)))
        case .completed, .removed:
            members.append(("errorCode", .string(snapshot.status == .completed ? "0" : String(removedCode))))
            members.append(("errorMessage", .string("")))
        case .queued, .running, .paused:
            break
        }
        guard let keys else { return .object(members) }
        return .object(members.filter { keys.contains($0.0) })
    }

    /// The piece length aria2 reports for HTTP (its `piece-length`), and Stitch's smallest.
    static let defaultPieceLength: Int64 = 1 << 20

    /// aria2's `bitfield`: lowercase hex, piece 0 the highest bit of the first digit, the bits past the last
    /// piece zero.
    static func bitfield(_ pieces: [Bool]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity((pieces.count + 3) / 4)
        var index = 0
        while index < pieces.count {
            var nibble = 0
            for bit in 0..<4 where index + bit < pieces.count && pieces[index + bit] { nibble |= 8 >> bit }
            text.append(digits[nibble])
            index += 4
        }
        // Whole bytes, as aria2 writes them: an odd digit count gets a zero digit.
        if text.count % 2 == 1 { text.append(UInt8(ascii: "0")) }
        return String(decoding: text, as: UTF8.self)
    }

    /// aria2's exit-status code for a failure, where one fits (1: unknown).
    static func aria2ErrorCode(_ failure: DownloadFailure) -> Int {
        switch failure.code {
        case .httpStatus:
            switch failure.httpStatus {
            case 404: 3  // resource not found
            case 401, 407: 24  // authorization failed
            case 503: 29  // service unavailable
            default: 22  // HTTP protocol error
            }
        case .redirects: 23
        case .retriesExhausted: 2  // timed out
        case .network: 6
        case .unstableSource: 8  // cannot resume: the file changed
        case .checksumMismatch: 32
        case .destinationExists: 13
        case .io: failure.message.contains("No space left") || failure.message.contains("disk is full") ? 9 : 17
        case .invalidOption: 28
        case .cancelled: removedCode
        default: 1
        }
    }

    /// aria2's code for a removed download.
    static let removedCode = 31

    /// Whether `given` equals `secret`, in a time that depends on the secret's length only: every byte of the
    /// secret is compared whatever `given` holds or how long it is, so neither where a guess first differs nor
    /// the secret's length shows.
    static func constantTimeEquals(_ given: [UInt8], _ secret: [UInt8]) -> Bool {
        var difference = UInt8(given.count == secret.count ? 0 : 1)
        given.withUnsafeBufferPointer { given in
            for index in 0..<secret.count {
                let byte = index < given.count ? given[index] : ~secret[index]
                difference |= byte ^ secret[index]
            }
        }
        return difference == 0
    }
}
