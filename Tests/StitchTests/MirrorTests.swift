import Foundation
import Glibc
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport

/// One file from several mirrors at once (``DownloadRequest/mirrors``), end to end over the real transport: a
/// mirror joins only on proof (samples spread over the file equal to the first source's, its own strong validator),
/// its lanes then fetch segments guarded by that validator, and any sign that it serves something else drops it
/// without a byte of it in the file.
@Suite struct MirrorTests {
    static let size = 8 << 20
    /// The first source's connections, slow enough that a loopback mirror's proof is over before they are.
    static let slow = FaultPolicy.always(.throttle(bytesPerSecond: 1 << 20))

    /// A fixture whose file is also served by a second server (the mirror) at `/m.bin`.
    struct Mirrored {
        let f: Fixture
        let mirror: TestHTTPServer
        var mirrorURL: String { mirror.url("/m.bin") }

        init() throws {
            f = try Fixture()
            mirror = try TestHTTPServer()
        }

        func request(checksum: ExpectedChecksum? = nil) -> DownloadRequest {
            var request = f.request(checksum: checksum)
            request.mirrors = [mirrorURL]
            return request
        }

        func download(_ request: DownloadRequest, connections: Int = 4) async throws -> DownloadResult {
            var options = DownloadOptions.testing
            options.connections = connections
            return try await f.download(request, options: options)
        }

        /// Serves `data` as the first source (ETag "first"), its segment requests held until `gate` opens (the mirror
        /// was asked for a segment), each answered with `fault`. Not its first request, which learns the file (the
        /// URLSession backend asks it as a window).
        func serveFirst(_ data: [UInt8], heldUntil gate: OneShot, then fault: Fault) {
            serveFirst(ServedFile(data: data, etag: "\"first\""), heldUntil: gate, then: fault)
        }

        /// ``serveFirst(_:heldUntil:then:)`` with a file of its own (its headers).
        func serveFirst(_ file: ServedFile, heldUntil gate: OneShot, then fault: Fault) {
            f.serve(file) { request, index in
                if index > 0, Self.isSegment(request) { gate.wait(atMost: 60) }
                return fault
            }
        }

        /// The mirror's requests that asked for the whole file or more than one sample's bytes: not proof.
        var mirrorSegmentRequests: [RecordedRequest] {
            mirror.requests.filter { $0.header("Range") == nil || Self.isSegment($0) }
        }

        /// Whether `request` asked for a range of more than one sample's bytes (a segment, not a proof's sample).
        static func isSegment(_ request: RecordedRequest) -> Bool {
            guard let range = request.header("Range"), let bounds = bounds(range) else { return false }
            return bounds.1 - bounds.0 + 1 > Adoption.sampleBytes
        }

        static func bounds(_ range: String) -> (Int64, Int64)? {
            let parts = range.dropFirst(6).split(separator: "-")
            guard range.hasPrefix("bytes="), parts.count == 2, let a = Int64(parts[0]), let b = Int64(parts[1])
            else { return nil }
            return (a, b)
        }

        func notices() -> [String] {
            f.watch.events.compactMap { if case .notice(let text) = $0 { text } else { nil } }
        }
    }

