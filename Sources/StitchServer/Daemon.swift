import Foundation
import Stitch
import StitchLocks
import StitchRPC

/// `stitch serve`: a ``DownloadManager`` on one folder, driven over aria2's JSON-RPC, until SIGTERM, SIGINT or an
/// RPC shutdown. Everything it knows lives in the folder (the catalog in `.stitch/`, each download's partial data
/// beside its file), so after a `kill -9` the next start on the same folder has every download back in its state
/// and order, and the active ones continue.
public enum Daemon {
    public struct Options: Sendable {
        /// The served folder: downloads go here, and nothing is written outside it.
        public var directory: String
        public var server = RPCServer.Configuration()
        /// The token every call must carry (`token:SECRET`); required to listen beyond loopback.
        public var secret: String?
        public var maxConcurrentDownloads: Int?
        public var rateLimit: Int64?
        public var maxConnectionsPerHost: Int?
        public var connections: Int?
        public var logFile: String?
        public var verbose = false
        /// Defaults for new downloads from a configuration file (aria2's option names and values), under what
        /// was set over RPC before a restart.
        public var downloadDefaults: [String: String] = [:]
        /// Lines for the log about the configuration file (the options it names that Stitch ignores).
        public var notes: [String] = []
        /// The settings the command line gave, by aria2's names (`max-concurrent-downloads`,
        /// `max-overall-download-limit`, `split`, `max-connection-per-server`): they win over what was set over RPC
        /// before a restart, which wins over a configuration file's.
        public var commandLine: Set<String> = []
        /// The configuration file (`--conf-path`), and how to read the command line and it again: what SIGHUP does.
        public var configPath: String?
        public var reread: (@Sendable () throws -> Options)?
        /// An aria2 session file to import once at start (`--input-file`).
        public var inputFile: String?
        /// `--load-cookies FILE`: the cookie file's text (Netscape format; sent with every download's matching
        /// requests) and its path, for getGlobalOption. Read when the daemon starts.
        public var cookies: (text: String, path: String)?
        public init(directory: String) { self.directory = directory }
    }

    /// The largest session file `--input-file` reads (aria2's for 100,000 downloads is about 20 MiB).
    static let maxSessionFileSize = 64 << 20

    /// The folder inside the served one that holds the catalog and the daemon's lock.
    public static let stateFolder = ".stitch"

    /// Why the daemon cannot start, in one line (exit status 64 for what the user asked, 1 otherwise).
    public struct StartError: Error, CustomStringConvertible {
        public var description: String
        public var isUsage: Bool
        public init(description: String, isUsage: Bool) {
            self.description = description
            self.isUsage = isUsage
        }
    }

    /// Checks what a user asked for before anything starts.
    public static func validate(_ options: Options) throws(StartError) {
        let beyondLoopback = options.server.addresses.filter { !isLoopback($0) }
        if !beyondLoopback.isEmpty, options.secret == nil {
            throw StartError(
                description: "listening on \(beyondLoopback.joined(separator: ", ")) (beyond this machine) needs a "
                    + "secret: put one in a file and pass --rpc-secret-file FILE, or set STITCH_RPC_SECRET",
                isUsage: true)
        }
        if options.server.policy.allowOriginAll, options.secret == nil {
            throw StartError(
                description: "--rpc-allow-origin-all lets any web page call the daemon, so it needs a secret "
                    + "(--rpc-secret-file FILE or STITCH_RPC_SECRET)",
                isUsage: true)
        }
    }

    static func isLoopback(_ address: String) -> Bool {
        guard let (host, _) = Core.split(address) else { return false }
        return host == "::1" || host.hasPrefix("127.") || host == "localhost"
    }

