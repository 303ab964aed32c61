import CStitchSystem
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization
import StitchLocks

/// The files of one download: the destination and, beside it until the end, the part file, the state
/// file and the live record.
public struct DownloadPaths: Sendable, Hashable {
    /// Where the finished, verified file appears — and nothing else ever does.
    public let destination: String
    /// `DEST.part`: the bytes so far; renamed to ``destination`` once complete and verified.
    public var part: String { destination + ".part" }
    /// `DEST.stitch`: the state file, rewritten at each checkpoint (what is durable, the validators, the URL).
    public var state: String { destination + ".stitch" }
    /// `DEST.stitch-live`: the live record of how far each segment was written since the last checkpoint.
    public var live: String { destination + ".stitch-live" }
    /// The state of the checkpoint before the last one (a hard link to that file): what a resume falls back on
    /// when `state` is found damaged.
    public var previousState: String { destination + ".stitch.prev" }
    /// UTF-8 bytes the longest of these add to the destination's name (`.stitch-live`, `.stitch.prev`; the
    /// temporaries `.stitch.tmp` and `.stitch.lnk` are shorter).
    static let longestSuffixBytes = 12

    /// Every file a partial download may leave beside the destination, the part file aside.
    ///
    /// In the order they are removed: the state file last. A power cut keeps a prefix of a folder's unsynced changes,
    /// and a rerun that finds the download finished cleans up only when the state file is still there to show it
    /// (PowerCutTests' soak left a live record beside finished files when the state went first).
    var sidecars: [String] { [live, state + ".tmp", state + ".lnk", previousState, state] }

    /// The paths for the file at `destination`.
    public init(destination: String) { self.destination = destination }

    /// Creates the folder `directory` (and its parents) for downloads, durably: each folder created is synced into
    /// its parent, so that a power cut cannot take a folder away with the files finished in it. One that exists is
    /// fine.
    public static func createFolder(_ directory: String) throws {
        try FileOperations.createDirectory(directory)
    }
}

/// The mark a finished download leaves on its file (an extended attribute), so that a rerun of the same
/// command can say "already complete" instead of refusing to clobber a file it does not know.
///
/// It is set on the part file before the sync that precedes the rename into place, with the CRC32C of the whole
/// file: the final record that every byte is durable, made durable by that same sync. A part file that carries it
/// (a power cut before the rename, or before the rename's directory sync, became durable) is finished by the
/// next run once its bytes read back to that CRC (``PartialDownload/finishMarkedPart(matching:verify:)``), not
/// fetched again.
struct CompletionMark: Codable, Hashable {
    static let attributeName = "user.stitch"
    var url: String
    var length: Int64
    var etag: String?
    /// The `Last-Modified` the file came with (for ``DownloadRequest/ifNewer``); absent in older marks.
    var lastModified: String? = nil
    /// CRC32C of the file's `length` bytes; absent in marks written before it existed.
    var crc32c: UInt32?

    static func read(at path: String) -> CompletionMark? {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        #if canImport(Darwin)
        let n = buffer.withUnsafeMutableBytes { getxattr(path, attributeName, $0.baseAddress, $0.count, 0, 0) }
        #else
        let n = buffer.withUnsafeMutableBytes { getxattr(path, attributeName, $0.baseAddress, $0.count) }
        #endif
        guard n > 0 else { return nil }
        return try? JSONDecoder().decode(CompletionMark.self, from: Data(buffer[0..<n]))
    }

    /// The mark on the open file `fd`, if it has one that reads.
    static func read(fd: Int32) -> CompletionMark? {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        #if canImport(Darwin)
        let n = buffer.withUnsafeMutableBytes { fgetxattr(fd, attributeName, $0.baseAddress, $0.count, 0, 0) }
        #else
        let n = buffer.withUnsafeMutableBytes { fgetxattr(fd, attributeName, $0.baseAddress, $0.count) }
        #endif
        guard n > 0 else { return nil }
        return try? JSONDecoder().decode(CompletionMark.self, from: Data(buffer[0..<n]))
    }

    /// Sets the mark on the open file `fd`. Best effort: a file system without user xattrs only loses the "already
    /// complete" message and the finish of a part file whose rename a power cut undid.
    func write(fd: Int32) {
        var text = json
        text.withUTF8 { bytes in
            #if canImport(Darwin)
            _ = fsetxattr(fd, Self.attributeName, bytes.baseAddress, bytes.count, 0, 0)
            #else
            _ = fsetxattr(fd, Self.attributeName, bytes.baseAddress, bytes.count, 0)
            #endif
        }
    }

    /// The mark as the JSON object `read` decodes (the keys `Codable` gives it, sorted; absent optionals left out).
    var json: String {
        var text = "{"
        if let crc32c { text += "\"crc32c\":\(crc32c)," }
        if let etag { text += "\"etag\":" + JSONText.string(etag) + "," }
        if let lastModified { text += "\"lastModified\":" + JSONText.string(lastModified) + "," }
        text += "\"length\":\(length),\"url\":" + JSONText.string(url) + "}"
        return text
    }

    /// Removes the mark from the open file `fd` (best effort).
    static func remove(fd: Int32) {
        #if canImport(Darwin)
        _ = fremovexattr(fd, attributeName, 0)
        #else
        _ = fremovexattr(fd, attributeName)
        #endif
    }
}

/// What resuming found on disk.
struct ResumePoint: Sendable {
    /// Bytes vouched for, over all segments.
    var bytes: Int64
    /// The contiguous vouched-for bytes from offset 0 (where a single connection continues).
    var prefix: Int64
    /// Why less than the state file's best record was trusted, for the user.
    var note: String?
    /// The state was written in another boot: the durable pieces are worth re-checking.
    var rebooted = false
    /// The pieces whose recorded checksum or proof failed when reopening after a reboot, cut (fetched again).
    var damagedPieces: [Int] = []
    /// The pieces holding durable bytes that no checksum proved when reopening after a reboot (a state an older
    /// stitch wrote), cut (fetched again).
    var unprovenPieces: [Int] = []
    /// Durable bytes of the state that the check after a reboot (or a fallback) did not keep.
    var cutBytes: Int64 = 0
}

