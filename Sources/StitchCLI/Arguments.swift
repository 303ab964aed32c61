import Stitch

/// A usage error: one line, exit status 64.
struct UsageError: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// `stitch get` options, parsed and validated before any work starts.
struct GetOptions {
    var urls: [String] = []
    var url: String? { urls.count == 1 ? urls[0] : nil }
    /// `-i FILE` (aria2's input-file format; `-` reads stdin).
    var inputFile: String?
    /// `-j N`: downloads at once in a batch.
    var jobs: Int?
    var resumePath: String?
    var output: String?
    var directory: String?
    var checksum: ExpectedChecksum?
    var retries = 5
    var timeout = 30.0
    var connectTimeout = 30.0
    var headers = HTTPHeaders()
    var caCert: String?
    var insecure = false
    var overwrite = false
    var quiet = false
    var json = false
    var connections: Int?
    var limitRate: Int64?
    var streams = false

    static let reservedHeaders: Set<String> = ["range", "if-range", "accept-encoding"]

    static func parse(_ arguments: [String]) throws -> GetOptions {
        var options = GetOptions()
        var index = 0
        var positional: [String] = []
        func value(for flag: String) throws -> String {
            index += 1
            guard index < arguments.count else { throw UsageError("\(flag) needs a value") }
            return arguments[index]
        }
        func seconds(_ text: String, _ flag: String) throws -> Double {
            guard let value = Double(text), value.isFinite, value > 0, value <= 86_400 else {
                throw UsageError("\(flag) takes a number of seconds between 0 and 86400, not '\(text)'")
            }
            return value
        }
        var sawDoubleDash = false
        while index < arguments.count {
            var argument = arguments[index]
            var inlineValue: String?
            if !sawDoubleDash, argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
                inlineValue = String(argument[argument.index(after: equals)...])
                argument = String(argument[..<equals])
            }
            func take(_ flag: String) throws -> String {
                if let inlineValue { return inlineValue }
                return try value(for: flag)
            }
            if sawDoubleDash || !argument.hasPrefix("-") || argument == "-" {
                positional.append(argument)
                index += 1
                continue
            }
            switch argument {
            case "--": sawDoubleDash = true
            case "-o", "--output": options.output = try take(argument)
            case "-d", "--dir", "--directory": options.directory = try take(argument)
            case "--resume": options.resumePath = try take(argument)
            case "--checksum":
                let text = try take(argument)
                do { options.checksum = try ExpectedChecksum(parsing: text) } catch {
                    throw UsageError("--checksum: \(error)")
                }
            case "--retries":
                let text = try take(argument)
                guard let n = Int(text), (0...1000).contains(n) else {
                    throw UsageError("--retries takes a whole number from 0 to 1000, not '\(text)'")
                }
                options.retries = n
            case "--timeout": options.timeout = try seconds(try take(argument), argument)
            case "--connect-timeout": options.connectTimeout = try seconds(try take(argument), argument)
            case "-H", "--header":
                let text = try take(argument)
                guard let (name, value) = Downloader.parseHeaderLine(text) else {
                    throw UsageError("--header must be 'Name: value' without control characters, not \(text.debugDescription)")
                }
                guard !reservedHeaders.contains(name.lowercased()) else {
                    throw UsageError("--header \(name) is set by stitch itself and cannot be overridden")
                }
                options.headers.add(name: name, value: value)
            case "--ca-cert", "--cacert":
                let path = try take(argument)
                options.caCert = path
            case "-c", "--connections":
                let text = try take(argument)
                guard let n = Int(text), (1...16).contains(n) else {
                    throw UsageError("--connections takes a whole number from 1 to 16, not '\(text)'")
                }
                options.connections = n
            case "--limit-rate":
                let text = try take(argument)
                guard let rate = RateLimiter.parse(text) else {
                    throw UsageError("--limit-rate takes a rate like 500K, 2M or 1.5M (bytes per second), not '\(text)'")
                }
                options.limitRate = rate
            case "-i", "--input-file": options.inputFile = try take(argument)
            case "-j", "--jobs", "--max-concurrent-downloads":
                let text = try take(argument)
                guard let n = Int(text), (1...256).contains(n) else {
                    throw UsageError("--jobs takes a whole number from 1 to 256, not '\(text)'")
                }
                options.jobs = n
            case "--streams": options.streams = true
            case "-k", "--insecure": options.insecure = true
            case "--overwrite": options.overwrite = true
            case "-q", "--quiet": options.quiet = true
            case "--json": options.json = true
            default:
                throw UsageError("unknown option '\(argument)'")
            }
            if inlineValue != nil, ["--insecure", "--overwrite", "--quiet", "--json", "--streams"].contains(argument) {
                throw UsageError("\(argument) takes no value")
            }
            index += 1
        }
        options.urls = positional
        try options.validate()
        return options
    }

    /// Several URLs, or a list: run through a download manager, several at once.
    var isBatch: Bool { urls.count > 1 || inputFile != nil }

    func validate() throws {
        if urls.isEmpty && resumePath == nil && inputFile == nil {
            throw UsageError("missing URL (or -i FILE, or --resume DEST)")
        }
        if !urls.isEmpty && resumePath != nil { throw UsageError("give either a URL or --resume DEST, not both") }
        if inputFile != nil && resumePath != nil { throw UsageError("give either -i FILE or --resume DEST, not both") }
        if isBatch {
            if output != nil { throw UsageError("-o names one file; with several URLs use -d DIR (or out= in -i FILE)") }
            if checksum != nil { throw UsageError("--checksum is for one URL; in -i FILE give checksum= per download") }
        } else if jobs != nil {
            throw UsageError("-j is for several downloads (several URLs or -i FILE)")
        }
        if output != nil && directory != nil { throw UsageError("-o and -d cannot be used together") }
        if resumePath != nil && (output != nil || directory != nil) {
            throw UsageError("--resume DEST names the file already; drop -o/-d")
        }
        if let output, output.isEmpty || output.hasSuffix("/") {
            throw UsageError("-o needs a file path, not '\(output)'")
        }
        if let caCert, caCert.isEmpty { throw UsageError("--ca-cert needs a file path") }
        if quiet && json { throw UsageError("--quiet and --json cannot be used together") }
    }
}
