import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// Hostile and broken servers: responses written byte for byte (``Fault/raw(_:then:)``) with oversized, duplicate,
/// contradictory, non-UTF-8 or overflowing headers, bodies longer or shorter than announced, encoded bodies, hostile
/// `Content-Disposition` names and redirects to other schemes.
///
/// Every case ends in one of two ways, within a bounded time (a watchdog cancels a download that runs too long and
/// the test fails): a byte-exact download (SHA-256 against the source), or a ``DownloadError`` with the expected
/// code and a one-line message, with nothing at the destination (and the partial kept where one is expected).
/// Faults fire on byte counts, never after sleeps; the fake clock makes backoff instant.
@Suite struct HostileServerTests {
    static let size = 100_000
    static let half = 40_000
    static let etag = "\"h1\""

    static func file(seed: UInt64 = 0x4057, disposition: String? = nil) -> ServedFile {
        ServedFile.random(size: size, seed: seed, etag: etag, contentDisposition: disposition)
    }

    // MARK: Headers

    @Test(arguments: HostileCase.runnable(headerCases))
    func hostileHeaders(_ c: HostileCase) async throws {
        try await Self.check(c)
    }

    static let headerCases: [HostileCase] = [
        HostileCase("1 MiB of headers", .fails(.protocolViolation)) { file in
            .always(.raw(ok(file, extra: (0..<1024).map { line("X-Pad-\($0): " + String(repeating: "a", count: 1000)) })))
        },
        HostileCase("20 interim 102 heads of 15 KB each, then the file", .fails(.protocolViolation)) { file in
            let interim = head("102 Processing", [line("X-Pad: " + String(repeating: "p", count: 15_000))])
            return .always(.raw(Array(repeating: interim, count: 20).flatMap { $0 } + ok(file)))
        }.expecting(.fails(.httpStatus), on: .urlSession),  // FoundationNetworking takes a 1xx for the final head
        HostileCase("240 KB of headers (under the 256 KiB limit)", .complete) { file in
            .always(.raw(ok(file, extra: (0..<240).map { line("X-Pad-\($0): " + String(repeating: "a", count: 1000)) })))
        },
        HostileCase("one 200 KB header line", .fails(.protocolViolation)) { file in
            .always(.raw(ok(file, extra: [line("X-Big: " + String(repeating: "b", count: 200_000))])))
        },
        HostileCase("10,000 headers", .complete) { file in
            .always(.raw(ok(file, extra: (0..<10_000).map { line("X-H\($0): v") })))
        },
        HostileCase("invalid UTF-8 in ETag, then resume", .complete) { file in
            .onRequest(0, .all([.raw(ok(file, etag: Array("\"\u{1}".utf8) + [0xFF, 0xFE, 0x22])), .dropAfter(half)]))
        }.expecting(.fails(.protocolViolation), on: .urlSession),  // FoundationNetworking refuses a non-UTF-8 head
        HostileCase("control characters in ETag, then resume", .complete) { file in
            .onRequest(0, .all([.raw(ok(file, etag: Array("\"a\u{1}b\u{7F}c\u{1B}[0m\rX-Injected: 1\"".utf8))), .dropAfter(half)]))
        },
        HostileCase("NUL in ETag (libcurl refuses the response)", .fails(.protocolViolation)) { file in
            .onRequest(0, .all([.raw(ok(file, etag: [0x22, 0x61, 0x00, 0x62, 0x22])), .dropAfter(half)]))
        },
        HostileCase("NUL in a header value", .fails(.protocolViolation)) { file in
            .always(.raw(ok(file, extra: [line("X-Nul: a\u{0}b")])))
        },
        HostileCase("invalid UTF-8 and controls in other headers", .complete) { file in
            .always(.raw(ok(file, extra: [
                [0x58, 0x2D, 0xFF, 0x3A, 0x20, 0xC0, 0x80, 0xED, 0xA0, 0x80],  // "X-\xFF: " + overlong + surrogate
                line("Last-Modified: \u{1}\u{2}\u{7F}"), line("Accept-Ranges: \u{1}bytes"),
                line("Content-Type: text/\u{1B}[31mred"),
            ])))
        }.expecting(.fails(.protocolViolation), on: .urlSession),  // FoundationNetworking refuses a non-UTF-8 head
        HostileCase("duplicate conflicting Content-Length (larger second)", .fails(.protocolViolation)) { file in
            .always(.raw(ok(file, length: nil, extra: [line("Content-Length: \(size)"), line("Content-Length: \(size + 10)")])))
        },
        HostileCase("duplicate conflicting Content-Length (smaller second)", .fails(.protocolViolation)) { file in
            .always(.raw(ok(file, length: nil, extra: [line("Content-Length: \(size)"), line("Content-Length: \(size - 10)")])))
        },
        HostileCase("duplicate equal Content-Length", .complete) { file in
            .always(.raw(ok(file, length: nil, extra: [line("Content-Length: \(size)"), line("Content-Length: \(size)")])))
        },
        HostileCase("Content-Length: 99999999999999999999", .complete) { file in
            .always(.raw(ok(file, length: "99999999999999999999")))
        },
        HostileCase("Content-Length: -5", .fails(.protocolViolation)) { file in
            .always(.raw(ok(file, length: "-5")))
        },
        HostileCase("Content-Length: abc", .fails(.protocolViolation)) { file in
            .always(.raw(ok(file, length: "abc")))
        },
        HostileCase("Content-Length: 9223372036854775807", .fails(.unstableSource, part: .prefix)) { file in
            .always(.raw(ok(file, length: "9223372036854775807")))
        }.notRun(on: .urlSession, because: FoundationNetworkingLimits.hugeContentLengthTraps),
        HostileCase("Content-Length: 999999999999999999", .fails(.unstableSource, part: .prefix)) { file in
            .always(.raw(ok(file, length: "999999999999999999")))
        },
        HostileCase("Content-Length: +100000", .complete) { file in
            .always(.raw(ok(file, length: "+\(size)")))
        },
    ] + contentRangeCases + retryAfterCases

