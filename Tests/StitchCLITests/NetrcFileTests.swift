import Foundation
import Testing

@testable import StitchCLI

/// The netrc reading `--proxy-user` uses for the proxy's password (libcurl reads netrc for servers only).
@Suite struct NetrcFileTests {
    @Test func findsTheProxysEntry() {
        let file = NetrcFile(
            text: """
                machine example.com login bob password server-pw
                # a comment-looking word is a token, skipped
                machine Proxy.Local
                  login alice
                  password "p w\\"q"
                macdef init
                machine evil login alice password from-a-macro

                machine 127.0.0.1 login carol password c1
                default login dave password d1
                """)
        #expect(file.password(host: "proxy.local", login: "alice") == "p w\"q")
        #expect(file.password(host: "proxy.local", login: "mallory") == nil)
        #expect(file.password(host: "127.0.0.1", login: "carol") == "c1")
        #expect(file.password(host: "other", login: "dave") == "d1", "the default entry")
        #expect(file.password(host: "evil", login: "alice") == nil, "a macro's body is not entries")
        #expect(NetrcFile(text: "").password(host: "h", login: "u") == nil)
        #expect(NetrcFile(text: "machine").password(host: "h", login: "u") == nil)
    }
}
