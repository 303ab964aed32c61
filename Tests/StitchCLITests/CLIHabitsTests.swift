import Foundation
import Glibc
import Stitch
import StitchTestSupport
import Testing

/// What people type out of habit from curl, wget and aria2c (issue 14): `stitch URL` without `get`, a URL without a
/// scheme, `-c URL` meaning "continue", and `-d` naming a folder that does not exist yet.
@Suite("stitch CLI habits")
struct CLIHabitsTests {
    /// A server with one file, and the file's URL without its scheme.
    private static func serve(_ seed: UInt64) throws -> (TestHTTPServer, ServedFile, String) {
        let server = try TestHTTPServer()
        let file = ServedFile.random(size: 300_000, seed: seed, etag: "\"h\"")
        server.serve("/f.bin", file: file)
        let bare = String(server.url("/f.bin").dropFirst("http://".count))
        return (server, file, bare)
    }

    /// `stitch URL…` is `stitch get URL…`, options before or after the URL.
    @Test(arguments: [false, true])
    func bareURLMeansGet(optionsFirst: Bool) async throws {
        let (server, file, _) = try Self.serve(31)
        defer { server.stop() }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let url = server.url("/f.bin")
        let result = try await sandbox.run(optionsFirst ? ["-o", "out.bin", url] : [url, "-o", "out.bin"])
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
        #expect(sandbox.entries() == ["out.bin"])
        #expect(server.requests(for: "/f.bin").count == 1)
    }

    /// A URL without a scheme is taken as `http://…`, with a note saying so, on the command line (with and without
    /// `get`) and in an `-i` list.
    @Test func urlWithoutASchemeIsHTTP() async throws {
        let (server, file, bare) = try Self.serve(32)
        defer { server.stop() }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let withGet = try await sandbox.run(["get", bare, "-o", "a.bin"])
        #expect(withGet.status == 0, "\(withGet)")
        #expect(withGet.stderr.contains("no scheme in '\(bare)': using http://\(bare)"), "\(withGet)")
        #expect(readBytes(sandbox.path("a.bin")) == file.data)
        let withoutGet = try await sandbox.run([bare, "-o", "b.bin"])
        #expect(withoutGet.status == 0, "\(withoutGet)")
        #expect(readBytes(sandbox.path("b.bin")) == file.data)

        try Data("\(bare)\n  out=c.bin\n".utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        let listed = try await sandbox.run(["get", "-i", sandbox.path("list.txt"), "-d", sandbox.path("in")])
        #expect(listed.status == 0, "\(listed)")
        #expect(listed.stderr.contains("line 1: note: no scheme"), "\(listed)")
        #expect(readBytes(sandbox.path("in/c.bin")) == file.data)
        #expect(server.requests(for: "/f.bin").count == 3)
    }

    /// `-c URL` (wget's and aria2c's "continue") downloads the URL and says in one line what stitch's `-c` is;
    /// `-c 2 URL` still sets connections, and `-c` followed by neither is still a usage error.
    @Test func dashCBeforeAURLIsAHint() async throws {
        let (server, file, _) = try Self.serve(33)
        defer { server.stop() }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let url = server.url("/f.bin")
        for arguments in [["-c", url, "-o", "a.bin"], ["get", "-c", url, "-o", "a.bin", "--overwrite"]] {
            let result = try await sandbox.run(arguments)
            #expect(result.status == 0, "\(arguments): \(result)")
            let hints = result.stderrLines.filter { $0.contains("-c sets the number of connections") }
            #expect(hints.count == 1, "\(result)")
            #expect(readBytes(sandbox.path("a.bin")) == file.data)
        }
        let bad = try await sandbox.run(["get", "-c", "many", url, "-o", "b.bin"])
        #expect(bad.status == 64, "\(bad)")
        #expect(bad.stderr.contains("--connections takes a whole number"), "\(bad)")
        #expect(!fileExists(sandbox.path("b.bin")))
    }

    /// A word that is no URL and no command stays an unknown command, with no request made.
    @Test(arguments: ["gte", "serv", "list", "1.5", "-c"])
    func mistypedCommandIsStillUnknown(_ word: String) async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run([word])
        #expect(result.status == 64, "\(result)")
        let what = word.hasPrefix("-") ? "option" : "command"
        #expect(result.stderr.contains("unknown \(what) '\(word)'"), "\(result)")
        #expect(sandbox.entries().isEmpty)
    }

