import Testing

@testable import StitchCore

/// The manager's queue rules (``DownloadQueue``), without a catalog, an actor or a network: the order, moves within
/// the waiting queue as aria2's `changePosition` counts them, adds at a place, and which queued downloads start when
/// slots are free. Each case is a row: the queue before, the step, what it returns and the queue after.
@Suite struct DownloadQueueTests {
    /// Downloads named by letter: `a` is id 0xa, and so on (so the id order is the letter order).
    static func id(_ letter: Character) -> DownloadID { DownloadID(rawValue: UInt64(String(letter), radix: 16)!) }

    static func letters(_ ids: [DownloadID]) -> String {
        String(ids.map { Character(String($0.rawValue, radix: 16)) })
    }

    /// A queue of `rows`: letter, priority, position, status.
    static func queue(_ rows: [(Character, Int, Int64, DownloadStatus)]) -> DownloadQueue {
        var queue = DownloadQueue()
        for (letter, priority, position, status) in rows {
            queue.insert(id(letter), at: .init(priority: priority, position: position), status: status)
        }
        return queue
    }

    /// Five downloads of one priority at positions 1…5, queued unless said otherwise.
    static func five(_ statuses: [DownloadStatus] = Array(repeating: .queued, count: 5)) -> DownloadQueue {
        queue(zip("abcde", statuses).enumerated().map { ($1.0, 0, Int64($0 + 1), $1.1) })
    }

    // MARK: Order

    /// Higher priority first, then lower position, then lower id; every status has a place; the waiting queue is
    /// the queued and paused ones in that order.
    @Test func orderIsPriorityThenPositionThenID() {
        var queue = Self.queue([
            ("a", 0, 5, .queued), ("b", 1, 9, .paused), ("c", 0, 2, .completed),
            ("d", 0, 2, .running), ("e", 1, 1, .queued), ("f", -1, 0, .paused),
        ])
        #expect(Self.letters(queue.order()) == "ebcdaf")
        #expect(Self.letters(queue.waiting()) == "ebaf")
        #expect(queue.activeCount == 3)
    }

    // MARK: Moves

