public import Foundation
/// A case-insensitive, order-preserving list of HTTP header fields.
public struct HTTPHeaders: Sendable, Hashable, Sequence {
    /// One header field.
    public struct Field: Sendable, Hashable {
        /// The field name, in the case it was given.
        public var name: String
        /// The field value.
        public var value: String
        /// A field with this name and value.
        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// The fields in the order added.
    public private(set) var fields: [Field] = []

    /// No fields.
    public init() {}

    /// The fields of these (name, value) pairs, in order.
    public init(_ pairs: [(String, String)]) {
        self.fields = pairs.map { Field(name: $0.0, value: $0.1) }
    }

    /// Appends a field, keeping any of the same name.
    public mutating func add(name: String, value: String) {
        fields.append(Field(name: name, value: value))
    }

    /// The first value of `name`, compared case-insensitively.
    public subscript(name: String) -> String? {
        fields.first { Self.sameName($0.name, name) }?.value
    }

    /// Every value of `name`, in order, compared case-insensitively.
    public func values(_ name: String) -> [String] {
        fields.compactMap { Self.sameName($0.name, name) ? $0.value : nil }
    }

    /// Whether two field names are the same: ASCII letters compared without case, every other byte as it is (RFC
    /// 9110 §5.1: a name is a token, compared case-insensitively). Nothing is allocated: a response's head is looked
    /// up a dozen times, and lowercasing every name each time was about 1 % of a small download's CPU. A name
    /// outside ASCII matches only itself (Unicode lowercasing would have taken the Kelvin sign for a `k`).
    public static func sameName(_ a: String, _ b: String) -> Bool {
        guard a.utf8.count == b.utf8.count else { return false }
        return a.utf8.elementsEqual(b.utf8) { x, y in
            x == y || (x | 0x20 == y | 0x20 && (x | 0x20) >= UInt8(ascii: "a") && (x | 0x20) <= UInt8(ascii: "z"))
        }
    }

    /// Whether a field named `name` is present, compared case-insensitively.
    public func contains(_ name: String) -> Bool { self[name] != nil }

    /// Iterates over ``fields`` in order.
    public func makeIterator() -> IndexingIterator<[Field]> { fields.makeIterator() }
}

/// One HTTP GET as the engine asks the transport to perform it.
public struct TransportRequest: Sendable {
    /// The URL to request.
    public var url: String
    /// The header fields to send (the engine's, such as `Range`, and the user's).
    public var headers: HTTPHeaders
    /// Timeouts, TLS and credentials for this request.
    public var options: TransportOptions
    /// Set on every request of a segmented download's lanes (the lane's number): requests of different lanes are
    /// meant to travel in parallel, so a transport must not carry them over one connection (as streams of one
    /// HTTP/2 connection, or one after another); a lane's next request may reuse its own connection. `nil`: any
    /// connection, reused or shared, as the transport sees fit. How a backend keeps lanes apart (libcurl: no
    /// waiting for multiplexing and a fresh TLS connection; a URLSession backend: a session per lane) is its own
    /// business.
    public var lane: Int?
    /// The download's clock: the transport measures stalls and times pauses on it.
    public var clock: any DownloadClock

    /// A request with these fields; by default on no lane, on the system's clock.
    public init(
        url: String, headers: HTTPHeaders, options: TransportOptions, lane: Int? = nil,
        clock: any DownloadClock = SystemClock()
    ) {
        self.url = url
        self.headers = headers
        // The cookies of `options` for this URL (every request, each redirect's too), unless the caller sent its own.
        if let jar = options.cookies, headers["Cookie"] == nil, let cookie = jar.header(for: url) {
            self.headers.add(name: "Cookie", value: cookie)
        }
        self.options = options
        self.lane = lane
        self.clock = clock
    }
}

/// Connection-level settings for one request, as any HTTP client has them. Settings of one backend (libcurl's
/// receive buffer size) belong to that backend's own configuration, so the engine never depends on them.
public struct TransportOptions: Sendable, Hashable {
    /// How TLS certificates are checked.
    public enum TLSVerification: Sendable, Hashable {
        /// Verify against the system trust store, or `caCertificatePath` when set.
        case verify
        /// Do not verify peer or host name (`--insecure`).
        case insecure
    }

