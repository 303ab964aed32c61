import Foundation
import Glibc
import StitchLocks

/// A real nginx on loopback for integration tests, started by `scripts/nginx.sh`.
///
/// If `STITCH_NGINX_DIR` names a directory holding a `ports.env` (as `scripts/test.sh` arranges), that
/// nginx is used; otherwise one is started on first use and stopped when the test process exits.
public final class Nginx: Sendable {
    public let directory: String
    public let httpPort: Int
    public let httpsPort: Int
    /// A port whose responses are rate-limited per connection (`slowRate`), for interrupting transfers.
    public let slowPort: Int
    public let slowRate: String
    /// The self-signed certificate (its own CA) for 127.0.0.1 and localhost.
    public let caCertificate: String
    /// HTTPS with a certificate from `caCertificate` that expired in 2020 (for 127.0.0.1 and localhost).
    public let expiredCertificatePort: Int
    /// HTTPS with a valid certificate from `caCertificate` for `wrong.example` only.
    public let wrongHostCertificatePort: Int
    /// The document root: small.bin (1 MiB), medium.bin (16 MiB), empty.bin, SHA256SUMS.
    public let documentRoot: String
    /// Each line: method, URI, status, body bytes, Range, If-Range, protocol (see scripts/nginx.sh).
    public let accessLog: String

    private static let instance = Locked<Result<Nginx, NginxError>?>(nil)

    /// The process-wide nginx, started on first use.
    public static func shared() throws -> Nginx {
        try instance.withLock { cached in
            if let cached { return try cached.get() }
            let result = Result { () throws(NginxError) -> Nginx in try start() }
            cached = result
            return try result.get()
        }
    }

