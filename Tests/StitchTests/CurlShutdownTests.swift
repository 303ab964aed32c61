// The libcurl backend's own tests: only in a build with it (the Libcurl trait).
#if Libcurl
import Foundation
import StitchLocks
import StitchTestSupport
import Synchronization
import Testing

@testable import StitchCurl
@testable import StitchTransport

/// A `CurlTransport` other than the shared one ends its thread: `shutdown()` (transfers in flight end as cancelled,
/// later requests fail at once) or its release.
@Suite struct CurlShutdownTests {
    /// Holds the body: the first chunk asks to wait a minute.
    final class HoldingSink: BodySink, Sendable {
        let chunks = Locked(0)
        func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
            chunks.withLock { $0 += 1 }
            return .wait(.seconds(60))
        }
    }

    static func request(_ server: TestHTTPServer) -> TransportRequest {
        var options = TransportOptions()
        options.stallTimeout = 120
        return TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: options)
    }

    /// Whether the kernel still has the thread `id` in this process.
    static func threadExists(_ id: Int32) -> Bool {
        FileManager.default.fileExists(atPath: "/proc/self/task/\(id)")
    }

    @Test func shutdownEndsTransfersInFlightAndTheThread() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/file", file: .random(size: 16 << 20, seed: 5, etag: "\"s\""))
        let transport = CurlTransport()
        let started = await transport.start(Self.request(server))
        let response = try started.get()
        #expect(response.head.status == 200)
        let sink = HoldingSink()
        async let body = response.receive(into: sink)
        #expect(await eventually { sink.chunks.withLock { $0 } > 0 })
        let thread = transport.loop.threadID.load(ordering: .acquiring)
        #expect(thread > 0 && Self.threadExists(thread))

        // Two at once (as a deinit and a caller may): both return, each once the loop has ended.
        async let one: Void = transport.shutdown()
        async let two: Void = transport.shutdown()
        _ = await (one, two)
        let result = await body
        guard case .failure(let error) = result else {
            Issue.record("a transfer in flight ended as \(result) after the shutdown")
            return
        }
        #expect(error.isCancelled && error.message.contains("shut down"), "\(error)")
        #expect(await eventually { !Self.threadExists(thread) })

        // Later requests fail at once, and a second shutdown returns.
        let later = await transport.start(Self.request(server))
        guard case .failure(let refused) = later else {
            Issue.record("a request after the shutdown was started")
            return
        }
        #expect(refused.message.contains("shut down"), "\(refused)")
        await transport.shutdown()
    }

    @Test func aReleasedTransportEndsItsThread() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/file", file: .random(size: 64 << 10, seed: 6, etag: "\"r\""))
        var transport: CurlTransport? = CurlTransport()
        let response = try await transport!.start(Self.request(server)).get()
        #expect(try await response.discard().get() == ())
        let thread = transport!.loop.threadID.load(ordering: .acquiring)
        #expect(thread > 0 && Self.threadExists(thread))
        transport = nil
        #expect(await eventually { !Self.threadExists(thread) })
    }
}
#endif  // Libcurl
