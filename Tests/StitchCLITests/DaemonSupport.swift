import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Testing

/// A `stitch serve` process on a folder of a sandbox, listening on a free loopback port.
final class ServedDaemon: Sendable {
    let process: StitchProcess
    let port: Int
    let directory: String

    /// Starts `stitch serve --dir DIRECTORY --rpc-listen 127.0.0.1:0 EXTRA…` and waits until it says where it
    /// listens.
    init(directory: String, _ extra: [String] = [], environment: [String: String] = [:], sandbox: Sandbox) async throws {
        self.directory = directory
        process = try StitchProcess(
            ["serve", "--dir", directory, "--rpc-listen", "127.0.0.1:0"] + extra, environment: environment,
            directory: sandbox.directory)
        var port: Int?
        let deadline = ContinuousClock.now + .seconds(60)
        while port == nil, ContinuousClock.now < deadline, process.isRunning {
            port = Self.port(in: process.stderrSoFar)
            if port == nil { try await Task.sleep(for: .milliseconds(20)) }
        }
        guard let port else {
            let result = await process.wait(timeout: .seconds(5))
            throw DaemonTestError("stitch serve did not start: \(result)")
        }
        self.port = port
    }

    static func port(in log: String) -> Int? {
        guard let range = log.range(of: #" on 127\.0\.0\.1:(\d+)"#, options: .regularExpression) else { return nil }
        return Int(log[range].split(separator: ":").last ?? "")
    }

    /// One JSON-RPC call over POST; the whole response object.
    func call(_ method: String, _ params: [JSON] = [], id: JSON = .integer(1)) throws -> JSON {
        let body = JSON.object([("jsonrpc", .string("2.0")), ("id", id), ("method", .string(method)),
            ("params", .array(params))]).serialized
        let reply = try post(body)
        let answer = try JSON.parse(reply.body)
        // aria2's statuses: 200 for a result; for an error 400 (a method's failure, code 1), 500 (-32602, -32700).
        let code = answer["error"]?["code"]?.integer
        let expected = code == nil ? 200 : code == 1 || code == -32600 ? 400 : 500
        #expect(reply.status == expected, "\(method): HTTP \(reply.status)")
        return answer
    }

    /// The `result` of a call that must succeed.
    func result(_ method: String, _ params: [JSON] = []) throws -> JSON {
        let response = try call(method, params)
        guard let result = response["result"] else { throw DaemonTestError("\(method) failed: \(response)") }
        return result
    }

    /// The `error` of a call that must fail.
    func error(_ method: String, _ params: [JSON] = []) throws -> (code: Int64, message: String) {
        let response = try call(method, params)
        guard let error = response["error"], let code = error["code"]?.integer, let message = error["message"]?.string
        else { throw DaemonTestError("\(method) did not fail: \(response)") }
        return (code, message)
    }

    func post(_ body: [UInt8], headers: [(String, String)] = []) throws -> RawHTTP.Reply {
        try RawHTTP.request(
            port: port, method: "POST", path: "/jsonrpc",
            headers: [("Host", "127.0.0.1:\(port)"), ("Content-Type", "application/json")] + headers, body: body)
    }

    func get(_ target: String, headers: [(String, String)] = []) throws -> RawHTTP.Reply {
        try RawHTTP.request(port: port, method: "GET", path: target, headers: [("Host", "127.0.0.1:\(port)")] + headers)
    }

    /// Waits until `condition` holds for the download's status (polling tellStatus), or throws after `timeout`.
    @discardableResult
    func waitFor(
        _ gid: String, timeout: Duration = .seconds(120), _ condition: (JSON) -> Bool
    ) async throws -> JSON {
        let deadline = ContinuousClock.now + timeout
        var last: JSON = .null
        while ContinuousClock.now < deadline {
            last = try result("aria2.tellStatus", [.string(gid)])
            if condition(last) { return last }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw DaemonTestError("timed out waiting for \(gid): last \(last)")
    }

    /// Waits until the daemon's log has said `text` at least `count` times (the log is the daemon's answer to a
    /// signal), or throws after `timeout`.
    func waitForLog(_ text: String, count: Int = 1, timeout: Duration = .seconds(60)) async throws {
        let deadline = ContinuousClock.now + timeout
        while process.stderrSoFar.components(separatedBy: text).count - 1 < count {
            guard ContinuousClock.now < deadline, process.isRunning else {
                throw DaemonTestError("the log did not say '\(text)' \(count) times: \(process.stderrSoFar)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Whether the process still runs (a TLS listener cannot be asked in plain HTTP).
    func processIsServing() throws -> Bool { process.isRunning }

    func stop() async -> CommandResult {
        process.send(SIGTERM)
        return await process.wait(timeout: .seconds(60))
    }
}

struct DaemonTestError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A plain HTTP/1.1 exchange over a fresh loopback connection (`Connection: close`), byte for byte.
enum RawHTTP {
    struct Reply {
        var status: Int
        var headers: [String: String]
        var body: [UInt8]
        var text: String { String(decoding: body, as: UTF8.self) }
    }

    static func request(
        port: Int, method: String, path: String, headers: [(String, String)], body: [UInt8] = [],
        declaredLength: Int? = nil
    ) throws -> Reply {
        guard let fd = connectToLoopback(port: port) else { throw DaemonTestError("cannot connect to \(port)") }
        defer { close(fd) }
        var head = "\(method) \(path) HTTP/1.1\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if method == "POST" { head += "Content-Length: \(declaredLength ?? body.count)\r\n" }
        head += "Connection: close\r\n\r\n"
        try sendAll(fd, Array(head.utf8) + body)
        let bytes = try readToEnd(fd)
        do { return try parse(bytes) } catch {
            throw DaemonTestError("\(method) \(path) \(String(decoding: body.prefix(200), as: UTF8.self)): \(error)")
        }
    }

    static func sendAll(_ fd: Int32, _ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 {
                if errno == EINTR { continue }
                if errno == EPIPE || errno == ECONNRESET { return }  // the server answered early and closed
                throw DaemonTestError("send failed: errno \(errno)")
            }
            sent += n
        }
    }

    static func readToEnd(_ fd: Int32, timeout: Int32 = 60_000) throws -> [UInt8] {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, timeout) > 0 else { throw DaemonTestError("no answer in time") }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0, errno == EINTR { continue }
            if n <= 0 { break }
            bytes += buffer[..<n]
        }
        return bytes
    }

    static func parse(_ bytes: [UInt8]) throws -> Reply {
        let separator: [UInt8] = [13, 10, 13, 10]
        guard let end = (0..<max(0, bytes.count - 3)).first(where: { Array(bytes[$0..<$0 + 4]) == separator }) else {
            throw DaemonTestError("no HTTP head in \(bytes.count) bytes: \(String(decoding: bytes, as: UTF8.self))")
        }
        let lines = String(decoding: bytes[..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let status = Int(lines[0].split(separator: " ").dropFirst().first ?? "") ?? 0
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        var body = Array(bytes[(end + 4)...])
        if let length = headers["content-length"].flatMap(Int.init), length < body.count { body = Array(body[..<length]) }
        return Reply(status: status, headers: headers, body: body)
    }
}

/// A minimal WebSocket client (RFC 6455): the handshake, masked text frames out, unmasked frames in.
final class TestWebSocket {
    let fd: Int32
    private var pending: [UInt8] = []

    init(port: Int, headers: [(String, String)] = []) throws {
        guard let fd = connectToLoopback(port: port) else { throw DaemonTestError("cannot connect to \(port)") }
        self.fd = fd
        var head = "GET /jsonrpc HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        head += "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        head += "\r\n"
        try RawHTTP.sendAll(fd, Array(head.utf8))
        // The head of the answer, up to its blank line; what follows is the first frames.
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4_096)
        while !bytes.contains(13) || String(decoding: bytes, as: UTF8.self).range(of: "\r\n\r\n") == nil {
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 30_000) > 0 else { throw DaemonTestError("no upgrade answer") }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw DaemonTestError("closed during the upgrade: \(String(decoding: bytes, as: UTF8.self))") }
            bytes += buffer[..<n]
        }
        let text = String(decoding: bytes, as: UTF8.self)
        let headEnd = text.range(of: "\r\n\r\n")!
        let headText = String(text[..<headEnd.lowerBound])
        guard headText.hasPrefix("HTTP/1.1 101"),
            headText.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        else {
            close(fd)
            throw DaemonTestError("upgrade refused: \(text)")
        }
        pending = Array(bytes[(Array(text[..<headEnd.upperBound].utf8).count)...])
    }

    deinit { close(fd) }

    func send(_ text: String) throws { try sendFrame(opcode: 1, Array(text.utf8)) }

    func sendFrame(opcode: UInt8, _ payload: [UInt8], declaredLength: UInt64? = nil) throws {
        var frame: [UInt8] = [0x80 | opcode]
        let length = declaredLength ?? UInt64(payload.count)
        if length < 126 {
            frame.append(0x80 | UInt8(length))
        } else if length <= 0xFFFF {
            frame += [0x80 | 126, UInt8(length >> 8), UInt8(length & 0xFF)]
        } else {
            frame.append(0x80 | 127)
            for shift in stride(from: 56, through: 0, by: -8) { frame.append(UInt8((length >> UInt64(shift)) & 0xFF)) }
        }
        let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        try RawHTTP.sendAll(fd, frame)
    }

    /// The next text message, or nil when the server closed the connection (or nothing came in `timeout` ms).
    func receive(timeout: Int32 = 30_000) throws -> String? {
        while true {
            if let (opcode, payload, used) = Self.frame(in: pending) {
                pending.removeFirst(used)
                switch opcode {
                case 1, 2: return String(decoding: payload, as: UTF8.self)
                case 8: return nil
                default: continue  // ping, pong
                }
            }
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, timeout) > 0 else { return nil }
            var buffer = [UInt8](repeating: 0, count: 65_536)
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return nil }
            pending += buffer[..<n]
        }
    }

    /// The next message that is a notification (has `method`), skipping answers.
    func notification(timeout: Int32 = 60_000) throws -> JSON? {
        while let text = try receive(timeout: timeout) {
            let message = try JSON.parse(Array(text.utf8))
            if message["method"] != nil { return message }
        }
        return nil
    }

    static func frame(in bytes: [UInt8]) -> (UInt8, [UInt8], Int)? {
        guard bytes.count >= 2 else { return nil }
        var length = Int(bytes[1] & 0x7F)
        var offset = 2
        if length == 126 {
            guard bytes.count >= 4 else { return nil }
            length = Int(bytes[2]) << 8 | Int(bytes[3])
            offset = 4
        } else if length == 127 {
            guard bytes.count >= 10 else { return nil }
            length = (2..<10).reduce(0) { $0 << 8 | Int(bytes[$1]) }
            offset = 10
        }
        guard bytes.count >= offset + length else { return nil }
        return (bytes[0] & 0x0F, Array(bytes[offset..<offset + length]), offset + length)
    }
}

extension JSON {
    /// `self[key]` as a string, for brevity in tests.
    func text(_ key: String) -> String? { self[key]?.string }
}
