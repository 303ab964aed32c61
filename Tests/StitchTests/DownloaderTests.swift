import Dispatch
import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

/// End-to-end tests of the engine: `Downloader` over the real libcurl transport against the fault-injecting
/// loopback server, with a fake clock for backoff. Every successful download is checked byte for byte (SHA-256)
/// against the source, and every test watches that nothing appears at the destination before completion: at each
/// request the server receives and at each event the engine sends.
@Suite struct DownloaderTests {
    static let size = 4 << 20
    static let etag = "\"v1\""

    // MARK: Clean runs

    @Test func cleanDownload() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 1, etag: Self.etag)
        f.serve(file)
        var request = f.request()
        request.headers.add(name: "X-Test", value: "yes")
        let result = try await f.download(request)

        try f.expectComplete(result, file.data)
        #expect(result.bytesTransferred == Int64(Self.size))
        #expect(result.resumedFrom == 0)
        #expect(!result.alreadyComplete)
        #expect(result.checksum == nil)
        let requests = f.server.requests
        #expect(requests.count == 1)
        #expect(requests.first?.askedRange == nil)
        #expect(requests.first?.header("If-Range") == nil)
        #expect(requests.first?.header("X-Test") == "yes")
        #expect(f.watch.resolved == [f.dest])
        #expect(f.watch.receiving.map(\.status) == [200])
        #expect(f.watch.receiving.first?.total == Int64(Self.size))
        #expect(f.watch.restarts.isEmpty && f.watch.retries.isEmpty)
        #expect(f.clock.sleeps.isEmpty)
    }

    @Test func zeroByteFile() async throws {
        let f = try Fixture()
        let file = ServedFile(data: [], etag: Self.etag)
        f.serve(file)
        let result = try await f.download(f.request())
        try f.expectComplete(result, [])
        #expect(result.bytes == 0)

        f.watch.disarm()
        let again = try await f.download(f.request())
        #expect(again.alreadyComplete)
        // Over URLSession the first window (`bytes=0-…`) of an empty file is refused (416) and the file asked for as
        // the engine asked.
        #expect(f.server.requests.count == (TestBackend.selected.requestWindow == nil ? 1 : 2))
    }

    @Test func chunkedWithoutLength() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 3 << 20, seed: 2, etag: Self.etag)
        // Without ranges, so that URLSession's first window (whose Content-Range would tell the length) is answered
        // as libcurl's request for the whole file is.
        f.serve(file, faults: .always(.all([.chunked, .ignoreRange])))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.watch.receiving.first?.total == nil)
        #expect(f.server.requests.count == 1)
    }

    @Test func chunkedDropResumesWithRange() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 3 << 20, seed: 2, etag: Self.etag)
        f.serve(file, faults: .sequence([.all([.chunked, .dropAfter(1_000_000)]), .chunked]))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        let requests = f.server.requests
        #expect(requests.count == 2)
        #expect(requests.last?.askedRange == "bytes=1000000-")
        #expect(requests.last?.header("If-Range") == Self.etag)
        #expect(f.server.bodyBytesSent == 3 << 20)
    }

    /// Unknown lengths end with their responses, also after a restart in place: a chunked first response drops,
    /// the resume's range is ignored (a chunked 200 — the whole file, length still unknown), the download restarts
    /// from zero keeping that body, and ends when it ends (not asking again for a length it was never told).
    /// Then the same with the server changing the file to a longer one: the new length comes only from the body.
    @Test(.timeLimit(.minutes(1)), arguments: [false, true])
    func unknownLengthEndsWithTheBodyAfterARestartInPlace(_ longer: Bool) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 3 << 20, seed: 2, etag: Self.etag)
        let other = ServedFile.random(size: 4 << 20, seed: 5, etag: "\"v2\"")
        let second: Fault = longer ? .all([.chunked, .servedAs(other)]) : .all([.chunked, .ignoreRange])
        f.serve(file, faults: .sequence([.all([.chunked, .dropAfter(1_000_000)]), second]))
        let result = try await f.download(f.request())
        try f.expectComplete(result, longer ? other.data : file.data)
        let requests = f.server.requests
        #expect(requests.count == 2, "\(requests.map(\.askedRange))")
        #expect(requests.last?.askedRange == "bytes=1000000-")
        #expect(f.watch.restarts.count == 1, "\(f.watch.restarts)")
    }

    // MARK: Retries within one run continue from the offset

    @Test(arguments: [Cut.drop, .shortBody, .reset])
    func interruptedTransferIsRetriedFromTheOffset(_ cut: Cut) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 3, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, cut.fault(after: 1_000_000)))
        let result = try await f.download(f.request())

        try f.expectComplete(result, file.data)
        let requests = f.server.requests
        #expect(requests.count == 2)
        let retry = try #require(requests.last)
        #expect(retry.header("If-Range") == Self.etag || retry.askedRange == nil)
        if cut == .reset {
            // A TCP reset may destroy bytes the kernel had received: anything up to the cut is fine.
            let start = retry.askedRange.flatMap { Int($0.dropFirst(6).dropLast()) } ?? 0
            #expect(start <= 1_000_000)
            #expect(f.server.bodyBytesSent <= Self.size + 1_000_000)
        } else {
            #expect(retry.askedRange == "bytes=1000000-")
            #expect(f.server.bodyBytesSent == Self.size)  // nothing fetched twice
            #expect(result.bytesTransferred == Int64(Self.size))
        }
        #expect(f.watch.retries.count == 1)
        #expect(f.watch.retries.first?.attempt == 1)
        #expect(f.clock.sleeps.count == 1)
        #expect(f.watch.restarts.isEmpty)
    }

    @Test(arguments: [408, 429, 500, 502, 504])
    func temporaryStatusIsRetriedKeepingThePartial(_ status: Int) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 4, etag: Self.etag)
        f.serve(file, faults: .sequence([.dropAfter(700_000), .status(status, body: Array("error page".utf8))]))
        let result = try await f.download(f.request())

        try f.expectComplete(result, file.data)
        let requests = f.server.requests
        #expect(requests.count == 3)
        #expect(requests[1].askedRange == "bytes=700000-")
        #expect(requests[2].askedRange == "bytes=700000-")  // the partial was not thrown away
        // The drop made progress (first retry: 0.5–1 s); the error status did not (second retry: 1–2 s).
        let sleeps = f.clock.sleeps
        #expect(sleeps.count == 2)
        #expect(sleeps.first.map { $0 >= 0.5 && $0 <= 1 } == true)
        #expect(sleeps.last.map { $0 >= 1 && $0 <= 2 } == true)
        #expect(f.server.bodyBytesSent == 2 << 20)
    }

    @Test func serviceUnavailableHonoursRetryAfter() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 1 << 20, seed: 5, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .status(503, headers: [("Retry-After", "2")], body: Array("busy".utf8))))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.clock.sleeps == [2])
        #expect(f.watch.retries.map(\.delay) == [2])
        #expect(f.server.requests.count == 2)
    }

    @Test func retryAfterAsHTTPDate() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 1 << 20, seed: 5, etag: Self.etag)
        let when = ServedFile.httpDate(secondsSince1970: Int(FakeClock.fixedNow) + 30)
        f.serve(file, faults: .onRequest(0, .status(429, headers: [("Retry-After", when)])))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        let delay = try #require(f.clock.sleeps.first)
        #expect(delay == 30)
    }

    @Test func retriesExhaustedKeepsThePartial() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 6, etag: Self.etag)
        f.serve(file) { _, index in index == 0 ? .dropAfter(800_000) : .closeWithoutResponse }
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(error?.code == .retriesExhausted)
        #expect(error?.isResumable == true)

        // Five retries after the last progress, with growing (jittered) backoff.
        #expect(f.server.requests.count == 6)
        let sleeps = f.clock.sleeps
        #expect(sleeps.count == 5)
        for (index, delay) in sleeps.enumerated() {
            let full = Double(1 << index)
            #expect(delay >= full / 2 && delay <= full, "retry \(index + 1): \(delay)")
        }
        #expect(!fileExists(f.dest))
        #expect(fileSize(f.paths.part) == 800_000)
        #expect(try StateFile.read(f.paths.state)?.segments == [Segment(start: 0, end: 2 << 20, durable: 800_000)])

        // The server recovers: the next run continues from what was kept.
        f.serve(file)
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(result.resumedFrom == 800_000)
        #expect(f.server.requests.last?.askedRange == "bytes=800000-")
    }

    /// Retries that run out on an HTTP status report the status (`.httpStatus`, with the status number).
    @Test func persistentServerErrorGivesUp() async throws {
        let f = try Fixture()
        f.serve(ServedFile.random(size: 1000, seed: 6), faults: .always(.status(503, body: Array("down".utf8))))
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(error?.code == .httpStatus)
        #expect(error?.httpStatus == 503)
        #expect(f.server.requests.count == 6)
        #expect(f.clock.sleeps.count == 5)
        #expect(try f.leftovers().isEmpty)
    }

    @Test(arguments: [Stall.afterBody, .beforeHeaders])
    func stallIsRetried(_ stall: Stall) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 7, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, stall.fault))
        var options = DownloadOptions.testing
        options.transport.stallTimeout = 1  // libcurl's low-speed timer: about a second of real time
        let result = try await f.download(f.request(), options: options)

        try f.expectComplete(result, file.data)
        let requests = f.server.requests
        #expect(requests.count == 2)
        #expect(requests.last?.askedRange == (stall == .afterBody ? "bytes=900000-" : nil))
        #expect(f.watch.retries.count == 1)
    }

    @Test func wrongContentLengthIsRetriedAndCorrected() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 8, etag: Self.etag)
        // The first response claims 1000 bytes more than it sends: the engine waits for them, sees the connection
        // close, asks for the rest, and is told (416) that the file is shorter than it was told: start over.
        // (Ranges ignored for it, so URLSession's first window gets the same answer as a request for the whole file.)
        f.serve(file, faults: .onRequest(0, .all([.wrongContentLength((2 << 20) + 1000), .ignoreRange])))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts == [.rangeNotSatisfiable])
        #expect(f.server.requests.map(\.askedRange) == [nil, "bytes=\(2 << 20)-", nil])
    }

    // MARK: Cancel, then resume in a second run

    @Test func cancelledDownloadResumesInTheNextRun() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 9, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1_500_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 1_500_000)

        #expect(!fileExists(f.dest))
        #expect(fileSize(f.paths.part) == 1_500_000)
        #expect(  // saved on cancel
            try StateFile.read(f.paths.state)?.segments
                == [Segment(start: 0, end: Int64(Self.size), durable: 1_500_000)])
        let saved = try Downloader.savedDownload(at: f.dest)
        #expect(saved.url == f.url && saved.durableBytes == 1_500_000 && saved.totalBytes == Int64(Self.size))

        let sentBefore = f.server.bodyBytesSent
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        let resume = try #require(f.server.requests.last)
        #expect(f.server.requests.count == 2)
        #expect(resume.askedRange == "bytes=1500000-")
        #expect(resume.header("If-Range") == Self.etag)
        #expect(f.server.bodyBytesSent - sentBefore == Self.size - 1_500_000)
        #expect(result.resumedFrom == 1_500_000)
        #expect(result.bytesTransferred == Int64(Self.size - 1_500_000))
        #expect(f.watch.resumes.map(\.from) == [1_500_000])
        #expect(f.watch.resumes.first?.note == nil)
        #expect(f.watch.receiving.last?.status == 206)
        #expect(f.watch.receiving.last?.offset == 1_500_000)
    }

    @Test func lastModifiedOnlyServerResumesWithDate() async throws {
        let f = try Fixture()
        let modified = ServedFile.httpDate(secondsSince1970: Int(time(nil)) - 86_400)
        let file = ServedFile.random(size: Self.size, seed: 10, lastModified: modified)
        f.serve(file, faults: .onRequest(0, .stallAfter(1_000_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 1_000_000)

        let sentBefore = f.server.bodyBytesSent
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        let resume = try #require(f.server.requests.last)
        #expect(resume.askedRange == "bytes=1000000-")
        #expect(resume.header("If-Range") == modified)
        #expect(f.server.bodyBytesSent - sentBefore == Self.size - 1_000_000)
    }

    @Test func noValidatorRefetchesTheOverlapWindow() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 11)
        f.serve(file, faults: .onRequest(0, .stallAfter(2_000_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 2_000_000)

        let sentBefore = f.server.bodyBytesSent
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        let resume = try #require(f.server.requests.last)
        #expect(resume.askedRange == "bytes=\(2_000_000 - 65_536)-")
        #expect(resume.header("If-Range") == nil)
        #expect(f.server.bodyBytesSent - sentBefore == Self.size - 2_000_000 + 65_536)
        #expect(result.resumedFrom == 2_000_000)
        #expect(f.watch.restarts.isEmpty)
    }

    @Test func noValidatorAndChangedContentRestarts() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 12)
        f.serve(file, faults: .onRequest(0, .stallAfter(2_000_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 2_000_000)

        let changed = ServedFile.random(size: Self.size, seed: 13)  // same length, other bytes, no validator
        f.server.replaceFile("/file.bin", with: changed)
        let result = try await f.download(f.request())
        try f.expectComplete(result, changed.data)
        #expect(f.watch.restarts == [.overlapMismatch(offset: 2_000_000)])
        #expect(f.server.requests.map(\.askedRange) == [nil, "bytes=\(2_000_000 - 65_536)-", nil])
    }

    @Test(arguments: Change.allCases)
    func changedFileBetweenRunsRestarts(_ change: Change) async throws {
        let f = try Fixture()
        let modified = ServedFile.httpDate(secondsSince1970: Int(time(nil)) - 86_400)
        let file: ServedFile =
            change == .lastModified
            ? .random(size: Self.size, seed: 14, lastModified: modified)
            : .random(size: Self.size, seed: 14, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1_500_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 1_500_000)

        let changed: ServedFile
        let reason: RestartReason
        switch change {
        case .etag:
            changed = .random(size: Self.size, seed: 15, etag: "\"v2\"")
            reason = .etagChanged(old: Self.etag, new: "\"v2\"")
        case .lastModified:
            let newer = ServedFile.httpDate(secondsSince1970: Int(time(nil)) - 60)
            changed = .random(size: Self.size, seed: 15, lastModified: newer)
            reason = .lastModifiedChanged(old: modified, new: newer)
        case .length:
            // A server that keeps the ETag although the length changed: the length still gives it away.
            changed = .random(size: Self.size + 100_000, seed: 15, etag: Self.etag)
            reason = .lengthChanged(old: Int64(Self.size), new: Int64(Self.size + 100_000))
        }
        f.server.replaceFile("/file.bin", with: changed)
        let result = try await f.download(f.request())
        try f.expectComplete(result, changed.data)
        #expect(f.watch.restarts == [reason])
        #expect(f.server.requests[1].askedRange == "bytes=1500000-")
    }

    @Test func rangeIgnoredRestartsWithTheBody() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 16, etag: Self.etag)
        f.serve(file, faults: .sequence([.dropAfter(1_000_000), .ignoreRange]))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts == [.rangeIgnored])
        #expect(f.server.requests.count == 2)  // the 200 body itself is the new start
        #expect(f.server.bodyBytesSent == 1_000_000 + Self.size)
    }

    static let wrongRanges: [(ContentRangeLie, RestartReason)] = [
        (.shiftStart(by: 10), .contentRangeMismatch("bytes 1000010-\(size - 1)/\(size)")),
        (.shiftStart(by: -100), .contentRangeMismatch("bytes 999900-\(size - 1)/\(size)")),
        (.total(size + 1), .lengthChanged(old: Int64(size), new: Int64(size + 1))),
        (.total(size - 1), .contentRangeMismatch("bytes 1000000-\(size - 1)/\(size - 1)")),
        (.header("bytes 0-9/\(size)"), .contentRangeMismatch("bytes 0-9/\(size)")),
        (.header("bytes 1000000-\(size - 1)/*"), .contentRangeMismatch("bytes 1000000-\(size - 1)/*")),
    ]

    @Test(arguments: wrongRanges)
    func wrongContentRangeRestarts(_ lie: ContentRangeLie, _ reason: RestartReason) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 17, etag: Self.etag)
        f.serve(file, faults: .sequence([.dropAfter(1_000_000), .wrongContentRange(lie)]))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts == [reason])
        #expect(f.server.requests.map(\.askedRange) == [nil, "bytes=1000000-", nil])
    }

    @Test func serverWithoutRangesRestartsWithTheBody() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 40, etag: Self.etag, acceptRanges: false)
        f.serve(file, faults: .onRequest(0, .dropAfter(1_000_000)))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts == [.rangeIgnored])
        #expect(f.server.requests.count == 2)
    }

    @Test func noValidatorRetryWithinTheRunUsesTheOverlapWindow() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 41)
        f.serve(file, faults: .onRequest(0, .dropAfter(1_000_000)))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.server.requests.map(\.askedRange) == [nil, "bytes=\(1_000_000 - 65_536)-"])
        #expect(f.server.requests.last?.header("If-Range") == nil)
        #expect(f.server.bodyBytesSent == (2 << 20) + 65_536)
        #expect(f.watch.restarts.isEmpty)
    }

    @Test func fileChangingOnEveryRequestIsUnstable() async throws {
        let f = try Fixture()
        let server = f.server
        f.serve(ServedFile.random(size: 2 << 20, seed: 42, etag: "\"e0\"")) { _, index in
            // Each request sees the file the previous request left; the next one will see a newer one.
            server.replaceFile(
                "/file.bin", with: .random(size: 2 << 20, seed: 43 + UInt64(index), etag: "\"e\(index + 1)\""))
            return .dropAfter(500_000)
        }
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(error?.code == .unstableSource)
        #expect(f.watch.restarts.count == 3)  // DownloadOptions.maxRestarts
        #expect(f.server.requests.count == 5)
        #expect(!fileExists(f.dest))
    }

    @Test func checksumSurvivesRestarts() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 44, etag: Self.etag)
        f.serve(
            file,
            faults: .sequence([
                .dropAfter(1_000_000), .all([.ignoreRange, .dropAfter(2_000_000)]),
                .wrongContentRange(.shiftStart(by: 1)),
            ]))
        let checksum = try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: file.data))
        let result = try await f.download(f.request(checksum: checksum))
        try f.expectComplete(result, file.data)
        #expect(result.checksum == checksum)
        #expect(f.watch.restarts.count == 2)
    }

    /// After a restart the bytes written drop to zero; progress must not go on claiming the old durable bytes.
    @Test func progressNeverClaimsMoreThanWritten() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 45, etag: Self.etag)
        f.serve(
            file,
            faults: .sequence([
                .dropAfter(1_000_000),  // the retry checkpoints: 1 000 000 bytes durable
                .dropAfter(100),  // a write after that checkpoint, so progress knows of it
                .status(416, headers: [("Content-Range", "bytes */\(2 << 20)")]),  // restart from zero
                .stallBeforeHeaders(then: .resume),
            ]))
        let task = Task { try await f.download(f.request()) }
        let server = f.server
        #expect(await blocking { server.waitForStall() })
        // Let the progress ticker report at least once while the restarted download waits for its response.
        let watch = f.watch
        #expect(await blocking { waitUntil { watch.progressEventsAfterRestart > 0 } })
        server.releaseStalls()
        let result = try await task.value
        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts == [.rangeNotSatisfiable])
    }

    @Test func engineOwnsRangeAndEncodingHeaders() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 46, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .dropAfter(1_000_000)))
        var request = f.request()
        request.headers.add(name: "range", value: "bytes=0-99")
        request.headers.add(name: "Accept-Encoding", value: "gzip")
        request.headers.add(name: "If-Range", value: "\"other\"")
        request.headers.add(name: "X-Kept", value: "1")
        let result = try await f.download(request)
        try f.expectComplete(result, file.data)
        let requests = f.server.requests
        #expect(requests.map(\.askedRange) == [nil, "bytes=1000000-"])
        #expect(requests.allSatisfy { $0.headerValues("Range").count <= 1 && $0.headerValues("If-Range").count <= 1 })
        #expect(requests.last?.header("If-Range") == Self.etag)
        #expect(requests.allSatisfy { $0.headerValues("Accept-Encoding") == ["identity"] })
        #expect(requests.allSatisfy { $0.header("X-Kept") == "1" })
    }

    @Test func nothingToResume() throws {
        let directory = try TemporaryDirectory()
        let error = #expect(throws: DownloadError.self) {
            try Downloader.savedDownload(at: directory.path + "/nothing.bin")
        }
        #expect(error?.code == .nothingToResume)
    }

    // MARK: 416

    @Test func rangeNotSatisfiableWithFullPartCompletes() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 18, etag: Self.etag)
        f.serve(file)
        // What a run killed after the last byte but before the rename leaves behind.
        try writeFile(f.paths.part, file.data)
        try StateFile.write(f.state(durable: Int64(file.data.count), total: Int64(file.data.count)), to: f.paths.state)
        let checksum = try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: file.data))

        let result = try await f.download(f.request(checksum: checksum))
        try f.expectComplete(result, file.data)
        #expect(result.bytesTransferred == 0)
        #expect(result.resumedFrom == Int64(file.data.count))
        #expect(result.checksum == checksum)
        // Every byte is there, all from the version the validators name: finished without asking (as a split
        // download whose segments are all written is), the checksum checked over the file.
        #expect(f.server.requests.isEmpty, "\(f.server.requests.map(\.askedRange))")
        #expect(f.server.bodyBytesSent == 0)
    }

    /// A 416 to the resume of a partial that lacks bytes (the file shrank on the server) restarts from zero.
    @Test func rangeNotSatisfiableWithAShortPartRestarts() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 19, etag: Self.etag)
        let shrunk = ServedFile(data: Array(file.data[0..<(1 << 20)]), etag: Self.etag)
        f.serve(shrunk)
        try writeFile(f.paths.part, Array(file.data[0..<1_500_000]))
        try StateFile.write(f.state(durable: 1_500_000, total: Int64(file.data.count)), to: f.paths.state)

        let result = try await f.download(f.request())
        try f.expectComplete(result, shrunk.data)
        #expect(f.watch.restarts == [.rangeNotSatisfiable], "\(f.watch.restarts)")
        #expect(f.server.requests.first?.askedRange == "bytes=1500000-")
    }

    @Test func rangeNotSatisfiableOtherwiseRestarts() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 19, etag: Self.etag)
        f.serve(
            file,
            faults: .sequence([
                .dropAfter(1_000_000), .status(416, headers: [("Content-Range", "bytes */\(2 << 20)")]),
            ]))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts == [.rangeNotSatisfiable])
        #expect(f.server.requests.map(\.askedRange) == [nil, "bytes=1000000-", nil])
    }

    @Test func fileShrunkBelowTheOffsetRestarts() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 20, etag: Self.etag)
        let shrunk = ServedFile.random(size: 500_000, seed: 21, etag: Self.etag)  // same (wrong) ETag
        let server = f.server
        f.serve(file) { _, index in
            guard index == 0 else { return .none }
            server.replaceFile("/file.bin", with: shrunk)  // takes effect from the next request
            return .dropAfter(1_000_000)
        }
        let result = try await f.download(f.request())
        try f.expectComplete(result, shrunk.data)
        #expect(f.watch.restarts == [.rangeNotSatisfiable])
        #expect(f.server.requests.map(\.askedRange) == [nil, "bytes=1000000-", nil])
    }

    // MARK: Redirects

    @Test func redirectChainIsFollowedAndRetriesStartOver() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 22, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .dropAfter(1_000_000)))
        f.server.redirect(from: "/a", to: "/b", status: 301)
        f.server.redirect(from: "/b", to: f.server.url("/c"), status: 307)
        f.server.redirect(from: "/c", to: "/file.bin", status: 302)
        let result = try await f.download(f.request(url: f.server.url("/a")))

        try f.expectComplete(result, file.data)
        // A retry starts from the URL the user gave (redirect targets may expire), at the offset.
        #expect(f.server.requests.map(\.path) == ["/a", "/b", "/c", "/file.bin", "/a", "/b", "/c", "/file.bin"])
        #expect(f.server.requests.last?.askedRange == "bytes=1000000-")
        #expect(f.watch.redirects.count == 6)
        #expect(f.watch.redirects.last == f.url)
        #expect(f.server.bodyBytesSent == 2 << 20)
    }

    @Test(arguments: [10, 11])
    func redirectLimit(_ hops: Int) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 1000, seed: 23)
        f.serve(file)
        for hop in 0..<hops {
            f.server.redirect(from: "/r\(hop)", to: hop == hops - 1 ? "/file.bin" : "/r\(hop + 1)")
        }
        let request = f.request(url: f.server.url("/r0"))
        if hops <= 10 {
            let result = try await f.download(request)
            try f.expectComplete(result, file.data)
        } else {
            let error = await #expect(throws: DownloadError.self) { try await f.download(request) }
            #expect(error?.code == .redirects)
            #expect(error?.message.contains("too many") == true)
            #expect(try f.leftovers().isEmpty)
            #expect(f.server.requests(for: "/file.bin").isEmpty)
        }
    }

    @Test(arguments: [["/a", "/a"], ["/a", "/b", "/a"], ["/a", "/b", "/c", "/b"]])
    func redirectLoopIsAnError(_ chain: [String]) async throws {
        let f = try Fixture()
        for (from, to) in zip(chain, chain.dropFirst()) { f.server.redirect(from: from, to: to) }
        let error = await #expect(throws: DownloadError.self) {
            try await f.download(f.request(url: f.server.url(chain[0])))
        }
        #expect(error?.code == .redirects)
        #expect(error?.message.contains("loop") == true)
        #expect(f.server.requests.count == chain.count - 1)
        #expect(try f.leftovers().isEmpty)
        #expect(f.clock.sleeps.isEmpty)
    }

    @Test func redirectToAnotherSchemeIsAnError() async throws {
        let f = try Fixture()
        f.server.redirect(from: "/a", to: "ftp://127.0.0.1/file.bin")
        let error = await #expect(throws: DownloadError.self) {
            try await f.download(f.request(url: f.server.url("/a")))
        }
        #expect(error?.code == .redirects)
        #expect(try f.leftovers().isEmpty)
    }

    // MARK: Client errors fail at once

    @Test(arguments: [400, 401, 403, 404, 410])
    func clientErrorFailsAtOnce(_ status: Int) async throws {
        let f = try Fixture()
        f.serve(
            ServedFile.random(size: 1000, seed: 24),
            faults: .always(.status(status, body: Array("<html>error page</html>".utf8))))
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(error?.code == .httpStatus)
        #expect(error?.httpStatus == status)
        #expect(f.server.requests.count == 1)
        #expect(f.clock.sleeps.isEmpty)
        #expect(try f.leftovers().isEmpty)  // no DEST, and the error page was not saved anywhere
    }

    @Test func missingFileWithPartialKeepsThePartial() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 25, etag: Self.etag)
        f.serve(file, faults: .sequence([.dropAfter(1_000_000), .status(404)]))
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(error?.code == .httpStatus)
        #expect(error?.httpStatus == 404)
        #expect(error?.isResumable == true)
        #expect(!fileExists(f.dest))
        #expect(fileSize(f.paths.part) == 1_000_000)
        #expect(try StateFile.read(f.paths.state)?.segments == [Segment(start: 0, end: 2 << 20, durable: 1_000_000)])

        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.server.requests.last?.askedRange == "bytes=1000000-")
    }

    /// A refused connection gets three tries within seconds (0.5 s, then 1 s between them), not the long backoff
    /// of other failures; the error names the server and, with nothing saved, does not promise a resume.
    @Test func unreachableServerIsTriedThreeTimesThenGivesUp() async throws {
        let f = try Fixture()
        let closed = try ClosedPort()  // bound but not listening: every connect is refused
        var request = f.request()
        request.url = "http://127.0.0.1:\(closed.port)/file.bin"
        let error = await #expect(throws: DownloadError.self) { try await f.download(request) }
        #expect(error?.code == .network)
        #expect(f.clock.sleeps == [0.5, 1.0])
        #expect(error?.message.contains("cannot connect to 127.0.0.1:\(closed.port)") == true, "\(String(describing: error))")
        #expect(error?.message.contains("rerun") == false, "\(String(describing: error))")
        #expect(error?.isResumable == false)
        #expect(try f.leftovers().isEmpty)
    }

    /// A host that does not resolve is not tried again.
    @Test func unresolvableHostFailsAtOnce() async throws {
        let f = try Fixture()
        var request = f.request()
        request.url = "http://no-such-host.invalid/file.bin"
        let error = await #expect(throws: DownloadError.self) { try await f.download(request) }
        #expect(error?.code == .network)
        #expect(f.clock.sleeps.isEmpty)
        #expect(error?.message.contains("cannot resolve host no-such-host.invalid") == true, "\(String(describing: error))")
        #expect(error?.message.contains("rerun") == false)
        #expect(try f.leftovers().isEmpty)
    }

    @Test func tlsFailureFailsAtOnce() async throws {
        let f = try Fixture()
        let plain = try PlainTextPeer()  // answers a TLS ClientHello with an HTTP status line
        var request = f.request()
        request.url = "https://127.0.0.1:\(plain.port)/file.bin"
        let error = await #expect(throws: DownloadError.self) { try await f.download(request) }
        #expect(error?.code == .tls)
        #expect(f.clock.sleeps.isEmpty)
        #expect(try f.leftovers().isEmpty)
    }

    // MARK: Naming with .directory

    static let hostileNames = [
        "attachment; filename=\"../../escape.bin\"",
        "attachment; filename*=UTF-8''..%2F..%2Fescape.bin",
        "attachment; filename=\"/etc/passwd\"",
        "attachment; filename=\"..\"",
        "attachment; filename=\".\"",
        "attachment; filename=\".hidden\"",
        "attachment; filename=\"a/b\\\\c.bin\"",
        "attachment; filename=\"%2e%2e%2fx\"",
        "attachment; filename*=UTF-8''%00evil%0A.bin",
        "attachment; filename=\"" + String(repeating: "n", count: 300) + ".bin\"",
        "attachment; filename=\"\"",
    ]

    @Test(arguments: hostileNames)
    func hostileContentDispositionStaysInside(_ disposition: String) async throws {
        let f = try Fixture(directoryMode: true)
        let file = ServedFile.random(size: 1 << 20, seed: 26, etag: Self.etag, contentDisposition: disposition)
        f.serve(file)
        let result = try await f.download(f.request())

        let name = (result.destination as NSString).lastPathComponent
        #expect((result.destination as NSString).deletingLastPathComponent == f.downloads)
        #expect(!name.isEmpty && name != "." && name != ".." && !name.contains("/"))
        #expect(!name.hasPrefix("."))
        #expect(name.utf8.count + ".stitch-live".utf8.count <= 255)  // room for the sidecar files
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.directory.path) == ["downloads"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.downloads) == [name])
        try f.expectComplete(result, file.data, at: result.destination)
    }

    @Test(arguments: [
        (nil, "file.bin"),
        ("attachment; filename=\"plain.bin\"", "plain.bin"),
        ("attachment; filename=\"fallback.bin\"; filename*=UTF-8''%E2%82%AC%20rates.bin", "€ rates.bin"),
    ] as [(String?, String)])
    func directoryNaming(_ disposition: String?, _ expected: String) async throws {
        let f = try Fixture(directoryMode: true)
        let file = ServedFile.random(size: 1 << 20, seed: 27, etag: Self.etag, contentDisposition: disposition)
        f.serve(file)
        let result = try await f.download(f.request())
        #expect(result.destination == f.downloads + "/" + expected)
        try f.expectComplete(result, file.data, at: result.destination)
    }

    @Test func directoryModeRerunIsAlreadyComplete() async throws {
        let f = try Fixture(directoryMode: true)
        let file = ServedFile.random(
            size: 1 << 20, seed: 48, etag: Self.etag, contentDisposition: "attachment; filename=d.bin")
        f.serve(file)
        let first = try await f.download(f.request())
        try f.expectComplete(first, file.data, at: f.downloads + "/d.bin")
        f.watch.disarm()
        let again = try await f.download(f.request())
        #expect(again.alreadyComplete)
        #expect(again.destination == f.downloads + "/d.bin")
        #expect(try readFile(again.destination) == file.data)
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.downloads) == ["d.bin"])
    }

    @Test func directoryModeResumes() async throws {
        let f = try Fixture(directoryMode: true)
        let file = ServedFile.random(
            size: Self.size, seed: 28, etag: Self.etag, contentDisposition: "attachment; filename=\"named.bin\"")
        f.serve(file, faults: .onRequest(0, .stallAfter(1_500_000, then: .close)))
        let named = f.downloads + "/named.bin"
        try await f.interruptedDownload(f.request(), at: 1_500_000, part: named + ".part")

        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data, at: named)
        #expect(result.resumedFrom == 1_500_000)
        // The name is learnt from a first response; the resume itself is a proper range request.
        #expect(f.server.requests.last?.askedRange == "bytes=1500000-")
        #expect(f.server.requests.last?.header("If-Range") == Self.etag)
    }

    /// Into a folder, with the name from the URL: a rerun finds the finished file before asking the server
    /// anything (it used to fetch the file again only to learn its name, and then drop it).
    @Test func directoryModeRerunByTheURLsNameAsksNothing() async throws {
        let f = try Fixture(directoryMode: true)
        let file = ServedFile.random(size: 256 << 10, seed: 49, etag: Self.etag)
        f.serve(file)
        let first = try await f.download(f.request())
        try f.expectComplete(first, file.data, at: f.downloads + "/file.bin")
        f.watch.disarm()
        let before = f.server.requests.count
        let again = try await f.download(f.request())
        #expect(again.alreadyComplete && again.bytesTransferred == 0)
        #expect(again.destination == f.downloads + "/file.bin")
        #expect(f.server.requests.count == before, "the rerun asked the server: \(f.server.requests[before...].map(\.askedRange))")
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.downloads) == ["file.bin"])
    }

    /// Into a folder, a file another program left under the name the URL gives is not this download's: the
    /// response's name is used as if nothing were there, and that file is left alone.
    @Test func directoryModeLeavesAnotherProgramsFileAtTheURLsName() async throws {
        let f = try Fixture(directoryMode: true)
        let file = ServedFile.random(
            size: 256 << 10, seed: 51, etag: Self.etag, contentDisposition: "attachment; filename=named.bin")
        f.serve(file)
        try FileManager.default.createDirectory(atPath: f.downloads, withIntermediateDirectories: true)
        try writeFile(f.downloads + "/file.bin", Array("not stitch's".utf8))
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data, at: f.downloads + "/named.bin")
        #expect(try readFile(f.downloads + "/file.bin") == Array("not stitch's".utf8))
    }

    /// Into a folder, with the name from the URL: an interrupted download resumes with a range request as its first
    /// request (no request for the whole file to learn the name).
    @Test func directoryModeResumesByTheURLsNameWithARangeFirst() async throws {
        let f = try Fixture(directoryMode: true)
        let file = ServedFile.random(size: Self.size, seed: 50, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1_500_000, then: .close)))
        let named = f.downloads + "/file.bin"
        try await f.interruptedDownload(f.request(), at: 1_500_000, part: named + ".part")

        let before = f.server.requests.count
        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data, at: named)
        #expect(result.resumedFrom == 1_500_000)
        let rerun = f.server.requests[before...]
        #expect(rerun.first?.askedRange == "bytes=1500000-", "\(rerun.map(\.askedRange))")
        #expect(rerun.first?.header("If-Range") == Self.etag)
    }

    // MARK: Checksums

    @Test func checksumVerified() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 29, etag: Self.etag)
        f.serve(file)
        let hex = ExpectedChecksum.hexString(DigestHasher.digest(.sha256, of: file.data))
        let checksum = try ExpectedChecksum(parsing: "sha-256=" + hex)
        let result = try await f.download(f.request(checksum: checksum))
        try f.expectComplete(result, file.data)
        #expect(result.checksum == checksum)
    }

    @Test func checksumMismatchLeavesNothing() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 30, etag: Self.etag)
        f.serve(file)
        let wrong = try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: [1, 2, 3]))
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request(checksum: wrong)) }
        #expect(error?.code == .checksumMismatch)
        #expect(try f.leftovers().isEmpty)  // no DEST, no .part, no state
    }

    @Test(arguments: [false, true])
    func checksumAcrossResumeHashesThePrefix(_ corruptPrefix: Bool) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 31, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1_500_000, then: .close)))
        let checksum = try ExpectedChecksum(algorithm: .sha512, digest: DigestHasher.digest(.sha512, of: file.data))
        try await f.interruptedDownload(f.request(checksum: checksum), at: 1_500_000)
        if corruptPrefix {
            // Damage the trusted prefix: only hashing it on resume can notice.
            var part = try readFile(f.paths.part)
            part[12_345] ^= 0x01
            try writeFile(f.paths.part, part)
        }

        if corruptPrefix {
            let error = await #expect(throws: DownloadError.self) {
                try await f.download(f.request(checksum: checksum))
            }
            #expect(error?.code == .checksumMismatch)
            #expect(try f.leftovers().isEmpty)
        } else {
            let result = try await f.download(f.request(checksum: checksum))
            try f.expectComplete(result, file.data)
            #expect(result.checksum == checksum)
        }
        #expect(f.server.requests.last?.askedRange == "bytes=1500000-")
    }

    // MARK: What is already on disk

    /// Without a previous generation to fall back on (LocalFaultTests covers the fallback).
    @Test func corruptStateIsReportedAndThePartKept() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 32, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1_500_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 1_500_000)
        unlink(f.paths.previousState)
        try writeFile(f.paths.state, Array("{\"schemaVersion\": 2, \"url\": tru".utf8))
        let part = try readFile(f.paths.part)

        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains("\n") == false)
        #expect(try readFile(f.paths.part) == part)  // untouched, not deleted
        #expect(f.server.requests.count == 1)  // nothing asked of the server

        let result = try await f.download(f.request(overwrite: true))
        try f.expectComplete(result, file.data)
        #expect(result.resumedFrom == 0)
        #expect(f.server.requests.last?.askedRange == nil)
    }

    @Test func stateOfAnotherURLIsRefused() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 33, etag: Self.etag)
        let other = ServedFile.random(size: 1 << 20, seed: 34, etag: "\"o\"")
        f.serve(file, faults: .onRequest(0, .stallAfter(1_500_000, then: .close)))
        f.serve(other, at: "/other.bin")
        try await f.interruptedDownload(f.request(), at: 1_500_000)
        let part = try readFile(f.paths.part)

        let otherURL = f.server.url("/other.bin")
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request(url: otherURL)) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains(f.url) == true)
        #expect(try readFile(f.paths.part) == part)
        #expect(f.server.requests(for: "/other.bin").isEmpty)

        let result = try await f.download(f.request(url: otherURL, overwrite: true))
        try f.expectComplete(result, other.data)
        #expect(f.server.requests(for: "/other.bin").map(\.askedRange) == [nil])
    }

    @Test func existingDestinationIsNotClobbered() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 1 << 20, seed: 35, etag: Self.etag)
        f.serve(file)
        let mine = Array("my own file\n".utf8)
        try writeFile(f.dest, mine)
        f.watch.disarm()

        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(error?.code == .destinationExists)
        #expect(try readFile(f.dest) == mine)
        #expect(f.server.requests.isEmpty)

        let result = try await f.download(f.request(overwrite: true))
        try f.expectComplete(result, file.data)
    }

    /// A file put at DEST while a partial download waits beside it is not replaced by resuming.
    @Test func fileAppearingAtDestinationDuringAPartialIsNotClobbered() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 49, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1_500_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 1_500_000)
        let mine = Array("written by someone else\n".utf8)
        try writeFile(f.dest, mine)
        f.watch.disarm()

        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(error?.code == .destinationExists)
        #expect(try readFile(f.dest) == mine)
        #expect(fileSize(f.paths.part) == 1_500_000)  // the partial is kept too
        #expect(f.server.requests.count == 1)

        let result = try await f.download(f.request(overwrite: true))
        try f.expectComplete(result, file.data)
        #expect(result.resumedFrom == 1_500_000)  // overwrite replaces DEST, it need not discard the partial
    }

    /// A run killed after the final rename but before removing the state: the rerun cleans up and reports done.
    @Test func crashAfterRenameIsAlreadyComplete() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 1 << 20, seed: 50, etag: Self.etag)
        f.serve(file)
        let first = try await f.download(f.request())
        try f.expectComplete(first, file.data)
        try StateFile.write(f.state(durable: 1 << 20, total: 1 << 20), to: f.paths.state)
        _ = try LiveRecord(creatingAt: f.paths.live, nonce: 0x5eed, written: [1 << 20])
        f.watch.disarm()

        let again = try await f.download(f.request())
        #expect(again.alreadyComplete)
        #expect(!fileExists(f.paths.state) && !fileExists(f.paths.live) && !fileExists(f.paths.part))
        #expect(try readFile(f.dest) == file.data)
        #expect(f.server.requests.count == 1)
    }

    /// "Already complete" with a checksum asked for means the file on disk was hashed and matches.
    @Test func alreadyCompleteIsCheckedAgainstAChecksum() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 300_000, seed: 37, etag: Self.etag)
        f.serve(file)
        _ = try await f.download(f.request())
        f.watch.disarm()
        let right = try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: file.data))
        let again = try await f.download(f.request(checksum: right))
        #expect(again.alreadyComplete)
        #expect(again.checksum == right)

        let wrong = try ExpectedChecksum(algorithm: .sha256, digest: [UInt8](repeating: 7, count: 32))
        let error = await #expect(throws: DownloadError.self) { try await f.download(f.request(checksum: wrong)) }
        #expect(error?.code == .checksumMismatch)
        #expect(try readFile(f.dest) == file.data)  // the finished file is left as it is
        #expect(f.server.requests.count == 1)

        // With overwrite, a new version with its new checksum replaces it.
        let newer = ServedFile.random(size: 300_000, seed: 38, etag: "\"v2\"")
        f.serve(newer)
        let newSum = try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: newer.data))
        let replaced = try await f.download(f.request(checksum: newSum, overwrite: true))
        #expect(!replaced.alreadyComplete)
        #expect(try readFile(f.dest) == newer.data)
    }

    @Test func rerunAfterSuccessIsAlreadyComplete() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 1 << 20, seed: 36, etag: Self.etag)
        f.serve(file)
        f.serve(file, at: "/elsewhere.bin")
        let first = try await f.download(f.request())
        try f.expectComplete(first, file.data)
        f.watch.disarm()

        let again = try await f.download(f.request())
        #expect(again.alreadyComplete)
        #expect(again.bytesTransferred == 0)
        #expect(again.destination == f.dest)
        #expect(f.server.requests.count == 1)
        #expect(try readFile(f.dest) == file.data)

        // The same file name from another URL is not "already complete".
        let error = await #expect(throws: DownloadError.self) {
            try await f.download(f.request(url: f.server.url("/elsewhere.bin")))
        }
        #expect(error?.code == .destinationExists)
    }

    /// Two runs on one destination at once (two `stitch get`, or two calls in one process): the second is refused
    /// before it touches anything, with or without overwrite, and the first finishes intact.
    @Test(arguments: [false, true])
    func secondRunOnTheSameDestinationIsRefused(_ overwrite: Bool) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 51, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1_000_000, then: .resume)))
        let first = Task { try await f.download(f.request()) }
        let server = f.server
        #expect(await blocking { server.waitForStall() })
        // The server has sent its bytes; the first run holds the download once its state file exists.
        let paths = f.paths
        #expect(await eventually { fileExists(paths.state) })

        let error = await #expect(throws: DownloadError.self) {
            try await f.download(f.request(overwrite: overwrite))
        }
        #expect(error?.code == .io)
        #expect(error?.message.contains("another") == true)
        #expect(fileExists(f.paths.part) && fileExists(f.paths.state))
        #expect(f.server.requests.count == 1, "\(f.server.requests.map { $0.askedRange ?? "whole file" })")

        server.releaseStalls()
        let result = try await first.value
        try f.expectComplete(result, file.data)
        #expect(f.server.requests.count == 1)
    }

    // MARK: Crash recovery: durable extent vs live record

    /// After a reboot the page cache is gone: only the bytes synced before the last durable checkpoint count, even
    /// though the live record (kept here, as if the page cache had survived) claims more.
    @Test func afterRebootOnlyTheDurableExtentIsTrusted() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 37, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(3_000_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 3_000_000)

        // The last durable checkpoint was at 1 000 000; the boot that wrote it is over; what lies beyond it in
        // the part file is whatever the disk happened to keep.
        var state = try #require(try StateFile.read(f.paths.state))
        #expect(LiveRecord.read(at: f.paths.live, nonce: state.nonce) == PartStoreTests.slots([3_000_000]))
        try #require(state.segments.count == 1)
        state.bootID = "a-previous-boot"
        state.segments[0].durable = 1_000_000
        // That checkpoint could record only the checksums of pieces wholly below 1 000 000, and a proof of the rest.
        state.pieces = Array(state.pieces.prefix(Int(1_000_000 / state.pieceSize)))
        state.proofs = [Proof(start: 0, end: 1_000_000, crc: CRC32C.checksum(Array(file.data[0..<1_000_000])))]
        try StateFile.write(state, to: f.paths.state)
        var part = try readFile(f.paths.part)
        var scrambler = SplitMix64(seed: 99)
        for index in 1_000_000..<part.count { part[index] = UInt8(truncatingIfNeeded: scrambler.next()) }
        try writeFile(f.paths.part, part)

        let result = try await f.download(f.request())
        try f.expectComplete(result, file.data)
        #expect(f.server.requests.last?.askedRange == "bytes=1000000-")
        #expect(f.watch.resumes.map(\.from) == [1_000_000])
        #expect(f.watch.resumes.first?.note != nil)
    }

    /// A process crash (same boot) keeps the page cache: the live record lets the resume continue past the last
    /// durable checkpoint.
    @Test func sameBootResumesFromTheLiveRecord() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 38, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(2_500_000, then: .close)))
        var options = DownloadOptions.testing
        options.checkpointInterval = 3600
        options.checkpointBytes = 1 << 40
        let paths = f.paths
        try await f.interruptedDownload(f.request(), options: options, at: 2_500_000) {
            // The state file as a kill -9 at this instant would leave it.
            try readFile(paths.state)
        }
        let stateAtCrash = try #require(f.snapshot)
        try writeFile(f.paths.state, stateAtCrash)  // undo the checkpoint the clean cancel made
        let state = try #require(try StateFile.read(f.paths.state))
        try #require(state.segments.count == 1)
        #expect(state.segments[0].durable < 2_500_000)
        #expect(LiveRecord.read(at: f.paths.live, nonce: state.nonce) == PartStoreTests.slots([2_500_000]))

        let sentBefore = f.server.bodyBytesSent
        let result = try await f.download(f.request(), options: options)
        try f.expectComplete(result, file.data)
        #expect(f.server.requests.last?.askedRange == "bytes=2500000-")
        #expect(f.watch.resumes.map(\.from) == [2_500_000])
        #expect(f.watch.resumes.first?.note == nil)
        #expect(f.server.bodyBytesSent - sentBefore == Self.size - 2_500_000)
    }
}

