import Foundation
import Stitch
import StitchLocks

/// A configuration file in aria2.conf's syntax: one `name=value` per line, `name` an option's long name without
/// `--`. A line that is empty or whose first character is `#` is skipped (a `#` later in a line, or after
/// leading spaces, is not a comment, as in aria2). Name and value are stripped of spaces, tabs and line ends;
/// nothing is unquoted; a name with no `=` has the value "" (which a true-or-false option reads as true, as aria2
/// does).
public struct Aria2ConfigFile: Sendable {
    /// One setting, with the line it is on (from 1).
    public struct Entry: Sendable, Hashable {
        public var line: Int
        public var name: String
        public var value: String

        public init(line: Int, name: String, value: String) {
            self.line = line
            self.name = name
            self.value = value
        }
    }

    public var entries: [Entry]

    public init(text: String) {
        var entries: [Entry] = []
        let strip: (Substring) -> String = { $0.trimmingCharacters(in: CharacterSet(charactersIn: " \t\r\n")) }
        // "\r\n" is one Character in Swift: split at it as at "\n".
        let lines = text.split(omittingEmptySubsequences: false) { $0 == "\n" || $0 == "\r\n" }
        for (index, line) in lines.enumerated() {
            guard !line.isEmpty, !line.hasPrefix("#") else { continue }
            let name: String
            let value: String
            if let equals = line.firstIndex(of: "=") {
                name = strip(line[..<equals])
                value = strip(line[line.index(after: equals)...])
            } else {
                name = strip(line)
                value = ""
            }
            guard !name.isEmpty || !value.isEmpty else { continue }  // a line of spaces
            entries.append(Entry(line: index + 1, name: name, value: value))
        }
        self.entries = entries
    }
}

extension Aria2RPC {
    /// What a configuration file's download options come to: the defaults for new downloads (as
    /// `changeGlobalOption` would set them), the options it names that Stitch ignores, and the problems, each
    /// `LINE: message` — an option that is not aria2's, a malformed value, a value Stitch cannot do, or a daemon
    /// option the daemon does not take from a file.
    public static func configDefaults(_ entries: [Aria2ConfigFile.Entry]) -> (
        defaults: [String: String], ignored: [String], problems: [String]
    ) {
        var defaults: [String: String] = [:]
        var ignored: [String] = []
        var problems: [String] = []
        for entry in entries {
            let name = entry.name
            guard let option = Aria2Option.named[name] else {
                problems.append("\(entry.line): \(name) is not an option of aria2 or of stitch serve")
                continue
            }
            // A true-or-false option given no value is true, as in aria2's files.
            let text = option.kind == .bool && entry.value.isEmpty ? "true" : entry.value
            do {
                try option.check(text)
                switch (option.handling, option.scope) {
                case (.ignored, _):
                    ignored.append(name)
                case (.applied, .download) where name != "http-user" && name != "http-passwd",
                    (.addOnly, .download) where Aria2RPC.defaultableAtAdd.contains(name):
                    if !text.isEmpty {
                        var scratch = DownloadManager.AddOptions()
                        try apply(name, .string(text), to: &scratch)
                        if let field = credentialField(scratch.headers) {
                            throw Failure.aria2("\(name): \(field): \(credentialDefault)")
                        }
                    }
                    if name == "header", let earlier = defaults[name], !text.isEmpty {
                        defaults[name] = earlier + "\n" + text  // header lines add up, as in aria2's files
                    } else {
                        defaults[name] = text.isEmpty ? nil : text
                    }
                case (.fixed, _):
                    let shown: String? = if case .value(let value) = option.shown { value } else { nil }
                    guard option.same(text, shown) else {
                        throw Failure.aria2("\(name)=\(option.shown(text)): Stitch cannot do this: \(option.why)")
                    }
                default:
                    throw Failure.aria2("\(name) is not taken from a file: \(option.why)")
                }
            } catch {
                problems.append("\(entry.line): \(error)")
            }
        }
        return (defaults, ignored, problems)
    }

    /// Forgets every global option set over RPC (kept in the catalog by `changeGlobalOption`), as reading the
    /// configuration file again does: from then on the file's values (and the command line's) are the daemon's.
    /// Returns the names forgotten.
    public func forgetKeptOptions() async throws -> [String] {
        let kept = try await manager.keptSettings().keys.filter { $0.hasPrefix(Self.keptPrefix) }
        guard !kept.isEmpty else { return [] }
        try await manager.keepSettings(Dictionary(uniqueKeysWithValues: kept.map { ($0, String?.none) }))
        return kept.map { String($0.dropFirst(Self.keptPrefix.count)) }.sorted()
    }

    /// Sets the defaults for new downloads that a configuration file gives (``configDefaults(_:)``): before
    /// ``restoreKeptOptions(overriddenBy:)``, whose values, set over RPC, win over the file's.
    public func setConfigDefaults(_ defaults: [String: String]) {
        settings.withLock { $0.defaults = defaults }
    }
}
