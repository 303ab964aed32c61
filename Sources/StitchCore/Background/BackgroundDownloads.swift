import Dispatch
public import Foundation
import Synchronization
import StitchLocks

/// Something that happened to a background download.
public enum BackgroundDownloadEvent: Sendable, Hashable {
    /// More bytes are durable in the part file: `durableBytes` of `totalBytes` (nil while the length is unknown).
    /// Only bytes synced to disk count; a task's bytes count once its whole range is in.
    case progress(DownloadID, durableBytes: Int64, totalBytes: Int64?)
    /// The saved bytes were thrown away and the download starts again from zero, for this reason.
    case restarted(DownloadID, reason: String)
    /// The file is complete and verified at `path`.
    case finished(DownloadID, path: String)
    /// The download stopped, for this reason; its part file and state stay, and ``BackgroundDownloads/resume(_:)``
    /// carries on from them.
    case failed(DownloadID, message: String)
}

/// What a background download is doing.
public struct BackgroundDownloadStatus: Sendable, Hashable {
    /// Where it is going.
    public enum Phase: Sendable, Hashable {
        /// Tasks are out for it.
        case active
        /// Paused: no tasks; its part file and state stay.
        case paused
        /// It stopped with this message; its part file and state stay.
        case failed(String)
    }

    /// The download's identifier.
    public var id: DownloadID
    /// The URL as given.
    public var url: String
    /// Where the file appears when it is complete and verified.
    public var destination: String
    /// Bytes durable in the part file.
    public var durableBytes: Int64
    /// The file's length, once known.
    public var totalBytes: Int64?
    /// What it is doing.
    public var phase: Phase
}

/// Downloads carried by a session of download tasks — on Apple platforms a background `URLSession`, whose system
/// daemon keeps them going while the app is suspended or not running — under the same rules as the engine: a file
/// appears at its destination only complete and verified, progress is only what is synced to disk, and bytes are
/// kept only with the evidence that they are of the same version of the file (docs/background-sessions.md).
///
/// A download is fetched as whole ranges, each a task: the first (the probe) learns the length and the validators;
/// with a strong validator and ranges the rest is cut into ranges asked for with `If-Range`; otherwise the whole
/// file is one task. A task's bytes become the download's only when its whole range has arrived and has been
/// judged: a 206 whose `Content-Range` is exactly the range asked for, of the length known, with the same
/// validators, and a file of exactly that size. Then they are copied into `DEST.part` at their offset, synced, and
/// recorded in the state file beside it. A 200 to a range request or a changed validator starts the download again
/// from zero, with an event saying why.
///
/// Create one per session identifier, early at every launch, and call ``reattach()``: it copies ranges that arrived
/// while the process was not running into their part files, and makes the session's tasks match what each download
/// still needs. The state directory holds the list of downloads and the files of tasks not yet copied; it must be
/// reachable by whichever process owns the session.
///
/// What it cannot do, against ``Downloader``: rate limits, stall timeouts, a connection per range (the session
/// chooses), per-hop redirect rules (the session follows redirects itself; only the final answer is judged), and
/// credentials (an `Authorization` field is refused: the session could carry it to another origin).
///
/// ```swift
/// // Early at every launch (on iOS, in application(_:didFinishLaunchingWithOptions:)):
/// let downloads = try BackgroundDownloads(identifier: "com.example.app.downloads", stateDirectory: supportPath)
/// Task { await downloads.reattach() }
/// Task { for await event in downloads.events { print(event) } }
///
/// let id = try await downloads.add("https://example.com/big.iso", to: documentsPath + "/big.iso")
///
/// // On iOS, from application(_:handleEventsForBackgroundURLSession:completionHandler:):
/// downloads.handleEvents(forBackgroundURLSession: identifier, completion: completionHandler)
/// ```
public final class BackgroundDownloads: Sendable {
    /// How downloads are cut into tasks and how often a range is asked for again.
    public struct Configuration: Sendable, Hashable {
        /// The size of the probe and the smallest range (rounded up to whole pieces). A lost task costs at most this.
        public var rangeSize: Int64 = 64 << 20
        /// The most ranges a download is cut into (ranges grow for larger files).
        public var maximumRanges: Int = 64
        /// How a failed range is asked for again: the download's rules (``RetryPolicy``): at most
        /// `maxRetries` times in a row, after `baseDelay` doubling with each further try (half of it fixed, half
        /// random), or after the server's `Retry-After`.
        public var retry = RetryPolicy()
        /// How many times a range is asked for again after failing before the download stops
        /// (`retry.maxRetries`).
        public var maximumRetries: Int {
            get { retry.maxRetries }
            set { retry.maxRetries = newValue }
        }
        /// The wait before a failed range is asked for again the first time (`retry.baseDelay`; later tries wait
        /// longer).
        public var retryDelay: Duration {
            get { .milliseconds(Int64(retry.baseDelay * 1000)) }
            set {
                let (seconds, attoseconds) = newValue.components
                retry.baseDelay = Double(seconds) + Double(attoseconds) * 1e-18
            }
        }
        /// How many times a download starts again from zero (the file changed on the server) before it stops.
        public var maximumRestarts: Int = 3