// MARK: - Parameters

enum Cut: Sendable, CustomTestStringConvertible {
    case drop, shortBody, reset

    func fault(after bytes: Int) -> Fault {
        switch self {
        case .drop: .dropAfter(bytes)
        case .shortBody: .shortBody(bytes)
        case .reset: .resetAfter(bytes)
        }
    }

    var testDescription: String { "\(self)" }
}

enum Stall: Sendable, CustomTestStringConvertible {
    case afterBody, beforeHeaders

    var fault: Fault {
        switch self {
        case .afterBody: .stallAfter(900_000, then: .close)
        case .beforeHeaders: .stallBeforeHeaders(then: .close)
        }
    }

    var testDescription: String { "\(self)" }
}

enum Change: Sendable, CaseIterable, CustomTestStringConvertible {
    case etag, lastModified, length
    var testDescription: String { "\(self)" }
}

extension DownloadOptions {
    /// Defaults, with progress events often (so the "nothing at DEST" check sees many) and generous timeouts.
    static var testing: DownloadOptions {
        var options = DownloadOptions()
        options.transport.connectTimeout = 10
        options.transport.stallTimeout = 30
        options.progressInterval = 0.005
        return options
    }
}

// MARK: - Fixture

/// A server, a temporary directory, a fake clock and a watch on the destination, for one test.
final class Fixture: Sendable {
    let server: TestHTTPServer
    let directory: TemporaryDirectory
    let clock: FakeClock
    let watch: Watch
    let directoryMode: Bool
    private let snapshotBox = Locked<[UInt8]?>(nil)

