import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

/// Segmented downloads: several connections, each asking for one segment with `Range: bytes=a-b` and `If-Range`,
/// against the fault-injecting loopback server. Every finished download is checked byte for byte (SHA-256, via
/// `Fixture.expectComplete`), and the fixture's watch checks at every request and event that nothing is at the
/// destination before the end. Faults fire on byte counts or on explicit signals (a stall reached, a request
/// received, the live record showing the bytes written), never after a sleep.
///
/// Sizes: 8–12 MiB, so pieces are 1 MiB. On a fast machine the lanes finish their segments before any has a speed
/// to judge (a request is measured over 0.2–0.5 s) or a second left, so the initial split is exactly predictable;
/// on a slow one idle lanes may also take over ends of running requests (the end game), and tests allow such
/// steals where they are not the subject: within an asked range, each costing at most the steal slack.
@Suite struct SegmentedTests {
    static let etag = "\"seg-v1\""
    static let mib: Int64 = 1 << 20

    // MARK: 1. Splitting

    /// N lanes over 12 MiB (the first, whole-file response is stalled after its head so that the server's byte
    /// count is exactly what the lanes fetched). The file is byte-exact and its checksum verified from disk; the
    /// first request is the whole-file one whose head decides; then each of the N segments (on 1 MiB piece
    /// boundaries) is asked for exactly once, with If-Range and Accept-Encoding: identity; requests only overlap
    /// where one asks for a tail of the other (a steal); and the bytes sent stay within
    /// file size + steal slack × steals.
    @Test(arguments: [2, 4, 8])
    func splitsIntoSegmentsAndIsByteExact(_ lanes: Int) async throws {
        let f = try Fixture()
        let size: Int64 = 12 << 20
        let minimumSplit: Int64 = 256 << 10
        let file = ServedFile.random(size: Int(size), seed: 0x5E60 + UInt64(lanes), etag: Self.etag)
        f.serve(file, faults: Self.lanesOnly { _, _ in .none })
        let checksum = try Self.sha256(of: file.data)
        let result = try await f.download(
            f.request(checksum: checksum), options: Self.options(lanes: lanes, minimumSplit: minimumSplit))

        try f.expectComplete(result, file.data)
        #expect(result.checksum == checksum)
        #expect(result.resumedFrom == 0)
        #expect(await Self.settle(f.server))
        let requests = f.server.requests
        try #require(requests.first?.askedRange == nil, "the first request asks for the whole file")
        let ranged = Array(requests.dropFirst())
        let asked = ranged.compactMap(AskedRange.init)
        #expect(asked.count == ranged.count, "every request after the first is ranged: \(ranged.map(\.askedRange))")
        #expect(asked.count >= lanes)
        for request in ranged {
            #expect(request.header("If-Range") == Self.etag, "request \(request.serial) If-Range")
            #expect(request.header("Accept-Encoding") == "identity", "request \(request.serial) Accept-Encoding")
        }
        let segments = Self.segments(total: size, lanes: lanes, minimumSplit: minimumSplit)
        #expect(segments.count == lanes)
        #expect(segments.allSatisfy { $0.start % Self.mib == 0 }, "segments start on pieces: \(segments)")
        for segment in segments {
            #expect(asked.count(where: { $0 == segment }) == 1, "segment \(segment) asked for once: \(asked)")
        }
        Self.expectNested(asked, total: size)
        #expect(f.watch.retries.isEmpty && f.watch.restarts.isEmpty)
        #expect(f.watch.resolved == [f.dest])

        let steals = asked.count - lanes
        let sent = Int64(f.server.bodyBytesSent)
        Self.expectCost(result, needed: size, sent: sent, cuts: steals)
        print(
            "SegmentedTests: \(lanes) lanes: \(asked.count) ranged requests (\(steals) steals), "
                + "\(result.bytesDiscarded) bytes dropped, \(sent - size) sent twice")
    }

    /// The end game: lane 0 stalls after 100 KB while the other three finish their 3 MiB; idle lanes then take
    /// over what lane 0 has left (once its silence is measured, nearly all of it, and its connection is replaced
    /// rather than left to its stall timeout). Every byte of the stalled segment after the 100 KB is asked for
    /// again, no other segment is, and what cut-short requests sent past their split points stays within the
    /// steal slack per steal.
    @Test func idleLanesTakeOverAStalledSegment() async throws {
        let f = try Fixture()
        let size: Int64 = 12 << 20
        let minimumSplit: Int64 = 256 << 10
        let file = ServedFile.random(size: Int(size), seed: 0x5E61, etag: Self.etag)
        let segments = Self.segments(total: size, lanes: 4, minimumSplit: minimumSplit)
        let slow = segments[0]
        let once = Once()
        f.serve(
            file,
            faults: Self.lanesOnly { request, _ in
                AskedRange(request) == slow && once.first() ? .stallAfter(100_000, then: .resume) : .none
            })
        let request = f.request()
        var options = Self.options(lanes: 4, minimumSplit: minimumSplit)
        options.transport.stallTimeout = 60  // the end game, not the stall timeout, must end the stall
        let task = Task { try await f.download(request, options: options) }
        let server = f.server
        // The whole-file response stalls first (after its head), then lane 0.
        #expect(await blocking { server.waitForStall(timeout: .seconds(30)) })
        #expect(await blocking { server.waitForStall(timeout: .seconds(30)) })
        let began = ContinuousClock.now
        let result = try await task.value
        server.releaseStalls()
        // The end game takes over in well under a second on a quiet machine; the stall timeout is a minute.
        if ContinuousClock.now - began > .seconds(20) { await printDiagnostics(server) }

        try f.expectComplete(result, file.data)
        #expect(await Self.settle(f.server))
        let asked = f.server.requests.dropFirst().compactMap(AskedRange.init)
        #expect(asked.count >= 5, "\(asked)")
        for segment in segments.dropFirst() {
            #expect(asked.count(where: { $0 == segment }) == 1, "segment \(segment) asked once: \(asked)")
        }
        let taken = asked.dropFirst(4).filter { $0.start >= slow.start && $0.start <= slow.last! }
        // The rest from where lane 0's bytes stop: at 100 KB, or earlier when the machine was too slow to read them
        // before the stalled connection was replaced (what it held in its socket is fetched again).
        let resumedAt = try #require(taken.map(\.start).min(), "the stalled segment's rest: \(taken)")
        #expect(resumedAt <= slow.start + 100_000, "the stalled segment's rest: \(taken)")
        #expect(taken.contains { $0.last == slow.last }, "\(taken)")
        // Every request lies within the stalled segment (a replaced connection may ask again from the same offset,
        // so they need not nest strictly).
        #expect(taken.allSatisfy { $0.start >= slow.start && $0.last! <= slow.last! }, "\(taken)")
        // Each request past the first four cut one short: a steal its victim, a replacement the stalled request.
        Self.expectCost(result, needed: size, sent: Int64(f.server.bodyBytesSent), cuts: asked.count - 4)
        #expect(f.watch.retries.isEmpty && f.watch.restarts.isEmpty, "\(f.watch.events)")
    }

    /// A lane steals only from a request that would take at least a second more at its speed so far; one with no
    /// speed yet (just started, or nothing received) may always be stolen from.
    @Test func stealingWeighsTheVictimsTimeLeft() {
        let left = { (written: Int64, now: Double) in
            LaneTiming.secondsLeft(from: 1_000, at: 10, written: written, end: 101_000, now: now)
        }
        #expect(left(51_000, 11) == 1)  // 50 000 B/s, 50 000 left
        #expect(left(91_000, 11) < LaneTiming.stealMinimumSeconds)  // almost done: left alone
        #expect(left(11_000, 11) >= LaneTiming.stealMinimumSeconds)  // slow: worth a steal
        #expect(left(1_000, 20) == .infinity)  // stalled from the start
        #expect(left(51_000, 10.05) == .infinity)  // too young to judge
    }