        /// The defaults.
        public init() {}
    }

    private let driver: BackgroundDriver
    /// The session's identifier.
    public let identifier: String

    /// Opens the driver of the session `identifier`, keeping its list in `stateDirectory` (created if missing).
    ///
    /// - Parameters:
    ///   - identifier: The session's identifier (on Apple platforms, the background session's; one per app or
    ///     extension).
    ///   - stateDirectory: Where the list of downloads and the files of finished tasks are kept.
    ///   - configuration: How downloads are cut into tasks.
    ///   - makeSession: Makes the session given where its events go (`import Stitch` adds an initializer without
    ///     it: the platform's download tasks).
    /// - Throws: ``DownloadError`` if the directory cannot be made or read, or a download's record there is damaged.
    public init(
        identifier: String, stateDirectory: String, configuration: Configuration = Configuration(),
        makeSession: @escaping @Sendable (any DownloadTaskEvents) -> any DownloadTaskSession
    ) throws(DownloadError) {
        self.identifier = identifier
        driver = try BackgroundDriver(directory: stateDirectory, configuration: configuration, makeSession: makeSession)
    }

    /// The downloads' events, for as long as the driver lives. One reader; events are buffered until read.
    public var events: AsyncStream<BackgroundDownloadEvent> { driver.events }

    /// Adds a download of `url` to the file at `destination` and sends its first task.
    ///
    /// - Parameters:
    ///   - url: An `http` or `https` URL.
    ///   - destination: The file's path; the part file, the state file and the live record go beside it.
    ///   - headers: Extra request header fields. `Range`, `If-Range` and `Accept-Encoding` are the driver's and are
    ///     replaced; `Authorization` is refused.
    ///   - checksum: The digest the finished file must have, checked before it is renamed into place.
    /// - Returns: The new download's identifier.
    /// - Throws: ``DownloadError`` for a bad URL or header, a destination another download of this driver has, or
    ///   a record that cannot be written.
    public func add(
        _ url: String, to destination: String, headers: [(name: String, value: String)] = [],
        checksum: ExpectedChecksum? = nil
    ) async throws(DownloadError) -> DownloadID {
        try await driver.performThrowing { driver throws(DownloadError) in
            try driver.add(url, to: destination, headers: headers, checksum: checksum)
        }
    }

    /// Adds a download of `url`; see ``add(_:to:headers:checksum:)-(String,_,_,_)``.
    public func add(
        _ url: URL, to destination: String, headers: [(name: String, value: String)] = [],
        checksum: ExpectedChecksum? = nil
    ) async throws(DownloadError) -> DownloadID {
        try await add(url.absoluteString, to: destination, headers: headers, checksum: checksum)
    }

    /// At every launch: copies what arrived while the process was not running into the part files, cancels the
    /// session's tasks that no download needs, and sends a task for every range that has none.
    public func reattach() async {
        let running = await driver.session.runningTasks()
        await driver.perform { driver in driver.reattach(running: running) }
    }

    /// On Apple platforms, from `application(_:handleEventsForBackgroundURLSession:completionHandler:)`: `completion`
    /// is called (on the main queue) once the session has delivered the events of its tasks that ended while the app
    /// was not running and the driver has taken their files in. Other identifiers are not this driver's: `completion`
    /// is not called. Elsewhere there are no such events, and it is called at once.
    ///
    /// Copying the ranges into their part files goes on afterwards; an app that is suspended before that ends finds
    /// the files staged at its next launch (``reattach()`` copies them).
    public func handleEvents(forBackgroundURLSession identifier: String, completion: @escaping @Sendable () -> Void) {
        guard identifier == self.identifier else { return }
        driver.session.whenEventsDelivered(completion)
    }

    /// Stops a download's tasks; its part file and state stay, and ``resume(_:)`` carries on from them.
    public func pause(_ id: DownloadID) async {
        await driver.perform { driver in driver.pause(id) }
    }

    /// Sends tasks again for a paused or failed download.
    public func resume(_ id: DownloadID) async {
        await driver.perform { driver in driver.resume(id) }
    }

    /// Stops a download and removes it with its part file and state (a finished file stays).
    public func remove(_ id: DownloadID) async {
        await driver.perform { driver in driver.remove(id) }
    }

    /// The downloads not yet finished, in the order they were added.
    public func downloads() async -> [BackgroundDownloadStatus] {
        await driver.perform { driver in driver.statuses() }
    }

    /// Lets the session go (its tasks are cancelled) and ends ``events``. Downloads stay as they are on disk.
    public func close() async {
        await driver.perform { driver in driver.close() }
    }

    /// The driver's internals, for tests that stop it at a given step as a crash would.
    var testDriver: BackgroundDriver { driver }
}

