import Foundation
import Glibc
import Stitch
import StitchTestSupport
import Synchronization
import Testing
import StitchLocks

// The combination matrix of MatrixTests (issue 10, part 3; DEVELOPERS.md rule 6): the dimensions, one case's run
// against a real server, and the checks. docs/overlap.md says what may be fetched twice and why.

// MARK: - Dimensions

enum MatrixConnections: String, CaseIterable, Sendable {
    case auto, one = "1", three = "3", eight = "8"

    var arguments: [String] { self == .auto ? [] : ["-c", rawValue] }
    var explicitCount: Int? { Int(rawValue) }
}

enum MatrixRate: String, CaseIterable, Sendable {
    /// No --limit-rate.
    case none
    /// Well below what the server gives: the achieved rate is judged (±5 %).
    case below
    /// Above what the server gives (a 100M cap on servers that give at most 32 MiB/s, 4G on loopback nginx):
    /// only byte-exactness and the fetch bounds are judged.
    case above
}

enum MatrixInterruption: String, CaseIterable, Sendable {
    case none, sigint, sigkill

    var signal: Int32? {
        switch self {
        case .none: return nil
        case .sigint: return SIGINT
        case .sigkill: return SIGKILL
        }
    }
}

enum MatrixServer: String, CaseIterable, Sendable, CustomTestStringConvertible {
    /// nginx's plain HTTP port (NGINX_HTTP_PORT): loopback speed, strong ETag + Last-Modified.
    case nginx
    /// nginx's NGINX_SLOW_PORT: limit_rate 2 MiB/s per connection (after a first 2 MiB, nginx's sendfile_max_chunk).
    case nginxCapped
    /// The test server, 4 MiB/s per response, with a strong ETag.
    case strongETag
    /// The test server with a Last-Modified date an hour old (strong by RFC 9110 §8.8.2.2) and no ETag.
    case lastModifiedOnly
    /// The test server with neither ETag nor Last-Modified (ranges honoured).
    case noValidator
    /// The test server with a strong ETag that ignores Range and sends no Accept-Ranges.
    case noRanges

    var testDescription: String { rawValue }
    var isNginx: Bool { self == .nginx || self == .nginxCapped }
    var hasValidator: Bool { self != .noValidator }
    var acceptsRanges: Bool { self != .noRanges }
    /// Whether a download from it may use several connections and resume by range with If-Range.
    var canSplit: Bool { hasValidator && acceptsRanges }

    /// The test servers' pace, per response.
    static let testServerRate = 4 << 20
}

/// The proxy between stitch and the server (issue 36): none, tinyproxy (HTTP) or microsocks (SOCKS5), each started
/// for the case on loopback. Combined pairwise with the other dimensions, not as a full product
/// (``MatrixCase/proxied(for:)``).
enum MatrixProxy: String, CaseIterable, Sendable {
    case none, http, socks

    var kind: LoopbackProxy.Kind? {
        switch self {
        case .none: nil
        case .http: .http
        case .socks: .socks
        }
    }
}

/// A mirror of the file (issue 36): none, one serving the same bytes, or one serving other bytes under the same
/// validators (only the samples can tell). Combined pairwise with the other dimensions (``MatrixCase/mirrored(for:)``).
enum MatrixMirror: String, CaseIterable, Sendable {
    case one, equal, differing

    /// The bytes of one sample that proves a mirror (the engine's `Adoption.sampleBytes`).
    static let sampleBytes = 64 << 10
}

enum MatrixSize: String, CaseIterable, Sendable {
    /// 1,500,000 bytes: under every split threshold of the knobs (2 × the 768 KiB minimum split; 2 × the 1 MiB step),
    /// so one connection whatever -c says; more than one piece, so it has a live record.
    case below
    /// 8,000,000 bytes: automatic connections 4, -c 3 three segments, -c 8 eight.
    case above

    var bytes: Int { self == .below ? 1_500_000 : 8_000_000 }
}

/// The test-only knobs every matrix case runs with (StitchCommand.swift, TestTuning).
enum MatrixKnobs {
    static let minimumSplit = 768 << 10
    static let connectionStep = 1 << 20
    /// Loopback nginx gives one connection far more than this (the probe keeps one connection); a rate limit or
    /// a capped server gives less (the probe splits).
    static let singleConnectionRate = 32 << 20

    static let environment: [String: String] = [
        "STITCH_TEST_MINIMUM_SPLIT": "\(minimumSplit)",
        "STITCH_TEST_CONNECTION_STEP": "\(connectionStep)",
        "STITCH_TEST_SINGLE_CONNECTION_RATE": "\(singleConnectionRate)",
        "STITCH_RETRY_BASE_DELAY": "0.2",
    ]
}

struct MatrixCase: Sendable, CustomStringConvertible, Hashable {
    var connections: MatrixConnections
    var rate: MatrixRate
    var interruption: MatrixInterruption
    var server: MatrixServer
    var size: MatrixSize
    /// Overrides for the explicit extra case (issue 10's bug): its own size, limit and no knobs.
    var explicitBytes: Int?
    var explicitLimit: String?
    var defaultKnobs = false
    var proxy = MatrixProxy.none
    var mirror = MatrixMirror.one

    var bytes: Int { explicitBytes ?? size.bytes }

    /// The --limit-rate value and its bytes per second, if any.
    var limit: (text: String, bytesPerSecond: Int)? {
        if let explicitLimit { return (explicitLimit, Self.parse(explicitLimit)) }
        switch rate {
        case .none: return nil
        case .below: return size == .above ? ("1M", 1 << 20) : ("256K", 256 << 10)
        case .above: return server == .nginx ? ("4G", 4 << 30) : ("100M", 100 << 20)
        }
    }

    /// Whether the achieved rate is judged.
    var judgesRate: Bool { rate == .below || explicitLimit != nil }

    var environment: [String: String] {
        defaultKnobs ? ["STITCH_RETRY_BASE_DELAY": "0.2"] : MatrixKnobs.environment
    }

    var arguments: [String] {
        connections.arguments + (limit.map { ["--limit-rate", $0.text] } ?? [])
    }

    var slug: String {
        "\(server.rawValue)-c\(connections.rawValue)-\(rate.rawValue)-\(interruption.rawValue)-\(bytes)"
            + (proxy == .none ? "" : "-via-\(proxy.rawValue)") + (mirror == .one ? "" : "-mirror-\(mirror.rawValue)")
    }

    var description: String {
        let rateText = limit.map { "\(rate.rawValue)(\($0.text))" } ?? rate.rawValue
        return "[connections=\(connections.rawValue) rate=\(rateText) interruption=\(interruption.rawValue) "
            + "server=\(server.rawValue) size=\(bytes)\(defaultKnobs ? " knobs=default" : "")"
            + (proxy == .none ? "" : " proxy=\(proxy.rawValue)")
            + (mirror == .one ? "" : " mirror=\(mirror.rawValue)") + "]"
    }

