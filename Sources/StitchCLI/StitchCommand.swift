import Dispatch
import CStitchSystem
import Foundation
import Stitch
import Synchronization
import StitchLocks

/// Exit statuses; documented in `stitch get --help` and docs/cli.md.
enum ExitStatus: Int32 {
    case success = 0
    case failure = 1
    case usage = 64
    case io = 74
    case temporaryFailure = 75
    case interrupted = 130
    case terminated = 143

    init(for error: DownloadError) {
        switch error.code {
        case .invalidURL, .unsupportedScheme, .invalidOption, .nothingToResume: self = .usage
        case .io: self = .io
        case .retriesExhausted: self = .temporaryFailure
        case .httpStatus where error.httpStatus.map(Self.isTemporary) ?? false:
            // The engine retries 408, 429 and 5xx; reaching the CLI with one means --retries ran out.
            self = .temporaryFailure
        default: self = .failure
        }
    }

    /// HTTP statuses the engine treats as temporary (and retries).
    static func isTemporary(_ status: Int) -> Bool {
        status == 408 || status == 429 || (500...599).contains(status)
    }
}

@main
struct StitchCommand {
    static func main() async {
        // A reader of stdout that goes away (`stitch get -i list | head -1`) is EPIPE on the next write, not a
        // death mid-download with the terminal's live area left drawn.
        signal(SIGPIPE, SIG_IGN)
        let arguments = Array(CommandLine.arguments.dropFirst())
        let status = await run(arguments)
        exit(status.rawValue)
    }

    static func run(_ arguments: [String]) async -> ExitStatus {
        guard let command = arguments.first else {
            writeAll(STDERR_FILENO, Help.main + "\n")
            return .usage
        }
        switch command {
        case "-h", "--help", "help":
            // The manual pages and completions the package installs, from the same text (scripts/package.sh).
            if arguments.count == 3, arguments[1] == "--man" || arguments[1] == "--completion" {
                let text = arguments[1] == "--man" ? Manual.page(arguments[2]) : Manual.completion(arguments[2])
                guard let text else {
                    writeAll(STDERR_FILENO, "stitch: no \(arguments[1].dropFirst(2)) '\(arguments[2])' (stitch.1, stitch-serve.8; bash, zsh, fish)\n")
                    return .usage
                }
                Output.stdout(text)
                return .success
            }
            if arguments.dropFirst().first == "get" {
                Output.stdout(Help.get + "\n")
            } else if let topic = arguments.dropFirst().first, topic == "client" || Client.commands.contains(topic) {
                Output.stdout(Help.client + "\n")
            } else if arguments.dropFirst().first == "serve" {
                Output.stdout(Help.serve + "\n")
            } else {
                Output.stdout(Help.main + "\n")
            }
            return .success
        case "--version", "version":
            Output.stdout("stitch \(StitchVersion.string) (commit \(String(cString: stitch_build_commit())))\n")
            return .success
        case "get":
            let rest = Array(arguments.dropFirst())
            if rest.contains("-h") || rest.contains("--help") {
                Output.stdout(Help.get + "\n")
                return .success
            }
            return await get(rest)
        case "serve":
            let rest = Array(arguments.dropFirst())
            if rest.contains("-h") || rest.contains("--help") {
                Output.stdout(Help.serve + "\n")
                return .success
            }
            return await Serve.run(rest)
        case "verify":
            let rest = Array(arguments.dropFirst())
            if rest.contains("-h") || rest.contains("--help") {
                Output.stdout(Help.verify + "\n")
                return .success
            }
            return verify(rest)
        case let client where Client.commands.contains(client):
            let rest = Array(arguments.dropFirst())
            if rest.contains("-h") || rest.contains("--help") {
                Output.stdout(Help.client + "\n")
                return .success
            }
            return await Client.run(client, rest)
        default:
            // `stitch URL…` (as `wget URL`, `aria2c URL`), also after options (`stitch -c URL`): `stitch get URL…`.
            if command.hasPrefix("-") || CommandLineURL.looksLikeURL(command),
                arguments.contains(where: CommandLineURL.looksLikeURL)
            {
                return await run(["get"] + arguments)
            }
            let what = command.hasPrefix("-") ? "option" : "command"
            writeAll(
                STDERR_FILENO,
                "stitch: unknown \(what) '\(command)'\nUsage: stitch get URL [options]; see 'stitch --help'\n")
            return .usage
        }
    }

