import Glibc
import Synchronization

/// Writes a body to a descriptor in order, on the transport's thread, never blocking it: a pipe without room
/// pauses the transfer (the same bytes are offered again, and what was written of them is skipped).
final class DescriptorSink: BodySink, @unchecked Sendable {
    let fd: Int32
    let rateLimiter: RateLimiter?
    /// Bytes written to the descriptor; read after the transfer has ended.
    var written: Int64 { total.load(ordering: .acquiring) }
    private let total = Atomic<Int64>(0)
    /// What of the chunk being offered was written before a pause.
    private var partial = 0
    private let failureBox = Mutex<DownloadError?>(nil)
    var failure: DownloadError? { failureBox.withLock { $0 } }

    init(fd: Int32, rateLimiter: RateLimiter?) {
        self.fd = fd
        self.rateLimiter = rateLimiter
    }


    /// Before each request: a chunk left half-written by a transfer that then ended is not offered again (the
    /// next request starts after what was written).
    func startRequest() { partial = 0 }

    func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
        if partial == 0, let limiter = rateLimiter, let wait = limiter.take(bytes.count, now: monotonicNow()) {
            return .wait(.seconds(wait))
        }
        while partial < bytes.count {
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
            let count = min(bytes.count - partial, Int(PIPE_BUF))
            let n = Glibc.write(fd, bytes.baseAddress! + partial, count)
            if n < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                let error = Errno.current
                failureBox.withLock { $0 = DownloadError(.io, "cannot write the output: \(error)", cause: error) }
                return .abort
            }
            partial += n
            total.add(Int64(n), ordering: .releasing)
        }
        partial = 0
        return .accepted
    }
}