    /// A first response is cut at `half`; the resume gets a 206 with this `Content-Range` (and the rest of the file).
    /// Whatever the header claims, the download restarts or retries and ends byte-exact.
    static let contentRangeCases: [HostileCase] = [
        "bytes \(half)-10/-5", "bytes \(half)-\(half - 3)/\(size)", "bytes 5-2/10",
        "bytes \(half)-99999999999999999999/\(size)", "bytes \(half)-\(size - 1)/99999999999999999999",
        "bytes \(half)-\(size + 100)/\(size)", "bytes \(half)-\(size - 1)/\(size - 10)",
        "bytes \(half)-\(size - 1)/\(size + 10)", "bytes -\(half)-\(size - 1)/\(size)", "bytes \(half)-\(size - 1)/*",
        "bytes=\(half)-\(size - 1)/\(size)", "bytes \(half)-\(size - 1)/\(size)/\(size)", "bytes \u{1}\(half)-\(size - 1)/\(size)",
    ].map { header in
        HostileCase("206 with Content-Range: \(header.debugDescription)", .complete) { file in
            .onRequests([0: .dropAfter(half), 1: .raw(partial(file, contentRange: header))])
        }
    }

    static let retryAfterCases: [HostileCase] = ["99999999999999999999", "-5", "1e9", "Thu, 01 Jan 9999 00:00:00 GMT", "\u{1}"].map {
        value in
        HostileCase("503 with Retry-After: \(value.debugDescription)", .complete, maxSleep: 600) { _ in
            .onRequest(0, .status(503, headers: [("Retry-After", value)], body: Array("busy".utf8)))
        }
    }

    // MARK: Bodies

    @Test(arguments: HostileCase.runnable(bodyCases))
    func brokenBodies(_ c: HostileCase) async throws {
        try await Self.check(c)
    }

    static let gzipBody: [UInt8] = [
        31, 139, 8, 0, 0, 0, 0, 0, 2, 3, 203, 72, 205, 201, 201, 215, 81, 200, 200, 47, 46, 201, 204, 73, 85, 40,
        207, 47, 202, 73, 225, 2, 0, 100, 171, 88, 217, 21, 0, 0, 0,
    ]  // gzip -n -9 of "hello, hostile world\n"

