import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

/// The manager killed with SIGKILL at seeded random moments — each when the server has sent a chosen number of
/// bytes more — and started again on the same directory, then left to finish: every download that was not added
/// paused is complete and byte-exact, the paused ones are still paused and were never fetched, and no download is
/// there twice. The manager runs in `stitch-manager-harness` (Tests/Harness/ManagerHarness), built with the tests.
@Suite struct ManagerCrashTests {
    struct Spec: Sendable {
        var name: String
        var size: Int
        var connections: Int?
        var paused: Bool
    }

    static let specs: [Spec] = [
        Spec(name: "big1.bin", size: 8 << 20, connections: 4, paused: false),
        Spec(name: "big2.bin", size: 10 << 20, connections: 4, paused: false),
        Spec(name: "one.bin", size: 2 << 20, connections: 1, paused: false),
        Spec(name: "two.bin", size: 3 << 20, connections: 1, paused: false),
        Spec(name: "three.bin", size: 3 << 19, connections: nil, paused: false),
        Spec(name: "held1.bin", size: 3 << 20, connections: 4, paused: true),
        Spec(name: "held2.bin", size: 1 << 20, connections: nil, paused: true),
    ]

    @Test func killedAndRestartedManagerFinishesEverything() async throws {
        let seed = ProcessInfo.processInfo.environment["STITCH_CRASH_SEED"].flatMap { UInt64($0) } ?? 0xC0FF_EE42
        print("manager crash test seed: \(seed) (set STITCH_CRASH_SEED to repeat another)")
        var random = SplitMix64(seed: seed)
        let harness = try #require(HarnessBinary.path, "stitch-manager-harness was not found next to the tests")

        let server = try TestHTTPServer()
        defer { server.stop() }
        let directory = try TemporaryDirectory()
        let managerDirectory = directory.path + "/manager"
        let downloads = directory.path + "/downloads"
        var files: [String: ServedFile] = [:]
        var spec: [[String: Any]] = []
        for (index, item) in Self.specs.enumerated() {
            let file = ServedFile.random(size: item.size, seed: seed &+ UInt64(index), etag: "\"\(item.name)-\(seed)\"")
            files[item.name] = file
            server.serve("/" + item.name, file: file)
            var entry: [String: Any] = ["url": server.url("/" + item.name), "out": item.name, "paused": item.paused]
            if let connections = item.connections { entry["connections"] = connections }
            spec.append(entry)
        }
        // Slow enough per response that a kill lands mid-transfer, fast enough for the whole test to take seconds.
        server.throttle = 3_000_000
        let specPath = directory.path + "/spec.json"
        try JSONSerialization.data(withJSONObject: spec).write(to: URL(fileURLWithPath: specPath))
        let arguments = [
            "--directory", managerDirectory, "--downloads", downloads, "--spec", specPath, "--max-concurrent", "2",
        ]
        let total = Self.specs.filter { !$0.paused }.reduce(0) { $0 + $1.size }

        var kills = 0
        var outputs: [String] = []
        for round in 0..<8 {
            // Up to 2.5 MiB more, sometimes almost nothing (a kill while the first requests go out).
            let more = random.next() % 4 == 0 ? Int(random.next() % 4096) : Int(random.next() % (5 << 19))
            let target = server.bodyBytesSent + more
            let process = try HarnessProcess(harness, arguments)
            // Watched and killed on a thread of its own: the kill must not wait for a busy cooperative pool.
            let killedAt = await blocking { () -> Int? in
                let reached = waitUntil(timeout: 60) { server.bodyBytesSent >= target || !process.isRunning }
                guard reached, process.isRunning else { return nil }
                process.kill()
                return server.bodyBytesSent
            }
            let result = await process.finish()
            outputs.append(result.stdout)
            guard let killedAt else {
                print("round \(round): the harness finished before its kill: \(result)")
                #expect(result.status == 0 && result.signal == nil, "round \(round): \(result)")
                break
            }
            #expect(result.signal == SIGKILL, "round \(round): \(result)")
            kills += 1
            print("round \(round): killed at \(killedAt) of \(total) bytes (target \(target), +\(more))")
        }
        #expect(kills >= 5, "only \(kills) kills landed before the downloads finished")

        let last = try HarnessProcess(harness, arguments)
        let result = await last.finish(timeout: 120)
        #expect(result.status == 0 && result.signal == nil, "the final run: \(result)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix("restored 7 rebuilt no") == true, "\(lines.first ?? "")")
        #expect(!lines.contains { $0.hasPrefix("added") }, "a restarted harness added a download again")
        #expect(outputs.joined().split(separator: "\n").filter { $0.hasPrefix("added") }.count <= Self.specs.count)
        print("the final run:\n\(result.stdout)")

        // What a manager opened afterwards sees.
        var configuration = DownloadManager.Configuration(downloadDirectory: downloads)
        configuration.autoResume = false
        let manager = try DownloadManager(directory: managerDirectory, configuration: configuration)
        #expect(manager.restoreReport.rebuiltBecause == nil)
        let all = await manager.downloads()
        #expect(all.count == Self.specs.count, "\(all.map(\.destination))")
        #expect(Set(all.map(\.id)).count == all.count)
        let byPath = Dictionary(grouping: all) { snapshot -> String in
            if case .file(let path) = snapshot.destination { path } else { "?" }
        }
        for item in Self.specs {
            let path = downloads + "/" + item.name
            let found = byPath[path] ?? []
            #expect(found.count == 1, "\(item.name): \(found.count) downloads")
            guard let snapshot = found.first else { continue }
            if item.paused {
                #expect(snapshot.status == .paused, "\(item.name): \(snapshot.status)")
                #expect(server.requests(for: "/" + item.name).isEmpty, "\(item.name) was fetched while paused")
                #expect(!fileExists(path) && !fileExists(path + ".part"))
            } else {
                #expect(snapshot.status == .completed, "\(item.name): \(snapshot.status)")
                expectFile(path, files[item.name]!.data)
            }
        }
        let requests = server.requests
        print(
            "\(kills) kills; \(requests.count) requests, \(requests.filter { $0.askedRange != nil }.count) ranged; "
                + "\(server.bodyBytesSent) body bytes sent for \(total)")
        await manager.close()
    }
}

