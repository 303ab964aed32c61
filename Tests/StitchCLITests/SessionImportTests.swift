import Foundation
import Glibc
import StitchRPC
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// `stitch serve --input-file SESSION`: an aria2c user's queue comes over once — real aria2c, killed mid-download,
/// leaves its session file and its partial (`FILE` + `FILE.aria2`); the daemon imports the session (GIDs, `out`,
/// `dir`, `split`, `header`, `pause`), adopts the partial on proof and finishes it byte-exact; entries it cannot take
/// are named and skipped; a restart with the same file imports nothing again, not even a download the user removed.
@Suite struct SessionImportTests {
    @Test func anAria2SessionComesOverOnce() async throws {
        let nginx = try await sharedNginx()
        let size = 64 << 20
        let name = "session-\(UUID().uuidString).bin"
        let bytes = ServedFile.randomBytes(count: size, seed: 91)
        try nginx.publish(name, bytes: bytes)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + name) }
        let small = "session-small-\(UUID().uuidString).bin"
        let smallBytes = ServedFile.randomBytes(count: 300_000, seed: 92)
        try nginx.publish(small, bytes: smallBytes)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + small) }
        let sandbox = try Sandbox("session")
        defer { sandbox.cleanup() }
        let folder = sandbox.path("dl")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let session = sandbox.path("aria2.session")
        try Data("\(nginx.slowURL(name))\n out=f.bin\n".utf8).write(to: URL(fileURLWithPath: sandbox.path("list")))

        // aria2c as its users run it: an input list, four connections, the session saved every second; killed once
        // its control file records three complete pieces and the session names the download.
        let control = folder + "/f.bin.aria2"
        let met = try await AdoptTests.runAndKill(
            "/usr/bin/aria2c",
            [
                "-q", "-x4", "-s4", "--auto-save-interval=1", "--file-allocation=prealloc", "--dir=\(folder)",
                "--save-session=\(session)", "--save-session-interval=1", "-i", sandbox.path("list"),
            ],
            in: sandbox.directory
        ) {
            (readBytes(control).flatMap { try? Aria2ControlFile(parsing: $0) }?.complete.count { $0 } ?? 0) >= 3
                && ((try? String(contentsOfFile: session, encoding: .utf8))?.contains("gid=") ?? false)
        }
        #expect(met, "aria2c did not record three pieces and its session")
        let parsed = try #require(readBytes(control).flatMap { try? Aria2ControlFile(parsing: $0) })
        let claimed = parsed.completeRanges.reduce(0) { $0 + $1.count }
        let written = try String(contentsOfFile: session, encoding: .utf8)
        let gid = try #require(written.split(separator: "\n").first { $0.hasPrefix(" gid=") }.map { String($0.dropFirst(5)) })
        #expect(written.contains(" out=f.bin") && written.contains(" split=4"), "\(written)")
        let servedBefore = nginx.accessLogLines(containing: name).count

        // What else an aria2 session may hold: a paused download with its own GID, folder, headers and limit; and
        // entries Stitch cannot take.
        let added = """
            # added by hand
            \(nginx.httpURL(small))\t\(nginx.slowURL(small))
             gid=00000000000000b1
             pause=true
             dir=\(folder)/sub
             header=X-From: aria2
             header=X-Two: 2
             max-download-limit=1M
            \(nginx.httpURL(small))
             dir=/etc
            ftp://127.0.0.1/x.bin
            \(nginx.httpURL(small))
             not an option line
            """
        try Data((written + added + "\n").utf8).write(to: URL(fileURLWithPath: session))

        var daemon = try await ServedDaemon(directory: folder, ["--input-file", session], sandbox: sandbox)
        try await daemon.waitForLog("imported")
        var log = daemon.process.stderrSoFar
        #expect(log.contains("2 downloads imported, 3 not imported"), "\(log)")
        #expect(log.contains("aria2.session:\(written.split(separator: "\n").count + 9):") && log.contains("/etc"), "\(log)")
        #expect(log.contains("only http and https"), "\(log)")
        #expect(log.contains("is not name=value"), "\(log)")

        let paused = try daemon.result("aria2.tellStatus", [.string("00000000000000b1")])
        #expect(paused.text("status") == "paused" && paused.text("dir") == folder + "/sub", "\(paused)")
        let pausedOptions = try daemon.result("aria2.getOption", [.string("00000000000000b1")])
        #expect(pausedOptions.text("max-download-limit") == String(1 << 20), "\(pausedOptions)")
        #expect(pausedOptions.text("header")?.contains("X-From: aria2") == true, "\(pausedOptions)")
        let uris = try daemon.result("aria2.getUris", [.string("00000000000000b1")]).array?.compactMap { $0.text("uri") }
        #expect(uris == [nginx.httpURL(small), nginx.slowURL(small)], "mirrors kept in order")

        // The partial is adopted (only what aria2c lacked is fetched, beside the samples) and ends byte-exact.
        let done = try await daemon.waitFor(gid, timeout: .seconds(180)) { $0.text("status") == "complete" }
        #expect(done.text("gid") == gid, "the GID is aria2c's")
        #expect(FileManager.default.contents(atPath: folder + "/f.bin").map(Array.init) == bytes)
        #expect(!FileManager.default.fileExists(atPath: control), "the control file is gone")
        // What the daemon fetched of the bytes aria2c had: only the adoption's samples (at most 32 of 64 KiB, and the
        // first probe). Counted from what nginx sent for each request, so a connection cut with bytes in flight
        // (the end game's steals) counts what it sent, and only where it overlaps aria2c's pieces.
        let records = nginx.accessLogLines(containing: name).dropFirst(servedBefore).filter { !$0.contains("ua=\"aria2") }
            .compactMap { ServedRecord(nginxLine: $0, size: size) }
        let refetched = records.reduce(0) { total, record in
            total + parsed.completeRanges.reduce(0) { sum, piece in
                let overlap = min(Int(piece.upperBound), record.sentRange.upperBound)
                    - max(Int(piece.lowerBound), record.sentRange.lowerBound)
                return sum + max(0, overlap)
            }
        }
        print("SessionImportTests: \(records.count) requests fetched again \(refetched) of the \(claimed) bytes aria2c had")
        #expect(!records.isEmpty && refetched <= 33 * (64 << 10), "fetched again \(refetched) of the \(claimed) bytes aria2c had: \(records)")

        // The user removes the paused one; a restart with the same file imports nothing again.
        #expect(try daemon.result("aria2.remove", [.string("00000000000000b1")]) == .string("00000000000000b1"))
        _ = await daemon.stop()
        daemon = try await ServedDaemon(directory: folder, ["--input-file", session], sandbox: sandbox)
        try await daemon.waitForLog("imported")
        log = daemon.process.stderrSoFar
        #expect(log.contains("0 downloads imported, 2 imported at an earlier start, 3 not imported"), "\(log)")
        let all = try daemon.result("stitch.tellAll", [.array([.string("gid"), .string("status")])]).array?
            .compactMap { entry in entry.text("gid").map { "\($0) \(entry.text("status") ?? "")" } }
        #expect(all == ["\(gid) complete"], "the paused one removed is not back: \(String(describing: all))")
        _ = await daemon.stop()
    }

    /// A session file that cannot be read stops the start (exit 64), before anything else happens.
    @Test func anUnreadableSessionStopsTheStart() async throws {
        let sandbox = try Sandbox("session")
        defer { sandbox.cleanup() }
        let process = try StitchProcess(
            ["serve", "--dir", sandbox.path("dl"), "--rpc-listen", "127.0.0.1:0", "--input-file", sandbox.path("none")],
            directory: sandbox.directory)
        let result = await process.wait(timeout: .seconds(60))
        #expect(result.status == 64 && result.stderr.contains("cannot read the session file"), "\(result)")
    }

    @Test func theSessionSyntax() {
        let session = Aria2Session(
            text: " stray=1\r\n# comment\r\nhttp://a/x\thttp://b/x\t\r\n gid=1\r\n\theader=A: b=c\r\n\r\nhttp://c/y\n  \n")
        #expect(session.strayLines == [1])
        #expect(session.entries.map(\.uris) == [["http://a/x", "http://b/x"], ["http://c/y"]])
        #expect(session.entries.first?.options.map { "\($0.name)=\($0.value)" } == ["gid=1", "header=A: b=c"])
        #expect(session.entries.map(\.line) == [3, 7])
    }
}
