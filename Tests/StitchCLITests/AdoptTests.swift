import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// `stitch get URL -o FILE --adopt` against partials left by real `wget -c`, `curl -C -` and `aria2c` runs from the
/// loopback nginx, each killed by SIGKILL once it had written a given number of bytes (docs/adopt.md): adopted and
/// finished byte-exact, fetching only what the partial lacked; a tampered one, and one of a file since changed,
/// downloaded again from zero; a damaged aria2 control file refused with both files left as they were.
@Suite("--adopt against wget, curl and aria2c partials")
struct AdoptTests {
    /// 24 MiB: 12 s from the rate-limited port (2 MB/s a connection) for wget and curl.
    static let size = 24 << 20
    /// aria2c fetches over four connections (four times as fast) and records its pieces once a second.
    static let aria2Size = 64 << 20

    /// A fresh file in nginx's document root, with the URLs of the fast and the rate-limited port.
    struct Published {
        let name: String
        let bytes: [UInt8]
        let url: String
        let slowURL: String
    }

    static func publish(_ nginx: Nginx, seed: UInt64, size: Int = AdoptTests.size) throws -> Published {
        let name = "adopt-\(UUID().uuidString).bin"
        let bytes = ServedFile.randomBytes(count: size, seed: seed)
        try nginx.publish(name, bytes: bytes)
        return Published(name: name, bytes: bytes, url: nginx.httpURL(name), slowURL: nginx.slowURL(name))
    }

    /// Runs `tool arguments…` in `directory` and kills it with SIGKILL once `condition` holds, polled every 2 ms on
    /// a thread of its own (a busy concurrency pool must not delay the kill until the tool has finished; it
    /// fetches from the rate-limited port). Returns whether the condition was met before the tool ended.
    static func runAndKill(
        _ tool: String, _ arguments: [String], in directory: String, when condition: @escaping @Sendable () -> Bool
    ) async throws -> Bool {
        let process = try ChildProcess(
            executable: tool, arguments: arguments, environment: ["PATH": "/usr/bin:/bin", "HOME": directory],
            directory: directory, standardOutput: .null, standardError: .null)
        return try await offload {
            let deadline = Date().addingTimeInterval(60)
            var met = false
            while Date() < deadline {
                if condition() {
                    met = true
                    break
                }
                if !process.isRunning { break }
                usleep(2000)
            }
            process.send(SIGKILL)
            _ = process.waitUntilExit()
            return met
        }
    }

    /// A partial left by `wget -c` killed after at least `bytes`.
    static func wgetPartial(_ file: Published, in sandbox: Sandbox, at bytes: Int) async throws -> Int {
        let path = sandbox.path("f.bin")
        let met = try await runAndKill(
            "/usr/bin/wget", ["-q", "-c", "-O", "f.bin", file.slowURL], in: sandbox.directory
        ) { fileSize(path) >= bytes }
        #expect(met, "wget did not get to \(bytes) bytes")
        return fileSize(sandbox.path("f.bin"))
    }

    /// Runs `stitch get URL -o f.bin --adopt --json` (without `--adopt` when not `adopting`) and returns the result,
    /// its events and its `done` event.
    static func adopt(
        _ url: String, in sandbox: Sandbox, adopting: Bool = true, extra: [String] = []
    ) async throws -> (CommandResult, [[String: Any]], [String: Any]?) {
        let result = try await sandbox.run(
            ["get", url, "-o", "f.bin", "--json"] + (adopting ? ["--adopt"] : []) + extra)
        let events = jsonLinesLenient(result.stdout)
        return (result, events, events.first { $0["event"] as? String == "done" })
    }