    static func get(_ arguments: [String]) async -> ExitStatus {
        let options: GetOptions
        do {
            options = try GetOptions.parse(arguments)
        } catch let error as UsageError {
            writeAll(STDERR_FILENO, "stitch: \(error.message)\nUsage: stitch get URL [-o PATH | -d DIR] [options]; see 'stitch get --help'\n")
            return .usage
        } catch {
            writeAll(STDERR_FILENO, "stitch: \(error)\n")
            return .usage
        }
        let output = Output(mode: options.json ? .json : options.quiet ? .quiet : .human)
        for note in options.notes {
            output.message("stitch: note: \(note)")
            output.json("notice", ["message": note])
        }
        if let directory = options.directory {
            // `-d` names where to save, created (with its parents) as for a list of URLs.
            do {
                try DownloadPaths.createFolder(normalizedPath(directory))
            } catch {
                let reason = (error as NSError).localizedFailureReason ?? "\(error)"
                output.error("-d \(directory): cannot create the directory: \(reason)")
                output.json("error", ["code": "io", "message": "cannot create the directory \(directory)", "resumable": false])
                return .io
            }
        }
        if options.isBatch { return await Batch.run(options, output: output) }
        if options.output == "-" { return await stream(options, output: output) }

        var request: DownloadRequest
        if let output = options.output, isDirectory(output) {
            writeAll(STDERR_FILENO, "stitch: -o \(output) is a directory; use -d DIR to save into it\n")
            return .usage
        }
        if let resumePath = options.resumePath.map(normalizedPath) {
            do {
                let saved = try Downloader.savedDownload(at: resumePath)
                // A header given now replaces a saved one of the same name (e.g. a fresh Authorization).
                let given = Set(options.headers.map { $0.name.lowercased() })
                var headers = HTTPHeaders()
                for field in saved.headers where !given.contains(field.name.lowercased()) {
                    headers.add(name: field.name, value: field.value)
                }
                for field in options.headers { headers.add(name: field.name, value: field.value) }
                request = DownloadRequest(
                    url: saved.url, destination: .file(resumePath), headers: headers,
                    checksum: options.checksum ?? saved.checksum, overwrite: options.overwrite)
            } catch {
                output.error(error.commandLineMessage)
                output.json(
                    "error",
                    ["code": "\(error.code)", "message": error.commandLineMessage, "resumable": error.isResumable])
                return ExitStatus(for: error)
            }
        } else {
            let destination: Destination =
                options.output.map { .file(normalizedPath($0)) }
                ?? .directory(normalizedPath(options.directory ?? "."))
            request = DownloadRequest(
                url: options.url ?? "", destination: destination, headers: options.headers,
                checksum: options.checksum, overwrite: options.overwrite)
            request.adopt = options.adopt
            request.ifNewer = options.ifNewer
        }
        request.mirrors = options.mirrors
        request.useAdvertisedMirrors = options.useAdvertisedMirrors
        for (name, file) in [("--ca-cert", options.caCert), ("--proxy-ca-cert", options.proxyCACert)] {
            if let file, access(file, R_OK) != 0 {
                output.error("\(name): cannot read \(file)")
                return .usage
            }
        }

        var downloadOptions = DownloadOptions()
        downloadOptions.retry.maxRetries = options.retries
        downloadOptions.connections = options.connections
        downloadOptions.http2Streams = options.streams
        downloadOptions.rateLimiter = options.limitRate.map { RateLimiter(bytesPerSecond: $0) }
        if let error = options.configure(&downloadOptions.transport, for: [request.url]) {
            output.error(error.message)
            return .usage
        }
        if let base = ProcessInfo.processInfo.environment["STITCH_RETRY_BASE_DELAY"], let value = Double(base) {
            downloadOptions.retry.baseDelay = value  // for tests of the binary; not a user-facing option
        }
        let tuning = TestTuning.fromEnvironment()
        tuning.minimumSplitSize.map { downloadOptions.minimumSplitSize = $0 }
        tuning.singleConnectionRate.map { downloadOptions.singleConnectionRate = $0 == 0 ? nil : $0 }
        tuning.automaticConnectionStep.map { downloadOptions.automaticConnectionStep = $0 }

        let signals = SignalCatcher()
        let task = Task { () -> Result<DownloadResult, DownloadError> in
            do throws(DownloadError) {
                let transport = options.transport.cliTransport
                let result = try await Downloader(transport: transport).download(request, options: downloadOptions) {
                    report($0, to: output)
                }
                return .success(result)
            } catch {
                return .failure(error)
            }
        }
        signals.onSignal { task.cancel() }
        let outcome = await task.value

        switch outcome {
        case .success(let result):
            if result.alreadyComplete {
                output.endProgressLine()
            } else {
                output.finishProgress(bytes: result.bytes)
            }
            if result.notModified {
                // The engine's notice said why it is up to date.
            } else if result.alreadyComplete {
                output.message("\(result.destination) is already complete (\(result.bytes) bytes)")
            } else {
                var line = "saved \(result.destination) (\(Output.bytes(result.bytes))"
                if result.resumedFrom > 0 { line += ", resumed at \(Output.bytes(result.resumedFrom))" }
                if let checksum = result.checksum { line += ", \(checksum.algorithm.name) verified" }
                if let digest = result.serverDigest, let field = result.serverDigestField, digest != result.checksum {
                    line += ", \(digest.algorithm.name) from \(field) verified"
                }
                output.message(line + ")")
            }
            if output.mode == .json {
                var fields: [String: Any] = [
                    "path": result.destination, "bytes": result.bytes, "transferred": result.bytesTransferred,
                    "resumed_from": result.resumedFrom, "already_complete": result.alreadyComplete,
                    "not_modified": result.notModified,
                ]
                if let checksum = result.checksum { fields["checksum"] = checksum.description }
                if let digest = result.serverDigest {
                    fields["server_digest"] = digest.description
                    fields["server_digest_field"] = result.serverDigestField ?? ""
                }
                output.json("done", fields)
            } else {
                output.result(result.destination + "\n")
            }
            return .success
        case .failure(let error):
            output.error(error.commandLineMessage)
            output.json(
                "error", ["code": "\(error.code)", "message": error.commandLineMessage, "resumable": error.isResumable])
            if error.code == .cancelled {
                return signals.received == SIGTERM ? .terminated : .interrupted
            }
            return ExitStatus(for: error)
        }
    }