// MARK: - Running the harness

/// Locates `stitch-manager-harness` built alongside the test bundle, as the CLI tests find `stitch`.
enum HarnessBinary {
    static let name = "stitch-manager-harness"

    static let path: String? = builtExecutable(named: name, environmentVariable: "STITCH_MANAGER_HARNESS")
}

/// A running harness whose stdout and stderr are read on their own threads. Killed if still running when released.
final class HarnessProcess: Sendable {
    struct Result: Sendable, CustomStringConvertible {
        var status: Int32
        var signal: Int32?
        var stdout: String
        var stderr: String
        var description: String {
            "status \(status)\(signal.map { " (signal \($0))" } ?? "")\n--- stdout ---\n\(stdout)--- stderr ---\n\(stderr)"
        }
    }

    private let process: ChildProcess
    private let output = CapturedOutput()
    let pid: Int32

    init(_ path: String, _ arguments: [String]) throws {
        var environment = ProcessInfo.processInfo.environment
        for key in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"] {
            environment[key] = nil
        }
        let output = self.output
        // posix_spawn, not Foundation.Process: see ChildProcess.
        self.process = try ChildProcess(
            executable: path, arguments: arguments, environment: environment,
            onOutput: { chunk, isStandardOutput in
                output.bytes.withLock { if isStandardOutput { $0.stdout += chunk } else { $0.stderr += chunk } }
            })
        self.pid = process.pid
    }

    deinit {
        process.send(SIGKILL)
    }

    var isRunning: Bool { process.isRunning }

    func kill() { process.send(SIGKILL) }

    /// Waits for the process to exit (killing it after `timeout` seconds) and for its output.
    func finish(timeout: Double = 60) async -> Result {
        let process = self.process
        let termination = await blocking { () -> ChildProcess.Termination in
            if !waitUntil(timeout: timeout, { !process.isRunning }) { process.send(SIGKILL) }
            return process.waitUntilExit()
        }
        let (stdout, stderr) = output.bytes.withLock { ($0.stdout, $0.stderr) }
        return Result(
            status: termination.status, signal: termination.signal,
            stdout: String(decoding: stdout, as: UTF8.self), stderr: String(decoding: stderr, as: UTF8.self))
    }
}

/// Output read from a child process, shared with its reader threads.
final class CapturedOutput: Sendable {
    let bytes = Locked<(stdout: [UInt8], stderr: [UInt8])>(([], []))
}
