import Foundation
import Glibc
import StitchTestSupport
import Testing

/// A real proxy from Debian on loopback for a test: tinyproxy (HTTP, CONNECT for HTTPS) or microsocks (SOCKS5),
/// optionally asking for a user name and password. Its log (what it connected to) is a file the test reads.
final class LoopbackProxy: Sendable {
    enum Kind: String, Sendable, CaseIterable {
        case http = "tinyproxy"
        case socks = "microsocks"
    }

    let kind: Kind
    let port: Int
    let log: String
    let credentials: (user: String, password: String)?
    private let process: ChildProcess

    /// Whether the program is installed (`.ci/run` installs both).
    static func isInstalled(_ kind: Kind) -> Bool {
        FileManager.default.isExecutableFile(atPath: "/usr/bin/" + kind.rawValue)
    }

    /// Starts a proxy of `kind` in `folder` on a free port (or `port`), and waits until it accepts connections.
    init(
        _ kind: Kind, in folder: String, port: Int? = nil, credentials: (user: String, password: String)? = nil
    ) throws {
        self.kind = kind
        self.credentials = credentials
        var lastError = "not started"
        for attempt in 0..<5 {
            let port = try port ?? Self.freePort()
            let log = folder + "/\(kind.rawValue)-\(port)-\(attempt).log"
            var arguments: [String]
            switch kind {
            case .http:
                var config = "Port \(port)\nListen 127.0.0.1\nTimeout 60\nMaxClients 100\nLogLevel Info\n"
                if let credentials { config += "BasicAuth \(credentials.user) \(credentials.password)\n" }
                let file = folder + "/tinyproxy-\(port).conf"
                try Data(config.utf8).write(to: URL(fileURLWithPath: file))
                arguments = ["-d", "-c", file]
            case .socks:
                arguments = ["-i", "127.0.0.1", "-p", String(port)]
                if let credentials { arguments += ["-u", credentials.user, "-P", credentials.password] }
            }
            let process = try ChildProcess(
                executable: "/usr/bin/" + kind.rawValue, arguments: arguments, environment: [:],
                standardOutput: .file(log), standardError: .file(log + ".err"))
            if Self.waitForListener(port: port, process: process) {
                self.port = port
                self.log = log
                self.process = process
                return
            }
            process.send(SIGKILL)
            _ = process.waitUntilExit()
            lastError = (try? String(contentsOfFile: log + ".err", encoding: .utf8)) ?? "no output"
        }
        throw ProxyStartError(description: "\(kind.rawValue) did not start: \(lastError)")
    }

    deinit { stop() }

    /// `scheme://127.0.0.1:PORT` for `--proxy`.
    func url(_ scheme: String? = nil) -> String {
        "\(scheme ?? (kind == .http ? "http" : "socks5h"))://127.0.0.1:\(port)"
    }

    /// Everything the proxy logged so far (tinyproxy logs each request and CONNECT; microsocks each connection).
    var logText: String {
        ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: log + ".err", encoding: .utf8)) ?? "")
    }

    /// Kills the proxy at once (a proxy that dies mid-transfer); idempotent.
    func kill() {
        process.send(SIGKILL)
        _ = process.waitUntilExit()
    }

    /// SIGTERM, then SIGKILL after 5 s: a proxy that does not stop never holds a test.
    func stop() {
        process.send(SIGTERM)
        let deadline = ContinuousClock.now + .seconds(5)
        while process.isRunning && ContinuousClock.now < deadline { usleep(2_000) }
        process.send(SIGKILL)
        _ = process.waitUntilExit()
    }

    /// A port nothing listens on now: bound to 0, read back, closed.
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ProxyStartError(description: "socket: \(errno)") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = in_addr_t(0x7F00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        guard bound else { throw ProxyStartError(description: "bind: \(errno)") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// Polls until something accepts on `port` (up to 20 s, the process alive).
    static func waitForListener(port: Int, process: ChildProcess) -> Bool {
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            if let fd = connectToLoopback(port: port) {
                close(fd)
                return true
            }
            if !process.isRunning { return false }
            usleep(2_000)
        }
        return false
    }
}

struct ProxyStartError: Error, CustomStringConvertible {
    let description: String
}

