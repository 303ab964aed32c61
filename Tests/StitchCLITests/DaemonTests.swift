import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Testing
import StitchLocks

/// `stitch serve` as clients meet it: the real binary, over real sockets, downloading from the loopback nginx.
@Suite("stitch serve")
struct DaemonTests {
    static func publish(_ nginx: Nginx, _ name: String, size: Int, seed: UInt64) throws -> [UInt8] {
        let bytes = ServedFile.randomBytes(count: size, seed: seed)
        try nginx.publish(name, bytes: bytes)
        return bytes
    }

    static func isComplete(_ status: JSON) -> Bool { status.text("status") == "complete" }

    /// Every method a client polls with, with aria2's shapes: numbers as strings, 16-hex-digit GIDs that a
    /// unique prefix finds, the `keys` filter, files and URIs; then the results removed.
    @Test func methodsAnswerWithAria2Shapes() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        let bytes = try Self.publish(nginx, "serve-shapes.bin", size: 300_000, seed: 11)
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)

        let gid = try #require(try daemon.result("aria2.addUri", [.array([.string(nginx.httpURL("serve-shapes.bin"))])]).string)
        #expect(gid.count == 16 && gid.allSatisfy(\.isHexDigit), "\(gid)")
        let done = try await daemon.waitFor(gid, Self.isComplete)
        #expect(done.text("totalLength") == "300000")
        #expect(done.text("completedLength") == "300000")
        #expect(done.text("dir") == sandbox.path("dl"))
        let file = try #require(done["files"]?.array?.first)
        #expect(file.text("path") == sandbox.path("dl/serve-shapes.bin"))
        #expect(file.text("length") == "300000")
        #expect(FileManager.default.contents(atPath: sandbox.path("dl/serve-shapes.bin")).map(Array.init) == bytes)

        // A prefix finds it; `keys` keeps only what was asked.
        let short = try daemon.result("aria2.tellStatus", [.string(String(gid.prefix(6))), .array([.string("gid"), .string("status")])])
        #expect(short.members?.map(\.0) == ["gid", "status"])
        #expect(short.text("gid") == gid)
        let uris = try daemon.result("aria2.getUris", [.string(gid)])
        #expect(uris.array?.first?.text("uri") == nginx.httpURL("serve-shapes.bin"))
        #expect(try daemon.result("aria2.getFiles", [.string(gid)]).array?.first?.text("completedLength") == "300000")
        #expect(try daemon.result("aria2.getPeers", [.string(gid)]) == .array([]))
        #expect(try daemon.result("aria2.getOption", [.string(gid)]).text("dir") == sandbox.path("dl"))
        let stopped = try daemon.result("aria2.tellStopped", [.integer(0), .integer(10), .array([.string("gid")])])
        #expect(stopped.array?.compactMap { $0.text("gid") } == [gid])
        #expect(try daemon.result("aria2.tellStopped", [.integer(-1), .integer(10)]).array?.count == 1)
        #expect(try daemon.result("aria2.tellStopped", [.integer(0), .integer(.max)]).array?.count == 1, "a huge num")
        #expect(try daemon.result("aria2.tellActive").array == [])
        let stat = try daemon.result("aria2.getGlobalStat")
        #expect(stat.text("numStopped") == "1" && stat.text("numActive") == "0", "\(stat)")
        #expect(try daemon.result("aria2.getGlobalOption").text("dir") == sandbox.path("dl"))
        #expect(try daemon.result("aria2.getSessionInfo").text("sessionId")?.count == 40)
        #expect(try daemon.result("stitch.tellAll").array?.count == 1)
        let methods = try #require(try daemon.result("system.listMethods").array?.compactMap(\.string))
        for method in Aria2RPC.methods { #expect(methods.contains(method)) }

        // Errors: JSON-RPC's for the envelope, aria2's for a method.
        #expect(try daemon.error("aria2.nosuch") == (1, "No such method: aria2.nosuch"))
        #expect(try daemon.error("aria2.tellStatus", [.string("ffffffffffffffff")]).message.contains("not found"))
        #expect(try daemon.error("aria2.addTorrent", [.string("")]).message.contains("not supported"))
        #expect(try daemon.error("aria2.tellWaiting", [.string("x"), .integer(1)]) == (1, "The parameter at 0 has wrong type: offset is an integer"))
        #expect(try daemon.error("aria2.addUri") == (1, "The parameter at 0 is required but missing: an array of URIs"))
        #expect(try daemon.error("aria2.addUri", [.array([])]) == (1, "URI is not provided."))
        let malformed = try daemon.post(Array(#"{"jsonrpc":"2.0","id":1,"method":"#.utf8))
        #expect(try JSON.parse(malformed.body)["error"]?["code"]?.integer == -32700)

        #expect(try daemon.result("aria2.removeDownloadResult", [.string(gid)]) == .string("OK"))
        #expect(try daemon.result("aria2.tellStopped", [.integer(0), .integer(10)]).array == [])
        #expect(FileManager.default.fileExists(atPath: sandbox.path("dl/serve-shapes.bin")), "the file stays")
        let stop = await daemon.stop()
        #expect(stop.status == 0, "\(stop)")
    }

    /// The methods the other tests do not reach, against the binary: batches and system.multicall, a JSONP GET
    /// with base64 params, forcePause/forceRemove/forcePauseAll, getServers, changeOption, changeGlobalOption,
    /// saveSession, stitch.retry and stitch.updateSource, the pause/stop/error notifications, and shutdown.
    @Test func theRestOfTheMethods() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        let bytes = try Self.publish(nginx, "serve-rest.bin", size: 4 << 20, seed: 16)
        // The slow one must still be running when it is paused, however loaded the machine (2 MiB/s: 32 s; over
        // URLSession each 8 MiB window is a request of its own, which nginx lets start faster: 12 s for 32 MiB, and
        // a loaded run once took longer than that to reach the pause).
        _ = try Self.publish(nginx, "serve-rest-slow.bin", size: 64 << 20, seed: 17)
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), ["-c", "1"], sandbox: sandbox)
        let socket = try TestWebSocket(port: daemon.port)
        // An answer over it first: the daemon hands the socket to its WebSocket hub after sending the 101, so only
        // then are notifications sure to reach it (an onDownloadStart was missed once in CI).
        try socket.send(#"{"jsonrpc":"2.0","id":"ready","method":"aria2.getVersion"}"#)
        #expect(try socket.receive().map { $0.contains(#""id":"ready""#) } == true)

        // A batch and a multicall, each with a failing member.
        let batch = try daemon.post(Array(#"[{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion"},{"jsonrpc":"2.0","id":2,"method":"aria2.nosuch"},{"jsonrpc":"2.0","method":"aria2.getVersion"}]"#.utf8))
        let answers = try #require(try JSON.parse(batch.body).array)
        #expect(answers.count == 2 && answers[0]["result"] != nil && answers[1]["error"]?["code"]?.integer == 1, "\(batch.text)")
        let multi = try daemon.result("system.multicall", [.array([
            .object([("methodName", .string("aria2.getGlobalStat")), ("params", .array([]))]),
            .object([("methodName", .string("aria2.tellStatus")), ("params", .array([.string("ffff")]))]),
        ])])
        #expect(multi.array?.count == 2 && multi.array?[0].array?.first?.text("numActive") == "0" && multi.array?[1]["code"]?.integer == 1, "\(multi)")
        #expect(try daemon.result("system.listNotifications").array?.count == 5)

        // A slow download: getServers while active, forcePause (onDownloadPause), changeOption, unpause.
        let slow = try #require(try daemon.result("aria2.addUri", [.array([.string(nginx.slowURL("serve-rest-slow.bin"))]), .object([("out", .string("slow.bin"))])]).string)
        try await daemon.waitFor(slow) { $0.text("status") == "active" }
        let servers = try daemon.result("aria2.getServers", [.string(slow)])
        #expect(servers.array?.first?["servers"]?.array?.first?.text("uri") == nginx.slowURL("serve-rest-slow.bin"))
        // The JSONP GET form with base64 params reads it.
        let params = Data(#"["\#(slow)",["gid","status"]]"#.utf8).base64EncodedString()
        let jsonp = try daemon.get("/jsonrpc?method=aria2.tellStatus&id=9&params=\(params)&jsoncallback=got")
        #expect(jsonp.text.hasPrefix("got(") && jsonp.text.contains(#""status":"active""#), "\(jsonp.text)")
        let running = try await daemon.waitFor(slow) { Int($0.text("completedLength") ?? "0") ?? 0 > 256 << 10 }
        #expect(Int(running.text("connections") ?? "") ?? 0 >= 1, "the live count: \(running)")
        #expect(try daemon.result("aria2.forcePause", [.string(slow)]) == .string(slow))
        let pausedStatus = try await daemon.waitFor(slow) { $0.text("status") == "paused" }
        // Stitch's extra keys: the ranges with what of them is on disk (as the state file says), the validators.
        let segments = try #require(pausedStatus["stitch.segments"]?.array, "\(pausedStatus)")
        func sum(_ key: String) -> Int64 {
            segments.reduce(Int64(0)) { $0 + (Int64($1.text(key) ?? "") ?? 0) - (Int64($1.text("start") ?? "") ?? 0) }
        }
        #expect(!segments.isEmpty && segments.last?.text("end") == String(64 << 20), "\(segments)")
        #expect(sum("written") >= 256 << 10 && sum("written") <= 64 << 20, "written: \(pausedStatus)")
        #expect(sum("durable") <= sum("written"), "\(segments)")
        #expect(pausedStatus["stitch.validators"]?.text("etag")?.isEmpty == false, "nginx's ETag: \(pausedStatus)")
        // aria2's piece map: 64 pieces of 1 MiB, as 8 bytes of hex; a set bit only for a piece written whole.
        #expect(pausedStatus.text("numPieces") == "64" && pausedStatus.text("pieceLength") == String(1 << 20), "\(pausedStatus)")
        let bitfield = try #require(pausedStatus.text("bitfield"), "\(pausedStatus)")
        let setBits = bitfield.compactMap { $0.hexDigitValue?.nonzeroBitCount }.reduce(0, +)
        #expect(bitfield.count == 16 && Int64(setBits) << 20 <= sum("written"), "\(bitfield) for \(segments)")
        #expect(pausedStatus.text("connections") == "0")
        #expect(try daemon.result("aria2.changeOption", [.string(slow), .object([("max-download-limit", .string("1M"))])]) == .string("OK"))
        #expect(try daemon.result("aria2.getOption", [.string(slow)]).text("max-download-limit") == String(1 << 20))
        #expect(try daemon.error("aria2.changeOption", [.string(slow), .object([("out", .string("x.bin"))])]).message.contains("out"))
        #expect(try daemon.result("aria2.changeOption", [.string(slow), .object([("max-tries", .string("3")), ("split", .string("2")), ("user-agent", .string("changed/1"))])]) == .string("OK"))
        let changed = try daemon.result("aria2.getOption", [.string(slow)])
        #expect(changed.text("max-tries") == "3" && changed.text("header")?.split(separator: "\n").contains("User-Agent: changed/1") == true, "\(changed)")
        #expect(try daemon.result("aria2.changeGlobalOption", [.object([("max-overall-download-limit", .string("10M")), ("max-concurrent-downloads", .string("3"))])]) == .string("OK"))
        let global = try daemon.result("aria2.getGlobalOption")
        #expect(global.text("max-concurrent-downloads") == "3" && global.text("max-overall-download-limit") == String(10 << 20), "\(global)")
        #expect(try daemon.error("aria2.changeGlobalOption", [.object([("max-concurrent-downloads", .string("2")), ("dir", .string("/tmp"))])]).message.contains("dir"))
        #expect(try daemon.result("aria2.getGlobalOption").text("max-concurrent-downloads") == "3", "a refused change changes nothing")
        #expect(try daemon.result("aria2.saveSession") == .string("OK"))
        #expect(try daemon.result("aria2.forcePauseAll") == .string("OK"))
        #expect(try daemon.result("aria2.forceRemove", [.string(slow)]) == .string(slow))
        #expect(try daemon.error("aria2.tellStatus", [.string(slow)]).message.contains("not found"), "paused, so dropped at once, as aria2")

        // A download that fails (404), then stitch.updateSource points it at the right file and stitch.retry
        // brings it back; onDownloadError, then onDownloadComplete.
        let broken = try #require(try daemon.result("aria2.addUri", [.array([.string(nginx.httpURL("serve-rest-missing.bin"))]), .object([("out", .string("fixed.bin")), ("max-tries", .string("1"))])]).string)
        try await daemon.waitFor(broken) { $0.text("status") == "error" }
        let failed = try daemon.result("aria2.tellStatus", [.string(broken)])
        #expect(failed.text("errorCode") == "3" && failed.text("errorMessage")?.isEmpty == false, "\(failed)")
        #expect(failed.text("stitch.lastProblem")?.contains("404") == true, "in plain words: \(failed)")
        #expect(try daemon.error("stitch.retry", [.string(slow)]).message.contains("not found"), "a dropped one is gone")
        #expect(try daemon.result("stitch.updateSource", [.string(broken), .string(nginx.httpURL("serve-rest.bin"))]) == .string(broken))
        #expect(try daemon.result("stitch.retry", [.string(broken)]) == .string(broken))
        try await daemon.waitFor(broken, Self.isComplete)
        #expect(FileManager.default.contents(atPath: sandbox.path("dl/fixed.bin")).map(Array.init) == bytes)
        // A finished download's options are final, and a refused change changes nothing (the rate either).
        #expect(try daemon.error("aria2.changeOption", [.string(broken), .object([("max-download-limit", .string("1M")), ("max-tries", .string("2"))])]).message.contains("Cannot change option for GID#\(broken)"))
        #expect(try daemon.result("aria2.getOption", [.string(broken)]).text("max-download-limit") == "0")

        var seen: [String: Set<String>] = [:]
        while seen[broken]?.contains("aria2.onDownloadComplete") != true, let note = try socket.notification(timeout: 10_000) {
            let gid = note["params"]?.array?.first?.text("gid") ?? "?"
            seen[gid, default: []].insert(note.text("method") ?? "?")
        }
        #expect(seen[slow]?.isSuperset(of: ["aria2.onDownloadStart", "aria2.onDownloadPause"]) == true, "\(seen)")
        #expect(seen[slow]?.contains("aria2.onDownloadStop") == false, "removed while paused: dropped unannounced, as aria2: \(seen)")
        #expect(seen[broken]?.isSuperset(of: ["aria2.onDownloadError", "aria2.onDownloadComplete"]) == true, "\(seen)")

        // shutdown answers OK, then the daemon stops as on SIGTERM.
        #expect(try daemon.result("aria2.shutdown") == .string("OK"))
        let end = await daemon.process.wait(timeout: .seconds(60))
        #expect(end.status == 0 && end.stderr.contains("an RPC shutdown"), "\(end)")
    }

    /// Pause, unpause, remove and changePosition on a queue that one download at a time drains, with aria2's
    /// statuses; the removed one is listed as stopped until its result is purged.
    @Test func queueControlAsAria2Does() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        _ = try Self.publish(nginx, "serve-queue.bin", size: 8 << 20, seed: 12)
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), ["-j", "1", "-c", "1"], sandbox: sandbox)
        var gids: [String] = []
        for index in 0..<4 {
            let options = JSON.object([("out", .string("q\(index).bin"))])
            gids.append(try #require(try daemon.result("aria2.addUri", [.array([.string(nginx.slowURL("serve-queue.bin"))]), options]).string))
        }
        try await daemon.waitFor(gids[0]) { $0.text("status") == "active" }
        let waiting = try daemon.result("aria2.tellWaiting", [.integer(0), .integer(10)]).array?.compactMap { $0.text("gid") }
        #expect(waiting == Array(gids[1...]))
        // Move the last to the front of the waiting ones; POS_CUR moves relative to where it is.
        #expect(try daemon.result("aria2.changePosition", [.string(gids[3]), .integer(0), .string("POS_SET")]) == .integer(0))
        #expect(try daemon.result("aria2.changePosition", [.string(gids[1]), .integer(1), .string("POS_CUR")]) == .integer(2))
        let moved = try daemon.result("aria2.tellWaiting", [.integer(0), .integer(10)]).array?.compactMap { $0.text("gid") }
        #expect(moved == [gids[3], gids[2], gids[1]])
        // tellWaiting with a negative offset reads backwards from the end.
        let backwards = try daemon.result("aria2.tellWaiting", [.integer(-1), .integer(2)]).array?.compactMap { $0.text("gid") }
        #expect(backwards == [gids[1], gids[2]])

        #expect(try daemon.result("aria2.pause", [.string(gids[0])]) == .string(gids[0]))
        try await daemon.waitFor(gids[0]) { $0.text("status") == "paused" }
        #expect(try daemon.error("aria2.unpause", [.string(gids[2])]).message.contains("not paused"))
        #expect(try daemon.result("aria2.remove", [.string(gids[2])]) == .string(gids[2]))
        #expect(try daemon.error("aria2.tellStatus", [.string(gids[2])]).message.contains("not found"), "a waiting one is dropped at once, as aria2")
        #expect(try daemon.result("aria2.pauseAll") == .string("OK"))
        let paused = try daemon.result("aria2.tellWaiting", [.integer(0), .integer(10), .array([.string("status")])])
        #expect(paused.array?.allSatisfy { $0.text("status") == "paused" } == true, "\(paused)")
        #expect(try daemon.result("aria2.unpauseAll") == .string("OK"))
        #expect(try daemon.result("aria2.purgeDownloadResult") == .string("OK"))
        #expect(try daemon.error("aria2.tellStatus", [.string(gids[2])]).message.contains("not found"))
        let stop = await daemon.stop()
        #expect(stop.status == 0, "\(stop)")
    }

    /// What a web page of another site, a rebound DNS name, or a careless client sends is refused with a reason,
    /// and the daemon goes on serving.
    @Test func foreignPagesAndHostsAreRefused() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)
        let version = Array(#"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion"}"#.utf8)
        let foreign = try daemon.post(version, headers: [("Origin", "https://evil.example")])
        #expect(foreign.status == 403 && foreign.text.contains("--rpc-allow-origin-all"), "\(foreign.text)")
        let same = try daemon.post(version, headers: [("Origin", "http://127.0.0.1:\(daemon.port)")])
        #expect(same.status == 200, "the daemon's own page may call: \(same.text)")
        let rebound = try RawHTTP.request(
            port: daemon.port, method: "POST", path: "/jsonrpc", headers: [("Host", "evil.example:\(daemon.port)")],
            body: version)
        #expect(rebound.status == 403 && rebound.text.contains("--rpc-allow-host"), "\(rebound.text)")

        // The attack a <script> tag makes: a cross-site GET with no Origin; refused before any method runs.
        let add = Data(#"[["http://127.0.0.1:1/x.bin"]]"#.utf8).base64EncodedString()
        let script = try daemon.get(
            "/jsonrpc?method=aria2.addUri&id=1&params=\(add)&jsoncallback=cb",
            headers: [("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Mode", "no-cors")])
        #expect(script.status == 403, "\(script.text)")
        // Without the browser's headers a GET still may not change anything …
        let plain = try daemon.get("/jsonrpc?method=aria2.addUri&id=1&params=\(add)")
        #expect(plain.text.contains("refused over GET"), "\(plain.text)")
        // … but may read, as JSONP.
        let read = try daemon.get("/jsonrpc?method=aria2.getGlobalStat&id=7&jsoncallback=show")
        #expect(read.text.hasPrefix("show({") && read.text.hasSuffix(")") && read.headers["content-type"] == "text/javascript", "\(read.text)")
        let badCallback = try daemon.get("/jsonrpc?method=aria2.getGlobalStat&id=7&jsoncallback=alert(1)//")
        #expect(badCallback.status == 400)
        #expect(try daemon.result("aria2.tellWaiting", [.integer(0), .integer(10)]).array == [], "nothing was added")

        // A preflight is refused without --rpc-allow-origin-all.
        let preflight = try RawHTTP.request(
            port: daemon.port, method: "OPTIONS", path: "/jsonrpc",
            headers: [("Host", "127.0.0.1:\(daemon.port)"), ("Origin", "https://evil.example")])
        #expect(preflight.status == 403 && preflight.headers["access-control-allow-origin"] == nil)
        #expect(try daemon.get("/other").status == 404)
        #expect(try daemon.result("aria2.getVersion").text("version") == StitchVersion.string, "still serving")
        _ = await daemon.stop()
    }

    /// The web page at `/`, built into the binary: its files with their types and the strict headers; a `Host` the
    /// daemon does not answer to is refused for the page as for the RPC; only GET and HEAD; a cross-site
    /// navigation to the page is allowed (it acts on nothing by itself), and its scripts reach the RPC only as the
    /// page's own origin.
    @Test func webPageIsServedWithStrictHeaders() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)
        let page = try daemon.get("/")
        #expect(page.status == 200 && page.headers["content-type"] == "text/html; charset=utf-8")
        #expect(page.text.contains(#"<script type="module" src="/app.mjs"></script>"#), "\(page.text.prefix(300))")
        let policy = try #require(page.headers["content-security-policy"])
        for directive in ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
            "frame-ancestors 'none'", "base-uri 'none'"] {
            #expect(policy.contains(directive), "\(policy)")
        }
        #expect(!policy.contains("unsafe"), "\(policy)")
        #expect(page.headers["x-content-type-options"] == "nosniff")
        #expect(page.headers["referrer-policy"] == "no-referrer")
        #expect(page.headers["x-frame-options"] == "DENY")
        #expect(try daemon.get("/index.html").body == page.body)
        for (path, type, marker) in [
            ("/app.mjs", "text/javascript; charset=utf-8", "import * as L from \"./logic.mjs\""),
            ("/logic.mjs", "text/javascript; charset=utf-8", "export function formatBytes"),
            ("/app.css", "text/css; charset=utf-8", "prefers-color-scheme: dark"),
            ("/favicon.svg", "image/svg+xml", "<svg"),
        ] {
            let asset = try daemon.get(path)
            #expect(asset.status == 200 && asset.headers["content-type"] == type, "\(path): \(asset.headers)")
            #expect(asset.text.contains(marker), "\(path)")
            #expect(asset.headers["content-security-policy"] == policy, "\(path)")
        }
        // Inline scripts and styles would need the policy to allow them: there are none.
        #expect(!page.text.contains("<script>") && !page.text.contains(" style=") && !page.text.contains(" onclick="))
        // The query string does not change what is served.
        #expect(try daemon.get("/?x=1").body == page.body)
        let head = try RawHTTP.request(port: daemon.port, method: "HEAD", path: "/", headers: [("Host", "127.0.0.1")])
        #expect(head.status == 200 && head.body.isEmpty)
        let post = try RawHTTP.request(
            port: daemon.port, method: "POST", path: "/", headers: [("Host", "127.0.0.1"), ("Content-Length", "0")])
        #expect(post.status == 405, "\(post.text)")
        let rebound = try RawHTTP.request(
            port: daemon.port, method: "GET", path: "/", headers: [("Host", "evil.example:\(daemon.port)")])
        #expect(rebound.status == 403 && rebound.text.contains("--rpc-allow-host"), "\(rebound.text)")
        #expect(!rebound.text.contains("<html"))
        let linked = try daemon.get("/", headers: [("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Mode", "navigate")])
        #expect(linked.status == 200 && linked.body == page.body)
        // Cut off from a window that opened it, where browsers honour that: loopback (and TLS), not a LAN name
        // over plain HTTP (they would only log an error).
        #expect(page.headers["cross-origin-opener-policy"] == "same-origin", "\(page.headers)")
        _ = await daemon.stop()
        let named = try await ServedDaemon(
            directory: sandbox.path("dl2"), ["--rpc-allow-host", "nas.lan"], sandbox: sandbox)
        let lan = try RawHTTP.request(port: named.port, method: "GET", path: "/", headers: [("Host", "nas.lan:\(named.port)")])
        #expect(lan.status == 200 && lan.headers["cross-origin-opener-policy"] == nil, "\(lan.headers)")
        // JSONP is not for the page's own origin: an answer the page's script-src would allow.
        let jsonp = try RawHTTP.request(
            port: named.port, method: "GET", path: "/jsonrpc?method=aria2.getGlobalStat&id=1&jsoncallback=cb",
            headers: [("Host", "127.0.0.1:\(named.port)"), ("Sec-Fetch-Site", "same-origin")])
        #expect(jsonp.status == 400 && !jsonp.text.hasPrefix("cb("), "\(jsonp.text)")
        let missing = try named.get("/app.js")
        #expect(missing.status == 404 && missing.text.contains("the page is at /"), "\(missing.text)")
        _ = await named.stop()
    }

    /// Calls that carry no token are refused but are no guess: another site can make a browser open the daemon's
    /// page over and over, whose first calls carry none, and the user's own client must not be slowed by it.
    /// Wrong tokens still are; a WebSocket call refused for them is answered with its own id.
    @Test func callsWithoutTheSecretAreNotGuesses() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(
            directory: sandbox.path("dl"), ["--log", sandbox.path("serve.log")],
            environment: ["STITCH_RPC_SECRET": "s3cret", "STITCH_TEST_WRONG_SECRET_DELAY": "60"], sandbox: sandbox)
        for _ in 0..<20 { #expect(try daemon.error("aria2.getVersion").message == "Unauthorized") }
        let multicall = try daemon.result(
            "system.multicall", [.array([.object([("methodName", .string("aria2.tellActive")), ("params", .array([]))])])])
        #expect(multicall.array?.first?["message"]?.string == "Unauthorized", "\(multicall)")
        let right = ContinuousClock.now
        #expect(try daemon.result("aria2.getVersion", [.string("token:s3cret")]).text("version") == StitchVersion.string)
        #expect(ContinuousClock.now - right < .seconds(1), "not slowed by 21 requests without a token")

        // A wrong token books the address's next turn one first delay later: 60 s here (a test-only setting), far
        // beyond the 10 s a request may wait, so the next call is refused at once however slowly this test runs.
        // Over the WebSocket the refusal carries the call's id (with the right token, even), so a client waiting
        // on it is answered; over HTTP it is a 429.
        let wrong = Array(#"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion","params":["token:guess"]}"#.utf8)
        #expect(try daemon.post(wrong).status == 400, "Unauthorized is code 1: aria2's 400")
        let socket = try TestWebSocket(port: daemon.port)
        try socket.send(#"{"jsonrpc":"2.0","id":"call-42","method":"aria2.getVersion","params":["token:s3cret"]}"#)
        let reply = try JSON.parse(Array(try #require(try socket.receive(timeout: 5_000), "an answer").utf8))
        #expect(reply["id"]?.string == "call-42", "\(reply)")
        #expect(reply["error"]?.text("message") == "too many wrong secrets", "\(reply)")
        #expect(try daemon.post(wrong).status == 429)
        _ = await daemon.stop()
        let logged = (try? String(contentsOfFile: sandbox.path("serve.log"), encoding: .utf8)) ?? ""
        #expect(logged.contains("call(s) without the secret") && logged.contains("wrong secret(s)"), "\(logged)")
    }

    /// With --rpc-allow-origin-all (which needs a secret) a page of another origin may call: the preflight is
    /// answered with CORS headers, and so is the call; the secret still applies.
    @Test func allowOriginAllLetsOtherPagesCallWithTheSecret() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let refused = try StitchProcess(["serve", "--dir", sandbox.path("dl"), "--rpc-allow-origin-all"], directory: sandbox.directory)
        let refusal = await refused.wait()
        #expect(refusal.status == 64 && refusal.stderr.contains("needs a secret"), "\(refusal)")
        let daemon = try await ServedDaemon(
            directory: sandbox.path("dl"), ["--rpc-allow-origin-all", "--log", sandbox.path("serve.log")],
            environment: ["STITCH_RPC_SECRET": "cors"], sandbox: sandbox)
        let origin = ("Origin", "https://ariang.example")
        let preflight = try RawHTTP.request(
            port: daemon.port, method: "OPTIONS", path: "/jsonrpc",
            headers: [("Host", "127.0.0.1:\(daemon.port)"), origin, ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "content-type")])
        #expect(preflight.status == 204 && preflight.headers["access-control-allow-origin"] == "*", "\(preflight.headers)")
        #expect(preflight.headers["access-control-allow-methods"]?.contains("POST") == true)
        #expect(preflight.headers["access-control-allow-headers"]?.lowercased().contains("content-type") == true)
        let call = try daemon.post(
            Array(#"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion","params":["token:cors"]}"#.utf8), headers: [origin])
        #expect(call.status == 200 && call.headers["access-control-allow-origin"] == "*", "\(call.headers)")
        #expect(try JSON.parse(call.body)["result"]?.text("version") == StitchVersion.string)
        let noToken = try daemon.post(Array(#"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion"}"#.utf8), headers: [origin])
        #expect(try JSON.parse(noToken.body)["error"]?.text("message") == "Unauthorized")
        _ = await daemon.stop()
        // --log FILE has the same lines as stderr, with their levels.
        let logged = (try? String(contentsOfFile: sandbox.path("serve.log"), encoding: .utf8)) ?? ""
        #expect(logged.contains("stitch serve info: serving") && logged.contains("stitch serve info: stopped"), "\(logged)")
        #expect(logged.contains("call(s) without the secret"), "\(logged)")
    }

    /// Bodies too large, nested too deep, frames too long: refused with an error; the daemon keeps serving.
    @Test func oversizedAndMalformedRequestsAreBounded() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), ["--rpc-max-request-size", "64K"], sandbox: sandbox)
        let big = try RawHTTP.request(
            port: daemon.port, method: "POST", path: "/jsonrpc", headers: [("Host", "127.0.0.1:\(daemon.port)")],
            body: [], declaredLength: 1 << 20)
        #expect(big.status == 413, "\(big.status) \(big.text)")
        let nested = Array((String(repeating: "[", count: 5_000) + String(repeating: "]", count: 5_000)).utf8)
        let deep = try daemon.post(nested)
        #expect(try JSON.parse(deep.body)["error"]?["code"]?.integer == -32700, "\(deep.text)")
        let wrongType = try daemon.post(Array(#"{"jsonrpc":"2.0","id":1,"method":"aria2.tellStatus","params":{"a":1}}"#.utf8))
        #expect(try JSON.parse(wrongType.body)["error"]?["code"]?.integer == -32602)
        let huge = String(repeating: "a", count: 70_000)
        let header = try RawHTTP.request(
            port: daemon.port, method: "GET", path: "/jsonrpc?method=aria2.getVersion&id=1",
            headers: [("Host", "127.0.0.1:\(daemon.port)"), ("X-Huge", huge)])
        #expect(header.status >= 400, "a head larger than the connection's memory is refused: \(header.status)")
        // A WebSocket frame that claims more than the limit closes that client only.
        let socket = try TestWebSocket(port: daemon.port)
        try socket.sendFrame(opcode: 1, [UInt8](repeating: 0x61, count: 4_096), declaredLength: 3 << 30)
        #expect(try socket.receive(timeout: 10_000) == nil)
        #expect(try daemon.result("aria2.getVersion").text("version") == StitchVersion.string, "still serving")
        _ = await daemon.stop()
    }

    /// `dir` and `out` stay inside the served folder: `..`, absolute paths elsewhere and symbolic links that
    /// lead out are refused; only http and https URLs are taken.
    @Test func downloadsStayInsideTheServedFolder() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        _ = try Self.publish(nginx, "serve-confined.bin", size: 10_000, seed: 13)
        let folder = sandbox.path("dl")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: sandbox.path("outside"), withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: folder + "/link", withDestinationPath: sandbox.path("outside"))
        try FileManager.default.createSymbolicLink(atPath: folder + "/file-link.bin", withDestinationPath: sandbox.path("outside/f"))
        let daemon = try await ServedDaemon(directory: folder, sandbox: sandbox)
        let url = JSON.array([.string(nginx.httpURL("serve-confined.bin"))])
        for (name, value) in [
            ("dir", "../outside"), ("dir", sandbox.path("outside")), ("dir", "link"), ("dir", "link/deeper"),
            ("dir", "/etc"), ("out", "../x.bin"), ("out", "a/../../b.bin"), ("out", "file-link.bin"), ("dir", ".stitch"),
            ("out", "link/x.bin"), ("out", "/etc/x.bin"), ("out", ".stitch/x.bin"),
        ] {
            let refused = try daemon.error("aria2.addUri", [url, .object([(name, .string(value))])])
            #expect(refused.code == 1, "\(name)=\(value): \(refused)")
        }
        for scheme in ["file:///etc/passwd", "ftp://127.0.0.1/x", "javascript:alert(1)"] {
            #expect(try daemon.error("aria2.addUri", [.array([.string(scheme)])]).message.contains("only http and https"))
        }
        // Inside is fine, relative or absolute.
        let inside = try #require(try daemon.result("aria2.addUri", [url, .object([("dir", .string("sub/deeper")), ("out", .string("ok.bin"))])]).string)
        try await daemon.waitFor(inside, Self.isComplete)
        #expect(FileManager.default.fileExists(atPath: folder + "/sub/deeper/ok.bin"))
        let absolute = try #require(try daemon.result("aria2.addUri", [url, .object([("dir", .string(folder + "/abs"))])]).string)
        try await daemon.waitFor(absolute, Self.isComplete)
        // out with folders below the download's folder, as aria2's: made.
        let nested = try #require(try daemon.result("aria2.addUri", [url, .object([("dir", .string("sub")), ("out", .string("a/b.bin"))])]).string)
        try await daemon.waitFor(nested, Self.isComplete)
        #expect(FileManager.default.fileExists(atPath: folder + "/sub/a/b.bin"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: sandbox.path("outside")).isEmpty, "nothing outside")
        _ = await daemon.stop()
    }

    /// The daemon's own folder cannot be reached through another path to the served folder (a link to it).
    @Test func theDaemonsOwnFolderIsRefusedThroughALink() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let real = sandbox.path("real")
        try FileManager.default.createDirectory(atPath: real, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: sandbox.path("link"), withDestinationPath: real)
        let daemon = try await ServedDaemon(directory: sandbox.path("link"), sandbox: sandbox)
        let url = JSON.array([.string("http://127.0.0.1:1/x.bin")])
        for options: [(String, JSON)] in [
            [("dir", .string(real + "/.stitch")), ("out", .string("catalog.sqlite3")), ("allow-overwrite", .string("true"))],
            [("dir", .string(real + "/.stitch/deeper"))], [("dir", .string(real)), ("out", .string(".stitch"))],
            [("out", .string(".stitch/catalog.sqlite3"))], [("dir", .string(real)), ("out", .string(".stitch/new/x.bin"))],
        ] {
            let refused = try daemon.error("aria2.addUri", [url, .object(options)])
            #expect(refused.message.contains("daemon's own"), "\(options): \(refused)")
        }
        _ = await daemon.stop()
    }

    /// Clients that reset the connection right after asking for a WebSocket do not use up the places: a
    /// daemon with 4 still takes 4 clients afterwards.
    @Test func abandonedUpgradesGiveTheirPlaceBack() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), ["--rpc-max-websocket-clients", "4"], sandbox: sandbox)
        for _ in 0..<300 {
            guard let fd = connectToLoopback(port: daemon.port) else { continue }
            let head = "GET /jsonrpc HTTP/1.1\r\nHost: 127.0.0.1:\(daemon.port)\r\nUpgrade: websocket\r\n"
                + "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            try RawHTTP.sendAll(fd, Array(head.utf8))
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)  // close with a reset, at once
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
            close(fd)
        }
        // Places come back as MHD notices each reset; then four clients fit, and a fifth does not.
        var clients: [TestWebSocket] = []
        let deadline = ContinuousClock.now + .seconds(30)
        while clients.count < 4, ContinuousClock.now < deadline {
            if let client = try? TestWebSocket(port: daemon.port) { clients.append(client) } else {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        #expect(clients.count == 4, "places left after 300 abandoned upgrades: \(clients.count)")
        #expect(throws: DaemonTestError.self) { try TestWebSocket(port: daemon.port) }
        _ = await daemon.stop()
    }

    /// SIGTERM while keep-alive clients keep calling (as a front-end polls): the daemon stops cleanly, exit 0,
    /// every time (MHD must never stop with a suspended connection).
    @Test func sigtermUnderKeepAlivePollingExitsCleanly() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        for round in 0..<3 {
            let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)
            let port = daemon.port
            let answered = Locked(0)
            let pollers = (0..<8).map { index in
                Thread {
                    guard let fd = connectToLoopback(port: port) else { return }
                    defer { close(fd) }
                    // Half of them ask for something that goes through the manager (the suspended path).
                    let method = index % 2 == 0 ? "aria2.getGlobalOption" : "aria2.tellActive"
                    let body = #"{"jsonrpc":"2.0","id":1,"method":"\#(method)"}"#
                    let request = Array("POST /jsonrpc HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)".utf8)
                    var buffer = [UInt8](repeating: 0, count: 65_536)
                    while (try? RawHTTP.sendAll(fd, request)) != nil {
                        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                        guard poll(&descriptor, 1, 10_000) > 0 else { return }
                        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                        guard n > 0 else { return }
                        answered.withLock { $0 += 1 }
                    }
                }
            }
            for poller in pollers { poller.start() }
            _ = await waitUntil(timeout: .seconds(20)) { answered.withLock { $0 } > 200 }
            let stop = await daemon.stop()
            #expect(stop.status == 0 && stop.signal == nil, "round \(round): \(stop)")
        }
    }

    /// The secret: from a file or the environment, never argv; calls without it or with a wrong one are refused
    /// (listMethods needs none); repeated wrong tokens are slowed down while the daemon sleeps.
    @Test func secretIsRequiredAndGuessesAreSlowedWithoutCPU() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let argv = try StitchProcess(["serve", "--dir", sandbox.path("dl"), "--rpc-secret", "s3cret"], directory: sandbox.directory)
        let refused = await argv.wait()
        #expect(refused.status == 64 && refused.stderr.contains("STITCH_RPC_SECRET"), "\(refused)")
        let open = try StitchProcess(["serve", "--dir", sandbox.path("dl"), "--rpc-listen", "0.0.0.0:0"], directory: sandbox.directory)
        let openResult = await open.wait()
        #expect(openResult.status == 64 && openResult.stderr.contains("needs a secret"), "\(openResult)")

        try "s3cret\n".write(toFile: sandbox.path("secret"), atomically: true, encoding: .utf8)
        let daemon = try await ServedDaemon(
            directory: sandbox.path("dl"), ["--rpc-secret-file", sandbox.path("secret")], sandbox: sandbox)
        #expect(try daemon.error("aria2.getVersion").message == "Unauthorized")
        #expect(try daemon.result("system.listMethods").array?.isEmpty == false)
        #expect(try daemon.result("aria2.getVersion", [.string("token:s3cret")]).text("version") == StitchVersion.string)

        // Wrong tokens in a row: each answer comes later than the one before, up to seconds.
        let cpuBefore = try Self.cpuTicks(daemon.process.pid)
        // The server answers guess k+1 no sooner than delay(k) after it recorded guess k (0.1, 0.2, 0.4 s), so
        // four in a row take at least 0.7 s from the first sent to the last answered, however slow the machine
        // (a slow machine only adds).
        let sequence = ContinuousClock.now
        for _ in 0..<4 {
            #expect(try daemon.error("aria2.getVersion", [.string("token:guess")]).message == "Unauthorized")
        }
        let fourGuesses = ContinuousClock.now - sequence
        // After a pause longer than the last delay, 8 parallel guesses still wait their turns, one per delay
        // (≥ 0.8 s by now), with the daemon asleep meanwhile (they once all went through together); those whose
        // turn would come more than 10 s later are refused at once (429).
        try await Task.sleep(for: .seconds(1))
        let start = ContinuousClock.now
        let body = Array(#"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion","params":["token:guess"]}"#.utf8)
        let outcomes = try await withThrowingTaskGroup(of: (Int, Duration).self) { group in
            for _ in 0..<8 {
                group.addTask {
                    // Timed on the thread that reads the answer: a busy task pool resumes tasks late, together.
                    try await offload {
                        let reply = try daemon.post(body)
                        return (reply.status, ContinuousClock.now - start)
                    }
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let parallel = ContinuousClock.now - start
        let cpu = try Self.cpuTicks(daemon.process.pid) - cpuBefore
        #expect(fourGuesses >= .milliseconds(700), "four wrong tokens in a row are slowed (0.1, 0.2, 0.4 s): \(fourGuesses)")
        #expect(outcomes.allSatisfy { $0.0 == 400 || $0.0 == 429 }, "\(outcomes)")
        let answered = outcomes.filter { $0.0 == 400 }.map(\.1).sorted()  // Unauthorized, aria2's 400
        #expect(answered.count >= 2, "the first turns come within 10 s: \(outcomes)")
        // Spaced by at least 0.8 s each on the server, so the last is answered no sooner than 0.8 s per turn
        // after they were all sent.
        if let last = answered.last {
            #expect(last >= .milliseconds(800) * (answered.count - 1), "answered one per delay: \(answered)")
        }
        let ticks = sysconf(Int32(_SC_CLK_TCK))
        #expect(cpu < ticks * 2, "the waiting cost the daemon \(cpu) ticks of CPU over \(parallel)")
        // The right token works once the address's turn comes (refused with 429 until then) and clears it.
        let right = Array(#"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion","params":["token:s3cret"]}"#.utf8)
        var cleared = try daemon.post(right)
        let deadline = ContinuousClock.now + .seconds(60)
        while cleared.status == 429, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(500))
            cleared = try daemon.post(right)
        }
        #expect(try JSON.parse(cleared.body)["result"]?.text("version") != nil, "\(cleared.status) \(cleared.text)")
        // A batch of guesses cannot tell which one was right: after the first wrong one, every call fails.
        let guesses = (0..<4).map { index in
            #"{"jsonrpc":"2.0","id":\#(index),"method":"aria2.getVersion","params":["token:\#(index == 2 ? "s3cret" : "guess\(index)")"]}"#
        }
        let beforeBatch = ContinuousClock.now
        let batch = try daemon.post(Array("[\(guesses.joined(separator: ","))]".utf8))
        let answers = try #require(try JSON.parse(batch.body).array)
        #expect(answers.count == 4 && answers.allSatisfy { $0["error"]?.text("message") == "Unauthorized" }, "\(batch.text)")
        // The batch's four failures count (delay 0.8 s after them; one would give 0.1 s), and a call that needs no
        // token (listMethods) does not clear the address: it and the next guess wait their turns.
        _ = try daemon.result("system.listMethods")
        _ = try daemon.error("aria2.getVersion", [.string("token:guess")])
        #expect(ContinuousClock.now - beforeBatch >= .milliseconds(800), "4 wrong tokens in the batch count")
        _ = await daemon.stop()
    }

    /// With a certificate and key the RPC is HTTPS (and WSS): curl, trusting the certificate, calls it; the secret
    /// travels encrypted; plain HTTP to that port gets no answer.
    @Test func tlsServesTheRPCOverHTTPS() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        let daemon = try await ServedDaemon(
            directory: sandbox.path("dl"),
            ["--rpc-certificate", nginx.directory + "/cert.pem", "--rpc-private-key", nginx.directory + "/key.pem"],
            environment: ["STITCH_RPC_SECRET": "tls-secret"], sandbox: sandbox)
        let body = #"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion","params":["token:tls-secret"]}"#
        var output: [UInt8] = []
        let collected = Locked<[UInt8]>([])
        let curl = try ChildProcess(
            executable: "/usr/bin/curl",
            arguments: [
                "-sS", "--max-time", "60", "--cacert", nginx.caCertificate, "-d", body,
                "https://127.0.0.1:\(daemon.port)/jsonrpc",
            ],
            environment: [:], onOutput: { chunk, isOutput in if isOutput { collected.withLock { $0 += chunk } } })
        let status = try await offload { curl.waitUntilExit() }
        output = collected.withLock { $0 }
        #expect(status.status == 0)
        let answer = try JSON.parse(output)
        #expect(answer["result"]?.text("version") == StitchVersion.string, "\(String(decoding: output, as: UTF8.self))")
        let plain = try? daemon.post(Array(body.utf8))
        #expect(plain == nil || plain?.status != 200, "plain HTTP is not served on the TLS port")
        #expect(try daemon.processIsServing(), "still serving")
        _ = await daemon.stop()
    }

    /// Several URIs in one addUri are mirrors of one file: a missing first one is passed over for the next;
    /// changeUri edits the list; aria2's per-download options reach the requests and show in getOption.
    @Test func mirrorsAndPerDownloadOptions() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        let bytes = try Self.publish(nginx, "serve-mirror.bin", size: 250_000, seed: 15)
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)
        let missing = nginx.httpURL("serve-mirror-missing.bin")
        let good = nginx.httpURL("serve-mirror.bin")
        let agent = "stitch-test-agent/\(UInt32.random(in: 0...UInt32.max))"
        let options = JSON.object([
            ("out", .string("m.bin")), ("max-tries", .string("1")), ("retry-wait", .string("1")),
            ("timeout", .string("20")), ("connect-timeout", .string("10")), ("user-agent", .string(agent)),
            ("min-split-size", .string("2M")),
        ])
        let gid = try #require(try daemon.result("aria2.addUri", [.array([.string(missing), .string(good)]), options]).string)
        try await daemon.waitFor(gid, Self.isComplete)
        #expect(FileManager.default.contents(atPath: sandbox.path("dl/m.bin")).map(Array.init) == bytes)
        let uris = try daemon.result("aria2.getUris", [.string(gid)]).array ?? []
        #expect(uris.map { "\($0.text("uri") ?? "") \($0.text("status") ?? "")" } == ["\(good) used", "\(missing) waiting"], "as aria2: the one used first")
        let seen = nginx.accessLogLines(containing: "serve-mirror")
        #expect(seen.contains { $0.contains("/serve-mirror-missing.bin") && $0.contains(" 404 ") && $0.contains(agent) }, "\(seen)")
        // The whole file from the good mirror (over URLSession asked as a window, which a 206 answers).
        #expect(seen.contains { line in
            let record = ServedRecord(nginxLine: line, size: bytes.count)
            return line.contains("/serve-mirror.bin") && line.contains(agent)
                && (record?.status == 200 || (record?.status == 206 && record?.range == nil))
        }, "\(seen)")
        let shown = try daemon.result("aria2.getOption", [.string(gid)])
        #expect(shown.text("max-tries") == "1" && shown.text("timeout") == "20" && shown.text("min-split-size") == "\(2 << 20)", "\(shown)")

        // changeUri on a paused one: delete one, add two at the front; [deleted, added]. A finished one's URIs
        // are final.
        let paused = try #require(try daemon.result("aria2.addUri", [.array([.string(missing), .string(good)]), .object([("pause", .string("true")), ("out", .string("p.bin"))])]).string)
        let other = nginx.httpURL("serve-mirror-other.bin")
        let changed = try daemon.result("aria2.changeUri", [.string(paused), .integer(1), .array([.string(missing)]), .array([.string(other), .string(good)]), .integer(0)])
        #expect(changed == .array([.integer(1), .integer(1)]), "a URI already listed is not added twice: \(changed)")
        let after = try daemon.result("aria2.getUris", [.string(paused)]).array ?? []
        #expect(after.map { "\($0.text("uri") ?? "") \($0.text("status") ?? "")" } == ["\(other) waiting", "\(good) waiting"], "the deleted current URI gives way to the first; not started, none is used yet (as aria2)")
        #expect(try daemon.error("aria2.changeUri", [.string(gid), .integer(1), .array([]), .array([.string(other)])]).message.contains("final"))
        #expect(try daemon.error("aria2.addUri", [.array([.string(good)]), .object([("max-tries", .string("-1"))])]).message.contains("max-tries"))
        #expect(try daemon.error("aria2.addUri", [.array([.string(good)]), .object([("all-proxy", .string("ftp://p:1"))])]).message.contains("all-proxy"), "a proxy Stitch cannot use is refused, not ignored")
        #expect(try daemon.error("aria2.addUri", [.array([.string(good)]), .object([("dry-run", .string("true"))])]).message.contains("dry-run"))
        let ignored = try daemon.result("aria2.addUri", [.array([.string(good)]), .object([("seed-ratio", .string("1")), ("file-allocation", .string("none")), ("out", .string("ignored.bin"))])])
        #expect(ignored.string?.count == 16, "BitTorrent and allocation knobs are taken and ignored")
        _ = await daemon.stop()
    }

    /// utime + stime of a process, in clock ticks.
    static func cpuTicks(_ pid: Int32) throws -> Int {
        let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
        let fields = stat[stat.range(of: ")")!.upperBound...].split(separator: " ")
        return (Int(fields[11]) ?? 0) + (Int(fields[12]) ?? 0)
    }

    /// A WebSocket client gets answers to its calls and aria2's notifications as downloads start and complete.
    @Test func webSocketCarriesCallsAndNotifications() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        let bytes = try Self.publish(nginx, "serve-ws.bin", size: 200_000, seed: 14)
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)
        let socket = try TestWebSocket(port: daemon.port)
        try socket.send(#"{"jsonrpc":"2.0","id":"v","method":"aria2.getVersion"}"#)
        let answer = try JSON.parse(Array(try #require(try socket.receive()).utf8))
        #expect(answer.text("id") == "v" && answer["result"]?.text("version") == StitchVersion.string)

        let gid = try #require(try daemon.result("aria2.addUri", [.array([.string(nginx.httpURL("serve-ws.bin"))])]).string)
        var seen: [String] = []
        while !seen.contains("aria2.onDownloadComplete"), let note = try socket.notification() {
            #expect(note["params"]?.array?.first?.text("gid") == gid, "\(note)")
            seen.append(note.text("method") ?? "?")
        }
        #expect(seen.first == "aria2.onDownloadStart" && seen.last == "aria2.onDownloadComplete", "\(seen)")
        #expect(FileManager.default.contents(atPath: sandbox.path("dl/serve-ws.bin")).map(Array.init) == bytes)
        // A cross-site page cannot open the socket either.
        #expect(throws: DaemonTestError.self) { try TestWebSocket(port: daemon.port, headers: [("Origin", "https://evil.example")]) }
        _ = await daemon.stop()
    }

    /// `aria2.shutdown` over the WebSocket is answered before the socket closes (the hub closed its clients before
    /// the answer was queued, three times in four with a download in the catalog; aioaria2 waited in vain).
    @Test func shutdownOverTheWebSocketIsAnswered() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        for round in 0..<3 {
            let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)
            if round == 0 {
                _ = try daemon.result("aria2.addUri", [.array([.string("http://127.0.0.1:9/x.bin")]), .object([("pause", .string("true"))])])
            }
            let socket = try TestWebSocket(port: daemon.port)
            try socket.send(#"{"jsonrpc":"2.0","id":"bye","method":"aria2.shutdown"}"#)
            var answer: String?
            while let message = try socket.receive(timeout: 10_000) {
                if message.contains(#""id":"bye""#) {
                    answer = message
                    break
                }
            }
            #expect(answer?.contains(#""result":"OK""#) == true, "round \(round): \(answer ?? "no answer")")
            let end = await daemon.process.wait(timeout: .seconds(60))
            #expect(end.status == 0, "\(end)")
        }
    }

    /// `-j 50` with fifty downloads from one server: all fifty transfer at once (each holds a connection), as in
    /// aria2 — the cap on connections to one host follows the concurrency asked for (it was 16, silently).
    @Test func fiftyDownloadsFromOneServerAllRun() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        _ = try Self.publish(nginx, "serve-fifty.bin", size: 2 << 20, seed: 50)
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), ["-j", "50"], sandbox: sandbox)
        // 64 KiB/s each: half a minute a download, so all are still running when the fiftieth starts, however
        // loaded the machine.
        let options: [(String, JSON)] = [("split", .string("1")), ("max-download-limit", .string("64K"))]
        for index in 0..<50 {
            let add = try daemon.result("aria2.addUri", [
                .array([.string(nginx.httpURL("serve-fifty.bin"))]), .object(options + [("out", .string("f\(index).bin"))]),
            ])
            #expect(add.string?.count == 16)
        }
        let deadline = ContinuousClock.now + .seconds(60)
        var transferring = 0
        var last: JSON = .null
        while ContinuousClock.now < deadline {
            last = try daemon.result("aria2.tellActive", [.array([.string("gid"), .string("connections"), .string("completedLength")])])
            transferring = last.array?.count { Int($0.text("connections") ?? "0") ?? 0 >= 1 } ?? 0
            if transferring == 50 { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(transferring == 50, "\(transferring) of 50 transferring at once: \(last)")
        #expect(try daemon.result("aria2.getGlobalOption").text("max-concurrent-downloads") == "50")
        #expect(try daemon.result("aria2.pauseAll") == .string("OK"))
        let stop = await daemon.stop()
        #expect(stop.status == 0, "\(stop)")
    }

    /// `kill -9` mid-download, several times at seeded byte counts, and a restart on the same folder each time:
    /// every download comes back in its state and order, the active ones continue, and all end byte-exact.
    @Test func killedDaemonRestoresEveryDownload() async throws {
        let sandbox = try Sandbox("serve")
        defer { sandbox.cleanup() }
        let nginx = try await sharedNginx()
        let size = 6 << 20
        let sources = try (0..<3).map { try Self.publish(nginx, "serve-kill-\($0).bin", size: size, seed: 20 + UInt64($0)) }
        let folder = sandbox.path("dl")
        var generator = SplitMix64(seed: UInt64(ProcessInfo.processInfo.environment["STITCH_SEED"] ?? "") ?? 0x5EED)
        // An aria2.conf-syntax file: a default for new downloads, and settings RPC changes will override.
        let conf = sandbox.path("stitch.conf")
        try Data("max-tries=2\nuser-agent=from-conf/1\nmax-overall-download-limit=32M\nseed-ratio=0\n".utf8)
            .write(to: URL(fileURLWithPath: conf))
        let extra = ["-j", "2", "-c", "1", "--conf-path", conf]
        var daemon = try await ServedDaemon(directory: folder, extra, sandbox: sandbox)
        let fromFile = try daemon.result("aria2.getGlobalOption")
        #expect(fromFile.text("max-tries") == "2" && fromFile.text("user-agent") == "from-conf/1", "\(fromFile)")
        #expect(fromFile.text("max-overall-download-limit") == String(32 << 20))
        var gids: [String] = []
        for index in 0..<3 {
            let options = JSON.object([("out", .string("k\(index).bin"))] + (index == 2 ? [("pause", .string("true"))] : []))
            gids.append(try #require(try daemon.result("aria2.addUri", [.array([.string(nginx.slowURL("serve-kill-\(index).bin"))]), options]).string))
        }
        let order = try daemon.result("stitch.tellAll", [.array([.string("gid")])]).array?.compactMap { $0.text("gid") }
        #expect(order == gids)
        // Global options set over RPC are kept in the catalog and come back over the file's, but the command line
        // (-j 2) wins.
        let settings = JSON.object([
            ("max-tries", .string("4")), ("max-overall-download-limit", .string("64M")),
            ("max-concurrent-downloads", .string("3")),
        ])
        #expect(try daemon.result("aria2.changeGlobalOption", [settings]) == .string("OK"))
        var kills: [String] = []
        for round in 0..<3 {
            let threshold = Int(generator.next() % UInt64(size / 4)) + 64 << 10
            // Wait until the first download has gone `threshold` further, then kill without warning.
            let before = Int(try daemon.result("aria2.tellStatus", [.string(gids[0])]).text("completedLength") ?? "0") ?? 0
            let target = min(size - 1, before + threshold)
            try await daemon.waitFor(gids[0]) { Int($0.text("completedLength") ?? "0") ?? 0 >= target || Self.isComplete($0) }
            daemon.process.kill()
            _ = await daemon.process.wait()
            kills.append("round \(round): killed at ≥ \(target)")
            daemon = try await ServedDaemon(directory: folder, extra, sandbox: sandbox)
            let restored = try daemon.result("stitch.tellAll", [.array([.string("gid"), .string("status")])]).array ?? []
            #expect(restored.compactMap { $0.text("gid") } == gids, "order kept after kill \(round)")
            #expect(restored.last?.text("status") == "paused", "paused kept after kill \(round): \(restored)")
            let global = try daemon.result("aria2.getGlobalOption")
            #expect(global.text("max-tries") == "4" && global.text("max-overall-download-limit") == String(64 << 20), "kept over the file's")
            #expect(global.text("user-agent") == "from-conf/1", "the file's default stays where RPC set nothing")
            #expect(global.text("max-concurrent-downloads") == "2", "the command line wins")
        }
        #expect(try daemon.result("aria2.unpause", [.string(gids[2])]) == .string(gids[2]))
        for gid in gids { try await daemon.waitFor(gid, timeout: .seconds(180), Self.isComplete) }
        for index in 0..<3 {
            #expect(FileManager.default.contents(atPath: folder + "/k\(index).bin").map(Array.init) == sources[index], "k\(index).bin")
        }
        let stop = await daemon.stop()
        #expect(stop.status == 0 && stop.stderr.contains("stopped"), "\(stop)")
        print("DaemonTests.kill: \(kills)")
    }
}