    /// Seconds the case spends at least waiting (for ordering long cases first).
    var expectedSeconds: Double {
        if let limit, judgesRate { return Double(bytes) / Double(limit.bytesPerSecond) }
        return server.isNginx ? 1 : Double(bytes) / Double(MatrixServer.testServerRate)
    }

    var seed: UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in slug.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return hash
    }

    static func parse(_ text: String) -> Int {
        let units: [Character: Int] = ["K": 10, "M": 20, "G": 30]
        guard let last = text.last, let shift = units[last], let value = Int(text.dropLast()) else {
            return Int(text) ?? 0
        }
        return value << shift
    }

    /// The whole cross product.
    static var all: [MatrixCase] {
        var cases: [MatrixCase] = []
        for server in MatrixServer.allCases {
            cases += all(for: server)
        }
        return cases
    }

    /// The cases through a proxy for `server`: for each proxy, one per connection count, the rate, the
    /// interruption and the size turning with it, so that each proxy meets every value of every other dimension
    /// (pairwise, as issue 36 asks: a full product would multiply the matrix's minutes by three).
    static func proxied(for server: MatrixServer) -> [MatrixCase] {
        var cases: [MatrixCase] = []
        for (p, proxy) in [MatrixProxy.http, .socks].enumerated() {
            for (c, connections) in MatrixConnections.allCases.enumerated() {
                let k = c + 4 * p
                var matrixCase = MatrixCase(
                    connections: connections, rate: MatrixRate.allCases[k % 3],
                    interruption: MatrixInterruption.allCases[(2 * k) % 3], server: server,
                    size: MatrixSize.allCases[k % 2])
                matrixCase.proxy = proxy
                cases.append(matrixCase)
            }
        }
        return cases
    }

    /// The cases with a mirror for `server`: for each kind of mirror, one per connection count, the rate, the
    /// interruption and the size turning with it (pairwise, as for the proxies).
    static func mirrored(for server: MatrixServer) -> [MatrixCase] {
        var cases: [MatrixCase] = []
        for (m, mirror) in [MatrixMirror.equal, .differing].enumerated() {
            for (c, connections) in MatrixConnections.allCases.enumerated() {
                let k = c + 4 * m
                var matrixCase = MatrixCase(
                    connections: connections, rate: MatrixRate.allCases[(k + 1) % 3],
                    interruption: MatrixInterruption.allCases[(2 * k + 1) % 3], server: server,
                    size: MatrixSize.allCases[(k + 1) % 2])
                matrixCase.mirror = mirror
                cases.append(matrixCase)
            }
        }
        return cases
    }

    static func all(for server: MatrixServer) -> [MatrixCase] {
        var cases: [MatrixCase] = LoopbackProxy.Kind.allCases.allSatisfy(LoopbackProxy.isInstalled)
            && StitchUnderTest.hasLibcurl ? proxied(for: server) : []
        cases += mirrored(for: server)
        for connections in MatrixConnections.allCases {
            for rate in MatrixRate.allCases {
                for interruption in MatrixInterruption.allCases {
                    for size in MatrixSize.allCases {
                        cases.append(
                            MatrixCase(
                                connections: connections, rate: rate, interruption: interruption, server: server,
                                size: size))
                    }
                }
            }
        }
        return cases
    }

    /// Issue 10's corruption exactly as met: 40,000,000 bytes from nginx, automatic connections, --limit-rate 10M,
    /// default knobs.
    static let issue10 = MatrixCase(
        connections: .auto, rate: .below, interruption: .none, server: .nginx, size: .above,
        explicitBytes: 40_000_000, explicitLimit: "10M", defaultKnobs: true)
}

// MARK: - Bounds (docs/overlap.md)

enum OverlapBounds {
    /// What one response cut short (aborted, split, replaced, its process interrupted) may have had handed to the
    /// kernel beyond what the client used: the server's send queue (autotuned up to tcp_wmem's maximum), the
    /// client's receive queue (autotuned up to tcp_rmem's maximum: it grows while the reader keeps up, so a fast
    /// start followed by a rate-limit pause leaves it large) and libcurl's 512 KiB receive buffer.
    static let cutRequestSlack: Int = tcpSendBufferMaximum + tcpReceiveBufferMaximum + curlReceiveBuffer

    /// tcp_wmem's and tcp_rmem's maxima (the third field): what autotuning may grow a socket's buffers to.
    static let tcpSendBufferMaximum = sysctlMaximum("tcp_wmem", fallback: 4 << 20)
    static let tcpReceiveBufferMaximum = sysctlMaximum("tcp_rmem", fallback: 6 << 20)
    /// CurlTransport.defaultReceiveBufferSize (CURLOPT_BUFFERSIZE).
    static let curlReceiveBuffer = 512 << 10
    /// What a proxy holds between its two connections (tinyproxy's and microsocks' buffers are far smaller).
    static let proxyBuffer = 1 << 20

    static func sysctlMaximum(_ name: String, fallback: Int) -> Int {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/" + name, encoding: .utf8)) ?? ""
        return text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).compactMap { Int($0) }.last
            ?? fallback
    }

    /// Re-fetched and compared on a resume without a validator (DownloadOptions.overlapWindow).
    static let overlapWindow = 64 << 10

    /// Rate-limited runs: judged from this many seconds after the start…
    static let rateSettleSeconds = 1.0
    /// …over at least this long a window (shorter runs are not judged; every rate-limited case has one that is).
    static let rateMinimumWindow = 2.0
    static let rateTolerance = 0.05
    /// …unless the client's threads spent more than this share of the window waiting for a CPU (an overloaded
    /// machine, not the rate limiter).
    static let rateMaximumStarvation = 0.25
}

// MARK: - Concurrency

