// Fuzz target: the state-file decoder (`StateFile.read`, `DownloadState` JSON decoding and `problem()`) and what
// `Downloader.savedDownload(at:)` derives from an accepted state.
//
// Input: the bytes of a `NAME.stitch` file. Each run writes them to a private temporary directory.

import Foundation
@testable import Stitch
@testable import StitchCore
@testable import StitchTransport

#if canImport(Glibc)
    import Glibc
#endif

/// A private directory for this process's state file, made once.
let fuzzDirectory: String = {
    var template = Array((NSTemporaryDirectory() + "/stitch-fuzz-XXXXXX").utf8CString)
    let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    check(made != nil, "mkdtemp failed")
    return String(cString: made!)
}()

func writeFile(_ path: String, _ bytes: [UInt8]) {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    check(fd >= 0, "cannot write \(path)")
    var done = 0
    while done < bytes.count {
        let n = bytes[done...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        check(n > 0, "write failed")
        done += n
    }
    close(fd)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzStateFile(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let destination = fuzzDirectory + "/file.bin"
    writeFile(destination + ".stitch", input.bytes)

    // The reader either accepts a state that passes its own checks or throws; it never traps.
    let state: DownloadState?
    do {
        state = try StateFile.read(destination + ".stitch")
    } catch {
        check(error.code == .unusableState, "unexpected error \(error)")
        state = nil
    }
    if let state {
        check(
            DownloadState.readableSchemaVersions.contains(state.schemaVersion),
            "schema \(state.schemaVersion) accepted")
        check(state.schemaVersion >= 3 || state.proofs.isEmpty, "a format-2 state with proofs")
        check(state.problem() == nil, "accepted a state with a problem")
        let total = state.validators.totalLength
        check(state.durableBytes >= 0 && state.durableBytes <= (total ?? Int64.max), "durable bytes \(state.durableBytes)")
        check(state.durablePrefix >= 0 && state.durablePrefix <= state.durableBytes, "durable prefix \(state.durablePrefix)")
        check(state.segments.count <= LiveRecord.slotCount, "too many segments")
        _ = state.nonce
        _ = state.segments.map(\.isComplete)
        _ = state.validators.ifRange
        check(PieceLayout.pieceSize(forTotal: total) >= PieceLayout.minimumPieceSize, "piece size")
        if let total {
            check(Int64(state.pieces.count) <= total / state.pieceSize + 1, "\(state.pieces.count) pieces for \(total)")
        }
        // The public view of a saved download.
        do {
            let saved = try Downloader.savedDownload(at: destination)
            check(saved.durableBytes == state.durableBytes && saved.totalBytes == total, "saved download differs")
        } catch {
            check(false, "savedDownload failed on an accepted state: \(error)")
        }
    }

    // States the reader refuses are still decoded by JSONDecoder; judging them must not trap either.
    if let decoded = try? JSONDecoder().decode(DownloadState.self, from: Data(input.bytes)) {
        if decoded.problem() == nil {
            _ = decoded.durableBytes
            _ = decoded.durablePrefix
        }
    }
    return 0
}