    static let bodyCases: [HostileCase] = [
        HostileCase("more bytes than Content-Length", .complete) { file in
            .always(.raw(ok(file) + Array(repeating: 0xEE, count: 5000)))
        },
        HostileCase("206 resume with more bytes than announced", .complete) { file in
            .onRequests([0: .dropAfter(half), 1: .raw(partial(file) + Array(repeating: 0xEE, count: 5000))])
        },
        HostileCase("fewer bytes than Content-Length, then a normal server", .complete) { file in
            .onRequest(0, .raw(Array(ok(file).dropLast(size - half))))
        },
        HostileCase("always fewer bytes than Content-Length", .fails(.unstableSource, part: .exactly(half))) { file in
            .always(.raw(Array(ok(file).dropLast(size - half))))
        },
        HostileCase("reset in the middle of a chunk", .complete) { _ in
            .onRequest(0, .all([.chunked, .resetAfter(half + 7)]))
        },
        HostileCase("chunked body without its last chunk", .complete) { file in
            .onRequest(0, .raw(chunked(file, terminated: false)))
        },
        HostileCase("chunked body with a bad chunk size", .complete) { file in
            .onRequest(0, .raw(head("200 OK", [line("Transfer-Encoding: chunked")]) + Array("zz\r\nabc\r\n0\r\n\r\n".utf8)))
        },
        HostileCase("chunk size overflowing 64 bits", .complete) { file in
            .onRequest(0, .raw(head("200 OK", [line("Transfer-Encoding: chunked")]) + Array("fffffffffffffffffff\r\nabc".utf8)))
        },
        HostileCase("gzip body despite identity", .fails(.protocolViolation)) { _ in
            .always(.raw(head("200 OK", [line("Content-Encoding: gzip"), line("Content-Length: \(gzipBody.count)")]) + gzipBody))
        },
        HostileCase("gzip body once (not tried again)", .fails(.protocolViolation)) { _ in
            .onRequest(0, .raw(head("200 OK", [line("Content-Encoding: gzip"), line("Content-Length: \(gzipBody.count)")]) + gzipBody))
        },
        HostileCase("br-encoded chunked body", .fails(.protocolViolation)) { file in
            .always(.raw(chunked(file, extra: [line("Content-Encoding: br")])))
        },
        HostileCase("gzip-encoded 206 on resume", .fails(.protocolViolation, part: .exactly(half))) { file in
            .onRequests([0: .dropAfter(half), 1: .raw(partial(file, extra: [line("Content-Encoding: gzip")]))])
        },
        HostileCase("Content-Encoding: identity is fine", .complete) { file in
            .always(.raw(ok(file, extra: [line("Content-Encoding: identity")])))
        },
        HostileCase("Transfer-Encoding: gzip, chunked", .fails(.protocolViolation)) { file in
            .always(.raw(chunked(file, transferEncoding: "gzip, chunked")))
        },
    ]

    /// A server that sends one byte and then nothing: the stall timeout ends each attempt, the retry gets nothing
    /// either, and the download gives up keeping the byte it got.
    @Test func dripOneByteThenStallGivesUpKeepingThePartial() async throws {
        var options = DownloadOptions.testing
        options.transport.stallTimeout = TestBackend.selected.shortStallTimeout
        options.retry.maxRetries = 1
        let c = HostileCase("drip one byte, then stall", .fails(.retriesExhausted, part: .exactly(1)), options: options) { _ in
            FaultPolicy { _, index in index == 0 ? .stallAfter(1, then: .close) : .stallBeforeHeaders(then: .close) }
        }
        let f = try await Self.check(c)
        #expect(f.server.requests.count == 2)
        #expect(try StateFile.read(f.paths.state)?.segments.first?.durable == 1)
    }

    /// A server that drips its body (here 20 bytes a second, in 1-byte writes) never goes silent, so "no data for
    /// N s" would wait for ever; fewer than `stallMinimumBytes` in `stallTimeout` is a stall too. Each attempt
    /// saves a few bytes (less than `minimumProgress`), so the retries run out, the partial kept. With the minimum
    /// at 1 byte (the old rule) the same server is still being waited for when the test looks.
    @Test(arguments: [1024, 1])
    func dripOneByteAtATimeStalls(stallMinimumBytes: Int) async throws {
        var options = DownloadOptions.testing
        options.connections = 1
        options.transport.stallTimeout = TestBackend.selected.shortStallTimeout
        options.transport.stallMinimumBytes = stallMinimumBytes
        options.retry.maxRetries = 1
        let f = try Fixture()
        let file = Self.file()
        f.serve(file, faults: .always(.throttle(bytesPerSecond: 20)))
        let task = Task { try await f.download(f.request(), options: options) }
        let server = f.server
        if stallMinimumBytes > 1 {
            let outcome = await Self.bounded { try await task.value }
            let error = try #require(outcome.failure)
            #expect(error.code == .retriesExhausted, "\(error.code): \(error.message)")
            #expect(error.message.contains("stalled transfer"), "\(error.message)")
            #expect(server.requests.count == 2)
            let part = (try? readFile(f.paths.part)) ?? []
            #expect(part == Array(file.data[0..<part.count]))
            #expect(!fileExists(f.dest))
        } else {
            // Dripping for longer than two stall timeouts and two attempts' worth: still on its first request.
            let bytes = Int(3 * TestBackend.selected.shortStallTimeout * 20)
            #expect(await blocking { waitUntil(timeout: 60) { server.bodyBytesSent >= bytes } })
            #expect(server.requests.count == 1)
            task.cancel()
            _ = try? await task.value
        }
    }

