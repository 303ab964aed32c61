import Foundation

/// What the start of a download decides about what an earlier run left at its destination, as pure functions:
/// which state to go by, and whether the partial is resumed, discarded or refused. ``Reopening`` reads the files
/// and performs the decision. Unit tests: OpenPolicyTests.
enum OpenPolicy {
    /// Which state to go by.
    enum StateChoice: Sendable {
        /// No state file: look for a finished file (or a part file finished but not renamed).
        case none
        /// This state; `damaged`: why the state file could not be used and this, the generation before it, stands
        /// in (what its piece checksums prove is kept).
        case use(DownloadState, damaged: String?)
        /// The leftovers are deleted and the download starts over (the user asked to overwrite).
        case discard
        case refuse(DownloadError)
    }

    /// The state to go by, given what the state file holds. A damaged state file gives way to the generation
    /// before it when that is this download's (aria2 #790, #1116: truncated, zero-filled or garbage); else the
    /// partial is kept and the download refused, unless the user asked to overwrite. A state file that could not
    /// be read for another reason (an I/O error) is refused as it is.
    static func state(_ saved: PartialDownload.Saved, owns: (String) -> Bool, overwrite: Bool) -> StateChoice {
        switch saved {
        case .none:
            return .none
        case .state(let state):
            return .use(state, damaged: nil)
        case .unusable(let error, let previous):
            guard error.code == .unusableState else { return .refuse(error) }
            if let previous, owns(previous.url) { return .use(previous, damaged: error.message) }
            guard overwrite else {
                return .refuse(
                    DownloadError(
                        .unusableState, "\(error.message); the partial data is kept", cause: error,
                        remedy: .overwrite(.startOver)))
            }
            return .discard
        }
    }

    /// What becomes of a partial whose state is another download's, or beside a file at the destination.
    enum PartialChoice: Sendable {
        /// Resume it.
        case resume
        /// Delete it and start over (the user asked to overwrite).
        case discard
        case refuse(DownloadError)
    }

    /// Whether the partial described by a state of `stateURL` is resumed: only when it is this download's (or the
    /// user asked to overwrite: then it is deleted), and only when no file has appeared at the destination that
    /// the finished download may not replace (``replacesDestination(overwrite:adoption:)``).
    static func partial(
        stateURL: String, owns: (String) -> Bool, overwrite: Bool, adoption: AdoptionRecord?,
        destinationExists: Bool, partExists: Bool, paths: DownloadPaths, ifNewer: Bool = false
    ) -> PartialChoice {
        guard owns(stateURL) else {
            if overwrite { return .discard }
            return .refuse(
                DownloadError(
                    .unusableState, "\(paths.part) belongs to a download of \(stateURL)", remedy: .overwrite(.replace)))
        }
        // A file that appeared at the destination while the partial waited is not ours to replace.
        if destinationExists, !replacesDestination(overwrite: overwrite, adoption: adoption, ifNewer: ifNewer) {
            guard partExists else {
                // A state without its part file beside the file it names: an `--adopt` cut short.
                return .refuse(
                    DownloadError(
                        .destinationExists,
                        "\(paths.destination) already exists, and taking it over as a partial download was cut "
                            + "short; ask to adopt it again to continue it"))
            }
            return .refuse(
                DownloadError(
                    .destinationExists,
                    "\(paths.destination) already exists (the partial download beside it is kept)",
                    remedy: .overwrite(.replace)))
        }
        return .resume
    }

    /// Whether a file at the destination that Stitch did not finish may be replaced by the finished download: with
    /// ``DownloadRequest/overwrite``, or when the file there is another program's partial of this download that
    /// `--adopt` found (adopted, it is no longer there; not adopted, the complete file replaces it). Not for any
    /// other file: `--adopt` with nothing to adopt replaces nothing. `ifNewer`: the user asked for the server's
    /// file when it is newer than the one there (a partial beside it is that newer file's).
    static func replacesDestination(overwrite: Bool, adoption: AdoptionRecord?, ifNewer: Bool = false) -> Bool {
        overwrite || adoption != nil || ifNewer
    }
}

/// What an earlier run left at a download's destination, looked at before anything is asked of the server: a
/// finished file (the result), a partial to resume (reopened and checked), leftovers to discard, or a refusal. The
/// decisions are ``OpenPolicy``'s; this reads the state, completion marks and digests and performs them, on the
/// blocking pool (the caller's). It changes nothing of the run's: ``DownloadRun`` takes what it found.
struct Reopening {
    let request: DownloadRequest
    /// What `--adopt` found in this run, if anything.
    let adoption: AdoptionRecord?
    let emit: (DownloadEvent) -> Void

