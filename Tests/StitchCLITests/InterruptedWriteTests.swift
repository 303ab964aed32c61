import Foundation
import Glibc
import Stitch
import StitchTestSupport
import Testing

/// Writes that fail with `EINTR` or come up short, injected into the `stitch` binary by an `LD_PRELOAD` shim
/// (Tests/Shims/eintr_shim.c, compiled here with the system C compiler): every Nth `write`/`pwrite` to a regular file
/// fails with `EINTR` without writing, every Mth writes half of what it was asked. The part file, the state file, the
/// live record and the batch catalog (SQLite) are all written through such calls, so every download must still end
/// byte-exact, and the shim's report must show that both faults fired. Two patterns: every 3rd and every 5th call,
/// and every 2nd and every 3rd (which lands on the live record's first write, the second call of a fresh download).
/// Faults fire on call counts and interruptions on stalls, never after a sleep.
@Suite(
    "stitch under interrupted and short writes",
    .enabled(if: EINTRShim.compiler != nil, "no C compiler (cc, gcc or clang) on PATH to build the LD_PRELOAD shim"))
struct InterruptedWriteTests {
    /// Which calls the shim makes fail (`STITCH_SHIM_EINTR_EVERY`) and cut short (`STITCH_SHIM_SHORT_EVERY`).
    struct Pattern: Sendable, CustomTestStringConvertible {
        var eintrEvery: Int
        var shortEvery: Int

        var testDescription: String { "EINTR every \(eintrEvery), short every \(shortEvery)" }

        static let all = [Pattern(eintrEvery: 3, shortEvery: 5), Pattern(eintrEvery: 2, shortEvery: 3)]
    }

    // MARK: One connection

