import Foundation
import Glibc
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport
import StitchLocks

/// A download-task session that outlives its driver, as the system's daemon does: tasks keep running, and their
/// results wait, while no driver is attached; a new driver attaches and gets them. Tasks run only when the test says
/// (`runNext`, `runAll`) and results are handed over only when it says (`deliver`), so each crash point is reached
/// on an explicit step, never on timing. Answers come from a `ServedFile` with `If-Range` judged as a server would.
final class FakeDownloadTasks: DownloadTaskSession, @unchecked Sendable {
    struct Pending {
        var id: Int
        var request: DownloadTaskRequest
    }
    struct Done {
        var info: DownloadTaskInfo
        var path: String
    }
    private struct State {
        var events: (any DownloadTaskEvents)?
        var pending: [Pending] = []
        var done: [Done] = []
        var next = 1
        var requests: [DownloadTaskRequest] = []
    }
    private let state = Locked(State())
    let file: Locked<ServedFile>
    let folder: String

    init(file: ServedFile, folder: String) {
        self.file = Locked(file)
        self.folder = folder
    }

    func attach(_ events: any DownloadTaskEvents) { state.withLock { $0.events = events } }

    /// Every request a task was created with, in order.
    var requests: [DownloadTaskRequest] { state.withLock { $0.requests } }
    var pendingCount: Int { state.withLock { $0.pending.count } }

    func start(_ request: DownloadTaskRequest) -> Int {
        let id = state.withLock { state in
            let id = state.next
            state.next += 1
            state.pending.append(Pending(id: id, request: request))
            state.requests.append(request)
            return id
        }
        afterStart.withLock { $0 }?()
        return id
    }

    /// Called after each task is started (a test's explicit signal).
    let afterStart = Locked<(@Sendable () -> Void)?>(nil)

    func cancel(taskID: Int) {
        let (events, cancelled) = state.withLock { state -> ((any DownloadTaskEvents)?, Pending?) in
            guard let index = state.pending.firstIndex(where: { $0.id == taskID }) else { return (nil, nil) }
            return (state.events, state.pending.remove(at: index))
        }
        if let cancelled {
            events?.taskCompleted(Self.info(cancelled, head: nil), error: "cancelled")
        }
    }

    func runningTasks() async -> [DownloadTaskInfo] {
        let listed = state.withLock { $0.pending.map { Self.info($0, head: nil) } }
        afterListing.withLock { $0 }?()
        return listed
    }

    /// Called right after ``runningTasks()`` has made its list (a test's explicit signal).
    let afterListing = Locked<(@Sendable () -> Void)?>(nil)

    /// Ends the oldest pending task with a failure, as a dropped connection would.
    func failFirst() {
        let (events, failed) = state.withLock { state -> ((any DownloadTaskEvents)?, Pending?) in
            (state.events, state.pending.isEmpty ? nil : state.pending.removeFirst())
        }
        if let failed { events?.taskCompleted(Self.info(failed, head: nil), error: "the connection was reset") }
    }

    /// Detaches the driver; the tasks stay (the daemon keeps them).
    func invalidate() { state.withLock { $0.events = nil } }

    static func info(_ task: Pending, head: ResponseHead?) -> DownloadTaskInfo {
        DownloadTaskInfo(
            taskID: task.id, label: task.request.label, head: head, requestedRange: task.request.headers["Range"])
    }

    /// Runs the oldest pending task to completion; its result waits for ``deliver()``.
    @discardableResult
    func runNext() -> Bool {
        guard let task = state.withLock({ $0.pending.isEmpty ? nil : $0.pending.removeFirst() }) else { return false }
        let served = file.withLock { $0 }
        let data = served.data
        var headers = HTTPHeaders()
        if let etag = served.etag { headers.add(name: "ETag", value: etag) }
        var body = data[...]
        var status = 200
        if let range = task.request.headers["Range"], range.hasPrefix("bytes="),
            task.request.headers["If-Range"] == nil || task.request.headers["If-Range"] == served.etag
        {
            let bounds = range.dropFirst(6).split(separator: "-", omittingEmptySubsequences: false)
            let first = Int(bounds[0])!
            let last = min(bounds[1].isEmpty ? data.count - 1 : Int(bounds[1])!, data.count - 1)
            body = data[first...last]
            status = 206
            headers.add(name: "Content-Range", value: "bytes \(first)-\(last)/\(data.count)")
        }
        headers.add(name: "Content-Length", value: "\(body.count)")
        let path = "\(folder)/fake-\(task.id)"
        precondition(FileManager.default.createFile(atPath: path, contents: Data(body)), "cannot write \(path)")
        let done = Done(info: Self.info(task, head: ResponseHead(status: status, headers: headers)), path: path)
        state.withLock { $0.done.append(done) }
        return true
    }

