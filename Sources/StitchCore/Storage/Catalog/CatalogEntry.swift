/// One download as the catalog keeps it: what to fetch, where to, with which options, and where it stands.
///
/// Byte progress here (`completedBytes`) is only the last snapshot, for listings; the download's own state file
/// beside its destination is the truth a resume starts from.
struct CatalogEntry: Sendable, Hashable {
    /// Whether `destinationPath` names the file itself or a directory to put it in (name chosen from the response).
    enum DestinationKind: String, Sendable, Hashable, CaseIterable {
        case file
        case directory
    }

    /// The texts `status` holds.
    enum Status {
        static let queued = "queued"
        static let running = "running"
        static let paused = "paused"
        static let completed = "completed"
        static let failed = "failed"

        /// Every valid status; the catalog refuses to write another and reads another as `paused`.
        static let all: Set<String> = [queued, running, paused, completed, failed]
    }

    var id: DownloadID
    /// The URL the user asked for (before redirects).
    var url: String
    /// The user's extra request headers, as "Name: value".
    var headers: [String]
    var destinationKind: DestinationKind
    var destinationPath: String
    /// The final file path, once known (for a directory destination, after the response named the file).
    var resolvedPath: String?
    /// The expected checksum in its text form, "sha-256=hex".
    var checksum: String?
    var options: StoredOptions
    /// One of ``Status``'s texts: queued, running, paused, completed or failed.
    var status: String
    /// The `DownloadError.Code` name of the last failure, if any.
    var errorCode: String?
    var errorMessage: String?
    /// Higher priorities start first.
    var priority: Int
    /// The order within a priority: lower positions start first.
    var position: Int64
    var totalBytes: Int64?
    /// The last snapshot of bytes done (informational only; the state file is authoritative).
    var completedBytes: Int64
    var etag: String?
    var lastModified: String?
    /// Seconds since 1970.
    var createdAt: Double
    /// Seconds since 1970.
    var updatedAt: Double

