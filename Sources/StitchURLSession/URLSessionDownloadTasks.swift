import Dispatch
import Foundation
import StitchLocks
public import StitchTransport

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A ``DownloadTaskSession`` over `URLSession` download tasks: a background session on Apple platforms, an ordinary
/// one (FoundationNetworking) on Linux.
///
/// On Apple platforms the session is `URLSessionConfiguration.background(withIdentifier:)`: the system's daemon runs
/// the tasks while the app is suspended or not running, and a session made again with the same identifier after a
/// relaunch gets their events. That path is written for, but never compiled or run on, this project's machines
/// (README, "Platforms and transports").
///
/// On Linux there is no background session (swift-corelibs-foundation does not have one): the tasks run while the
/// process does, and a new process sees none of them. What the driver gets there is a range fetcher that spills
/// each response to a temporary file, measured in docs/background-sessions.md. FoundationNetworking never removes
/// those files, including the partial files of failed tasks; the driver moves every finished one away.
public final class URLSessionDownloadTasks: DownloadTaskSession {
    private let session: URLSession
    private let relay: DownloadTaskRelay

    /// A session with this identifier whose events go to `events`.
    ///
    /// - Parameters:
    ///   - identifier: The background session's identifier (Apple platforms); one per app or extension. Kept, and
    ///     without effect, on Linux.
    ///   - events: Where the tasks' events go (the driver). Held strongly until ``invalidate()``.
    public init(identifier: String, events: any DownloadTaskEvents) {
        #if canImport(Darwin)
        let configuration = URLSessionConfiguration.background(withIdentifier: identifier)
        configuration.sessionSendsLaunchEvents = true
        #else
        let configuration = URLSessionConfiguration.ephemeral
        configuration.identifier = identifier
        #endif
        configuration.keepsNothing()
        configuration.timeoutIntervalForRequest = 60
        let relay = DownloadTaskRelay(events: events)
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        queue.name = "stitch.download-tasks"
        self.relay = relay
        self.session = URLSession(configuration: configuration, delegate: relay, delegateQueue: queue)
    }

    public func start(_ request: DownloadTaskRequest) -> Int {
        var urlRequest = URLRequest(url: URL(string: request.url) ?? URL(fileURLWithPath: "/"))
        urlRequest.httpMethod = "GET"
        for field in request.headers { urlRequest.addValue(field.value, forHTTPHeaderField: field.name) }
        let task = session.downloadTask(with: urlRequest)
        task.taskDescription = request.label
        task.resume()
        return task.taskIdentifier
    }

    public func cancel(taskID: Int) {
        session.getAllTasks { tasks in
            for task in tasks where task.taskIdentifier == taskID { task.cancel() }
        }
    }

    public func runningTasks() async -> [DownloadTaskInfo] {
        await withCheckedContinuation { continuation in
            session.getAllTasks { tasks in
                continuation.resume(returning: tasks.map(DownloadTaskRelay.info(of:)))
            }
        }
    }

    public func invalidate() {
        relay.stop()
        session.invalidateAndCancel()
    }

    #if canImport(Darwin)
    /// Calls `completion` on the main queue after the session's `urlSessionDidFinishEvents(forBackgroundURLSession:)`
    /// (the handler the app got in `application(_:handleEventsForBackgroundURLSession:completionHandler:)`).
    public func whenEventsDelivered(_ completion: @escaping @Sendable () -> Void) {
        relay.eventsDelivered.withLock { $0 = completion }
    }
    #endif
}

/// The session's delegate: turns its callbacks into ``DownloadTaskEvents`` calls, on the session's serial queue.
final class DownloadTaskRelay: NSObject, URLSessionDownloadDelegate, Sendable {
    private let events: Locked<(any DownloadTaskEvents)?>

    init(events: any DownloadTaskEvents) {
        self.events = Locked(events)
    }

    func stop() { events.withLock { $0 = nil } }

    #if canImport(Darwin)
    /// The app's handler for a relaunch's events, called once they have all been delivered.
    let eventsDelivered = Locked<(@Sendable () -> Void)?>(nil)

    func urlSessionDidFinishEvents(forBackgroundURLSession session: URLSession) {
        guard let completion = eventsDelivered.withLock({ handler in defer { handler = nil }; return handler }) else {
            return
        }
        DispatchQueue.main.async { completion() }
    }
    #endif

    static func info(of task: URLSessionTask) -> DownloadTaskInfo {
        DownloadTaskInfo(
            taskID: task.taskIdentifier, label: task.taskDescription,
            head: (task.response as? HTTPURLResponse).map(URLSessionTransfer.head(of:)),
            requestedRange: task.originalRequest?.value(forHTTPHeaderField: "Range"))
    }

    func urlSession(_ session: URLSession, downloadTask: URLSessionDownloadTask, didFinishDownloadingTo location: URL) {
        guard let events = events.withLock({ $0 }) else { return }
        events.taskFinished(Self.info(of: downloadTask), file: location.path)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let events = events.withLock({ $0 }) else { return }
        events.taskCompleted(Self.info(of: task), error: error.map { ($0 as NSError).localizedDescription })
    }

    func urlSession(
        _ session: URLSession, downloadTask: URLSessionDownloadTask, didWriteData bytesWritten: Int64,
        totalBytesWritten: Int64, totalBytesExpectedToWrite: Int64
    ) {
        // Bytes in the system's temporary file: not progress (a lost task loses them), so not reported.
    }
}
