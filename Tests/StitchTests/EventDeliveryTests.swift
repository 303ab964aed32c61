import Dispatch
import Foundation
import StitchLocks
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// A caller's `onEvent` runs on its download's own event queue: one blocked there holds up no other download (the
/// probe's notice used to be delivered on the transport's one thread, which every transfer shares).
@Suite struct EventDeliveryTests {
    @Test func aBlockedOnEventHoldsUpNoOtherDownload() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let first = ServedFile.random(size: 4 << 20, seed: 51, etag: "\"a\"")
        let second = ServedFile.random(size: 4 << 20, seed: 52, etag: "\"b\"")
        server.serve("/a.bin", file: first) { _, _ in .throttle(bytesPerSecond: 8 << 20) }
        server.serve("/b.bin", file: second)
        let directory = try TemporaryDirectory()

        struct Gate {
            var blocked = false
            var released = false
        }
        let gate = Locked(Gate())
        let release = DispatchSemaphore(value: 0)
        // The first download's probe finds one connection fast enough and says so: the callback then blocks.
        var options = DownloadOptions()
        options.singleConnectionRate = 1
        options.automaticConnectionStep = 256 << 10
        let blocking = Task {
            try await Downloader().download(
                DownloadRequest(url: server.url("/a.bin"), destination: .file(directory.path + "/a.bin")),
                options: options
            ) { event in
                guard case .notice(let text) = event, text.contains("one connection already brings") else { return }
                gate.withLock { $0.blocked = true }
                _ = release.wait(timeout: .now() + 20)
                gate.withLock { $0.released = true }
            }
        }
        #expect(await eventually { gate.withLock { $0.blocked } }, "the probe's notice never came")

        // Meanwhile another download runs to its end on the same transport.
        let other = try await Downloader().download(
            DownloadRequest(url: server.url("/b.bin"), destination: .file(directory.path + "/b.bin")))
        let stillBlocked = gate.withLock { !$0.released }
        #expect(stillBlocked, "the other download ended only once the blocked callback returned")
        release.signal()
        let done = try await blocking.value

        #expect(other.bytes == Int64(second.data.count) && done.bytes == Int64(first.data.count))
        let same = try readFile(directory.path + "/a.bin") == first.data && readFile(directory.path + "/b.bin") == second.data
        #expect(same)
    }
}