    /// What was found.
    enum Outcome {
        /// Nothing to resume: the download starts with a request for the whole file. `adoption`: what the
        /// download began with, when a partial of this download that came from another program's was deleted to
        /// start over (its control file still goes once the file is finished, and the new state records it).
        /// `condition`: with ``DownloadRequest/ifNewer``, the file at the destination, which the request for the
        /// whole file asks about (nil: the server's file replaces it).
        case nothing(adoption: AdoptionRecord?, condition: Unchanged? = nil)
        /// The file is already complete (or was finished and is now renamed into place).
        case complete(DownloadResult)
        /// A partial to continue.
        case resume(Resumed)
    }

    /// The file at the destination of a download with ``DownloadRequest/ifNewer``: what the request asks with, and
    /// the result if the server says it is its file.
    struct Unchanged: Sendable {
        let condition: FreshnessCondition
        let result: DownloadResult
    }

    /// A partial reopened for this download.
    struct Resumed {
        let store: PartStore
        let point: ResumePoint
        /// The validators to go on with: the state's, when bytes are kept or segments are to be asked for by range.
        let known: Validators?
        /// The file's length the state records.
        let total: Int64?
        /// The adoption the download began with (this run's, or the state's).
        let adoption: AdoptionRecord?
    }

    /// Looks at what an earlier run left at `paths`.
    func open(_ paths: DownloadPaths) throws -> Outcome {
        let partial = PartialDownload(paths)
        let state: DownloadState
        // Set when the state file is damaged and the previous checkpoint's state stands in: why, for the notice.
        let damagedState: String?
        switch OpenPolicy.state(partial.saved, owns: request.owns, overwrite: request.overwrite) {
        case .refuse(let error):
            throw error
        case .discard:
            try discardLeftovers(paths)
            return try fresh(partial, stateless: true, adoption: self.adoption)
        case .none:
            return try fresh(partial, stateless: true, adoption: self.adoption)
        case .use(let found, let damaged):
            state = found
            damagedState = damaged
        }
        let destinationExists = partial.destinationExists
        if destinationExists && !partial.partExists {
            // A finished download whose clean-up was cut short; under `ifNewer` the server is asked about it.
            if request.ifNewer, let mark = partial.completion, request.owns(mark.url) {
                partial.removeSidecars()
                return .nothing(adoption: self.adoption, condition: try conditional(partial))
            }
            if let done = try completedResult(partial) {
                partial.removeSidecars()
                return .complete(done)
            }
        }
        let adoption = self.adoption ?? state.adoption
        switch OpenPolicy.partial(
            stateURL: state.url, owns: request.owns, overwrite: request.overwrite, adoption: adoption,
            destinationExists: destinationExists, partExists: partial.partExists, paths: paths,
            ifNewer: request.ifNewer && state.replacesDestination == true)
        {
        case .refuse(let error):
            throw error
        case .discard:
            try discardLeftovers(paths)
            return try fresh(partial, stateless: false, adoption: self.adoption)
        case .resume:
            break
        }
        // Finished but not renamed into place (a cut between the final sync and the rename): finished now.
        var recheck = false
        if partial.partExists {
            switch try finishMarkedPart(partial, state: state) {
            case .finished(let done): return .complete(done)
            case .failedCheck: recheck = true
            case .none: break
            }
        }
        var resumed = state
        if resumed.url != request.url {
            // The same download under a new URL: saved at the next checkpoint. The saved validators decide
            // (If-Range) whether the new URL's file is the one the bytes came from.
            emit(.notice("continuing the partial download started from \(resumed.url) from its new URL"))
            resumed.url = request.url
        }
        let reopened = Result { () throws(DownloadError) in
            try PartStore.reopen(paths: paths, state: resumed, fromPrevious: damagedState != nil, recheck: recheck)
        }
        if case .failure(let error) = reopened, request.overwrite, error.code == .unusableState {
            // A repair (a fallback, or damage found after a reboot) cannot be done in place, and the user asked
            // to start over.
            try discardLeftovers(paths)
            return try fresh(partial, stateless: false, adoption: adoption)
        }
        var (store, point) = try reopened.get()
        if let damagedState {
            // reopen kept only what the previous state's checksums prove.
            point.note =
                "\(damagedState); resuming from the checkpoint before it, keeping the \(point.bytes) bytes its "
                + "checksums prove and fetching the rest again"
        } else if let cut = Self.cutNote(point) {
            // reopen re-checked every recorded piece and proof (the state was written before a reboot).
            point.note = cut
        }
        if recheck {
            point.note =
                "\(paths.part) was marked complete but does not read back to the CRC32C recorded with the mark; "
                + "keeping only the \(point.bytes) saved bytes its checksums prove"
        }
        // Validators matter when bytes are kept, or when segments (even empty ones) are to be asked for by range.
        let known = point.bytes > 0 || store.snapshot.segments.count > 1 ? resumed.validators : nil
        return .resume(
            Resumed(
                store: store, point: point, known: known, total: resumed.validators.totalLength, adoption: adoption))
    }