    /// Runs until stopped; returns the exit status.
    public static func run(_ options: Options, log: Log) async -> Int32 {
        do { try validate(options) } catch {
            log.error(error.description)
            return 64
        }
        // Signals are taken from the start: a SIGHUP (a log rotation, a reload) while the catalog is restored or a
        // session imported must not end the daemon, as its default action would; a reload or a stop asked for
        // then is done once the server runs.
        let (stops, stop) = AsyncStream<String>.makeStream()
        let (reloads, reload) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        let signals = [SIGTERM, SIGINT, SIGHUP].map { number -> any DispatchSourceSignal in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number)
            source.setEventHandler {
                if number == SIGHUP { reload.yield() } else { stop.yield(number == SIGTERM ? "SIGTERM" : "SIGINT") }
            }
            source.resume()
            return source
        }
        defer { for source in signals { source.cancel() } }
        let folder = absolute(options.directory)
        // Read before anything starts: a session file that cannot be read stops the start, as a bad option does.
        var session: Aria2Session?
        if let path = options.inputFile {
            let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? nil
            guard let size, size <= maxSessionFileSize, let text = try? String(contentsOfFile: path, encoding: .utf8) else {
                log.error(
                    "cannot read the session file \(path)"
                        + ((size ?? 0) > maxSessionFileSize ? " (larger than \(maxSessionFileSize >> 20) MiB)" : ""))
                return 64
            }
            session = Aria2Session(text: text)
        }
        let state = folder + "/" + stateFolder
        do {
            try DownloadPaths.createFolder(state)
        } catch {
            log.error("cannot create \(state): \(error.localizedDescription)")
            return 74
        }
        // One daemon per folder: a second would run the same downloads.
        let lock = open(state + "/daemon.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lock >= 0, flock(lock, LOCK_EX | LOCK_NB) == 0 else {
            log.error("\(folder) is already served by another stitch serve (\(state)/daemon.lock is held)")
            return 1
        }
        defer { close(lock) }

        var configuration = DownloadManager.Configuration(downloadDirectory: folder)
        if let count = options.maxConcurrentDownloads { configuration.maxConcurrentDownloads = count }
        if let rate = options.rateLimit { configuration.rateLimit = rate }
        // Unless given, the cap on connections to one host follows the concurrency, so that -j 50 downloads from
        // one server run 50 at once, as in aria2 (which has no such cap); it follows changes over RPC too.
        configuration.maxConnectionsPerHost =
            options.maxConnectionsPerHost ?? max(16, configuration.maxConcurrentDownloads)
        configuration.connections = options.connections
        configuration.transport.cookies = options.cookies.map { CookieJar(text: $0.text) }
        let manager: DownloadManager
        do {
            manager = try DownloadManager(directory: state, configuration: configuration)
        } catch {
            log.error("\(error)")
            return 1
        }
        let report = manager.restoreReport
        if let why = report.rebuiltBecause { log.warning(why) }

        let rpc = Aria2RPC(manager: manager, secret: options.secret, reservedFolder: stateFolder) {
            stop.yield("an RPC shutdown")
        }
        // What a client set over RPC before the restart, unless the command line says otherwise.
        if options.maxConnectionsPerHost == nil { rpc.hostCapFollowsConcurrency() }
        for note in options.notes { log.info(note) }
        rpc.setConfigDefaults(options.downloadDefaults)
        await rpc.applyProxyDefaults()
        for problem in await rpc.restoreKeptOptions(overriddenBy: options.commandLine) { log.warning(problem) }
        if let session, let path = options.inputFile {
            let result = await rpc.importSession(session, source: path)
            for line in result.notes { log.info(line) }
            for line in result.skipped { log.warning(line) }
            log.info(
                "\(path): \(result.imported.count) download\(result.imported.count == 1 ? "" : "s") imported"
                    + (result.already > 0 ? ", \(result.already) imported at an earlier start" : "")
                    + (result.skipped.isEmpty ? "" : ", \(result.skipped.count) not imported (above)"))
        }
        let server: RPCServer
        do {
            server = try startServer(rpc, options, log: log)
        } catch {
            log.error("\(error)")
            await manager.close()
            return 1
        }
        rpc.reportDaemonOptions(Self.reportedOptions(options, boundAddresses: server.boundAddresses))
        log.info(
            "serving \(folder) on \(server.boundAddresses.joined(separator: " and ")) (\(report.restored) "
                + "download\(report.restored == 1 ? "" : "s") restored\(options.secret == nil ? "; no secret" : ""))")
        if let first = server.boundAddresses.first {
            // A wildcard address is no place to open; its loopback address is.
            let shown = first.replacingOccurrences(of: "0.0.0.0:", with: "127.0.0.1:")
                .replacingOccurrences(of: "[::]:", with: "[::1]:")
            log.info("the web page: \(options.server.tls == nil ? "http" : "https")://\(shown)/")
        }

