import Foundation
import StitchTestSupport
import Testing

@testable import StitchCLI
@testable import StitchRPC
import StitchServer

/// `stitch serve --conf-path FILE`: aria2.conf's syntax, the daemon's options by their names, aria2's download
/// options as the defaults for new downloads, the command line winning, and every refusal naming its line.
@Suite struct ConfigFileTests {
    static func write(_ text: String, mode: mode_t = 0o600) throws -> (Sandbox, String) {
        let folder = try Sandbox("conf")
        let path = folder.path("aria2.conf")
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        chmod(path, mode)
        return (folder, path)
    }

    /// aria2's syntax: `#` only at the start of a line, spaces and tabs stripped, no unquoting, a bare name.
    @Test func aria2sSyntax() {
        let file = Aria2ConfigFile(text: "# comment\n\n dir = /srv/dl \r\n  # not a comment\ncontinue\nheader=X-A: \"1\"\n=x\n")
        #expect(file.entries == [
            .init(line: 3, name: "dir", value: "/srv/dl"), .init(line: 4, name: "# not a comment", value: ""),
            .init(line: 5, name: "continue", value: ""), .init(line: 6, name: "header", value: "X-A: \"1\""),
            .init(line: 7, name: "", value: "x"),
        ])
    }

    /// A typical aria2.conf: the daemon's options, download defaults, ignored BitTorrent keys; the command line's
    /// -j wins over the file's, and only what the file alone gave may be overridden by options set over RPC.
    @Test func aTypicalFileIsRead() throws {
        let (folder, path) = try Self.write("""
            dir=/srv/downloads
            enable-rpc=true
            rpc-listen-all=true
            rpc-listen-port=6801
            rpc-secret=from-the-file
            max-concurrent-downloads=7
            max-overall-download-limit=4M
            split=8
            max-tries=3
            user-agent=conf/1
            continue=true
            seed-ratio=1.0
            bt-max-peers=55
            log-level=debug
            daemon=true
            """)
        defer { folder.cleanup() }
        let options = try Serve.parse(["--conf-path", path, "-j", "2"], environment: [:])
        #expect(options.directory == "/srv/downloads" && options.secret == "from-the-file")
        #expect(options.server.addresses == ["0.0.0.0:6801", "[::]:6801"])
        #expect(options.maxConcurrentDownloads == 2, "the command line wins")
        #expect(options.rateLimit == 4 << 20 && options.connections == 8 && options.verbose)
        #expect(options.downloadDefaults == ["max-tries": "3", "user-agent": "conf/1"])
        #expect(options.commandLine == ["max-concurrent-downloads"], "only -j came from the command line")
        let note = options.notes.first ?? ""
        #expect(options.notes.count == 1 && note.contains("seed-ratio") && note.contains("daemon"), "\(note)")
        // "No limit" on the command line wins over the file's limit.
        let unlimited = try Serve.parse(["--conf-path", path, "--max-overall-download-limit", "0"], environment: [:])
        #expect(unlimited.rateLimit == nil && unlimited.commandLine == ["max-overall-download-limit"])
        // The command line's folder and listening address win too.
        let overridden = try Serve.parse(["--conf-path", path, "--dir", "/other", "--rpc-listen", "127.0.0.1:7000"], environment: [:])
        #expect(overridden.directory == "/other" && overridden.server.addresses == ["127.0.0.1:7000"])
    }

    /// Every refusal names the file and the line, before anything starts.
    @Test(arguments: [
        ("no-such-option=1", "not an option"), ("split=x", "--split"), ("max-tries=-1", "max-tries"),
        ("all-proxy=ftp://127.0.0.1:21", "all-proxy"), ("check-certificate=false", "check-certificate"),
        ("enable-rpc=false", "enable-rpc"), ("rpc-listen-all=maybe", "rpc-listen-all"), ("log-level=loud", "log-level"),
        ("max-concurrent-downloads=0", "-concurrent-downloads"),
    ])
    func refusalsNameTheLine(_ line: String, _ mentions: String) throws {
        let (folder, path) = try Self.write("dir=/srv/dl\n# a comment\n\(line)\n")
        defer { folder.cleanup() }
        do {
            _ = try Serve.parse(["--conf-path", path], environment: [:])
            Issue.record("\(line) was taken")
        } catch let error as UsageError {
            #expect(error.message.hasPrefix("\(path):3: ") && error.message.contains(mentions), "\(error.message)")
        }
    }

    /// A proxy's password (apart, or in its URL) is taken from a file only its owner can read, never from one
    /// others can, and the proxy is then every new download's default.
    @Test(arguments: ["all-proxy=http://127.0.0.1:3128\nall-proxy-user=al\nall-proxy-passwd=s3cret\n", "all-proxy=http://al:s3cret@127.0.0.1:3128\n"])
    func aProxyPasswordNeedsAPrivateFile(_ lines: String) throws {
        let (open, openPath) = try Self.write("dir=/srv/dl\n" + lines, mode: 0o644)
        defer { open.cleanup() }
        do {
            _ = try Serve.parse(["--conf-path", openPath], environment: [:])
            Issue.record("a password in a file others can read was taken")
        } catch let error as UsageError {
            #expect(error.message.contains("chmod 600") && !error.message.contains("s3cret"), "\(error.message)")
        }
        let (closed, closedPath) = try Self.write("dir=/srv/dl\n" + lines, mode: 0o600)
        defer { closed.cleanup() }
        let taken = try Serve.parse(["--conf-path", closedPath], environment: [:])
        #expect(taken.downloadDefaults["all-proxy"] != nil, "\(taken.downloadDefaults.keys.sorted())")
    }

    /// The secret is taken from a file only its owner can read, never from one others can.
    @Test func theSecretNeedsAPrivateFile() throws {
        let (folder, path) = try Self.write("dir=/srv/dl\nrpc-secret=s3cret\n", mode: 0o644)
        defer { folder.cleanup() }
        #expect(throws: UsageError.self) { _ = try Serve.parse(["--conf-path", path], environment: [:]) }
        chmod(path, 0o600)
        #expect(try Serve.parse(["--conf-path", path], environment: [:]).secret == "s3cret")
        #expect(try Serve.parse(["--conf-path", path], environment: ["STITCH_RPC_SECRET": "env"]).secret == "env")
        #expect(throws: UsageError.self) { _ = try Serve.parse(["--conf-path", folder.path("missing.conf")], environment: [:]) }
    }
}
