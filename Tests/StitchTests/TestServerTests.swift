import Foundation
import Glibc
import StitchTestSupport
import Testing
import StitchLocks

/// Tests of the fault-injecting loopback server itself, using real clients: a raw socket
/// client (to check exact framing) and /usr/bin/curl (libcurl's behaviour).
@Suite("TestHTTPServer")
struct TestServerTests {

    // MARK: Plain responses

    @Test func plainGetWithCurl() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 300_000, seed: 7, etag: "\"abc\"")
        server.serve("/file.bin", file: file)

        let result = try curl(["-sS", "-f", server.url("/file.bin")])
        #expect(result.exitCode == 0)
        #expect(result.stdout == file.data)
        #expect(server.bodyBytesSent == 300_000)
        #expect(server.bodyBytesSent(for: "/file.bin") == 300_000)
        let requests = server.requests
        #expect(requests.count == 1)
        #expect(requests.first?.method == "GET")
        #expect(requests.first?.path == "/file.bin")
        #expect(requests.first?.index == 0)
        #expect(requests.first?.header("user-agent")?.hasPrefix("curl/") == true)
    }

    @Test func plainGetHeaders() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let date = ServedFile.httpDate(secondsSince1970: 784_111_777)
        #expect(date == "Sun, 06 Nov 1994 08:49:37 GMT")
        server.serve(
            "/a",
            file: ServedFile(
                data: Array("hello".utf8), etag: "W/\"weak\"", lastModified: date,
                contentDisposition: "attachment; filename=\"../../etc/passwd\"", contentType: "text/plain"))

        let client = try RawClient(port: server.port)
        client.send("GET /a?x=1 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        let response = try #require(client.readResponse())
        #expect(response.status == 200)
        #expect(response.header("Content-Length") == "5")
        #expect(response.header("Accept-Ranges") == "bytes")
        #expect(response.header("ETag") == "W/\"weak\"")
        #expect(response.header("Last-Modified") == date)
        #expect(response.header("Content-Type") == "text/plain")
        #expect(response.header("Content-Disposition") == "attachment; filename=\"../../etc/passwd\"")
        #expect(response.header("Date")?.hasSuffix(" GMT") == true)
        #expect(response.body == Array("hello".utf8))
        let request = try #require(server.requests.first)
        #expect(request.target == "/a?x=1")
        #expect(request.path == "/a")
        #expect(request.query == "x=1")

        client.send("GET /missing HTTP/1.1\r\nHost: localhost\r\n\r\n")
        #expect(client.readResponse()?.status == 404)
    }

    @Test func headRequest() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/h", file: .random(size: 1234, seed: 1))
        let client = try RawClient(port: server.port)
        client.send("HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
        let response = try #require(client.readResponse(isHead: true))
        #expect(response.status == 200)
        #expect(response.header("Content-Length") == "1234")
        #expect(response.body.isEmpty)
        // The connection is still in sync: the next response parses.
        client.send("GET /h HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n\r\n")
        #expect(client.readResponse()?.body.count == 10)
        #expect(server.bodyBytesSent == 10)
    }

    @Test func randomBytesAreDeterministic() {
        let a = ServedFile.randomBytes(count: 1_000_003, seed: 42)
        let b = ServedFile.randomBytes(count: 1_000_003, seed: 42)
        let c = ServedFile.randomBytes(count: 1_000_003, seed: 43)
        #expect(a == b)
        #expect(a != c)
        #expect(Array(a.prefix(17)) == ServedFile.randomBytes(count: 17, seed: 42))
        #expect(ServedFile.randomBytes(count: 0, seed: 1).isEmpty)
        #expect(Set(a.prefix(4096)).count > 200)
    }

    /// The bytes are SplitMix64's stream, each value little-endian, as the Swift reference here computes them.
    @Test(arguments: [0, 1, 7, 8, 9, 1_001])
    func randomBytesAreSplitMix64(count: Int) {
        var state: UInt64 = 0x5EED
        var expected: [UInt8] = []
        while expected.count < count {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            z ^= z >> 31
            expected += (0..<8).map { UInt8(truncatingIfNeeded: z >> (8 * $0)) }
        }
        #expect(ServedFile.randomBytes(count: count, seed: 0x5EED) == Array(expected.prefix(count)))
    }

    @Test func wellFormedUTF8IsTold() {
        #expect(isWellFormedUTF8(Array("plain, 下载, 👍".utf8)))
        #expect(!isWellFormedUTF8([0xC0, 0x80]), "overlong")
        #expect(!isWellFormedUTF8([0xED, 0xA0, 0x80]), "a surrogate")
        #expect(!isWellFormedUTF8([0xF4, 0x90, 0x80, 0x80]), "above U+10FFFF")
        #expect(!isWellFormedUTF8([0xE4, 0xB8]), "cut short")
        #expect(textIfUTF8(ServedFile.randomBytes(count: 1 << 20, seed: 1)) == "<1048576 bytes, not UTF-8>")
        #expect(textIfUTF8(Array("ok\n".utf8)) == "ok\n")
    }

    @Test func textIsFoundInBinaryBytes() {
        var data = ServedFile.randomBytes(count: 1 << 20, seed: 2)
        #expect(!bytes(data, contain: "pa:ss-secret"))
        data.replaceSubrange(700_000..<700_012, with: Array("pa:ss-secret".utf8))
        #expect(bytes(data, contain: "pa:ss-secret"))
        #expect(bytes(data, contain: "pa:ss-secret".dropLast(3)))
        #expect(!bytes(Array("pa:ss".utf8), contain: "pa:ss-secret"), "a needle longer than the bytes")
    }

    // MARK: Ranges

    @Test func rangeRequests() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 1000, seed: 3)
        server.serve("/r", file: file)
        let client = try RawClient(port: server.port)

        let cases: [(String, Int, Int)] = [
            ("bytes=10-19", 10, 19), ("bytes=990-", 990, 999), ("bytes=-5", 995, 999),
            ("bytes=900-5000", 900, 999), ("bytes=-5000", 0, 999), ("bytes=0-0", 0, 0),
        ]
        for (range, first, last) in cases {
            client.send("GET /r HTTP/1.1\r\nHost: x\r\nRange: \(range)\r\n\r\n")
            let response = try #require(client.readResponse())
            #expect(response.status == 206, "\(range)")
            #expect(response.header("Content-Range") == "bytes \(first)-\(last)/1000", "\(range)")
            #expect(response.header("Content-Length") == "\(last - first + 1)", "\(range)")
            #expect(response.body == Array(file.data[first...last]), "\(range)")
        }
        // Multiple ranges and syntactically invalid ranges are ignored (200, whole body).
        for range in ["bytes=0-1,5-6", "items=0-5", "bytes=abc"] {
            client.send("GET /r HTTP/1.1\r\nHost: x\r\nRange: \(range)\r\n\r\n")
            let response = try #require(client.readResponse())
            #expect(response.status == 200, "\(range)")
            #expect(response.body.count == 1000)
        }

        // And libcurl agrees.
        let result = try curl(["-sS", "-r", "100-199", server.url("/r")])
        #expect(result.stdout == Array(file.data[100...199]))
    }

    @Test func ifRange() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let date = ServedFile.httpDate(secondsSince1970: 1_700_000_000)
        server.serve("/f", file: .random(size: 100, seed: 9, etag: "\"v1\"", lastModified: date))
        let client = try RawClient(port: server.port)

        func get(_ ifRange: String) throws -> RawResponse {
            client.send("GET /f HTTP/1.1\r\nHost: x\r\nRange: bytes=50-\r\nIf-Range: \(ifRange)\r\n\r\n")
            return try #require(client.readResponse())
        }
        #expect(try get("\"v1\"").status == 206)
        #expect(try get(date).status == 206)
        let mismatch = try get("\"v0\"")
        #expect(mismatch.status == 200)
        #expect(mismatch.body.count == 100)
        #expect(mismatch.header("Content-Range") == nil)
        #expect(try get("W/\"v1\"").status == 200)
        #expect(try get(ServedFile.httpDate(secondsSince1970: 1_700_000_001)).status == 200)

        // The file changes: the old validator no longer matches.
        server.serve("/f", file: .random(size: 120, seed: 10, etag: "\"v2\""))
        let changed = try get("\"v1\"")
        #expect(changed.status == 200)
        #expect(changed.body.count == 120)
        // A weak current ETag never satisfies If-Range.
        server.serve("/f", file: .random(size: 120, seed: 10, etag: "W/\"v3\""))
        #expect(try get("W/\"v3\"").status == 200)
    }

    @Test func unsatisfiableRangesAndEmptyFile() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/small", file: .random(size: 100, seed: 1))
        server.serve("/empty", file: ServedFile(data: []))
        let client = try RawClient(port: server.port)

        for range in ["bytes=100-", "bytes=500-600", "bytes=-0", "bytes=20-10"] {
            client.send("GET /small HTTP/1.1\r\nHost: x\r\nRange: \(range)\r\n\r\n")
            let response = try #require(client.readResponse())
            #expect(response.status == 416, "\(range)")
            #expect(response.header("Content-Range") == "bytes */100", "\(range)")
        }

        client.send("GET /empty HTTP/1.1\r\nHost: x\r\n\r\n")
        let empty = try #require(client.readResponse())
        #expect(empty.status == 200)
        #expect(empty.header("Content-Length") == "0")
        #expect(empty.body.isEmpty)

        for range in ["bytes=0-", "bytes=0-0", "bytes=-1"] {
            client.send("GET /empty HTTP/1.1\r\nHost: x\r\nRange: \(range)\r\n\r\n")
            let response = try #require(client.readResponse())
            #expect(response.status == 416, "\(range)")
            #expect(response.header("Content-Range") == "bytes */0", "\(range)")
        }
        #expect(server.bodyBytesSent == 0)
    }

    @Test func acceptRangesFalseIgnoresRange() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/n", file: .random(size: 64, seed: 2, acceptRanges: false))
        let client = try RawClient(port: server.port)
        client.send("GET /n HTTP/1.1\r\nHost: x\r\nRange: bytes=10-\r\n\r\n")
        let response = try #require(client.readResponse())
        #expect(response.status == 200)
        #expect(response.header("Accept-Ranges") == nil)
        #expect(response.body.count == 64)
    }

    // MARK: Faults

    @Test func dropAfterAndByteCounting() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 100_000, seed: 5, etag: "\"e\"")
        server.serve("/d", file: file, faults: .onRequest(0, .dropAfter(1000)))

        let client = try RawClient(port: server.port)
        client.send("GET /d HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = try #require(client.readHead())
        #expect(head.status == 200)
        #expect(head.header("Content-Length") == "100000")
        let partial = client.readUntilEOF()
        #expect(partial == Array(file.data[0..<1000]))
        #expect(server.bodyBytesSent(for: "/d") == 1000)

        // libcurl resumes from 1000 on the next request (index 1: no fault).
        let result = try curl(["-sS", "-r", "1000-", server.url("/d")])
        #expect(result.exitCode == 0)
        #expect(result.stdout == Array(file.data[1000...]))
        #expect(server.bodyBytesSent(for: "/d") == 100_000)
        #expect(server.requests(for: "/d").map(\.index) == [0, 1])
        #expect(server.requests(for: "/d").last?.header("Range") == "bytes=1000-")
    }

    @Test func curlSeesPartialFileOnDrop() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/d", file: .random(size: 50_000, seed: 5), faults: .always(.dropAfter(20_000)))
        let result = try curl(["-sS", server.url("/d")])
        #expect(result.exitCode == 18)  // CURLE_PARTIAL_FILE
        #expect(result.stdout.count == 20_000)
        #expect(server.bodyBytesSent == 20_000)
    }

    @Test func stallAndRelease() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 10_000, seed: 11)
        server.serve("/s", file: file, faults: .sequence([.stallAfter(4000), .stallAfter(100, then: .close)]))

        let client = try RawClient(port: server.port)
        client.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForStall(timeout: .seconds(10)))
        let head = try #require(client.readHead())
        #expect(head.header("Content-Length") == "10000")
        #expect(client.readExactly(4000) == Array(file.data[0..<4000]))
        #expect(server.bodyBytesSent == 4000)
        #expect(server.releaseStalls() == 1)
        #expect(client.readExactly(6000) == Array(file.data[4000...]))

        // Same connection (resume keeps framing intact); this time the stall ends in a close.
        client.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForStall(timeout: .seconds(10)))
        #expect(client.readHead()?.status == 200)
        #expect(client.readExactly(100) == Array(file.data[0..<100]))
        server.releaseStalls()
        #expect(client.readUntilEOF().isEmpty)
        #expect(server.waitUntilIdle())
        #expect(server.bodyBytesSent == 10_100)
        #expect(Set(server.requests.map(\.connectionID)).count == 1)
    }

    @Test func stallEndsWhenClientLeavesOrServerStops() throws {
        let server = try TestHTTPServer()
        server.serve("/s", file: .random(size: 1000, seed: 1), faults: .always(.stallAfter(10)))

        let leaving = try RawClient(port: server.port)
        leaving.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForStall())
        leaving.close()
        #expect(server.waitUntilIdle())

        let staying = try RawClient(port: server.port)
        staying.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForStall())
        let idle = try RawClient(port: server.port)  // an idle keep-alive connection too
        idle.send("GET /missing HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(idle.readResponse()?.status == 404)
        server.stop()  // must return although a response is stalled and a connection is idle
        _ = staying.readHead()
        #expect(staying.readUntilEOF().count == 10)
        #expect(idle.readUntilEOF().isEmpty)
        server.stop()  // idempotent
    }

    @Test func stallBeforeHeaders() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/s", file: .random(size: 10, seed: 1), faults: .always(.stallBeforeHeaders()))
        let client = try RawClient(port: server.port)
        client.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForStall())
        #expect(!client.hasPendingData())
        server.releaseStalls()
        #expect(client.readResponse()?.body.count == 10)
    }

    @Test func shortBodyWrongLengthAndWrongRanges() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 1000, seed: 4)
        server.serve(
            "/x", file: file,
            faults: .sequence([
                .shortBody(300), .wrongContentLength(2000), .ignoreRange,
                .wrongContentRange(.shiftStart(by: 10)), .wrongContentRange(.total(5000)),
                .wrongContentRange(.header("bytes 0-9/1000")),
            ]))
        func request(_ range: String? = nil) throws -> RawClient {
            let client = try RawClient(port: server.port)
            client.send("GET /x HTTP/1.1\r\nHost: x\r\n" + (range.map { "Range: \($0)\r\n" } ?? "") + "\r\n")
            return client
        }

        var client = try request()
        #expect(client.readHead()?.header("Content-Length") == "1000")
        #expect(client.readUntilEOF() == Array(file.data[0..<300]))

        client = try request()
        #expect(client.readHead()?.header("Content-Length") == "2000")
        #expect(client.readUntilEOF() == file.data)

        client = try request("bytes=100-199")
        var response = try #require(client.readResponse())
        #expect(response.status == 200)
        #expect(response.body == file.data)

        client = try request("bytes=100-199")
        response = try #require(client.readResponse())
        #expect(response.status == 206)
        #expect(response.header("Content-Range") == "bytes 110-199/1000")
        #expect(response.body == Array(file.data[110...199]))

        client = try request("bytes=100-199")
        response = try #require(client.readResponse())
        #expect(response.header("Content-Range") == "bytes 100-199/5000")
        #expect(response.body == Array(file.data[100...199]))

        client = try request("bytes=100-199")
        response = try #require(client.readResponse())
        #expect(response.header("Content-Range") == "bytes 0-9/1000")
        #expect(response.body == Array(file.data[0...9]))
    }

    @Test func statusFaultsWithIndex() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/busy", file: .random(size: 10, seed: 1)) { request, index in
            index < 2 ? .status(503, headers: [("Retry-After", "1")], body: Array("busy".utf8)) : .none
        }
        let client = try RawClient(port: server.port)
        for expected in [503, 503, 200] {
            client.send("GET /busy HTTP/1.1\r\nHost: x\r\n\r\n")
            let response = try #require(client.readResponse())
            #expect(response.status == expected)
            if expected == 503 {
                #expect(response.header("Retry-After") == "1")
                #expect(response.body == Array("busy".utf8))
            }
        }
        #expect(server.bodyBytesSent == 10)
    }

    @Test func redirects() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 5000, seed: 8)
        server.serve("/final", file: file)
        server.redirect(from: "/a", to: "/b", status: 301)
        server.redirect(from: "/b", to: server.url("/final"), status: 307)

        let followed = try curl(["-sS", "-L", server.url("/a")])
        #expect(followed.exitCode == 0)
        #expect(followed.stdout == file.data)
        #expect(server.requests.map(\.path) == ["/a", "/b", "/final"])

        let client = try RawClient(port: server.port)
        client.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        let response = try #require(client.readResponse())
        #expect(response.status == 301)
        #expect(response.header("Location") == "/b")

        server.redirect(from: "/loop1", to: "/loop2")
        server.redirect(from: "/loop2", to: "/loop1")
        let loop = try curl(["-sS", "-L", "--max-redirs", "5", server.url("/loop1")])
        #expect(loop.exitCode == 47)  // CURLE_TOO_MANY_REDIRECTS

        server.serve("/moved", file: file, faults: .onRequest(0, .redirect(308, location: "/final")))
        let viaFault = try curl(["-sS", "-L", server.url("/moved")])
        #expect(viaFault.stdout == file.data)
    }

    @Test func chunked() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 600_000, seed: 12)
        server.serve("/c", file: file, faults: .always(.chunked))

        let client = try RawClient(port: server.port)
        client.send("GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
        let response = try #require(client.readResponse())
        #expect(response.header("Transfer-Encoding") == "chunked")
        #expect(response.header("Content-Length") == nil)
        #expect(response.body == file.data)

        client.send("GET /c HTTP/1.1\r\nHost: x\r\nRange: bytes=10-20\r\n\r\n")
        let ranged = try #require(client.readResponse())
        #expect(ranged.status == 206)
        #expect(ranged.header("Content-Range") == "bytes 10-20/600000")
        #expect(ranged.body == Array(file.data[10...20]))

        let result = try curl(["-sS", server.url("/c")])
        #expect(result.stdout == file.data)
        #expect(server.bodyBytesSent == 600_000 * 2 + 11)

        // Combined: chunked, then dropped mid-body (no terminating chunk).
        server.setFaults("/c", .always(.all([.chunked, .dropAfter(1000)])))
        let dropped = try curl(["-sS", server.url("/c")])
        #expect(dropped.exitCode == 18)
        #expect(dropped.stdout == Array(file.data[0..<1000]))
    }

    @Test func throttledTransferCompletes() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 20_000, seed: 13)
        server.serve("/t", file: file, faults: .always(.throttle(bytesPerSecond: 400_000)))
        server.throttle = 1_000_000
        #expect(server.throttle == 1_000_000)
        let result = try curl(["-sS", server.url("/t")])
        #expect(result.stdout == file.data)
    }

    // MARK: Connections

    @Test func keepAlive() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3000, seed: 14)
        server.serve("/k", file: file)

        let client = try RawClient(port: server.port)
        client.send("GET /k HTTP/1.1\r\nHost: x\r\n\r\nGET /k HTTP/1.1\r\nHost: x\r\nRange: bytes=0-99\r\n\r\n")
        #expect(client.readResponse()?.body == file.data)
        #expect(client.readResponse()?.body == Array(file.data[0...99]))
        client.send("GET /k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        let last = try #require(client.readResponse())
        #expect(last.header("Connection") == "close")
        #expect(client.readUntilEOF().isEmpty)

        let requests = server.requests
        #expect(requests.map(\.connectionID) == [0, 0, 0])
        #expect(requests.map(\.indexOnConnection) == [0, 1, 2])
        #expect(requests.map(\.index) == [0, 1, 2])
        #expect(server.connectionCount == 1)

        // libcurl reuses the connection for two URLs in one invocation.
        let reused = try curl(["-sS", "-o", "/dev/null", "-o", "/dev/null", server.url("/k"), server.url("/k")])
        #expect(reused.exitCode == 0)
        #expect(server.connectionCount == 2)
        #expect(server.requests(for: "/k").suffix(2).map(\.indexOnConnection) == [0, 1])
    }

    @Test func http10ClosesByDefault() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.serve("/o", file: .random(size: 5, seed: 1))
        let client = try RawClient(port: server.port)
        client.send("GET /o HTTP/1.0\r\n\r\n")
        #expect(client.readResponse()?.body.count == 5)
        #expect(client.readUntilEOF().isEmpty)
    }

    @Test func absoluteFormTarget() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 777, seed: 15)
        server.serve("/p/file", file: file)

        // curl talking to us as an HTTP proxy sends the absolute form.
        let result = try curl(["-sS", "-x", server.baseURL, "http://example.invalid/p/file?q=1"])
        #expect(result.exitCode == 0)
        #expect(result.stdout == file.data)
        let request = try #require(server.requests.first)
        #expect(request.target == "http://example.invalid/p/file?q=1")
        #expect(request.path == "/p/file")
        #expect(request.query == "q=1")

        let client = try RawClient(port: server.port)
        client.send("GET http://127.0.0.1:\(server.port) HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(client.readResponse()?.status == 404)
        #expect(server.requests.last?.path == "/")
    }

    @Test func oversizedHeadersGet431() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        let filler = String(repeating: "a", count: 1000)
        var request = "GET / HTTP/1.1\r\nHost: x\r\n"
        for index in 0..<70 { request += "X-Filler-\(index): \(filler)\r\n" }
        client.send(request + "\r\n")
        #expect(client.readResponse()?.status == 431)
        #expect(client.readUntilEOF().isEmpty)

        let bad = try RawClient(port: server.port)
        bad.send("NONSENSE\r\n\r\n")
        #expect(bad.readResponse()?.status == 400)
    }

    @Test func manyServersStartAndStop() throws {
        for _ in 0..<50 {
            let server = try TestHTTPServer()
            server.serve("/", file: .random(size: 10, seed: 1))
            let client = try RawClient(port: server.port)
            client.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(client.readResponse()?.status == 200)
            server.stop()
        }
    }
}

