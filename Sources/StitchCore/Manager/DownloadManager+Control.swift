import Foundation
import StitchLocks

// Controlling downloads: pause, resume, cancel, remove, and their places in the waiting queue.
extension DownloadManager {
    // MARK: Controlling

    /// Stops a queued or running download, keeping its partial data; ``resume(_:)`` queues it again.
    public func pause(_ id: DownloadID) throws(DownloadManagerError) {
        let notKept = try transition(id, .pause)
        stopRun(id)
        if let notKept { throw notKept }
    }

    /// Queues a paused or failed download again; it continues from its saved partial data.
    public func resume(_ id: DownloadID) throws(DownloadManagerError) {
        let notKept = try transition(id, .resume)
        resetMirrors(id)
        schedule()
        if let notKept { throw notKept }
    }

    /// Every mirror is worth a try again once the user resumes a download.
    func resetMirrors(_ id: DownloadID) {
        guard table[id]?.entry.options.mirrorsTried != 0 else { return }
        table[id]?.entry.options.mirrorsTried = 0
        if let entry = table[id]?.entry { try? catalog.update(entry) }
    }

    /// Stops a download for good unless resumed: it becomes failed (cancelled) and keeps its partial data.
    public func cancel(_ id: DownloadID) throws(DownloadManagerError) {
        let notKept = try transition(id, .cancel)
        stopRun(id)
        if let notKept { throw notKept }
    }

    /// Removes a download from the manager, stopping it first.
    /// - Parameters:
    ///   - id: the download.
    ///   - deletingFiles: also delete its partial data, and the finished file if it completed.
    public func remove(_ id: DownloadID, deletingFiles: Bool = false) async throws(DownloadManagerError) {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        guard let next = managed.status.after(.remove) else {
            throw DownloadManagerError(.illegalTransition(from: managed.status, action: .remove))
        }
        // The row goes first: whatever happens while the run stops (even a close), the next manager does not bring
        // the download back.
        do { try catalog.delete(id) } catch { throw DownloadManagerError(.catalog(error.description)) }
        let wasCompleted = managed.status == .completed
        queue.setStatus(id, next)
        managed.status = next
        table[id] = managed
        let task = managed.run?.task.withLock { $0 }
        stopRun(id)
        await task?.value
        guard let managed = table.removeValue(forKey: id) else { return }
        queue.remove(id)
        if let path = CatalogRestore.claimedPath(managed.entry) {
            claims.release(path, for: id)
            if deletingFiles {
                try? PartStore.removeLeftovers(at: DownloadPaths(destination: path))
                if wasCompleted { FileOperations.remove(path) }
            }
        }
        publish(.statusChanged(id, .removed))
        finishStreams(for: id)
        schedule()
    }

    /// Pauses every queued and running download.
    /// - Throws: ``DownloadManagerError`` when the catalog did not take a change (every download is paused all the
    ///   same; the first error is thrown).
    public func pauseAll() throws(DownloadManagerError) {
        try checkOpen()
        var first: DownloadManagerError?
        for id in queue.order() where table[id]?.status == .queued || table[id]?.status == .running {
            do { try pause(id) } catch { first = first ?? error }
        }
        if let first { throw first }
    }

    /// Queues every paused download again (not failed ones: ``resume(_:)`` retries those one by one).
    /// - Throws: ``DownloadManagerError`` when the catalog did not take a change (as ``pauseAll()``).
    public func resumeAll() throws(DownloadManagerError) {
        try checkOpen()
        var first: DownloadManagerError?
        for id in queue.order() where table[id]?.status == .paused {
            do {
                if let notKept = try transition(id, .resume) { first = first ?? notKept }
            } catch {
                first = first ?? error
            }
            resetMirrors(id)
        }
        schedule()
        if let first { throw first }
    }

    /// Moves a download to the front or back of those with its priority.
    public func move(_ id: DownloadID, to place: QueuePlace) throws(DownloadManagerError) {
        try checkOpen()
        guard let moved = queue.place(for: id, at: place) else { throw DownloadManagerError(.unknownDownload(id)) }
        try keep([DownloadQueue.Change(id: id, place: moved)])
        schedule()
    }

    /// The downloads waiting to start (queued or paused), in the order they would start.
    public func waitingQueue() -> [DownloadID] {
        queue.waiting()
    }

    /// Moves a waiting download within the waiting queue and returns its new place there (0 is the front). It
    /// takes the priority of the download it now stands before (at the end, after), so that the order is the one
    /// asked for.
    /// - Throws: ``DownloadManagerError``: `.unknownDownload`, or `.invalidRequest` when the download is not
    ///   waiting (running, completed or failed).
    @discardableResult
    public func move(_ id: DownloadID, to place: QueuePosition) throws(DownloadManagerError) -> Int {
        try checkOpen()
        switch queue.planMove(id, to: place) {
        case .failure(.unknown):
            throw DownloadManagerError(.unknownDownload(id))
        case .failure(.notWaiting(let status)):
            throw DownloadManagerError(.invalidRequest("download \(id) is \(status.name), not waiting in the queue"))
        case .success(let move):
            try keep(move.changes)
            schedule()
            return move.index
        }
    }

    /// Writes new places to the catalog (one transaction) and, once kept, to the queue and the table.
    func keep(_ changes: [DownloadQueue.Change]) throws(DownloadManagerError) {
        do {
            try catalog.setPositions(changes.map { ($0.id, $0.place.priority, $0.place.position) })
        } catch { throw DownloadManagerError(.catalog(error.description)) }
        queue.apply(changes)
        for change in changes {
            table[change.id]?.entry.priority = change.place.priority
            table[change.id]?.entry.position = change.place.position
        }
    }
}
