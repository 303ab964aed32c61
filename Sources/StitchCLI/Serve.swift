import Foundation
import Stitch
import StitchRPC
import StitchServer

/// `stitch serve`: its options, checked before the daemon starts.
enum Serve {
    static func run(_ arguments: [String]) async -> ExitStatus {
        let options: Daemon.Options
        let log: Log
        do {
            options = try parse(arguments, environment: ProcessInfo.processInfo.environment)
            log = try Log(path: options.logFile, verbose: options.verbose)
        } catch let error as UsageError {
            writeAll(STDERR_FILENO, "stitch serve: \(error.message)\nUsage: stitch serve --dir DIR [options]; see 'stitch serve --help'\n")
            return .usage
        } catch {
            writeAll(STDERR_FILENO, "stitch serve: \(error)\n")
            return .usage
        }
        let status = await Daemon.run(options, log: log)
        return ExitStatus(rawValue: status) ?? .failure
    }

    /// The options as given on the command line, before the environment and files are read.
    struct Given {
        var directory: String?
        var listen: [String] = []
        var secretFile: String?
        var allowOriginAll = false
        var allowHosts: [String] = []
        var certificate: String?
        var privateKey: String?
        var maxRequestSize: Int?
        var maxWebSockets: Int?
        var maxConcurrent: Int?
        var rate: Int64?
        var perHost: Int?
        var connections: Int?
        var logFile: String?
        var verbose = false
        var confPath: String?
        var inputFile: String?
        var cookieFile: String?

        /// The settings given that RPC can change too, by aria2's names.
        var rpcSettings: Set<String> {
            var names: Set<String> = []
            if maxConcurrent != nil { names.insert("max-concurrent-downloads") }
            if rate != nil { names.insert("max-overall-download-limit") }
            if connections != nil { names.formUnion(["split", "max-connection-per-server"]) }
            return names
        }
        /// From a configuration file only (aria2's `rpc-secret`, `rpc-listen-all`, `log-level`).
        var secret: String?
        var listenAll = false
    }

