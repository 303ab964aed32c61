import Dispatch
import Foundation
import StitchLocks

/// Hashes what one body's sink writes into the running digest of ``DownloadRequest/checksum``, behind it, on a
/// queue of its own: a digest (SHA-256, SHA-512, MD5) costs the CPU several times what receiving the bytes does, and
/// the transport's thread is every transfer's. That thread only writes and records how far; the bytes are read back
/// from the part file (the page cache, as they were just written) in chunks of at most 1 MiB, so memory stays flat
/// however far the hashing lags. The request's end waits for it (``drained()``), so that the next request, a
/// restart in place or the finish sees every byte of this body hashed.
///
/// The pieces' CRC-32C stay on the transport's thread (``SegmentSink``): in hardware they cost less than the read
/// back would.
final class HashFollower: Sendable {
    private struct State {
        /// The next byte to hash, and how far the sink has written.
        var hashed: Int64
        var written: Int64
        /// A drain is queued or running.
        var draining = false
        /// A read back fell short: nothing more is hashed (a gap would make every later checksum wrong).
        var failed = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Locked<State>
    private let store: PartStore
    private let digest: RunningDigest
    /// Called when a read back fell short (the file was cut under the run): the digest no longer covers the file.
    private let lost: @Sendable () -> Void
    private let hook: (@Sendable () -> Void)?
    private let queue = DispatchQueue(label: "stitch.hash")

    /// Follows a body whose first written byte goes at `offset`. Nil when there is no digest to keep.
    init?(
        store: PartStore, from offset: Int64, digest: RunningDigest?, lost: @escaping @Sendable () -> Void,
        hook: (@Sendable () -> Void)? = nil
    ) {
        guard let digest else { return nil }
        self.store = store
        self.digest = digest
        self.lost = lost
        self.hook = hook
        state = Locked(State(hashed: offset, written: offset))
    }

    /// Bytes behind the writer before a drain starts: the queue wakes once a MiB, not once a chunk.
    static let batch: Int64 = 1 << 20

    /// The sink wrote up to `offset` (on the transport's thread: one lock, and a queued drain once a batch waits).
    func wrote(upTo offset: Int64) {
        let start = state.withLock { state -> Bool in
            state.written = offset
            guard !state.draining, !state.failed, state.written - state.hashed >= Self.batch else { return false }
            state.draining = true
            return true
        }
        if start { queue.async { [self] in drain() } }
    }

    /// Returns once every byte written so far is hashed (at once when nothing is left).
    func drained() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            enum Next { case done, wait, drain }
            let next = state.withLock { state -> Next in
                if !state.draining, state.hashed >= state.written || state.failed { return .done }
                state.waiters.append(continuation)
                guard !state.draining else { return .wait }
                state.draining = true
                return .drain
            }
            switch next {
            case .done: continuation.resume()
            case .wait: break
            case .drain: queue.async { [self] in drain() }
            }
        }
    }

    private func drain() {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        while true {
            let next = state.withLock { state -> (Int64, Int64)? in
                guard state.hashed < state.written, !state.failed else {
                    state.draining = false
                    return nil
                }
                return (state.hashed, min(state.written, state.hashed + Int64(buffer.count)))
            }
            guard let (from, to) = next else { break }
            hook?()
            let chunk = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<Int(to - from)])
            let read = store.read(into: chunk, at: from)
            if read == chunk.count {
                digest.update(UnsafeRawBufferPointer(chunk))
                state.withLock { $0.hashed = to }
            } else {
                state.withLock { $0.failed = true }
                lost()
            }
        }
        let waiters = state.withLock { state in
            defer { state.waiters.removeAll() }
            return state.draining ? [] : state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}
