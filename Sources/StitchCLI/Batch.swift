import Foundation
import Stitch
import StitchLocks

/// `stitch get URL1 URL2 …` and `stitch get -i FILE`: many downloads through one ``DownloadManager``, `-j` at
/// once, one progress view, a summary at the end.
///
/// The manager's catalog lives in memory only (nothing is left behind, even after `kill -9`): what makes a rerun
/// resume only what is unfinished is each download's own state file (and the completion mark on finished
/// files), exactly as for a single `stitch get`.
enum Batch {
    /// One line of the list, ready to add (or already failed to parse into one).
    struct Item {
        var url: String
        var options: DownloadManager.AddOptions
        /// Why the list's entry cannot be downloaded (a bad value on its lines): it fails alone.
        var problem: String?
    }

    static func run(_ options: GetOptions, output: Output) async -> ExitStatus {
        let items: [Item]
        do {
            items = try makeItems(options, output: output)
        } catch let error as UsageError {
            output.error(error.message)
            return .usage
        } catch {
            output.error("\(error)")
            return .usage
        }
        for (name, file) in [("--ca-cert", options.caCert), ("--proxy-ca-cert", options.proxyCACert)] {
            if let file, access(file, R_OK) != 0 {
                output.error("\(name): cannot read \(file)")
                return .usage
            }
        }
        // Bad URLs fail on their own, like any other failed download, without stopping the rest.
        var invalid: [(url: String, message: String)] = []
        var valid: [Item] = []
        // Two entries that name one file fail alone too (the later one), instead of refusing the whole list.
        var destinations: Set<String> = []
        let defaultFolder = normalizedPath(options.directory ?? ".")
        for item in items {
            if let problem = item.problem {
                invalid.append((item.url, problem))
                output.error("\(item.url.debugDescription): \(problem)")
                output.json("error", ["url": item.url, "code": "invalidOption", "message": problem])
                continue
            }
            do {
                try Downloader.validate(url: item.url)
                if let out = item.options.out {
                    let folder = item.options.directory ?? defaultFolder
                    let path = normalizedPath(out.hasPrefix("/") ? out : folder + "/" + out)
                    guard destinations.insert(path).inserted else {
                        let message = "\(path) is already the destination of an earlier download in the list"
                        invalid.append((item.url, message))
                        output.error("\(item.url.debugDescription): \(message)")
                        output.json("error", ["url": item.url, "code": "invalidOption", "message": message])
                        continue
                    }
                }
                valid.append(item)
            } catch {
                invalid.append((item.url, error.message))
                output.error("\(item.url.debugDescription): \(error.message)")
                output.json("error", ["url": item.url, "code": "\(error.code)", "message": error.message])
            }
        }

        var configuration = DownloadManager.Configuration(downloadDirectory: normalizedPath(options.directory ?? "."))
        configuration.maxConcurrentDownloads = options.jobs ?? 5
        configuration.maxConnectionsPerHost = max(16, configuration.maxConcurrentDownloads)
        configuration.rateLimit = options.limitRate
        configuration.retry.maxRetries = options.retries
        if let base = ProcessInfo.processInfo.environment["STITCH_RETRY_BASE_DELAY"], let value = Double(base) {
            configuration.retry.baseDelay = value  // for tests of the binary; not a user-facing option
        }
        let tuning = TestTuning.fromEnvironment()
        tuning.minimumSplitSize.map { configuration.minimumSplitSize = $0 }
        tuning.singleConnectionRate.map { configuration.singleConnectionRate = $0 == 0 ? nil : $0 }
        tuning.automaticConnectionStep.map { configuration.automaticConnectionStep = $0 }
        configuration.connections = options.connections
        if let error = options.configure(&configuration.transport, for: valid.map(\.url)) {
            output.error(error.message)
            return .usage
        }

        // Like aria2, a list may name folders that do not exist yet (`dir=`, `out=sub/name`): create them, or
        // the download would fail to open its part file. One that cannot be created fails that download alone.
        createFolders(for: valid, defaultFolder: configuration.downloadDirectory)

        let manager: DownloadManager
        do {
            manager = try DownloadManager(configuration: configuration, transport: options.transport.cliTransport)
        } catch {
            output.error("\(error)")
            return .io
        }
        let view = BatchView(output: output, count: items.count, failed: invalid.count)
        let events = await manager.events(buffering: .unbounded)
        let consumer = Task {
            for await event in events { view.handle(event) }
        }
        let ticker = view.startTicker()

        let signals = SignalCatcher()
        signals.onSignal { Task { await manager.close() } }
        do {
            _ = try await manager.add(valid.map { ($0.url, $0.options) })
        } catch {
            ticker.cancel()
            await ticker.value
            output.endProgressLine()
            await manager.close()
            if signals.received != 0 {
                output.message("stitch: interrupted before the downloads started", always: true)
                return signals.received == SIGTERM ? .terminated : .interrupted
            }
            output.error("\(error)")
            return .usage
        }
        await manager.waitUntilIdle()
        let finals = await manager.downloads()
        await manager.close()
        await consumer.value
        // Wait for the ticker to stop, or its last line could come after the summary; then show the final count.
        ticker.cancel()
        await ticker.value
        view.tick()
        output.endProgressLine()

        if signals.received != 0 {
            let unfinished = finals.count { $0.status != .completed }
            output.message("stitch: interrupted; \(unfinished) unfinished download(s) saved — rerun to resume", always: true)
            return signals.received == SIGTERM ? .terminated : .interrupted
        }
        return summarize(finals, invalid: invalid, output: output, view: view)
    }