    /// `stitch verify DEST [--json]`: checks the recorded pieces of a partial download and marks damaged ones.
    static func verify(_ arguments: [String]) -> ExitStatus {
        let json = arguments.contains("--json")
        let paths = arguments.filter { $0 != "--json" }
        guard paths.count == 1, let path = paths.first, !path.hasPrefix("-") else {
            writeAll(STDERR_FILENO, "stitch: verify takes one partial download: stitch verify DEST [--json]\n")
            return .usage
        }
        let output = Output(mode: json ? .json : .human)
        do {
            let report = try Downloader.verify(at: path)
            if json {
                output.json("verify", [
                    "path": path, "piece_size": report.pieceSize, "pieces_checked": report.piecesChecked,
                    "damaged": report.damagedPieces.map { ["index": $0.index, "start": $0.bytes.lowerBound, "end": $0.bytes.upperBound] },
                ])
            } else if report.damagedPieces.isEmpty {
                Output.stdout("\(path): \(report.piecesChecked) pieces checked, none damaged\n")
            } else {
                for piece in report.damagedPieces {
                    Output.stdout("damaged piece \(piece.index): bytes \(piece.bytes.lowerBound)-\(piece.bytes.upperBound - 1)\n")
                }
                output.message(
                    "stitch: \(report.damagedPieces.count) of \(report.piecesChecked) pieces damaged; rerun the download (or stitch get --resume \(path)) to fetch only those again",
                    always: true)
            }
            return report.damagedPieces.isEmpty ? .success : .failure
        } catch {
            output.error(error.commandLineMessage)
            output.json(
                "error", ["code": "\(error.code)", "message": error.commandLineMessage, "resumable": error.isResumable])
            return ExitStatus(for: error)
        }
    }

