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
/// for await event in await manager.events(for: id) { … }
/// ```
///
/// After the process is killed, a new manager on the same directory restores every download in its state and
/// order; those that were running carry on from what their state files prove (``Configuration/autoResume``).
/// Per-byte progress lives in each download's own state file beside its destination; the catalog never claims
/// more than those prove.
public actor DownloadManager {
    /// What is in force now: the configuration the manager was opened with, and the changes made since.
    public private(set) var configuration: Configuration
    /// What opening the catalog found: downloads restored, a migration, a rebuild.
    public nonisolated let restoreReport: RestoreReport

    private let catalog: Catalog
    /// The manager runs on threads of its own, not on the cooperative pool: each change is committed to the catalog,
    /// and synced, before the call returns (``BlockingSerialExecutor``).
    private let executor = BlockingSerialExecutor()
    /// The executor the manager's work runs on: a serial executor over the blocking pool's threads, so that a catalog
    /// sync never holds a thread of the cooperative pool.
    public nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
    private let downloader: Downloader
    /// The limit over all downloads; always there, switched off without a limit, so that a limit set later applies
    /// to running downloads too.
    private let rateLimiter: RateLimiter
    private let hosts: HostSlots
    private let claims = PathClaims()
    private var table: [DownloadID: Managed] = [:]
    /// The order, the places and the slots: which download starts next (a pure state machine the actor drives).
    private var queue = DownloadQueue()
    private var nextRunToken = 0
    /// Who listens to the event streams.
    private var subscribers = Subscribers()
    private var idleWaiters: [CheckedContinuation<Void, Never>] = []
    private var isClosed = false
    /// Downloads whose last status change the catalog did not take (``transition(_:_:)``).
    private var unsaved: Set<DownloadID> = []

    private struct Managed {
        var entry: CatalogEntry
        var status: DownloadStatus
        var progress: TransferProgress
        var meter = SpeedMeter()
        var run: ManagerRun?
        /// Set by ``updateSource``: when the current run ends, start again with the new source.
        var restartAfterRun = false
        /// The last problem the download met, in plain words (a retry's reason, a restart's, a failure).
        var lastProblem: String?
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
    /// - Throws: ``DownloadManagerError`` when SQLite cannot make the in-memory catalog.
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

    private init(
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

    // MARK: Adding

    /// Adds a download and starts it when a slot is free.
    /// - Returns: its id, stable across restarts.
    /// - Throws: ``DownloadManagerError``: `.invalidRequest` for a bad URL or option, `.pathInUse` when another
    ///   download of this manager already writes to the path.
    @discardableResult
    public func add(_ url: String, options: AddOptions = AddOptions()) throws(DownloadManagerError) -> DownloadID {
        try add([(url, options)])[0]
    }

    /// Adds a download of `url` (its `absoluteString`) and starts it when a slot is free; as
    /// ``add(_:options:)-(String,_)``, which refuses what is not http or https with a host (a `file:` URL).
    /// - Returns: its id, stable across restarts.
    /// - Throws: ``DownloadManagerError``: `.invalidRequest` for a bad URL or option, `.pathInUse` when another
    ///   download of this manager already writes to the path.
    @discardableResult
    public func add(_ url: URL, options: AddOptions = AddOptions()) throws(DownloadManagerError) -> DownloadID {
        try add(url.absoluteString, options: options)
    }

    /// Adds several downloads of `URL`s at once (one catalog transaction): all or none, as the `String` form.
    public func add(_ items: [(url: URL, options: AddOptions)]) throws(DownloadManagerError) -> [DownloadID] {
        try add(items.map { (url: $0.url.absoluteString, options: $0.options) })
    }

    /// Adds several downloads at once (one catalog transaction): all or none.
    public func add(_ items: [(url: String, options: AddOptions)]) throws(DownloadManagerError) -> [DownloadID] {
        try checkOpen()
        var entries: [CatalogEntry] = []
        entries.reserveCapacity(items.count)
        var position = (try? catalog.maxPosition()) ?? 0
        let now = Date().timeIntervalSince1970
        var batchIDs: Set<DownloadID> = []
        var claimed: [(String, DownloadID)] = []
        var ids: [DownloadID] = []
        // Claims made for this batch are given back if any item (or the catalog) refuses it.
        func rollBack() { for (path, id) in claimed { claims.release(path, for: id) } }
        for (url, options) in items {
            if options.reuseExisting {
                let existing: DownloadID?
                do { existing = try heldDownload(url, options, alsoAmong: entries) } catch {
                    rollBack()
                    throw error
                }
                if let existing {
                    ids.append(existing)
                    continue
                }
            }
            do { _ = try validateURL(url) } catch {
                rollBack()
                throw DownloadManagerError(.invalidRequest(error.message))
            }
            for mirror in options.mirrors {
                do { _ = try validateURL(mirror) } catch {
                    rollBack()
                    throw DownloadManagerError(.invalidRequest("mirror: \(error.message)"))
                }
            }
            if let connections = options.connections, !DownloadOptions.connectionRange.contains(connections) {
                rollBack()
                throw DownloadManagerError(.invalidRequest(Self.connectionsRefusal(connections)))
            }
            if let rate = options.rateLimit, rate <= 0 {
                rollBack()
                throw DownloadManagerError(.invalidRequest("the rate limit must be positive, not \(rate)"))
            }
            var id = DownloadID.random()
            while table[id] != nil || batchIDs.contains(id) { id = DownloadID.random() }
            batchIDs.insert(id)
            let folder = absolutePath(options.directory ?? configuration.downloadDirectory)
            let kind: CatalogEntry.DestinationKind
            let path: String
            if let out = options.out {
                kind = .file
                // Without `.` components and repeated slashes, so `x.bin` and `./x.bin` are one claim (`..` stays:
                // resolving it by the text would be wrong after a symbolic link; the part file's lock still keeps
                // two downloads apart there).
                path = withoutDotComponents(out.hasPrefix("/") ? out : folder + "/" + out)
                if let owner = claims.claimIfFree(path, for: id) {
                    rollBack()
                    throw DownloadManagerError(.pathInUse(path, by: owner))
                }
                claimed.append((path, id))
            } else {
                kind = .directory
                path = folder
            }
            position += 1
            entries.append(
                CatalogEntry(
                    id: id, url: url, headers: options.headers.map { "\($0.name): \($0.value)" },
                    destinationKind: kind, destinationPath: path, checksum: options.checksum?.description,
                    options: {
                        var stored = StoredOptions(
                            connections: options.connections, overwrite: options.overwrite,
                            rateLimit: options.rateLimit)
                        let others = options.mirrors.filter { $0 != url }
                        stored.mirrors = others.isEmpty ? [] : [url] + others
                        stored.tuning = options.tuning
                        stored.adopt = options.adopt && options.out != nil
                        return stored
                    }(),
                    status: options.paused ? CatalogEntry.Status.paused : CatalogEntry.Status.queued,
                    priority: options.priority, position: position, createdAt: now, updatedAt: now))
            ids.append(id)
        }
        // Adds at a place: planned on a copy of the queue with the new downloads at the end, before anything is
        // written; the new downloads' places go in with them, the others' moves in the same transaction.
        let placed = zip(items.lazy.map(\.options.position), ids).compactMap { position, id in
            batchIDs.contains(id) ? position.map { (id, $0) } : nil
        }
        var planned: DownloadQueue?
        var moved: [DownloadQueue.Change] = []
        if !placed.isEmpty {
            var plan = queue
            for entry in entries {
                plan.insert(entry.id, at: .init(priority: entry.priority, position: entry.position), status: Self.status(ofNew: entry))
            }
            var changed: [DownloadID: DownloadQueue.Place] = [:]
            for (id, position) in placed {
                guard case .success(let move) = plan.planMove(id, to: position) else { continue }  // new: always waiting
                plan.apply(move.changes)
                for change in move.changes { changed[change.id] = change.place }
            }
            for index in entries.indices {
                if let place = changed.removeValue(forKey: entries[index].id) {
                    entries[index].priority = place.priority
                    entries[index].position = place.position
                }
            }
            moved = changed.map { DownloadQueue.Change(id: $0.key, place: $0.value) }
            planned = plan
        }
        do { try catalog.insert(entries, moving: moved.map { ($0.id, $0.place.priority, $0.place.position) }) } catch {
            rollBack()
            throw DownloadManagerError(.catalog(error.description))
        }
        if let planned {
            queue = planned
            for change in moved {
                table[change.id]?.entry.priority = change.place.priority
                table[change.id]?.entry.position = change.place.position
            }
        }
        for entry in entries {
            let status = Self.status(ofNew: entry)
            if planned == nil {
                queue.insert(entry.id, at: .init(priority: entry.priority, position: entry.position), status: status)
            }
            table[entry.id] = Managed(entry: entry, status: status, progress: TransferProgress())
            publish(.added(snapshot(of: entry.id)!))
        }
        schedule()
        return ids
    }

    /// Why `count` connections are refused: "connections must be 1…16, not 20".
    private static func connectionsRefusal(_ count: Int) -> String {
        let range = DownloadOptions.connectionRange
        return "connections must be \(range.lowerBound)…\(range.upperBound), not \(count)"
    }

    /// The status of a download just added: paused if added so, else queued.
    private static func status(ofNew entry: CatalogEntry) -> DownloadStatus {
        entry.status == CatalogEntry.Status.paused ? .paused : .queued
    }

    /// A download this manager holds (or this batch adds) for `url` going where `options` say, for
    /// ``AddOptions/reuseExisting``: one whose current URL it is first, else one that had it before. Folders are
    /// compared without `.` components and trailing slashes. A held download asked for with another checksum is
    /// refused rather than returned unverified.
    private func heldDownload(
        _ url: String, _ options: AddOptions, alsoAmong batch: [CatalogEntry]
    ) throws(DownloadManagerError) -> DownloadID? {
        let folder = Self.comparable(absolutePath(options.directory ?? configuration.downloadDirectory))
        let kind: CatalogEntry.DestinationKind = options.out == nil ? .directory : .file
        let path = options.out.map { withoutDotComponents($0.hasPrefix("/") ? $0 : folder + "/" + $0) } ?? folder
        let candidates = batch + queue.order().compactMap { id in table[id].flatMap { $0.status == .removed ? nil : $0.entry } }
        let here = candidates.filter {
            $0.destinationKind == kind && Self.comparable($0.destinationPath) == Self.comparable(path)
        }
        guard let entry = here.first(where: { $0.url == url }) ?? here.first(where: { $0.options.formerURLs.contains(url) })
        else { return nil }
        if let checksum = options.checksum, entry.checksum != checksum.description {
            throw DownloadManagerError(
                .invalidRequest(
                    "download \(entry.id) of \(url) is already held with \(entry.checksum.map { "checksum \($0)" } ?? "no checksum")"))
        }
        return entry.id
    }

    /// A path as ``heldDownload`` compares it: without `.` components, repeated or trailing slashes.
    private static func comparable(_ path: String) -> String {
        var cleaned = withoutDotComponents(path)
        while cleaned.count > 1 && cleaned.hasSuffix("/") { cleaned.removeLast() }
        return cleaned
    }

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
    private func resetMirrors(_ id: DownloadID) {
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
    private func keep(_ changes: [DownloadQueue.Change]) throws(DownloadManagerError) {
        do {
            try catalog.setPositions(changes.map { ($0.id, $0.place.priority, $0.place.position) })
        } catch { throw DownloadManagerError(.catalog(error.description)) }
        queue.apply(changes)
        for change in changes {
            table[change.id]?.entry.priority = change.place.priority
            table[change.id]?.entry.position = change.place.position
        }
    }

    // MARK: Settings that change while downloads run

    /// Changes how many downloads transfer at once (at least 1). Raised, queued downloads start at once; lowered,
    /// running downloads go on and no other starts until fewer run.
    public func setMaxConcurrentDownloads(_ count: Int) throws(DownloadManagerError) {
        try checkOpen()
        guard count >= 1 else {
            throw DownloadManagerError(.invalidRequest("the concurrent downloads must be at least 1, not \(count)"))
        }
        configuration.maxConcurrentDownloads = count
        schedule()
    }

    /// Changes the limit over all downloads, in bytes per second (nil: none). Running downloads follow it within
    /// about a second.
    public func setRateLimit(_ bytesPerSecond: Int64?) throws(DownloadManagerError) {
        try checkOpen()
        if let bytesPerSecond {
            guard bytesPerSecond > 0 else {
                throw DownloadManagerError(.invalidRequest("the rate limit must be positive, not \(bytesPerSecond)"))
            }
            rateLimiter.bytesPerSecond = bytesPerSecond
        }
        rateLimiter.isEnabled = bytesPerSecond != nil
        configuration.rateLimit = bytesPerSecond
    }

    /// Changes download `id`'s own limit, in bytes per second within the manager's (nil: none); a running download
    /// follows it within about a second. Kept in the catalog.
    public func setRateLimit(_ id: DownloadID, _ bytesPerSecond: Int64?) throws(DownloadManagerError) {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        if let bytesPerSecond, bytesPerSecond <= 0 {
            throw DownloadManagerError(.invalidRequest("the rate limit must be positive, not \(bytesPerSecond)"))
        }
        managed.entry.options.rateLimit = bytesPerSecond
        managed.entry.updatedAt = Date().timeIntervalSince1970
        do { try catalog.update(managed.entry) } catch { throw DownloadManagerError(.catalog(error.description)) }
        table[id] = managed
        if let run = managed.run {
            if let bytesPerSecond { run.limiter.bytesPerSecond = bytesPerSecond }
            run.limiter.isEnabled = bytesPerSecond != nil
        }
    }

    /// Changes a download's connections, engine settings and headers (aria2's `changeOption`), all in one step
    /// of the actor, so changes made at once by two callers to different settings both stay. Not finished
    /// downloads only; a running one starts its transfer again with them (keeping its bytes) when they changed.
    /// - Parameters:
    ///   - id: the download.
    ///   - connections: `.some(nil)` for the manager's choice; nil leaves them.
    ///   - tuning: its non-nil settings replace the download's; the others stay.
    ///   - headers: replace every header; nil leaves them.
    ///   - headerFields: set these headers by name (replacing those of the same name), after `headers`.
    public func setOptions(
        _ id: DownloadID, connections: Int?? = nil, tuning: Tuning? = nil, headers: HTTPHeaders? = nil,
        headerFields: HTTPHeaders? = nil
    ) throws(DownloadManagerError) {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        guard managed.status != .completed, managed.status != .removed else {
            throw DownloadManagerError(.invalidRequest("download \(id) is \(managed.status.name); its options are final"))
        }
        if case .some(.some(let count)) = connections, !DownloadOptions.connectionRange.contains(count) {
            throw DownloadManagerError(.invalidRequest(Self.connectionsRefusal(count)))
        }
        let before = managed.entry
        if let connections { managed.entry.options.connections = connections }
        if let patch = tuning {
            var merged = managed.entry.options.tuning
            if let value = patch.maxRetries { merged.maxRetries = value }
            if let value = patch.retryDelay { merged.retryDelay = value }
            if let value = patch.stallTimeout { merged.stallTimeout = value }
            if let value = patch.connectTimeout { merged.connectTimeout = value }
            if let value = patch.minimumSplitSize { merged.minimumSplitSize = value }
            managed.entry.options.tuning = merged
        }
        if let headers { managed.entry.headers = headers.map { "\($0.name): \($0.value)" } }
        if let headerFields {
            let names = Set(headerFields.map { $0.name.lowercased() })
            managed.entry.headers.removeAll { line in
                Downloader.parseHeaderLine(line).map { names.contains($0.0.lowercased()) } ?? false
            }
            managed.entry.headers += headerFields.map { "\($0.name): \($0.value)" }
        }
        guard managed.entry != before else { return }  // nothing changed: a running transfer goes on
        managed.entry.updatedAt = Date().timeIntervalSince1970
        do { try catalog.update(managed.entry) } catch { throw DownloadManagerError(.catalog(error.description)) }
        if managed.run != nil, managed.status == .running { managed.restartAfterRun = true }
        table[id] = managed
        if managed.restartAfterRun { stopRun(id) }
    }

    /// Changes how many connections all running downloads may hold to one host (at least 1). Lowered, running
    /// downloads keep the connections they have; new ones are granted once the host is below the cap.
    public func setMaxConnectionsPerHost(_ count: Int) throws(DownloadManagerError) {
        try checkOpen()
        guard count >= 1 else {
            throw DownloadManagerError(.invalidRequest("the connections per host must be at least 1, not \(count)"))
        }
        configuration.maxConnectionsPerHost = count
        hosts.setCap(count)
        schedule()
    }

    /// Changes a download's priority: higher priorities start first (running downloads are not stopped).
    public func setPriority(_ id: DownloadID, _ priority: Int) throws(DownloadManagerError) {
        try checkOpen()
        guard let managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        try keep([DownloadQueue.Change(id: id, place: .init(priority: priority, position: managed.entry.position))])
        schedule()
    }

    /// Gives a download a new URL (an expired signed link, a rotated token) and, if given, new headers. Its
    /// partial data is resumed from the new URL only if the server proves the file is the same (its saved
    /// `ETag` or `Last-Modified` with `If-Range`); otherwise the download starts over and says why. A running
    /// download switches at once.
    public func updateSource(_ id: DownloadID, url: String, headers: HTTPHeaders? = nil) throws(DownloadManagerError) {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        do { _ = try validateURL(url) } catch { throw DownloadManagerError(.invalidRequest(error.message)) }
        guard managed.status != .completed, managed.status != .removed else {
            throw DownloadManagerError(.invalidRequest("download \(id) is \(managed.status.name); its source is final"))
        }
        Self.point(&managed.entry, at: url)
        if let headers { managed.entry.headers = headers.map { "\($0.name): \($0.value)" } }
        managed.entry.updatedAt = Date().timeIntervalSince1970
        do { try catalog.update(managed.entry) } catch { throw DownloadManagerError(.catalog(error.description)) }
        if managed.run != nil, managed.status == .running { managed.restartAfterRun = true }
        table[id] = managed
        if managed.restartAfterRun { stopRun(id) }
    }

    /// ``updateSource(_:url:headers:)-(_,String,_)`` with a `URL` (its `absoluteString`).
    public func updateSource(_ id: DownloadID, url: URL, headers: HTTPHeaders? = nil) throws(DownloadManagerError) {
        try updateSource(id, url: url.absoluteString, headers: headers)
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
    private var closing: Task<Void, Never>?

    // MARK: Internals

    private var isIdle: Bool { queue.isIdle }

    /// A rate for the limiter while it is switched off (it is never consulted then).
    private static let unlimitedRate: Int64 = 1 << 40

    private func checkOpen() throws(DownloadManagerError) {
        if isClosed { throw DownloadManagerError(.closed) }
    }

    /// Applies `action` to download `id`; throws if it cannot be applied. Returns the catalog's error when the
    /// change was made but not kept: the caller finishes what the change needs (stopping the run, scheduling) and
    /// then throws it, so a client is never told a change is kept that a power cut would undo (an RPC's pause
    /// answered while the disk failed was waiting after the reboot, PowerCutServeTests). The row is written again
    /// with the next change and at close (``saveUnsaved()``).
    @discardableResult
    private func transition(_ id: DownloadID, _ action: DownloadAction) throws(DownloadManagerError) -> DownloadManagerError? {
        try checkOpen()
        saveUnsaved()
        guard let managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        guard let next = managed.status.after(action) else {
            throw DownloadManagerError(.illegalTransition(from: managed.status, action: action))
        }
        return setStatus(id, next).map { DownloadManagerError(.catalog($0.description)) }
    }

    /// Writes again the rows whose last change the catalog did not take.
    private func saveUnsaved() {
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
    private func setStatus(_ id: DownloadID, _ status: DownloadStatus) -> CatalogError? {
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

    /// Starts queued downloads while slots are free, in queue order, skipping those whose host is at its cap (the
    /// queue's rules: ``DownloadQueue/toStart(free:acquireHost:)``).
    private func schedule() {
        guard !isClosed else { return }
        let free = max(1, configuration.maxConcurrentDownloads) - queue.liveRuns
        let hosts = self.hosts
        let table = self.table
        let starting = queue.toStart(free: free) { id in
            guard let url = table[id]?.entry.url else { return false }
            return hosts.acquire(Self.hostKey(url), upTo: 1) == 1
        }
        for id in starting {
            guard let url = table[id]?.entry.url else { continue }
            start(id, host: Self.hostKey(url))
        }
        if isIdle { resumeIdleWaiters() }
    }

    private func start(_ id: DownloadID, host: String) {
        guard var managed = table[id] else { return }
        nextRunToken += 1
        let limiter = RateLimiter(bytesPerSecond: managed.entry.options.rateLimit ?? Self.unlimitedRate, within: rateLimiter)
        limiter.isEnabled = managed.entry.options.rateLimit != nil
        let run = ManagerRun(token: nextRunToken, host: host, limiter: limiter)
        managed.run = run
        managed.restartAfterRun = false
        table[id] = managed
        queue.runStarted(id)
        setStatus(id, .running)

        let (request, options) = run.request(for: managed.entry, configuration: configuration, claims: claims, hosts: hosts)
        let (events, sink) = AsyncStream.makeStream(of: DownloadEvent.self, bufferingPolicy: .unbounded)
        let downloader = self.downloader
        let task = Task { [weak self] in
            let pump = Task { [weak self] in
                for await event in events { await self?.engineEvent(id, token: run.token, event) }
            }
            let outcome: Result<DownloadResult, DownloadError>
            do throws(DownloadError) {
                outcome = .success(try await downloader.download(request, options: options) { sink.yield($0) })
            } catch {
                outcome = .failure(error)
            }
            sink.finish()
            await pump.value
            await self?.runEnded(id, run: run, outcome)
        }
        run.task.withLock { $0 = task }
    }

    private func engineEvent(_ id: DownloadID, token: Int, _ event: DownloadEvent) {
        guard var managed = table[id], managed.run?.token == token else { return }
        switch event {
        case .destinationResolved(let path):
            // Kept in memory until the next catalog write: after a crash, a download into a folder finds its
            // partial again by name (its state file names its URL).
            managed.entry.resolvedPath = path
            table[id] = managed
            publish(.pathResolved(id, path))
        case .resuming(let from, let note):
            managed.progress.bytes = from
            table[id] = managed
            if let note { publish(.notice(id, note)) }
        case .receiving(_, _, let total):
            managed.progress.total = total
            managed.entry.totalBytes = total
            table[id] = managed
        case .progress where managed.status != .running, .notice where managed.status != .running,
            .retrying where managed.status != .running:
            break  // the user paused, cancelled or removed it: the run's last words are not news
        case .progress(let progress):
            managed.meter.add(bytes: progress.bytes, at: downloader.clock.uptime())
            managed.progress = TransferProgress(
                bytes: progress.bytes, total: progress.total, durableBytes: progress.durableBytes,
                bytesPerSecond: managed.meter.bytesPerSecond,
                secondsLeft: managed.meter.secondsLeft(bytes: progress.bytes, total: progress.total))
            table[id] = managed
            publish(.progress(id, managed.progress))
        case .redirected:
            break
        case .restarting(let reason):
            managed.progress.bytes = 0
            managed.lastProblem = "restarted from zero: \(reason)"
            table[id] = managed
            publish(.restarting(id, reason))
        case .retrying(let attempt, let maxRetries, let delay, let reason):
            managed.lastProblem = "\(reason) (retry \(attempt) of \(maxRetries))"
            table[id] = managed
            publish(.retrying(id, attempt: attempt, maxRetries: maxRetries, delay: delay, reason: reason))
        case .notice(let text):
            publish(.notice(id, text))
        }
    }

    private func runEnded(_ id: DownloadID, run: ManagerRun, _ outcome: Result<DownloadResult, DownloadError>) {
        hosts.release(run.host, 1 + run.extra.load(ordering: .relaxed))
        queue.runEnded(id, current: table[id]?.run === run)
        defer { schedule() }
        guard var managed = table[id], managed.run === run else { return }
        managed.run = nil
        table[id] = managed
        // A download the user paused, cancelled or removed keeps that status; so does one stopped by close().
        guard managed.status == .running, !isClosed else { return }
        // A run that finished before it could be stopped for new settings or a new source is done, not redone.
        if managed.restartAfterRun, case .failure = outcome {
            let host = Self.hostKey(managed.entry.url)  // the new source's host, which may not be the old one
            if hosts.acquire(host, upTo: 1) == 1 {
                start(id, host: host)
            } else {
                setStatus(id, .queued)  // a new run for the new source, when its host has room
            }
            return
        }
        switch outcome {
        case .success(let result):
            managed.entry.resolvedPath = result.destination
            managed.entry.totalBytes = result.bytes
            managed.entry.completedBytes = result.bytes
            managed.progress = TransferProgress(bytes: result.bytes, total: result.bytes, durableBytes: result.bytes)
            table[id] = managed
            publish(.progress(id, managed.progress))
            if result.alreadyComplete { publish(.alreadyComplete(id)) }
            setStatus(id, .completed)
        case .failure(let error):
            managed.entry.completedBytes = managed.progress.durableBytes
            table[id] = managed
            if let next = nextMirror(managed.entry, after: error) {
                switchSource(id, to: next, mirror: true)
                publish(.notice(id, "\(error.message); trying the next mirror, \(next)"))
                setStatus(id, .queued)
                return
            }
            setStatus(id, .failed(DownloadFailure(error)))
        }
    }

    /// The mirror to go on from after `error`, if one is left untried and another server could help.
    private func nextMirror(_ entry: CatalogEntry, after error: DownloadError) -> String? {
        let all = entry.options.mirrors
        // Every mirror once: the others than the current one, or all of them when the current URL is not listed.
        let others = all.contains(entry.url) ? all.count - 1 : all.count
        guard all.count > 1, entry.options.mirrorsTried < others else { return nil }
        switch error.code {
        // Local problems, which another server cannot mend.
        case .cancelled, .io, .destinationExists, .invalidURL, .unsupportedScheme, .invalidOption, .unusableState,
            .nothingToResume:
            return nil
        default: break
        }
        let current = all.firstIndex(of: entry.url) ?? -1
        return all[(current + 1) % all.count]
    }

    /// Points the download at `url`, keeping its partial data for a server that proves the file is the same.
    private func switchSource(_ id: DownloadID, to url: String, mirror: Bool) {
        guard var managed = table[id] else { return }
        Self.point(&managed.entry, at: url)
        if mirror { managed.entry.options.mirrorsTried += 1 }
        managed.entry.updatedAt = Date().timeIntervalSince1970
        try? catalog.update(managed.entry)
        table[id] = managed
    }

    /// The entry's URL becomes `url`, the old one kept among those whose partial data it may resume (the last
    /// 32: an older state's URL is then simply not resumed from).
    private static func point(_ entry: inout CatalogEntry, at url: String) {
        guard entry.url != url else { return }
        entry.options.formerURLs.removeAll { $0 == url || $0 == entry.url }
        entry.options.formerURLs.append(entry.url)
        if entry.options.formerURLs.count > 32 { entry.options.formerURLs.removeFirst(entry.options.formerURLs.count - 32) }
        entry.url = url
    }

    /// Edits every URL of download `id`'s file (aria2's `changeUri`) in one step of the actor: `edit` gets the
    /// list (the current URL among them) and changes it; the current URL stays if still listed, otherwise the
    /// download goes on from the first (a running one at once), as ``updateSource(_:url:headers:)-(_,String,_)``.
    /// One catalog write. Returns what `edit` returned.
    public func editMirrors<T: Sendable>(
        _ id: DownloadID, _ edit: @Sendable (inout [String]) throws -> T
    ) throws -> T {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        guard managed.status != .completed, managed.status != .removed else {
            throw DownloadManagerError(.invalidRequest("download \(id) is \(managed.status.name); its source is final"))
        }
        var urls = managed.entry.options.mirrors.isEmpty ? [managed.entry.url] : managed.entry.options.mirrors
        let result = try edit(&urls)
        var unique: [String] = []
        for url in urls where !unique.contains(url) { unique.append(url) }
        guard !unique.isEmpty else { throw DownloadManagerError(.invalidRequest("a download needs at least one URL")) }
        for url in unique {
            do { _ = try validateURL(url) } catch { throw DownloadManagerError(.invalidRequest(error.message)) }
        }
        managed.entry.options.mirrors = unique.count > 1 ? unique : []
        managed.entry.options.mirrorsTried = 0
        let moves = !unique.contains(managed.entry.url)
        if moves { Self.point(&managed.entry, at: unique[0]) }
        managed.entry.updatedAt = Date().timeIntervalSince1970
        do { try catalog.update(managed.entry) } catch { throw DownloadManagerError(.catalog(error.description)) }
        if moves, managed.run != nil, managed.status == .running { managed.restartAfterRun = true }
        table[id] = managed
        if managed.restartAfterRun { stopRun(id) }
        return result
    }

    private func stopRun(_ id: DownloadID) {
        table[id]?.run?.task.withLock { $0 }?.cancel()
    }

    private func snapshot(of id: DownloadID) -> DownloadSnapshot? {
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
            tuning: entry.options.tuning, lastProblem: managed.lastProblem ?? entry.errorMessage)
    }

    private func subscribe(
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

    private func unsubscribe(_ key: Int) {
        subscribers.remove(key)
    }

    private func publish(_ event: DownloadManagerEvent) {
        subscribers.publish(event)
    }

    private func finishStreams(for id: DownloadID) {
        subscribers.finish(for: id)
    }

    private func resumeIdleWaiters() {
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
