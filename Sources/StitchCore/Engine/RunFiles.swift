import Foundation
import Synchronization
import StitchLocks

/// The part file of one run and what the run knows of it: the store once there is one, its checkpointer, the
/// validators the bytes came with, the running digest, where a resume started and what `--adopt` found. Every
/// step that touches the disk is here: finding what an earlier run left, creating the store, restarting from
/// zero, checkpoints, the finish. It decides nothing (the state machine and ``FinishPolicy`` do); the run's
/// executor (``DownloadRun``) calls it, and the head decisions (``LaneRequest``) on the decision pool.
///
/// The facts are behind one lock, taken only to read or set them: never through a sync (the store has its own
/// locks), never with the state machine's lock held.
final class RunFiles: Sendable {
    struct Facts: Sendable {
        var store: PartStore?
        var checkpointer: Checkpointer?
        /// The validators the kept bytes came with.
        var known: Validators?
        var resumedFrom: Int64 = 0
        /// What `--adopt` found at the destination (this run, or the run whose state this one continues).
        var adoption: AdoptionRecord?
        /// The running digest did not see the bytes in order (several connections): hash the file at the end.
        var hashFromDisk = false
        /// The store's files were renamed into place or deleted: nothing may be written for it after.
        var closed = false
        /// With ``DownloadRequest/ifNewer``: the file at the destination, asked about until a store is created.
        var condition: Reopening.Unchanged?
        /// Restarts for a 206 whose bytes did not match its `Content-Digest`.
        var partMismatches = 0
        /// Mirrors the first response advertised (``DownloadRequest/useAdvertisedMirrors``).
        var advertisedMirrors: [URL] = []
    }

    private let facts = Locked(Facts())
    private let context: RunContext
    private let reporter: RunReporter
    /// The digest of ``DownloadRequest/checksum``, fed in order while one connection writes from byte 0.
    private let hasher: RunningDigest

    init(context: RunContext, reporter: RunReporter) {
        self.context = context
        self.reporter = reporter
        hasher = RunningDigest(context.request.checksum.map { [$0.algorithm] } ?? [])
    }

    var store: PartStore? { facts.withLock { $0.store } }
    var known: Validators? {
        get { facts.withLock { $0.known } }
        set {
            facts.withLock { $0.known = newValue }
            followAnnounced(newValue)
        }
    }
    var adoption: AdoptionRecord? {
        get { facts.withLock { $0.adoption } }
        set { facts.withLock { $0.adoption = newValue } }
    }
    var checkpointError: DownloadError? { facts.withLock { $0.checkpointer?.error } }
    var checkpointer: Checkpointer? { facts.withLock { $0.checkpointer } }

    /// The digest that sees every byte in order from 0, unless the bytes came over several connections.
    var runningDigest: RunningDigest? { facts.withLock { $0.hashFromDisk } || hasher.isEmpty ? nil : hasher }

    /// The validators the bytes come with from now on, for the digests: the one the server announced is followed
    /// while the bytes come in, when none has been hashed yet (else it is read from the file at the end).
    private func followAnnounced(_ validators: Validators?, fromZero: Bool? = nil) {
        guard let announced = validators?.digest, let algorithm = ChecksumAlgorithm(name: announced.algorithm) else {
            return
        }
        // Only a digest that will see every byte from the first: with bytes already in the file and none of them
        // fed (a resume that hashed no prefix), it is read from the file at the end instead.
        guard fromZero ?? ((store?.writtenBytes ?? 0) == 0) else { return }
        hasher.follow(algorithm)
    }

    /// From now on the bytes come over several connections: the digest is the file's, read at the end.
    func hashFromDisk() { facts.withLock { $0.hashFromDisk = true } }

    /// What the part file holds, for the state machine.
    var machineFacts: DownloadStateMachine.Store? {
        let (store, known) = facts.withLock { ($0.store, $0.known) }
        return store.map {
            .init(segments: $0.snapshot.segments.count, written: $0.written(0), canCheckRanges: known?.ifRange != nil)
        }
    }

    // MARK: Opening

    /// ``openExisting(_:)`` for a closure on the blocking pool, which throws only ``DownloadError``: any other error
    /// is reported as `.io`.
    func openExistingOnThePool(_ paths: DownloadPaths) throws(DownloadError) -> DownloadResult? {
        do { return try openExisting(paths) } catch let error as DownloadError { throw error } catch {
            throw DownloadError(.io, "\(error)")
        }
    }