    /// Seconds allowed to establish the connection (TCP and TLS).
    public var connectTimeout: Double = 30
    /// A transfer that receives fewer than `stallMinimumBytes` (head or body) in this many seconds counts as
    /// stalled: silent, or dripping (a server that sends one byte a second never goes silent).
    public var stallTimeout: Double = 30
    /// See `stallTimeout`. 1 KiB per 30 s is ~34 bytes a second, far below any real link; 1 restores "any byte".
    public var stallMinimumBytes: Int = 1024
    /// Whether the server's certificate and host name are checked.
    public var tlsVerification: TLSVerification = .verify
    /// A PEM bundle used instead of the system trust store.
    public var caCertificatePath: String?
    /// A PEM bundle an `https://` proxy's certificate is checked against instead of the system trust store
    /// (`--proxy-ca-cert`, curl's `--proxy-cacert`): a company's proxy often has a certificate of its own CA. It
    /// applies to the proxy only (``caCertificatePath`` to the servers), and to the environment's proxy too.
    public var proxyCACertificatePath: String?
    /// The `User-Agent` sent with every request.
    public var userAgent: String = "stitch/\(StitchVersion.string)"
    /// HTTP Basic credentials (`stitch get -u`), sent only to the origin they were given for.
    public var credentials: Credentials?
    /// Credentials from a netrc file for each request's own host (`--netrc`, `--netrc-file`), as libcurl reads
    /// it; ``credentials`` win for their origin. Nil: no netrc.
    public var netrc: Netrc?
    /// Cookies sent with each request whose URL they match (`--load-cookies`); nil: none. The engine adds them
    /// (``TransportRequest/init(url:headers:options:lane:clock:)``), not the transport, so every backend sends the same.
    public var cookies: CookieJar?
    /// The proxy every request goes through (`--proxy`). Nil: the environment's, as libcurl reads it
    /// (`http_proxy` for http URLs — lower case only —, `https_proxy` or `HTTPS_PROXY` for https, then
    /// `ALL_PROXY`/`all_proxy`; `NO_PROXY`/`no_proxy` lists hosts reached directly). ``Proxy/direct``: none at
    /// all, whatever the environment says.
    public var proxy: Proxy?
    /// Hosts reached directly, not through the proxy (`--noproxy`): curl's list, comma-separated host names
    /// (a name matches itself and its subdomains), IP addresses, CIDR ranges, or `*` for every host. Nil: the
    /// environment's `NO_PROXY` or `no_proxy`.
    public var noProxy: String?

    /// A user name and password for the origins (scheme, host and port) of the URLs they were given with: a
    /// redirect to another origin does not get them, as curl does not send `-u` credentials to another host
    /// unless told to.
    public struct Credentials: Sendable, Hashable, CustomStringConvertible {
        /// The user name.
        public var user: String
        /// The password; never in ``description``.
        public var password: String
        /// The origins they are sent to, e.g. `https://example.com:443`.
        public var origins: Set<String>

        /// Credentials for the origins of `urls` (those without a host are left out).
        public init(user: String, password: String, for urls: [String]) {
            self.user = user
            self.password = password
            self.origins = Set(urls.compactMap(Self.origin(of:)))
        }

        /// Credentials for the origins of `urls` (those without a host are left out).
        public init(user: String, password: String, for urls: [URL]) {
            self.init(user: user, password: password, for: urls.map(\.absoluteString))
        }

        /// `scheme://host:port`, lowercased, the port filled in for http and https; nil without a host.
        public static func origin(of url: String) -> String? {
            guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
                let host = components.host?.lowercased(), !host.isEmpty
            else { return nil }
            let port = components.port ?? (scheme == "https" ? 443 : scheme == "http" ? 80 : -1)
            return "\(scheme)://\(host):\(port)"
        }

        /// Never the password (descriptions end up in logs and failure messages).
        public var description: String { "Credentials(user: \(user), password: <hidden>, origins: \(origins.sorted()))" }
    }