    /// `-u USER:PASSWORD` sends HTTP Basic credentials to the URL's origin only: not to another origin a redirect
    /// leads to (as curl), and nowhere on disk or in `--json` (the state files of an interrupted download, the
    /// events); `--resume` with `-u` again finishes it.
    @Test func credentialsStayWithTheirOrigin() async throws {
        let origin = try TestHTTPServer()
        defer { origin.stop() }
        let other = try TestHTTPServer()
        defer { other.stop() }
        let file = ServedFile.random(size: 2 << 20, seed: 35, etag: "\"u\"")
        origin.serve("/f.bin", file: file) { _, index in index == 0 ? .stallAfter(1 << 20, then: .close) : .none }
        origin.redirect(from: "/away", to: other.url("/f.bin"))
        other.serve("/f.bin", file: file)
        let password = "pa:ss-\(UInt32.random(in: 100_000...999_999))"
        let basic = "Basic " + Data("me:\(password)".utf8).base64EncodedString()
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }

        let first = try sandbox.start(["get", origin.url("/f.bin"), "-u", "me:\(password)", "-o", "out.bin", "--json"])
        let reached = await waitForBytes(512 << 10, while: first, onReach: { _ in first.kill() }) {
            fileSize(sandbox.path("out.bin.part"))
        }
        first.kill()
        let killed = await first.wait()
        try #require(reached != nil && killed.signal == SIGKILL, "\(killed)")
        #expect(origin.requests(for: "/f.bin").first?.header("Authorization") == basic)
        #expect(!killed.stdout.contains(password) && !killed.stdout.contains(basic), "\(killed.stdout)")
        for name in sandbox.entries() {
            // Searched as bytes: the part file is binary, and String(decoding:) of a MiB of random bytes held a
            // thread of the concurrency pool for over 20 s on a loaded machine (a backtrace per repaired sequence),
            // while other tests' downloads waited for it.
            let contents = readBytes(sandbox.path(name)) ?? []
            #expect(
                !bytes(contents, contain: password) && !bytes(contents, contain: basic.dropFirst(6)),
                "\(name) holds the secret")
        }
        #expect(sandbox.entries().contains("out.bin.stitch"), "\(sandbox.entries())")

        let resumed = try await sandbox.run(["get", "--resume", "out.bin", "-u", "me:\(password)"])
        #expect(resumed.status == 0, "\(resumed)")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
        #expect(origin.requests(for: "/f.bin").last?.header("Authorization") == basic)

        let redirected = try await sandbox.run(["get", origin.url("/away"), "-u", "me:\(password)", "-o", "r.bin"])
        #expect(redirected.status == 0, "\(redirected)")
        #expect(readBytes(sandbox.path("r.bin")) == file.data)
        #expect(origin.requests(for: "/away").first?.header("Authorization") == basic)
        let followed = try #require(other.requests(for: "/f.bin").first)
        #expect(followed.header("Authorization") == nil, "credentials must not follow a redirect to another origin")

        let noPassword = try await sandbox.run(["get", origin.url("/f.bin"), "-u", "me", "-o", "p.bin"])
        #expect(noPassword.status == 64, "no terminal to ask on: \(noPassword)")
        #expect(errorLines(noPassword).count == 1)
    }

    /// `-o -` writes the body to standard output in order, with nothing on disk; a dropped connection continues
    /// with `Range` and `If-Range` from the last byte written.
    @Test func streamToStandardOutput() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3 << 20, seed: 36, etag: "\"s\"")
        server.serve("/f.bin", file: file) { _, index in index == 0 ? .dropAfter(1 << 20) : .none }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get", server.url("/f.bin"), "-o", "-"], environment: ["STITCH_RETRY_BASE_DELAY": "0.01"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdoutBytes == file.data, "\(result.stdoutBytes.count) bytes")
        #expect(result.stderr.contains("streamed 3.0 MiB"), "\(result.stderr)")
        #expect(sandbox.entries().isEmpty, "nothing on disk")
        let requests = server.requests(for: "/f.bin")
        #expect(requests.count == 2)
        let resumedAt = try #require(rangeStart(requests.last?.range))
        #expect(resumedAt > 0 && resumedAt <= 1 << 20, "continued from what was written: \(resumedAt)")
        #expect(requests.last?.header("If-Range") == "\"s\"")
        #expect(requests.allSatisfy { $0.header("Accept-Encoding") == "identity" })
    }

    /// A 503 mid-stream is retried and said as what it was (not "the body ended early"); the output is whole.
    @Test func streamRetrySaysWhy() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 1 << 20, seed: 37, etag: "\"r\"")
        server.serve("/f.bin", file: file, faults: .onRequests([0: .dropAfter(300_000), 1: .status(503)]))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get", server.url("/f.bin"), "-o", "-"], environment: ["STITCH_RETRY_BASE_DELAY": "0.01"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdoutBytes == file.data, "\(result.stdoutBytes.count) bytes")
        #expect(result.stderr.contains("HTTP 503"), "\(result.stderr)")
        #expect(server.requests(for: "/f.bin").count == 3)
    }

    /// Once bytes went out, the stream never restarts: a whole file to the range (200), or no validator to ask
    /// with, fails with one line saying so, after exactly the bytes the first response gave.
    @Test(arguments: [false, true])
    func streamNeverRestarts(withValidator: Bool) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 2 << 20, seed: 37, etag: withValidator ? "\"r\"" : nil)
        server.serve("/f.bin", file: file) { _, index in index == 0 ? .dropAfter(1 << 20) : .ignoreRange }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get", server.url("/f.bin"), "-o", "-"], environment: ["STITCH_RETRY_BASE_DELAY": "0.01"])
        #expect(result.status != 0, "\(result.stderr)")
        // With a validator it retried once (a line saying so) before the whole file came back.
        #expect(errorLines(result).count == (withValidator ? 2 : 1), "\(result.stderr)")
        let last = errorLines(result).last ?? ""
        #expect(last.contains(withValidator ? "cannot restart from zero" : "cannot be resumed"), "\(result.stderr)")
        // The library says what to do in no interface's words (Remedy.saveToFile); the command line names its flag.
        #expect(last.contains("use -o FILE to download it resumably"), "\(result.stderr)")
        #expect(result.stdoutBytes.count <= 1 << 20 && result.stdoutBytes.count > 0)
        #expect(result.stdoutBytes == Array(file.data.prefix(result.stdoutBytes.count)), "a prefix of the file, never spliced")
        #expect(server.requests(for: "/f.bin").count == (withValidator ? 2 : 1))
    }

    /// What `-o -` cannot do is a usage error before any request.
    @Test(arguments: [["-c", "4"], ["--checksum", "sha-256=" + String(repeating: "0", count: 64)], ["--json"], ["--streams", "-c", "2"]])
    func streamRefusesWhatItCannotDo(_ extra: [String]) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f.bin", file: .random(size: 1000, seed: 1))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/f.bin"), "-o", "-"] + extra)
        #expect(result.status == 64, "\(result)")
        #expect(server.requests.isEmpty)
    }

    /// `-d` creates the folder with its parents for one URL as for several; a path that cannot be a folder is one
    /// error line and exit status 74, with nothing fetched.
    @Test func directoryIsCreatedForOneURL() async throws {
        let (server, file, _) = try Self.serve(34)
        defer { server.stop() }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let url = server.url("/f.bin")
        let result = try await sandbox.run(["get", url, "-d", "a/b/c"])
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(sandbox.path("a/b/c/f.bin")) == file.data)
        #expect(sandbox.entries("a/b/c") == ["f.bin"])

        #expect(FileManager.default.createFile(atPath: sandbox.path("plain"), contents: Data("x".utf8)))
        let blocked = try await sandbox.run(["get", url, "-d", "plain/sub"])
        #expect(blocked.status == 74, "\(blocked)")
        #expect(errorLines(blocked).count == 1, "\(blocked)")
        #expect(blocked.stderr.contains("cannot create the directory"), "\(blocked)")
        #expect(server.requests(for: "/f.bin").count == 1, "nothing fetched for the folder that could not be made")
    }
}
