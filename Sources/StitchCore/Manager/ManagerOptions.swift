public import Foundation

// What a manager is opened with and what a download is added with: the options' types of ``DownloadManager``.
extension DownloadManager {
    /// How a manager runs its downloads. The concurrency, the rate limit and the per-host cap can change while
    /// downloads run (``setMaxConcurrentDownloads(_:)``, ``setRateLimit(_:)``, ``setMaxConnectionsPerHost(_:)``);
    /// ``configuration`` says what is in force.
    public struct Configuration: Sendable {
        /// Where downloads go unless added with another folder or path. Created if missing.
        public var downloadDirectory: String
        /// Downloads transferring at once (aria2's `-j`; its default is 5 too). A download whose bytes are all in
        /// (``DownloadEvent/finishing``) gives its slot and its host's connections to the next while its file is
        /// checked, synced and renamed, as `curl --parallel-max` counts transfers: up to twice as many downloads may
        /// be running at once, never more transferring.
        public var maxConcurrentDownloads = 5
        /// TCP connections to one host (host and port) over all running downloads.
        public var maxConnectionsPerHost = 16
        /// Bytes per second over all downloads; nil for no limit.
        public var rateLimit: Int64?
        /// How failed attempts are retried; a download's ``Tuning`` may change some of it.
        public var retry = RetryPolicy()
        /// Whether downloads restored from the catalog start by themselves. Off: those that were running or
        /// queued come back paused.
        public var autoResume = true
        /// Connections per download unless added with a number; nil chooses by size.
        public var connections: Int?
        /// Connection settings for every request: timeouts, TLS, user agent, credentials, the proxy.
        public var transport = TransportOptions()
        /// Proxies by URL scheme for every download that names none of its own (the daemon's `all-proxy`,
        /// `http-proxy`, `https-proxy`, `no-proxy`); where these name none either, ``transport``'s proxy.
        public var proxies = Proxies()
        /// When downloads split (``DownloadOptions/minimumSplitSize``, ``DownloadOptions/singleConnectionRate``,
        /// ``DownloadOptions/automaticConnectionStep``): the engine's defaults; tests make them small.
        public var minimumSplitSize = DownloadOptions().minimumSplitSize
        /// ``DownloadOptions/singleConnectionRate`` for every download (bytes per second).
        public var singleConnectionRate = DownloadOptions().singleConnectionRate
        /// ``DownloadOptions/automaticConnectionStep`` for every download (bytes).
        public var automaticConnectionStep = DownloadOptions().automaticConnectionStep
        /// Tests only: ``DownloadOptions/finishHook`` for every download.
        var finishHook: (@Sendable (DownloadPaths) -> Void)?

        /// The defaults, with downloads going to `downloadDirectory`.
        public init(downloadDirectory: String) {
            self.downloadDirectory = downloadDirectory
        }
    }

