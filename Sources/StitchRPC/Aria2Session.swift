import Foundation
import Stitch

/// An aria2 session file (what `aria2c --save-session` writes, and `--input-file` reads): a line of URIs separated
/// by tabs (mirrors of one file), followed by its options, one `name=value` per line indented by a space or a tab.
/// `#` starts a comment line; blank lines are skipped.
///
/// ```
/// http://example.com/a.iso	http://mirror.example/a.iso
///  gid=2089b05ecca3d829
///  dir=/srv/downloads
///  out=a.iso
///  pause=true
/// ```
public struct Aria2Session: Sendable {
    public struct Entry: Sendable {
        /// The line of the URIs (1-based).
        public var line: Int
        public var uris: [String]
        /// The options in their order (`header` may come several times).
        public var options: [(name: String, value: String)]
        /// An indented line that is not `name=value`, with its number: the entry is not imported.
        public var problem: String?

        /// What marks the entry imported in the catalog: its GID, else a digest of its URIs and options, so an
        /// entry is imported once however often the daemon starts with the file.
        var key: String {
            if let gid = options.last(where: { $0.name == "gid" })?.value, !gid.isEmpty { return "gid." + gid }
            var text = uris.joined(separator: "\t")
            // A password is left out: the key is kept in the catalog, and a digest of a weak one could be guessed.
            for option in options where !option.name.hasSuffix("passwd") { text += "\n" + option.name + "=" + option.value }
            return "sha256." + Aria2Session.digest(text)
        }
    }

    public var entries: [Entry] = []
    /// Option lines before any URI, by number: skipped.
    public var strayLines: [Int] = []

    public init(text: String) {
        var number = 0
        // "\r\n" is one Character in Swift: split on it too.
        for raw in text.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r\n" }) {
            number += 1
            let line = raw.hasSuffix("\r") ? raw.dropLast() : raw[...]
            guard let first = line.first else { continue }
            if first == " " || first == "\t" {
                let trimmed = line.drop { $0 == " " || $0 == "\t" }
                guard !trimmed.isEmpty else { continue }
                guard !entries.isEmpty else {
                    strayLines.append(number)
                    continue
                }
                guard let equals = trimmed.firstIndex(of: "="), equals != trimmed.startIndex else {
                    if entries[entries.count - 1].problem == nil {
                        entries[entries.count - 1].problem = "line \(number) is not name=value"
                    }
                    continue
                }
                entries[entries.count - 1].options.append(
                    (String(trimmed[..<equals]), String(trimmed[trimmed.index(after: equals)...])))
            } else if first == "#" {
                continue
            } else {
                let uris = line.split(separator: "\t").map { $0.trimmingCharacters(in: .whitespaces) }
                    .filter { !$0.isEmpty }
                guard !uris.isEmpty else { continue }
                entries.append(Entry(line: number, uris: uris, options: []))
            }
        }
    }

    static func digest(_ text: String) -> String {
        let bytes = Array(text.utf8).withUnsafeBytes { DigestHasher.digest(.sha256, of: $0) }
        return bytes.prefix(16).map { String(format: "%02x", $0) }.joined()
    }
}

extension Aria2RPC {
    /// What an import did, for the log.
    public struct SessionImport: Sendable {
        public var imported: [String] = []
        /// Entries imported at an earlier start (the catalog remembers them).
        public var already = 0
        /// Entries not imported, each with its line and why.
        public var skipped: [String] = []
        /// What else the log should say (a GID another download has).
        public var notes: [String] = []
    }

    /// The file an entry names: its `dir` (as written) and `out`, or the name aria2c gives its first URI.
    static func fileKey(_ entry: Aria2Session.Entry, fromURI: Bool) -> String {
        let folder = entry.options.last { $0.name == "dir" }?.value ?? ""
        let out = entry.options.last { $0.name == "out" }?.value ?? (fromURI ? aria2Name(entry.uris[0]) ?? "" : "")
        return folder + "\u{0}" + out
    }

    /// The catalog's key prefix marking session entries imported.
    static let importedPrefix = "aria2.session.imported."

    /// Imports an aria2 session (``Aria2Session``) into the manager, once: each entry becomes a download as
    /// `addUri` would add it with the entry's options (its GID kept when no download has it; `pause=true` paused;
    /// `dir` inside the served folder), marked in the catalog so a later start with the same file adds nothing
    /// again. A partial aria2c left (`FILE` and `FILE.aria2`) is taken over where its server proves the file is
    /// the same, as `stitch get --adopt` does. An entry Stitch cannot take (a `dir` outside the folder, an option
    /// it cannot do, not http or https) is skipped and named, and tried again at the next start.
    public func importSession(_ session: Aria2Session, source: String) async -> SessionImport {
        var result = SessionImport()
        for line in session.strayLines {
            result.skipped.append("\(source):\(line): an option line before any URI")
        }
        let kept = (try? await manager.keptSettings()) ?? [:]
        // The files the entries name (their folder and `out`, or the name aria2c gives the URI): a partial found
        // under a name two entries would give is nobody's to adopt.
        var named: [String: Int] = [:]
        for entry in session.entries { named[Self.fileKey(entry, fromURI: true), default: 0] += 1 }
        for entry in session.entries {
            let marker = Self.importedPrefix + entry.key
            if kept[marker] != nil {
                result.already += 1
                continue
            }
            if let problem = entry.problem {
                result.skipped.append("\(source):\(entry.line): \(problem)")
                continue
            }
            var members: [(String, JSON)] = []
            var headers: [String] = []
            for (name, value) in entry.options {
                if name == "header" { headers.append(value) } else { members.append((name, .string(value))) }
            }
            if !headers.isEmpty { members.append(("header", .array(headers.map(JSON.string)))) }
            // A GID another download has: the entry's own download when its URL is the entry's (added at an
            // earlier start that ended before it was marked), else a clash, and the GID is not taken.
            if let gid = members.first(where: { $0.0 == "gid" })?.1.string, let id = DownloadID(gid),
                let held = await manager.download(id)
            {
                if held.url == entry.uris[0] || held.mirrors.contains(entry.uris[0]) {
                    do {
                        try await manager.keepSettings([marker: "\(id)"])
                        result.already += 1
                    } catch {
                        result.skipped.append("\(source):\(entry.line): \(error)")
                    }
                    continue
                }
                members.removeAll { $0.0 == "gid" }
                result.notes.append("\(source):\(entry.line): GID \(gid) is another download's; this one gets a new GID")
            }
            do {
                let id = try await addUri(
                    [.array(entry.uris.map(JSON.string)), .object(members)], importing: true,
                    nameFromURI: named[Self.fileKey(entry, fromURI: true), default: 0] <= 1)
                try await manager.keepSettings([marker: id.string ?? ""])
                result.imported.append(id.string ?? "")
            } catch {
                result.skipped.append("\(source):\(entry.line): not imported: \(error)")
            }
        }
        return result
    }
}