    /// With `timeStands`, the download's clock never moves (see ``FakeClock/init(timeStands:)``).
    init(directoryMode: Bool = false, timeStands: Bool = false) throws {
        clock = FakeClock(timeStands: timeStands)
        server = try TestHTTPServer()
        directory = try TemporaryDirectory()
        self.directoryMode = directoryMode
        watch = Watch(destination: directoryMode ? nil : directory.path + "/file.bin")
        if directoryMode { mkdir(directory.path + "/downloads", 0o755) }
    }

    deinit { server.stop() }

    var dest: String { directory.path + "/file.bin" }
    var downloads: String { directory.path + "/downloads" }
    var paths: DownloadPaths { DownloadPaths(destination: dest) }
    var url: String { server.url("/file.bin") }
    var snapshot: [UInt8]? { snapshotBox.withLock { $0 } }

    func request(url: String? = nil, checksum: ExpectedChecksum? = nil, overwrite: Bool = false) -> DownloadRequest {
        DownloadRequest(
            url: url ?? self.url, destination: directoryMode ? .directory(downloads) : .file(dest),
            checksum: checksum, overwrite: overwrite)
    }

    /// Serves `file`, checking at every request that the destination does not exist yet.
    func serve(_ file: ServedFile, at path: String = "/file.bin", faults: FaultPolicy = .none) {
        serve(file, at: path) { request, index in faults.fault(for: request, index: index) }
    }