    /// Reads `stitch serve`'s arguments (after `serve`), then the secret from its file or the environment, and
    /// the TLS files; throws ``UsageError`` for anything wrong.
    static func parse(_ arguments: [String], environment: [String: String]) throws -> Daemon.Options {
        var given = Given()
        try table.parse(arguments, into: &given) { _, argument in
            // serve takes no arguments but options. After `--` an option is an argument: shown without what
            // follows its `=`, which could be a secret.
            let shown = argument.hasPrefix("-") ? String(argument.prefix { $0 != "=" }) : argument
            throw UsageError("unknown option '\(shown)'")
        }
        var file = ConfigRead()
        let command = given
        if let path = given.confPath {
            file = try readConfig(path)
            given = merged(given, over: file.given)
        }
        guard let directory = given.directory else {
            throw UsageError("--dir DIR is required: the folder the daemon downloads into")
        }
        var options = Daemon.Options(directory: directory)
        options.downloadDefaults = file.downloadDefaults
        options.notes = file.notes
        options.commandLine = command.rpcSettings
        if let path = given.confPath {
            // SIGHUP: the same reading again (the command line still wins over the file).
            options.configPath = path
            options.reread = {
                do { return try parse(arguments, environment: environment) } catch let error as UsageError {
                    throw Daemon.StartError(description: error.message, isUsage: true)
                }
            }
        }
        if !given.listen.isEmpty {
            // A bare port listens on both loopback addresses, as the default does.
            options.server.addresses = given.listen.flatMap { address -> [String] in
                UInt16(address) != nil ? ["127.0.0.1:\(address)", "[::1]:\(address)"] : [address]
            }
        }
        if let secretFile = given.secretFile {
            options.secret = try readSecretFile(secretFile)
        } else if let secret = environment["STITCH_RPC_SECRET"], !secret.isEmpty {
            options.secret = secret
        } else if let secret = given.secret {
            options.secret = secret
        }
        if given.listenAll {
            // aria2's rpc-listen-all: every address, on the port given (6800 by default).
            let first = options.server.addresses.first
            let port = first.flatMap { $0.split(separator: ":").last }.map(String.init) ?? "6800"
            options.server.addresses = ["0.0.0.0:\(port)", "[::]:\(port)"]
        }
        options.server.policy = AccessPolicy(allowedHosts: given.allowHosts, allowOriginAll: given.allowOriginAll)
        switch (given.certificate, given.privateKey) {
        case (nil, nil): break
        case (let certificate?, let key?):
            guard let certificateText = try? String(contentsOfFile: certificate, encoding: .utf8) else {
                throw UsageError("cannot read the certificate \(certificate)")
            }
            guard let keyText = try? String(contentsOfFile: key, encoding: .utf8) else {
                throw UsageError("cannot read the private key \(key)")
            }
            options.server.tls = (keyText, certificateText)
        default:
            throw UsageError("--rpc-certificate and --rpc-private-key go together")
        }
        // For tests of the binary, not a user-facing option: the wrong-token throttle's first delay (seconds), so a
        // test can book an address's next turn far beyond the longest wait instead of racing the clock.
        if let first = environment["STITCH_TEST_WRONG_SECRET_DELAY"].flatMap(Double.init), first > 0 {
            let delay = Duration.milliseconds(Int64(first * 1_000))
            options.server.wrongSecretDelays.first = delay
            options.server.wrongSecretDelays.max = max(delay, options.server.wrongSecretDelays.max)
        }
        if let maxRequestSize = given.maxRequestSize { options.server.maxRequestSize = maxRequestSize }
        if let maxWebSockets = given.maxWebSockets { options.server.maxWebSocketClients = maxWebSockets }
        options.maxConcurrentDownloads = given.maxConcurrent
        options.rateLimit = given.rate.flatMap { $0 == 0 ? nil : $0 }  // 0: none, given
        options.maxConnectionsPerHost = given.perHost
        options.connections = given.connections
        options.logFile = given.logFile
        options.inputFile = given.inputFile.map { ($0 as NSString).expandingTildeInPath }
        if let path = given.cookieFile.map({ ($0 as NSString).expandingTildeInPath }) {
            let limit = 64 << 20
            guard let handle = FileHandle(forReadingAtPath: path), let data = try? handle.read(upToCount: limit + 1),
                data.count <= limit, let text = String(data: data, encoding: .utf8)
            else { throw UsageError("cannot read the cookie file \(path) (UTF-8 text, at most 64 MiB)") }
            let jar = CookieJar(text: text)
            options.notes += jar.problems.map { "\(path): \($0)" }
            options.cookies = (text, path)
        }
        options.verbose = given.verbose
        return options
    }

    /// What a configuration file gave.
    struct ConfigRead {
        /// The daemon's own options, as the command line's.
        var given = Given()
        /// Defaults for new downloads (aria2's download options).
        var downloadDefaults: [String: String] = [:]
        var notes: [String] = []

    }

