import Foundation
import StitchLocks
import Synchronization

// Runs: starting queued downloads when slots are free, following a run's events, and what its end leads to
// (done, failed, the next mirror, queued again).
extension DownloadManager {
    /// Starts queued downloads while slots are free, in queue order, skipping those whose host is at its cap (the
    /// queue's rules: ``DownloadQueue/toStart(free:acquireHost:)``).
    func schedule() {
        guard !isClosed else { return }
        // Slots count transfers: a run that is only finishing (its bytes in) holds none, but at most as many runs
        // finish at once as transfer (each holds its part file open until it is synced).
        let slots = max(1, configuration.maxConcurrentDownloads)
        let free = min(slots - (queue.liveRuns - queue.finishingRuns), 2 * slots - queue.liveRuns)
        let hosts = self.hosts
        // `self.table` itself, not a copy held across the starts: `start` writes the table, and a live copy would
        // make each write copy the whole table (a long list's downloads would cost the square of their number).
        let starting = queue.toStart(free: free) { id in
            guard let url = self.table[id]?.entry.url else { return false }
            return hosts.acquire(Self.hostKey(url), upTo: 1) == 1
        }
        for id in starting {
            guard let url = table[id]?.entry.url else { continue }
            start(id, host: Self.hostKey(url))
        }
        if isIdle { resumeIdleWaiters() }
    }

    func start(_ id: DownloadID, host: String) {
        guard var managed = table[id] else { return }
        nextRunToken += 1
        let limiter = RateLimiter(bytesPerSecond: managed.entry.options.rateLimit ?? Self.unlimitedRate, within: rateLimiter)
        limiter.isEnabled = managed.entry.options.rateLimit != nil
        let run = ManagerRun(token: nextRunToken, host: host, limiter: limiter)
        managed.run = run
        managed.restartAfterRun = false
        table[id] = managed
        queue.runStarted(id)
        setStatus(id, .running)

        let (request, options) = run.request(for: managed.entry, configuration: configuration, claims: claims, hosts: hosts)
        let (events, sink) = AsyncStream.makeStream(of: DownloadEvent.self, bufferingPolicy: .unbounded)
        let downloader = self.downloader
        let task = Task { [weak self] in
            let pump = Task { [weak self] in
                for await event in events { await self?.engineEvent(id, token: run.token, event) }
            }
            let outcome: Result<DownloadResult, DownloadError>
            do throws(DownloadError) {
                outcome = .success(try await downloader.download(request, options: options) { sink.yield($0) })
            } catch {
                outcome = .failure(error)
            }
            sink.finish()
            await pump.value
            await self?.runEnded(id, run: run, outcome)
        }
        run.task.withLock { $0 = task }
    }

    func engineEvent(_ id: DownloadID, token: Int, _ event: DownloadEvent) {
        guard var managed = table[id], managed.run?.token == token else { return }
        switch event {
        case .destinationResolved(let path):
            // Kept in memory until the next catalog write: after a crash, a download into a folder finds its
            // partial again by name (its state file names its URL).
            managed.entry.resolvedPath = path
            table[id] = managed
            publish(.pathResolved(id, path))
        case .resuming(let from, let note):
            managed.progress.bytes = from
            table[id] = managed
            if let note { publish(.notice(id, note)) }
        case .receiving(_, _, let total):
            managed.progress.total = total
            managed.entry.totalBytes = total
            table[id] = managed
        case .progress where managed.status != .running, .notice where managed.status != .running,
            .retrying where managed.status != .running:
            break  // the user paused, cancelled or removed it: the run's last words are not news
        case .progress(let progress):
            managed.meter.add(bytes: progress.bytes, at: downloader.clock.uptime())
            managed.progress = TransferProgress(
                bytes: progress.bytes, total: progress.total, durableBytes: progress.durableBytes,
                bytesPerSecond: managed.meter.bytesPerSecond,
                secondsLeft: managed.meter.secondsLeft(bytes: progress.bytes, total: progress.total),
                writtenRanges: progress.writtenRanges, pieceLength: progress.pieceLength,
                connections: progress.connections)
            table[id] = managed
            publish(.progress(id, managed.progress))
        case .redirected:
            break
        case .restarting(let reason):
            managed.progress.bytes = 0
            managed.lastProblem = "restarted from zero: \(reason)"
            table[id] = managed
            publish(.restarting(id, reason))
        case .retrying(let attempt, let maxRetries, let delay, let reason):
            managed.lastProblem = "\(reason) (retry \(attempt) of \(maxRetries))"
            table[id] = managed
            publish(.retrying(id, attempt: attempt, maxRetries: maxRetries, delay: delay, reason: reason))
        case .notice(let text):
            publish(.notice(id, text))
        case .finishing:
            // Its bytes are in and its connections closed: its slot and its host's go to the next download while
            // it is checked, synced and renamed (as `curl --parallel-max` counts transfers). It stays running
            // until its run ends.
            guard let run = managed.run, run.markFinishing() else { return }
            // Nothing is fetched any more: no speed, no connection (the daemon's totals add these up). A small
            // download has reported neither, and costs nothing here.
            if managed.progress.bytesPerSecond != 0 || managed.progress.connections != 0 {
                managed.progress.bytesPerSecond = 0
                managed.progress.secondsLeft = nil
                managed.progress.connections = 0
                table[id] = managed
                publish(.progress(id, managed.progress))
            }
            queue.runFinishing()
            hosts.release(run.host, run.takeHostSlots())
            schedule()
        }
    }