    /// A server that drops every connection after a few bytes: the attempts save a little, less than
    /// `minimumProgress` between them, so the retries run out (the old rule — any new byte resets the count —
    /// retried for ever). One that drops after 6,000 or 12,000 bytes (limit 10,000) is progress, however many
    /// attempts it takes: the count starts again once the failed attempts have saved 10,000 bytes together.
    @Test(arguments: [(100, false), (6_000, true), (12_000, true)])
    func connectionsThatEachSaveTooLittleExhaustTheRetries(bytesPerConnection: Int, completes: Bool) async throws {
        var options = DownloadOptions.testing
        options.connections = 1
        options.retry.maxRetries = 3
        options.retry.minimumProgress = 10_000
        let expect: HostileCase.Expect =
            completes ? .complete : .fails(.retriesExhausted, part: .exactly(4 * bytesPerConnection))
        let c = HostileCase("drop after \(bytesPerConnection) bytes", expect, options: options) { _ in
            .always(.dropAfter(bytesPerConnection))
        }
        let f = try await Self.check(c)
        let requests = completes ? (Self.size + bytesPerConnection - 1) / bytesPerConnection : 4
        #expect(f.server.requests.count == requests)
    }

    // MARK: Pure checks behind the cases above

    /// A length near Int64.max used to overflow the piece-size computation (a crash on the transport thread).
    @Test(arguments: [Int64.max, Int64.max - 1, 999_999_999_999_999_999, 1 << 62, 0, 1, 4096 << 20])
    func pieceSizeNeverOverflows(_ total: Int64) {
        let size = PieceLayout.pieceSize(forTotal: total)
        #expect(size >= PieceLayout.minimumPieceSize)
        #expect(total / size + (total % size == 0 ? 0 : 1) <= PieceLayout.maximumPieces)
    }

    @Test(arguments: [
        ([("Content-Encoding", "gzip")], false), ([("Content-Encoding", "GZip ")], false),
        ([("Content-Encoding", "identity, br")], false), ([("Content-Encoding", "identity")], true),
        ([("Content-Encoding", "")], true), ([("Transfer-Encoding", "gzip, chunked")], false),
        ([("Transfer-Encoding", "chunked")], true), ([("Content-Length", "5"), ("Content-Length", "6")], false),
        ([("Content-Length", "5"), ("content-length", "5")], true),
    ] as [([(String, String)], Bool)])
    func encodedOrAmbiguousBodiesAreNotTaken(_ headers: [(String, String)], _ taken: Bool) {
        var fields = HTTPHeaders()
        for (name, value) in headers { fields.add(name: name, value: value) }
        for status in [200, 206] {
            if status == 206 { fields.add(name: "Content-Range", value: "bytes 0-4/5") }
            let plan = RequestPlan(rangeStart: status == 206 ? 0 : nil, resumeOffset: 0, ifRange: nil)
            let verdict = ResumePolicy.evaluate(ResponseHead(status: status, headers: fields), plan: plan, known: nil)
            if case .refused(let why) = verdict {
                #expect(!taken, "\(status): \(why)")
                #expect(!why.contains("\n"))
            } else {
                #expect(taken, "\(status): \(verdict)")
            }
        }
    }

    // MARK: Segmented

