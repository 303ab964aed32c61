import Foundation
import Glibc
import Stitch
import StitchTestSupport
import Testing
import StitchLocks

// Helpers for running the built `stitch` binary, in the spirit of swift-argument-parser's
// `AssertExecuteCommand`: run it with arguments, environment and working directory, capture stdout,
// stderr and the exit status, and never leave a child behind.

/// What the `stitch` under test can do that depends on its transport. It is built with the same package traits as
/// these tests, so its default backend is this process's ``TransportBackend/default``; every download it makes goes
/// over that backend (the tests never pass `--transport`, except to test `--transport`).
enum StitchUnderTest {
    /// Whether it has the libcurl transport (the `Libcurl` trait), which its libcurl-only options need: `--ca-cert`,
    /// `--insecure`/`-k`, `--netrc`/`--netrc-file`, `--streams`. Without it they are usage errors (exit 64).
    static let hasLibcurl = TransportBackend.available.contains(.libcurl)
    /// Whether its downloads go over URLSession, which has none of the options above, asks in windows (the logs read
    /// through `askedRange` and `engineRequests`), and keeps no connection from one download to the next.
    static let isURLSession = TransportBackend.default == .urlSession
    /// Why a test that needs the libcurl transport is not run here.
    static let libcurlOnly: Comment = "needs the libcurl transport (a build without the Libcurl trait has none)"
    /// The window its transport asks in (URLSession's), or nil.
    static let window = TransportBackend.default.requestWindow
}

extension RecordedRequest {
    /// The `Range` the engine of the `stitch` under test asked for, behind its transport's window
    /// (``RecordedRequest/askedRange(window:)``; not this process's `STITCH_TEST_TRANSPORT`).
    var stitchAskedRange: String? { askedRange(window: StitchUnderTest.window) }
}

extension Sequence where Element == RecordedRequest {
    /// The requests as the engine of the `stitch` under test made them, a request's windows folded into one.
    var stitchRequests: [RecordedRequest] { engineRequests(window: StitchUnderTest.window) }
}

/// Locates the `stitch` executable built alongside the test bundle.
enum StitchBinary {
    /// `STITCH_BINARY` if set, else the first regular executable file named `stitch` found by walking
    /// up from the test bundle (`CommandLine.arguments[0]`, `/proc/self/exe`, `Bundle.main`).
    static let path: String = locate()

    private static func locate() -> String {
        builtExecutable(named: "stitch", environmentVariable: "STITCH_BINARY")
            ?? "/nonexistent/stitch (set STITCH_BINARY)"
    }
}

/// What a finished `stitch` run produced.
struct CommandResult: Sendable, CustomStringConvertible {
    /// The exit status, or 128 + the signal number if a signal ended the process.
    var status: Int32
    /// The signal that ended the process, if any.
    var signal: Int32?
    var stdout: String
    var stderr: String
    /// True if the run outlasted its timeout and was killed.
    var timedOut: Bool
    /// Standard output as the bytes written (`stitch get -o -`).
    var stdoutBytes: [UInt8] = []

    var stdoutLines: [String] { stdout.split(separator: "\n", omittingEmptySubsequences: true).map(String.init) }
    var stderrLines: [String] { stderr.split(separator: "\n", omittingEmptySubsequences: true).map(String.init) }

    var description: String {
        "status \(status)\(signal.map { " (signal \($0))" } ?? "")\(timedOut ? " TIMED OUT" : "")\n"
            + "--- stdout ---\n\(stdout)--- stderr ---\n\(stderr)--------------"
    }
}

/// A running `stitch` process whose output is collected on background threads (so neither pipe can
/// fill up and block the child). Killed with SIGKILL if it is still running when released.
final class StitchProcess: Sendable {
    let arguments: [String]
    let pid: Int32
    private let process: ChildProcess
    private let box: Box

    /// Shared with the termination handler and the pipe readers.
    final class Box: Sendable {
        struct State {
            var exited = false
            var status: Int32 = 0
            var signalled = false
            /// Output read so far; the streams are complete once `stdoutDone`/`stderrDone`.
            var stdout = Data()
            var stderr = Data()
            var stdoutDone = false
            var stderrDone = false
            var timedOut = false
            var waiters: [CheckedContinuation<Void, Never>] = []
            var isComplete: Bool { exited && stdoutDone && stderrDone }
        }

        let state = Locked(State())

