import Synchronization
import StitchLocks

/// One run of a managed download: its engine task, the host slots it holds and its own rate limit; and the engine
/// request and options a catalog row and the manager's configuration make for it. Shared with the engine's threads
/// (the connection grant), so its state is a lock and atomics.
final class ManagerRun: Sendable {
    /// Tells this run's events and end from an earlier run's of the same download.
    let token: Int
    /// The host key (``DownloadManager/hostKey(_:)``) whose slots it holds.
    let host: String
    let task: Locked<Task<Void, Never>?> = Locked(nil)
    /// Connections this run holds on its host beyond the first.
    let extra = Atomic<Int>(0)
    /// Its bytes are in (``DownloadEvent/finishing``): it holds no transfer slot and no host slot any more.
    private let finishing = Atomic<Bool>(false)
    /// The host slots were given back (at ``markFinishing()`` or at the run's end, once).
    private let hostSlotsReleased = Atomic<Bool>(false)
    /// The download's own limit, within the manager's (switched off without one, so that one set while the
    /// run goes applies at once).
    let limiter: RateLimiter

    init(token: Int, host: String, limiter: RateLimiter) {
        self.token = token
        self.host = host
        self.limiter = limiter
    }

    /// Marks the run as finishing; false if it already was.
    func markFinishing() -> Bool { !finishing.exchange(true, ordering: .acquiringAndReleasing) }

    var isFinishing: Bool { finishing.load(ordering: .acquiring) }

    /// The host slots to give back: the first and the extra ones, the first time; none after.
    func takeHostSlots() -> Int {
        hostSlotsReleased.exchange(true, ordering: .acquiringAndReleasing) ? 0 : 1 + extra.load(ordering: .relaxed)
    }

    /// The engine request and options for `entry` under `configuration`: its destination (a path it named is
    /// claimed through `claims`), headers, checksum and overrides; this run's limiter; and a connection grant
    /// that takes the extra connections from `hosts`.
    func request(
        for entry: CatalogEntry, configuration: DownloadManager.Configuration, claims: PathClaims, hosts: HostSlots
    ) -> (DownloadRequest, DownloadOptions) {
        let path = entry.resolvedPath ?? entry.destinationPath
        let destination: Destination =
            entry.resolvedPath != nil || entry.destinationKind == .file ? .file(path) : .directory(path)
        var headers = HTTPHeaders()
        for line in entry.headers {
            if let (name, value) = Downloader.parseHeaderLine(line) { headers.add(name: name, value: value) }
        }
        var request = DownloadRequest(
            url: entry.url, destination: destination, headers: headers,
            checksum: entry.checksum.flatMap { try? ExpectedChecksum(parsing: $0) },
            overwrite: entry.options.overwrite)
        request.formerURLs = entry.options.formerURLs
        request.adopt = entry.options.adopt
        request.ifNewer = entry.options.ifNewer
        // The file's other URLs, fetched from at once while it is split (and each tried in turn after a failure).
        request.mirrors = entry.options.mirrors.filter { $0 != entry.url }
        request.useAdvertisedMirrors = entry.options.useAdvertisedMirrors
        let id = entry.id
        let urls = Set([entry.url] + entry.options.formerURLs)
        let replacing = entry.options.ifNewer
        request.claimPath = { proposed in claims.choice(proposed, for: id, urls: urls, replacing: replacing) }

        var options = DownloadOptions()
        options.retry = configuration.retry
        options.transport = configuration.transport
        let tuning = entry.options.tuning
        if let value = tuning.maxRetries { options.retry.maxRetries = value }
        if let value = tuning.retryDelay { options.retry.baseDelay = value }
        if let value = tuning.stallTimeout { options.transport.stallTimeout = value }
        if let value = tuning.connectTimeout { options.transport.connectTimeout = value }
        // The download's proxies, else the manager's, else the transport's (the command line's --proxy, or none:
        // the environment's).
        let proxies = entry.options.proxies.over(configuration.proxies)
        if let proxy = proxies.proxy(for: entry.url) { options.transport.proxy = proxy }
        if let noProxy = proxies.noProxy { options.transport.noProxy = noProxy }
        options.rateLimiter = limiter
        options.connections = entry.options.connections ?? configuration.connections
        options.http2Streams = entry.options.http2Streams
        options.minimumSplitSize = tuning.minimumSplitSize ?? configuration.minimumSplitSize
        options.singleConnectionRate = configuration.singleConnectionRate
        options.automaticConnectionStep = configuration.automaticConnectionStep
        options.progressInterval = 0.1
        options.finishHook = configuration.finishHook
        options.connectionGrant = { [self] wanted in
            let granted = hosts.acquire(host, upTo: wanted - 1)
            extra.add(granted, ordering: .relaxed)
            return 1 + granted
        }
        return (request, options)
    }
}
