import Foundation

/// Decides whether a request may reach the RPC at all, from its headers alone: the checks that keep web pages of
/// other sites and DNS-rebinding names away from a daemon that listens on this machine.
///
/// - `Host` must name the daemon: an IP address, `localhost`, or a name given with `--rpc-allow-host`. A rebound
///   name (`evil.example` resolving to 127.0.0.1) carries its own name here, and is refused.
/// - `Origin`, when sent, must be the daemon's own (the page it serves) unless every origin is allowed.
/// - `Sec-Fetch-Site`, when sent, must be `same-origin` or `none` unless every origin is allowed: a browser sends
///   a cross-site `<script>` or `<img>` GET without `Origin` but with `Sec-Fetch-Site: cross-site`.
/// Clients that are not browsers (aria2p, curl) send neither header and pass.
public struct AccessPolicy: Sendable {
    /// Names `Host` may carry besides IP addresses and `localhost` (lower case, without a port).
    public var allowedHosts: Set<String>
    /// `--rpc-allow-origin-all`: pages of any origin may call (the secret still applies).
    public var allowOriginAll: Bool

    public init(allowedHosts: [String] = [], allowOriginAll: Bool = false) {
        self.allowedHosts = Set(allowedHosts.map { $0.lowercased() })
        self.allowOriginAll = allowOriginAll
    }

    public enum Verdict: Sendable, Hashable {
        case allow
        /// Refused with HTTP `status`, for `reason` (said to the client and logged).
        case refuse(status: Int, reason: String)
    }

    /// The headers of one request that the policy reads.
    public struct Request: Sendable, Hashable {
        public var host: String?
        public var origin: String?
        public var fetchSite: String?
        public init(host: String?, origin: String?, fetchSite: String?) {
            self.host = host
            self.origin = origin
            self.fetchSite = fetchSite
        }
    }

    public func check(_ request: Request) -> Verdict {
        let hostVerdict = checkHost(request)
        guard hostVerdict == .allow else { return hostVerdict }
        let hostHeader = request.host ?? ""
        if allowOriginAll { return .allow }
        if let origin = request.origin {
            guard Self.sameOrigin(origin, host: hostHeader) else {
                return .refuse(
                    status: 403,
                    reason: "requests from the page \(origin) are refused (another origin); start stitch serve "
                        + "with --rpc-allow-origin-all to allow pages of other origins")
            }
        }
        if let site = request.fetchSite, site.lowercased() != "same-origin", site.lowercased() != "none" {
            return .refuse(
                status: 403,
                reason: "a request a page of another site made (Sec-Fetch-Site: \(site)) is refused; start stitch "
                    + "serve with --rpc-allow-origin-all to allow it")
        }
        return .allow
    }

    /// The `Host` check alone: what the daemon's static page needs (it carries no secret and does nothing by
    /// itself, so a link from another site may open it; the rebinding check still applies).
    public func checkHost(_ request: Request) -> Verdict {
        guard let hostHeader = request.host, let host = Self.hostName(hostHeader) else {
            return .refuse(status: 400, reason: "the request has no valid Host header")
        }
        guard Self.isAddress(host) || host == "localhost" || allowedHosts.contains(host) else {
            return .refuse(
                status: 403,
                reason: "Host \(hostHeader) is not this server's name; start stitch serve with --rpc-allow-host "
                    + "\(host) to accept it")
        }
        return .allow
    }

    /// The host part of a `Host` header, lower case, without the port and the brackets of an IPv6 address.
    static func hostName(_ header: String) -> String? {
        // Plain UTF-8 work: this runs for every request.
        var bytes = Array(header.utf8)
        while let last = bytes.last, last == 0x20 || last == 0x09 { bytes.removeLast() }
        while let first = bytes.first, first == 0x20 || first == 0x09 { bytes.removeFirst() }
        guard !bytes.isEmpty, !bytes.contains(UInt8(ascii: "/")), !bytes.contains(UInt8(ascii: "@")) else { return nil }
        for index in bytes.indices where (0x41...0x5A).contains(bytes[index]) { bytes[index] += 0x20 }
        func isPort(_ part: ArraySlice<UInt8>) -> Bool {
            !part.isEmpty && part.allSatisfy { (0x30...0x39).contains($0) }
        }
        if bytes[0] == UInt8(ascii: "[") {
            guard let close = bytes.firstIndex(of: UInt8(ascii: "]")) else { return nil }
            let rest = bytes[(close + 1)...]
            guard rest.isEmpty || (rest.first == UInt8(ascii: ":") && isPort(rest.dropFirst())) else { return nil }
            return String(decoding: bytes[1..<close], as: UTF8.self)
        }
        let colons = bytes.indices.filter { bytes[$0] == UInt8(ascii: ":") }
        guard colons.count <= 1 else { return nil }
        if let colon = colons.first {
            guard colon > 0, isPort(bytes[(colon + 1)...]) else { return nil }
            return String(decoding: bytes[..<colon], as: UTF8.self)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Whether `host` is an IPv4 or IPv6 literal (which no DNS rebinding can produce).
    static func isAddress(_ host: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }

    /// Whether `origin` (`scheme://host[:port]`) is the server the request was sent to (its `Host` header).
    static func sameOrigin(_ origin: String, host: String) -> Bool {
        let lowered = origin.lowercased()
        for scheme in ["http://", "https://"] where lowered.hasPrefix(scheme) {
            let authority = String(lowered.dropFirst(scheme.count))
            let defaultPort = scheme == "http://" ? ":80" : ":443"
            let requested = host.lowercased()
            return authority == requested || authority + defaultPort == requested
                || authority == requested + defaultPort
        }
        return false
    }
}
