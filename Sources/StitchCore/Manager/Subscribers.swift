/// The manager's event streams: who listens to which download (or to all), and handing each event to them. A
/// value the ``DownloadManager`` actor keeps, so every change to it is the actor's; a stream its consumer drops is
/// taken out by the actor when told (``remove(_:)``).
struct Subscribers {
    private struct Subscriber {
        /// The download it follows, or nil for every download.
        var id: DownloadID?
        var continuation: AsyncStream<DownloadManagerEvent>.Continuation
    }

    private var subscribers: [Int: Subscriber] = [:]
    private var nextKey = 0

    /// Adds a listener to `id` (nil: every download) on `continuation`; returns its key for ``remove(_:)``.
    mutating func add(_ id: DownloadID?, _ continuation: AsyncStream<DownloadManagerEvent>.Continuation) -> Int {
        let key = nextKey
        nextKey += 1
        subscribers[key] = Subscriber(id: id, continuation: continuation)
        return key
    }

    /// Forgets the listener with `key` (its stream ended).
    mutating func remove(_ key: Int) {
        subscribers[key] = nil
    }

    /// Hands `event` to every listener of its download and of every download.
    func publish(_ event: DownloadManagerEvent) {
        guard !subscribers.isEmpty else { return }
        let id = event.id
        for (_, subscriber) in subscribers where subscriber.id == nil || subscriber.id == id {
            subscriber.continuation.yield(event)
        }
    }

    /// Ends the streams that follow download `id` (it was removed).
    mutating func finish(for id: DownloadID) {
        for (key, subscriber) in subscribers where subscriber.id == id {
            subscriber.continuation.finish()
            subscribers[key] = nil
        }
    }

    /// Ends every stream (the manager closes).
    mutating func finishAll() {
        for (_, subscriber) in subscribers { subscriber.continuation.finish() }
        subscribers.removeAll()
    }
}