    /// No partial to resume: a file at the destination this download already completed is the result; any other
    /// file there is refused unless it may be replaced. `stateless`: there was no state file (a small download
    /// has none), so a part file finished but not renamed into place is finished now.
    private func fresh(_ partial: PartialDownload, stateless: Bool, adoption: AdoptionRecord?) throws -> Outcome {
        if request.ifNewer, partial.destinationExists {
            // A newer file finished but not renamed into place is finished now; else the server is asked.
            if stateless, partial.partExists, case .finished(let done) = try finishMarkedPart(partial, state: nil) {
                return .complete(done)
            }
            return .nothing(adoption: adoption, condition: try conditional(partial))
        }
        if let done = try checkDestination(partial, exists: partial.destinationExists, adoption: adoption) {
            return .complete(done)
        }
        if stateless, partial.partExists, case .finished(let done) = try finishMarkedPart(partial, state: nil) {
            return .complete(done)
        }
        return .nothing(adoption: adoption)
    }

    /// What the check after a reboot cut, for the user; nil when it cut nothing.
    static func cutNote(_ point: ResumePoint) -> String? {
        var found: [String] = []
        if !point.damagedPieces.isEmpty { found.append("\(point.damagedPieces.count) damaged piece(s) found after the restart") }
        if !point.unprovenPieces.isEmpty {
            found.append(
                "\(point.unprovenPieces.count) piece(s) saved without a checksum (by an older stitch) cannot be proven "
                    + "after the restart")
        }
        if found.isEmpty && point.cutBytes > 0 {
            found.append("\(point.cutBytes) saved bytes failed their checksums after the restart")
        }
        guard !found.isEmpty else { return nil }
        return found.joined(separator: "; ") + "; fetching only those again"
    }

    /// Finishes a part file the previous run had finished writing — its completion mark, with the whole file's
    /// CRC32C, made durable by the sync before the rename — when a power cut or a kill came before the rename into
    /// place (``PartialDownload/finishMarkedPart(matching:verify:)``): the mark must be this download's (URL; the
    /// length and ETag of `state` when there is one), and the bytes must read back to its CRC. Under a checksum the
    /// file is read and its digest compared before the rename. Returns the result (nothing fetched); `.none` when
    /// there is no such file; `.failedCheck` when its bytes do not match (the mark is removed, and the resume that
    /// follows checks every piece).
    func finishMarkedPart(_ partial: PartialDownload, state: DownloadState?) throws -> MarkedPartOutcome {
        let paths = partial.paths
        let expected = request.checksum
        var mismatch: [UInt8]?
        let found: PartStore.MarkedPart
        do {
            found = try partial.finishMarkedPart(
                matching: { mark in
                    guard request.owns(mark.url) else { return false }
                    if let total = state?.validators.totalLength, total != mark.length { return false }
                    if let etag = state?.validators.etag, etag != mark.etag { return false }
                    return true
                },
                verify: { (part: String) throws(DownloadError) in
                    guard let expected else { return }
                    let digest = try FileOperations.digest(ofFileAt: part, expected.algorithm)
                    guard expected.matches(digest) else {
                        mismatch = digest
                        throw DownloadError(.checksumMismatch, "checksum mismatch")
                    }
                })
        } catch {
            guard let mismatch, let expected else { throw error }
            let got = "\(expected.algorithm.name)=\(ExpectedChecksum.hexString(mismatch))"
            if state?.adoption?.kept == true, !request.overwrite {
                throw DownloadError(
                    .checksumMismatch,
                    "checksum mismatch: expected \(expected), got \(got); the file was continued from another program's partial download, which may differ from the server's between the samples compared: it is kept as \(paths.part), and nothing was saved at \(paths.destination)",
                    remedy: .overwrite(.downloadAgain))
            }
            try discardLeftovers(paths)
            throw DownloadError(
                .checksumMismatch,
                "checksum mismatch: expected \(expected), got \(got); the downloaded data was deleted and nothing was saved at \(paths.destination)"
            )
        }
        let mark: CompletionMark
        switch found {
        case .none: return .none
        case .failedCheck: return .failedCheck
        case .finished(let finished): mark = finished
        }
        if state?.adoption?.origin == .aria2 { ForeignPartial.removeControlFile(of: paths.destination) }
        emit(.destinationResolved(paths.destination))
        emit(
            .resuming(
                from: mark.length,
                note: "the previous run had finished writing \(paths.part) (all \(mark.length) bytes read back to the "
                    + "CRC32C it recorded) but was stopped before moving it into place; moved it there, nothing fetched"))
        return .finished(
            DownloadResult(
                destination: paths.destination, bytes: mark.length, bytesTransferred: 0, resumedFrom: mark.length,
                alreadyComplete: false, checksum: expected))
    }

