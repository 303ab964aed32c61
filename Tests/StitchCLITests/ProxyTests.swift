import Foundation
import Glibc
import Stitch
import StitchRPC
import StitchTestSupport
import Testing

/// `stitch get` through real proxies from Debian (issue 36): tinyproxy for HTTP (and CONNECT for HTTPS), microsocks
/// for SOCKS5, nginx behind them. The proxy's log shows the download went through it; the file is byte-exact; a
/// proxy that refuses, wants credentials or dies mid-body gives one error line or a resumed, exact file.
@Suite(
    "stitch through proxies",
    .enabled(if: StitchUnderTest.hasLibcurl, StitchUnderTest.libcurlOnly),
    .enabled(if: LoopbackProxy.Kind.allCases.allSatisfy(LoopbackProxy.isInstalled), "tinyproxy and microsocks"))
struct ProxyTests {
    static func start(
        _ kind: LoopbackProxy.Kind, in sandbox: Sandbox, port: Int? = nil,
        credentials: (user: String, password: String)? = nil
    ) async throws -> LoopbackProxy {
        let folder = sandbox.path("proxy")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        return try await offload { try LoopbackProxy(kind, in: folder, port: port, credentials: credentials) }
    }

    /// Every proxy kind and scheme, for an http:// and an https:// URL: the file is exact, and the proxy carried it.
    @Test(arguments: [
        (LoopbackProxy.Kind.http, "http"), (.socks, "socks5"), (.socks, "socks5h"),
    ])
    func downloadsThroughTheProxy(_ kind: LoopbackProxy.Kind, _ scheme: String) async throws {
        let nginx = try await sharedNginx()
        let expected = try #require(readBytes(nginx.documentRoot + "/small.bin"))
        let sandbox = try Sandbox("proxy")
        defer { sandbox.cleanup() }
        let proxy = try await Self.start(kind, in: sandbox)
        defer { proxy.stop() }
        let plain = try await sandbox.run([
            "get", nginx.httpURL("small.bin"), "-o", "plain.bin", "--proxy", proxy.url(scheme),
        ])
        #expect(plain.status == 0, "\(plain)")
        #expect(readBytes(sandbox.path("plain.bin")) == expected)
        let tls = try await sandbox.run([
            "get", nginx.httpsURL("small.bin"), "-o", "tls.bin", "--ca-cert", nginx.caCertificate, "-x",
            proxy.url(scheme),
        ])
        #expect(tls.status == 0, "\(tls)")
        #expect(readBytes(sandbox.path("tls.bin")) == expected)
        let log = proxy.logText
        #expect(log.contains(":\(nginx.httpPort)"), "the proxy did not carry the http request: \(log)")
        #expect(log.contains(":\(nginx.httpsPort)"), "the proxy did not carry the https tunnel: \(log)")
    }

    /// The environment's proxy is used when no --proxy is given; NO_PROXY, --noproxy and --proxy '' go direct.
    @Test func theEnvironmentsProxyAndTheWaysAroundIt() async throws {
        let nginx = try await sharedNginx()
        let expected = try #require(readBytes(nginx.documentRoot + "/small.bin"))
        let sandbox = try Sandbox("proxy")
        defer { sandbox.cleanup() }
        let proxy = try await Self.start(.http, in: sandbox)
        defer { proxy.stop() }
        let url = nginx.httpURL("small.bin")
        func carried() -> Int { proxy.logText.components(separatedBy: "small.bin").count - 1 }

        let viaEnvironment = try await sandbox.run(
            ["get", url, "-o", "env.bin"], environment: ["http_proxy": proxy.url()])
        #expect(viaEnvironment.status == 0, "\(viaEnvironment)")
        #expect(readBytes(sandbox.path("env.bin")) == expected)
        let afterEnvironment = carried()
        #expect(afterEnvironment >= 1, "http_proxy was not used: \(proxy.logText)")

        let direct: [([String], [String: String])] = [
            (["-o", "no-proxy.bin"], ["http_proxy": proxy.url(), "NO_PROXY": "127.0.0.1"]),
            (["-o", "noproxy.bin", "--noproxy", "127.0.0.1"], ["http_proxy": proxy.url()]),
            (["-o", "flag-noproxy.bin", "--proxy", proxy.url(), "--noproxy", "*"], [:]),
            (["-o", "empty.bin", "--proxy", ""], ["http_proxy": proxy.url(), "ALL_PROXY": proxy.url()]),
        ]
        for (arguments, environment) in direct {
            let result = try await sandbox.run(["get", url] + arguments, environment: environment)
            #expect(result.status == 0, "\(arguments) \(environment): \(result)")
            #expect(readBytes(sandbox.path(arguments[1])) == expected)
        }
        #expect(carried() == afterEnvironment, "a direct download went through the proxy: \(proxy.logText)")

        // The flag wins over the environment: a dead proxy in the environment is not tried.
        let dead = try LoopbackProxy.freePort()
        let flagWins = try await sandbox.run(
            ["get", url, "-o", "flag.bin", "--proxy", proxy.url()],
            environment: ["http_proxy": "http://127.0.0.1:\(dead)"])
        #expect(flagWins.status == 0, "\(flagWins)")
        #expect(carried() >= afterEnvironment + 1)
    }

