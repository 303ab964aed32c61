import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Synchronization
import Testing

/// `--mirror`, a list's TAB-separated URIs and the daemon's several URIs per addUri (issue 36): one file from
/// several servers at once, a mirror that differs dropped.
@Suite("mirrors")
struct MirrorCLITests {
    static let size = 6 << 20

    static func servedSegments(_ server: TestHTTPServer) -> Int { server.requests.filter(isSegment).count }

    /// A request for a range of more than one sample's 64 KiB: a segment, not a proof's sample.
    static func isSegment(_ request: RecordedRequest) -> Bool {
        guard let range = request.header("Range"), range.hasPrefix("bytes=") else { return false }
        let parts = range.dropFirst(6).split(separator: "-")
        guard parts.count == 2, let a = Int64(parts[0]), let b = Int64(parts[1]) else { return false }
        return b - a + 1 > 64 << 10
    }

    @Test func theCommandLineFetchesFromAMirrorAndDropsOneThatDiffers() async throws {
        let first = try TestHTTPServer()
        let same = try TestHTTPServer()
        let other = try TestHTTPServer()
        defer { [first, same, other].forEach { $0.stop() } }
        let data = ServedFile.randomBytes(count: Self.size, seed: 367)
        // The first server answers its segment requests once the equal mirror was asked for one (so it was proven
        // and has work, however slow the machine): an explicit signal, not the first server's rate.
        let sameAsked = OneShot()
        defer { sameAsked.open() }
        first.serve("/f.bin", file: ServedFile(data: data, etag: "\"a\"")) { request, index in
            if index > 0, Self.isSegment(request) { sameAsked.wait(atMost: 60) }
            return .throttle(bytesPerSecond: 1 << 20)
        }
        same.serve("/f.bin", file: ServedFile(data: data, etag: "\"b\"")) { request, _ in
            if Self.isSegment(request) { sameAsked.open() }
            return .none
        }
        other.serve("/f.bin", file: ServedFile.random(size: Self.size, seed: 368, etag: "\"c\""))
        let sandbox = try Sandbox("mirrors")
        defer { sandbox.cleanup() }

        let run = try await sandbox.run([
            "get", first.url("/f.bin"), "-o", "f.bin", "-c", "4", "--mirror", same.url("/f.bin"), "--mirror",
            other.url("/f.bin"),
        ])
        #expect(run.status == 0, "\(run)")
        #expect(readBytes(sandbox.path("f.bin")) == data)
        #expect(run.stderr.contains("mirror \(same.url("/f.bin")) joins"), "\(run.stderr)")
        #expect(run.stderr.contains("mirror \(other.url("/f.bin")) dropped: its bytes differ"), "\(run.stderr)")
        #expect(Self.servedSegments(same) > 0)
        #expect(Self.servedSegments(other) == 0)

        let refused = try await sandbox.run(["get", first.url("/f.bin"), "-o", "-", "--mirror", same.url("/f.bin")])
        #expect(refused.status == 64 && refused.stderr.contains("drop the mirrors"), "\(refused)")
    }

    @Test func aListLineAndTheDaemonTakeSeveralURIsAsMirrors() async throws {
        let first = try TestHTTPServer()
        let same = try TestHTTPServer()
        defer { [first, same].forEach { $0.stop() } }
        let data = ServedFile.randomBytes(count: Self.size, seed: 369)
        // As above, once for the list's download and once for the daemon's: the first server's segments wait until
        // the mirror was asked for one in that phase.
        // Each phase's first request is never held: it learns the file (the URLSession build asks it as a window).
        let phase = Atomic<Int>(0)
        let phaseStart = Atomic<Int>(0)
        let asked = [OneShot(), OneShot()]
        defer { asked.forEach { $0.open() } }
        first.serve("/f.bin", file: ServedFile(data: data, etag: "\"a\"")) { request, index in
            if index > phaseStart.load(ordering: .acquiring), Self.isSegment(request) {
                asked[phase.load(ordering: .acquiring)].wait(atMost: 60)
            }
            return .throttle(bytesPerSecond: 1 << 20)
        }
        same.serve("/f.bin", file: ServedFile(data: data, etag: "\"b\"")) { request, _ in
            if Self.isSegment(request) { asked[phase.load(ordering: .acquiring)].open() }
            return .none
        }
        let sandbox = try Sandbox("mirrors")
        defer { sandbox.cleanup() }
        mkdir(sandbox.path("dl"), 0o755)
        let list = "\(first.url("/f.bin"))\t\(same.url("/f.bin"))\n  out=list.bin\n  split=4\n"
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        let batch = try await sandbox.run(["get", "-i", sandbox.path("list.txt"), "-d", sandbox.path("dl")])
        #expect(batch.status == 0 && readBytes(sandbox.path("dl/list.bin")) == data, "\(batch)")
        #expect(!batch.stderr.contains("not supported"), "\(batch.stderr)")
        let fromList = Self.servedSegments(same)
        #expect(fromList > 0)

        phaseStart.store(first.requests.count, ordering: .releasing)
        phase.store(1, ordering: .releasing)
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), [], sandbox: sandbox)
        let gid = try #require(
            try daemon.result(
                "aria2.addUri",
                [
                    .array([.string(first.url("/f.bin")), .string(same.url("/f.bin"))]),
                    .object([("out", .string("rpc.bin")), ("split", .string("4"))]),
                ]
            ).string)
        let done = try await daemon.waitFor(gid) { ["complete", "error"].contains($0.text("status")) }
        #expect(done.text("status") == "complete", "\(done)")
        #expect(readBytes(sandbox.path("dl/rpc.bin")) == data)
        #expect(Self.servedSegments(same) > fromList, "the daemon's download fetched segments from the mirror")
        _ = await daemon.stop()
    }
}