    /// What ``finishMarkedPart(_:state:)`` did.
    enum MarkedPartOutcome {
        case none
        case finished(DownloadResult)
        case failedCheck
    }

    func checkDestination(_ partial: PartialDownload, exists: Bool, adoption: AdoptionRecord?) throws
        -> DownloadResult?
    {
        guard exists else { return nil }
        if let done = try completedResult(partial) { return done }
        if OpenPolicy.replacesDestination(overwrite: request.overwrite, adoption: adoption, ifNewer: request.ifNewer) {
            return nil
        }
        throw DownloadError(
            .destinationExists, "\(partial.paths.destination) already exists", remedy: .overwrite(.replace))
    }

    /// The result for a destination this run's URL already completed, if it is that; with a checksum asked
    /// for, the file is hashed and must match. The file's bytes and mark were synced before its rename; the rename
    /// itself is made durable here (a folder sync shared with the runs beside it) before the file is called complete:
    /// the run that renamed it may not have synced its folder yet (another process, between its rename and its
    /// sync), or its sync failed.
    func completedResult(_ partial: PartialDownload) throws -> DownloadResult? {
        let paths = partial.paths
        guard let mark = partial.completion, request.owns(mark.url) else { return nil }
        if let expected = request.checksum {
            let digest = try FileOperations.digest(ofFileAt: paths.destination, expected.algorithm)
            guard expected.matches(digest) else {
                if request.overwrite { return nil }  // download it again and replace it
                throw DownloadError(
                    .checksumMismatch,
                    "\(paths.destination) is already downloaded but does not match \(expected) (it has \(expected.algorithm.name)=\(ExpectedChecksum.hexString(digest)))",
                    remedy: .overwrite(.downloadAgain))
            }
        }
        try DirectorySync.shared.sync(parentDirectory(of: paths.destination))
        emit(.destinationResolved(paths.destination))
        return DownloadResult(
            destination: paths.destination, bytes: mark.length, bytesTransferred: 0, resumedFrom: mark.length,
            alreadyComplete: true, checksum: request.checksum)
    }

    /// What the request for the whole file asks about the file at the destination (``DownloadRequest/ifNewer``):
    /// the ETag and Last-Modified its completion mark recorded when this download made it, else its modification
    /// time (as `curl -z FILE` and `wget -N` go by). Nil when the file is not worth asking about: it does not match
    /// the checksum asked for (the server's file replaces it, whatever its date). Only a regular file is replaced.
    func conditional(_ partial: PartialDownload) throws -> Unchanged? {
        let paths = partial.paths
        let found = try partial.destinationFile()
        guard found.isRegular else {
            throw DownloadError(.destinationExists, "\(paths.destination) already exists and is not a regular file")
        }
        let length = found.length
        if let expected = request.checksum {
            let digest = try FileOperations.digest(ofFileAt: paths.destination, expected.algorithm)
            guard expected.matches(digest) else {
                emit(.notice("\(paths.destination) does not match \(expected): fetching the server's file to replace it"))
                return nil
            }
        }
        let mark = partial.completion.flatMap { request.owns($0.url) && $0.length == length ? $0 : nil }
        let modifiedSince = mark?.lastModified ?? HTTPDate.format(found.modified)
        let condition = FreshnessCondition(
            etag: mark?.etag, modifiedSince: modifiedSince, serverDate: mark?.lastModified != nil, length: length)
        var result = DownloadResult(
            destination: paths.destination, bytes: length, bytesTransferred: 0, resumedFrom: length,
            alreadyComplete: true, checksum: request.checksum)
        result.notModified = true
        return Unchanged(condition: condition, result: result)
    }

    func discardLeftovers(_ paths: DownloadPaths) throws(DownloadError) {
        try PartStore.removeLeftovers(at: paths)
    }

}