    /// A proxy nobody listens on: one error line naming the proxy, exit 1, nothing left behind.
    @Test func aProxyThatRefusesTheConnection() async throws {
        let nginx = try await sharedNginx()
        let sandbox = try Sandbox("proxy")
        defer { sandbox.cleanup() }
        let dead = try LoopbackProxy.freePort()
        let result = try await sandbox.run(
            [
                "get", nginx.httpURL("small.bin"), "-o", "out.bin", "--proxy", "http://127.0.0.1:\(dead)", "--retries",
                "0",
            ])
        #expect(result.status == 1, "\(result)")
        let last = try #require(errorLines(result).last)
        #expect(last.contains("proxy http://127.0.0.1:\(dead)") && last.contains("refused"), "\(result)")
        #expect(sandbox.entries().filter { $0 != "proxy" }.isEmpty, "\(sandbox.entries())")
    }

    /// A proxy that asks for credentials: without them, HTTP 407 said as the proxy's (for http:// and for the tunnel
    /// of https://), exit 1; with --proxy-user and the password from the environment, the exact file. The password
    /// never appears in the output, and on the command line it is refused before anything starts.
    @Test(arguments: [LoopbackProxy.Kind.http, .socks])
    func aProxyThatWantsCredentials(_ kind: LoopbackProxy.Kind) async throws {
        let nginx = try await sharedNginx()
        let expected = try #require(readBytes(nginx.documentRoot + "/small.bin"))
        let sandbox = try Sandbox("proxy")
        defer { sandbox.cleanup() }
        let password = "pw-\(UInt32.random(in: 1_000...9_999))"
        let proxy = try await Self.start(kind, in: sandbox, credentials: ("alice", password))
        defer { proxy.stop() }
        let urls = [nginx.httpURL("small.bin"), nginx.httpsURL("small.bin")]
        for (index, url) in urls.enumerated() {
            let tls = ["--ca-cert", nginx.caCertificate]
            let without = try await sandbox.run(["get", url, "-o", "no\(index).bin", "--proxy", proxy.url()] + tls)
            #expect(without.status == 1, "\(without)")
            let said = errorLines(without).last ?? ""
            if kind == .http {
                #expect(said.contains("407") && said.contains("credentials"), "\(without)")
            } else {
                #expect(said.contains("proxy"), "\(without)")
            }
            let wrong = try await sandbox.run(
                ["get", url, "-o", "wrong\(index).bin", "--proxy", proxy.url(), "--proxy-user", "alice"] + tls,
                environment: ["STITCH_PROXY_PASSWORD": "not-it"])
            #expect(wrong.status == 1, "\(wrong)")
            let with = try await sandbox.run(
                ["get", url, "-o", "yes\(index).bin", "--proxy", proxy.url(), "--proxy-user", "alice"] + tls,
                environment: ["STITCH_PROXY_PASSWORD": password])
            #expect(with.status == 0, "\(with)")
            #expect(readBytes(sandbox.path("yes\(index).bin")) == expected)
            for result in [without, wrong, with] {
                #expect(!result.stderr.contains(password) && !result.stdout.contains(password), "\(result)")
            }
        }
        let inURL = try await sandbox.run([
            "get", urls[0], "-o", "x.bin", "--proxy", "http://alice:\(password)@127.0.0.1:\(proxy.port)",
        ])
        #expect(inURL.status == 64 && inURL.stderr.contains("--proxy-user"), "\(inURL)")
        #expect(!inURL.stderr.contains(password))
        let inUser = try await sandbox.run([
            "get", urls[0], "-o", "x.bin", "--proxy", proxy.url(), "--proxy-user", "alice:\(password)",
        ])
        #expect(inUser.status == 64 && !inUser.stderr.contains(password), "\(inUser)")
        // The password from a netrc file's entry for the proxy's host.
        let netrc = "machine 127.0.0.1\n  login alice\n  password \(password)\n"
        try Data(netrc.utf8).write(to: URL(fileURLWithPath: sandbox.path("netrc")))
        let fromNetrc = try await sandbox.run([
            "get", urls[0], "-o", "netrc.bin", "--proxy", proxy.url(), "--proxy-user", "alice", "--netrc-file",
            sandbox.path("netrc"),
        ])
        #expect(fromNetrc.status == 0 && readBytes(sandbox.path("netrc.bin")) == expected, "\(fromNetrc)")
        let noPassword = try await sandbox.run([
            "get", urls[0], "-o", "x.bin", "--proxy", proxy.url(), "--proxy-user", "alice",
        ])
        #expect(noPassword.status == 64 && noPassword.stderr.contains("STITCH_PROXY_PASSWORD"), "\(noPassword)")
        #expect(!fileExists(sandbox.path("x.bin")))
    }