    /// The results as aria2c prints them at the end: one row per download, its status, size, average speed and
    /// path (or URL, if it never got a path).
    static func resultsTable(
        _ finals: [DownloadSnapshot], invalid: [(url: String, message: String)], view: BatchView
    ) -> String {
        var rows: [[String]] = [["status", "size", "speed", "path"]]
        for snapshot in finals {
            let status: String
            switch snapshot.status {
            case .completed: status = "OK"
            case .failed: status = "failed"
            default: status = "unfinished"
            }
            let speed = view.averageSpeed(of: snapshot.id).map { "\(Output.bytes(Int64($0)))/s" } ?? "-"
            let size = snapshot.progress.total ?? (snapshot.status == .completed ? snapshot.progress.bytes : nil)
            rows.append([status, size.map(Output.bytes) ?? "-", speed, snapshot.path ?? snapshot.url])
        }
        for entry in invalid { rows.append(["failed", "-", "-", entry.url]) }
        return DisplayWidth.table(rows)
    }

    /// The downloads the command line and the list ask for, in order.
    static func makeItems(_ options: GetOptions, output: Output) throws -> [Item] {
        func base() -> DownloadManager.AddOptions {
            var add = DownloadManager.AddOptions()
            // As wget and curl: a URL named twice is fetched twice (the second as `NAME.1.EXT`).
            add.reuseExisting = false
            add.headers = options.headers
            add.connections = options.connections
            add.overwrite = options.overwrite
            add.adopt = options.adopt
            add.ifNewer = options.ifNewer
            add.useAdvertisedMirrors = options.useAdvertisedMirrors
            return add
        }
        var items = options.urls.map { Item(url: $0, options: base()) }
        guard let inputFile = options.inputFile else { return items }
        let bytes: [UInt8]
        if inputFile == "-" {
            bytes = Array(FileHandle.standardInput.readDataToEndOfFile())
        } else {
            guard let data = FileManager.default.contents(atPath: inputFile) else {
                throw UsageError("-i: cannot read \(inputFile)")
            }
            bytes = Array(data)
        }
        let list: InputList
        do {
            list = try InputList.parse(bytes: bytes)
        } catch {
            throw UsageError("\(inputFile): \(error)")
        }
        for warning in list.warnings { output.message("stitch: \(inputFile): \(warning)") }
        for entry in list.entries {
            guard let listed = entry.uris.first else { continue }
            if let problem = entry.problem {
                items.append(Item(url: listed, options: base(), problem: "\(inputFile): \(problem); not downloaded"))
                continue
            }
            let (url, note) = CommandLineURL.assumingScheme(listed)
            if let note { output.message("stitch: \(inputFile): line \(entry.line): note: \(note)") }
            if entry.rateLimit != nil {
                output.message(
                    "stitch: \(inputFile): line \(entry.line): max-download-limit per download is not supported; "
                        + "--limit-rate caps the whole list")
            }
            var add = base()
            // aria2's TAB-separated URIs of one file: its mirrors, fetched from at once.
            if entry.uris.count > 1 {
                add.mirrors = [url] + entry.uris.dropFirst().map { CommandLineURL.assumingScheme($0).url }
            }
            add.out = entry.out
            add.directory = entry.dir.map(normalizedPath)
            add.checksum = entry.checksum
            if let connections = entry.connections { add.connections = connections }
            if let adopt = entry.adopt { add.adopt = adopt }
            if let ifNewer = entry.ifNewer { add.ifNewer = ifNewer }
            add.proxies = entry.proxies
            if !entry.proxies.isEmpty, options.transport == .urlSession {
                items.append(
                    Item(
                        url: url, options: add,
                        problem: "\(inputFile): line \(entry.line): a proxy needs the libcurl transport; not downloaded"))
                continue
            }
            if add.adopt && add.ifNewer {
                items.append(
                    Item(
                        url: url, options: add,
                        problem: "\(inputFile): line \(entry.line): 'adopt' and 'conditional-get' contradict (a partial "
                            + "file or a complete one); not downloaded"))
                continue
            }
            if add.adopt && entry.out == nil {
                items.append(
                    Item(
                        url: url, options: add,
                        problem: "\(inputFile): line \(entry.line): 'adopt' needs 'out' (the partial's name); not downloaded"))
                continue
            }
            // A header in the list replaces a -H header of the same name.
            let given = Set(entry.headers.compactMap { Downloader.parseHeaderLine($0)?.0.lowercased() })
            var headers = HTTPHeaders()
            for field in options.headers where !given.contains(field.name.lowercased()) {
                headers.add(name: field.name, value: field.value)
            }
            for line in entry.headers {
                if let (name, value) = Downloader.parseHeaderLine(line) { headers.add(name: name, value: value) }
            }
            add.headers = headers
            items.append(Item(url: url, options: add))
        }
        return items
    }