    /// Looks at what an earlier run left at `paths` (``Reopening``) and takes a partial to resume. Returns a result
    /// if the file is already complete. On the blocking pool.
    func openExisting(_ paths: DownloadPaths) throws -> DownloadResult? {
        let found = try Reopening(request: context.request, adoption: adoption, emit: { [reporter] in reporter.emit($0) })
            .open(paths)
        switch found {
        case .nothing(let kept, let condition):
            facts.withLock {
                if $0.adoption == nil { $0.adoption = kept }
                $0.condition = condition
            }
            return nil
        case .complete(let done):
            return done
        case .resume(let resumed):
            let store = resumed.store
            let split = store.snapshot.segments.count > 1
            facts.withLock {
                $0.store = store
                $0.adoption = resumed.adoption
                $0.known = resumed.known
                $0.resumedFrom = resumed.point.bytes
                if split { $0.hashFromDisk = true }
            }
            // The prefix is hashed from byte 0 below (one connection); split, the digest is read at the end.
            followAnnounced(resumed.known ?? store.snapshot.validators, fromZero: !split)
            reporter.position.store(resumed.point.bytes, ordering: .relaxed)
            if let total = resumed.total { reporter.announce(total: total) }
            if !split { try hashPrefix(store, upTo: resumed.point.prefix) }
            startCheckpointer(store)
            reporter.emit(.destinationResolved(paths.destination))
            reporter.emit(.resuming(from: resumed.point.bytes, note: resumed.point.note))
            return nil
        }
    }

    /// Mirrors the first response advertised (`Link: rel=duplicate`), checked URLs.
    var advertisedMirrors: [URL] {
        get { facts.withLock { $0.advertisedMirrors } }
        set { facts.withLock { $0.advertisedMirrors = newValue } }
    }

    /// Whether a 206's `Content-Digest` is checked against its bytes: until it failed twice in this run (a server
    /// that labels another digest so would restart the download forever).
    var checksParts: Bool { facts.withLock { $0.partMismatches < 2 } }

    /// The condition of the next request for the whole file: the destination's, until a response is taken.
    var condition: FreshnessCondition? { facts.withLock { $0.store == nil ? $0.condition?.condition : nil } }

    /// The result when the server showed the file at the destination to be its own (`why`); nil without a
    /// condition. The file is not touched.
    func unchanged(_ why: String) -> DownloadResult? {
        guard let found = facts.withLock({ $0.store == nil ? $0.condition : nil }) else { return nil }
        reporter.emit(.destinationResolved(found.result.destination))
        reporter.emit(.notice("\(found.result.destination) is up to date (\(why)); left as it is"))
        return found.result
    }

    /// Hashes the bytes already on disk once, so the running digest covers the whole file.
    private func hashPrefix(_ store: PartStore, upTo end: Int64) throws {
        guard !hasher.isEmpty, end > 0 else { return }
        hasher.reset()
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { chunk.deallocate() }
        var at: Int64 = 0
        while at < end {
            let want = Int(min(Int64(chunk.count), end - at))
            let got = store.read(into: UnsafeMutableRawBufferPointer(rebasing: chunk[0..<want]), at: at)
            guard got == want else { throw DownloadError(.io, "cannot read \(store.paths.part) to verify it") }
            hasher.update(UnsafeRawBufferPointer(rebasing: chunk[0..<got]))
            at += Int64(got)
        }
    }

    /// Creates the part file and state at `path` for a response with `validators`. On the decision pool. `vacant`:
    /// the path choice just found nothing there (``PathChoice/vacant``).
    func create(at path: String, validators: Validators, vacant: Bool = false) throws {
        let request = context.request
        // Under ifNewer with a file at the destination, this partial is the newer file that replaces it.
        let replaces = facts.withLock { $0.condition != nil }
        let store = try PartStore.create(
            paths: DownloadPaths(destination: path), url: request.url,
            headers: request.headers.map { "\($0.name): \($0.value)" },
            checksum: request.checksum?.description, validators: validators, adoption: adoption,
            replacesDestination: replaces, vacant: vacant)
        facts.withLock { $0.store = store }
        startCheckpointer(store)
        reporter.emit(.destinationResolved(path))
    }

    private func startCheckpointer(_ store: PartStore) {
        let checkpointer = Checkpointer(
            store: store, interval: context.options.checkpointInterval, clock: context.clock)
        facts.withLock { $0.checkpointer = checkpointer }
        reporter.counters.resetCheckpointCount()
        reporter.opened(store)
    }

    /// A response added to (or changed) the validators of the bytes kept: saved before its body is written.
    func update(validators: Validators) throws(DownloadError) {
        if let store, validators != known { try store.update(validators: validators) }
        known = validators
    }

    // MARK: Restarts and checkpoints

