import Foundation
public import Stitch

/// The transport backends the engine's tests run over: the library's own list (``TransportBackend``).
public typealias TestBackend = TransportBackend

extension TransportBackend {
    /// The process-wide transport of this backend, for a test that has already chosen one this build has.
    public var testTransport: any HTTPTransport {
        guard let transport else { fatalError("this build has no \(self) transport (see TransportBackend.available)") }
        return transport
    }

    /// The backend the suites that drive the engine against the fault-injecting server use: the one named by
    /// `STITCH_TEST_TRANSPORT` (`libcurl` or `urlsession`), else the build's default. So the test script runs them
    /// once per backend; the conformance suite runs every backend the build has in one go. An unknown name, or one
    /// this build lacks, stops the run rather than silently testing the default.
    public static let selected: TransportBackend = {
        guard let name = ProcessInfo.processInfo.environment["STITCH_TEST_TRANSPORT"], !name.isEmpty else {
            return .default
        }
        guard let backend = TransportBackend(rawValue: name) else {
            fatalError("STITCH_TEST_TRANSPORT=\(name): expected one of \(TransportBackend.available)")
        }
        guard backend.transport != nil else {
            fatalError("STITCH_TEST_TRANSPORT=\(name): this build has no \(name) transport (the Libcurl trait is off)")
        }
        return backend
    }()
}

extension TransportBackend {
    /// The window the backend's shared transport asks for a whole file or an open range in (``URLSessionTransport``;
    /// Stitch's `RangeWindow`), or nil when it sends every request as the engine made it.
    public var requestWindow: Int? {
        switch self {
        case .urlSession: return URLSessionTransport.shared.window
        case .libcurl: return nil
        }
    }
}

extension RecordedRequest {
    /// The `Range` the engine asked for, seen through the window of the backend under test
    /// (``TransportBackend/selected``): over URLSession a request for the whole file, or for a range to the end,
    /// goes out as its first window, `bytes=A-(A+W-1)`; that stands for `bytes=A-`, or for no `Range` at all at
    /// `A = 0` without `If-Range`. Over libcurl this is ``range``. Meant for files no larger than a window: the
    /// windows after the first, and a lane's range longer than a window, are not told apart from the engine's own.
    public var askedRange: String? { askedRange(window: TransportBackend.selected.requestWindow) }

    /// ``askedRange`` behind a transport that asks in `window`s (nil: none); for a process other than this one
    /// (the `stitch` the CLI tests run uses its build's default transport, whatever `STITCH_TEST_TRANSPORT` says).
    public func askedRange(window: Int?) -> String? {
        Self.askedRange(range, hasIfRange: header("If-Range") != nil, window: window)
    }

    /// ``askedRange`` of a `Range` value sent with or without `If-Range` by a transport asking in `window`s (nil:
    /// none); for logs other than the test server's (the matrix reads nginx's).
    public static func askedRange(_ range: String?, hasIfRange: Bool, window: Int?) -> String? {
        guard let window, let (first, last) = bounds(of: range), last - first + 1 == window else { return range }
        return first == 0 && !hasIfRange ? nil : "bytes=\(first)-"
    }

    /// The first and last byte of a `bytes=A-B` value; nil for any other form.
    static func bounds(of range: String?) -> (Int, Int)? {
        guard let range, range.hasPrefix("bytes="), let dash = range.firstIndex(of: "-"),
            let first = Int(range[range.index(range.startIndex, offsetBy: 6)..<dash]),
            let last = Int(range[range.index(after: dash)...])
        else { return nil }
        return (first, last)
    }
}

extension TestBackend {
    /// The most one TCP connection over loopback can hold between the server's writes and the client's reads: the
    /// largest send buffer plus the largest receive buffer the kernel grows a socket to. What a server counts as
    /// sent on a connection the client cut can exceed what the client used by this much.
    public static let loopbackSocketLimit: Int64 = {
        func maximum(_ name: String) -> Int64 {
            let handle = FileHandle(forReadingAtPath: "/proc/sys/net/ipv4/\(name)")
            let text = (try? handle?.readToEnd()).flatMap { $0.flatMap { String(decoding: $0, as: UTF8.self) } } ?? ""
            return text.split(whereSeparator: \.isWhitespace).last.flatMap { Int64($0) } ?? 64 << 20
        }
        return maximum("tcp_wmem") + maximum("tcp_rmem")
    }()
}

