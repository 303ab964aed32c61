// The libcurl backend's own tests: only in a build with it (the Libcurl trait).
#if Libcurl
import Foundation
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchCurl
@testable import StitchTransport
import StitchLocks

/// The libcurl transport's pause (rate limiting) against the loopback test server: the bytes a delegate
/// refuses with `.wait` come again, in order, and a delegate that aborts is never called again.
///
/// The regression behind issue 10: libcurl hands back the bytes it held during a pause from inside
/// `curl_easy_pause`; when the delegate aborts then, libcurl frees the rest of what it held, returns the error
/// from `curl_easy_pause` and carries on reading. The transport ignored that return, so the transfer went on
/// and the engine wrote the following bytes where the dropped ones belonged (a shifted file, exit 0).
@Suite struct CurlPauseTests {
    /// Records every call; pauses or aborts as the script says, counting body calls.
    final class ScriptedDelegate: BodySink, @unchecked Sendable {
        struct Log {
            var received: [UInt8] = []
            var calls = 0
            var callsAfterAbort = 0
            var aborted = false
            var pauses = 0
        }
        let log = Locked(Log())
        /// Given the body call's index and whether it is a redelivery after a pause, what to do.
        let script: @Sendable (_ call: Int, _ afterPause: Bool) -> ReceiveDecision
        private let lastWasPause = Atomic<Bool>(false)

        init(_ script: @escaping @Sendable (_ call: Int, _ afterPause: Bool) -> ReceiveDecision) {
            self.script = script
        }

        func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision {
            let afterPause = lastWasPause.exchange(false, ordering: .relaxed)
            return log.withLock { log in
                if log.aborted {
                    log.callsAfterAbort += 1
                    return .abort
                }
                let decision = script(log.calls, afterPause)
                log.calls += 1
                switch decision {
                case .accepted: log.received.append(contentsOf: bytes)
                case .wait:
                    log.pauses += 1
                    lastWasPause.store(true, ordering: .relaxed)
                case .abort: log.aborted = true
                }
                return decision
            }
        }
    }

    static func perform(_ server: TestHTTPServer, _ delegate: ScriptedDelegate) async -> Result<Void, TransportError> {
        var options = TransportOptions()
        options.stallTimeout = 60
        let started = await CurlTransport.shared.start(
            TransportRequest(url: server.url("/file"), headers: HTTPHeaders(), options: options))
        switch started {
        case .failure(let error): return .failure(error)
        case .success(let response): return await response.receive(into: delegate)
        }
    }

    /// Abort on the redelivery that ends a pause: the transfer ends at once as aborted, and the delegate sees
    /// no further byte (today's main went on delivering, the rest of the paused buffer silently dropped).
    @Test(arguments: [0, 1, 5])
    func abortWhileBytesComeBackAfterAPause(pauseAt: Int) async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/file", file: .random(size: 8 << 20, seed: 3, etag: "\"p\""))
        let delegate = ScriptedDelegate { call, afterPause in
            if afterPause { return .abort }
            return call == pauseAt ? .wait(.milliseconds(1)) : .accepted
        }
        let result = await Self.perform(server, delegate)
        let log = delegate.log.withLock { $0 }
        #expect(log.aborted, "the script never aborted: \(log.calls) calls")
        #expect(log.callsAfterAbort == 0, "the transport delivered \(log.callsAfterAbort) chunks after an abort")
        guard case .failure(let error) = result else {
            Issue.record("an aborted transfer ended as a success")
            return
        }
        #expect(error.isAbortedBySink, "\(error)")
    }

    /// Pauses again and again (every other chunk, and twice in a row after some redeliveries): the bytes taken
    /// are the file, byte for byte.
    @Test func repeatedPausesKeepTheStreamExact() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 6 << 20, seed: 4, etag: "\"q\"")
        server.serve("/file", file: file)
        let delegate = ScriptedDelegate { call, afterPause in
            if afterPause { return call % 7 == 0 ? .wait(.milliseconds(1)) : .accepted }
            return call % 2 == 0 ? .wait(.milliseconds(1)) : .accepted
        }
        let result = await Self.perform(server, delegate)
        let log = delegate.log.withLock { $0 }
        guard case .success = result else {
            Issue.record("\(result)")
            return
        }
        #expect(log.pauses > 10, "only \(log.pauses) pauses")
        #expect(log.received.count == file.data.count)
        #expect(log.received == file.data)
    }
}
#endif  // Libcurl
