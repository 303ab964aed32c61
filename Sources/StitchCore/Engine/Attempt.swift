import StitchLocks

/// What the engine does with a response once it has judged its head.
enum HeadDecision: Sendable {
    /// Stream the body into this sink.
    case receive(any BodySink)
    /// Read and drop it (a redirect's, an error page), keeping the connection.
    case discard
    /// Close the transfer.
    case abort
}

/// One request in two phases, the same for a download on one connection and for each lane of one on several:
/// the transport hands over the response head; the engine decides what it means on the blocking pool for
/// decisions (`decide` may open, reopen, preallocate or hash files, which must never hold up the transport's
/// thread that every transfer shares); then the body streams into the chosen sink, is read and dropped, or the
/// transfer is cancelled.
///
/// `started` sees the response before the decision (a lane keeps it, so that a stalled connection can be cut off).
/// Returns how the transfer ended, and the error a decision threw (the transfer was then cancelled).
func performAttempt(
    _ request: TransportRequest, on transport: any HTTPTransport, hook: (@Sendable () -> Void)?,
    started: (any TransportResponse) -> Void = { _ in },
    decide: @escaping @Sendable (ResponseHead) throws(DownloadError) -> HeadDecision
) async -> (result: Result<Void, TransportError>, decisionError: DownloadError?) {
    let response: any TransportResponse
    Trace.note(
        "\(request.url) attempt start lane \(request.lane.map(String.init) ?? "-") "
            + (request.headers.first { $0.name == "Range" }?.value ?? "whole"))
    switch await transport.start(request) {
    case .failure(let error):
        Trace.note("\(request.url) attempt failed before head: \(error)")
        return (.failure(error), nil)
    case .success(let head): response = head
    }
    Trace.note("\(request.url) attempt head \(response.head.status)")
    started(response)
    if let decided = response as? any DecidedBodyResponse {
        return await decideAndReceive(decided, request: request, hook: hook, decide: decide)
    }
    let decision: HeadDecision
    let decisionError: DownloadError?
    do {
        (decision, decisionError) = try await offloadedDecision { deciding(response.head, hook: hook, decide: decide) }
    } catch {
        (decision, decisionError) = (.abort, error)
    }
    Trace.note("\(request.url) attempt decision \(decision)")
    switch decision {
    case .receive(let sink): return (await response.receive(into: sink), decisionError)
    case .discard: return (await response.discard(), decisionError)
    case .abort: return (await abandon(response), decisionError)
    }
}

/// Runs the test hook and `decide` on the calling thread (the decision pool's): a decision that throws is an abort,
/// with its error.
private func deciding(
    _ head: ResponseHead, hook: (@Sendable () -> Void)?,
    decide: (ResponseHead) throws(DownloadError) -> HeadDecision
) -> (decision: HeadDecision, error: DownloadError?) {
    do throws(DownloadError) {
        hook?()
        return (try decide(head), nil)
    } catch {
        return (.abort, error)
    }
}

/// Ends a transfer whose decision was to abort it; returns once it has let go of its connection (see
/// `TransportResponse.cancel`).
private func abandon(_ response: any TransportResponse) async -> Result<Void, TransportError> {
    response.cancel()
    _ = await response.discard()
    return .failure(.abortedBySink)
}

/// ``performAttempt(_:on:hook:started:decide:)`` after the head, for a transport that takes the decision's answer on
/// the thread that made it: the decision runs on ``BlockingPool/decisions`` and asks for the body from there.
private func decideAndReceive(
    _ response: any DecidedBodyResponse, request: TransportRequest, hook: (@Sendable () -> Void)?,
    decide: @escaping @Sendable (ResponseHead) throws(DownloadError) -> HeadDecision
) async -> (result: Result<Void, TransportError>, decisionError: DownloadError?) {
    let head = response.head
    // The decision's error, set on the pool thread before the body is asked for (or the continuation resumed) and
    // read after: the lock also orders the decision's other writes before this task's reads.
    let failure = Locked<DownloadError?>(nil)
    let ended = await response.body(decidedOn: { BlockingPool.decisions.execute($0) }) { () -> BodyChoice? in
        let (decision, decisionError) = deciding(head, hook: hook, decide: decide)
        failure.withLock { $0 = decisionError }
        Trace.note("\(request.url) attempt decision \(decision)")
        switch decision {
        case .receive(let sink): return .receive(sink)
        case .discard: return .discard
        case .abort: return nil
        }
    }
    let decisionError = failure.withLock { $0 }
    if let ended { return (ended, decisionError) }
    return (await abandon(response), decisionError)
}

/// Runs blocking file-system work (syncs, renames) on ``BlockingPool``'s threads instead of a cooperative one.
/// Not cancellable: once started, the work completes.
func offloaded<T: Sendable>(_ work: @escaping @Sendable () throws(DownloadError) -> T) async throws(DownloadError) -> T {
    try await BlockingPool.shared.run(work)
}

/// Runs a response-head decision (and the disk work it may need) on ``BlockingPool/decisions``.
func offloadedDecision<T: Sendable>(
    _ work: @escaping @Sendable () throws(DownloadError) -> T
) async throws(DownloadError) -> T {
    try await BlockingPool.decisions.run(work)
}