    /// More lanes than minimum-sized parts: 16 lanes over 12 MiB with a 1 MiB minimum split make 12 segments of
    /// 1 MiB, one request each (a boundary that rounding repeats is skipped, not the end of the split).
    @Test func moreLanesThanMinimumSizedPartsStillSplitsIntoAsManyAsFit() async throws {
        let f = try Fixture()
        let size: Int64 = 12 << 20
        let file = ServedFile.random(size: Int(size), seed: 0x5E74, etag: Self.etag)
        f.serve(file, faults: Self.lanesOnly { _, _ in .none })
        let result = try await f.download(f.request(), options: Self.options(lanes: 16, minimumSplit: Self.mib))

        try f.expectComplete(result, file.data)
        let asked = f.server.requests.dropFirst().compactMap(AskedRange.init)
        Self.expectNested(asked, total: size)
        print("SegmentedTests.16 lanes over 12 MiB: \(asked.count) requests \(asked)")
        let oneMiB = (0..<12).map { AskedRange(start: Int64($0) * Self.mib, last: Int64($0 + 1) * Self.mib - 1) }
        #expect(Self.segments(total: size, lanes: 16, minimumSplit: Self.mib) == oneMiB)
        // Each part once; on a slow machine idle lanes may then take over ends of parts still running.
        #expect(asked.count >= 12 && Set(asked.prefix(12)) == Set(oneMiB), "requests: \(asked)")
    }

    // MARK: 2. A fault on one lane

