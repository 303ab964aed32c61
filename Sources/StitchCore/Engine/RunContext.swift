import Foundation
import Synchronization
import StitchLocks

/// What one run of a download was given, unchanged while it runs.
struct RunContext: Sendable {
    let request: DownloadRequest
    let options: DownloadOptions
    let transport: any HTTPTransport
    let clock: any DownloadClock
    /// The request's URL, checked.
    let startURL: URL
    /// The mirrors' URLs (``DownloadRequest/mirrors``), checked; none that is the request's own URL.
    var mirrorURLs: [URL] = []

    /// Header fields a caller gives that carry credentials: sent to the request's own origin only, as curl keeps
    /// them from another host (or scheme, or port) a redirect leads to.
    static let credentialHeaders: Set<String> = ["authorization", "cookie"]

    /// The caller's headers for a request of `url`: all of them to the request's origin (scheme, host and port),
    /// none that carries credentials anywhere else (a mirror, a redirect's target).
    func userHeaders(for url: URL) -> HTTPHeaders {
        Self.userHeaders(request.headers, for: url, start: startURL)
    }

    /// `headers` for a request of `url` in a download that began at `start` (``userHeaders(for:)``).
    static func userHeaders(_ headers: HTTPHeaders, for url: URL, start: URL) -> HTTPHeaders {
        func origin(_ url: URL) -> String {
            let scheme = url.scheme?.lowercased() ?? ""
            let port = url.port ?? (scheme == "https" ? 443 : 80)
            return "\(scheme)://\(url.host?.lowercased() ?? ""):\(port)"
        }
        guard origin(url) != origin(start) else { return headers }
        var kept = HTTPHeaders()
        for field in headers where !credentialHeaders.contains(field.name.lowercased()) {
            kept.add(name: field.name, value: field.value)
        }
        return kept
    }
}

/// What a run tells its caller: the events (``EventChannel``: one at a time, in order, on a queue of the
/// download's own, never under an engine lock nor on the transport's thread) and the progress, read from anywhere
/// (atomics, and the store's own lock).
final class RunReporter: Sendable {
    private let events: EventChannel
    /// Body bytes received over every attempt and lane.
    let counters: TransferCounters
    /// Where the first connection's body has got to, before a store exists.
    let position = Atomic<Int64>(0)
    /// The file's length as last announced (-1: unknown).
    let totalLength = Atomic<Int64>(-1)
    /// The part file, once there is one: progress is never reported before the destination is.
    private let store = Locked<PartStore?>(nil)
    /// Requests transferring now (``DownloadProgress/connections``).
    let requestsInFlight = Atomic<Int>(0)

    init(checkpointBytes: Int64, onEvent: @escaping @Sendable (DownloadEvent) -> Void) {
        events = EventChannel(onEvent)
        counters = TransferCounters(checkpointBytes: checkpointBytes)
    }

    /// Hands `event` to the caller's `onEvent`: at once from the engine's tasks, through the run's event queue
    /// from the transport's thread (`fromTransport`).
    func emit(_ event: DownloadEvent, fromTransport: Bool = false) {
        events.send(event, fromTransport: fromTransport)
    }

    /// No event after this is delivered.
    func close() { events.close() }

    /// Sends `event` as the last event delivered (a progress tick cannot slip in after it).
    func close(after event: DownloadEvent) { events.send(event, closing: true) }

    /// Returns once every event sent so far has reached the caller.
    func drained() async { await events.drained() }

    var isOpen: Bool { events.isOpen }

    /// The part file progress is read from, from now on.
    func opened(_ store: PartStore) {
        self.store.withLock { $0 = store }
    }

    /// The file's length as a response announced it (nil: unknown).
    func announce(total: Int64?) {
        totalLength.store(total ?? -1, ordering: .relaxed)
    }

    var hasStore: Bool { store.withLock { $0 != nil } }

    var progress: DownloadProgress {
        let total = totalLength.load(ordering: .relaxed)
        guard let store = store.withLock({ $0 }) else {
            return DownloadProgress(
                bytes: position.load(ordering: .relaxed), total: total >= 0 ? total : nil, durableBytes: 0)
        }
        // Durable first, then written: a restart in between can only make written smaller, so clamp. The store
        // knows for every lane.
        let durable = store.durable.load(ordering: .acquiring)
        let segments = store.writtenSegments
        let bytes = segments.reduce(0) { $0 + ($1.durable - $1.start) }
        return DownloadProgress(
            bytes: bytes, total: total >= 0 ? total : nil, durableBytes: min(durable, bytes),
            writtenRanges: Self.merged(segments.map { $0.start..<$0.durable }), pieceLength: store.pieceSize,
            connections: requestsInFlight.load(ordering: .relaxed))
    }

    /// `ranges` in order with the empty ones dropped and the touching ones joined.
    static func merged(_ ranges: [Range<Int64>]) -> [Range<Int64>] {
        var merged: [Range<Int64>] = []
        for range in ranges.filter({ !$0.isEmpty }).sorted(by: { $0.lowerBound < $1.lowerBound }) {
            if let last = merged.last, range.lowerBound <= last.upperBound {
                merged[merged.count - 1] = last.lowerBound..<max(last.upperBound, range.upperBound)
            } else {
                merged.append(range)
            }
        }
        return merged
    }

    /// Progress every `interval`, timed by the shared clock (a download over before its first tick costs no thread
    /// a wake-up). Each tick is emitted from a task: computing progress takes the store's lock, which a
    /// checkpoint's sync may hold, and the clock's thread must not wait (nor hold the last reference to this
    /// reporter: it holds a weak one).
    ///
    /// At most one tick task per download, waiting or running: on a machine too busy to run them, or while a sync
    /// holds the store's lock, ticks are dropped, not queued up on cooperative threads.
    func startTicker(_ clock: any DownloadClock, interval: Double) -> any ClockTimer {
        let ticks = Ticks(self)
        return clock.every(interval) { ticks.fire() }
    }

    private final class Ticks: Sendable {
        private let busy = Atomic<Bool>(false)
        private let reporter: Locked<Weak>

        struct Weak {
            weak var reporter: RunReporter?
        }

        init(_ reporter: RunReporter) { self.reporter = Locked(Weak(reporter: reporter)) }

        func fire() {
            guard !busy.exchange(true, ordering: .acquiringAndReleasing) else { return }
            Task { [self] in
                defer { busy.store(false, ordering: .releasing) }
                // Not once the run is finishing (the events are closed): the final syncs hold the store's lock, and
                // this is a cooperative thread.
                guard let reporter = reporter.withLock({ $0.reporter }), reporter.hasStore, reporter.isOpen else {
                    return
                }
                reporter.emit(.progress(reporter.progress))
            }
        }
    }
}