    /// Two connections whose `Content-Range` totals differ: the engine restarts (and falls back to one connection),
    /// never stitching bytes of two different lengths.
    @Test(arguments: [0, 10, -10, 1 << 20])
    func totalsDifferingBetweenConnections(_ delta: Int) async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 0x70_7A1, etag: Self.etag)
        let lie = delta == 0 ? Fault.wrongContentRange(.header("bytes 2097152-4194303/*")) : .wrongContentRange(.total(size + delta))
        f.serve(file) { request, _ in
            guard let range = request.askedRange, !range.hasPrefix("bytes=0-") else { return .none }
            return lie
        }
        var options = DownloadOptions.testing
        options.connections = 2
        let outcome = await Self.bounded { [options] in try await f.download(f.request(), options: options) }
        let result = try outcome.get()
        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts.count >= 1)
    }

    // MARK: Names

    @Test(arguments: nameCases)
    func hostileNames(_ c: NameCase) async throws {
        // The server ends the response itself: no stall is part of any case (the clock stands; see HostileCase).
        let f = try Fixture(directoryMode: true, timeStands: true)
        let file = Self.file(seed: 0x4A3E)
        f.serve(file, faults: .always(.raw(Self.ok(file, extra: [Array("Content-Disposition: ".utf8) + c.disposition]))))
        var options = DownloadOptions.testing
        options.connections = 1
        let outcome = await Self.bounded { [options] in try await f.download(f.request(), options: options) }
        if c.refusedOver.contains(.selected) {
            let error = try #require(outcome.failure, "over \(TestBackend.selected) the head cannot be read")
            #expect(error.code == .protocolViolation, "\(error.code): \(error.message)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: f.downloads).isEmpty)
            return
        }
        let result = try outcome.get()

        let name = (result.destination as NSString).lastPathComponent
        #expect((result.destination as NSString).deletingLastPathComponent == f.downloads)
        #expect(!name.isEmpty && name != "." && name != ".." && !name.contains("/") && !name.hasPrefix("."))
        #expect(name.unicodeScalars.allSatisfy { !Self.isUnsafeScalar($0) }, "unsafe scalar in \(name.debugDescription)")
        #expect(name.utf8.count + ".stitch-live".utf8.count <= 255)
        if let expected = c.expected { #expect(name == expected) }
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.directory.path) == ["downloads"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: f.downloads) == [name])
        let parent = (f.directory.path as NSString).deletingLastPathComponent
        #expect(!fileExists(parent + "/stitch-escape.bin") && !fileExists(f.directory.path + "/stitch-escape.bin"))
        try f.expectComplete(result, file.data, at: result.destination)
    }

    static let nameCases: [NameCase] = [
        NameCase("../../stitch-escape.bin", "attachment; filename=\"../../stitch-escape.bin\""),
        NameCase("..%2F..%2F in filename*", "attachment; filename*=UTF-8''..%2F..%2Fstitch-escape.bin"),
        NameCase("absolute /etc/passwd", "attachment; filename=\"/etc/passwd\""),
        NameCase("NUL in filename*", "attachment; filename*=UTF-8''evil%00.bin"),
        NameCase("dot", "attachment; filename=\".\"", expected: "file.bin"),
        NameCase("dot dot", "attachment; filename=\"..\"", expected: "file.bin"),
        NameCase("empty", "attachment; filename=\"\"", expected: "file.bin"),
        NameCase("10,000-character name", "attachment; filename=\"" + String(repeating: "n", count: 10_000) + ".bin\""),
        NameCase("10,000 multibyte characters", "attachment; filename*=UTF-8''" + String(repeating: "%E2%82%AC", count: 10_000)),
        NameCase("ISO-8859-1 filename*", "attachment; filename*=iso-8859-1''%E9t%E9.bin", expected: "été.bin"),
        NameCase("bidi override in filename*", "attachment; filename*=UTF-8''%E2%80%AEnip.exe"),
        NameCase("invalid UTF-8 in filename*", "attachment; filename*=UTF-8''%FF%FE.bin"),
        // FoundationNetworking's header parser refuses a head that is not UTF-8: the download fails at once.
        NameCase("raw invalid UTF-8 bytes", Array("attachment; filename=\"".utf8) + [0xFF, 0xFE, 0xC0, 0xAF] + Array(".bin\"".utf8),
            refusedOver: [.urlSession]),
        NameCase("control characters", "attachment; filename=\"a\u{1}b\u{1B}[31mc\u{7F}.bin\""),
        NameCase("only spaces and dots", "attachment; filename=\" . . \""),
        NameCase("Windows reserved name", "attachment; filename=\"CON\""),
    ]

    static func isUnsafeScalar(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0..<0x20, 0x7F...0x9F, 0x2F, 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069, 0x2028, 0x2029:
            return true
        default:
            return false
        }
    }

    // MARK: Redirects

    @Test(arguments: [
        "file:///etc/passwd", "ftp://127.0.0.1/file.bin", "gopher://127.0.0.1:70/1", "dict://127.0.0.1/x",
        "data:,hello", "javascript:alert(1)", "http://[::1", "http://", "http:///file.bin",
    ])
    func redirectToAnUnusableLocationIsRefused(_ location: String) async throws {
        let f = try Fixture()
        f.serve(Self.file(), faults: .always(.redirect(302, location: location)))
        let error = try await Self.expectFailure(f, code: .redirects)
        #expect(error.message.contains("unusable") || error.message.contains("redirect"))
        #expect(f.server.requests.count == 1)
    }

    @Test(arguments: [["/a", "/a"], ["/a", "/b", "/a"]])
    func redirectLoopEnds(_ chain: [String]) async throws {
        let f = try Fixture()
        for (from, to) in zip(chain, chain.dropFirst()) { f.server.redirect(from: from, to: f.server.url(to)) }
        let outcome = await Self.bounded { try await f.download(f.request(url: f.server.url(chain[0]))) }
        let error = try #require(outcome.failure)
        #expect(error.code == .redirects)
        #expect(!error.message.contains("\n"))
        #expect(try f.leftovers().isEmpty)
    }

    @Test func redirectWithRawControlCharactersIsRefused() async throws {
        let f = try Fixture()
        let location = Array("Location: http://127.0.0.1:1/\u{1}".utf8) + [0xFF, 0x0D] + Array("x".utf8)
        f.serve(Self.file(), faults: .always(.raw(Self.head("302 Found", [location, Self.line("Content-Length: 0")]))))
        let outcome = await Self.bounded { try await f.download(f.request()) }
        let error = try #require(outcome.failure)
        #expect(!error.message.contains("\n"))
        #expect(try f.leftovers().isEmpty)
    }

    // MARK: Running a case

    /// Runs a case and checks its outcome; returns the fixture for extra checks.
    @discardableResult
    static func check(_ c: HostileCase, sourceLocation: SourceLocation = #_sourceLocation) async throws -> Fixture {
        let f = try Fixture(timeStands: c.timeStands)
        let file = Self.file()
        f.serve(file, faults: c.faults(file))
        let outcome = await bounded { try await f.download(f.request(), options: c.options) }
        switch c.expect {
        case .complete:
            let result = try outcome.get()
            try f.expectComplete(result, file.data, sourceLocation: sourceLocation)
        case .fails(let code, let kept):
            guard let error = outcome.failure else {
                Issue.record("expected \(code), the download completed", sourceLocation: sourceLocation)
                return f
            }
            #expect(error.code == code, "\(error.code): \(error.message)", sourceLocation: sourceLocation)
            #expect(!error.message.isEmpty && !error.message.contains("\n") && !error.message.contains("\r"),
                "message: \(error.message.debugDescription)", sourceLocation: sourceLocation)
            #expect(!fileExists(f.dest), "something was saved as the file", sourceLocation: sourceLocation)
            if code == .protocolViolation {
                // A response no retry can change ends at once (a retry only for the drop before it, if any).
                #expect(f.watch.retries.count <= (kept == .nothing ? 0 : 1), "retried: \(f.watch.retries)",
                    sourceLocation: sourceLocation)
            }
            if kept != .nothing {
                let part = (try? readFile(f.paths.part)) ?? []
                if case .exactly(let count) = kept {
                    #expect(part.count == count, "the partial has \(part.count) bytes", sourceLocation: sourceLocation)
                }
                #expect(part.count <= file.data.count && part == Array(file.data[0..<min(part.count, file.data.count)]),
                    "the partial is not a prefix of the file", sourceLocation: sourceLocation)
            } else {
                let leftovers = try f.leftovers()
                #expect(leftovers.isEmpty, "\(leftovers)", sourceLocation: sourceLocation)
            }
        }
        #expect(f.watch.violations.isEmpty, "\(f.watch.violations)", sourceLocation: sourceLocation)
        #expect(f.clock.sleeps.allSatisfy { $0 >= 0 && $0 <= c.maxSleep }, "sleeps \(f.clock.sleeps)",
            sourceLocation: sourceLocation)
        return f
    }

    static func expectFailure(
        _ f: Fixture, code: DownloadError.Code, sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> DownloadError {
        let outcome = await bounded { try await f.download(f.request()) }
        let error = try #require(outcome.failure, sourceLocation: sourceLocation)
        #expect(error.code == code, "\(error.code): \(error.message)", sourceLocation: sourceLocation)
        #expect(!error.message.contains("\n"), sourceLocation: sourceLocation)
        #expect(try f.leftovers().isEmpty, sourceLocation: sourceLocation)
        return error
    }

    /// Runs `body`, cancelling it (and recording an issue) if it has not finished after `seconds`.
    static func bounded<T: Sendable>(
        // Long enough for a loaded machine or a sanitizer; the cases end in well under a second when alone.
        seconds: Double = 60, sourceLocation: SourceLocation = #_sourceLocation,
        _ body: @escaping @Sendable () async throws -> T
    ) async -> Result<T, DownloadError> {
        let task = Task { try await body() }
        let watchdog = Task {
            try await Task.sleep(for: .seconds(seconds))
            task.cancel()
        }
        defer { watchdog.cancel() }
        let start = ContinuousClock.now
        do {
            let value = try await task.value
            return .success(value)
        } catch let error as DownloadError {
            if error.code == .cancelled {
                Issue.record("the download hung past \(seconds) s", sourceLocation: sourceLocation)
            }
            #expect(ContinuousClock.now - start < .seconds(seconds), sourceLocation: sourceLocation)
            return .failure(error)
        } catch {
            Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
            return .failure(DownloadError(.io, "\(error)"))
        }
    }

    // MARK: Raw responses

    static func line(_ text: String) -> [UInt8] { Array(text.utf8) }

    static func head(_ status: String, _ lines: [[UInt8]]) -> [UInt8] {
        var bytes = Array("HTTP/1.1 \(status)\r\n".utf8)
        for line in lines { bytes += line + [13, 10] }
        return bytes + [13, 10]
    }

    /// A 200 with the whole file. `length` nil: no `Content-Length` line (give one in `extra`).
    static func ok(
        _ file: ServedFile, length: String? = "\(size)", etag: [UInt8]? = nil, extra: [[UInt8]] = []
    ) -> [UInt8] {
        var lines = [line("Accept-Ranges: bytes"), Array("ETag: ".utf8) + (etag ?? Array(Self.etag.utf8))]
        if let length { lines.append(line("Content-Length: \(length)")) }
        return head("200 OK", lines + extra) + file.data
    }

    /// A 206 for `bytes=half-` claiming `contentRange`, with the rest of the file as its body.
    static func partial(
        _ file: ServedFile, contentRange: String = "bytes \(half)-\(size - 1)/\(size)", extra: [[UInt8]] = []
    ) -> [UInt8] {
        head("206 Partial Content", [
            line("Accept-Ranges: bytes"), line("ETag: \(etag)"), line("Content-Range: \(contentRange)"),
            line("Content-Length: \(size - half)"),
        ] + extra) + Array(file.data[half...])
    }

    static func chunked(
        _ file: ServedFile, transferEncoding: String = "chunked", terminated: Bool = true, extra: [[UInt8]] = []
    ) -> [UInt8] {
        var bytes = head("200 OK", [line("ETag: \(etag)"), line("Transfer-Encoding: \(transferEncoding)")] + extra)
        var offset = 0
        while offset < file.data.count {
            let count = min(7_000, file.data.count - offset)
            bytes += Array("\(String(count, radix: 16))\r\n".utf8) + file.data[offset..<(offset + count)] + [13, 10]
            offset += count
        }
        if terminated { bytes += Array("0\r\n\r\n".utf8) }
        return bytes
    }
}