    /// A 3 MiB file over one connection (`-c 1`): exit 0, byte-exact, no part, state or live record left.
    @Test(arguments: Pattern.all)
    func singleConnection(_ pattern: Pattern) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: (3 << 20) + 4097, seed: 0xE1_0001, etag: "\"one\"")
        server.serve("/one.bin", file: file)
        let sandbox = try Sandbox("eintr")
        defer { sandbox.cleanup() }
        let shim = try await EINTRShim.build(in: sandbox, pattern)

        let result = try await sandbox.run(
            ["get", server.url("/one.bin"), "-o", "one.bin", "-c", "1"], environment: shim.environment("one"))
        #expect(result.status == 0, "\(result)")
        Self.expectFile(sandbox.path("one.bin"), file.data)
        #expect(sandbox.entries() == ["one.bin", EINTRShim.folder], "leftovers: \(sandbox.entries())")
        shim.expectFaultsFired("one")
    }

    // MARK: Several connections

    /// An 8 MiB file over four connections (`-c 4`, paced so that the first response is split): the lanes `pwrite`
    /// at their offsets from four threads under the same faults; exit 0, byte-exact, more than one ranged request.
    @Test(arguments: Pattern.all)
    func segmented(_ pattern: Pattern) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.throttle = 8_000_000  // per response
        let file = ServedFile.random(size: (8 << 20) + 123, seed: 0xE1_0002, etag: "\"seg\"")
        server.serve("/seg.bin", file: file)
        let sandbox = try Sandbox("eintr")
        defer { sandbox.cleanup() }
        let shim = try await EINTRShim.build(in: sandbox, pattern)

        let result = try await sandbox.run(
            ["get", server.url("/seg.bin"), "-o", "seg.bin", "-c", "4"], environment: shim.environment("seg"))
        #expect(result.status == 0, "\(result)")
        Self.expectFile(sandbox.path("seg.bin"), file.data)
        let ranged = server.requests(for: "/seg.bin").filter { $0.range != nil }
        #expect(ranged.count >= 2, "not split: \(server.requests(for: "/seg.bin").map { $0.range ?? "whole" })")
        #expect(sandbox.entries() == ["seg.bin", EINTRShim.folder], "leftovers: \(sandbox.entries())")
        shim.expectFaultsFired("seg")
    }

    // MARK: A batch

    /// `stitch get URL URL URL` (the download manager, with its SQLite catalog): three files, each byte-exact in
    /// `-d dl`, "3 completed, 0 failed", exit 0.
    @Test(arguments: Pattern.all)
    func batch(_ pattern: Pattern) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let sizes = [70_001, (3 << 19) + 5, (2 << 20) + 333]
        var files: [String: [UInt8]] = [:]
        for (index, size) in sizes.enumerated() {
            let name = "b\(index).bin"
            let file = ServedFile.random(size: size, seed: 0xE1_0010 + UInt64(index), etag: "\"b\(index)\"")
            server.serve("/" + name, file: file)
            files[name] = file.data
        }
        let sandbox = try Sandbox("eintr")
        defer { sandbox.cleanup() }
        let shim = try await EINTRShim.build(in: sandbox, pattern)
        let names = files.keys.sorted()

        let result = try await sandbox.run(
            ["get"] + names.map { server.url("/" + $0) } + ["-d", "dl"], environment: shim.environment("batch"))
        #expect(result.status == 0, "\(result)")
        #expect(result.stderr.contains("3 completed, 0 failed"), "\(result)")
        #expect(result.stdoutLines.sorted() == names.map { sandbox.path("dl/" + $0) }, "\(result)")
        for name in names { Self.expectFile(sandbox.path("dl/" + name), files[name] ?? []) }
        #expect(sandbox.entries("dl") == names, "leftovers: \(sandbox.entries("dl"))")
        shim.expectFaultsFired("batch")
    }

    // MARK: Interrupted, then resumed

    /// A 3 MiB download whose first response stalls after 1.5 MB; once the part file holds those bytes, SIGINT: the
    /// run saves its state (state file and live record written under the faults) and exits 130. The same command
    /// again (a reopen: a new live record, a new state file) resumes at exactly 1.5 MB and ends byte-exact. Both
    /// runs' reports show both faults.
    @Test(arguments: Pattern.all)
    func interruptedThenResumed(_ pattern: Pattern) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let stallAt = 1_500_000
        let file = ServedFile.random(size: 3 << 20, seed: 0xE1_0020, etag: "\"re\"")
        server.serve("/re.bin", file: file, faults: .onRequest(0, .stallAfter(stallAt, then: .close)))
        let sandbox = try Sandbox("eintr")
        defer { sandbox.cleanup() }
        let shim = try await EINTRShim.build(in: sandbox, pattern)
        let arguments = ["get", server.url("/re.bin"), "-o", "re.bin", "-c", "1"]

        let first = try sandbox.start(arguments, environment: shim.environment("first"))
        let stalled = try await offload { server.waitForStall(timeout: .seconds(30)) }
        try #require(stalled, "the download never reached its stall: \(first.stderrSoFar)")
        _ = await waitUntil(timeout: .seconds(30)) {
            fileSize(sandbox.path("re.bin.part")) >= stallAt || !first.isRunning
        }
        try #require(
            first.isRunning && fileSize(sandbox.path("re.bin.part")) >= stallAt,
            "the part file holds \(fileSize(sandbox.path("re.bin.part"))) bytes: \(first.stderrSoFar)")
        first.send(SIGINT)
        let interrupted = await first.wait()
        #expect(interrupted.status == 130, "\(interrupted)")
        #expect(interrupted.signal == nil, "exited by itself after saving: \(interrupted)")
        #expect(!fileExists(sandbox.path("re.bin")))
        #expect(fileExists(sandbox.path("re.bin.stitch")), "\(sandbox.entries())")
        #expect(fileExists(sandbox.path("re.bin.stitch-live")), "\(sandbox.entries())")
        #expect(await server.settled())
        shim.expectFaultsFired("first")

        let requestsBefore = server.requests(for: "/re.bin").count
        let rerun = try await sandbox.run(arguments, environment: shim.environment("rerun"))
        #expect(rerun.status == 0, "\(rerun)")
        let resumed = Array(server.requests(for: "/re.bin").dropFirst(requestsBefore))
        #expect(resumed.count == 1, "\(resumed.map { $0.range ?? "whole" })")
        #expect(rangeStart(resumed.first?.range) == stallAt, "a graceful stop saves everything written")
        Self.expectFile(sandbox.path("re.bin"), file.data)
        #expect(sandbox.entries() == ["re.bin", EINTRShim.folder], "leftovers: \(sandbox.entries())")
        shim.expectFaultsFired("rerun")
    }

    /// Expects the file at `path` to hold exactly `expected`; says where it first differs if it does not.
    static func expectFile(_ path: String, _ expected: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
        guard let actual = readBytes(path) else {
            Issue.record("\(path) is missing", sourceLocation: sourceLocation)
            return
        }
        guard actual != expected else { return }
        let common = min(actual.count, expected.count)
        let differs = (0..<common).first { actual[$0] != expected[$0] } ?? common
        Issue.record(
            "\(path): \(actual.count) bytes, expected \(expected.count); first difference at byte \(differs)",
            sourceLocation: sourceLocation)
    }
}