    func serve(
        _ file: ServedFile, at path: String = "/file.bin",
        faults: @escaping @Sendable (RecordedRequest, Int) -> Fault
    ) {
        let watch = self.watch
        server.serve(path, file: file) { request, index in
            watch.check("request \(index) to \(path)")
            if request.header("Accept-Encoding") != "identity" { watch.flag("request \(index) without identity") }
            return faults(request, index)
        }
    }

    func download(_ request: DownloadRequest, options: DownloadOptions = .testing) async throws -> DownloadResult {
        let watch = self.watch
        return try await Downloader(transport: TestBackend.selected.testTransport, clock: clock).download(request, options: options) {
            watch.record($0)
        }
    }

    /// Starts a download, waits until the server has stalled after `bytes` body bytes and the part file holds them
    /// all, optionally takes a snapshot, then cancels the task: an interruption after exactly `bytes`.
    func interruptedDownload(
        _ request: DownloadRequest, options: DownloadOptions = .testing, at bytes: Int64, part: String? = nil,
        snapshot: (@Sendable () throws -> [UInt8])? = nil, sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let task = Task { try await self.download(request, options: options) }
        let server = self.server
        let stalled = await blocking { server.waitForStall(timeout: .seconds(30)) }
        #expect(stalled, "the server never stalled", sourceLocation: sourceLocation)
        let part = part ?? paths.part
        let arrived = await blocking { waitUntil { fileSize(part) == bytes } }
        #expect(arrived, "the part file has \(fileSize(part) ?? -1) bytes", sourceLocation: sourceLocation)
        if let snapshot { try snapshotBox.withLock { $0 = try snapshot() } }
        task.cancel()
        let error = await #expect(throws: DownloadError.self, sourceLocation: sourceLocation) { try await task.value }
        #expect(error?.code == .cancelled, sourceLocation: sourceLocation)
        #expect(error?.isResumable == true, sourceLocation: sourceLocation)
        #expect(watch.violations.isEmpty, "\(watch.violations)", sourceLocation: sourceLocation)
        watch.resetEvents()
    }

