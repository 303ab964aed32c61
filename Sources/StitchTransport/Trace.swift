import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import StitchLocks

/// A diagnostic record of what the engine and the transport did, kept in memory only when `STITCH_TRACE` is set
/// in the environment (tests that wait on the engine print it when they fail). Off, each call site costs one load
/// of a constant: the message is never built.
package enum Trace {
    package static let enabled = getenv("STITCH_TRACE") != nil
    private static let lines = Locked<[String]>([])
    /// The newest lines kept.
    static let capacity = 200_000

    /// Adds a line when tracing is on. Inlinable, so that off it costs the call sites in other modules of the
    /// package (the engine's, per chunk of body) a load and a branch, not a call.
    @inlinable
    package static func note(_ message: @autoclosure () -> String) {
        guard enabled else { return }
        record(message())
    }

    /// Stamps `message` with the time and thread and keeps it.
    @usableFromInline
    static func record(_ message: String) {
        let line = String(format: "%.3f", monotonicNow()) + " [\(UInt(pthread_self()) % 1_000_000)] " + message
        lines.withLock { lines in
            if lines.count >= capacity { lines.removeFirst(capacity / 4) }
            lines.append(line)
        }
    }

    /// The lines that contain `text` (a download's URL, say).
    package static func lines(containing text: String) -> [String] {
        lines.withLock { $0.filter { $0.contains(text) } }
    }
}