    /// Proven, the mirror fetches segments. Not left to speeds: the first source answers its segment requests only
    /// once the mirror has been asked for one (an explicit signal), so under any load the mirror's lanes find work.
    @Test func anEqualMirrorWithItsOwnETagFetchesSegments() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 101)
        let mirrorAsked = OneShot()
        defer { mirrorAsked.open() }  // no server thread is left waiting, whatever the test's outcome
        m.serveFirst(data, heldUntil: mirrorAsked, then: .throttle(bytesPerSecond: 1 << 20))
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\"")) { request, _ in
            if Mirrored.isSegment(request) { mirrorAsked.open() }
            return .none
        }

        let result = try await m.download(m.request())
        try m.f.expectComplete(result, data)
        #expect(m.notices().contains { $0.contains("mirror \(m.mirrorURL) joins") }, "\(m.notices())")
        #expect(!m.notices().contains { $0.contains("dropped") }, "\(m.notices())")
        let segments = m.mirrorSegmentRequests
        #expect(!segments.isEmpty, "the mirror served segments: \(m.mirror.requests.map { $0.header("Range") ?? "-" })")
        // Every range the mirror served after its first sample was tied to its own validator.
        #expect(segments.allSatisfy { $0.header("If-Range") == "\"mirror\"" })
        #expect(m.f.server.requests.allSatisfy { $0.header("If-Range") == nil || $0.header("If-Range") == "\"first\"" })
    }

    @Test func aMirrorWithAnotherFileIsDroppedBeforeItServesAByte() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 102)
        var other = data
        other[Self.size - 10] ^= 0xFF  // differs in its last sample only
        m.f.serve(ServedFile(data: data, etag: "\"first\""), faults: Self.slow)
        m.mirror.serve("/m.bin", file: ServedFile(data: other, etag: "\"mirror\""))

        let result = try await m.download(m.request())
        try m.f.expectComplete(result, data)
        #expect(m.notices().contains { $0.contains("mirror \(m.mirrorURL) dropped: its bytes differ from the first source's at byte \(Self.size - 10)") }, "\(m.notices())")
        #expect(m.mirrorSegmentRequests.isEmpty, "only samples were asked of it")
    }

    @Test func aMirrorOfAnotherLengthOrWithoutAValidatorIsDropped() async throws {
        for (file, words) in [
            (ServedFile.random(size: Self.size + 1, seed: 103, etag: "\"m\""), "bytes, the first source's"),
            (ServedFile(data: ServedFile.randomBytes(count: Self.size, seed: 103)), "no strong validator"),
        ] {
            let m = try Mirrored()
            defer { m.mirror.stop() }
            let data = ServedFile.randomBytes(count: Self.size, seed: 103)
            m.f.serve(ServedFile(data: data, etag: "\"first\""), faults: Self.slow)
            m.mirror.serve("/m.bin", file: file)
            let result = try await m.download(m.request())
            try m.f.expectComplete(result, data)
            #expect(m.notices().contains { $0.contains("dropped") && $0.contains(words) }, "\(m.notices())")
            #expect(m.mirrorSegmentRequests.isEmpty)
        }
    }

    /// Proven, then the mirror's file changes: its next range (If-Range with the proven validator) comes back as
    /// the whole new file, and the mirror is dropped without a byte of it kept.
    @Test func aMirrorThatChangesAfterItsProofIsDropped() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 104)
        // The first source's segments wait until the mirror is asked for one, so that it is proven and has work
        // under any load (a loaded ThreadSanitizer run finished from the first source before the proof).
        let mirrorAsked = OneShot()
        defer { mirrorAsked.open() }
        m.serveFirst(data, heldUntil: mirrorAsked, then: .throttle(bytesPerSecond: 1 << 20))
        let changed = ServedFile.random(size: Self.size, seed: 105, etag: "\"changed\"")
        // Samples as they were proven; the segments that follow get the changed file (whatever was retried).
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\"")) { request, _ in
            if Mirrored.isSegment(request) { mirrorAsked.open() }
            let bounds = request.header("Range").flatMap(Mirrored.bounds)
            return bounds.map { $0.1 - $0.0 + 1 > Adoption.sampleBytes } ?? true ? .servedAs(changed) : .none
        }
        let result = try await m.download(m.request())
        try m.f.expectComplete(result, data)
        #expect(m.notices().contains { $0.contains("mirror \(m.mirrorURL) joins") })
        #expect(m.notices().contains { $0.contains("mirror \(m.mirrorURL) dropped") }, "\(m.notices())")
        #expect(m.f.watch.restarts.isEmpty, "a mirror's trouble never restarts the download: \(m.f.watch.restarts)")
    }

    /// Proven, then failing: on two connections the mirror's lane goes on with the first source, and the download
    /// ends whole.
    @Test func aMirrorThatFailsLaterLeavesItsConnectionToTheFirstSource() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 111)
        let mirrorAsked = OneShot()  // as in aMirrorThatChangesAfterItsProofIsDropped
        defer { mirrorAsked.open() }
        m.serveFirst(data, heldUntil: mirrorAsked, then: .throttle(bytesPerSecond: 1 << 20))
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\"")) { request, _ in
            if Mirrored.isSegment(request) { mirrorAsked.open() }
            let bounds = request.header("Range").flatMap(Mirrored.bounds)
            return bounds.map { $0.1 - $0.0 + 1 > Adoption.sampleBytes } ?? true ? .status(404) : .none
        }
        let result = try await m.download(m.request(), connections: 2)
        try m.f.expectComplete(result, data)
        #expect(m.notices().contains { $0.contains("mirror \(m.mirrorURL) dropped: HTTP 404") }, "\(m.notices())")
        #expect(m.f.watch.restarts.isEmpty)
    }

    /// Proven, then stalling mid-segment (its connections open, no bytes): the download does not wait on it — its
    /// ranges are taken by the first source's connections — and ends whole.
    @Test func aMirrorThatStallsHasItsRangesTakenByTheFirstSource() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 112)
        // The first source's segments wait until the mirror has a segment (as in the test of an equal mirror).
        let mirrorAsked = OneShot()
        defer { mirrorAsked.open() }
        m.serveFirst(data, heldUntil: mirrorAsked, then: .none)
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\"")) { request, _ in
            guard Mirrored.isSegment(request) else { return .none }
            mirrorAsked.open()
            return .stallAfter(100_000, then: .close)
        }
        let result = try await m.download(m.request(), connections: 2)
        try m.f.expectComplete(result, data)
        #expect(!m.mirrorSegmentRequests.isEmpty, "the mirror was asked for segments")
        // Its stalled connection was replaced by the lanes' monitor (beside a peer that brings bytes), not left to
        // the stall timeout; the bytes it did send are kept (proven version, If-Range), nothing restarted.
        #expect(m.notices().contains("replacing a slow connection"), "\(m.notices())")
        #expect(m.f.watch.restarts.isEmpty)
    }

    /// Two lanes on one mirror: one's request stalls mid-body (its connection open), the other's is refused (502)
    /// and drops the mirror. The stalled request is cut at the drop — the mirror sends nothing more — and its range
    /// goes to the first source. Under a rate limit (which keeps the monitor from replacing slow connections) and
    /// with a stall timeout longer than the test's limit, only the cut at the drop lets the download end.
    @Test(.timeLimit(.minutes(1))) func aDroppedMirrorsOtherRequestsAreCut() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 115)
        let mirrorAsked = OneShot()
        defer { mirrorAsked.open() }
        m.serveFirst(data, heldUntil: mirrorAsked, then: .none)
        // The first source's segments wait until both mirror lanes have asked (one stalls, one is refused): under
        // any load the two mirror lanes get segments of their own.
        let segments = Atomic<Int>(0)
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\"")) { request, _ in
            guard Mirrored.isSegment(request) else { return .none }
            guard segments.add(1, ordering: .relaxed).oldValue == 0 else {
                mirrorAsked.open()
                return .status(502)
            }
            return .stallAfter(100_000, then: .close)
        }
        var options = DownloadOptions.testing
        options.connections = 4
        options.transport.stallTimeout = 600
        options.rateLimiter = RateLimiter(bytesPerSecond: 1 << 30)
        let result = try await m.f.download(m.request(), options: options)
        try m.f.expectComplete(result, data)
        #expect(m.notices().contains { $0.contains("mirror \(m.mirrorURL) dropped: HTTP 502") }, "\(m.notices())")
        #expect(!m.notices().contains("replacing a slow connection"), "\(m.notices())")
        #expect(m.f.watch.restarts.isEmpty)
    }

    /// The samples that prove a mirror (and the first source's they are compared with) count against the rate
    /// limit as the file's bytes do: the limiter lets through the file and at least the minimum samples of each.
    @Test func theSamplesCountAgainstTheRateLimit() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 116)
        // The first source's segments wait until the mirror is asked for one (so it was proven: every sample taken).
        let mirrorAsked = OneShot()
        defer { mirrorAsked.open() }
        m.serveFirst(data, heldUntil: mirrorAsked, then: .none)
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\"")) { request, _ in
            if Mirrored.isSegment(request) { mirrorAsked.open() }
            return .none
        }
        let limiter = RateLimiter(bytesPerSecond: 1 << 30)
        var options = DownloadOptions.testing
        options.connections = 4
        options.rateLimiter = limiter
        let result = try await m.f.download(m.request(), options: options)
        try m.f.expectComplete(result, data)
        let samples = (m.f.server.requests + m.mirror.requests).filter { request in
            request.header("Range").flatMap(Mirrored.bounds).map { $0.1 - $0.0 + 1 == Adoption.sampleBytes } ?? false
        }
        #expect(samples.count >= 2 * Adoption.minimumSamples, "\(samples.count) samples")
        #expect(
            limiter.bytesTaken >= Int64(Self.size) + Int64(2 * Adoption.minimumSamples) * Adoption.sampleBytes,
            "\(limiter.bytesTaken) bytes through the limiter, \(samples.count) samples")
    }

    /// A redirect to another origin gets no `Authorization` or `Cookie` the caller gave (as curl without
    /// `--location-trusted`); one on the same origin gets them.
    @Test func credentialHeadersDoNotFollowARedirectToAnotherOrigin() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: 300_000, seed: 113)
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"m\""))
        m.f.server.redirect(from: "/file.bin", to: "/same.bin")
        m.f.server.redirect(from: "/same.bin", to: m.mirrorURL)
        var request = m.f.request()
        request.headers.add(name: "Authorization", value: "Bearer secret")
        request.headers.add(name: "X-Other", value: "kept")
        let result = try await m.f.download(request)
        try m.f.expectComplete(result, data)
        #expect(m.f.server.requests.allSatisfy { $0.header("Authorization") == "Bearer secret" })
        #expect(!m.mirror.requests.isEmpty)
        #expect(m.mirror.requests.allSatisfy { $0.header("Authorization") == nil && $0.header("X-Other") == "kept" })
    }

    /// Two lanes on a mirror that fails its segments (502, then 503): once one drops it, the other's next request goes
    /// to the first source — never again to the mirror, and never with the first source's validator — and a
    /// mirror's refusal retires none of the first source's connections.
    @Test(arguments: [502, 503])
    func afterADropNoLaneAsksTheMirrorAgain(_ status: Int) async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 114)
        m.f.serve(ServedFile(data: data, etag: "\"first\""), faults: Self.slow)
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\"")) { request, _ in
            let bounds = request.header("Range").flatMap(Mirrored.bounds)
            return bounds.map { $0.1 - $0.0 + 1 > Adoption.sampleBytes } ?? true ? .status(status) : .none
        }
        var request = m.f.request()
        request.mirrors = [m.mirrorURL, m.mirrorURL + "?again"]  // lanes 1 and 3: one mirror each, same server
        let result = try await m.download(request)
        try m.f.expectComplete(result, data)
        #expect(m.mirror.requests.allSatisfy { $0.header("If-Range") != "\"first\"" }, "\(m.mirror.requests.map { $0.header("If-Range") ?? "-" })")
        #expect(m.f.watch.restarts.isEmpty, "\(m.f.watch.restarts)")
        #expect(!m.notices().contains { $0.contains("refused an extra connection") }, "\(m.notices())")
        #expect(!m.notices().contains { $0.contains("changed") }, "\(m.notices())")
    }

    @Test func credentialHeadersStayWithTheirOrigin() throws {
        var request = DownloadRequest(url: "https://h.example/f", destination: .file("/tmp/x"))
        request.headers.add(name: "Authorization", value: "a")
        request.headers.add(name: "Cookie", value: "c")
        request.headers.add(name: "X-Other", value: "o")
        let context = RunContext(
            request: request, options: DownloadOptions(), transport: ScriptedTransport(file: ServedFile(data: [])) { _, _ in .serve() }, clock: FakeClock(),
            startURL: URL(string: "https://h.example/f")!)
        func names(_ url: String) -> [String] { context.userHeaders(for: URL(string: url)!).map { $0.name } }
        #expect(names("https://H.example:443/g") == ["Authorization", "Cookie", "X-Other"])
        #expect(names("http://h.example/f") == ["X-Other"], "not over another scheme")
        #expect(names("https://h.example:8443/f") == ["X-Other"], "not to another port")
        #expect(names("https://mirror.example/f") == ["X-Other"])
    }

    /// Metalink/HTTP: a mirror the first response advertises (`Link: rel=duplicate`) is used when asked, under the
    /// same proof, and never otherwise. Asked, the first source answers its segment requests only once the mirror
    /// was asked for one (an explicit signal, as ``anEqualMirrorWithItsOwnETagFetchesSegments()``): under ThreadSanitizer
    /// on a loaded machine the throttled first source once finished before the mirror's proof was in.
    @Test(arguments: [false, true])
    func anAdvertisedMirrorIsUsedOnlyWhenAskedFor(_ asked: Bool) async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 112)
        var first = ServedFile(data: data, etag: "\"first\"")
        first.extraHeaders = [("Link", "<http://127.0.0.1:1/nothing>; rel=\"describedby\", <\(m.mirrorURL)>; rel=duplicate; pri=1")]
        let mirrorAsked = OneShot()
        defer { mirrorAsked.open() }  // no server thread is left waiting, whatever the test's outcome
        if asked {
            m.serveFirst(first, heldUntil: mirrorAsked, then: .throttle(bytesPerSecond: 1 << 20))
        } else {
            m.f.serve(first, faults: Self.slow)
        }
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\"")) { request, _ in
            if Mirrored.isSegment(request) { mirrorAsked.open() }
            return .none
        }
        var request = m.f.request()
        request.useAdvertisedMirrors = asked
        let result = try await m.download(request)
        try m.f.expectComplete(result, data)
        if asked {
            #expect(m.notices().contains { $0.contains("mirror \(m.mirrorURL) joins") }, "\(m.notices())")
            #expect(!m.mirrorSegmentRequests.isEmpty)
        } else {
            #expect(m.mirror.requests.isEmpty)
        }
    }

    @Test func linkHeadersAreReadAsRFC8288WritesThem() {
        func head(_ values: String...) -> ResponseHead {
            ResponseHead(status: 200, headers: HTTPHeaders(values.map { ("Link", $0) }))
        }
        #expect(
            LinkHeader.targets(
                of: head(
                    "<http://b/f>; rel=duplicate; pri=2, <http://a/f>; REL=\"duplicate other\"; pri=1",
                    "<http://c/f>; rel=describedby", "garbage, <http://d/f>;rel=duplicate", "<http://a/f>; rel=duplicate"),
                relation: "duplicate") == ["http://a/f", "http://b/f", "http://d/f"])
        #expect(LinkHeader.targets(of: head("<http://x/f>; title=\"a, b; rel=duplicate\""), relation: "duplicate").isEmpty)
        // Unclosed brackets end the parse at once (it was quadratic: 80 KB took 35 s; this is 400 KB).
        let hostile = String(repeating: "<,", count: 200_000)
        #expect(LinkHeader.targets(of: head(hostile + "<http://y/f>; rel=duplicate"), relation: "duplicate") == ["http://y/f"])
        #expect(LinkHeader.targets(of: head(hostile), relation: "duplicate").isEmpty)
    }

    @Test func anUnreachableMirrorIsDropped() async throws {
        let m = try Mirrored()
        let data = ServedFile.randomBytes(count: Self.size, seed: 106)
        m.f.serve(ServedFile(data: data, etag: "\"first\""), faults: Self.slow)
        m.mirror.stop()  // nothing listens there
        let result = try await m.download(m.request())
        try m.f.expectComplete(result, data)
        #expect(m.notices().contains { $0.contains("mirror \(m.mirrorURL) dropped") }, "\(m.notices())")
    }

    /// Samples cannot see a difference between them; the checksum does, and nothing is saved.
    @Test func aDifferenceBetweenTheSamplesIsCaughtByTheChecksum() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 107)
        var other = data
        // A byte no sample covers, in every quarter of the file (whichever segments the mirror's lanes take).
        let samples = Adoption.samples(of: [0..<Int64(Self.size)])
        for quarter in 0..<4 {
            var at = Int64(quarter) * Int64(Self.size / 4) + 300_000
            while samples.contains(where: { $0.contains(at) }) { at += 70_000 }
            other[Int(at)] ^= 0x01
        }
        m.f.serve(ServedFile(data: data, etag: "\"first\""), faults: Self.slow)
        m.mirror.serve("/m.bin", file: ServedFile(data: other, etag: "\"mirror\""))
        let checksum = try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: data))
        do {
            let result = try await m.download(m.request(checksum: checksum))
            // The mirror's lanes fetched none of the changed bytes: the file is the first source's.
            try m.f.expectComplete(result, data)
        } catch let error as DownloadError {
            #expect(error.code == .checksumMismatch, "\(error)")
            #expect(!fileExists(m.f.dest))
        }
    }

    @Test func credentialsGivenAsHeadersAreNotSentToAMirrorOnAnotherHost() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 108)
        m.f.serve(ServedFile(data: data, etag: "\"first\""), faults: Self.slow)
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\""))
        var request = m.request()
        request.headers.add(name: "Authorization", value: "Bearer secret")
        request.headers.add(name: "X-Other", value: "kept")
        let result = try await m.download(request)
        try m.f.expectComplete(result, data)
        #expect(!m.mirror.requests.isEmpty)
        #expect(m.mirror.requests.allSatisfy { $0.header("Authorization") == nil && $0.header("X-Other") == "kept" })
        #expect(m.f.server.requests.allSatisfy { $0.header("Authorization") == "Bearer secret" })
    }

    @Test func onOneConnectionMirrorsAreNotAsked() async throws {
        let m = try Mirrored()
        defer { m.mirror.stop() }
        let data = ServedFile.randomBytes(count: Self.size, seed: 109)
        m.f.serve(ServedFile(data: data, etag: "\"first\""), faults: Self.slow)
        m.mirror.serve("/m.bin", file: ServedFile(data: data, etag: "\"mirror\""))
        let result = try await m.download(m.request(), connections: 1)
        try m.f.expectComplete(result, data)
        #expect(m.mirror.requests.isEmpty)
    }
}
