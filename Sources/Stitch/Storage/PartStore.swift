import CStitchSystem
import Foundation
import Glibc
import Synchronization

/// The files of one download: the destination and, beside it until the end, the part file, the state
/// file and the live record.
public struct DownloadPaths: Sendable, Hashable {
    /// Where the finished, verified file appears — and nothing else ever does.
    public let destination: String
    public var part: String { destination + ".part" }
    public var state: String { destination + ".stitch" }
    public var live: String { destination + ".stitch-live" }
    /// UTF-8 bytes the longest of these add to the destination's name (`.stitch-live`; the state's temporary
    /// `.stitch.tmp` is shorter).
    static let longestSuffixBytes = 12

    public init(destination: String) { self.destination = destination }
}

/// The mark a finished download leaves on its file (an extended attribute), so that a rerun of the same
/// command can say "already complete" instead of refusing to clobber a file it does not know.
struct CompletionMark: Codable, Hashable {
    static let attributeName = "user.stitch"
    var url: String
    var length: Int64
    var etag: String?

    static func read(at path: String) -> CompletionMark? {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        let n = buffer.withUnsafeMutableBytes { getxattr(path, attributeName, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        return try? JSONDecoder().decode(CompletionMark.self, from: Data(buffer[0..<n]))
    }
}

/// What resuming found on disk.
struct ResumePoint: Sendable {
    /// Bytes `0..<offset` of the part file are vouched for.
    var offset: Int64
    /// Why less than the state file's best record was trusted, for the user.
    var note: String?
}

/// Owns what is on disk for one download. Every write the crash rules depend on goes through here.
///
/// Threads: `write`, `read` and `noteWritten` are called on the transport thread during a transfer;
/// `checkpoint` on the checkpointer thread; the rest by the engine between transfers. State changes are
/// serialised by one lock; `written` is an atomic so that progress can be read from anywhere.
final class PartStore: @unchecked Sendable {
    let paths: DownloadPaths
    let fd: Int32
    private let live: LiveRecord
    private let state: Mutex<DownloadState>
    /// Bytes `0..<written` have been handed to the kernel (page cache).
    let written: Atomic<Int64>
    /// The last durable extent, mirrored for readers outside the lock.
    let durable: Atomic<Int64>
    /// Set after a failed `fdatasync` or a half-done restart: nothing this store writes may be trusted as
    /// durable any more (Linux reports a writeback error to one fsync only; a retried one would lie), so
    /// every later durable step fails and the run ends with the error.
    private let broken = Atomic<Bool>(false)

    private init(paths: DownloadPaths, fd: Int32, live: LiveRecord, state: DownloadState, written: Int64) {
        self.paths = paths
        self.fd = fd
        self.live = live
        self.state = Mutex(state)
        self.written = Atomic(written)
        self.durable = Atomic(state.durableLength)
    }

    deinit { close(fd) }

    var snapshot: DownloadState { state.withLock { $0 } }

    /// Starts a fresh download: empty part file, state at zero, a new live record.
    static func create(
        paths: DownloadPaths, url: String, headers: [String], checksum: String?, validators: Validators
    ) throws(DownloadError) -> PartStore {
        let state = DownloadState(
            url: url, headers: headers, checksum: checksum, validators: validators, durableLength: 0,
            bootID: BootID.current, liveNonce: newNonce(), updatedAt: now())
        // Locked before anything changes; emptied; the state durable before any data exists, so a crash at any
        // later point finds it.
        let fd = try openLocked(paths)
        let live: LiveRecord
        do throws(DownloadError) {
            guard ftruncate(fd, 0) == 0 else { throw .io("cannot truncate", path: paths.part, .current) }
            try StateFile.write(state, to: paths.state)
            live = try LiveRecord(creatingAt: paths.live, nonce: state.nonce, written: 0)
        } catch {
            close(fd)
            throw error
        }
        return PartStore(paths: paths, fd: fd, live: live, state: state, written: 0)
    }

    /// Reopens a partial download from its state file and decides how much of the part file to trust:
    /// the live record's extent within the same boot, else the durable extent. The untrusted tail is cut off.
    static func reopen(paths: DownloadPaths, state: DownloadState) throws(DownloadError) -> (PartStore, ResumePoint) {
        let fd = try openLocked(paths)
        // The state was read before the lock; another run may have finished or restarted in between.
        let current: DownloadState?
        do { current = try StateFile.read(paths.state) } catch {
            close(fd)
            throw error
        }
        guard current == state else {
            close(fd)
            throw DownloadError(
                .io, "\(paths.destination) changed while it was being opened by another stitch run; run again",
                resumable: true)
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let error = Errno.current
            close(fd)
            throw .io("cannot stat", path: paths.part, error)
        }
        let size = Int64(info.st_size)
        var state = state
        var note: String?
        var trusted = state.durableLength
        if state.bootID == BootID.current {
            if let written = LiveRecord.read(at: paths.live, nonce: state.nonce), written > trusted {
                trusted = written
            }
        } else if size > state.durableLength {
            note = "the machine restarted since the last run; trusting only the \(state.durableLength) bytes synced to disk"
        }
        if size < state.durableLength {
            note = "the part file is shorter than its state records; starting over"
            trusted = 0
        }
        trusted = min(trusted, size, state.validators.totalLength ?? Int64.max)
        if trusted < state.durableLength { state.durableLength = trusted }
        guard ftruncate(fd, off_t(trusted)) == 0 else {
            let error = Errno.current
            close(fd)
            throw .io("cannot truncate", path: paths.part, error)
        }
        state.bootID = BootID.current
        let live: LiveRecord
        do { live = try LiveRecord(creatingAt: paths.live, nonce: state.nonce, written: trusted) } catch {
            close(fd)
            throw error
        }
        // From here the store owns (and closes) the descriptor. The new boot id must not be recorded before the
        // data it vouches for is durable.
        let store = PartStore(paths: paths, fd: fd, live: live, state: state, written: trusted)
        try store.checkpoint(force: true)
        return (store, ResumePoint(offset: trusted, note: note))
    }

    /// Opens (creating) the part file and takes the download's lock, an exclusive `flock` held until ``unlock()``
    /// or the store's end, so that two runs — two processes, or two calls in one — never write one partial
    /// download. Nothing on disk is changed before the lock is held.
    private static func openLocked(_ paths: DownloadPaths) throws(DownloadError) -> Int32 {
        let fd = retryingOnInterrupt { open(paths.part, O_RDWR | O_CREAT | O_CLOEXEC, 0o644) }
        guard fd >= 0 else { throw .io("cannot open", path: paths.part, .current) }
        if let busy = lock(fd, paths) {
            close(fd)
            throw busy
        }
        // The name may have been renamed or removed by a run that finished between our open and our lock.
        var opened = stat()
        var named = stat()
        guard fstat(fd, &opened) == 0, stat(paths.part, &named) == 0,
            opened.st_ino == named.st_ino, opened.st_dev == named.st_dev
        else {
            close(fd)
            throw DownloadError(
                .io, "\(paths.destination) changed while it was being opened by another stitch run; run again",
                resumable: true)
        }
        return fd
    }

    /// Takes the lock on `fd`; returns the error if another run holds it. Other failures (a file system
    /// without `flock`) are ignored: the lock guards against a mistake, it must not stop downloads.
    private static func lock(_ fd: Int32, _ paths: DownloadPaths) -> DownloadError? {
        guard retryingOnInterrupt({ flock(fd, LOCK_EX | LOCK_NB) }) != 0 else { return nil }
        let error = Errno.current
        guard error.rawValue == EWOULDBLOCK else { return nil }
        return DownloadError(
            .io, "\(paths.destination) is being downloaded by another stitch run; wait for it to end or stop it",
            cause: error, resumable: true)
    }

    /// Removes the part file, state and live record an earlier run left at `paths` — unless a running download
    /// holds them (then throws, removing nothing).
    static func removeLeftovers(at paths: DownloadPaths) throws(DownloadError) {
        let fd = retryingOnInterrupt { open(paths.part, O_RDWR | O_CLOEXEC) }
        if fd >= 0 {
            defer { close(fd) }
            if let busy = lock(fd, paths) { throw busy }
            unlink(paths.part)
        }
        unlink(paths.state)
        unlink(paths.state + ".tmp")
        unlink(paths.live)
    }

    /// Releases the lock (the run is over); the files stay as they are.
    func unlock() {
        _ = flock(fd, LOCK_UN)
    }

    /// Reserves disk blocks for the rest of the file (keeping the size, which tracks written data), so a full
    /// disk shows up before the transfer rather than in the middle, and the file system allocates once.
    /// Returns `ENOSPC` when the space is not there; other failures (a file system without fallocate) are
    /// ignored.
    func preallocate(totalLength: Int64) -> Errno? {
        let from = written.load(ordering: .relaxed)
        guard totalLength > from else { return nil }
        if stitch_preallocate(fd, from, totalLength - from) != 0, errno == ENOSPC { return .noSpace }
        return nil
    }

    // MARK: Transport-thread hot path

    /// Writes all of `buffer` at `offset`, retrying short writes and `EINTR`.
    @inline(__always)
    func write(_ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Errno? {
        var done = 0
        while done < buffer.count {
            let n = retryingOnInterrupt {
                pwrite(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            }
            if n < 0 { return .current }
            if n == 0 { return .noSpace }
            done += n
        }
        return nil
    }

    /// Reads up to `buffer.count` bytes at `offset`; returns how many were read.
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Int {
        var done = 0
        while done < buffer.count {
            let n = retryingOnInterrupt {
                pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            }
            if n <= 0 { break }
            done += n
        }
        return done
    }

    /// Records that bytes `0..<end` are written: an atomic for readers plus one store into the live record.
    @inline(__always)
    func noteWritten(_ end: Int64) {
        written.store(end, ordering: .releasing)
        live.store(written: end)
    }

    // MARK: Durable steps

    /// Makes everything written so far durable: `fdatasync` the data, then atomically replace the state
    /// with the new durable extent (temp, fsync, rename, fsync directory).
    func checkpoint(force: Bool = false) throws(DownloadError) {
        try state.withLock { (state: inout DownloadState) throws(DownloadError) in
            try checkUsable()
            let end = written.load(ordering: .acquiring)
            guard force || end != state.durableLength else { return }
            guard fdatasync(fd) == 0 else {
                broken.store(true, ordering: .releasing)
                throw .io("cannot sync", path: paths.part, .current)
            }
            // The in-memory state changes only once the file says the same.
            var next = state
            next.durableLength = end
            next.updatedAt = now()
            try StateFile.write(next, to: paths.state)
            state = next
            durable.store(end, ordering: .releasing)
        }
    }

    private func checkUsable() throws(DownloadError) {
        if broken.load(ordering: .acquiring) {
            throw DownloadError(
                .io, "an earlier write of \(paths.part) failed; stopping so nothing unverified is kept as saved",
                resumable: true)
        }
    }

    /// Throws the partial data away and starts again from zero with new validators. The new state (with a
    /// new nonce) is durable before the part file is cut, so a crash in between trusts nothing old.
    func restart(validators: Validators) throws(DownloadError) {
        try state.withLock { (state: inout DownloadState) throws(DownloadError) in
            try checkUsable()
            var next = state
            next.validators = validators
            next.durableLength = 0
            next.liveNonce = Self.newNonce()
            next.updatedAt = now()
            do throws(DownloadError) {
                try StateFile.write(next, to: paths.state)
            } catch {
                // The file may hold either generation now; memory must not pair new validators with old bytes.
                broken.store(true, ordering: .releasing)
                throw error
            }
            state = next
            durable.store(0, ordering: .releasing)
            live.reset(nonce: next.nonce, written: 0)
            written.store(0, ordering: .releasing)
            guard ftruncate(fd, 0) == 0 else {
                broken.store(true, ordering: .releasing)
                throw .io("cannot truncate", path: paths.part, .current)
            }
        }
    }

    /// Records validators learnt from a later response (e.g. after a restart, or the length from a
    /// `Content-Range`) durably at once, so bytes the live record vouches for are never paired with validators
    /// that were only in memory.
    func update(validators: Validators) throws(DownloadError) {
        try state.withLock { (state: inout DownloadState) throws(DownloadError) in
            try checkUsable()
            guard state.validators != validators else { return }
            var next = state
            next.validators = validators
            next.updatedAt = now()
            try StateFile.write(next, to: paths.state)
            state = next
        }
    }

    /// Completes the download: sync the data, mark it, rename it into place, sync the directory, then
    /// remove the state and live record.
    func finish(url: String) throws(DownloadError) {
        try state.withLock { (state: inout DownloadState) throws(DownloadError) in
            try checkUsable()
            let mark = CompletionMark(url: url, length: written.load(ordering: .acquiring), etag: state.validators.etag)
            if let data = try? JSONEncoder().encode(mark) {
                // Best effort: a file system without user xattrs only loses the "already complete" message.
                _ = data.withUnsafeBytes { fsetxattr(fd, CompletionMark.attributeName, $0.baseAddress, $0.count, 0) }
            }
            // fsync, not fdatasync: the mark (metadata) must be as durable as the data it describes.
            guard fsync(fd) == 0 else {
                broken.store(true, ordering: .releasing)
                throw .io("cannot sync", path: paths.part, .current)
            }
            guard rename(paths.part, paths.destination) == 0 else {
                throw .io("cannot rename into place", path: paths.destination, .current)
            }
            try syncDirectory(containing: paths.destination)
            unlink(paths.state)
            unlink(paths.state + ".tmp")
            unlink(paths.live)
        }
    }

    /// Removes the part file, state and live record.
    func discard() {
        state.withLock { _ in
            unlink(paths.part)
            unlink(paths.state)
            unlink(paths.state + ".tmp")
            unlink(paths.live)
        }
    }

    private static func newNonce() -> String {
        String(UInt64.random(in: 1...UInt64.max), radix: 16)
    }
}

func now() -> Int64 { Int64(time(nil)) }
