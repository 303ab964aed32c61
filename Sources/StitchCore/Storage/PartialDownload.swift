import CStitchSystem
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// What an earlier run left for one destination: its state (or the previous generation standing in for a
/// damaged one), whether a part file and a finished file are there, and the finished file's completion mark.
///
/// The one inspection of the disk for `DEST` that every caller shares — the engine before a download, the
/// manager when it names a file, restores a catalog or shows a restored download's progress, and
/// ``Downloader/savedDownload(at:)`` and ``Downloader/verify(at:)`` — so that each reads the same files the same
/// way, and the file-system calls stay in `Storage/` (LayeringTests checks that none appear elsewhere).
///
/// The state is read when the value is made; the other facts are looked up when asked for (each is one system
/// call, and most callers need only some of them).
struct PartialDownload: Sendable {
    /// What the state file says.
    enum Saved: Sendable {
        /// No state file.
        case none
        /// A state file that reads cleanly.
        case state(DownloadState)
        /// A state file that is there but cannot be used — damaged, of another format, unreadable (`error` says
        /// which) — with the previous generation that stands in for a damaged one, if it reads cleanly beside a
        /// part file.
        case unusable(DownloadError, previous: DownloadState?)
    }

    let paths: DownloadPaths
    let saved: Saved

    /// Reads the state at `paths` (falling back on the previous generation when it is damaged).
    init(_ paths: DownloadPaths) {
        self.paths = paths
        do {
            saved = try StateFile.read(paths.state).map(Saved.state) ?? .none
        } catch {
            saved = .unusable(error, previous: error.code == .unusableState ? StateFile.fallback(for: paths) : nil)
        }
    }

    /// The state to go by: the state file's, else the previous generation standing in for a damaged one.
    var state: DownloadState? {
        switch saved {
        case .none: nil
        case .state(let state): state
        case .unusable(_, let previous): previous
        }
    }

    /// False only when no state file, destination file or part file is at `paths` (each lookup says `ENOENT`):
    /// then there is nothing of an earlier run to look at. Any other answer is for the full look to judge and report.
    static func mayBeThere(_ paths: DownloadPaths) -> Bool {
        func mayExist(_ path: String) -> Bool {
            var info = stat()
            return lstat(path, &info) == 0 || errno != ENOENT
        }
        // The part file too: a small download has no state file, and one finished but not yet renamed into place
        // is finished by the look.
        return mayExist(paths.state) || mayExist(paths.destination) || mayExist(paths.part)
    }

    /// Whether what is here is a download of a URL `owns` accepts: a state file of it (or the previous generation
    /// standing in for a damaged one), a finished file at the destination with its completion mark, or a part file
    /// finished but not yet renamed into place (its mark with a CRC).
    func isADownload(of owns: (String) -> Bool) -> Bool {
        if let state { return owns(state.url) }
        if let mark = completion, owns(mark.url) { return true }
        return partCompletion.map { owns($0.url) } ?? false
    }

    /// Whether anything is at the destination.
    var destinationExists: Bool { access(paths.destination, F_OK) == 0 }

    /// Whether the part file is there.
    var partExists: Bool { access(paths.part, F_OK) == 0 }

    /// What is at the destination, for ``DownloadRequest/ifNewer``: whether it is a regular file, its length and its
    /// modification time (seconds since the epoch).
    func destinationFile() throws(DownloadError) -> (isRegular: Bool, length: Int64, modified: Int64) {
        var info = stat()
        guard stat(paths.destination, &info) == 0 else {
            throw DownloadError.io("cannot read", path: paths.destination, .current)
        }
        return ((info.st_mode & S_IFMT) == S_IFREG, Int64(info.st_size), Int64(info.st_mtim.tv_sec))
    }

    /// The mark of a download that finished at the destination, if the file there still has the marked length.
    var completion: CompletionMark? {
        guard let mark = CompletionMark.read(at: paths.destination) else { return nil }
        var info = stat()
        guard stat(paths.destination, &info) == 0, Int64(info.st_size) == mark.length else { return nil }
        return mark
    }

    /// Finishes the part file an earlier run had finished writing (its completion mark set and synced) when a cut
    /// came before its rename into place: see ``PartStore/finishMarkedPart(at:matching:verify:)``.
    func finishMarkedPart(
        matching: (CompletionMark) -> Bool, verify: (_ part: String) throws(DownloadError) -> Void
    ) throws(DownloadError) -> PartStore.MarkedPart {
        try PartStore.finishMarkedPart(at: paths, matching: matching, verify: verify)
    }

