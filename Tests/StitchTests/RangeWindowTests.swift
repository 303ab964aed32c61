import Dispatch
import Foundation
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport
@testable import StitchURLSession
import StitchLocks

/// The URLSession backend's windows (``RangeWindow``): no response brings more than a window, the engine sees the
/// response it asked for, and bytes of two versions of a file are never joined. First the rules over headers, then
/// the transport against the fault-injecting server, then downloads through the engine.
@Suite struct RangeWindowTests {
    static let window = 256 << 10
    static let etag = "\"w1\""

    /// Whether two byte arrays are equal, without printing them when they are not (they run to megabytes).
    static func same(_ a: [UInt8], _ b: [UInt8]) -> Bool { a == b }

    static func headers(_ pairs: [(String, String)]) -> HTTPHeaders { HTTPHeaders(pairs) }

    static func head(_ status: Int, _ pairs: [(String, String)]) -> ResponseHead {
        ResponseHead(status: status, headers: HTTPHeaders(pairs))
    }

    // MARK: Which requests are windowed

    @Test func whichRequestsAreWindowed() throws {
        let whole = try #require(RangeWindow(requestHeaders: Self.headers([("Accept-Encoding", "identity")]), size: 100))
        #expect(whole.wholeFile && whole.rangeValue == "bytes=0-99")
        let open = try #require(
            RangeWindow(requestHeaders: Self.headers([("Range", "bytes=1000-"), ("If-Range", Self.etag)]), size: 100))
        #expect(!open.wholeFile && open.rangeValue == "bytes=1000-1099" && open.ifRange == Self.etag)
        let bounded = try #require(
            RangeWindow(requestHeaders: Self.headers([("Range", "bytes=10-500"), ("If-Range", Self.etag)]), size: 100))
        #expect(bounded.rangeValue == "bytes=10-109")
        // Sent as the engine made them: a range that fits, a range without a validator (the engine's overlap check
        // needs the bytes it asked for), several ranges, forms the engine does not send, a bare If-Range.
        let asIs: [[(String, String)]] = [
            [("Range", "bytes=10-109"), ("If-Range", Self.etag)],
            [("Range", "bytes=1000-")],
            [("Range", "bytes=0-10,20-30"), ("If-Range", Self.etag)],
            [("Range", "bytes=-500"), ("If-Range", Self.etag)],
            [("Range", "bytes=9-3"), ("If-Range", Self.etag)],
            [("Range", "bytes=0-"), ("Range", "bytes=5-"), ("If-Range", Self.etag)],
            [("If-Range", Self.etag)],
        ]
        for headers in asIs { #expect(RangeWindow(requestHeaders: Self.headers(headers), size: 100) == nil, "\(headers)") }
        #expect(RangeWindow(requestHeaders: HTTPHeaders(), size: 0) == nil)
    }

    // MARK: What the first answer stands for

    @Test func aWholeFileWindowIsShownAsTheWholeFile() throws {
        let window = try #require(RangeWindow(requestHeaders: HTTPHeaders(), size: 100))
        let answer = Self.head(206, [
            ("Content-Range", "bytes 0-99/1000"), ("Content-Length", "100"), ("ETag", Self.etag),
            ("Content-Type", "application/octet-stream"),
        ])
        guard case .rewrite(let shown, let bodyLength, let rest) = window.adapt(answer) else {
            Issue.record("\(window.adapt(answer))")
            return
        }
        #expect(shown.status == 200)
        #expect(shown.headers["Content-Length"] == "1000")
        #expect(shown.headers["Content-Range"] == nil)
        #expect(shown.headers["Accept-Ranges"] == "bytes")
        #expect(shown.headers["ETag"] == Self.etag && shown.headers["Content-Type"] == "application/octet-stream")
        #expect(bodyLength == 100)
        let next = try #require(rest)
        #expect(next.validator == Self.etag && next.next == 100 && next.last == 999 && next.completeLength == 1000)
        #expect(next.nextWindow == (100, 199) as (Int64, Int64))
        // A chunked window: the chunks are undone, so the head shown has a length and no transfer coding.
        guard case .rewrite(let chunked, 100, _) = window.adapt(Self.head(206, [
            ("Content-Range", "bytes 0-99/1000"), ("Transfer-Encoding", "chunked"), ("ETag", Self.etag),
        ])) else {
            Issue.record("a chunked window was not shown")
            return
        }
        #expect(chunked.headers["Transfer-Encoding"] == nil && chunked.headers["Content-Length"] == "1000")
    }

    @Test func aWholeFileInOneWindowNeedsNoValidator() throws {
        let window = try #require(RangeWindow(requestHeaders: HTTPHeaders(), size: 100))
        guard case .rewrite(let shown, let bodyLength, let rest) = window.adapt(
            Self.head(206, [("Content-Range", "bytes 0-41/42"), ("Content-Length", "42")]))
        else {
            Issue.record("a file within the window was not shown whole")
            return
        }
        #expect(shown.status == 200 && shown.headers["Content-Length"] == "42" && bodyLength == 42 && rest == nil)
    }

    /// What the first window's answer cannot stand for: asked again as the engine asked (no validator to join the
    /// windows with, an empty file's 416, an answer that is not the window), or shown as it came.
    @Test func answersThatAreNotTheWindow() throws {
        let whole = try #require(RangeWindow(requestHeaders: HTTPHeaders(), size: 100))
        let again: [ResponseHead] = [
            Self.head(206, [("Content-Range", "bytes 0-99/1000"), ("ETag", "W/\"weak\"")]),
            Self.head(206, [("Content-Range", "bytes 0-99/1000")]),
            Self.head(416, [("Content-Range", "bytes */0")]),
            Self.head(206, [("Content-Range", "bytes 0-49/1000"), ("ETag", Self.etag)]),
            Self.head(206, [("Content-Range", "bytes 1-100/1000"), ("ETag", Self.etag)]),
            Self.head(206, [("Content-Range", "bytes 0-99/*"), ("ETag", Self.etag)]),
            Self.head(206, [("Content-Range", "bytes 0-99/1000"), ("Content-Length", "1000"), ("ETag", Self.etag)]),
            Self.head(206, [
                ("Content-Range", "bytes 0-99/1000"), ("Content-Range", "bytes 0-99/2000"), ("ETag", Self.etag),
            ]),
            Self.head(206, [("Content-Range", "bytes 0-99/1000"), ("Transfer-Encoding", "gzip"), ("ETag", Self.etag)]),
        ]
        for head in again { #expect(whole.adapt(head) == .sendAsAsked, "\(head)") }
        for status in [200, 302, 404, 503] {
            #expect(whole.adapt(Self.head(status, [("Content-Length", "5")])) == .pass)
        }
        let ranged = try #require(
            RangeWindow(requestHeaders: Self.headers([("Range", "bytes=500-"), ("If-Range", Self.etag)]), size: 100))
        // The engine judges these against what it asked (a 200: the file changed; a 206 elsewhere: a mismatch).
        for head in [
            Self.head(200, [("Content-Length", "1000")]),
            Self.head(206, [("Content-Range", "bytes 400-499/1000")]),
            Self.head(416, [("Content-Range", "bytes */300")]),
        ] {
            #expect(ranged.adapt(head) == .pass, "\(head)")
        }
    }

    @Test func aRangeWindowIsShownAsTheEnginesRange() throws {
        let window = try #require(
            RangeWindow(requestHeaders: Self.headers([("Range", "bytes=500-"), ("If-Range", Self.etag)]), size: 100))
        guard case .rewrite(let shown, let bodyLength, let rest) = window.adapt(
            Self.head(206, [("Content-Range", "bytes 500-599/1000"), ("Content-Length", "100"), ("ETag", Self.etag)]))
        else {
            Issue.record("not rewritten")
            return
        }
        #expect(shown.status == 206 && shown.headers["Content-Range"] == "bytes 500-999/1000")
        #expect(shown.headers["Content-Length"] == "500" && bodyLength == 100)
        #expect(rest?.validator == Self.etag && rest?.last == 999)
        // A lane's bounded range past a file that turned out shorter: shown as libcurl would show it.
        let lane = try #require(
            RangeWindow(requestHeaders: Self.headers([("Range", "bytes=0-4999"), ("If-Range", Self.etag)]), size: 100))
        guard case .rewrite(let laneHead, _, let laneRest) = lane.adapt(
            Self.head(206, [("Content-Range", "bytes 0-99/300"), ("ETag", Self.etag)]))
        else {
            Issue.record("not rewritten")
            return
        }
        #expect(laneHead.headers["Content-Range"] == "bytes 0-299/300" && laneRest?.last == 299)
    }

    // MARK: Later windows

    @Test func laterWindowsMustBeTheNextBytesOfTheSameVersion() {
        let rest = RangeWindow.Rest(
            next: 100, last: 999, size: 100, validator: Self.etag, completeLength: 1000, etag: Self.etag,
            lastModified: "Mon, 02 Nov 2026 10:00:00 GMT")
        let window: (first: Int64, last: Int64) = (100, 199)
        #expect(rest.problem(
            with: Self.head(206, [("Content-Range", "bytes 100-199/1000"), ("Content-Length", "100"), ("ETag", Self.etag)]),
            window: window) == nil)
        // A 206 may leave the validators out.
        #expect(rest.problem(with: Self.head(206, [("Content-Range", "bytes 100-199/1000")]), window: window) == nil)
        let refused: [(ResponseHead, String)] = [
            (Self.head(200, [("Content-Length", "1000")]), "whole file"),
            (Self.head(503, []), "HTTP 503"),
            (Self.head(206, [("Content-Range", "bytes 100-199/1001")]), "length 1000 → 1001"),
            (Self.head(206, [("Content-Range", "bytes 101-200/1000")]), "does not match"),
            (Self.head(206, [("Content-Range", "bytes 100-150/1000")]), "does not match"),
            (Self.head(206, []), "none"),
            (Self.head(206, [("Content-Range", "bytes 100-199/1000"), ("ETag", "\"w2\"")]), "ETag"),
            (Self.head(206, [("Content-Range", "bytes 100-199/1000"), ("Last-Modified", "Tue, 03 Nov 2026 10:00:00 GMT")]),
                "Last-Modified"),
            (Self.head(206, [("Content-Range", "bytes 100-199/1000"), ("Content-Length", "99")]), "Content-Length"),
            (Self.head(206, [("Content-Range", "bytes 100-199/1000"), ("Content-Encoding", "gzip")]), "gzip"),
        ]
        for (head, why) in refused {
            let problem = rest.problem(with: head, window: window)
            #expect(problem?.contains(why) == true, "\(head): \(problem ?? "accepted")")
        }
    }

    // MARK: The transport against the server

    /// A sink that takes everything; it cannot ask for its rest, so the windows must be joined by the transport.
    final class Collect: BodySink, @unchecked Sendable {
        private let bytes = Locked<[UInt8]>([])
        let limit: Int
        let offers = Atomic<Int>(0)
        /// Takes everything, or (with `limit`) chunks up to `limit` bytes in all and then waits for good.
        init(takingAtMost limit: Int = .max) { self.limit = limit }
        var taken: [UInt8] { bytes.withLock { $0 } }
        func receive(_ chunk: UnsafeRawBufferPointer) -> ReceiveDecision {
            offers.add(1, ordering: .relaxed)
            return bytes.withLock {
                guard $0.count + chunk.count <= limit else { return .wait(.seconds(600)) }
                $0.append(contentsOf: chunk)
                return .accepted
            }
        }
    }

    static func transport(onWindowEnd: (@Sendable (Int) -> Void)? = nil) -> URLSessionTransport {
        URLSessionTransport(window: window, yieldLimit: 64 << 10, holdLimit: 8 << 20, onWindowEnd: onWindowEnd)
    }

    static func ranges(_ server: TestHTTPServer) -> [String] {
        server.requests(for: "/file").map { $0.range ?? "none" }
    }

    static func windows(of size: Int, from start: Int = 0) -> [String] {
        stride(from: start, to: size, by: window).map { "bytes=\($0)-\(min($0 + window, size) - 1)" }
    }

    @Test func aWholeFileComesWindowByWindowUnderItsValidator() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3 * Self.window + 12_345, seed: 0xA1, etag: Self.etag)
        server.serve("/file", file: file)
        let request = TransportRequest(
            url: server.url("/file"), headers: HTTPHeaders([("Accept-Encoding", "identity")]),
            options: TransportOptions())
        guard case .success(let response) = await Self.transport().start(request) else {
            Issue.record("no head")
            return
        }
        #expect(response.head.status == 200)
        #expect(response.head.headers["Content-Length"] == "\(file.data.count)")
        #expect(response.head.headers["Content-Range"] == nil)
        let sink = Collect()
        let outcome = await response.receive(into: sink)
        #expect((try? outcome.get()) != nil, "\(outcome)")
        #expect(Self.same(sink.taken, file.data))
        let requests = server.requests(for: "/file")
        #expect(Self.ranges(server) == Self.windows(of: file.data.count))
        #expect(requests.first?.header("If-Range") == nil)
        #expect(requests.dropFirst().allSatisfy { $0.header("If-Range") == Self.etag })
        #expect(server.responses(for: "/file").allSatisfy { $0.bodyBytesSent <= Self.window })
        // Later windows reuse the first one's connection.
        #expect(server.connectionCount == 1, "\(server.connectionCount) connections")
    }

    @Test func aRangeRequestComesWindowByWindow() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 2 * Self.window + 999, seed: 0xA2, etag: Self.etag)
        server.serve("/file", file: file)
        let start = 100_000
        let request = TransportRequest(
            url: server.url("/file"), headers: HTTPHeaders([("Range", "bytes=\(start)-"), ("If-Range", Self.etag)]),
            options: TransportOptions())
        guard case .success(let response) = await Self.transport().start(request) else {
            Issue.record("no head")
            return
        }
        #expect(response.head.status == 206)
        #expect(response.head.headers["Content-Range"] == "bytes \(start)-\(file.data.count - 1)/\(file.data.count)")
        let sink = Collect()
        let outcome = await response.receive(into: sink)
        #expect((try? outcome.get()) != nil, "\(outcome)")
        #expect(Self.same(sink.taken, Array(file.data[start...])))
        #expect(Self.ranges(server) == Self.windows(of: file.data.count, from: start))
        #expect(server.requests(for: "/file").allSatisfy { $0.header("If-Range") == Self.etag })
    }

    /// Without a strong validator the windows could not be joined safely: the file is asked for as the engine
    /// asked, unless it fits in the first window.
    @Test(arguments: [3 * window, 1000])
    func withoutAValidatorTheFileIsAskedForAsTheEngineAsked(size: Int) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: size, seed: 0xA3)
        server.serve("/file", file: file)
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await Self.transport().start(request) else {
            Issue.record("no head")
            return
        }
        #expect(response.head.status == 200 && response.head.headers["Content-Length"] == "\(size)")
        let sink = Collect()
        let outcome = await response.receive(into: sink)
        #expect((try? outcome.get()) != nil, "\(outcome)")
        #expect(Self.same(sink.taken, file.data))
        let first = "bytes=0-\(Self.window - 1)"
        #expect(Self.ranges(server) == (size > Self.window ? [first, "none"] : [first]))
    }

    @Test func anEmptyFile() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/file", file: ServedFile(data: [], etag: Self.etag))
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await Self.transport().start(request) else {
            Issue.record("no head")
            return
        }
        #expect(response.head.status == 200 && response.head.headers["Content-Length"] == "0")
        let sink = Collect()
        #expect((try? await response.receive(into: sink).get()) != nil)
        #expect(sink.taken.isEmpty)
        let ranges = Self.ranges(server)
        #expect(ranges.first == "bytes=0-\(Self.window - 1)")
        #expect(ranges.count <= 2 && ranges.dropFirst().allSatisfy { $0 == "none" }, "\(ranges)")
    }

    /// The memory bound on byte counts: a sink that takes 64 KiB and then nothing, against a server far faster.
    /// The first window arrives whole and is held; with more than half a window held the next is not asked for,
    /// so the server never sends more than one window.
    @Test func aStuckSinkHoldsOneWindowAndAsksForNoMore() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 8 * Self.window, seed: 0xA4, etag: Self.etag)
        server.serve("/file", file: file)
        let ended = DispatchSemaphore(value: 0)
        let held = Atomic<Int>(-1)
        let transport = Self.transport(onWindowEnd: {
            held.store($0, ordering: .relaxed)
            ended.signal()
        })
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await transport.start(request) else {
            Issue.record("no head")
            return
        }
        let sink = Collect(takingAtMost: 64 << 10)
        let receiving = Task { await response.receive(into: sink) }
        #expect(await blocking { ended.wait(timeout: .now() + 60) == .success }, "the first window never ended")
        receiving.cancel()
        let outcome = await receiving.value
        #expect(outcome.failure?.isCancelled == true, "\(outcome)")
        #expect(held.load(ordering: .relaxed) > Self.window / 2, "\(held.load(ordering: .relaxed)) bytes held")
        #expect(Self.same(sink.taken, Array(file.data.prefix(sink.taken.count))) && sink.taken.count <= 64 << 10)
        #expect(server.requests(for: "/file").count == 1)
        #expect(server.bodyBytesSent(for: "/file") == Self.window)
    }

    /// A sink that wants fewer bytes than its response promises (a segment whose end another lane took over).
    final class Wanting: BodySink, @unchecked Sendable {
        let limit: Int
        private let bytes = Locked<[UInt8]>([])
        init(_ limit: Int) { self.limit = limit }
        var taken: [UInt8] { bytes.withLock { $0 } }
        func receive(_ chunk: UnsafeRawBufferPointer) -> ReceiveDecision {
            bytes.withLock {
                let room = limit - $0.count
                $0.append(contentsOf: chunk.prefix(max(0, room)))
                return chunk.count <= room ? .accepted : .abort
            }
        }
        var bytesWanted: Int64? { Int64(limit - taken.count) }
    }

    /// The next window asks for no more than the sink still wants and one byte, which shows the sink where its
    /// bytes end: the sink stops there, and the server sent nothing beyond that byte.
    @Test func aLaterWindowAsksNoMoreThanTheSinkWants() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 4 * Self.window, seed: 0xA8, etag: Self.etag)
        server.serve("/file", file: file)
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await Self.transport().start(request) else {
            Issue.record("no head")
            return
        }
        let wanted = Self.window + 37_856
        let sink = Wanting(wanted)
        let outcome = await response.receive(into: sink)
        #expect(outcome.failure?.isAbortedBySink == true, "\(outcome)")
        #expect(Self.same(sink.taken, Array(file.data.prefix(wanted))))
        #expect(Self.ranges(server) == ["bytes=0-\(Self.window - 1)", "bytes=\(Self.window)-\(wanted)"])
        #expect(server.bodyBytesSent(for: "/file") == wanted + 1)
    }

    /// The file changes between two windows: the server answers the next window's `If-Range` with the new file
    /// whole. The transport takes none of it and ends the body after the first window's bytes (all of the old
    /// version), saying why.
    @Test func aFileChangedBetweenWindowsEndsTheBodyWithItsOldBytesOnly() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let old = ServedFile.random(size: 4 * Self.window, seed: 0xA5, etag: Self.etag)
        let new = ServedFile.random(size: 4 * Self.window, seed: 0xA6, etag: "\"w2\"")
        server.serve("/file", file: old) { _, index in index >= 1 ? .servedAs(new) : .none }
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await Self.transport().start(request) else {
            Issue.record("no head")
            return
        }
        let sink = Collect()
        let outcome = await response.receive(into: sink)
        let error = try #require(outcome.failure)
        #expect(error.code == .partialBody && error.isRetryable, "\(error)")
        #expect(error.message.contains("whole file"), "\(error.message)")
        #expect(Self.same(sink.taken, Array(old.data.prefix(Self.window))))
    }

    @Test func aLaterWindowWithAnotherContentRangeEndsTheBody() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 4 * Self.window, seed: 0xA7, etag: Self.etag)
        server.serve("/file", file: file, faults: .onRequest(1, .wrongContentRange(.shiftStart(by: 1))))
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await Self.transport().start(request) else {
            Issue.record("no head")
            return
        }
        let sink = Collect()
        let error = try #require(await response.receive(into: sink).failure)
        #expect(error.code == .partialBody && error.message.contains("does not match"), "\(error)")
        #expect(Self.same(sink.taken, Array(file.data.prefix(Self.window))))
    }

    // MARK: Through the engine

    static func downloader(_ f: Fixture) -> Downloader {
        Downloader(transport: transport(), clock: f.clock)
    }

    @Test func aDownloadComesWindowByWindowAndIsByteExact() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 5 * Self.window + 7, seed: 0xB1, etag: Self.etag)
        f.serve(file)
        var options = DownloadOptions.testing
        options.connections = 1
        let result = try await Self.downloader(f).download(f.request(), options: options) { f.watch.record($0) }
        try f.expectComplete(result, file.data)
        #expect(f.server.requests.map { $0.range ?? "none" } == Self.windows(of: file.data.count))
        #expect(f.watch.retries.isEmpty, "\(f.watch.retries)")
    }

    /// A rate limit far below the server's speed: the sink waits, the held bytes stay within a window and a half,
    /// and the windows still join into the exact file, each asked once, in order.
    @Test func aRateLimitedDownloadAsksEachWindowOnce() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 6 * Self.window, seed: 0xB2, etag: Self.etag)
        f.serve(file)
        var options = DownloadOptions.testing
        options.connections = 1
        options.rateLimiter = RateLimiter(bytesPerSecond: 2 << 20, burst: 64 << 10)
        let result = try await Self.downloader(f).download(f.request(), options: options) { f.watch.record($0) }
        try f.expectComplete(result, file.data)
        #expect(f.server.requests.map { $0.range ?? "none" } == Self.windows(of: file.data.count))
        #expect(f.watch.retries.isEmpty, "\(f.watch.retries)")
    }

    /// The file changes on the server between two windows: the engine hears the body end early, asks for the rest
    /// under its validator, learns of the change and starts over, saying so — the file is the new version, whole.
    @Test func aFileChangedMidDownloadRestartsPlainlyAndEndsAsTheNewFile() async throws {
        let f = try Fixture()
        let old = ServedFile.random(size: 4 * Self.window, seed: 0xB3, etag: Self.etag)
        let new = ServedFile.random(size: 3 * Self.window + 5, seed: 0xB4, etag: "\"w2\"")
        f.serve(old) { _, index in index >= 1 ? .servedAs(new) : .none }
        var options = DownloadOptions.testing
        options.connections = 1
        let result = try await Self.downloader(f).download(f.request(), options: options) { f.watch.record($0) }
        try f.expectComplete(result, new.data)
        #expect(!f.watch.restarts.isEmpty, "the change was not said")
    }

    /// A window cut short by the network: the engine resumes from what was written, under the validator, and the
    /// file ends byte-exact.
    @Test func aWindowCutShortIsResumed() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 4 * Self.window, seed: 0xB5, etag: Self.etag)
        f.serve(file, faults: .onRequest(2, .dropAfter(1000)))
        var options = DownloadOptions.testing
        options.connections = 1
        let result = try await Self.downloader(f).download(f.request(), options: options) { f.watch.record($0) }
        try f.expectComplete(result, file.data)
        #expect(f.watch.retries.count == 1, "\(f.watch.retries)")
        let ranges = f.server.requests.map { $0.range ?? "none" }
        // The resume asks from where the file got to (two windows and the 1000 bytes of the cut one).
        #expect(ranges.count >= 4 && ranges[3].hasPrefix("bytes=\(2 * Self.window + 1000)-"), "\(ranges)")
        #expect(f.server.requests.dropFirst().allSatisfy { $0.header("If-Range") == Self.etag })
    }
}
