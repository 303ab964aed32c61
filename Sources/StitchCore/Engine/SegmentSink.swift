#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization
import StitchLocks

/// The engine's one body sink: writes one response's body into one segment of the part file, for a download on
/// one connection and for each lane of a download on several alike.
///
/// Per chunk, on the transport's thread and nothing else: the stop checks, the shared rate limit, a comparison
/// with the bytes on disk for the part of the body that re-fetches what was already there (a resume checked
/// without a validator), a `pwrite` at the segment's offset, the pieces' CRC-32C, one store into the live record, a word to its
/// ``HashFollower`` (which hashes the running digest elsewhere),
/// and counters. Everything that opens, syncs or hashes files happened before, in the engine's decision.
///
/// Once the sink has said stop it takes nothing more of this response, whatever the transport does next: the
/// bytes it would be offered are not the ones that follow ``offset``.
final class SegmentSink: BodySink, Sendable {
    /// Why the sink stopped a body on its own.
    enum Failure: Sendable {
        /// A byte before ``verifyEnd`` differed from the one on disk: the file on the server is not the one the
        /// partial came from.
        case overlapMismatch(Int64)
        /// A write of the part file failed.
        case write(Errno)
        /// More body than the file's length.
        case tooLong
        /// A checkpoint (a sync or a state write) failed: nothing more may be written.
        case checkpoint
        /// The whole body arrived and does not match the response's `Content-Digest` (bytes `first-last`).
        case partDigestMismatch(String)

        /// What this means for the attempt's machine, the one mapping of every request (the first and each
        /// lane's). `part`: the part file's path; `checkpointError`: why the checkpoint failed, when known.
        func outcome(part: String, checkpointError: DownloadError?) -> AttemptReport.SinkOutcome {
            switch self {
            case .overlapMismatch(let at): .overlapMismatch(at: at)
            case .write(let errno): .storageFailed(DownloadError.io("cannot write", path: part, errno))
            case .tooLong: .tooLong
            case .partDigestMismatch(let range): .partDigestMismatch(range: range)
            case .checkpoint:
                .storageFailed(
                    checkpointError
                        ?? DownloadError(.io, "an earlier write of \(part) failed; stopping", resumable: true))
            }
        }
    }

    /// Where the body's bytes stop counting.
    enum Bound: Sendable {
        /// At the segment's end as the store has it at each chunk: another connection may take the segment's tail
        /// (a split), so the end can move closer while the body flows. Bytes past it are dropped (counted in
        /// ``TransferCounters/discarded``) and the sink stops, unless the response ends exactly there
        /// (`requestEnd`, the end it asked for), so that its connection can be reused.
        case segmentEnd(requestEnd: Int64)
        /// At the file's length (unknown: none); a longer body is ``Failure/tooLong``.
        case fileLength(Int64?)
    }

    let store: PartStore
    let slot: Int
    private let bound: Bound
    /// Where the next byte goes (read from anywhere: the monitor samples it).
    var offset: Int64 { published.load(ordering: .relaxed) }
    private let published: Atomic<Int64>
    /// Bytes before this offset are compared with the disk, not written.
    private let verifyEnd: Int64
    private let rateLimiter: RateLimiter?
    /// The download's clock, read for the rate limit.
    private let clock: any DownloadClock
    private let checkpointer: Checkpointer?
    private let counters: TransferCounters
    /// Hashes what this sink writes, behind it, off the transport's thread (nil: nothing to hash).
    let follower: HashFollower?
    /// Checked before each chunk: true stops the body (the transfer halted, the connection is being replaced).
    private let shouldStop: @Sendable () -> Bool
    /// Called after each write with the new offset: true stops the body (the first response's probe split the
    /// download).
    private let afterWrite: (@Sendable (Int64) -> Bool)?

    let canRequestRest: Bool
    /// Why the sink stopped the body on its own, if it did.
    var failure: Failure? { body.withLock { $0.failure } }
    /// The body reached the segment's end (see ``Bound/segmentEnd(requestEnd:)``).
    var reachedEnd: Bool { body.withLock { $0.reachedEnd } }

    /// What the body changes, on the transport's thread, one chunk at a time: the lock is held for a chunk (never
    /// contended but by a reader of the outcome once the body is over).
    private struct Body {
        var offset: Int64
        var pieces: PieceHasher?
        var failure: Failure?
        var reachedEnd = false
        var closed = false
        /// The digest of every byte of this response taken so far, for ``PartCheck``.
        var partHasher: DigestHasher?
        var partSeen: Int64 = 0
    }

