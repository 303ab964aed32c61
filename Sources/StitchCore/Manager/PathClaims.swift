import Foundation
import StitchLocks

/// Which download writes to which path, so two never share a part file. Shared with the engine's threads (a
/// download into a folder names its file at the first response, or before its request when an earlier run of its
/// URL left that file there; on the engine's threads).
final class PathClaims: Sendable {
    private struct State {
        var owners: [String: DownloadID] = [:]
        /// Claims given up so far: a path found taken on disk while nobody here owned it may have been freed
        /// (removed) by the time it is claimed, and ``choose(_:for:urls:)`` then looks again.
        var releases: UInt64 = 0
    }
    private let state = Locked(State())

    func owner(of path: String) -> DownloadID? { state.withLock { $0.owners[path] } }

    /// Claims `path` for `id` unless another download has it; returns that download then.
    func claimIfFree(_ path: String, for id: DownloadID) -> DownloadID? {
        state.withLock { state in
            if let owner = state.owners[path], owner != id { return owner }
            state.owners[path] = id
            return nil
        }
    }

    func claim(_ path: String, for id: DownloadID) {
        _ = claimIfFree(path, for: id)
    }

    func release(_ path: String, for id: DownloadID) {
        state.withLock { state in
            if state.owners[path] == id {
                state.owners[path] = nil
                state.releases &+= 1
            }
        }
    }

    /// Gives back every path `id` claims.
    func releaseAll(for id: DownloadID) {
        state.withLock { state in
            for (path, owner) in state.owners where owner == id {
                state.owners[path] = nil
                state.releases &+= 1
            }
        }
    }

    /// The path for download `id` (of `url`) named `proposed` by its response: `proposed` unless another
    /// download claims it or a file there belongs to another URL, else `NAME.1.EXT`, `NAME.2.EXT`, … (as aria2
    /// renames). Claims the path for `id`.
    ///
    /// The disk is looked at outside the lock (the engine's decision threads all name their files here, and
    /// holding the lock through a few lookups in a large folder made them queue); the claim then succeeds only
    /// if nobody claimed the path meanwhile and nothing was released (else the path is looked at again; after a
    /// few tries, under the lock). The one look that takes a lock of its own — whether another process holds the
    /// part file — is made under the lock, where no download of this process can be creating that file.
    ///
    /// `replacing`: a finished file there that another URL (or another program) left is this download's to compare
    /// and replace (``DownloadRequest/ifNewer``), unless another download of this manager claims the path.
    func choose(_ proposed: String, for id: DownloadID, urls: Set<String>, replacing: Bool = false) -> String {
        choice(proposed, for: id, urls: urls, replacing: replacing).path
    }

    /// ``choose(_:for:urls:replacing:)``, and whether the look that chose the path found nothing of a download
    /// there: no state file, no file at the destination, no part file (``PathChoice/vacant``).
    func choice(_ proposed: String, for id: DownloadID, urls: Set<String>, replacing: Bool = false) -> PathChoice {
        for candidate in Self.candidates(proposed) {
            var outcome: Bool?
            var vacant = false
            var tries = 0
            repeat {
                tries += 1
                let seen = state.withLock { state -> UInt64? in
                    if let owner = state.owners[candidate], owner != id { return nil }
                    return state.releases
                }
                guard let seen else { break }  // another download's
                let underLock = tries > 3
                let look = underLock ? nil : Self.look(candidate, for: urls, replacing: replacing)
                outcome = state.withLock { state -> Bool? in
                    if let owner = state.owners[candidate], owner != id { return false }
                    if state.releases != seen { return nil }  // what the disk said may be stale: look again
                    vacant = false
                    switch look ?? Self.look(candidate, for: urls, replacing: replacing) {
                    case .taken: return false
                    case .freeUnlessHeld(let partial, let nothingElse):
                        switch partial.partHolder {
                        case .anotherRun: return false
                        case .noPartFile: vacant = nothingElse
                        case .nobody: break
                        }
                    case .free: break
                    }
                    for (path, owner) in state.owners where owner == id && path != candidate {
                        state.owners[path] = nil
                        state.releases &+= 1
                    }
                    state.owners[candidate] = id
                    return true
                }
            } while outcome == nil
            if outcome == true { return PathChoice(path: candidate, vacant: vacant) }
        }
        return PathChoice(path: proposed, vacant: false)
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

    private enum Look {
        case free
        case taken
        /// Free unless another process holds its part file (a lock taken and let go to find out). `nothingElse`: no
        /// state file and no file at the destination were found, so with no part file the path is vacant.
        case freeUnlessHeld(PartialDownload, nothingElse: Bool)
    }

    /// Nothing at `path`, or only what a download of `url` left there (its partial, or its finished file). A
    /// part file without a state file is free: it holds nothing resumable (a small download interrupted before
    /// its first checkpoint), and the engine starts it over — unless another run holds it.
    private static func look(_ path: String, for urls: Set<String>, replacing: Bool = false) -> Look {
        let partial = PartialDownload(DownloadPaths(destination: path))
        if case .none = partial.saved {
            if partial.destinationExists {
                if replacing, (try? partial.destinationFile().isRegular) == true {
                    return .freeUnlessHeld(partial, nothingElse: false)
                }
                return partial.completion.map { urls.contains($0.url) } ?? false ? .free : .taken
            }
            // A part file another download finished writing (its completion mark set) is that download's: its next
            // run moves it into place.
            if let mark = partial.partCompletion { return urls.contains(mark.url) ? .free : .taken }
            // A part file another run holds (a small download has no state file yet) is taken.
            return .freeUnlessHeld(partial, nothingElse: true)
        }
        // A damaged state is judged by the previous generation the engine would fall back on.
        return partial.state.map { urls.contains($0.url) } ?? false ? .free : .taken
    }
}

/// The path ``PathClaims`` chose for a download, claimed for it.
struct PathChoice: Sendable, Equatable {
    let path: String
    /// The look that chose it found nothing there: no state file (its lookup said `ENOENT`), no file at the
    /// destination and no part file. The engine then creates the part file without looking again
    /// (``PartStore/create(paths:url:headers:checksum:validators:adoption:replacesDestination:vacant:)``).
    let vacant: Bool
}

/// `path` without `.` components or repeated slashes (`..` is kept).
func withoutDotComponents(_ path: String) -> String {
    let components = path.split(separator: "/").filter { $0 != "." }
    return (path.hasPrefix("/") ? "/" : "") + components.joined(separator: "/")
}
