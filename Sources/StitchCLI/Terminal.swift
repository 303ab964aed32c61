import CStitchSystem
import Foundation

/// The size of the terminal on a descriptor, in character cells.
struct TerminalSize: Equatable, Sendable {
    var columns: Int
    var rows: Int

    /// The terminal's size as the kernel knows it (`TIOCGWINSZ`), or nil if `fd` is not a terminal or reports no
    /// size (a pty nobody sized says 0 × 0).
    static func of(_ fd: Int32) -> TerminalSize? {
        var columns: Int32 = 0
        var rows: Int32 = 0
        guard stitch_terminal_size(fd, &columns, &rows) == 0, columns > 0 else { return nil }
        return TerminalSize(columns: Int(columns), rows: Int(max(rows, 1)))
    }
}

/// Calls `action` on a dispatch queue whenever the terminal is resized (`SIGWINCH`), for the life of the watcher.
final class ResizeWatcher: @unchecked Sendable {
    // A dispatch source is not Sendable; it is only resumed here and cancelled in deinit.
    private let source: any DispatchSourceSignal

    init(_ action: @escaping @Sendable () -> Void) {
        // SIGWINCH is ignored by default; the source sees it either way, and nothing else in stitch handles it.
        signal(SIGWINCH, SIG_IGN)
        source = DispatchSource.makeSignalSource(signal: SIGWINCH, queue: .global())
        source.setEventHandler(handler: action)
        source.resume()
    }

    deinit { source.cancel() }
}

/// How many terminal columns text takes: East Asian wide and fullwidth characters (CJK, Hangul, kana, fullwidth
/// forms) and emoji shown as emoji take two, combining marks and format characters none, everything else one.
///
/// A grapheme cluster takes the sum of its scalars' widths (a letter and its accents one cell, a Devanagari
/// consonant and its vowel sign two), and at least two when U+FE0F makes it an emoji. Where terminals disagree —
/// a ZWJ family is two cells in some and six in others, as wcwidth counts it — this counts the wider answer, so a
/// line is at worst short, never wrapped.
enum DisplayWidth {
    static func of(_ text: String) -> Int {
        text.reduce(0) { $0 + of($1) }
    }

    static func of(_ character: Character) -> Int {
        var width = 0
        var emoji = false
        for scalar in character.unicodeScalars {
            if scalar == "\u{FE0F}" { emoji = true }
            width += of(scalar)
        }
        return emoji ? max(width, 2) : width
    }

    static func of(_ scalar: Unicode.Scalar) -> Int {
        let value = scalar.value
        if value < 0x7F { return value < 0x20 ? 0 : 1 }
        if value == 0xAD { return 1 }  // The soft hyphen is a format character that terminals draw.
        switch scalar.properties.generalCategory {
        case .nonspacingMark, .enclosingMark, .format, .control: return 0
        default: break
        }
        if (0x1160...0x11FF).contains(value) { return 0 }  // Hangul medial vowels and final consonants join.
        if scalar.properties.isEmojiPresentation { return 2 }
        for range in wide where range.contains(value) { return 2 }
        return 1
    }

    /// East Asian Width W and F outside the emoji (Unicode 15: Hangul Jamo, CJK radicals to CJK compatibility,
    /// Yi, Hangul syllables, compatibility ideographs, vertical and small forms, fullwidth forms, Tangut, kana
    /// supplements, the supplementary ideographic planes).
    private static let wide: [ClosedRange<UInt32>] = [
        0x1100...0x115F, 0x2329...0x232A, 0x2E80...0x303E, 0x3041...0x33FF, 0x3400...0x4DBF, 0x4E00...0x9FFF,
        0xA000...0xA4CF, 0xA960...0xA97F, 0xAC00...0xD7A3, 0xF900...0xFAFF, 0xFE10...0xFE19, 0xFE30...0xFE6F,
        0xFF00...0xFF60, 0xFFE0...0xFFE6, 0x16FE0...0x16FE4, 0x17000...0x18CFF, 0x1B000...0x1B2FF,
        0x1F200...0x1F251, 0x20000...0x2FFFD, 0x30000...0x3FFFD,
    ]

    /// Text that is safe to put on a terminal: control characters (which a file name from a server's
    /// `Content-Disposition` could carry, to move the cursor or retitle the window) and bidirectional overrides
    /// (which reorder what follows) become `?`.
    static func sanitized(_ text: String) -> String {
        var result = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            let isBidiControl = (0x202A...0x202E).contains(scalar.value) || (0x2066...0x2069).contains(scalar.value)
            if scalar.properties.generalCategory == .control || isBidiControl
                || scalar == "\u{2028}" || scalar == "\u{2029}"
            {
                result.append("?")
            } else {
                result.append(scalar)
            }
        }
        return String(result)
    }

    /// `sanitized` for a message of several lines: newlines and tabs stay.
    static func sanitizedKeepingLines(_ text: String) -> String {
        text.split(separator: "\n", omittingEmptySubsequences: false)
            .map { sanitized(String($0).replacingOccurrences(of: "\t", with: "    ")) }
            .joined(separator: "\n")
    }

    /// `text` cut to at most `columns` columns, never inside a character: the start and the end are kept (the end
    /// holds a file name's extension) around `…`.
    static func truncated(_ text: String, to columns: Int) -> String {
        guard columns > 0 else { return "" }
        if of(text) <= columns { return text }
        if columns == 1 { return "…" }
        let characters = Array(text)
        var tailBudget = (columns - 1) / 3
        var headBudget = columns - 1 - tailBudget
        var head = ""
        for character in characters {
            let width = of(character)
            if width > headBudget { break }
            head.append(character)
            headBudget -= width
        }
        tailBudget += headBudget  // What the head could not use (a wide character that did not fit).
        var tail: [Character] = []
        for character in characters.reversed() {
            let width = of(character)
            if width > tailBudget { break }
            tail.append(character)
            tailBudget -= width
        }
        return head + "…" + String(tail.reversed())
    }

    /// Rows as columns padded to their widest cell (by display width, after sanitizing), two spaces apart; the
    /// last column is not padded. `stitch ls` and the results table of a list.
    static func table(_ rows: [[String]]) -> String {
        let cells = rows.map { $0.map(sanitized) }
        guard let columns = cells.first?.count, columns > 0 else { return "" }
        var widths = [Int](repeating: 0, count: columns)
        for row in cells { for (column, cell) in row.enumerated() { widths[column] = max(widths[column], of(cell)) } }
        return cells.map { row in
            row.enumerated().map { column, cell in column == columns - 1 ? cell : padded(cell, to: widths[column]) }
                .joined(separator: "  ")
        }.joined(separator: "\n")
    }

    /// `text` padded with spaces on the right to `columns` columns (if it is narrower).
    static func padded(_ text: String, to columns: Int) -> String {
        text + String(repeating: " ", count: max(0, columns - of(text)))
    }
}

