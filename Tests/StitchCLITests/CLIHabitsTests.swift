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