/// Owns what is on disk for one download. Every write the crash rules depend on goes through here.
///
/// Threads: `write`, `read` and `noteWritten` are called on the transport thread during a transfer;
/// `checkpoint` on the checkpointer thread; the rest by the engine. The steps that write the state file are
/// serialised by one lock held through their syncs (`durableSteps`); the in-memory state has a lock of its own,
/// which a checkpoint holds only to read it and to take in what it wrote, never through a sync, so a split (taken
/// under the engine's lanes' lock) never waits for the disk. How far each segment is written lives in the live
/// record's slots (atomic loads and stores), so progress can be read from anywhere and the hot path takes no lock.
final class PartStore: Sendable {
    let paths: DownloadPaths
    let fd: Int32
    private let live: LiveRecord
    private let state: Locked<DownloadState>
    /// Held through each step that writes the state file (checkpoint, restart, new validators, invalidation,
    /// finish, discard), taken before the state lock: those steps follow one another, and one that read the state
    /// finds it unchanged when it writes, but for splits (``split(_:at:)``, the only change made without it).
    private let durableSteps = Locked(())
    /// For tests: called by a checkpoint just before its data sync (which it may hold up, as a slow disk would).
    let beforeCheckpointSync = Locked<(@Sendable () -> Void)?>(nil)
    /// The durable bytes over all segments, mirrored for readers outside the lock.
    let durable: Atomic<Int64>
    /// Set after a failed `fdatasync` or a half-done restart: nothing this store writes may be trusted as
    /// durable any more (Linux reports a writeback error to one fsync only; a retried one would lie), so
    /// every later durable step fails and the run ends with the error.
    private let broken = Atomic<Bool>(false)
    /// Piece checksums computed by the writers, waiting for their bytes to become durable.
    private let pendingPieces = Locked<[Int: UInt32]>([:])

    /// Each segment's end (`Int64.max` while open), by slot: read lock-free by the writers on every chunk, so no
    /// step that holds a lock through its syncs stalls a transfer. Written under the state lock.
    private let ends = AtomicWords(count: LiveRecord.slotCount, repeating: Int64.max)
    /// Where each segment's writer may be writing to (by slot; never below its written offset). A writer claims its
    /// next chunk, up to the segment's end, before it writes it (``claim(_:upTo:)``); a split never cuts a claimed
    /// chunk (``split(_:at:)``). So no byte is written by two connections (fetched, and counted, twice). Guarded by
    /// their own lock, which is held for a few loads and stores only (never over I/O, never by a checkpoint).
    private let claims = Locked([Int64](repeating: 0, count: LiveRecord.slotCount))

    private init(paths: DownloadPaths, fd: Int32, live: LiveRecord, state: DownloadState) {
        self.paths = paths
        self.fd = fd
        self.live = live
        self.state = Locked(state)
        self.durable = Atomic(state.durableBytes)
        publishEnds(state.segments)
        claims.withLock { claims in
            for (slot, segment) in state.segments.enumerated() {
                claims[slot] = Self.written(segment, live.load(slot: slot))
            }
        }
    }

    deinit {
        // Unlocked explicitly, not by the close: a process that forks (posix_spawn from another thread) shares this
        // open file description with the child until the child's exec, and the lock lives as long as any copy —
        // a reopen in that window found the download "being downloaded by another stitch run".
        if !unlocked.load(ordering: .acquiring) { _ = flock(fd, LOCK_UN) }
        close(fd)
    }

    /// Mirrors the segments' ends for the lock-free readers (call with the state lock held, or before sharing).
    private func publishEnds(_ segments: [Segment]) {
        for (slot, segment) in segments.enumerated() {
            ends.store(slot, segment.end ?? Int64.max)
        }
    }

    /// Starts the live record anew (a new layout or a new nonce) and each writer's claim where its slot now is.
    private func resetLive(nonce: UInt64, written: [Int64]) {
        live.reset(nonce: nonce, written: written)
        claims.withLock { claims in
            for (slot, offset) in written.enumerated() { claims[slot] = offset }
        }
    }

    var snapshot: DownloadState { state.withLock { $0 } }

    /// Runs a step that writes the state file: under `durableSteps`, then the state lock (held through the step's
    /// I/O; these steps are rare, unlike checkpoints).
    private func durableStep<T, Failure: Error>(_ body: (inout DownloadState) throws(Failure) -> T) throws(Failure) -> T {
        try durableSteps.withLock { _ throws(Failure) in
            try state.withLock { (state: inout DownloadState) throws(Failure) in try body(&state) }
        }
    }

    /// One segment covering the whole file (open-ended while the length is unknown).
    static func wholeFile(_ validators: Validators) -> [Segment] {
        [Segment(start: 0, end: validators.totalLength, durable: 0)]
    }

    /// Files of at most this many bytes are started without a state file or live record (see `create`).
    static let smallFileLimit: Int64 = PieceLayout.minimumPieceSize

    /// Starts a fresh download: empty part file, state at zero, a new live record.
    ///
    /// A file of known length up to ``smallFileLimit`` starts with neither a state file nor a live record on disk:
    /// its state file is written at its first checkpoint (after a second), and its written record stays in
    /// memory for the whole run. Three fewer files per download is most of the cost of fetching many small
    /// files. An interruption loses at most ``smallFileLimit`` bytes: before the first checkpoint the next run
    /// starts over (a part file without a state file), after it the next run resumes from the last checkpoint.
    /// Nothing is ever claimed that is not on disk.
    ///
    /// `vacant`: the caller's look, just before (the path choice at the response head), found no state file, no
    /// file at the destination and no part file (``PathChoice/vacant``); nothing was reopened. Its lookups were
    /// made one after another, and another process may have acted between them or since. So under the part file's
    /// lock, which every run holds while it makes, fills or renames these files, the call checks again: a file at
    /// the destination, a state file, or a part file with bytes or blocks ends it with a resumable "run again" (the
    /// rerun's look finds what is there and treats it as always), nothing of it touched but an empty part file
    /// beside a finished file with no state file (this call's, or an empty one left there), removed. Otherwise a
    /// small file's part file is taken without the four other lookups for leftovers (each searches the folder for
    /// a name that is not there). Those leftovers — a previous generation, a temporary, a link, a live record, left
    /// by a power cut that kept only some of an earlier run's removals or by a hand — are looked for and removed
    /// before this store's first state write instead, durably before it (``removeLeftoversBeforeTheFirstState()``);
    /// until then nothing reads them (a previous generation only stands in for a damaged state file, a live record only under
    /// its state's nonce, and this store has no state file on disk). A download that finishes before its first
    /// checkpoint leaves them beside the finished file, never read as its state.
    static func create(
        paths: DownloadPaths, url: String, headers: [String], checksum: String?, validators: Validators,
        adoption: AdoptionRecord? = nil, replacesDestination: Bool = false, vacant: Bool = false
    ) throws(DownloadError) -> PartStore {
        let small = validators.totalLength.map { $0 <= smallFileLimit } ?? false
        let state = DownloadState(
            url: url, headers: headers, checksum: checksum, validators: validators,
            segments: wholeFile(validators), pieceSize: PieceLayout.pieceSize(forTotal: validators.totalLength),
            adoption: adoption, replacesDestination: replacesDestination ? true : nil, bootID: BootID.current,
            liveNonce: newNonce(), updatedAt: now())
        // Locked before anything changes; emptied; the state (or, for a small file, the removal of an old one)
        // durable before any data exists, so a crash at any later point never pairs old state with new bytes.
        let (fd, empty) = try openLocked(paths)
        let live: LiveRecord
        var leftoversUnchecked = false
        do throws(DownloadError) {
            if vacant {
                let finished = access(paths.destination, F_OK) == 0
                let stated = access(paths.state, F_OK) == 0
                if finished || stated || !empty {
                    // An empty part file beside a finished file, with no state: this call's (or an empty one left
                    // beside that file), removed while still the one locked.
                    if finished && !stated && empty && Self.isStill(fd, at: paths.part) { unlink(paths.part) }
                    throw DownloadError(
                        .io,
                        "\(paths.destination) changed while it was being opened (by another program or stitch run); "
                            + "run again", resumable: true)
                }
            }
            if !empty {
                guard ftruncate(fd, 0) == 0 else { throw .io("cannot truncate", path: paths.part, .current) }
            }
            if small && vacant {
                // The other leftovers are looked for before the first state write (see above).
                leftoversUnchecked = true
                live = try LiveRecord(anonymousWithNonce: state.nonce, written: [0])
            } else if small {
                // A state file or live record an earlier run left would describe other bytes: remove them.
                // (Looked up first: unlinking a missing name still takes the directory's lock.) The removal is
                // made durable before any data, so a power cut cannot bring an old state back beside new bytes.
                var removed = false
                for stale in paths.sidecars where access(stale, F_OK) == 0 {
                    unlink(stale)
                    removed = true
                }
                if removed { try syncDirectory(containing: paths.state) }
                live = try LiveRecord(anonymousWithNonce: state.nonce, written: [0])
            } else {
                // A previous generation an earlier download left would describe other bytes.
                try StateFile.write(state, to: paths.state, previous: paths.previousState, generation: .remove)
                live = try LiveRecord(creatingAt: paths.live, nonce: state.nonce, written: [0])
            }
        } catch {
            unlockAndClose(fd)
            throw error
        }
        let store = PartStore(paths: paths, fd: fd, live: live, state: state)
        if small { store.stateOnDisk.store(false, ordering: .relaxed) }
        if leftoversUnchecked { store.leftoversUnchecked.store(true, ordering: .relaxed) }
        return store
    }