    /// `--proxy-user` without `--proxy` goes to the environment's proxy (as `curl -U`): the file through tinyproxy
    /// with its credentials; NO_PROXY still honoured; with no proxy in the environment, or `--proxy ''`, exit 64.
    @Test func theProxyUserGoesToTheEnvironmentsProxy() async throws {
        let nginx = try await sharedNginx()
        let expected = try #require(readBytes(nginx.documentRoot + "/small.bin"))
        let sandbox = try Sandbox("proxy")
        defer { sandbox.cleanup() }
        let password = "pw-\(UInt32.random(in: 1_000...9_999))"
        let proxy = try await Self.start(.http, in: sandbox, credentials: ("alice", password))
        defer { proxy.stop() }
        let url = nginx.httpURL("small.bin")
        func carried() -> Int { proxy.logText.components(separatedBy: "small.bin").count - 1 }

        let through = try await sandbox.run(
            ["get", url, "-o", "env.bin", "--proxy-user", "alice"],
            environment: ["http_proxy": proxy.url(), "STITCH_PROXY_PASSWORD": password])
        #expect(through.status == 0, "\(through)")
        #expect(readBytes(sandbox.path("env.bin")) == expected)
        let after = carried()
        #expect(after >= 1, "the environment's proxy was not used: \(proxy.logText)")
        #expect(!through.stderr.contains(password) && !through.stdout.contains(password))

        let bypassed = try await sandbox.run(
            ["get", url, "-o", "direct.bin", "--proxy-user", "alice"],
            environment: ["http_proxy": proxy.url(), "NO_PROXY": "127.0.0.1", "STITCH_PROXY_PASSWORD": password])
        #expect(bypassed.status == 0 && readBytes(sandbox.path("direct.bin")) == expected, "\(bypassed)")
        #expect(carried() == after, "NO_PROXY was not honoured: \(proxy.logText)")

        let none = try await sandbox.run(
            ["get", url, "-o", "x.bin", "--proxy-user", "alice"], environment: ["STITCH_PROXY_PASSWORD": password])
        #expect(none.status == 64 && none.stderr.contains("http_proxy"), "\(none)")
        let direct = try await sandbox.run(["get", url, "-o", "x.bin", "--proxy", "", "--proxy-user", "alice"])
        #expect(direct.status == 64, "\(direct)")
        #expect(!fileExists(sandbox.path("x.bin")))
    }