    static func report(_ event: DownloadEvent, to output: Output) {
        switch event {
        case .destinationResolved(let path):
            output.setName((path as NSString).lastPathComponent)
            output.json("destination", ["path": path])
        case .resuming(let offset, let note):
            if let note { output.message("stitch: \(note)") }
            if offset > 0 { output.message("resuming at \(Output.bytes(offset)) (\(offset) bytes)") }
            var fields: [String: Any] = ["offset": offset]
            if let note { fields["note"] = note }
            output.json("resume", fields)
        case .receiving(let status, let offset, let total):
            output.bodyBegins(at: offset)
            var fields: [String: Any] = ["status": status, "offset": offset]
            if let total { fields["total"] = total }
            output.json("response", fields)
        case .progress(let progress):
            output.progress(progress)
        case .redirected(let url):
            output.json("redirect", ["url": url])
        case .restarting(let reason):
            output.message("stitch: restarting from zero: \(reason)", always: true)
            output.json("restart", ["reason": reason.description])
        case .notice(let text):
            output.message("stitch: \(text)")
            output.json("notice", ["message": text])
        case .retrying(let attempt, let maxRetries, let delay, let reason):
            output.message(String(format: "stitch: %@; retry %d of %d in %.1fs", reason, attempt, maxRetries, delay))
            output.json("retry", ["attempt": attempt, "max": maxRetries, "delay": delay, "reason": reason])
        case .finishing:
            break  // the saved line (or the error) follows
        }
    }
}

/// `stitch get URL -o -`: the body to standard output, in order, over one connection (see
/// ``Downloader/stream(_:headers:options:to:onEvent:)``): nothing on disk, nothing to resume later.
func stream(_ options: GetOptions, output: Output) async -> ExitStatus {
    guard let url = options.url else { return .usage }
    var downloadOptions = DownloadOptions()
    downloadOptions.retry.maxRetries = options.retries
    downloadOptions.rateLimiter = options.limitRate.map { RateLimiter(bytesPerSecond: $0) }
    if let error = options.configure(&downloadOptions.transport, for: [url]) {
        output.error(error.message)
        return .usage
    }
    if let base = ProcessInfo.processInfo.environment["STITCH_RETRY_BASE_DELAY"], let value = Double(base) {
        downloadOptions.retry.baseDelay = value  // for tests of the binary; not a user-facing option
    }
    // A reader that goes away between the sink's poll and its write must give EPIPE (exit 74), not kill us.
    signal(SIGPIPE, SIG_IGN)
    let signals = SignalCatcher()
    let headers = options.headers
    let task = Task { () -> Result<Int64, DownloadError> in
        do throws(DownloadError) {
            return .success(
                try await Downloader(transport: options.transport.cliTransport).stream(url, headers: headers, options: downloadOptions, to: .fileDescriptor(STDOUT_FILENO)) {
                    event in StitchCommand.report(event, to: output)
                })
        } catch {
            return .failure(error)
        }
    }
    signals.onSignal { task.cancel() }
    let outcome = await task.value
    switch outcome {
    case .success(let bytes):
        output.finishProgress(bytes: bytes)
        output.message("streamed \(Output.bytes(bytes)) (\(bytes) bytes) to standard output")
        return .success
    case .failure(let error):
        if error.code == DownloadError.Code.cancelled {
            output.error("interrupted; the stream cannot be resumed")
            return signals.received == SIGTERM ? .terminated : .interrupted
        }
        output.error(error.commandLineMessage)
        return ExitStatus(for: error)
    }
}

extension TransportBackend {
    /// The transport of a backend that parsing has already found in this build.
    var cliTransport: any HTTPTransport { transport ?? TransportBackend.defaultTransport }
}

