import Foundation
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
    /// `--adopt`: take over a partial that wget, curl or aria2c left at `-o FILE` (or at each list entry's `out=`).
    var adopt = false
    var quiet = false
    var json = false
    var connections: Int?
    var limitRate: Int64?
    var streams = false
    /// The first option given that only the libcurl transport has, as the user spelled it (`--insecure` or `-k`).
    var libcurlOnlyOption: String?
    /// What the parser assumed or ignored, for the user (printed before anything starts).
    var notes: [String] = []
    /// `-u USER[:PASSWORD]`: the user and, if given, the password (else asked for on the terminal).
    var user: (name: String, password: String?)?
    /// `--netrc` / `--netrc-file FILE`: credentials from a netrc file (`file` nil: ~/.netrc).
    var netrc: TransportOptions.Netrc?
    /// `--transport NAME`: the HTTP backend (libcurl, or URLSession; the build's default unless given).
    var transport = TransportBackend.default

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
                options.libcurlOnlyOption = options.libcurlOnlyOption ?? argument
            case "-c", "--connections":
                let text = try take(argument)
                if argument == "-c", inlineValue == nil, Int(text) == nil, CommandLineURL.looksLikeURL(text) {
                    // `wget -c URL`, `aria2c -c URL`: continue. stitch always does; its -c is aria2c's -x.
                    options.notes.append(
                        "-c sets the number of connections here (aria2c's -x); a partial download is always "
                            + "continued, no flag needed")
                    positional.append(text)
                    index += 1
                    continue
                }
                let range = DownloadOptions.connectionRange
                guard let n = Int(text), range.contains(n) else {
                    throw UsageError(
                        "--connections takes a whole number from \(range.lowerBound) to \(range.upperBound), not '\(text)'")
                }
                options.connections = n
            case "--limit-rate":
                let text = try take(argument)
                guard let rate = RateLimiter.parse(text) else {
                    throw UsageError("--limit-rate takes a rate like 500K, 2M or 1.5M (bytes per second), not '\(text)'")
                }
                options.limitRate = rate
            case "-u", "--user":
                let text = try take(argument)
                let parts = text.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
                guard let name = parts.first, !name.isEmpty,
                    !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
                else {
                    // Not the value itself: it may hold a password.
                    throw UsageError("-u takes USER or USER:PASSWORD (a user name, no control characters)")
                }
                options.user = (String(name), parts.count > 1 ? String(parts[1]) : nil)
            case "--netrc":
                options.netrc = TransportOptions.Netrc()
                options.libcurlOnlyOption = options.libcurlOnlyOption ?? argument
            case "--netrc-file":
                let path = try take(argument)
                guard !path.isEmpty else { throw UsageError("--netrc-file needs a file path") }
                options.netrc = TransportOptions.Netrc(file: path)
                options.libcurlOnlyOption = options.libcurlOnlyOption ?? argument
            case "-i", "--input-file": options.inputFile = try take(argument)
            case "-j", "--jobs", "--max-concurrent-downloads":
                let text = try take(argument)
                guard let n = Int(text), (1...256).contains(n) else {
                    throw UsageError("--jobs takes a whole number from 1 to 256, not '\(text)'")
                }
                options.jobs = n
            case "--streams":
                options.streams = true
                options.libcurlOnlyOption = options.libcurlOnlyOption ?? argument
            case "--transport":
                let name = try take(argument)
                guard let backend = TransportBackend(rawValue: name.lowercased()) else {
                    let names = TransportBackend.allCases.map(\.rawValue).joined(separator: " or ")
                    throw UsageError("--transport takes \(names), not '\(name)'")
                }
                guard backend.transport != nil else {
                    throw UsageError("this stitch was built without the \(backend) transport; use --transport \(TransportBackend.default)")
                }
                options.transport = backend
            case "-k", "--insecure":
                options.insecure = true
                options.libcurlOnlyOption = options.libcurlOnlyOption ?? argument
            case "--overwrite": options.overwrite = true
            case "--adopt": options.adopt = true
            case "-q", "--quiet": options.quiet = true
            case "--json": options.json = true
            default:
                throw UsageError("unknown option '\(argument)'")
            }
            if inlineValue != nil,
                ["--insecure", "--overwrite", "--adopt", "--quiet", "--json", "--streams", "--netrc"].contains(argument)
            {
                throw UsageError("\(argument) takes no value")
            }
            index += 1
        }
        options.urls = positional.map { text in
            let (url, note) = CommandLineURL.assumingScheme(text)
            if let note { options.notes.append(note) }
            return url
        }
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
        if output == "-" {
            // Standard output: in order, over one connection, nothing on disk to check or resume.
            if let connections, connections > 1 { throw UsageError("-o - streams over one connection; drop -c") }
            if streams { throw UsageError("-o - streams over one connection; drop --streams") }
            if checksum != nil {
                throw UsageError("--checksum cannot hold back bytes already sent to -o -; use -o FILE")
            }
            if json { throw UsageError("--json writes to standard output, which -o - holds; use -o FILE") }
            if overwrite { throw UsageError("--overwrite has no file to replace with -o -") }
            if adopt { throw UsageError("--adopt takes over a partial FILE; -o - has none") }
        }
        if transport == .urlSession {
            // What URLSession cannot do is refused before anything starts, not part-way through a batch.
            if let needsLibcurl = libcurlOnlyOption {
                throw UsageError("\(needsLibcurl) needs the libcurl transport; the URLSession transport cannot do it")
            }
        }
        if let output, output.isEmpty || output.hasSuffix("/") {
            throw UsageError("-o needs a file path, not '\(output)'")
        }
        if adopt && isBatch && !urls.isEmpty {
            throw UsageError("--adopt with several downloads takes their names from -i FILE (out= per download); give the URLs there")
        }
        if adopt && !isBatch && output == nil {
            throw UsageError(
                resumePath != nil
                    ? "--resume continues stitch's own partial download; --adopt is for another tool's: use -o FILE"
                    : "--adopt needs -o FILE: the partial download to take over")
        }
        if let caCert, caCert.isEmpty { throw UsageError("--ca-cert needs a file path") }
        if quiet && json { throw UsageError("--quiet and --json cannot be used together") }
    }
}