    /// Killed mid-body, the rerun through the proxy resumes with Range and If-Range and ends byte-exact; a proxy that
    /// dies mid-body and comes back is retried within the run, which resumes and ends byte-exact.
    @Test(arguments: LoopbackProxy.Kind.allCases)
    func resumesThroughTheProxy(_ kind: LoopbackProxy.Kind) async throws {
        let nginx = try await sharedNginx()
        let name = "proxy-resume-\(UUID().uuidString).bin"
        let bytes = ServedFile.randomBytes(count: 4 << 20, seed: 36)
        try nginx.publish(name, bytes: bytes)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + name) }
        let sandbox = try Sandbox("proxy")
        defer { sandbox.cleanup() }
        var proxy = try await Self.start(kind, in: sandbox)
        defer { proxy.stop() }
        let arguments = ["get", nginx.slowURL(name), "-o", "out.bin", "--proxy", proxy.url()]

        let first = try sandbox.start(arguments)
        let written = await waitForBytes(1 << 20, while: first, onReach: { _ in first.kill() }) {
            fileSize(sandbox.path("out.bin.part"))
        }
        first.kill()
        let killed = await first.wait()
        try #require(written != nil && killed.signal == SIGKILL, "not killed mid-way: \(killed)")
        // The proxy dies mid-body and comes back. The rerun is stopped (SIGSTOP) while the proxy is killed and a new
        // one takes its port, and continued only once the new one accepts connections: the retry after the broken
        // body finds it listening whatever the machine's load, with no bet on how long a backoff lasts. Both signals
        // go from the thread that saw the bytes: a proxy still alive while the test's task waits for a thread (under
        // the whole suite's load) would fill the stopped rerun's socket with the rest of the file, and the body would
        // never break.
        let rerun = try sandbox.start(arguments)
        // Mid-body again (past what the first run kept).
        let kept = fileSize(sandbox.path("out.bin.part"))
        let port = proxy.port
        let dying = proxy
        let reached = await waitForBytes(
            kept + (1 << 20), while: rerun,
            onReach: { _ in
                rerun.send(SIGSTOP)
                dying.kill()
            }
        ) {
            fileSize(sandbox.path("out.bin.part"))
        }
        guard reached != nil else {
            rerun.send(SIGCONT)
            let ended = await rerun.wait()
            Issue.record("the rerun ended before the proxy was killed: \(ended)")
            return
        }
        do {
            proxy = try await Self.start(kind, in: sandbox, port: port)
        } catch {
            rerun.send(SIGCONT)
            _ = await rerun.wait()
            throw error
        }
        rerun.send(SIGCONT)
        let result = await rerun.wait()
        #expect(result.status == 0, "\(result)")
        #expect(result.stderr.contains("resuming at"), "\(result)")
        #expect(readBytes(sandbox.path("out.bin")) == bytes)
        var ranged: [String] = []
        _ = await waitUntil {
            ranged = nginx.accessLogLines(containing: name).filter { $0.contains("range=\"bytes=") }
            return ranged.count >= 2
        }
        #expect(ranged.count >= 2, "\(nginx.accessLogLines(containing: name))")
        for line in ranged {
            #expect(line.contains("if_range=\"\\x22"), "If-Range carries the ETag: \(line)")
        }
    }

    /// `-i FILE` names a proxy per download (aria2's `all-proxy` and friends), over the command line's: one download
    /// through a proxy with credentials from the list, one direct (`all-proxy=` empty) though `--proxy` names a dead
    /// proxy, one through the command line's. Each file exact, each proxy carrying only its own.
    @Test func anInputListNamesAProxyPerDownload() async throws {
        let nginx = try await sharedNginx()
        let expected = try #require(readBytes(nginx.documentRoot + "/small.bin"))
        let sandbox = try Sandbox("proxy")
        defer { sandbox.cleanup() }
        let password = "pw-\(UInt32.random(in: 1_000...9_999))"
        let guarded = try await Self.start(.http, in: sandbox, credentials: ("alice", password))
        defer { guarded.stop() }
        let socks = try await Self.start(.socks, in: sandbox)
        defer { socks.stop() }
        let url = nginx.httpURL("small.bin")
        let list = """
            \(url)
              out=guarded.bin
              all-proxy=\(guarded.url())
              all-proxy-user=alice
              all-proxy-passwd=\(password)
            \(url)
              out=direct.bin
              all-proxy=
            \(url)
              out=socks.bin
              http-proxy=\(socks.url("socks5"))

            """
        try Data(list.utf8).write(to: URL(fileURLWithPath: sandbox.path("list.txt")))
        let dead = try LoopbackProxy.freePort()
        let result = try await sandbox.run([
            "get", "-i", sandbox.path("list.txt"), "-d", sandbox.path("out"), "--proxy", "http://127.0.0.1:\(dead)",
        ])
        #expect(result.status == 0, "\(result)")
        for name in ["guarded.bin", "direct.bin", "socks.bin"] {
            #expect(readBytes(sandbox.path("out/" + name)) == expected, "\(name)")
        }
        // At least once each (a retried request counts again), and each proxy only its own downloads.
        #expect(guarded.logText.contains("small.bin"), "\(guarded.logText)")
        #expect(socks.logText.contains(":\(nginx.httpPort)"), "\(socks.logText)")
        #expect(!result.stderr.contains(password) && !result.stdout.contains(password))
    }

    /// The daemon: aria2's global `all-proxy` with its user and password (the password shown as the placeholder,
    /// never kept in the catalog), and a download's own `all-proxy` over it; each download byte-exact through its
    /// proxy.
    @Test func theDaemonTakesAria2sProxyOptions() async throws {
        let nginx = try await sharedNginx()
        let expected = try #require(readBytes(nginx.documentRoot + "/small.bin"))
        let sandbox = try Sandbox("proxy")
        defer { sandbox.cleanup() }
        let password = "pw-\(UInt32.random(in: 1_000...9_999))"
        let guarded = try await Self.start(.http, in: sandbox, credentials: ("alice", password))
        defer { guarded.stop() }
        let socks = try await Self.start(.socks, in: sandbox)
        defer { socks.stop() }
        let daemon = try await ServedDaemon(directory: sandbox.path("dl"), sandbox: sandbox)
        #expect(
            try daemon.result("aria2.changeGlobalOption", [
                .object([
                    ("all-proxy", .string(guarded.url())), ("all-proxy-user", .string("alice")),
                    ("all-proxy-passwd", .string(password)),
                ])
            ]) == .string("OK"))
        let global = try daemon.result("aria2.getGlobalOption")
        #expect(global.text("all-proxy") == guarded.url() && global.text("all-proxy-passwd") == "(hidden)")
        let first = try #require(
            try daemon.result("aria2.addUri", [.array([.string(nginx.httpURL("small.bin"))]), .object([("out", .string("a.bin"))])]).string)
        let second = try #require(
            try daemon.result("aria2.addUri", [
                .array([.string(nginx.httpURL("small.bin"))]),
                .object([("out", .string("b.bin")), ("all-proxy", .string(socks.url("socks5")))]),
            ]).string)
        for gid in [first, second] {
            let done = try await daemon.waitFor(gid) { ["complete", "error"].contains($0.text("status")) }
            #expect(done.text("status") == "complete", "\(done)")
        }
        #expect(readBytes(sandbox.path("dl/a.bin")) == expected)
        #expect(readBytes(sandbox.path("dl/b.bin")) == expected)
        #expect(guarded.logText.contains("small.bin"), "\(guarded.logText)")
        #expect(socks.logText.contains(":\(nginx.httpPort)"), "\(socks.logText)")
        let options = try daemon.result("aria2.getOption", [.string(first)])
        #expect(options.text("all-proxy-passwd") == "(hidden)" && options.text("all-proxy-user") == "alice")
        // The default's credentials stay with the default proxy: a proxy a caller names never gets them.
        let own = try daemon.result("aria2.getOption", [.string(second)])
        #expect(own.text("all-proxy") == socks.url("socks5") && own.text("all-proxy-user") == nil, "\(own)")
        #expect(own.text("all-proxy-passwd") == nil)
        let stopped = await daemon.stop()
        #expect(!stopped.stderr.contains(password) && !stopped.stdout.contains(password))
        // Nothing the daemon keeps (the catalog and its log, state files) holds the password.
        let kept = FileManager.default.enumerator(atPath: sandbox.path("dl"))?.compactMap { $0 as? String } ?? []
        #expect(kept.contains { $0.hasSuffix("catalog.sqlite3") }, "\(kept)")
        for name in kept {
            let bytes = FileManager.default.contents(atPath: sandbox.path("dl/" + name)) ?? Data()
            #expect(!String(decoding: bytes, as: UTF8.self).contains(password), "\(name) holds the password")
        }
    }
}

