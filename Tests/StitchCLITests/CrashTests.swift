import Foundation
import Glibc
import Stitch
import StitchTestSupport
import Testing

/// `kill -9` at many points of a transfer, and a simulated reboot: the final file is byte-exact, DEST
/// never appears early, and a resumed run re-fetches almost nothing (only the written record's lag).
@Suite("stitch survives SIGKILL", .serialized)
struct CrashTests {
    /// What a resumed run may re-fetch: the written record trails the data by at most the transport's
    /// 512 KiB receive buffer, plus what sat in socket buffers when the process died. 1 MiB + generous slack.
    static let refetchBudget = 4 << 20

    @Test func sigkillAtSeededByteCounts() async throws {
        let seed = testSeed(0x5717_C4ED_0001)
        print("CrashTests.sigkillAtSeededByteCounts: seed \(seed) (STITCH_TEST_SEED=\(seed) repeats it)")
        var rng = SplitMix64(seed: seed)
        let size = 8 << 20
        let path = "/big.bin"
        let file = ServedFile.random(size: size, seed: seed, etag: "\"crash-\(seed)\"")
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.throttle = 1_700_000  // 8 MiB in about 5 s
        server.serve(path, file: file)
        let sandbox = try Sandbox("crash")
        defer { sandbox.cleanup() }
        let destination = sandbox.path("big.bin")
        // --timeout 300: the run is killed at the server's stall; a client that gave up on the stall first (its
        // 30 s default, reached under ThreadSanitizer in CI while the test waited to see the stall) would make a
        // second request and spoil the count.
        let arguments = [
            "get", server.url(path), "-o", "big.bin", "--checksum", "sha-256=\(sha256Hex(file.data))", "--timeout", "300",
        ]

        let thresholds = Self.killPoints(count: 24, in: (32 << 10)..<(size - (256 << 10)), minGap: 96 << 10, rng: &rng)
        print("CrashTests: kill points (bytes) \(thresholds)")
        var lastKillPosition: Int?
        var refetches: [Int] = []
        let started = ContinuousClock.now

        /// Checks the first request of a run against the position the previous run was killed at.
        func checkResume(_ start: Int, run: Int) {
            guard let killed = lastKillPosition else {
                #expect(start == 0, "the first run starts at zero")
                return
            }
            #expect(start <= killed, "run \(run) resumed at \(start), beyond the \(killed) bytes ever sent")
            #expect(
                start >= killed - Self.refetchBudget,
                "run \(run) resumed at \(start) after a kill at \(killed): re-fetches \(killed - start) bytes")
            refetches.append(killed - start)
        }

        for (run, threshold) in thresholds.enumerated() {
            let requestsBefore = server.requests(for: path).count
            let sentBefore = server.bodyBytesSent(for: path)
            // The server stops sending at the kill point (a byte count, not a race against a busy machine): the
            // process is killed there, mid-response, with everything sent so far in flight or written.
            server.setFaults(
                path,
                FaultPolicy { request, _ in
                    let start = rangeStart(request.header("Range")) ?? 0
                    return .stallAfter(max(1, threshold - start), then: .close)
                })
            let process = try sandbox.start(arguments)
            let asked = await waitUntil(timeout: .seconds(20)) {
                server.requests(for: path).count > requestsBefore || !process.isRunning
            }
            guard asked, server.requests(for: path).count > requestsBefore else {
                let result = await process.wait()
                Issue.record("run \(run) sent no request: \(result)")
                return
            }
            let request = server.requests(for: path)[requestsBefore]
            let start = try #require(rangeStart(request.range), "odd Range \(request.range ?? "")")
            checkResume(start, run: run)
            if start > 0 { #expect(request.header("If-Range") == file.etag) }

            // Kill once the server has stopped at the threshold (after at least one byte of this run).
            let target = max(threshold, start + 1)
            let stalled = (try? await offload { server.waitForStall(timeout: .seconds(30)) }) ?? false
            process.kill()
            let result = await process.wait()
            guard stalled, result.signal == SIGKILL else {
                Issue.record("run \(run) was to be killed at \(target) bytes but ended first: \(result)")
                return
            }
            server.releaseStalls()
            #expect(await server.settled())
            // One request per run: a second one means the client gave up on the first (its words say why).
            #expect(
                server.requests(for: path).count == requestsBefore + 1,
                "run \(run) made \(server.requests(for: path).count - requestsBefore) requests before the kill: \(result.stderr)")
            #expect(start + server.bodyBytesSent(for: path) - sentBefore == target, "killed at the stall: \(result.stderr)")
            let position = start + server.bodyBytesSent(for: path) - sentBefore
            lastKillPosition = position
            #expect(!fileExists(destination), "DEST appeared after the kill at \(position) bytes (run \(run))")
            #expect(fileExists(destination + ".stitch"), "no state after the kill at \(position) bytes (run \(run))")
        }

        // The last run goes to the end.
        server.setFaults(path, .none)
        let requestsBefore = server.requests(for: path).count
        let final = try await sandbox.run(arguments, timeout: .seconds(60))
        #expect(final.status == 0, "\(final)")
        let finalRequest = try #require(server.requests(for: path).dropFirst(requestsBefore).first)
        checkResume(try #require(rangeStart(finalRequest.range)), run: thresholds.count)
        let saved = try #require(readBytes(destination))
        #expect(saved.count == size)
        #expect(sha256Hex(saved) == sha256Hex(file.data))
        #expect(saved == file.data)
        #expect(sandbox.entries() == ["big.bin"], "leftovers: \(sandbox.entries())")

        let total = server.bodyBytesSent(for: path)
        print(
            "CrashTests: \(thresholds.count) kills, re-fetched per kill max \(refetches.max() ?? 0) bytes, "
                + "mean \(refetches.isEmpty ? 0 : refetches.reduce(0, +) / refetches.count), "
                + "\(total) bytes sent for \(size) (\(total - size) extra), "
                + "\(ContinuousClock.now - started)")
        #expect(total - size <= refetches.reduce(0, +), "extra bytes sent beyond the measured re-fetches")
        // Durable checkpoints come about once a second (~1.7 MB here); resuming from them alone would put the
        // typical re-fetch near 1 MB. The written record keeps it to the bytes in flight.
        let median = refetches.sorted()[refetches.count / 2]
        #expect(median <= 512 << 10, "median re-fetch \(median) bytes: resumes should use the written record")
    }

