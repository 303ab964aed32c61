import Glibc
import StitchLocks

// Low-level helpers shared by the test server: POSIX sockets, threads, and a small
// condition-variable lock. Only `connectToLoopback` is public (for tests' raw clients).

/// `POLLRDHUP` (peer closed its writing half) is only exposed by Glibc under `_GNU_SOURCE`.
let pollReadHangUp: Int16 = 0x2000

/// Closes a descriptor once (on Linux the fd is released even if `close` reports `EINTR`).
func closeDescriptor(_ fd: Int32) {
    _ = Glibc.close(fd)
}

/// Runs `body` on a new detached POSIX thread.
func spawnThread(_ body: @escaping @Sendable () -> Void) -> Bool {
    final class Box {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
    let context = Unmanaged.passRetained(Box(body)).toOpaque()
    var thread = pthread_t()
    let result = pthread_create(
        &thread, nil,
        { raw in
            let box = Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
            box.body()
            return nil
        }, context)
    if result != 0 {
        Unmanaged<Box>.fromOpaque(context).release()
        return false
    }
    pthread_detach(thread)
    return true
}

/// Creates a close-on-exec pipe; returns `(read, write)` or nil.
func makePipe() -> (read: Int32, write: Int32)? {
    var fds: [Int32] = [-1, -1]
    guard pipe(&fds) == 0 else { return nil }
    setCloseOnExec(fds[0])
    setCloseOnExec(fds[1])
    return (fds[0], fds[1])
}

/// Marks a descriptor close-on-exec so child processes (e.g. a `curl` started by a test) do not
/// inherit it. (`pipe2`/`accept4` are not exported by the Glibc module.)
func setCloseOnExec(_ fd: Int32) {
    _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
}

/// Writes one byte to a pipe (used as a level-triggered wake-up signal).
func signalPipe(_ fd: Int32) {
    var byte: UInt8 = 1
    _ = Glibc.write(fd, &byte, 1)
}

/// A loopback port that refuses connections for as long as this lives: bound, never listening, so no other
/// test's server can take it (a stopped server's port can be reused at once by a test running beside).
public final class RefusingPort: Sendable {
    public let port: Int
    private let fd: Int32

    public init() throws(TestServerError) {
        (fd, port) = try makeLoopbackListener(listening: false)
    }

    deinit { closeDescriptor(fd) }
}

/// Opens a listening (or only bound) TCP socket on 127.0.0.1 with an ephemeral port.
func makeLoopbackListener(listening: Bool = true) throws(TestServerError) -> (fd: Int32, port: Int) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw TestServerError("socket() failed: errno \(errno)") }
    var one: Int32 = 1
    _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr.s_addr = in_addr_t(0x7F00_0001).bigEndian
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }
    guard bound == 0 else {
        let code = errno
        closeDescriptor(fd)
        throw TestServerError("bind(127.0.0.1:0) failed: errno \(code)")
    }
    guard !listening || listen(fd, 128) == 0 else {
        let code = errno
        closeDescriptor(fd)
        throw TestServerError("listen() failed: errno \(code)")
    }
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let named = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    guard named == 0 else {
        let code = errno
        closeDescriptor(fd)
        throw TestServerError("getsockname() failed: errno \(code)")
    }
    return (fd, Int(UInt16(bigEndian: address.sin_port)))
}

/// Disables Nagle's algorithm so small responses are not delayed on keep-alive connections.
func setNoDelay(_ fd: Int32) {
    var one: Int32 = 1
    _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
}

/// Makes the next `close` send a TCP RST instead of a FIN.
func setLingerReset(_ fd: Int32) {
    var value = linger(l_onoff: 1, l_linger: 0)
    _ = setsockopt(fd, SOL_SOCKET, SO_LINGER, &value, socklen_t(MemoryLayout<linger>.size))
}

/// Sends the whole buffer (retrying partial writes and `EINTR`), never raising SIGPIPE.
/// `willSend` is told how many bytes are about to be handed to each `send` call and `didSend`
/// how many of them were actually accepted, so callers can keep exact counters.
@discardableResult
func sendAll(
    _ fd: Int32, _ buffer: UnsafeRawBufferPointer, more: Bool = false,
    willSend: (Int) -> Void = { _ in }, didSend: (_ attempted: Int, _ accepted: Int) -> Void = { _, _ in }
) -> Bool {
    var offset = 0
    let flags = Int32(MSG_NOSIGNAL) | (more ? Int32(MSG_MORE) : 0)
    while offset < buffer.count {
        let attempt = buffer.count - offset
        willSend(attempt)
        let result = send(fd, buffer.baseAddress! + offset, attempt, flags)
        if result < 0 {
            didSend(attempt, 0)
            if errno == EINTR { continue }
            return false
        }
        didSend(attempt, result)
        offset += result
    }
    return true
}

/// Sends a byte array in full.
@discardableResult
func sendAll(_ fd: Int32, _ bytes: [UInt8], more: Bool = false) -> Bool {
    bytes.withUnsafeBytes { sendAll(fd, $0, more: more) }
}

/// A value behind a ``ConditionLock``, for the few places where a test's thread waits for a state change.
final class Condition<Value: Sendable>: @unchecked Sendable {
    // Sendable: `value` is reached only under `lock`.
    private let lock = ConditionLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    /// Reads or mutates the value under the lock and wakes every waiter afterwards.
    func update<R>(_ body: (inout Value) -> R) -> R {
        lock.withLock {
            let result = body(&value)
            lock.broadcast()
            return result
        }
    }

    /// Waits until `body` returns true (it may mutate the value when it does), or until
    /// `timeout` elapses (nil waits forever). Returns whether `body` succeeded.
    func wait(timeout: Duration?, _ body: (inout Value) -> Bool) -> Bool {
        let deadline = timeout.map { timeout -> UInt64 in
            let (seconds, attoseconds) = timeout.components
            return ConditionLock.monotonicNanoseconds() + UInt64(max(0, seconds)) * 1_000_000_000
                + UInt64(max(0, attoseconds / 1_000_000_000))
        }
        return lock.withLock {
            while true {
                if body(&value) { return true }
                if !lock.wait(untilNanoseconds: deadline) { return body(&value) }
            }
        }
    }
}

/// A TCP socket connected to 127.0.0.1:`port`, or nil with `errno` telling why — for tests that drive a server by
/// hand, byte for byte.
public func connectToLoopback(port: Int) -> Int32? {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return nil }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = UInt16(port).bigEndian
    address.sin_addr.s_addr = in_addr_t(0x7F00_0001).bigEndian
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }
    guard connected == 0 else {
        let error = errno
        close(fd)
        errno = error
        return nil
    }
    // A send blocks at most a minute (then fails with EAGAIN): a peer that stops reading fails a test, never
    // hangs it.
    var bound = timeval(tv_sec: 60, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, socklen_t(MemoryLayout<timeval>.size))
    return fd
}
