import Foundation
import Stitch
import Synchronization
import StitchLocks

/// Writes results to stdout and progress/messages to stderr, from any thread.
///
/// On a terminal, progress is a live area of one or more lines at the bottom of the screen: each line fitted to the
/// terminal's width (re-measured on `SIGWINCH`), redrawn in place, erased before anything else is printed and drawn
/// again after it. Elsewhere progress is a plain line every 5 s.
final class Output: Sendable {
    enum Mode { case human, quiet, json }

    let mode: Mode
    let isTTY: Bool
    /// Standard output is a terminal too (most likely the same one), so a result line must not land on the live area.
    private let stdoutIsTTY: Bool
    private let state: Locked<State>
    private let resizeWatcher = Locked<ResizeWatcher?>(nil)

    struct State {
        var meter = SpeedMeter()
        /// The meter has its first sample, from the first response's start (``bodyBegins(at:)``).
        var meterStarted = false
        var lastTime: Double = 0
        var speed: Double = 0
        var lastPlainLine: Double = 0
        var lastProgressJSON: Double = 0
        /// The single download's file name and latest progress (for its line and its final 100%).
        var name: String?
        var latest: DownloadProgress?
        /// What the live area shows (already fitted) and how many rows of the screen it takes.
        var live: [String] = []
        var shownRows = 0
        /// The width changed under a live area: the next output starts with a newline (see refreshSize).
        var pendingNewline = false
        /// The live area is the single download's progress line (drawn by `progress(_:)`).
        var singleLine = false
        var size: TerminalSize?
    }

    init(mode: Mode) {
        self.mode = mode
        let isTTY = isatty(STDERR_FILENO) == 1
        self.isTTY = isTTY
        self.stdoutIsTTY = isatty(STDOUT_FILENO) == 1
        var initial = State()
        initial.size = isTTY ? TerminalSize.of(STDERR_FILENO) : nil
        state = Locked(initial)
        if isTTY && mode == .human {
            resizeWatcher.withLock {
                $0 = ResizeWatcher { [weak self] in
                    self?.state.withLock { state in
                        // A single download's line is made again for the new width; a list's lines are cut to it
                        // until the list's next tick (a quarter of a second) makes them again.
                        if state.singleLine, let latest = state.latest {
                            Self.refreshSize(&state)
                            let line = ProgressLine(
                                name: state.name, bytes: latest.bytes, total: latest.total, speed: state.speed)
                            Self.draw([line.render(width: Self.width(state.size))], in: &state)
                        } else {
                            Self.draw(state.live, in: &state)
                        }
                    }
                }
            }
        }
    }

    /// The terminal's size (nil when stderr is not a terminal), read again now.
    var terminalSize: TerminalSize? {
        guard isTTY else { return nil }
        return state.withLock { state in
            Self.refreshSize(&state)
            return state.size
        }
    }

    static func stdout(_ text: String) {
        writeAll(STDOUT_FILENO, text)
    }

    /// A result on stdout (a saved file's path): the live area is erased first when both are on a terminal, and
    /// drawn again after.
    func result(_ text: String) {
        state.withLock { state in
            if isTTY { Self.refreshSize(&state) }
            guard stdoutIsTTY, state.shownRows > 0 else {
                let lead = Self.takeNewline(&state)
                if !lead.isEmpty { writeAll(STDERR_FILENO, lead) }
                writeAll(STDOUT_FILENO, text)
                return
            }
            writeAll(STDERR_FILENO, Self.erasure(state.shownRows))
            state.shownRows = 0
            writeAll(STDOUT_FILENO, text)
            Self.draw(state.live, in: &state)
        }
    }

    /// A message for people on stderr (also in --json mode; not in --quiet mode unless `always`), above the live
    /// area.
    func message(_ text: String, always: Bool = false) {
        if mode == .quiet && !always { return }
        state.withLock { state in
            if isTTY { Self.refreshSize(&state) }
            let erase = Self.takeNewline(&state) + (state.shownRows > 0 ? Self.erasure(state.shownRows) : "")
            state.shownRows = 0
            writeAll(STDERR_FILENO, erase + DisplayWidth.sanitizedKeepingLines(text) + "\n")
            Self.draw(state.live, in: &state)
        }
    }

    /// Leaves the live area on the screen as it is and moves past it: it is finished.
    func endProgressLine() {
        state.withLock { state in
            if state.shownRows > 0 || state.pendingNewline { writeAll(STDERR_FILENO, "\n") }
            state.shownRows = 0
            state.pendingNewline = false
            state.live = []
            Self.liveAreaShown.store(false, ordering: .releasing)
        }
    }

    /// Draws the single download's line once more at 100% (it arrived whole), then moves past it.
    func finishProgress(bytes: Int64) {
        state.withLock { state in
            guard mode == .human, isTTY, state.latest != nil || state.shownRows > 0 else { return }
            let line = ProgressLine(name: state.name, bytes: bytes, total: bytes, speed: state.speed, finished: true)
            Self.refreshSize(&state)
            Self.draw([line.render(width: Self.width(state.size))], in: &state)
        }
        endProgressLine()
    }

    /// An error ends the live area (left as it was, the last progress before the failure) and goes below it.
    func error(_ text: String) {
        endProgressLine()
        message("stitch: \(text)", always: true)
    }

