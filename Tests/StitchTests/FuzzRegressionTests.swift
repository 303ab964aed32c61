import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

/// Inputs the libFuzzer targets in Fuzz/ found crashing (see Fuzz/README.md), kept so they stay fixed.
@Suite struct FuzzRegressionTests {
    /// Fuzz/Targets/HTTPDate.swift: an RFC 850 date's two-digit year is placed within 50 years of `now`; around an
    /// extreme `now` (a caller's clock, e.g. a `DownloadClock`) that year is ~292 billion years away and its seconds
    /// overflowed Int64 in `HTTPDate.timestamp`, trapping in `parse(_:now:)`, `retryAfterDelay` and
    /// `RetryPolicy.delay`. Now such a date is not representable and does not parse.
    @Test func rfc850DateAtExtremeNowDoesNotTrap() {
        let text = "Sunday, 06-Nov-94 08:49:37 GMT"
        #expect(HTTPDate.parse(text, now: .min) == nil)
        #expect(HTTPDate.retryAfterDelay(text, now: .min) == nil)
        #expect(RetryPolicy().delay(attempt: 1, retryAfter: text, now: .min, jitter: 0) == 0.5)
        // Near the other end the date still fits, and is in the past.
        let late = HTTPDate.parse(text, now: .max)
        #expect(late != nil)
        #expect(late.map { $0 < .max } == true)
        #expect(HTTPDate.retryAfterDelay(text, now: .max) == 0)
        for now: Int64 in [.min, .min + 86_400 * 366 * 60, -1, 0, .max - 86_400 * 366 * 60, .max] {
            for date in [text, "Monday, 01-Jan-00 00:00:00 GMT", "Friday, 31-Dec-99 23:59:59 GMT"] {
                _ = HTTPDate.parse(date, now: now)
                if let delay = HTTPDate.retryAfterDelay(date, now: now) { #expect(delay >= 0) }
            }
        }
    }

    /// Fuzz/Targets/StateFile.swift: a state file whose length is near Int64.max made `DownloadState.problem()`
    /// overflow computing the piece count (`total + pieceSize - 1`), so reading a corrupt or hostile
    /// `NAME.stitch` crashed `stitch` instead of refusing or accepting it.
    @Test func stateWithHugeLengthDoesNotTrap() throws {
        let json = """
            {"schemaVersion":2,"url":"u","headers":[],"validators":{"acceptRanges":true,"totalLength":9223372036854775807},\
            "segments":[{"start":0,"end":9223372036854775807,"durable":0}],"pieceSize":1048576,"pieces":[],\
            "bootID":"b","liveNonce":"1","updatedAt":0}
            """
        var template = Array("/tmp/stitch-fuzz-regression-XXXXXX".utf8CString)
        let made = try #require(template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) })
        let directory = String(cString: made)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/file.bin.stitch"
        try Data(json.utf8).write(to: URL(fileURLWithPath: path))

        let state = try #require(try StateFile.read(path))
        #expect(state.validators.totalLength == .max)
        #expect(state.problem() == nil)

        // The same length with more piece checksums than pieces is refused, not trapped on.
        var crowded = state
        crowded.pieceSize = 1 << 62
        crowded.pieces = [1, 2, 3]
        #expect(crowded.problem() == "too many pieces")
        crowded.pieces = [1, 2]
        #expect(crowded.problem() == nil)
    }
}
