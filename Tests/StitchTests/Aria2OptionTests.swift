import Foundation
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchRPC

/// aria2's options as front-ends read and send them (Aria2OptionTable.swift, Aria2RPC+OptionValues.swift): every
/// option reported with what Stitch does, whole option objects taken, changes Stitch cannot make refused by name,
/// and docs/rpc.md's table the code's.
@Suite struct Aria2OptionTests {
    /// A call's whole response.
    static func call(_ rpc: Aria2RPC, _ method: String, _ params: [JSON] = []) async throws -> JSON {
        let body = JSON.object([("jsonrpc", .string("2.0")), ("id", .integer(1)), ("method", .string(method)),
            ("params", .array(params))]).serialized
        return try JSON.parse(try #require(await rpc.handle(body)))
    }

    static func result(_ rpc: Aria2RPC, _ method: String, _ params: [JSON] = []) async throws -> JSON {
        let response = try await call(rpc, method, params)
        return try #require(response["result"], "\(method): \(String(decoding: response.serialized, as: UTF8.self))")
    }

    static func error(_ rpc: Aria2RPC, _ method: String, _ params: [JSON] = []) async throws -> (code: Int64, message: String) {
        let response = try await call(rpc, method, params)
        let error = try #require(response["error"], "\(method) did not fail: \(String(decoding: response.serialized, as: UTF8.self))")
        return (error["code"]?.integer ?? 0, error["message"]?.string ?? "")
    }

    static func strings(_ value: JSON) -> [String: String] {
        Dictionary(uniqueKeysWithValues: (value.members ?? []).map { ($0.0, $0.1.string ?? "<not a string>") })
    }

    /// A paused download of a file the fixture serves.
    static func paused(_ f: ManagerFixture, _ rpc: Aria2RPC, _ name: String, _ options: [(String, JSON)] = []) async throws -> String {
        f.server.serve("/\(name)", file: ServedFile.random(size: 10_000, seed: 71, etag: "\"o\""))
        let gid = try await result(rpc, "aria2.addUri", [
            .array([.string(f.server.url("/\(name)"))]), .object([("pause", .string("true"))] + options),
        ])
        return try #require(gid.string)
    }

    /// The proxy options: shown only when set.
    static let proxyNames: Set<String> = [
        "all-proxy", "all-proxy-user", "all-proxy-passwd", "http-proxy", "http-proxy-user", "http-proxy-passwd",
        "https-proxy", "https-proxy-user", "https-proxy-passwd", "no-proxy",
    ]

    // MARK: Reading

    /// getOption lists every download option of aria2 that has a value, sorted, every value a string, with what
    /// Stitch does (the manager's settings where the download has none of its own); getGlobalOption every option
    /// Stitch shows, the secret never.
    @Test func optionsAreReportedWhole() async throws {
        let f = try ManagerFixture()
        let manager = try f.open { $0.retry.maxRetries = 7 }
        let rpc = Aria2RPC(manager: manager, secret: nil)
        rpc.reportDaemonOptions([
            "rpc-listen-port": "6801", "log-level": "notice", "rpc-listen-all": "false", "rpc-secure": "false",
            "rpc-allow-origin-all": "false", "rpc-max-request-size": "16777216",
        ])
        let gid = try await Self.paused(f, rpc, "r.bin", [("out", .string("r.bin")), ("split", .string("3"))])
        let shown = try await Self.result(rpc, "aria2.getOption", [.string(gid)])
        let names = try #require(shown.members).map(\.0)
        #expect(names == names.sorted(), "sorted as aria2's map")
        let values = Self.strings(shown)
        #expect(!values.values.contains("<not a string>"))
        let expected = Aria2Option.table.filter { $0.scope == .download && $0.shown != .none }.map(\.name)
        let unsetHere = Set(["checksum", "header", "referer", "http-user", "http-passwd"]).union(Self.proxyNames)
        #expect(Set(names).isSuperset(of: Set(expected).subtracting(unsetHere)), "missing: \(Set(expected).subtracting(names).sorted())")
        #expect(values["split"] == "3" && values["max-connection-per-server"] == "3")
        #expect(values["max-tries"] == "8", "the manager's retries, as aria2 counts tries")
        #expect(values["out"] == "r.bin" && values["dir"] == f.downloads && values["continue"] == "true")
        #expect(values["piece-length"] == "1048576" && values["user-agent"] == "stitch/\(StitchVersion.string)")
        #expect(values["all-proxy"] == nil && values["pause"] == nil && values["rpc-listen-port"] == nil)

        let global = try await Self.result(rpc, "aria2.getGlobalOption")
        let globalNames = try #require(global.members).map(\.0)
        #expect(globalNames == globalNames.sorted())
        let globals = Self.strings(global)
        #expect(globals["rpc-listen-port"] == "6801" && globals["max-concurrent-downloads"] == "5" && globals["split"] == "4")
        #expect(globals["rpc-secret"] == nil && globals["out"] == nil && globals["checksum"] == nil)
        for option in Aria2Option.table where option.scope != .download {
            if case .value(let value) = option.shown { #expect(globals[option.name] == value, "\(option.name)") }
        }
        let unset: Set<String> = Set(["out", "checksum", "header", "referer", "http-user", "http-passwd", "log", "load-cookies"]).union(Self.proxyNames)
        for option in Aria2Option.table where option.shown == .computed && !unset.contains(option.name) {
            #expect(globals[option.name] != nil, "\(option.name) is shown: \(option.name)")
        }
        await manager.close()
    }

    // MARK: changeOption

    /// A settings dialog's whole object (webui-aria2 sends every key it knows, most unchanged, with start-up keys
    /// and JSON booleans among them): the one change made is applied, the rest change nothing.
    @Test func aDialogsWholeObjectChangesOnlyWhatChanged() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        let gid = try await Self.paused(f, rpc, "d.bin", [("user-agent", .string("agent/1"))])
        let before = try await Self.result(rpc, "aria2.getOption", [.string(gid)])
        var members = try #require(before.members).map { name, value in
            (name, name == "max-download-limit" ? JSON.string("2M") : value)
        }
        // Keys getOption did not list, sent with the dialog's own defaults; a daemon's keys (not a download's).
        let extra: [(String, JSON)] = [
            ("all-proxy", .string("")), ("referer", .string("")), ("checksum", .string("")), ("enable-async-dns6", .bool(false)),
            ("daemon", .bool(true)), ("enable-rpc", .string("false")), ("rpc-listen-all", .string("true")), ("quiet", .string("true")),
            ("bt-max-peers", .string("55")), ("seed-time", .string("")), ("select-file", .string("")),
        ]
        let listed = Set(members.map(\.0))
        members += extra.filter { !listed.contains($0.0) }
        #expect(try await Self.result(rpc, "aria2.changeOption", [.string(gid), .object(members)]) == .string("OK"))
        let after = Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(gid)]))
        var expected = Self.strings(before)
        expected["max-download-limit"] = String(2 << 20)
        #expect(after == expected)
        let id = try #require(DownloadID(gid))
        let snapshot = try #require(await manager.download(id))
        #expect(snapshot.rateLimit == 2 << 20 && snapshot.headers["User-Agent"] == "agent/1")
        await manager.close()
    }

    /// Changes Stitch cannot make refuse the whole call, naming every such key; a malformed value is aria2's
    /// error naming the key and the value. Nothing is changed either way.
    @Test func refusalsNameEveryKeyAndChangeNothing() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        let gid = try await Self.paused(f, rpc, "n.bin")
        let before = Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(gid)]))
        let refused = try await Self.error(rpc, "aria2.changeOption", [.string(gid), .object([
            ("max-download-limit", .string("1M")), ("dry-run", .string("true")),
            ("piece-length", .string("2M")), ("no-such-option", .string("1")), ("out", .string("other.bin")),
            ("check-integrity", .string("false")),
        ])])
        #expect(refused.code == 1)
        for name in ["dry-run", "piece-length", "no-such-option", "out"] {
            #expect(refused.message.contains(name), "\(name): \(refused.message)")
        }
        #expect(!refused.message.contains("max-download-limit") && !refused.message.contains("check-integrity"))
        for (key, value, detail) in [("split", "x", "\"x\""), ("max-tries", "-1", "\"-1\""), ("continue", "yes", "\"yes\""),
            ("min-split-size", "1K", "\"1K\""), ("file-allocation", "bad", "\"bad\"")] {
            let malformed = try await Self.error(rpc, "aria2.changeOption", [.string(gid), .object([
                ("max-download-limit", .string("1M")), (key, .string(value)),
            ])])
            #expect(malformed.code == 1 && malformed.message.hasPrefix("We encountered a problem while processing the option '--\(key)'"), "\(malformed)")
            #expect(malformed.message.contains(detail), "\(malformed)")
        }
        let nested = try await Self.error(rpc, "aria2.changeOption", [.string(gid), .object([("split", .object([("a", .string("1"))]))])])
        #expect(nested.message.contains("split"))
        let many = (0..<10_000).map { ("k\($0)", JSON.string("1")) }
        let tooMany = try await Self.error(rpc, "aria2.changeOption", [.string(gid), .object(many)])
        #expect(tooMany.message.contains("at most"), "\(tooMany.message)")
        #expect(try await Self.error(rpc, "aria2.changeGlobalOption", [.object(many)]).message.contains("at most"))
        #expect(Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(gid)])) == before, "nothing changed")
        await manager.close()
    }

    /// Values equal by what they mean are no change (sizes with units, numbers); an empty value unsets, bringing
    /// back the default for new downloads; a header sent back as shown keeps the credentials it hides.
    @Test func emptyUnsetsAndHiddenValuesAreKept() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        let gid = try await Self.paused(f, rpc, "u.bin", [
            ("http-user", .string("ann")), ("http-passwd", .string("pw")), ("header", .array([.string("X-A: 1")])),
            ("max-tries", .string("3")),
        ])
        let id = try #require(DownloadID(gid))
        let shown = Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(gid)]))
        #expect(shown["http-user"] == "ann" && shown["http-passwd"] == "(hidden)" && shown["max-tries"] == "3")
        let header = try #require(shown["header"])
        #expect(header.contains("Authorization: (hidden)") && header.contains("X-A: 1") && !header.contains("pw"))
        // The header list edited as a dialog edits it: one line added, the hidden one sent back as shown.
        _ = try await Self.result(rpc, "aria2.changeOption", [.string(gid), .object([
            ("header", .string(header + "\nX-B: 2")), ("max-download-limit", .string("1024K")),
        ])])
        var snapshot = try #require(await manager.download(id))
        let credentials = "Basic " + Data("ann:pw".utf8).base64EncodedString()
        #expect(snapshot.headers["Authorization"] == credentials && snapshot.headers["X-B"] == "2" && snapshot.headers["X-A"] == "1")
        #expect(try await Self.result(rpc, "aria2.changeOption", [.string(gid), .object([("max-download-limit", .string("1M"))])]) == .string("OK"))
        // The password alone (AriaNg sends one key per call) keeps the user.
        _ = try await Self.result(rpc, "aria2.changeOption", [.string(gid), .object([("http-passwd", .string("new"))])])
        snapshot = try #require(await manager.download(id))
        #expect(snapshot.headers["Authorization"] == "Basic " + Data("ann:new".utf8).base64EncodedString())
        // Unset: the manager's own again; with a default set for new downloads, that default.
        _ = try await Self.result(rpc, "aria2.changeOption", [.string(gid), .object([("max-tries", .string("")), ("max-download-limit", .string(""))])])
        snapshot = try #require(await manager.download(id))
        #expect(snapshot.tuning.maxRetries == nil && snapshot.rateLimit == nil)
        _ = try await Self.result(rpc, "aria2.changeGlobalOption", [.object([("max-tries", .string("9"))])])
        _ = try await Self.result(rpc, "aria2.changeOption", [.string(gid), .object([("max-tries", .string("2"))])])
        _ = try await Self.result(rpc, "aria2.changeOption", [.string(gid), .object([("max-tries", .string(""))])])
        #expect(Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(gid)]))["max-tries"] == "9")
        await manager.close()
    }

    // MARK: changeGlobalOption

    /// A global settings dialog's save: several options in one call, all applied; a download option is the
    /// default for new downloads (an addUri's own still wins); a change Stitch cannot make refuses the save and
    /// changes nothing, naming the key; the served folder sent back unchanged is no change.
    @Test func globalOptionsSetTheDaemonAndNewDownloads() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        rpc.reportDaemonOptions(["log-level": "notice", "rpc-listen-port": "6800"])
        #expect(try await Self.result(rpc, "aria2.changeGlobalOption", [.object([
            ("max-tries", .string("3")), ("max-overall-download-limit", .string("8M")), ("split", .string("2")),
            ("dir", .string(f.downloads)), ("max-concurrent-downloads", .string("2")), ("user-agent", .string("ua/2")),
            ("seed-ratio", .string("2.0")), ("log-level", .string("notice")),
        ])]) == .string("OK"))
        let configuration = await manager.configuration
        #expect(configuration.rateLimit == 8 << 20 && configuration.maxConcurrentDownloads == 2)
        let globals = Self.strings(try await Self.result(rpc, "aria2.getGlobalOption"))
        #expect(globals["max-tries"] == "3" && globals["split"] == "2" && globals["max-overall-download-limit"] == String(8 << 20))
        let plain = try await Self.paused(f, rpc, "g1.bin")
        let own = try await Self.paused(f, rpc, "g2.bin", [("max-tries", .string("5")), ("max-connection-per-server", .string("4"))])
        let first = Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(plain)]))
        #expect(first["max-tries"] == "3" && first["split"] == "2" && first["user-agent"] == "ua/2")
        let second = Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(own)]))
        #expect(second["max-tries"] == "5" && second["split"] == "4", "an addUri's own options win: \(second)")

        let refused = try await Self.error(rpc, "aria2.changeGlobalOption", [.object([
            ("max-concurrent-downloads", .string("4")), ("dir", .string("/tmp")), ("http-user", .string("u")),
            ("rpc-listen-port", .string("7000")),
        ])])
        for name in ["dir", "http-user", "rpc-listen-port"] { #expect(refused.message.contains(name), "\(refused.message)") }
        #expect(await manager.configuration.maxConcurrentDownloads == 2, "a refused save changes nothing")
        // Unset: back to the manager's own.
        _ = try await Self.result(rpc, "aria2.changeGlobalOption", [.object([("max-tries", .string("")), ("max-overall-download-limit", .string(""))])])
        let reset = Self.strings(try await Self.result(rpc, "aria2.getGlobalOption"))
        #expect(reset["max-tries"] == "6" && reset["max-overall-download-limit"] == "0")
        await manager.close()
    }

    /// Global options set over RPC are kept in the catalog: a new daemon on the same catalog has them back,
    /// except those its command line gives.
    @Test func globalOptionsAreKeptAcrossARestart() async throws {
        let f = try ManagerFixture()
        var manager = try f.open()
        var rpc = Aria2RPC(manager: manager, secret: nil)
        _ = try await Self.result(rpc, "aria2.changeGlobalOption", [.object([
            ("max-tries", .string("3")), ("max-concurrent-downloads", .string("2")), ("max-overall-download-limit", .string("8M")),
            ("user-agent", .string("kept/1")), ("split", .string("2")),
        ])])
        _ = try await Self.result(rpc, "aria2.changeGlobalOption", [.object([("split", .string(""))])])
        await manager.close()
        manager = try f.open()
        rpc = Aria2RPC(manager: manager, secret: nil)
        #expect(await rpc.restoreKeptOptions(overriddenBy: ["max-overall-download-limit"]).isEmpty)
        let globals = Self.strings(try await Self.result(rpc, "aria2.getGlobalOption"))
        #expect(globals["max-tries"] == "3" && globals["max-concurrent-downloads"] == "2" && globals["user-agent"] == "kept/1")
        #expect(globals["max-overall-download-limit"] == "0", "given on the command line: not restored")
        #expect(globals["split"] == "4", "unset before the restart stays unset")
        let gid = try await Self.paused(f, rpc, "k.bin")
        #expect(Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(gid)]))["user-agent"] == "kept/1")
        // A kept value this version would refuse is reported, not taken.
        try await manager.keepSettings([Aria2RPC.keptPrefix + "max-tries": "many"])
        let problems = await Aria2RPC(manager: manager, secret: nil).restoreKeptOptions(overriddenBy: [])
        #expect(problems.count == 1 && problems[0].contains("max-tries"), "\(problems)")
        await manager.close()
    }

    /// A daemon given no per-host cap has it follow the concurrency (16 at the least), so that as many downloads
    /// from one server as asked run at once; one given a cap keeps it.
    @Test func theHostCapFollowsTheConcurrency() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        _ = try await Self.result(rpc, "aria2.changeGlobalOption", [.object([("max-concurrent-downloads", .string("50"))])])
        #expect(await manager.configuration.maxConnectionsPerHost == 16, "a cap of its own is kept")
        rpc.hostCapFollowsConcurrency()
        _ = try await Self.result(rpc, "aria2.changeGlobalOption", [.object([("max-concurrent-downloads", .string("40"))])])
        #expect(await manager.configuration.maxConnectionsPerHost == 40)
        _ = try await Self.result(rpc, "aria2.changeGlobalOption", [.object([("max-concurrent-downloads", .string("3"))])])
        #expect(await manager.configuration.maxConnectionsPerHost == 16)
        await manager.close()
    }

    // MARK: Paths

    /// `out` may name a path inside the download folder, as aria2's: its folders are made and the file lands
    /// there. Through a link that leads out of the folder it is refused, and nothing is added.
    @Test func outMayNameAPathInsideTheFolder() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 30_000, seed: 72, etag: "\"p\"")
        f.server.serve("/p.bin", file: file)
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        let gid = try await Self.result(rpc, "aria2.addUri", [
            .array([.string(f.server.url("/p.bin"))]), .object([("out", .string("sub/inner/p.bin"))]),
        ])
        await manager.waitUntilIdle()
        expectFile(f.path("sub/inner/p.bin"), file.data)
        #expect(Self.strings(try await Self.result(rpc, "aria2.getOption", [gid]))["out"] == "p.bin")
        let outside = try TemporaryDirectory()
        try FileManager.default.createSymbolicLink(atPath: f.path("away"), withDestinationPath: outside.path)
        let refused = try await Self.error(rpc, "aria2.addUri", [
            .array([.string(f.server.url("/p.bin"))]), .object([("out", .string("away/p.bin"))]),
        ])
        #expect(refused.message.contains("outside"), "\(refused.message)")
        #expect(await manager.downloads().count == 1 && (try? FileManager.default.contentsOfDirectory(atPath: outside.path))?.isEmpty == true)
        await manager.close()
    }

    /// aria2's `gid` option: a download added with it has that GID; one that another download has, or that is not
    /// 16 hex digits, is refused and nothing is added.
    @Test func aGivenGIDIsKeptOrRefused() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        let gid = try await Self.paused(f, rpc, "g.bin", [("gid", .string("2089B05ECCA3D829"))])
        #expect(gid == "2089b05ecca3d829")
        #expect(try await Self.result(rpc, "aria2.tellStatus", [.string(gid)])["status"]?.string == "paused")
        for bad in ["2089b05ecca3d829", "12345", "0000000000000000", "zz89b05ecca3d829"] {
            let refused = try await Self.error(rpc, "aria2.addUri", [
                .array([.string(f.server.url("/g.bin"))]), .object([("gid", .string(bad)), ("pause", .string("true"))]),
            ])
            #expect(refused.code == 1 && refused.message.contains(bad.count == 16 && bad != "0000000000000000" && !bad.hasPrefix("zz") ? "another download" : "16 hex digits"), "\(bad): \(refused.message)")
        }
        #expect(await manager.downloads().count == 1)
        await manager.close()
    }

    /// getOption's placeholders are not values: copied into an addUri (a client re-adding a download from its
    /// options) they are left out, never sent as credentials; credentials are never a default for new downloads,
    /// so getGlobalOption has none to show; a refused add leaves no folder behind.
    @Test func placeholdersAndCredentialDefaults() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        let gid = try await Self.paused(f, rpc, "h.bin", [
            ("header", .array([.string("Authorization: (hidden)"), .string("X-A: 1")])), ("http-user", .string("ann")),
            ("http-passwd", .string("(hidden)")),
        ])
        let id = try #require(DownloadID(gid))
        let snapshot = try #require(await manager.download(id))
        #expect(snapshot.headers["Authorization"] == nil && snapshot.headers["X-A"] == "1", "\(snapshot.headers)")
        // A new hidden line with the placeholder and no value to keep is left out too.
        _ = try await Self.result(rpc, "aria2.changeOption", [.string(gid), .object([("header", .string("X-A: 1\nCookie: (hidden)"))])])
        #expect(try #require(await manager.download(id)).headers["Cookie"] == nil)
        for header in ["Authorization: Bearer t", "X-A: 1\nCookie: s=1"] {
            let refused = try await Self.error(rpc, "aria2.changeGlobalOption", [.object([("header", .string(header))])])
            #expect(refused.message.contains("credentials"), "\(refused.message)")
        }
        #expect(Self.strings(try await Self.result(rpc, "aria2.getGlobalOption"))["header"] == nil)
        let secret = try await Self.error(rpc, "aria2.addUri", [.array([.string(f.server.url("/h.bin"))]), .object([("all-proxy", .string("ftp://u:hunter2@h:21"))])])
        #expect(!secret.message.contains("hunter2"), "a password is never repeated: \(secret.message)")
        // A proxy's password is taken, and shown back as the placeholder only.
        let proxied = try await Self.result(rpc, "aria2.addUri", [.array([.string(f.server.url("/p.bin"))]), .object([
            ("pause", .string("true")), ("all-proxy", .string("http://127.0.0.1:3128")), ("all-proxy-user", .string("al")),
            ("all-proxy-passwd", .string("hunter2")),
        ])])
        let proxiedOptions = Self.strings(try await Self.result(rpc, "aria2.getOption", [.string(try #require(proxied.string))]))
        #expect(proxiedOptions["all-proxy"] == "http://127.0.0.1:3128" && proxiedOptions["all-proxy-user"] == "al")
        #expect(proxiedOptions["all-proxy-passwd"] == "(hidden)")
        let refusedInURL = try await Self.error(rpc, "aria2.changeGlobalOption", [.object([("all-proxy", .string("http://u:hunter2@h:1"))])])
        #expect(refusedInURL.message.contains("all-proxy-passwd") && !refusedInURL.message.contains("hunter2"), "\(refusedInURL.message)")
        // A bad position refuses the add before any folder is made.
        let bad = try await Self.call(rpc, "aria2.addUri", [.array([.string(f.server.url("/h.bin"))]), .object([("out", .string("made/deeper/h.bin"))]), .string("x")])
        #expect(bad["error"] != nil && !FileManager.default.fileExists(atPath: f.path("made")))
        // An add the manager refuses removes the folders it made.
        let taken = try await Self.call(rpc, "aria2.addUri", [.array([.string("http://")]), .object([("dir", .string("d1")), ("out", .string("e/h.bin"))])])
        #expect(taken["error"] != nil && !FileManager.default.fileExists(atPath: f.path("d1")))
        await manager.close()
    }

    /// A length near the largest a server can announce is no crash: no piece map is drawn for it.
    @Test func hugeLengthsDrawNoPieces() {
        let progress = TransferProgress(total: .max, writtenRanges: [0..<(1 << 20)], pieceLength: 1 << 51)
        #expect(progress.writtenPieces?.count == 4_096)
        let crafted = TransferProgress(total: .max - 1, writtenRanges: [0..<(.max - 1)], pieceLength: 1 << 20)
        #expect(crafted.writtenPieces == nil)
        let last = TransferProgress(total: .max, writtenRanges: [(.max - 10)..<(.max)], pieceLength: 1 << 51)
        #expect(last.writtenPieces?.last == false, "\(String(describing: last.writtenPieces?.suffix(1)))")
    }

    // MARK: The table

    /// The table is aria2's option set, and docs/rpc.md's table is the table: one row per option with what Stitch
    /// does and why.
    @Test func theDocumentedTableIsTheCodes() throws {
        let table = Aria2Option.table
        #expect(table.map(\.name) == table.map(\.name).sorted() && Set(table.map(\.name)).count == table.count)
        #expect(table.count == 206)
        for option in table where option.handling == .applied || option.handling == .addOnly {
            #expect(option.scope != .startup, "\(option.name)")
        }
        let docs = try String(contentsOfFile: Self.repository + "/docs/rpc.md", encoding: .utf8)
        let rows = docs.split(separator: "\n").filter { $0.hasPrefix("| `") }
        var documented: [String: String] = [:]
        for row in rows {
            let cells = row.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count >= 5, cells[1].hasPrefix("`"), cells[1].hasSuffix("`") else { continue }
            documented[String(cells[1].dropFirst().dropLast())] = cells[2] + " | " + cells[3] + " | " + cells[4]
        }
        var missing: [String] = []
        for option in table {
            let row = Self.documentedRow(option)
            if documented[option.name] != row { missing.append("| `\(option.name)` | \(row) |") }
        }
        #expect(missing.isEmpty, "docs/rpc.md's option table differs; these rows are right:\n\(missing.joined(separator: "\n"))")
    }

    static func documentedRow(_ option: Aria2Option) -> String {
        let scope = switch option.scope {
        case .download: "download"
        case .global: "daemon"
        case .startup: "start-up"
        }
        let handling = switch option.handling {
        case .applied: "applied"
        case .addOnly: "when added"
        case .ignored: "ignored"
        case .fixed: "fixed"
        }
        let shown = switch option.shown {
        case .none: "—"
        case .value(let value): "`\(value)`"
        case .computed: "its value"
        }
        return "\(scope) | \(handling), shows \(shown) | \(option.why)"
    }

    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
}