    /// Replaces the live area with `lines` (human mode, on a terminal), each cut to the terminal's width.
    func show(_ lines: [String]) {
        guard mode == .human, isTTY else { return }
        state.withLock { state in Self.draw(lines, in: &state) }
    }

    /// A plain progress line for a log (human mode, not a terminal).
    func plainLine(_ line: String) {
        guard mode == .human, !isTTY else { return }
        writeAll(STDERR_FILENO, DisplayWidth.sanitized(line) + "\n")
    }

    /// The columns a live line may take: all but the terminal's last (writing into the last column leaves some
    /// terminals about to wrap).
    static func width(_ size: TerminalSize?) -> Int {
        max(1, (size?.columns ?? 100) - 1)
    }

    /// Erases a live area of `rows` rows whose last row holds the cursor, row by row from the last up (EL 2, then
    /// up one), and leaves the cursor at the start of its first row. Lines, not the screen: erasing to the end of
    /// the screen (ED) from a screen's first row clears the whole screen, which tmux (scroll-on-clear) and some
    /// terminals keep in their history — a copy of every frame.
    private static func erasure(_ rows: Int) -> String {
        "\r\u{1B}[2K" + String(repeating: "\u{1B}[1A\u{1B}[2K", count: max(0, rows - 1))
    }

    /// Whether a live area is on the screen, for an exit that cannot wait for its owner (a second Ctrl-C): it
    /// then ends the line first.
    static let liveAreaShown = Atomic<Bool>(false)

    /// Reads the terminal's size again (every draw: one ioctl, so a resize is followed even before its SIGWINCH
    /// arrives). When the width changed under a live area, the area is left where it is and the next draw starts
    /// on a new row below it: a terminal that re-wraps lines on a resize (most do; xterm and pyte do not) has
    /// turned the area into more rows than were drawn, which no erase can count, so one stale copy stays above
    /// rather than fragments of it or of what was printed before it.
    private static func refreshSize(_ state: inout State) {
        guard let size = TerminalSize.of(STDERR_FILENO) else { return }
        if let old = state.size, old.columns != size.columns, state.shownRows > 0 {
            // Written with the next output, not now: one write per redraw, so nothing sees a half-made frame.
            state.pendingNewline = true
            state.shownRows = 0
        }
        state.size = size
    }

    private static func takeNewline(_ state: inout State) -> String {
        guard state.pendingNewline else { return "" }
        state.pendingNewline = false
        return "\n"
    }

    private static func draw(_ lines: [String], in state: inout State) {
        refreshSize(&state)
        let width = width(state.size)
        // Never more rows than the screen has less one, or the terminal scrolls the area's top away.
        let fitted = lines.prefix(max(1, (state.size?.rows ?? 2) - 1)).map {
            DisplayWidth.truncated(DisplayWidth.sanitized($0), to: width)
        }
        let erase = takeNewline(&state) + (state.shownRows > 0 ? erasure(state.shownRows) : "")
        state.live = lines
        guard !fitted.isEmpty || !erase.isEmpty else { return }
        writeAll(STDERR_FILENO, erase + fitted.joined(separator: "\n"))
        state.shownRows = fitted.count
        liveAreaShown.store(state.shownRows > 0, ordering: .releasing)
    }

    /// The single download's file name, for its progress line.
    func setName(_ name: String) {
        state.withLock { $0.name = name }
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

    /// A response's body starts at `offset`: the speed is measured from here, so the first progress line already
    /// has one (a meter with one sample has none, and the line would say "0 B/s, ETA --:--" while bytes arrive).
    func bodyBegins(at offset: Int64) {
        let now = monotonicSeconds()
        state.withLock { state in
            guard state.lastTime == 0, !state.meterStarted else { return }
            state.meterStarted = true
            state.meter.add(bytes: offset, at: now)
        }
    }

    func progress(_ progress: DownloadProgress) {
        let now = monotonicSeconds()
        state.withLock { state in
            // The first sample has no speed yet; a plain line would always say "0 B/s, ETA --:--".
            let firstSample = state.lastTime == 0
            state.meter.add(bytes: progress.bytes, at: now)
            state.speed = state.meter.bytesPerSecond
            state.lastTime = now
            state.latest = progress
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
                let line = ProgressLine(name: state.name, bytes: progress.bytes, total: progress.total, speed: state.speed)
                if isTTY {
                    // No speed measured yet (the meter needs a tenth of a second of samples): the line would say
                    // "0 B/s, ETA --:--" while bytes arrive. The next tick draws it (and `finishProgress` the
                    // final 100% in any case); a download that stalls is measured at 0 B/s a tenth of a second
                    // on. Seen on a loaded machine, where the first tick can follow the body's start by a few
                    // milliseconds, or come before its event.
                    if !state.meter.hasMeasured { return }
                    Self.refreshSize(&state)
                    Self.draw([line.render(width: Self.width(state.size))], in: &state)
                    state.singleLine = true
                } else if !firstSample, now - state.lastPlainLine >= 5 {
                    state.lastPlainLine = now
                    writeAll(STDERR_FILENO, DisplayWidth.sanitized(line.render(width: 100)) + "\n")
                }
            }
        }
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
