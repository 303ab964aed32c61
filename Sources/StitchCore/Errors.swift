#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A failed system call's `errno`, with its message. Internal: swift-system's public `Errno` is the one an app
/// imports; ``DownloadError/posixErrorCode`` gives ours as a number.
struct Errno: Error, Sendable, Hashable, CustomStringConvertible {
    /// The `errno` value.
    let rawValue: Int32

    /// Wraps an `errno` value.
    init(rawValue: Int32) { self.rawValue = rawValue }

    /// The calling thread's current `errno`.
    static var current: Errno { Errno(rawValue: errno) }

    /// `ENOSPC`: no space left on the device.
    static let noSpace = Errno(rawValue: ENOSPC)
    /// `EINTR`: the call was interrupted by a signal.
    static let interrupted = Errno(rawValue: EINTR)
    /// `ENOENT`: no such file or directory.
    static let noEntry = Errno(rawValue: ENOENT)

    /// The system's message for the error (`strerror`).
    var description: String { String(cString: strerror(rawValue)) }
}

/// Retries a system call while it fails with `EINTR`, as swift-system does.
@inline(__always)
func retryingOnInterrupt<T: BinaryInteger>(_ call: () -> T) -> T {
    while true {
        let result = call()
        if result == -1 && errno == EINTR { continue }
        return result
    }
}

/// Why a download did not finish.
///
/// One struct with an extensible ``Code`` (as async-http-client's `HTTPClientError`), a message for people and the
/// underlying cause. Only the CLI maps codes to exit statuses.
public struct DownloadError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is. Compare with the static members; new codes may be added.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        /// The code's name, e.g. `checksumMismatch` (as the catalog stores it).
        public var description: String { name }

        /// The URL cannot be parsed or has no host.
        public static let invalidURL = Code("invalidURL")
        /// A scheme other than http or https.
        public static let unsupportedScheme = Code("unsupportedScheme")
        /// A user-supplied option or header is malformed.
        public static let invalidOption = Code("invalidOption")
        /// The server answered with a status that is not worth retrying (4xx), or retries ran out on one.
        public static let httpStatus = Code("httpStatus")
        /// More than the allowed number of redirects, or a redirect loop.
        public static let redirects = Code("redirects")
        /// Certificate or handshake failure.
        public static let tls = Code("tls")
        /// Network failures went on past the retry budget; the partial download is kept and resumable.
        public static let retriesExhausted = Code("retriesExhausted")
        /// The host did not resolve, or refused or timed out every connection.
        public static let network = Code("network")
        /// The server broke the protocol in a way that cannot be retried.
        public static let protocolViolation = Code("protocolViolation")
        /// The file kept changing on the server across restarts.
        public static let unstableSource = Code("unstableSource")
        /// The downloaded bytes did not match the expected checksum.
        public static let checksumMismatch = Code("checksumMismatch")
        /// The destination exists and was not left by Stitch; pass `overwrite` to replace it.
        public static let destinationExists = Code("destinationExists")
        /// A state file beside the destination cannot be read or belongs to another download.
        public static let unusableState = Code("unusableState")
        /// A local file-system operation failed (disk full, permissions, …).
        public static let io = Code("io")
        /// The download was cancelled (or interrupted by a signal) after saving its state.
        public static let cancelled = Code("cancelled")
        /// There is no saved download to resume at the given path.
        public static let nothingToResume = Code("nothingToResume")

        /// The code whose ``description`` is `name` (a failure read back from the catalog).
        static func named(_ name: String) -> Code { Code(name) }
    }

    /// What kind of failure this is.
    public let code: Code
    /// One line for people.
    public let message: String
    /// The underlying error (a `TransportError`, or a system call's error: see ``posixErrorCode``), if any.
    public let cause: (any Error & Sendable)?
    /// The HTTP status involved, if any.
    public let httpStatus: Int?
    /// Whether a rerun of the same command continues from the saved state.
    public let isResumable: Bool
    /// What the user can do about it, if anything: the CLI renders it as a flag, a daemon in its own words.
    public let remedy: Remedy?

    /// What can be done about an error, in no interface's words (no command-line flag appears in a message).
    public enum Remedy: Sendable, Hashable, CustomStringConvertible {
        /// Allow the download to replace what is in the way (`stitch get --overwrite`).
        case overwrite(Purpose)
        /// Run the same download again: it resumes from what was saved.
        case rerun(Purpose)
        /// Download to a file instead of streaming it (`stitch get -o FILE`): a file can be resumed, a stream
        /// whose bytes have gone to the reader cannot.
        case saveToFile

        /// What taking the remedy achieves.
        public enum Purpose: Sendable, Hashable, CustomStringConvertible {
            /// `replace`: replace what is in the way; `startOver`: discard the partial data and start from zero;
            /// `downloadAgain`: fetch the file again; `resume`: continue from what was saved.
            case replace, startOver, downloadAgain, resume

            /// "to replace it", "to start over", …
            public var description: String {
                switch self {
                case .replace: return "to replace it"
                case .startOver: return "to start over"
                case .downloadAgain: return "to download it again"
                case .resume: return "to resume"
                }
            }
        }

        /// Words for any interface: "allow overwriting to replace it", "run it again to resume".
        public var description: String {
            switch self {
            case .overwrite(let purpose): return "allow overwriting \(purpose)"
            case .rerun(let purpose): return "run it again \(purpose)"
            case .saveToFile: return "download it to a file, which can be resumed"
            }
        }
    }

    init(
        _ code: Code, _ message: String, cause: (any Error & Sendable)? = nil, httpStatus: Int? = nil,
        resumable: Bool = false, remedy: Remedy? = nil
    ) {
        self.code = code
        self.message = message
        self.cause = cause
        self.httpStatus = httpStatus
        self.isResumable = resumable
        self.remedy = remedy
    }

    /// The `errno` of the system call that failed, for ``Code/io`` failures (`ENOSPC` when the disk is full, say):
    /// compare with the C constants or wrap it in swift-system's `Errno(rawValue:)`.
    public var posixErrorCode: Int32? { (cause as? Errno)?.rawValue }

    /// The message, and the remedy in general words.
    public var description: String { message + (remedy.map { "; \($0)" } ?? "") }

    /// `error` itself when it is a download error, else an I/O failure that says what it was (at the public
    /// boundary, where every error leaves as a ``DownloadError``).
    static func wrapping(_ error: any Error) -> DownloadError {
        if let error = error as? DownloadError { return error }
        return DownloadError(.io, "\(error)")
    }

    static func io(_ what: String, path: String, _ errno: Errno) -> DownloadError {
        DownloadError(.io, "\(what) \(path): \(errno)", cause: errno, resumable: true)
    }
}