    /// What to add besides the URL.
    public struct AddOptions: Sendable {
        /// The file's path: relative to ``directory`` (or the manager's download folder), or absolute. Without
        /// it the file is named from `Content-Disposition` or the URL, made unique among the manager's downloads.
        public var out: String?
        /// The folder for this download instead of ``Configuration/downloadDirectory``.
        public var directory: String?
        /// Extra request headers, sent on every request.
        public var headers = HTTPHeaders()
        /// Verify the finished file against this digest.
        public var checksum: ExpectedChecksum?
        /// TCP connections for this download, 1 to 16; nil takes ``Configuration/connections``.
        public var connections: Int?
        /// This download's own limit in bytes per second, within the manager's (``Configuration/rateLimit``);
        /// nil for none. Changeable later with ``DownloadManager/setRateLimit(_:_:)``.
        public var rateLimit: Int64?
        /// Replace an existing file that Stitch did not leave.
        public var overwrite = false
        /// Fetch the file only if the server's is newer than the one at its destination
        /// (``DownloadRequest/ifNewer``; aria2's `conditional-get`).
        public var ifNewer = false
        /// With ``out``: take over a partial download another program left there (``DownloadRequest/adopt``).
        public var adopt = false
        /// This download's proxies (aria2's `all-proxy`, `http-proxy`, `https-proxy`, `no-proxy`); what it leaves
        /// unset comes from the manager's ``Configuration/proxies``. The catalog keeps the proxies' URLs, never their
        /// credentials: after the manager is opened again, a proxy that wants them must be given them again.
        public var proxies = Proxies()
        /// Higher starts first; equal priorities start in queue order (the order added, unless moved).
        public var priority = 0
        /// Where in the waiting queue the download goes, counted as ``DownloadManager/move(_:to:)->_``
        /// counts (aria2's `addUri` position: `.fromStart(n)`); nil puts it at the end. The add and the move are one
        /// step: no other call sees the download at the end first, and one catalog transaction keeps both. Not
        /// applied to a download ``reuseExisting`` returns (it keeps its place).
        public var position: QueuePosition?
        /// Add without starting (status ``DownloadStatus/paused``).
        public var paused = false
        /// The id to give the download (aria2's `gid` option; an imported download keeps its GID); nil chooses one.
        /// A download of the manager that has it already refuses the add (`.invalidRequest`).
        public var id: DownloadID?
        /// Whether adding a URL the manager already holds for the same place — the same file for an `out`, else
        /// the same folder — returns that download instead of adding another. On by default, so that an app that
        /// adds its downloads again at every launch gets the ones it has, not a second copy as `NAME.1.EXT`.
        /// One whose current URL it is comes first, then one that had it before. Whatever its status; a removed
        /// download is gone and does not count. The held download keeps its own options (the others given here are
        /// not applied), except that a checksum other than its own is refused (`.invalidRequest`) rather than left
        /// unchecked.
        ///
        /// Set it to `false` to download the same URL again as a new download beside the first (`NAME.1.EXT` in a
        /// folder; refused with ``DownloadManagerError/pathInUse(_:by:)`` for the same `out`), as aria2's
        /// `addUri` does.
        public var reuseExisting = true
        /// Other URLs of the same file (aria2's several URIs in one `addUri`): while the file comes over several
        /// connections, some fetch from them at once, each only once proven to serve the same bytes
        /// (``DownloadRequest/mirrors``); and when the download fails from one, it goes on from the next, each
        /// tried once in turn, its partial data kept only where the new server proves the file is the same (as
        /// ``DownloadManager/updateSource(_:url:headers:)-(_,String,_)``).
        public var mirrors: [String] = []
        /// Also fetch from the servers the first response names as copies of the file (`Link: rel=duplicate`),
        /// each once proven (``DownloadRequest/useAdvertisedMirrors``).
        public var useAdvertisedMirrors = false
        /// Engine settings for this download instead of the manager's.
        public var tuning = Tuning()

        /// ``mirrors`` as `URL`s: set, each is kept by its `absoluteString` (checked by
        /// ``DownloadManager/add(_:options:)-(String,_)`` as the strings are); read, the mirrors that parse as a
        /// `URL`.
        public var mirrorURLs: [URL] {
            get { mirrors.compactMap { URL(string: $0) } }
            set { mirrors = newValue.map(\.absoluteString) }
        }

        /// Options with this path and folder; the others are the defaults.
        public init(out: String? = nil, directory: String? = nil) {
            self.out = out
            self.directory = directory
        }
    }

    /// A download's own engine settings; each nil takes the manager's ``Configuration``.
    public struct Tuning: Sendable, Hashable, Codable {
        /// Failed attempts in a row before the download fails (``RetryPolicy/maxRetries``).
        public var maxRetries: Int?
        /// Seconds before the first retry (``RetryPolicy/baseDelay``).
        public var retryDelay: Double?
        /// Seconds a transfer may bring almost nothing before it is retried (``TransportOptions/stallTimeout``).
        public var stallTimeout: Double?
        /// Seconds allowed to connect (``TransportOptions/connectTimeout``).
        public var connectTimeout: Double?
        /// The smallest piece a split makes (``DownloadOptions/minimumSplitSize``).
        public var minimumSplitSize: Int64?
        /// No settings of its own: every one is the manager's.
        public init() {}
    }

    /// What opening the catalog found.
    public struct RestoreReport: Sendable, Hashable {
        /// Downloads restored from the catalog (or, after a rebuild, from state files).
        public var restored: Int
        /// The schema version an older catalog was migrated from.
        public var migratedFrom: Int?
        /// Why the catalog was unreadable and rebuilt (and where the old one was moved), if it was.
        public var rebuiltBecause: String?
        /// Partial downloads found by their state files while rebuilding.
        public var recoveredFromStateFiles: Int
    }

    /// Where in the queue to put a download.
    public enum QueuePlace: Sendable {
        /// `front`: before the others of its priority; `back`: after them.
        case front, back
    }

