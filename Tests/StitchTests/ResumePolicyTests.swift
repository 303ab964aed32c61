import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport

/// Table-driven tests of the pure resume rules (DEVELOPERS.md rule 3): request planning, response-head verdicts,
/// `Content-Range` parsing, `If-Range` validator strength and retry spacing. No sockets, no files.
@Suite struct ResumePolicyTests {

    // MARK: Fixtures

    static let lastModified = ServedFile.httpDate(secondsSince1970: 1_700_000_000)
    static let dateLater = ServedFile.httpDate(secondsSince1970: 1_700_000_100)
    static let dateSame = lastModified
    static let dateOneSecond = ServedFile.httpDate(secondsSince1970: 1_700_000_001)

    /// What the engine knew from the first response: strong ETag, strong Last-Modified, length 1000.
    static let known = Validators(
        etag: "\"v1\"", lastModified: lastModified, date: dateLater, totalLength: 1000, acceptRanges: true)
    /// A resume at 400 with `If-Range: "v1"`.
    static let resumePlan = RequestPlan(rangeStart: 400, resumeOffset: 400, ifRange: "\"v1\"")
    /// A resume at 400 without a validator: the 64 KiB overlap window is clamped to 0.
    static let overlapPlan = RequestPlan(rangeStart: 0, resumeOffset: 400, ifRange: nil)
    static let wholePlan = RequestPlan(rangeStart: nil, resumeOffset: 0, ifRange: nil)

    static func head(_ status: Int, _ pairs: [(String, String)] = []) -> ResponseHead {
        ResponseHead(status: status, headers: HTTPHeaders(pairs))
    }

    // MARK: plan

    struct PlanCase: Sendable, CustomTestStringConvertible {
        var name: String
        var offset: Int64
        var known: Validators?
        var window: Int64 = ResumePolicy.defaultOverlapWindow
        var expected: RequestPlan
        var testDescription: String { name }
    }

    static let weakOnly = Validators(
        etag: "W/\"v1\"", lastModified: nil, date: nil, totalLength: 1000, acceptRanges: true)
    static let nothing = Validators(etag: nil, lastModified: nil, date: nil, totalLength: nil, acceptRanges: false)
    static let lastModifiedOnly = Validators(
        etag: nil, lastModified: lastModified, date: dateLater, totalLength: 1 << 20, acceptRanges: true)
    static let weakLastModified = Validators(
        etag: nil, lastModified: lastModified, date: dateSame, totalLength: 1 << 20, acceptRanges: true)

    static let planCases: [PlanCase] = [
        PlanCase(name: "nothing on disk", offset: 0, known: known, expected: wholePlan),
        PlanCase(name: "bytes on disk but nothing known", offset: 500, known: nil, expected: wholePlan),
        PlanCase(
            name: "strong ETag", offset: 500, known: known,
            expected: RequestPlan(rangeStart: 500, resumeOffset: 500, ifRange: "\"v1\"")),
        PlanCase(
            name: "strong Last-Modified only", offset: 500_000, known: lastModifiedOnly,
            expected: RequestPlan(rangeStart: 500_000, resumeOffset: 500_000, ifRange: lastModified)),
        PlanCase(
            name: "weak Last-Modified: overlap window", offset: 500_000, known: weakLastModified,
            expected: RequestPlan(rangeStart: 500_000 - 65_536, resumeOffset: 500_000, ifRange: nil)),
        PlanCase(
            name: "weak ETag only: overlap window", offset: 100_000, known: weakOnly,
            expected: RequestPlan(rangeStart: 100_000 - 65_536, resumeOffset: 100_000, ifRange: nil)),
        PlanCase(
            name: "no validator: overlap window", offset: 1 << 20, known: nothing,
            expected: RequestPlan(rangeStart: (1 << 20) - 65_536, resumeOffset: 1 << 20, ifRange: nil)),
        PlanCase(
            name: "no validator, offset inside the window: clamp to 0", offset: 400, known: nothing,
            expected: overlapPlan),
        PlanCase(
            name: "custom window", offset: 10_000, known: nothing, window: 1000,
            expected: RequestPlan(rangeStart: 9000, resumeOffset: 10_000, ifRange: nil)),
    ]

