/// The daemon's own web page (Sources/StitchServer/Web), built into the binary with SwiftPM's `.embedInCode`:
/// no files to install, nothing fetched at run time, works offline.
///
/// The page talks only the daemon's RPC (`/jsonrpc`, over WebSocket and HTTP), so it passes the same access
/// policy as any other client. Its assets are static and carry no secret; they are served to any request whose
/// `Host` names this server (a cross-site link to the page is harmless: nothing on it acts by itself), with headers
/// that keep other pages from framing it or running anything but its own files.
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
    /// framing, no forms posted elsewhere, no plugins. (No Cross-Origin-Opener-Policy: browsers ignore it, with a
    /// console error, on plain-HTTP origins other than localhost, which is how a LAN address serves the page.)
    static let headers: [(String, String)] = [
        (
            "Content-Security-Policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
                + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        ),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "no-referrer"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
    ]
}
