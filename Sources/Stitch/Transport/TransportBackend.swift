/// The HTTP transports this build of the library has, by name.
///
/// The libcurl transport comes with the package's `Libcurl` trait, on by default; a build without it (for example
/// `swift build --disable-default-traits`) needs no libcurl headers and moves every download over `URLSession`
/// (FoundationNetworking on Linux, which brings its own libcurl at run time). This is the one place outside the
/// libcurl backend that names it.
public enum TransportBackend: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// libcurl's multi interface on one event-loop thread: pauses a transfer for back-pressure, keeps connections,
    /// and has every TLS option.
    case libcurl
    /// `URLSession` data tasks (``URLSessionTransport``).
    case urlSession = "urlsession"

    /// The backends this build has, the default first.
    public static var available: [TransportBackend] {
        #if Libcurl
        return [.libcurl, .urlSession]
        #else
        return [.urlSession]
        #endif
    }

    /// The backend a download uses unless it is given a transport: libcurl's when the build has it.
    public static var `default`: TransportBackend { available[0] }

    /// The shared transport of this backend, or nil when this build does not have it.
    public var transport: (any HTTPTransport)? {
        switch self {
        case .libcurl:
            #if Libcurl
            return CurlTransport.shared
            #else
            return nil
            #endif
        case .urlSession:
            return URLSessionTransport.shared
        }
    }

    /// The backend's name, as `stitch get --transport` takes it: `libcurl` or `urlsession`.
    public var description: String { rawValue }

    /// The transport a download or a manager uses unless given one: the shared transport of the default backend.
    public static var defaultTransport: any HTTPTransport {
        #if Libcurl
        return CurlTransport.shared
        #else
        return URLSessionTransport.shared
        #endif
    }

    /// The platform's session of download tasks for ``BackgroundDownloads``: a background `URLSession` on Apple
    /// platforms, an ordinary one on Linux (``URLSessionDownloadTasks``).
    ///
    /// - Parameters:
    ///   - identifier: The session's identifier.
    ///   - events: Where the tasks' events go.
    /// - Returns: The session.
    public static func downloadTaskSession(identifier: String, events: any DownloadTaskEvents) -> any DownloadTaskSession {
        URLSessionDownloadTasks(identifier: identifier, events: events)
    }
}