extension GetOptions {
    /// Sets what the command line says of connections on `transport` (one download, a list, a stream): timeouts,
    /// TLS, netrc, the proxy (its password from `STITCH_PROXY_PASSWORD` or the terminal), and `-u`'s credentials
    /// for `urls`' origins, the password from the option or asked for on the
    /// terminal (never echoed), as curl asks. Returns the usage error when there is no password and no terminal.
    func configure(_ transport: inout TransportOptions, for urls: [String]) -> UsageError? {
        transport.stallTimeout = timeout
        transport.connectTimeout = connectTimeout
        transport.caCertificatePath = caCert
        transport.proxyCACertificatePath = proxyCACert
        transport.tlsVerification = insecure ? .insecure : .verify
        transport.netrc = netrc
        transport.noProxy = noProxy
        transport.proxy = proxy
        transport.cookies = cookies
        if let proxyUser {
            // Without --proxy, the environment's proxy for these URLs (as `curl -U` takes it): made explicit here,
            // so that the user and password go to that proxy and no other.
            var proxy: TransportOptions.Proxy
            switch self.proxy.map({ Result<TransportOptions.Proxy, UsageError>.success($0) })
                ?? Self.environmentProxy(for: urls)
            {
            case .success(let chosen): proxy = chosen
            case .failure(let error): return error
            }
            var password = ProcessInfo.processInfo.environment["STITCH_PROXY_PASSWORD"]
            if password == nil, proxy.user == proxyUser {
                password = proxy.password  // the environment's URL may carry the password (it is no command line)
            }
            if password == nil, let netrc, let host = URLComponents(string: proxy.url)?.host {
                // The proxy's host in the netrc file libcurl reads for the servers (it has none for proxies).
                let path = netrc.file ?? (ProcessInfo.processInfo.environment["HOME"] ?? NSHomeDirectory()) + "/.netrc"
                if let text = try? String(contentsOfFile: path, encoding: .utf8) {
                    let bare = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
                    password = NetrcFile(text: text).password(host: bare, login: proxyUser)
                }
            }
            if password == nil {
                guard isatty(STDIN_FILENO) == 1, let typed = getpass("Enter proxy password for user '\(proxyUser)': ")
                else {
                    return UsageError(
                        "--proxy-user \(proxyUser) needs a password: set STITCH_PROXY_PASSWORD, give a netrc file "
                            + "with the proxy's host (--netrc-file), or run it on a terminal")
                }
                password = String(cString: typed)
            }
            proxy.user = proxyUser
            proxy.password = password
            transport.proxy = proxy
        }
        guard let user else { return nil }
        var password = user.password
        if password == nil {
            guard isatty(STDIN_FILENO) == 1, let typed = getpass("Enter host password for user '\(user.name)': ")
            else {
                return UsageError("-u \(user.name) needs a password: -u \(user.name):PASSWORD, or run it on a terminal")
            }
            password = String(cString: typed)
        }
        transport.credentials = TransportOptions.Credentials(user: user.name, password: password ?? "", for: urls)
        return nil
    }

    /// The one proxy the environment names for `urls`, as libcurl reads it: `http_proxy` (lower case only) for
    /// http://, `https_proxy` or `HTTPS_PROXY` for https://, else `ALL_PROXY` or `all_proxy`. A usage error when
    /// there is none, or when the URLs would go to different ones (then `--proxy` says which).
    static func environmentProxy(for urls: [String]) -> Result<TransportOptions.Proxy, UsageError> {
        let environment = ProcessInfo.processInfo.environment
        func value(_ names: String...) -> String? {
            names.lazy.compactMap { environment[$0] }.first { !$0.isEmpty }
        }
        let all = value("ALL_PROXY", "all_proxy")
        var named: Set<String> = []
        for url in urls {
            let https = url.lowercased().hasPrefix("https:")
            if let chosen = https ? value("https_proxy", "HTTPS_PROXY") ?? all : value("http_proxy") ?? all {
                named.insert(chosen)
            }
        }
        guard let text = named.first else {
            return .failure(
                UsageError("--proxy-user needs a proxy: give --proxy URL, or set http_proxy, https_proxy or ALL_PROXY"))
        }
        guard named.count == 1 else {
            return .failure(
                UsageError("--proxy-user: the environment names different proxies for these URLs; give --proxy URL"))
        }
        // Not the text in any message: it may hold a password.
        do { return .success(try TransportOptions.Proxy(parsing: text)) } catch {
            return .failure(UsageError("--proxy-user: the environment's proxy: \(error)"))
        }
    }
}

