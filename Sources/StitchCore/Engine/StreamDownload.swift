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
        // The download's own retry rules (backoff with jitter, `Retry-After`, quick tries of a refused connection,
        // the redirect limit); what differs is only what a stream cannot do: restart.
        var machine = AttemptStateMachine(
            startURL: start, policy: options.retry, maxRedirects: options.maxRedirects, scope: .download)
        var known: Validators?
        while true {
            let written = sink.written
            let plan = ResumePolicy.plan(offset: written, known: known, overlapWindow: 0)
            if written > 0, plan.ifRange == nil { throw Self.noValidator(written) }
            let url = machine.url
            let request = TransportRequest(
                url: url.absoluteString,
                headers: ResumePolicy.requestHeaders(
                    user: RunContext.userHeaders(headers, for: url, start: start), plan: plan),
                options: options.transport, clock: clock)
            sink.startRequest()
            let verdict = Locked<HeadVerdict?>(nil)
            let knownNow = known
            let (result, decisionError) = await performAttempt(
                request, on: transport, hook: nil,
                decide: { head throws(DownloadError) in
                    let judged = ResumePolicy.evaluate(head, plan: plan, known: knownNow)
                    verdict.withLock { $0 = judged }
                    switch judged {
                    case .accept(let bodyStart, _) where bodyStart == written: return .receive(sink)
                    case .accept, .restart, .restartWithBody, .malformed, .refused: return .abort
                    case .complete, .notModified, .redirect, .retry, .fail: return .discard
                    }
                })
            if let decisionError { throw decisionError }
            if let failure = sink.failure { throw failure }
            let judged = verdict.withLock { $0 }
            // What a stream refuses that a download would restart for: its bytes cannot be taken back.
            switch judged {
            case .accept(let bodyStart, let validators)?:
                if let known, let change = ResumePolicy.change(from: known, to: validators) {
                    throw cannotRestart(change, written: sink.written)
                }
                if bodyStart != written {
                    throw DownloadError(
                        .protocolViolation, "the server sent bytes from \(bodyStart), not \(written) (from \(url.absoluteString))")
                }
                known = validators
            case .restartWithBody(let reason, _)?, .restart(let reason)?:
                throw cannotRestart(reason, written: sink.written)
            case .complete?:
                if let total = known?.totalLength, total == sink.written { return sink.written }
                throw DownloadError(.protocolViolation, "the server said the stream was complete at \(sink.written) bytes")
            default:
                break
            }
            let report = AttemptReport(
                verdict: judged, result: result, written: sink.written, end: known?.totalLength,
                saved: sink.written - written, durable: 0)
            switch machine.attemptEnded(report, now: clock.now(), jitter: Double.random(in: 0...1)) {
            case .complete:
                return sink.written
            case .requestAgain:
                continue
            case .follow(let next):
                onEvent(.redirected(to: next.absoluteString))
            case .restart(let reason):
                throw cannotRestart(reason, written: sink.written)
            case .interrupted:
                throw DownloadError(.cancelled, "cancelled")
            case .fail(let error):
                guard sink.written > 0 else { throw error }
                throw DownloadError(
                    error.code, "\(error.message); \(sink.written) bytes went to the output", cause: error.cause,
                    httpStatus: error.httpStatus)
            case .wait(let delay, let attempt, let of, let reason):
                if sink.written > 0, known?.ifRange == nil { throw Self.noValidator(sink.written) }
                onEvent(.retrying(attempt: attempt, maxRetries: of, delay: delay, reason: reason))
                do { try await clock.sleep(seconds: delay) } catch { throw DownloadError(.cancelled, "cancelled") }
            }
        }
    }

    private static func noValidator(_ written: Int64) -> DownloadError {
        DownloadError(
            .network,
            "the connection dropped after \(written) bytes went to the output, and the server gave no validator to "
                + "continue from there with; the stream cannot be resumed", remedy: .saveToFile)
    }

    private func cannotRestart(_ reason: RestartReason, written: Int64) -> DownloadError {
        written == 0
            ? DownloadError(.protocolViolation, "the server's answer cannot be streamed: \(reason)")
            : DownloadError(
                .unstableSource,
                "\(reason); \(written) bytes already went to the output, so the stream cannot restart from zero",
                remedy: .saveToFile)
    }
}