    @Test(arguments: planCases)
    func plan(_ c: PlanCase) {
        #expect(ResumePolicy.plan(offset: c.offset, known: c.known, overlapWindow: c.window) == c.expected)
    }

    @Test func requestHeaders() {
        func pairs(_ plan: RequestPlan) -> [String] {
            ResumePolicy.headers(for: plan).map { "\($0.0): \($0.1)" }
        }
        #expect(pairs(Self.wholePlan) == ["Accept-Encoding: identity"])
        #expect(pairs(Self.resumePlan) == ["Accept-Encoding: identity", "Range: bytes=400-", "If-Range: \"v1\""])
        #expect(pairs(Self.overlapPlan) == ["Accept-Encoding: identity", "Range: bytes=0-"])
        #expect(Self.wholePlan.isRanged == false)
        #expect(Self.overlapPlan.isRanged)
    }

    // MARK: evaluate — every verdict and every restart reason it can give

    struct VerdictCase: Sendable, CustomTestStringConvertible {
        var name: String
        var head: ResponseHead
        var plan: RequestPlan
        var known: Validators?
        var expected: HeadVerdict
        var testDescription: String { name }
    }

    static let fresh200 = Validators(
        etag: "\"v1\"", lastModified: lastModified, date: dateLater, totalLength: 1000, acceptRanges: true)
    static let good206: [(String, String)] = [
        ("Content-Range", "bytes 400-999/1000"), ("Content-Length", "600"), ("ETag", "\"v1\""),
        ("Accept-Ranges", "bytes"),
    ]