/// `path` made absolute (against the working directory) without `.` components or repeated slashes, so
/// that messages and `--json` show `/home/me/f.bin` rather than `/home/me/./f.bin`. `..` is kept: resolving
/// it lexically would be wrong after a symbolic link.
func normalizedPath(_ path: String) -> String {
    let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    let components = absolute.split(separator: "/").filter { $0 != "." }
    return "/" + components.joined(separator: "/")
}

func isDirectory(_ path: String) -> Bool {
    var info = stat()
    return stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
}

/// Turns SIGINT and SIGTERM into task cancellation, so the download saves its state before exiting.
/// A second signal exits at once (the live record still lets the next run resume).
/// `@unchecked`: `sources` is set once in `init` and only kept alive afterwards.
final class SignalCatcher: @unchecked Sendable {
    private let sources: [any DispatchSourceSignal]
    private let receivedSignal = Atomic<Int32>(0)
    private let handler = Locked<(@Sendable () -> Void)?>(nil)

    init() {
        var sources: [any DispatchSourceSignal] = []
        for number in [SIGINT, SIGTERM] {
            signal(number, SIG_IGN)
            sources.append(DispatchSource.makeSignalSource(signal: number, queue: .global()))
        }
        self.sources = sources
        for (source, number) in zip(sources, [SIGINT, SIGTERM]) {
            source.setEventHandler { [self] in
                if receivedSignal.exchange(number, ordering: .acquiringAndReleasing) != 0 {
                    // Not on the progress line: the shell's prompt would land on it.
                    if Output.liveAreaShown.load(ordering: .acquiring) { writeAll(STDERR_FILENO, "\n") }
                    exit(number == SIGTERM ? ExitStatus.terminated.rawValue : ExitStatus.interrupted.rawValue)
                }
                handler.withLock { $0 }?()
            }
            source.resume()
        }
    }

    var received: Int32 { receivedSignal.load(ordering: .acquiring) }

    func onSignal(_ action: @escaping @Sendable () -> Void) {
        handler.withLock { $0 = action }
        if received != 0 { action() }
    }
}

/// Split thresholds that tests of the binary make small, so that small files reach every split path (the
/// defaults are 1 MiB, 128 MiB/s and 16 MiB). Read from the environment; not user-facing options.
///   STITCH_TEST_MINIMUM_SPLIT       bytes (DownloadOptions.minimumSplitSize)
///   STITCH_TEST_SINGLE_CONNECTION_RATE  bytes per second; 0 turns the probe off (DownloadOptions.singleConnectionRate)
///   STITCH_TEST_CONNECTION_STEP     bytes (DownloadOptions.automaticConnectionStep)
struct TestTuning {
    var minimumSplitSize: Int64?
    var singleConnectionRate: Int64?
    var automaticConnectionStep: Int64?

    static func fromEnvironment() -> TestTuning {
        let environment = ProcessInfo.processInfo.environment
        func value(_ name: String, minimum: Int64) -> Int64? {
            environment[name].flatMap { Int64($0) }.flatMap { $0 >= minimum ? $0 : nil }
        }
        return TestTuning(
            minimumSplitSize: value("STITCH_TEST_MINIMUM_SPLIT", minimum: 1),
            singleConnectionRate: value("STITCH_TEST_SINGLE_CONNECTION_RATE", minimum: 0),
            automaticConnectionStep: value("STITCH_TEST_CONNECTION_STEP", minimum: 1))
    }
}

extension DownloadError.Remedy {
    /// The command line's words for a remedy: the flag to pass, or the command to run again.
    var commandLineWords: String {
        switch self {
        case .overwrite(let purpose): return "pass --overwrite \(purpose)"
        case .rerun(let purpose): return "rerun \(purpose)"
        case .saveToFile: return "use -o FILE to download it resumably"
        }
    }
}

/// A library message with its remedy in the command line's words.
func commandLineMessage(_ message: String, _ remedy: DownloadError.Remedy?) -> String {
    remedy.map { "\(message); \($0.commandLineWords)" } ?? message
}

extension DownloadError {
    var commandLineMessage: String { StitchCLI.commandLineMessage(message, remedy) }
}

extension DownloadFailure {
    var commandLineMessage: String { StitchCLI.commandLineMessage(message, remedy) }
}
