import Foundation
import StitchLocks

/// Asks a server for one byte range into memory: a sample that proves (or disproves) that bytes are the same as
/// others — another program's partial (``ForeignAdoption``), a mirror's copy (``MirrorProof``). A range request
/// (with `If-Range` once the server's validators are known), following redirects and retrying what a download
/// would retry (the download's ``AttemptStateMachine``), at most ``sampleRetries`` times.
struct RangeSampler: Sendable {
    let startURL: URL
    /// The request's headers besides the engine's own, for each URL asked (a redirect's target may get fewer).
    let headers: @Sendable (URL) -> HTTPHeaders
    let options: DownloadOptions
    let transport: any HTTPTransport
    let clock: any DownloadClock
    let emit: @Sendable (DownloadEvent) -> Void

    /// What came of a sample.
    enum Fetched {
        /// The range's bytes, and the validators of the response that carried them.
        case bytes([UInt8], Validators)
        /// No sample can be had from this server, and why (for the user).
        case declined(String)
    }

    /// Retries of one sample at most (fewer if the download's policy has fewer).
    static let sampleRetries = 3

    /// Samples asked at once of one server by ``fetchAll(_:known:)``: two, as many as a server that limits
    /// connections commonly allows (and fewer round trips than one at a time).
    static let width = 2

    /// The bytes of every range of `ranges`, in order, ``width`` at a time, all tied to `known` (the server's
    /// validators): the first answer that declines is the result.
    func fetchAll(_ ranges: [Range<Int64>], known: Validators) async throws -> [Fetched] {
        var results = [Fetched?](repeating: nil, count: ranges.count)
        try await withThrowingTaskGroup(of: (Int, Fetched).self) { group in
            var next = 0
            func start() {
                guard next < ranges.count else { return }
                let index = next
                next += 1
                group.addTask { (index, try await self.fetch(ranges[index], known: known)) }
            }
            for _ in 0..<Self.width { start() }
            while let (index, fetched) = try await group.next() {
                results[index] = fetched
                if case .declined = fetched {
                    group.cancelAll()
                    break
                }
                start()
            }
        }
        if let declined = results.first(where: { if case .declined? = $0 { true } else { false } }) {
            return [declined!]
        }
        return results.compactMap { $0 }
    }

    /// The bytes of `range`; `known`: the server's validators from an earlier sample (their change declines).
    /// - Throws: the attempt's failure (an HTTP error, the network, retries used up), or cancellation.
    func fetch(_ range: Range<Int64>, known: Validators?) async throws -> Fetched {
        let plan = RequestPlan(
            rangeStart: range.lowerBound, resumeOffset: 0, ifRange: known?.ifRange, rangeEnd: range.upperBound)
        var policy = options.retry
        policy.maxRetries = min(policy.maxRetries, Self.sampleRetries)
        var machine = AttemptStateMachine(
            startURL: startURL, policy: policy, maxRedirects: options.maxRedirects, scope: .download)
        while true {
            let sink = CollectingSink(limit: range.count, rateLimiter: options.rateLimiter, clock: clock)
            let verdict = Locked<HeadVerdict?>(nil)
            let (result, decisionError) = await performAttempt(
                TransportRequest(
                    url: machine.url.absoluteString,
                    headers: ResumePolicy.requestHeaders(user: headers(machine.url), plan: plan),
                    options: options.transport, clock: clock),
                on: transport, hook: nil,
                decide: { head throws(DownloadError) in
                    var judged = ResumePolicy.evaluate(head, plan: plan, known: known)
                    if case .accept = judged {
                        let contentRange = head.headers["Content-Range"].flatMap(ContentRange.init(parsing:))
                        if head.status != 206 || contentRange?.last != range.upperBound - 1 {
                            judged = .refused("the server did not send the range asked for")
                        }
                    }
                    verdict.withLock { $0 = judged }
                    switch judged {
                    case .accept: return .receive(sink)
                    case .redirect, .retry: return .discard
                    case .restart, .restartWithBody, .malformed, .refused, .complete, .notModified, .fail: return .abort
                    }
                })
            if let decisionError { throw decisionError }
            let judged = verdict.withLock { $0 }
            // What makes a sample impossible rather than failed.
            switch judged {
            case .restartWithBody(let reason, _)?:
                return .declined(reason == .rangeIgnored ? "the server does not serve byte ranges" : reason.description)
            case .restart(let reason)?:
                return .declined(reason.description)
            case .complete?:
                return .declined("the server refused the range")
            case .refused(let why)?:
                return .declined(why)
            case .accept(_, let validators)?:
                if case .success = result, sink.bytes.count == range.count { return .bytes(sink.bytes, validators) }
                if case .failure(let error) = result, error.isAbortedBySink {
                    return .declined("the server sent more than the range asked for")
                }
            default:
                break
            }
            // Bytes of a sample cut short are not kept: no progress that would renew the budget.
            let report = AttemptReport(
                verdict: judged, result: result, written: Int64(sink.bytes.count), end: Int64(range.count), saved: 0,
                durable: 0)
            switch machine.attemptEnded(report, now: clock.now(), jitter: Double.random(in: 0...1)) {
            case .requestAgain, .follow:
                continue
            case .complete:
                return .declined("the server sent no sample")
            case .restart(let reason):
                return .declined(reason.description)
            case .interrupted:
                throw DownloadError(.cancelled, "interrupted")
            case .fail(let error):
                throw error
            case .wait(let delay, let attempt, let of, let reason):
                emit(.retrying(attempt: attempt, maxRetries: of, delay: delay, reason: reason))
                do { try await clock.sleep(seconds: delay) } catch { throw DownloadError(.cancelled, "interrupted") }
            }
        }
    }
}

/// Keeps a sample's body in memory (at most `limit` bytes: one sample, never a file). A sample's bytes count
/// against the download's rate limit as the file's do (`--limit-rate` caps everything fetched).
private final class CollectingSink: BodySink {
    private let state: Locked<[UInt8]>
    private let limit: Int
    private let rateLimiter: RateLimiter?
    private let clock: any DownloadClock

    init(limit: Int, rateLimiter: RateLimiter?, clock: any DownloadClock) {
        self.limit = limit
        self.rateLimiter = rateLimiter
        self.clock = clock
        state = Locked([])
    }

    var bytes: [UInt8] { state.withLock { $0 } }

    func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
        // One transfer calls this at a time: the room checked here is still there after the wait's answer.
        guard state.withLock({ $0.count }) + bytes.count <= limit else { return .abort }
        if let rateLimiter, let wait = rateLimiter.take(bytes.count, now: clock.uptime()) {
            return .wait(.seconds(wait))
        }
        state.withLock { $0.append(contentsOf: bytes) }
        return .accepted
    }
}
