public import Foundation

// Settings that change while downloads run, and a download's sources (its URL and mirrors).
extension DownloadManager {
    // MARK: Settings that change while downloads run

    /// Changes how many downloads transfer at once (at least 1). Raised, queued downloads start at once; lowered,
    /// running downloads go on and no other starts until fewer transfer.
    public func setMaxConcurrentDownloads(_ count: Int) throws(DownloadManagerError) {
        try checkOpen()
        guard count >= 1 else {
            throw DownloadManagerError(.invalidRequest("the concurrent downloads must be at least 1, not \(count)"))
        }
        configuration.maxConcurrentDownloads = count
        schedule()
    }

    /// Changes the limit over all downloads, in bytes per second (nil: none). Running downloads follow it within
    /// about a second.
    public func setRateLimit(_ bytesPerSecond: Int64?) throws(DownloadManagerError) {
        try checkOpen()
        if let bytesPerSecond {
            guard bytesPerSecond > 0 else {
                throw DownloadManagerError(.invalidRequest("the rate limit must be positive, not \(bytesPerSecond)"))
            }
            rateLimiter.bytesPerSecond = bytesPerSecond
        }
        rateLimiter.isEnabled = bytesPerSecond != nil
        configuration.rateLimit = bytesPerSecond
    }

    /// Changes download `id`'s own limit, in bytes per second within the manager's (nil: none); a running download
    /// follows it within about a second. Kept in the catalog.
    public func setRateLimit(_ id: DownloadID, _ bytesPerSecond: Int64?) throws(DownloadManagerError) {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        if let bytesPerSecond, bytesPerSecond <= 0 {
            throw DownloadManagerError(.invalidRequest("the rate limit must be positive, not \(bytesPerSecond)"))
        }
        managed.entry.options.rateLimit = bytesPerSecond
        managed.entry.updatedAt = Date().timeIntervalSince1970
        do { try catalog.update(managed.entry) } catch { throw DownloadManagerError(.catalog(error.description)) }
        table[id] = managed
        if let run = managed.run {
            if let bytesPerSecond { run.limiter.bytesPerSecond = bytesPerSecond }
            run.limiter.isEnabled = bytesPerSecond != nil
        }
    }

    /// Changes a download's connections, engine settings and headers (aria2's `changeOption`), all in one step
    /// of the actor, so changes made at once by two callers to different settings both stay. Not finished
    /// downloads only; a running one starts its transfer again with them (keeping its bytes) when they changed.
    /// - Parameters:
    ///   - id: the download.
    ///   - connections: `.some(nil)` for the manager's choice; nil leaves them.
    ///   - tuning: its non-nil settings replace the download's; the others stay.
    ///   - headers: replace every header; nil leaves them.
    ///   - headerFields: set these headers by name (replacing those of the same name), after `headers`.
    ///   - editTuning: edits the download's settings as they are then (after `tuning`), in the same step; what it
    ///     sets to nil goes back to the manager's.
    ///   - editHeaders: edits the download's headers as they are then (after `headers` and `headerFields`), in the
    ///     same step.
    ///   - editProxies: edits the download's proxies as they are then, in the same step.
    public func setOptions(
        _ id: DownloadID, connections: Int?? = nil, tuning: Tuning? = nil, headers: HTTPHeaders? = nil,
        headerFields: HTTPHeaders? = nil, editTuning: (@Sendable (inout Tuning) -> Void)? = nil,
        editHeaders: (@Sendable (inout HTTPHeaders) -> Void)? = nil,
        editProxies: (@Sendable (inout Proxies) -> Void)? = nil
    ) throws(DownloadManagerError) {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        guard managed.status != .completed, managed.status != .removed else {
            throw DownloadManagerError(.invalidRequest("download \(id) is \(managed.status.name); its options are final"))
        }
        if case .some(.some(let count)) = connections, !DownloadOptions.connectionRange.contains(count) {
            throw DownloadManagerError(.invalidRequest(Self.connectionsRefusal(count)))
        }
        let before = managed.entry
        if let connections { managed.entry.options.connections = connections }
        if let patch = tuning {
            var merged = managed.entry.options.tuning
            if let value = patch.maxRetries { merged.maxRetries = value }
            if let value = patch.retryDelay { merged.retryDelay = value }
            if let value = patch.stallTimeout { merged.stallTimeout = value }
            if let value = patch.connectTimeout { merged.connectTimeout = value }
            if let value = patch.minimumSplitSize { merged.minimumSplitSize = value }
            managed.entry.options.tuning = merged
        }
        if let editTuning { editTuning(&managed.entry.options.tuning) }
        if let headers { managed.entry.headers = headers.map { "\($0.name): \($0.value)" } }
        if let headerFields {
            let names = Set(headerFields.map { $0.name.lowercased() })
            managed.entry.headers.removeAll { line in
                Downloader.parseHeaderLine(line).map { names.contains($0.0.lowercased()) } ?? false
            }
            managed.entry.headers += headerFields.map { "\($0.name): \($0.value)" }
        }
        if let editHeaders {
            var edited = HTTPHeaders(managed.entry.headers.compactMap(Downloader.parseHeaderLine))
            editHeaders(&edited)
            managed.entry.headers = edited.map { "\($0.name): \($0.value)" }
        }
        if let editProxies { editProxies(&managed.entry.options.proxies) }
        guard managed.entry != before else { return }  // nothing changed: a running transfer goes on
        managed.entry.updatedAt = Date().timeIntervalSince1970
        do { try catalog.update(managed.entry) } catch { throw DownloadManagerError(.catalog(error.description)) }
        if managed.run != nil, managed.status == .running { managed.restartAfterRun = true }
        table[id] = managed
        if managed.restartAfterRun { stopRun(id) }
    }