/// A counting semaphore shared by every matrix test, so that the matrix runs `limit` cases at once overall.
actor MatrixGate {
    static let shared = MatrixGate(
        limit: ProcessInfo.processInfo.environment["STITCH_MATRIX_CONCURRENCY"].flatMap(Int.init) ?? 16)

    private let limit: Int
    private var running = 0
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(limit: Int) { self.limit = max(1, limit) }

    func acquire() async {
        if running < limit {
            running += 1
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    func release() {
        if waiting.isEmpty {
            running -= 1
        } else {
            waiting.removeFirst().resume()
        }
    }
}

// MARK: - What the server saw

/// One response to a request for the case's file, from nginx's access log or the test server's records.
struct ServedRecord: Sendable, CustomStringConvertible {
    var status: Int
    var range: String?
    var ifRange: String?
    /// The body's first byte in the file and the bytes it was to carry.
    var start: Int
    var length: Int
    /// Body bytes handed to the kernel.
    var sent: Int
    /// Increases with time across runs: nginx's connection serial (`conn=`; a run's connections are all opened after
    /// the previous run died), the test server's request serial.
    var order: Int
    /// The log line (nginx) or a summary (test server).
    var raw: String

    var isCut: Bool { sent < length }
    var sentRange: Range<Int> { start..<(start + sent) }
    /// `bytes=A-B`: a segment of a split download.
    var isBoundedRange: Bool {
        guard let range, range.hasPrefix("bytes="), let dash = range.firstIndex(of: "-") else { return false }
        return range.index(after: dash) < range.endIndex
    }
    var hasIfRange: Bool { ifRange.map { !$0.isEmpty && $0 != "-" } ?? false }

    var description: String { raw }

    /// Parses a line of scripts/nginx.sh's `stitch` log format for a file of `size` bytes.
    init?(nginxLine line: String, size: Int) {
        guard let close = line.range(of: "HTTP/1.1\" ") ?? line.range(of: "HTTP/2.0\" ") else { return nil }
        let fields = line[close.upperBound...].split(separator: " ", maxSplits: 2)
        guard fields.count >= 2, let status = Int(fields[0]), let sent = Int(fields[1]) else { return nil }
        func quoted(_ key: String) -> String? {
            guard let start = line.range(of: key + "=\"") else { return nil }
            let rest = line[start.upperBound...]
            guard let end = rest.firstIndex(of: "\"") else { return nil }
            let value = String(rest[..<end])
            return value == "-" || value.isEmpty ? nil : value
        }
        guard let conn = line.range(of: " conn="), let order = Int(line[conn.upperBound...].prefix { $0.isNumber })
        else { return nil }
        self.order = order
        self.status = status
        self.range = quoted("range")
        self.ifRange = quoted("if_range")
        // Only a 200 or 206 carries the file's bytes (a 416's body is nginx's error page).
        self.sent = status == 200 || status == 206 ? sent : 0
        self.raw = line
        (start, length) = Self.slice(status: status, range: range, size: size)
        range = Self.asked(range, hasIfRange: hasIfRange)
    }

    init(served: ServedResponse) {
        status = served.status
        range = served.request.range
        ifRange = served.request.header("If-Range")
        start = served.bodyStart
        length = served.bodyLength
        sent = served.bodyBytesSent
        order = served.request.serial
        raw = "#\(served.request.index) \(served.status) range=\(range ?? "-") if-range=\(ifRange ?? "-") "
            + "body \(start)+\(length) sent \(sent) conn=\(served.request.connectionID)"
        range = Self.asked(range, hasIfRange: hasIfRange)
    }

    /// The `Range` the engine asked for, behind the transport's window: a first window `bytes=A-(A+W-1)` stands for
    /// `bytes=A-`, or for the whole file at 0 without `If-Range` (StitchTestSupport's `askedRange`, on a log line).
    /// The bytes served (`start`, `length`) stay those of the range sent.
    static func asked(_ range: String?, hasIfRange: Bool) -> String? {
        RecordedRequest.askedRange(range, hasIfRange: hasIfRange, window: StitchUnderTest.window)
    }

    /// The body slice a static-file server sends for `range` with this status.
    static func slice(status: Int, range: String?, size: Int) -> (Int, Int) {
        guard status == 206, let range, range.hasPrefix("bytes="), let dash = range.firstIndex(of: "-"),
            let first = Int(range[range.index(range.startIndex, offsetBy: 6)..<dash])
        else { return (0, status == 200 ? size : 0) }
        let lastText = range[range.index(after: dash)...]
        let last = lastText.isEmpty ? size - 1 : min(Int(lastText) ?? (size - 1), size - 1)
        return (first, last - first + 1)
    }
}

/// Where a case downloads from: a fresh file on the shared nginx, or a test server of its own.
final class MatrixOrigin: Sendable {
    let url: String
    let validator: String?
    private let nginx: Nginx?
    private let name: String
    private let size: Int
    private let server: TestHTTPServer?
    private let path = "/f.bin"

    init(_ matrixCase: MatrixCase, name: String, bytes: [UInt8]) async throws {
        self.name = name
        size = bytes.count
        switch matrixCase.server {
        case .nginx, .nginxCapped:
            let nginx = try await sharedNginx()
            try nginx.publish(name, bytes: bytes)
            self.nginx = nginx
            server = nil
            url = matrixCase.server == .nginx ? nginx.httpURL(name) : nginx.slowURL(name)
            validator = nil  // nginx's ETag; checked for presence
        case .strongETag, .lastModifiedOnly, .noValidator, .noRanges:
            let server = try TestHTTPServer()
            server.throttle = MatrixServer.testServerRate
            var file = ServedFile(data: bytes)
            switch matrixCase.server {
            case .strongETag: file.etag = "\"mx-\(matrixCase.seed)\""
            case .lastModifiedOnly: file.lastModified = ServedFile.httpDate(secondsSince1970: Int(time(nil)) - 3600)
            case .noValidator: break
            default:
                file.etag = "\"mx-\(matrixCase.seed)\""
                file.acceptRanges = false
            }
            server.serve(path, file: file)
            self.server = server
            nginx = nil
            url = server.url(path) + "?case=" + name
            validator = file.etag ?? file.lastModified
        }
    }

    /// The test server's body bytes for the file so far (nil for nginx, which tells only when a response ends).
    func bodyBytesSent() -> Int? { server?.bodyBytesSent(for: path) }

    /// Every response for the file so far.
    func records() -> [ServedRecord] {
        if let nginx {
            return NginxLogIndex.shared.lines(for: "/" + name, in: nginx.accessLog).compactMap {
                ServedRecord(nginxLine: $0, size: size)
            }
        }
        return server?.responses(for: path).map(ServedRecord.init(served:)) ?? []
    }

    /// A value of ``ServedRecord/order`` that every response logged so far is below and no later request's is:
    /// for nginx the serial of a connection opened now (a request for a path that does not exist, found in the log);
    /// for the test server the number of requests received so far (the next request's serial).
    func fence() async -> Int? {
        if let server { return server.requests.count }
        guard let nginx else { return nil }
        let marker = "/fence-" + name
        let port = url.contains(":\(nginx.slowPort)/") ? nginx.slowPort : nginx.httpPort
        guard let fd = connectToLoopback(port: port) else { return nil }
        let request = Array("GET \(marker) HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".utf8)
        _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        while buffer.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, 0) }) > 0 {}
        Glibc.close(fd)
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if let line = NginxLogIndex.shared.lines(for: marker, in: nginx.accessLog).first,
                let conn = line.range(of: " conn="), let serial = Int(line[conn.upperBound...].prefix { $0.isNumber })
            {
                return serial
            }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }

    /// Waits until the server has logged every response: the test server is idle; nginx (which logs a request
    /// when it has ended it, a cut one when it notices the client gone) has logged nothing new for 2 s.
    func settle() async {
        if let server {
            _ = await server.settled()
            return
        }
        var count = records().count
        var stableSince = ContinuousClock.now
        let deadline = ContinuousClock.now + .seconds(15)
        while ContinuousClock.now < deadline, ContinuousClock.now - stableSince < .seconds(2) {
            try? await Task.sleep(for: .milliseconds(100))
            let now = records().count
            if now != count {
                count = now
                stableSince = ContinuousClock.now
            }
        }
    }

    func close() {
        server?.stop()
        if let nginx { BackgroundRemoval.remove(nginx.documentRoot + "/" + name) }
    }
}

// MARK: - Watching a run