// MARK: - Parameters

/// One hostile server and what the download must do against it.
struct HostileCase: Sendable, CustomTestStringConvertible {
    enum Expect: Sendable {
        /// A byte-exact download.
        case complete
        /// This error, nothing at the destination, and the partial as `part` says.
        case fails(DownloadError.Code, part: Kept = .nothing)
    }

    enum Kept: Sendable, Equatable {
        /// No file at all is left.
        case nothing
        /// A part file that is a prefix of the file (a failed resume may have restarted it).
        case prefix
        /// A part file holding exactly the first `count` bytes of the file.
        case exactly(Int)
    }

    let name: String
    private(set) var expect: Expect
    let options: DownloadOptions
    /// Whether the download's clock stands still (no stall timeout ever fires; see ``FakeClock/init(timeStands:)``):
    /// for the cases whose server ends every response itself (a close, a complete body), where a stall could only
    /// be a loaded machine's. `options` without their own set this.
    let timeStands: Bool
    let maxSleep: Double
    let faults: @Sendable (ServedFile) -> FaultPolicy
    /// Why the case cannot run over a backend (it would take the test process down): it is left out there.
    private(set) var notOn: [TestBackend: String] = [:]

    /// The case with another outcome over `backend` (which refuses or accepts differently what libcurl does).
    func expecting(_ expect: Expect, on backend: TestBackend) -> HostileCase {
        var copy = self
        if backend == .selected { copy.expect = expect }
        return copy
    }

