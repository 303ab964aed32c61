import Foundation
import Testing

@testable import StitchCore
@testable import StitchTransport

/// `TransportOptions.Proxy(parsing:)`: what `--proxy` and the daemon's `all-proxy` accept, and what they say to the
/// rest.
@Suite struct ProxyOptionTests {
    @Test(arguments: [
        ("127.0.0.1:3128", "http://127.0.0.1:3128"),
        ("http://proxy.example", "http://proxy.example:80"),
        ("HTTPS://proxy.example", "https://proxy.example:443"),
        ("socks5://127.0.0.1", "socks5://127.0.0.1:1080"),
        ("socks5h://h:9050/", "socks5h://h:9050"),
        ("http://[::1]:8080", "http://[::1]:8080"),
    ])
    func acceptedURLs(_ text: String, _ url: String) throws {
        let proxy = try TransportOptions.Proxy(parsing: text)
        #expect(proxy.url == url)
        #expect(proxy.user == nil && proxy.password == nil)
    }

    @Test(arguments: [
        ("ftp://h:21", "not ftp://"), ("socks4://h:1080", "not socks4://"), ("http://h:0", "port"),
        ("http://h:3128/path", "no path"), ("http://h:3128?x=1", "no path"), ("http://:3128", "names a host"),
        ("http://h 1:80", "spaces"), ("http://h:99999", "port"),
    ])
    func refusedURLs(_ text: String, _ said: String) {
        #expect {
            try TransportOptions.Proxy(parsing: text)
        } throws: { error in
            "\(error)".contains(said)
        }
    }

    /// Credentials are taken out of the URL, percent-decoded, and never shown.
    @Test func credentialsAreKeptApartAndHidden() throws {
        let text = "http://al%40ice:p%3Ass@h:3128"
        #expect(TransportOptions.Proxy.hasCredentials(text))
        #expect(TransportOptions.Proxy.hasCredentials("http://u:p/ss@h:3128"), "a / in the password")
        #expect(TransportOptions.Proxy.hasCredentials("http://u:p#ss@h:3128"), "a # in the password")
        #expect(!TransportOptions.Proxy.hasCredentials("h:3128"))
        let proxy = try TransportOptions.Proxy(parsing: text)
        #expect(proxy.url == "http://h:3128")
        #expect(proxy.user == "al@ice" && proxy.password == "p:ss")
        #expect(!proxy.description.contains("p:ss") && !proxy.description.contains("p%3Ass"))
        for text in ["ftp://u:secret@h", "http://u:se/cret@h:1", "http://u:sec#ret@h", "u:se@cret@h:x"] {
            #expect {
                try TransportOptions.Proxy(parsing: text)
            } throws: { error in
                !"\(error)".contains("se") || !"\(error)".contains("cret")
            }
        }
    }

    @Test func anEmptyURLIsNoProxy() throws {
        #expect(try TransportOptions.Proxy(parsing: "") == .direct)
        #expect(TransportOptions.Proxy.direct.url.isEmpty)
    }
}

/// Proxies per download: an input list's `all-proxy` and friends, the choice by scheme, and what the catalog keeps
/// (the URLs, never the credentials).
@Suite struct DownloadProxiesTests {
    @Test func anInputListNamesProxiesWithTheirCredentials() throws {
        let text = """
            http://h/a
              all-proxy-passwd=s3cret
              all-proxy=http://127.0.0.1:3128
              all-proxy-user=alice
              no-proxy=example.com,10.0.0.0/8
            https://h/b
              all-proxy=
              https-proxy=socks5h://u:p%40ss@127.0.0.1:1080
            http://h/c
              http-proxy=ftp://127.0.0.1:21
            http://h/d
              http-proxy-user=bob

            """
        let list = try InputList.parse(bytes: Array(text.utf8))
        #expect(list.warnings.isEmpty, "\(list.warnings)")
        try #require(list.entries.count == 4)
        let a = list.entries[0].proxies
        #expect(a.all?.url == "http://127.0.0.1:3128" && a.all?.user == "alice" && a.all?.password == "s3cret")
        #expect(a.noProxy == "example.com,10.0.0.0/8")
        #expect(a.proxy(for: "https://x/") == a.all && a.proxy(for: "http://x/") == a.all)
        let b = list.entries[1].proxies
        #expect(b.all == .direct)
        #expect(b.https?.url == "socks5h://127.0.0.1:1080" && b.https?.user == "u" && b.https?.password == "p@ss")
        #expect(b.proxy(for: "https://x/")?.url == "socks5h://127.0.0.1:1080")
        #expect(b.proxy(for: "http://x/") == .direct)
        let c = list.entries[2]
        #expect(c.problem?.message.contains("http-proxy") == true && c.problem?.line == 10, "\(String(describing: c.problem))")
        #expect(list.entries[3].proxies.isEmpty && list.entries[3].problem == nil)
    }