    func runEnded(_ id: DownloadID, run: ManagerRun, _ outcome: Result<DownloadResult, DownloadError>) {
        hosts.release(run.host, run.takeHostSlots())
        queue.runEnded(id, current: table[id]?.run === run, finishing: run.isFinishing)
        defer { schedule() }
        guard var managed = table[id], managed.run === run else { return }
        managed.run = nil
        table[id] = managed
        // Into a folder, the run claims a name before its first request; one no response confirmed (the run ended
        // before its file was created or found) is given back: the next run chooses again.
        if managed.entry.destinationKind == .directory, managed.entry.resolvedPath == nil { claims.releaseAll(for: id) }
        // A download the user paused, cancelled or removed keeps that status; so does one stopped by close().
        guard managed.status == .running, !isClosed else { return }
        // A run that finished before it could be stopped for new settings or a new source is done, not redone.
        if managed.restartAfterRun, case .failure = outcome {
            let host = Self.hostKey(managed.entry.url)  // the new source's host, which may not be the old one
            // Straight into a new run only with the slot this one held: a finishing run gave its slot away, and
            // queues like any other download.
            if !run.isFinishing, hosts.acquire(host, upTo: 1) == 1 {
                start(id, host: host)
            } else {
                setStatus(id, .queued)  // a new run for the new source, when its host has room
            }
            return
        }
        switch outcome {
        case .success(let result):
            managed.entry.resolvedPath = result.destination
            managed.entry.totalBytes = result.bytes
            managed.entry.completedBytes = result.bytes
            managed.verifiedDigest = result.serverDigest.map { "\(result.serverDigestField ?? "digest") \($0)" }
            managed.progress = TransferProgress(
                bytes: result.bytes, total: result.bytes, durableBytes: result.bytes, writtenRanges: [0..<result.bytes],
                pieceLength: PieceLayout.pieceSize(forTotal: result.bytes))
            table[id] = managed
            publish(.progress(id, managed.progress))
            if result.alreadyComplete { publish(.alreadyComplete(id)) }
            setStatus(id, .completed)
        case .failure(let error):
            managed.entry.completedBytes = managed.progress.durableBytes
            table[id] = managed
            if let next = nextMirror(managed.entry, after: error) {
                switchSource(id, to: next, mirror: true)
                publish(.notice(id, "\(error.message); trying the next mirror, \(next)"))
                setStatus(id, .queued)
                return
            }
            setStatus(id, .failed(DownloadFailure(error)))
        }
    }

    /// The mirror to go on from after `error`, if one is left untried and another server could help.
    func nextMirror(_ entry: CatalogEntry, after error: DownloadError) -> String? {
        let all = entry.options.mirrors
        // Every mirror once: the others than the current one, or all of them when the current URL is not listed.
        let others = all.contains(entry.url) ? all.count - 1 : all.count
        guard all.count > 1, entry.options.mirrorsTried < others else { return nil }
        switch error.code {
        // Local problems, which another server cannot mend.
        case .cancelled, .io, .destinationExists, .invalidURL, .unsupportedScheme, .invalidOption, .unusableState,
            .nothingToResume:
            return nil
        default: break
        }
        let current = all.firstIndex(of: entry.url) ?? -1
        return all[(current + 1) % all.count]
    }

    /// Points the download at `url`, keeping its partial data for a server that proves the file is the same.
    func switchSource(_ id: DownloadID, to url: String, mirror: Bool) {
        guard var managed = table[id] else { return }
        point(&managed.entry, at: url)
        if mirror { managed.entry.options.mirrorsTried += 1 }
        managed.entry.updatedAt = Date().timeIntervalSince1970
        try? catalog.update(managed.entry)
        table[id] = managed
    }

    /// The entry's URL becomes `url`, the old one kept among those whose partial data it may resume (the last
    /// 32: an older state's URL is then simply not resumed from).
    func point(_ entry: inout CatalogEntry, at url: String) {
        heldIndex = nil  // the index knows the download by its URLs
        guard entry.url != url else { return }
        entry.options.formerURLs.removeAll { $0 == url || $0 == entry.url }
        entry.options.formerURLs.append(entry.url)
        if entry.options.formerURLs.count > 32 { entry.options.formerURLs.removeFirst(entry.options.formerURLs.count - 32) }
        entry.url = url
    }
}