    /// One fault on the first request of one lane (of 4, each 2 MiB). The download completes byte-exact; the
    /// other lanes' segments are asked for once each; the faulty segment's bytes are all asked for again from where
    /// its bytes stop — by its own lane's retry or by idle lanes that take over its rest (the end game); nothing
    /// restarts (a 206 whose Content-Length contradicts its Content-Range is retried, not a restart); and nothing
    /// is sent twice beyond what a cut-short request had in flight. A 503 on the lane while the others receive
    /// retires that connection (the server refuses an extra one) instead of waiting out its Retry-After.
    @Test(arguments: LaneFault.allCases)
    func faultOnOneLaneRetriesOnlyThatLane(_ kind: LaneFault) async throws {
        let f = try Fixture()
        let size: Int64 = 8 << 20
        let cut: Int64 = 300_000
        let file = ServedFile.random(size: Int(size), seed: 0x5E62, etag: Self.etag)
        let segments = Self.segments(total: size, lanes: 4, minimumSplit: Self.mib)
        let target = segments[1]
        let once = Once()
        f.serve(
            file,
            faults: Self.lanesOnly { request, _ in
                AskedRange(request) == target && once.first() ? kind.fault(after: Int(cut)) : .none
            })
        var options = Self.options(lanes: 4)
        // libcurl's low-speed timer: about a second (longer over URLSession: TransportBackend.shortStallTimeout).
        if kind == .stall { options.transport.stallTimeout = TestBackend.selected.shortStallTimeout }
        let result = try await f.download(f.request(), options: options)

        try f.expectComplete(result, file.data)
        #expect(await Self.settle(f.server))
        let requests = f.server.requests
        let asked = requests.dropFirst().compactMap(AskedRange.init)
        for segment in segments where segment != target {
            // Once; on a loaded machine a connection whose first bytes are late beside its peers' may be replaced
            // before it brought any (then the same range is asked again, with a replacement notice).
            let times = asked.count(where: { $0 == segment })
            let replaced = f.watch.notices.count { $0.contains("replacing a slow connection") }
            #expect(times >= 1 && times <= 1 + replaced, "lane \(segment) asked once: \(asked)")
        }
        let onTarget = asked.filter { $0.start >= target.start && $0.start <= target.last! }
        try #require(onTarget.count >= 2, "the faulty segment asked again: \(asked)")
        #expect(onTarget[0] == target)
        // What was written before the fault is not asked for again (a reset may lose what was in flight).
        let again = onTarget.dropFirst()
        let resumedAt = again.map(\.start).min()!
        // On a loaded machine the faulty lane's own first request may be replaced as slow before its fault: it
        // then asks again from wherever it had got to.
        let replacements = f.watch.notices.count { $0.contains("replacing a slow connection") }
        switch kind {
        case .drop where replacements > 0, .shortBody where replacements > 0, .stall where replacements > 0:
            #expect(resumedAt >= target.start && resumedAt <= target.start + cut, "asked again: \(again)")
        case .drop, .shortBody, .stall:
            #expect(resumedAt == target.start + cut, "asked again: \(again)")
        case .reset:
            #expect(resumedAt >= target.start && resumedAt <= target.start + cut, "asked again: \(again)")
        case .unavailable, .wrongContentLength:
            #expect(resumedAt == target.start, "refused at the head, nothing written: \(again)")
        }
        #expect(again.contains { $0.last == target.last }, "the segment's end asked for: \(again)")
        // Every request beyond one per segment (steals, replaced connections, the retry) may cost the slack.
        let steals = Int64(max(again.count - 1, asked.count - segments.count))
        let slack = LaneTiming.stealSlack * steals
        switch kind {
        case .drop, .shortBody, .stall, .unavailable:
            #expect(f.server.bodyBytesSent <= Int(size + slack), "sent \(f.server.bodyBytesSent)")
        case .reset:
            #expect(f.server.bodyBytesSent <= Int(size + cut + slack))
        case .wrongContentLength:
            #expect(f.server.bodyBytesSent <= Int(size + target.end(in: size) - target.start + slack))
        }
        #expect(requests.dropFirst().allSatisfy { $0.header("If-Range") == Self.etag })
        if kind == .unavailable {
            // Retired when another lane is receiving at that moment (the usual case); on a very slow machine the
            // others may not have started yet, and the lane waits out the Retry-After instead.
            let retired = f.watch.notices.contains { $0.contains("refused an extra connection") }
            #expect(retired != (f.watch.retries.count == 1), "\(f.watch.notices), \(f.watch.retries)")
            if !retired { #expect(f.clock.sleeps == [2], "Retry-After honoured") }
        } else {
            let reasons = f.watch.events.compactMap { if case .retrying(_, _, _, let why) = $0 { why } else { nil } }
            #expect(f.watch.retries.count <= 1, "retried because: \(reasons)")
        }
        #expect(f.clock.sleeps.count <= 1)
        #expect(f.watch.restarts.isEmpty)
    }

    // MARK: 3. Ranges ignored, validators changed: restart from zero, never a splice

    /// The server answers one lane's range request with the whole file (200) while other lanes are left: that
    /// response is dropped unread (nothing of it is written), the download says so and goes on with one
    /// connection for the rest, without a restart, and ends byte-exact. (Every lane meeting it: see the next test.)
    @Test func rangeIgnoredOnOneLaneContinuesOnOneConnection() async throws {
        let f = try Fixture()
        let size: Int64 = 8 << 20
        let file = ServedFile.random(size: Int(size), seed: 0x5E64, etag: Self.etag)
        let segments = Self.segments(total: size, lanes: 4, minimumSplit: Self.mib)
        let once = Once()
        f.serve(file) { request, _ in AskedRange(request) == segments[2] && once.first() ? .ignoreRange : .none }
        let result = try await f.download(f.request(), options: Self.options(lanes: 4))

        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts.isEmpty, "\(f.watch.restarts)")
        let requests = f.server.requests
        #expect(requests.filter { $0.askedRange == nil }.count == 1, "no restart: \(requests.map(\.askedRange))")
        // Segment 2 is asked for again (by its lane's successor), with the same validator.
        #expect(requests.filter { AskedRange($0)?.start == segments[2].start }.count >= 2)
        #expect(requests.dropFirst().allSatisfy { $0.header("If-Range") == Self.etag })
        #expect(
            f.watch.notices.contains { $0.contains("whole file") && $0.contains("one connection") },
            "\(f.watch.notices)")
    }

    /// The server ignores every lane's range (200 to each): the lanes drop out one by one and the last restarts
    /// the download from zero (reported), which then takes the whole file on one connection, byte-exact.
    @Test func rangeIgnoredOnEveryLaneRestartsFromZeroOnOneConnection() async throws {
        let f = try Fixture()
        let size: Int64 = 8 << 20
        let file = ServedFile.random(size: Int(size), seed: 0x5E63, etag: Self.etag)
        let restarted = Once()
        f.serve(file) { request, _ in
            // Ranges are ignored until the download asks for the whole file a second time.
            if request.askedRange == nil, request.index > 0 { restarted.disarm() }
            return restarted.isArmed && request.askedRange != nil ? .ignoreRange : .none
        }
        let result = try await f.download(f.request(), options: Self.options(lanes: 4))

        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts == [.rangeIgnored])
        let requests = f.server.requests
        let whole = requests.indices.filter { requests[$0].askedRange == nil }
        try #require(whole.count == 2, "the first request and the one after the restart: \(requests.map(\.askedRange))")
        // A server that ignored ranges is not split again in this run: the whole file comes on one connection.
        let after = requests[(whole[1] + 1)...].compactMap(AskedRange.init)
        #expect(after.isEmpty, "after the restart: \(after)")
        #expect(f.watch.notices.contains { $0.contains("ignored a range request") }, "\(f.watch.notices)")
    }

    /// The file changes (same length, new validator) right after the first response: every lane's If-Range fails,
    /// the server sends the new file whole, the download restarts (reported, with the change) and ends with the
    /// new file, not a mix.
    @Test(arguments: [Validator.etag, .lastModified])
    func fileChangingBeforeTheLanesAskRestartsWithTheNewFile(_ validator: Validator) async throws {
        let f = try Fixture()
        let size = 8 << 20
        let (old, new) = validator.files(size: size, seeds: (0x5E65, 0x5E66))
        let server = f.server
        f.serve(old) { _, index in
            if index == 0 { server.replaceFile("/file.bin", with: new) }  // served from the next request on
            return .none
        }
        let result = try await f.download(f.request(), options: Self.options(lanes: 4))

        try f.expectComplete(result, new.data)
        #expect(f.watch.restarts == [validator.change(from: old, to: new)])
        let requests = f.server.requests
        let whole = requests.indices.filter { requests[$0].askedRange == nil }
        try #require(whole.count == 2, "\(requests.map(\.askedRange))")
        let newIfRange = new.etag ?? new.lastModified
        #expect(
            requests[..<whole[1]].dropFirst().allSatisfy { $0.header("If-Range") == (old.etag ?? old.lastModified) })
        #expect(requests[(whole[1] + 1)...].allSatisfy { $0.header("If-Range") == newIfRange })
        // Split again into its four segments; on a loaded machine idle lanes may then take over ends of running
        // requests (nested within them).
        let again = requests[(whole[1] + 1)...].compactMap(AskedRange.init)
        let segments = Self.segments(total: Int64(size), lanes: 4, minimumSplit: Self.mib)
        #expect(Set(segments).isSubset(of: Set(again)), "\(again)")
        Self.expectNested(again, total: Int64(size))
    }

    /// Backends behind a balancer that disagree on the ETag of the same bytes: every split meets a validator it
    /// did not start with and restarts. After the second such restart the run continues on one connection (and
    /// says so) instead of failing as an unstable source; the file is byte-exact.
    @Test func disagreeingBackendsEndOnOneConnection() async throws {
        let f = try Fixture()
        let size = 8 << 20
        let data = ServedFile.randomBytes(count: size, seed: 0x5E70)
        let a = ServedFile(data: data, etag: "\"backend-a\"")
        let b = ServedFile(data: data, etag: "\"backend-b\"")
        let server = f.server
        f.serve(a) { _, index in
            // The next request lands on the other backend.
            server.replaceFile("/file.bin", with: index % 2 == 0 ? b : a)
            return .none
        }
        let result = try await f.download(f.request(), options: Self.options(lanes: 4))
        try f.expectComplete(result, data)
        // A lane that meets the other backend while other lanes are left is dropped (no restart); the last lane
        // to meet it restarts the download.
        #expect(f.watch.restarts.count <= 2, "\(f.watch.restarts)")
        #expect(f.watch.notices.contains { $0.contains("one connection") }, "\(f.watch.notices)")
    }

    /// A CDN whose edges hold different copies (another ETag, other bytes): one of the lanes' connections reaches
    /// the other edge, which answers the lane's `If-Range` with its own whole file (200). The other lanes are
    /// receiving the version the download has, so that response is dropped unread, the download says why and goes
    /// on with one connection — no restart, no new connection, nothing of the other copy kept — and ends
    /// byte-exact with the first version.
    @Test(arguments: [Validator.etag, .lastModified])
    func connectionsWithDifferentVersionsFallBackToOneConnection(_ validator: Validator) async throws {
        let f = try Fixture()
        let size = 12 << 20
        let (a, b) = validator.files(size: size, seeds: (0x5E90, 0x5E91))
        // The second connection that asks for a range is the other edge's, for every request it carries.
        let edge = Locked<(seen: Set<Int>, other: Int?)>(([], nil))
        f.serve(a) { request, _ in
            let other = edge.withLock { edge -> Bool in
                if edge.other == nil, request.askedRange != nil, !edge.seen.contains(request.connectionID) {
                    edge.seen.insert(request.connectionID)
                    if edge.seen.count == 2 { edge.other = request.connectionID }
                }
                return edge.other == request.connectionID
            }
            return other ? .servedAs(b) : .none
        }
        let result = try await f.download(f.request(), options: Self.options(lanes: 4))
        try f.expectComplete(result, a.data)
        #expect(f.watch.restarts.isEmpty, "\(f.watch.restarts)")
        let notices = f.watch.notices.filter { $0.contains("different versions") }
        #expect(notices.count == 1, "\(f.watch.notices)")
        let requests = f.server.requests
        let otherEdge = try #require(edge.withLock { $0.other })
        #expect(requests.filter { $0.connectionID == otherEdge }.count == 1, "one response from the other edge")
        #expect(requests.dropFirst().allSatisfy { $0.header("If-Range") == (a.etag ?? a.lastModified) })
        #expect(requests.filter { $0.askedRange == nil }.count == 1, "no restart: one request for the whole file")
    }

    /// The file changes between two requests of one lane: lane 1 stalls after 300 000 bytes (the others finish with
    /// the old file), the file is replaced, the stall ends with a closed connection, and the lane's retry (If-Range
    /// with the old ETag) gets the new file whole. The download restarts from zero and ends with the new file only.
    @Test func fileChangingBetweenTwoRequestsOfALaneRestartsWithTheNewFile() async throws {
        let f = try Fixture()
        let size = 8 << 20
        let (old, new) = Validator.etag.files(size: size, seeds: (0x5E67, 0x5E68))
        let segments = Self.segments(total: Int64(size), lanes: 4, minimumSplit: Self.mib)
        let once = Once()
        // The first request inside segment 1, not only one for exactly segment 1: on a loaded machine an idle lane
        // may take over the end of segment 1 before its own lane has asked, which then asks for less.
        let total = Int64(size)
        f.serve(old) { request, _ in
            guard let asked = AskedRange(request), segments[1].start <= asked.start,
                asked.end(in: total) <= segments[1].end(in: total), asked.end(in: total) - asked.start > 300_000
            else { return .none }
            return once.first() ? .stallAfter(300_000, then: .close) : .none
        }
        let request = f.request()
        let task = Task { try await f.download(request, options: Self.options(lanes: 4)) }
        let server = f.server
        // Generous, as elsewhere: a pool that the whole suite loads can take half a minute to run a head's
        // continuation; the stall is a byte count, the wait only a bound.
        let stalled = await blocking { server.waitForStall(timeout: .seconds(120)) }
        let pools = "decisions: \(BlockingPool.decisions.occupancy); blocking: \(BlockingPool.shared.occupancy)"
        #expect(stalled, "requests \(server.requests.map { $0.askedRange ?? "whole" }); notices \(f.watch.notices); \(pools)")
        if !stalled { await printDiagnostics(server) }
        // Every lane has asked (with the old file) before it changes: only lane 1's retry can see the new one.
        #expect(await blocking { server.waitForRequests(5, timeout: .seconds(30)) })
        server.replaceFile("/file.bin", with: new)
        server.releaseStalls()
        let result = try await task.value

        try f.expectComplete(result, new.data)
        #expect(f.watch.restarts == [.etagChanged(old: old.etag!, new: new.etag!)])
        let requests = f.server.requests
        print("SegmentedTests.fileChangingBetweenTwoRequestsOfALane: \(requests.map { $0.askedRange ?? "whole" })")
        let whole = requests.indices.filter { requests[$0].askedRange == nil }
        try #require(whole.count == 2, "\(requests.map(\.askedRange))")
        // Between the change and the restart: requests still with the old validator — the lane's retry from where
        // it stopped, an end-game takeover, a lane's next range on a slow machine — the ones that met the new file
        // (dropped unread while other lanes were left, the restart by the last); never a splice.
        let between = requests[5..<whole[1]]
        #expect(!between.isEmpty && between.allSatisfy { $0.header("If-Range") == old.etag }, "\(between.map(\.askedRange))")
        #expect(requests[(whole[1] + 1)...].allSatisfy { $0.header("If-Range") == new.etag })
    }

    // MARK: 4. One connection when the server cannot be split

    /// No Accept-Ranges, no validator, only a weak ETag, or a Last-Modified too recent to be strong: the download
    /// stays on its first connection (one request, no Range), says why in a `.notice`, and ends byte-exact.
    @Test(arguments: Unsplittable.allCases)
    func serverThatCannotBeSplitUsesOneConnection(_ kind: Unsplittable) async throws {
        let f = try Fixture()
        let size = 8 << 20
        let file = kind.file(size: size, seed: 0x5E69)
        f.serve(file)
        let result = try await f.download(f.request(), options: Self.options(lanes: 4))

        try f.expectComplete(result, file.data)
        #expect(f.server.requests.count == 1)
        #expect(f.server.requests.first?.askedRange == nil)
        let notices = f.watch.notices
        #expect(notices.count == 1 && notices.first?.contains(kind.notice) == true, "notices: \(notices)")
        #expect(f.watch.restarts.isEmpty && f.watch.retries.isEmpty)
        #expect(result.bytesTransferred == Int64(size))
    }

    /// A strong Last-Modified (at least a second older than Date) without any ETag is enough to split; the lanes
    /// send it as If-Range.
    @Test func strongLastModifiedAloneIsEnoughToSplit() async throws {
        let f = try Fixture()
        let modified = ServedFile.httpDate(secondsSince1970: 1_600_000_000)
        let file = ServedFile.random(size: 8 << 20, seed: 0x5E6A, lastModified: modified)
        f.serve(file)
        let result = try await f.download(f.request(), options: Self.options(lanes: 4))

        try f.expectComplete(result, file.data)
        let ranged = f.server.requests.dropFirst()
        #expect(ranged.count >= 4, "four segments, and on a slow machine steals of their ends")
        Self.expectNested(ranged.compactMap(AskedRange.init), total: 8 << 20)
        #expect(ranged.allSatisfy { $0.askedRange != nil && $0.header("If-Range") == modified })
        // No fallback to one connection; a slow connection replaced on a loaded machine (seen under AddressSanitizer)
        // is the engine at work, not a notice about the validator.
        #expect(f.watch.notices.allSatisfy { $0 == "replacing a slow connection" }, "notices: \(f.watch.notices)")
        // The first response is aborted at its head; what the server had pushed into the socket by then is lost.
        #expect(await Self.settle(f.server))
        print("SegmentedTests: the aborted first response cost \(f.server.bodyBytesSent - file.data.count) bytes")
    }

    /// The automatic choice probes first. A first connection at least `singleConnectionRate` fast keeps the whole
    /// download (one request, a notice saying why); a slower one is split from where it got to: the lanes' ranges
    /// tile exactly [probe offset, end), so the probe's bytes are kept, not fetched again.
    @Test(arguments: [true, false])
    func automaticChoiceProbesTheFirstConnection(_ fastEnough: Bool) async throws {
        let f = try Fixture()
        let size: Int64 = 48 << 20  // the automatic choice: 3 connections
        let file = ServedFile.random(size: Int(size), seed: 0x5E80, etag: Self.etag)
        f.serve(file)
        var options = DownloadOptions.testing
        options.connections = nil
        options.singleConnectionRate = fastEnough ? 1 : Int64.max
        // Segments of 16 MiB with 8 MiB as the smallest part. On a loaded machine an idle lane may take over the
        // end of a slow one: such a request lies within the split's ranges and comes after them.
        options.minimumSplitSize = 8 << 20
        let result = try await f.download(f.request(), options: options)

        try f.expectComplete(result, file.data)
        #expect(await Self.settle(f.server))
        let requests = f.server.requests.engineRequests
        #expect(requests.first?.askedRange == nil, "the first request asks for the whole file")
        if fastEnough {
            #expect(requests.count == 1, "\(requests.map(\.askedRange))")
            #expect(f.watch.notices.contains { $0.contains("not splitting") }, "\(f.watch.notices)")
            #expect(f.server.bodyBytesSent == Int(size))
        } else {
            let all = requests.dropFirst().compactMap(AskedRange.init)
            #expect(all.count == requests.count - 1 && all.count >= Connections.automatic(forLength: size))
            let asked = all.prefix(Connections.automatic(forLength: size)).sorted { $0.start < $1.start }
            let probed = try #require(asked.first?.start)
            #expect(probed > 0 && probed <= SplitPolicy.probeBytes + (1 << 20), "split from \(probed)")
            if TestBackend.selected.requestWindow == nil {
                Self.expectNested(all, total: size)
                #expect(asked.last?.last.map { $0 + 1 } == size)
                #expect(zip(asked, asked.dropFirst()).allSatisfy { $0.last.map { $0 + 1 } == $1.start }, "\(asked)")
            } else {
                // Over URLSession a lane's windows show the bytes fetched, not the range the lane asked for: a steal
                // clips the victim's last window (BodySink.bytesWanted). The lanes start apart, and their windows
                // (every ranged request but the probe's) cover the rest of the file from the split.
                #expect(Set(asked.map(\.start)).count == asked.count, "\(asked)")
                let windows = f.server.requests.filter { $0.header("If-Range") != nil }.compactMap(AskedRange.init)
                    .sorted { $0.start < $1.start }
                var covered = probed
                for window in windows where window.start <= covered { covered = max(covered, window.end(in: size)) }
                #expect(covered == size, "covered \(probed)..<\(covered): \(windows)")
            }
            // Replacing a connection that a slow machine made look slow is the only notice allowed.
            #expect(f.watch.notices.allSatisfy { $0.contains("replacing a slow connection") }, "\(f.watch.notices)")
            print(
                "SegmentedTests.probe: split at \(probed) bytes; the first response sent "
                    + "\(f.server.bodyBytesSent - Int(size - probed)) bytes, \(probed) of them kept")
        }
    }

    /// Files too small to split (under 2 × minimumSplitSize) or of unknown length (chunked) use one connection.
    /// The engine says nothing about it (the `.notice` is only for a server without ranges or validators); the
    /// notices are printed for the report.
    @Test(arguments: [Quiet.small, .unsized])
    func smallOrUnsizedFileUsesOneConnection(_ kind: Quiet) async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: kind == .small ? 1_500_000 : 8 << 20, seed: 0x5E6B, etag: Self.etag)
        // Unsized: chunked, and without ranges, so that URLSession's first window (whose Content-Range would tell the
        // length) is answered as libcurl's request for the whole file is.
        f.serve(file, faults: kind == .unsized ? .always(.all([.chunked, .ignoreRange])) : .none)
        let result = try await f.download(f.request(), options: Self.options(lanes: 4))

        try f.expectComplete(result, file.data)
        #expect(f.server.requests.count == 1)
        #expect(f.server.requests.first?.askedRange == nil)
        print("SegmentedTests.\(kind): one connection; notices \(f.watch.notices)")
    }

    // MARK: 5. Resume with another number of connections

    /// (N, N'): a download over N connections is cancelled while every lane is stalled at a different offset; the
    /// state file then lists the N segments with exactly those offsets durable. Resumed with N' connections, the
    /// requests start exactly at the saved offsets and end at the segments' ends (a one-segment partial resumed
    /// with several connections is split again from its offset), the bytes sent are exactly the missing ones, and
    /// the file is byte-exact. A lane with several segments to fetch reuses its connection for the next one.
    @Test(arguments: [(4, 2), (4, 8), (4, 1), (2, 4), (1, 4)])
    func resumeWithADifferentNumberOfConnections(_ before: Int, _ after: Int) async throws {
        let f = try Fixture()
        let size: Int64 = 8 << 20
        let file = ServedFile.random(size: Int(size), seed: 0x5E6C + UInt64(before * 10 + after), etag: Self.etag)
        let segments = Self.segments(total: size, lanes: before, minimumSplit: Self.mib)
        let stops = segments.indices.map { segments[$0].start + 300_000 + Int64($0) * 250_000 }
        let armed = Once()
        f.serve(file) { request, _ in
            armed.isArmed ? Self.hold(request, segments: segments, at: stops, total: size) : .none
        }
        try await Self.interrupt(f, options: Self.options(lanes: before), stalls: before, written: stops)

        let state = try #require(try StateFile.read(f.paths.state))
        let saved = zip(segments, stops).map { Segment(start: $0.start, end: $0.last! + 1, durable: $1) }
        #expect(state.segments.sorted { $0.start < $1.start } == saved, "saved on cancel")
        #expect(!fileExists(f.dest))
        armed.disarm()
        #expect(await Self.settle(f.server))
        let requestsBefore = f.server.requests.count
        let sentBefore = f.server.bodyBytesSent

        let result = try await f.download(f.request(), options: Self.options(lanes: after))
        try f.expectComplete(result, file.data)
        #expect(await Self.settle(f.server))
        let resumed = f.server.requests[requestsBefore...].engineRequests
        let have = zip(segments, stops).reduce(Int64(0)) { $0 + $1.1 - $1.0.start }
        // On a slow machine idle lanes may also take over the end of a running request (the end game): such a
        // steal lies within one asked range and costs at most the steal slack.
        var steals = 0
        if saved.count == 1 && after == 1 {
            #expect(resumed.map(\.askedRange) == ["bytes=\(stops[0])-"])
        } else if saved.count == 1 {
            // Split again: the ranges start at the saved offset and tile the rest of the file, none re-asked.
            let all = resumed.compactMap(AskedRange.init)
            #expect(all.count == resumed.count, "\(resumed.map(\.askedRange))")
            let asked = Array(all.prefix(after)).sorted { $0.start < $1.start }
            #expect(asked.count == after, "\(resumed.map(\.askedRange))")
            #expect(asked.first?.start == stops[0])
            #expect(asked.last?.last.map { $0 + 1 } == size)
            #expect(zip(asked, asked.dropFirst()).allSatisfy { $0.last.map { $0 + 1 } == $1.start }, "\(asked)")
            Self.expectNested(all, total: size)
            steals = all.count - after
        } else {
            let expected = saved.map { AskedRange(start: $0.durable, last: $0.end! - 1) }
            let asked = resumed.compactMap(AskedRange.init)
            #expect(asked.count == resumed.count, "\(resumed.map(\.askedRange))")
            #expect(Set(asked.filter(expected.contains)) == Set(expected), "resumed \(asked), saved \(expected)")
            #expect(asked.filter(expected.contains).count == expected.count, "a rest asked twice: \(asked)")
            for steal in asked where !expected.contains(steal) {
                #expect(
                    expected.contains { $0.start <= steal.start && steal.last! <= $0.last! },
                    "\(steal) is not within a saved segment's rest: \(asked)")
            }
            steals = asked.count - expected.count
            if steals == 0, TestBackend.selected.keepsConnections {
                // A lane that finishes a segment lets its response end and asks for the next on the same connection.
                let connections = Set(resumed.map(\.connectionID)).count
                #expect(connections <= min(after, saved.count), "\(connections) connections for \(after) lanes")
            }
        }
        #expect(resumed.allSatisfy { $0.header("If-Range") == Self.etag })
        // Only the missing bytes, and what the steals cost.
        Self.expectCost(result, needed: size - have, sent: Int64(f.server.bodyBytesSent - sentBefore), cuts: steals)
        #expect(result.resumedFrom == have)
        #expect(f.watch.resumes.map(\.from) == [have])
        #expect(f.watch.restarts.isEmpty)
        print(
            "SegmentedTests.resume \(before)→\(after): \(resumed.count) request(s) on "
                + "\(Set(resumed.map(\.connectionID)).count) connection(s): \(resumed.map { $0.askedRange ?? "whole" })")
    }

    /// Cancelled after the split but before any lane received a byte: the split is made durable before the lanes
    /// start, so the state lists the empty segments, and the next run asks for exactly those ranges (with If-Range),
    /// without a whole-file request and without reporting a restart.
    @Test func cancelledBeforeAnyLaneByteStartsAfreshQuietly() async throws {
        let f = try Fixture()
        let size: Int64 = 8 << 20
        let file = ServedFile.random(size: Int(size), seed: 0x5E6D, etag: Self.etag)
        let segments = Self.segments(total: size, lanes: 4, minimumSplit: Self.mib)
        let armed = Once()
        f.serve(file) { request, _ in
            armed.isArmed && AskedRange(request) != nil ? .stallAfter(0, then: .close) : .none
        }
        try await Self.interrupt(f, options: Self.options(lanes: 4), stalls: 4, written: segments.map(\.start))
        let state = try #require(try StateFile.read(f.paths.state))
        let empty = segments.map { Segment(start: $0.start, end: $0.last! + 1, durable: $0.start) }
        #expect(state.segments.sorted { $0.start < $1.start } == empty, "\(state.segments)")
        armed.disarm()
        let requestsBefore = f.server.requests.count

        let result = try await f.download(f.request(), options: Self.options(lanes: 4))
        try f.expectComplete(result, file.data)
        #expect(f.watch.restarts.isEmpty, "\(f.watch.restarts)")
        let resumed = f.server.requests[requestsBefore...]
        #expect(resumed.allSatisfy { $0.askedRange != nil && $0.header("If-Range") == Self.etag })
        // Each empty segment is asked for exactly once; on a loaded machine the end game may also steal the tail of
        // a slow lane's segment (seen in CI), and then the tail of what that lane still had (a second steal ends
        // where the first began: seen under two busy loops) — always a range inside one segment, past its start,
        // never a whole-file request.
        let asked = resumed.compactMap(AskedRange.init)
        #expect(asked.count == resumed.count, "\(resumed.map(\.askedRange))")
        #expect(asked.filter(segments.contains).count == segments.count, "\(asked)")
        #expect(Set(asked.filter(segments.contains)) == Set(segments), "\(asked)")
        for steal in asked where !segments.contains(steal) {
            #expect(
                segments.contains { $0.start < steal.start && (steal.last ?? .max) <= ($0.last ?? .max) },
                "\(steal) is not inside one segment: \(asked)")
        }
    }

    /// A crash (not a cancel) before any timed checkpoint after the split: the split itself was made durable before
    /// the lanes started, so the state on disk lists every segment, and the live record's slots say how far each
    /// lane wrote. Simulated exactly: no timed checkpoint may run (huge interval), the three files are copied while
    /// every lane is stalled (what `kill -9` would leave, page cache included), the run is cancelled, and the copies
    /// are put back. The resumed run trusts every lane's bytes and fetches only the rest; the file is byte-exact.
    @Test func crashAfterTheSplitKeepsEveryLanesBytes() async throws {
        let f = try Fixture()
        let size: Int64 = 8 << 20
        let file = ServedFile.random(size: Int(size), seed: 0x5E6E, etag: Self.etag)
        let segments = Self.segments(total: size, lanes: 4, minimumSplit: Self.mib)
        let stops = segments.map { $0.start + 400_000 }
        let armed = Once()
        f.serve(file) { request, _ in
            armed.isArmed ? Self.hold(request, segments: segments, at: stops, total: size) : .none
        }
        var options = Self.options(lanes: 4)
        options.checkpointInterval = 3600
        options.checkpointBytes = 1 << 40
        let paths = f.paths
        let files = [paths.part, paths.state, paths.live]
        let copies = Locked<[[UInt8]]>([])
        try await Self.interrupt(f, options: options, stalls: 4, written: stops) {
            let taken = try files.map { try readFile($0) }
            copies.withLock { $0 = taken }
        }
        for (path, bytes) in zip(files, copies.withLock { $0 }) { try writeFile(path, bytes) }
        let crashed = try #require(try StateFile.read(paths.state))
        let split = segments.map { Segment(start: $0.start, end: $0.last! + 1, durable: $0.start) }
        #expect(crashed.segments.sorted { $0.start < $1.start } == split, "the split is durable, the bytes are not")
        armed.disarm()
        #expect(await Self.settle(f.server))
        let requestsBefore = f.server.requests.count
        let sentBefore = f.server.bodyBytesSent

        let result = try await f.download(f.request(), options: Self.options(lanes: 4))
        try f.expectComplete(result, file.data)
        #expect(await Self.settle(f.server))
        let resumed = f.server.requests[requestsBefore...].engineRequests
        let kept = Int64(stops.count) * 400_000
        // Each lane's rest from where its bytes stop; on a loaded machine idle lanes may then take over ends of
        // running requests (within them, each costing at most the steal slack).
        let asked = resumed.compactMap(AskedRange.init)
        #expect(Set(asked.prefix(stops.count).map(\.start)) == Set(stops), "every lane's written bytes are kept: \(asked)")
        Self.expectNested(asked, total: size)
        #expect(result.resumedFrom == kept)
        let sent = Int64(f.server.bodyBytesSent - sentBefore)
        Self.expectCost(result, needed: size - kept, sent: sent, cuts: asked.count - stops.count)
    }

    // MARK: 6. Piece checks

    /// Cancelled with every lane stalled 1.5 MiB into its 2 MiB segment: the first piece of each segment (0, 2, 4, 6)
    /// is complete and recorded (the durable halves of pieces 1, 3, 5 and 7 have proofs). Two bytes are flipped
    /// inside pieces 2 and 4 of the part file. Found by
    /// `Downloader.verify(at:)`, or by the re-check after a reboot (another boot id in the state): exactly those two
    /// pieces. The resumed run fetches exactly those pieces and the unfinished tails, nothing else, byte-exact.
    @Test(arguments: [PieceCheck.verify, .reboot])
    func damagedPiecesAreFetchedAgain(_ check: PieceCheck) async throws {
        let f = try Fixture()
        let size: Int64 = 8 << 20
        let mib = Self.mib
        let file = ServedFile.random(size: Int(size), seed: 0x5E6F, etag: Self.etag)
        let segments = Self.segments(total: size, lanes: 4, minimumSplit: mib)
        let stops = segments.map { $0.start + 3 * mib / 2 }
        let armed = Once()
        f.serve(file) { request, _ in
            armed.isArmed ? Self.hold(request, segments: segments, at: stops, total: size) : .none
        }
        try await Self.interrupt(f, options: Self.options(lanes: 4), stalls: 4, written: stops)
        let saved = try #require(try StateFile.read(f.paths.state))
        #expect(saved.pieceSize == mib)
        #expect(saved.recordedPieces == [0, 2, 4, 6], "pieces recorded at the cancel: \(saved.pieces)")

        try Self.flipByte(in: f.paths.part, at: 2 * mib + 4321)
        try Self.flipByte(in: f.paths.part, at: 4 * mib + 1_000_000)
        switch check {
        case .verify:
            let report = try Downloader.verify(at: f.dest)
            #expect(report.pieceSize == mib)
            // The four recorded pieces and the four partial ones (1, 3, 5, 7), whose durable halves have proofs.
            #expect(report.piecesChecked == 8)
            #expect(report.damagedPieces.map(\.index) == [2, 4])
            #expect(report.damagedPieces.map(\.bytes) == [2 * mib..<3 * mib, 4 * mib..<5 * mib])
            #expect(try StateFile.read(f.paths.state)?.recordedPieces == [0, 6])
            let again = try Downloader.verify(at: f.dest)
            #expect(again.damagedPieces.isEmpty && again.piecesChecked == 6, "\(again)")
        case .reboot:
            var state = saved
            state.bootID = "stitch-test-another-boot"  // never a real boot id (those are UUIDs)
            try StateFile.write(state, to: f.paths.state)
        }
        armed.disarm()
        #expect(await Self.settle(f.server))
        let requestsBefore = f.server.requests.count
        let sentBefore = f.server.bodyBytesSent

        let result = try await f.download(f.request(), options: Self.options(lanes: 4))
        try f.expectComplete(result, file.data)
        #expect(await Self.settle(f.server))
        // Kept: [0, 1.5M) [3M, 3.5M) [5M, 5.5M) [6M, 7.5M). Fetched: the rest of each segment, pieces 2 and 4 included.
        let expected: Set<AskedRange> = [
            AskedRange(start: 3 * mib / 2, last: 3 * mib - 1), AskedRange(start: 7 * mib / 2, last: 5 * mib - 1),
            AskedRange(start: 11 * mib / 2, last: 6 * mib - 1), AskedRange(start: 15 * mib / 2, last: 8 * mib - 1),
        ]
        let resumed = f.server.requests[requestsBefore...]
        let asked = resumed.compactMap(AskedRange.init)
        // The four rests first; on a loaded machine idle lanes may then take over ends of running requests.
        #expect(asked.count == resumed.count && Set(asked.prefix(4)) == expected, "\(asked)")
        Self.expectNested(asked, total: 8 * mib)
        // Only the damaged pieces and the tails, and what the steals cost.
        let sent = Int64(f.server.bodyBytesSent - sentBefore)
        Self.expectCost(result, needed: 4 * mib, sent: sent, cuts: asked.count - 4)
        #expect(result.resumedFrom == 4 * mib)
        if check == .reboot {
            let note = f.watch.resumes.first?.note ?? ""
            #expect(note.contains("2 damaged piece(s)"), "resume note: \(note)")
        }
    }

    // MARK: 7. Rate limiter

    /// A limiter that never makes anyone wait (a 64 MiB bucket, larger than the file) but refills at 1 byte/s, so
    /// its bucket afterwards tells how many bytes it was asked for: exactly the file's, whether one connection or
    /// four share it. Probed at time 0, earlier than anything it has seen, so the probes add no tokens.
    @Test(arguments: [1, 4])
    func rateLimiterIsAskedForEveryByte(_ lanes: Int) async throws {
        let f = try Fixture()
        let size: Int64 = 8 << 20
        let file = ServedFile.random(size: Int(size), seed: 0x5E70, etag: Self.etag)
        if lanes > 1 {
            f.serve(file, faults: Self.lanesOnly { _, _ in Fault.none })
        } else {
            f.serve(file)
        }
        let burst: Int64 = 64 << 20
        let limiter = RateLimiter(bytesPerSecond: 1, burst: burst)
        var options = Self.options(lanes: lanes)
        options.rateLimiter = limiter
        let result = try await f.download(f.request(), options: options)

        try f.expectComplete(result, file.data)
        #expect(f.server.requests.count == (lanes > 1 ? 1 + lanes : 1))
        Self.expectLimiter(limiter, burst: burst, consumed: size)
    }

    /// One limiter shared by two downloads at once (4 + 2 connections): it is asked for the bytes of both.
    @Test func oneRateLimiterIsSharedByTwoSegmentedDownloads() async throws {
        let f1 = try Fixture()
        let f2 = try Fixture()
        let file1 = ServedFile.random(size: 8 << 20, seed: 0x5E71, etag: Self.etag)
        let file2 = ServedFile.random(size: 4 << 20, seed: 0x5E72, etag: Self.etag)
        f1.serve(file1, faults: Self.lanesOnly { _, _ in .none })
        f2.serve(file2, faults: Self.lanesOnly { _, _ in .none })
        let burst: Int64 = 64 << 20
        let limiter = RateLimiter(bytesPerSecond: 1, burst: burst)
        var options1 = Self.options(lanes: 4)
        options1.rateLimiter = limiter
        var options2 = Self.options(lanes: 2)
        options2.rateLimiter = limiter
        async let first = f1.download(f1.request(), options: options1)
        async let second = f2.download(f2.request(), options: options2)
        let (result1, result2) = try await (first, second)

        try f1.expectComplete(result1, file1.data)
        try f2.expectComplete(result2, file2.data)
        Self.expectLimiter(limiter, burst: burst, consumed: Int64(file1.data.count + file2.data.count))
    }

    /// A limiter that does pause the connections (8 MiB/s for 4 MiB over 4 connections, a 64 KiB bucket): the file
    /// is still byte-exact. How long it took is not checked here (bench/ measures the accuracy).
    @Test func connectionsPausedByTheRateLimiterStillAssembleTheFile() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 4 << 20, seed: 0x5E73, etag: Self.etag)
        f.serve(file)
        let limiter = RateLimiter(bytesPerSecond: 8 << 20, burst: 64 << 10)
        var options = Self.options(lanes: 4)
        options.rateLimiter = limiter
        let result = try await f.download(f.request(), options: options)

        try f.expectComplete(result, file.data)
        #expect(f.server.requests.count == 5)
        #expect(limiter.take(64 << 10, now: 0) != nil, "the limiter was not asked")
    }
}

