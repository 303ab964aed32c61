import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

@Suite struct ChecksumTests {

    // MARK: Known-answer vectors (FIPS 180-4 / RFC 1321 examples)

    static let abcdq = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"

    @Test(
        arguments: [
            (ChecksumAlgorithm.sha256, "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            (.sha256, "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            (.sha256, abcdq, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
            (.sha1, "abc", "a9993e364706816aba3e25717850c26c9cd0d89d"),
            (.sha1, "", "da39a3ee5e6b4b0d3255bfef95601890afd80709"),
            (.sha1, abcdq, "84983e441c3bd26ebaae4aa1f95129e5e54670f1"),
            (
                .sha512, "abc",
                "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
                    + "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f"
            ),
            (
                .sha512, "",
                "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce"
                    + "47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e"
            ),
            (.md5, "abc", "900150983cd24fb0d6963f7d28e17f72"),
            (.md5, "", "d41d8cd98f00b204e9800998ecf8427e"),
        ] as [(ChecksumAlgorithm, String, String)])
    func knownVectors(algorithm: ChecksumAlgorithm, message: String, expectedHex: String) {
        let digest = DigestHasher.digest(algorithm, of: Array(message.utf8))
        #expect(digest.count == algorithm.digestLength)
        #expect(ExpectedChecksum.hexString(digest) == expectedHex)
    }

    @Test(
        arguments: [
            (ChecksumAlgorithm.sha256, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
            (.sha1, "34aa973cd4c4daa4f61eeb2bdbad27316534016f"),
            (.md5, "7707d6ae4e027c70eea2a935c2296f21"),
            (
                .sha512,
                "e718483d0ce769644e2e42c7bc15b4638e1f98b13b2044285632a803afa973eb"
                    + "de0ff244877ea60a4cb0432ce577c31beb009c5c2c49aa2e4eadb217ad8cc09b"
            ),
        ] as [(ChecksumAlgorithm, String)])
    func oneMillionA(algorithm: ChecksumAlgorithm, expectedHex: String) {
        // Fed in 1000 chunks of 1000 'a's, and in one go.
        let chunk = [UInt8](repeating: UInt8(ascii: "a"), count: 1000)
        let hasher = DigestHasher(algorithm)
        for _ in 0..<1000 { hasher.update(chunk) }
        #expect(ExpectedChecksum.hexString(hasher.finalize()) == expectedHex)

        let whole = [UInt8](repeating: UInt8(ascii: "a"), count: 1_000_000)
        #expect(ExpectedChecksum.hexString(DigestHasher.digest(algorithm, of: whole)) == expectedHex)
    }

    // MARK: Incremental hashing

    static func pseudoRandomBytes(count: Int) -> [UInt8] {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        return (0..<count).map { _ in
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return UInt8(truncatingIfNeeded: state)
        }
    }

    @Test(arguments: [ChecksumAlgorithm.sha256, .sha1, .sha512, .md5])
    func incrementalEqualsOneShot(algorithm: ChecksumAlgorithm) {
        let data = Self.pseudoRandomBytes(count: 100_003)
        let oneShot = DigestHasher.digest(algorithm, of: data)
        for chunkSize in [1, 3, 63, 64, 65, 127, 128, 4096, 65_536, 100_003, 1_000_000] {
            let hasher = DigestHasher(algorithm)
            data.withUnsafeBytes { all in
                var offset = 0
                while offset < all.count {
                    let end = min(offset + chunkSize, all.count)
                    hasher.update(UnsafeRawBufferPointer(rebasing: all[offset..<end]))
                    offset = end
                }
            }
            #expect(hasher.finalize() == oneShot, "chunk size \(chunkSize)")
        }
    }

    @Test func emptyUpdatesAreNoOps() {
        let hasher = DigestHasher(.sha256)
        hasher.update(UnsafeRawBufferPointer(start: nil, count: 0))
        hasher.update([])
        hasher.update(Array("ab".utf8))
        hasher.update([])
        hasher.update(Array("c".utf8))
        #expect(
            ExpectedChecksum.hexString(hasher.finalize())
                == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test func finalizeResetsForReuse() {
        let hasher = DigestHasher(.sha256)
        hasher.update(Array("abc".utf8))
        let first = hasher.finalize()
        #expect(
            ExpectedChecksum.hexString(hasher.finalize())
                == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        hasher.update(Array("abc".utf8))
        #expect(hasher.finalize() == first)
    }

    @Test func resetDiscardsInput() {
        let hasher = DigestHasher(.md5)
        hasher.update(Array("garbage".utf8))
        hasher.reset()
        hasher.update(Array("abc".utf8))
        #expect(ExpectedChecksum.hexString(hasher.finalize()) == "900150983cd24fb0d6963f7d28e17f72")
        #expect(hasher.algorithm == .md5)
    }

    @Test func manyHashersDoNotLeakOrCrash() {
        for index in 0..<10_000 {
            let hasher = DigestHasher(ChecksumAlgorithm.allCases[index % 4])
            if index % 2 == 0 { hasher.update([UInt8(truncatingIfNeeded: index)]) }
            if index % 3 == 0 { _ = hasher.finalize() }
        }
    }

    // MARK: ChecksumAlgorithm

    @Test(
        arguments: [
            ("sha-256", ChecksumAlgorithm.sha256), ("sha256", .sha256), ("SHA-256", .sha256), ("SHA256", .sha256),
            ("sha_256", .sha256), (" sha-256 ", .sha256),
            ("sha-1", .sha1), ("sha1", .sha1), ("SHA-1", .sha1),
            ("sha-512", .sha512), ("sha512", .sha512), ("SHA-512", .sha512),
            ("md5", .md5), ("MD5", .md5), ("md-5", .md5),
        ] as [(String, ChecksumAlgorithm)])
    func algorithmNames(name: String, expected: ChecksumAlgorithm) {
        #expect(ChecksumAlgorithm(name: name) == expected)
    }

    @Test(arguments: ["", "sha", "sha-2", "sha-384", "sha3-256", "crc32", "md4", "sha-2565", "256"])
    func unknownAlgorithmNames(name: String) {
        #expect(ChecksumAlgorithm(name: name) == nil)
    }

    @Test func canonicalNamesAndLengths() {
        #expect(ChecksumAlgorithm.allCases.map(\.name) == ["sha-256", "sha-512", "sha-1", "md5"])
        #expect(ChecksumAlgorithm.allCases.map(\.digestLength) == [32, 64, 20, 16])
        #expect(ChecksumAlgorithm.sha256.description == "sha-256")
        #expect("\(ChecksumAlgorithm.sha1)" == "sha-1")
        for algorithm in ChecksumAlgorithm.allCases {
            #expect(ChecksumAlgorithm(name: algorithm.name) == algorithm)
        }
    }

    // MARK: ExpectedChecksum parsing

    static let abcSHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

    @Test(arguments: [
        "sha-256=" + abcSHA256,
        "SHA256=" + abcSHA256.uppercased(),
        "sha256:" + abcSHA256,
        "  sha-256 = " + abcSHA256 + "\n",
    ])
    func parsesValidSpecifications(text: String) throws {
        let checksum = try ExpectedChecksum(parsing: text)
        #expect(checksum.algorithm == .sha256)
        #expect(checksum.hex == Self.abcSHA256)
        #expect(checksum.description == "sha-256=" + Self.abcSHA256)
        #expect(checksum.digest.count == 32)
        #expect(checksum.matches(DigestHasher.digest(.sha256, of: Array("abc".utf8))))
        #expect(!checksum.matches(DigestHasher.digest(.sha256, of: Array("abd".utf8))))
    }

    @Test func parsesEveryAlgorithm() throws {
        for algorithm in ChecksumAlgorithm.allCases {
            let digest = DigestHasher.digest(algorithm, of: Array("abc".utf8))
            let checksum = try ExpectedChecksum(parsing: "\(algorithm.name)=\(ExpectedChecksum.hexString(digest))")
            #expect(checksum.algorithm == algorithm)
            #expect(checksum.digest == digest)
            #expect(try ExpectedChecksum(parsing: checksum.description) == checksum)
        }
    }

    @Test(
        arguments: [
            ("crc9=abcd", "unknown checksum algorithm 'crc9'; use sha-256, sha-512, sha-1 or md5"),
            ("sha-256=0123456789ab", "sha-256 digest must be 64 hex digits, got 12"),
            ("sha-256=", "sha-256 digest must be 64 hex digits, got 0"),
            ("md5=" + String(repeating: "0", count: 33), "md5 digest must be 32 hex digits, got 33"),
            ("sha-1=" + abcSHA256, "sha-1 digest must be 40 hex digits, got 64"),
            ("sha-256=xyz", "sha-256 digest must be hexadecimal, found 'x'"),
            ("sha-256=" + String(abcSHA256.dropLast()) + "g", "sha-256 digest must be hexadecimal, found 'g'"),
            ("sha-256=ab cd", "sha-256 digest must be hexadecimal, found ' '"),
            (
                abcSHA256,
                "checksum '\(abcSHA256)' must have the form <algorithm>=<hex digest>, e.g. sha-256=<64 hex digits>"
            ),
            ("", "checksum '' must have the form <algorithm>=<hex digest>, e.g. sha-256=<64 hex digits>"),
            ("=abc", "checksum '=abc' must have the form <algorithm>=<hex digest>, e.g. sha-256=<64 hex digits>"),
        ] as [(String, String)])
    func parseErrors(text: String, message: String) {
        #expect(throws: ChecksumParseError(message)) {
            try ExpectedChecksum(parsing: text)
        }
        do {
            _ = try ExpectedChecksum(parsing: text)
        } catch {
            // Typed throws: `error` is a ChecksumParseError.
            #expect(error.description == message)
        }
    }

    @Test func fullWidthDigitsAreNotHex() {
        // Character.isHexDigit also accepts fullwidth forms; the parser must not.
        #expect(throws: ChecksumParseError("md5 digest must be hexadecimal, found '０'")) {
            try ExpectedChecksum(parsing: "md5=" + String(repeating: "０", count: 32))
        }
    }

    @Test func initFromDigestValidatesLength() throws {
        let digest = [UInt8](repeating: 0xAB, count: 16)
        let checksum = try ExpectedChecksum(algorithm: .md5, digest: digest)
        #expect(checksum.hex == String(repeating: "ab", count: 16))
        #expect(throws: ChecksumParseError("sha-256 digest must be 32 bytes, got 16")) {
            try ExpectedChecksum(algorithm: .sha256, digest: digest)
        }
    }

    @Test func hexString() {
        #expect(ExpectedChecksum.hexString([]) == "")
        #expect(ExpectedChecksum.hexString([0x00, 0x0F, 0xF0, 0xFF, 0x5A]) == "000ff0ff5a")
        #expect(ExpectedChecksum.hexString(Array(0...255)).count == 512)
    }

    // MARK: Codable

    @Test func codableAsString() throws {
        let checksum = try ExpectedChecksum(parsing: "SHA256=" + Self.abcSHA256.uppercased())
        let json = try JSONEncoder().encode(["checksum": checksum])
        #expect(String(decoding: json, as: UTF8.self) == #"{"checksum":"sha-256=\#(Self.abcSHA256)"}"#)
        let decoded = try JSONDecoder().decode([String: ExpectedChecksum].self, from: json)
        #expect(decoded["checksum"] == checksum)
    }

    @Test func decodingInvalidStringFailsWithMessage() {
        let json = Data(#"["crc9=00"]"#.utf8)
        do {
            _ = try JSONDecoder().decode([ExpectedChecksum].self, from: json)
            Issue.record("expected a decoding error")
        } catch let DecodingError.dataCorrupted(context) {
            #expect(context.debugDescription == "unknown checksum algorithm 'crc9'; use sha-256, sha-512, sha-1 or md5")
        } catch {
            Issue.record("unexpected error \(error)")
        }
    }
}