/// `stitch get` through squid (issue 36): a caching proxy as companies run it, reached over TLS (`--proxy https://`)
/// with a certificate of its own CA (`--proxy-ca-cert`), for http:// URLs (squid fetches them) and https:// URLs (a
/// tunnel inside the TLS to the proxy); and a download killed mid-body resumed through it, byte-exact.
@Suite(
    "stitch through squid",
    .enabled(if: StitchUnderTest.hasLibcurl, StitchUnderTest.libcurlOnly),
    .enabled(if: SquidProxy.isInstalled, "squid-openssl and openssl"))
struct SquidProxyTests {
    static func start() async throws -> SquidProxy {
        try await offload { try SquidProxy() }
    }

    @Test func aTLSProxyIsCheckedAgainstItsOwnCA() async throws {
        let nginx = try await sharedNginx()
        let expected = try #require(readBytes(nginx.documentRoot + "/small.bin"))
        let sandbox = try Sandbox("squid")
        defer { sandbox.cleanup() }
        let squid = try await Self.start()
        defer { squid.stop() }
        let trust = ["--proxy-ca-cert", squid.certificate]

        let plain = try await sandbox.run(
            ["get", nginx.httpURL("small.bin"), "-o", "plain.bin", "--proxy", squid.url(tls: true)] + trust)
        #expect(plain.status == 0, "\(plain)")
        #expect(readBytes(sandbox.path("plain.bin")) == expected)
        // Squid logs a request once it has ended on its side, which may be after the client has the file.
        let fetched = await waitUntil { squid.accessLog.contains("GET http://127.0.0.1:\(nginx.httpPort)/small.bin") }
        #expect(fetched, "\(squid.accessLog)")

        let tunnel = try await sandbox.run(
            [
                "get", nginx.httpsURL("small.bin"), "-o", "tunnel.bin", "--proxy", squid.url(tls: true), "--ca-cert",
                nginx.caCertificate,
            ] + trust)
        #expect(tunnel.status == 0, "\(tunnel)")
        #expect(readBytes(sandbox.path("tunnel.bin")) == expected)
        let tunnelled = await waitUntil {
            squid.accessLog.split(separator: "\n").contains { $0.contains(" CONNECT ") && $0.contains(":\(nginx.httpsPort) ") }
        }
        #expect(tunnelled, "\(squid.accessLog)")

        // The environment's https:// proxy is checked against --proxy-ca-cert too.
        let fromEnvironment = try await sandbox.run(
            ["get", nginx.httpURL("small.bin"), "-o", "env.bin"] + trust,
            environment: ["http_proxy": squid.url(tls: true)])
        #expect(fromEnvironment.status == 0, "\(fromEnvironment)")
        #expect(readBytes(sandbox.path("env.bin")) == expected)

        // Not trusted (the server's --ca-cert is not the proxy's): one line naming the proxy, nothing sent through
        // it, nothing left behind.
        func carried() -> Int {
            squid.accessLog.split(separator: "\n").filter { $0.contains(" GET ") || $0.contains(" CONNECT ") }.count
        }
        _ = await waitUntil { carried() >= 3 }
        let before = carried()
        #expect(before == 3, "\(squid.accessLog)")
        for (name, extra) in [("untrusted.bin", [String]()), ("servers-ca.bin", ["--ca-cert", squid.certificate])] {
            let untrusted = try await sandbox.run(
                ["get", nginx.httpURL("small.bin"), "-o", name, "--proxy", squid.url(tls: true), "--retries", "0"]
                    + extra)
            #expect(untrusted.status == 1, "\(untrusted)")
            let said = errorLines(untrusted)
            #expect(said.count == 1 && said[0].contains("proxy \(squid.url(tls: true))"), "\(untrusted)")
            #expect(said.first?.contains("the proxy's own certificate") ?? false, "\(untrusted)")
            #expect(!(said.first?.contains("(server ") ?? true), "the proxy's failure said as the server's: \(untrusted)")
            #expect(!fileExists(sandbox.path(name)) && !fileExists(sandbox.path(name + ".part")))
        }
        #expect(carried() == before, "a request went through an untrusted proxy: \(squid.accessLog)")

        // https:// given for a port that speaks plain HTTP: the TLS to the proxy fails, said as the proxy's.
        let plainPort = try await sandbox.run(
            [
                "get", nginx.httpsURL("small.bin"), "-o", "plain-port.bin", "--proxy", "https://127.0.0.1:\(squid.httpPort)",
                "--retries", "0", "--ca-cert", nginx.caCertificate,
            ] + trust)
        #expect(plainPort.status == 1, "\(plainPort)")
        let plainSaid = errorLines(plainPort).last ?? ""
        #expect(plainSaid.contains("proxy https://127.0.0.1:\(squid.httpPort)") && !plainSaid.contains("(server "), "\(plainPort)")

        let unreadable = try await sandbox.run(
            ["get", nginx.httpURL("small.bin"), "-o", "x.bin", "--proxy-ca-cert", sandbox.path("none.pem")])
        #expect(unreadable.status == 64 && unreadable.stderr.contains("--proxy-ca-cert"), "\(unreadable)")
    }

