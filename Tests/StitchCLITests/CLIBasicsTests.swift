import Foundation
import Glibc
import Stitch
import StitchTestSupport
import Testing

/// The `stitch` binary's interface: help, usage errors, exit statuses, output streams, signals.
@Suite("stitch CLI basics")
struct CLIBasicsTests {

    // MARK: Help and version

    @Test(arguments: [["--help"], ["-h"], ["help"]])
    func help(_ arguments: [String]) async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(arguments)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.contains("USAGE:"))
        #expect(result.stdout.contains("stitch get URL"))
        #expect(result.stdout.contains("stitch get --resume DEST"))
        #expect(result.stderr.isEmpty)
    }

    @Test(arguments: [
        ["help", "get"], ["--help", "get"], ["get", "--help"], ["get", "-h"], ["get", "http://x/y", "-h"],
    ])
    func helpGet(_ arguments: [String]) async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(arguments)
        #expect(result.status == 0, "\(result)")
        for option in ["--output", "--dir", "--resume", "--checksum", "--retries", "--timeout", "--connect-timeout",
            "--header", "--ca-cert", "--insecure", "--overwrite", "--quiet", "--json", "EXIT STATUS"]
        {
            #expect(result.stdout.contains(option), "get help lacks \(option)")
        }
        for status in ["64", "74", "75", "130", "143"] {
            #expect(result.stdout.contains(status), "get help lacks exit status \(status)")
        }
        #expect(result.stderr.isEmpty)
        #expect(sandbox.entries().isEmpty)
    }

    @Test func version() async throws {
        #expect(
            FileManager.default.isExecutableFile(atPath: StitchBinary.path),
            "no stitch binary at \(StitchBinary.path); set STITCH_BINARY")
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["--version"])
        #expect(result.status == 0)
        // The commit is stamped by scripts/package.sh; a plain build says "unknown".
        #expect(result.stdout.hasPrefix("stitch \(StitchVersion.string) (commit ") && result.stdout.hasSuffix(")\n"), "\(result)")
        #expect(result.stderr.isEmpty)
    }

    @Test func noArgumentsPrintsUsage() async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run([])
        #expect(result.status == 64, "\(result)")
        #expect(result.stdout.isEmpty)
        #expect(result.stderr.contains("USAGE:"))
        #expect(result.stderr.contains("stitch get URL"))
    }

    // MARK: Usage errors (64, one `stitch: …` line, no work done)

    @Test(arguments: [
        (["frobnicate"], "frobnicate"),
        (["--frobnicate"], "--frobnicate"),
        (["get", "--frobnicate", "URL"], "--frobnicate"),
        (["get", "URL", "-x"], "-x"),
        (["get", "URL", "--quiet=yes"], "--quiet"),
        (["get", "URL", "-o"], "-o"),
        (["get", "-o", "x", "URL", "URL"], "-o names one file"),
        (["get"], "missing URL"),
        (["get", "URL", "--quiet", "--json"], "--json"),
        (["get", "URL", "--resume", "x"], "--resume"),
        (["get", "--resume", "x", "-o", "y"], "--resume"),
        // (Without the libcurl transport, --ca-cert itself is refused, as with --transport urlsession below.)
        (
            ["get", "URL", "--ca-cert", "/nonexistent/ca.pem"],
            StitchUnderTest.hasLibcurl ? "/nonexistent/ca.pem" : "--ca-cert needs the libcurl transport"
        ),
        (["get", "URL", "--transport", "carrier-pigeon"], "--transport"),
        (["get", "URL", "--transport"], "--transport"),
        (["get", "URL", "--transport", "urlsession", "-k"], "-k needs the libcurl transport"),
        (["get", "URL", "--transport=urlsession", "--netrc"], "--netrc needs the libcurl transport"),
        (["get", "URL", "--transport", "urlsession", "--insecure"], "--insecure needs the libcurl transport"),
        (["get", "URL", "--netrc-file", "/etc/hostname", "--transport", "urlsession"], "--netrc-file needs the libcurl"),
        (["get", "URL", "--transport", "urlsession", "--streams"], "--streams needs the libcurl transport"),
        (["get", "URL", "URL", "--transport", "urlsession", "--ca-cert", "/etc/hostname"], "--ca-cert needs"),
    ])
    func usageErrors(_ arguments: [String], mentions: String) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f", file: .random(size: 1000, seed: 1))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(arguments.map { $0 == "URL" ? server.url("/f") : $0 })
        expectUsageError(result, mentioning: mentions)
        #expect(server.requests.isEmpty, "a usage error must not reach the network")
        #expect(sandbox.entries().isEmpty)
    }

    @Test(arguments: [
        // ("notaurl" was here: a URL without a scheme is now taken as http://, as curl and wget take it; CLIHabitsTests.)
        "://nohost", "ftp://x/y", "http://", "https://", "http:///path", "file:///etc/passwd", "",
        "http://exa mple.com/f", "http://example.com/a b", "http://example.com/a\u{7}b", "http://example.com/\tx",
        "http://example.com/x\u{7F}", "http://example.com/\u{1B}[31m",
    ])
    func badURL(_ url: String) async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", url, "-o", "out"])
        expectUsageError(result)
        #expect(sandbox.entries().isEmpty)
    }

    @Test(arguments: [
        "sha-256=zz", "sha-256=abcd", "md4=00112233445566778899aabbccddeeff", "sha256", "=abc", "", "sha-256=",
        "sha-1=" + String(repeating: "0", count: 64),
    ])
    func badChecksum(_ checksum: String) async throws {
        try await expectRejected(["--checksum", checksum], mentioning: "--checksum")
    }

    @Test(arguments: ["-1", "abc", "1001", "1.5", "", "0x5", "99999999999999999999"])
    func badRetries(_ value: String) async throws {
        try await expectRejected(["--retries", value], mentioning: "--retries")
    }

    @Test(arguments: [
        ("--timeout", "0"), ("--timeout", "-1"), ("--timeout", "abc"), ("--timeout", "nan"), ("--timeout", "inf"),
        ("--timeout", "86401"), ("--timeout", ""), ("--connect-timeout", "0"), ("--connect-timeout", "-5"),
        ("--connect-timeout", "nan"),
    ])
    func badTimeout(_ flag: String, _ value: String) async throws {
        try await expectRejected([flag, value], mentioning: flag)
        try await expectRejected(["\(flag)=\(value)"], mentioning: flag)
    }

    @Test(arguments: [
        "X: a\r\nEvil: b", "X: a\nEvil: b", "X: a\rb", "NoColon", ": value", "Bad Name: v", "X\r\n: v",
        "Range: bytes=0-", "range: bytes=100-", "If-Range: \"x\"", "Accept-Encoding: gzip", "X: \u{1B}[2J",
    ])
    func hostileHeader(_ header: String) async throws {
        try await expectRejected(["--header", header], mentioning: "--header")
        try await expectRejected(["-H", header], mentioning: "--header")
    }

    @Test func outputAndDirectoryTogether() async throws {
        try await expectRejected(["-o", "file", "-d", "."], mentioning: "-o")
        try await expectRejected(["--output=file", "--dir=."], mentioning: "-o")
    }

    @Test func outputIsADirectory() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f", file: .random(size: 1000, seed: 1))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        try FileManager.default.createDirectory(atPath: sandbox.path("sub"), withIntermediateDirectories: false)
        for output in [".", "sub", sandbox.directory] {
            let result = try await sandbox.run(["get", server.url("/f"), "-o", output])
            expectUsageError(result, mentioning: "-d")
        }
        #expect(server.requests.isEmpty)
        #expect(sandbox.entries() == ["sub"])
    }

    /// `-o` into a folder that does not exist is an I/O error (`-d` creates its folder: CLIHabitsTests).
    @Test func missingDirectoryIsAnIOError() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f.bin", file: .random(size: 1000, seed: 1))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        for arguments in [["-o", "missing/f.bin"]] {
            let result = try await sandbox.run(["get", server.url("/f.bin")] + arguments)
            #expect(result.status == 74, "\(result)")
            #expect(errorLines(result).count == 1)
            #expect(result.stderr.contains("missing"))
        }
        #expect(sandbox.entries().isEmpty)
    }

    /// `--transport` picks the HTTP backend, and the state a download leaves is the engine's, not the backend's: a
    /// download cut over one backend resumes over the other with a validated range, byte-exact.
    @Test(
        .enabled(if: StitchUnderTest.hasLibcurl, StitchUnderTest.libcurlOnly),
        arguments: [(TransportBackend.libcurl, TransportBackend.urlSession), (.urlSession, .libcurl)])
    func aDownloadCutOverOneTransportResumesOverTheOther(first: TransportBackend, then: TransportBackend)
        async throws
    {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3 << 20, seed: 15, etag: "\"t15\"")
        server.serve("/f.bin", file: file, faults: .onRequest(0, .dropAfter(1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let cut = try await sandbox.run(
            ["get", server.url("/f.bin"), "-o", "f.bin", "-q", "-c", "1", "--retries", "0", "--transport", "\(first)"])
        #expect(cut.status != 0, "\(cut)")
        #expect(readBytes(sandbox.path("f.bin")) == nil, "a cut download at the destination")
        let resumed = try await sandbox.run(["get", server.url("/f.bin"), "-o", "f.bin", "-q", "--transport=\(then)"])
        #expect(resumed.status == 0, "\(resumed)")
        #expect(readBytes(sandbox.path("f.bin")) == file.data)
        let requests = server.requests(for: "/f.bin")
        #expect(requests.count == 2, "\(requests.map(\.range))")
        let rangeStart = requests.last?.range.flatMap { Int($0.dropFirst(6).prefix { $0 != "-" }) }
        #expect((rangeStart ?? 0) > 0, "the second run did not resume: \(requests.map(\.range))")
        #expect(requests.last?.header("If-Range") == "\"t15\"")
        #expect(sandbox.entries() == ["f.bin"])
    }

    @Test func goodHeaderIsSent() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f", file: .random(size: 1000, seed: 1))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get", server.url("/f"), "-o", "out", "-q", "-H", "X-Token: a b:c", "--header=X-Other:v"])
        #expect(result.status == 0, "\(result)")
        let request = try #require(server.requests.first)
        #expect(request.header("X-Token") == "a b:c")
        #expect(request.header("X-Other") == "v")
    }

    /// Proxies come from the usual environment variables: the request reaches the proxy in absolute form, with
    /// stitch's User-Agent and `Accept-Encoding: identity`.
    @Test func proxyFromEnvironment() async throws {
        let proxy = try TestHTTPServer()
        defer { proxy.stop() }
        let file = ServedFile.random(size: 5000, seed: 4)
        proxy.serve("/via-proxy.bin", file: file)
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get", "http://downloads.example.invalid/via-proxy.bin", "-o", "out", "-q"],
            environment: ["http_proxy": proxy.baseURL])
        #expect(result.status == 0, "\(result)")
        let request = try #require(proxy.requests.first)
        #expect(request.target == "http://downloads.example.invalid/via-proxy.bin")
        #expect(request.header("User-Agent")?.hasPrefix("stitch/") == true)
        #expect(request.header("Accept-Encoding") == "identity")
        #expect(readBytes(sandbox.directory + "/out") == file.data)
    }

    // MARK: Failures

    @Test func notFound() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/missing.bin"), "-o", "out.bin"])
        #expect(result.status == 1, "\(result)")
        #expect(result.stdout.isEmpty)
        #expect(errorLines(result).count == 1)
        #expect(result.stderr.contains("404"))
        #expect(sandbox.entries().isEmpty, "nothing may be left at DEST: \(sandbox.entries())")

        // The same through -d: no file named after the URL either.
        let viaDirectory = try await sandbox.run(["get", server.url("/missing.bin"), "-d", "."])
        #expect(viaDirectory.status == 1)
        #expect(sandbox.entries().isEmpty, "\(sandbox.entries())")
    }

    @Test func existingDestinationNeedsOverwrite() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 50_000, seed: 2, etag: "\"e\"")
        server.serve("/f", file: file)
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let mine = Array("precious, not from stitch\n".utf8)
        try Data(mine).write(to: URL(fileURLWithPath: sandbox.path("out.bin")))

        let refused = try await sandbox.run(["get", server.url("/f"), "-o", "out.bin"])
        #expect(refused.status == 1, "\(refused)")
        #expect(refused.stdout.isEmpty)
        #expect(errorLines(refused).count == 1)
        #expect(refused.stderr.contains("--overwrite"))
        #expect(readBytes(sandbox.path("out.bin")) == mine)
        #expect(sandbox.entries() == ["out.bin"])

        let replaced = try await sandbox.run(["get", server.url("/f"), "-o", "out.bin", "--overwrite"])
        #expect(replaced.status == 0, "\(replaced)")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
        #expect(sandbox.entries() == ["out.bin"])
    }

    @Test func rerunAfterSuccessIsAlreadyComplete() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 200_000, seed: 3, etag: "\"e\"")
        server.serve("/f.bin", file: file)
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let first = try await sandbox.run(["get", server.url("/f.bin"), "-o", "out.bin"])
        #expect(first.status == 0, "\(first)")
        #expect(sandbox.entries() == ["out.bin"])
        let requests = server.requests.count

        let second = try await sandbox.run(["get", server.url("/f.bin"), "-o", "out.bin"])
        #expect(second.status == 0, "\(second)")
        #expect(second.stderr.contains("already complete"))
        #expect(second.stdout == sandbox.path("out.bin") + "\n")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
        #expect(server.requests.count == requests, "an already complete file is not fetched again")

    }

    @Test func rerunWithDirectoryIsAlreadyComplete() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 200_000, seed: 3, etag: "\"e\"")
        server.serve("/f.bin", file: file)
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let first = try await sandbox.run(["get", server.url("/f.bin"), "-d", "."])
        #expect(first.status == 0, "\(first)")
        #expect(sandbox.entries() == ["f.bin"])

        // -d has to ask the server for the name first, then finds the finished file and stops there.
        let second = try await sandbox.run(["get", server.url("/f.bin"), "-d", ".", "--json"])
        #expect(second.status == 0, "\(second)")
        let done = try #require(jsonLines(second.stdout)?.last)
        #expect(done["event"] as? String == "done")
        #expect(done["already_complete"] as? Bool == true)
        #expect(done["path"] as? String == sandbox.path("f.bin"))
        #expect(readBytes(sandbox.path("f.bin")) == file.data)
        #expect(sandbox.entries() == ["f.bin"])
    }

    @Test func checksumMismatchDeletesThePartial() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 300_000, seed: 4, etag: "\"e\"")
        server.serve("/f", file: file)
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let wrong = "sha-256=" + String(repeating: "ab", count: 32)
        let result = try await sandbox.run(["get", server.url("/f"), "-o", "out.bin", "--checksum", wrong])
        #expect(result.status == 1, "\(result)")
        #expect(result.stdout.isEmpty)
        #expect(result.stderr.contains("checksum mismatch"))
        #expect(result.stderr.contains("deleted"))
        #expect(sandbox.entries().isEmpty, "\(sandbox.entries())")

        let right = "sha-256=" + sha256Hex(file.data)
        let good = try await sandbox.run(["get", server.url("/f"), "-o", "out.bin", "--checksum", right])
        #expect(good.status == 0, "\(good)")
        #expect(good.stderr.contains("verified"))
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
    }

    @Test func retriesExhaustedOnServiceUnavailable() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f", file: .random(size: 1000, seed: 5), faults: .always(.status(503)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get", server.url("/f"), "-o", "out.bin", "--retries", "1"],
            environment: ["STITCH_RETRY_BASE_DELAY": "0.01"])
        #expect(result.status == 75, "\(result)")
        #expect(result.stderr.contains("503"))
        #expect(server.requests.count == 2, "one attempt plus one retry")
        #expect(!fileExists(sandbox.path("out.bin")))
    }

    @Test func retriesExhaustedKeepsThePartial() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 1 << 20, seed: 6, etag: "\"e\"")
        server.serve("/f", file: file) { _, index in index == 0 ? .dropAfter(300_000) : .status(503) }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f"), "-o", "out.bin", "--retries", "1"]
        let result = try await sandbox.run(arguments, environment: ["STITCH_RETRY_BASE_DELAY": "0.01"])
        #expect(result.status == 75, "\(result)")
        #expect(!fileExists(sandbox.path("out.bin")))
        #expect(fileExists(sandbox.path("out.bin.stitch")))
        #expect(fileSize(sandbox.path("out.bin.part")) == 300_000)

        // The server recovers: the rerun continues from the kept bytes.
        server.setFaults("/f", .none)
        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        #expect(server.requests.last?.stitchAskedRange == "bytes=300000-")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
    }

    /// Responses no retry can change end at once with exit 1 and one line naming what was wrong: a NUL byte in a
    /// header (libcurl refuses it), an encoded body despite `identity`, conflicting `Content-Length`s. No retry,
    /// no promise of a resume, nothing saved.
    @Test(arguments: [
        ("X-Nul: a\u{0}b", "malformed"), ("Content-Encoding: gzip", "encoded body"),
        ("Content-Length: 99", "conflicting Content-Length"),
    ])
    func unchangeableFailuresEndAtOnce(_ header: String, _ words: String) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let body = [UInt8](repeating: 0x61, count: 100)
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nETag: \"x\"\r\n\(header)\r\n\r\n"
        server.serve("/f", file: ServedFile(data: body), faults: .always(.raw(Array(head.utf8) + body)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/f"), "-o", "out.bin"])
        #expect(result.status == 1, "\(result)")
        #expect(errorLines(result).count == 1, "\(result)")
        #expect(result.stderr.contains(words), "\(result)")
        #expect(!result.stderr.contains("retry") && !result.stderr.contains("rerun"), "\(result)")
        #expect(server.requests.count == 1)
        #expect(sandbox.entries().isEmpty, "\(sandbox.entries())")
    }

    /// A host that does not resolve: one line, exit 1, no retry. A refused port: three tries within seconds,
    /// then one line naming the server; neither promises a resume when nothing was saved.
    @Test func unreachableServersFailPlainly() async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let unresolved = try await sandbox.run(["get", "http://no-such-host.invalid/f", "-o", "out.bin"])
        #expect(unresolved.status == 1, "\(unresolved)")
        #expect(errorLines(unresolved) == errorLines(unresolved).filter { $0.contains("cannot resolve host") })
        #expect(errorLines(unresolved).count == 1, "\(unresolved)")
        #expect(!unresolved.stderr.contains("retry") && !unresolved.stderr.contains("rerun"), "\(unresolved)")

        let refusing = try RefusingPort()  // bound, not listening: refused, and no other test's server there
        let port = refusing.port
        let refused = try await sandbox.run(["get", "http://127.0.0.1:\(port)/f", "-o", "out.bin"])
        #expect(refused.status == 1, "\(refused)")
        let lines = errorLines(refused)
        #expect(lines.count == 3 && lines.prefix(2).allSatisfy { $0.contains("retry") }, "\(refused)")
        // libcurl reads the system's reason; FoundationNetworking reports only that the connection was not made.
        let reason = StitchUnderTest.isURLSession ? "refused, or the host cannot be reached" : "connection refused"
        #expect(lines.last == "stitch: cannot connect to 127.0.0.1:\(port): \(reason) (3 tries)", "\(refused)")
        #expect(!refused.stderr.contains("rerun"), "\(refused)")
        #expect(sandbox.entries().isEmpty, "\(sandbox.entries())")
        withExtendedLifetime(refusing) {}
    }

    @Test func retriesExhaustedOnDroppedConnections() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f", file: .random(size: 100_000, seed: 7), faults: .always(.closeWithoutResponse))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get", server.url("/f"), "-o", "out.bin", "--retries", "2"],
            environment: ["STITCH_RETRY_BASE_DELAY": "0.01"])
        #expect(result.status == 75, "\(result)")
        #expect(server.requests.count == 3)
        #expect(!fileExists(sandbox.path("out.bin")))
    }

    @Test func stallTimeoutRetriesThenKeepsThePartial() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 1 << 20, seed: 13, etag: "\"e\"")
        // The first response stalls after 100 kB, later ones before the headers: no progress after that.
        server.serve("/f", file: file) { _, index in
            index == 0 ? .stallAfter(100_000, then: .close) : .stallBeforeHeaders(then: .close)
        }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        // A stall timeout of 1 s, or 4 s over URLSession, whose callbacks can come late under load.
        let timeout = "\(Int(TransportBackend.default.shortStallTimeout))"
        let result = try await sandbox.run(
            ["get", server.url("/f"), "-o", "out.bin", "--timeout", timeout, "--retries", "1"],
            environment: ["STITCH_RETRY_BASE_DELAY": "0.01"], timeout: .seconds(30))
        #expect(result.status == 75, "\(result)")
        #expect(server.requests.count == 2, "one stalled attempt, one retry that made no progress")
        #expect(server.requests.last?.stitchAskedRange == "bytes=100000-")
        #expect(fileSize(sandbox.path("out.bin.part")) == 100_000)
        #expect(!fileExists(sandbox.path("out.bin")))
    }

    @Test func signalDuringRetryBackoff() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f", file: .random(size: 1000, seed: 14), faults: .always(.status(503)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        // A 100 s backoff: the signal must cut it short.
        let run = try sandbox.start(
            ["get", server.url("/f"), "-o", "out.bin", "--json"], environment: ["STITCH_RETRY_BASE_DELAY": "100"])
        // The "retry" event shows stitch is in its backoff sleep.
        let sleeping = await waitUntil { run.stdoutSoFar.contains("\"event\":\"retry\"") || !run.isRunning }
        #expect(sleeping && run.isRunning, "no retry event: \(run.stdoutSoFar)")
        run.send(SIGTERM)
        let result = await run.wait(timeout: .seconds(20))
        #expect(result.status == 143, "\(result)")
        #expect(!result.timedOut)
        #expect(jsonLines(result.stdout)?.last?["event"] as? String == "error")
        // Once seen in CI's ThreadSanitizer stage (2 requests); the events and requests say which path retried.
        #expect(
            server.requests.count == 1,
            "requests \(server.requests.map { "\($0.method) \($0.target) \($0.stitchAskedRange ?? "-")" }); \(result)")
    }

    @Test func contentDispositionNameIsSanitized() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(
            size: 10_000, seed: 15, etag: "\"e\"", contentDisposition: "attachment; filename=\"../../.evil.sh\"")
        server.serve("/download", file: file)
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        try FileManager.default.createDirectory(atPath: sandbox.path("in"), withIntermediateDirectories: false)
        let result = try await sandbox.run(["get", server.url("/download"), "-d", "in"])
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout == sandbox.path("in/evil.sh") + "\n")
        #expect(sandbox.entries("in") == ["evil.sh"])
        #expect(sandbox.entries() == ["in"], "nothing may escape the directory")
        #expect(readBytes(sandbox.path("in/evil.sh")) == file.data)
    }

    @Test func redirectIsFollowedAndReported() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 10_000, seed: 16, etag: "\"e\"")
        server.serve("/files/real.bin", file: file)
        server.redirect(from: "/latest", to: "/files/real.bin")
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/latest"), "-d", ".", "--json"])
        #expect(result.status == 0, "\(result)")
        let events = try #require(jsonLines(result.stdout))
        let redirect = try #require(events.first { $0["event"] as? String == "redirect" })
        #expect(redirect["url"] as? String == server.url("/files/real.bin"))
        #expect(events.last?["path"] as? String == sandbox.path("real.bin"), "named after the final URL")
        #expect(readBytes(sandbox.path("real.bin")) == file.data)

        server.redirect(from: "/loop-a", to: "/loop-b")
        server.redirect(from: "/loop-b", to: "/loop-a")
        let loop = try await sandbox.run(["get", server.url("/loop-a"), "-o", "loop.bin"])
        #expect(loop.status == 1, "\(loop)")
        #expect(loop.stderr.contains("redirect loop"))
        #expect(!fileExists(sandbox.path("loop.bin")))
    }

    // MARK: Output streams

    @Test func resultOnStdoutProgressOnStderr() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 1_600_000, seed: 8, etag: "\"e\"")
        server.serve("/f", file: file, faults: .always(.throttle(bytesPerSecond: 1_500_000)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/f"), "-o", "out.bin"])
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout == sandbox.path("out.bin") + "\n")
        #expect(result.stderr.contains("saved \(sandbox.path("out.bin"))"))
        // At least one plain progress line (not a terminal: no bar, no escape sequences).
        #expect(result.stderrLines.contains { $0.contains("%") && $0.contains("/s") }, "\(result)")
        #expect(!result.stderr.contains("\u{1B}["))
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
    }

    @Test func quietPrintsNothingOnStderr() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 600_000, seed: 9, etag: "\"e\"")
        server.serve("/f", file: file, faults: .always(.throttle(bytesPerSecond: 1_500_000)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        for flag in ["--quiet", "-q"] {
            let result = try await sandbox.run(["get", server.url("/f"), "-o", "out\(flag).bin", flag])
            #expect(result.status == 0, "\(result)")
            #expect(result.stderr.isEmpty, "\(result)")
            #expect(result.stdout == sandbox.path("out\(flag).bin") + "\n")
        }
    }

    @Test func jsonStreamOnSuccess() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 1_800_000, seed: 10, etag: "\"e\"")
        server.serve("/f", file: file, faults: .always(.throttle(bytesPerSecond: 1_500_000)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/f"), "-o", "out.bin", "--json"])
        #expect(result.status == 0, "\(result)")
        let events = try #require(jsonLines(result.stdout), "stdout is not NDJSON: \(result.stdout)")
        #expect(events.count >= 3)
        for event in events {
            #expect(event["v"] as? Int == 1)
            #expect(event["event"] is String)
        }
        let names = events.compactMap { $0["event"] as? String }
        #expect(names.first == "destination")
        #expect(names.contains("response"))
        #expect(names.contains("progress"), "1.8 MB at 1.5 MB/s should report progress: \(names)")
        #expect(names.last == "done")
        let done = try #require(events.last)
        #expect(done["path"] as? String == sandbox.path("out.bin"))
        #expect(done["bytes"] as? Int == file.data.count)
        #expect(done["transferred"] as? Int == file.data.count)
        #expect(done["already_complete"] as? Bool == false)
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
    }

    @Test func jsonStreamOnFailure() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/missing"), "-o", "out.bin", "--json"])
        #expect(result.status == 1, "\(result)")
        let events = try #require(jsonLines(result.stdout), "stdout is not NDJSON: \(result.stdout)")
        #expect(!events.isEmpty)
        for event in events {
            #expect(event["v"] as? Int == 1)
            #expect(event["event"] is String)
        }
        let error = try #require(events.last)
        #expect(error["event"] as? String == "error")
        #expect(error["code"] as? String == "httpStatus")
        #expect((error["message"] as? String)?.contains("404") == true)
        #expect(error["resumable"] as? Bool == false)

        // An engine-level usage error (bad URL) in --json mode also ends with an error event.
        let bad = try await sandbox.run(["get", "ftp://x/y", "--json"])
        #expect(bad.status == 64)
        let badEvents = try #require(jsonLines(bad.stdout))
        #expect(badEvents.last?["event"] as? String == "error")
    }

    // MARK: Resume

    @Test func resumeWithoutURL() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3 << 20, seed: 11, etag: "\"e\"")
        // The first response is throttled and holds after 1 MiB until the client goes away.
        server.serve("/f", file: file, faults: .onRequest(0, Self.throttledThenStalled(after: 1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let sha = "sha-256=" + sha256Hex(file.data)
        let first = try sandbox.start(["get", server.url("/f"), "-o", "out.bin", "--checksum", sha, "-H", "X-Keep: 1"])
        // On bytes the client has written: on a loaded machine (CI's sanitizer runs) the server's 1 MiB can sit in
        // socket buffers before the client has even made its part file, and a kill then leaves nothing to resume.
        let seen = await waitForBytes(512 << 10, while: first, onReach: { _ in first.kill() }) {
            fileSize(sandbox.path("out.bin.part"))
        }
        #expect(seen != nil, "the first run ended before writing 512 KiB")
        first.kill()
        let killed = await first.wait()
        #expect(killed.signal == SIGKILL)
        #expect(await server.settled())
        #expect(!fileExists(sandbox.path("out.bin")))

        // Full speed now; --resume takes URL, headers and checksum from the state file.
        let resumed = try await sandbox.run(["get", "--resume", "out.bin"])
        #expect(resumed.status == 0, "\(resumed)")
        #expect(resumed.stderr.contains("resuming at"))
        #expect(resumed.stderr.contains("verified"), "the saved checksum is checked: \(resumed)")
        let request = try #require(server.requests(for: "/f").last)
        let start = try #require(rangeStart(request.range))
        #expect(start > 0 && start <= 1 << 20, "resumed at \(start); only 1 MiB was ever sent")
        #expect(request.header("If-Range") == "\"e\"")
        #expect(request.header("X-Keep") == "1", "saved --header values are sent again")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
        #expect(sandbox.entries() == ["out.bin"])
    }

    @Test func resumeWithNothingThere() async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", "--resume", "nothing.bin"])
        #expect(result.status == 64, "\(result)")
        #expect(errorLines(result).count == 1)
        #expect(result.stderr.contains("nothing.bin"))
        #expect(sandbox.entries().isEmpty)
    }

    @Test(arguments: [(SIGINT, Int32(130)), (SIGTERM, Int32(143))])
    func signalSavesStateAndRerunCompletes(_ signal: Int32, _ expected: Int32) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3 << 20, seed: 12, etag: "\"e\"")
        server.serve("/f", file: file, faults: .onRequest(0, Self.throttledThenStalled(after: 1 << 20)))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let arguments = ["get", server.url("/f"), "-o", "out.bin"]
        let run = try sandbox.start(arguments)
        // On bytes the client has written (what the server sent may still sit in socket buffers on a busy machine).
        let seen = await waitForBytes(512 << 10, while: run, onReach: { _ in run.send(signal) }) {
            fileSize(sandbox.path("out.bin.part"))
        }
        #expect(seen != nil, "the run ended before 512 KiB")
        let result = await run.wait(timeout: .seconds(20))
        #expect(result.status == expected, "\(result)")
        #expect(result.signal == nil, "stitch must exit on its own after saving, not die by the signal")
        #expect(result.stderr.contains("resume"), "\(result)")
        #expect(result.stdout.isEmpty)
        #expect(!fileExists(sandbox.path("out.bin")))
        #expect(fileExists(sandbox.path("out.bin.part")))
        #expect(fileExists(sandbox.path("out.bin.stitch")))
        #expect(await server.settled())
        let saved = fileSize(sandbox.path("out.bin.part"))
        #expect(saved > 0 && saved <= server.bodyBytesSent(for: "/f"))

        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        let start = try #require(rangeStart(server.requests(for: "/f").last?.range))
        #expect(start == saved, "a graceful stop saves everything written")
        #expect(readBytes(sandbox.path("out.bin")) == file.data)
        #expect(sandbox.entries() == ["out.bin"])
    }

    // MARK: Helpers

    /// A paced response that stops after `bytes` body bytes and stays open until the client leaves (or the
    /// stall is released), so an interruption lands mid-transfer at an exact byte count.
    static func throttledThenStalled(after bytes: Int) -> Fault {
        .all([.throttle(bytesPerSecond: 4_000_000), .stallAfter(bytes, then: .close)])
    }

    /// Runs `stitch get URL -o out <extra>` against a live server and expects a usage error that names
    /// `mentioning`, without any request or file.
    private func expectRejected(_ extra: [String], mentioning: String) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f", file: .random(size: 1000, seed: 1))
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", server.url("/f"), "-o", "out"] + extra)
        expectUsageError(result, mentioning: mentioning)
        #expect(server.requests.isEmpty, "a usage error must not reach the network: \(extra)")
        #expect(sandbox.entries().isEmpty)
    }

    private func expectUsageError(
        _ result: CommandResult, mentioning: String? = nil, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(result.status == 64, "\(result)", sourceLocation: sourceLocation)
        #expect(result.stdout.isEmpty, "\(result)", sourceLocation: sourceLocation)
        let lines = result.stderrLines
        #expect(lines.first?.hasPrefix("stitch: ") == true, "\(result)", sourceLocation: sourceLocation)
        #expect(errorLines(result).count == 1, "exactly one error line: \(result)", sourceLocation: sourceLocation)
        #expect(lines.count <= 2, "an error line plus at most a usage hint: \(result)", sourceLocation: sourceLocation)
        if let mentioning {
            #expect(
                lines.first?.contains(mentioning) == true, "the error should name \(mentioning): \(result)",
                sourceLocation: sourceLocation)
        }
    }
}