    /// Checks a finished download: the file at `path` has exactly the source's SHA-256, no partial files remain,
    /// and nothing was at the destination before the end.
    func expectComplete(
        _ result: DownloadResult, _ source: [UInt8], at path: String? = nil,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let path = path ?? dest
        #expect(result.destination == path, sourceLocation: sourceLocation)
        let bytes = try readFile(path)
        #expect(bytes.count == source.count, sourceLocation: sourceLocation)
        #expect(
            DigestHasher.digest(.sha256, of: bytes) == DigestHasher.digest(.sha256, of: source),
            "the file differs from the source", sourceLocation: sourceLocation)
        #expect(result.bytes == Int64(source.count), sourceLocation: sourceLocation)
        let paths = DownloadPaths(destination: path)
        for leftover in [paths.part, paths.state, paths.live, paths.state + ".tmp"] {
            #expect(!fileExists(leftover), "\(leftover) left behind", sourceLocation: sourceLocation)
        }
        #expect(watch.violations.isEmpty, "\(watch.violations)", sourceLocation: sourceLocation)
    }

    /// Everything in the test directory (recursively) other than the downloads folder itself.
    func leftovers() throws -> [String] {
        let all = try FileManager.default.subpathsOfDirectory(atPath: directory.path)
        return all.filter { $0 != "downloads" }
    }
}

