import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

/// Rules about where things live in the library's sources, checked on the sources themselves.
@Suite struct LayeringTests {
    static let sourcesRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Sources")
    /// The targets of the library product: the umbrella, the core (engine, storage, manager), the transport protocol
    /// and the two backends.
    static let libraryTargets = ["Stitch", "StitchCore", "StitchTransport", "StitchURLSession", "StitchCurl"]

    /// Every Swift file of these targets, with its path relative to Sources (`Stitch/Engine/Attempt.swift`) and its
    /// lines. Symbolic links are skipped (there are none; a shared source belongs in a target of its own).
    static func sources(of targets: [String] = libraryTargets) throws -> [(path: String, lines: [Substring])] {
        try targets.flatMap { target in
            let folder = sourcesRoot.appendingPathComponent(target)
            let names = try FileManager.default.subpathsOfDirectory(atPath: folder.path)
            return try names.filter { $0.hasSuffix(".swift") }.sorted().compactMap {
                name -> (path: String, lines: [Substring])? in
                let file = folder.appendingPathComponent(name)
                let isLink = (try? FileManager.default.destinationOfSymbolicLink(atPath: file.path)) != nil
                if isLink { return nil }
                let text = try String(contentsOf: file, encoding: .utf8)
                return ("\(target)/\(name)", text.split(separator: "\n", omittingEmptySubsequences: false))
            }
        }
    }

    /// No command-line flag in a library message, long (`--overwrite`) or short (`-o FILE`): errors carry a typed
    /// remedy (`DownloadError.Remedy`) that the CLI renders as a flag and a daemon in its own words. The daemon's
    /// RPC (StitchRPC) answers clients that never see the command line, so it is held to the same rule.
    @Test func noCommandLineFlagsInLibraryStrings() throws {
        let sources = try Self.sources(of: Self.libraryTargets + ["StitchRPC"])
        #expect(sources.count > 20, "found \(sources.count) sources under \(Self.sourcesRoot.path)")
        var found: [String] = []
        for (path, lines) in sources {
            for (number, line) in lines.enumerated() {
                let code = line.trimmingCharacters(in: .whitespaces)
                if code.hasPrefix("//") { continue }  // comments may name flags
                guard let quote = code.firstIndex(of: "\"") else { continue }
                if Self.namesAFlag(code[quote...]) { found.append("\(path):\(number + 1): \(code)") }
            }
        }
        #expect(found.isEmpty, "\(found.joined(separator: "\n"))")
    }

