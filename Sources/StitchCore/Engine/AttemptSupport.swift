import Foundation

/// The redirects followed within one attempt (the single connection's, or one lane's): each `Location` is
/// resolved against the URL that sent it; other schemes, loops and more than `limit` hops end the download.
struct RedirectChain {
    let limit: Int
    private var visited: [String] = []

    init(limit: Int) { self.limit = limit }

    /// The URL to request next, after `url` answered with a redirect to `location`.
    mutating func follow(_ location: String, from url: URL) throws(DownloadError) -> URL {
        guard let next = URL(string: location, relativeTo: url)?.absoluteURL,
            let scheme = next.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = next.host, !host.isEmpty
        else { throw DownloadError(.redirects, "redirect to an unusable location: \(location.debugDescription)") }
        visited.append(url.absoluteString)
        if visited.contains(next.absoluteString) {
            throw DownloadError(
                .redirects, "redirect loop: \((visited + [next.absoluteString]).joined(separator: " → "))")
        }
        if visited.count > limit {
            throw DownloadError(.redirects, "too many redirects (more than \(limit))")
        }
        return next
    }

    /// A retry starts again from the original URL (redirect targets may expire).
    mutating func reset() { visited = [] }
}
