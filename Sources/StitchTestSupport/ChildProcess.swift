import CStitchSystem
import Foundation
import Glibc
import StitchLocks

/// A child process started with `posix_spawn`, for tests that run `stitch`, curl, nginx's script or the manager
/// harness.
///
/// Not `Foundation.Process`: on Linux its `run()` copies each `/proc/self/fd` entry's whole 256-byte `d_name` and
/// crashes now and then once a process has about a thousand descriptors open (swift-corelibs-foundation
/// #5472; this test suite peaks above 1,600). Here the child gets descriptors 0, 1 and 2 and nothing else
/// (`closefrom`), default signal handling and an empty signal mask.
public final class ChildProcess: Sendable {
    /// How the process ended: `signal` is set when a signal killed it (then `status` is 128 + signal).
    public struct Termination: Sendable, Hashable {
        public var status: Int32
        public var signal: Int32?
    }

    /// Where a standard stream goes.
    public enum Stream: Sendable {
        case null
        /// Read by the parent; delivered to `onOutput`.
        case pipe
        /// A file, created or truncated.
        case file(String)
    }

    public let pid: Int32
    private let state = Locked(State())

    private struct State {
        var termination: Termination?
        var openStreams = 0
        var waiters: [@Sendable () -> Void] = []
        var isComplete: Bool { termination != nil && openStreams == 0 }
    }

    /// Starts `executable` with `arguments` (not including argv[0]).
    /// - Parameters:
    ///   - input: bytes for its standard input (then end of file), or nil for `/dev/null`.
    ///   - onOutput: chunks read from piped streams (`isStandardOutput` tells which), on reader threads.
    ///   - onExit: called once, on the reaper thread, when the process has exited.
    public init(
        executable: String, arguments: [String], environment: [String: String], directory: String? = nil,
        input: [UInt8]? = nil, standardOutput: Stream = .pipe, standardError: Stream = .pipe,
        onOutput: @escaping @Sendable (_ chunk: [UInt8], _ isStandardOutput: Bool) -> Void = { _, _ in },
        onExit: @escaping @Sendable (Termination) -> Void = { _ in }
    ) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var everySignal = sigset_t()
        sigfillset(&everySignal)
        var noSignal = sigset_t()
        sigemptyset(&noSignal)
        posix_spawnattr_setsigdefault(&attributes, &everySignal)
        posix_spawnattr_setsigmask(&attributes, &noSignal)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))

        var parentEnds: [Int32] = []  // closed after the spawn
        var readers: [(fd: Int32, isStandardOutput: Bool)] = []
        var inputWriter: Int32?
        func fail(_ what: String) -> any Error {
            for fd in parentEnds { close(fd) }
            for (fd, _) in readers { close(fd) }
            if let inputWriter { close(inputWriter) }
            return ChildProcessError(message: "\(what): errno \(errno) (\(executable))")
        }
        if let input {
            guard let pipe = makePipe() else { throw fail("pipe") }
            posix_spawn_file_actions_adddup2(&actions, pipe.read, 0)
            parentEnds.append(pipe.read)
            inputWriter = pipe.write
            _ = input
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        for (stream, target) in [(standardOutput, Int32(1)), (standardError, Int32(2))] {
            switch stream {
            case .null:
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_WRONLY, 0)
            case .file(let path):
                posix_spawn_file_actions_addopen(&actions, target, path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            case .pipe:
                guard let pipe = makePipe() else { throw fail("pipe") }
                posix_spawn_file_actions_adddup2(&actions, pipe.write, target)
                parentEnds.append(pipe.write)
                readers.append((pipe.read, target == 1))
            }
        }
        if let directory { stitch_spawn_add_chdir(&actions, directory) }
        stitch_spawn_add_closefrom(&actions, 3)

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var child: Int32 = 0
        let result = posix_spawn(&child, executable, &actions, &attributes, argv, envp)
        guard result == 0 else {
            errno = result
            throw fail("posix_spawn")
        }
        pid = child
        for fd in parentEnds { close(fd) }
        state.withLock { $0.openStreams = readers.count }

        if let inputWriter, let input {
            spawnDetached {
                var done = 0
                while done < input.count {
                    let n = input.withUnsafeBytes { write(inputWriter, $0.baseAddress! + done, $0.count - done) }
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { break }
                    done += n
                }
                close(inputWriter)
            }
        }
        for (fd, isStandardOutput) in readers {
            spawnDetached { [self] in
                var buffer = [UInt8](repeating: 0, count: 64 * 1024)
                while true {
                    let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { break }
                    onOutput(Array(buffer[0..<n]), isStandardOutput)
                }
                close(fd)
                self.finished { $0.openStreams -= 1 }
            }
        }
        spawnDetached { [self] in
            var status: Int32 = 0
            let child = self.pid
            while waitpid(child, &status, 0) < 0 && errno == EINTR {}
            // WIFSIGNALED / WTERMSIG / WEXITSTATUS, which are macros.
            let signal = status & 0x7f
            let termination =
                signal != 0 && signal != 0x7f
                ? Termination(status: 128 + signal, signal: signal)
                : Termination(status: (status >> 8) & 0xff, signal: nil)
            onExit(termination)
            self.finished { $0.termination = termination }
        }
    }

    private func finished(_ change: (inout State) -> Void) {
        let waiters: [@Sendable () -> Void] = state.withLock { state in
            change(&state)
            guard state.isComplete else { return [] }
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter() }
    }

    /// True until the process has exited and been reaped.
    public var isRunning: Bool { state.withLock { $0.termination == nil } }

    /// How it ended, once it has.
    public var termination: Termination? { state.withLock { $0.termination } }

    /// Sends `signal` unless the process has been reaped (so the pid cannot belong to another process yet).
    public func send(_ signal: Int32) {
        state.withLock { state in
            if state.termination == nil { _ = Glibc.kill(pid, signal) }
        }
    }

    /// Calls `body` once the process has exited and its piped output has been read to the end (at once if so).
    public func whenComplete(_ body: @escaping @Sendable () -> Void) {
        let now = state.withLock { state -> Bool in
            if state.isComplete { return true }
            state.waiters.append(body)
            return false
        }
        if now { body() }
    }

    /// Blocks until the process has exited and its output has been read; returns how it ended.
    public func waitUntilExit() -> Termination {
        let done = DispatchSemaphore(value: 0)
        whenComplete { done.signal() }
        done.wait()
        return state.withLock { $0.termination! }
    }

    deinit {
        if state.withLock({ $0.termination == nil }) { _ = Glibc.kill(pid, SIGKILL) }
    }
}

public struct ChildProcessError: Error, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}

/// Runs `body` on a new detached thread.
private func spawnDetached(_ body: @escaping @Sendable () -> Void) {
    Thread { body() }.start()
}
