public import Foundation
import Synchronization
import StitchLocks

/// Many downloads, one queue: started in order under a concurrency cap and a per-host connection cap, paused,
/// resumed, cancelled and removed on request, reported through event streams, and kept in a catalog that
/// outlives the process.
///
/// ```swift
/// let manager = try await DownloadManager(directory: "/var/lib/app/downloads")
/// let id = try await manager.add("https://example.com/big.iso")
/// await manager.observe(id) { progress in … } completion: { outcome in … }
/// ```
///
/// After the process is killed, a new manager on the same directory restores every download in its state and
/// order; those that were running carry on from what their state files prove (``Configuration/autoResume``).
/// Per-byte progress lives in each download's own state file beside its destination; the catalog never claims
/// more than those prove.
public actor DownloadManager {
    /// What is in force now: the configuration the manager was opened with, and the changes made since.
    public internal(set) var configuration: Configuration
    /// What opening the catalog found: downloads restored, a migration, a rebuild.
    public nonisolated let restoreReport: RestoreReport

    let catalog: Catalog
    /// The manager runs on threads of its own, not on the cooperative pool: each change is committed to the catalog,
    /// and synced, before the call returns (``BlockingSerialExecutor``).
    let executor = BlockingSerialExecutor()
    /// The executor the manager's work runs on: a serial executor over the blocking pool's threads, so that a catalog
    /// sync never holds a thread of the cooperative pool.
    public nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
    let downloader: Downloader
    /// The limit over all downloads; always there, switched off without a limit, so that a limit set later applies
    /// to running downloads too.
    let rateLimiter: RateLimiter
    let hosts: HostSlots
    let claims = PathClaims()
    var table: [DownloadID: Managed] = [:]
    /// The order, the places and the slots: which download starts next (a pure state machine the actor drives).
    var queue = DownloadQueue()
    var nextRunToken = 0
    /// Who listens to the event streams.
    var subscribers = Subscribers()
    var idleWaiters: [CheckedContinuation<Void, Never>] = []
    var isClosed = false
    /// Downloads whose last status change the catalog did not take (``transition(_:_:)``).
    var unsaved: Set<DownloadID> = []
    /// The downloads an add that reuses may return, by place and URL; built on the first such add, kept up to date
    /// by adds, and dropped when a download's URL changes (``point(_:at:)``). Removed downloads are skipped on
    /// lookup.
    var heldIndex: HeldIndex?

    struct Managed {
        var entry: CatalogEntry
        var status: DownloadStatus
        var progress: TransferProgress
        var meter = SpeedMeter()
        var run: ManagerRun?
        /// Set by ``updateSource``: when the current run ends, start again with the new source.
        var restartAfterRun = false
        /// The last problem the download met, in plain words (a retry's reason, a restart's, a failure).
        var lastProblem: String?
        /// The digest the server announced that the finished file matched (`FIELD algorithm=hex`).
        var verifiedDigest: String?
    }

    /// Opens the manager kept in `directory` (its catalog), creating it if needed, and restores its downloads.
    /// - Parameters:
    ///   - directory: where the manager keeps its catalog (created if missing).
    ///   - configuration: the download folder, caps and defaults; nil downloads into `directory` with the defaults.
    ///   - transport: moves the bytes (`import Stitch` adds an initializer without it: the shared transport of the
    ///     build's default backend).
    ///   - clock: time for retries and stall checks; the system's by default (tests inject their own).
    /// - Throws: ``DownloadManagerError`` when the catalog cannot be opened or created.
    public init(
        directory: String, configuration: Configuration? = nil, transport: any HTTPTransport,
        clock: any DownloadClock = SystemClock()
    ) throws(DownloadManagerError) {
        let configuration = configuration ?? Configuration(downloadDirectory: directory)
        try? FileOperations.createDirectory(configuration.downloadDirectory)
        let catalog: Catalog
        do {
            catalog = try Catalog(directory: directory)
        } catch {
            throw DownloadManagerError(.catalog(error.description))
        }
        try self.init(catalog: catalog, configuration: configuration, transport: transport, clock: clock)
    }

    /// A manager whose list of downloads lives in memory only: nothing is written besides the downloads' own
    /// files, and a manager opened later knows none of them. Each download still keeps its partial data and
    /// state file beside its destination, so adding the same URL to the same place later resumes it (what the
    /// command line's list of URLs does).
    /// - Parameters:
    ///   - configuration: the download folder, caps and defaults.
    ///   - transport: moves the bytes (`import Stitch` adds an initializer without it).
    ///   - clock: time for retries and stall checks.
    /// - Throws: ``DownloadManagerError``, in the signature since the in-memory catalog was an SQLite database; the
    ///   catalog in memory now cannot fail.
    public init(
        configuration: Configuration, transport: any HTTPTransport, clock: any DownloadClock = SystemClock()
    ) throws(DownloadManagerError) {
        try? FileOperations.createDirectory(configuration.downloadDirectory)
        let catalog: Catalog
        do {
            catalog = try Catalog(inMemory: ())
        } catch {
            throw DownloadManagerError(.catalog(error.description))
        }
        try self.init(catalog: catalog, configuration: configuration, transport: transport, clock: clock)
    }

    init(
        catalog: Catalog, configuration: Configuration, transport: any HTTPTransport, clock: any DownloadClock
    ) throws(DownloadManagerError) {
        self.configuration = configuration
        self.downloader = Downloader(transport: transport, clock: clock)
        let limiter = RateLimiter(bytesPerSecond: configuration.rateLimit ?? Self.unlimitedRate)
        limiter.isEnabled = configuration.rateLimit != nil
        self.rateLimiter = limiter
        self.hosts = HostSlots(cap: max(1, configuration.maxConnectionsPerHost))
        self.catalog = catalog
        var recovered = 0
        var entries: [CatalogEntry]
        do {
            entries = try catalog.all()
            if catalog.openReport.rebuiltBecause != nil {
                let found = CatalogRestore.entriesFromStateFiles(in: configuration.downloadDirectory)
                try catalog.insert(found)
                recovered = found.count
                entries = try catalog.all()
            }
        } catch {
            throw DownloadManagerError(.catalog(error.description))
        }
        var restored: [DownloadID: Managed] = [:]
        var queue = DownloadQueue()
        for entry in entries {
            var entry = entry
            var status = CatalogRestore.status(of: entry)
            if status == .running || status == .queued {
                // A download that was running when the process died continues, or waits for the user.
                status = configuration.autoResume ? .queued : .paused
                entry.status = status.name
            }
            let progress = CatalogRestore.restoredProgress(entry, status: status)
            restored[entry.id] = Managed(entry: entry, status: status, progress: progress)
            queue.insert(entry.id, at: .init(priority: entry.priority, position: entry.position), status: status)
            if let path = CatalogRestore.claimedPath(entry) { claims.claim(path, for: entry.id) }
        }
        self.table = restored
        self.queue = queue
        self.restoreReport = RestoreReport(
            restored: entries.count, migratedFrom: catalog.openReport.migratedFrom,
            rebuiltBecause: catalog.openReport.rebuiltBecause, recoveredFromStateFiles: recovered)
        // Restored downloads start at once (autoResume), without waiting for a first call.
        Task { await self.schedule() }
    }

    // MARK: Looking

    /// The download with this id.
    public func download(_ id: DownloadID) -> DownloadSnapshot? { snapshot(of: id) }

    /// Every download with this URL (current or former), in queue order.
    public func downloads(url: String) -> [DownloadSnapshot] {
        queue.order().compactMap { id in
            guard let entry = table[id]?.entry, entry.url == url || entry.options.formerURLs.contains(url)
            else { return nil }
            return snapshot(of: id)
        }
    }

    /// Every download with this `URL` (its `absoluteString`, current or former), in queue order.
    public func downloads(url: URL) -> [DownloadSnapshot] { downloads(url: url.absoluteString) }

    /// Every download, in queue order (priority, then position).
    public func downloads() -> [DownloadSnapshot] { queue.order().compactMap { snapshot(of: $0) } }

    /// The progress of every download together: bytes and lengths, the share done, the summed speed and the
    /// downloads by status, counted as ``AggregateProgress`` says (failed downloads are counted but leave the bytes
    /// out; paused and completed ones are in).
    public func aggregateProgress() -> AggregateProgress {
        AggregateProgress(statuses: table.values.lazy.map { ($0.status, $0.progress) })
    }

    /// Download `id`'s events from now on and its snapshot at that same moment (nil when the manager has no such
    /// download), for ``observe(_:isolation:progress:completion:)``.
    func subscribeWithSnapshot(_ id: DownloadID) -> (AsyncStream<DownloadManagerEvent>, DownloadSnapshot?) {
        (subscribe(id), snapshot(of: id))
    }

    /// Every download's events from now on and the downloads at that same moment, in queue order, for
    /// ``DownloadList``.
    func subscribeWithSnapshots() -> (AsyncStream<DownloadManagerEvent>, [DownloadSnapshot]) {
        (subscribe(nil), downloads())
    }

    /// Events about every download, from now on. The stream ends when the manager closes.
    ///
    /// Progress is sent at most about ten times a second per download. A consumer that falls more than
    /// 10,000 events behind loses the oldest.
    /// - Parameter buffering: how many events wait for a slow consumer before the oldest are dropped.
    public func events(
        buffering: AsyncStream<DownloadManagerEvent>.Continuation.BufferingPolicy = .bufferingNewest(10_000)
    ) -> AsyncStream<DownloadManagerEvent> { subscribe(nil, buffering: buffering) }

    /// Events about one download, from now on. The stream ends once it is removed or the manager closes. (Apps
    /// observe one download with ``observe(_:isolation:progress:completion:)``.)
    func events(for id: DownloadID) -> AsyncStream<DownloadManagerEvent> { subscribe(id) }

    /// Waits until no download is queued or running (paused, completed and failed ones are at rest).
    public func waitUntilIdle() async {
        schedule()
        if isIdle || isClosed { return }
        await withCheckedContinuation { idleWaiters.append($0) }
    }

    /// Stops every running download (their state is saved; a manager opened later on this directory continues
    /// them), ends the event streams and closes the catalog. The manager refuses calls afterwards.
    public func close() async {
        if let closing {
            await closing.value
            return
        }
        let done = Task {}
        closing = done
        isClosed = true
        var tasks: [Task<Void, Never>] = []
        for (_, managed) in table {
            if let task = managed.run?.task.withLock({ $0 }) {
                task.cancel()
                tasks.append(task)
            }
        }
        for task in tasks { await task.value }
        // What running downloads learnt (their file's path, its length) is saved for the next manager.
        for (_, managed) in table where managed.status == .running { try? catalog.update(managed.entry) }
        saveUnsaved()
        subscribers.finishAll()
        catalog.close()
        resumeIdleWaiters()
    }

    deinit {
        // Dropped without close(): its runs must not go on without an owner (they save their state as they stop).
        for managed in table.values { managed.run?.task.withLock { $0 }?.cancel() }
    }

    /// Set by the first ``close()``; a second one waits for the same end.
    var closing: Task<Void, Never>?

    // MARK: Internals

    var isIdle: Bool { queue.isIdle }

    /// A rate for the limiter while it is switched off (it is never consulted then).
    static let unlimitedRate: Int64 = 1 << 40

    func checkOpen() throws(DownloadManagerError) {
        if isClosed { throw DownloadManagerError(.closed) }
    }

    /// Applies `action` to download `id`; throws if it cannot be applied. Returns the catalog's error when the
    /// change was made but not kept: the caller finishes what the change needs (stopping the run, scheduling) and
    /// then throws it, so a client is never told a change is kept that a power cut would undo (an RPC's pause
    /// answered while the disk failed was waiting after the reboot, PowerCutServeTests). The row is written again
    /// with the next change and at close (``saveUnsaved()``).
    @discardableResult
    func transition(_ id: DownloadID, _ action: DownloadAction) throws(DownloadManagerError) -> DownloadManagerError? {
        try checkOpen()
        saveUnsaved()
        guard let managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        guard let next = managed.status.after(action) else {
            throw DownloadManagerError(.illegalTransition(from: managed.status, action: action))
        }
        return setStatus(id, next).map { DownloadManagerError(.catalog($0.description)) }
    }

    /// Writes again the rows whose last change the catalog did not take.
    func saveUnsaved() {
        for id in unsaved {
            guard let entry = table[id]?.entry else {
                unsaved.remove(id)
                continue
            }
            if (try? catalog.update(entry)) != nil { unsaved.remove(id) }
        }
    }

    /// Sets the status, and writes it to the catalog unless it is `running` or `removed`; returns the catalog's
    /// error if that write failed.
    @discardableResult
    func setStatus(_ id: DownloadID, _ status: DownloadStatus) -> CatalogError? {
        guard var managed = table[id], managed.status != status else { return nil }
        queue.setStatus(id, status)
        managed.status = status
        // The catalog never says running (restoring treats queued the same), so neither does the entry.
        managed.entry.status = status == .removed || status == .running ? managed.entry.status : status.name
        var code: String?
        var message: String?
        if case .failed(let failure) = status {
            code = failure.code.description
            message = failure.message
        }
        managed.entry.errorCode = code
        managed.entry.errorMessage = message
        if status != .running { managed.meter.reset() }
        table[id] = managed
        // `running` is not written: a download the catalog says is queued is restored exactly like a running one,
        // and the many-small-files case pays one catalog write per download instead of several. The whole row goes
        // in, so the path and length learnt while running are saved with the status that follows.
        // A catalog that cannot be written is reported to the caller that asked for the change (and by the next
        // call that can throw); the status change itself is what the user asked for and stands.
        var failure: CatalogError?
        if status != .removed && status != .running {
            managed.entry.updatedAt = Date().timeIntervalSince1970
            table[id] = managed
            do {
                try catalog.update(managed.entry)
                unsaved.remove(id)
            } catch {
                failure = error
                unsaved.insert(id)
            }
        }
        publish(.statusChanged(id, status))
        if isIdle { resumeIdleWaiters() }
        return failure
    }

    func stopRun(_ id: DownloadID) {
        table[id]?.run?.task.withLock { $0 }?.cancel()
    }

    func snapshot(of id: DownloadID) -> DownloadSnapshot? {
        guard let managed = table[id] else { return nil }
        let entry = managed.entry
        var headers = HTTPHeaders()
        for line in entry.headers {
            if let (name, value) = Downloader.parseHeaderLine(line) { headers.add(name: name, value: value) }
        }
        return DownloadSnapshot(
            id: id, url: entry.url, headers: headers,
            destination: entry.destinationKind == .file ? .file(entry.destinationPath) : .directory(entry.destinationPath),
            path: entry.resolvedPath ?? (entry.destinationKind == .file ? entry.destinationPath : nil),
            status: managed.status, progress: managed.progress, priority: entry.priority, position: entry.position,
            checksum: entry.checksum.flatMap { try? ExpectedChecksum(parsing: $0) }, addedAt: entry.createdAt,
            rateLimit: entry.options.rateLimit, mirrors: entry.options.mirrors.isEmpty ? [entry.url] : entry.options.mirrors,
            tuning: entry.options.tuning, connections: entry.options.connections, overwrite: entry.options.overwrite,
            ifNewer: entry.options.ifNewer, proxies: entry.options.proxies, lastProblem: managed.lastProblem ?? entry.errorMessage,
            verifiedDigest: managed.verifiedDigest)
    }

    func subscribe(
        _ id: DownloadID?,
        buffering: AsyncStream<DownloadManagerEvent>.Continuation.BufferingPolicy = .bufferingNewest(10_000)
    ) -> AsyncStream<DownloadManagerEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: DownloadManagerEvent.self, bufferingPolicy: buffering)
        if isClosed || (id != nil && table[id!] == nil) {
            continuation.finish()
            return stream
        }
        let key = subscribers.add(id, continuation)
        continuation.onTermination = { [weak self] _ in
            Task { await self?.unsubscribe(key) }
        }
        return stream
    }

    func unsubscribe(_ key: Int) {
        subscribers.remove(key)
    }

    func publish(_ event: DownloadManagerEvent) {
        subscribers.publish(event)
    }

    func finishStreams(for id: DownloadID) {
        subscribers.finish(for: id)
    }

    func resumeIdleWaiters() {
        let waiters = idleWaiters
        idleWaiters.removeAll()
        for waiter in waiters { waiter.resume() }
    }

    /// The key of the per-host cap: lower-cased host and the port (explicit or the scheme's).
    static func hostKey(_ url: String) -> String {
        guard let parsed = URL(string: url), let host = parsed.host?.lowercased() else { return url }
        let port = parsed.port ?? (parsed.scheme?.lowercased() == "https" ? 443 : 80)
        return "\(host):\(port)"
    }
}