    /// Prints the summary and chooses the exit status: 0 when every download completed.
    static func summarize(
        _ finals: [DownloadSnapshot], invalid: [(url: String, message: String)], output: Output, view: BatchView
    ) -> ExitStatus {
        if output.mode == .human, finals.count + invalid.count > 1 {
            output.message(resultsTable(finals, invalid: invalid, view: view))
        }
        var completed = 0
        var failures: [(url: String, failure: DownloadFailure)] = []
        var unfinished = 0
        for snapshot in finals {
            switch snapshot.status {
            case .completed: completed += 1
            case .failed(let failure): failures.append((snapshot.url, failure))
            default: unfinished += 1
            }
        }
        let failedCount = failures.count + invalid.count
        var line = "\(completed) completed, \(failedCount) failed"
        if unfinished > 0 { line += ", \(unfinished) unfinished" }
        output.message(line, always: failedCount > 0)
        for (url, message) in invalid { output.message("  failed \(url): \(message)", always: true) }
        for (url, failure) in failures {
            output.message("  failed \(url): \(failure.commandLineMessage)", always: true)
        }
        output.json("summary", ["completed": completed, "failed": failedCount, "unfinished": unfinished])
        if failedCount == 0 && unfinished == 0 { return .success }
        if failures.contains(where: { $0.failure.code == .io }) { return .io }
        if invalid.isEmpty, !failures.isEmpty, failures.allSatisfy({ isTemporary($0.failure) }) {
            return .temporaryFailure
        }
        return .failure
    }