/// Records the sleeps the engine asks for and returns at once.
final class FakeClock: DownloadClock {
    private let recorded = Locked<[Double]>([])
    private let timeStands: Bool

    /// With `timeStands`, no time passes for the engine and the transport: ``uptime()`` stays put and timers never
    /// fire, so no stall timeout, checkpoint or progress tick ever comes; an attempt ends only on what the server
    /// does (for tests where that is the whole story: a loaded machine that delivers a head late, say 5 s late, can
    /// then not turn it into a stall). Else uptime and timers are the system's.
    init(timeStands: Bool = false) {
        self.timeStands = timeStands
    }

    func uptime() -> Double { timeStands ? 1_000 : monotonicNow() }

    func every(_ interval: Double, _ work: @escaping @Sendable () -> Void) -> any ClockTimer {
        timeStands ? NeverFires() : EngineClock.shared.every(interval, work)
    }

    private struct NeverFires: ClockTimer {
        func cancel() {}
    }

    var sleeps: [Double] { recorded.withLock { $0 } }

    func sleep(seconds: Double) async throws {
        recorded.withLock { $0.append(seconds) }
        try Task.checkCancellation()
        await Task.yield()
    }

    /// A fixed "now", so `Retry-After` dates give exact delays however slowly the test runs.
    static let fixedNow: Int64 = 1_800_000_000