// MARK: - Parameters

extension SegmentedTests {
    enum LaneFault: CaseIterable, Sendable, CustomTestStringConvertible {
        case drop, reset, shortBody, stall, unavailable, wrongContentLength

        func fault(after bytes: Int) -> Fault {
            switch self {
            case .drop: .dropAfter(bytes)
            case .reset: .resetAfter(bytes)
            case .shortBody: .shortBody(bytes)
            case .stall: .stallAfter(bytes, then: .close)
            case .unavailable: .status(503, headers: [("Retry-After", "2")], body: Array("busy".utf8))
            case .wrongContentLength: .wrongContentLength(bytes)  // 206 claiming 300 000 bytes for a 2 MiB range
            }
        }

        var testDescription: String { "\(self)" }
    }

    enum Validator: Sendable, CustomTestStringConvertible {
        case etag, lastModified

        /// Two files of the same length (the dangerous case: only the validator tells them apart).
        func files(size: Int, seeds: (UInt64, UInt64)) -> (ServedFile, ServedFile) {
            switch self {
            case .etag:
                return (
                    ServedFile.random(size: size, seed: seeds.0, etag: "\"old\""),
                    ServedFile.random(size: size, seed: seeds.1, etag: "\"new\"")
                )
            case .lastModified:
                return (
                    ServedFile.random(
                        size: size, seed: seeds.0, lastModified: ServedFile.httpDate(secondsSince1970: 1_600_000_000)),
                    ServedFile.random(
                        size: size, seed: seeds.1, lastModified: ServedFile.httpDate(secondsSince1970: 1_600_000_100))
                )
            }
        }

