import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Testing

/// `stitch serve --conf-path FILE` and SIGHUP: the file is read again and what can change while running is applied,
/// under the command line; the global options set over RPC since the file was last read are forgotten, for good
/// (a restart does not bring them back); a bad file changes nothing; what cannot change is named.
@Suite struct ConfigReloadTests {
    static func write(_ text: String, to path: String) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
    }

    static func hostAnswer(_ daemon: ServedDaemon, _ host: String) throws -> Int {
        try RawHTTP.request(
            port: daemon.port, method: "POST", path: "/jsonrpc", headers: [("Host", "\(host):\(daemon.port)")],
            body: Array(#"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion"}"#.utf8)
        ).status
    }

    @Test func sighupAppliesTheFileUnderTheCommandLine() async throws {
        let sandbox = try Sandbox("reload")
        defer { sandbox.cleanup() }
        let conf = sandbox.path("stitch.conf")
        try Self.write(
            "max-concurrent-downloads=3\nmax-overall-download-limit=1M\nmax-tries=2\nrpc-allow-host=first.lan\n",
            to: conf)
        let folder = sandbox.path("dl")
        let daemon = try await ServedDaemon(directory: folder, ["--conf-path", conf, "--split", "2"], sandbox: sandbox)
        var global = try daemon.result("aria2.getGlobalOption")
        #expect(global.text("max-concurrent-downloads") == "3" && global.text("max-tries") == "2", "\(global)")
        #expect(global.text("max-overall-download-limit") == String(1 << 20) && global.text("split") == "2")
        let defaultAgent = try #require(global.text("user-agent"))
        #expect(try Self.hostAnswer(daemon, "first.lan") == 200)
        #expect(try Self.hostAnswer(daemon, "second.lan") == 403)
        // Set over RPC: wins over the file until the file is read again.
        let changes = JSON.object([
            ("max-tries", .string("5")), ("max-concurrent-downloads", .string("4")), ("user-agent", .string("rpc/1")),
        ])
        #expect(try daemon.result("aria2.changeGlobalOption", [changes]) == .string("OK"))

        try Self.write(
            """
            # edited
            max-concurrent-downloads=7
            max-overall-download-limit=2M
            max-tries=3
            split=8
            rpc-allow-host=second.lan
            rpc-max-request-size=2M
            log-level=debug

            """, to: conf)
        daemon.process.send(SIGHUP)
        try await daemon.waitForLog("again and applied it")
        global = try daemon.result("aria2.getGlobalOption")
        #expect(global.text("max-concurrent-downloads") == "7", "the file's, over what RPC set: \(global)")
        #expect(global.text("max-overall-download-limit") == String(2 << 20))
        #expect(global.text("max-tries") == "3")
        #expect(global.text("user-agent") == defaultAgent, "RPC's change is forgotten; the file names none")
        #expect(global.text("split") == "2", "the command line still wins")
        #expect(global.text("log-level") == "debug")
        #expect(try Self.hostAnswer(daemon, "second.lan") == 200, "allowed hosts change at once")
        #expect(try Self.hostAnswer(daemon, "first.lan") == 403)
        let log = daemon.process.stderrSoFar
        #expect(log.contains("forgotten: max-concurrent-downloads, max-tries, user-agent"), "\(log)")
        #expect(log.contains("rpc-max-request-size cannot change while stitch serve runs"), "\(log)")
        // A new download takes the file's defaults.
        let gid = try #require(
            try daemon.result("aria2.addUri", [.array([.string("http://127.0.0.1:9/x.bin")]), .object([("pause", .string("true"))])]).string)
        #expect(try daemon.result("aria2.getOption", [.string(gid)]).text("max-tries") == "3")

        // A bad line: an error in the log, and nothing changes.
        try Self.write("max-concurrent-downloads=9\nmax-tries=banana\n", to: conf)
        daemon.process.send(SIGHUP)
        try await daemon.waitForLog("; nothing changed")
        #expect(daemon.process.stderrSoFar.contains("stitch.conf:2:"), "the line is named")
        global = try daemon.result("aria2.getGlobalOption")
        #expect(global.text("max-concurrent-downloads") == "7" && global.text("max-tries") == "3", "\(global)")
        // Unreadable: the same.
        try FileManager.default.removeItem(atPath: conf)
        daemon.process.send(SIGHUP)
        try await daemon.waitForLog("; nothing changed", count: 2)
        #expect(try daemon.result("aria2.getGlobalOption").text("max-concurrent-downloads") == "7")
        let stop = await daemon.stop()
        #expect(stop.status == 0, "\(stop)")

        // After a restart the forgotten options stay forgotten; RPC changes after the reload are kept.
        try Self.write("max-concurrent-downloads=7\nmax-tries=3\n", to: conf)
        let again = try await ServedDaemon(directory: folder, ["--conf-path", conf], sandbox: sandbox)
        global = try again.result("aria2.getGlobalOption")
        #expect(global.text("max-concurrent-downloads") == "7" && global.text("max-tries") == "3", "\(global)")
        #expect(global.text("user-agent") == defaultAgent)
        #expect(try again.result("aria2.changeGlobalOption", [.object([("max-tries", .string("6"))])]) == .string("OK"))
        _ = await again.stop()
        let third = try await ServedDaemon(directory: folder, ["--conf-path", conf], sandbox: sandbox)
        #expect(try third.result("aria2.getGlobalOption").text("max-tries") == "6", "set over RPC since the file was read")
        _ = await third.stop()
    }

    /// Without a configuration file, SIGHUP says so and the daemon goes on (it does not stop, as SIGHUP's default
    /// would).
    @Test func sighupWithoutAFileIsHarmless() async throws {
        let sandbox = try Sandbox("reload")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)
        daemon.process.send(SIGHUP)
        try await daemon.waitForLog("no configuration file to read again")
        #expect(try daemon.result("aria2.getVersion").text("version") == StitchVersion.string)
        let stop = await daemon.stop()
        #expect(stop.status == 0, "\(stop)")
    }
}