    init(
        id: DownloadID,
        url: String,
        headers: [String] = [],
        destinationKind: DestinationKind,
        destinationPath: String,
        resolvedPath: String? = nil,
        checksum: String? = nil,
        options: StoredOptions = StoredOptions(),
        status: String = Status.queued,
        errorCode: String? = nil,
        errorMessage: String? = nil,
        priority: Int = 0,
        position: Int64,
        totalBytes: Int64? = nil,
        completedBytes: Int64 = 0,
        etag: String? = nil,
        lastModified: String? = nil,
        createdAt: Double,
        updatedAt: Double
    ) {
        self.id = id
        self.url = url
        self.headers = headers
        self.destinationKind = destinationKind
        self.destinationPath = destinationPath
        self.resolvedPath = resolvedPath
        self.checksum = checksum
        self.options = options
        self.status = status
        self.errorCode = errorCode
        self.errorMessage = errorMessage
        self.priority = priority
        self.position = position
        self.totalBytes = totalBytes
        self.completedBytes = completedBytes
        self.etag = etag
        self.lastModified = lastModified
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

/// A download's options as the catalog stores them: a JSON object in one column, so options can be added without a
/// schema migration.
///
/// Decoding is lenient: a missing key, a key of the wrong type, or text that is not a JSON object at all, reads as
/// the default for that option; unknown keys (from a newer Stitch) are ignored.
struct StoredOptions: Codable, Sendable, Hashable {
    /// Connections to use; `nil` for the manager's default.
    var connections: Int?
    /// Replace an existing destination file not left by Stitch.
    var overwrite: Bool
    /// Bytes per second; `nil` for no limit.
    var rateLimit: Int64?
    /// Prefer HTTP/2 streams over separate connections when the server supports it.
    var http2Streams: Bool
    /// URLs the download had before its current one (``DownloadManager/updateSource(_:url:headers:)``).
    var formerURLs: [String]
    /// Every URL of the file, the current one among them (``DownloadManager/AddOptions/mirrors``); empty for one.
    var mirrors: [String] = []
    /// Mirrors switched to since the download last started from the user's hand: each is tried once in turn.
    var mirrorsTried = 0
    /// This download's own engine settings; nil for the manager's.
    var tuning = DownloadManager.Tuning()
    /// Take over another program's partial download at the file (``DownloadManager/AddOptions/adopt``).
    var adopt = false
    /// This download's proxies: their URLs are stored, never their credentials (``DownloadManager/Proxies``).
    var proxies = DownloadManager.Proxies()
    /// Fetch only if newer than the file at the destination (``DownloadManager/AddOptions/ifNewer``).
    var ifNewer = false
    /// Also the mirrors a response advertises (``DownloadManager/AddOptions/useAdvertisedMirrors``).
    var useAdvertisedMirrors = false

    init(
        connections: Int? = nil, overwrite: Bool = false, rateLimit: Int64? = nil, http2Streams: Bool = false,
        formerURLs: [String] = []
    ) {
        self.connections = connections
        self.overwrite = overwrite
        self.rateLimit = rateLimit
        self.http2Streams = http2Streams
        self.formerURLs = formerURLs
    }

    private enum CodingKeys: String, CodingKey {
        case connections
        case overwrite
        case rateLimit
        case http2Streams
        case formerURLs
        case mirrors
        case mirrorsTried
        case tuning
        case adopt
        case proxies
        case ifNewer
        case useAdvertisedMirrors
    }

    init(from decoder: any Decoder) throws {
        self.init()
        guard let container = try? decoder.container(keyedBy: CodingKeys.self) else { return }
        connections = (try? container.decodeIfPresent(Int.self, forKey: .connections)) ?? nil
        overwrite = (try? container.decodeIfPresent(Bool.self, forKey: .overwrite)) ?? false
        rateLimit = (try? container.decodeIfPresent(Int64.self, forKey: .rateLimit)) ?? nil
        http2Streams = (try? container.decodeIfPresent(Bool.self, forKey: .http2Streams)) ?? false
        formerURLs = (try? container.decodeIfPresent([String].self, forKey: .formerURLs)) ?? []
        mirrors = (try? container.decodeIfPresent([String].self, forKey: .mirrors)) ?? []
        mirrorsTried = (try? container.decodeIfPresent(Int.self, forKey: .mirrorsTried)) ?? 0
        tuning = (try? container.decodeIfPresent(DownloadManager.Tuning.self, forKey: .tuning)) ?? DownloadManager.Tuning()
        adopt = (try? container.decodeIfPresent(Bool.self, forKey: .adopt)) ?? false
        ifNewer = (try? container.decodeIfPresent(Bool.self, forKey: .ifNewer)) ?? false
        useAdvertisedMirrors = (try? container.decodeIfPresent(Bool.self, forKey: .useAdvertisedMirrors)) ?? false
        proxies =
            (try? container.decodeIfPresent(DownloadManager.Proxies.self, forKey: .proxies)) ?? DownloadManager.Proxies()
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(connections, forKey: .connections)
        try container.encode(overwrite, forKey: .overwrite)
        try container.encodeIfPresent(rateLimit, forKey: .rateLimit)
        try container.encode(http2Streams, forKey: .http2Streams)
        if !formerURLs.isEmpty { try container.encode(formerURLs, forKey: .formerURLs) }
        if !mirrors.isEmpty { try container.encode(mirrors, forKey: .mirrors) }
        if mirrorsTried != 0 { try container.encode(mirrorsTried, forKey: .mirrorsTried) }
        if tuning != DownloadManager.Tuning() { try container.encode(tuning, forKey: .tuning) }
        if adopt { try container.encode(adopt, forKey: .adopt) }
        if ifNewer { try container.encode(ifNewer, forKey: .ifNewer) }
        if useAdvertisedMirrors { try container.encode(useAdvertisedMirrors, forKey: .useAdvertisedMirrors) }
        if !proxies.isEmpty { try container.encode(proxies, forKey: .proxies) }
    }
}