    /// A proxy: its URL (`http://`, `https://`, `socks5://` or `socks5h://`, a host and a port; nothing else) and
    /// the credentials it asks for, kept apart from the URL so that the URL can be shown.
    public struct Proxy: Sendable, Hashable, CustomStringConvertible {
        /// The schemes a proxy may have: HTTP (plain, or TLS to the proxy), SOCKS5 with names resolved here
        /// (`socks5`) or by the proxy (`socks5h`).
        public static let schemes = ["http", "https", "socks5", "socks5h"]

        /// `scheme://host:port`, without credentials; empty for ``direct``.
        public let url: String
        /// The user name the proxy is given, if any.
        public var user: String?
        /// The password; never in ``description``.
        public var password: String?

        /// No proxy, whatever the environment says (`--proxy ''`, as curl).
        public static let direct = Proxy(checkedURL: "")

        private init(checkedURL: String) { url = checkedURL }

        /// The proxy at `text`: `[SCHEME://][USER[:PASSWORD]@]HOST[:PORT][/]` (no scheme: `http://`, as curl and
        /// aria2 take it; no port: 1080, libcurl's default, for SOCKS; 80 or 443 for HTTP and HTTPS, what a user
        /// of aria2 expects). Credentials in `text` are moved to ``user`` and ``password`` (a caller that must not
        /// take them from there, the command line, refuses them first: see ``hasCredentials(_:)``).
        /// - Throws: a message naming what is wrong, without the credentials.
        public init(parsing text: String) throws(ProxyError) {
            if text.isEmpty {
                self = .direct
                return
            }
            // No message repeats `text`: it may hold a password (anything before an `@`, whatever follows it).
            guard !text.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7F }) else {
                throw ProxyError("a proxy URL has no spaces or control characters")
            }
            let full = text.contains("://") ? text : "http://" + text
            guard let components = URLComponents(string: full), let scheme = components.scheme?.lowercased() else {
                throw ProxyError("not a proxy URL (SCHEME://HOST:PORT, e.g. http://127.0.0.1:3128)")
            }
            guard Self.schemes.contains(scheme) else {
                throw ProxyError(
                    "a proxy is \(Self.schemes.map { $0 + "://" }.joined(separator: ", ")), not \(scheme)://")
            }
            guard let host = components.host, !host.isEmpty else { throw ProxyError("a proxy URL names a host") }
            guard components.path.isEmpty || components.path == "/", components.query == nil,
                components.fragment == nil
            else {
                throw ProxyError("a proxy URL is SCHEME://HOST:PORT, with no path or query")
            }
            let port = components.port ?? (scheme == "http" ? 80 : scheme == "https" ? 443 : 1080)
            guard (1...65_535).contains(port) else { throw ProxyError("a proxy's port is 1 to 65535, not \(port)") }
            let shownHost = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
            self.init(checkedURL: "\(scheme)://\(shownHost):\(port)")
            // URLComponents gives them percent-decoded already.
            user = components.user
            password = components.password
        }

        /// Whether `text` may hold a user name or password: any `@` (a password may hold `/`, `?` or `#` unencoded,
        /// so where the authority ends cannot be trusted to find it).
        public static func hasCredentials(_ text: String) -> Bool { text.contains("@") }

        /// The URL and the user name, never the password.
        public var description: String {
            url.isEmpty ? "no proxy" : url + (user.map { " (user \($0), password <hidden>)" } ?? "")
        }
    }

    /// Why a proxy URL was refused.
    public struct ProxyError: Error, Sendable, CustomStringConvertible {
        /// What is wrong, in one line, without the URL's credentials.
        public let description: String
        /// An error saying `description`.
        public init(_ description: String) { self.description = description }
    }

    /// Where credentials for a host may come from besides `-u`.
    public struct Netrc: Sendable, Hashable {
        /// The file; nil: `~/.netrc`.
        public var file: String?
        /// Credentials from `file`, or from `~/.netrc` when nil.
        public init(file: String? = nil) { self.file = file }
    }

    /// The defaults.
    public init() {}
}

/// The status line and header fields of a final (non-1xx) response.
public struct ResponseHead: Sendable, Hashable {
    /// The HTTP status code, e.g. 206.
    public var status: Int
    /// The header fields, in the order received.
    public var headers: HTTPHeaders

    /// A head with this status and these fields.
    public init(status: Int, headers: HTTPHeaders) {
        self.status = status
        self.headers = headers
    }
}