/// The driver's state and work, all on one serial queue (`queue`): the session's events, the public calls, and
/// the disk work they need, in order. Only ``BackgroundDownloads`` and tests use it.
final class BackgroundDriver: DownloadTaskEvents, Sendable {
    /// The steps of handling a finished range, at which a test can stop the driver as a crash would.
    enum Step: Sendable, Hashable {
        case accepted, copied, checkpointed
        /// The file is renamed into place; its record is not removed yet.
        case renamed
    }

    let directory: String
    let configuration: BackgroundDownloads.Configuration
    let staging: BackgroundStaging
    /// Inactive until the session exists, so no event is handled before `session` can be used.
    private let queue = DispatchQueue(label: "stitch.background", attributes: .initiallyInactive)
    private let sessionBox = Locked<(any DownloadTaskSession)?>(nil)
    let events: AsyncStream<BackgroundDownloadEvent>
    private let continuation: AsyncStream<BackgroundDownloadEvent>.Continuation
    private let serial = Atomic<Int>(0)
    /// A test's stop: when it returns true at a step, the driver stops there as if killed (nothing more is written,
    /// the part files are closed).
    let stopAt = Locked<(@Sendable (Step) -> Bool)?>(nil)

    // On `queue` only (``confined``):
    private struct Entry {
        var record: BackgroundRecord
        var store: PartStore?
        /// Running tasks by session identifier.
        var tasks: [Int: TaskLabel] = [:]
        /// Failures in a row, by range start.
        var failures: [Int64: Int] = [:]
    }
    private struct Confined {
        var entries: [DownloadID: Entry] = [:]
        var closed = false
        /// Tasks this driver cancelled: their completions are not failures.
        var cancelled: Set<Int> = []
        /// Tasks whose end (a file judged, or a failure) this launch has handled: a listing of the session's tasks
        /// taken before that is out of date for them.
        var ended: Set<Int> = []
    }
    /// The driver's state, reached on `queue` only (checked at each access).
    private let confined: QueueConfined<Confined>
    private var entries: [DownloadID: Entry] {
        get { confined.value.entries }
        _modify { yield &confined.value.entries }
    }
    private var closed: Bool {
        get { confined.value.closed }
        _modify { yield &confined.value.closed }
    }
    private var cancelled: Set<Int> {
        get { confined.value.cancelled }
        _modify { yield &confined.value.cancelled }
    }
    private var ended: Set<Int> {
        get { confined.value.ended }
        _modify { yield &confined.value.ended }
    }

    var session: any DownloadTaskSession { sessionBox.withLock { $0! } }

    init(
        directory: String, configuration: BackgroundDownloads.Configuration,
        makeSession: (any DownloadTaskEvents) -> any DownloadTaskSession
    ) throws(DownloadError) {
        self.directory = directory
        self.configuration = configuration
        self.staging = BackgroundStaging(directory: directory + "/staged")
        (events, continuation) = AsyncStream.makeStream()
        try BackgroundRecords.createDirectory(staging.directory)
        var initial = Confined()
        for record in try BackgroundRecords.load(from: directory) { initial.entries[record.id] = Entry(record: record) }
        confined = QueueConfined(initial, on: queue)
        let session = makeSession(self)
        sessionBox.withLock { $0 = session }
        queue.activate()
    }

