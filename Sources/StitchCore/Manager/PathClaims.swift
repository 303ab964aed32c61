import Foundation
import StitchLocks

/// Which download writes to which path, so two never share a part file. Shared with the engine's threads (a
/// download into a folder names its file at the first response).
final class PathClaims: Sendable {
    private let owners = Locked<[String: DownloadID]>([:])

    func owner(of path: String) -> DownloadID? { owners.withLock { $0[path] } }

    /// Claims `path` for `id` unless another download has it; returns that download then.
    func claimIfFree(_ path: String, for id: DownloadID) -> DownloadID? {
        owners.withLock { owners in
            if let owner = owners[path], owner != id { return owner }
            owners[path] = id
            return nil
        }
    }

    func claim(_ path: String, for id: DownloadID) {
        _ = claimIfFree(path, for: id)
    }

    func release(_ path: String, for id: DownloadID) {
        owners.withLock { owners in
            if owners[path] == id { owners[path] = nil }
        }
    }

    /// The path for download `id` (of `url`) named `proposed` by its response: `proposed` unless another
    /// download claims it or a file there belongs to another URL, else `NAME.1.EXT`, `NAME.2.EXT`, … (as aria2
    /// renames). Claims the path for `id`.
    func choose(_ proposed: String, for id: DownloadID, urls: Set<String>) -> String {
        owners.withLock { owners in
            for candidate in Self.candidates(proposed) {
                if let owner = owners[candidate], owner != id { continue }
                guard Self.isFree(candidate, for: urls) else { continue }
                for (path, owner) in owners where owner == id { owners[path] = nil }
                owners[candidate] = id
                return candidate
            }
            return proposed
        }
    }

    /// `proposed`, then numbered variants with the number after the name's stem: `a/b.tar.gz`, `a/b.1.tar.gz`,
    /// `a/b.2.tar.gz`, … (a leading dot is part of the stem: `.profile.1`).
    static func candidates(_ proposed: String) -> some Sequence<String> {
        let slash = proposed.lastIndex(of: "/").map { proposed.index(after: $0) } ?? proposed.startIndex
        let folder = proposed[..<slash]
        let name = proposed[slash...]
        let dot = name.dropFirst().firstIndex(of: ".")
        let stem = dot.map { name[..<$0] } ?? name[...]
        let suffix = dot.map { name[$0...] } ?? ""
        return (0..<10_000).lazy.map { $0 == 0 ? proposed : "\(folder)\(stem).\($0)\(suffix)" }
    }

    /// Nothing at `path`, or only what a download of `url` left there (its partial, or its finished file). A
    /// part file without a state file is free: it holds nothing resumable (a small download interrupted before
    /// its first checkpoint), and the engine starts it over.
    private static func isFree(_ path: String, for urls: Set<String>) -> Bool {
        let partial = PartialDownload(DownloadPaths(destination: path))
        if case .none = partial.saved {
            if partial.destinationExists {
                return partial.completion.map { urls.contains($0.url) } ?? false
            }
            // A part file another download finished writing (its completion mark set) is that download's: its next
            // run moves it into place.
            if let mark = partial.partCompletion { return urls.contains(mark.url) }
            // A part file another run holds (a small download has no state file yet) is taken.
            return !partial.partIsHeldByAnotherRun
        }
        // A damaged state is judged by the previous generation the engine would fall back on.
        return partial.state.map { urls.contains($0.url) } ?? false
    }
}

/// `path` without `.` components or repeated slashes (`..` is kept).
func withoutDotComponents(_ path: String) -> String {
    let components = path.split(separator: "/").filter { $0 != "." }
    return (path.hasPrefix("/") ? "/" : "") + components.joined(separator: "/")
}