/// The `LD_PRELOAD` shim of Tests/Shims/eintr_shim.c, built into a sandbox's `shim` folder for one test, with the
/// environment that loads it into `stitch` and the reports it appends at exit (one per run, by name).
struct EINTRShim {
    /// The sandbox subfolder that holds the library, the compiler's output and the reports.
    static let folder = "shim"

    /// The C compiler: the first of `cc`, `gcc`, `clang` on `PATH` (nil, with a message printed, if none is).
    static let compiler: String? = {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for name in ["cc", "gcc", "clang"] {
            for directory in path.split(separator: ":") where access("\(directory)/\(name)", X_OK) == 0 {
                return "\(directory)/\(name)"
            }
        }
        print("InterruptedWriteTests: skipped, no C compiler (cc, gcc or clang) on PATH to build the LD_PRELOAD shim")
        return nil
    }()

    /// Tests/Shims/eintr_shim.c, found from this file's path.
    static let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Shims/eintr_shim.c").path

    let library: String
    let directory: String
    let pattern: InterruptedWriteTests.Pattern

    /// Compiles the shim into `sandbox`'s ``folder`` (off the concurrency pool).
    static func build(in sandbox: Sandbox, _ pattern: InterruptedWriteTests.Pattern) async throws -> EINTRShim {
        let compiler = try #require(Self.compiler)
        try #require(fileExists(source), "missing \(source)")
        let directory = sandbox.path(folder)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let library = directory + "/eintr_shim.so"
        let log = directory + "/cc.log"
        let termination = try await offload {
            try ChildProcess(
                executable: compiler, arguments: ["-shared", "-fPIC", "-O1", "-o", library, source, "-ldl"],
                environment: ProcessInfo.processInfo.environment, standardOutput: .file(log), standardError: .file(log)
            ).waitUntilExit()
        }
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        try #require(termination.status == 0 && termination.signal == nil, "\(compiler) failed: \(output)")
        return EINTRShim(library: library, directory: directory, pattern: pattern)
    }

    /// The environment for one `stitch` run whose report is named `run`.
    func environment(_ run: String) -> [String: String] {
        let preload = ProcessInfo.processInfo.environment["LD_PRELOAD"].map { $0.isEmpty ? "" : $0 + " " } ?? ""
        return [
            "LD_PRELOAD": preload + library,
            "STITCH_SHIM_EINTR_EVERY": "\(pattern.eintrEvery)",
            "STITCH_SHIM_SHORT_EVERY": "\(pattern.shortEvery)",
            "STITCH_SHIM_REPORT": directory + "/report-" + run,
        ]
    }

    /// The report of the run named `run`: one line per process, `eintr=E short=S calls=C pid=P`.
    func report(_ run: String) -> String {
        (try? String(contentsOfFile: directory + "/report-" + run, encoding: .utf8)) ?? ""
    }

    /// The counts in the report of the run named `run` (`eintr`, `short`, `calls`, `pid`), one dictionary per line.
    func reports(_ run: String) -> [[String: Int]] {
        report(run).split(separator: "\n").map { line in
            var counts: [String: Int] = [:]
            for field in line.split(separator: " ") {
                let pair = field.split(separator: "=", maxSplits: 1)
                if pair.count == 2, let value = Int(pair[1]) { counts[String(pair[0])] = value }
            }
            return counts
        }
    }

    /// Expects one report from the run named `run` (one process) showing both faults fired; prints it.
    func expectFaultsFired(_ run: String, sourceLocation: SourceLocation = #_sourceLocation) {
        let reports = reports(run)
        print("InterruptedWriteTests (\(pattern.testDescription)) \(run): \(report(run).split(separator: "\n"))")
        #expect(reports.count == 1, "report of \(run): \(reports)", sourceLocation: sourceLocation)
        guard let report = reports.first else { return }
        #expect((report["eintr"] ?? 0) > 0, "no EINTR injected in \(run): \(report)", sourceLocation: sourceLocation)
        #expect((report["short"] ?? 0) > 0, "no short write in \(run): \(report)", sourceLocation: sourceLocation)
    }
}