/// Samples `wchar` of a running process (/proc/PID/io: bytes it passed to write and pwrite — the data written to
/// the part file, plus a few hundred bytes of state and --json lines a second) every 10 ms on a thread of its own.
final class WriteSampler: Sendable {
    struct Sample: Sendable {
        var seconds: Double
        var bytes: Int
        /// The server's body bytes for the file so far (the test server), to tell whether it kept ahead.
        var served: Int?
        /// Seconds the process's threads have spent runnable but waiting for a CPU, so far (/proc/PID/task/*/schedstat;
        /// read every 100 ms).
        var waited: Double?
    }

    let started: ContinuousClock.Instant
    private let samples = Locked<[Sample]>([])
    private let stopped = Atomic<Bool>(false)

    init(_ process: StitchProcess, started: ContinuousClock.Instant, served: @escaping @Sendable () -> Int?) {
        self.started = started
        let counter = WriteCounter(pid: process.pid)
        let pid = process.pid
        let thread = Thread { [self] in
            var tick = 0
            var waited: Double?
            while !stopped.load(ordering: .relaxed), process.isRunning {
                let sent = served()
                if tick % 10 == 0 { waited = runqueueWait(pid: pid) ?? waited }
                tick += 1
                if let bytes = counter.read() {
                    let seconds = (ContinuousClock.now - started) / .seconds(1)
                    samples.withLock {
                        $0.append(Sample(seconds: seconds, bytes: bytes, served: sent, waited: waited))
                    }
                }
                usleep(10_000)
            }
        }
        thread.start()
    }

    func stop() { stopped.store(true, ordering: .relaxed) }

    var all: [Sample] { samples.withLock { $0 } }
}

/// Reads `wchar` from /proc/PID/io through one descriptor kept open (a `pread` per sample: the matrix samples
/// thousands of times a second over all its cases).
final class WriteCounter: @unchecked Sendable {
    private let fd: Int32
    private let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 512, alignment: 8)

    init(pid: Int32) {
        fd = open("/proc/\(pid)/io", O_RDONLY | O_CLOEXEC)
    }

    deinit {
        if fd >= 0 { close(fd) }
        buffer.deallocate()
    }

    /// `wchar`, or nil once the process is gone. One thread at a time.
    func read() -> Int? {
        guard fd >= 0 else { return nil }
        let count = pread(fd, buffer.baseAddress, buffer.count, 0)
        guard count > 0 else { return nil }
        // "rchar: N\nwchar: N\n…": the digits after the second line's "wchar: ".
        let key: [UInt8] = Array("wchar: ".utf8)
        var index = 0
        while index + key.count <= count {
            var matches = true
            for offset in 0..<key.count where buffer[index + offset] != key[offset] {
                matches = false
                break
            }
            if matches {
                var value = 0
                var digit = index + key.count
                while digit < count, buffer[digit] >= 48, buffer[digit] <= 57 {
                    value = value * 10 + Int(buffer[digit] - 48)
                    digit += 1
                }
                return value
            }
            index += 1
        }
        return nil
    }
}

/// The seconds all threads of `pid` have spent waiting on a run queue (the second field of each
/// /proc/PID/task/TID/schedstat), or nil.
func runqueueWait(pid: Int32) -> Double? {
    guard let tasks = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return nil }
    var total = 0
    for task in tasks {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/schedstat", encoding: .utf8) else {
            continue
        }
        let fields = text.split(separator: " ")
        if fields.count >= 2, let wait = Int(fields[1]) { total += wait }
    }
    return Double(total) / 1e9
}

/// Calls `onReach` on a thread of its own as soon as the process has written `threshold` bytes (polled every
/// millisecond); returns false if it exited first or `timeout` passed.
func waitForWritten(
    _ threshold: Int, by process: StitchProcess, timeout: Duration, onReach: @escaping @Sendable () -> Void
) async -> Bool {
    let counter = WriteCounter(pid: process.pid)
    return (try? await offload { () -> Bool in
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline, process.isRunning {
            if let written = counter.read(), written >= threshold {
                onReach()
                return true
            }
            usleep(1000)
        }
        return false
    }) ?? false
}

/// One run of the command.
struct MatrixRun: Sendable {
    var result: CommandResult
    var samples: [WriteSampler.Sample]
    /// Seconds after the start at which the signal was sent, if it was.
    var signalledAt: Double?
    /// Seconds after the start at which the run was over.
    var endedAt: Double

    /// The share of `from…to` (seconds) the process's threads spent waiting for a CPU, if sampled.
    func starvation(from: Double, to: Double) -> Double? {
        guard to > from,
            let start = samples.last(where: { $0.seconds <= from })?.waited ?? samples.first?.waited,
            let end = samples.last(where: { $0.seconds <= to })?.waited
        else { return nil }
        return (end - start) / (to - from)
    }

    /// When the process had written (nearly) all it ever wrote: the end of the data.
    var dataCompleteAt: Double? {
        guard let last = samples.last else { return nil }
        return samples.first { $0.bytes >= last.bytes - (16 << 10) }?.seconds
    }

    /// The achieved rate from the first second to the end of the transfer (least squares over the samples), and the
    /// window it covers; nil when the window is too short.
    func achievedRate() -> (rate: Double, from: Double, to: Double, serverFellBehind: Bool, starved: Double)? {
        guard let last = samples.last else { return nil }
        // The end of the transfer: the signal, or 128 KiB before the last bytes written (the state and the done line
        // come after the data; the test server has sent everything by then and its lead shrinks).
        let end = signalledAt ?? endedAt
        let window = samples.filter {
            $0.seconds >= OverlapBounds.rateSettleSeconds && $0.seconds <= end
                && (signalledAt != nil || $0.bytes <= last.bytes - (128 << 10))
        }
        guard let first = window.first, let final = window.last,
            final.seconds - first.seconds >= OverlapBounds.rateMinimumWindow
        else { return nil }
        let n = Double(window.count)
        let meanT = window.reduce(0) { $0 + $1.seconds } / n
        let meanB = window.reduce(0) { $0 + Double($1.bytes) } / n
        var numerator = 0.0
        var denominator = 0.0
        for sample in window {
            numerator += (sample.seconds - meanT) * (Double(sample.bytes) - meanB)
            denominator += (sample.seconds - meanT) * (sample.seconds - meanT)
        }
        guard denominator > 0 else { return nil }
        // "Well below the link" is a premise: the server must keep ahead of the client, with bytes waiting in the
        // socket buffers. A client that has read everything sent (less than 32 KiB waiting, counted from this run's
        // start; the window ends 128 KiB before the data does) was starved by its server (the test server shares the
        // machine), not held back by its limit.
        var fellBehind = false
        if let base = samples.first, let servedBase = base.served {
            fellBehind = window.contains { sample in
                guard let served = sample.served else { return false }
                return (served - servedBase) - (sample.bytes - base.bytes) < 32 << 10
            }
        }
        // The same for the client: a machine so busy that the process waited long for a CPU cannot keep any pace.
        var starved = 0.0
        if let from = first.waited, let to = final.waited {
            starved = (to - from) / (final.seconds - first.seconds)
        }
        return (numerator / denominator, first.seconds, final.seconds, fellBehind, starved)
    }