    static let verdictCases: [VerdictCase] = [
        // 206
        VerdictCase(
            name: "206 as asked: accept, keeping what the partial response is silent about",
            head: head(206, good206 + [("Date", dateOneSecond)]), plan: resumePlan, known: known,
            expected: .accept(bodyStart: 400, validators: known)),
        VerdictCase(
            name: "206 for the overlap window", head: head(206, [("Content-Range", "bytes 0-999/1000")]),
            plan: overlapPlan, known: nothing,
            expected: .accept(
                bodyStart: 0,
                validators: Validators(
                    etag: nil, lastModified: nil, date: nil, totalLength: 1000, acceptRanges: true))),
        VerdictCase(
            name: "206 starting elsewhere", head: head(206, [("Content-Range", "bytes 0-999/1000")]),
            plan: resumePlan, known: known, expected: .restart(.contentRangeMismatch("bytes 0-999/1000"))),
        VerdictCase(
            name: "206 starting later", head: head(206, [("Content-Range", "bytes 410-999/1000")]),
            plan: resumePlan, known: known, expected: .restart(.contentRangeMismatch("bytes 410-999/1000"))),
        VerdictCase(
            name: "206 without Content-Range", head: head(206, [("Content-Length", "600")]), plan: resumePlan,
            known: known, expected: .restart(.contentRangeMismatch(""))),
        VerdictCase(
            name: "206 with an unknown complete length", head: head(206, [("Content-Range", "bytes 400-999/*")]),
            plan: resumePlan, known: known, expected: .restart(.contentRangeMismatch("bytes 400-999/*"))),
        VerdictCase(
            name: "206 past its complete length", head: head(206, [("Content-Range", "bytes 400-1000/1000")]),
            plan: resumePlan, known: known, expected: .restart(.contentRangeMismatch("bytes 400-1000/1000"))),
        VerdictCase(
            name: "206 with unparsable Content-Range", head: head(206, [("Content-Range", "bytes 400-/1000")]),
            plan: resumePlan, known: known, expected: .restart(.contentRangeMismatch("bytes 400-/1000"))),
        VerdictCase(
            name: "206 whose Content-Length disagrees with its range",
            head: head(206, [("Content-Range", "bytes 400-999/1000"), ("Content-Length", "599")]),
            plan: resumePlan, known: known,
            expected: .malformed("Content-Length 599 does not match Content-Range bytes 400-999/1000")),
        VerdictCase(
            name: "206 with another complete length", head: head(206, [("Content-Range", "bytes 400-999/2000")]),
            plan: resumePlan, known: known, expected: .restart(.lengthChanged(old: 1000, new: 2000))),
        VerdictCase(
            name: "206 with another ETag",
            head: head(206, [("Content-Range", "bytes 400-999/1000"), ("ETag", "\"v2\"")]), plan: resumePlan,
            known: known, expected: .restart(.etagChanged(old: "\"v1\"", new: "\"v2\""))),
        VerdictCase(
            name: "206 with another Last-Modified",
            head: head(206, [("Content-Range", "bytes 400-999/1000"), ("Last-Modified", dateLater)]),
            plan: resumePlan, known: known, expected: .restart(.lastModifiedChanged(old: lastModified, new: dateLater))
        ),
        VerdictCase(
            name: "206 without validators, shorter than the data on disk",
            head: head(206, [("Content-Range", "bytes 0-49999/50000")]),
            plan: RequestPlan(rangeStart: 0, resumeOffset: 70_000, ifRange: nil), known: Validators.none,
            expected: .restart(.lengthChanged(old: 70_000, new: 50_000))),
        VerdictCase(
            name: "206 to a request for the whole file", head: head(206, [("Content-Range", "bytes 0-999/1000")]),
            plan: wholePlan, known: nil,
            expected: .restart(.contentRangeMismatch("a partial response to a request for the whole file"))),
        // 200
        VerdictCase(
            name: "200 to a whole-file request",
            head: head(
                200,
                [("Content-Length", "1000"), ("ETag", "\"v1\""), ("Last-Modified", lastModified),
                    ("Date", dateLater), ("Accept-Ranges", "bytes")]),
            plan: wholePlan, known: nil, expected: .accept(bodyStart: 0, validators: fresh200)),
        VerdictCase(
            name: "200 chunked: length unknown", head: head(200, [("Transfer-Encoding", "chunked")]),
            plan: wholePlan, known: nil,
            expected: .accept(
                bodyStart: 0,
                validators: Validators(
                    etag: nil, lastModified: nil, date: nil, totalLength: nil, acceptRanges: false))),
        VerdictCase(
            name: "200 to a range request, same file: range ignored",
            head: head(
                200,
                [("Content-Length", "1000"), ("ETag", "\"v1\""), ("Last-Modified", lastModified),
                    ("Date", dateLater), ("Accept-Ranges", "bytes")]),
            plan: resumePlan, known: known, expected: .restartWithBody(.rangeIgnored, validators: fresh200)),
        VerdictCase(
            name: "200 to a range request with a new ETag",
            head: head(200, [("Content-Length", "1000"), ("ETag", "\"v2\"")]), plan: resumePlan, known: known,
            expected: .restartWithBody(
                .etagChanged(old: "\"v1\"", new: "\"v2\""),
                validators: Validators(
                    etag: "\"v2\"", lastModified: nil, date: nil, totalLength: 1000, acceptRanges: false))),
        VerdictCase(
            name: "200 to a range request with a new length", head: head(200, [("Content-Length", "1200")]),
            plan: overlapPlan, known: fresh200,
            expected: .restartWithBody(
                .lengthChanged(old: 1000, new: 1200),
                validators: Validators(
                    etag: nil, lastModified: nil, date: nil, totalLength: 1200, acceptRanges: false))),
        // 416
        VerdictCase(
            name: "416 confirming a complete local copy", head: head(416, [("Content-Range", "bytes */1000")]),
            plan: RequestPlan(rangeStart: 1000, resumeOffset: 1000, ifRange: "\"v1\""), known: known,
            expected: .complete),
        VerdictCase(
            name: "416 with a partial local copy", head: head(416, [("Content-Range", "bytes */1000")]),
            plan: resumePlan, known: known, expected: .restart(.rangeNotSatisfiable)),
        VerdictCase(
            name: "416 with another length", head: head(416, [("Content-Range", "bytes */900")]),
            plan: RequestPlan(rangeStart: 1000, resumeOffset: 1000, ifRange: "\"v1\""), known: known,
            expected: .restart(.rangeNotSatisfiable)),
        VerdictCase(
            name: "416 without Content-Range", head: head(416),
            plan: RequestPlan(rangeStart: 1000, resumeOffset: 1000, ifRange: "\"v1\""), known: known,
            expected: .restart(.rangeNotSatisfiable)),
        VerdictCase(
            name: "416 when the length was never known", head: head(416, [("Content-Range", "bytes */1000")]),
            plan: RequestPlan(rangeStart: 1000, resumeOffset: 1000, ifRange: "\"v1\""),
            known: Validators(etag: "\"v1\"", lastModified: nil, date: nil, totalLength: nil, acceptRanges: true),
            expected: .restart(.rangeNotSatisfiable)),
        // Redirects
        VerdictCase(
            name: "redirect without Location", head: head(302), plan: wholePlan, known: nil,
            expected: .fail(status: 302)),
        VerdictCase(
            name: "redirect with an empty Location", head: head(307, [("Location", "")]), plan: wholePlan,
            known: nil, expected: .fail(status: 307)),
        // Other statuses
        VerdictCase(
            name: "503 with Retry-After", head: head(503, [("Retry-After", "2")]), plan: resumePlan, known: known,
            expected: .retry(status: 503, retryAfter: "2")),
        VerdictCase(
            name: "304 is not a success", head: head(304), plan: wholePlan, known: nil, expected: .fail(status: 304)
        ),
        VerdictCase(
            name: "204 is not a file", head: head(204), plan: wholePlan, known: nil, expected: .fail(status: 204)),
    ]

