import Foundation
import Glibc
import StitchRPC
import StitchTestSupport
import Testing

/// `stitch add | ls | pause | resume | rm | stats | watch` against a real `stitch serve` (issue 14).
@Suite("stitch client commands")
struct ClientCommandsTests {
    /// Runs a client command against `daemon`, with no config file unless the environment names one.
    private static func client(
        _ arguments: [String], _ daemon: ServedDaemon?, in sandbox: Sandbox, environment: [String: String] = [:]
    ) async throws -> CommandResult {
        var flags: [String] = []
        if let daemon { flags = ["--rpc-url", "http://127.0.0.1:\(daemon.port)/jsonrpc"] }
        var environment = environment
        if environment["STITCH_CLIENT_CONFIG"] == nil { environment["STITCH_CLIENT_CONFIG"] = sandbox.path("no-config") }
        return try await sandbox.run(arguments + flags, environment: environment)
    }

    private static func status(_ gid: String, _ daemon: ServedDaemon) throws -> String {
        try daemon.result("aria2.tellStatus", [.string(gid), .array([.string("status")])])["status"]?.string ?? "?"
    }

    /// The whole round: add two downloads (one held slow), list them, pause and resume the slow one, watch the
    /// other to completion (byte-exact), remove the slow one, and read the statistics.
    @Test func addListPauseResumeWatchRemove() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let fast = ServedFile.random(size: 2 << 20, seed: 151, etag: "\"f\"")
        let slow = ServedFile.random(size: 8 << 20, seed: 152, etag: "\"s\"")
        server.serve("/fast.bin", file: fast, faults: .always(.throttle(bytesPerSecond: 1 << 20)))
        server.serve("/slow.bin", file: slow, faults: .always(.throttle(bytesPerSecond: 64 << 10)))
        let sandbox = try Sandbox("client")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)

        let added = try await Self.client(["add", server.url("/fast.bin"), "-o", "one.bin"], daemon, in: sandbox)
        #expect(added.status == 0, "\(added)")
        let fastGID = try #require(added.stdoutLines.first)
        #expect(fastGID.count == 16 && fastGID.allSatisfy(\.isHexDigit), "a GID on stdout: \(added)")
        #expect(added.stderr.contains("added \(server.url("/fast.bin")) as \(fastGID)"), "\(added)")
        let second = try await Self.client(["add", server.url("/slow.bin"), "-c", "1"], daemon, in: sandbox)
        let slowGID = try #require(second.stdoutLines.first, "\(second)")

        let listed = try await Self.client(["ls", "--json"], daemon, in: sandbox)
        #expect(listed.status == 0, "\(listed)")
        let rows = try #require(jsonLines(listed.stdout), "\(listed)")
        #expect(Set(rows.compactMap { $0["gid"] as? String }) == [fastGID, slowGID], "\(listed)")
        let table = try await Self.client(["ls"], daemon, in: sandbox)
        #expect(table.stdoutLines.first?.hasPrefix("gid") == true, "\(table)")
        #expect(table.stdoutLines.contains { $0.hasPrefix(slowGID) && $0.hasSuffix("slow.bin") }, "\(table)")

        let paused = try await Self.client(["pause", slowGID], daemon, in: sandbox)
        #expect(paused.status == 0 && paused.stderr.contains("paused \(slowGID)"), "\(paused)")
        #expect(try Self.status(slowGID, daemon) == "paused")
        let resumed = try await Self.client(["resume", slowGID], daemon, in: sandbox)
        #expect(resumed.status == 0, "\(resumed)")
        #expect(["active", "waiting"].contains(try Self.status(slowGID, daemon)))

        let watched = try await Self.client(["watch", fastGID], daemon, in: sandbox)
        #expect(watched.status == 0, "\(watched)")
        #expect(try Self.status(fastGID, daemon) == "complete")
        #expect(readBytes(sandbox.path("dl/one.bin")) == fast.data)

        // Watching everything until Ctrl-C: 130, as an interrupted wait is; the download carries on.
        let watching = try sandbox.start(
            ["watch", "--rpc-url", "http://127.0.0.1:\(daemon.port)/jsonrpc"],
            environment: ["STITCH_CLIENT_CONFIG": sandbox.path("no-config")])
        #expect(await waitUntil(timeout: .seconds(60)) { watching.stderrSoFar.contains("1 active") }, "\(watching.stderrSoFar)")
        watching.send(SIGINT)
        let interrupted = await watching.wait()
        #expect(interrupted.status == 130, "\(interrupted)")
        #expect(try Self.status(slowGID, daemon) == "active")

        let stats = try await Self.client(["stats"], daemon, in: sandbox)
        #expect(stats.status == 0, "\(stats)")
        #expect(stats.stdout.hasPrefix("1 active, 0 waiting, 1 stopped"), "\(stats)")

        let removed = try await Self.client(["rm", slowGID, fastGID], daemon, in: sandbox)
        #expect(removed.status == 0, "\(removed)")
        #expect(removed.stderr.contains("removed \(slowGID)") && removed.stderr.contains("removed \(fastGID)"))
        let after = try await Self.client(["ls", "--json"], daemon, in: sandbox)
        let left = (jsonLines(after.stdout) ?? []).compactMap { $0["gid"] as? String }
        #expect(!left.contains(fastGID), "a finished download's result is removed: \(after)")
        #expect(readBytes(sandbox.path("dl/one.bin")) == fast.data, "removing a result keeps the file")
        _ = await daemon.stop()
    }

    /// One secret file read the same way by the daemon and the client: spaces and line ends around the secret are
    /// dropped by both (the daemon kept a trailing space the client dropped, so the two never agreed).
    @Test func oneSecretFileServesBothEnds() async throws {
        let sandbox = try Sandbox("client")
        defer { sandbox.cleanup() }
        try Data("s3cret-token \t\r\n".utf8).write(to: URL(fileURLWithPath: sandbox.path("secret")))
        let daemon = try await ServedDaemon(
            directory: sandbox.path("dl"), ["--rpc-secret-file", sandbox.path("secret")],
            environment: ["STITCH_TEST_WRONG_SECRET_DELAY": "0.01"], sandbox: sandbox)
        let stats = try await Self.client(["stats", "--rpc-secret-file", sandbox.path("secret")], daemon, in: sandbox)
        #expect(stats.status == 0, "\(stats)")
        let bare = try await Self.client(
            ["stats"], daemon, in: sandbox, environment: ["STITCH_RPC_SECRET": "s3cret-token"])
        #expect(bare.status == 0, "the secret without the spaces: \(bare)")
        _ = await daemon.stop()
    }

    /// What goes wrong is said in one line with its exit status: an unknown GID (1), no daemon there (75), a
    /// secret on the command line (64), a daemon with a secret asked without it (1) — and with it from the
    /// config file the client names (0).
    @Test func failuresAndTheSecret() async throws {
        let sandbox = try Sandbox("client")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(
            directory: sandbox.path("dl"),
            environment: ["STITCH_RPC_SECRET": "s3cret-token", "STITCH_TEST_WRONG_SECRET_DELAY": "0.01"],
            sandbox: sandbox)

        let unknown = try await Self.client(
            ["pause", "ffffffffffffffff"], daemon, in: sandbox, environment: ["STITCH_RPC_SECRET": "s3cret-token"])
        #expect(unknown.status == 1, "\(unknown)")
        #expect(errorLines(unknown).count == 1, "\(unknown)")

        let noSecret = try await Self.client(["ls"], daemon, in: sandbox)
        #expect(noSecret.status == 1, "\(noSecret)")
        #expect(noSecret.stderr.contains("refused the secret"), "\(noSecret)")

        try Data("s3cret-token\n".utf8).write(to: URL(fileURLWithPath: sandbox.path("secret")))
        // CRLF line ends, as an editor on Windows writes them.
        let config = "# the client's config\r\nrpc-url = \"http://127.0.0.1:\(daemon.port)/jsonrpc\"\r\n"
            + "rpc-secret-file = \"\(sandbox.path("secret"))\"\r\n"
        try Data(config.utf8).write(to: URL(fileURLWithPath: sandbox.path("client.toml")))
        let configured = try await Self.client(
            ["stats", "--json"], nil, in: sandbox, environment: ["STITCH_CLIENT_CONFIG": sandbox.path("client.toml")])
        #expect(configured.status == 0, "\(configured)")
        #expect(jsonLines(configured.stdout)?.first?["event"] as? String == "stats", "\(configured)")

        // The environment's secret comes before the config file's.
        try Data("rpc-secret = \"wrong\"\n".utf8).write(to: URL(fileURLWithPath: sandbox.path("wrong.toml")))
        let environmentFirst = try await Self.client(
            ["stats"], daemon, in: sandbox,
            environment: ["STITCH_CLIENT_CONFIG": sandbox.path("wrong.toml"), "STITCH_RPC_SECRET": "s3cret-token"])
        #expect(environmentFirst.status == 0, "\(environmentFirst)")

        for form in [["--rpc-secret", "s3cret-token"], ["--rpc-secret=s3cret-token"]] {
            let onTheLine = try await Self.client(["ls"] + form, daemon, in: sandbox)
            #expect(onTheLine.status == 64, "\(onTheLine)")
            #expect(!onTheLine.stderr.contains("s3cret-token"), "the secret is not echoed: \(onTheLine.stderr)")
        }
        _ = await daemon.stop()

        // Nothing listens there (a port held bound, not a stopped daemon's, which another test could take).
        let refusing = try RefusingPort()
        let gone = try await Self.client(
            ["ls", "--rpc-url", "http://127.0.0.1:\(refusing.port)/jsonrpc"], nil, in: sandbox,
            environment: ["STITCH_RPC_SECRET": "x"])
        #expect(gone.status == 75, "\(gone)")
        #expect(gone.stderr.contains("cannot reach stitch serve"), "\(gone)")
        withExtendedLifetime(refusing) {}
    }
}