    /// A failure a rerun may get past, as ``ExitStatus/init(for:)`` judges one download: network failures and
    /// temporary HTTP statuses (408, 429, 5xx; the engine retries those, so one here outlasted --retries).
    static func isTemporary(_ failure: DownloadFailure) -> Bool {
        if failure.code == .retriesExhausted { return true }
        guard failure.code == .httpStatus, let status = failure.httpStatus else { return false }
        return ExitStatus.isTemporary(status)
    }

    /// Creates the folder each download saves in (its `dir=`, or `defaultFolder`, plus the folders of its `out=`).
    private static func createFolders(for items: [Item], defaultFolder: String) {
        var folders: Set<String> = []
        for item in items {
            var folder = item.options.directory ?? defaultFolder
            if let out = item.options.out, let slash = out.lastIndex(of: "/") {
                let sub = String(out[..<slash])
                folder = out.hasPrefix("/") ? sub : folder + "/" + sub
            }
            folders.insert(folder)
        }
        for folder in folders where !folder.isEmpty {
            try? DownloadPaths.createFolder(folder)
        }
    }
}

/// The progress of a whole list. On a terminal: a summary line and, when the terminal is tall enough, a line per
/// running download (as aria2c shows them), redrawn in place; otherwise the summary every 5 s. A line per event
/// worth telling, the finished paths on stdout, and a table of results at the end.
final class BatchView: Sendable {
    private let output: Output
    private let count: Int
    private let state = Locked(State())

    private struct State {
        var urls: [DownloadID: String] = [:]
        var paths: [DownloadID: String] = [:]
        var bytes: [DownloadID: Int64] = [:]
        var totals: [DownloadID: Int64] = [:]
        var meters: [DownloadID: SpeedMeter] = [:]
        /// When each download first ran and when it ended, for its average speed in the results.
        var started: [DownloadID: Double] = [:]
        var ended: [DownloadID: Double] = [:]
        var startBytes: [DownloadID: Int64] = [:]
        /// Running downloads in the order they started.
        var running: [DownloadID] = []
        var completed = 0
        var failed = 0
        var totalBytes: Int64 = 0
        var meter = SpeedMeter()
        var lastPlainLine = 0.0
    }

    /// `failed`: downloads that failed before reaching the manager (invalid URLs), counted from the start.
    init(output: Output, count: Int, failed: Int = 0) {
        self.output = output
        self.count = count
        state.withLock { $0.failed = failed }
    }

    func handle(_ event: DownloadManagerEvent) {
        let id = event.id
        var line: String?
        var json: (String, [String: Any])?
        var stdoutPath: String?
        let now = monotonicSeconds()
        state.withLock { state in
            switch event {
            case .added(let snapshot):
                state.urls[id] = snapshot.url
                if let path = snapshot.path { state.paths[id] = path }
            case .pathResolved(_, let path):
                state.paths[id] = path
            case .progress(_, let progress):
                state.totalBytes += progress.bytes - state.bytes[id, default: 0]
                state.bytes[id] = progress.bytes
                if let total = progress.total { state.totals[id] = total }
            case .alreadyComplete:
                let url = state.urls[id] ?? "\(id)"
                line = "\(state.paths[id] ?? url) is already complete"
                json = ("notice", ["id": "\(id)", "url": url, "message": "already complete"])
            case .restarting(_, let reason):
                let url = state.urls[id] ?? "\(id)"
                line = "stitch: \(url): starting over: \(reason)"
                json = ("restart", ["id": "\(id)", "url": url, "reason": "\(reason)"])
            case .retrying(_, let attempt, let maxRetries, let delay, let reason):
                let url = state.urls[id] ?? "\(id)"
                let text = "retry \(attempt)/\(maxRetries) in \(String(format: "%.1f", delay)) s: \(reason)"
                line = "stitch: \(url): \(text)"
                json = (
                    "retry",
                    ["id": "\(id)", "url": url, "attempt": attempt, "max": maxRetries, "delay": delay, "reason": reason]
                )
            case .notice(_, let text):
                let url = state.urls[id] ?? "\(id)"
                line = "stitch: \(url): \(text)"
                json = ("notice", ["id": "\(id)", "url": url, "message": text])
            case .statusChanged(_, let status):
                let url = state.urls[id] ?? "\(id)"
                if status != .running, let index = state.running.firstIndex(of: id) {
                    state.running.remove(at: index)
                    state.ended[id] = now
                }
                switch status {
                case .running:
                    if !state.running.contains(id) { state.running.append(id) }
                    if state.started[id] == nil {
                        state.started[id] = now
                        state.startBytes[id] = state.bytes[id, default: 0]
                    }
                case .completed:
                    state.completed += 1
                    let path = state.paths[id] ?? url
                    stdoutPath = path
                    json = ("done", ["id": "\(id)", "url": url, "path": path, "bytes": state.bytes[id, default: 0]])
                case .failed(let failure):
                    state.failed += 1
                    line = "stitch: failed \(url): \(failure.commandLineMessage)"
                    json = (
                        "error",
                        ["id": "\(id)", "url": url, "code": "\(failure.code)", "message": failure.commandLineMessage]
                    )
                default:
                    break
                }
            }
        }
        if let line { output.message(line, always: line.hasPrefix("stitch: failed")) }
        if let (name, fields) = json { output.json(name, fields) }
        if let stdoutPath, output.mode != .json { output.result(stdoutPath + "\n") }
    }