    /// Where to move a waiting download, counted as aria2's `changePosition` counts (`POS_SET`, `POS_CUR`,
    /// `POS_END`) over the waiting queue (``waitingQueue()``). A place before the front or past the end is the
    /// front or the end.
    public enum QueuePosition: Sendable, Hashable {
        /// `n` places from the front (0 is the front).
        case fromStart(Int)
        /// `n` places from where it is now (negative: towards the front).
        case fromCurrent(Int)
        /// `n` places from the end (0 is the end, -1 the place before it).
        case fromEnd(Int)
    }
}

extension DownloadManager {
    /// Proxies by URL scheme, as aria2 has them: one for `http://` URLs, one for `https://`, one for all that have
    /// none of their own, and the hosts reached directly. A proxy of ``TransportOptions/Proxy/direct`` says "none"
    /// (aria2's empty value), which a fallback's proxy does not replace.
    public struct Proxies: Sendable, Hashable, Codable {
        /// For every URL whose scheme has no proxy of its own (aria2's `all-proxy`).
        public var all: TransportOptions.Proxy?
        /// For `http://` URLs (`http-proxy`).
        public var http: TransportOptions.Proxy?
        /// For `https://` URLs (`https-proxy`).
        public var https: TransportOptions.Proxy?
        /// Hosts reached directly (`no-proxy`; curl's list: see ``TransportOptions/noProxy``).
        public var noProxy: String?

        /// No proxy named.
        public init(
            all: TransportOptions.Proxy? = nil, http: TransportOptions.Proxy? = nil,
            https: TransportOptions.Proxy? = nil, noProxy: String? = nil
        ) {
            self.all = all
            self.http = http
            self.https = https
            self.noProxy = noProxy
        }

        /// Whether it names nothing.
        public var isEmpty: Bool { all == nil && http == nil && https == nil && noProxy == nil }

        /// The proxy for a request of `url`: its scheme's, else ``all``; nil when neither is named here.
        public func proxy(for url: String) -> TransportOptions.Proxy? {
            let scheme = url.prefix { $0 != ":" }.lowercased()
            return (scheme == "https" ? https : scheme == "http" ? http : nil) ?? all
        }

        /// Which of the three proxies credentials are for.
        public enum Kind: String, Sendable, CaseIterable {
            /// ``Proxies/all``.
            case all
            /// ``Proxies/http``.
            case http
            /// ``Proxies/https``.
            case https
        }

        /// The proxy of `kind`.
        public subscript(kind: Kind) -> TransportOptions.Proxy? {
            get {
                switch kind {
                case .all: all
                case .http: http
                case .https: https
                }
            }
            set {
                switch kind {
                case .all: all = newValue
                case .http: http = newValue
                case .https: https = newValue
                }
            }
        }

        /// Gives the proxy of `kind` a user and a password (given apart, they win over any in its URL): nil leaves
        /// what it has, an empty password removes it. Nothing without a proxy of that kind (credentials are for a
        /// named proxy only, never for ``TransportOptions/Proxy/direct``).
        public mutating func setCredentials(_ kind: Kind, user: String?, password: String?) {
            guard var named = self[kind], !named.url.isEmpty else { return }
            if let user, !user.isEmpty { named.user = user }
            if let password { named.password = password.isEmpty ? nil : password }
            self[kind] = named
        }

        /// These proxies, with `fallback`'s where these name none.
        public func over(_ fallback: Proxies) -> Proxies {
            Proxies(
                all: all ?? fallback.all, http: http ?? fallback.http, https: https ?? fallback.https,
                noProxy: noProxy ?? fallback.noProxy)
        }

        private enum CodingKeys: String, CodingKey { case all, http, https, noProxy }

        /// Reads the URLs (a URL that no longer parses reads as none).
        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            func proxy(_ key: CodingKeys) -> TransportOptions.Proxy? {
                ((try? container.decodeIfPresent(String.self, forKey: key)) ?? nil)
                    .flatMap { try? TransportOptions.Proxy(parsing: $0) }
            }
            self.init(
                all: proxy(.all), http: proxy(.http), https: proxy(.https),
                noProxy: (try? container.decodeIfPresent(String.self, forKey: .noProxy)) ?? nil)
        }

        /// Writes the URLs only: never a user name or a password.
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encodeIfPresent(all?.url, forKey: .all)
            try container.encodeIfPresent(http?.url, forKey: .http)
            try container.encodeIfPresent(https?.url, forKey: .https)
            try container.encodeIfPresent(noProxy, forKey: .noProxy)
        }
    }
}
