public import Foundation

// Adding downloads: checking a request, claiming its path, finding one the manager holds, and keeping the new
// rows in the catalog and the queue in one step.
extension DownloadManager {
    // MARK: Adding

    /// Adds a download and starts it when a slot is free.
    /// - Returns: its id, stable across restarts.
    /// - Throws: ``DownloadManagerError``: `.invalidRequest` for a bad URL or option, `.pathInUse` when another
    ///   download of this manager already writes to the path.
    @discardableResult
    public func add(_ url: String, options: AddOptions = AddOptions()) throws(DownloadManagerError) -> DownloadID {
        try add([(url, options)])[0]
    }

    /// Adds a download of `url` (its `absoluteString`) and starts it when a slot is free; as
    /// ``add(_:options:)-(String,_)``, which refuses what is not http or https with a host (a `file:` URL).
    /// - Returns: its id, stable across restarts.
    /// - Throws: ``DownloadManagerError``: `.invalidRequest` for a bad URL or option, `.pathInUse` when another
    ///   download of this manager already writes to the path.
    @discardableResult
    public func add(_ url: URL, options: AddOptions = AddOptions()) throws(DownloadManagerError) -> DownloadID {
        try add(url.absoluteString, options: options)
    }

    /// Adds several downloads of `URL`s at once (one catalog transaction): all or none, as the `String` form.
    public func add(_ items: [(url: URL, options: AddOptions)]) throws(DownloadManagerError) -> [DownloadID] {
        try add(items.map { (url: $0.url.absoluteString, options: $0.options) })
    }

    /// Adds several downloads at once (one catalog transaction): all or none.
    public func add(_ items: [(url: String, options: AddOptions)]) throws(DownloadManagerError) -> [DownloadID] {
        try checkOpen()
        var entries: [CatalogEntry] = []
        entries.reserveCapacity(items.count)
        var position = (try? catalog.maxPosition()) ?? 0
        let now = Date().timeIntervalSince1970
        var batchIDs: Set<DownloadID> = []
        var claimed: [(String, DownloadID)] = []
        var ids: [DownloadID] = []
        // Claims made for this batch are given back if any item (or the catalog) refuses it.
        func rollBack() { for (path, id) in claimed { claims.release(path, for: id) } }
        // This batch's new downloads by place and URL, so that a later item finds an earlier one; each lookup is
        // a hash, so a batch costs its length, not its square.
        var added: [HeldIndex.Key: CatalogEntry] = [:]
        for (url, options) in items {
            if options.reuseExisting {
                let existing: DownloadID?
                do { existing = try heldDownload(url, options, batch: added) } catch {
                    rollBack()
                    throw error
                }
                if let existing {
                    ids.append(existing)
                    continue
                }
            }
            do { _ = try validateURL(url) } catch {
                rollBack()
                throw DownloadManagerError(.invalidRequest(error.message))
            }
            for mirror in options.mirrors {
                do { _ = try validateURL(mirror) } catch {
                    rollBack()
                    throw DownloadManagerError(.invalidRequest("mirror: \(error.message)"))
                }
            }
            if let connections = options.connections, !DownloadOptions.connectionRange.contains(connections) {
                rollBack()
                throw DownloadManagerError(.invalidRequest(Self.connectionsRefusal(connections)))
            }
            if let rate = options.rateLimit, rate <= 0 {
                rollBack()
                throw DownloadManagerError(.invalidRequest("the rate limit must be positive, not \(rate)"))
            }
            var id = options.id ?? DownloadID.random()
            if let wanted = options.id, table[wanted] != nil || batchIDs.contains(wanted) {
                rollBack()
                throw DownloadManagerError(.invalidRequest("the id \(wanted) is another download's"))
            }
            while table[id] != nil || batchIDs.contains(id) { id = DownloadID.random() }
            batchIDs.insert(id)
            let folder = absolutePath(options.directory ?? configuration.downloadDirectory)
            let kind: CatalogEntry.DestinationKind
            let path: String
            if let out = options.out {
                kind = .file
                // Without `.` components and repeated slashes, so `x.bin` and `./x.bin` are one claim (`..` stays:
                // resolving it by the text would be wrong after a symbolic link; the part file's lock still keeps
                // two downloads apart there).
                path = withoutDotComponents(out.hasPrefix("/") ? out : folder + "/" + out)
                if let owner = claims.claimIfFree(path, for: id) {
                    rollBack()
                    throw DownloadManagerError(.pathInUse(path, by: owner))
                }
                claimed.append((path, id))
            } else {
                kind = .directory
                path = folder
            }
            position += 1
            entries.append(
                CatalogEntry(
                    id: id, url: url, headers: options.headers.map { "\($0.name): \($0.value)" },
                    destinationKind: kind, destinationPath: path, checksum: options.checksum?.description,
                    options: {
                        var stored = StoredOptions(
                            connections: options.connections, overwrite: options.overwrite,
                            rateLimit: options.rateLimit)
                        let others = options.mirrors.filter { $0 != url }
                        stored.mirrors = others.isEmpty ? [] : [url] + others
                        stored.tuning = options.tuning
                        stored.adopt = options.adopt && options.out != nil
                        stored.ifNewer = options.ifNewer
                        stored.useAdvertisedMirrors = options.useAdvertisedMirrors
                        stored.proxies = options.proxies
                        return stored
                    }(),
                    status: options.paused ? CatalogEntry.Status.paused : CatalogEntry.Status.queued,
                    priority: options.priority, position: position, createdAt: now, updatedAt: now))
            let key = HeldIndex.Key(kind: kind, path: Self.comparable(path), url: url)
            if added[key] == nil { added[key] = entries[entries.count - 1] }
            ids.append(id)
        }
        // Adds at a place: planned on a copy of the queue with the new downloads at the end, before anything is
        // written; the new downloads' places go in with them, the others' moves in the same transaction.
        // Only the item that made a download places it: a later item of the batch that found it keeps it there.
        var placedIDs: Set<DownloadID> = []
        let placed = zip(items.lazy.map(\.options.position), ids).compactMap { position, id in
            batchIDs.contains(id) && placedIDs.insert(id).inserted ? position.map { (id, $0) } : nil
        }
        var planned: DownloadQueue?
        var moved: [DownloadQueue.Change] = []
        if !placed.isEmpty {
            var plan = queue
            for entry in entries {
                plan.insert(entry.id, at: .init(priority: entry.priority, position: entry.position), status: Self.status(ofNew: entry))
            }
            var changed: [DownloadID: DownloadQueue.Place] = [:]
            for (id, position) in placed {
                guard case .success(let move) = plan.planMove(id, to: position) else { continue }  // new: always waiting
                plan.apply(move.changes)
                for change in move.changes { changed[change.id] = change.place }
            }
            for index in entries.indices {
                if let place = changed.removeValue(forKey: entries[index].id) {
                    entries[index].priority = place.priority
                    entries[index].position = place.position
                }
            }
            moved = changed.map { DownloadQueue.Change(id: $0.key, place: $0.value) }
            planned = plan
        }
        do { try catalog.insert(entries, moving: moved.map { ($0.id, $0.place.priority, $0.place.position) }) } catch {
            rollBack()
            throw DownloadManagerError(.catalog(error.description))
        }
        if let planned {
            queue = planned
            for change in moved {
                table[change.id]?.entry.priority = change.place.priority
                table[change.id]?.entry.position = change.place.position
            }
        }
        for entry in entries {
            let status = Self.status(ofNew: entry)
            if planned == nil {
                queue.insert(entry.id, at: .init(priority: entry.priority, position: entry.position), status: status)
            }
            table[entry.id] = Managed(entry: entry, status: status, progress: TransferProgress())
            heldIndex?.insert(entry)
            publish(.added(snapshot(of: entry.id)!))
        }
        schedule()
        return ids
    }