    @Test func aDownloadsProxiesOverTheManagers() throws {
        let manager = DownloadManager.Proxies(
            all: try .init(parsing: "http://m:1"), https: try .init(parsing: "socks5://m:2"), noProxy: "m")
        let own = DownloadManager.Proxies(http: .direct)
        let chosen = own.over(manager)
        #expect(chosen.proxy(for: "http://x/") == .direct)
        #expect(chosen.proxy(for: "https://x/")?.url == "socks5://m:2")
        #expect(chosen.proxy(for: "HTTPS://x/")?.url == "socks5://m:2")
        #expect(chosen.noProxy == "m")
        #expect(DownloadManager.Proxies().over(DownloadManager.Proxies()).proxy(for: "http://x/") == nil)
    }

    /// The catalog's JSON for a download's options holds the proxies' URLs and no user or password.
    @Test func theCatalogKeepsNoCredentials() throws {
        var stored = StoredOptions()
        stored.proxies.all = try .init(parsing: "http://alice:s3cret@127.0.0.1:3128")
        stored.proxies.noProxy = "localhost"
        let json = String(decoding: try JSONEncoder().encode(stored), as: UTF8.self)
        #expect(!json.contains("s3cret") && !json.contains("alice"), "\(json)")
        let read = try JSONDecoder().decode(StoredOptions.self, from: Data(json.utf8))
        #expect(read.proxies.all?.url == "http://127.0.0.1:3128" && read.proxies.all?.user == nil)
        #expect(read.proxies.noProxy == "localhost")
        let old = try JSONDecoder().decode(StoredOptions.self, from: Data(#"{"overwrite":false}"#.utf8))
        #expect(old.proxies.isEmpty)
    }
}

/// The Netscape cookie file and RFC 6265's matching.
@Suite struct CookieJarTests {
    @Test func readsAndMatches() {
        let jar = CookieJar(
            text: [
                ".example.com\tTRUE\t/\tFALSE\t0\tall\t1",
                "example.com\tFALSE\t/docs\tTRUE\t0\tdocs\t2\r",
                "#HttpOnly_www.example.com\tFALSE\t/\tFALSE\t2000000000\thttponly\t3",
                "example.com\tFALSE\t/\tFALSE\t1000\texpired\t4",
                "1.2.3.4\tTRUE\t/\tFALSE\t0\tip\t5",
                "bad\tMAYBE\t/\tFALSE\t0\tx\t6",
                "example.com\tFALSE\t/\tFALSE\t0\tsemi\ta;b",
                "only\tthree\tfields",
                "example.com\tFALSE\t/\tFALSE\t0\tempty",
            ].joined(separator: "\n"))
        #expect(jar.problems.map(\.line) == [6, 7, 8], "\(jar.problems)")
        #expect(jar.header(for: "https://example.com/docs/a", now: 1_500_000_000) == "docs=2; all=1; empty=")
        #expect(jar.header(for: "http://example.com/docs/a", now: 1_500_000_000) == "all=1; empty=", "secure: https only")
        #expect(jar.header(for: "http://www.example.com/x", now: 1_500_000_000) == "all=1; httponly=3")
        #expect(jar.header(for: "http://www.example.com/x", now: 2_100_000_000) == "all=1", "expired by then")
        #expect(jar.header(for: "http://example.com/docsx", now: 1_500_000_000) == "all=1; empty=")
        #expect(jar.header(for: "http://badexample.com/", now: 1_500_000_000) == nil)
        #expect(jar.header(for: "http://5.1.2.3.4/", now: 1_500_000_000) == nil, "no subdomains of an address")
        #expect(jar.header(for: "http://1.2.3.4/", now: 1_500_000_000) == "ip=5")
        #expect(jar.header(for: "http://example.com/", now: 999) == "all=1; expired=4; empty=")
    }

    /// The engine's requests carry the jar's cookies, unless the caller gave its own `Cookie` header.
    @Test func aRequestCarriesTheJarsCookies() {
        var options = TransportOptions()
        options.cookies = CookieJar(text: "h\tFALSE\t/\tFALSE\t0\tk\tv\n")
        #expect(TransportRequest(url: "http://h/f", headers: HTTPHeaders(), options: options).headers["Cookie"] == "k=v")
        #expect(TransportRequest(url: "http://g/f", headers: HTTPHeaders(), options: options).headers["Cookie"] == nil)
        let own = TransportRequest(url: "http://h/f", headers: HTTPHeaders([("Cookie", "mine=1")]), options: options)
        #expect(own.headers["Cookie"] == "mine=1")
    }
}
