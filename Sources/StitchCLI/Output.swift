import Foundation
import Stitch
import Synchronization

/// Writes results to stdout and progress/messages to stderr, from any thread.
final class Output: Sendable {
    enum Mode { case human, quiet, json }

    let mode: Mode
    let isTTY: Bool
    private let state = Mutex(State())

    struct State {
        var meter = SpeedMeter()
        var lastTime: Double = 0
        var speed: Double = 0
        var lastPlainLine: Double = 0
        var barShown = false
        var lastProgressJSON: Double = 0
    }

    init(mode: Mode) {
        self.mode = mode
        self.isTTY = isatty(STDERR_FILENO) == 1
    }

    static func stdout(_ text: String) {
        writeAll(STDOUT_FILENO, text)
    }

    /// A message for people on stderr (also in --json mode; not in --quiet mode unless `always`).
    func message(_ text: String, always: Bool = false) {
        if mode == .quiet && !always { return }
        state.withLock { state in
            var line = text + "\n"
            if state.barShown {
                line = "\r\u{1B}[K" + line
                state.barShown = false
            }
            writeAll(STDERR_FILENO, line)
        }
    }

    /// Moves past a live progress bar, if one is showing.
    func endProgressLine() {
        state.withLock { state in
            if state.barShown {
                writeAll(STDERR_FILENO, "\n")
                state.barShown = false
            }
        }
    }

    func error(_ text: String) { message("stitch: \(text)", always: true) }

    /// A status line: redrawn in place on a terminal, one line each otherwise (human mode only).
    func bar(_ line: String) {
        guard mode == .human else { return }
        state.withLock { state in
            if isTTY {
                writeAll(STDERR_FILENO, "\r\u{1B}[K" + line)
                state.barShown = true
            } else {
                writeAll(STDERR_FILENO, line + "\n")
            }
        }
    }

    /// One JSON object per line on stdout, with a format version.
    func json(_ event: String, _ fields: [String: Any]) {
        guard mode == .json else { return }
        var object = fields
        object["v"] = 1
        object["event"] = event
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return }
        Self.stdout(String(decoding: data, as: UTF8.self) + "\n")
    }

    func progress(_ progress: DownloadProgress) {
        let now = monotonicSeconds()
        state.withLock { state in
            // The first sample has no speed yet; a plain line would always say "0 B/s, ETA --:--".
            let firstSample = state.lastTime == 0
            state.meter.add(bytes: progress.bytes, at: now)
            state.speed = state.meter.bytesPerSecond
            state.lastTime = now
            switch mode {
            case .quiet: return
            case .json:
                guard now - state.lastProgressJSON >= 1 else { return }
                state.lastProgressJSON = now
                var fields: [String: Any] = [
                    "bytes": progress.bytes, "durable_bytes": progress.durableBytes,
                    "speed": Int(max(0, state.speed)),
                ]
                if let total = progress.total { fields["total"] = total }
                json("progress", fields)
            case .human:
                let line = Self.describe(progress, speed: state.speed)
                if isTTY {
                    writeAll(STDERR_FILENO, "\r\u{1B}[K" + line)
                    state.barShown = true
                } else if !firstSample, now - state.lastPlainLine >= 5 {
                    state.lastPlainLine = now
                    writeAll(STDERR_FILENO, line + "\n")
                }
            }
        }
    }

    static func describe(_ progress: DownloadProgress, speed: Double) -> String {
        let rate = "\(bytes(Int64(max(0, speed))))/s"
        guard let total = progress.total, total > 0 else {
            return "\(bytes(progress.bytes))  \(rate)"
        }
        let fraction = min(1, Double(progress.bytes) / Double(total))
        let width = 24
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "=", count: filled) + (filled < width ? ">" : "")
            + String(repeating: " ", count: max(0, width - filled - 1))
        var eta = "--:--"
        if speed > 1 {
            let seconds = Int(Double(total - progress.bytes) / speed)
            eta = seconds >= 3600
                ? String(format: "%d:%02d:%02d", seconds / 3600, seconds / 60 % 60, seconds % 60)
                : String(format: "%d:%02d", seconds / 60, seconds % 60)
        }
        return String(format: "%3d%% ", Int(fraction * 100)) + "[\(bar)] \(bytes(progress.bytes)) / \(bytes(total))  \(rate)  ETA \(eta)"
    }

    static func bytes(_ count: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var value = Double(count)
        var unit = 0
        while value >= 1024 && unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(count) B" : String(format: "%.1f %@", value, units[unit])
    }
}

func monotonicSeconds() -> Double {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}

/// Writes all of `text` to `fd` (unbuffered, so stdout and stderr interleave in order).
func writeAll(_ fd: Int32, _ text: String) {
    var bytes = Array(text.utf8)
    var done = 0
    while done < bytes.count {
        let n = bytes.withUnsafeMutableBytes { write(fd, $0.baseAddress! + done, $0.count - done) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { return }
        done += n
    }
}
