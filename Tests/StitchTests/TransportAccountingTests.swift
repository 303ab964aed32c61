// The libcurl backend's own tests: only in a build with it (the Libcurl trait).
#if Libcurl
import CCurl
import Foundation
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchCurl
@testable import StitchTransport

/// The per-transfer bookkeeping in `CurlTransfer` that decides a stall, an oversized head and a discarded body,
/// fed header lines and body chunks directly (no network, no clock: `lastActivity` is compared, not waited for).
@Suite struct TransportAccountingTests {
    final class Sink: BodySink, @unchecked Sendable {
        func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision { .accepted }
    }

    enum Decision { case receive, discard }

    static func transfer(minimum: Int = 1024) -> CurlTransfer {
        var options = TransportOptions()
        options.stallMinimumBytes = minimum
        return CurlTransfer(
            request: TransportRequest(url: "http://127.0.0.1:1/x", headers: HTTPHeaders(), options: options))
    }

    /// The end of the head, and the engine's decision as the event loop applies it.
    static func endHead(_ transfer: CurlTransfer, _ decision: Decision = .receive) {
        header(transfer, "")
        transfer.phase = decision == .receive ? .receiving(Sink()) : .discarding
    }

    @discardableResult
    static func header(_ transfer: CurlTransfer, _ text: String) -> Bool {
        Array((text + "\r\n").utf8).withUnsafeBytes { transfer.receiveHeaderLine($0) }
    }

    static func body(_ transfer: CurlTransfer, _ count: Int) -> Int {
        [UInt8](repeating: 7, count: count).withUnsafeBytes { transfer.receiveBody($0) }
    }

    /// Interim 1xx heads count towards the head limit with the final one: 20 heads of ~15 KB are refused at the
    /// 18th (256 KiB), as a failure that is not retried.
    @Test func interimHeadsShareTheHeadLimit() {
        let t = Self.transfer()
        let pad = "X-Pad: " + String(repeating: "p", count: 15_000)
        var refusedAt: Int?
        for index in 0..<20 where refusedAt == nil {
            if !Self.header(t, "HTTP/1.1 102 Processing") || !Self.header(t, pad) || !Self.header(t, "") {
                refusedAt = index
            }
        }
        #expect(refusedAt == 17, "refused at head \(String(describing: refusedAt))")
        guard case .failure(let error) = t.outcome(for: CURLE_WRITE_ERROR) else {
            Issue.record("an oversized head was not a failure")
            return
        }
        #expect(!error.isRetryable)
        #expect(error.message.contains("256 KiB"))
    }

    /// A whole head is progress however small, and a body shorter than the stall minimum is progress once it is
    /// all there; without a length the minimum holds.
    @Test(arguments: [("500", 500), (nil, 1024), ("0", 1), ("99999999", 1024)] as [(String?, Int)])
    func activityThresholdFollowsTheBodyLength(_ length: String?, _ threshold: Int) {
        let t = Self.transfer()
        t.lastActivity = -1
        Self.header(t, "HTTP/1.1 200 OK")
        if let length { Self.header(t, "Content-Length: \(length)") }
        #expect(t.lastActivity == -1, "a few header bytes are not yet progress")
        Self.endHead(t)
        #expect(t.lastActivity > 0, "the end of the head is progress")
        #expect(t.activityThreshold == threshold)
        guard threshold > 1 else { return }
        t.lastActivity = -1
        #expect(Self.body(t, threshold - 1) == threshold - 1)
        #expect(t.lastActivity == -1 && t.bytesSinceActivity == threshold - 1)
        #expect(Self.body(t, 1) == 1)
        #expect(t.lastActivity > 0 && t.bytesSinceActivity == 0)
    }

    /// A body the engine does not want (a redirect's, an error page) is read up to 64 KiB for the connection's
    /// sake, then the transfer ends — successfully: the head said everything.
    @Test func discardedBodiesAreCapped() {
        let t = Self.transfer()
        Self.header(t, "HTTP/1.1 503 Service Unavailable")
        Self.endHead(t, .discard)
        var taken = 0
        while true {
            let n = Self.body(t, 4096)
            if n == 0 { break }
            taken += n
            if taken > 1 << 20 { break }
        }
        #expect(taken == CurlTransfer.maximumDiscardedBytes)
        guard case .success = t.outcome(for: CURLE_WRITE_ERROR) else {
            Issue.record("a capped discard should end the transfer as done")
            return
        }
    }

    /// Body bytes that come before the engine has decided are held (libcurl pauses and offers them again), and
    /// waiting for the decision is not a stall, however long it takes.
    @Test func bodyWaitsForTheDecision() {
        let t = Self.transfer()
        Self.header(t, "HTTP/1.1 200 OK")
        Self.header(t, "")
        #expect(Self.body(t, 4096) == Int(CURL_WRITEFUNC_PAUSE))
        #expect(t.pausedForDecision)
        t.requestSent = true
        t.lastActivity = -1_000_000
        #expect(t.checkStall(), "the engine deciding counted as a stall")
        t.phase = .receiving(Sink())
        #expect(Self.body(t, 4096) == 4096)
        t.lastActivity = -1_000_000
        #expect(!t.checkStall(), "a silent transfer after the decision is a stall")
    }
}
#endif  // Libcurl
