import Foundation
import Stitch

extension GetOptions {
    /// `stitch get`'s options, in the order its help lists them.
    static let table = OptionTable<GetOptions>([
        .value(
            ["-o", "--output"], "PATH",
            help: """
                save to PATH; '-o -' writes to standard output, in order, over one
                connection: a dropped connection continues (with a strong validator), but
                it never restarts from zero and cannot be resumed later (nothing on disk)
                """
        ) { options, use in options.output = use.value },
        .value(
            ["-d", "--dir"], "DIR", aliases: ["--directory"],
            help: """
                save in DIR (created with its parents), named from Content-Disposition or
                the URL (default: .)
                """
        ) { options, use in options.directory = use.value },
        .value(
            ["--resume"], "DEST",
            help: """
                continue the download saved at DEST (URL, headers and checksum come from
                DEST.stitch; give TLS options again; a header given replaces the saved one)
                """
        ) { options, use in options.resumePath = use.value },
        .value(["--checksum"], "ALGO=HEX", help: "verify the file (sha-256, sha-512, sha-1, md5)") { options, use in
            do { options.checksum = try ExpectedChecksum(parsing: use.value) } catch {
                throw UsageError("--checksum: \(error)")
            }
        },
        .value(
            ["-c", "--connections"], "N",
            help: """
                TCP connections for one file, 1-16 (default: 1 per 16 MiB, at most 4, and
                one when a first connection already brings 128 MiB/s; always one when the
                server gives no ranges or no strong validator)
                """
        ) { options, use in
            let text = use.value
            if use.name == "-c", !use.isInline, Int(text) == nil, CommandLineURL.looksLikeURL(text) {
                // `wget -c URL`, `aria2c -c URL`: continue. stitch always does; its -c is aria2c's -x.
                options.notes.append(
                    "-c sets the number of connections here (aria2c's -x); a partial download is always "
                        + "continued, no flag needed")
                options.urls.append(text)
                return
            }
            let range = DownloadOptions.connectionRange
            guard let n = Int(text), range.contains(n) else {
                throw UsageError(
                    "--connections takes a whole number from \(range.lowerBound) to \(range.upperBound), not '\(text)'")
            }
            options.connections = n
        },
        .flag(["--streams"], help: "over HTTPS, carry the connections as HTTP/2 streams of one TCP connection") {
            options, use in
            options.streams = true
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .value(
            ["--transport"], "NAME",
            help: """
                libcurl (the default when built with it) or urlsession (Foundation's; no -k,
                --ca-cert, --netrc or --streams)
                """
        ) { options, use in
            let name = use.value
            guard let backend = TransportBackend(rawValue: name.lowercased()) else {
                let names = TransportBackend.allCases.map(\.rawValue).joined(separator: " or ")
                throw UsageError("--transport takes \(names), not '\(name)'")
            }
            guard backend.transport != nil else {
                throw UsageError(
                    "this stitch was built without the \(backend) transport; "
                        + "use --transport \(TransportBackend.default)")
            }
            options.transport = backend
        },
        .value(
            ["--limit-rate"], "RATE",
            help: "at most RATE bytes per second over all connections (500K, 2M, 1.5M; K = 1024)"
        ) { options, use in
            guard let rate = RateLimiter.parse(use.value) else {
                throw UsageError(
                    "--limit-rate takes a rate like 500K, 2M or 1.5M (bytes per second), not '\(use.value)'")
            }
            options.limitRate = rate
        },
        .value(
            ["--retries"], "N",
            help: "give up after N failed attempts in a row that saved < 16 KiB in all (default 5)"
        ) { options, use in
            guard let n = Int(use.value), (0...1000).contains(n) else {
                throw UsageError("--retries takes a whole number from 0 to 1000, not '\(use.value)'")
            }
            options.retries = n
        },
        .value(["--timeout"], "SECS", help: "a transfer getting < 1 KiB in SECS seconds is retried (default 30)") {
            options, use in
            options.timeout = try seconds(use)
        },
        .value(["--connect-timeout"], "SECS", help: "time allowed to connect, TLS included (default 30)") {
            options, use in
            options.connectTimeout = try seconds(use)
        },
        .value(["-H", "--header"], "'K: V'", help: "add a request header (repeatable)") { options, use in
            let text = use.value
            guard let (name, value) = Downloader.parseHeaderLine(text) else {
                throw UsageError(
                    "--header must be 'Name: value' without control characters, not \(text.debugDescription)")
            }
            guard !reservedHeaders.contains(name.lowercased()) else {
                throw UsageError("--header \(name) is set by stitch itself and cannot be overridden")
            }
            options.headers.add(name: name, value: value)
        },
        .value(
            ["--ca-cert"], "FILE", aliases: ["--cacert"],
            help: "trust the certificates in FILE (PEM) instead of the system store"
        ) { options, use in
            options.caCert = use.value
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .flag(["-k", "--insecure"], help: "do not verify TLS certificates") { options, use in
            options.insecure = true
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .value(
            ["-u", "--user"], "USER[:PASSWORD]",
            help: """
                HTTP Basic credentials for the URL's host only (not sent on a redirect
                elsewhere, never saved); without :PASSWORD it is asked for on the terminal
                """
        ) { options, use in
            let text = use.value
            let parts = text.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = parts.first, !name.isEmpty,
                !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
            else {
                // Not the value itself: it may hold a password.
                throw UsageError("-u takes USER or USER:PASSWORD (a user name, no control characters)")
            }
            options.user = (String(name), parts.count > 1 ? String(parts[1]) : nil)
        },
        .flag(["--netrc"], help: "credentials per host from ~/.netrc (-u wins for its host)") { options, use in
            options.netrc = TransportOptions.Netrc()
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .value(["--netrc-file"], "FILE", help: "credentials per host from FILE (-u wins for its host)") {
            options, use in
            guard !use.value.isEmpty else { throw UsageError("--netrc-file needs a file path") }
            options.netrc = TransportOptions.Netrc(file: use.value)
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .value(
            ["--mirror"], "URL",
            help: """
                another URL of the same file (repeatable): while the file comes over several
                connections, some fetch from the mirror, once samples of it match the first
                URL's bytes; one that differs is dropped and they go on with the first URL
                """
        ) { options, use in
            let (url, note) = CommandLineURL.assumingScheme(use.value)
            if let note { options.notes.append(note) }
            options.mirrors.append(url)
        },
        .flag(
            ["--use-advertised-mirrors"],
            help: """
                also fetch from the servers the first response names as copies of the
                file (Link: rel=duplicate, Metalink/HTTP), each once proven as --mirror is
                """
        ) { options, _ in options.useAdvertisedMirrors = true },
        .value(
            ["--load-cookies"], "FILE", aliases: ["-b"],
            help: """
                send the cookies of FILE (Netscape format, as curl -c, wget and aria2 write
                it) with each request whose domain, path and scheme they match, redirects
                included; never written anywhere
                """
        ) { options, use in
            let path = use.value
            guard !path.isEmpty else { throw UsageError("\(use.name) needs a file path") }
            let limit = 64 << 20
            guard let handle = FileHandle(forReadingAtPath: path),
                let data = try? handle.read(upToCount: limit + 1)
            else {
                if path.contains("="), !FileManager.default.fileExists(atPath: path) {
                    // curl's -b also takes the cookies themselves.
                    throw UsageError("\(use.name) takes a cookie file here; send cookies themselves with -H 'Cookie: NAME=VALUE'")
                }
                throw UsageError("cannot read the cookie file \(path)")
            }
            guard data.count <= limit else { throw UsageError("the cookie file \(path) is over 64 MiB") }
            guard let text = String(data: data, encoding: .utf8) else {
                throw UsageError("the cookie file \(path) is not UTF-8 text")
            }
            let jar = CookieJar(text: text)
            for problem in jar.problems { options.notes.append("\(path): \(problem)") }
            options.cookies = jar
        },
        .value(
            ["-x", "--proxy"], "URL",
            help: """
                send every request through the proxy at URL: http://, https://, socks5://
                (names resolved here) or socks5h:// (by the proxy), HOST:PORT; '' for
                none (the default is the environment's: http_proxy, https_proxy, ALL_PROXY,
                NO_PROXY); no credentials in URL: see --proxy-user
                """
        ) { options, use in
            if use.name == "-x", !use.value.isEmpty, use.value.allSatisfy(\.isASCII), Int(use.value) != nil {
                throw UsageError("-x is the proxy here, as curl's; for aria2c's -x N (connections) give -c N")
            }
            if TransportOptions.Proxy.hasCredentials(use.value) {
                // Not the value: it holds a password.
                throw UsageError(
                    "--proxy takes no credentials in its URL (other users can read a command line); "
                        + "give --proxy-user USER, with the password in STITCH_PROXY_PASSWORD or typed on the terminal")
            }
            do { options.proxy = try TransportOptions.Proxy(parsing: use.value) } catch {
                throw UsageError("--proxy: \(error)")
            }
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .value(
            ["--proxy-user"], "USER",
            help: """
                the proxy's user name; the password is read from STITCH_PROXY_PASSWORD, the
                netrc file's entry for the proxy's host (--netrc, --netrc-file), or asked for
                on the terminal (never on the command line, never saved)
                """
        ) { options, use in
            let name = use.value
            guard !name.isEmpty, !name.contains(":"),
                !name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
            else {
                // Not the value itself: it may hold a password.
                throw UsageError(
                    "--proxy-user takes a user name only (no ':' or control characters); the password goes in "
                        + "STITCH_PROXY_PASSWORD or is typed on the terminal")
            }
            options.proxyUser = name
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .value(
            ["--proxy-ca-cert"], "FILE", aliases: ["--proxy-cacert"],
            help: """
                check an https:// proxy's certificate against the certificates in FILE (PEM)
                instead of the system store (the servers' stay with --ca-cert)
                """
        ) { options, use in
            options.proxyCACert = use.value
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .value(
            ["--noproxy"], "LIST",
            help: """
                hosts reached directly, not through a proxy: comma-separated names (each
                with its subdomains), addresses, CIDR ranges, or '*' (instead of NO_PROXY)
                """
        ) { options, use in
            guard !use.value.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
                throw UsageError("--noproxy takes host names separated by commas, without control characters")
            }
            options.noProxy = use.value
            options.libcurlOnlyOption = options.libcurlOnlyOption ?? use.name
        },
        .flag(
            ["--overwrite"], help: "replace an existing DEST, or a partial download that cannot be resumed"
        ) { options, _ in options.overwrite = true },
        .flag(
            ["--adopt"],
            help: """
                with -o FILE: take over a partial FILE that wget -c, curl -C - or aria2c
                left, once the server proves it (a strong validator and samples of FILE
                that match); else download it again and replace FILE when complete
                """
        ) { options, _ in options.adopt = true },
        .flag(
            ["-N", "--if-newer"],
            help: """
                with DEST there: fetch the file only if the server's is newer (If-None-Match
                with the ETag DEST came with, If-Modified-Since); else leave DEST as it is
                """
        ) { options, _ in options.ifNewer = true },
        .value(
            ["-i", "--input-file"], "FILE",
            help: """
                download the URLs listed in FILE (aria2c's format: indented out=, dir=,
                checksum=, header=, split= lines; '-' reads stdin)
                """
        ) { options, use in options.inputFile = use.value },
        .value(
            ["-j", "--jobs"], "N", aliases: ["--max-concurrent-downloads"],
            help: "with several URLs or -i: downloads at once, 1-256 (default 5)"
        ) { options, use in
            guard let n = Int(use.value), (1...256).contains(n) else {
                throw UsageError("--jobs takes a whole number from 1 to 256, not '\(use.value)'")
            }
            options.jobs = n
        },
        .flag(["-q", "--quiet"], help: "no progress output") { options, _ in options.quiet = true },
        .flag(["--json"], help: "one JSON object per line on stdout (see docs/cli.md)") { options, _ in
            options.json = true
        },
        // Answered before parsing (StitchCommand.run); here so that the help lists it.
        .flag(["-h", "--help"], help: "this help") { _, _ in },
    ])

    /// `--timeout` and `--connect-timeout`: seconds, more than 0 and at most a day.
    private static func seconds(_ use: OptionUse) throws -> Double {
        guard let value = Double(use.value), value.isFinite, value > 0, value <= 86_400 else {
            throw UsageError("\(use.name) takes a number of seconds between 0 and 86400, not '\(use.value)'")
        }
        return value
    }
}