/// URLs as people type them to curl, wget and aria2c.
enum CommandLineURL {
    /// `text` with `http://` in front when it names no scheme (`127.0.0.1:8080/f`, `example.com/f`), as curl and
    /// wget assume, and the note that says so; unchanged otherwise (a scheme without `//`, such as `mailto:`, is
    /// left for the engine to refuse).
    static func assumingScheme(_ text: String) -> (url: String, note: String?) {
        guard !text.isEmpty, !text.contains("://"), !hasSchemeWithoutSlashes(text) else { return (text, nil) }
        let url = "http://" + text
        return (url, "no scheme in '\(text)': using \(url)")
    }

    /// A `scheme:` prefix (RFC 3986: a letter, then letters, digits, `+`, `-`, `.`) not followed by a port number:
    /// `mailto:x` has one, `localhost:8080/f` does not.
    private static func hasSchemeWithoutSlashes(_ text: String) -> Bool {
        guard let colon = text.firstIndex(of: ":") else { return false }
        let scheme = text[..<colon]
        guard let first = scheme.first, first.isASCII, first.isLetter,
            scheme.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+-.".contains($0)) })
        else { return false }
        let rest = text[text.index(after: colon)...]
        return !(rest.first?.isNumber ?? false)
    }

    /// Whether a bare word on the command line is meant as a URL (`stitch URL` without `get`, `-c URL`): it names a
    /// scheme with `://`, or starts with a host that has a port, or a dotted host (or `localhost`) followed by a path
    /// or ending in a name (`example.com`). A mistyped command (`stitch gte`) and a number (`-c 1.5`) are none of
    /// these.
    static func looksLikeURL(_ text: String) -> Bool {
        if text.contains("://") { return true }
        guard !text.hasPrefix("-"), !text.contains(where: { $0 == " " || $0.isNewline }) else { return false }
        let host = text.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !host.isEmpty, !hasSchemeWithoutSlashes(text) else { return false }
        let name = host.split(separator: ":", maxSplits: 1).first.map(String.init) ?? ""
        let hasPort = host.contains(":")
        if hasPort { return !name.isEmpty }
        let dotted = name.contains(".") && !name.hasPrefix(".") && !name.hasSuffix(".")
        let hasPath = host.count < text.count
        let endsInAName = name.split(separator: ".").last?.first?.isLetter ?? false
        return (name == "localhost" || dotted) && (hasPath || endsInAName || name == "localhost")
    }
}

/// The daemon's secret from a file, as `stitch serve` and the client commands both read it (so they agree on
/// it): `~` expanded, spaces and line ends around it dropped (a file written by `echo`, or by an editor that
/// adds a newline, holds the same secret as one without); an empty or unreadable file is a usage error.
func readSecretFile(_ path: String) throws -> String {
    let expanded = (path as NSString).expandingTildeInPath
    guard let data = FileManager.default.contents(atPath: expanded), let text = String(data: data, encoding: .utf8)
    else { throw UsageError("cannot read the secret file \(path)") }
    let secret = text.trimmingCharacters(in: .whitespacesAndNewlines)
    guard !secret.isEmpty else { throw UsageError("the secret file \(path) is empty") }
    return secret
}
