/// The manager's queue as a pure state machine: the order downloads start in, their places in it, how a move or an
/// add at a place rewrites those places, and which queued downloads start when slots are free. No I/O, no catalog,
/// no actor: ``DownloadManager`` asks it, writes what it returns to the catalog, and tells it what was kept. Every
/// rule is a table test (DownloadQueueTests), as async-http-client tests its connection pool's state machine.
///
/// The rules:
/// - The order is by priority (higher first), then position (lower first), then id: every download the manager
///   holds has a place, whatever its status.
/// - The waiting queue is the downloads queued or paused, in that order (aria2's waiting list holds both).
/// - A move within the waiting queue (aria2's `changePosition`: from the start, from where it is, from the end;
///   clamped to the ends) takes the priority of the download it now stands before (at the end, after), and the
///   waiting downloads' own positions, sorted, are handed out again in the new order — so no download that is not
///   waiting changes its place among them. Only the places that change are returned.
/// - An add at a place is an add at the end followed by that move, decided before anything is written.
/// - When slots are free, queued downloads start in order; one whose host is at its cap is skipped (it keeps its
///   place and starts when the host frees up), and one whose last run is still ending waits for that end.
struct DownloadQueue: Sendable {
    /// Where a download stands in the order.
    struct Place: Sendable, Hashable {
        var priority: Int
        var position: Int64
    }

    /// A place that changed: what the catalog is to keep.
    struct Change: Sendable, Hashable {
        var id: DownloadID
        var place: Place
    }

    /// Where to move a waiting download, counted as aria2's `changePosition` counts.
    typealias Target = DownloadManager.QueuePosition

    /// Why a move cannot be made.
    enum MoveRefusal: Error, Sendable, Hashable {
        case unknown
        /// Not queued or paused (running, completed, failed): it is not in the waiting queue.
        case notWaiting(DownloadStatus)
    }

    /// A planned move: the download's new index in the waiting queue and the places to write. Applied with
    /// ``apply(_:)`` once the catalog has kept them.
    struct Move: Sendable, Hashable {
        var index: Int
        var changes: [Change]
    }

    private struct Item: Sendable {
        var place: Place
        var status: DownloadStatus
        /// A run is in flight (started and not yet ended), whatever the status says now.
        var hasRun = false
    }

    private var items: [DownloadID: Item] = [:]
    /// Every download in order, rebuilt lazily after additions, removals and moves.
    private var orderCache: [DownloadID]?
    /// Queued downloads in start order, from `queueHead` on; entries that have since left `queued` are skipped.
    private var queueCache: [DownloadID]?
    private var queueHead = 0
    /// Downloads queued or running (kept as a count: checking every item at each status change made a long list
    /// quadratic).
    private(set) var activeCount = 0
    /// Runs in flight: started and not yet ended (a paused download's run may still be ending).
    private(set) var liveRuns = 0
    /// Of ``liveRuns``, those only finishing (their bytes in: ``runFinishing()``): they hold no transfer slot.
    private(set) var finishingRuns = 0

    init() {}

    // MARK: Membership

    /// How many downloads it holds.
    var count: Int { items.count }

    func contains(_ id: DownloadID) -> Bool { items[id] != nil }

    func place(of id: DownloadID) -> Place? { items[id]?.place }

    func status(of id: DownloadID) -> DownloadStatus? { items[id]?.status }

    /// Whether the download has a run in flight.
    func hasRun(_ id: DownloadID) -> Bool { items[id]?.hasRun ?? false }

    /// Adds a download at `place` (one the caller has kept: a new download's, after the catalog's last, or a
    /// restored one's).
    mutating func insert(_ id: DownloadID, at place: Place, status: DownloadStatus) {
        precondition(items[id] == nil, "download \(id) is already in the queue")
        items[id] = Item(place: place, status: status)
        if Self.isActive(status) { activeCount += 1 }
        invalidate()
    }

    /// Forgets a download (removed). A run of it still ending counts until ``runEnded(_:current:)``.
    mutating func remove(_ id: DownloadID) {
        guard let item = items.removeValue(forKey: id) else { return }
        if Self.isActive(item.status) { activeCount -= 1 }
        invalidate()
    }

    /// Records a status change.
    mutating func setStatus(_ id: DownloadID, _ status: DownloadStatus) {
        guard var item = items[id], item.status != status else { return }
        activeCount += (Self.isActive(status) ? 1 : 0) - (Self.isActive(item.status) ? 1 : 0)
        if status == .queued { queueCache = nil }
        item.status = status
        items[id] = item
    }

    /// A run of the download started: it holds a slot until ``runEnded(_:current:)``.
    mutating func runStarted(_ id: DownloadID) {
        items[id]?.hasRun = true
        liveRuns += 1
    }

    /// A run's bytes are in: it gives its transfer slot back and goes on finishing until ``runEnded(_:current:finishing:)``.
    mutating func runFinishing() { finishingRuns += 1 }

    /// A run ended and gives its slot back. `current`: it was the download's current run (not one it had left, nor
    /// one of a download removed meanwhile), so the download may start again. `finishing`: it had said
    /// ``runFinishing()``.
    mutating func runEnded(_ id: DownloadID, current: Bool, finishing: Bool = false) {
        liveRuns -= 1
        if finishing { finishingRuns -= 1 }
        if current { items[id]?.hasRun = false }
    }