    /// Discards what is kept for a restart from zero (counted by the state machine), says why, and keeps
    /// `validators` for the file from now on (none: not known until the next response).
    func restart(_ reason: RestartReason, validators: Validators?) throws(DownloadError) {
        reporter.emit(.restarting(reason))
        if case .partDigestMismatch = reason {
            let count = facts.withLock {
                $0.partMismatches += 1
                return $0.partMismatches
            }
            if count == 2 {
                reporter.emit(
                    .notice(
                        "the server's Content-Digest of partial responses failed twice: it does not describe their "
                            + "bytes (some servers send the whole file's); not checked from now on"))
            }
        }
        let store = facts.withLock {
            $0.resumedFrom = 0  // nothing kept: the result must not report a resume
            return $0.store
        }
        try store?.restart(validators: validators ?? .none)
        known = validators
        hasher.reset()
        followAnnounced(validators, fromZero: true)
        reporter.position.store(0, ordering: .relaxed)
        reporter.counters.resetCheckpointCount()
    }

    /// A durable checkpoint now (a retry's pause is a good moment), on the blocking pool: it syncs, and many
    /// downloads retrying at once must not hold the few cooperative threads.
    func checkpointOffPool() async {
        guard let store = facts.withLock({ $0.closed ? nil : $0.store }) else { return }
        _ = try? await offloaded { () throws(DownloadError) in try store.checkpoint() }
    }

    /// Saves the state durably and describes the interruption.
    func interrupted() -> DownloadError {
        let (store, checkpointer) = facts.withLock { ($0.store, $0.checkpointer) }
        checkpointer?.stop()
        // A failed last checkpoint still leaves the earlier ones and the live record: report the interruption.
        try? store?.checkpoint()
        let saved = store?.durable.load(ordering: .acquiring) ?? 0
        return DownloadError(
            .cancelled, "interrupted; \(saved) bytes saved", resumable: store != nil,
            remedy: store != nil ? .rerun(.resume) : nil)
    }

    /// The run is over, whatever the outcome: no more timed checkpoints, one last one for a partial that stays (an
    /// error that is not retried, a pause), and the next run may take the files. That checkpoint syncs: on the
    /// blocking pool, never a cooperative thread (which every download and the caller's tasks share).
    func endRun() async {
        let (store, checkpointer, closed) = facts.withLock { ($0.store, $0.checkpointer, $0.closed) }
        guard !closed, let store else {
            checkpointer?.stop()
            store?.unlock()
            return
        }
        _ = try? await offloaded { () throws(DownloadError) in
            checkpointer?.stop()
            try? store.checkpoint()
            store.unlock()
        }
    }

    // MARK: The finish

    /// Stops the checkpoints before the finish (waiting for one in progress: off the cooperative threads when one
    /// runs; most small downloads end with none running, and need no other thread for it).
    func stopCheckpoints() async throws {
        if let checkpointer, !checkpointer.stopIfIdle() {
            try await offloaded { () throws(DownloadError) in checkpointer.stop() }
        }
    }