    /// aria2's three ways of counting, clamped to the ends, over five waiting downloads (`c` is at index 2).
    @Test(arguments: [
        (DownloadManager.QueuePosition.fromStart(0), 0, "cabde"),
        (.fromStart(4), 4, "abdec"),
        (.fromStart(99), 4, "abdec"),
        (.fromStart(-3), 0, "cabde"),
        (.fromCurrent(1), 3, "abdce"),
        (.fromCurrent(-1), 1, "acbde"),
        (.fromCurrent(0), 2, "abcde"),
        (.fromCurrent(Int.max), 4, "abdec"),
        (.fromCurrent(Int.min), 0, "cabde"),
        (.fromEnd(0), 4, "abdec"),
        (.fromEnd(-1), 3, "abdce"),
        (.fromEnd(-10), 0, "cabde"),
    ])
    func moveCountsAsAria2(_ target: DownloadManager.QueuePosition, _ index: Int, _ after: String) throws {
        var queue = Self.five()
        let move = try queue.planMove(Self.id("c"), to: target).get()
        #expect(move.index == index)
        queue.apply(move.changes)
        #expect(Self.letters(queue.waiting()) == after)
        // Only places that changed are written, and no two downloads share a position.
        let places = "abcde".map { queue.place(of: Self.id($0))!.position }
        #expect(Set(places).count == 5)
        #expect(move.changes.allSatisfy { change in change.place != Self.five().place(of: change.id) })
        if after == "abcde" { #expect(move.changes.isEmpty) }
    }

    /// A moved download takes the priority of the one it now stands before (at the end, of the one before it), so
    /// the order asked for holds; downloads that are not waiting keep their places among the waiting ones.
    @Test func aMoveTakesItsNeighboursPriorityAndLeavesOthersInPlace() throws {
        var queue = Self.queue([
            ("a", 5, 1, .queued), ("b", 5, 2, .running), ("c", 0, 3, .paused),
            ("d", 0, 4, .completed), ("e", 0, 5, .queued),
        ])
        #expect(Self.letters(queue.waiting()) == "ace")
        let front = try queue.planMove(Self.id("e"), to: .fromStart(0)).get()
        queue.apply(front.changes)
        #expect(Self.letters(queue.waiting()) == "eac")
        #expect(queue.place(of: Self.id("e"))?.priority == 5)
        #expect(queue.place(of: Self.id("b")) == .init(priority: 5, position: 2), "a running download keeps its place")
        #expect(queue.place(of: Self.id("d")) == .init(priority: 0, position: 4), "a completed one too")
        let end = try queue.planMove(Self.id("a"), to: .fromEnd(0)).get()
        queue.apply(end.changes)
        #expect(Self.letters(queue.waiting()) == "eca")
        #expect(queue.place(of: Self.id("a"))?.priority == 0)
    }

    /// Positions that collide (a catalog written by an older version) are spread apart, never shared.
    @Test func collidingPositionsAreSpreadApart() throws {
        var queue = Self.queue([("a", 0, 1, .queued), ("b", 0, 1, .queued), ("c", 0, 1, .queued)])
        let move = try queue.planMove(Self.id("a"), to: .fromEnd(0)).get()
        queue.apply(move.changes)
        #expect(Self.letters(queue.waiting()) == "bca")
        #expect(Set("abc".map { queue.place(of: Self.id($0))!.position }).count == 3)
    }

    /// Only waiting downloads move; an unknown one is said to be unknown.
    @Test(arguments: [DownloadStatus.running, .completed, .failed(DownloadFailure(DownloadError(.io, "disk")))])
    func onlyWaitingDownloadsMove(_ status: DownloadStatus) {
        var queue = Self.five([.queued, .queued, status, .queued, .queued])
        #expect(queue.planMove(Self.id("c"), to: .fromStart(0)) == .failure(.notWaiting(status)))
        #expect(queue.planMove(Self.id("f"), to: .fromStart(0)) == .failure(.unknown))
    }

    /// Front and back: before or after every download's position, keeping the priority.
    @Test func frontAndBackKeepThePriority() {
        var queue = Self.queue([("a", 0, 3, .queued), ("b", 2, 7, .queued), ("c", 0, 5, .queued)])
        queue.apply([.init(id: Self.id("c"), place: queue.place(for: Self.id("c"), at: .front)!)])
        #expect(queue.place(of: Self.id("c")) == .init(priority: 0, position: 2))
        #expect(Self.letters(queue.order()) == "bca")
        queue.apply([.init(id: Self.id("b"), place: queue.place(for: Self.id("b"), at: .back)!)])
        #expect(queue.place(of: Self.id("b")) == .init(priority: 2, position: 8))
        #expect(Self.letters(queue.order()) == "bca", "a higher priority still starts first")
    }

    // MARK: Starting

    /// Queued downloads start in order while slots are free; paused, running and finished ones never do.
    @Test func queuedDownloadsStartInOrderWhileSlotsAreFree() {
        var queue = Self.five([.paused, .queued, .running, .queued, .queued])
        #expect(Self.letters(queue.toStart(free: 2) { _ in true }) == "bd")
        #expect(Self.letters(queue.toStart(free: 0) { _ in true }) == "")
        // The caller starts every download returned: the head has moved past them.
        #expect(Self.letters(queue.toStart(free: 9) { _ in true }) == "e")
    }

    /// A download whose host is at its cap is skipped and keeps its place: it starts first once the host has room,
    /// before later downloads.
    @Test func aDownloadWhoseHostIsFullKeepsItsPlace() {
        var queue = Self.queue([("a", 0, 1, .queued), ("b", 0, 2, .queued), ("c", 0, 3, .queued)])
        let hosts = [Self.id("a"): "x", Self.id("b"): "y", Self.id("c"): "y"]
        var room = ["x": 0, "y": 1]
        let take = { (id: DownloadID) -> Bool in
            let host = hosts[id]!
            guard room[host, default: 0] > 0 else { return false }
            room[host, default: 0] -= 1
            return true
        }
        let first = queue.toStart(free: 3, acquireHost: take)
        #expect(Self.letters(first) == "b", "a's host is full; c's host took b")
        queue.setStatus(Self.id("b"), .running)
        queue.runStarted(Self.id("b"))
        room["x"] = 1
        room["y"] = 1
        #expect(Self.letters(queue.toStart(free: 1, acquireHost: take)) == "a", "a first, it kept its place")
    }

    /// A run that is only finishing is still live but counts apart (the manager gives its transfer slot away); its
    /// end takes it off both counts, and a run that never finished off the live one only.
    @Test func aFinishingRunCountsApartUntilItEnds() {
        var queue = Self.five()
        let (a, b) = (Self.id("a"), Self.id("b"))
        #expect(Self.letters(queue.toStart(free: 2) { _ in true }) == "ab")
        queue.runStarted(a)
        queue.runStarted(b)
        queue.runFinishing()
        #expect(queue.liveRuns == 2 && queue.finishingRuns == 1)
        queue.runEnded(b, current: true)
        #expect(queue.liveRuns == 1 && queue.finishingRuns == 1)
        queue.runEnded(a, current: true, finishing: true)
        #expect(queue.liveRuns == 0 && queue.finishingRuns == 0)
    }

    /// A download queued again while its last run is still ending (paused and resumed at once) waits for that end,
    /// keeping its place; the run's slot counts until it ends.
    @Test func aRunStillEndingHoldsItsSlotAndItsDownload() {
        var queue = Self.five()
        let a = Self.id("a")
        #expect(Self.letters(queue.toStart(free: 1) { _ in true }) == "a")
        queue.runStarted(a)
        queue.setStatus(a, .running)
        queue.setStatus(a, .paused)
        queue.setStatus(a, .queued)
        #expect(queue.liveRuns == 1)
        #expect(Self.letters(queue.toStart(free: 2) { _ in true }) == "bc", "a waits for its run's end")
        queue.runEnded(a, current: true)
        #expect(queue.liveRuns == 0)
        #expect(Self.letters(queue.toStart(free: 1) { _ in true }) == "a")
    }

    /// A removed download's run counts until it ends; the counts of queued or running downloads follow every
    /// status change, and the queue is idle only with neither.
    @Test func countsFollowStatusesAndRuns() {
        var queue = Self.five([.queued, .paused, .completed, .queued, .paused])
        #expect(queue.activeCount == 2 && !queue.isIdle)
        let a = Self.id("a")
        queue.runStarted(a)
        queue.setStatus(a, .running)
        #expect(queue.activeCount == 2)
        queue.setStatus(Self.id("d"), .paused)
        #expect(queue.activeCount == 1)
        queue.setStatus(a, .removed)
        queue.remove(a)
        #expect(queue.activeCount == 0 && queue.liveRuns == 1 && !queue.isIdle)
        queue.runEnded(a, current: false)
        #expect(queue.isIdle)
        #expect(queue.count == 4 && !queue.contains(a))
    }

    /// The queue's head moves past downloads that started, so a long queue is not walked from the front at every
    /// call; a move, an add or a newly queued download makes it walk again from the front.
    @Test func aMovedOrRequeuedDownloadIsSeen() throws {
        var queue = Self.five()
        for id in queue.toStart(free: 3, acquireHost: { _ in true }) {
            queue.runStarted(id)
            queue.setStatus(id, .running)
        }
        queue.setStatus(Self.id("a"), .paused)
        queue.setStatus(Self.id("a"), .queued)
        queue.runEnded(Self.id("a"), current: true)
        #expect(Self.letters(queue.toStart(free: 1) { _ in true }) == "a", "queued again: first in order")
        let move = try queue.planMove(Self.id("e"), to: .fromStart(0)).get()
        queue.apply(move.changes)
        #expect(Self.letters(queue.toStart(free: 1) { _ in true }) == "e")
        queue.insert(Self.id("f"), at: .init(priority: 9, position: 99), status: .queued)
        #expect(Self.letters(queue.toStart(free: 1) { _ in true }) == "f")
    }
}
