import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Testing

/// The digest a server announces, as the command line and the daemon report it (issue 36).
@Suite("server digests")
struct ServerDigestCLITests {
    static func served(_ data: [UInt8], digestOf: [UInt8]) -> ServedFile {
        var file = ServedFile(data: data, etag: "\"s1\"")
        file.extraHeaders = [("Repr-Digest", "sha-256=:\(Data(DigestHasher.digest(.sha256, of: digestOf)).base64EncodedString()):")]
        return file
    }

    @Test func theCommandLineSaysWhatItChecked() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let data = ServedFile.randomBytes(count: 400_000, seed: 365)
        server.serve("/good.bin", file: Self.served(data, digestOf: data))
        server.serve("/bad.bin", file: Self.served(data, digestOf: Array(data.reversed())))
        let sandbox = try Sandbox("digest")
        defer { sandbox.cleanup() }

        let good = try await sandbox.run(["get", server.url("/good.bin"), "-o", "good.bin"])
        #expect(good.status == 0 && good.stderr.contains("sha-256 from Repr-Digest verified"), "\(good)")
        let json = try await sandbox.run(["get", server.url("/good.bin"), "-o", "again.bin", "--json"])
        let hex = ExpectedChecksum.hexString(DigestHasher.digest(.sha256, of: data))
        #expect(json.stdout.contains("\"server_digest\":\"sha-256=\(hex)\""), "\(json.stdout)")
        #expect(json.stdout.contains("\"server_digest_field\":\"Repr-Digest\""), "\(json.stdout)")

        let bad = try await sandbox.run(["get", server.url("/bad.bin"), "-o", "bad.bin"])
        #expect(bad.status == 1, "\(bad)")
        #expect(errorLines(bad).last?.contains("does not match the digest the server announced (Repr-Digest") == true, "\(bad)")
        #expect(!fileExists(sandbox.path("bad.bin")) && fileExists(sandbox.path("bad.bin.part")), "\(sandbox.entries())")
    }

    @Test func theDaemonReportsTheVerifiedDigest() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let data = ServedFile.randomBytes(count: 300_000, seed: 366)
        server.serve("/f.bin", file: Self.served(data, digestOf: data))
        let sandbox = try Sandbox("digest")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), [], sandbox: sandbox)
        let gid = try #require(try daemon.result("aria2.addUri", [.array([.string(server.url("/f.bin"))])]).string)
        let done = try await daemon.waitFor(gid) { ["complete", "error"].contains($0.text("status")) }
        #expect(done.text("status") == "complete", "\(done)")
        let hex = ExpectedChecksum.hexString(DigestHasher.digest(.sha256, of: data))
        let status = try daemon.result("aria2.tellStatus", [.string(gid)])
        #expect(status.text("stitch.verifiedDigest") == "Repr-Digest sha-256=\(hex)", "\(status)")
        _ = await daemon.stop()
    }
}
