import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport

/// Digests the server announces for the whole file (RFC 9530 `Repr-Digest`, a 200's `Content-Digest`, RFC 3230
/// `Digest`): verified as `--checksum` would be, over one connection or several, across a resume; a mismatch keeps
/// the partial and saves nothing at the destination; a different digest on resume is a changed file.
@Suite struct ServerDigestTests {
    static let size = 2 << 20

    static func base64(_ algorithm: ChecksumAlgorithm, _ data: [UInt8]) -> String {
        Data(DigestHasher.digest(algorithm, of: data)).base64EncodedString()
    }

    static func served(_ seed: UInt64, _ headers: [(String, String)], etag: String = "\"d1\"") -> ServedFile {
        var file = ServedFile.random(size: size, seed: seed, etag: etag)
        file.extraHeaders = headers
        return file
    }

    @Test(arguments: ["Repr-Digest", "Content-Digest", "Digest"], [1, 4])
    func aCorrectDigestIsVerified(_ field: String, connections: Int) async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: Self.size, seed: 91)
        let value =
            field == "Digest"
            ? "MD5=\(Self.base64(.md5, data)), SHA-512=\(Self.base64(.sha512, data))"
            : "sha-256=:\(Self.base64(.sha256, data)):, sha-512=:\(Self.base64(.sha512, data)):;x=1"
        f.serve(Self.served(91, [(field, value)]))
        var options = DownloadOptions.testing
        options.connections = connections
        let result = try await f.download(f.request(), options: options)
        try f.expectComplete(result, data)
        if field != "Repr-Digest", TestBackend.selected.requestWindow != nil {
            // URLSession asks in windows: each 206's Content-Digest (or Digest) is its window's, never the file's.
            #expect(result.serverDigest == nil)
            return
        }
        // Of several algorithms the strongest.
        #expect(result.serverDigest?.algorithm == .sha512)
        #expect(result.serverDigest?.digest == DigestHasher.digest(.sha512, of: data))
        #expect(result.serverDigestField == field)
    }

    @Test(arguments: [1, 4])
    func aWrongDigestSavesNothingAndKeepsThePartial(_ connections: Int) async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: Self.size, seed: 92)
        let other = Self.base64(.sha256, Array(data.dropLast()))
        f.serve(Self.served(92, [("Repr-Digest", "sha-256=:\(other):")]))
        var options = DownloadOptions.testing
        options.connections = connections
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request(), options: options) }
        #expect(error?.code == .checksumMismatch)
        #expect(error?.message.contains("does not match the digest the server announced (Repr-Digest sha-256=") == true)
        #expect(!fileExists(f.dest))
        #expect(fileSize(f.paths.part) == Int64(Self.size), "the partial is kept")
        #expect(f.watch.violations.isEmpty, "\(f.watch.violations)")
    }

    /// A server that sends the whole file's Content-Digest with every response (206s too, which RFC 9530 says
    /// describe their part): the lanes' parts are not failed for it, and the file is verified whole.
    @Test func theWholeFilesContentDigestOnEveryPartIsNotAPartsDigest() async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: 8 << 20, seed: 98)
        var file = ServedFile(data: data, etag: "\"d1\"")
        file.extraHeaders = [("Content-Digest", "sha-256=:\(Self.base64(.sha256, data)):")]
        f.serve(file)
        var options = DownloadOptions.testing
        options.connections = 4
        let result = try await f.download(f.request(), options: options)
        try f.expectComplete(result, data)
        if TestBackend.selected.requestWindow == nil {
            #expect(f.watch.restarts.isEmpty, "\(f.watch.restarts)")
        } else {
            // URLSession's first window hides the 200's digest: the parts' mislabelled digests fail twice, and
            // then are no longer checked.
            #expect(f.watch.restarts.count <= 2, "\(f.watch.restarts)")
        }
        #expect(f.server.requests.contains { $0.header("Range") != nil }, "the download was split")
        #expect(result.serverDigestField == (TestBackend.selected.requestWindow == nil ? "Content-Digest" : nil))
    }

    @Test func anMD5OrSHA1DigestAloneIsNotTaken() async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: Self.size, seed: 93)
        // Wrong on purpose: were it taken, the download would fail.
        f.serve(Self.served(93, [("Digest", "MD5=\(Self.base64(.md5, [1])), SHA=\(Self.base64(.sha1, [1]))")]))
        let result = try await f.download(f.request())
        try f.expectComplete(result, data)
        #expect(result.serverDigest == nil)
    }

    @Test func aResumedDownloadIsVerifiedWhole() async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: Self.size, seed: 94)
        let repr = ("Repr-Digest", "sha-256=:\(Self.base64(.sha256, data)):")
        f.serve(Self.served(94, [repr]), faults: .onRequest(0, .stallAfter(700_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 700_000)
        let result = try await f.download(f.request())
        try f.expectComplete(result, data)
        #expect(result.resumedFrom == 700_000)
        #expect(result.serverDigest?.algorithm == .sha256 && result.serverDigestField == "Repr-Digest")
    }

    /// A partial begun without a digest (an older stitch, or a first answer without one) resumed by an answer that
    /// announces one: the digest did not see the first bytes, so the file is read back to check it.
    @Test func aDigestFirstAnnouncedOnResumeIsCheckedOverTheWholeFile() async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: Self.size, seed: 99)
        f.serve(ServedFile(data: data, etag: "\"d1\""), faults: .onRequest(0, .stallAfter(700_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 700_000)
        f.server.replaceFile("/file.bin", with: Self.served(99, [("Repr-Digest", "sha-256=:\(Self.base64(.sha256, data)):")]))
        let result = try await f.download(f.request())
        try f.expectComplete(result, data)
        #expect(result.resumedFrom == 700_000)
        #expect(result.serverDigest?.digest == DigestHasher.digest(.sha256, of: data))
    }

    @Test func aMismatchIsDownloadedAgainWhenAskedTo() async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: Self.size, seed: 100)
        f.serve(Self.served(100, [("Repr-Digest", "sha-256=:\(Self.base64(.sha256, [1])):")]))
        let kept = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(kept?.code == .checksumMismatch && fileExists(f.paths.part))
        let again = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(again?.code == .checksumMismatch, "the same bytes, the same answer")
        let discarded = await #expect(throws: DownloadError.self) { try await f.download(f.request(overwrite: true)) }
        #expect(discarded?.message.contains("deleted") == true && !fileExists(f.paths.part))
        // The server's digest is right now: downloaded again and verified.
        f.server.replaceFile("/file.bin", with: Self.served(100, [("Repr-Digest", "sha-256=:\(Self.base64(.sha256, data)):")]))
        let result = try await f.download(f.request())
        try f.expectComplete(result, data)
        #expect(result.serverDigest != nil)
    }

    /// A checksum the caller gave that matches proves the file: a server digest that disagrees is the server's error.
    @Test func aMatchingChecksumOutranksAWrongServerDigest() async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: Self.size, seed: 110)
        f.serve(Self.served(110, [("Repr-Digest", "sha-256=:\(Self.base64(.sha256, [1])):")]))
        let checksum = try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: data))
        let result = try await f.download(f.request(checksum: checksum))
        try f.expectComplete(result, data)
        #expect(result.serverDigest == nil && result.checksum == checksum)
    }

    /// The same ETag with another digest on resume: the server says the file is another one; the bytes kept are
    /// not spliced with it.
    @Test func anotherDigestOnResumeStartsOver() async throws {
        let f = try Fixture()
        let first = ServedFile.randomBytes(count: Self.size, seed: 95)
        f.serve(
            Self.served(95, [("Repr-Digest", "sha-256=:\(Self.base64(.sha256, first)):")]),
            faults: .onRequest(0, .stallAfter(700_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 700_000)
        let second = ServedFile.randomBytes(count: Self.size, seed: 96)
        var now = ServedFile(data: second, etag: "\"d1\"")
        now.extraHeaders = [("Repr-Digest", "sha-256=:\(Self.base64(.sha256, second)):")]
        f.server.replaceFile("/file.bin", with: now)
        let result = try await f.download(f.request())
        try f.expectComplete(result, second)
        #expect(f.watch.restarts.contains { if case .digestChanged = $0 { true } else { false } }, "\(f.watch.restarts)")
        #expect(result.resumedFrom == 0)
    }

    // MARK: Parsing

    @Test func fieldsAreReadAsTheRFCsWriteThem() {
        func head(_ status: Int, _ fields: [(String, String)]) -> ResponseHead {
            ResponseHead(status: status, headers: HTTPHeaders(fields))
        }
        let sha256 = [UInt8](repeating: 7, count: 32)
        let b64 = Data(sha256).base64EncodedString()
        let hex = String(repeating: "07", count: 32)
        #expect(AnnouncedDigest(from: head(200, [("Repr-Digest", "sha-256=:\(b64):")]))?.hex == hex)
        // Padding may be left out; keys in any case; parameters ignored; a member that does not parse is skipped.
        let unpadded = String(b64.drop { _ in false }.filter { $0 != "=" })
        #expect(
            AnnouncedDigest(from: head(206, [("Repr-Digest", "unixsum=:AAA:, SHA-256=:\(unpadded):;p=1")]))?.hex == hex)
        #expect(AnnouncedDigest(from: head(200, [("Repr-Digest", "sha-256=\(b64)")])) == nil, "not a byte sequence")
        #expect(AnnouncedDigest(from: head(200, [("Repr-Digest", "sha-256=:!!!!:")])) == nil)
        #expect(AnnouncedDigest(from: head(200, [("Repr-Digest", "sha-256=:AAAA:")])) == nil, "wrong length")
        // Content-Digest is the whole file's only on a 200; on a 206 it is the part's.
        #expect(AnnouncedDigest(from: head(200, [("Content-Digest", "sha-256=:\(b64):")]))?.field == "Content-Digest")
        #expect(AnnouncedDigest(from: head(206, [("Content-Digest", "sha-256=:\(b64):")])) == nil)
        #expect(AnnouncedDigest.part(of: head(206, [("Content-Digest", "sha-256=:\(b64):")]))?.hex == hex)
        // Repr-Digest wins over Digest; Digest's names in any case.
        let other = Data([UInt8](repeating: 1, count: 32)).base64EncodedString()
        let both = AnnouncedDigest(from: head(200, [("Digest", "SHA-256=\(other)"), ("Repr-Digest", "sha-256=:\(b64):")]))
        #expect(both?.field == "Repr-Digest" && both?.hex == hex)
        #expect(AnnouncedDigest(from: head(200, [("Digest", "sha-256=\(b64)")]))?.field == "Digest")
        // Digest on a 206 may be the part's (some compute it over the message body): not the file's.
        #expect(AnnouncedDigest(from: head(206, [("Digest", "sha-256=\(b64)")])) == nil)
        // Two field lines are one list.
        let sha512 = Data([UInt8](repeating: 2, count: 64)).base64EncodedString()
        let lines = AnnouncedDigest(
            from: head(200, [("Repr-Digest", "sha-256=:\(b64):"), ("Repr-Digest", "sha-512=:\(sha512):")]))
        #expect(lines?.algorithm == "sha-512")
        // The change on resume is only within one algorithm.
        var known = Validators.none
        known.digest = AnnouncedDigest(algorithm: "sha-256", hex: hex, field: "Repr-Digest")
        var fresh = Validators.none
        fresh.digest = AnnouncedDigest(algorithm: "sha-512", hex: "00", field: "Repr-Digest")
        #expect(ResumePolicy.change(from: known, to: fresh) == nil)
        fresh.digest = AnnouncedDigest(algorithm: "sha-256", hex: "00", field: "Repr-Digest")
        #expect(ResumePolicy.change(from: known, to: fresh) != nil)
    }
}