    func startTicker() -> Task<Void, Never> {
        Task { [self] in
            while true {
                try? await Task.sleep(for: .milliseconds(250))
                if Task.isCancelled { return }
                tick()
            }
        }
    }

    /// Redraws the live area (on a terminal; otherwise prints the summary at most every 5 s).
    func tick() {
        guard output.mode == .human else { return }
        let now = monotonicSeconds()
        let size = output.terminalSize
        let lines: [String]? = state.withLock { state in
            state.meter.add(bytes: state.totalBytes, at: now)
            for id in state.running { state.meters[id, default: SpeedMeter()].add(bytes: state.bytes[id, default: 0], at: now) }
            if !output.isTTY {
                guard now - state.lastPlainLine >= 5 else { return nil }
                state.lastPlainLine = now
            }
            let summary = "[\(state.completed + state.failed)/\(count) done, \(state.running.count) running"
                + (state.failed > 0 ? ", \(state.failed) failed" : "") + "]  "
                + "\(Output.bytes(state.totalBytes))  \(Output.bytes(Int64(max(0, state.meter.bytesPerSecond))))/s"
            guard output.isTTY, let size else { return [summary] }
            // A line per running download when they fit with room to spare for the messages above them: the area
            // takes at most half the screen, and the summary says how many more there are.
            let room = size.rows / 2 - 1
            guard room >= 1, !state.running.isEmpty else { return [summary] }
            let width = Output.width(size)
            let shown = state.running.count <= room ? state.running[...] : state.running.prefix(max(0, room - 1))
            var lines = [summary]
            for id in shown {
                let name = state.paths[id].map { ($0 as NSString).lastPathComponent } ?? state.urls[id] ?? "\(id)"
                let line = ProgressLine(
                    name: name, bytes: state.bytes[id, default: 0], total: state.totals[id],
                    speed: state.meters[id]?.bytesPerSecond ?? 0)
                lines.append(line.render(width: width))
            }
            if shown.count < state.running.count { lines.append("… and \(state.running.count - shown.count) more running") }
            return lines
        }
        guard let lines else { return }
        if output.isTTY { output.show(lines) } else { output.plainLine(lines[0]) }
    }

    /// Each download's average speed from when it started running to when it ended, if it ran.
    func averageSpeed(of id: DownloadID) -> Double? {
        state.withLock { state in
            guard let started = state.started[id], let ended = state.ended[id], ended > started else { return nil }
            return Double(state.bytes[id, default: 0] - state.startBytes[id, default: 0]) / (ended - started)
        }
    }
}