    /// Verifies every byte is there (and the checksum), syncs and renames the file into place; or does what
    /// ``FinishPolicy`` says with a part file that may not be, and throws why.
    func finish() async throws -> DownloadResult {
        let (store, known, adoption, hashFromDisk, resumedFrom) = facts.withLock {
            ($0.store, $0.known, $0.adoption, $0.hashFromDisk, $0.resumedFrom)
        }
        guard let store else { throw DownloadError(.protocolViolation, "no response body") }
        let request = context.request
        let bytes = store.writtenBytes
        // Every byte was written, so the file has no hole: one means another program cut the file under the run
        // (FinishPolicy). One lseek, once the length is right: metadata only, cheap enough for a cooperative thread.
        if let refusal = FinishPolicy.written(
            bytes: bytes, announced: known?.totalLength, stateLength: store.snapshot.validators.totalLength,
            holes: { store.holes(before: bytes) }, pieceSize: store.pieceSize, paths: store.paths)
        {
            try await dispose(store, refusal)
        }
        // The digest of every byte in `algorithm`: the running one when it saw them all in order, else read from
        // the file on the blocking pool (several connections wrote out of order, or the server announced it late).
        let hasher = self.hasher
        func digest(_ algorithm: ChecksumAlgorithm) async throws -> [UInt8] {
            if !hashFromDisk, let running = hasher.finalize(algorithm) { return running }
            return try await offloaded { () throws(DownloadError) in
                try FileOperations.digest(ofFileAt: store.paths.part, algorithm, length: bytes)
            }
        }
        var verified: ExpectedChecksum?
        var computed: [UInt8]?
        if let expected = request.checksum {
            let found = try await digest(expected.algorithm)
            computed = found
            if let refusal = FinishPolicy.digest(
                found, expected: expected, adoptedKept: store.snapshot.adoption?.kept == true,
                overwrite: request.overwrite, paths: store.paths)
            {
                try await dispose(store, refusal)
            }
            verified = expected
        }
        // The digest the server announced for the whole file, checked as a checksum asked for would be.
        var announcedVerified: (field: String, digest: ExpectedChecksum)?
        if let announced = known?.digest ?? store.snapshot.validators.digest,
            let expected = try? ExpectedChecksum(parsing: announced.text)
        {
            let found = try await expected.algorithm == request.checksum?.algorithm ? computed! : digest(expected.algorithm)
            if let refusal = FinishPolicy.announced(
                found, expected: expected, field: announced.field, overwrite: request.overwrite, paths: store.paths)
            {
                // The checksum the caller gave proved every byte: the server's digest is what is wrong (the result
                // names no server digest).
                guard verified != nil else { try await dispose(store, refusal) }
            } else {
                announcedVerified = (announced.field, expected)
            }
        }
        facts.withLock { $0.closed = true }
        // Two syncs and a rename: blocking calls that must not hold one of the few cooperative threads, or a
        // list of small files syncs two at a time instead of letting the file system commit them together.
        let url = request.url
        let aria2 = adoption?.origin == .aria2
        let hook = context.options.finishHook
        let sidecars = try await offloaded { () throws(DownloadError) in
            hook?(store.paths)
            return try store.markAndRename(url: url, length: bytes)
        }
        // The rename made durable by a folder sync shared with the downloads finishing beside it, waited for without
        // holding a thread; then what described the partial is removed.
        try await DirectorySync.shared.suspendingSync(parentDirectory(of: store.paths.destination))
        if sidecars || aria2 {
            try await offloaded { () throws(DownloadError) in
                store.removeSidecarsOfTheFinishedFile()
                // aria2's control file of a partial this download adopted (left by a crash between the adoption's
                // rename and its removal) or replaced: it describes a file that is no longer there.
                if aria2 { ForeignPartial.removeControlFile(of: store.paths.destination) }
            }
        }
        var result = DownloadResult(
            destination: store.paths.destination, bytes: bytes,
            bytesTransferred: reporter.counters.received.load(ordering: .relaxed),
            bytesDiscarded: reporter.counters.discarded.load(ordering: .relaxed), resumedFrom: resumedFrom,
            alreadyComplete: false, checksum: verified)
        result.serverDigest = announcedVerified?.digest
        result.serverDigestField = announcedVerified?.field
        return result
    }

    /// Does what ``FinishPolicy`` decided with a part file that is not renamed into place, on the blocking pool,
    /// and throws why.
    private func dispose(_ store: PartStore, _ refusal: FinishPolicy.Refusal) async throws -> Never {
        let disposal = refusal.disposal
        if disposal == .discard { facts.withLock { $0.closed = true } }
        if disposal == .keep { throw refusal.error }  // nothing to do on the disk
        try await offloaded { () throws(DownloadError) in
            switch disposal {
            case .keep: break
            case .invalidate(let pieces): try store.invalidate(pieces: pieces)
            case .discard: store.discard()
            }
        }
        throw refusal.error
    }
}

/// The digests of the download's bytes in order from byte 0 — of the checksum asked for and of the digest the
/// server announced — fed by one thread at a time (the sink's, on the transport's thread; the resume's prefix, the
/// finish) and reached only under its lock. An algorithm joins only before the first byte (or after a reset).
final class RunningDigest: Sendable {
    private struct State {
        var hashers: [DigestHasher]
        var fed = false
    }

    private let state: Locked<State>

    init(_ algorithms: [ChecksumAlgorithm]) {
        state = Locked(State(hashers: algorithms.map { DigestHasher($0) }))
    }

    /// Whether it follows no algorithm (nothing to hash).
    var isEmpty: Bool { state.withLock { $0.hashers.isEmpty } }

    /// Follows `algorithm` too, if no byte has been fed since the start or the last reset; false otherwise (the
    /// digest is then read from the file at the end).
    @discardableResult
    func follow(_ algorithm: ChecksumAlgorithm) -> Bool {
        state.withLock { state in
            if state.hashers.contains(where: { $0.algorithm == algorithm }) { return !state.fed }
            guard !state.fed else { return false }
            state.hashers.append(DigestHasher(algorithm))
            return true
        }
    }

    func update(_ bytes: UnsafeRawBufferPointer) {
        state.withLock { state in
            guard !bytes.isEmpty else { return }
            state.fed = true
            for hasher in state.hashers { hasher.update(bytes) }
        }
    }

    func reset() {
        state.withLock { state in
            state.fed = false
            for hasher in state.hashers { hasher.reset() }
        }
    }

    /// The digest in `algorithm` of every byte fed; nil when it does not follow it.
    func finalize(_ algorithm: ChecksumAlgorithm) -> [UInt8]? {
        state.withLock { state in state.hashers.first { $0.algorithm == algorithm }?.finalize() }
    }
}