// MARK: - Clients

/// Runs /usr/bin/curl with a 30 s limit and returns its exit code and standard output.
private func curl(_ arguments: [String]) throws -> (exitCode: Int32, stdout: [UInt8]) {
    let output = CapturedOutput()
    // posix_spawn, not Foundation.Process: see ChildProcess.
    let process = try ChildProcess(
        executable: "/usr/bin/curl", arguments: ["--max-time", "30"] + arguments,
        environment: ProcessInfo.processInfo.environment, standardError: .null,
        onOutput: { chunk, _ in output.bytes.withLock { $0.stdout += chunk } })
    let termination = process.waitUntilExit()
    return (termination.status, output.bytes.withLock { $0.stdout })
}

/// A parsed HTTP response as seen on the wire.
private struct RawResponse {
    var status: Int
    var headers: [(String, String)]
    var body: [UInt8] = []

    func header(_ name: String) -> String? {
        headers.first { $0.0.lowercased() == name.lowercased() }?.1
    }
}

private struct RawClientError: Error {}

/// A blocking HTTP/1.1 client on a raw socket (10 s receive timeout) for exact framing checks.
private final class RawClient {
    private var fd: Int32
    private var buffer: [UInt8] = []

    init(port: Int) throws {
        guard let fd = connectToLoopback(port: port) else { throw RawClientError() }
        self.fd = fd
        // A bound, not a pace: on a loaded machine the server's threads can wait seconds for a CPU.
        var timeout = timeval(tv_sec: 60, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close() }

    func close() {
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }

    func send(_ text: String) {
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if sent <= 0 { return }
            offset += sent
        }
    }