    @Test(arguments: verdictCases)
    func evaluate(_ c: VerdictCase) {
        #expect(ResumePolicy.evaluate(c.head, plan: c.plan, known: c.known) == c.expected)
    }

    @Test(arguments: [301, 302, 303, 307, 308])
    func redirectStatuses(_ status: Int) {
        let verdict = ResumePolicy.evaluate(
            Self.head(status, [("Location", "/elsewhere")]), plan: Self.resumePlan, known: Self.known)
        #expect(verdict == .redirect(location: "/elsewhere"))
    }

    @Test(arguments: [408, 429, 500, 502, 503, 504, 599])
    func retriedStatuses(_ status: Int) {
        #expect(
            ResumePolicy.evaluate(Self.head(status), plan: Self.wholePlan, known: nil)
                == .retry(status: status, retryAfter: nil))
    }

    @Test(arguments: [400, 401, 403, 404, 405, 410, 412, 451])
    func failedStatuses(_ status: Int) {
        // An error body is never taken as the file, with or without a partial download.
        #expect(ResumePolicy.evaluate(Self.head(status), plan: Self.wholePlan, known: nil) == .fail(status: status))
        #expect(
            ResumePolicy.evaluate(Self.head(status), plan: Self.resumePlan, known: Self.known)
                == .fail(status: status))
    }

    // MARK: Validators(from:) and change(from:to:)

    @Test func validatorsFromHead() {
        let ranged = Validators(
            from: Self.head(206, [("Content-Range", "bytes 5-9/10"), ("Content-Length", "5")]))
        #expect(ranged.totalLength == 10)
        #expect(ranged.acceptRanges)  // a 206 proves ranges work
        let whole = Validators(from: Self.head(200, [("Content-Length", "42")]))
        #expect(whole.totalLength == 42)
        #expect(!whole.acceptRanges)
        #expect(Validators(from: Self.head(200, [("Content-Length", "-1")])).totalLength == nil)
        #expect(Validators(from: Self.head(200, [("Content-Length", "x")])).totalLength == nil)
        #expect(
            Validators(from: Self.head(200, [("Accept-Ranges", "none")])).acceptRanges == false)
        #expect(
            Validators(from: Self.head(200, [("accept-ranges", "Bytes")])).acceptRanges == true)
    }

    struct ChangeCase: Sendable, CustomTestStringConvertible {
        var name: String
        var known: Validators?
        var fresh: Validators
        var expected: RestartReason?
        var testDescription: String { name }
    }

    static func with(_ change: (inout Validators) -> Void) -> Validators {
        var v = known
        change(&v)
        return v
    }

    static let changeCases: [ChangeCase] = [
        ChangeCase(name: "nothing known", known: nil, fresh: known, expected: nil),
        ChangeCase(name: "same", known: known, fresh: known, expected: nil),
        ChangeCase(name: "silent response", known: known, fresh: nothing, expected: nil),
        ChangeCase(
            name: "ETag", known: known, fresh: with { $0.etag = "\"v2\"" },
            expected: .etagChanged(old: "\"v1\"", new: "\"v2\"")),
        ChangeCase(
            name: "weak ETag counts too", known: weakOnly, fresh: with { $0.etag = "W/\"v2\"" },
            expected: .etagChanged(old: "W/\"v1\"", new: "W/\"v2\"")),
        ChangeCase(
            name: "Last-Modified", known: known, fresh: with { $0.lastModified = dateLater },
            expected: .lastModifiedChanged(old: lastModified, new: dateLater)),
        ChangeCase(
            name: "length", known: known, fresh: with { $0.totalLength = 999 },
            expected: .lengthChanged(old: 1000, new: 999)),
        ChangeCase(
            name: "ETag wins over length", known: known,
            fresh: with {
                $0.etag = "\"v3\""
                $0.totalLength = 5
            }, expected: .etagChanged(old: "\"v1\"", new: "\"v3\"")),
        ChangeCase(name: "Date alone is no change", known: known, fresh: with { $0.date = dateSame }, expected: nil),
    ]

    @Test(arguments: changeCases)
    func change(_ c: ChangeCase) {
        #expect(ResumePolicy.change(from: c.known, to: c.fresh) == c.expected)
    }

    @Test func everyRestartReasonIsSaidPlainly() {
        let reasons: [RestartReason] = [
            .rangeIgnored, .etagChanged(old: "\"a\"", new: "\"b\""), .lastModifiedChanged(old: "x", new: "y"),
            .lengthChanged(old: 1, new: 2), .contentRangeMismatch("bytes 1-2/3"), .contentRangeMismatch(""),
            .rangeNotSatisfiable, .overlapMismatch(offset: 65_536), .untrustedPartial("the state was lost"),
        ]
        let texts = reasons.map(\.description)
        #expect(Set(texts).count == texts.count)
        for text in texts {
            #expect(!text.isEmpty && !text.contains("\n"))
        }
        #expect(texts[1].contains("\"a\"") && texts[1].contains("\"b\""))
        #expect(texts[3].contains("1") && texts[3].contains("2"))
        #expect(texts[4].contains("bytes 1-2/3"))
        #expect(texts[5].contains("none"))
        #expect(texts[7].contains("65536"))
        #expect(texts[8] == "the state was lost")
    }

    // MARK: Content-Range

    @Test(arguments: [
        ("bytes 0-499/1234", 0, 499, 1234),
        ("bytes 500-1233/1234", 500, 1233, 1234),
        ("bytes 500-999/*", 500, 999, nil),
        ("bytes */1234", nil, nil, 1234),
        ("bytes */0", nil, nil, 0),
        ("BYTES 0-0/1", 0, 0, 1),
        ("  bytes 1-2/3\t", 1, 2, 3),
        ("bytes  1-2/3", 1, 2, 3),
        ("bytes 5-9/3", 5, 9, 3),  // syntactically fine; evaluate() rejects last >= complete
        ("bytes 0-999999999999999999/999999999999999999", 0, 999_999_999_999_999_999, 999_999_999_999_999_999),
    ] as [(String, Int64?, Int64?, Int64?)])
    func contentRangeParses(_ header: String, _ first: Int64?, _ last: Int64?, _ complete: Int64?) throws {
        let range = try #require(ContentRange(parsing: header))
        #expect(range.first == first)
        #expect(range.last == last)
        #expect(range.completeLength == complete)
    }

    @Test(arguments: [
        "", "bytes", "bytes ", "bytes */*", "bytes 5-4/10", "bytes -1-2/3", "bytes 1--2/3", "items 0-1/2",
        "bytes 0-1", "bytes 0-1/2/3", "bytes a-b/c", "bytes 0-1/x", "bytes 0-1/-2", "bytes 0 -1/2", "bytes 0-/10",
        "bytes -5/10", "bytes=0-1/2", "bytes 0-1/2 3", "bytes 0-1/10000000000000000000", "bytes +1-2/3",
        "bytes ١-٢/٣",
    ])
    func contentRangeRejects(_ header: String) {
        #expect(ContentRange(parsing: header) == nil)
    }

    // MARK: Validators.ifRange

    @Test(arguments: [
        // (etag, lastModified, date, expected If-Range)
        ("\"abc\"", nil, nil, "\"abc\""),
        ("\"\"", nil, nil, "\"\""),
        ("W/\"abc\"", nil, nil, nil),
        ("abc", nil, nil, nil),  // not a valid entity-tag
        ("W/\"abc\"", lastModified, dateLater, lastModified),  // weak ETag: fall back to a strong date
        ("\"abc\"", lastModified, dateLater, "\"abc\""),  // a strong ETag is preferred
        (nil, lastModified, dateLater, lastModified),
        (nil, lastModified, dateOneSecond, lastModified),  // exactly one second is enough
        (nil, lastModified, dateSame, nil),  // same second: weak
        (nil, dateLater, lastModified, nil),  // modified after the Date: weak
        (nil, lastModified, nil, nil),  // no Date to compare with
        (nil, "yesterday", dateLater, nil),  // not a date
        (nil, lastModified, "soon", nil),
        (nil, nil, dateLater, nil),
    ] as [(String?, String?, String?, String?)])
    func ifRange(_ etag: String?, _ lastModified: String?, _ date: String?, _ expected: String?) {
        let v = Validators(etag: etag, lastModified: lastModified, date: date, totalLength: 10, acceptRanges: true)
        #expect(v.ifRange == expected)
    }

    // MARK: RetryPolicy.delay

    static let now: Int64 = 1_700_000_000

    @Test(arguments: [
        ("2", 2.0), ("0", 0), (" 7 ", 7), ("120", 120), ("600", 600), ("601", 600), ("99999999999999999999", 600),
    ])
    func retryAfterSeconds(_ header: String, _ expected: Double) {
        let policy = RetryPolicy()
        for jitter in [0.0, 0.5, 1.0] {
            #expect(policy.delay(attempt: 3, retryAfter: header, now: Self.now, jitter: jitter) == expected)
        }
    }

    @Test(arguments: [(30, 30.0), (0, 0), (-3600, 0), (86_400, 600)])
    func retryAfterDate(_ secondsFromNow: Int, _ expected: Double) {
        let header = ServedFile.httpDate(secondsSince1970: Int(Self.now) + secondsFromNow)
        #expect(RetryPolicy().delay(attempt: 1, retryAfter: header, now: Self.now, jitter: 0.3) == expected)
    }

    @Test func retryAfterClampIsConfigurable() {
        var policy = RetryPolicy()
        policy.maxRetryAfter = 5
        #expect(policy.delay(attempt: 1, retryAfter: "30", now: Self.now, jitter: 0) == 5)
    }

    @Test(arguments: ["soon", "", "-5", "1.5", "Tue, 99 Foo 2024 00:00:00 GMT"])
    func unusableRetryAfterFallsBackToBackoff(_ header: String) {
        let policy = RetryPolicy()
        #expect(policy.delay(attempt: 2, retryAfter: header, now: Self.now, jitter: 1) == 2)
        #expect(policy.delay(attempt: 2, retryAfter: header, now: Self.now, jitter: 0) == 1)
    }

    @Test(arguments: [(1, 1.0), (2, 2), (3, 4), (4, 8), (5, 16), (6, 32), (7, 60), (8, 60), (40, 60), (10_000, 60)])
    func backoffGrowsAndIsCapped(_ attempt: Int, _ full: Double) {
        let policy = RetryPolicy()
        // Equal jitter: half fixed, half random.
        #expect(policy.delay(attempt: attempt, retryAfter: nil, now: Self.now, jitter: 1) == full)
        #expect(policy.delay(attempt: attempt, retryAfter: nil, now: Self.now, jitter: 0) == full / 2)
        #expect(policy.delay(attempt: attempt, retryAfter: nil, now: Self.now, jitter: 0.5) == full * 0.75)
    }

    @Test func jitterStaysInBounds() {
        var policy = RetryPolicy()
        policy.baseDelay = 0.25
        policy.maxDelay = 10
        var generator = SplitMix64(seed: 1)
        var previousLow = 0.0
        for attempt in 0...20 {
            let full = min(10, 0.25 * Double(1 << max(0, attempt - 1)))
            for _ in 0..<50 {
                let jitter = Double(generator.next() % 1_000_001) / 1_000_000
                let delay = policy.delay(attempt: attempt, retryAfter: nil, now: Self.now, jitter: jitter)
                #expect(delay >= full / 2 && delay <= full, "attempt \(attempt) jitter \(jitter): \(delay)")
            }
            // The lower bound never shrinks as attempts go on.
            #expect(full / 2 >= previousLow)
            previousLow = full / 2
        }
    }
}

