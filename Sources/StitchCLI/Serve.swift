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

    static func parse(_ arguments: [String], environment: [String: String]) throws -> Daemon.Options {
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
        var index = 0
        while index < arguments.count {
            var argument = arguments[index]
            var inline: String?
            if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
                inline = String(argument[argument.index(after: equals)...])
                argument = String(argument[..<equals])
            }
            func value() throws -> String {
                if let inline { return inline }
                index += 1
                guard index < arguments.count else { throw UsageError("\(argument) needs a value") }
                return arguments[index]
            }
            func count(_ range: ClosedRange<Int>) throws -> Int {
                let text = try value()
                guard let number = Int(text), range.contains(number) else {
                    throw UsageError("\(argument) takes a number \(range.lowerBound)-\(range.upperBound), not '\(text)'")
                }
                return number
            }
            switch argument {
            case "-d", "--dir": directory = try value()
            case "--rpc-listen": listen.append(try value())
            case "--rpc-listen-port":
                let port = try count(0...65_535)
                listen += ["127.0.0.1:\(port)", "[::1]:\(port)"]
            case "--rpc-secret":
                throw UsageError(
                    "the secret is not taken on the command line (other users can read it in ps); put it in a "
                        + "file for --rpc-secret-file FILE, or set STITCH_RPC_SECRET")
            case "--rpc-secret-file": secretFile = try value()
            case "--rpc-allow-origin-all": allowOriginAll = true
            case "--rpc-allow-host": allowHosts.append(try value())
            case "--rpc-certificate": certificate = try value()
            case "--rpc-private-key": privateKey = try value()
            case "--rpc-max-request-size":
                let text = try value()
                guard let size = ByteSize.parse(text), size >= 1_024, size <= 1 << 30 else {
                    throw UsageError("--rpc-max-request-size takes a size from 1K to 1G (16M, 512K), not '\(text)'")
                }
                maxRequestSize = Int(size)
            case "--rpc-max-websocket-clients": maxWebSockets = try count(1...10_000)
            case "-j", "--max-concurrent-downloads": maxConcurrent = try count(1...1_000)
            case "--max-overall-download-limit":
                let text = try value()
                if text != "0" {
                    guard let parsed = RateLimiter.parse(text) else {
                        throw UsageError("--max-overall-download-limit takes a rate (500K, 2M, 0 for none), not '\(text)'")
                    }
                    rate = parsed
                }
            case "--max-connections-per-host": perHost = try count(1...4_096)
            case "-c", "--split", "--connections": connections = try count(DownloadOptions.connectionRange)
            case "--log": logFile = try value()
            case "-v", "--verbose": verbose = true
            default:
                throw UsageError("unknown option '\(argument)'")
            }
            index += 1
        }
        guard let directory else { throw UsageError("--dir DIR is required: the folder the daemon downloads into") }
        var options = Daemon.Options(directory: directory)
        if !listen.isEmpty {
            // A bare port listens on both loopback addresses, as the default does.
            options.server.addresses = listen.flatMap { address -> [String] in
                UInt16(address) != nil ? ["127.0.0.1:\(address)", "[::1]:\(address)"] : [address]
            }
        }
        if let secretFile {
            options.secret = try readSecretFile(secretFile)
        } else if let secret = environment["STITCH_RPC_SECRET"], !secret.isEmpty {
            options.secret = secret
        }
        options.server.policy = AccessPolicy(allowedHosts: allowHosts, allowOriginAll: allowOriginAll)
        switch (certificate, privateKey) {
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
        if let maxRequestSize { options.server.maxRequestSize = maxRequestSize }
        if let maxWebSockets { options.server.maxWebSocketClients = maxWebSockets }
        options.maxConcurrentDownloads = maxConcurrent
        options.rateLimit = rate
        options.maxConnectionsPerHost = perHost
        options.connections = connections
        options.logFile = logFile
        options.verbose = verbose
        return options
    }
}