/// A 206's `Content-Digest` covers its own bytes: checked once the whole part has arrived.
@Suite struct PartDigestTests {
    static let size = 2 << 20

    /// A 206 for what `request` asks, carrying `digest(part)` as its Content-Digest.
    static func partial(_ data: [UInt8], _ request: RecordedRequest, digest: ([UInt8]) -> [UInt8]) -> Fault {
        guard let range = request.header("Range"), range.hasPrefix("bytes="),
            let first = Int(range.dropFirst(6).prefix { $0 != "-" })
        else { return .none }
        let part = Array(data[first...])
        let value = Data(digest(part)).base64EncodedString()
        let head =
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes \(first)-\(data.count - 1)/\(data.count)\r\n"
            + "Content-Length: \(part.count)\r\nETag: \"p1\"\r\nAccept-Ranges: bytes\r\n"
            + "Content-Digest: sha-256=:\(value):\r\n\r\n"
        return .raw(Array(head.utf8) + part)
    }

    @Test(arguments: [true, false])
    func aResumedPartIsCheckedAgainstItsContentDigest(_ honest: Bool) async throws {
        let f = try Fixture()
        let data = ServedFile.randomBytes(count: Self.size, seed: 97)
        f.serve(ServedFile(data: data, etag: "\"p1\"")) { request, index in
            switch index {
            case 0: return .stallAfter(700_000, then: .close)
            case 1:
                return Self.partial(data, request) { part in
                    DigestHasher.digest(.sha256, of: honest ? part : Array(part.dropFirst()))
                }
            default: return .none
            }
        }
        try await f.interruptedDownload(f.request(), at: 700_000)
        let result = try await f.download(f.request())
        try f.expectComplete(result, data)
        let mismatches = f.watch.restarts.filter { if case .partDigestMismatch = $0 { true } else { false } }
        if TestBackend.selected.requestWindow != nil {
            // URLSession asks in windows of its own: a part's Content-Digest is not the window's, and not checked.
            #expect(mismatches.isEmpty, "\(f.watch.restarts)")
        } else if honest {
            #expect(mismatches.isEmpty && result.resumedFrom == 700_000, "\(f.watch.restarts)")
        } else {
            #expect(mismatches.count == 1, "\(f.watch.restarts)")
            #expect(f.server.requests.count == 3 && f.server.requests[2].header("Range") == nil)
        }
    }
}
