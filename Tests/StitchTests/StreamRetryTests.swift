import Foundation
import Glibc
import StitchLocks
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// `Downloader.stream` and `--adopt`'s samples retry through the download's own rules (``AttemptStateMachine``):
/// `Retry-After`, backoff with jitter, a retry budget that progress renews; a stream still never restarts once
/// bytes went out.
@Suite struct StreamRetryTests {
    /// Streams `transport`'s file into a temporary file; returns what was written and the clock's recorded sleeps.
    static func stream(
        _ transport: ScriptedTransport, options: DownloadOptions = DownloadOptions()
    ) async throws -> (result: Result<Int64, DownloadError>, bytes: [UInt8], sleeps: [Double], events: [DownloadEvent]) {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/out.bin"
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        try #require(fd >= 0)
        defer { close(fd) }
        let clock = FakeClock()
        let events = Locked<[DownloadEvent]>([])
        let result: Result<Int64, DownloadError>
        do {
            result = .success(
                try await Downloader(transport: transport, clock: clock).stream(
                    "http://scripted.test/f.bin", options: options, to: .fileDescriptor(fd)
                ) { event in events.withLock { $0.append(event) } })
        } catch {
            result = .failure(error)
        }
        return (result, try readFile(path), clock.sleeps, events.withLock { $0 })
    }

    /// A 503 with `Retry-After: 7` mid-stream waits the seven seconds the server asked for (the stream used to wait
    /// its own fixed backoff, one second), then continues from the byte it got to.
    @Test func retryAfterIsHonoured() async throws {
        let file = ServedFile.random(size: 1 << 20, seed: 41, etag: "\"t\"")
        let transport = ScriptedTransport(file: file) { _, index in
            switch index {
            case 0: return .serve(cutAfter: 300_000)
            case 1: return .status(503, retryAfter: "7")
            default: return .serve()
            }
        }
        let run = try await Self.stream(transport)
        #expect(try run.result.get() == Int64(file.data.count))
        let same = run.bytes == file.data
        #expect(same)
        #expect(run.sleeps.count == 2, "\(run.sleeps)")
        #expect(run.sleeps.last == 7, "\(run.sleeps)")
        #expect(transport.requests.map(\.range) == [nil, "bytes=300000-", "bytes=300000-"])
    }

    /// Backoff with the download's jitter: each wait is half its doubling step plus a random part of the other half.
    /// Past five retries without progress the stream gives up, saying how many bytes went to the output.
    @Test func backoffHasJitterAndTheBudgetRunsOut() async throws {
        let file = ServedFile.random(size: 1 << 20, seed: 42, etag: "\"u\"")
        let transport = ScriptedTransport(file: file) { _, index in
            index == 0 ? .serve(cutAfter: 200_000) : .status(503)
        }
        var options = DownloadOptions()
        options.retry.baseDelay = 1
        let run = try await Self.stream(transport, options: options)
        guard case .failure(let error) = run.result else {
            Issue.record("a stream that never got its bytes succeeded")
            return
        }
        #expect(error.code == .httpStatus, "\(error)")
        #expect(error.message.contains("200000 bytes went to the output"), "\(error)")
        // The cut is the first failure (its 200,000 bytes renewed the budget), the 503s the next four; the fifth
        // 503 is one too many. Five waits, each within its doubling step.
        let steps = [1.0, 2, 4, 8, 16]
        #expect(run.sleeps.count == 5, "\(run.sleeps)")
        for (sleep, step) in zip(run.sleeps, steps) {
            #expect(sleep >= step / 2 && sleep <= step, "\(run.sleeps)")
        }
        let same = run.bytes == Array(file.data.prefix(200_000))
        #expect(same)
    }

    /// `--adopt`'s samples retry through the same rules: a 503 with `Retry-After: 3` on a sample waits the three
    /// seconds (it used to wait a fixed second); the partial is then adopted and the download finished byte-exact.
    @Test func adoptionSamplesHonourRetryAfter() async throws {
        let file = ServedFile.random(size: 4 << 20, seed: 43, etag: "\"a\"")
        let refused = Locked(false)
        let transport = ScriptedTransport(file: file) { request, _ in
            // The first sample (a ranged request before any download request) is refused once.
            let first = request.headers["Range"] != nil && refused.withLock { done in
                defer { done = true }
                return !done
            }
            return first ? .status(503, retryAfter: "3") : .serve()
        }
        let directory = try TemporaryDirectory()
        let destination = directory.path + "/f.bin"
        let partial = 1 << 20
        try writeFile(destination, Array(file.data.prefix(partial)))
        var request = DownloadRequest(url: "http://scripted.test/f.bin", destination: .file(destination))
        request.adopt = true
        let clock = FakeClock()
        let result = try await Downloader(transport: transport, clock: clock).download(request)
        #expect(result.resumedFrom == Int64(partial))
        let same = try readFile(destination) == file.data
        #expect(same)
        #expect(clock.sleeps.contains(3), "\(clock.sleeps)")
    }
}