    @Test func rebootTrustsOnlyTheDurableExtent() async throws {
        let seed = testSeed(0x5717_C4ED_0002)
        print("CrashTests.rebootTrustsOnlyTheDurableExtent: seed \(seed)")
        let size = 8 << 20
        let path = "/reboot.bin"
        let file = ServedFile.random(size: size, seed: seed, etag: "\"reboot\"")
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve(path, file: file, faults: .always(.throttle(bytesPerSecond: 2_000_000)))
        let sandbox = try Sandbox("reboot")
        defer { sandbox.cleanup() }
        let destination = sandbox.path("reboot.bin")
        let statePath = destination + ".stitch"
        let partPath = destination + ".part"
        let arguments = ["get", server.url(path), "-o", "reboot.bin"]

        // Kill once 2.5 MiB have gone out, a checkpoint has made a prefix durable, and more than that
        // prefix is written (so there is an undurable tail to distrust).
        let process = try sandbox.start(arguments)
        let ready = await waitUntil(timeout: .seconds(20)) {
            guard process.isRunning, server.bodyBytesSent(for: path) >= 5 << 19 else { return false }
            guard let durable = Self.durableLength(statePath), durable > 0 else { return false }
            return fileSize(partPath) > durable + (256 << 10)
        }
        process.kill()
        let killed = await process.wait()
        try #require(ready && killed.signal == SIGKILL, "could not kill mid-way with a durable prefix: \(killed)")
        #expect(await server.settled())
        #expect(!fileExists(destination))

        // "Reboot": another boot id, and the page cache lost — the bytes past the durable extent are junk.
        let stateData = try #require(FileManager.default.contents(atPath: statePath))
        var state = try #require(try JSONSerialization.jsonObject(with: stateData) as? [String: Any])
        // An 8 MiB download uses one connection: one segment from 0, whose durable extent is the durable prefix.
        let segments = try #require(state["segments"] as? [[String: Any]], "no segments in \(state)")
        try #require(segments.count == 1, "expected one segment: \(segments)")
        #expect(segments[0]["start"] as? Int == 0)
        let durable = try #require(segments[0]["durable"] as? Int)
        let oldBoot = try #require(state["bootID"] as? String)
        state["bootID"] = oldBoot == "00000000-0000-4000-8000-000000000000"
            ? "11111111-1111-4111-8111-111111111111" : "00000000-0000-4000-8000-000000000000"
        try JSONSerialization.data(withJSONObject: state, options: [.prettyPrinted, .sortedKeys])
            .write(to: URL(fileURLWithPath: statePath), options: .atomic)
        let partSize = fileSize(partPath)
        #expect(partSize > durable)
        let handle = try #require(FileHandle(forWritingAtPath: partPath))
        try handle.seek(toOffset: UInt64(durable))
        try handle.write(contentsOf: Data(repeating: 0xA5, count: partSize - durable))
        try handle.close()
        print("CrashTests.reboot: durable \(durable) of \(partSize) written bytes; tail overwritten")

        server.setFaults(path, .none)
        let requestsBefore = server.requests(for: path).count
        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        #expect(rerun.stderr.contains("restarted"), "the user is told why less was trusted: \(rerun)")
        let request = try #require(server.requests(for: path).dropFirst(requestsBefore).first)
        let start = try #require(rangeStart(request.range))
        #expect(start <= durable, "after a reboot only the \(durable) durable bytes may be trusted, not \(start)")
        #expect(start > 0, "the durable prefix should be kept")
        let saved = try #require(readBytes(destination))
        #expect(saved.count == size)
        #expect(saved == file.data, "garbage from past the durable extent survived")
        #expect(sandbox.entries() == ["reboot.bin"], "leftovers: \(sandbox.entries())")
    }

    // MARK: Helpers

    /// `count` sorted kill points in `range`, at least `minGap` apart (so every run moves forward).
    static func killPoints(count: Int, in range: Range<Int>, minGap: Int, rng: inout SplitMix64) -> [Int] {
        var points = (0..<count).map { _ in Int.random(in: range, using: &rng) }.sorted()
        for index in points.indices.dropFirst() where points[index] < points[index - 1] + minGap {
            points[index] = points[index - 1] + minGap
        }
        // Keep the tail inside the range by pulling crowded points back, preserving the gap.
        var limit = range.upperBound - 1
        for index in points.indices.reversed() {
            points[index] = min(points[index], limit)
            limit = points[index] - minGap
        }
        return points
    }

    /// The durable extent of the state file's only segment (`segments[0].durable`), if it can be read right now
    /// and the download has exactly one segment starting at 0.
    static func durableLength(_ path: String) -> Int? {
        guard let data = FileManager.default.contents(atPath: path),
            let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
            let segments = object["segments"] as? [[String: Any]], segments.count == 1,
            segments[0]["start"] as? Int == 0
        else { return nil }
        return segments[0]["durable"] as? Int
    }
}
