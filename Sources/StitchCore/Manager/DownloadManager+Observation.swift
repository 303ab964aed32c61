/// How one download ended, as ``DownloadManager/observe(_:isolation:progress:completion:)`` reports it: its
/// snapshot once completed (``DownloadSnapshot/path`` is the file), else why not — the failure
/// (``DownloadFailure/cancelled`` after ``DownloadManager/cancel(_:)``), or a failure with code `.cancelled` and
/// ``DownloadFailure/isResumable`` false once removed or unknown.
public typealias DownloadOutcome = Result<DownloadSnapshot, DownloadFailure>

/// The handle of an observation started by ``DownloadManager/observe(_:isolation:progress:completion:)``: cancel it
/// to stop the calls early. It ends on its own once the completion was called; dropping the handle does not stop
/// it.
public struct DownloadObservation: Sendable, Hashable {
    let task: Task<Void, Never>

    /// Stops the observation: called on the observing actor, no call to the observation's closures comes after it
    /// returns, and the completion is not called at all if it was not yet.
    public func cancel() { task.cancel() }

    /// Whether ``cancel()`` was called.
    public var isCancelled: Bool { task.isCancelled }

    /// Waits until the observation is over: the completion was called, or it was cancelled.
    public func finished() async { await task.value }
}

extension DownloadManager {
    /// Calls `progress` with each progress report of download `id` and `completion` once when it ends, both on
    /// the actor `isolation` — by default the caller's, so that a `@MainActor` view or view model gets its calls on
    /// the main actor without hopping itself; pass `MainActor.shared` (or any actor) to choose another.
    ///
    /// `progress` is called first, at once, with where the download stands, then with each report as it moves
    /// (about ten a second while it runs), in order, across pauses and resumes; a restart from zero reports fewer
    /// bytes again. `completion` is called exactly once, after the last `progress`, when the download completes
    /// (its snapshot, with the file's ``DownloadSnapshot/path``), fails or is cancelled (the ``DownloadFailure``),
    /// or is removed (a failure with code `.cancelled`, not resumable); at once if it had already ended, and with
    /// a `.cancelled` failure if the manager closes first or has no such download. The calls stop there, or when
    /// the returned handle is cancelled (then without a completion).
    ///
    /// ```swift
    /// @MainActor func watch(_ id: DownloadID) async {
    ///     await manager.observe(id) { progress in
    ///         bar.fraction = progress.fractionCompleted ?? 0
    ///     } completion: { outcome in
    ///         if case .success(let download) = outcome { open(download.path!) }
    ///     }
    /// }
    /// ```
    /// - Parameters:
    ///   - id: the download.
    ///   - isolation: the actor the closures run on; the caller's by default (nil: no actor, the global executor).
    ///   - progress: called on `isolation` with each progress report.
    ///   - completion: called on `isolation` once, when the download ends.
    /// - Returns: the observation, to cancel it early; already subscribed when returned, so no report made after
    ///   the call is missed.
    @discardableResult
    public func observe(
        _ id: DownloadID,
        isolation: isolated (any Actor)? = #isolation,
        progress: @escaping (TransferProgress) -> Void,
        completion: @escaping (DownloadOutcome) -> Void
    ) async -> DownloadObservation {
        let (stream, start) = await subscribeWithSnapshot(id)
        let task = Task { [weak self] in
            // Capturing the isolated parameter makes this task run on that actor.
            _ = isolation
            guard var current = start else {
                completion(
                    .failure(DownloadFailure(code: .cancelled, message: "no download \(id)", isResumable: false)))
                return
            }
            progress(current.progress)
            if let done = Self.outcome(current) {
                completion(done)
                return
            }
            for await event in stream {
                // Events already buffered when the observation was cancelled are not delivered.
                if Task.isCancelled { return }
                switch event {
                case .progress(_, let report):
                    current.progress = report
                    progress(report)
                case .pathResolved(_, let path):
                    current.path = path
                case .statusChanged(_, let status):
                    current.status = status
                    if status == .completed, let latest = await self?.download(id), latest.status == .completed {
                        current = latest
                    }
                    if Task.isCancelled { return }
                    if let done = Self.outcome(current) {
                        completion(done)
                        return  // ending the stream unsubscribes it
                    }
                default:
                    continue
                }
            }
            if !Task.isCancelled {
                completion(.failure(DownloadFailure(code: .cancelled, message: "the download manager is closed")))
            }
        }
        return DownloadObservation(task: task)
    }

    /// How a download with this snapshot has ended, or nil while it has not.
    private static func outcome(_ snapshot: DownloadSnapshot) -> DownloadOutcome? {
        switch snapshot.status {
        case .completed: .success(snapshot)
        case .failed(let failure): .failure(failure)
        case .removed: .failure(DownloadFailure(code: .cancelled, message: "removed", isResumable: false))
        case .queued, .running, .paused: nil
        }
    }
}