        func update(_ body: (inout State) -> Void) {
            let waiters: [CheckedContinuation<Void, Never>] = state.withLock { state in
                body(&state)
                guard state.isComplete else { return [] }
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    /// Environment variables removed from the child's environment so that loopback tests stay hermetic.
    static let strippedEnvironment = [
        "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY",
        "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR",
    ]

    /// Starts `stitch arguments…` in `directory`, with `environment` added to (a cleaned copy of) ours.
    /// `executable` runs instead of `stitch` (a wrapper such as the pty screen script, given stitch's path).
    init(
        _ arguments: [String], environment: [String: String] = [:], directory: String, executable: String? = nil
    ) throws {
        self.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        for key in Self.strippedEnvironment { env[key] = nil }
        env.merge(environment) { $1 }
        let box = Box()
        // posix_spawn, not Foundation.Process: see ChildProcess.
        let process = try ChildProcess(
            executable: executable ?? StitchBinary.path, arguments: arguments, environment: env, directory: directory,
            onOutput: { chunk, isStandardOutput in
                box.update { state in
                    if isStandardOutput { state.stdout.append(contentsOf: chunk) } else { state.stderr.append(contentsOf: chunk) }
                }
            },
            onExit: { termination in
                box.update { state in
                    state.exited = true
                    state.status = termination.signal ?? termination.status
                    state.signalled = termination.signal != nil
                }
            })
        self.process = process
        self.box = box
        self.pid = process.pid
        process.whenComplete {
            box.update { state in
                state.stdoutDone = true
                state.stderrDone = true
            }
        }
    }

    deinit {
        kill()
    }

    /// What the process has written to stdout so far.
    var stdoutSoFar: String { box.state.withLock { textIfUTF8($0.stdout) } }

    /// What the process has written to stderr so far.
    var stderrSoFar: String { box.state.withLock { textIfUTF8($0.stderr) } }

    /// True until the process has exited (and been reaped).
    var isRunning: Bool { box.state.withLock { !$0.exited } }

    /// Sends `signal` unless the process has already exited.
    func send(_ signal: Int32) {
        box.state.withLock { state in
            if !state.exited { _ = Glibc.kill(pid, signal) }
        }
    }

    /// SIGKILL, if still running.
    func kill() { send(SIGKILL) }

    /// Waits for the process to exit and its output to be read; kills it after `timeout`.
    func wait(timeout: Duration = .seconds(60)) async -> CommandResult {
        let box = self.box
        let pid = self.pid
        let watchdog = Task {
            try? await Task.sleep(for: timeout)
            guard !Task.isCancelled else { return }
            box.state.withLock { state in
                if !state.exited {
                    state.timedOut = true
                    _ = Glibc.kill(pid, SIGKILL)
                }
            }
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = box.state.withLock { state -> Bool in
                if state.isComplete { return true }
                state.waiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
        watchdog.cancel()
        return box.state.withLock { state in
            CommandResult(
                status: state.signalled ? 128 + state.status : state.status,
                signal: state.signalled ? state.status : nil,
                // Not String(decoding:) on `-o -`'s binary output: see textIfUTF8.
                stdout: textIfUTF8(state.stdout),
                stderr: textIfUTF8(state.stderr),
                timedOut: state.timedOut, stdoutBytes: Array(state.stdout))
        }
    }
}

/// A private temporary directory for one test, plus the `stitch` processes it started (all killed by
/// ``cleanup()``).
final class Sandbox: Sendable {
    let directory: String
    private let processes = Locked<[StitchProcess]>([])

    init(_ label: String = "cli") throws {
        var template = Array((NSTemporaryDirectory() + "/stitch-\(label)-XXXXXX").utf8CString)
        let made = template.withUnsafeMutableBufferPointer { buffer -> String? in
            mkdtemp(buffer.baseAddress!).map { String(cString: $0) }
        }
        guard let made else { throw SandboxError("mkdtemp failed: errno \(errno)") }
        directory = URL(fileURLWithPath: made).standardizedFileURL.path
    }

    /// Kills every process still running and removes the directory.
    func cleanup() {
        for process in processes.withLock({ $0 }) { process.kill() }
        BackgroundRemoval.remove(directory)  // off the concurrency pool, which the tests share
    }

    /// The absolute path of `name` inside the sandbox.
    func path(_ name: String) -> String { directory + "/" + name }

    /// Starts `stitch arguments…` in the sandbox (or in `directory`).
    func start(
        _ arguments: [String], environment: [String: String] = [:], directory: String? = nil,
        executable: String? = nil
    ) throws -> StitchProcess {
        let process = try StitchProcess(
            arguments, environment: environment, directory: directory ?? self.directory, executable: executable)
        processes.withLock { $0.append(process) }
        return process
    }

    /// Runs `stitch arguments…` to completion.
    func run(
        _ arguments: [String], environment: [String: String] = [:], directory: String? = nil,
        timeout: Duration = .seconds(60), executable: String? = nil
    ) async throws -> CommandResult {
        let process = try start(arguments, environment: environment, directory: directory, executable: executable)
        let result = await process.wait(timeout: timeout)
        #expect(!result.timedOut, "stitch \(arguments) timed out")
        return result
    }

    /// Names of the entries in the sandbox directory (or a subdirectory), sorted.
    func entries(_ subdirectory: String? = nil) -> [String] {
        let path = subdirectory.map { self.path($0) } ?? directory
        return ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted()
    }
}

struct SandboxError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

// MARK: - Small helpers

/// Polls `value` (a byte counter) about every half millisecond until it reaches `threshold`, then runs
/// `onReach` right away (e.g. to kill the process at that byte count). Returns the value seen, or nil if
/// `process` exited first or `timeout` passed. Decides *when* by bytes, never by elapsed time.
///
/// The loop runs on its own thread, so a busy Swift concurrency pool cannot make it late.
func waitForBytes(
    _ threshold: Int, while process: StitchProcess, timeout: Duration = .seconds(30),
    onReach: @escaping @Sendable (Int) -> Void = { _ in }, _ value: @escaping @Sendable () -> Int
) async -> Int? {
    (try? await offload { () -> Int? in
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let current = value()
            if current >= threshold {
                onReach(current)
                return current
            }
            if !process.isRunning { return nil }
            usleep(500)
        }
        return nil
    }) ?? nil
}

/// Runs blocking work (starting nginx, waiting for a server to settle) on a thread of its own, so that
/// it never occupies one of the few threads of the Swift concurrency pool that all tests share.
func offload<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            do { continuation.resume(returning: try body()) } catch { continuation.resume(throwing: error) }
        }
        thread.start()
    }
}

/// ``Nginx/shared()`` off the concurrency pool (the first call starts nginx and takes a second or two).
func sharedNginx() async throws -> Nginx {
    try await offload { try Nginx.shared() }
}

extension TestHTTPServer {
    /// ``waitUntilIdle(timeout:)`` off the concurrency pool.
    func settled() async -> Bool {
        (try? await offload { [self] in waitUntilIdle() }) ?? false
    }
}

/// Polls `condition` every few milliseconds until it holds or `timeout` passes.
func waitUntil(timeout: Duration = .seconds(10), _ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(5))
    }
    return condition()
}

