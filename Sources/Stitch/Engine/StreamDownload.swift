import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import StitchLocks

/// Where a streamed download's bytes go (``Downloader/stream(_:headers:options:to:onEvent:)``).
public enum StreamTarget: Sendable {
    /// A file descriptor the caller owns (standard output for `stitch get -o -`), written in order. A pipe whose
    /// reader is slow pauses the transfer instead of blocking the transport's thread.
    case fileDescriptor(Int32)
}

extension Downloader {
    /// Streams `url`'s body to `target` in order over one connection, with nothing on disk (`stitch get -o -`).
    ///
    /// The bytes cannot be taken back once written, so the rules differ from a download to a file: a dropped
    /// connection continues with `Range` from the last byte written, but only with a strong validator sent as
    /// `If-Range` and a `206` whose `Content-Range` starts there; a server that answers with the whole file, a
    /// changed validator, or no validator to ask with fails the stream, saying how many bytes went out — it never
    /// restarts (that would repeat them) and cannot be resumed later (there is no state to resume from).
    ///
    /// - Returns: The bytes written.
    public func stream(
        _ url: String, headers: HTTPHeaders = HTTPHeaders(), options: DownloadOptions = DownloadOptions(),
        to target: StreamTarget, onEvent: @escaping @Sendable (DownloadEvent) -> Void = { _ in }
    ) async throws(DownloadError) -> Int64 {
        let start = try validateURL(url)
        guard case .fileDescriptor(let fd) = target else { preconditionFailure("one target kind") }
        let sink = DescriptorSink(fd: fd, rateLimiter: options.rateLimiter, clock: clock)
        var current = start
        var redirects = RedirectChain(limit: 10)
        var known: Validators?
        var failures = 0
        var progressSinceFailure: Int64 = 0
        let policy = options.retry
        while true {
            let written = sink.written
            let plan = ResumePolicy.plan(offset: written, known: known, overlapWindow: 0)
            if written > 0, plan.ifRange == nil { throw Self.noValidator(written) }
            let request = TransportRequest(
                url: current.absoluteString, headers: ResumePolicy.requestHeaders(user: headers, plan: plan),
                options: options.transport, clock: clock)
            sink.startRequest()
            let verdict = Locked<HeadVerdict?>(nil)
            let before = written
            let knownNow = known
            let (result, decisionError) = await performAttempt(
                request, on: transport, hook: nil,
                decide: { head throws(DownloadError) in
                    let judged = ResumePolicy.evaluate(head, plan: plan, known: knownNow)
                    verdict.withLock { $0 = judged }
                    switch judged {
                    case .accept(let bodyStart, _) where bodyStart == written: return .receive(sink)
                    case .accept, .restart, .restartWithBody, .malformed, .refused: return .abort
                    case .complete, .redirect, .retry, .fail: return .discard
                    }
                })
            if let decisionError { throw decisionError }
            if case .failure(let error) = result, error.isCancelled { throw DownloadError(.cancelled, "cancelled") }
            if let failure = sink.failure { throw failure }
            let judged = verdict.withLock { $0 }
            switch judged {
            case .accept(_, let validators)?:
                if let known, let change = ResumePolicy.change(from: known, to: validators) {
                    throw cannotRestart(change, written: sink.written)
                }
                known = validators
                if case .success = result, validators.totalLength.map({ $0 == sink.written }) ?? true {
                    return sink.written
                }
                // A failure another request cannot change (a TLS error, say) ends the stream as it would the
                // first request.
                if case .failure(let error) = result, !error.isRetryable || error.isTLS {
                    throw DownloadError(
                        error.isTLS ? .tls : .network, "\(error.message) (from \(current.absoluteString))",
                        cause: error)
                }
                // Cut short (an error, or a body shorter than its length): continue from where it got to.
            case .restartWithBody(let reason, _)?, .restart(let reason)?:
                throw cannotRestart(reason, written: sink.written)
            case .complete?:
                if let total = known?.totalLength, total == sink.written { return sink.written }
                throw DownloadError(.protocolViolation, "the server said the stream was complete at \(sink.written) bytes")
            case .redirect(let location)?:
                current = try redirects.follow(location, from: current)
                onEvent(.redirected(to: current.absoluteString))
                continue
            case .fail(let status)?:
                throw DownloadError(
                    .httpStatus, "HTTP \(status) \(statusText(status)) from \(current.absoluteString)", httpStatus: status)
            case .refused(let why)?:
                throw DownloadError(.protocolViolation, "\(why) (from \(current.absoluteString))")
            case .retry?, .malformed?, nil:
                if case .failure(let error) = result, !error.isRetryable || error.isTLS {
                    throw DownloadError(
                        error.isTLS ? .tls : .network, "\(error.message) (from \(current.absoluteString))",
                        cause: error)
                }
            }
            if sink.written > 0, known?.ifRange == nil { throw Self.noValidator(sink.written) }
            // A failure worth another request: as many in a row as the retry policy allows, counted afresh
            // after progress.
            progressSinceFailure += sink.written - before
            if progressSinceFailure >= Int64(policy.minimumProgress) {
                failures = 0
                progressSinceFailure = 0
            }
            failures += 1
            guard failures <= policy.maxRetries else {
                throw DownloadError(
                    .retriesExhausted,
                    "gave up after \(policy.maxRetries) retries; \(sink.written) bytes went to the output")
            }
            let delay = min(policy.maxDelay, policy.baseDelay * Double(1 << min(failures - 1, 10)))
            let reason: String
            switch (judged, result) {
            case (.retry(let status, _)?, _): reason = "HTTP \(status) \(statusText(status)) from \(current.absoluteString)"
            case (.malformed(let why)?, _): reason = why
            case (_, .failure(let error)): reason = error.message
            default: reason = "the body ended early"
            }
            onEvent(.retrying(attempt: failures, maxRetries: policy.maxRetries, delay: delay, reason: reason))
            do { try await clock.sleep(seconds: delay) } catch { throw DownloadError(.cancelled, "cancelled") }
            redirects.reset()
            current = start
        }
    }

    private static func noValidator(_ written: Int64) -> DownloadError {
        DownloadError(
            .network,
            "the connection dropped after \(written) bytes went to the output, and the server gave no validator to "
                + "continue from there with; the stream cannot be resumed (use -o FILE)")
    }

    private func cannotRestart(_ reason: RestartReason, written: Int64) -> DownloadError {
        written == 0
            ? DownloadError(.protocolViolation, "the server's answer cannot be streamed: \(reason)")
            : DownloadError(
                .unstableSource,
                "\(reason); \(written) bytes already went to the output, so the stream cannot restart from zero "
                    + "(use -o FILE to download it resumably)")
    }
}
