import Testing

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
        ("http://h:3128/path", "no path"), ("http://h:3128?x=1", "no path"), ("http://:3128", "no proxy host"),
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
        #expect(!TransportOptions.Proxy.hasCredentials("http://h:3128/a@b"))
        #expect(!TransportOptions.Proxy.hasCredentials("h:3128"))
        let proxy = try TransportOptions.Proxy(parsing: text)
        #expect(proxy.url == "http://h:3128")
        #expect(proxy.user == "al@ice" && proxy.password == "p:ss")
        #expect(!proxy.description.contains("p:ss") && !proxy.description.contains("p%3Ass"))
        #expect {
            try TransportOptions.Proxy(parsing: "ftp://u:secret@h")
        } throws: { error in
            !"\(error)".contains("secret")
        }
    }

    @Test func anEmptyURLIsNoProxy() throws {
        #expect(try TransportOptions.Proxy(parsing: "") == .direct)
        #expect(TransportOptions.Proxy.direct.url.isEmpty)
    }
}
