// The `Link` header field (RFC 8288) as Metalink/HTTP (RFC 6249) uses it: `<URI>; rel=duplicate` names another
// server of the same file.

/// The links of a response head with a given relation.
package enum LinkHeader {
    /// The URIs of every `Link` of `head` whose `rel` (a token, or a quoted space-separated list) includes
    /// `relation` (case-insensitive), in order, lowest `pri` first when given (RFC 6249 §3.1: a lower value is
    /// preferred); duplicates left out.
    package static func targets(of head: ResponseHead, relation: String) -> [String] {
        var found: [(uri: String, priority: Int, order: Int)] = []
        for field in head.headers where HTTPHeaders.sameName(field.name, "link") {
            for value in links(in: field.value) {
                let rel = value.parameters["rel"]?.lowercased().split(separator: " ").map(String.init) ?? []
                guard rel.contains(relation.lowercased()) else { continue }
                let priority = value.parameters["pri"].flatMap { Int($0) } ?? 999_999
                found.append((value.uri, priority, found.count))
            }
        }
        var seen = Set<String>()
        return found.sorted { ($0.priority, $0.order) < ($1.priority, $1.order) }.map(\.uri).filter {
            seen.insert($0).inserted
        }
    }

    /// The link-values of one field: `<URI>` then `; name=value` parameters (values as tokens or quoted strings),
    /// separated by commas outside angle brackets and quotes. A value that does not parse is skipped.
    static func links(in text: String) -> [(uri: String, parameters: [String: String])] {
        var result: [(uri: String, parameters: [String: String])] = []
        var scalars = Substring(text).unicodeScalars[...]
        func skipBlanks() { while let c = scalars.first, c == " " || c == "\t" { scalars.removeFirst() } }
        while !scalars.isEmpty {
            skipBlanks()
            // A URI between < and > (one holds no < of its own: a < before the > starts the next try, so a hostile
            // run of them is read once, not once per <).
            let end = scalars.first == "<" ? scalars.dropFirst().firstIndex(where: { $0 == ">" || $0 == "<" }) : nil
            guard let close = end, scalars[close] == ">" else {
                // Not a link-value: skip to the next comma, or to the next <.
                let from = scalars.index(after: scalars.startIndex)
                guard let next = scalars[from...].firstIndex(where: { $0 == "," || $0 == "<" }) else { break }
                scalars = scalars[next...]
                if scalars.first == "," { scalars.removeFirst() }
                continue
            }
            let uri = String(String.UnicodeScalarView(scalars[scalars.index(after: scalars.startIndex)..<close]))
            scalars = scalars[scalars.index(after: close)...]
            var parameters: [String: String] = [:]
            while true {
                skipBlanks()
                guard scalars.first == ";" else { break }
                scalars.removeFirst()
                skipBlanks()
                var name = ""
                while let c = scalars.first, c != "=", c != ";", c != ",", c != " " {
                    name.unicodeScalars.append(c)
                    scalars.removeFirst()
                }
                skipBlanks()
                var value = ""
                if scalars.first == "=" {
                    scalars.removeFirst()
                    skipBlanks()
                    if scalars.first == "\"" {
                        scalars.removeFirst()
                        while let c = scalars.first, c != "\"" {
                            if c == "\\" { scalars.removeFirst() }
                            if let next = scalars.first { value.unicodeScalars.append(next); scalars.removeFirst() }
                        }
                        if !scalars.isEmpty { scalars.removeFirst() }
                    } else {
                        while let c = scalars.first, c != ";", c != ",", c != " ", c != "\t" {
                            value.unicodeScalars.append(c)
                            scalars.removeFirst()
                        }
                    }
                }
                if !name.isEmpty, parameters[name.lowercased()] == nil { parameters[name.lowercased()] = value }
            }
            result.append((uri, parameters))
            skipBlanks()
            if scalars.first == "," { scalars.removeFirst() }
        }
        return result
    }
}