    func now() -> Int64 { Self.fixedNow }
}

/// Collects the events of a download and anything that breaks rule 1: a file at the destination before the
/// download has completed, seen at an event or at a request.
final class Watch: Sendable {
    private struct State {
        var destination: String?
        var armed = true
        var events: [DownloadEvent] = []
        var violations: [String] = []
    }

    private let state: Locked<State>

    init(destination: String?) {
        state = Locked(State(destination: destination))
    }

    /// Stops checking the destination (for tests that put a file there on purpose).
    func disarm() { state.withLock { $0.armed = false } }

    func resetEvents() { state.withLock { $0.events = [] } }

    func flag(_ problem: String) { state.withLock { $0.violations.append(problem) } }

    func check(_ context: String) {
        state.withLock { state in
            guard state.armed, let destination = state.destination, fileExists(destination) else { return }
            state.violations.append("\(destination) exists at \(context)")
        }
    }

    func record(_ event: DownloadEvent) {
        state.withLock { state in
            if case .destinationResolved(let path) = event, state.destination == nil { state.destination = path }
            if case .progress(let progress) = event {
                if progress.durableBytes > progress.bytes {
                    state.violations.append("durable \(progress.durableBytes) > written \(progress.bytes)")
                }
                if let total = progress.total, progress.bytes > total {
                    state.violations.append("written \(progress.bytes) > total \(total)")
                }
            }
            state.events.append(event)
        }
        check("event \(event)")
    }

