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

/// The URLSession backend cannot pause a data task (FoundationNetworking's `suspend()` ends the transfer and
/// `resume()` sends the request again from its first byte), so it holds what a slow sink has not taken and, past
/// `yieldLimit`, lets go of the connection for the engine to ask for the rest. These tests make the sink slower
/// than the server with a rate limit and check that the file still ends byte-exact, that the extra requests resume
/// where the file got to under the validator (never from zero, never counted as retries), and that a response whose
/// rest cannot be asked for fails plainly past `holdLimit` rather than growing without bound.
@Suite struct URLSessionTransportTests {
    static let size = 512 << 10
    static let etag = "\"u1\""

    static func options(rate: Int64) -> DownloadOptions {
        var options = DownloadOptions.testing
        options.connections = 1
        options.rateLimiter = RateLimiter(bytesPerSecond: rate, burst: 16 << 10)
        return options
    }

    @Test func aSinkSlowerThanTheServerResumesWhereItGotTo() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 0x5E55, etag: Self.etag)
        f.serve(file)
        let transport = URLSessionTransport(window: nil, yieldLimit: 16 << 10, holdLimit: 8 << 20)
        let result = try await Downloader(transport: transport, clock: f.clock).download(
            f.request(), options: Self.options(rate: 128 << 10)
        ) { f.watch.record($0) }
        try f.expectComplete(result, file.data)

        let requests = f.server.requests
        // 512 KiB at 128 KiB/s against a loopback server that sends a thousand times faster (and still far faster on
        // a machine loaded by the rest of the suite): the held bytes pass 16 KiB many times.
        // How many let-gos there are depends on how far the server outruns the sink (the test above pins the
        // mechanism on byte counts); whatever their number, each resumes where the file got to.
        let starts = requests.dropFirst().map { request -> Int in
            guard let range = request.range, range.hasPrefix("bytes="), let dash = range.firstIndex(of: "-") else {
                return -1
            }
            return Int(range[range.index(range.startIndex, offsetBy: 6)..<dash]) ?? -1
        }
        #expect(requests.first?.range == nil)
        #expect(starts.allSatisfy { $0 > 0 }, "\(starts)")
        // Never back: a request let go of during a wait, before the sink took a byte, asks from the same offset.
        #expect(starts == starts.sorted(), "a range asked before the last: \(starts)")
        #expect(requests.dropFirst().allSatisfy { $0.header("If-Range") == Self.etag })
        #expect(f.watch.retries.isEmpty, "letting go counted as a retry: \(f.watch.retries)")
    }

    /// A sink that always waits and whose rest can be asked for again.
    final class WaitingSink: BodySink, @unchecked Sendable {
        let offers = Atomic<Int>(0)
        func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
            offers.add(1, ordering: .relaxed)
            return .wait(.milliseconds(5))
        }
        var canRequestRest: Bool { true }
    }

    /// On byte counts, at the transport: the server sends 1 MiB and then nothing until released; the sink takes
    /// nothing. What arrived before the sink's first wait is already past `yieldLimit`, so the transfer lets go at
    /// once — it does not wait for more bytes that a stalled server will not send — and says why.
    @Test func aWaitingSinkPastTheYieldLimitLetsGoWithoutMoreBytes() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 4 << 20, seed: 0x5E57, etag: Self.etag)
        server.serve("/file", file: file, faults: .always(.stallAfter(1 << 20, then: .close)))
        let transport = URLSessionTransport(window: nil, yieldLimit: 64 << 10, holdLimit: 8 << 20)
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await transport.start(request) else {
            Issue.record("no head")
            return
        }
        #expect(response.head.status == 200)
        #expect(server.waitForStall(timeout: .seconds(60)), "the server never sent its first MiB")
        let sink = WaitingSink()
        let outcome = await response.receive(into: sink)
        _ = server.releaseStalls()
        guard case .failure(let error) = outcome else {
            Issue.record("a sink that took nothing ended in \(outcome)")
            return
        }
        #expect(error.code == .yielded, "\(error)")
        #expect(error.message.contains("after 0 bytes"), "\(error.message)")
        #expect(sink.offers.load(ordering: .relaxed) >= 1)
        #expect(server.requests(for: "/file").count == 1)
    }

    /// A sink that takes everything, and says whether its rest can be asked for again.
    final class Collect: BodySink, @unchecked Sendable {
        let canRequestRest: Bool
        private let bytes = Locked<[UInt8]>([])
        init(canRequestRest: Bool) { self.canRequestRest = canRequestRest }
        var taken: [UInt8] { bytes.withLock { $0 } }
        func receive(_ chunk: UnsafeRawBufferPointer) -> ReceiveDecision {
            bytes.withLock { $0.append(contentsOf: chunk) }
            return .accepted
        }
    }

    /// Past `holdLimit` while the engine still decides what the head means (a resume check hashing a large saved
    /// prefix, say), the transfer stops reading and keeps what it held: a sink whose rest can be asked for gets
    /// those bytes, in order, and then `yielded` (the engine asks for the rest); any other sink gets the hold
    /// limit's failure and no byte. The let-go is awaited on its signal, not on time.
    @Test(arguments: [true, false])
    func aDecisionSlowerThanTheServerLetsGoAndKeepsWhatWasHeld(canRequestRest: Bool) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 4 << 20, seed: 0x5E58, etag: Self.etag)
        server.serve("/file", file: file)
        let letGo = DispatchSemaphore(value: 0)
        let transport = URLSessionTransport(window: nil, yieldLimit: 64 << 10, holdLimit: 256 << 10, onLetGo: { letGo.signal() })
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await transport.start(request) else {
            Issue.record("no head")
            return
        }
        #expect(await blocking { letGo.wait(timeout: .now() + 60) == .success }, "never let go while undecided")
        let sink = Collect(canRequestRest: canRequestRest)
        let outcome = await response.receive(into: sink)
        guard case .failure(let error) = outcome else {
            Issue.record("a body let go of before the decision ended in \(outcome)")
            return
        }
        let taken = sink.taken
        if canRequestRest {
            #expect(error.code == .yielded, "\(error)")
            #expect(!taken.isEmpty && taken.count < file.data.count, "\(taken.count) bytes")
            #expect(taken == Array(file.data.prefix(taken.count)), "the held bytes out of order")
            #expect(error.message.contains("after \(taken.count) bytes"), "\(error.message)")
        } else {
            #expect(error.code == .unsupported, "\(error)")
            #expect(taken.isEmpty)
        }
        #expect(server.requests(for: "/file").count == 1)
    }

    /// A sink that answers every offer the same way (counting them); its rest can be asked for again.
    final class Answer: BodySink, @unchecked Sendable {
        let decision: ReceiveDecision
        let offers = Atomic<Int>(0)
        init(_ decision: ReceiveDecision) { self.decision = decision }
        func receive(_ chunk: UnsafeRawBufferPointer) -> ReceiveDecision {
            offers.add(1, ordering: .relaxed)
            return decision
        }
        var canRequestRest: Bool { true }
    }

    /// Starts a 4 MiB download over a transport with a 256 KiB hold limit and waits (on its signal) until it has let
    /// go of the connection while the engine had not decided yet.
    static func letGoBeforeTheDecision() async throws -> (TestHTTPServer, any TransportResponse)? {
        let server = try TestHTTPServer()
        server.serve("/file", file: ServedFile.random(size: 4 << 20, seed: 0x5E59, etag: Self.etag))
        let letGo = DispatchSemaphore(value: 0)
        let transport = URLSessionTransport(window: nil, yieldLimit: 64 << 10, holdLimit: 256 << 10, onLetGo: { letGo.signal() })
        let request = TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: TransportOptions())
        guard case .success(let response) = await transport.start(request) else {
            Issue.record("no head")
            server.stop()
            return nil
        }
        #expect(await blocking { letGo.wait(timeout: .now() + 60) == .success }, "never let go while undecided")
        return (server, response)
    }

    /// A sink that aborts the bytes held for it after a let-go ends the body as aborted, not as let go of (which
    /// the engine would take as "ask for the rest" and count as no retry), and is not offered more.
    @Test func aSinksAbortOfHeldBytesIsNotALetGo() async throws {
        guard let (server, response) = try await Self.letGoBeforeTheDecision() else { return }
        defer { server.stop() }
        let sink = Answer(.abort)
        let outcome = await response.receive(into: sink)
        guard case .failure(let error) = outcome else {
            Issue.record("an aborted body ended in \(outcome)")
            return
        }
        #expect(error.code == .abortedBySink, "\(error)")
        #expect(sink.offers.load(ordering: .relaxed) == 1)
    }

    /// Cancelling the task while its sink waits out a long wait over bytes held after a let-go ends the body as
    /// cancelled at once, whether or not the let-go task's own end has come yet.
    @Test func aCancelDuringAWaitAfterALetGoEndsAtOnce() async throws {
        guard let (server, response) = try await Self.letGoBeforeTheDecision() else { return }
        defer { server.stop() }
        let sink = Answer(.wait(.seconds(120)))
        let receiving = Task { await response.receive(into: sink) }
        #expect(await blocking { waitUntil(timeout: 60) { sink.offers.load(ordering: .relaxed) >= 1 } })
        receiving.cancel()
        let outcome = await receiving.value
        guard case .failure(let error) = outcome else {
            Issue.record("a cancelled body ended in \(outcome)")
            return
        }
        #expect(error.code == .cancelled, "\(error)")
    }

    /// A sink that takes 16 KiB and then waits for a refill that never comes (the download's clock stands still), so
    /// the server outruns it on byte counts, however slowly the machine runs: past the 256 KiB hold limit, with no
    /// validator to ask for the rest under, the download fails plainly.
    @Test func aBodyWhoseRestCannotBeAskedForFailsPastTheHoldLimit() async throws {
        let f = try Fixture(timeStands: true)
        // No validator: the rest of the body cannot be asked for without risking another version's bytes.
        let file = ServedFile.random(size: Self.size, seed: 0x5E56)
        f.serve(file)
        let transport = URLSessionTransport(window: nil, yieldLimit: 16 << 10, holdLimit: 256 << 10)
        let outcome = await Result(catching: {
            try await Downloader(transport: transport, clock: f.clock).download(
                f.request(), options: Self.options(rate: 256 << 10)
            ) { f.watch.record($0) }
        })
        let error = try #require(outcome.failure as? DownloadError)
        #expect(error.code == .invalidOption, "\(error.code): \(error.message)")
        #expect(error.message.contains("URLSession transport cannot slow this server down"), "\(error.message)")
        #expect(!error.message.contains("\n"))
        #expect(!FileManager.default.fileExists(atPath: f.dest))
        #expect(f.server.requests.count == 1)
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}