    func runAll() { while runNext() {} }

    /// Hands every waiting result to the attached driver (none while detached), as the session's delegate queue does.
    func deliver() {
        let (events, done) = state.withLock { state -> ((any DownloadTaskEvents)?, [Done]) in
            guard let events = state.events else { return (nil, []) }
            defer { state.done = [] }
            return (events, state.done)
        }
        guard let events else { return }
        for result in done {
            events.taskFinished(result.info, file: result.path)
            unlink(result.path)  // the session deletes it once the callback returns
            events.taskCompleted(result.info, error: nil)
        }
    }
}

/// Relaunch and crash points of the background driver, over ``FakeDownloadTasks``: a driver stopped at each step of
/// taking a range in (accepted → copied → synced and recorded) or killed while its tasks finish, and a new driver on
/// the same state directory that must end byte-exact without asking again for a range it already holds.
@Suite struct BackgroundRelaunchTests {
    static let mib = 1 << 20
    static let etag = "\"relaunch\""

    final class Setup: Sendable {
        let folder: BackgroundDownloadsTests.Folder
        let fake: FakeDownloadTasks
        let file: ServedFile

        init(size: Int = 3 * BackgroundRelaunchTests.mib + 5, seed: UInt64) throws {
            folder = try BackgroundDownloadsTests.Folder()
            file = ServedFile.random(size: size, seed: seed, etag: BackgroundRelaunchTests.etag)
            mkdir(folder.path + "/session", 0o755)
            fake = FakeDownloadTasks(file: file, folder: folder.path + "/session")
        }

        /// A driver on the shared state directory, attached to the fake session.
        func driver() throws -> BackgroundDownloads {
            let fake = self.fake
            return try BackgroundDownloads(
                identifier: "relaunch", stateDirectory: folder.state,
                configuration: BackgroundDownloadsTests.configuration()
            ) { events in
                fake.attach(events)
                return fake
            }
        }

        var destination: String { folder.file("out.bin") }

        /// Waits until the driver has handled everything handed to it so far (its queue is serial).
        func settle(_ downloads: BackgroundDownloads) async -> [BackgroundDownloadStatus] {
            await downloads.downloads()
        }

        /// Runs and delivers tasks one at a time until none is left or `done` says stop.
        func drive(_ downloads: BackgroundDownloads, until done: () -> Bool = { false }) async {
            while !done(), fake.runNext() {
                fake.deliver()
                _ = await settle(downloads)
            }
        }
    }