    /// Reopens a partial download from its state file and decides how much of each segment to trust: the live
    /// record's extent within the same boot, else the durable extent. Untrusted bytes are fetched again.
    ///
    /// After a reboot (the state names another boot), before anything is written, every recorded piece and every
    /// proof is read back (``Proofs/check(_:read:)``): a piece whose check fails, or that holds durable bytes no
    /// checksum covers (a format 2 state), is cut, so a disk that acknowledged a sync but dropped the data costs
    /// a refetch, never a wrong file.
    ///
    /// `fromPrevious`: `state` was read from ``DownloadPaths/previousState`` because the state file is damaged. Then
    /// the live record is not applied (it cannot prove anything the previous state's checksums do not), the same
    /// check cuts every piece its checksums do not prove before anything is written, and the first
    /// state written replaces the damaged file while the previous generation stays: a crash or an error at any
    /// point leaves either the damaged file beside the previous one (the next run falls back again) or a state
    /// that claims only proven bytes.
    ///
    /// `recheck`: treat the state as if written before a reboot (the live record is not applied, everything is
    /// checked): the disk was found not to hold what a run wrote (a completion mark whose CRC the bytes failed).
    static func reopen(
        paths: DownloadPaths, state: DownloadState, fromPrevious: Bool = false, recheck: Bool = false
    ) throws(DownloadError) -> (PartStore, ResumePoint) {
        let fd = try openLocked(paths).fd
        // The state was read before the lock; another run may have finished or restarted in between.
        let current: DownloadState?
        do throws(DownloadError) {
            current = try StateFile.read(fromPrevious ? paths.previousState : paths.state)
            // Falling back is right only while the state file is still unusable, and not of another format.
            if fromPrevious, !StateFile.isDamaged(paths.state) {
                throw DownloadError(
                    .io, "\(paths.destination) changed while it was being opened by another stitch run; run again",
                    resumable: true)
            }
        } catch {
            unlockAndClose(fd)
            throw error
        }
        // The caller may have given the state a new URL (the same download from a refreshed link); everything
        // else must be what is on disk.
        var expected = current
        expected?.url = state.url
        guard expected == state else {
            unlockAndClose(fd)
            throw DownloadError(
                .io, "\(paths.destination) changed while it was being opened by another stitch run; run again",
                resumable: true)
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let error = Errno.current
            unlockAndClose(fd)
            throw .io("cannot stat", path: paths.part, error)
        }
        let size = Int64(info.st_size)
        var state = state
        var note: String?
        let rebooted = state.bootID != BootID.current
        let liveWritten =
            !rebooted && !fromPrevious && !recheck ? LiveRecord.read(at: paths.live, nonce: state.nonce) : nil
        if rebooted, state.segments.contains(where: { $0.durable < min($0.end ?? Int64.max, size) }) {
            note = "the machine restarted since the last run; trusting only the \(state.durableBytes) bytes synced to disk"
        }
        let claimed = state.durableBytes
        var check: Proofs.Check?
        if state.segments.contains(where: { $0.durable > $0.start && $0.durable > size }) {
            note = "the part file is shorter than its state records; starting over"
            state.segments = wholeFile(state.validators)
            state.pieces = []
            state.proofs = []
        } else if rebooted || fromPrevious || recheck {
            // Nothing durable is taken on the disk's word: every recorded piece and proof is read back now, and what
            // fails or was never proven is cut below, before anything is written.
            let found = Proofs.check(state) { (start, end, crc) throws(DownloadError) in
                try Self.checksum(of: fd, from: start, to: end, continuing: crc)
            }
            check = found
            if let end = found.provenEnd, var only = state.segments.first {
                // One prefix (an unknown length): kept up to the first chunk that fails or that nothing proves.
                only.durable = max(only.start, min(only.durable, end))
                state.segments = [only]
                state.proofs = state.proofs.filter { $0.end <= only.durable }
            }
        } else {
            for index in state.segments.indices {
                var segment = state.segments[index]
                if let written = liveWritten?[index] {
                    segment.durable = max(segment.durable, min(written, segment.end ?? Int64.max, size))
                }
                state.segments[index] = segment
            }
        }
        // With an unknown length the file's end is where the data ends: cut the untrusted tail.
        if state.validators.totalLength == nil, let only = state.segments.first, state.segments.count == 1 {
            guard ftruncate(fd, off_t(only.durable)) == 0 else {
                let error = Errno.current
                unlockAndClose(fd)
                throw .io("cannot truncate", path: paths.part, error)
            }
        }
        state.bootID = BootID.current
        let trusted = state.segments.map(\.durable)
        let live: LiveRecord
        do { live = try LiveRecord(creatingAt: paths.live, nonce: state.nonce, written: trusted) } catch {
            unlockAndClose(fd)
            throw error
        }
        // From here the store owns (and closes) the descriptor. The new boot id must not be recorded before the
        // data it vouches for is durable.
        let store = PartStore(paths: paths, fd: fd, live: live, state: state)
        // Pieces are checked before the first state write: a state with this boot's id is never checked again.
        // After a fallback, the first state written (the checked one) replaces the damaged file.
        if fromPrevious { store.replacesDamagedState.store(true, ordering: .relaxed) }
        if let check { try store.invalidate(pieces: check.cut) }
        try store.checkpoint(force: true)
        let checked = store.snapshot
        return (
            store,
            ResumePoint(
                bytes: checked.durableBytes, prefix: checked.durablePrefix, note: note, rebooted: rebooted,
                damagedPieces: check?.damaged ?? [], unprovenPieces: check?.unproven ?? [],
                cutBytes: check == nil ? 0 : max(0, claimed - checked.durableBytes))
        )
    }

