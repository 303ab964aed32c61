import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Testing

/// `--load-cookies FILE` (issue 36): the Netscape file's cookies sent where their domain, path, scheme and expiry
/// allow, across a redirect; a malformed line named and skipped; nothing of them in a state file.
@Suite("stitch get --load-cookies")
struct CookieTests {
    static func jar(_ port: Int) -> String {
        [
            "# Netscape HTTP Cookie File",
            "127.0.0.1\tFALSE\t/a\tFALSE\t0\tsession\tv1",
            "#HttpOnly_127.0.0.1\tFALSE\t/\tFALSE\t4102444800\troot\tr",
            "127.0.0.1\tFALSE\t/\tTRUE\t0\tsecure\tx",
            "127.0.0.1\tFALSE\t/\tFALSE\t1\told\ty",
            "localhost\tFALSE\t/\tFALSE\t0\tother\tz",
            "127.0.0.1\tFALSE\t/ab\tFALSE\t0\tprefix\tp",
            "this line is not a cookie",
            "",
        ].joined(separator: "\n")
    }

    /// Behind a "login" (the server answers 403 without the session cookie): without the file, one error line and
    /// nothing saved; with it, the file, and each request carried exactly the cookies that match it.
    @Test func cookiesAreSentWhereTheyMatch() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 200_000, seed: 36)
        server.serve("/a/f.bin", file: file) { request, _ in
            (request.header("Cookie") ?? "").contains("session=v1") ? .none : .status(403)
        }
        server.redirect(from: "/start", to: "/a/f.bin")
        let sandbox = try Sandbox("cookies")
        defer { sandbox.cleanup() }
        try Data(Self.jar(server.port).utf8).write(to: URL(fileURLWithPath: sandbox.path("jar.txt")))

        let without = try await sandbox.run(["get", server.url("/start"), "-o", "no.bin"])
        #expect(without.status == 1 && errorLines(without).last?.contains("403") == true, "\(without)")
        #expect(!fileExists(sandbox.path("no.bin")))

        let with = try await sandbox.run(["get", server.url("/start"), "-o", "f.bin", "--load-cookies", sandbox.path("jar.txt")])
        #expect(with.status == 0, "\(with)")
        #expect(readBytes(sandbox.path("f.bin")) == file.data)
        #expect(with.stderr.contains("jar.txt: line 8: not a cookie"), "\(with.stderr)")
        let cookies = server.requests.filter { $0.header("Cookie") != nil || $0.path == "/start" }
            .map { "\($0.path) \($0.header("Cookie") ?? "-")" }
        #expect(cookies.contains("/start root=r"), "\(cookies)")
        #expect(cookies.contains("/a/f.bin session=v1; root=r"), "longer paths first, and only those that match: \(cookies)")
        #expect(!cookies.joined().contains("secure=") && !cookies.joined().contains("old=") && !cookies.joined().contains("other="))
        #expect(!cookies.joined().contains("prefix="), "/ab is not a prefix of /a/…")
    }

    /// An interrupted download keeps its state beside the file; the cookies are not in it (they are sent, never saved),
    /// and the rerun with the file resumes.
    @Test func cookiesAreNeverSaved() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3_000_000, seed: 37)
        server.serve("/a/f.bin", file: file) { request, index in
            guard (request.header("Cookie") ?? "").contains("session=v1") else { return .status(403) }
            return index == 0 ? .dropAfter(2_000_000) : .none
        }
        let sandbox = try Sandbox("cookies")
        defer { sandbox.cleanup() }
        try Data(Self.jar(server.port).utf8).write(to: URL(fileURLWithPath: sandbox.path("jar.txt")))
        let arguments = ["get", server.url("/a/f.bin"), "-o", "f.bin", "-c", "1", "--load-cookies", sandbox.path("jar.txt")]
        let first = try await sandbox.run(arguments + ["--retries", "0"])
        #expect(first.status != 0, "\(first)")
        let state = try #require(FileManager.default.contents(atPath: sandbox.path("f.bin.stitch")), "\(sandbox.entries())")
        #expect(!String(decoding: state, as: UTF8.self).contains("v1"), "the state file holds no cookie")
        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0 && rerun.stderr.contains("resuming at"), "\(rerun)")
        #expect(readBytes(sandbox.path("f.bin")) == file.data)
    }

    @Test func aCookieStringIsNotAFile() async throws {
        let sandbox = try Sandbox("cookies")
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", "http://127.0.0.1:1/f", "-b", "name=value"])
        #expect(result.status == 64 && result.stderr.contains("-H 'Cookie: NAME=VALUE'"), "\(result)")
    }

    /// `stitch serve --load-cookies FILE`: every download's matching requests carry them; getGlobalOption names the
    /// file.
    @Test func theDaemonSendsTheFilesCookies() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 100_000, seed: 38)
        server.serve("/a/f.bin", file: file) { request, _ in
            (request.header("Cookie") ?? "").contains("session=v1") ? .none : .status(403)
        }
        let sandbox = try Sandbox("cookies")
        defer { sandbox.cleanup() }
        try Data(Self.jar(server.port).utf8).write(to: URL(fileURLWithPath: sandbox.path("jar.txt")))
        let daemon = try await ServedDaemon(
            directory: sandbox.path("dl"), ["--load-cookies", sandbox.path("jar.txt")], sandbox: sandbox)
        let gid = try #require(try daemon.result("aria2.addUri", [.array([.string(server.url("/a/f.bin"))])]).string)
        let done = try await daemon.waitFor(gid) { ["complete", "error"].contains($0.text("status")) }
        #expect(done.text("status") == "complete", "\(done)")
        #expect(readBytes(sandbox.path("dl/f.bin")) == file.data)
        #expect(try daemon.result("aria2.getGlobalOption").text("load-cookies") == sandbox.path("jar.txt"))
        _ = await daemon.stop()
    }
}
