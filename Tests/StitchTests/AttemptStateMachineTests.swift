import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

/// The decisions after each request, without sockets, files or clocks: `AttemptStateMachine` is fed reports of
/// how requests ended and says what to do next.
@Suite struct AttemptStateMachineTests {
    static let start = URL(string: "http://example.test/file.bin")!
    static let validators = Validators(
        etag: "\"v\"", lastModified: nil, date: nil, totalLength: 1000, acceptRanges: true)

    static func machine(scope: AttemptStateMachine.Scope = .download, maxRetries: Int = 5) -> AttemptStateMachine {
        var policy = RetryPolicy()
        policy.maxRetries = maxRetries
        return AttemptStateMachine(startURL: start, policy: policy, maxRedirects: 3, scope: scope)
    }

    static func report(
        _ verdict: HeadVerdict? = .accept(bodyStart: 0, validators: validators),
        _ result: Result<Void, TransportError> = .success(()), sink: AttemptReport.SinkOutcome = .none,
        written: Int64 = 1000, end: Int64? = 1000, saved: Int64 = 0, durable: Int64 = 0
    ) -> AttemptReport {
        AttemptReport(verdict: verdict, result: result, sink: sink, written: written, end: end, saved: saved, durable: durable)
    }

    /// What an action is, in a form tests compare: its kind and its words.
    static func describe(_ action: AttemptAction) -> String {
        switch action {
        case .requestAgain: return "again"
        case .follow(let url): return "follow \(url.absoluteString)"
        case .restart(let reason): return "restart: \(reason)"
        case .complete: return "complete"
        case .wait(let seconds, let attempt, let of, let reason): return "wait \(seconds) (\(attempt)/\(of)): \(reason)"
        case .fail(let error): return "fail \(error.code): \(error)"
        case .interrupted: return "interrupted"
        }
    }

    static func step(_ machine: inout AttemptStateMachine, _ report: AttemptReport) -> String {
        describe(machine.attemptEnded(report, now: 1_700_000_000, jitter: 0))
    }