    /// Opens (creating) the part file and takes the download's lock, an exclusive `flock` held until ``unlock()``
    /// or the store's end, so that two runs — two processes, or two calls in one — never write one partial
    /// download. Nothing on disk is changed before the lock is held.
    private static func openLocked(_ paths: DownloadPaths) throws(DownloadError) -> (fd: Int32, empty: Bool) {
        let fd = retryingOnInterrupt { open(paths.part, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o644) }
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
            unlockAndClose(fd)
            throw DownloadError(
                .io, "\(paths.destination) changed while it was being opened by another stitch run; run again",
                resumable: true)
        }
        return (fd, opened.st_size == 0 && opened.st_blocks == 0)
    }

    /// Whether the file open as `fd` is still the one at `path`.
    private static func isStill(_ fd: Int32, at path: String) -> Bool {
        var opened = stat()
        var named = stat()
        return fstat(fd, &opened) == 0 && stat(path, &named) == 0 && opened.st_ino == named.st_ino
            && opened.st_dev == named.st_dev
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

    /// Finishes the part file an earlier run finished writing but did not rename into place (a power cut or a kill
    /// between the sync that made its completion mark durable and the rename, or before the rename's directory sync
    /// was): when its mark has a CRC, is this download's (`matching`: URL, length, validators), the file has the
    /// marked length and its bytes read back to the marked CRC32C, then `verify` (an expected digest, read from the
    /// file) is asked, the file is renamed into place, the directory synced and the sidecars removed. Returns the
    /// mark then. Returns nil, changing nothing, when there is no such part file or mark; a mark whose CRC the
    /// bytes do not match is removed (and nil returned): the ordinary resume decides what the bytes are worth.
    /// - Throws: another run holds the part file; `verify`'s error; the rename or the directory sync failed.
    static func finishMarkedPart(
        at paths: DownloadPaths, matching: (CompletionMark) -> Bool,
        verify: (_ part: String) throws(DownloadError) -> Void
    ) throws(DownloadError) -> MarkedPart {
        let fd = retryingOnInterrupt { open(paths.part, O_RDWR | O_CLOEXEC | O_NOFOLLOW) }
        guard fd >= 0 else { return .none }
        defer { unlockAndClose(fd) }
        guard let mark = CompletionMark.read(fd: fd), let expected = mark.crc32c, matching(mark) else { return .none }
        if let busy = lock(fd, paths) { throw busy }
        var opened = stat()
        var named = stat()
        guard fstat(fd, &opened) == 0, stat(paths.part, &named) == 0, opened.st_ino == named.st_ino,
            opened.st_dev == named.st_dev
        else { return .none }
        guard Int64(opened.st_size) == mark.length,
            (try? checksum(of: fd, from: 0, to: mark.length, continuing: 0)) == expected
        else {
            CompletionMark.remove(fd: fd)
            return .failedCheck(mark)
        }
        try verify(paths.part)
        guard rename(paths.part, paths.destination) == 0 else {
            throw .io("cannot rename into place", path: paths.destination, .current)
        }
        try DirectorySync.shared.sync(parentDirectory(of: paths.destination))
        for sidecar in paths.sidecars { unlink(sidecar) }
        return .finished(mark)
    }

    /// What ``finishMarkedPart(at:matching:verify:)`` found.
    enum MarkedPart {
        /// No part file, or none with this download's completion mark (with a CRC).
        case none
        /// The part file was complete: it is at the destination now.
        case finished(CompletionMark)
        /// The part file carried the mark, but its size or bytes do not match it: the disk does not hold what the
        /// run wrote. The mark is removed; nothing the state calls durable may be taken on the disk's word.
        case failedCheck(CompletionMark)
    }

    /// Removes the part file, state and live record an earlier run left at `paths` — unless a running download
    /// holds them (then throws, removing nothing).
    static func removeLeftovers(at paths: DownloadPaths) throws(DownloadError) {
        let fd = retryingOnInterrupt { open(paths.part, O_RDWR | O_CLOEXEC) }
        if fd >= 0 {
            defer { unlockAndClose(fd) }
            if let busy = lock(fd, paths) { throw busy }
            unlink(paths.part)
        }
        for sidecar in paths.sidecars { unlink(sidecar) }
    }

    /// Closes a descriptor this file may have locked, unlocking it first. A close alone does not release an `flock`
    /// while another copy of the open file description exists, and a child that another thread is spawning holds
    /// one from its fork to its exec: a run that failed after taking the lock (a live record it could not make,
    /// say) left the download "being downloaded by another stitch run" for that long, to a retry at once.
    private static func unlockAndClose(_ fd: Int32) {
        _ = flock(fd, LOCK_UN)
        close(fd)
    }

    /// Releases the lock (the run is over); the files stay as they are.
    func unlock() {
        if !unlocked.exchange(true, ordering: .acquiringAndReleasing) { _ = flock(fd, LOCK_UN) }
    }

    /// The lock was let go (``unlock()``): the close need not again.
    private let unlocked = Atomic<Bool>(false)

    /// Reserves disk blocks for the rest of the file (keeping the size, which tracks written data), so a full
    /// disk shows up before the transfer rather than in the middle, and the file system allocates once. Not for a
    /// file of at most ``smallFileLimit`` bytes.
    /// Returns `ENOSPC` when the space is not there; other failures (a file system without fallocate) are
    /// ignored.
    func preallocate(totalLength: Int64) -> Errno? {
        // A small file is written whole at once: a full disk shows up at its first write, as clearly (the sink's
        // error), and there is nothing to keep together.
        guard totalLength > Self.smallFileLimit else { return nil }
        // Blocks already allocated are left alone, so the whole range can be asked for at any time.
        if stitch_preallocate(fd, 0, totalLength) != 0, errno == ENOSPC { return .noSpace }
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

    /// Records that segment `slot` is written up to `end`: one store into the live record.
    @inline(__always)
    func noteWritten(_ slot: Int, _ end: Int64) {
        live.store(slot: slot, written: end)
    }

    /// Claims segment `slot` up to `upTo` (or its end, if that comes first) for a write about to start, and returns
    /// the segment's end (nil while it is open): the write stops there. On the transport's thread, by the segment's
    /// one writer; until its next claim no split cuts the claimed bytes.
    func claim(_ slot: Int, upTo: Int64) -> Int64? {
        claims.withLock { claims in
            let end = ends.load(slot)
            claims[slot] = min(upTo, end)
            return end == Int64.max ? nil : end
        }
    }

    /// How far segment `slot` is written (in the page cache).
    @inline(__always)
    func written(_ slot: Int) -> Int64 {
        live.load(slot: slot)
    }

    /// The segments with `durable` replaced by how far each is written: the working picture.
    var writtenSegments: [Segment] {
        state.withLock { state in
            state.segments.enumerated().map { index, segment in
                var current = segment
                current.durable = Self.written(segment, live.load(slot: index))
                return current
            }
        }
    }

    /// Bytes written over all segments.
    var writtenBytes: Int64 {
        writtenSegments.reduce(0) { $0 + ($1.durable - $1.start) }
    }

    /// Shortens segment `slot` to end at `offset` and appends a new segment `offset..<oldEnd`; returns its slot,
    /// or nil when every slot is used or the segment's writer has claimed bytes past `offset` (``claim(_:upTo:)``).
    /// Needs no durable write: until the next checkpoint the state on disk still has the longer segment, whose
    /// written extent never passes `offset`, and the new slot is beyond the state's list and so ignored — a crash
    /// only re-fetches the new segment's bytes.
    func split(_ slot: Int, at offset: Int64) -> Int? {
        state.withLock { state in
            guard state.segments.count < LiveRecord.slotCount, let end = state.segments[slot].end,
                offset > max(state.segments[slot].start, live.load(slot: slot)), offset < end
            else { return nil }
            let newSlot = state.segments.count
            let cut = claims.withLock { claims in
                guard claims[slot] <= offset else { return false }
                claims[newSlot] = offset
                ends.store(newSlot, end)
                ends.store(slot, offset)
                return true
            }
            guard cut else { return nil }
            state.segments[slot].end = offset
            state.segments.append(Segment(start: offset, end: end, durable: offset))
            live.store(slot: newSlot, written: offset)
            return newSlot
        }
    }

    /// How far `segment` is written given its live slot: never below what is durable, never past its end (a
    /// writer's claim keeps it inside its segment; the bound stays as a second line of defence).
    private static func written(_ segment: Segment, _ slot: Int64) -> Int64 {
        min(max(segment.durable, slot), segment.end ?? Int64.max)
    }

    /// Where segment `slot` begins.
    func segmentStart(_ slot: Int) -> Int64 {
        state.withLock { $0.segments[slot].start }
    }

    /// The current end of segment `slot` (it shrinks when another connection takes part of it).
    func end(_ slot: Int) -> Int64? {
        let end = ends.load(slot)
        return end == Int64.max ? nil : end
    }

    /// The piece size of the current state.
    var pieceSize: Int64 { state.withLock { $0.pieceSize } }

    /// True once a sync or state write has failed: writers must stop.
    var isBroken: Bool { broken.load(ordering: .relaxed) }

    // MARK: Durable steps

    /// Makes everything written so far durable: `fdatasync` the data, then atomically replace the state
    /// with the new durable extents (temp, fsync, rename, fsync directory).
    func checkpoint(force: Bool = false) throws(DownloadError) {
        try durableSteps.withLock { _ throws(DownloadError) in
            try checkUsable()
            // What is written now, read under the state lock (a split may come at any moment after it: it cuts a
            // segment only past what its writer has claimed, so each extent read here stays inside its segment).
            let (current, written) = state.withLock { state in
                (state, state.segments.indices.map { live.load(slot: $0) })
            }
            var next = current
            for index in next.segments.indices {
                next.segments[index].durable = Self.written(next.segments[index], written[index])
            }
            // A piece's checksum is recorded once all of its bytes are in this checkpoint; the other durable bytes
            // are proven (the new bytes of pieces not yet complete are read back, from the page cache).
            try prove(&next, from: current)
            if next == current && !force { return }
            beforeCheckpointSync.withLock { $0 }?()
            guard syncData(fd) == 0 else {
                let error = Errno.current
                broken.store(true, ordering: .releasing)
                // Linux reports a failed writeback to one sync only: nothing written may be vouched for any more.
                live.invalidate()
                throw .io("cannot sync", path: paths.part, error)
            }
            // The in-memory state changes only once the file says the same.
            next.updatedAt = now()
            try writeState(next)
            Self.dropFromCache(
                fd, from: current.segments, to: next.segments, keepingBelow: cacheKeptBelow.load(ordering: .relaxed))
            let taken = state.withLock { state in
                // Splits made meanwhile only moved ends and added segments (kept: the next checkpoint writes them;
                // until then the file's longer segments say no more than was written); the rest is what was written.
                var taken = next
                taken.segments = state.segments
                for index in next.segments.indices { taken.segments[index].durable = next.segments[index].durable }
                state = taken
                return taken
            }
            durable.store(taken.durableBytes, ordering: .releasing)
            forgetRecordedPieces(next)
        }
    }

    /// Drops the pending checksums of pieces `state` records.
    private func forgetRecordedPieces(_ state: DownloadState) {
        pendingPieces.withLock { pending in
            for piece in pending.keys where piece < state.pieces.count && state.pieces[piece] != nil {
                pending[piece] = nil
            }
        }
    }

    /// Drops the ranges a checkpoint just made durable from the page cache, beyond the file's first
    /// `keepingBelow` bytes. They are clean now (synced), so this only frees their pages: a download larger than
    /// the page cache then neither makes the kernel reclaim under pressure on the receive path nor evicts the
    /// rest of the machine's cache. Advice only: the kernel skips dirty, locked and under-writeback pages, and a
    /// failure changes nothing, so what a crash or a power cut leaves is as before. Whatever reads the part file
    /// back (overlap checks at steal points, piece checksums, a resume's checksum prefix, and the final digest of
    /// a segmented download with `--checksum`, which re-reads the whole file) reads dropped pages from the disk:
    /// the same bytes, more slowly.
    ///
    /// The first GiB stays cached (``cacheKeptBelow``): a file that size is cheap to keep and often opened right
    /// away, and freeing its pages cost 12–18 % more CPU at 1 GiB (bench/large.sh) for no gain in speed. At 5 GiB
    /// dropping the rest made the download 2.4× faster at half the CPU on this project's VM (bench/README.md,
    /// with its caveats).
    ///
    /// The kernel drops only whole folios, which on ext4 and XFS with 4 KiB pages are up to 2 MiB: the folio
    /// holding the previous checkpoint's end was partly outside that range, so each range starts 2 MiB-aligned
    /// below it (those bytes are durable since the previous checkpoint), within the segment. (With 16 or 64 KiB
    /// pages folios can be larger, and some pages stay cached: slower, never wrong.)
    static func dropFromCache(_ fd: Int32, from before: [Segment], to after: [Segment], keepingBelow kept: Int64) {
        let folio: Int64 = 2 << 20
        // `after` is `before` with durable ends moved (one step under `durableSteps` made both), so they pair by
        // index.
        for (old, new) in zip(before, after) where new.durable > old.durable {
            let start = max(kept, old.start, old.durable / folio * folio)
            guard new.durable > start else { continue }
            #if os(Linux)
            _ = posix_fadvise(fd, off_t(start), off_t(new.durable - start), POSIX_FADV_DONTNEED)
            #endif
        }
    }

    /// Bytes at the start of the file whose pages checkpoints leave in the page cache (``dropFromCache``);
    /// changeable for tests.
    let cacheKeptBelow = Atomic<Int64>(1 << 30)

    /// A writer finished piece `index` with checksum `crc` (recorded at the checkpoint that makes it durable).
    func notePiece(_ index: Int, crc: UInt32) {
        pendingPieces.withLock { $0[index] = crc }
    }

    /// Reads back every recorded piece and every proof of the current state and compares them with the bytes
    /// (``Proofs/check(_:read:)``): what ``Downloader/verify(at:)`` reports and cuts.
    func check() -> Proofs.Check {
        let snapshot = self.snapshot
        return Proofs.check(snapshot) { (start, end, crc) throws(DownloadError) in
            try Self.checksum(of: fd, from: start, to: end, continuing: crc)
        }
    }

    /// CRC32C of `start..<end` of the part file, read in chunks of up to 1 MiB (memory stays flat for any piece
    /// size); nil if the file is shorter.
    func checksum(from start: Int64, to end: Int64) -> UInt32? {
        try? Self.checksum(of: fd, from: start, to: end, continuing: 0)
    }

    /// `crc` continued over `start..<end` of the file `fd`; throws when the file is shorter or cannot be read.
    static func checksum(of fd: Int32, from start: Int64, to end: Int64, continuing crc: UInt32) throws(DownloadError)
        -> UInt32
    {
        guard end > start else { return crc }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(min(end - start, 1 << 20)), alignment: 16)
        defer { buffer.deallocate() }
        var crc = CRC32C(value: crc)
        var at = start
        while at < end {
            let count = Int(min(Int64(buffer.count), end - at))
            var done = 0
            while done < count {
                let n = retryingOnInterrupt {
                    pread(fd, buffer.baseAddress! + done, count - done, off_t(at) + off_t(done))
                }
                if n < 0 { throw DownloadError(.io, "cannot read back the saved bytes: \(Errno.current)", resumable: true) }
                if n == 0 {
                    throw DownloadError(
                        .io, "the part file ends at \(at + Int64(done)), before the \(end) bytes saved in it",
                        resumable: true)
                }
                done += n
            }
            crc.update(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
            at += Int64(count)
        }
        return crc.value
    }

    /// Brings `next`'s piece checksums and proofs up to date (``Proofs/update(_:previous:pending:read:)``), from the
    /// proofs of `current` (less those in `cut` pieces), the writers' pending checksums and the part file. Returns
    /// the pieces whose pending checksum it recorded. Call under `durableSteps` (`current` is then the state
    /// whatever splits do meanwhile: they change no piece and no proof).
    @discardableResult
    private func prove(_ next: inout DownloadState, from current: DownloadState, cut: Set<Int> = []) throws(DownloadError)
        -> [Int]
    {
        var pending = pendingPieces.withLock { $0 }
        var previous = current.proofs
        if !cut.isEmpty {
            for piece in cut { pending[piece] = nil }
            previous.removeAll { cut.contains(Int($0.start / current.pieceSize)) }
        }
        let fd = self.fd
        return try Proofs.update(&next, previous: previous, pending: pending) { (start, end, crc) throws(DownloadError) in
            try Self.checksum(of: fd, from: start, to: end, continuing: crc)
        }
    }

    /// Marks pieces as not downloaded, so that only they are fetched again: the segment list is rebuilt (durable
    /// bytes outside the pieces stay), their checksums and proofs dropped, and a new nonce voids the live record's
    /// slots. With an unknown length (one prefix) the download is cut at the first of them.
    func invalidate(pieces damaged: [Int]) throws(DownloadError) {
        guard !damaged.isEmpty else { return }
        try durableStep { (state: inout DownloadState) throws(DownloadError) in
            try checkUsable()
            guard let total = state.validators.totalLength else {
                try cutPrefix(&state, at: Int64(damaged.min()!) * state.pieceSize)
                return
            }
            var done: [(Int64, Int64)] = state.segments.enumerated().map { index, segment in
                (segment.start, Self.written(segment, live.load(slot: index)))
            }.filter { $0.0 < $0.1 }
            for piece in damaged {
                let cutStart = Int64(piece) * state.pieceSize
                let cutEnd = min(cutStart + state.pieceSize, total)
                done = done.flatMap { interval -> [(Int64, Int64)] in
                    guard interval.0 < cutEnd, cutStart < interval.1 else { return [interval] }
                    return [(interval.0, cutStart), (cutEnd, interval.1)].filter { $0.0 < $0.1 }
                }
            }
            done.sort { $0.0 < $1.0 }
            // Each done interval becomes a segment that also owns the gap after it (still to fetch).
            var segments: [Segment] = []
            if let first = done.first, first.0 > 0 { segments.append(Segment(start: 0, end: first.0, durable: 0)) }
            if done.isEmpty { segments.append(Segment(start: 0, end: total, durable: 0)) }
            for (index, interval) in done.enumerated() {
                let end = index + 1 < done.count ? done[index + 1].0 : total
                segments.append(Segment(start: interval.0, end: end, durable: interval.1))
            }
            guard segments.count <= LiveRecord.slotCount else {
                throw DownloadError(
                    .unusableState, "too many damaged pieces to repair in place", remedy: .overwrite(.startOver))
            }
            var next = state
            next.segments = segments
            for piece in damaged where piece < next.pieces.count { next.pieces[piece] = nil }
            next.liveNonce = Self.newNonce()
            next.updatedAt = now()
            // The kept bytes proven (those only written so far read back); nothing of the cut pieces is reused.
            try prove(&next, from: state, cut: Set(damaged))
            // Durable data first: the kept bytes may have been only written, not yet synced.
            guard syncData(fd) == 0 else {
                broken.store(true, ordering: .releasing)
                throw .io("cannot sync", path: paths.part, .current)
            }
            try writeState(next)
            state = next
            resetLive(nonce: next.nonce, written: segments.map(\.durable))
            publishEnds(next.segments)
            pendingPieces.withLock { pending in
                for piece in damaged { pending[piece] = nil }
            }
            forgetRecordedPieces(next)
            durable.store(next.durableBytes, ordering: .releasing)
        }
    }

    /// Cuts the one segment of a download of unknown length at `offset` (when it is written past it): the bytes from
    /// there are fetched again, and the file is cut there (its end is where the data ends). Call with the state
    /// lock held.
    private func cutPrefix(_ state: inout DownloadState, at offset: Int64) throws(DownloadError) {
        guard let only = state.segments.first, state.segments.count == 1 else { return }
        let written = Self.written(only, live.load(slot: 0))
        let kept = max(only.start, offset)
        guard kept < written else { return }
        var next = state
        next.segments[0].durable = kept
        next.proofs.removeAll { $0.end > kept }
        next.liveNonce = Self.newNonce()
        next.updatedAt = now()
        var current = state
        current.proofs = next.proofs
        try prove(&next, from: current)
        // Durable data first: the kept bytes may have been only written, not yet synced.
        guard syncData(fd) == 0 else {
            broken.store(true, ordering: .releasing)
            throw .io("cannot sync", path: paths.part, .current)
        }
        try writeState(next)
        state = next
        resetLive(nonce: next.nonce, written: [kept])
        durable.store(next.durableBytes, ordering: .releasing)
        guard ftruncate(fd, off_t(kept)) == 0 else {
            broken.store(true, ordering: .releasing)
            throw .io("cannot truncate", path: paths.part, .current)
        }
    }

    /// Replaces the state file with `next` (atomically) and notes that there is one to remove at the end.
    /// `.keep` (the state being replaced describes the same bytes: a checkpoint, or a repair of them) unless this
    /// store was rebuilt from the previous generation and has not written yet (`.leave`: the file on disk is the
    /// damaged one).
    private func writeState(_ next: DownloadState, generation: StateFile.PreviousGeneration = .keep) throws(DownloadError) {
        try removeLeftoversBeforeTheFirstState()
        let generation = replacesDamagedState.load(ordering: .relaxed) ? .leave : generation
        try StateFile.write(next, to: paths.state, previous: paths.previousState, generation: generation)
        replacesDamagedState.store(false, ordering: .relaxed)
        stateOnDisk.store(true, ordering: .relaxed)
    }

    /// For a store ``create`` made at a vacant path without looking for leftovers: before its first state write,
    /// what an earlier run left beside the part file (a previous generation, a temporary, a link, a live record)
    /// is removed, and the removal made durable before the state is written, so that no power cut can pair this
    /// state with another download's previous generation.
    private func removeLeftoversBeforeTheFirstState() throws(DownloadError) {
        guard leftoversUnchecked.load(ordering: .relaxed) else { return }
        for stale in paths.sidecars where stale != paths.state && access(stale, F_OK) == 0 {
            unlink(stale)
            leftoversRemoved.store(true, ordering: .relaxed)
        }
        // Cleared only once the removal is durable: after a failed sync the next state write syncs again (the
        // files are gone by then, the sync still owed).
        if leftoversRemoved.load(ordering: .relaxed) { try syncDirectory(containing: paths.state) }
        leftoversUnchecked.store(false, ordering: .relaxed)
    }

    /// Set by ``create`` at a vacant path until ``removeLeftoversBeforeTheFirstState()`` has run. Only read and
    /// written under `durableSteps` (or before the store is shared).
    private let leftoversUnchecked = Atomic<Bool>(false)
    /// Leftovers were removed and the folder's sync is owed (as ``leftoversUnchecked``).
    private let leftoversRemoved = Atomic<Bool>(false)

    /// Set by a fallback `reopen` until the first state write replaces the damaged file. Only read and written under
    /// `durableSteps` (or before the store is shared): an atomic only so that the class is checked `Sendable`.
    private let replacesDamagedState = Atomic<Bool>(false)

    /// Whether this store has a state file on disk (a small download has none until its first checkpoint).
    private let stateOnDisk = Atomic<Bool>(true)

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
        try durableStep { (state: inout DownloadState) throws(DownloadError) in
            try checkUsable()
            var next = state
            next.validators = validators
            next.segments = Self.wholeFile(validators)
            next.pieceSize = PieceLayout.pieceSize(forTotal: validators.totalLength)
            next.pieces = []
            next.proofs = []
            next.schemaVersion = DownloadState.currentSchemaVersion
            // An adopted partial's bytes are gone: the download now replaces the file it began from.
            next.adoption?.kept = false
            pendingPieces.withLock { $0.removeAll() }
            next.liveNonce = Self.newNonce()
            next.updatedAt = now()
            do throws(DownloadError) {
                try writeState(next, generation: .remove)
            } catch {
                // The file may hold either generation now; memory must not pair new validators with old bytes.
                broken.store(true, ordering: .releasing)
                throw error
            }
            state = next
            durable.store(0, ordering: .releasing)
            resetLive(nonce: next.nonce, written: [0])
            publishEnds(next.segments)
            guard ftruncate(fd, 0) == 0 else {
                broken.store(true, ordering: .releasing)
                throw .io("cannot truncate", path: paths.part, .current)
            }
        }
    }

    /// Records validators learnt from a later response (e.g. after a restart, or the length from a
    /// `Content-Range`) durably at once, so bytes the live record vouches for are never paired with validators
    /// that were only in memory. A length learnt for the single open segment closes it.
    func update(validators: Validators) throws(DownloadError) {
        try durableStep { (state: inout DownloadState) throws(DownloadError) in
            try checkUsable()
            guard state.validators != validators else { return }
            var next = state
            next.validators = validators
            var relaid = false
            if let total = validators.totalLength, next.segments.count == 1, next.segments[0].end == nil {
                next.segments[0].end = total
                next.pieceSize = PieceLayout.pieceSize(forTotal: total)
            } else if validators.totalLength != state.validators.totalLength {
                // Another length (only reachable when nothing was kept): lay the file out anew, so the segments
                // tile the new length; a new nonce voids the old slots.
                next.segments = Self.wholeFile(validators)
                next.pieceSize = PieceLayout.pieceSize(forTotal: validators.totalLength)
                next.pieces = []
                next.proofs = []
                next.liveNonce = Self.newNonce()
                relaid = true
            }
            next.updatedAt = now()
            if relaid {
                next.schemaVersion = DownloadState.currentSchemaVersion
            } else {
                // A length learnt: the proofs of the chunks join into the pieces' (nothing is read again).
                try prove(&next, from: state)
            }
            try writeState(next, generation: relaid ? .remove : .keep)
            state = next
            forgetRecordedPieces(next)
            if relaid {
                resetLive(nonce: next.nonce, written: next.segments.map(\.durable))
                pendingPieces.withLock { $0.removeAll() }
                durable.store(next.durableBytes, ordering: .releasing)
            }
            publishEnds(next.segments)
        }
    }

    /// The holes (never-written or freed ranges) within `0..<length` of the part file: where data the run wrote was
    /// lost because another program truncated the file under it. Empty where the file system cannot say.
    func holes(before length: Int64) -> [Range<Int64>] { fileHoles(fd, before: length) }

    /// Completes the download: sync the data, mark it, rename it into place, sync the directory, then
    /// remove the state and live record. `durableCleanup`: the removals are synced too (one more sync of the folder),
    /// for a caller that forgets the download durably right after (the background driver removes its record: without
    /// this sync a power cut left the sidecar files with no record to clean them up, PowerCutTests).
    func finish(url: String, length: Int64, durableCleanup: Bool = false) throws(DownloadError) {
        try durableStep { (state: inout DownloadState) throws(DownloadError) in
            try markAndRename(&state, url: url, length: length)
            try DirectorySync.shared.sync(parentDirectory(of: paths.destination))
            unlinkSidecarsOfTheFinishedFile()
            if durableCleanup { try? syncDirectory(containing: paths.destination) }
        }
    }

    /// ``finish(url:length:durableCleanup:)`` up to the rename, for a caller that makes the rename durable itself
    /// (``DirectorySync/suspendingSync(_:)``, holding no thread while it waits) and then, if this returns true, calls
    /// ``removeSidecarsOfTheFinishedFile()`` (a state file or a live record is on disk), in that order.
    func markAndRename(url: String, length: Int64) throws(DownloadError) -> Bool {
        try durableStep { (state: inout DownloadState) throws(DownloadError) in
            try markAndRename(&state, url: url, length: length)
            return stateOnDisk.load(ordering: .relaxed) || live.isFileBacked
        }
    }

    /// Removes the state file and the live record of a file renamed into place, once the rename is durable.
    func removeSidecarsOfTheFinishedFile() {
        durableStep { _ in unlinkSidecarsOfTheFinishedFile() }
    }

    private func unlinkSidecarsOfTheFinishedFile() {
        // Unlinking a name that is not there still takes the directory's lock: skip what a small download never
        // created. In `sidecars`' order, the state file last: a cut that keeps only some of these removals leaves the
        // state beside whatever remains, and the rerun removes it all.
        for sidecar in paths.sidecars {
            if sidecar == paths.live ? live.isFileBacked : stateOnDisk.load(ordering: .relaxed) { unlink(sidecar) }
        }
    }

    /// Truncates, marks, syncs and renames the part file into place (the rename not yet durable).
    private func markAndRename(_ state: inout DownloadState, url: String, length: Int64) throws(DownloadError) {
        try checkUsable()
        // The file ends where the data ends (a preallocation past it, or an untrusted tail, is cut). A small file
        // (never preallocated) whose size is already its length has nothing to cut: no truncate, which ext4 runs in
        // full even to the same size (the inode's block reservations discarded, the inode dirtied again).
        var size = stat()
        let endsThere = length <= Self.smallFileLimit && fstat(fd, &size) == 0 && Int64(size.st_size) == length
        guard endsThere || ftruncate(fd, off_t(length)) == 0 else {
            broken.store(true, ordering: .releasing)
            throw .io("cannot truncate", path: paths.part, .current)
        }
        // The whole file's CRC32C, from the piece checksums and proofs known (joined without the data) and the
        // bytes none covers, read back (mostly pieces shared between connections, from the page cache).
        var known = state.validators.totalLength == length ? pendingPieces.withLock { $0 } : [:]
        if state.validators.totalLength == length {
            for (piece, crc) in state.pieces.enumerated() { if let crc { known[piece] = crc } }
        }
        let fd = self.fd
        let crc = try Proofs.wholeFile(
            length: length, pieceSize: state.pieceSize, pieces: known, ranges: state.proofs
        ) { (start, end, crc) throws(DownloadError) in
            try Self.checksum(of: fd, from: start, to: end, continuing: crc)
        }
        CompletionMark(
            url: url, length: length, etag: state.validators.etag, lastModified: state.validators.lastModified,
            crc32c: crc
        ).write(fd: fd)
        // fsync, not fdatasync: the mark (metadata) must be as durable as the data it describes.
        guard syncFile(fd) == 0 else {
            let error = Errno.current
            broken.store(true, ordering: .releasing)
            // The sync failed: the page cache may read back what the disk does not hold, so no later run may
            // take the mark's word that the file is complete.
            CompletionMark.remove(fd: fd)
            throw .io("cannot sync", path: paths.part, error)
        }
        var info = stat()
        if fstat(fd, &info) == 0, info.st_nlink == 0 {
            throw DownloadError(
                .io, "\(paths.part) was deleted while downloading", resumable: true, remedy: .rerun(.downloadAgain))
        }
        guard rename(paths.part, paths.destination) == 0 else {
            throw .io("cannot rename into place", path: paths.destination, .current)
        }
    }

    /// Removes the part file, state and live record.
    func discard() {
        durableStep { _ in
            unlink(paths.part)
            for sidecar in paths.sidecars { unlink(sidecar) }
        }
    }

    static func newNonce() -> String {
        String(UInt64.random(in: 1...UInt64.max), radix: 16)
    }
}

func now() -> Int64 { Int64(time(nil)) }

/// The holes of the open file `fd` below `length` (`SEEK_HOLE`/`SEEK_DATA`; none where the file system cannot say).
func fileHoles(_ fd: Int32, before length: Int64) -> [Range<Int64>] {
    var found: [Range<Int64>] = []
    var at: Int64 = 0
    while at < length {
        let hole = Int64(lseek(fd, off_t(at), seekHole))
        guard hole >= 0, hole < length else { break }
        let data = Int64(lseek(fd, off_t(hole), seekData))
        let end = data > hole ? min(data, length) : length
        found.append(hole..<end)
        at = end
    }
    return found
}