    /// Runs `work` on the queue and returns its result.
    func perform<T: Sendable>(_ work: @escaping @Sendable (BackgroundDriver) -> T) async -> T {
        await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: work(self)) }
        }
    }

    func performThrowing<T: Sendable>(_ work: @escaping @Sendable (BackgroundDriver) throws(DownloadError) -> T) async throws(
        DownloadError
    ) -> T {
        let result: Result<T, DownloadError> = await perform { driver in
            do throws(DownloadError) { return .success(try work(driver)) } catch { return .failure(error) }
        }
        return try result.get()
    }

    // MARK: Public calls (on the queue)

    func add(
        _ url: String, to destination: String, headers: [(name: String, value: String)], checksum: ExpectedChecksum?
    ) throws(DownloadError) -> DownloadID {
        guard !closed else { throw DownloadError(.invalidOption, "the background downloads were closed") }
        _ = try validateURL(url)
        var fields: [String] = []
        for (name, value) in headers {
            // The engine's check (a token for the name, no control character but tab in the value), on the line
            // the record keeps; a name with a colon in it would split elsewhere.
            guard let (parsed, value) = Downloader.parseHeaderLine("\(name): \(value)"), parsed == name else {
                throw DownloadError(.invalidOption, "bad header field \(name.debugDescription)")
            }
            if name.lowercased() == "authorization" {
                throw DownloadError(
                    .invalidOption,
                    "background downloads do not send Authorization (the session follows redirects to any origin itself)"
                )
            }
            guard !ResumePolicy.ownedHeaders.contains(name.lowercased()) else { continue }
            fields.append("\(name): \(value)")
        }
        let destination = absolutePath(destination)
        guard !entries.values.contains(where: { $0.record.destination == destination }) else {
            throw DownloadError(.invalidOption, "\(destination) is already a download of these background downloads")
        }
        let folder = (destination as NSString).deletingLastPathComponent
        guard BackgroundRecords.isDirectory(folder) else {
            throw DownloadError(.io, "no folder \(folder) for \(destination)")
        }
        // Neither a file nor another run's partial download is replaced (the part file would be truncated).
        let paths = DownloadPaths(destination: destination)
        guard !BackgroundRecords.exists(destination) else {
            throw DownloadError(.destinationExists, "\(destination) already exists; remove it first")
        }
        guard !BackgroundRecords.exists(paths.part), !BackgroundRecords.exists(paths.state) else {
            throw DownloadError(
                .destinationExists, "\(paths.part) is another run's partial download; finish or remove it first")
        }
        var id = DownloadID.random()
        while entries[id] != nil { id = DownloadID.random() }
        let record = BackgroundRecord(
            id: id, url: url, destination: destination, headers: fields, checksum: checksum?.description,
            nonce: PartStore.newNonce(), kind: TaskLabel.Kind.probe.rawValue, added: now())
        try BackgroundRecords.write(record, in: directory)
        entries[id] = Entry(record: record)
        sendTasks(id)
        return id
    }

    func reattach(running: [DownloadTaskInfo]) {
        guard !closed else { return }
        staging.removeOrphans()
        commitAccepted()
        // Listed before this ran: a task whose end was handled since is not running any more, and a task this launch
        // sent since (a failure's retry that fired first) is running though not listed.
        let running = running.filter { !ended.contains($0.taskID) }
        let listed = Set(running.map(\.taskID))
        var labelled = running.compactMap { task in task.label.flatMap(TaskLabel.init(parsing:)).map { (task.taskID, $0) } }
        for entry in entries.values {
            let sent = entry.tasks.filter { !listed.contains($0.key) && !ended.contains($0.key) }
            labelled += sent.map { ($0.key, $0.value) }
        }
        for task in running where task.label.flatMap(TaskLabel.init(parsing:)).map({ entries[$0.download] == nil }) ?? true {
            cancel(task.taskID)
        }
        for id in entries.keys.sorted() {
            guard var entry = entries[id] else { continue }
            let mine = labelled.filter { $0.1.download == id }
            if entry.record.paused || entry.record.failure != nil {
                for (taskID, _) in mine { cancel(taskID) }
                continue
            }
            if finishedElsewhere(id) { continue }
            guard let needed = neededRanges(id) else { continue }
            if needed.isEmpty {
                // Every byte is durable (a crash after the last range was recorded, or during the finish).
                for (taskID, _) in mine { cancel(taskID) }
                finish(id)
                continue
            }
            let plan = BackgroundPlan.reconcile(
                tasks: mine.map { (taskID: $0.0, label: $0.1) }, download: id, nonce: entry.record.nonce,
                kind: entry.record.taskKind, needed: needed)
            for taskID in plan.cancel { cancel(taskID) }
            entry = entries[id] ?? entry
            for taskID in plan.cancel { entry.tasks[taskID] = nil }
            entry.tasks.merge(plan.keep) { _, new in new }
            entries[id] = entry
            for range in plan.create { sendTask(id, range) }
        }
    }

    func pause(_ id: DownloadID) {
        stop(id) { $0.paused = true }
    }

    /// Cancels the download's tasks, lets go of its part file (its lock and descriptor, until it resumes: another
    /// run may take the destination meanwhile) and records `change`.
    private func stop(_ id: DownloadID, _ change: (inout BackgroundRecord) -> Void) {
        guard var entry = entries[id] else { return }
        for taskID in entry.tasks.keys { cancel(taskID) }
        entry.tasks = [:]
        entry.store = nil
        change(&entry.record)
        entries[id] = entry
        try? BackgroundRecords.write(entry.record, in: directory)
    }

    func resume(_ id: DownloadID) {
        guard var entry = entries[id], !closed else { return }
        entry.record.paused = false
        entry.record.failure = nil
        entry.failures = [:]
        entries[id] = entry
        try? BackgroundRecords.write(entry.record, in: directory)
        commitAccepted()
        if finishedElsewhere(id) { return }
        if entries[id]?.tasks.isEmpty == true { sendTasks(id) }
    }

    func remove(_ id: DownloadID) {
        guard let entry = entries[id] else { return }
        for taskID in entry.tasks.keys { cancel(taskID) }
        entries[id] = nil
        if let store = entry.store {
            store.discard()
        } else {
            try? PartStore.removeLeftovers(at: DownloadPaths(destination: entry.record.destination))
        }
        staging.removeAccepted(of: id)
        BackgroundRecords.remove(id, in: directory)
    }

    func statuses() -> [BackgroundDownloadStatus] {
        entries.values.sorted { ($0.record.added, $0.record.id) < ($1.record.added, $1.record.id) }.map { entry in
            // A paused or failed download's store is closed: its state file says the same.
            let state =
                entry.store?.snapshot
                ?? (entry.record.taskKind == .probe
                    ? nil : try? StateFile.read(DownloadPaths(destination: entry.record.destination).state))
            let phase: BackgroundDownloadStatus.Phase =
                entry.record.failure.map { .failed($0) } ?? (entry.record.paused ? .paused : .active)
            return BackgroundDownloadStatus(
                id: entry.record.id, url: entry.record.url, destination: entry.record.destination,
                durableBytes: state?.durableBytes ?? 0, totalBytes: state?.validators.totalLength, phase: phase)
        }
    }

    func close() {
        guard !closed else { return }
        closed = true
        session.invalidate()
        for id in entries.keys { entries[id]?.store = nil }
        continuation.finish()
    }

    /// Stops as a crash would: no more events are handled, nothing more is written, the part files are closed.
    /// (Tests call it, on the queue, through ``stopAt`` or ``perform(_:)``.)
    func halt() {
        closed = true
        sessionBox.withLock { $0?.invalidate() }
        for id in entries.keys { entries[id]?.store = nil }
        continuation.finish()
    }

    private func stops(at step: Step) -> Bool {
        guard let stop = stopAt.withLock({ $0 }), stop(step) else { return false }
        halt()
        return true
    }

    // MARK: Session events

    func taskFinished(_ task: DownloadTaskInfo, file path: String) {
        // Before returning, as the session deletes the file then; judged on the queue.
        let taken = staging.takeIn(path, serial: serial.add(1, ordering: .relaxed).newValue)
        queue.async { [self] in
            guard !closed else {
                if let taken { BackgroundStaging.discard(taken) }
                return
            }
            guard let taken else {
                handleFailure(task, "the task's file could not be kept")
                return
            }
            judge(task, file: taken)
        }
    }

    func taskCompleted(_ task: DownloadTaskInfo, error: String?) {
        queue.async { [self] in
            guard !closed else { return }
            if cancelled.remove(task.taskID) != nil { return }
            guard let error else { return }
            handleFailure(task, error)
        }
    }

    // MARK: Judging and committing (on the queue)

    /// The download and generation a task is of, if it is one of ours that is still wanted.
    private func current(_ task: DownloadTaskInfo) -> (TaskLabel, Entry)? {
        guard let label = task.label.flatMap(TaskLabel.init(parsing:)), let entry = entries[label.download],
            label.nonce == entry.record.nonce, label.kind == entry.record.taskKind,
            task.requestedRange == label.rangeHeader, !entry.record.paused, entry.record.failure == nil
        else { return nil }
        return (label, entry)
    }

    private func judge(_ task: DownloadTaskInfo, file: String) {
        ended.insert(task.taskID)
        guard let (label, entry) = current(task) else {
            BackgroundStaging.discard(file)
            return
        }
        entries[label.download]?.tasks[task.taskID] = nil
        guard let fileSize = BackgroundStaging.size(of: file) else {
            retry(label, "the task's file is gone")
            return
        }
        let id = label.download
        let known: Validators?
        if label.kind == .range {
            guard let store = openStore(id) else {
                BackgroundStaging.discard(file)
                return
            }
            known = store.snapshot.validators
        } else {
            known = nil
        }
        let verdict = BackgroundPlan.judge(label, head: task.head, fileSize: fileSize, known: known)
        Trace.note("background \(label) \(task.head?.status ?? 0) \(fileSize) bytes: \(verdict)")
        switch verdict {
        case .range:
            let accepted = BackgroundStaging.Accepted(
                download: id, nonce: label.nonce, boot: BackgroundStaging.boot, range: label.start..<label.end!)
            guard let path = staging.accept(file, as: accepted) else {
                BackgroundStaging.discard(file)
                retry(label, "the task's file could not be kept")
                return
            }
            if stops(at: .accepted) { return }
            commit(path, accepted, label: label)
        case .probed(let validators):
            startRanges(id, probe: file, validators: validators)
        case .whole(let validators):
            finishWhole(id, file: file, validators: validators)
        case .needsWholeFile:
            BackgroundStaging.discard(file)
            var record = entry.record
            record.kind = TaskLabel.Kind.whole.rawValue
            guard persist(record) else { return }
            sendTasks(id)
        case .restart(let reason):
            BackgroundStaging.discard(file)
            restart(id, reason)
        case .retry(let why, let retryAfter):
            BackgroundStaging.discard(file)
            retry(label, why, retryAfter: retryAfter)
        case .fail(let why):
            BackgroundStaging.discard(file)
            fail(id, why)
        }
    }

    /// A task of `label` failed: ask again after the delay, or stop the download once retries run out.
    private func handleFailure(_ task: DownloadTaskInfo, _ why: String) {
        ended.insert(task.taskID)
        guard let (label, _) = current(task) else { return }
        entries[label.download]?.tasks[task.taskID] = nil
        retry(label, why)
    }

    private func retry(_ label: TaskLabel, _ why: String, retryAfter: String? = nil) {
        let id = label.download
        guard var entry = entries[id] else { return }
        let count = (entry.failures[label.start] ?? 0) + 1
        entry.failures[label.start] = count
        entries[id] = entry
        guard count <= configuration.retry.maxRetries else {
            fail(id, "\(why) (after \(count) tries)")
            return
        }
        let delay = configuration.retry.delay(
            attempt: count, retryAfter: retryAfter, now: now(), jitter: Double.random(in: 0...1))
        let nanoseconds = Int(delay * 1e9)
        queue.asyncAfter(deadline: .now() + .nanoseconds(nanoseconds)) { [self] in
            guard !closed, let entry = entries[id], entry.record.nonce == label.nonce,
                entry.record.taskKind == label.kind, !entry.record.paused, entry.record.failure == nil,
                !entry.tasks.values.contains(where: { $0.start == label.start })
            else { return }
            // Still needed? (A duplicate may have brought it meanwhile.)
            guard let needed = neededRanges(id), needed.contains(where: { $0.lowerBound == label.start }) else { return }
            send(label)
        }
    }

    private func fail(_ id: DownloadID, _ why: String) {
        guard entries[id] != nil else { return }
        stop(id) { $0.failure = why }
        continuation.yield(.failed(id, message: why))
    }

    /// The file changed on the server: a new generation, whose record is durable before the old bytes go (a crash
    /// in between finds a probe generation beside old files, and removes them).
    private func restart(_ id: DownloadID, _ reason: RestartReason) {
        guard var entry = entries[id] else { return }
        for taskID in entry.tasks.keys { cancel(taskID) }
        entry.tasks = [:]
        entry.failures = [:]
        entry.record.restarts += 1
        guard entry.record.restarts <= configuration.maximumRestarts else {
            entries[id] = entry
            fail(id, "\(reason) (the download started over \(configuration.maximumRestarts) times)")
            return
        }
        entries[id] = entry
        var record = entry.record
        record.nonce = PartStore.newNonce()
        record.kind = TaskLabel.Kind.probe.rawValue
        // The new generation is durable before the old bytes go; if it cannot be written the download stops as it
        // was (the old generation's record and files).
        guard persist(record) else { return }
        staging.removeAccepted(of: id)
        if let store = entry.store {
            store.discard()
            entries[id]?.store = nil
        } else {
            try? PartStore.removeLeftovers(at: DownloadPaths(destination: entry.record.destination))
        }
        continuation.yield(.restarted(id, reason: reason.description))
        sendTasks(id)
    }

    /// The probe brought the first bytes of a file that can be fetched in validated ranges: the part file and its
    /// state are made, laid out in ranges, the probe's bytes copied in and synced, and the other ranges sent.
    private func startRanges(_ id: DownloadID, probe file: String, validators: Validators) {
        defer { BackgroundStaging.discard(file) }
        guard var entry = entries[id], let total = validators.totalLength else { return }
        let paths = DownloadPaths(destination: entry.record.destination)
        do throws(DownloadError) {
            entries[id]?.store = nil
            let store = try PartStore.create(
                paths: paths, url: entry.record.url, headers: entry.record.headers, checksum: entry.record.checksum,
                validators: validators)
            guard let probed = BackgroundStaging.size(of: file) else {
                throw DownloadError(.io, "the probe's file is gone: \(file)")
            }
            let pieceSize = store.pieceSize
            let rest = BackgroundPlan.ranges(
                from: probed, to: total, rangeSize: rangeSize(pieceSize), pieceSize: pieceSize,
                maximumRanges: configuration.maximumRanges - 1)
            var slot = 0
            for range in rest {
                guard let next = store.split(slot, at: range.lowerBound) else {
                    throw DownloadError(.io, "cannot lay out \(paths.part) in ranges")
                }
                slot = next
            }
            let pieces = try BackgroundStaging.copy(
                file, length: probed, into: store, at: 0, pieceSize: pieceSize, total: total)
            store.noteWritten(0, probed)
            for (piece, crc) in pieces { store.notePiece(piece, crc: crc) }
            try store.checkpoint(force: true)
            entry.store = store
            entry.record.kind = TaskLabel.Kind.range.rawValue
            entries[id] = entry
            guard persist(entry.record) else { return }
            continuation.yield(.progress(id, durableBytes: store.snapshot.durableBytes, totalBytes: total))
            sendTasks(id)
        } catch {
            entries[id] = entry
            fail(id, error.description)
        }
    }

    /// The whole file arrived in one task: copied into a new part file, synced, verified, renamed into place.
    private func finishWhole(_ id: DownloadID, file: String, validators: Validators) {
        defer { BackgroundStaging.discard(file) }
        guard var entry = entries[id], let total = validators.totalLength else { return }
        do throws(DownloadError) {
            entries[id]?.store = nil
            let store = try PartStore.create(
                paths: DownloadPaths(destination: entry.record.destination), url: entry.record.url,
                headers: entry.record.headers, checksum: entry.record.checksum, validators: validators)
            // (An empty file's answer may be a 416 with a page: nothing of it is copied.)
            let pieces =
                total == 0
                ? [] : try BackgroundStaging.copy(file, length: total, into: store, at: 0, pieceSize: store.pieceSize, total: total)
            store.noteWritten(0, total)
            for (piece, crc) in pieces { store.notePiece(piece, crc: crc) }
            try store.checkpoint(force: true)
            entry.store = store
            entries[id] = entry
            finish(id)
        } catch {
            entries[id] = entry
            fail(id, error.description)
        }
    }

    /// Copies an accepted range into its part file, syncs it, records it durably, then removes the accepted file.
    /// `label`: the task that brought it, when it is committed as that task ends.
    private func commit(_ path: String, _ accepted: BackgroundStaging.Accepted, label: TaskLabel? = nil) {
        let id = accepted.download
        guard let entry = entries[id], accepted.nonce == entry.record.nonce, entry.record.taskKind == .range,
            accepted.boot == BackgroundStaging.boot, let store = openStore(id)
        else {
            BackgroundStaging.discard(path)
            return
        }
        let state = store.snapshot
        guard let total = state.validators.totalLength,
            let slot = state.segments.firstIndex(where: { segment in
                segment.start <= accepted.range.lowerBound && accepted.range.upperBound <= (segment.end ?? 0)
            }),
            store.written(slot) >= accepted.range.lowerBound
        else {
            BackgroundStaging.discard(path)
            return
        }
        if store.written(slot) >= accepted.range.upperBound {
            // Already in (a duplicate, or a copy a crash interrupted after its record): nothing to add, but it may
            // have been the last range.
            BackgroundStaging.discard(path)
            if store.snapshot.durableBytes == total { finish(id) }
            return
        }
        // An accepted file holds exactly its range (it was judged so). One that does not is dropped, nothing of it
        // claimed: a task that just ended is retried (counted); at a launch or a resume, the range is among those
        // the caller finds missing. (A file of the right size whose pages a power cut zeroed is kept out by its
        // name's boot id: it is from another boot.)
        guard BackgroundStaging.size(of: path) == Int64(accepted.range.count) else {
            BackgroundStaging.discard(path)
            if let label { retry(label, "the range's file does not hold its \(accepted.range.count) bytes") }
            return
        }
        do throws(DownloadError) {
            let pieces = try BackgroundStaging.copy(
                path, length: Int64(accepted.range.count), into: store, at: accepted.range.lowerBound,
                pieceSize: state.pieceSize, total: total)
            store.noteWritten(slot, accepted.range.upperBound)
            for (piece, crc) in pieces { store.notePiece(piece, crc: crc) }
            if stops(at: .copied) { return }
            try store.checkpoint(force: true)
            if stops(at: .checkpointed) { return }
            BackgroundStaging.discard(path)
            entries[id]?.failures[accepted.range.lowerBound] = nil
            let durable = store.snapshot.durableBytes
            continuation.yield(.progress(id, durableBytes: durable, totalBytes: total))
            if durable == total { finish(id) }
        } catch {
            // The accepted file stays: `resume` copies it again.
            fail(id, error.description)
        }
    }

    /// Copies every accepted file of this boot whose generation is current; removes the rest.
    private func commitAccepted() {
        for (path, accepted) in staging.acceptedFiles().sorted(by: { $0.accepted.range.lowerBound < $1.accepted.range.lowerBound }) {
            guard let entry = entries[accepted.download], accepted.nonce == entry.record.nonce else {
                BackgroundStaging.discard(path)
                continue
            }
            if entry.record.paused || entry.record.failure != nil { continue }
            commit(path, accepted)
        }
    }

    /// All bytes are durable: the checksum is checked, then the part file is renamed into place and the record goes.
    private func finish(_ id: DownloadID) {
        guard let entry = entries[id], let store = openStore(id), let total = store.snapshot.validators.totalLength,
            store.snapshot.durableBytes == total
        else { return }
        do throws(DownloadError) {
            if let text = entry.record.checksum {
                guard let expected = try? ExpectedChecksum(parsing: text) else {
                    throw DownloadError(.unusableState, "the record's checksum \(text) does not parse; nothing was checked")
                }
                let digest = try FileOperations.digest(ofFileAt: store.paths.part, expected.algorithm, length: total)
                guard expected.matches(digest) else {
                    // A new generation, durable before the bytes go (as a restart), so a crash in between never
                    // leaves a record of ranges without their state.
                    var record = entry.record
                    record.kind = TaskLabel.Kind.probe.rawValue
                    record.nonce = PartStore.newNonce()
                    guard persist(record) else { return }
                    store.discard()
                    entries[id]?.store = nil
                    fail(
                        id,
                        "checksum mismatch: expected \(expected), got \(expected.algorithm.name)=\(ExpectedChecksum.hexString(digest)); the downloaded data was deleted and nothing was saved at \(entry.record.destination)"
                    )
                    return
                }
            }
            // A file that appeared at the destination meanwhile is not ours to replace.
            guard !BackgroundRecords.exists(store.paths.destination) else {
                throw DownloadError(
                    .destinationExists,
                    "\(store.paths.destination) appeared while downloading and is not replaced; the download is kept as \(store.paths.part)"
                )
            }
            try store.finish(url: entry.record.url, length: total, durableCleanup: true)
        } catch {
            fail(id, error.description)
            return
        }
        if stops(at: .renamed) { return }
        completed(id)
    }

    /// The download's file is in place: its record and staged files go, and it is reported finished.
    private func completed(_ id: DownloadID) {
        guard let entry = entries[id] else { return }
        entries[id] = nil
        staging.removeAccepted(of: id)
        BackgroundRecords.remove(id, in: directory)
        continuation.yield(.finished(id, path: entry.record.destination))
    }

    /// Whether an earlier launch renamed the download's file into place and stopped before removing its record (the
    /// part file is gone, and the destination carries the completion mark of this URL); then it is completed now.
    private func finishedElsewhere(_ id: DownloadID) -> Bool {
        guard let entry = entries[id], entry.record.taskKind != .probe, entry.store == nil else { return false }
        let paths = DownloadPaths(destination: entry.record.destination)
        guard !BackgroundRecords.exists(paths.part), CompletionMark.read(at: paths.destination)?.url == entry.record.url
        else { return false }
        try? PartStore.removeLeftovers(at: paths)
        completed(id)
        return true
    }

    // MARK: Tasks

    /// The ranges the download still needs for its current generation; nil if its state cannot be opened (then it
    /// has failed).
    private func neededRanges(_ id: DownloadID) -> [Range<Int64>]? {
        guard let entry = entries[id] else { return nil }
        switch entry.record.taskKind {
        case .probe:
            // Whole mebibytes (the smallest piece), so the ranges after it start on a piece boundary.
            let mib = PieceLayout.minimumPieceSize
            return [0..<max(mib, (configuration.rangeSize + mib - 1) / mib * mib)]
        case .whole:
            return [0..<Int64.max]
        case .range:
            guard let store = openStore(id) else { return nil }
            return BackgroundPlan.missing(store.writtenSegments)
        }
    }

    /// Sends a task for every range the download needs and has none for.
    private func sendTasks(_ id: DownloadID) {
        guard let entry = entries[id], let needed = neededRanges(id) else { return }
        if needed.isEmpty {
            finish(id)
            return
        }
        let covered = Set(entry.tasks.values.map(\.start))
        for range in needed where !covered.contains(range.lowerBound) { sendTask(id, range) }
    }

    private func sendTask(_ id: DownloadID, _ range: Range<Int64>) {
        guard let entry = entries[id] else { return }
        let kind = entry.record.taskKind
        send(
            TaskLabel(
                download: id, nonce: entry.record.nonce, kind: kind, start: range.lowerBound,
                end: kind == .whole ? nil : range.upperBound))
    }

    private func send(_ label: TaskLabel) {
        guard let entry = entries[label.download], !closed else { return }
        var user = HTTPHeaders()
        for field in entry.record.headers {
            guard let (name, value) = Downloader.parseHeaderLine(field) else { continue }
            user.add(name: name, value: value)
        }
        // As the engine: stitch's User-Agent unless the caller set one (not the session's default, which names the
        // app and the HTTP library).
        if user["User-Agent"] == nil { user.add(name: "User-Agent", value: TransportOptions().userAgent) }
        let known = entry.store?.snapshot.validators
        guard label.kind != .range || known?.ifRange != nil else {
            fail(label.download, "no validator to ask for the bytes from \(label.start) with")
            return
        }
        let plan = RequestPlan(
            rangeStart: label.end == nil ? nil : label.start, resumeOffset: label.start,
            ifRange: label.kind == .range ? known?.ifRange : nil, rangeEnd: label.end)
        let request = DownloadTaskRequest(
            url: entry.record.url, headers: ResumePolicy.requestHeaders(user: user, plan: plan), label: label.description)
        let taskID = session.start(request)
        entries[label.download]?.tasks[taskID] = label
    }

    private func cancel(_ taskID: Int) {
        if !ended.contains(taskID) { cancelled.insert(taskID) }
        session.cancel(taskID: taskID)
    }

    // MARK: Disk

    /// The download's part store, reopened from its state file if it is not open; nil (and the download failed)
    /// when that fails.
    private func openStore(_ id: DownloadID) -> PartStore? {
        guard let entry = entries[id] else { return nil }
        if let store = entry.store { return store }
        let paths = DownloadPaths(destination: entry.record.destination)
        do throws(DownloadError) {
            guard let state = try StateFile.read(paths.state) else {
                throw DownloadError(.unusableState, "\(paths.state) is missing; remove the download and add it again")
            }
            let (store, _) = try PartStore.reopen(paths: paths, state: state)
            entries[id]?.store = store
            return store
        } catch {
            fail(id, error.description)
            return nil
        }
    }

    private func rangeSize(_ pieceSize: Int64) -> Int64 {
        max(configuration.rangeSize, pieceSize)
    }

    /// Writes the record durably; on failure the download fails with the reason (and false is returned).
    private func persist(_ record: BackgroundRecord) -> Bool {
        do throws(DownloadError) {
            try BackgroundRecords.write(record, in: directory)
            entries[record.id]?.record = record
            return true
        } catch {
            fail(record.id, error.description)
            return false
        }
    }
}
