import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport

/// The background driver's pure decisions, as tables: labels, the verdict on a finished task, the ranges a file is cut
/// into, and the reconciliation of a relaunched session's tasks (docs/background-sessions.md, "Test plan").
@Suite struct BackgroundPlanTests {
    static let id = DownloadID(rawValue: 0x00f3_a9c2_7d1e_4b08)
    static let etag = "\"bg1\""
    static let known = Validators(
        etag: etag, lastModified: nil, date: nil, totalLength: 10_000, acceptRanges: true)

    static func head(_ status: Int, _ fields: [(String, String)]) -> ResponseHead {
        var headers = HTTPHeaders()
        for (name, value) in fields { headers.add(name: name, value: value) }
        return ResponseHead(status: status, headers: headers)
    }

    static func range(_ start: Int64, _ end: Int64) -> TaskLabel {
        TaskLabel(download: id, nonce: "abc1", kind: .range, start: start, end: end)
    }

    // MARK: Labels

    @Test func labelsRoundTripAndRejectAnythingElse() {
        let labels = [
            TaskLabel(download: Self.id, nonce: "abc1", kind: .probe, start: 0, end: 1 << 20),
            Self.range(1 << 20, 2 << 20),
            TaskLabel(download: Self.id, nonce: "ffffffffffffffff", kind: .whole, start: 0, end: nil),
        ]
        for label in labels {
            #expect(TaskLabel(parsing: label.description) == label, "\(label)")
        }
        #expect(Self.range(5, 10).description == "stitch1 00f3a9c27d1e4b08 abc1 r 5 10")
        #expect(Self.range(5, 10).rangeHeader == "bytes=5-9")
        let bad = [
            "", "stitch1", "stitch2 00f3a9c27d1e4b08 abc1 r 5 10", "stitch1 00f3a9c27d1e4b08 abc1 r 10 5",
            "stitch1 00f3a9c27d1e4b08 abc1 r 5 5", "stitch1 00f3a9c27d1e4b08 abc1 r 5 *",
            "stitch1 00f3a9c27d1e4b08 abc1 p 5 10", "stitch1 00f3a9c27d1e4b08 abc1 w 0 10",
            "stitch1 00f3a9c27d1e4b08 xyz r 5 10", "stitch1 f3a9c27d1e4b08 abc1 r 5 10",
            "stitch1 00f3a9c27d1e4b08 abc1 r -5 10", "stitch1 00f3a9c27d1e4b08 abc1 r 5 10 ",
            "stitch1 00f3a9c27d1e4b08 abc1 x 5 10", "stitch1 00f3a9c27d1e4b08 abc1 r 5 99999999999999999999",
        ]
        for text in bad { #expect(TaskLabel(parsing: text) == nil, "\(text.debugDescription)") }
    }

    // MARK: Judging a range

    @Test(arguments: [
        // Exactly the range, of the known version.
        (206, [("Content-Range", "bytes 1000-1999/10000"), ("ETag", etag)], 1000, TaskVerdict.range),
        // A 206 silent about its validators: If-Range was sent, and the range is exact.
        (206, [("Content-Range", "bytes 1000-1999/10000")], 1000, .range),
        // A short or long file: the body was cut, or is not what the head says.
        (206, [("Content-Range", "bytes 1000-1999/10000"), ("ETag", etag)], 999,
         .retry("the body has 999 of the 1000 bytes asked for")),
        (206, [("Content-Range", "bytes 1000-1999/10000"), ("ETag", etag)], 1001,
         .retry("the body has 1001 of the 1000 bytes asked for")),
        // The server ignored the range, or the validator changed.
        (200, [("ETag", etag), ("Content-Length", "10000")], 10_000, .restart(.rangeIgnored)),
        (200, [("ETag", "\"bg2\""), ("Content-Length", "10000")], 10_000,
         .restart(.etagChanged(old: etag, new: "\"bg2\""))),
        (206, [("Content-Range", "bytes 1000-1999/10000"), ("ETag", "\"bg2\"")], 1000,
         .restart(.etagChanged(old: etag, new: "\"bg2\""))),
        // Another span, another length, no Content-Range.
        (206, [("Content-Range", "bytes 1001-2000/10000"), ("ETag", etag)], 1000,
         .restart(.contentRangeMismatch("bytes 1001-2000/10000"))),
        (206, [("Content-Range", "bytes 1000-1998/10000"), ("ETag", etag)], 999,
         .restart(.contentRangeMismatch("bytes 1000-1998/10000"))),
        (206, [("Content-Range", "bytes 1000-1999/20000"), ("ETag", etag)], 1000,
         .restart(.lengthChanged(old: 10_000, new: 20_000))),
        (206, [("Content-Range", "bytes 1000-1999/*"), ("ETag", etag)], 1000,
         .restart(.contentRangeMismatch("bytes 1000-1999/*"))),
        (206, [("ETag", etag)], 1000, .restart(.contentRangeMismatch(""))),
        (416, [("Content-Range", "bytes */10000")], 0, .restart(.rangeNotSatisfiable)),
        // An error page delivered as "the download", a temporary status, an encoding.
        (404, [("Content-Length", "153")], 153, .fail("the server answered 404")),
        (503, [("Retry-After", "5")], 0, .retry("the server answered 503", retryAfter: "5")),
        (429, [], 0, .retry("the server answered 429")),
        (206, [("Content-Range", "bytes 1000-1999/10000"), ("ETag", etag), ("Content-Encoding", "gzip")], 1000,
         .fail("the server sent an encoded body (Content-Encoding: \"gzip\") despite Accept-Encoding: identity")),
    ] as [(Int, [(String, String)], Int64, TaskVerdict)])
    func aRangeTaskIsTakenOnlyWhenExact(status: Int, fields: [(String, String)], size: Int64, expected: TaskVerdict) {
        let verdict = BackgroundPlan.judge(
            Self.range(1000, 2000), head: Self.head(status, fields), fileSize: size, known: Self.known)
        #expect(verdict == expected)
    }

    @Test func noResponseIsRetried() {
        #expect(BackgroundPlan.judge(Self.range(0, 10), head: nil, fileSize: 0, known: Self.known) == .retry("no response"))
    }

    // MARK: Judging the probe and the whole file

    @Test func theProbeLearnsTheFileOrFallsBackToOneTask() {
        let probe = TaskLabel(download: Self.id, nonce: "abc1", kind: .probe, start: 0, end: 1000)
        func judge(_ status: Int, _ fields: [(String, String)], _ size: Int64) -> TaskVerdict {
            BackgroundPlan.judge(probe, head: Self.head(status, fields), fileSize: size, known: nil)
        }
        // A strong ETag and ranges: continued in ranges.
        guard case .probed(let validators) = judge(206, [("Content-Range", "bytes 0-999/10000"), ("ETag", Self.etag)], 1000)
        else {
            Issue.record("not probed")
            return
        }
        #expect(validators.totalLength == 10_000 && validators.ifRange == Self.etag && validators.acceptRanges)
        // A weak ETag (no If-Range possible): the whole file in one task.
        guard case .needsWholeFile = judge(206, [("Content-Range", "bytes 0-999/10000"), ("ETag", "W/\"x\"")], 1000)
        else {
            Issue.record("a weak ETag was continued in ranges")
            return
        }
        // The probe was the whole file (shorter than the probe), with or without a validator.
        guard case .whole(let small) = judge(206, [("Content-Range", "bytes 0-499/500")], 500) else {
            Issue.record("a short file was not taken whole")
            return
        }
        #expect(small.totalLength == 500)
        // A 200: the whole file; its length is the file's when the head says none, and must match when it does.
        guard case .whole(let full) = judge(200, [("ETag", Self.etag)], 12_345) else {
            Issue.record("a 200 was not taken whole")
            return
        }
        #expect(full.totalLength == 12_345)
        #expect(judge(200, [("Content-Length", "12345")], 12_000) == .retry("the body has 12000 of the 12345 bytes announced"))
        // A probe answered with other bytes than asked for, or a short body.
        #expect(
            judge(206, [("Content-Range", "bytes 0-499/10000"), ("ETag", Self.etag)], 500)
                == .retry("the server's Content-Range (bytes 0-499/10000) does not match the request"))
        #expect(
            judge(206, [("Content-Range", "bytes 0-999/10000"), ("ETag", Self.etag)], 900)
                == .retry("the body has 900 of the 1000 bytes announced"))
        #expect(judge(404, [], 153) == .fail("the server answered 404"))
    }

    @Test func theWholeFileIsTakenOnlyFromA200OfItsAnnouncedLength() {
        let whole = TaskLabel(download: Self.id, nonce: "abc1", kind: .whole, start: 0, end: nil)
        func judge(_ status: Int, _ fields: [(String, String)], _ size: Int64) -> TaskVerdict {
            BackgroundPlan.judge(whole, head: Self.head(status, fields), fileSize: size, known: Self.known)
        }
        guard case .whole(let validators) = judge(200, [("Content-Length", "777")], 777) else {
            Issue.record("not taken")
            return
        }
        #expect(validators.totalLength == 777)
        // A chunked body has no length to check against: its file is the file.
        guard case .whole = judge(200, [("Transfer-Encoding", "chunked")], 5) else {
            Issue.record("a chunked body was not taken")
            return
        }
        #expect(judge(200, [("Content-Length", "777")], 700) == .retry("the body has 700 of the 777 bytes announced"))
        #expect(
            judge(206, [("Content-Range", "bytes 0-9/777")], 10)
                == .retry("a partial response (206) to a request for the whole file"))
    }

    // MARK: Ranges

    @Test func filesAreCutIntoWholePiecesWithinTheRangeCount() {
        let mib: Int64 = 1 << 20
        let cuts = BackgroundPlan.ranges(from: mib, to: 10 * mib + 5, rangeSize: 3 * mib, pieceSize: mib, maximumRanges: 63)
        #expect(cuts == [mib..<4 * mib, 4 * mib..<7 * mib, 7 * mib..<10 * mib, 10 * mib..<10 * mib + 5])
        // More ranges than allowed: they grow (to whole pieces).
        let many = BackgroundPlan.ranges(from: 0, to: 100 * mib, rangeSize: mib, pieceSize: mib, maximumRanges: 10)
        #expect(many.count == 10 && many.allSatisfy { $0.lowerBound % mib == 0 })
        #expect(many.first?.lowerBound == 0 && many.last?.upperBound == 100 * mib)
        #expect(zip(many, many.dropFirst()).allSatisfy { $0.upperBound == $1.lowerBound })
        // A range size that is not whole pieces is rounded up.
        #expect(BackgroundPlan.ranges(from: 0, to: 5 * mib, rangeSize: mib + 1, pieceSize: mib, maximumRanges: 64).count == 3)
        #expect(BackgroundPlan.ranges(from: 5, to: 5, rangeSize: mib, pieceSize: mib, maximumRanges: 64).isEmpty)
        #expect(
            BackgroundPlan.missing([
                Segment(start: 0, end: 10, durable: 10), Segment(start: 20, end: 30, durable: 25),
                Segment(start: 10, end: 20, durable: 10),
            ]) == [10..<20, 25..<30])
    }

    // MARK: Reconciling a relaunched session

    @Test func aRelaunchKeepsOneTaskPerNeededRangeAndCancelsTheRest() {
        let other = DownloadID(rawValue: 7)
        let tasks: [(taskID: Int, label: TaskLabel)] = [
            (1, Self.range(0, 100)),
            (2, Self.range(0, 100)),  // a duplicate
            (3, TaskLabel(download: Self.id, nonce: "0dd", kind: .range, start: 100, end: 200)),  // stale generation
            (4, Self.range(200, 250)),  // a range no longer needed in this shape
            (5, TaskLabel(download: other, nonce: "abc1", kind: .range, start: 0, end: 100)),  // another download's
            (6, TaskLabel(download: Self.id, nonce: "abc1", kind: .probe, start: 0, end: 100)),  // another kind
        ]
        let plan = BackgroundPlan.reconcile(
            tasks: tasks, download: Self.id, nonce: "abc1", kind: .range, needed: [0..<100, 100..<200, 200..<300])
        #expect(plan.keep == [1: Self.range(0, 100)])
        #expect(plan.cancel.sorted() == [2, 3, 4, 6])
        #expect(plan.create == [100..<200, 200..<300])
    }
}