        func change(from old: ServedFile, to new: ServedFile) -> RestartReason {
            switch self {
            case .etag: .etagChanged(old: old.etag!, new: new.etag!)
            case .lastModified: .lastModifiedChanged(old: old.lastModified!, new: new.lastModified!)
            }
        }

        var testDescription: String { "\(self)" }
    }

    enum Unsplittable: CaseIterable, Sendable, CustomTestStringConvertible {
        case noAcceptRanges, noValidator, weakETag, lastModifiedTooRecent

        func file(size: Int, seed: UInt64) -> ServedFile {
            switch self {
            case .noAcceptRanges:
                ServedFile.random(size: size, seed: seed, etag: SegmentedTests.etag, acceptRanges: false)
            case .noValidator: ServedFile.random(size: size, seed: seed)
            case .weakETag: ServedFile.random(size: size, seed: seed, etag: "W/\"weak\"")
            case .lastModifiedTooRecent:
                // Not at least a second older than the response's Date: weak (RFC 9110 §8.8.2.2).
                ServedFile.random(
                    size: size, seed: seed, lastModified: ServedFile.httpDate(secondsSince1970: Int(time(nil)) + 3600))
            }
        }

        var notice: String {
            self == .noAcceptRanges ? "does not accept range requests" : "no strong validator"
        }