func fileExists(_ path: String) -> Bool { access(path, F_OK) == 0 }

/// The size of the file at `path`, or -1 if there is none.
func fileSize(_ path: String) -> Int {
    var info = stat()
    return stat(path, &info) == 0 ? Int(info.st_size) : -1
}

func readBytes(_ path: String) -> [UInt8]? {
    FileManager.default.contents(atPath: path).map { [UInt8]($0) }
}

func sha256Hex(_ bytes: [UInt8]) -> String {
    ExpectedChecksum.hexString(DigestHasher.digest(.sha256, of: bytes))
}

/// The start of a `Range: bytes=N-` header value (0 when there is no Range header).
func rangeStart(_ header: String?) -> Int? {
    guard let header else { return 0 }
    guard header.hasPrefix("bytes="), let dash = header.firstIndex(of: "-") else { return nil }
    return Int(header[header.index(header.startIndex, offsetBy: 6)..<dash])
}

/// Parses every stdout line as a JSON object.
func jsonLines(_ text: String) -> [[String: Any]]? {
    var objects: [[String: Any]] = []
    for line in text.split(separator: "\n") {
        guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
            return nil
        }
        objects.append(object)
    }
    return objects
}

/// The lines of `stderr` that are stitch's own one-line messages (`stitch: …`).
func errorLines(_ result: CommandResult) -> [String] {
    result.stderrLines.filter { $0.hasPrefix("stitch: ") }
}

/// The seed for randomised tests: `STITCH_TEST_SEED` if set (decimal or 0x-hex), else `fallback`.
func testSeed(_ fallback: UInt64) -> UInt64 {
    guard let text = ProcessInfo.processInfo.environment["STITCH_TEST_SEED"] else { return fallback }
    if text.hasPrefix("0x") { return UInt64(text.dropFirst(2), radix: 16) ?? fallback }
    return UInt64(text) ?? fallback
}