    /// Why `count` connections are refused: "connections must be 1…16, not 20".
    static func connectionsRefusal(_ count: Int) -> String {
        let range = DownloadOptions.connectionRange
        return "connections must be \(range.lowerBound)…\(range.upperBound), not \(count)"
    }

    /// The status of a download just added: paused if added so, else queued.
    static func status(ofNew entry: CatalogEntry) -> DownloadStatus {
        entry.status == CatalogEntry.Status.paused ? .paused : .queued
    }

    /// A download this batch adds (first) or this manager holds for `url` going where `options` say, for
    /// ``AddOptions/reuseExisting``: one whose current URL it is first, else one that had it before; among several,
    /// the first in the queue (when the index was built) or added since. Folders are compared without `.`
    /// components and trailing slashes. A held download asked for with another checksum is refused rather than
    /// returned unverified.
    func heldDownload(
        _ url: String, _ options: AddOptions, batch: [HeldIndex.Key: CatalogEntry]
    ) throws(DownloadManagerError) -> DownloadID? {
        let folder = Self.comparable(absolutePath(options.directory ?? configuration.downloadDirectory))
        let kind: CatalogEntry.DestinationKind = options.out == nil ? .directory : .file
        let path = options.out.map { withoutDotComponents($0.hasPrefix("/") ? $0 : folder + "/" + $0) } ?? folder
        let key = HeldIndex.Key(kind: kind, path: Self.comparable(path), url: url)
        let index =
            heldIndex
            ?? HeldIndex(queue.order().lazy.compactMap { self.table[$0] }.filter { $0.status != .removed }.map(\.entry))
        heldIndex = index
        // What the index lists is checked against the table: a download removed since it was listed is skipped.
        func held(_ ids: [DownloadID]?, _ matches: (CatalogEntry) -> Bool) -> CatalogEntry? {
            for id in ids ?? [] {
                if let managed = table[id], managed.status != .removed, matches(managed.entry) { return managed.entry }
            }
            return nil
        }
        guard
            let entry = batch[key] ?? held(index.current[key], { $0.url == url })
                ?? held(index.former[key], { $0.options.formerURLs.contains(url) })
        else { return nil }
        if let checksum = options.checksum, entry.checksum != checksum.description {
            throw DownloadManagerError(
                .invalidRequest(
                    "download \(entry.id) of \(url) is already held with \(entry.checksum.map { "checksum \($0)" } ?? "no checksum")"))
        }
        return entry.id
    }

    /// A path as ``heldDownload`` compares it: without `.` components, repeated or trailing slashes.
    static func comparable(_ path: String) -> String {
        var cleaned = withoutDotComponents(path)
        while cleaned.count > 1 && cleaned.hasSuffix("/") { cleaned.removeLast() }
        return cleaned
    }
}
