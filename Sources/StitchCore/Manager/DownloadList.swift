public import Foundation
public import Observation
import StitchLocks

/// A ``DownloadManager``'s downloads for a SwiftUI view: an `@Observable` list, on the main actor, that follows the
/// manager's events, with the intents a row's buttons call.
///
/// ```swift
/// @State var list = DownloadList(manager: manager)
///
/// var body: some View {
///     List(list.downloads) { download in
///         ProgressView(value: download.progress.fractionCompleted ?? 0)
///         Button("Pause") { Task { try await list.pause(download.id) } }
///     }
///     .task { await list.start() }
/// }
/// ```
///
/// ``start()`` loads the downloads and follows the manager's events (``DownloadManager/events(buffering:)``) until
/// ``stop()``, until the list is gone or the manager closes. A progress report changes the download's
/// ``DownloadSnapshot/progress`` in place; any other event reloads that download's snapshot from the manager, so
/// the list holds what ``DownloadManager/downloads()`` says once the events are in. Each intent waits for the
/// manager and shows its effect before it returns. Changes the manager makes without an event (a move in the queue,
/// a new priority, new options) show after ``refresh()``.
@MainActor @Observable
public final class DownloadList {
    /// The manager whose downloads these are.
    public let manager: DownloadManager
    /// Every download of the manager, in queue order (priority, then position), as last reported.
    public private(set) var downloads: [DownloadSnapshot] = []
    /// The progress of all of them together (``AggregateProgress``), kept with ``downloads``.
    public private(set) var aggregate = AggregateProgress()
    /// Whether the list follows the manager's events (between ``start()`` and ``stop()``, until the manager closes).
    public private(set) var isFollowing = false

    /// The task following the events; cancelled by ``stop()`` or when the list goes away.
    private let following = Locked<Task<Void, Never>?>(nil)
    /// Bumped by each ``start()`` and ``stop()``: a follower that is not the latest changes nothing.
    @ObservationIgnored private var generation = 0

    /// A list of `manager`'s downloads, empty until ``start()``.
    public init(manager: DownloadManager) {
        self.manager = manager
    }

    deinit {
        following.withLock { $0 }?.cancel()
    }

    /// Loads the downloads and follows the manager's events from then on; returns once ``downloads`` holds them.
    /// Calling it again starts over (reloading everything).
    public func start() async {
        stop()
        generation += 1
        let current = generation
        let (events, snapshots) = await manager.subscribeWithSnapshots()
        guard current == generation else { return }  // stopped or started again meanwhile
        set(snapshots)
        isFollowing = true
        let task = Task { [weak self] in
            for await event in events {
                guard let self, current == self.generation else { return }
                await self.apply(event)
            }
            guard let self, current == self.generation else { return }
            self.isFollowing = false
        }
        following.withLock { $0 = task }
    }

    /// Stops following the manager's events; ``downloads`` keeps what it holds.
    public func stop() {
        generation += 1
        following.withLock { task in
            task?.cancel()
            task = nil
        }
        isFollowing = false
    }

    /// Reloads every download from the manager (after a change that sends no event: a move, a priority).
    public func refresh() async {
        let snapshots = await manager.downloads()
        set(snapshots)
    }

    /// The download with this id, as last reported.
    public func download(_ id: DownloadID) -> DownloadSnapshot? {
        downloads.first { $0.id == id }
    }

    // MARK: Intents

    /// Adds a download of `url` (``DownloadManager/add(_:options:)-(URL,_)``) and returns its id; it is in
    /// ``downloads`` when this returns.
    @discardableResult
    public func add(
        _ url: URL, options: DownloadManager.AddOptions = .init()
    ) async throws(DownloadManagerError) -> DownloadID {
        let id = try await manager.add(url, options: options)
        // An add at a place moves the downloads after it, which send no event of their own: read them all again.
        if options.position != nil { await refresh() } else { await reload(id) }
        return id
    }

    /// Pauses download `id` (``DownloadManager/pause(_:)``).
    public func pause(_ id: DownloadID) async throws(DownloadManagerError) {
        try await manager.pause(id)
        await reload(id)
    }

    /// Queues download `id` again (``DownloadManager/resume(_:)``).
    public func resume(_ id: DownloadID) async throws(DownloadManagerError) {
        try await manager.resume(id)
        await reload(id)
    }

    /// Cancels download `id` (``DownloadManager/cancel(_:)``), keeping its partial data.
    public func cancel(_ id: DownloadID) async throws(DownloadManagerError) {
        try await manager.cancel(id)
        await reload(id)
    }

    /// Removes download `id` from the manager (``DownloadManager/remove(_:deletingFiles:)``) and from the list.
    public func remove(_ id: DownloadID, deletingFiles: Bool = false) async throws(DownloadManagerError) {
        try await manager.remove(id, deletingFiles: deletingFiles)
        await reload(id)
    }

    /// Pauses every queued and running download (``DownloadManager/pauseAll()``).
    public func pauseAll() async throws(DownloadManagerError) {
        do { try await manager.pauseAll() } catch {
            await refresh()
            throw error
        }
        await refresh()
    }

    /// Queues every paused download again (``DownloadManager/resumeAll()``).
    public func resumeAll() async throws(DownloadManagerError) {
        do { try await manager.resumeAll() } catch {
            await refresh()
            throw error
        }
        await refresh()
    }

    // MARK: Following

    private func apply(_ event: DownloadManagerEvent) async {
        switch event {
        case .progress(let id, let progress):
            // Reports only come while a download runs; one for a download the list holds in another status is
            // older than what the list holds.
            guard let index = downloads.firstIndex(where: { $0.id == id }), downloads[index].status == .running
            else { return }
            downloads[index].progress = progress
            aggregate = AggregateProgress(downloads)
        case .added(let snapshot):
            insert(snapshot)
        case .statusChanged(let id, .removed):
            drop(id)
        default:
            await reload(event.id)
        }
    }

    /// Takes the manager's snapshot of download `id` now (drops it when the manager no longer has it).
    private func reload(_ id: DownloadID) async {
        guard let snapshot = await manager.download(id) else {
            drop(id)
            return
        }
        insert(snapshot)
    }

    private func set(_ snapshots: [DownloadSnapshot]) {
        downloads = snapshots
        aggregate = AggregateProgress(snapshots)
    }

    /// Replaces the download's snapshot, or inserts it at its place in the queue order.
    private func insert(_ snapshot: DownloadSnapshot) {
        if let index = downloads.firstIndex(where: { $0.id == snapshot.id }) {
            guard downloads[index] != snapshot else { return }
            downloads[index] = snapshot
        } else {
            let index = downloads.firstIndex { Self.precedes(snapshot, $0) } ?? downloads.endIndex
            downloads.insert(snapshot, at: index)
        }
        aggregate = AggregateProgress(downloads)
    }

    private func drop(_ id: DownloadID) {
        guard let index = downloads.firstIndex(where: { $0.id == id }) else { return }
        downloads.remove(at: index)
        aggregate = AggregateProgress(downloads)
    }

    /// The manager's queue order: higher priority first, then lower position, then lower id.
    private static func precedes(_ a: DownloadSnapshot, _ b: DownloadSnapshot) -> Bool {
        (a.priority, -a.position, b.id) > (b.priority, -b.position, a.id)
    }
}