    /// Killed mid-body, the rerun through squid over TLS resumes with Range and If-Range (squid passes both on as
    /// sent: nginx's log shows them) and ends byte-exact.
    @Test func resumesThroughSquidOverTLS() async throws {
        let nginx = try await sharedNginx()
        let name = "squid-resume-\(UUID().uuidString).bin"
        let bytes = ServedFile.randomBytes(count: 4 << 20, seed: 37)
        try nginx.publish(name, bytes: bytes)
        defer { BackgroundRemoval.remove(nginx.documentRoot + "/" + name) }
        let sandbox = try Sandbox("squid")
        defer { sandbox.cleanup() }
        let squid = try await Self.start()
        defer { squid.stop() }
        let arguments = [
            "get", nginx.slowURL(name), "-o", "out.bin", "--proxy", squid.url(tls: true), "--proxy-ca-cert",
            squid.certificate,
        ]
        let first = try sandbox.start(arguments)
        let written = await waitForBytes(1 << 20, while: first, onReach: { _ in first.kill() }) {
            fileSize(sandbox.path("out.bin.part"))
        }
        first.kill()
        let killed = await first.wait()
        try #require(written != nil && killed.signal == SIGKILL, "not killed mid-way: \(killed)")
        let rerun = try await sandbox.run(arguments)
        #expect(rerun.status == 0, "\(rerun)")
        #expect(rerun.stderr.contains("resuming at"), "\(rerun)")
        #expect(readBytes(sandbox.path("out.bin")) == bytes)
        // Squid logs a request once it has ended on its side, which may be after the client has the file.
        let carriedBoth = await waitUntil { squid.accessLog.components(separatedBy: name).count - 1 >= 2 }
        #expect(carriedBoth, "\(squid.accessLog)")
        var ranged: [String] = []
        _ = await waitUntil {
            ranged = nginx.accessLogLines(containing: name).filter { $0.contains("range=\"bytes=") }
            return !ranged.isEmpty
        }
        #expect(!ranged.isEmpty, "\(nginx.accessLogLines(containing: name))")
        for line in ranged {
            #expect(line.contains("if_range=\"\\x22"), "If-Range carries the ETag: \(line)")
        }
    }
}
