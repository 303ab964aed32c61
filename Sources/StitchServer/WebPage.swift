import Foundation

/// The daemon's own web page (Sources/StitchServer/Web), built into the binary with SwiftPM's `.embedInCode`:
/// no files to install, nothing fetched at run time, works offline.
///
/// The page talks only the daemon's RPC (`/jsonrpc`, over WebSocket and HTTP), so it passes the same access
/// policy as any other client. Its assets are static and carry no secret; they are served to any request whose
/// `Host` names this server (a cross-site link to the page is harmless: nothing on it acts by itself), with headers
/// that keep other pages from framing it or running anything but its own files. A page that another site opens
/// carries no secret (session storage is not shared across origins), and calls without one are not counted as
/// guesses, so opening it over and over slows nobody down.
enum WebPage {
    struct Asset: Sendable {
        let bytes: [UInt8]
        let contentType: String
    }

    /// The page's files by request path.
    static func asset(for path: String) -> Asset? {
        switch path {
        case "/", "/index.html": Asset(bytes: PackageResources.index_html, contentType: "text/html; charset=utf-8")
        case "/app.mjs": Asset(bytes: PackageResources.app_mjs, contentType: "text/javascript; charset=utf-8")
        case "/logic.mjs": Asset(bytes: PackageResources.logic_mjs, contentType: "text/javascript; charset=utf-8")
        case "/app.css": Asset(bytes: PackageResources.app_css, contentType: "text/css; charset=utf-8")
        case "/favicon.svg", "/favicon.ico":
            Asset(bytes: PackageResources.favicon_svg, contentType: "image/svg+xml")
        default: nil
        }
    }

    /// Sent with every asset. The policy allows only the page's own scripts, styles and images, and connections to
    /// its own origin (CSP Level 3's `'self'` covers `ws:`/`wss:` to the same host); no inline script or style, no
    /// framing, no forms posted elsewhere, no plugins.
    ///
    /// `Cross-Origin-Opener-Policy: same-origin` cuts the page off from a window of another site that opened it
    /// (which could otherwise keep navigating it). Browsers honour it only on trustworthy origins and report it
    /// as a console error elsewhere: it is sent over TLS and to loopback names, not to a LAN name over plain HTTP.
    static func headers(host: String?, secure: Bool = false) -> [(String, String)] {
        var headers: [(String, String)] = [
            (
                "Content-Security-Policy",
                "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
                    + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
            ),
            ("X-Frame-Options", "DENY"),
            ("Referrer-Policy", "no-referrer"),
            ("Cross-Origin-Resource-Policy", "same-origin"),
        ]
        if secure || host.flatMap(AccessPolicy.hostName).map(isLoopback) == true {
            headers.append(("Cross-Origin-Opener-Policy", "same-origin"))
        }
        return headers
    }

    /// `localhost`, 127.0.0.0/8 or ::1: origins browsers treat as trustworthy without TLS.
    static func isLoopback(_ host: String) -> Bool {
        if host == "localhost" || host == "::1" { return true }
        var v4 = in_addr()
        guard inet_pton(AF_INET, host, &v4) == 1 else { return false }
        return UInt32(bigEndian: v4.s_addr) >> 24 == 127
    }
}
