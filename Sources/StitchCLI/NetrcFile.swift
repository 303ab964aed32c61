import Foundation

/// A netrc file read for one thing libcurl's netrc support does not cover: the password of a proxy
/// (`--proxy-user USER` with `--netrc` or `--netrc-file FILE`). The format as libcurl and ftp(1) read it: tokens
/// separated by white space, `machine NAME` opening an entry (`default` one for every other host), `login` and
/// `password` within it, `macdef NAME` a macro skipped up to the next empty line; a token may be in double quotes
/// with `\` escapes.
struct NetrcFile {
    struct Entry: Equatable {
        var machine: String?  // nil: `default`
        var login: String?
        var password: String?
    }

    let entries: [Entry]

    init(text: String) {
        var entries: [Entry] = []
        var tokens = Self.tokens(text)[...]
        while let token = tokens.popFirst() {
            switch token {
            case "machine":
                entries.append(Entry(machine: tokens.popFirst()))
            case "default":
                entries.append(Entry(machine: nil))
            case "login":
                let value = tokens.popFirst()
                if !entries.isEmpty { entries[entries.count - 1].login = value }
            case "password":
                let value = tokens.popFirst()
                if !entries.isEmpty { entries[entries.count - 1].password = value }
            default:
                continue  // account, macdef's name (its body is dropped by `tokens`), or stray words
            }
        }
        self.entries = entries
    }

    /// The password for `login` at `host`: the first entry for the host (its login matching, or none given), else
    /// the `default` entry's.
    func password(host: String, login: String) -> String? {
        let host = host.lowercased()
        let named = entries.first { $0.machine?.lowercased() == host && ($0.login == nil || $0.login == login) }
        let chosen = named ?? entries.first { $0.machine == nil && ($0.login == nil || $0.login == login) }
        return chosen?.password
    }

    /// Words and quoted strings; a `macdef` body (up to an empty line) is left out.
    static func tokens(_ text: String) -> [String] {
        var tokens: [String] = []
        // Line by line without an array of them, by scalars: "\r\n" is one Character.
        var rest = text.unicodeScalars[...]
        func nextLine() -> Substring.UnicodeScalarView? {
            guard !rest.isEmpty else { return nil }
            let end = rest.firstIndex(of: "\n") ?? rest.endIndex
            let line = rest[..<end]
            rest = end == rest.endIndex ? rest[end...] : rest[rest.index(after: end)...]
            return line
        }
        while let line = nextLine() {
            var scalars = line
            var lineTokens: [String] = []
            while true {
                while let first = scalars.first, first == " " || first == "\t" || first == "\r" { scalars.removeFirst() }
                guard let first = scalars.first else { break }
                var token = ""
                if first == "\"" {
                    scalars.removeFirst()
                    while let scalar = scalars.popFirst(), scalar != "\"" {
                        if scalar == "\\", let escaped = scalars.popFirst() {
                            token.unicodeScalars.append(escaped == "n" ? "\n" : escaped == "t" ? "\t" : escaped)
                        } else {
                            token.unicodeScalars.append(scalar)
                        }
                    }
                } else {
                    while let scalar = scalars.first, scalar != " ", scalar != "\t", scalar != "\r" {
                        token.unicodeScalars.append(scalar)
                        scalars.removeFirst()
                    }
                }
                lineTokens.append(token)
            }
            tokens += lineTokens
            if lineTokens.first == "macdef" {
                // The macro's body runs to the next empty line.
                while let next = nextLine(), next.contains(where: { $0 != " " && $0 != "\t" && $0 != "\r" }) {}
            }
        }
        return tokens
    }
}