    @Test func wgetPartialIsAdoptedAndFinished() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 71)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let partial = try await Self.wgetPartial(file, in: sandbox, at: 3 << 20)
        #expect(readBytes(sandbox.path("f.bin")).map { Array(file.bytes[0..<$0.count]) == $0 } == true)

        let (result, events, done) = try await Self.adopt(file.url, in: sandbox)
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == file.bytes)
        #expect(sandbox.entries() == ["f.bin"])
        let notice = events.first { ($0["message"] as? String)?.contains("adopting") == true }
        #expect((notice?["message"] as? String)?.contains("left by wget or curl)") == true, "\(events)")
        #expect(done?["resumed_from"] as? Int == partial, "\(events)")
        // Only what the partial lacked came through the download (the samples are compared, not saved).
        #expect(done?["transferred"] as? Int == Self.size - partial, "\(events)")
        // The samples were asked for by range, the first with no validator to send, the others with If-Range.
        let samples = nginx.accessLogLines(containing: file.name).filter {
            $0.contains("stitch/") && $0.contains("range=\"bytes=") && !$0.contains("range=\"bytes=\(partial)-")
        }
        #expect(samples.count >= Adoption.minimumSamples, "\(samples)")
    }

    @Test func curlPartialIsAdoptedAndFinished() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 72)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        // A first run killed, then `curl -C -` continuing it, killed again: what a curl user leaves.
        let path = sandbox.path("f.bin")
        let first = try await Self.runAndKill(
            "/usr/bin/curl", ["-s", "-o", "f.bin", file.slowURL], in: sandbox.directory
        ) { fileSize(path) >= 1 << 20 }
        let firstSize = fileSize(path)
        let second = try await Self.runAndKill(
            "/usr/bin/curl", ["-s", "-C", "-", "-o", "f.bin", file.slowURL], in: sandbox.directory
        ) { fileSize(path) >= firstSize + (2 << 20) }
        #expect(first && second)
        let partial = fileSize(sandbox.path("f.bin"))
        #expect(readBytes(sandbox.path("f.bin")).map { Array(file.bytes[0..<$0.count]) == $0 } == true)

        let (result, events, done) = try await Self.adopt(file.url, in: sandbox)
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == file.bytes)
        #expect(sandbox.entries() == ["f.bin"])
        #expect(done?["resumed_from"] as? Int == partial, "\(events)")
        #expect(done?["transferred"] as? Int == Self.size - partial, "\(events)")
    }

    /// aria2c over four connections with its control file saved every second, killed once the control file
    /// records three complete pieces: the pieces it recorded are kept, the rest (in-flight pieces too) fetched.
    @Test func aria2PartialIsAdoptedAndFinished() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 73, size: Self.aria2Size)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let control = sandbox.path("f.bin.aria2")
        @Sendable func recorded() -> Aria2ControlFile? {
            readBytes(control).flatMap { try? Aria2ControlFile(parsing: $0) }
        }
        let met = try await Self.runAndKill(
            "/usr/bin/aria2c",
            ["-q", "-x4", "-s4", "--auto-save-interval=1", "--file-allocation=prealloc", "-o", "f.bin", file.slowURL],
            in: sandbox.directory
        ) { (recorded()?.complete.count { $0 } ?? 0) >= 3 }
        #expect(met, "aria2c did not record three pieces")
        let parsed = try #require(recorded())
        let claimed = parsed.completeRanges.reduce(0) { $0 + $1.count }
        #expect(parsed.totalLength == Int64(Self.aria2Size))
        #expect(claimed > 0 && claimed < Self.aria2Size)

        let (result, events, done) = try await Self.adopt(file.url, in: sandbox)
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == file.bytes)
        #expect(sandbox.entries() == ["f.bin"], "the control file is gone")
        let notice = events.first { ($0["message"] as? String)?.contains("adopting") == true }
        #expect((notice?["message"] as? String)?.contains("left by aria2") == true, "\(events)")
        #expect(done?["resumed_from"] as? Int == claimed, "\(events)")
        #expect(done?["transferred"] as? Int == Self.aria2Size - claimed, "\(events)")
    }

    /// A byte changed inside the partial's last 64 KiB (always among the samples): not adopted, downloaded from zero
    /// and saying why; the result is the server's file.
    @Test func tamperedPartialIsDownloadedAgain() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 74)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let partial = try await Self.wgetPartial(file, in: sandbox, at: 2 << 20)
        var bytes = try #require(readBytes(sandbox.path("f.bin")))
        bytes[partial - 100] ^= 0x5A
        try Data(bytes).write(to: URL(fileURLWithPath: sandbox.path("f.bin")))

        let (result, events, done) = try await Self.adopt(file.url, in: sandbox)
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == file.bytes)
        #expect(sandbox.entries() == ["f.bin"])
        let restart = events.first { $0["event"] as? String == "restart" }
        let reason = restart?["reason"] as? String ?? ""
        #expect(reason.contains("cannot adopt") && reason.contains("differs at byte \(partial - 100)"), "\(events)")
        #expect(done?["resumed_from"] as? Int == 0, "\(events)")
        #expect(done?["transferred"] as? Int == Self.size, "\(events)")
        #expect(result.stderr.contains("cannot adopt"), "said plainly: \(result.stderr)")
    }

    /// A partial that could not be adopted, whose download from zero is interrupted (SIGINT once 4 MiB are
    /// written): a rerun, even without `--adopt`, continues that download (the state says it replaces the file)
    /// and replaces the foreign file with the server's.
    @Test func declinedDownloadInterruptedIsContinuedAndReplacesTheFile() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 83)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let partial = try await Self.wgetPartial(file, in: sandbox, at: 1 << 20)
        var bytes = try #require(readBytes(sandbox.path("f.bin")))
        bytes[partial - 1] ^= 0xFF
        try Data(bytes).write(to: URL(fileURLWithPath: sandbox.path("f.bin")))

        let first = try sandbox.start(["get", file.url, "-o", "f.bin", "--adopt", "-c", "1", "--limit-rate", "2M"])
        let part = sandbox.path("f.bin.part")
        let written = await waitUntil(timeout: .seconds(60)) { fileSize(part) >= 4 << 20 }
        #expect(written)
        first.send(SIGINT)
        let interrupted = await first.wait()
        #expect(interrupted.status == 130, "\(interrupted)")
        #expect(readBytes(sandbox.path("f.bin")) == bytes, "the foreign file is left until the download is complete")

        let (result, events, done) = try await Self.adopt(file.url, in: sandbox, adopting: false)
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == file.bytes)
        #expect(sandbox.entries() == ["f.bin"])
        #expect((done?["resumed_from"] as? Int ?? 0) >= 4 << 20, "\(events)")
    }

    /// The file on the server changed since the partial was made (another length, other bytes): downloaded again.
    @Test func partialOfAChangedFileIsDownloadedAgain() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 75)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        _ = try await Self.wgetPartial(file, in: sandbox, at: 2 << 20)
        let shorter = ServedFile.randomBytes(count: 1 << 20, seed: 76)
        try nginx.publish(file.name, bytes: shorter)

        let (result, events, done) = try await Self.adopt(file.url, in: sandbox)
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == shorter)
        let reason = events.first { $0["event"] as? String == "restart" }?["reason"] as? String ?? ""
        #expect(reason.contains("but the server's file has \(1 << 20)"), "\(events)")
        #expect(done?["resumed_from"] as? Int == 0, "\(events)")
    }

    /// A control file cut short: refused in one line, exit 1, the partial and its control file exactly as they were.
    @Test func damagedControlFileIsRefused() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 77, size: Self.aria2Size)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let control = sandbox.path("f.bin.aria2")
        let met = try await Self.runAndKill(
            "/usr/bin/aria2c", ["-q", "--auto-save-interval=1", "-o", "f.bin", file.slowURL], in: sandbox.directory
        ) {
            readBytes(control).flatMap { try? Aria2ControlFile(parsing: $0) }.map { $0.complete.contains(true) } == true
        }
        #expect(met)
        let damaged = Array(try #require(readBytes(control)).dropLast(3))
        try Data(damaged).write(to: URL(fileURLWithPath: control))
        let before = readBytes(sandbox.path("f.bin"))

        let result = try await sandbox.run(["get", file.url, "-o", "f.bin", "--adopt"])
        #expect(result.status == 1, "\(result)")
        #expect(errorLines(result).count == 1, "\(result)")
        #expect(result.stderr.contains("not a usable aria2 control file"), "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == before)
        #expect(readBytes(control) == damaged)
        #expect(sandbox.entries() == ["f.bin", "f.bin.aria2"])
    }

    /// In a list: `adopt=true` with `out=` adopts; without `out=` that line fails alone; without `--adopt` or
    /// `adopt=true` a foreign file is still refused ("already exists").
    @Test func inputListAdoptsPerLine() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 78)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let partial = try await Self.wgetPartial(file, in: sandbox, at: 1 << 20)
        let copy = try #require(readBytes(sandbox.path("f.bin")))
        try Data(copy).write(to: URL(fileURLWithPath: sandbox.path("g.bin")))
        let list = """
            \(file.url)
              out=f.bin
              adopt=true
            \(file.url)
              adopt=true
            \(file.url)
              out=g.bin
            """
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        let result = try await sandbox.run(["get", "-i", "list.txt", "--json"])
        #expect(result.status == 1, "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == file.bytes)
        #expect(readBytes(sandbox.path("g.bin")) == copy, "not adopted, not replaced")
        #expect(result.stderr.contains("'adopt' needs 'out'"), "\(result)")
        #expect(result.stderr.contains("already exists"), "\(result)")
        let events = jsonLinesLenient(result.stdout)
        #expect(events.filter { $0["event"] as? String == "done" }.count == 1, "\(result.stdout)")
        let adopted = events.filter { ($0["message"] as? String)?.contains("adopting") == true }
        #expect(adopted.count == 1, "\(result.stdout)")
        #expect((adopted.first?["message"] as? String)?.contains("\(partial) of \(Self.size) bytes") == true)
    }

    /// `--adopt` with nothing foreign to adopt replaces nothing: a file stitch finished from another URL is refused
    /// as without it.
    @Test func nothingToAdoptReplacesNothing() async throws {
        let nginx = try await sharedNginx()
        let first = try Self.publish(nginx, seed: 79, size: 1 << 20)
        let second = try Self.publish(nginx, seed: 80, size: 1 << 20)
        defer {
            BackgroundRemoval.remove(nginx.documentRoot + "/" + first.name)
            BackgroundRemoval.remove(nginx.documentRoot + "/" + second.name)
        }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let fetched = try await sandbox.run(["get", first.url, "-o", "f.bin"])
        #expect(fetched.status == 0, "\(fetched)")
        let result = try await sandbox.run(["get", second.url, "-o", "f.bin", "--adopt"])
        #expect(result.status != 0, "\(result)")
        #expect(result.stderr.contains("already exists"), "\(result)")
        #expect(readBytes(sandbox.path("f.bin")) == first.bytes)
        #expect(sandbox.entries() == ["f.bin"])
    }

    /// An adopted partial whose finished file fails `--checksum` is kept (the user's bytes are not deleted), and
    /// the message says where.
    @Test func checksumMismatchKeepsTheAdoptedBytes() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 81)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let partial = try await Self.wgetPartial(file, in: sandbox, at: 1 << 20)
        let wrong = String(repeating: "0", count: 64)
        let result = try await sandbox.run(["get", file.url, "-o", "f.bin", "--adopt", "--checksum", "sha256:\(wrong)"])
        #expect(result.status == 1, "\(result)")
        #expect(result.stderr.contains("it is kept as \(sandbox.path("f.bin.part"))"), "\(result)")
        let kept = try #require(readBytes(sandbox.path("f.bin.part")))
        #expect(kept.count == Self.size && kept == file.bytes, "kept, with the adopted \(partial) bytes in it")
        #expect(!fileExists(sandbox.path("f.bin")))
    }

    /// A hole in the partial (it reads as zeros, nothing wrote it) is not claimed: only the bytes before it are
    /// adopted.
    @Test func holesAreNotAdopted() async throws {
        let nginx = try await sharedNginx()
        let file = try Self.publish(nginx, seed: 82)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + file.name) }
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        let path = sandbox.path("f.bin")
        try Data(file.bytes[0..<(1 << 20)]).write(to: URL(fileURLWithPath: path))
        #expect(truncate(path, off_t(3 << 20)) == 0)
        let (result, events, done) = try await Self.adopt(file.url, in: sandbox)
        #expect(result.status == 0, "\(result)")
        #expect(readBytes(path) == file.bytes)
        #expect(done?["resumed_from"] as? Int == 1 << 20, "\(events)")
    }

    @Test func adoptNeedsAFileName() async throws {
        let sandbox = try Sandbox("adopt")
        defer { sandbox.cleanup() }
        for arguments in [
            ["get", "http://127.0.0.1:9/f.bin", "--adopt"],
            ["get", "http://127.0.0.1:9/f.bin", "-o", "-", "--adopt"],
            ["get", "http://127.0.0.1:9/a", "http://127.0.0.1:9/b", "--adopt"],
        ] {
            let result = try await sandbox.run(arguments)
            #expect(result.status == 64, "\(arguments): \(result)")
            #expect(result.stderr.contains("--adopt"), "\(result)")
        }
    }
}
