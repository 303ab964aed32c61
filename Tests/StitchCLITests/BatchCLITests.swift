import Foundation
import Glibc
import Stitch
import StitchTestSupport
import Synchronization
import Testing

/// `stitch get URL URL…` and `stitch get -i FILE` (batches through the download manager) from the outside:
/// byte-exact files and the exact stdout paths, the input-file keys, failures that do not stop the rest and the exit
/// status they give, the `-j` cap and keep-alive reuse counted on the server, a rerun after SIGINT/SIGTERM that
/// fetches only what is unfinished, name collisions, and usage errors. Faults fire on byte counts and stalls, never
/// after a sleep.
@Suite("stitch batch downloads")
struct BatchCLITests {

    // MARK: 1. Several URLs on the command line

    /// Six files of different sizes (one over 4 MiB) given as URLs: every one byte-exact in `-d DIR`, stdout lists
    /// exactly their six paths, exit 0, "6 completed, 0 failed", no part or state file left.
    @Test func severalURLsOnTheCommandLine() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let sizes = [1, 1000, 65_543, 300_000, 1_572_864 + 11, (4 << 20) + 4097]
        var files: [String: [UInt8]] = [:]
        for (index, size) in sizes.enumerated() {
            let name = "f\(index).bin"
            let file = ServedFile.random(size: size, seed: UInt64(100 + index), etag: "\"f\(index)\"")
            server.serve("/" + name, file: file)
            files[name] = file.data
        }
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let names = files.keys.sorted()
        let result = try await sandbox.run(["get"] + names.map { server.url("/" + $0) } + ["-d", "dl"])
        #expect(result.status == 0, "\(result)")
        #expect(result.stdoutLines.sorted() == names.map { sandbox.path("dl/" + $0) }.sorted(), "\(result)")
        #expect(result.stderr.contains("6 completed, 0 failed"), "\(result)")
        #expect(!result.stderr.contains("failed "), "\(result)")
        Self.expectProgressLines(result, total: 6)
        for name in names {
            Self.expectFile(sandbox.path("dl/" + name), files[name], "\(name) differs")
        }
        #expect(sandbox.entries("dl") == names, "leftovers: \(sandbox.entries("dl"))")
        #expect(sandbox.entries() == ["dl"])
    }

    // MARK: 2. The input file

    /// A list with comments (also between a URI and its options), blank lines and CRLF; `out=` with a subfolder,
    /// `dir=` relative to the working directory, a correct `checksum=`, `header=` that replaces a `-H` of the same
    /// name for its download only, and `split=4` on a big file (ranged requests).
    @Test func inputFileKeys() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let a = ServedFile.random(size: 70_000, seed: 201, etag: "\"a\"")
        let b = ServedFile.random(size: 90_001, seed: 202, etag: "\"b\"")
        let c = ServedFile.random(size: 250_000, seed: 203, etag: "\"c\"")
        let d = ServedFile.random(size: 6 << 20, seed: 204, etag: "\"d\"")
        let e = ServedFile.random(size: 5_000, seed: 205, etag: "\"e\"")
        for (path, file) in [("/a.bin", a), ("/b.bin", b), ("/c.bin", c), ("/e.bin", e)] {
            server.serve(path, file: file)
        }
        // Paced, so that the ranged requests of split=4 overlap on the server.
        server.serve("/d.bin", file: d, faults: .always(.throttle(bytesPerSecond: 8_000_000)))
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let lines = [
            "# nightly list",
            "",
            server.url("/a.bin"),
            "  out=sub/x.bin",
            "",
            "   # a comment between the options",
            server.url("/b.bin"),
            "\tdir=elsewhere",
            server.url("/c.bin"),
            "  checksum=sha-256=\(sha256Hex(c.data))",
            "  header=X-Token: abc",
            "# the big one",
            server.url("/d.bin"),
            "  split=4",
            "  out=big.bin",
            server.url("/e.bin"),
        ]
        try Data((lines.joined(separator: "\r\n") + "\r\n").utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        let result = try await sandbox.run(
            ["get", "-i", "list.txt", "-d", "dl", "-H", "X-Token: cli", "-H", "X-Other: o"])
        #expect(result.status == 0, "\(result)")
        let expected = [
            sandbox.path("dl/sub/x.bin"), sandbox.path("elsewhere/b.bin"), sandbox.path("dl/c.bin"),
            sandbox.path("dl/big.bin"), sandbox.path("dl/e.bin"),
        ]
        #expect(result.stdoutLines.sorted() == expected.sorted(), "\(result)")
        #expect(result.stderr.contains("5 completed, 0 failed"), "\(result)")
        Self.expectFile(sandbox.path("dl/sub/x.bin"), a.data)
        Self.expectFile(sandbox.path("elsewhere/b.bin"), b.data)
        Self.expectFile(sandbox.path("dl/c.bin"), c.data)
        Self.expectFile(sandbox.path("dl/big.bin"), d.data)
        Self.expectFile(sandbox.path("dl/e.bin"), e.data)
        #expect(sandbox.entries() == ["dl", "elsewhere", "list.txt"])
        #expect(sandbox.entries("dl") == ["big.bin", "c.bin", "e.bin", "sub"])
        #expect(sandbox.entries("elsewhere") == ["b.bin"])
        #expect(sandbox.entries("dl/sub") == ["x.bin"])

        // header= replaces the -H of the same name on its own download only; other -H headers stay.
        for request in server.requests {
            #expect(request.headerValues("X-Other") == ["o"], "\(request.path): \(request.headers)")
            let token = request.path == "/c.bin" ? ["abc"] : ["cli"]
            #expect(request.headerValues("X-Token") == token, "\(request.path): \(request.headers)")
        }
        // split=4: the big file came in ranged requests that tile it.
        // (As the engine asked them: over URLSession the probe's request of the whole file goes out as a window.)
        let big = server.requests(for: "/d.bin").stitchRequests
        let ranges = big.compactMap { Self.closedRange($0.stitchAskedRange) }.sorted { $0.lowerBound < $1.lowerBound }
        #expect(ranges.count >= 4, "\(big.map { $0.range ?? "whole" })")
        var covered = 0
        for range in ranges where range.lowerBound <= covered { covered = max(covered, range.upperBound + 1) }
        #expect(covered == d.data.count, "the ranged requests do not tile the file: \(big.map { $0.range ?? "whole" })")
        let lanes = server.maxActiveRequests(for: "/d.bin")
        #expect(lanes >= 3 && lanes <= 4, "split=4: \(lanes) requests in flight at once")
        // Every other file came in one plain request.
        for path in ["/a.bin", "/b.bin", "/c.bin", "/e.bin"] {
            let requests = server.requests(for: path)
            #expect(
                requests.count == 1 && requests.first?.stitchAskedRange == nil, "\(path): \(requests.map { $0.range ?? "whole" })")
        }
    }

    /// `-i -` reads the list from stdin (a pipe), with `--json` events that name each URL and path.
    @Test func inputFileFromStdin() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let one = ServedFile.random(size: 12_345, seed: 211)
        let two = ServedFile.random(size: 234_567, seed: 212)
        server.serve("/one.bin", file: one)
        server.serve("/two.bin", file: two)
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let list = "# from stdin\n\(server.url("/one.bin"))\n  out=first.bin\n\(server.url("/two.bin"))\n"
        let result = try await Self.runWithStdin(sandbox, ["get", "-i", "-", "-d", "dl", "--json"], stdin: Data(list.utf8))
        #expect(result.status == 0, "\(result)")
        Self.expectFile(sandbox.path("dl/first.bin"), one.data)
        Self.expectFile(sandbox.path("dl/two.bin"), two.data)
        let events = try #require(jsonLines(result.stdout), "stdout is not JSON lines: \(result)")
        let done = events.filter { $0["event"] as? String == "done" }
        var pathByURL: [String: String] = [:]
        for event in done {
            if let url = event["url"] as? String, let path = event["path"] as? String { pathByURL[url] = path }
            #expect(event["id"] is String, "\(event)")
        }
        #expect(
            pathByURL == [
                server.url("/one.bin"): sandbox.path("dl/first.bin"), server.url("/two.bin"): sandbox.path("dl/two.bin"),
            ], "\(result)")
        let summary = try #require(events.last, "\(result)")
        #expect(summary["event"] as? String == "summary")
        #expect(summary["completed"] as? Int == 2 && summary["failed"] as? Int == 0, "\(summary)")
        #expect(server.requests.count == 2)
    }

    // MARK: 3. Failures do not stop the rest

    /// A list keeps its catalog in memory: it leaves nothing in the temporary folder, neither when it ends nor
    /// when it is killed with SIGKILL in the middle (the downloads' own partial data stays beside them, and a
    /// rerun finishes them).
    @Test func aListLeavesNothingBehind() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let held = ServedFile.random(size: 200_000, seed: 323, etag: "\"held\"")
        server.serve("/a.bin", file: ServedFile.random(size: 1000, seed: 321))
        server.serve("/held.bin", file: held, faults: .onRequest(0, .stallAfter(100_000)))
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let tmp = sandbox.path("tmp")
        try FileManager.default.createDirectory(atPath: tmp, withIntermediateDirectories: true)
        let arguments = ["get", server.url("/a.bin"), server.url("/held.bin"), "-d", "dl", "--timeout", "600"]
        let killed = try sandbox.start(arguments, environment: ["TMPDIR": tmp])
        #expect(try await offload { server.waitForStall(timeout: .seconds(30)) })
        // Killed once the download has its part file (how much of it a rerun can keep is CrashTests' matter).
        #expect(await waitUntil(timeout: .seconds(30)) { fileExists(sandbox.path("dl/held.bin.stitch")) })
        killed.kill()
        let result = await killed.wait()
        #expect(result.signal == SIGKILL, "\(result)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: tmp).isEmpty, "left in TMPDIR after SIGKILL")
        #expect(fileExists(sandbox.path("dl/held.bin.part")), "\(sandbox.entries("dl"))")

        server.releaseStalls()
        let rerun = try await sandbox.run(arguments, environment: ["TMPDIR": tmp])
        #expect(rerun.status == 0, "\(rerun)")
        Self.expectFile(sandbox.path("dl/held.bin"), held.data, "held.bin")
        #expect(try FileManager.default.contentsOfDirectory(atPath: tmp).isEmpty, "left in TMPDIR after a run")
    }

    /// Two entries with the same `out=` (one written `./same.bin`): the first is downloaded, the second fails on its
    /// own with a line naming the clash, and the rest of the list still runs; exit 1.
    @Test func sameOutTwiceFailsOnlyTheSecond() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let first = ServedFile.random(size: 30_000, seed: 311)
        let second = ServedFile.random(size: 30_000, seed: 312)
        let other = ServedFile.random(size: 30_000, seed: 313)
        server.serve("/first.bin", file: first)
        server.serve("/second.bin", file: second)
        server.serve("/other.bin", file: other)
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let list = [
            server.url("/first.bin"), "  out=same.bin",
            server.url("/second.bin"), "  out=./same.bin",
            server.url("/other.bin"),
        ].joined(separator: "\n") + "\n"
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        let result = try await sandbox.run(["get", "-i", "list.txt", "-d", "dl"])
        #expect(result.status == 1, "\(result)")
        Self.expectFile(sandbox.path("dl/same.bin"), first.data)
        Self.expectFile(sandbox.path("dl/other.bin"), other.data)
        #expect(server.requests(for: "/second.bin").isEmpty, "the clashing download is not fetched")
        #expect(result.stderr.contains("2 completed, 1 failed"), "\(result)")
        #expect(
            result.stderrLines.contains { $0.hasPrefix("  failed \(server.url("/second.bin")): ") && $0.contains("same.bin") },
            "\(result)")
    }

    /// A 404, a checksum mismatch and two invalid URLs among two good downloads: the good ones complete; exit 1;
    /// a `failed URL: reason` line per failure; the counts in the summary line and in the `--json` summary.
    @Test(arguments: [false, true])
    func failuresDoNotStopTheRest(json: Bool) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let good1 = ServedFile.random(size: 40_000, seed: 301)
        let good2 = ServedFile.random(size: 1_300_000, seed: 302, etag: "\"g2\"")
        let bad = ServedFile.random(size: 50_000, seed: 303)
        server.serve("/good1.bin", file: good1)
        server.serve("/good2.bin", file: good2)
        server.serve("/bad-sum.bin", file: bad)
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let missing = server.url("/missing.bin")
        let badSum = server.url("/bad-sum.bin")
        let invalid = ["ftp://x/y", "http://"]
        let list = [
            server.url("/good1.bin"),
            missing,
            badSum,
            "  checksum=sha-256=\(String(repeating: "ab", count: 32))",
            invalid[0],
            invalid[1],
            server.url("/good2.bin"),
        ].joined(separator: "\n") + "\n"
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        let result = try await sandbox.run(["get", "-i", "list.txt", "-d", "dl"] + (json ? ["--json"] : []))
        #expect(result.status == 1, "\(result)")
        Self.expectFile(sandbox.path("dl/good1.bin"), good1.data)
        Self.expectFile(sandbox.path("dl/good2.bin"), good2.data)
        #expect(!fileExists(sandbox.path("dl/bad-sum.bin")), "a file failing its checksum must not appear")
        #expect(!fileExists(sandbox.path("dl/missing.bin")))
        #expect(result.stderr.contains("2 completed, 4 failed"), "\(result)")
        let failures = [missing, badSum] + invalid
        // The summary: one `  failed URL: reason` line per failure, naming its URL.
        let summaryLines = result.stderrLines.filter { $0.hasPrefix("  failed ") }
        #expect(summaryLines.count == 4, "\(result)")
        for url in failures {
            #expect(summaryLines.count { $0.hasPrefix("  failed \(url): ") } == 1, "no failed line for \(url): \(result)")
        }
        #expect(summaryLines.contains { $0.hasPrefix("  failed \(missing): ") && $0.contains("404") }, "\(result)")
        Self.expectProgressLines(result, total: 6, failedAtLeast: json ? 0 : 2)
        #expect(
            summaryLines.contains { $0.hasPrefix("  failed \(badSum): ") && $0.lowercased().contains("checksum") },
            "\(result)")
        if json {
            let events = try #require(jsonLines(result.stdout), "stdout is not JSON lines: \(result)")
            let summary = try #require(events.last)
            #expect(summary["event"] as? String == "summary", "\(result)")
            #expect(summary["completed"] as? Int == 2, "\(summary)")
            #expect(summary["failed"] as? Int == 4, "\(summary)")
            #expect(summary["unfinished"] as? Int == 0, "\(summary)")
            #expect(events.count { $0["event"] as? String == "summary" } == 1)
            let errors = events.filter { $0["event"] as? String == "error" }
            #expect(errors.compactMap { $0["url"] as? String }.sorted() == failures.sorted(), "\(errors)")
            let done = events.filter { $0["event"] as? String == "done" }
            #expect(
                done.compactMap { $0["path"] as? String }.sorted()
                    == [sandbox.path("dl/good1.bin"), sandbox.path("dl/good2.bin")], "\(result)")
        } else {
            #expect(
                result.stdoutLines.sorted() == [sandbox.path("dl/good1.bin"), sandbox.path("dl/good2.bin")],
                "\(result)")
        }
    }

    /// Invalid URLs on the command line fail like any other download, without stopping the good one.
    @Test func invalidURLOnTheCommandLineFailsAlone() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3_000, seed: 311)
        server.serve("/ok.bin", file: file)
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(["get", "ftp://x/y", server.url("/ok.bin"), "-d", "dl"])
        #expect(result.status == 1, "\(result)")
        Self.expectFile(sandbox.path("dl/ok.bin"), file.data)
        #expect(result.stdoutLines == [sandbox.path("dl/ok.bin")], "\(result)")
        #expect(result.stderr.contains("1 completed, 1 failed"), "\(result)")
        #expect(result.stderrLines.contains { $0.hasPrefix("  failed ftp://x/y: ") }, "\(result)")
    }

    /// The exit status says what kind of failure there was, as for one download: 75 when every failure is a network
    /// failure or a temporary HTTP status (503) that outlasted `--retries`; 1 as soon as one failure is permanent
    /// (404); 74 as soon as one is a local I/O error (a `dir=` that cannot be created), whatever the others.
    @Test(arguments: [
        (["/dropped.bin"], 75), (["/unavailable.bin"], 75), (["/dropped.bin", "/unavailable.bin"], 75),
        (["/unavailable.bin", "/missing.bin"], 1), (["/missing.bin", "/unwritable.bin"], 74),
        (["/dropped.bin", "/unwritable.bin"], 74),
    ])
    func exitStatusByKindOfFailure(_ failing: [String], status: Int) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let good = ServedFile.random(size: 20_000, seed: 321)
        server.serve("/good.bin", file: good)
        server.serve("/dropped.bin", file: .random(size: 50_000, seed: 322), faults: .always(.dropAfter(1_000)))
        server.serve("/unavailable.bin", file: .random(size: 50_000, seed: 323), faults: .always(.status(503)))
        server.serve("/unwritable.bin", file: .random(size: 50_000, seed: 324))
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        try Data("not a folder".utf8).write(to: URL(fileURLWithPath: sandbox.path("file")))
        var list = server.url("/good.bin") + "\n"
        for path in failing {
            list += server.url(path) + "\n"
            if path == "/unwritable.bin" { list += "  dir=file/sub\n" }
        }
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        let result = try await sandbox.run(
            ["get", "-i", "list.txt", "-d", "dl", "--retries", "1"], environment: ["STITCH_RETRY_BASE_DELAY": "0.01"])
        #expect(Int(result.status) == status, "\(result)")
        Self.expectFile(sandbox.path("dl/good.bin"), good.data)
        #expect(result.stderr.contains("1 completed, \(failing.count) failed"), "\(result)")
        for path in failing {
            #expect(result.stderrLines.contains { $0.hasPrefix("  failed \(server.url(path)): ") }, "\(path): \(result)")
        }
    }

    // MARK: 4. The -j cap

    /// Eight throttled downloads: with `-j 3` at most three (and at some point three) responses are in flight at
    /// once on the server; without `-j`, at most five (and at some point five).
    @Test(arguments: [3, nil] as [Int?])
    func jobsCap(jobs: Int?) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.throttle = 400_000  // each 120 KB response stays in flight for about 0.3 s
        var files: [String: [UInt8]] = [:]
        for index in 0..<8 {
            let file = ServedFile.random(size: 120_000, seed: UInt64(400 + index))
            server.serve("/j\(index).bin", file: file)
            files["j\(index).bin"] = file.data
        }
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        var arguments = ["get"] + files.keys.sorted().map { server.url("/" + $0) } + ["-d", "dl", "-q"]
        if let jobs { arguments += ["-j", "\(jobs)"] }
        let result = try await sandbox.run(arguments)
        #expect(result.status == 0, "\(result)")
        for (name, bytes) in files { Self.expectFile(sandbox.path("dl/" + name), bytes, "\(name)") }
        #expect(result.stderr.isEmpty, "-q prints nothing on stderr when all went well: \(result)")
        let cap = jobs ?? 5
        #expect(server.maxActiveRequests <= cap, "\(server.maxActiveRequests) in flight with a cap of \(cap)")
        #expect(server.maxActivePaths <= cap)
        #expect(server.maxActiveRequests == cap, "the cap was never reached: \(server.maxActiveRequests)")
        #expect(server.requests.count == 8)
    }

    // MARK: 5. Keep-alive

    /// Twenty small files from one server with `-j 2` ride on a few reused connections. (Over URLSession each
    /// request has a session, and so a connection, of its own: nothing is kept from one download to the next.)
    @Test(.enabled(if: TransportBackend.default.keepsConnections, "the transport keeps no connection between downloads"))
    func keepAliveAcrossDownloads() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        var files: [String: [UInt8]] = [:]
        for index in 0..<20 {
            let file = ServedFile.random(size: 2_000 + 997 * index, seed: UInt64(500 + index))
            server.serve("/k\(index).bin", file: file)
            files["k\(index).bin"] = file.data
        }
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get"] + files.keys.sorted().map { server.url("/" + $0) } + ["-d", "dl", "-j", "2", "-q"])
        #expect(result.status == 0, "\(result)")
        for (name, bytes) in files { Self.expectFile(sandbox.path("dl/" + name), bytes, "\(name)") }
        let requests = server.requests
        #expect(requests.count == 20)
        let connections = Set(requests.map(\.connectionID))
        #expect(connections.count <= 4, "\(connections.count) connections for 20 requests")
        #expect(requests.count { $0.indexOnConnection >= 1 } >= 16, "\(requests.map(\.indexOnConnection))")
        #expect(server.connectionCount <= 4)
    }

    /// The same against nginx: its access log's connection serials show a few connections for twenty files.
    @Test(.enabled(if: TransportBackend.default.keepsConnections, "the transport keeps no connection between downloads"))
    func keepAliveAgainstNginx() async throws {
        let nginx = try await sharedNginx()
        let tag = "ka-\(UUID().uuidString)"
        var files: [String: [UInt8]] = [:]
        for index in 0..<20 {
            let name = "\(tag)-\(index).bin"
            let bytes = ServedFile.randomBytes(count: 3_000 + 1_001 * index, seed: UInt64(550 + index))
            try nginx.publish(name, bytes: bytes)
            files[name] = bytes
        }
        defer {
            for name in files.keys { BackgroundRemoval.remove(nginx.documentRoot + "/" + name) }
        }
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(
            ["get"] + files.keys.sorted().map { nginx.httpURL($0) } + ["-d", "dl", "-j", "2", "-q"])
        #expect(result.status == 0, "\(result)")
        for (name, bytes) in files { Self.expectFile(sandbox.path("dl/" + name), bytes, "\(name)") }
        var lines: [String] = []
        _ = await waitUntil {
            lines = nginx.accessLogLines(containing: tag)
            return lines.count >= 20
        }
        #expect(lines.count == 20, "\(lines)")
        let serials = lines.map { line in
            line.range(of: "conn=").map { String(line[$0.upperBound...].prefix { $0.isNumber }) } ?? ""
        }
        #expect(!serials.contains(""), "no conn= in \(lines)")
        #expect(Set(serials).count <= 4, "\(Set(serials).count) connections: \(lines)")
    }

    // MARK: 6. A rerun resumes only what is unfinished

    /// Five downloads with `out=` names; the 3 MiB one stalls after 1.5 MB. Once the other four are done, SIGINT
    /// (or SIGTERM): exit 130 (143), four files complete, the big one kept as `.part` + `.stitch`. The same command again: exit 0,
    /// no request at all for the four ("already complete"), and the big one continues with one Range request from
    /// where it stopped, fetching only the rest.
    @Test(arguments: [SIGINT, SIGTERM])
    func rerunAfterSignalResumesOnlyWhatIsUnfinished(_ signal: Int32) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let stallAt = 1_500_000
        let bigSize = 3 << 20
        let big = ServedFile.random(size: bigSize, seed: 601, etag: "\"big\"")
        server.serve("/big.bin", file: big, faults: .onRequest(0, .stallAfter(stallAt)))
        let small = [("s1.bin", 1_000), ("s2.bin", 64_000), ("s3.bin", 700_000), ("s4.bin", 1_200_000)]
        var smallFiles: [String: [UInt8]] = [:]
        for (index, (name, size)) in small.enumerated() {
            let file = ServedFile.random(size: size, seed: UInt64(610 + index), etag: "\"\(name)\"")
            server.serve("/" + name, file: file)
            smallFiles[name] = file.data
        }
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        var list = ""
        for (name, _) in small { list += "\(server.url("/" + name))\n  out=\(name)\n" }
        list += "\(server.url("/big.bin"))\n  out=big.bin\n  split=1\n"
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        // The big download waits at its stall for as long as the test takes (longer than the default 30 s stall
        // timeout on a loaded machine under a sanitizer): it must not give up and ask again, unstalled.
        let arguments = ["get", "-i", "list.txt", "-d", "dl", "--timeout", "600"]

        let first = try sandbox.start(arguments)
        let stalled = try await offload { server.waitForStall(timeout: .seconds(30)) }
        try #require(stalled, "the big download never reached its stall: \(first.stderrSoFar)")
        let othersDone = await waitUntil(timeout: .seconds(30)) {
            first.stdoutSoFar.split(separator: "\n").count >= 4 || !first.isRunning
        }
        try #require(othersDone && first.isRunning, "the four small downloads did not finish: \(first.stderrSoFar)")
        // Every byte sent before the stall has reached the part file: the saved state may vouch for all of it.
        let written = await waitUntil(timeout: .seconds(30)) { fileSize(sandbox.path("dl/big.bin.part")) >= stallAt }
        try #require(written, "the part file holds \(fileSize(sandbox.path("dl/big.bin.part"))) bytes")
        first.send(signal)
        let interrupted = await first.wait()
        #expect(interrupted.status == (signal == SIGINT ? 130 : 143), "\(interrupted)")
        #expect(interrupted.signal == nil, "exited by itself after saving: \(interrupted)")
        #expect(interrupted.stderr.contains("interrupted"), "\(interrupted)")
        #expect(
            interrupted.stdoutLines.sorted() == small.map { sandbox.path("dl/" + $0.0) }.sorted(), "\(interrupted)")
        for (name, bytes) in smallFiles { Self.expectFile(sandbox.path("dl/" + name), bytes, "\(name)") }
        #expect(!fileExists(sandbox.path("dl/big.bin")))
        #expect(fileExists(sandbox.path("dl/big.bin.part")), "\(sandbox.entries("dl"))")
        #expect(fileExists(sandbox.path("dl/big.bin.stitch")), "\(sandbox.entries("dl"))")
        #expect(await server.settled())

        let requestsBefore = Dictionary(uniqueKeysWithValues: small.map { ($0.0, server.requests(for: "/" + $0.0).count) })
        let bigRequestsBefore = server.requests(for: "/big.bin").count
        let bigSentBefore = server.bodyBytesSent(for: "/big.bin")
        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        #expect(rerun.stderr.contains("5 completed, 0 failed"), "\(rerun)")
        for (name, _) in small {
            #expect(server.requests(for: "/" + name).count == requestsBefore[name], "\(name) was fetched again")
            #expect(
                rerun.stderrLines.contains { $0.contains(sandbox.path("dl/" + name)) && $0.contains("already complete") },
                "\(name) not reported already complete: \(rerun)")
        }
        #expect(rerun.stdoutLines.sorted() == (small.map(\.0) + ["big.bin"]).map { sandbox.path("dl/" + $0) }.sorted())
        Self.expectFile(sandbox.path("dl/big.bin"), big.data)
        let resumed = Array(server.requests(for: "/big.bin").dropFirst(bigRequestsBefore))
        #expect(resumed.count == 1, "\(resumed.map { $0.range ?? "whole" })")
        let request = try #require(resumed.first)
        let start = try #require(rangeStart(request.range), "\(request.range ?? "no Range")")
        #expect(start == stallAt, "resumed at \(start); the signal came after \(stallAt) bytes were written")
        #expect(request.header("If-Range") == "\"big\"", "\(request.headers)")
        #expect(server.bodyBytesSent(for: "/big.bin") - bigSentBefore == bigSize - start)
        #expect(sandbox.entries("dl") == (small.map(\.0) + ["big.bin"]).sorted(), "leftovers: \(sandbox.entries("dl"))")
    }

    // MARK: 7. Name collisions

    /// `/a/file.bin` and `/b/file.bin` into one folder: `file.bin` and `file.1.bin`, each its own URL's bytes; a
    /// rerun keeps the mapping (both already complete, no `file.2.bin`).
    @Test func sameNameFromTwoURLs() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let a = ServedFile.random(size: 80_000, seed: 701, etag: "\"a\"")
        let b = ServedFile.random(size: 80_000, seed: 702, etag: "\"b\"")
        server.serve("/a/file.bin", file: a)
        server.serve("/b/file.bin", file: b)
        let urlA = server.url("/a/file.bin")
        let urlB = server.url("/b/file.bin")
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }

        var mappings: [[String: String]] = []
        for run in 0..<2 {
            let result = try await sandbox.run(["get", urlA, urlB, "-d", "dl", "--json"])
            #expect(result.status == 0, "run \(run): \(result)")
            let events = try #require(jsonLines(result.stdout), "\(result)")
            var mapping: [String: String] = [:]
            for event in events where event["event"] as? String == "done" {
                if let url = event["url"] as? String, let path = event["path"] as? String { mapping[url] = path }
            }
            #expect(Set(mapping.values) == [sandbox.path("dl/file.bin"), sandbox.path("dl/file.1.bin")], "\(result)")
            Self.expectFile(mapping[urlA] ?? "", a.data, "run \(run): \(mapping)")
            Self.expectFile(mapping[urlB] ?? "", b.data, "run \(run): \(mapping)")
            #expect(sandbox.entries("dl") == ["file.1.bin", "file.bin"], "run \(run)")
            if run == 1 {
                let notices = events.filter { $0["event"] as? String == "notice" && $0["message"] as? String == "already complete" }
                #expect(Set(notices.compactMap { $0["url"] as? String }) == [urlA, urlB], "\(result)")
            }
            mappings.append(mapping)
        }
        #expect(mappings[0] == mappings[1])
    }

    /// A line with a bad value fails its download alone, the rest of the list runs; `split` above 16 is capped
    /// with a warning (issue 14: `split=32` on one line stopped the whole list before anything started).
    @Test func aBadLineFailsAlone() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let files = (0..<3).map { ServedFile.random(size: 200_000 + $0, seed: 90 + UInt64($0), etag: "\"b\($0)\"") }
        for (index, file) in files.enumerated() { server.serve("/f\(index)", file: file) }
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        let list = """
            \(server.url("/f0"))
              out=a.bin
            \(server.url("/f1"))
              out=b.bin
              checksum=sha-256=nothex
            \(server.url("/f2"))
              out=c.bin
              split=32

            """
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        for json in [false, true] {
            let result = try await sandbox.run(
                ["get", "-i", "list.txt", "-d", "out\(json)"] + (json ? ["--json"] : []))
            #expect(result.status == 1, "\(result)")
            #expect(readBytes(sandbox.path("out\(json)/a.bin")) == files[0].data)
            #expect(readBytes(sandbox.path("out\(json)/c.bin")) == files[2].data)
            #expect(sandbox.entries("out\(json)") == ["a.bin", "c.bin"])
            if json {
                let events = try #require(jsonLines(result.stdout), "\(result)")
                let errors = events.filter { $0["event"] as? String == "error" }
                #expect(errors.count == 1, "\(events)")
                #expect((errors.first?["message"] as? String)?.contains("line 5: 'checksum'") == true, "\(errors)")
                let summary = try #require(events.last { $0["event"] as? String == "summary" })
                #expect(summary["completed"] as? Int == 2 && summary["failed"] as? Int == 1, "\(summary)")
            } else {
                #expect(result.stderr.contains("list.txt: line 5: 'checksum'"), "\(result)")
                #expect(result.stderr.contains("line 8: 'split' \"32\" is above 16; using 16"), "\(result)")
                #expect(result.stderr.contains("2 completed, 1 failed"), "\(result)")
            }
        }
        #expect(server.requests(for: "/f1").isEmpty, "the bad line's download is never started")
    }

    // MARK: 8. Usage errors

    @Test(arguments: [
        (["-o", "x.bin", "URL", "URL2"], "-o"),
        (["-i", "list.txt", "--checksum", "sha-256=\(String(repeating: "0", count: 64))"], "--checksum"),
        (["URL", "URL2", "-j", "0"], "jobs"),
        (["URL", "URL2", "-j", "257"], "jobs"),
        (["URL", "-j", "2"], "-j"),
        (["-i", "missing.txt"], "missing.txt"),
        (["-i", "bad.txt"], "bad.txt: line 1"),
        (["-i", "list.txt", "-o", "x.bin"], "-o"),
    ])
    func usageErrors(_ arguments: [String], mentioning: String) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/f", file: .random(size: 1000, seed: 1))
        server.serve("/g", file: .random(size: 1000, seed: 2))
        let sandbox = try Sandbox("batch")
        defer { sandbox.cleanup() }
        try Data("\(server.url("/f"))\n\(server.url("/g"))\n".utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        // An option line before any URI: no download can be blamed, the whole list is refused.
        let bad = "  out=f.bin\n\(server.url("/f"))\n  checksum=sha-256=nothex\n\(server.url("/g"))\n"
        try Data(bad.utf8).write(to: URL(fileURLWithPath: sandbox.path("bad.txt")))
        let substituted = arguments.map { $0 == "URL" ? server.url("/f") : $0 == "URL2" ? server.url("/g") : $0 }
        let result = try await sandbox.run(["get"] + substituted)
        #expect(result.status == 64, "\(result)")
        #expect(result.stdout.isEmpty, "\(result)")
        #expect(errorLines(result).count == 1, "exactly one error line: \(result)")
        #expect(result.stderrLines.first?.hasPrefix("stitch: ") == true, "\(result)")
        #expect(result.stderrLines.count <= 2, "an error line plus at most a usage hint: \(result)")
        #expect(errorLines(result).first?.contains(mentioning) == true, "should name \(mentioning): \(result)")
        #expect(server.requests.isEmpty, "a usage error must not reach the network")
        #expect(sandbox.entries() == ["bad.txt", "list.txt"])
    }

    // MARK: - Helpers

    /// Expects stderr's progress lines (`[3/6 done, 2 running, …]`) to count `total` downloads, with at least
    /// `failedAtLeast` failed ones from the first, and none after the summary line (`N completed, N failed`).
    static func expectProgressLines(
        _ result: CommandResult, total: Int, failedAtLeast: Int = 0, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let lines = result.stderrLines
        let summary = lines.lastIndex { $0.contains(" completed, ") && $0.contains(" failed") }
        #expect(summary != nil, "no summary line: \(result)", sourceLocation: sourceLocation)
        for (index, line) in lines.enumerated() where line.hasPrefix("[") {
            #expect(line.contains("/\(total) done"), "counts the wrong total: \(line)", sourceLocation: sourceLocation)
            if failedAtLeast > 0 {
                let failed = line.range(of: " failed]").map { range in
                    Int(line[..<range.lowerBound].split(separator: " ").last ?? "") ?? 0
                } ?? 0
                #expect(failed >= failedAtLeast, "misses failures: \(line)", sourceLocation: sourceLocation)
            }
            if let summary {
                #expect(index < summary, "a progress line after the summary: \(result)", sourceLocation: sourceLocation)
            }
        }
    }

    /// `A...B` from a `bytes=A-B` Range header.
    static func closedRange(_ header: String?) -> ClosedRange<Int>? {
        guard let header, header.hasPrefix("bytes=") else { return nil }
        let parts = header.dropFirst(6).split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2, let first = Int(parts[0]), let last = Int(parts[1]), first <= last else { return nil }
        return first...last
    }

    /// Expects the file at `path` to hold exactly `expected` (without printing megabytes when it does not).
    static func expectFile(
        _ path: String, _ expected: [UInt8]?, _ note: String = "", sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let actual = readBytes(path)
        let same = actual != nil && actual == expected
        #expect(
            same, "\(path): \(actual.map { "\($0.count) bytes" } ?? "missing"), expected \(expected?.count ?? -1) bytes \(note)",
            sourceLocation: sourceLocation)
    }

    /// Runs `stitch arguments…` in the sandbox with `stdin` (at most 64 KiB) on a pipe; kills it after `timeout`.
    static func runWithStdin(
        _ sandbox: Sandbox, _ arguments: [String], stdin: Data, timeout: Duration = .seconds(60)
    ) async throws -> CommandResult {
        let capture = try Sandbox("batch-io")
        defer { capture.cleanup() }
        let outPath = capture.path("stdout")
        let errPath = capture.path("stderr")
        let directory = sandbox.directory
        var environment = ProcessInfo.processInfo.environment
        for key in StitchProcess.strippedEnvironment { environment[key] = nil }
        let env = environment
        let (status, signalled, timedOut) = try await offload { () throws -> (Int32, Bool, Bool) in
            // The list is written into the pipe and the pipe closed, as from `cat`.
            let process = try ChildProcess(
                executable: StitchBinary.path, arguments: arguments, environment: env, directory: directory,
                input: [UInt8](stdin), standardOutput: .file(outPath), standardError: .file(errPath))
            let expired = Atomic<Bool>(false)
            let watchdog = DispatchWorkItem {
                expired.store(true, ordering: .relaxed)
                process.send(SIGKILL)
            }
            DispatchQueue.global().asyncAfter(deadline: .now() + Double(timeout.components.seconds), execute: watchdog)
            let termination = process.waitUntilExit()
            watchdog.cancel()
            return (termination.signal ?? termination.status, termination.signal != nil, expired.load(ordering: .relaxed))
        }
        #expect(!timedOut, "stitch \(arguments) timed out")
        return CommandResult(
            status: signalled ? 128 + status : status, signal: signalled ? status : nil,
            stdout: (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "",
            stderr: (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "", timedOut: timedOut)
    }
}