    /// Settings an application keeps with its downloads, by key (the daemon keeps the options set over its RPC):
    /// in the catalog, so they are there again when the manager is opened after a restart or a crash.
    public func keptSettings() throws(DownloadManagerError) -> [String: String] {
        try checkOpen()
        do { return try catalog.settings() } catch { throw DownloadManagerError(.catalog(error.description)) }
    }

    /// Keeps settings (a nil value forgets the key), all in one transaction of the catalog: all or none.
    public func keepSettings(_ changes: [String: String?]) throws(DownloadManagerError) {
        try checkOpen()
        do { try catalog.setSettings(changes) } catch { throw DownloadManagerError(.catalog(error.description)) }
    }

    /// Changes the proxies of every download that names none of its own (``Configuration/proxies``), for the
    /// downloads that start from now on.
    public func setProxies(_ proxies: Proxies) throws(DownloadManagerError) {
        try checkOpen()
        configuration.proxies = proxies
    }

    /// Changes the connections a download opens when it was given no number of its own (nil: chosen per file, as
    /// ``Configuration/connections``); downloads that start from now on follow it.
    public func setConnections(_ count: Int?) throws(DownloadManagerError) {
        try checkOpen()
        if let count, !DownloadOptions.connectionRange.contains(count) {
            throw DownloadManagerError(.invalidRequest(Self.connectionsRefusal(count)))
        }
        configuration.connections = count
    }

    /// Changes how many connections all running downloads may hold to one host (at least 1). Lowered, running
    /// downloads keep the connections they have; new ones are granted once the host is below the cap.
    public func setMaxConnectionsPerHost(_ count: Int) throws(DownloadManagerError) {
        try checkOpen()
        guard count >= 1 else {
            throw DownloadManagerError(.invalidRequest("the connections per host must be at least 1, not \(count)"))
        }
        configuration.maxConnectionsPerHost = count
        hosts.setCap(count)
        schedule()
    }

    /// Changes a download's priority: higher priorities start first (running downloads are not stopped).
    public func setPriority(_ id: DownloadID, _ priority: Int) throws(DownloadManagerError) {
        try checkOpen()
        guard let managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        try keep([DownloadQueue.Change(id: id, place: .init(priority: priority, position: managed.entry.position))])
        schedule()
    }

    /// Gives a download a new URL (an expired signed link, a rotated token) and, if given, new headers. Its
    /// partial data is resumed from the new URL only if the server proves the file is the same (its saved
    /// `ETag` or `Last-Modified` with `If-Range`); otherwise the download starts over and says why. A running
    /// download switches at once.
    public func updateSource(_ id: DownloadID, url: String, headers: HTTPHeaders? = nil) throws(DownloadManagerError) {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        do { _ = try validateURL(url) } catch { throw DownloadManagerError(.invalidRequest(error.message)) }
        guard managed.status != .completed, managed.status != .removed else {
            throw DownloadManagerError(.invalidRequest("download \(id) is \(managed.status.name); its source is final"))
        }
        point(&managed.entry, at: url)
        if let headers { managed.entry.headers = headers.map { "\($0.name): \($0.value)" } }
        managed.entry.updatedAt = Date().timeIntervalSince1970
        do { try catalog.update(managed.entry) } catch { throw DownloadManagerError(.catalog(error.description)) }
        if managed.run != nil, managed.status == .running { managed.restartAfterRun = true }
        table[id] = managed
        if managed.restartAfterRun { stopRun(id) }
    }

    /// ``updateSource(_:url:headers:)-(_,String,_)`` with a `URL` (its `absoluteString`).
    public func updateSource(_ id: DownloadID, url: URL, headers: HTTPHeaders? = nil) throws(DownloadManagerError) {
        try updateSource(id, url: url.absoluteString, headers: headers)
    }

    /// Edits every URL of download `id`'s file (aria2's `changeUri`) in one step of the actor: `edit` gets the
    /// list (the current URL among them) and changes it; the current URL stays if still listed, otherwise the
    /// download goes on from the first (a running one at once), as ``updateSource(_:url:headers:)-(_,String,_)``.
    /// One catalog write. Returns what `edit` returned.
    public func editMirrors<T: Sendable>(
        _ id: DownloadID, _ edit: @Sendable (inout [String]) throws -> T
    ) throws -> T {
        try checkOpen()
        guard var managed = table[id] else { throw DownloadManagerError(.unknownDownload(id)) }
        guard managed.status != .completed, managed.status != .removed else {
            throw DownloadManagerError(.invalidRequest("download \(id) is \(managed.status.name); its source is final"))
        }
        var urls = managed.entry.options.mirrors.isEmpty ? [managed.entry.url] : managed.entry.options.mirrors
        let result = try edit(&urls)
        var unique: [String] = []
        for url in urls where !unique.contains(url) { unique.append(url) }
        guard !unique.isEmpty else { throw DownloadManagerError(.invalidRequest("a download needs at least one URL")) }
        for url in unique {
            do { _ = try validateURL(url) } catch { throw DownloadManagerError(.invalidRequest(error.message)) }
        }
        managed.entry.options.mirrors = unique.count > 1 ? unique : []
        managed.entry.options.mirrorsTried = 0
        let moves = !unique.contains(managed.entry.url)
        if moves { point(&managed.entry, at: unique[0]) }
        managed.entry.updatedAt = Date().timeIntervalSince1970
        do { try catalog.update(managed.entry) } catch { throw DownloadManagerError(.catalog(error.description)) }
        if moves, managed.run != nil, managed.status == .running { managed.restartAfterRun = true }
        table[id] = managed
        if managed.restartAfterRun { stopRun(id) }
        return result
    }
}
