import Foundation
import Glibc
import Stitch
import StitchTestSupport
import Testing

/// Interrupt-and-rerun through the binary for the less friendly servers: no validators, no ranges,
/// chunked bodies, files that change, state files that are not ours.
@Suite("stitch resume edge cases")
struct ResumeEdgeCaseTests {
    /// Starts `stitch arguments…` and SIGKILLs it once DEST.part holds `bytes` (the first response is made
    /// to stall there, so the client cannot finish first). Returns the size of DEST.part left behind.
    private func killAfter(
        _ bytes: Int, of path: String, on server: TestHTTPServer, in sandbox: Sandbox, _ arguments: [String],
        part: String = "out.bin.part"
    ) async throws -> Int {
        let process = try sandbox.start(arguments)
        let partPath = sandbox.path(part)
        let reached = await waitForBytes(bytes, while: process, onReach: { _ in process.kill() }) {
            fileSize(partPath)
        }
        process.kill()
        let result = await process.wait()
        try #require(reached != nil && result.signal == SIGKILL, "not killed mid-way: \(result)")
        #expect(await server.settled())
        return fileSize(sandbox.path(part))
    }

    private static func stalled(after bytes: Int) -> Fault { .stallAfter(bytes, then: .close) }

    @Test func emptyFile() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/empty", file: ServedFile(data: [], etag: "\"0\""))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/empty"), "-o", "e.bin"])
        #expect(result.status == 0, "\(result)")
        #expect(fileSize(sandbox.path("e.bin")) == 0)
        #expect(sandbox.entries() == ["e.bin"])
        let again = try await sandbox.run(["get", server.url("/empty"), "-o", "e.bin"])
        #expect(again.status == 0, "\(again)")
        #expect(sandbox.entries() == ["e.bin"])
    }

    @Test func noValidatorsResumesWithAnOverlapCheck() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 2 << 20, seed: 31)  // no ETag, no Last-Modified
        server.serve("/f", file: file, faults: .onRequest(0, Self.stalled(after: 1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f"), "-o", "out.bin"]
        let kept = try await killAfter(1 << 20, of: "/f", on: server, in: sandbox, arguments)
        #expect(kept > 0)

        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        let request = try #require(server.requests(for: "/f").last)
        #expect(request.header("If-Range") == nil, "nothing to send as If-Range")
        let start = try #require(rangeStart(request.range))
        #expect(start > 0 && start < kept, "re-fetches an overlap to compare: \(request.range ?? "none"), \(kept) kept")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
    }

    @Test func noValidatorsAndChangedContentRestarts() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let old = ServedFile.random(size: 2 << 20, seed: 32)
        let new = ServedFile.random(size: 2 << 20, seed: 33)
        server.serve("/f", file: old, faults: .onRequest(0, Self.stalled(after: 1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f"), "-o", "out.bin"]
        _ = try await killAfter(1 << 20, of: "/f", on: server, in: sandbox, arguments)
        server.replaceFile("/f", with: new)

        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        #expect(rerun.stderr.contains("restarting from zero"), "\(rerun)")
        #expect(readBytes(sandbox.path("out.bin")) == new.data, "the overlap check must catch the change")
    }

    /// How a rerun comes to restart from zero: the file changed under a validator-less partial (the overlap check
    /// catches it), or the server answers the ranged request with the whole file (200).
    enum RestartCause: String, CaseIterable, Sendable { case changedWithoutValidators, wholeFileToARange }

    /// A rerun that restarts from zero says so, and its result never claims a resume: no "resumed at" in the
    /// saved line, `resumed_from` 0 in `--json`'s `done` event (issue 14: it reported the offset it had started
    /// from before restarting).
    @Test(arguments: RestartCause.allCases)
    func restartedDownloadNeverReportsAResume(_ cause: RestartCause) async throws {
        let old = ServedFile.random(size: 2 << 20, seed: 36, etag: cause == .wholeFileToARange ? "\"w\"" : nil)
        let new = ServedFile.random(size: 2 << 20, seed: 37)
        for json in [false, true] {
            let server = try TestHTTPServer()
            defer { server.stop() }
            server.serve("/f", file: old) { _, index in
                index == 0 ? Self.stalled(after: 1 << 20) : cause == .wholeFileToARange ? .ignoreRange : .none
            }
            let sandbox = try Sandbox()
            defer { sandbox.cleanup() }
            let arguments = ["get", server.url("/f"), "-o", "out.bin"] + (json ? ["--json"] : [])
            _ = try await killAfter(1 << 20, of: "/f", on: server, in: sandbox, arguments)
            if cause == .changedWithoutValidators { server.replaceFile("/f", with: new) }
            let expected = cause == .changedWithoutValidators ? new.data : old.data

            let rerun = try await sandbox.run(arguments)
            #expect(rerun.status == 0, "\(rerun)")
            #expect(readBytes(sandbox.path("out.bin")) == expected)
            if json {
                let events = try #require(jsonLines(rerun.stdout), "\(rerun)")
                #expect(events.contains { $0["event"] as? String == "restart" }, "\(rerun)")
                let done = try #require(events.last { $0["event"] as? String == "done" }, "\(rerun)")
                #expect((done["resumed_from"] as? NSNumber)?.int64Value == 0, "\(done)")
            } else {
                #expect(rerun.stderr.contains("restarting from zero"), "\(rerun)")
                let saved = try #require(rerun.stderrLines.last { $0.contains("saved ") }, "\(rerun)")
                #expect(!saved.contains("resumed"), "\(saved)")
            }
        }
    }

    @Test func serverWithoutRangesStartsOver() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 2 << 20, seed: 34, etag: "\"n\"", acceptRanges: false)
        server.serve("/f", file: file, faults: .onRequest(0, Self.stalled(after: 1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f"), "-o", "out.bin"]
        _ = try await killAfter(1 << 20, of: "/f", on: server, in: sandbox, arguments)

        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
        #expect(sandbox.entries() == ["out.bin"])
    }

    @Test func chunkedBodyResumes() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 2 << 20, seed: 35, etag: "\"c\"")
        server.serve("/f", file: file) { _, index in
            index == 0 ? .all([.chunked, .stallAfter(1 << 20, then: .close)]) : .chunked
        }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f"), "-o", "out.bin", "--checksum", "sha-256=" + sha256Hex(file.data)]
        let kept = try await killAfter(1 << 20, of: "/f", on: server, in: sandbox, arguments)

        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        let start = try #require(rangeStart(server.requests(for: "/f").last?.range))
        #expect(start > 0 && start <= kept)
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
    }

    @Test func lengthAndETagChangeRestarts() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let old = ServedFile.random(size: 2 << 20, seed: 36, etag: "\"v1\"")
        let new = ServedFile.random(size: 3 << 20, seed: 37, etag: "\"v2\"")
        server.serve("/f", file: old, faults: .onRequest(0, Self.stalled(after: 1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f"), "-o", "out.bin", "--json"]
        _ = try await killAfter(1 << 20, of: "/f", on: server, in: sandbox, arguments)
        server.replaceFile("/f", with: new)

        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        let events = try #require(jsonLines(rerun.stdout))
        let restart = try #require(events.first { $0["event"] as? String == "restart" }, "\(rerun)")
        #expect((restart["reason"] as? String)?.contains("\"v2\"") == true)
        #expect(events.last?["bytes"] as? Int == 3 << 20)
        #expect(readBytes(sandbox.path("out.bin")) == new.data)
    }

    @Test func directoryDownloadResumes() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(
            size: 2 << 20, seed: 38, etag: "\"d\"", contentDisposition: "attachment; filename=\"report.pdf\"")
        server.serve("/get", file: file, faults: .onRequest(0, Self.stalled(after: 1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/get?id=1"), "-d", "."]
        let kept = try await killAfter(1 << 20, of: "/get", on: server, in: sandbox, arguments, part: "report.pdf.part")
        #expect(kept > 0)

        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        #expect(rerun.stdout == sandbox.path("report.pdf") + "\n")
        let ranged = server.requests(for: "/get").compactMap { rangeStart($0.range) }.filter { $0 > 0 }
        #expect(!ranged.isEmpty, "the rerun resumes the saved partial instead of starting over")
        #expect(readBytes(sandbox.path("report.pdf")) == file.data)
        #expect(sandbox.entries() == ["report.pdf"])
    }

    @Test func corruptStateNeedsOverwrite() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 100_000, seed: 39, etag: "\"s\"")
        server.serve("/f", file: file)
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        try Data("{ not json".utf8).write(to: URL(fileURLWithPath: sandbox.path("out.bin.stitch")))
        try Data(repeating: 7, count: 5000).write(to: URL(fileURLWithPath: sandbox.path("out.bin.part")))
        let arguments = ["get", server.url("/f"), "-o", "out.bin"]

        let refused = try await sandbox.run(arguments)
        #expect(refused.status == 1, "\(refused)")
        #expect(refused.stderr.contains("--overwrite"))
        #expect(fileSize(sandbox.path("out.bin.part")) == 5000, "the partial data is kept")
        #expect(server.requests.isEmpty)

        let resume = try await sandbox.run(["get", "--resume", "out.bin"])
        #expect(resume.status == 1, "\(resume)")

        let replaced = try await sandbox.run(arguments + ["--overwrite"])
        #expect(replaced.status == 0, "\(replaced)")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
        #expect(sandbox.entries() == ["out.bin"])
    }

    @Test func stateOfAnotherURLIsNotMixedIn() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let a = ServedFile.random(size: 2 << 20, seed: 40, etag: "\"a\"")
        let b = ServedFile.random(size: 2 << 20, seed: 41, etag: "\"b\"")
        server.serve("/a", file: a, faults: .onRequest(0, Self.stalled(after: 1 << 20)))
        server.serve("/b", file: b)
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        _ = try await killAfter(1 << 20, of: "/a", on: server, in: sandbox, ["get", server.url("/a"), "-o", "out.bin"])

        let other = try await sandbox.run(["get", server.url("/b"), "-o", "out.bin"])
        #expect(other.status == 1, "\(other)")
        #expect(other.stderr.contains("--overwrite"))
        #expect(server.requests(for: "/b").isEmpty)

        let replaced = try await sandbox.run(["get", server.url("/b"), "-o", "out.bin", "--overwrite"])
        #expect(replaced.status == 0, "\(replaced)")
        #expect(readBytes(sandbox.path("out.bin")) == b.data)
    }

    @Test func lyingServerIsCaughtByTheChecksum() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let real = ServedFile.random(size: 2 << 20, seed: 42, etag: "\"same\"")
        var forged = real
        forged.data[(3 << 19)] ^= 0xFF  // one flipped byte past the resume point, same ETag
        server.serve("/f", file: real, faults: .onRequest(0, Self.stalled(after: 1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f"), "-o", "out.bin", "--checksum", "sha-256=" + sha256Hex(real.data)]
        _ = try await killAfter(1 << 20, of: "/f", on: server, in: sandbox, arguments)
        server.replaceFile("/f", with: forged)

        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 1, "\(rerun)")
        #expect(rerun.stderr.contains("checksum mismatch"))
        #expect(sandbox.entries().isEmpty, "\(sandbox.entries())")
    }
}