/// Receives a response's body bytes. Called on the transport's thread, one chunk at a time and in order, so it
/// must be quick and must not block (a `pwrite` into the page cache and a little bookkeeping are fine; opening,
/// syncing or hashing files is not: that belongs to the engine, before it attaches the sink).
public protocol BodySink: AnyObject, Sendable {
    /// Body bytes in order: take them all, or none and pause (the same bytes come again after the pause), or
    /// stop the transfer (its outcome is then `.abortedBySink`). After `.abort` the sink is never called again.
    func receive(_ bytes: UnsafeRawBufferPointer) -> ReceiveDecision

    /// Whether what this sink has not yet taken can be asked for again with a range request that proves the
    /// resource unchanged. A transport that cannot pause a transfer (the URLSession backend) bounds its memory by
    /// letting go of the connection (``TransportError`` `yielded`) only when this is true. False unless a sink says
    /// otherwise.
    var canRequestRest: Bool { get }

    /// How many more bytes this sink takes before it has all it wants (a segment whose end another connection took
    /// over wants less than its response brings), or nil for the body to its end. Asked on the transport's thread,
    /// between chunks. A transport that asks for a body in parts (the URLSession backend's windows) asks for no more
    /// than this and one byte, so that the sink still sees where its bytes end, as over one response.
    var bytesWanted: Int64? { get }
}

extension BodySink {
    /// False: a sink says when the rest of its body can be asked for again.
    public var canRequestRest: Bool { false }
    /// Nil: the body to its end.
    public var bytesWanted: Int64? { nil }
}

/// What a sink did with a chunk of body bytes.
public enum ReceiveDecision: Sendable, Equatable {
    /// All bytes were taken.
    case accepted
    /// None were taken: read nothing more for this long (rate limiting), then offer the same bytes again. How a
    /// backend holds off (libcurl's pause; bytes held in memory over URLSession) and where it keeps the refused bytes is
    /// its own business; it must offer exactly them next, and none after them first.
    case wait(Duration)
    /// Stop the transfer.
    case abort
}

/// A response whose final head has arrived. Its body waits — the transport reads no further — until the engine
/// has decided, off the transport's thread, what the head means: then exactly one of ``receive(into:)``,
/// ``discard()`` or ``cancel()``. A response dropped without any of them is cancelled.
public protocol TransportResponse: AnyObject, Sendable {
    /// The status line and header fields.
    var head: ResponseHead { get }
    /// Streams the body into `sink` and returns when the transfer has ended: the body is complete (`.success`),
    /// the sink stopped it (`.abortedBySink`), it failed, or the calling task was cancelled (`.cancelled`).
    func receive(into sink: any BodySink) async -> Result<Void, TransportError>
    /// Reads and drops the body (a redirect's, an error page), up to a small limit, so the connection can be
    /// reused. `.success` once it is read or the limit is reached.
    func discard() async -> Result<Void, TransportError>
    /// Ends the transfer without reading (the rest of) the body: before a decision, or while ``receive(into:)``
    /// runs (which then returns `.cancelled`). It returns at once; a ``receive(into:)`` or ``discard()`` called
    /// after it takes no bytes and returns once the transfer has ended and let go of its connection (`.cancelled`,
    /// or how it had ended already): how a caller waits for that before its next request, so that a cap on
    /// connections holds at the server too.
    func cancel()
}

/// What the engine asks of a response's body once it has decided (``DecidedBodyResponse``).
package enum BodyChoice: Sendable {
    /// Stream the body into this sink.
    case receive(any BodySink)
    /// Read and drop it, keeping the connection.
    case discard
}

/// A response whose body the engine may ask for from the thread that decided about it (the libcurl transport): the
/// decision's answer goes to the transfer at once, without a hop back to the awaiting task and another to the
/// transport's thread (two waits for a busy thread between a small file's head and its body).
package protocol DecidedBodyResponse: TransportResponse {
    /// Hands `choose` to `submit` (which runs it on a thread that may block); from that thread the body is then
    /// asked for as it chose. Returns how the transfer ended (as ``TransportResponse/receive(into:)`` and
    /// ``TransportResponse/discard()`` do), or nil when `choose` chose neither: the body was not asked for, and the
    /// caller may still cancel the transfer and discard it.
    func body(
        decidedOn submit: (@escaping @Sendable () -> Void) -> Void, by choose: @escaping @Sendable () -> BodyChoice?
    ) async -> Result<Void, TransportError>?
}