    /// Reads more bytes into the buffer; false on EOF, error or timeout.
    private func fill() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return false }
        buffer += chunk[0..<count]
        return true
    }

    /// Whether bytes are readable right now (without blocking).
    func hasPendingData() -> Bool {
        if !buffer.isEmpty { return true }
        var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
        return poll(&fds, 1, 0) > 0
    }

    private func takeLine() -> String? {
        while true {
            if let index = buffer.indices.dropLast().first(where: { buffer[$0] == 13 && buffer[$0 + 1] == 10 }) {
                let line = String(decoding: buffer[0..<index], as: UTF8.self)
                buffer.removeFirst(index + 2)
                return line
            }
            if !fill() { return nil }
        }
    }

    func readHead() -> RawResponse? {
        guard let statusLine = takeLine() else { return nil }
        let parts = statusLine.split(separator: " ")
        guard parts.count >= 2, let status = Int(parts[1]) else { return nil }
        var headers: [(String, String)] = []
        while let line = takeLine() {
            if line.isEmpty { return RawResponse(status: status, headers: headers) }
            guard let colon = line.firstIndex(of: ":") else { return nil }
            headers.append(
                (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        return nil
    }

    func readExactly(_ count: Int) -> [UInt8]? {
        while buffer.count < count {
            if !fill() { return nil }
        }
        defer { buffer.removeFirst(count) }
        return Array(buffer[0..<count])
    }

    func readUntilEOF() -> [UInt8] {
        while fill() {}
        defer { buffer.removeAll() }
        return buffer
    }

    /// Reads a complete response, decoding Content-Length, chunked, or close-delimited bodies.
    func readResponse(isHead: Bool = false) -> RawResponse? {
        guard var response = readHead() else { return nil }
        if isHead || response.status == 204 || response.status == 304 { return response }
        if response.header("Transfer-Encoding")?.lowercased() == "chunked" {
            var body: [UInt8] = []
            while true {
                guard let sizeLine = takeLine(), let size = Int(sizeLine, radix: 16) else { return nil }
                if size == 0 {
                    _ = takeLine()
                    break
                }
                guard let chunk = readExactly(size), takeLine() == "" else { return nil }
                body += chunk
            }
            response.body = body
        } else if let length = response.header("Content-Length").flatMap({ Int($0) }) {
            guard let body = readExactly(length) else { return nil }
            response.body = body
        } else {
            response.body = readUntilEOF()
        }
        return response
    }
}

/// Every file comparison in the tests goes through StitchTestSupport's `memcmp` overloads of `==` for byte arrays:
/// they must tell every difference.
@Test func byteArrayComparisonTellsEveryDifference() {
    let file = ServedFile.randomBytes(count: 1 << 20, seed: 7)
    var copy = file
    #expect(copy == file)
    for index in [0, 1, file.count / 2, file.count - 1] {
        copy[index] ^= 0x40
        #expect(!(copy == file) && copy != file, "a changed byte at \(index)")
        copy[index] ^= 0x40
    }
    #expect(!(Array(file.dropLast()) == file), "a shorter array")
    #expect([] as [UInt8] == [] as [UInt8])
    let none: [UInt8]? = nil
    let some: [UInt8]? = file
    #expect(none == nil && !(none == some) && none != some && some == file && !(some == Array(file.dropFirst())))
}