    /// The repository's root, found from this source file's path.
    public static var repositoryRoot: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
    }

    private static func start() throws(NginxError) -> Nginx {
        if let dir = ProcessInfo.processInfo.environment["STITCH_NGINX_DIR"],
            FileManager.default.fileExists(atPath: dir + "/ports.env")
        {
            return try Nginx(directory: dir)
        }
        let dir = NSTemporaryDirectory() + "stitch-nginx-\(getpid())"
        // posix_spawn, not Foundation.Process: see ChildProcess.
        let termination: ChildProcess.Termination
        do {
            termination = try ChildProcess(
                executable: "/bin/bash",
                arguments: ["-c", closeInheritedDescriptors, "nginx.sh", repositoryRoot + "/scripts/nginx.sh", "start", dir],
                environment: ProcessInfo.processInfo.environment, standardOutput: .null, standardError: .file(dir + ".log")
            ).waitUntilExit()
        } catch { throw NginxError("cannot run scripts/nginx.sh: \(error)") }
        guard termination.status == 0 else {
            let log = (try? String(contentsOfFile: dir + ".log", encoding: .utf8)) ?? ""
            throw NginxError("scripts/nginx.sh start failed (\(termination.status)); is nginx installed? \(log)")
        }
        startedDirectory.withLock { $0 = dir }
        atexit {
            guard let dir = startedDirectory.withLock({ $0 }) else { return }
            Nginx.stopAtExit(dir)
        }
        return try Nginx(directory: dir)
    }

    /// Stops the nginx this process started, from its `atexit` handler: with plain system calls, bounded. No child
    /// process and no thread: at exit a new thread or a child's reaper can wait forever on a lock another exiting
    /// thread holds — a test process under ThreadSanitizer hung in its exit so, after its last test had passed,
    /// until CI's overall limit (it ran `scripts/nginx.sh stop` as a child and waited for it).
    static func stopAtExit(_ dir: String) {
        if let text = try? String(contentsOfFile: dir + "/nginx.pid", encoding: .utf8),
            let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)), pid > 1,
            let command = try? String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8),
            command.contains(dir + "/nginx.conf")  // the master of this folder's nginx, not a reused pid
        {
            // Alive: not gone, and not a zombie its parent has yet to reap (state Z in /proc/PID/stat).
            func alive() -> Bool {
                guard Glibc.kill(pid, 0) == 0 else { return false }
                let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
                return !(stat.split(separator: ")").last?.trimmingCharacters(in: .whitespaces).hasPrefix("Z") ?? false)
            }
            Glibc.kill(pid, SIGTERM)
            var waited = 0
            while alive(), waited < 100 {
                usleep(50_000)
                waited += 1
            }
            if alive() { Glibc.kill(pid, SIGKILL) }
        }
        try? FileManager.default.removeItem(atPath: dir)
        try? FileManager.default.removeItem(atPath: dir + ".log")
    }

    private init(directory: String) throws(NginxError) {
        guard let text = try? String(contentsOfFile: directory + "/ports.env", encoding: .utf8) else {
            throw NginxError("cannot read \(directory)/ports.env")
        }
        var values: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        guard let http = values["NGINX_HTTP_PORT"].flatMap(Int.init),
            let https = values["NGINX_HTTPS_PORT"].flatMap(Int.init),
            let slow = values["NGINX_SLOW_PORT"].flatMap(Int.init),
            let expired = values["NGINX_TLS_EXPIRED_PORT"].flatMap(Int.init),
            let wrongHost = values["NGINX_TLS_WRONG_HOST_PORT"].flatMap(Int.init),
            let ca = values["NGINX_CA_CERT"], let www = values["NGINX_WWW"]
        else { throw NginxError("incomplete \(directory)/ports.env") }
        self.directory = directory
        self.httpPort = http
        self.httpsPort = https
        self.slowPort = slow
        self.slowRate = values["NGINX_SLOW_RATE"] ?? "?"
        self.caCertificate = ca
        self.expiredCertificatePort = expired
        self.wrongHostCertificatePort = wrongHost
        self.documentRoot = www
        self.accessLog = values["NGINX_ACCESS_LOG"] ?? directory + "/access.log"
        self.authUser = values["NGINX_AUTH_USER"] ?? ""
        self.authPassword = values["NGINX_AUTH_PASSWORD"] ?? ""
    }

    /// The HTTP Basic credentials ``authURL(_:)`` requires.
    public let authUser: String
    public let authPassword: String
    /// `name` in the document root behind HTTP Basic authentication (plain HTTP port).
    public func authURL(_ name: String) -> String { "http://127.0.0.1:\(httpPort)/auth/\(name)" }

    public func httpURL(_ name: String) -> String { "http://127.0.0.1:\(httpPort)/\(name)" }
    public func httpsURL(_ name: String, host: String = "localhost") -> String { "https://\(host):\(httpsPort)/\(name)" }
    public func slowURL(_ name: String) -> String { "http://127.0.0.1:\(slowPort)/\(name)" }

    /// Writes `bytes` into the document root as `name` and returns its path.
    @discardableResult
    public func publish(_ name: String, bytes: [UInt8]) throws -> String {
        let path = documentRoot + "/" + name
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// Access-log lines whose URI contains `needle`.
    public func accessLogLines(containing needle: String) -> [String] {
        guard let text = try? String(contentsOfFile: accessLog, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").map(String.init).filter { $0.contains(needle) }
    }
}

private let startedDirectory = Locked<String?>(nil)

/// A `bash -c` prelude that closes every inherited descriptor above 2, then runs `"$@"`.
///
/// Foundation's `Process` (Linux) learns that a child exited when the child's copy of a socketpair end
/// closes, and it leaves that end open in the child. The daemonized nginx would inherit it (and any
/// descriptor another thread opened during the spawn, such as a pipe of a concurrently started process)
/// and keep it open for its whole life, so `waitUntilExit()` would never return. Closed here, Foundation
/// falls back to a blocking `waitpid`, which returns when the script itself exits.
private let closeInheritedDescriptors = """
    for fd in $(ls /proc/$$/fd); do
        if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null; fi
    done
    exec /bin/bash "$@"
    """

public struct NginxError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