    /// Each step of taking a range in, on the first range after the probe and on the last one (after which nothing
    /// is left to fetch: the relaunch must finish the download from what is on disk).
    @Test(arguments: [BackgroundDriver.Step.accepted, .copied, .checkpointed], [1, 3])
    func aDriverStoppedWhileTakingARangeInResumesWithoutAskingForItAgain(_ step: BackgroundDriver.Step, range: Int)
        async throws
    {
        let setup = try Setup(seed: 0xC1 + UInt64(String(describing: step).count + range))
        let first = try setup.driver()
        let hits = Atomic<Int>(0)
        // The `range`th range after the probe stops the driver at `step`.
        first.testDriver.stopAt.withLock { stop in
            stop = { at in at == step && hits.add(1, ordering: .relaxed).newValue == range }
        }
        let id = try await first.add("http://127.0.0.1:9/file", to: setup.destination)
        await setup.drive(first) { hits.load(ordering: .relaxed) >= range }
        #expect(hits.load(ordering: .relaxed) == range, "never reached \(step) of range \(range)")
        // Stopped: the probe's and the range's bytes are on disk (or staged), nothing is at the destination.
        #expect(access(setup.destination, F_OK) != 0)
        // At each of the three steps the accepted file is still there (it goes only after the state records it).
        #expect(setup.folder.stagedNames.contains { $0.hasPrefix("a-\(id)-") }, "\(setup.folder.stagedNames)")

        let second = try setup.driver()
        await second.reattach()
        await setup.drive(second)
        let statuses = await setup.settle(second)
        #expect(statuses.isEmpty, "\(statuses)")
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        // The probe and two ranges: none asked for twice.
        let ranges = setup.fake.requests.compactMap { $0.headers["Range"] }
        #expect(
            ranges == ["bytes=0-1048575", "bytes=1048576-2097151", "bytes=2097152-3145727", "bytes=3145728-3145732"],
            "a range asked for twice, or not at all: \(ranges)")
        #expect(setup.folder.names == ["out.bin"])
        #expect(setup.folder.stagedNames.isEmpty)
        await second.close()
    }

    @Test func aRangeStagedBeforeARebootIsFetchedAgain() async throws {
        let setup = try Setup(seed: 0xC7)
        let first = try setup.driver()
        let hits = Atomic<Int>(0)
        first.testDriver.stopAt.withLock { stop in
            stop = { at in at == .accepted && hits.add(1, ordering: .relaxed).newValue == 1 }
        }
        _ = try await first.add("http://127.0.0.1:9/file", to: setup.destination)
        await setup.drive(first) { hits.load(ordering: .relaxed) > 0 }
        // The accepted file now claims another boot: its bytes were never synced, so it proves nothing.
        let staged = try #require(setup.folder.stagedNames.first { $0.hasPrefix("a-") })
        var fields = staged.split(separator: "-").map(String.init)
        fields[3] = "0000000000000000"
        let renamed = fields.joined(separator: "-")
        #expect(rename(setup.folder.state + "/staged/" + staged, setup.folder.state + "/staged/" + renamed) == 0)
        let asked = setup.fake.requests.count

        let second = try setup.driver()
        await second.reattach()
        #expect(!setup.folder.stagedNames.contains(renamed))
        await setup.drive(second)
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        let again = setup.fake.requests.dropFirst(asked).compactMap { $0.headers["Range"] }
        let range = "bytes=\(fields[4])-\(Int(fields[5])! - 1)"
        #expect(again.contains(range), "\(range) not asked for again: \(again)")
        await second.close()
    }

    @Test func resultsThatArriveWhileNoDriverRunsAreTakenAtTheNextLaunch() async throws {
        let setup = try Setup(size: 4 * Self.mib, seed: 0xC8)
        let first = try setup.driver()
        let id = try await first.add("http://127.0.0.1:9/file", to: setup.destination)
        // The probe comes in; the driver sends the three other ranges, then the process dies.
        await setup.drive(first) { setup.fake.requests.count > 1 }
        _ = await setup.settle(first)
        #expect(setup.fake.pendingCount == 3)
        await first.testDriver.perform { driver in driver.halt() }
        // The daemon finishes every task while the app is not running.
        setup.fake.runAll()

        // Relaunched: the session hands the results over first, then the app reattaches.
        let second = try setup.driver()
        let events = Task { await BackgroundDownloadsTests.events(of: second, until: id) }
        setup.fake.deliver()
        await second.reattach()
        let seen = await events.value
        #expect(BackgroundDownloadsTests.finished(seen), "\(seen)")
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        #expect(setup.fake.requests.count == 4, "asked again: \(setup.fake.requests.map { $0.headers["Range"] ?? "" })")
        await second.close()
    }

    @Test func resultsDeliveredAfterTheRelaunchSentDuplicatesAreHarmless() async throws {
        let setup = try Setup(size: 4 * Self.mib, seed: 0xC9)
        let first = try setup.driver()
        _ = try await first.add("http://127.0.0.1:9/file", to: setup.destination)
        await setup.drive(first) { setup.fake.requests.count > 1 }
        _ = await setup.settle(first)
        await first.testDriver.perform { driver in driver.halt() }
        setup.fake.runAll()

        // The relaunched driver lists no running task (they all finished) and sends the three ranges again; then
        // the old results arrive, then the duplicates'.
        let second = try setup.driver()
        await second.reattach()
        #expect(setup.fake.pendingCount == 3)
        setup.fake.deliver()
        _ = await setup.settle(second)
        setup.fake.runAll()
        setup.fake.deliver()
        _ = await setup.settle(second)
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        #expect(await second.downloads().isEmpty)
        #expect(setup.folder.names == ["out.bin"])
        #expect(setup.folder.stagedNames.isEmpty)
        await second.close()
    }

    @Test func aRelaunchCancelsTasksOfAnEarlierGenerationAndOfUnknownDownloads() async throws {
        let setup = try Setup(seed: 0xCA)
        let first = try setup.driver()
        let id = try await first.add("http://127.0.0.1:9/file", to: setup.destination)
        await setup.drive(first) { setup.fake.requests.count > 1 }
        _ = await setup.settle(first)
        await first.testDriver.perform { driver in driver.halt() }
        // Tasks no download of this directory sent: a stale generation of this one, and another app's.
        let label = setup.fake.requests.last!.label
        let stale = label.replacingOccurrences(
            of: " \(label.split(separator: " ")[2]) ", with: " 0dd ")
        _ = setup.fake.start(DownloadTaskRequest(url: "http://127.0.0.1:9/file", headers: HTTPHeaders(), label: stale))
        _ = setup.fake.start(DownloadTaskRequest(url: "http://127.0.0.1:9/x", headers: HTTPHeaders(), label: "other app"))
        #expect(setup.fake.pendingCount == 5)

        let second = try setup.driver()
        await second.reattach()
        // Only the download's own tasks of its generation remain.
        let running = await setup.fake.runningTasks()
        #expect(running.count == 3, "\(running.map(\.label))")
        #expect(running.allSatisfy { $0.label?.contains(" \(id) ") == true && $0.label != stale })
        await setup.drive(second)
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        await second.close()
    }

    @Test func theAppsEventHandlerIsCalledForItsOwnSessionOnly() async throws {
        let setup = try Setup(seed: 0xCB)
        let downloads = try setup.driver()
        let calls = Atomic<Int>(0)
        // The fake queues no events for a later launch: the handler of this session's identifier is called at once.
        downloads.handleEvents(forBackgroundURLSession: "another") { calls.add(1, ordering: .relaxed) }
        #expect(calls.load(ordering: .relaxed) == 0)
        downloads.handleEvents(forBackgroundURLSession: "relaunch") { calls.add(1, ordering: .relaxed) }
        #expect(calls.load(ordering: .relaxed) == 1)
        await downloads.close()
    }

    @Test func aDriverStoppedAfterTheRenameCompletesWithoutFetchingAgain() async throws {
        let setup = try Setup(seed: 0xCC)
        let first = try setup.driver()
        first.testDriver.stopAt.withLock { stop in stop = { at in at == .renamed } }
        let id = try await first.add("http://127.0.0.1:9/file", to: setup.destination)
        await setup.drive(first)
        // In place, but the record says the download is still going.
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        #expect(access(setup.folder.state + "/\(id).json", F_OK) == 0)
        let asked = setup.fake.requests.count

        let second = try setup.driver()
        let events = Task { await BackgroundDownloadsTests.events(of: second, until: id) }
        await second.reattach()
        let seen = await events.value
        #expect(BackgroundDownloadsTests.finished(seen), "\(seen)")
        #expect(setup.fake.requests.count == asked, "fetched again")
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        #expect(setup.folder.names == ["out.bin"])
        #expect(await second.downloads().isEmpty)
        await second.close()
    }

    /// A task the relaunch listed as running ends (fails) before the listing is handled: its range must still get a
    /// task (the listing is out of date for it), not wait forever.
    @Test func aTaskThatEndsWhileTheRelaunchReconcilesIsAskedForAgain() async throws {
        let setup = try Setup(seed: 0xCD)
        let first = try setup.driver()
        let id = try await first.add("http://127.0.0.1:9/file", to: setup.destination)
        await setup.drive(first) { setup.fake.requests.count > 1 }
        _ = await setup.settle(first)
        await first.testDriver.perform { driver in driver.halt() }
        let second = try setup.driver()
        // The explicit signal: right after the session lists its tasks, the first of them fails.
        setup.fake.afterListing.withLock { $0 = { setup.fake.failFirst() } }
        await second.reattach()
        setup.fake.afterListing.withLock { $0 = nil }
        // The failure's retry sends a new task (after the configured 10 ms); wait for it with a deadline.
        let deadline = ContinuousClock.now + .seconds(60)
        while setup.fake.pendingCount < 3 && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
            _ = await setup.settle(second)
        }
        #expect(setup.fake.pendingCount == 3, "a range was left without a task")
        await setup.drive(second)
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        #expect(await second.downloads().first { $0.id == id } == nil)
        await second.close()
    }

    /// The other order of the same race (CI's fresh-machine failure, issue 31: 4 tasks where 3 were expected, under
    /// the whole suite's load): the failure's retry sends its task before the relaunch reconciles the listing taken
    /// before the failure. The reconcile must count that task as running and not send the range a second time.
    @Test func aRetrySentBeforeTheRelaunchReconcilesIsNotSentTwice() async throws {
        let setup = try Setup(seed: 0xCF)
        let first = try setup.driver()
        let id = try await first.add("http://127.0.0.1:9/file", to: setup.destination)
        await setup.drive(first) { setup.fake.requests.count > 1 }
        _ = await setup.settle(first)
        await first.testDriver.perform { driver in driver.halt() }
        #expect(setup.fake.pendingCount == 3)
        let second = try setup.driver()
        // Right after the session lists its tasks, the first of them fails, and the listing is handed over only once
        // the failure's retry has started its task (the explicit signal: a task started).
        let retried = DispatchSemaphore(value: 0)
        setup.fake.afterStart.withLock { $0 = { retried.signal() } }
        setup.fake.afterListing.withLock {
            $0 = {
                setup.fake.failFirst()
                _ = retried.wait(timeout: .now() + 60)
            }
        }
        await second.reattach()
        setup.fake.afterListing.withLock { $0 = nil }
        setup.fake.afterStart.withLock { $0 = nil }
        _ = await setup.settle(second)
        #expect(setup.fake.pendingCount == 3, "one task per range: \(setup.fake.requests.suffix(3).map(\.label))")
        let ranges = setup.fake.requests.compactMap { $0.headers["Range"] }
        #expect(Set(ranges).count == ranges.count - 1, "only the failed range asked for twice: \(ranges)")
        await setup.drive(second)
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        #expect(await second.downloads().first { $0.id == id } == nil)
        await second.close()
    }

    @Test func aFileThatAppearsAtTheDestinationIsNotReplaced() async throws {
        let setup = try Setup(seed: 0xCE)
        let downloads = try setup.driver()
        let id = try await downloads.add("http://127.0.0.1:9/file", to: setup.destination)
        // The probe comes in; then someone puts a file at the destination; then the rest arrives.
        await setup.drive(downloads) { setup.fake.requests.count > 1 }
        let mine = Array("someone else's file".utf8)
        #expect(FileManager.default.createFile(atPath: setup.destination, contents: Data(mine)))
        let events = Task { await BackgroundDownloadsTests.events(of: downloads, until: id) }
        await setup.drive(downloads)
        let seen = await events.value
        guard case .failed(_, let message) = seen.last else {
            Issue.record("not failed: \(seen)")
            return
        }
        #expect(message.contains("appeared while downloading and is not replaced"), "\(message)")
        #expect(BackgroundDownloadsTests.contents(setup.destination) == mine)
        // Every byte is kept beside it: once the file is moved away, resuming finishes without a request.
        let asked = setup.fake.requests.count
        #expect(rename(setup.destination, setup.destination + ".old") == 0)
        let more = Task { await BackgroundDownloadsTests.events(of: downloads, until: id) }
        await downloads.resume(id)
        let after = await more.value
        #expect(BackgroundDownloadsTests.finished(after), "\(after)")
        #expect(setup.fake.requests.count == asked)
        BackgroundDownloadsTests.expectFile(setup.destination, setup.file.data)
        await downloads.close()
    }
}
