// Parsing shared by the engine and the backends that read ranges themselves (the URLSession backend's windows).

/// A parsed `Content-Range: bytes first-last/complete` (or `bytes */complete`).
package struct ContentRange: Sendable, Hashable {
    package var first: Int64?
    package var last: Int64?
    package var completeLength: Int64?

    package init?(parsing header: String) {
        let trimmed = header.trimming(" \t")
        guard trimmed.lowercased().hasPrefix("bytes ") else { return nil }
        let spec = String(trimmed.dropFirst(6)).trimming(" \t")
        let halves = spec.split(separator: "/", omittingEmptySubsequences: false)
        guard halves.count == 2 else { return nil }
        if halves[1] == "*" {
            completeLength = nil
        } else {
            guard let value = Self.number(halves[1]) else { return nil }
            completeLength = value
        }
        if halves[0] == "*" {
            guard completeLength != nil else { return nil }
            first = nil
            last = nil
        } else {
            let ends = halves[0].split(separator: "-", omittingEmptySubsequences: false)
            guard ends.count == 2, let a = Self.number(ends[0]), let b = Self.number(ends[1]), a <= b else { return nil }
            first = a
            last = b
        }
    }

    /// A non-negative decimal of at most 18 digits (below 10^18, so sums of offsets cannot overflow), else nil.
    package static func number(_ text: Substring) -> Int64? {
        guard !text.isEmpty, text.count <= 18, text.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        return Int64(text)
    }
}

extension String {
    /// Without the leading and trailing characters that are in `set`.
    package func trimming(_ set: String) -> String {
        var s = Substring(self)
        while let f = s.first, set.contains(f) { s.removeFirst() }
        while let l = s.last, set.contains(l) { s.removeLast() }
        return String(s)
    }
}