    /// Reads an aria2.conf-syntax file (`name=value` lines, `#` comments): the daemon's options by their names
    /// in `stitch serve --help` (aria2's where it has them), aria2's download options as the defaults for new
    /// downloads; the options Stitch ignores are listed in a note. Anything else, or a bad value, is a usage
    /// error naming the file and the line, before anything starts.
    static func readConfig(_ path: String) throws -> ConfigRead {
        let expanded = (path as NSString).expandingTildeInPath
        guard let text = try? String(contentsOfFile: expanded, encoding: .utf8) else {
            throw UsageError("cannot read the configuration file \(path)")
        }
        var read = ConfigRead()
        var rest: [Aria2ConfigFile.Entry] = []
        var ignored: [String] = []
        for entry in Aria2ConfigFile(text: text).entries {
            func fail(_ message: String) -> UsageError { UsageError("\(path):\(entry.line): \(message)") }
            let value = entry.value
            switch entry.name {
            case "rpc-secret":
                // Taken only from a file no one else can read (on a command line, ps shows it to everyone).
                var info = stat()
                guard stat(expanded, &info) == 0, info.st_mode & 0o077 == 0 else {
                    throw fail("rpc-secret is in a file others can read: chmod 600 \(path), or give rpc-secret-file")
                }
                guard !value.isEmpty else { throw fail("rpc-secret is empty") }
                read.given.secret = value
            case "rpc-listen-all":
                guard ["", "true", "false"].contains(value) else { throw fail("rpc-listen-all takes true or false") }
                read.given.listenAll = value != "false"
            case "log-level":
                guard ["debug", "info", "notice", "warn", "error"].contains(value) else {
                    throw fail("log-level takes debug, info, notice, warn or error, not '\(value)'")
                }
                read.given.verbose = value == "debug" || value == "info"
            case "enable-rpc":
                guard value != "false" else { throw fail("enable-rpc=false: stitch serve is its RPC") }
            case "daemon":
                ignored.append("daemon (stitch serve stays in the foreground; a service manager runs it)")
            default:
                guard let spec = table.spec(named: "--" + entry.name), entry.name != "rpc-secret" else {
                    if entry.name.hasSuffix("-passwd") || (entry.name.hasSuffix("-proxy") && TransportOptions.Proxy.hasCredentials(value)) {
                        // A password, as rpc-secret: only from a file no one else can read.
                        var info = stat()
                        guard stat(expanded, &info) == 0, info.st_mode & 0o077 == 0 else {
                            throw fail("\(entry.name) holds a password in a file others can read: chmod 600 \(path)")
                        }
                    }
                    rest.append(entry)
                    continue
                }
                let arguments: [String]
                if spec.placeholder == nil {
                    guard ["", "true", "false"].contains(value) else { throw fail("\(entry.name) takes true or false") }
                    arguments = value == "false" ? [] : ["--" + entry.name]
                } else {
                    arguments = ["--" + entry.name, value]
                }
                do {
                    try table.parse(arguments, into: &read.given) { _, _ in }
                } catch let error as UsageError {
                    throw fail(error.message)
                }
            }
        }
        let (defaults, ignoredOptions, problems) = Aria2RPC.configDefaults(rest)
        if let problem = problems.first { throw UsageError("\(path):\(problem)") }
        read.downloadDefaults = defaults
        ignored += ignoredOptions
        if !ignored.isEmpty {
            read.notes.append("\(path): ignored (docs/rpc.md says why): \(ignored.joined(separator: ", "))")
        }
        return read
    }

    /// The command line's options over a file's: what the command line gives wins, a list given there replaces
    /// the file's.
    static func merged(_ command: Given, over file: Given) -> Given {
        var merged = command
        merged.directory = command.directory ?? file.directory
        if command.listen.isEmpty { merged.listen = file.listen }
        merged.secretFile = command.secretFile ?? file.secretFile
        merged.allowOriginAll = command.allowOriginAll || file.allowOriginAll
        if command.allowHosts.isEmpty { merged.allowHosts = file.allowHosts }
        merged.certificate = command.certificate ?? file.certificate
        merged.privateKey = command.privateKey ?? file.privateKey
        merged.maxRequestSize = command.maxRequestSize ?? file.maxRequestSize
        merged.maxWebSockets = command.maxWebSockets ?? file.maxWebSockets
        merged.maxConcurrent = command.maxConcurrent ?? file.maxConcurrent
        merged.rate = command.rate ?? file.rate
        merged.perHost = command.perHost ?? file.perHost
        merged.connections = command.connections ?? file.connections
        merged.logFile = command.logFile ?? file.logFile
        merged.inputFile = command.inputFile ?? file.inputFile
        merged.cookieFile = command.cookieFile ?? file.cookieFile
        merged.verbose = command.verbose || file.verbose
        merged.secret = file.secret
        merged.listenAll = command.listen.isEmpty && file.listenAll
        return merged
    }
}
