import Dispatch
import Foundation
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore

#if Libcurl
import StitchCurl
#endif

/// The two-phase transport: a response head goes to the engine, which decides (and does any disk work) off the
/// transport's thread while the body waits; every other transfer keeps moving meanwhile.
@Suite struct TwoPhaseTransportTests {
    /// A gate a test holds shut: `wait` blocks the calling thread until `open`.
    final class Gate: Sendable {
        private let entered = DispatchSemaphore(value: 0)
        private let released = DispatchSemaphore(value: 0)
        private let calls = Atomic<Int>(0)
        /// Blocks the first caller until `open()`; later callers pass.
        func pass() {
            guard calls.add(1, ordering: .relaxed).oldValue == 0 else { return }
            entered.signal()
            released.wait()
        }
        func waitUntilEntered(seconds: Int) -> Bool { entered.wait(timeout: .now() + .seconds(seconds)) == .success }
        func open() { released.signal() }
    }

    /// What a test holds of one download: its head decision (fresh, or a resume check, which opens, reopens and
    /// hashes files), the read of a resumed body's overlap from the part file (a slow disk), or the hashing of its
    /// body into the running digest of a checksum (a slow CPU).
    enum Held: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case decision, resumeDecision, overlapRead, hashing
        var testDescription: String { rawValue }
    }

    /// One download's head decision, or the disk read its resumed body starts with, is held on the blocking pool;
    /// another download over the same libcurl transport (the one thread every transfer shares) runs to the end
    /// meanwhile, and the held one then completes byte for byte. (The overlap was read, and the body hashed, on
    /// the transport's thread before; the other download then waited.)
    @Test(arguments: Held.allCases)
    func otherTransfersGoOnWhileADecisionIsHeld(held what: Held) async throws {
        let held = try Fixture()
        // Without a validator (no ETag) a resume asks again for the bytes before its point and compares them.
        let heldFile = ServedFile.random(size: 2 << 20, seed: 71, etag: what == .overlapRead ? nil : "\"held\"")
        if what != .decision && what != .hashing {
            // A partial to resume, so the held decision is a resume check.
            held.serve(heldFile, faults: .onRequest(0, .dropAfter(700_000)))
            var once = DownloadOptions.testing
            once.retry.maxRetries = 0
            once.connections = 1
            await #expect(throws: DownloadError.self) { try await held.download(held.request(), options: once) }
            #expect(fileExists(held.paths.state))
            held.watch.resetEvents()
        }
        held.serve(heldFile)
        let other = try Fixture()
        let otherFile = ServedFile.random(size: 8 << 20, seed: 72, etag: "\"other\"")
        other.serve(otherFile)

        let gate = Gate()
        var options = DownloadOptions.testing
        options.connections = 1
        switch what {
        case .overlapRead:
            options.overlapReadHook = { gate.pass() }
        case .hashing:
            options.hashHook = { gate.pass() }
        case .decision, .resumeDecision:
            options.headDecisionHook = { gate.pass() }
        }
        // A checksum to verify: the body is hashed into its digest as it comes.
        let checksum =
            what == .hashing
            ? try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: heldFile.data)) : nil
        let heldTask = Task { try await held.download(held.request(checksum: checksum), options: options) }
        #expect(await blocking { gate.waitUntilEntered(seconds: 120) }, "the held download never got a head")

        // Were the decision on the transport's thread, the other download could not move: a watchdog opens the
        // gate after 60 s so that the test fails instead of hanging.
        let watchdog = Task {
            try await Task.sleep(for: .seconds(60))
            gate.open()
            return true
        }
        let result = try await other.download(other.request())
        watchdog.cancel()
        #expect((try? await watchdog.value) == nil, "the other download waited for the held decision")
        try other.expectComplete(result, otherFile.data)
        #expect(!fileExists(held.dest), "the held download finished without its decision")

        gate.open()
        let heldResult = try await heldTask.value
        try held.expectComplete(heldResult, heldFile.data)
        if what == .hashing { #expect(heldResult.checksum == checksum, "\(heldResult)") }
        if what != .decision && what != .hashing { #expect(heldResult.resumedFrom > 0, "\(heldResult)") }
        if what == .overlapRead {
            // The resume asked again for bytes before its point (the overlap the held read compared).
            let resumed = try #require(held.server.requests.last?.header("Range"), "no range asked")
            #expect(resumed == "bytes=\(heldResult.resumedFrom - ResumePolicy.defaultOverlapWindow)-", "\(resumed)")
        }
    }

    /// A response dropped without a decision is cancelled (its connection closed), and the transport goes on: over
    /// every backend this build has. The server sends 8 MiB of the first response and then nothing until the client
    /// hangs up, so the test sees the cancel itself (the connection closing), whatever the machine's load; the
    /// stall is never released.
    @Test(arguments: TransportBackend.available)
    func aDroppedResponseIsCancelled(backend: TransportBackend) async throws {
        let transport = backend.testTransport
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 32 << 20, seed: 73, etag: "\"d\"")
        let sentBeforeStall = 8 << 20
        server.serve("/file", file: file, faults: .onRequest(0, .stallAfter(sentBeforeStall, then: .close)))
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        do {
            let started = await transport.start(request)
            guard case .success(let response) = started else {
                Issue.record("\(started)")
                return
            }
            #expect(response.head.status == 200)
        }
        let closed = await blocking { server.waitForOpenConnections(atMost: 0, timeout: .seconds(120)) }
        #expect(closed, "the dropped response's connection stayed open")
        #expect(server.bodyBytesSent <= sentBeforeStall)
        // The next request still gets its whole body.
        final class Collect: BodySink, @unchecked Sendable {
            var bytes: [UInt8] = []
            func receive(_ chunk: UnsafeRawBufferPointer) -> ReceiveDecision {
                bytes.append(contentsOf: chunk)
                return .accepted
            }
        }
        let sink = Collect()
        guard case .success(let response) = await transport.start(request) else {
            Issue.record("the second request failed")
            return
        }
        let outcome = await response.receive(into: sink)
        guard case .success = outcome else {
            Issue.record("\(outcome)")
            return
        }
        #expect(sink.bytes == file.data)
        // The dropped response's request, then the whole body in one (libcurl) or window by window (URLSession).
        let windows = (transport as? URLSessionTransport)?.window.map { (file.data.count + $0 - 1) / $0 } ?? 1
        #expect(server.requests(for: "/file").count == 1 + windows)
    }

    /// Client sockets this process holds that are connected to the loopback `port` (ESTABLISHED in /proc/net/tcp
    /// and tcp6, and named by one of this process's descriptors in /proc/self/fd).
    ///
    /// The descriptors and not only the socket's state: a process another test starts meanwhile (`Process.run`,
    /// posix_spawn) holds a copy of every descriptor from its fork until it closes them before its exec, and a
    /// socket closed here in that window stays ESTABLISHED until the child lets go of it (seen once in a whole
    /// suite's run; here 4 times in 30 with a thread spawning /bin/true beside the test).
    static func establishedSockets(toPort port: Int) -> Int {
        var inodes: [Substring] = []
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            // Read to the end: a /proc file says it is empty (its size is 0).
            guard let data = try? FileHandle(forReadingFrom: URL(fileURLWithPath: table)).readToEnd(),
                let text = String(data: data, encoding: .utf8)
            else { continue }
            for line in text.split(separator: "\n").dropFirst() {
                let fields = line.split(separator: " ")
                guard fields.count > 9, let remotePort = fields[2].split(separator: ":").last.flatMap({ Int($0, radix: 16) })
                else { continue }
                if remotePort == port, fields[3] == "01" { inodes.append(fields[9]) }
            }
        }
        guard !inodes.isEmpty else { return 0 }
        let held = Set(
            ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []).compactMap {
                try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0)
            })
        return inodes.filter { held.contains("socket:[\($0)]") }.count
    }

    /// A response cancelled before the engine takes its body (a lane's connection cut off while its head was being
    /// judged, or a head refused): the body asked for afterwards takes nothing, and returns `.cancelled` only once
    /// the transfer has ended: over libcurl its connection is closed by then; FoundationNetworking closes it a
    /// moment later on a queue of its own (`TransportBackend.connectionCloseLag`). On the old code the body failed
    /// at once, "a response body can be read only once", and the lane took its cut-off connection for a failed
    /// request (counted, retried after a backoff) and asked again while the old one was still open.
    @Test(arguments: TransportBackend.available, [false, true])
    func aBodyAskedForAfterACancelEndsWithTheConnection(backend: TransportBackend, receiving: Bool) async throws {
        // libcurl's loop thread is held below: a transport of its own (its thread ends with it), not the one every
        // other test shares.
        let transport: any HTTPTransport
        #if Libcurl
        let own = backend == .libcurl ? CurlTransport() : nil
        transport = own ?? backend.testTransport
        #else
        transport = backend.testTransport
        #endif
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 4 << 20, seed: 74, etag: "\"c\"")
        // Nothing of the body until the client hangs up: only the cancel ends the request.
        server.serve("/file", file: file, faults: .onRequest(0, .stallAfter(0, then: .close)))
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await transport.start(request) else {
            Issue.record("no head")
            return
        }
        #expect(server.activeRequests == 1)
        // The check below sees an open connection: this one, before the cancel.
        #expect(Self.establishedSockets(toPort: server.port) == 1)
        final class Refuse: BodySink, @unchecked Sendable {
            var bytes = 0
            func receive(_ chunk: UnsafeRawBufferPointer) -> ReceiveDecision {
                bytes += chunk.count
                return .accepted
            }
        }
        /// Holds the thread that calls it (libcurl's one loop thread) until the test opens it.
        final class Hold: BodySink, Sendable {
            let gate = Gate()
            let holding = Atomic<Bool>(true)
            func receive(_ chunk: UnsafeRawBufferPointer) -> ReceiveDecision {
                gate.pass()
                return .abort
            }
        }
        // Over libcurl the cancel and the body are handled on the loop thread, which another transfer's sink holds
        // here: a body that returned before the loop handled the cancel (with the connection still open) returns
        // while it is held. Without the hold the loop is quick enough to close the socket before the check reads
        // /proc, and a body returning too early went unseen.
        let hold = Hold()
        // However the test ends (a thrown sleep included), libcurl's loop thread is let go.
        defer { hold.gate.open() }
        let other = try TestHTTPServer()
        defer { other.stop() }
        let holder = Task<Void, Never> {
            guard backend.connectionCloseLag == .zero else { return }
            other.serve("/hold", file: .random(size: 1 << 20, seed: 75))
            let request = TransportRequest(
                url: other.url("/hold"), headers: HTTPHeaders(), options: TransportOptions())
            guard case .success(let response) = await transport.start(request) else { return }
            _ = await response.receive(into: hold)
        }
        if backend.connectionCloseLag == .zero {
            #expect(await blocking { hold.gate.waitUntilEntered(seconds: 60) }, "the holding transfer never received")
        }
        response.cancel()
        let sink = Refuse()
        let ended = Task {
            let outcome = receiving ? await response.receive(into: sink) : await response.discard()
            // Closed by then over libcurl; over URLSession a moment later (`TransportBackend.connectionCloseLag`):
            // how long is not asserted, only that it closes (the wait is a bound). Seen from this process's side:
            // the client's socket leaves ESTABLISHED when it is closed, while the server notices the hang-up only
            // when its thread next looks (a loaded machine made that later than the return).
            // The flag first: the /proc scan takes time, in which a body that returned too early could see the
            // hold end.
            let held = hold.holding.load(ordering: .acquiring)
            return (outcome, Self.establishedSockets(toPort: server.port), held)
        }
        if backend.connectionCloseLag == .zero {
            // A bound, not a trigger: a body that returns early does so at once; a right one waits for the loop.
            try await Task.sleep(for: .milliseconds(300))
            hold.holding.store(false, ordering: .releasing)
            hold.gate.open()
        }
        let (outcome, openAtReturn, returnedWhileHeld) = await ended.value
        await holder.value
        let closed = await blocking { waitUntil(timeout: 60) { server.activeRequests == 0 } }
        guard case .failure(let error) = outcome else {
            Issue.record("a cancelled response's body ended \(outcome)")
            return
        }
        #expect(error.isCancelled, "\(error)")
        #expect(backend.connectionCloseLag > .zero || !returnedWhileHeld,
            "the body returned before the transport's loop handled the cancel")
        #expect(backend.connectionCloseLag > .zero || openAtReturn == 0,
            "the body returned with the cancelled request's connection open")
        #expect(closed, "the cancelled request's connection stayed open")
        #expect(sink.bytes == 0)
    }
}