    /// No run in flight and nothing queued or running.
    var isIdle: Bool { liveRuns == 0 && activeCount == 0 }

    // MARK: Order

    /// Every download, in the order they start.
    mutating func order() -> [DownloadID] {
        if let orderCache { return orderCache }
        let sorted = items.sorted { Self.precedes(($0.key, $0.value.place), ($1.key, $1.value.place)) }.map(\.key)
        orderCache = sorted
        return sorted
    }

    /// The downloads waiting to start (queued or paused), in the order they would start.
    mutating func waiting() -> [DownloadID] {
        order().filter { items[$0].map { Self.isWaiting($0.status) } ?? false }
    }

    /// Whether `a` comes before `b`: higher priority, then lower position, then the lower id.
    static func precedes(_ a: (DownloadID, Place), _ b: (DownloadID, Place)) -> Bool {
        if a.1.priority != b.1.priority { return a.1.priority > b.1.priority }
        if a.1.position != b.1.position { return a.1.position < b.1.position }
        return a.0 < b.0
    }

    // MARK: Places

    /// The place before (`front`) or after (`back`) every download's, keeping the download's priority: it then
    /// stands first or last among those of its priority.
    func place(for id: DownloadID, at end: DownloadManager.QueuePlace) -> Place? {
        guard let item = items[id] else { return nil }
        let positions = items.values.map(\.place.position)
        let position = end == .front ? (positions.min() ?? 0) - 1 : (positions.max() ?? 0) + 1
        return Place(priority: item.place.priority, position: position)
    }

    /// Plans moving waiting download `id` to `target` within the waiting queue (see the rules above).
    mutating func planMove(_ id: DownloadID, to target: Target) -> Result<Move, MoveRefusal> {
        guard let item = items[id] else { return .failure(.unknown) }
        var waiting = waiting()
        guard let current = waiting.firstIndex(of: id) else { return .failure(.notWaiting(item.status)) }
        let last = waiting.count - 1
        let (base, offset) =
            switch target {
            case .fromStart(let n): (0, n)
            case .fromCurrent(let n): (current, n)
            case .fromEnd(let n): (last, n)
            }
        let (sum, overflow) = base.addingReportingOverflow(offset)
        let destination = overflow ? (offset < 0 ? 0 : last) : min(max(sum, 0), last)
        guard destination != current else { return .success(Move(index: current, changes: [])) }
        waiting.remove(at: current)
        waiting.insert(id, at: destination)
        let neighbour = destination + 1 < waiting.count ? waiting[destination + 1] : waiting[destination - 1]
        var priorities = Dictionary(uniqueKeysWithValues: waiting.map { ($0, items[$0]!.place.priority) })
        priorities[id] = items[neighbour]!.place.priority
        // The waiting downloads' own positions, sorted, handed out again in the new order: priorities never rise
        // along the queue, so that is the order asked for. Never two at one position.
        var positions = waiting.map { items[$0]!.place.position }.sorted()
        for index in positions.indices.dropFirst() where positions[index] <= positions[index - 1] {
            positions[index] = positions[index - 1] + 1
        }
        var changes: [Change] = []
        for (index, waitingID) in waiting.enumerated() {
            let place = Place(priority: priorities[waitingID]!, position: positions[index])
            if items[waitingID]!.place != place { changes.append(Change(id: waitingID, place: place)) }
        }
        return .success(Move(index: destination, changes: changes))
    }

    /// Sets the places the catalog has kept.
    mutating func apply(_ changes: [Change]) {
        guard !changes.isEmpty else { return }
        for change in changes { items[change.id]?.place = change.place }
        invalidate()
    }

    // MARK: Starting

    /// The queued downloads to start now, in order, at most `free` of them (the caller's free slots). `acquireHost`
    /// takes a slot on the download's host and says whether it could (at the host's cap, the download is skipped
    /// and keeps its place; the slots are the manager's, shared with running downloads' extra connections). A download whose last run is still ending is skipped too. The caller starts every download
    /// returned (``runStarted(_:)``, ``setStatus(_:_:)``): the queue's head has moved past them.
    mutating func toStart(free: Int, acquireHost: (DownloadID) -> Bool) -> [DownloadID] {
        guard free > 0 else { return [] }
        let queue: [DownloadID]
        if let queueCache {
            queue = queueCache
        } else {
            queue = order().filter { items[$0]?.status == .queued }
            queueCache = queue
            queueHead = 0
        }
        // Entries before the first one still waiting (for its host, or for its last run's end) are done with: the
        // head moves past them.
        var started: [DownloadID] = []
        var index = queueHead
        var skipped = false
        while index < queue.count && started.count < free {
            let id = queue[index]
            index += 1
            guard let item = items[id], item.status == .queued else {
                if !skipped { queueHead = index }
                continue
            }
            guard !item.hasRun, acquireHost(id) else {
                skipped = true
                continue
            }
            started.append(id)
            if !skipped { queueHead = index }
        }
        return started
    }

    // MARK: Helpers

    static func isActive(_ status: DownloadStatus) -> Bool { status == .queued || status == .running }

    static func isWaiting(_ status: DownloadStatus) -> Bool { status == .queued || status == .paused }

    private mutating func invalidate() {
        orderCache = nil
        queueCache = nil
    }
}