        var testDescription: String { "\(self)" }
    }

    enum Quiet: Sendable, CustomTestStringConvertible {
        case small, unsized
        var testDescription: String { "\(self)" }
    }

    enum PieceCheck: Sendable, CustomTestStringConvertible {
        case verify, reboot
        var testDescription: String { "\(self)" }
    }
}

// MARK: - Helpers

extension SegmentedTests {
    /// The `Range: bytes=start-last` of a request (`last` nil when open-ended).
    struct AskedRange: Hashable, Sendable, CustomStringConvertible {
        var start: Int64
        var last: Int64?

        init(start: Int64, last: Int64?) {
            self.start = start
            self.last = last
        }

        /// The range `request` asks for; nil for the whole file. Over URLSession a lone window reads as the bytes it
        /// asked for (a lower bound of the engine's range, which a steal's nesting check needs), a chain of them as
        /// the engine's one request (`engineRequests`), and the first window of a whole file as the whole file.
        init?(_ request: RecordedRequest) {
            guard request.askedRange != nil, let header = request.range, header.hasPrefix("bytes="),
                let dash = header.firstIndex(of: "-"),
                let start = Int64(header[header.index(header.startIndex, offsetBy: 6)..<dash])
            else { return nil }
            let tail = header[header.index(after: dash)...]
            self.start = start
            self.last = tail.isEmpty ? nil : Int64(tail)
        }