    var summary: String {
        var line = "status \(result.status)"
        if let signal = result.signal { line += " (signal \(signal))" }
        if result.timedOut { line += " TIMED OUT" }
        if let signalledAt { line += ", signalled at \(String(format: "%.2f", signalledAt)) s" }
        line += ", ended at \(String(format: "%.2f", endedAt)) s"
        if let rate = achievedRate() {
            line += String(
                format: ", %.0f B/s over %.1f–%.1f s (waited for a CPU %.1f%%)", rate.rate, rate.from, rate.to,
                rate.starved * 100)
        }
        return line
    }
}

// MARK: - Outcome

struct MatrixFailure: Sendable {
    enum Kind: String, Sendable {
        case exitStatus = "exit status"
        case content = "content"
        case leftovers = "leftovers"
        case interruption = "interruption"
        case refetch = "re-fetch after interruption"
        case overfetch = "bytes sent beyond the bound"
        case ifRange = "If-Range"
        case connections = "connections"
        case rate = "rate"
        case harness = "harness"
    }

    var kind: Kind
    var message: String
    /// Failures that other load on the machine can cause: a rate, and the automatic count's verdict against the
    /// test server (whose pacing catches up in a burst after a stall, which a probe may measure).
    var isTimingDependent = false
}

struct MatrixOutcome: Sendable {
    var matrixCase: MatrixCase
    var failures: [MatrixFailure] = []
    var runs: [MatrixRun] = []
    var records: [ServedRecord] = []
    /// What was not judged and why (printed in the summary, not failures).
    var notes: [String] = []
    /// Attempts whose process finished before the interruption could land.
    var missedInterruptions = 0
    var interrupted = false
    var seconds: Double = 0
    var bound = 0
    var sent = 0
    /// The most bytes of one cut request that another request sent too (kernel buffering, measured).
    var largestCutOverlap = 0

    mutating func fail(_ kind: MatrixFailure.Kind, _ message: String, timingDependent: Bool = false) {
        failures.append(MatrixFailure(kind: kind, message: message, isTimingDependent: timingDependent))
    }

    /// What a failure report carries: every run's status and stderr tail, and the server's log for the file.
    var context: String {
        var text = ""
        for (index, run) in runs.enumerated() {
            text += "run \(index + 1): stitch get … \(matrixCase.arguments.joined(separator: " ")): \(run.summary)\n"
            let tail = run.result.stderrLines.suffix(8)
            if !tail.isEmpty { text += "  stderr tail:\n" + tail.map { "    " + $0 }.joined(separator: "\n") + "\n" }
        }
        text += "server log (\(records.count) responses for the file):\n"
        text += records.prefix(24).map { "  " + $0.raw }.joined(separator: "\n")
        if records.count > 24 { text += "\n  … \(records.count - 24) more" }
        return text
    }
}

// MARK: - Interval arithmetic

/// The total length of the union of `ranges`.
func unionLength(_ ranges: [Range<Int>]) -> Int {
    var total = 0
    var currentEnd = Int.min
    for range in ranges.filter({ !$0.isEmpty }).sorted(by: { $0.lowerBound < $1.lowerBound }) {
        if range.lowerBound >= currentEnd {
            total += range.count
            currentEnd = range.upperBound
        } else if range.upperBound > currentEnd {
            total += range.upperBound - currentEnd
            currentEnd = range.upperBound
        }
    }
    return total
}

/// The length of (the union of `ranges`) ∩ (the union of `others`).
func intersectionLength(_ ranges: [Range<Int>], _ others: [Range<Int>]) -> Int {
    unionLength(ranges) + unionLength(others) - unionLength(ranges + others)
}

// MARK: - Running a case

enum MatrixRunner {
    /// Runs `cases` side by side, at most ``MatrixGate``'s limit at once over every matrix test.
    static func runAll(_ cases: [MatrixCase]) async -> [MatrixOutcome] {
        await withTaskGroup(of: MatrixOutcome.self) { group in
            for matrixCase in cases {
                group.addTask {
                    await MatrixGate.shared.acquire()
                    let outcome = await run(matrixCase)
                    await MatrixGate.shared.release()
                    return outcome
                }
            }
            var outcomes: [MatrixOutcome] = []
            for await outcome in group { outcomes.append(outcome) }
            return outcomes.sorted { $0.matrixCase.slug < $1.matrixCase.slug }
        }
    }

    /// Interruption points, in bytes written by the process: a quarter of the file (so that the rerun of a rate-limited
    /// case lasts long enough to be judged); if the download finished before
    /// the signal landed (loopback nginx moves a few MiB in milliseconds), a sixteenth, then 4 KiB (the state file
    /// and the first data; `wchar` also counts libcurl's 8-byte wake-ups, about 24 bytes before the first response).
    static func thresholds(_ matrixCase: MatrixCase) -> [Int] {
        matrixCase.interruption == .none ? [0] : [matrixCase.bytes / 4, matrixCase.bytes / 16, 4 << 10]
    }

    /// Runs a case; one whose only failures are timing-dependent (a rate, a probe's verdict against the test server)
    /// runs up to twice more, from scratch — other work on the machine (a build, another test suite) can starve a
    /// client or the in-process test server for a while — and fails only if every try fails. Earlier tries are kept
    /// as notes, so the summary shows what was retried.
    static func run(_ matrixCase: MatrixCase) async -> MatrixOutcome {
        var notes: [String] = []
        for attempt in 1...3 {
            var outcome = await runOnce(matrixCase)
            outcome.notes = notes + outcome.notes
            guard !outcome.failures.isEmpty, outcome.failures.allSatisfy(\.isTimingDependent), attempt < 3 else {
                return outcome
            }
            notes.append(
                "try \(attempt) failed, tried again: "
                    + outcome.failures.map { "\($0.kind.rawValue): \($0.message)" }.joined(separator: "; "))
        }
        return MatrixOutcome(matrixCase: matrixCase)
    }

    static func runOnce(_ matrixCase: MatrixCase) async -> MatrixOutcome {
        let started = ContinuousClock.now
        let bytes = ServedFile.randomBytes(count: matrixCase.bytes, seed: matrixCase.seed)
        let thresholds = thresholds(matrixCase)
        var missed = 0
        for (attempt, threshold) in thresholds.enumerated() {
            var outcome = MatrixOutcome(matrixCase: matrixCase)
            let finished = await attemptCase(
                matrixCase, bytes: bytes, attempt: attempt, threshold: threshold,
                isLast: attempt == thresholds.count - 1, into: &outcome)
            if finished {
                outcome.missedInterruptions = missed
                outcome.seconds = (ContinuousClock.now - started) / .seconds(1)
                return outcome
            }
            missed += 1
        }
        var outcome = MatrixOutcome(matrixCase: matrixCase)
        outcome.fail(.harness, "no attempt finished")
        return outcome
    }