    var violations: [String] { state.withLock { $0.violations } }

    /// `.progress` events seen after the first `.restarting` event.
    var progressEventsAfterRestart: Int {
        let events = self.events
        guard let restart = events.firstIndex(where: { if case .restarting = $0 { true } else { false } }) else {
            return 0
        }
        return events[restart...].filter { if case .progress = $0 { true } else { false } }.count
    }
    var events: [DownloadEvent] { state.withLock { $0.events } }

    var resolved: [String] {
        events.compactMap { if case .destinationResolved(let path) = $0 { path } else { nil } }
    }
    var restarts: [RestartReason] {
        events.compactMap { if case .restarting(let reason) = $0 { reason } else { nil } }
    }
    var retries: [(attempt: Int, delay: Double)] {
        events.compactMap { if case .retrying(let attempt, _, let delay, _) = $0 { (attempt, delay) } else { nil } }
    }
    var resumes: [(from: Int64, note: String?)] {
        events.compactMap { if case .resuming(let from, let note) = $0 { (from, note) } else { nil } }
    }
    var receiving: [(status: Int, offset: Int64, total: Int64?)] {
        events.compactMap {
            if case .receiving(let status, let offset, let total) = $0 { (status, offset, total) } else { nil }
        }
    }
    var redirects: [String] {
        events.compactMap { if case .redirected(let url) = $0 { url } else { nil } }
    }
}

/// Runs a blocking wait on its own thread, so that the test's task does not hold a cooperative thread.
func blocking<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        let thread = Thread { continuation.resume(returning: body()) }
        thread.start()
    }
}

/// Polls `condition` until it holds (true) or `timeout` seconds pass (false).
func waitUntil(timeout: Double = 30, _ condition: () -> Bool) -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now + .seconds(timeout)
    while !condition() {
        if clock.now > deadline { return false }
        usleep(1000)
    }
    return true
}

extension Fixture {
    /// A state file such as a run of this fixture's URL would have written.
    func state(durable: Int64, total: Int64?) -> DownloadState {
        DownloadState(
            url: url, headers: [], checksum: nil,
            validators: Validators(
                etag: DownloaderTests.etag, lastModified: nil, date: nil, totalLength: total, acceptRanges: true),
            segments: [Segment(start: 0, end: total, durable: durable)], bootID: BootID.current, liveNonce: "5eed",
            updatedAt: 1_700_000_000)
    }
}

/// A loopback port with a socket bound to it but not listening, so connections to it are refused.
final class ClosedPort: Sendable {
    let fd: Int32
    let port: Int

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Errno(rawValue: errno) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
                bind(fd, generic, length) == 0 && getsockname(fd, generic, &length) == 0
            }
        }
        guard bound else {
            close(fd)
            throw Errno(rawValue: errno)
        }
        self.fd = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(fd) }
}

/// A loopback listener that answers every connection at once with a plain-text HTTP status line and closes it: to
/// a TLS client that is a handshake failure, not a timeout.
final class PlainTextPeer: Sendable {
    let port: Int
    private let listener: ClosedPort
    private let done = DispatchSemaphore(value: 0)

    init() throws {
        listener = try ClosedPort()
        port = listener.port
        guard listen(listener.fd, 16) == 0 else { throw Errno(rawValue: errno) }
        let fd = listener.fd
        let done = self.done
        Thread {
            while true {
                let client = accept(fd, nil, nil)
                if client < 0 {
                    if errno == EINTR { continue }
                    break
                }
                let reply = Array("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".utf8)
                _ = reply.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                close(client)
            }
            done.signal()
        }.start()
    }

    deinit {
        shutdown(listener.fd, Int32(SHUT_RDWR))  // wakes accept()
        done.wait()
    }
}

/// What a test that waited in vain for `server` prints: the engine's trace of its downloads (with `STITCH_TRACE`
/// set, as scripts/test.sh does) and every thread's stack.
func printDiagnostics(_ server: TestHTTPServer) async {
    print("Trace of \(server.baseURL):\n" + Trace.lines(containing: server.baseURL).joined(separator: "\n"))
    print("Threads:\n" + (await blocking { threadDump() }))
}

/// Every thread's stack in this process, from gdb (empty when gdb is missing): what a test that waited in vain
/// prints, so that a starved pool shows what holds its threads.
func threadDump() -> String { ThreadDump.capture() }
