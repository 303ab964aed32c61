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

extension Downloader {
    /// A downloader over the shared transport of ``TransportBackend/default`` (see
    /// ``Downloader/init(transport:clock:)`` for another).
    /// - Parameter clock: waits between retries; inject a fake in tests.
    public init(clock: any DownloadClock = SystemClock()) {
        self.init(transport: TransportBackend.defaultTransport, clock: clock)
    }
}

extension DownloadManager {
    /// Opens the manager kept in `directory` over the shared transport of ``TransportBackend/default`` (see
    /// ``DownloadManager/init(directory:configuration:transport:clock:)``).
    /// - Parameters:
    ///   - directory: where the manager keeps its catalog (created if missing).
    ///   - configuration: the download folder, caps and defaults; nil downloads into `directory` with the defaults.
    ///   - clock: time for retries and stall checks; the system's by default.
    /// - Throws: ``DownloadManagerError`` when the catalog cannot be opened or created.
    public init(
        directory: String, configuration: Configuration? = nil, clock: any DownloadClock = SystemClock()
    ) throws(DownloadManagerError) {
        try self.init(
            directory: directory, configuration: configuration, transport: TransportBackend.defaultTransport,
            clock: clock)
    }

    /// A manager whose list lives in memory only, over the shared transport of ``TransportBackend/default`` (see
    /// ``DownloadManager/init(configuration:transport:clock:)``).
    /// - Parameters:
    ///   - configuration: the download folder, caps and defaults.
    ///   - clock: time for retries and stall checks; the system's by default.
    /// - Throws: ``DownloadManagerError`` when SQLite cannot make the in-memory catalog.
    public init(configuration: Configuration, clock: any DownloadClock = SystemClock()) throws(DownloadManagerError) {
        try self.init(configuration: configuration, transport: TransportBackend.defaultTransport, clock: clock)
    }
}

extension BackgroundDownloads {
    /// Opens the driver of the session `identifier` over the platform's download tasks
    /// (``TransportBackend/downloadTaskSession(identifier:events:)``).
    /// - Parameters:
    ///   - identifier: The session's identifier (on Apple platforms, the background session's).
    ///   - stateDirectory: Where the list of downloads and the files of finished tasks are kept.
    ///   - configuration: How downloads are cut into tasks.
    /// - Throws: ``DownloadError`` if the directory cannot be made or read, or a download's record there is damaged.
    public convenience init(
        identifier: String, stateDirectory: String, configuration: Configuration = Configuration()
    ) throws(DownloadError) {
        try self.init(
            identifier: identifier, stateDirectory: stateDirectory, configuration: configuration,
            makeSession: { TransportBackend.downloadTaskSession(identifier: identifier, events: $0) })
    }
}