    /// The completion mark on the part file: a download that finished writing it but was stopped before its
    /// rename into place (its next run finishes it).
    var partCompletion: CompletionMark? {
        CompletionMark.read(at: paths.part).flatMap { $0.crc32c == nil ? nil : $0 }
    }

    /// Whether another run holds the part file (a small download has no state file before its first
    /// checkpoint, so the lock is all that shows it).
    var partIsHeldByAnotherRun: Bool { partHolder == .anotherRun }

    /// Who has the part file: nobody (``PartHolder/nobody``), another run (it holds the lock), or there is none
    /// (``PartHolder/noPartFile``: the open said `ENOENT`).
    enum PartHolder: Sendable, Equatable { case noPartFile, nobody, anotherRun }

    /// Who has the part file, from one open (and a lock taken and let go).
    var partHolder: PartHolder {
        let fd = retryingOnInterrupt { open(paths.part, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        guard fd >= 0 else { return errno == ENOENT ? .noPartFile : .nobody }
        defer { close(fd) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else { return .anotherRun }
        // Let go before the close: a child being spawned meanwhile holds a copy of this open file description
        // until its exec, and the lock would live as long (the next real open would find the download "busy").
        _ = flock(fd, LOCK_UN)
        return .nobody
    }

    /// Removes the state, live record and their temporaries (a finished download whose clean-up was cut short).
    func removeSidecars() {
        for sidecar in paths.sidecars { unlink(sidecar) }
    }
}

// MARK: - Other file operations of the library

/// The other file-system operations the engine and the manager need, kept here with the rest of Storage.
enum FileOperations {
    /// The digest of the first `length` bytes of the file at `path` (all of it when nil).
    static func digest(ofFileAt path: String, _ algorithm: ChecksumAlgorithm, length: Int64? = nil)
        throws(DownloadError) -> [UInt8]
    {
        let fd = retryingOnInterrupt { open(path, O_RDONLY | O_CLOEXEC) }
        guard fd >= 0 else { throw DownloadError.io("cannot read", path: path, .current) }
        defer { close(fd) }
        let hasher = DigestHasher(algorithm)
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { chunk.deallocate() }
        var left = length ?? Int64.max
        while left > 0 {
            let want = Int(min(Int64(chunk.count), left))
            let n = retryingOnInterrupt { systemRead(fd, chunk.baseAddress, want) }
            if n < 0 { throw DownloadError.io("cannot read", path: path, .current) }
            if n == 0 { break }
            hasher.update(UnsafeRawBufferPointer(rebasing: chunk[0..<n]))
            left -= Int64(n)
        }
        return hasher.finalize()
    }

    /// Removes the file at `path` if there is one (a finished download the user removed with its files).
    static func remove(_ path: String) {
        unlink(path)
    }

    /// Creates `directory` and its parents; one that exists is fine. Each folder it creates is made durable in its
    /// parent (the parent is synced), so a power cut cannot take away a folder with the downloads finished in it: a
    /// finish syncs the folder holding the file, not the folders above (PowerCutTests found a new `STATE` folder of
    /// the background driver gone after a cut, with the downloads' files beside their destinations kept).
    static func createDirectory(_ directory: String) throws {
        var missing: [String] = []
        var current = directory
        while !current.isEmpty, access(current, F_OK) != 0 {
            missing.append(current)
            let parent = (current as NSString).deletingLastPathComponent
            if parent == current { break }
            current = parent
        }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        for created in missing.reversed() {
            try syncDirectory((created as NSString).deletingLastPathComponent)
        }
    }

    /// The destinations whose state files lie in `directory` (`NAME` for each `NAME.stitch`), sorted.
    static func destinationsWithStateFiles(in directory: String) -> [String] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return [] }
        let folder = directory.hasSuffix("/") ? directory : directory + "/"
        return names.sorted().filter { $0.hasSuffix(".stitch") }.map { folder + $0.dropLast(7) }
    }
}

/// `path` made absolute against the current directory.
func absolutePath(_ path: String) -> String {
    if path.hasPrefix("/") { return path }
    return FileManager.default.currentDirectoryPath + "/" + path
}
