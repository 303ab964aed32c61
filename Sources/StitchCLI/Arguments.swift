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
    /// `--mirror URL`: other URLs of the same file, fetched from beside the first while the file is split.
    var mirrors: [String] = []
    /// `--use-advertised-mirrors`: also the mirrors a response names with `Link: rel=duplicate`.
    var useAdvertisedMirrors = false
    /// `-N` / `--if-newer`: fetch only if the server's file is newer than DEST (wget -N, curl -z).
    var ifNewer = false
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
    /// `--load-cookies FILE`: cookies sent where they match.
    var cookies: CookieJar?
    /// `--proxy URL`: the proxy for every request (``TransportOptions/Proxy/direct`` for `--proxy ''`).
    var proxy: TransportOptions.Proxy?
    /// `--proxy-user USER`: the proxy's user; the password comes from `STITCH_PROXY_PASSWORD` or the terminal.
    var proxyUser: String?
    /// `--proxy-ca-cert FILE`: the CA bundle an https:// proxy's certificate is checked against.
    var proxyCACert: String?
    /// `--noproxy LIST`: hosts reached directly.
    var noProxy: String?
    /// `--transport NAME`: the HTTP backend (libcurl, or URLSession; the build's default unless given).
    var transport = TransportBackend.default

    static let reservedHeaders: Set<String> = ["range", "if-range", "accept-encoding"]

    /// Reads `stitch get`'s arguments (after `get`) and validates them.
    static func parse(_ arguments: [String]) throws -> GetOptions {
        var options = GetOptions()
        try table.parse(arguments, into: &options) { options, url in options.urls.append(url) }
        options.urls = options.urls.map { text in
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
            if !mirrors.isEmpty {
                throw UsageError("--mirror is for one URL; in -i FILE put a download's mirrors on its line, TAB-separated")
            }
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
            if ifNewer { throw UsageError("--if-newer compares with a FILE; -o - has none") }
            if !mirrors.isEmpty || useAdvertisedMirrors {
                throw UsageError("-o - streams over one connection from one URL; drop the mirrors")
            }
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
        if ifNewer && adopt {
            throw UsageError("--if-newer treats DEST as a complete file, --adopt as a partial one: give one of them")
        }
        if ifNewer && resumePath != nil {
            throw UsageError("--resume continues a partial download; --if-newer is for a complete DEST: drop one")
        }
        if let caCert, caCert.isEmpty { throw UsageError("--ca-cert needs a file path") }
        if let proxyCACert, proxyCACert.isEmpty { throw UsageError("--proxy-ca-cert needs a file path") }
        if proxyUser != nil, proxy == .direct {
            throw UsageError("--proxy-user names a proxy's user, and --proxy '' uses none: drop one")
        }
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