    // MARK: One request, one decision

    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        let report: AttemptReport
        let expected: String
        var testDescription: String { name }
    }

    static let single: [Case] = [
        Case(name: "cancelled", report: report(nil, .failure(.cancelled)), expected: "interrupted"),
        Case(name: "a whole body", report: report(), expected: "complete"),
        Case(name: "a body of unknown length", report: report(end: nil), expected: "complete"),
        Case(
            name: "closed early", report: report(written: 400),
            expected: "wait 0.5 (1/5): the connection closed at 400 of 1000 bytes"),
        Case(name: "a split moved the end", report: report(sink: .reachedEnd, written: 500), expected: "again"),
        Case(name: "a slow connection replaced", report: report(sink: .replaced, written: 500), expected: "again"),
        Case(
            name: "the overlap differs", report: report(sink: .overlapMismatch(at: 4096)),
            expected: "restart: the bytes before offset 4096 no longer match the server's (no validator to check)"),
        Case(
            name: "a write failed", report: report(sink: .storageFailed(DownloadError(.io, "cannot write x: full"))),
            expected: "fail io: cannot write x: full"),
        Case(
            name: "more than announced", report: report(sink: .tooLong),
            expected: "wait 0.5 (1/5): the server sent more data than it announced"),
        Case(
            name: "200 to a range", report: report(.restart(.rangeIgnored)),
            expected: "restart: the server sent the whole file instead of the requested range"),
        Case(name: "416 over a complete file", report: report(.complete), expected: "complete"),
        Case(
            name: "404", report: report(.fail(status: 404)),
            expected: "fail httpStatus: HTTP 404 Not Found from http://example.test/file.bin"),
        Case(name: "503 with Retry-After", report: report(.retry(status: 503, retryAfter: "7")),
            expected: "wait 7.0 (1/5): HTTP 503 Service Unavailable"),
        Case(
            name: "an encoded body", report: report(.refused("the server sent an encoded body")),
            expected: "fail protocolViolation: the server sent an encoded body (from http://example.test/file.bin)"),
        Case(
            name: "Content-Length unlike Content-Range", report: report(.malformed("lengths differ")),
            expected: "wait 0.5 (1/5): lengths differ"),
        Case(
            name: "TLS", report: report(nil, .failure(.tls("certificate has expired"))),
            expected: "fail tls: TLS error: certificate has expired"),
        Case(
            name: "no such host", report: report(nil, .failure(.resolve("Could not resolve host: example.test"))),
            expected: "fail network: cannot resolve host example.test: Could not resolve host: example.test"),
        Case(
            name: "a response libcurl refuses",
            report: report(nil, .failure(TransportError(.malformedResponse, "Nul byte in header"))),
            expected: "fail protocolViolation: Nul byte in header (from http://example.test/file.bin)"),
        Case(
            name: "a stall", report: report(nil, .failure(.stalled("no data in 30 s"))),
            expected: "wait 0.5 (1/5): no data in 30 s"),
        Case(
            name: "no head and no error", report: report(nil, .success(())),
            expected: "fail protocolViolation: no response from http://example.test/file.bin"),
    ]

    @Test(arguments: single)
    func oneRequest(_ c: Case) {
        var machine = Self.machine()
        #expect(Self.step(&machine, c.report) == c.expected)
    }

    // MARK: Sequences

    /// Redirects are followed relative to the URL that sent them; the next retry starts from the start URL again;
    /// a loop ends the download.
    @Test func redirectsAndTheirReset() {
        var machine = Self.machine()
        #expect(Self.step(&machine, Self.report(.redirect(location: "/b"))) == "follow http://example.test/b")
        #expect(Self.step(&machine, Self.report(.redirect(location: "c"))) == "follow http://example.test/c")
        #expect(machine.url.absoluteString == "http://example.test/c")
        #expect(Self.step(&machine, Self.report(nil, .failure(.network("reset")))).hasPrefix("wait"))
        #expect(machine.url == Self.start, "a retry asks the start URL again")
        #expect(Self.step(&machine, Self.report(.redirect(location: "/b"))) == "follow http://example.test/b")
        #expect(
            Self.step(&machine, Self.report(.redirect(location: "/file.bin")))
                == "fail redirects: redirect loop: http://example.test/file.bin → http://example.test/b → http://example.test/file.bin")
    }

    /// Retries back off exponentially and run out after `maxRetries`; the last words say "rerun to resume" only
    /// when bytes were saved, and name a lane's connection.
    @Test(arguments: [(AttemptStateMachine.Scope.download, Int64(0)), (.download, 5000), (.connection, 5000)])
    func retriesRunOut(scope: AttemptStateMachine.Scope, durable: Int64) {
        var machine = Self.machine(scope: scope, maxRetries: 3)
        let stalled = Self.report(nil, .failure(.stalled("no data in 30 s")), durable: durable)
        #expect(Self.step(&machine, stalled) == "wait 0.5 (1/3): no data in 30 s")
        #expect(Self.step(&machine, stalled) == "wait 1.0 (2/3): no data in 30 s")
        #expect(Self.step(&machine, stalled) == "wait 2.0 (3/3): no data in 30 s")
        let whose = scope == .connection ? " on one connection" : ""
        let saved = durable > 0 ? "; 5000 bytes saved; run it again to resume" : ""
        #expect(Self.step(&machine, stalled) == "fail retriesExhausted: giving up after 3 retries\(whose): no data in 30 s\(saved)")
    }

    /// A temporary status that persists ends with the status, after the retries.
    @Test func statusRetriesRunOut() {
        var machine = Self.machine(maxRetries: 1)
        let busy = Self.report(.retry(status: 503, retryAfter: nil))
        #expect(Self.step(&machine, busy) == "wait 0.5 (1/1): HTTP 503 Service Unavailable")
        #expect(
            Self.step(&machine, busy)
                == "fail httpStatus: HTTP 503 Service Unavailable from http://example.test/file.bin after 1 retries")
    }

    /// Saving `minimumProgress` bytes (counted over attempts) resets the retry count; less does not.
    @Test func progressResetsTheCount() {
        var machine = Self.machine(maxRetries: 2)
        let minimum = Int64(RetryPolicy().minimumProgress)
        let drop = { (saved: Int64) in Self.report(written: 10, saved: saved) }
        #expect(Self.step(&machine, drop(minimum / 2)).hasPrefix("wait 0.5 (1/2)"))
        #expect(Self.step(&machine, drop(minimum / 2)).hasPrefix("wait 0.5 (1/2)"), "the two halves make progress")
        #expect(Self.step(&machine, drop(1)).hasPrefix("wait 1.0 (2/2)"))
        #expect(Self.step(&machine, drop(1)).hasPrefix("fail retriesExhausted"))
    }

    /// A refused connection is tried three times in all, within two seconds, then named; once a response saved
    /// bytes, refusals count anew.
    @Test func refusedConnectionsGetThreeTries() {
        var machine = Self.machine()
        let refused = Self.report(nil, .failure(.connect("connection refused")))
        #expect(Self.step(&machine, refused) == "wait 0.5 (1/2): connection refused")
        #expect(Self.step(&machine, refused) == "wait 1.0 (2/2): connection refused")
        #expect(Self.step(&machine, Self.report(written: 100_000, end: 200_000, saved: 100_000)).hasPrefix("wait"))
        #expect(Self.step(&machine, refused) == "wait 0.5 (1/2): connection refused", "counted anew after progress")
        #expect(Self.step(&machine, refused) == "wait 1.0 (2/2): connection refused")
        var saved = refused
        saved.durable = 100_000
        #expect(
            Self.step(&machine, saved)
                == "fail network: cannot connect to example.test: connection refused (3 tries); 100000 bytes saved; run it again to resume")
    }

    /// No failure a retry could not change is retried: each ends at its first occurrence.
    @Test(arguments: [
        TransportError.tls("x"), .resolve("x"), TransportError(.malformedResponse, "x"), TransportError(.other, "x"),
    ])
    func finalFailuresAreNotRetried(_ error: TransportError) {
        var machine = Self.machine()
        #expect(Self.step(&machine, Self.report(nil, .failure(error))).hasPrefix("fail"))
        #expect(machine.failures == 0)
    }
}