        let notifier = Task { await notify(manager, rpc, server, log: log) }
        // SIGHUP reads the configuration file again, one reload after another.
        let reloader = Task {
            var running = options
            for await _ in reloads {
                running = await Self.reload(running, rpc: rpc, server: server, log: log)
            }
        }
        var why = "the end"
        for await reason in stops {
            why = reason
            break
        }
        log.info("stopping (\(why)): saving every download's state")
        reload.finish()
        await reloader.value
        await server.stop()
        await manager.close()
        notifier.cancel()
        log.info("stopped")
        return 0
    }

    /// SIGHUP: reads the command line and the configuration file again and applies what can change while the daemon
    /// runs (concurrency, limits, connections, the defaults for new downloads, allowed host names, the log level).
    /// The global options set over RPC are forgotten: from now on the file's values are the daemon's, under the
    /// command line's. What cannot change while running (the folder, addresses, secret, TLS files, …) is named in
    /// a warning and stays as it is; a file that cannot be read or has a bad line changes nothing. Returns the
    /// options in force.
    static func reload(_ running: Options, rpc: Aria2RPC, server: RPCServer, log: Log) async -> Options {
        guard let reread = running.reread, let path = running.configPath else {
            log.warning("SIGHUP: there is no configuration file to read again (stitch serve --conf-path FILE)")
            return running
        }
        let new: Options
        do { new = try reread() } catch {
            log.error("SIGHUP: \(error); nothing changed")
            return running
        }
        let manager = rpc.manager
        var fixed: [String] = []
        if absolute(new.directory) != absolute(running.directory) { fixed.append("dir") }
        if new.server.addresses != running.server.addresses { fixed.append("rpc-listen") }
        if new.secret != running.secret { fixed.append("rpc-secret") }
        if new.server.tls?.key != running.server.tls?.key || new.server.tls?.certificate != running.server.tls?.certificate {
            fixed.append("rpc-certificate and rpc-private-key")
        }
        if new.server.policy.allowOriginAll != running.server.policy.allowOriginAll { fixed.append("rpc-allow-origin-all") }
        if new.server.maxRequestSize != running.server.maxRequestSize { fixed.append("rpc-max-request-size") }
        if new.server.maxWebSocketClients != running.server.maxWebSocketClients {
            fixed.append("rpc-max-websocket-clients")
        }
        if new.logFile != running.logFile { fixed.append("log") }
        if new.cookies?.path != running.cookies?.path || new.cookies?.text != running.cookies?.text {
            fixed.append("load-cookies")  // read when the daemon starts
        }

        var applied = running
        applied.maxConcurrentDownloads = new.maxConcurrentDownloads
        applied.rateLimit = new.rateLimit
        applied.maxConnectionsPerHost = new.maxConnectionsPerHost
        applied.connections = new.connections
        applied.downloadDefaults = new.downloadDefaults
        applied.commandLine = new.commandLine
        applied.verbose = new.verbose
        applied.server.policy.allowedHosts = new.server.policy.allowedHosts
        let concurrency = new.maxConcurrentDownloads ?? DownloadManager.Configuration(downloadDirectory: "/").maxConcurrentDownloads
        // Applied first, then the options set over RPC forgotten, all while no changeGlobalOption runs: a change a
        // client makes meanwhile comes before or after the reload as a whole.
        let forgotten: [String]
        do {
            forgotten = try await rpc.changingSettings {
                try await manager.setMaxConcurrentDownloads(concurrency)
                try await manager.setRateLimit(new.rateLimit)
                rpc.hostCapFollowsConcurrency(new.maxConnectionsPerHost == nil)
                try await manager.setMaxConnectionsPerHost(new.maxConnectionsPerHost ?? max(16, concurrency))
                try await manager.setConnections(new.connections)
                rpc.setConfigDefaults(new.downloadDefaults)
                let forgotten = try await rpc.forgetKeptOptions()
                await rpc.applyProxyDefaults()
                return forgotten
            }
        } catch {
            // Only a closed manager or a catalog that cannot be written gets here (the values were checked when
            // the file was read).
            log.error("SIGHUP: \(error); the file's values may be partly applied")
            return running
        }
        server.setAllowedHosts(Array(new.server.policy.allowedHosts))
        log.setVerbose(new.verbose)
        rpc.reportDaemonOptions(reportedOptions(applied, boundAddresses: server.boundAddresses))
        for note in new.notes { log.info(note) }
        var line = "SIGHUP: read \(path) again and applied it (under the command line's options)"
        if !forgotten.isEmpty { line += "; the options set over RPC are forgotten: \(forgotten.joined(separator: ", "))" }
        log.info(line)
        if !fixed.isEmpty {
            log.warning(
                "SIGHUP: \(fixed.joined(separator: ", ")) cannot change while stitch serve runs: restart it to apply")
        }
        return applied
    }

    /// A folder as an absolute path (relative ones from the working directory).
    static func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    }

    /// The daemon's start-up settings by aria2's option names, as `getGlobalOption` reports them.
    static func reportedOptions(_ options: Options, boundAddresses: [String]) -> [String: String] {
        let port = boundAddresses.first.flatMap { $0.split(separator: ":").last }.map(String.init) ?? ""
        var reported = [
            "rpc-listen-port": port,
            "rpc-listen-all": options.server.addresses.allSatisfy(isLoopback) ? "false" : "true",
            "rpc-secure": options.server.tls == nil ? "false" : "true",
            "rpc-allow-origin-all": options.server.policy.allowOriginAll ? "true" : "false",
            "rpc-max-request-size": String(options.server.maxRequestSize),
            "log-level": options.verbose ? "debug" : "notice",
        ]
        if let file = options.logFile { reported["log"] = file }
        if let cookies = options.cookies { reported["load-cookies"] = cookies.path }
        return reported
    }

    /// Binds every address; the default pair tolerates a machine without IPv6.
    private static func startServer(_ rpc: Aria2RPC, _ options: Options, log: Log) throws -> RPCServer {
        let logLine: @Sendable (String) -> Void = { log.info($0) }
        do {
            return try RPCServer(rpc: rpc, configuration: options.server, log: logLine)
        } catch let error as ServerError where options.server.addresses == RPCServer.Configuration().addresses {
            var fallback = options.server
            fallback.addresses = ["127.0.0.1:6800"]
            guard let server = try? RPCServer(rpc: rpc, configuration: fallback, log: logLine) else { throw error }
            log.warning("\(error.description); serving on IPv4 only")
            return server
        }
    }

    /// aria2's notifications to the WebSocket clients, from the manager's events.
    static func notify(_ manager: DownloadManager, _ rpc: Aria2RPC, _ server: RPCServer, log: Log) async {
        // The downloads announced as started and not yet as stopped.
        var started: Set<DownloadID> = []
        for await event in await manager.events() {
            guard case .statusChanged(let id, let status) = event else { continue }
            let method: String
            switch status {
            case .running:
                method = "aria2.onDownloadStart"
                started.insert(id)
            case .paused: method = "aria2.onDownloadPause"
            case .completed: method = "aria2.onDownloadComplete"
            case .failed(let failure) where failure.code == .cancelled: method = "aria2.onDownloadStop"
            case .failed(let failure):
                method = "aria2.onDownloadError"
                log.info("download \(id) failed: \(failure.message)")
            // As aria2: a download dropped from the queue (removed while waiting or paused) or whose result is
            // removed is not announced; one removed while running (it had just started) stops as aria2's do.
            case .removed:
                guard started.contains(id) else { continue }
                method = "aria2.onDownloadStop"
            case .queued: continue
            }
            if status != .running { started.remove(id) }
            rpc.invalidate()  // a client that reads after the notification sees the change
            let message = JSON.object([
                ("jsonrpc", .string("2.0")), ("method", .string(method)),
                ("params", .array([.object([("gid", .string("\(id)"))])])),
            ])
            server.broadcast(message.serialized)
        }
    }
}