/// Squid from Debian (the `squid-openssl` build) on loopback: a caching proxy, as companies run, listening for plain
/// HTTP and for TLS (`https_port`: an `https://` proxy, its certificate made for the test by `openssl`, signed by
/// nobody the system trusts). Caching is off: every request reaches the origin as sent, which the tests check.
final class SquidProxy: Sendable {
    /// Plain HTTP (`http://127.0.0.1:httpPort`).
    let httpPort: Int
    /// TLS to the proxy (`https://127.0.0.1:tlsPort`).
    let tlsPort: Int
    /// The proxy's certificate (PEM), for `--proxy-ca-cert`.
    let certificate: String
    let folder: String
    private let process: ChildProcess

    static let executable = "/usr/sbin/squid"
    static var isInstalled: Bool {
        FileManager.default.isExecutableFile(atPath: executable)
            && FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl")
            && (geteuid() != 0 || getpwnam("proxy") != nil)  // as root squid switches to the package's user
    }

    /// Starts squid with its files in a folder of its own under /tmp (squid, run as root, switches to the `proxy`
    /// user, who must reach them: the folder is handed to that user; a test's sandbox stays as it is), and waits
    /// until both ports accept connections. ``stop()`` removes the folder.
    init() throws {
        var template = Array("/tmp/stitch-squid-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw ProxyStartError(description: "mkdtemp: \(errno)") }
        let folder = String(cString: made)
        self.folder = folder
        certificate = folder + "/proxy.crt"
        let key = folder + "/proxy.key"
        let openssl = try ChildProcess(
            executable: "/usr/bin/openssl",
            arguments: [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", certificate, "-days", "2",
                "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            ], environment: [:], standardOutput: .null, standardError: .null)
        guard openssl.waitUntilExit().status == 0 else { throw ProxyStartError(description: "openssl req failed") }
        if geteuid() == 0, let user = getpwnam("proxy") {
            for path in [folder, certificate, key] { chown(path, user.pointee.pw_uid, user.pointee.pw_gid) }
        }
        var lastError = "not started"
        for attempt in 0..<5 {
            let (http, tls) = (try LoopbackProxy.freePort(), try LoopbackProxy.freePort())
            let config = """
                http_port 127.0.0.1:\(http)
                https_port 127.0.0.1:\(tls) tls-cert=\(certificate) tls-key=\(key)
                http_access allow localhost
                http_access deny all
                cache deny all
                access_log stdio:\(folder)/access.log
                cache_log \(folder)/cache.log
                pid_filename none
                coredump_dir \(folder)
                netdb_filename none
                logfile_rotate 0
                shutdown_lifetime 0 seconds

                """
            let file = folder + "/squid-\(attempt).conf"
            try Data(config.utf8).write(to: URL(fileURLWithPath: file))
            // `-n`: a service name of its own, so that squids of parallel tests share nothing.
            let process = try ChildProcess(
                executable: Self.executable, arguments: ["-N", "-n", "stitch\(tls)", "-f", file], environment: [:],
                standardOutput: .file(folder + "/squid-\(attempt).out"),
                standardError: .file(folder + "/squid-\(attempt).err"))
            if LoopbackProxy.waitForListener(port: http, process: process),
                LoopbackProxy.waitForListener(port: tls, process: process)
            {
                (httpPort, tlsPort, self.process) = (http, tls, process)
                return
            }
            process.send(SIGKILL)
            _ = process.waitUntilExit()
            lastError = ((try? String(contentsOfFile: folder + "/squid-\(attempt).err", encoding: .utf8)) ?? "")
                + ((try? String(contentsOfFile: folder + "/cache.log", encoding: .utf8)) ?? "")
        }
        try? FileManager.default.removeItem(atPath: folder)
        throw ProxyStartError(description: "squid did not start: \(lastError.suffix(2000))")
    }

    deinit { stop() }

    /// The `https://` URL of the TLS port (`tls` true) or the `http://` one.
    func url(tls: Bool) -> String { tls ? "https://127.0.0.1:\(tlsPort)" : "http://127.0.0.1:\(httpPort)" }

    /// The access log: one line per request it carried (`GET http://…`, `CONNECT 127.0.0.1:…`).
    var accessLog: String { (try? String(contentsOfFile: folder + "/access.log", encoding: .utf8)) ?? "" }

    /// Kills squid at once (a proxy that dies mid-transfer); idempotent.
    func kill() {
        process.send(SIGKILL)
        _ = process.waitUntilExit()
    }

    /// SIGTERM (squid then stops at once: `shutdown_lifetime 0`), SIGKILL after 5 s; then its folder is removed.
    func stop() {
        process.send(SIGTERM)
        let deadline = ContinuousClock.now + .seconds(5)
        while process.isRunning && ContinuousClock.now < deadline { usleep(2_000) }
        kill()
        try? FileManager.default.removeItem(atPath: folder)
    }
}
