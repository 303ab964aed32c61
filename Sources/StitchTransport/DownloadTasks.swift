// What the background driver (`BackgroundDownloads` in Stitch) asks of a session of download tasks: tasks that
// deliver a whole response body as a file, some time later, possibly to another process. Apple's background
// URLSession is the session this is shaped for; FoundationNetworking's download tasks (a foreground session) and
// test fakes conform too. docs/background-sessions.md has the design.

/// One download task to create: a GET of `url` with exactly these header fields.
public struct DownloadTaskRequest: Sendable, Hashable {
    /// The absolute URL, as the user gave it (the session follows redirects itself).
    public var url: String
    /// The header fields to send, `Range`, `If-Range` and `Accept-Encoding` among them.
    public var headers: HTTPHeaders
    /// Text the session keeps with the task and gives back with every event and listing (a task's
    /// `taskDescription`): how a relaunched driver knows which download and which bytes a task is for.
    public var label: String

    /// A request for `url` with these header fields and this label.
    public init(url: String, headers: HTTPHeaders, label: String) {
        self.url = url
        self.headers = headers
        self.label = label
    }
}

/// A download task as its session reports it.
public struct DownloadTaskInfo: Sendable, Hashable {
    /// The session's identifier for the task (unique within the session).
    public var taskID: Int
    /// The label the task was created with (``DownloadTaskRequest/label``), or nil if it has none.
    public var label: String?
    /// The final response's head (after redirects), when one arrived.
    public var head: ResponseHead?
    /// The `Range` field of the request the task was created from, as the session still holds it.
    public var requestedRange: String?

    /// A task with these properties.
    public init(taskID: Int, label: String?, head: ResponseHead?, requestedRange: String?) {
        self.taskID = taskID
        self.label = label
        self.head = head
        self.requestedRange = requestedRange
    }
}

/// Receives a download-task session's events. A session calls these on a queue of its own, one at a time.
public protocol DownloadTaskEvents: AnyObject, Sendable {
    /// The task's response body is complete in the file at `path`, which the session deletes when this returns:
    /// move it (or open it) before returning. Called before ``taskCompleted(_:error:)`` of the same task.
    func taskFinished(_ task: DownloadTaskInfo, file path: String)

    /// The task ended: `error` is nil after ``taskFinished(_:file:)``, or says why no file came (a failed
    /// connection, a cancellation, a body cut short).
    func taskCompleted(_ task: DownloadTaskInfo, error: String?)
}

/// A session of download tasks. A task's bytes reach the driver only as the whole file of a finished task; nothing
/// about them is claimed before that.
public protocol DownloadTaskSession: Sendable {
    /// Creates and starts a task; returns its identifier.
    func start(_ request: DownloadTaskRequest) -> Int

    /// Cancels the task with this identifier, if it is still running. Its completion follows with an error.
    func cancel(taskID: Int)

    /// The session's running tasks (after a relaunch: those the system kept going for the app).
    func runningTasks() async -> [DownloadTaskInfo]

    /// Cancels every task and lets the session go; no events follow.
    func invalidate()

    /// Calls `completion` once the session has handed over every event the system queued for it while the app was
    /// not running (Apple's background sessions: after `urlSessionDidFinishEvents(forBackgroundURLSession:)`). A
    /// session that queues no events calls it at once.
    func whenEventsDelivered(_ completion: @escaping @Sendable () -> Void)
}

extension DownloadTaskSession {
    /// Calls `completion` at once: this session queues no events for a later launch.
    public func whenEventsDelivered(_ completion: @escaping @Sendable () -> Void) {
        completion()
    }
}