/// The daemon's log: one line per event, to standard error and, when given, appended to a file.
public final class Log: Sendable {
    private let file: Int32?
    private let verbose: Locked<Bool>

    /// - Throws: when `path` cannot be opened for appending.
    public init(path: String?, verbose: Bool) throws(Daemon.StartError) {
        self.verbose = Locked(verbose)
        if let path {
            let descriptor = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o640)
            guard descriptor >= 0 else {
                throw Daemon.StartError(
                    description: "cannot open the log \(path): \(String(cString: strerror(errno)))", isUsage: true)
            }
            file = descriptor
        } else {
            file = nil
        }
    }

    public func error(_ message: String) { write("error", message) }
    public func warning(_ message: String) { write("warning", message) }
    public func info(_ message: String) { write("info", message) }
    public func debug(_ message: String) { if verbose.withLock({ $0 }) { write("debug", message) } }
    /// Whether debug lines are written (a configuration reload may change it).
    public func setVerbose(_ verbose: Bool) { self.verbose.withLock { $0 = verbose } }

    private func write(_ level: String, _ message: String) {
        let stamp = Date().formatted(.iso8601)
        // One line, whatever a client put in the message.
        let flat = message.replacingOccurrences(of: "\n", with: "\\n").replacingOccurrences(of: "\r", with: "\\r")
        let line = Array("\(stamp) stitch serve \(level): \(flat)\n".utf8)
        for descriptor in [STDERR_FILENO] + (file.map { [$0] } ?? []) {
            line.withUnsafeBytes { _ = Glibc.write(descriptor, $0.baseAddress, $0.count) }
        }
    }
}
