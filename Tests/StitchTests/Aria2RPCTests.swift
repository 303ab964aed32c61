import Foundation
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchRPC

/// The aria2 JSON-RPC layer without sockets: the bounded JSON reader and writer, the JSON-RPC 2.0 envelope, the
/// secret token, and the methods' shapes over a real manager and the loopback test server.
@Suite struct Aria2RPCTests {
    static func parse(_ text: String, maxDepth: Int = 32) throws(JSONError) -> JSON {
        try JSON.parse(Array(text.utf8), maxDepth: maxDepth)
    }

    static func text(_ value: JSON) -> String { String(decoding: value.serialized, as: UTF8.self) }

    // MARK: JSON

    @Test func jsonReadsAndWritesWhatClientsSend() throws {
        let value = try Self.parse(
            #" {"a": [1, -2, 3.5, 1e3, 9223372036854775808, true, false, null], "s": "x\"\\\/\n\u00e9\ud83d\ude00"} "#)
        #expect(value["a"]?.array == [.integer(1), .integer(-2), .double(3.5), .double(1000), .double(9.223372036854776e18), .bool(true), .bool(false), .null])
        #expect(value["s"]?.string == "x\"\\/\né😀")
        let written = Self.text(value)
        #expect(try Self.parse(written) == value, "round trip: \(written)")
        #expect(Self.text(.string("</script>&")) == #""\u003c/script\u003e\u0026""#, "safe inside a JSONP script")
        #expect(Self.text(.object([("k", .string("\u{01}"))])) == #"{"k":"\u0001"}"#)
    }

    @Test(arguments: [
        "", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "tru", "\"\u{01}\"", "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"",
        "[1] 2", "{\"a\":1,}", "1e999",
    ])
    func malformedJSONIsRefused(_ text: String) {
        #expect(throws: JSONError.self) { try Self.parse(text) }
    }

    /// Deep nesting is refused at the limit, before it could exhaust the stack: 100,000 brackets are a quick error.
    @Test func nestingIsBounded() throws {
        let ok = String(repeating: "[", count: 32) + String(repeating: "]", count: 32)
        #expect(throws: Never.self) { try Self.parse(ok) }
        let deep = String(repeating: "[", count: 33) + String(repeating: "]", count: 33)
        #expect(throws: JSONError.self) { try Self.parse(deep) }
        let hostile = String(repeating: "[", count: 100_000)
        #expect(throws: JSONError.self) { try Self.parse(hostile) }
        #expect(throws: JSONError.self) { try JSON.parse([0x22, 0xFF, 0x22]) }  // not UTF-8
    }

    // MARK: The envelope

    static func call(_ rpc: Aria2RPC, _ body: String) async throws -> JSON {
        let response = try #require(await rpc.handle(Array(body.utf8)), "no response to \(body)")
        return try JSON.parse(response)
    }

    static func errorCode(_ response: JSON) -> Int64? { response["error"]?["code"]?.integer }

    @Test func envelopeErrorsAsJSONRPCSaysAndBatches() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        var limits = Aria2RPC.Limits()
        limits.maxCalls = 3
        let rpc = Aria2RPC(manager: manager, secret: nil, limits: limits)
        let parseError = try await Self.call(rpc, "{nope")
        #expect(Self.errorCode(parseError) == -32700 && parseError["id"] == .null)
        #expect(Self.errorCode(try await Self.call(rpc, "[]")) == -32600)
        #expect(Self.errorCode(try await Self.call(rpc, #"{"id":1}"#)) == -32600)
        // An unknown method is aria2's answer (code 1, HTTP 400), not JSON-RPC's -32601: aria2's clients show it.
        let unknown = await rpc.handle(Array(#"{"id":1,"method":"aria2.nope"}"#.utf8), channel: .full)
        let unknownAnswer = try JSON.parse(try #require(unknown.body))
        #expect(Self.errorCode(unknownAnswer) == 1 && unknown.status == 400)
        #expect(unknownAnswer["error"]?["message"]?.string == "No such method: aria2.nope")
        // aria2's HTTP statuses: 500 for a parse error and for params that are not an array, 200 for any batch.
        #expect(await rpc.handle(Array("{nope".utf8), channel: .full).status == 500)
        #expect(await rpc.handle(Array(#"{"id":1,"method":"aria2.getVersion","params":{}}"#.utf8), channel: .full).status == 500)
        #expect(await rpc.handle(Array(#"{"id":1}"#.utf8), channel: .full).status == 400)
        #expect(await rpc.handle(Array(#"{"id":1,"method":"aria2.getVersion"}"#.utf8), channel: .full).status == 200)
        #expect(await rpc.handle(Array(#"[{"id":1,"method":"aria2.nope"}]"#.utf8), channel: .full).status == 200)
        #expect(Self.errorCode(try await Self.call(rpc, #"{"id":1,"method":"aria2.getVersion","params":{}}"#)) == -32602)
        let version = try await Self.call(rpc, #"{"jsonrpc":"2.0","id":"v","method":"aria2.getVersion"}"#)
        #expect(version["id"] == .string("v") && version["result"]?["version"]?.string == StitchVersion.string)
        // A batch: one response per call with an id, in order; a notification (no id) gets none.
        let batch = try await Self.call(
            rpc,
            #"[{"id":1,"method":"system.listMethods"},{"method":"aria2.getVersion"},{"id":2,"method":"aria2.nope"}]"#)
        #expect(batch.array?.count == 2)
        #expect(batch.array?[0]["id"] == .integer(1) && batch.array?[0]["result"]?.array?.contains(.string("aria2.addUri")) == true)
        #expect(Self.errorCode(batch.array![1]) == 1)
        #expect(await rpc.handle(Array(#"{"method":"aria2.getVersion"}"#.utf8)) == nil, "a notification: no response")
        let tooMany = String(repeating: #"{"id":1,"method":"aria2.getVersion"},"#, count: 4).dropLast()
        #expect(Self.errorCode(try await Self.call(rpc, "[\(tooMany)]")) == -32600)
        await manager.close()
    }

    /// With a secret every call carries `token:SECRET` first (compared in constant time); the listing methods need
    /// none, as in aria2; inside `system.multicall` each call is checked on its own.
    @Test func secretIsRequired() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: "s3cret")
        func message(_ response: JSON) -> String? { response["error"]?["message"]?.string }
        #expect(message(try await Self.call(rpc, #"{"id":1,"method":"aria2.getVersion"}"#)) == "Unauthorized")
        #expect(message(try await Self.call(rpc, #"{"id":1,"method":"aria2.getVersion","params":["token:s3cre"]}"#)) == "Unauthorized")
        #expect(message(try await Self.call(rpc, #"{"id":1,"method":"aria2.getVersion","params":["token:s3cret!"]}"#)) == "Unauthorized")
        #expect(try await Self.call(rpc, #"{"id":1,"method":"aria2.getVersion","params":["token:s3cret"]}"#)["result"] != nil)
        #expect(try await Self.call(rpc, #"{"id":1,"method":"system.listNotifications"}"#)["result"]?.array?.count == 5)
        let multi = try await Self.call(
            rpc,
            #"{"id":1,"method":"system.multicall","params":[[{"methodName":"aria2.getVersion","params":["token:s3cret"]},{"methodName":"aria2.getVersion"}]]}"#
        )
        let results = try #require(multi["result"]?.array)
        #expect(results.count == 2)
        #expect(results[0].array?.first?["version"] != nil, "wrapped in an array, as aria2 does")
        #expect(results[1]["message"]?.string == "Unauthorized")
        #expect(Aria2RPC.constantTimeEquals(Array("abc".utf8), Array("abc".utf8)))
        #expect(!Aria2RPC.constantTimeEquals(Array("abc".utf8), Array("abd".utf8)))
        #expect(!Aria2RPC.constantTimeEquals(Array("abc".utf8), Array("abcd".utf8)))
        await manager.close()
    }

    // MARK: Methods

    /// addUri, tellStatus with and without keys, GIDs by prefix, changePosition, tellWaiting with offsets,
    /// unpause, tellStopped and getGlobalStat, with aria2's shapes (numbers as strings).
    @Test func methodsOverAManager() async throws {
        let f = try ManagerFixture()
        let files = (0..<3).map { ServedFile.random(size: 20_000 + $0, seed: UInt64(700 + $0), etag: "\"e\($0)\"") }
        for (index, file) in files.enumerated() { f.server.serve("/f\(index).bin", file: file) }
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        var gids: [String] = []
        for index in 0..<3 {
            let added = try await Self.call(
                rpc,
                #"{"id":1,"method":"aria2.addUri","params":[["\#(f.server.url("/f\(index).bin"))"],{"out":"f\#(index).bin","pause":"true"}]}"#
            )
            let gid = try #require(added["result"]?.string, "\(Self.text(added))")
            #expect(gid.count == 16 && DownloadID(gid) != nil)
            gids.append(gid)
        }
        let status = try await Self.call(rpc, #"{"id":1,"method":"aria2.tellStatus","params":["\#(gids[0])"]}"#)
        let result = try #require(status["result"])
        #expect(result["status"] == .string("paused") && result["gid"] == .string(gids[0]))
        #expect(result["completedLength"] == .string("0") && result["files"]?.array?.first?["path"] == .string(f.path("f0.bin")))
        let filtered = try await Self.call(
            rpc, #"{"id":1,"method":"aria2.tellStatus","params":["\#(gids[1])",["gid","status"]]}"#)
        #expect(filtered["result"]?.members?.map(\.0) == ["gid", "status"])
        // A unique prefix finds the download; an unknown one is an aria2 error (code 1).
        let prefix = String(gids[2].prefix(12))
        #expect(try await Self.call(rpc, #"{"id":1,"method":"aria2.tellStatus","params":["\#(prefix)",["gid"]]}"#)["result"]?["gid"] == .string(gids[2]))
        let unknown = try await Self.call(rpc, #"{"id":1,"method":"aria2.tellStatus","params":["zz"]}"#)
        #expect(Self.errorCode(unknown) == 1)

        let moved = try await Self.call(rpc, #"{"id":1,"method":"aria2.changePosition","params":["\#(gids[0])",0,"POS_END"]}"#)
        #expect(moved["result"] == .integer(2))
        let waiting = try await Self.call(rpc, #"{"id":1,"method":"aria2.tellWaiting","params":[0,10,["gid"]]}"#)
        #expect(waiting["result"]?.array?.compactMap { $0["gid"]?.string } == [gids[1], gids[2], gids[0]])
        let fromEnd = try await Self.call(rpc, #"{"id":1,"method":"aria2.tellWaiting","params":[-1,2,["gid"]]}"#)
        #expect(fromEnd["result"]?.array?.compactMap { $0["gid"]?.string } == [gids[0], gids[2]], "from the end, backwards")

        for gid in gids { _ = try await Self.call(rpc, #"{"id":1,"method":"aria2.unpause","params":["\#(gid)"]}"#) }
        await manager.waitUntilIdle()
        let stopped = try await Self.call(rpc, #"{"id":1,"method":"aria2.tellStopped","params":[0,10,["gid","status","completedLength"]]}"#)
        let entries = try #require(stopped["result"]?.array)
        #expect(entries.count == 3 && entries.allSatisfy { $0["status"] == .string("complete") })
        // aria2's piece map: one piece each, written; a paused download not started has none yet.
        let done = try await Self.call(rpc, #"{"id":1,"method":"aria2.tellStatus","params":["\#(gids[0])"]}"#)
        #expect(done["result"]?["numPieces"] == .string("1") && done["result"]?["bitfield"] == .string("80"), "\(Self.text(done))")
        #expect(done["result"]?["pieceLength"] == .string("1048576") && done["result"]?["connections"] == .string("0"))
        let asked = try await Self.call(rpc, #"{"id":1,"method":"aria2.tellStatus","params":["\#(gids[0])",["numPieces","bitfield"]]}"#)
        #expect(asked["result"]?.members?.map(\.0) == ["numPieces", "bitfield"], "\(Self.text(asked))")
        #expect(Set(entries.compactMap { $0["completedLength"]?.string }) == Set(files.map { String($0.data.count) }))
        for (index, file) in files.enumerated() { expectFile(f.path("f\(index).bin"), file.data) }
        let stat = try await Self.call(rpc, #"{"id":1,"method":"aria2.getGlobalStat"}"#)
        #expect(stat["result"]?["numStopped"] == .string("3") && stat["result"]?["numActive"] == .string("0"))
        await manager.close()
    }

    /// Options that could write outside the download folder, or that this version does not implement, are
    /// refused by name; nothing is added.
    @Test(arguments: [
        #"{"out":"../escape.bin"}"#, #"{"out":"sub/../../x.bin"}"#, #"{"out":"a//b.bin"}"#, #"{"out":"/etc/passwd"}"#, #"{"dir":"/tmp"}"#,
        #"{"split":"99"}"#, #"{"checksum":"crc9=00"}"#, #"{"all-proxy":"ftp://p:1"}"#, #"{"pause":"maybe"}"#,
        #"{"dir":"../up"}"#, #"{"max-tries":"x"}"#, #"{"gid":"0123456789abcdeg"}"#,
    ])
    func unsafeOrUnknownOptionsAreRefused(_ options: String) async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let rpc = Aria2RPC(manager: manager, secret: nil)
        let response = try await Self.call(
            rpc, #"{"id":1,"method":"aria2.addUri","params":[["http://127.0.0.1:1/x.bin"],\#(options)]}"#)
        #expect(Self.errorCode(response) == 1, "\(Self.text(response))")
        #expect(await manager.downloads().isEmpty)
        let file = try await Self.call(rpc, #"{"id":1,"method":"aria2.addUri","params":[["file:///etc/passwd"]]}"#)
        #expect(Self.errorCode(file) == 1, "only http and https: \(Self.text(file))")
        await manager.close()
    }

    /// aria2's bitfield: piece 0 is the highest bit of the first hex digit, whole bytes, the bits past the last
    /// piece zero; a piece is set only when every byte of it is written.
    @Test func piecesAsAria2ShowsThem() {
        #expect(Aria2RPC.bitfield([true]) == "80")
        #expect(Aria2RPC.bitfield([true, false, false, false, true]) == "88")
        #expect(Aria2RPC.bitfield(Array(repeating: true, count: 9)) == "ff80")
        #expect(Aria2RPC.bitfield([false, true, true, true, false, false, false, true]) == "71")
        let mib: Int64 = 1 << 20
        var progress = TransferProgress(total: 5 * mib / 2, writtenRanges: [0..<(mib + 10), (2 * mib)..<(5 * mib / 2)], pieceLength: mib)
        #expect(progress.writtenPieces == [true, false, true], "the last piece ends at the file's end")
        progress.writtenRanges = [(mib / 2)..<(2 * mib + 1)]
        #expect(progress.writtenPieces == [false, true, false])
        progress.total = nil
        #expect(progress.writtenPieces == nil, "no pieces while the length is unknown")
        #expect(RunReporter.merged([5..<9, 0..<3, 3..<4, 8..<8, 7..<12]) == [0..<4, 5..<12])
    }

    @Test func windowsAsAria2Counts() {
        let list = [0, 1, 2, 3, 4]
        #expect(Aria2RPC.window(list, offset: 1, count: 2) == [1, 2])
        #expect(Aria2RPC.window(list, offset: 4, count: 9) == [4])
        #expect(Aria2RPC.window(list, offset: 5, count: 9) == [])
        #expect(Aria2RPC.window(list, offset: -1, count: 3) == [4, 3, 2])
        #expect(Aria2RPC.window(list, offset: -5, count: 3) == [0])
        #expect(Aria2RPC.window(list, offset: -6, count: 3) == [])
        #expect(Aria2RPC.window(list, offset: 0, count: 0) == [])
        // What a client sends is not trusted to stay small (offset + count overflowed and trapped).
        #expect(Aria2RPC.window(list, offset: 1, count: .max) == [1, 2, 3, 4])
        #expect(Aria2RPC.window(list, offset: -1, count: .max) == [4, 3, 2, 1, 0])
        #expect(Aria2RPC.window(list, offset: .min, count: .max) == [])
        #expect(Aria2RPC.window(list, offset: .max, count: .max) == [])
        #expect(Aria2RPC.window(list, offset: 0, count: .min) == [])
    }
}