    /// Whether `text` (from a string literal's opening quote on) holds `--word`, or a lone `-x` standing as a word:
    /// after a space, a quote or a bracket and before one (so `Content-Length`, `bytes=0-99` and `-1` do not count).
    static func namesAFlag(_ text: Substring) -> Bool {
        text.range(of: #"--[a-z]"#, options: .regularExpression) != nil
            || text.range(of: #"(^|[\s"'(\[`])-[A-Za-z]($|[\s"'),.;:\]`])"#, options: .regularExpression) != nil
    }

    /// The flag finder on lines that name flags and on lines that only look alike.
    @Test(arguments: [
        (#""use -o FILE""#, true), (#""pass --overwrite to""#, true), (#""(-c 4)""#, true), (#""`-x`""#, true),
        (#""Content-Length: 5""#, false), (#""bytes=0-99""#, false), (#""-1 is the end""#, false),
        (#""a - b""#, false), (#""x-request-id""#, false), (#""re-run it""#, false),
    ])
    func theFlagFinderTellsFlagsApart(_ line: String, _ flag: Bool) {
        #expect(Self.namesAFlag(Substring(line)) == flag, "\(line)")
    }

    /// The library builds for Apple platforms in principle: no call or import of a platform's C module (`Glibc.`,
    /// `Musl.`, `Darwin.`) outside a branch whose condition names that module (`#if canImport(Glibc)`). The targets
    /// an app links on Darwin: the umbrella, the core, the transport protocol, URLSession's backend, the locks.
    @Test func platformModulesOnlyInTheirOwnBranches() throws {
        let sources = try Self.sources(of: ["Stitch", "StitchCore", "StitchTransport", "StitchURLSession", "StitchLocks"])
        #expect(sources.count > 20)
        let found = sources.flatMap { Self.platformCallsOutsideTheirBranch(path: $0.path, lines: $0.lines) }
        #expect(found.isEmpty, "\(found.joined(separator: "\n"))")
    }

    /// The scanner finds a qualified call outside its branch, and none inside one (nested and `#elseif` included).
    @Test func thePlatformScannerSeesBranches() {
        let source: [Substring] = [
            "#if canImport(Glibc)", "import Glibc", "let a = Glibc.write(1, p, 2)", "#elseif canImport(Darwin)",
            "let b = Darwin.write(1, p, 2)", "let c = Glibc.read(1, p, 2)", "#else", "let d = Musl.read(1, p, 2)",
            "#endif", "#if os(Linux)", "#if canImport(Musl)", "let e = Musl.link(a, b)", "#endif", "#endif",
            "let f = Glibc.link(a, b)  // outside every branch", "// Glibc.write in a comment",
        ]
        #expect(
            Self.platformCallsOutsideTheirBranch(path: "X.swift", lines: source)
                == ["X.swift:6: let c = Glibc.read(1, p, 2)", "X.swift:8: let d = Musl.read(1, p, 2)",
                    "X.swift:15: let f = Glibc.link(a, b)  // outside every branch"])
    }

    /// Lines of `lines` that name `Glibc.`, `Musl.` or `Darwin.` (in code, not in a `//` comment) without a
    /// condition in force that names `canImport` of that module.
    static func platformCallsOutsideTheirBranch(path: String, lines: [Substring]) -> [String] {
        let modules = ["Glibc", "Musl", "Darwin"]
        var conditions: [String] = []  // the condition of each open #if's branch now in force ("" after #else)
        var found: [String] = []
        for (number, line) in lines.enumerated() {
            let code = line.trimmingCharacters(in: .whitespaces)
            if code.hasPrefix("#if ") {
                conditions.append(String(code.dropFirst(4)))
            } else if code.hasPrefix("#elseif "), !conditions.isEmpty {
                conditions[conditions.count - 1] = String(code.dropFirst(8))
            } else if code.hasPrefix("#else"), !conditions.isEmpty {
                conditions[conditions.count - 1] = ""
            } else if code.hasPrefix("#endif"), !conditions.isEmpty {
                conditions.removeLast()
            } else if !code.hasPrefix("//") {
                let beforeComment = code.range(of: "//").map { code[..<$0.lowerBound] } ?? code[...]
                for module in modules where beforeComment.contains("\(module).") || beforeComment.hasPrefix("import \(module)") {
                    if !conditions.contains(where: { $0.contains("canImport(\(module))") }) {
                        found.append("\(path):\(number + 1): \(code)")
                    }
                }
            }
        }
        return found
    }

    /// One lock for every target: StitchLocks' `Locked` (a pthread mutex ThreadSanitizer sees), never
    /// Synchronization's `Mutex` (which it cannot see on Linux, so a sanitized run would need other lock code than a
    /// release build); and no source shared by symbolic links between targets.
    @Test func everyTargetLocksWithTheLockModule() throws {
        let targets = try FileManager.default.contentsOfDirectory(atPath: Self.sourcesRoot.path).filter {
            !$0.hasPrefix("C") && !$0.hasPrefix(".")
        }
        let testsRoot = Self.sourcesRoot.deletingLastPathComponent().appendingPathComponent("Tests")
        var found: [String] = []
        var links: [String] = []
        var files = 0
        for root in [Self.sourcesRoot, testsRoot] {
            let enumerator = FileManager.default.enumerator(atPath: root.path)
            while let name = enumerator?.nextObject() as? String {
                guard name.hasSuffix(".swift") else { continue }
                let path = root.appendingPathComponent(name).path
                if (try? FileManager.default.destinationOfSymbolicLink(atPath: path)) != nil {
                    links.append(name)
                    continue
                }
                files += 1
                let text = try String(contentsOfFile: path, encoding: .utf8)
                for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                    let code = line.trimmingCharacters(in: .whitespaces)
                    if code.hasPrefix("//") { continue }
                    if code.range(of: #"\bMutex\s*[<(]"#, options: .regularExpression) != nil {
                        found.append("\(name):\(number + 1): \(code)")
                    }
                }
            }
        }
        #expect(targets.contains("StitchLocks") && files > 100, "\(targets), \(files) files")
        #expect(found.isEmpty, "\(found.joined(separator: "\n"))")
        #expect(links.isEmpty, "\(links)")
    }

    /// Storage owns every file operation: no file-system call (libc's, Foundation's file APIs, SQLite's open)
    /// outside `Stitch/Storage/` (the transport and its backends included), so that what is on disk is read one way (`PartialDownload`) and every durability
    /// argument is made in one place.
    @Test func fileOperationsStayInStorage() throws {
        let calls = [
            "open", "openat", "creat", "close", "unlink", "unlinkat", "rename", "renameat", "link", "symlink",
            "access", "stat", "lstat", "fstat", "mkdir", "rmdir", "ftruncate", "truncate", "fsync", "fdatasync",
            "pread", "pwrite", "Glibc\\.read", "Glibc\\.write", "flock", "fallocate", "posix_fallocate", "getxattr", "setxattr",
            "fgetxattr", "fsetxattr", "mmap", "opendir", "readdir", "realpath", "chmod", "fopen", "sqlite3_open_v2",
        ]
        // A call as a free function (or through the `Glibc.` module name), not a method such as `store.read(`,
        // nor a declaration (`func close()`, `case write(Errno)`). Plain `read(` and `write(` are left out: the
        // sinks' own `write(bytes)` would match, and the library calls libc's as `Glibc.read` anyway.
        let pattern = #"(^|[^\w.])(?<!func )(?<!case )(Glibc\.)?("# + calls.joined(separator: "|") + #")\("#
        let foundation = ["FileManager", "FileHandle"]
        var found: [String] = []
        var scanned = 0
        for (path, lines) in try Self.sources() where !path.hasPrefix("StitchCore/Storage/") {
            scanned += 1
            for (number, line) in lines.enumerated() {
                let code = line.trimmingCharacters(in: .whitespaces)
                if code.hasPrefix("//") { continue }
                if code.range(of: pattern, options: .regularExpression) != nil
                    || foundation.contains(where: { code.contains($0) })
                {
                    found.append("\(path):\(number + 1): \(code)")
                }
            }
        }
        #expect(scanned > 10)
        #expect(found.isEmpty, "\(found.joined(separator: "\n"))")
        // The pattern sees what it should, and not methods of the same name.
        #expect("let fd = open(path, O_RDONLY)".range(of: pattern, options: .regularExpression) != nil)
        #expect("n = Glibc.read(fd, p, 1)".range(of: pattern, options: .regularExpression) != nil)
        #expect("store.read(into: buffer, at: 0)".range(of: pattern, options: .regularExpression) == nil)
        #expect("public func close() async {".range(of: pattern, options: .regularExpression) == nil)
    }

    /// The engine, the manager, storage and the transport protocol know no backend: no libcurl type, option or
    /// constant outside the libcurl backend (the `StitchCurl` target), and no URLSession (Foundation's, or the
    /// backend's types and module) outside the URLSession backend, except in the list of backends a build has
    /// (`Transport/TransportBackend.swift`, where the `Libcurl` trait picks the default) and the re-exports
    /// (`Transport/Exports.swift`). So a backend fits without touching the engine, and a build without libcurl
    /// leaves nothing behind. The package graph keeps the core (`StitchCore`) from importing a backend (it does not
    /// depend on one: ``theCoreDependsOnNoBackend()``); this scan also catches Foundation's URLSession, which
    /// needs no import of ours.
    @Test func backendsStayInTheirTargets() throws {
        let exempt = ["Stitch/Transport/TransportBackend.swift", "Stitch/Transport/Exports.swift"]
        var found: [String] = []
        var scanned = 0
        for (path, lines) in try Self.sources(of: ["Stitch", "StitchCore", "StitchTransport", "StitchURLSession"])
        where !exempt.contains(path) {
            scanned += 1
            for (number, line) in lines.enumerated() where Self.namesABackend(line, in: path) {
                found.append("\(path):\(number + 1): \(line.trimmingCharacters(in: .whitespaces))")
            }
        }
        #expect(scanned > 40)
        #expect(found.isEmpty, "\(found.joined(separator: "\n"))")
        // The check sees a violation: the backends' own lines, were they in the engine, and the usual slips.
        let curl = try Self.sources(of: ["StitchCurl"]).first { $0.path == "StitchCurl/CurlTransport.swift" }
        let curlLines = try #require(curl?.lines)
        #expect(curlLines.count { Self.namesABackend($0, in: "Stitch/Engine/X.swift") } > 50)
        let urlSession = try Self.sources(of: ["StitchURLSession"])
            .first { $0.path == "StitchURLSession/URLSessionTransport.swift" }
        let urlSessionLines = try #require(urlSession?.lines)
        #expect(urlSessionLines.count { Self.namesABackend($0, in: "Stitch/Engine/X.swift") } > 10)
        #expect(urlSessionLines.count { Self.namesABackend($0, in: "StitchURLSession/URLSessionTransport.swift") } == 0)
        for slip in [
            "let t = URLSessionTransport.shared", "import StitchURLSession", "let s = URLSession(configuration: c)",
            "if transport is CurlTransport {", "import StitchCurl", "curl_easy_setopt(h, CURLOPT_URL, u)",
            "func handleEvents(forBackgroundURLSession id: String, session: URLSession) {",
        ] {
            #expect(Self.namesABackend(Substring(slip), in: "Stitch/Engine/X.swift"), "\(slip)")
        }
        #expect(!Self.namesABackend("// the URLSession backend's windows", in: "Stitch/Engine/X.swift"))
        #expect(!Self.namesABackend("public func handleEvents(forBackgroundURLSession id: String) {", in: "Stitch/X.swift"))
        #expect(!Self.namesABackend(#"note("left by wget -c or curl -C -")"#, in: "Stitch/Engine/X.swift"))
    }

    /// The core (engine, storage, manager) depends on the transport protocol and on no backend: in Package.swift its
    /// target lists neither `StitchCurl` nor `StitchURLSession`, so none of its files can import one. The umbrella
    /// `Stitch` brings them and picks the default.
    @Test func theCoreDependsOnNoBackend() throws {
        let manifest = try String(
            contentsOf: Self.sourcesRoot.deletingLastPathComponent().appendingPathComponent("Package.swift"),
            encoding: .utf8)
        func dependencies(of target: String) throws -> Substring {
            let start = try #require(
                manifest.range(of: #"name:\s*"\#(target)",\s*dependencies:"#, options: .regularExpression),
                "no target \(target)")
            let rest = manifest[start.upperBound...]
            let end = rest.range(of: "swiftSettings:")?.lowerBound ?? rest.endIndex
            return rest[..<end]
        }
        let core = try dependencies(of: "StitchCore")
        #expect(core.contains("\"StitchTransport\""), "\(core)")
        for backend in ["StitchCurl", "StitchURLSession", "\"Stitch\""] {
            #expect(!core.contains(backend), "StitchCore depends on \(backend): \(core)")
        }
        // The check sees a dependency where there is one.
        let umbrella = try dependencies(of: "Stitch")
        #expect(umbrella.contains("StitchURLSession") && umbrella.contains("\"StitchCore\""), "\(umbrella)")
    }

    /// Whether a line of code (not a comment; string literals may name the curl tool to the user, as `--adopt`'s
    /// "left by wget -c or curl -C -") in the file at `path` names a backend it has no business with: anything
    /// curl outside `StitchCurl/`, anything URLSession outside `StitchURLSession/`.
    static func namesABackend(_ line: Substring, in path: String) -> Bool {
        let code = line.trimmingCharacters(in: .whitespaces)
        if code.hasPrefix("//") { return false }
        let rest = code.replacingOccurrences(of: #""(?:[^"\\]|\\.)*""#, with: "\"\"", options: .regularExpression)
        if !path.hasPrefix("StitchCurl/"), rest.range(of: "curl", options: .caseInsensitive) != nil { return true }
        // Apple's name for a relaunch's events (`application(_:handleEventsForBackgroundURLSession:…)`), which
        // `BackgroundDownloads.handleEvents(forBackgroundURLSession:completion:)` mirrors, names no backend.
        let unlabelled = rest.replacingOccurrences(of: "forBackgroundURLSession", with: "")
        if !path.hasPrefix("StitchURLSession/"), unlabelled.contains("URLSession") { return true }
        return false
    }

    /// Remedies render in general words in the library and in the CLI's words there (checked in the CLI tests).
    @Test func remediesHaveGeneralWords() {
        let error = DownloadError(.destinationExists, "/x already exists", remedy: .overwrite(.replace))
        #expect(error.description == "/x already exists; allow overwriting to replace it")
        #expect(error.message == "/x already exists")
        let rerun = DownloadError(.cancelled, "interrupted; 5 bytes saved", resumable: true, remedy: .rerun(.resume))
        #expect(rerun.description == "interrupted; 5 bytes saved; run it again to resume")
    }
}