    /// The case left out over `backend`, for `reason`.
    func notRun(on backend: TestBackend, because reason: String) -> HostileCase {
        var copy = self
        copy.notOn[backend] = reason
        return copy
    }

    /// The cases that can run over the selected backend; the rest are named on standard error with the reason.
    static func runnable(_ cases: [HostileCase]) -> [HostileCase] {
        cases.filter { c in
            guard let reason = c.notOn[.selected] else { return true }
            FileHandle.standardError.write(Data("not run over \(TestBackend.selected): \(c.name): \(reason)\n".utf8))
            return false
        }
    }

    init(
        _ name: String, _ expect: Expect, options: DownloadOptions? = nil, maxSleep: Double = 60,
        faults: @escaping @Sendable (ServedFile) -> FaultPolicy
    ) {
        self.name = name
        self.expect = expect
        self.maxSleep = maxSleep
        self.faults = faults
        timeStands = options == nil
        self.options =
            options
            ?? {
                var options = DownloadOptions.testing
                options.connections = 1
                return options
            }()
    }

    var testDescription: String { name }
}

/// What swift-corelibs-foundation cannot survive, in words for the reports of cases left out over it.
enum FoundationNetworkingLimits {
    /// Its header callback converts libcurl's `CONTENT_LENGTH_DOWNLOAD` (a double) to an integer, which traps for
    /// a length of 2^63 - 512 or more: any server can end a process that downloads with URLSession on Linux.
    static let hugeContentLengthTraps =
        "FoundationNetworking traps (the process dies) on a Content-Length of 2^63 - 512 or more"
}

