#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization
import StitchLocks

/// Writes a body to a descriptor in order, on the transport's thread, never blocking it: a pipe without room
/// pauses the transfer (the same bytes are offered again, and what was written of them is skipped).
final class DescriptorSink: BodySink, Sendable {
    let fd: Int32
    let rateLimiter: RateLimiter?
    /// Read for the rate limit.
    let clock: any DownloadClock
    /// Bytes written to the descriptor; read after the transfer has ended.
    var written: Int64 { total.load(ordering: .acquiring) }
    private let total = Atomic<Int64>(0)
    /// The chunk being offered: what of it was written before a pause, and whether the rate limiter was charged
    /// for it (a pause for the pipe must not charge it again). On the transport's thread; under a lock so that the
    /// type is checked `Sendable` (never contended).
    private struct Offer {
        var partial = 0
        var charged = false
    }
    private let offer = Locked(Offer())
    /// A pipe or socket, whose reader can be slow: written only as far as it has room. A file or a terminal is
    /// written in one go.
    private let pipeLike: Bool
    private let failureBox = Locked<DownloadError?>(nil)
    var failure: DownloadError? { failureBox.withLock { $0 } }

    init(fd: Int32, rateLimiter: RateLimiter?, clock: any DownloadClock = SystemClock()) {
        self.fd = fd
        self.rateLimiter = rateLimiter
        self.clock = clock
        var info = stat()
        let kind = fstat(fd, &info) == 0 ? info.st_mode & S_IFMT : S_IFIFO
        pipeLike = kind == S_IFIFO || kind == S_IFSOCK
    }

    /// Before each request: a chunk left half-written by a transfer that then ended is not offered again (the
    /// next request starts after what was written).
    func startRequest() {
        offer.withLock { $0 = Offer() }
    }

    func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
        offer.withLock { receive(bytes, &$0) }
    }

    private func receive(_ bytes: UnsafeRawBufferPointer, _ offer: inout Offer) -> ReceiveDecision {
        if !offer.charged, let limiter = rateLimiter {
            if let wait = limiter.take(bytes.count, now: clock.uptime()) { return .wait(.seconds(wait)) }
            offer.charged = true
        }
        while offer.partial < bytes.count {
            if !pipeLike {
                guard write(bytes, count: bytes.count - offer.partial, &offer) else { return .abort }
                continue
            }
            var ready = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            let polled = poll(&ready, 1, 0)
            if polled == 0 { return .wait(.milliseconds(2)) }
            if polled < 0 && errno == EINTR { continue }
            if ready.revents & Int16(POLLERR | POLLHUP | POLLNVAL) != 0 || polled < 0 {
                failureBox.withLock {
                    $0 = DownloadError(.io, "the output was closed after \(written) bytes")
                }
                return .abort
            }
            // At most what a pipe with room (POLLOUT: at least PIPE_BUF free) takes without blocking.
            guard write(bytes, count: min(bytes.count - offer.partial, Int(PIPE_BUF)), &offer) else { return .abort }
        }
        offer = Offer()
        return .accepted
    }

    /// One `write` of up to `count` bytes of `bytes` after what was written of them; false on an error (recorded).
    private func write(_ bytes: UnsafeRawBufferPointer, count: Int, _ offer: inout Offer) -> Bool {
        let n = systemWrite(fd, bytes.baseAddress! + offer.partial, count)
        if n < 0 {
            if errno == EINTR || errno == EAGAIN { return true }
            let error = Errno.current
            failureBox.withLock { $0 = DownloadError(.io, "cannot write the output: \(error)", cause: error) }
            return false
        }
        offer.partial += n
        total.add(Int64(n), ordering: .releasing)
        return true
    }
}
