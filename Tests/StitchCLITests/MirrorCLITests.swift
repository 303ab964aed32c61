import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Testing

/// `--mirror`, a list's TAB-separated URIs and the daemon's several URIs per addUri (issue 36): one file from
/// several servers at once, a mirror that differs dropped.
@Suite("mirrors")
struct MirrorCLITests {
    static let size = 6 << 20
    /// The first server's connections, slow enough that a loopback mirror's proof is over before they are.
    static let slow = FaultPolicy.always(.throttle(bytesPerSecond: 1 << 20))

    static func servedSegments(_ server: TestHTTPServer) -> Int {
        server.requests.filter { request in
            guard let range = request.header("Range"), range.hasPrefix("bytes=") else { return false }
            let parts = range.dropFirst(6).split(separator: "-")
            guard parts.count == 2, let a = Int64(parts[0]), let b = Int64(parts[1]) else { return false }
            return b - a + 1 > 64 << 10
        }.count
    }

    @Test func theCommandLineFetchesFromAMirrorAndDropsOneThatDiffers() async throws {
        let first = try TestHTTPServer()
        let same = try TestHTTPServer()
        let other = try TestHTTPServer()
        defer { [first, same, other].forEach { $0.stop() } }
        let data = ServedFile.randomBytes(count: Self.size, seed: 367)
        first.serve("/f.bin", file: ServedFile(data: data, etag: "\"a\""), faults: Self.slow)
        same.serve("/f.bin", file: ServedFile(data: data, etag: "\"b\""))
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
        first.serve("/f.bin", file: ServedFile(data: data, etag: "\"a\""), faults: Self.slow)
        same.serve("/f.bin", file: ServedFile(data: data, etag: "\"b\""))
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