        func end(in total: Int64) -> Int64 { (last ?? total - 1) + 1 }

        var description: String { "\(start)-\(last.map(String.init) ?? "")" }
    }

    /// Holds every lane at its stop: a request inside segment *i* that starts at or before `stops[i]` stalls once
    /// it has sent the bytes up to there (then closes). Not only the first request of each segment: on a loaded
    /// machine a lane held early looks slow beside peers that are still receiving, and the engine replaces its
    /// connection; the replacement asks again from where the lane got to and is held at the same stop, so every
    /// lane still ends up waiting exactly at its stop. (With one lane the whole-file request is the only "lane".)
    static func hold(_ request: RecordedRequest, segments: [AskedRange], at stops: [Int64], total: Int64) -> Fault {
        let asked = AskedRange(request) ?? AskedRange(start: 0, last: total - 1)
        guard
            let index = segments.firstIndex(where: {
                $0.start <= asked.start && asked.end(in: total) == $0.end(in: total)
            }), asked.start <= stops[index]
        else { return .none }
        return .stallAfter(Int(stops[index] - asked.start), then: .close)
    }

    /// A flag that is armed until disarmed, and true for `first()` once.
    final class Once: Sendable {
        private let state = Locked((armed: true, fired: false))

        var isArmed: Bool { state.withLock { $0.armed } }
        func disarm() { state.withLock { $0.armed = false } }

        /// True the first time only.
        func first() -> Bool {
            state.withLock { state in
                defer { state.fired = true }
                return !state.fired
            }
        }
    }


    /// Options asking for `lanes` connections.
    static func options(lanes: Int, minimumSplit: Int64 = 1 << 20) -> DownloadOptions {
        var options = DownloadOptions.testing
        options.connections = lanes
        options.minimumSplitSize = minimumSplit
        return options
    }