extension TransportBackend {
    /// The most body bytes the backend's shared transport reads from a connection before its sink has them: libcurl's
    /// receive buffer, or what ``URLSessionTransport`` holds for a sink that cannot ask for its rest.
    public var transportBufferLimit: Int64 {
        switch self {
        case .libcurl:
            #if Libcurl
            return Int64(CurlTransport.defaultReceiveBufferSize)
            #else
            fatalError("this build has no libcurl transport")
            #endif
        case .urlSession: return Int64(URLSessionTransport.shared.holdLimit)
        }
    }
}

extension TransportBackend {
    /// Whether the backend keeps a connection for the next request of a download (libcurl's keep-alive). Over
    /// URLSession every request the engine makes gets a session, and so a connection, of its own.
    public var keepsConnections: Bool { self == .libcurl }

    /// A stall timeout short enough for a test to wait out, yet not tripped by the backend's own latency: 1 s, or
    /// 4 s over URLSession, whose delegate callbacks can come seconds late while the rest of the suite's transfers
    /// keep dispatch's worker threads busy (each session has a work queue of its own; measured on two cores with
    /// the suite and two busy loops: a response head reached the delegate 2 s after the server sent it).
    public var shortStallTimeout: Double { self == .urlSession ? 4 : 1 }

    /// How long after a transfer has ended its connection may still be open, as a test allows for it. None for
    /// libcurl, which closes the socket before it reports the end. FoundationNetworking closes it once the dispatch
    /// sources watching it are torn down, on a queue of its own, after the task's completion has been delivered:
    /// about 1 ms later on an idle machine (TwoPhaseTransportTests.aBodyAskedForAfterACancelEndsWithTheConnection),
    /// so a lane's next request can reach the server first. Allowed: 2 s, for a loaded machine that runs those
    /// queues late. A connection the engine really kept beside the cap would be one of a lane waiting for bytes,
    /// which the engine keeps for longer; the exact count is checked over libcurl. See
    /// ``TestHTTPServer/settleInFlightCount(above:within:)``.
    public var connectionCloseLag: Duration { self == .urlSession ? .seconds(2) : .zero }
}

extension Sequence where Element == RecordedRequest {
    /// The requests as the engine made them, behind the windows of the backend under test
    /// (``TransportBackend/selected``). Over URLSession each request the engine makes has a connection of its own,
    /// and the windows after its first follow on that connection: they are folded into one request whose `Range`
    /// runs from the first window's start to the last one's end (no `Range` where the first window stands for the
    /// whole file), so a lane's or a probe's chain of windows reads as its one request. A lone first window is
    /// read through ``RecordedRequest/askedRange``. Over libcurl: the requests as they are.
    public var engineRequests: [RecordedRequest] { engineRequests(window: TransportBackend.selected.requestWindow) }

    /// ``engineRequests`` behind a transport that asks in `window`s (nil: none); for a process other than this one.
    public func engineRequests(window: Int?) -> [RecordedRequest] {
        guard let window else { return Array(self) }
        var order: [Int] = []
        var chains: [Int: [RecordedRequest]] = [:]
        for request in self {
            if chains[request.connectionID] == nil { order.append(request.connectionID) }
            chains[request.connectionID, default: []].append(request)
        }
        func bounds(_ request: RecordedRequest) -> (Int, Int)? { RecordedRequest.bounds(of: request.range) }
        return order.flatMap { id -> [RecordedRequest] in
            let chain = chains[id] ?? []
            guard chain.count > 1, let first = chain.first, let (start, firstLast) = bounds(first),
                firstLast - start + 1 == window, let (_, end) = chain.last.flatMap(bounds)
            else { return chain }  // one request, or (never seen) several that are not one request's windows
            var headers = first.headers.filter { $0.name.lowercased() != "range" }
            if start != 0 || first.header("If-Range") != nil { headers.append((name: "Range", value: "bytes=\(start)-\(end)")) }
            return [RecordedRequest(
                serial: first.serial, index: first.index, method: first.method, target: first.target, path: first.path,
                query: first.query, version: first.version, headers: headers, connectionID: first.connectionID,
                indexOnConnection: first.indexOnConnection)]
        }
    }
}
