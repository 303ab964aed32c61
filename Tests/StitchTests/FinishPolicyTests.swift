import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

/// What the end of a download decides (``FinishPolicy``): a file is renamed into place only when its length, its
/// bytes and its checksum are right; otherwise what becomes of the part file, and what the user is told.
@Suite struct FinishPolicyTests {
    static let paths = DownloadPaths(destination: "/d/f.bin")
    static let mib: Int64 = 1 << 20

    static func written(
        _ bytes: Int64, announced: Int64? = 4 << 20, state: Int64? = 4 << 20, holes: [Range<Int64>] = []
    ) -> FinishPolicy.Refusal? {
        FinishPolicy.written(
            bytes: bytes, announced: announced, stateLength: state, holes: { holes }, pieceSize: mib, paths: paths)
    }

    /// Every byte written, no hole: finished. A length other than the one announced: kept for a resume, whatever
    /// the holes.
    @Test func lengthDecidesFirst() {
        #expect(Self.written(4 * Self.mib) == nil)
        #expect(Self.written(5000, announced: nil, state: nil) == nil, "a body of unknown length")
        let short = Self.written(3 * Self.mib, holes: [0..<10])
        #expect(short?.disposal == .keep)
        #expect(short?.error.message == "have 3145728 bytes but the server said the file has 4194304")
        #expect(short?.error.isResumable == true && short?.error.remedy == .rerun(.resume))
        // The holes are not even read then (a call into the file system for nothing).
        var reads = 0
        let refused = FinishPolicy.written(
            bytes: 3 * Self.mib, announced: 4 * Self.mib, stateLength: 4 * Self.mib,
            holes: {
                reads += 1
                return []
            }, pieceSize: Self.mib, paths: Self.paths)
        #expect(refused?.disposal == .keep && reads == 0)
    }

    /// Holes in a file whose every byte was written: the pieces they touch are marked not downloaded (a hole
    /// across a boundary touches both pieces; one ending on a boundary does not touch the next), the rest kept.
    /// Without a length to count pieces by, the part file is discarded.
    @Test(arguments: [
        ([Self.mib + Self.mib / 2..<2 * Self.mib + 10], [1, 2]),
        ([0..<Self.mib, 3 * Self.mib..<4 * Self.mib], [0, 3]),
        ([10..<20, 30..<40], [0]),
    ])
    func holesInvalidateTheirPieces(_ holes: [Range<Int64>], _ pieces: [Int]) {
        let refusal = Self.written(4 * Self.mib, holes: holes)
        #expect(refusal?.disposal == .invalidate(pieces: pieces))
        let lost = holes.reduce(Int64(0)) { $0 + Int64($1.count) }
        #expect(
            refusal?.error.message
                == "/d/f.bin.part lost \(lost) bytes while downloading (another program truncated it); nothing was "
                + "saved at /d/f.bin")
        #expect(refusal?.error.code == .io && refusal?.error.isResumable == true)
    }

    @Test func holesWithoutALengthDiscard() {
        #expect(Self.written(4 * Self.mib, announced: nil, state: nil, holes: [0..<10])?.disposal == .discard)
        #expect(Self.written(4 * Self.mib, state: 5 * Self.mib, holes: [0..<10])?.disposal == .discard)
    }

    /// A digest that does not match discards the part file — unless it came with another program's partial the
    /// user had, kept unless they asked to overwrite.
    @Test func checksumMismatch() throws {
        let expected = try ExpectedChecksum(parsing: "sha256=" + String(repeating: "ab", count: 32))
        let right = [UInt8](repeating: 0xab, count: 32)
        let wrong = [UInt8](repeating: 0xcd, count: 32)
        func check(_ digest: [UInt8], adopted: Bool, overwrite: Bool) -> FinishPolicy.Refusal? {
            FinishPolicy.digest(digest, expected: expected, adoptedKept: adopted, overwrite: overwrite, paths: Self.paths)
        }
        #expect(check(right, adopted: true, overwrite: false) == nil)
        let plain = check(wrong, adopted: false, overwrite: false)
        #expect(plain?.disposal == .discard)
        #expect(plain?.error.code == .checksumMismatch)
        #expect(plain?.error.message.hasSuffix("the downloaded data was deleted and nothing was saved at /d/f.bin") == true)
        let adopted = check(wrong, adopted: true, overwrite: false)
        #expect(adopted?.disposal == .keep)
        #expect(adopted?.error.message.contains("it is kept as /d/f.bin.part") == true)
        #expect(adopted?.error.remedy == .overwrite(.downloadAgain))
        #expect(check(wrong, adopted: true, overwrite: true)?.disposal == .discard)
    }
}