    /// One attempt; false when the download finished before the interruption could land and another attempt
    /// (with an earlier interruption point) should be made.
    static func attemptCase(
        _ matrixCase: MatrixCase, bytes: [UInt8], attempt: Int, threshold: Int, isLast: Bool,
        into outcome: inout MatrixOutcome
    ) async -> Bool {
        let name = "mx-\(matrixCase.slug)-\(attempt)-\(UUID().uuidString.prefix(8)).bin"
        let origin: MatrixOrigin
        var mirror: MatrixOrigin?
        let sandbox: Sandbox
        do {
            origin = try await MatrixOrigin(matrixCase, name: name, bytes: bytes)
            if matrixCase.mirror != .one {
                // The same validators as the first server's; other bytes for a differing mirror.
                let mirrored =
                    matrixCase.mirror == .equal
                    ? bytes : ServedFile.randomBytes(count: bytes.count, seed: matrixCase.seed ^ 0x5eed)
                mirror = try await MatrixOrigin(matrixCase, name: "m-" + name, bytes: mirrored)
            }
            sandbox = try Sandbox("matrix")
        } catch {
            outcome.fail(.harness, "cannot set up: \(error)")
            return true
        }
        // The proxy's configuration and log go in a folder of their own: the sandbox must end holding the file alone.
        var proxy: LoopbackProxy?
        var proxyFolder: Sandbox?
        if let kind = matrixCase.proxy.kind {
            do {
                let folder = try Sandbox("matrix-proxy")
                proxyFolder = folder
                proxy = try await offload { try LoopbackProxy(kind, in: folder.directory) }
            } catch {
                outcome.fail(.harness, "cannot start the proxy: \(error)")
                proxyFolder?.cleanup()
                sandbox.cleanup()
                origin.close()
                return true
            }
        }
        defer {
            proxy?.stop()
            proxyFolder?.cleanup()
            sandbox.cleanup()
            origin.close()
            mirror?.close()
        }
        let destination = sandbox.path("f.bin")
        let arguments =
            ["get", origin.url, "-o", "f.bin", "--json"] + matrixCase.arguments
            + (proxy.map { ["--proxy", $0.url()] } ?? []) + (mirror.map { ["--mirror", $0.url] } ?? [])
        let environment = matrixCase.environment

        let first = await execute(
            arguments, environment: environment, in: sandbox, origin: origin, interrupt: matrixCase.interruption.signal.map { (threshold, $0) })
        outcome.runs.append(first)
        var trusted: [Range<Int>] = []
        var fence: Int?
        var mirrorFence: Int?
        if let signal = matrixCase.interruption.signal {
            let exitedCleanly = first.result.status == 0 && first.result.signal == nil
            // A SIGKILL can land after the file was renamed into place: the download was over.
            let completed = exitedCleanly || (fileExists(destination) && readBytes(destination).map { same($0, bytes) } == true)
            if first.signalledAt == nil && !exitedCleanly {
                outcome.fail(
                    .exitStatus, "the first run ended before the interruption point (\(threshold) bytes written)")
                outcome.records = origin.records()
                return true
            }
            if completed {
                // Finishing (syncs, rename) is not interruptible; receiving is. A signal that landed with the data
                // all but written just came too late; one after which the data went on arriving was ignored.
                // (Unless the process was kept off the CPU meanwhile: then the signal was only handled late.)
                if exitedCleanly, let at = first.signalledAt, let complete = first.dataCompleteAt, complete - at > 0.5,
                    first.starvation(from: at, to: complete).map({ $0 <= OverlapBounds.rateMaximumStarvation }) ?? true
                {
                    outcome.fail(
                        .interruption,
                        "signal \(signal) sent at \(String(format: "%.2f", at)) s, but the data went on arriving until "
                            + "\(String(format: "%.2f", complete)) s and the run finished with exit 0",
                        timingDependent: true)
                } else if !isLast {
                    return false
                }
            } else {
                outcome.interrupted = true
                if signal == SIGINT, first.result.status != 130 || first.result.signal != nil {
                    outcome.fail(.interruption, "SIGINT should end the run with exit 130: \(first.summary)")
                }
                if signal == SIGKILL, first.result.signal != SIGKILL {
                    outcome.fail(.interruption, "SIGKILL should end the run: \(first.summary)")
                }
                if fileExists(destination) {
                    outcome.fail(.content, "the destination exists after the interrupted run and is not the served file")
                }
            }
            // The same command again: it resumes (or, killed after the rename, says the file is complete).
            if !exitedCleanly {
                await origin.settle()
                fence = await origin.fence()
                if fence == nil { outcome.fail(.harness, "could not fence the server's log between the runs") }
                if let mirror {
                    await mirror.settle()
                    mirrorFence = await mirror.fence()
                }
                if outcome.interrupted {
                    trusted = (SegmentedCLITests.trusted(destination) ?? []).map { $0.start..<$0.durable }
                        .filter { !$0.isEmpty }
                }
                let rerun = await execute(
                    arguments, environment: environment, in: sandbox, origin: origin, interrupt: nil)
                outcome.runs.append(rerun)
            }
        }

        let final = outcome.runs[outcome.runs.count - 1]
        if final.result.status != 0 || final.result.signal != nil || final.result.timedOut {
            outcome.fail(.exitStatus, "expected exit 0 at the end: \(final.summary)")
        }
        if let saved = readBytes(destination) {
            if !same(saved, bytes) {
                let first = saved.indices.first { $0 >= bytes.count || saved[$0] != bytes[$0] } ?? saved.count
                outcome.fail(
                    .content,
                    "the saved file (\(saved.count) bytes) differs from the served one (\(bytes.count)) from byte \(first) on")
            }
        } else if final.result.status == 0 {
            outcome.fail(.content, "exit 0 but no file at the destination")
        }
        let entries = sandbox.entries()
        if entries != ["f.bin"] {
            outcome.fail(.leftovers, "the sandbox should hold only f.bin, it holds \(entries)")
        }

        await origin.settle()
        await mirror?.settle()
        let records = origin.records()
        let mirrorRecords = mirror?.records() ?? []
        outcome.records = records + mirrorRecords
        let interruptedRun = fence.map { fence in records.filter { $0.order < fence } } ?? []
        let lastRun = fence.map { fence in records.filter { $0.order >= fence } } ?? records
        // A mirror's records by run likewise (its own serials).
        let mirrorInterrupted = mirrorFence.map { fence in mirrorRecords.filter { $0.order < fence } } ?? []
        let mirrorLast = mirrorFence.map { fence in mirrorRecords.filter { $0.order >= fence } } ?? mirrorRecords
        if let mirror {
            checkMirror(mirrorRecords, origin: mirror, into: &outcome)
        }
        check(
            records + mirrorRecords, interruptedRun: interruptedRun + mirrorInterrupted,
            lastRun: lastRun + mirrorLast, trusted: trusted, origin: origin, into: &outcome,
            mirrorRecords: mirrorRecords.count)
        checkTransferred(final, records: lastRun, trusted: trusted, into: &outcome)
        checkRate(into: &outcome)
        return true
    }