    /// A 206's `Content-Digest` for its bytes (RFC 9530: the content of a partial response is its part), checked
    /// once the whole body has arrived (``checkPart()``).
    struct PartCheck: Sendable {
        let expected: ExpectedChecksum
        /// The body's first byte's offset and its length.
        let first: Int64
        let count: Int64
    }
    private let partCheck: PartCheck?
    private let body: Locked<Body>
    /// The part file's bytes from the body's first byte to ``verifyEnd`` (at most the overlap window), read when
    /// the sink is made, on the decision pool: the transport's thread only compares (a read could wait on the
    /// disk, and every transfer shares that thread). Nil when the file held fewer (then the first byte mismatches).
    private let onDisk: [UInt8]?
    private let onDiskStart: Int64

    init(
        store: PartStore, slot: Int, bound: Bound, offset: Int64, verifyEnd: Int64 = 0,
        rateLimiter: RateLimiter?, clock: any DownloadClock, checkpointer: Checkpointer?, counters: TransferCounters,
        pieces: PieceHasher?, follower: HashFollower?,
        shouldStop: @escaping @Sendable () -> Bool = { false }, afterWrite: (@Sendable (Int64) -> Bool)? = nil,
        canRequestRest: Bool = false, beforeOverlapRead: (@Sendable () -> Void)? = nil, partCheck: PartCheck? = nil
    ) {
        self.canRequestRest = canRequestRest
        self.partCheck = partCheck
        self.store = store
        self.slot = slot
        self.bound = bound
        published = Atomic(offset)
        body = Locked(
            Body(offset: offset, pieces: pieces, partHasher: partCheck.map { DigestHasher($0.expected.algorithm) }))
        self.verifyEnd = verifyEnd
        self.rateLimiter = rateLimiter
        self.clock = clock
        self.checkpointer = checkpointer
        self.counters = counters
        self.follower = follower
        self.shouldStop = shouldStop
        self.afterWrite = afterWrite
        onDiskStart = offset
        if verifyEnd > offset {
            beforeOverlapRead?()
            var bytes = [UInt8](repeating: 0, count: Int(verifyEnd - offset))
            let read = bytes.withUnsafeMutableBytes { store.read(into: $0, at: offset) }
            onDisk = read == bytes.count ? bytes : nil
        } else {
            onDisk = []
        }
    }

    /// Up to the segment's end as the store has it now (a split moves it closer), or nil for a body bounded by the
    /// file's length. On the transport's thread, as ``receive(_:)``.
    var bytesWanted: Int64? {
        let (closed, offset) = body.withLock { ($0.closed, $0.offset) }
        guard case .segmentEnd = bound, !closed else { return closed ? 0 : nil }
        guard let end = store.end(slot) else { return 0 }
        return max(0, end - offset)
    }