/// One download's progress as one line that fits a width: the richest layout that fits, from
/// `name  42% [=====>     ] 12.3 MiB / 40.0 MiB  5.2 MiB/s  ETA 0:05` down to `42%`.
struct ProgressLine: Sendable {
    var name: String?
    var bytes: Int64
    var total: Int64?
    var speed: Double
    /// Finished: shown as 100% of what arrived, without an ETA.
    var finished = false

    /// The line in at most `width` columns (the caller leaves the terminal's last column free, so that no terminal
    /// wraps the line).
    func render(width: Int) -> String {
        let known = total.flatMap { $0 > 0 ? $0 : nil }
        let fraction = finished ? 1 : known.map { min(1, Double(bytes) / Double($0)) }
        let percent = fraction.map { "\(Int($0 * 100))%".leftPadded(to: 4) }
        let rate = "\(Output.bytes(Int64(max(0, speed))))/s"
        let sizes = known.map { "\(Output.bytes(bytes)) / \(Output.bytes($0))" } ?? Output.bytes(bytes)
        var eta: String?
        if !finished, let known, speed > 1 {
            let seconds = Int(Double(max(0, known - bytes)) / speed)
            eta = "ETA " + Self.duration(seconds)
        } else if !finished, known != nil {
            eta = "ETA --:--"
        }
        // Each layout: the fields in order, and whether it has a bar. A name is worth more than the sizes and the
        // bar: every layout is tried with the name first, then without.
        let layouts: [([String?], Bool)] = [
            ([percent, sizes, rate, eta], true),
            ([percent, sizes, rate, eta], false),
            ([percent, rate, eta], false),
            ([percent ?? sizes, rate], false),
            ([percent ?? sizes], false),
        ]
        let name = name.map(DisplayWidth.sanitized).flatMap { $0.isEmpty ? nil : $0 }
        for withName in name == nil ? [false] : [true, false] {
            for (fields, hasBar) in layouts {
                if let line = Self.layout(fields, bar: hasBar ? fraction : nil, name: withName ? name : nil, width: width) {
                    return line
                }
            }
        }
        return DisplayWidth.truncated(percent ?? sizes, to: width)
    }

    /// `fields` (nil ones left out) after the name, with a bar after the first field when `bar` is set, in at most
    /// `width` columns; nil when they do not fit (the bar in fewer than 12, the name in fewer than 8 columns or
    /// its whole width if less).
    private static func layout(_ fields: [String?], bar: Double?, name: String?, width: Int) -> String? {
        let present = fields.compactMap { $0 }
        guard !present.isEmpty else { return nil }
        let barMinimum = 12
        var room = width - DisplayWidth.of(present.joined(separator: "  "))
        if bar != nil { room -= 1 + barMinimum }  // " [====>   ]" after the first field
        guard room >= 0 else { return nil }
        var parts: [String] = []
        if let name {
            // With a bar, the name takes up to two thirds of what is left beyond the bar's minimum (at least 24 columns
            // if there are that many); the rest widens the bar.
            let available = room - 2
            let nameWidth = DisplayWidth.of(name)
            let cap = bar != nil ? max(available * 2 / 3, min(available, 24)) : available
            let columns = min(nameWidth, cap)
            guard columns > 0, columns >= min(nameWidth, 8) else { return nil }
            let shown = DisplayWidth.truncated(name, to: columns)
            room -= DisplayWidth.of(shown) + 2
            parts.append(shown)
        }
        if let bar {
            parts.append(present[0] + " " + Self.bar(bar, width: min(barMinimum + room, 42)))
            parts.append(contentsOf: present.dropFirst())
        } else {
            parts.append(contentsOf: present)
        }
        return parts.joined(separator: "  ")
    }

    /// `[=====>    ]` in `width` columns, brackets included.
    static func bar(_ fraction: Double, width: Int) -> String {
        let inner = max(0, width - 2)
        let filled = Int(fraction * Double(inner))
        let arrow = filled < inner ? ">" : ""
        return "[" + String(repeating: "=", count: filled) + arrow
            + String(repeating: " ", count: max(0, inner - filled - arrow.count)) + "]"
    }

    static func duration(_ seconds: Int) -> String {
        seconds >= 3600
            ? String(format: "%d:%02d:%02d", seconds / 3600, seconds / 60 % 60, seconds % 60)
            : String(format: "%d:%02d", seconds / 60, seconds % 60)
    }
}

extension String {
    func leftPadded(to columns: Int) -> String {
        String(repeating: " ", count: max(0, columns - DisplayWidth.of(self))) + self
    }
}