    /// Runs the command once; with `interrupt`, sends the signal once the process has written `threshold` bytes.
    static func execute(
        _ arguments: [String], environment: [String: String], in sandbox: Sandbox, origin: MatrixOrigin,
        interrupt: (threshold: Int, signal: Int32)?
    ) async -> MatrixRun {
        let started = ContinuousClock.now
        func seconds() -> Double { (ContinuousClock.now - started) / .seconds(1) }
        let process: StitchProcess
        do {
            process = try sandbox.start(arguments, environment: environment)
        } catch {
            return MatrixRun(
                result: CommandResult(status: -1, signal: nil, stdout: "", stderr: "cannot start: \(error)", timedOut: false),
                samples: [], signalledAt: nil, endedAt: 0)
        }
        let sampler = WriteSampler(process, started: started) { origin.bodyBytesSent() }
        let signalled = Locked<Double?>(nil)
        if let interrupt {
            _ = await waitForWritten(interrupt.threshold, by: process, timeout: .seconds(120)) {
                signalled.withLock { $0 = (ContinuousClock.now - started) / .seconds(1) }
                process.send(interrupt.signal)
            }
        }
        let result = await process.wait(timeout: .seconds(180))
        let ended = seconds()
        sampler.stop()
        return MatrixRun(
            result: result, samples: sampler.all, signalledAt: signalled.withLock { $0 }, endedAt: ended)
    }

    /// A mirror's requests (docs/mirrors.md): its first sample asks without a validator (the mirror's is not known
    /// yet), every other range with one; a differing mirror is asked for samples only (never a segment).
    static func checkMirror(_ records: [ServedRecord], origin: MatrixOrigin, into outcome: inout MatrixOutcome) {
        let matrixCase = outcome.matrixCase
        let unvalidated = records.filter { $0.range != nil && !$0.hasIfRange }
        if unvalidated.count > (outcome.interrupted ? 2 : 1) || unvalidated.contains(where: { $0.length > MatrixMirror.sampleBytes }) {
            outcome.fail(.ifRange, "the mirror was asked for ranges without its validator: \(unvalidated.map(\.raw))")
        }
        if matrixCase.mirror == .differing, let segment = records.first(where: { $0.length > MatrixMirror.sampleBytes }) {
            outcome.fail(.content, "a mirror serving other bytes was asked for more than a sample: \(segment)")
        }
        if !matrixCase.server.canSplit || matrixCase.size == .below, let any = records.first {
            outcome.fail(.connections, "a mirror was asked where the file is not split: \(any)")
        }
    }

    /// The server-side checks (docs/overlap.md). `mirrorRecords`: how many of `records` (the last ones) are a
    /// mirror's.
    static func check(
        _ records: [ServedRecord], interruptedRun: [ServedRecord], lastRun: [ServedRecord], trusted: [Range<Int>],
        origin: MatrixOrigin, into outcome: inout MatrixOutcome, mirrorRecords: Int = 0
    ) {
        // Samples proving a mirror (the first server's and the mirror's own, 64 KiB each) are asked for beside the
        // file: they count in the bytes sent, within their own allowance, and are not a refetch of saved bytes.
        let mirrored = outcome.matrixCase.mirror != .one
        let isSample = { (record: ServedRecord) in
            mirrored && record.isBoundedRange && record.length <= MatrixMirror.sampleBytes
        }
        let sampleBytes = records.filter(isSample).reduce(0) { $0 + $1.sent }
        let firstServerRecords = Array(records.dropLast(mirrorRecords))
        let matrixCase = outcome.matrixCase
        let server = matrixCase.server
        let size = matrixCase.bytes
        if records.isEmpty {
            outcome.fail(.harness, "the server logged no response for the file")
            return
        }

        // If-Range: with a validator on every ranged request (the one the server gave); without, on none. (A
        // mirror's are checked by checkMirror.)
        for record in firstServerRecords where record.range != nil {
            if server.hasValidator {
                let expected = origin.validator
                if !record.hasIfRange || (expected != nil && record.ifRange != expected) {
                    outcome.fail(.ifRange, "a ranged request without the validator \(expected ?? "(ETag)"): \(record)")
                }
            } else if record.hasIfRange {
                outcome.fail(.ifRange, "If-Range sent though the server gave no validator: \(record)")
            }
        }

        // One connection below the split threshold and where ranges cannot be checked; -c 3 and -c 8 split above it.
        let segments = firstServerRecords.filter { $0.isBoundedRange && !isSample($0) }
        if matrixCase.size == .below || !server.canSplit, !segments.isEmpty {
            outcome.fail(.connections, "segment requests where one connection is due: \(segments.map(\.raw))")
        }
        if let count = matrixCase.connections.explicitCount, count > 1, matrixCase.size == .above, server.canSplit,
            segments.isEmpty
        {
            outcome.fail(.connections, "-c \(count) on \(size) bytes made no segment request")
        }
        // The automatic count splits where one connection is capped far below the probe's rate (2 MiB/s on nginx's
        // capped port, 4 MiB/s on the test server, against 32 MiB/s), unless a rate limit caps the whole download.
        if matrixCase.connections == .auto, matrixCase.size == .above, server.canSplit, server != .nginx,
            matrixCase.rate != .below, segments.isEmpty
        {
            let first = records.first.map { " (first response: \($0.raw))" } ?? ""
            outcome.fail(
                .connections,
                "automatic connections kept one connection on \(size) bytes from a server capped per connection "
                    + "\(server == .nginxCapped ? "at 2 MiB/s" : "at 4 MiB/s")\(first)",
                timingDependent: !server.isNginx)
        }

        // After an interruption: nothing the interrupted run had saved (what the state file and the written record
        // vouch for) is fetched again, but for the overlap window (no validator) or a whole restart (no ranges).
        let trustedBytes = unionLength(trusted)
        if outcome.interrupted {
            let rerun = lastRun.filter { !isSample($0) }
            let refetched = intersectionLength(rerun.map(\.sentRange), trusted)
            let allowed =
                server.canSplit ? 0 : server.acceptsRanges ? min(OverlapBounds.overlapWindow, trustedBytes) : trustedBytes
            if refetched > allowed {
                outcome.fail(
                    .refetch,
                    "the rerun was sent \(refetched) of the \(trustedBytes) bytes the interrupted run had saved "
                        + "(\(trusted.map { "\($0.lowerBound)..<\($0.upperBound)" })); allowed \(allowed); its responses: "
                        + rerun.map(\.raw).joined(separator: " | "))
            }
        }

        // Everything sent: the file once, plus per cut request what it had in flight (at most the kernel's and
        // libcurl's buffers), plus the overlap window of each request without If-Range, plus a whole restart.
        // A response counts as cut when the server could not send all of it, and every response of an interrupted
        // run does: a body that fitted in the socket buffers looks whole to the server though the client died first.
        let sent = records.reduce(0) { $0 + $1.sent }
        var bound = size + sampleBytes
        let interruptedOrders = Set(interruptedRun.map(\.order))
        // A steal's victim is cut too, at the split point, although the server may have handed all of its range to
        // the kernel before the client stopped reading (a throttled connection's rest fits in the socket buffers):
        // a response another response starts inside of.
        let stolenFrom = { (record: ServedRecord) in
            records.contains { other in
                !isSample(other) && other.start > record.start && other.start < record.start + record.length
            }
        }
        let countsAsCut = { (record: ServedRecord) in
            record.isCut || interruptedOrders.contains(record.order) || stolenFrom(record)
        }
        // Through a proxy a cut request had two connections' buffers in flight, and the proxy's own.
        let slack = OverlapBounds.cutRequestSlack * (matrixCase.proxy == .none ? 1 : 2) + (matrixCase.proxy == .none ? 0 : OverlapBounds.proxyBuffer)
        for record in records where countsAsCut(record) {
            bound += min(record.sent, slack)
        }
        bound += OverlapBounds.overlapWindow * records.filter { $0.range != nil && !$0.hasIfRange }.count
        if outcome.interrupted, !server.acceptsRanges { bound += trustedBytes }
        outcome.sent = sent
        outcome.bound = bound
        if sent > bound {
            let cut = records.filter(\.isCut).count
            outcome.fail(
                .overfetch,
                "the server sent \(sent) body bytes for a \(size)-byte file, over the bound \(bound) "
                    + "(\(records.count) responses, \(cut) cut short)")
        }
        for (index, record) in records.enumerated() where countsAsCut(record) {
            var others = records.map(\.sentRange)
            others.remove(at: index)
            outcome.largestCutOverlap = max(outcome.largestCutOverlap, intersectionLength([record.sentRange], others))
        }
    }