    func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
        let (decision, offset, probe) = body.withLock { body -> (ReceiveDecision, Int64, Bool) in
            let decision = receive(bytes, &body)
            return (decision, body.offset, decision == .accepted && afterWrite != nil)
        }
        published.store(offset, ordering: .relaxed)
        // The probe's sample, outside the lock (it may split the file and send an event).
        if probe, let afterWrite, afterWrite(offset) {
            body.withLock { $0.closed = true }
            return .abort
        }
        return decision
    }

    private func receive(_ bytes: UnsafeRawBufferPointer, _ body: inout Body) -> ReceiveDecision {
        if body.closed { return .abort }
        if shouldStop() {
            body.closed = true
            return .abort
        }
        if store.isBroken || checkpointer?.hasFailed.load(ordering: .relaxed) == true {
            body.failure = .checkpoint
            body.closed = true
            return .abort
        }
        // The rate limit is shared by every connection (and download) holding the same limiter.
        if let limiter = rateLimiter, let wait = limiter.take(bytes.count, now: clock.uptime()) {
            return .wait(.seconds(wait))
        }
        if write(bytes, &body) {
            if let hasher = body.partHasher {
                hasher.update(bytes)
                body.partSeen += Int64(bytes.count)
            }
            return .accepted
        }
        body.closed = true
        return .abort
    }

    /// Once the body is over: whether all of it arrived and matches the response's `Content-Digest`; a mismatch
    /// becomes the sink's failure (the bytes are not this part of the file: the download starts over). A body cut
    /// short cannot be checked (its bytes count as any resumed bytes do).
    func checkPart() {
        guard let partCheck else { return }
        body.withLock { body in
            guard body.failure == nil, let hasher = body.partHasher, body.partSeen == partCheck.count else { return }
            body.partHasher = nil
            if !partCheck.expected.matches(hasher.finalize()) {
                body.failure = .partDigestMismatch("\(partCheck.first)-\(partCheck.first + partCheck.count - 1)")
            }
        }
    }

    private func write(_ bytes: UnsafeRawBufferPointer, _ body: inout Body) -> Bool {
        var data = bytes
        if body.offset < verifyEnd {
            let count = Int(min(Int64(data.count), verifyEnd - body.offset))
            guard matchesDisk(UnsafeRawBufferPointer(rebasing: data[0..<count]), at: body.offset) else {
                body.failure = .overlapMismatch(verifyEnd)
                return false
            }
            body.offset += Int64(count)
            counters.received.add(Int64(count), ordering: .relaxed)
            data = UnsafeRawBufferPointer(rebasing: data[count...])
            if data.isEmpty { return true }
        }
        var count = data.count
        var segmentEnd: Int64?
        switch bound {
        case .segmentEnd:
            // Claimed before the end is read: a split either moved the end already, or waits past this chunk.
            guard let end = store.claim(slot, upTo: body.offset + Int64(data.count)) else { return false }
            segmentEnd = end
            let room = end - body.offset
            if room <= 0 {
                counters.discarded.add(Int64(data.count), ordering: .relaxed)
                body.reachedEnd = true
                return false
            }
            count = Int(min(Int64(data.count), room))
            if count < data.count { counters.discarded.add(Int64(data.count - count), ordering: .relaxed) }
        case .fileLength(let limit):
            if let limit, body.offset + Int64(data.count) > limit {
                body.failure = .tooLong
                return false
            }
        }
        let chunk = UnsafeRawBufferPointer(rebasing: data[0..<count])
        if let error = store.write(chunk, at: body.offset) {
            body.failure = .write(error)
            return false
        }
        // The pieces' checksums here, from the bytes in hand: hardware CRC-32C costs less than the copy that would
        // take them elsewhere (measured: a read back cost a 1 GiB download about a tenth of its time, bench/large.sh).
        body.pieces?.consume(chunk, at: body.offset, store: store)
        body.offset += Int64(count)
        store.noteWritten(slot, body.offset)
        follower?.wrote(upTo: body.offset)
        counters.wrote(count, checkpointer: checkpointer)
        if case .segmentEnd(let requestEnd) = bound, let end = segmentEnd, count < data.count || body.offset >= end {
            body.reachedEnd = true
            // At the end it asked for, the response is over: let it finish so the connection is kept for the
            // lane's next range. Cut short by a split, the server is still sending: stop it.
            return count == data.count && body.offset == requestEnd
        }
        return true
    }

    /// Whether `bytes` at `offset` (before ``verifyEnd``) are the part file's, as read when the sink was made.
    private func matchesDisk(_ bytes: UnsafeRawBufferPointer, at offset: Int64) -> Bool {
        guard let onDisk else { return false }
        let from = Int(offset - onDiskStart)
        guard from >= 0, from + bytes.count <= onDisk.count else { return false }
        return onDisk.withUnsafeBytes { memcmp($0.baseAddress! + from, bytes.baseAddress!, bytes.count) == 0 }
    }
}

/// Counters one download's sinks share (over its attempts and lanes), read from anywhere.
final class TransferCounters: Sendable {
    /// Body bytes taken: written, or compared with the disk.
    let received = Atomic<Int64>(0)
    /// Body bytes received past a split point and dropped (fetched twice: the price of steals and replacements).
    let discarded = Atomic<Int64>(0)
    private let sinceCheckpoint = Atomic<Int64>(0)
    private let checkpointBytes: Int64

    init(checkpointBytes: Int64) {
        self.checkpointBytes = checkpointBytes
    }

    /// Counts `count` bytes written and pokes the checkpointer every `checkpointBytes`.
    @inline(__always)
    func wrote(_ count: Int, checkpointer: Checkpointer?) {
        received.add(Int64(count), ordering: .relaxed)
        if sinceCheckpoint.add(Int64(count), ordering: .relaxed).newValue >= checkpointBytes {
            sinceCheckpoint.store(0, ordering: .relaxed)
            checkpointer?.poke()
        }
    }

    /// Starts the count towards the next checkpoint anew (a new checkpointer, a restart from zero).
    func resetCheckpointCount() {
        sinceCheckpoint.store(0, ordering: .relaxed)
    }
}