struct NameCase: Sendable, CustomTestStringConvertible {
    let name: String
    let disposition: [UInt8]
    let expected: String?
    /// Backends that refuse the response (a clean failure, nothing saved) instead of naming the file.
    let refusedOver: Set<TestBackend>

    init(_ name: String, _ disposition: [UInt8], expected: String? = nil, refusedOver: Set<TestBackend> = []) {
        self.name = name
        self.disposition = disposition
        self.expected = expected
        self.refusedOver = refusedOver
    }

    init(_ name: String, _ disposition: String, expected: String? = nil) {
        self.init(name, Array(disposition.utf8), expected: expected)
    }

    var testDescription: String { name }
}

extension Result {
    var failure: Failure? {
        if case .failure(let error) = self { error } else { nil }
    }
}

extension HostileServerTests {
    /// An ETag with control characters (a bare CR among them) is never echoed so that it splits the request's
    /// header lines: no request carries an injected field, and the resume ends byte-exact.
    @Test func etagWithControlCharactersDoesNotInjectHeaders() async throws {
        let f = try Fixture()
        let file = Self.file()
        let etag = Array("\"a\u{1}b\rX-Injected: 1\"".utf8)
        f.serve(file, faults: .onRequest(0, .all([.raw(Self.ok(file, etag: etag)), .dropAfter(Self.half)])))
        var options = DownloadOptions.testing
        options.connections = 1
        let result = try await Self.bounded { [options] in try await f.download(f.request(), options: options) }.get()
        try f.expectComplete(result, file.data)
        for request in f.server.requests {
            #expect(request.header("X-Injected") == nil, "request \(request.index): \(request.headers)")
            let ifRange = request.header("If-Range") ?? ""
            #expect(!ifRange.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, "\(ifRange.debugDescription)")
        }
    }
}