    /// The client's side of the same bound, without the kernel's share: the bytes the last run received (`transferred`
    /// in its `done` event) are the bytes the earlier runs had not saved, plus the overlap window of each request
    /// without If-Range, plus what a whole restart fetches again (no ranges).
    static func checkTransferred(
        _ run: MatrixRun, records: [ServedRecord], trusted: [Range<Int>], into outcome: inout MatrixOutcome
    ) {
        guard run.result.status == 0,
            let done = jsonLinesLenient(run.result.stdout).last(where: { $0["event"] as? String == "done" }),
            let transferred = done["transferred"] as? Int
        else { return }
        let server = outcome.matrixCase.server
        let trustedBytes = outcome.interrupted ? unionLength(trusted) : 0
        var allowed = outcome.matrixCase.bytes - trustedBytes
        allowed += OverlapBounds.overlapWindow * records.filter { $0.range != nil && !$0.hasIfRange }.count
        if !server.acceptsRanges { allowed += trustedBytes }
        if transferred > allowed {
            outcome.fail(
                .overfetch,
                "the last run received \(transferred) bytes (its done event), more than the \(allowed) it needed "
                    + "(\(outcome.matrixCase.bytes) − \(trustedBytes) saved before, + overlap windows and restarts)")
        }
    }

    /// Rate-limited cases: every run judged (from its first second to its end, when that is long enough) lands within
    /// 5 % of the limit, and at least one run is judged.
    static func checkRate(into outcome: inout MatrixOutcome) {
        guard outcome.matrixCase.judgesRate, let limit = outcome.matrixCase.limit else { return }
        var judged = 0
        for (index, run) in outcome.runs.enumerated() {
            guard let achieved = run.achievedRate() else { continue }
            if achieved.serverFellBehind {
                outcome.notes.append(
                    String(format: "run %d not judged: the test server fell behind (%.0f B/s)", index + 1, achieved.rate))
                continue
            }
            if achieved.starved > OverlapBounds.rateMaximumStarvation {
                outcome.notes.append(
                    String(
                        format: "run %d not judged: its threads waited for a CPU %.0f%% of the time (%.0f B/s)", index + 1,
                        achieved.starved * 100, achieved.rate))
                continue
            }
            judged += 1
            let error = (achieved.rate - Double(limit.bytesPerSecond)) / Double(limit.bytesPerSecond)
            if abs(error) > OverlapBounds.rateTolerance {
                outcome.fail(
                    .rate,
                    String(
                        format: "run %d: expected %d B/s (--limit-rate %@) ±5%% after the first second, achieved %.0f B/s "
                            + "(%+.1f%%) over %.2f–%.2f s",
                        index + 1, limit.bytesPerSecond, limit.text, achieved.rate, error * 100, achieved.from,
                        achieved.to) + String(format: "; its threads waited for a CPU %.1f%% of that time", achieved.starved * 100),
                    timingDependent: true)
            }
        }
        if judged == 0, outcome.notes.isEmpty {
            outcome.fail(
                .rate,
                "no run lasted \(OverlapBounds.rateMinimumWindow) s past its first second, so the rate could not be "
                    + "judged: \(outcome.runs.map(\.summary))")
        }
    }
}


/// The stdout lines that parse as JSON objects (a line cut by a signal is skipped).
func jsonLinesLenient(_ text: String) -> [[String: Any]] {
    text.split(separator: "\n").compactMap {
        try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
    }
}

/// Byte equality without a debug build's element-by-element loop.
func same(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    guard !a.isEmpty else { return true }
    return a.withUnsafeBytes { x in b.withUnsafeBytes { y in memcmp(x.baseAddress!, y.baseAddress!, a.count) == 0 } }
}

/// nginx's access log, read incrementally and indexed by request path: the matrix polls it for many files at once,
/// and reading and splitting the whole log each time costs seconds of CPU a second by the end of the run.
final class NginxLogIndex: Sendable {
    static let shared = NginxLogIndex()

    private struct State {
        var log: String?
        var offset: off_t = 0
        var partial: [UInt8] = []
        var lines: [String: [String]] = [:]
    }

    private let state = Locked(State())

    /// The lines for requests of `path` (query ignored), in log order.
    func lines(for path: String, in log: String) -> [String] {
        state.withLock { state in
            if state.log != log { state = State(log: log) }
            refresh(&state, log)
            return state.lines[path] ?? []
        }
    }

    private func refresh(_ state: inout State, _ log: String) {
        let fd = open(log, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { return }
        if info.st_size < state.offset { state = State(log: log) }
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = chunk.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, state.offset) }
            guard count > 0 else { break }
            state.offset += off_t(count)
            var start = 0
            for index in 0..<count where chunk[index] == 10 {
                state.partial += chunk[start..<index]
                add(String(decoding: state.partial, as: UTF8.self), to: &state)
                state.partial.removeAll(keepingCapacity: true)
                start = index + 1
            }
            state.partial += chunk[start..<count]
        }
    }

    /// Files the line under its request path: `"GET /path?query HTTP/1.1"`.
    private func add(_ line: String, to state: inout State) {
        guard let open = line.range(of: "\""), let space = line[open.upperBound...].firstIndex(of: " ") else { return }
        let target = line[line.index(after: space)...].prefix { $0 != " " && $0 != "\"" }
        let path = String(target.prefix { $0 != "?" })
        state.lines[path, default: []].append(line)
    }
}