    /// The segments the first response is split into, as the requests that ask for them, as the engine splits:
    /// as many parts as lanes but none under `minimumSplit`, each boundary rounded up to a piece (to `minimumSplit`
    /// when a piece is larger than a part), a boundary that rounding repeats skipped.
    static func segments(total: Int64, lanes: Int, minimumSplit: Int64) -> [AskedRange] {
        let pieceSize = PieceLayout.pieceSize(forTotal: total)
        let parts = Int64(max(1, min(lanes, Int(total / max(1, minimumSplit)))))
        let part = total / parts
        let alignment = pieceSize <= part ? pieceSize : max(1, minimumSplit)
        var starts: [Int64] = [0]
        for index in 1..<max(2, Int(parts)) where parts > 1 {
            let boundary = (part * Int64(index) + alignment - 1) / alignment * alignment
            if boundary > starts.last!, boundary < total { starts.append(boundary) }
        }
        return zip(starts, starts.dropFirst() + [total]).map { AskedRange(start: $0, last: $1 - 1) }
    }

    /// Ranged requests may only overlap where one asks for a tail of the other (a steal, or a retry from where the
    /// other stopped): never for the same start, never for bytes before the other's start. Order-independent: a
    /// victim's request may reach the server after its thief's.
    static func expectNested(
        _ asked: [AskedRange], total: Int64, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        for (index, one) in asked.enumerated() {
            for other in asked[(index + 1)...]
            where other.start < one.end(in: total) && one.start < other.end(in: total) {
                // A tail of the other (a steal), or the same start (a replaced connection asking again from where
                // its bytes stop, up to a split point).
                let (outer, inner) =
                    one.start < other.start || (one.start == other.start && one.end(in: total) >= other.end(in: total))
                    ? (one, other) : (other, one)
                #expect(
                    outer.start <= inner.start && inner.end(in: total) <= outer.end(in: total),
                    "\(one) and \(other) overlap without one lying within the other", sourceLocation: sourceLocation)
            }
        }
    }

    /// Stalls the whole-file response right after its head (the engine aborts it there when it splits), so the
    /// server's byte count is exactly what the lanes fetched; `lanes` chooses the faults of the ranged requests.
    static func lanesOnly(
        _ lanes: @escaping @Sendable (RecordedRequest, Int) -> Fault
    ) -> @Sendable (RecordedRequest, Int) -> Fault {
        { request, index in request.askedRange == nil ? .stallAfter(0, then: .close) : lanes(request, index) }
    }

    /// What a download that needed `needed` body bytes fetched, where `cuts` requests were ended before their
    /// asked end (a steal's victim, a replaced or faulted connection). Two counts, of two different things:
    /// - The engine's, exact: every needed byte is written once (`bytesTransferred`), and a cut-short request's
    ///   bytes past its split point are dropped — at most the steal slack per cut (the one chunk that crossed it).
    /// - The server's: at least the needed bytes, and at most those, plus what the engine dropped, plus what sat in
    ///   each cut connection's buffers when it was closed: the server's socket send buffer and the client's receive
    ///   buffer (at most the kernel's `tcp_wmem` and `tcp_rmem` maxima), and what the transport had read but not
    ///   yet offered. How full those were depends on how fast the client read (a sanitized, loaded run reads
    ///   slowly), not on the engine, so the server's count is bounded by them and not by the steal slack.
    static func expectCost(
        _ result: DownloadResult, needed: Int64, sent: Int64, cuts: Int, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let cuts = Int64(cuts)
        #expect(result.bytesTransferred == needed, "each byte written once", sourceLocation: sourceLocation)
        #expect(
            result.bytesDiscarded <= LaneTiming.stealSlack * cuts,
            "\(result.bytesDiscarded) bytes dropped past split points over \(cuts) cut request(s)",
            sourceLocation: sourceLocation)
        let buffered = cuts * (TestBackend.loopbackSocketLimit + TestBackend.selected.transportBufferLimit)
        #expect(
            sent >= needed && sent <= needed + result.bytesDiscarded + buffered,
            "sent \(sent) for \(needed) needed, \(result.bytesDiscarded) dropped, \(cuts) cut request(s)",
            sourceLocation: sourceLocation)
        if cuts == 0 { #expect(sent == needed, "without a cut every byte is sent once", sourceLocation: sourceLocation) }
    }

    static func settle(_ server: TestHTTPServer) async -> Bool {
        await blocking { server.waitUntilIdle(timeout: .seconds(30)) }
    }

    static func sha256(of bytes: [UInt8]) throws -> ExpectedChecksum {
        try ExpectedChecksum(parsing: "sha-256=" + ExpectedChecksum.hexString(DigestHasher.digest(.sha256, of: bytes)))
    }

    /// Starts a download, waits until `stalls` responses have stalled and the live record shows each segment
    /// written up to `written` (slot i is the i-th segment of the split), runs `beforeCancel`, then cancels: the
    /// download stops with exactly those bytes written, and the cancel saves them.
    static func interrupt(
        _ f: Fixture, options: DownloadOptions, stalls: Int, written: [Int64],
        beforeCancel: @Sendable () throws -> Void = {}, sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let request = f.request()
        let task = Task { try await f.download(request, options: options) }
        let server = f.server
        for stall in 0..<stalls {
            // Generous: when the whole suite starts at once on a loaded machine, a download's first bytes can take
            // half a minute (a trivial test then takes as long); the stall is a byte count, the wait only a bound.
            let stalled = await blocking { server.waitForStall(timeout: .seconds(120)) }
            #expect(stalled, "stall \(stall) of \(stalls) never came", sourceLocation: sourceLocation)
        }
        let paths = f.paths
        let arrived = await blocking {
            waitUntil { Self.liveWritten(paths).prefix(written.count).elementsEqual(written) }
        }
        #expect(
            arrived, "written \(Self.liveWritten(paths).prefix(written.count)), expected \(written)",
            sourceLocation: sourceLocation)
        try beforeCancel()
        task.cancel()
        let error = await #expect(throws: DownloadError.self, sourceLocation: sourceLocation) { try await task.value }
        #expect(error?.code == .cancelled, sourceLocation: sourceLocation)
        #expect(error?.isResumable == true, sourceLocation: sourceLocation)
        #expect(f.watch.violations.isEmpty, "\(f.watch.violations)", sourceLocation: sourceLocation)
        try #require(arrived, sourceLocation: sourceLocation)
        f.watch.resetEvents()
    }

    /// The live record's written offsets for the state file's nonce (empty if either is unreadable).
    static func liveWritten(_ paths: DownloadPaths) -> [Int64] {
        guard let state = try? StateFile.read(paths.state) else { return [] }
        return LiveRecord.read(at: paths.live, nonce: state.nonce) ?? []
    }

    /// Inverts the byte at `offset` in place.
    static func flipByte(in path: String, at offset: Int64) throws {
        let fd = open(path, O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { throw Errno(rawValue: errno) }
        defer { close(fd) }
        var byte: UInt8 = 0
        guard pread(fd, &byte, 1, off_t(offset)) == 1 else { throw Errno(rawValue: errno) }
        byte ^= 0xFF
        guard pwrite(fd, &byte, 1, off_t(offset)) == 1 else { throw Errno(rawValue: errno) }
    }

    /// Checks, without adding tokens (time 0 is earlier than anything the limiter has seen), that `limiter`'s
    /// bucket of `burst` lost `consumed` bytes: more than `consumed` − 4 KiB and at most `consumed` plus its refill
    /// at 1 byte/s.
    static func expectLimiter(
        _ limiter: RateLimiter, burst: Int64, consumed: Int64, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(
            limiter.take(Int(burst - consumed + 4096), now: 0) != nil,
            "the limiter was asked for fewer bytes than the download's \(consumed)", sourceLocation: sourceLocation)
        #expect(
            limiter.take(Int(burst - consumed), now: 0) == nil,
            "the limiter was asked for more bytes than the download's \(consumed)", sourceLocation: sourceLocation)
    }
}

extension DownloadState {
    /// Indices of the pieces with a recorded checksum.
    var recordedPieces: [Int] { pieces.indices.filter { pieces[$0] != nil } }
}

extension Watch {
    var notices: [String] { events.compactMap { if case .notice(let text) = $0 { text } else { nil } } }
}
