import Foundation
import Stitch
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
        guard let directory = given.directory else {
            throw UsageError("--dir DIR is required: the folder the daemon downloads into")
        }
        var options = Daemon.Options(directory: directory)
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
        options.rateLimit = given.rate
        options.maxConnectionsPerHost = given.perHost
        options.connections = given.connections
        options.logFile = given.logFile
        options.verbose = given.verbose
        return options
    }
}