/// Moves bytes: performs one request in two phases, the response head first, then (as the engine decides) the
/// body into a sink.
///
/// No transport type from a C library appears here, so the engine can be driven by a fake in tests.
public protocol HTTPTransport: Sendable {
    /// Sends `request` and returns once the final response head has arrived, or the transfer failed before it.
    /// Cancelling the calling task stops the transfer and yields `TransportError.cancelled`.
    func start(_ request: TransportRequest) async -> Result<any TransportResponse, TransportError>
}

/// Why a transfer ended without success.
public struct TransportError: Error, Sendable, Hashable, CustomStringConvertible {
    package enum Code: Sendable, Hashable {
        case cancelled
        case abortedBySink
        case resolve
        case connect
        case connectTimeout
        case stalled
        case tls
        case partialBody
        case network
        case protocolError
        /// A response the transport refuses outright (a NUL in a header, a head too large, a body coding it cannot
        /// undo): the same server would send the same again.
        case malformedResponse
        /// The transport cannot perform what the request asks for (an option its platform lacks).
        case unsupported
        /// The transport ended the request itself to keep memory bounded while the sink took the body more slowly
        /// than the server sent it (it has no way to pause a transfer): what the sink did not take is to be asked
        /// for again. Not a failure of the server's.
        case yielded
        case other
    }

    package let code: Code
    /// A message for people, e.g. libcurl's error buffer.
    public let message: String
    /// The underlying library's error number (a `CURLcode`), where there is one.
    public let underlyingCode: Int?

    package init(_ code: Code, _ message: String, underlyingCode: Int? = nil) {
        self.code = code
        self.message = message
        self.underlyingCode = underlyingCode
    }

    /// The calling task was cancelled, or ``TransportResponse/cancel()`` was called.
    public static let cancelled = TransportError(.cancelled, "cancelled")
    /// The sink stopped the transfer (``ReceiveDecision/abort``).
    public static let abortedBySink = TransportError(.abortedBySink, "aborted")
    /// The host name did not resolve; `m` is the message.
    public static func resolve(_ m: String) -> TransportError { .init(.resolve, m) }
    /// The connection was refused or could not be made; `m` is the message.
    public static func connect(_ m: String) -> TransportError { .init(.connect, m) }
    /// The connection was not established within ``TransportOptions/connectTimeout``; `m` is the message.
    public static func connectTimeout(_ m: String) -> TransportError { .init(.connectTimeout, m) }
    /// Too few bytes arrived within ``TransportOptions/stallTimeout``; `m` is the message.
    public static func stalled(_ m: String) -> TransportError { .init(.stalled, m) }
    /// A certificate or TLS handshake failure; `m` is the message. Not retried.
    public static func tls(_ m: String) -> TransportError { .init(.tls, m) }
    /// The body ended before its announced length; `m` is the message.
    public static func partialBody(_ m: String) -> TransportError { .init(.partialBody, m) }
    /// Sending or receiving failed on an open connection (reset, HTTP/2 stream error, nothing received); `m` is
    /// the message.
    public static func network(_ m: String) -> TransportError { .init(.network, m) }
    /// The server broke HTTP, e.g. it sent no complete response; `m` is the message.
    public static func protocolError(_ m: String) -> TransportError { .init(.protocolError, m) }

    /// Whether the transfer was cancelled (``cancelled``).
    public var isCancelled: Bool { code == .cancelled }
    /// Whether the sink stopped the transfer (``abortedBySink``).
    public var isAbortedBySink: Bool { code == .abortedBySink }
    /// TLS failures and cancellation are final; everything else may succeed on another try.
    public var isRetryable: Bool {
        switch code {
        case .cancelled, .abortedBySink, .tls, .other, .malformedResponse, .unsupported: return false
        case .resolve, .connect, .connectTimeout, .stalled, .partialBody, .network, .protocolError, .yielded: return true
        }
    }
    /// Whether it is a certificate or handshake failure (``tls(_:)``).
    public var isTLS: Bool { code == .tls }

    /// The ``message``.
    public var description: String { message }
}
