import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Testing

/// `stitch get -N` / `--if-newer`, a list's `conditional-get=`, and the daemon's `conditional-get` (issue 36): the
/// file at the destination is fetched again only when the server's is newer, and replaced only once complete.
@Suite("stitch get --if-newer")
struct IfNewerTests {
    static let older = ServedFile.httpDate(secondsSince1970: 1_700_000_000)
    static let newer = ServedFile.httpDate(secondsSince1970: 1_700_086_400)

    @Test func aScriptThatRefreshesAFileFetchesItOnlyWhenItChanged() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let v1 = ServedFile.random(size: 300_000, seed: 361, etag: "\"n1\"", lastModified: Self.older)
        server.serve("/f.bin", file: v1)
        let sandbox = try Sandbox("ifnewer")
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f.bin"), "-o", "f.bin", "-N"]

        let first = try await sandbox.run(arguments)
        #expect(first.status == 0 && readBytes(sandbox.path("f.bin")) == v1.data, "\(first)")

        let unchanged = try await sandbox.run(arguments + ["--json"])
        #expect(unchanged.status == 0, "\(unchanged)")
        #expect(unchanged.stdout.contains("\"not_modified\":true"), "\(unchanged.stdout)")
        #expect(server.requests.last?.header("If-None-Match") == "\"n1\"")
        let quiet = try await sandbox.run(arguments)
        #expect(quiet.stderr.contains("is up to date (the server answered 304 Not Modified)"), "\(quiet.stderr)")
        #expect(!quiet.stderr.contains("already complete"), "one line says it: \(quiet.stderr)")

        let v2 = ServedFile.random(size: 310_000, seed: 362, etag: "\"n2\"", lastModified: Self.newer)
        server.replaceFile("/f.bin", with: v2)
        let changed = try await sandbox.run(["get", server.url("/f.bin"), "-o", "f.bin", "--if-newer"])
        #expect(changed.status == 0 && readBytes(sandbox.path("f.bin")) == v2.data, "\(changed)")
        #expect(sandbox.entries() == ["f.bin"], "\(sandbox.entries())")

        // Without -N a file there is still never replaced.
        let plain = try await sandbox.run(["get", server.url("/f.bin"), "-o", "f.bin"])
        #expect(plain.stderr.contains("already complete"), "\(plain)")
    }

    @Test func contradictionsAreRefused() async throws {
        let sandbox = try Sandbox("ifnewer")
        defer { sandbox.cleanup() }
        for (arguments, words) in [
            (["get", "http://127.0.0.1:9/f", "-o", "-", "-N"], "-o - has none"),
            (["get", "http://127.0.0.1:9/f", "-o", "f", "-N", "--adopt"], "give one of them"),
            (["get", "--resume", "f", "--if-newer"], "drop one"),
        ] {
            let run = try await sandbox.run(arguments)
            #expect(run.status == 64 && run.stderr.contains(words), "\(arguments): \(run)")
        }
    }

    @Test func aListEntryAndTheDaemonTakeConditionalGet() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let v1 = ServedFile.random(size: 200_000, seed: 363, etag: "\"n1\"", lastModified: Self.older)
        server.serve("/f.bin", file: v1)
        let sandbox = try Sandbox("ifnewer")
        defer { sandbox.cleanup() }
        mkdir(sandbox.path("dl"), 0o755)
        let list = "\(server.url("/f.bin"))\n  out=f.bin\n  conditional-get=true\n"
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))

        let first = try await sandbox.run(["get", "-i", sandbox.path("list.txt"), "-d", sandbox.path("dl")])
        #expect(first.status == 0 && readBytes(sandbox.path("dl/f.bin")) == v1.data, "\(first)")
        let again = try await sandbox.run(["get", "-i", sandbox.path("list.txt"), "-d", sandbox.path("dl")])
        #expect(again.status == 0 && again.stderr.contains("is up to date"), "\(again)")
        #expect(server.requests.last?.header("If-None-Match") == "\"n1\"")

        // The daemon: conditional-get per download, shown by getOption.
        let v2 = ServedFile.random(size: 210_000, seed: 364, etag: "\"n2\"", lastModified: Self.newer)
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), [], sandbox: sandbox)
        let add: [JSON] = [.array([.string(server.url("/f.bin"))]), .object([("out", .string("f.bin")), ("conditional-get", .string("true"))])]
        let same = try #require(try daemon.result("aria2.addUri", add).string)
        let sameDone = try await daemon.waitFor(same) { ["complete", "error"].contains($0.text("status")) }
        #expect(sameDone.text("status") == "complete", "\(sameDone)")
        #expect(try daemon.result("aria2.getOption", [.string(same)]).text("conditional-get") == "true")
        #expect(readBytes(sandbox.path("dl/f.bin")) == v1.data)
        #expect(server.requests.last?.header("If-None-Match") == "\"n1\"")

        // A file another program left in the folder is compared, not renamed around (aria2's conditional-get).
        let g = ServedFile.random(size: 50_000, seed: 365, etag: "\"g1\"", lastModified: Self.older)
        server.serve("/g.bin", file: g)
        let theirs = Array("another program's copy\n".utf8)
        try Data(theirs).write(to: URL(fileURLWithPath: sandbox.path("dl/g.bin")))
        var times = [timespec(tv_sec: 1_700_040_000, tv_nsec: 0), timespec(tv_sec: 1_700_040_000, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, sandbox.path("dl/g.bin"), &times, 0) == 0)
        let kept = try #require(
            try daemon.result(
                "aria2.addUri", [.array([.string(server.url("/g.bin"))]), .object([("conditional-get", .string("true"))])]
            ).string)
        let keptDone = try await daemon.waitFor(kept) { ["complete", "error"].contains($0.text("status")) }
        #expect(keptDone.text("status") == "complete", "\(keptDone)")
        #expect(readBytes(sandbox.path("dl/g.bin")) == theirs)
        #expect(!fileExists(sandbox.path("dl/g.1.bin")), "\(sandbox.entries("dl"))")

        server.replaceFile("/f.bin", with: v2)
        _ = try daemon.result("aria2.removeDownloadResult", [.string(same)])
        let newer = try #require(try daemon.result("aria2.addUri", add).string)
        let newerDone = try await daemon.waitFor(newer) { ["complete", "error"].contains($0.text("status")) }
        #expect(newerDone.text("status") == "complete", "\(newerDone)")
        #expect(readBytes(sandbox.path("dl/f.bin")) == v2.data)
        _ = await daemon.stop()
    }
}
