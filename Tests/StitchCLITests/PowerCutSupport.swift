import CStitchSystem
import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

// The power-cut rig: `stitch` runs on Tests/PowerLoss/plfs.c, a FUSE file system that keeps in memory both what the
// program sees and what a disk would still hold after a power cut (data after fsync/fdatasync, directory entries after
// the directory's fsync). A cut spec names the operation after which the power goes: the file system saves what would
// survive as an image and vanishes; the rig kills `stitch`, "reboots" (mounts the image afresh, and gives the next
// runs another boot id through STITCH_TEST_BOOT_ID, which only test builds read) and runs the command again.

/// Why the rig cannot run here: said loudly by the tests, which fail (never skip) without it.
struct PowerCutError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Tests/PowerLoss/plfs.c, built once per test process with the system C compiler and libfuse3.
enum PowerLossFS {
    static let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("PowerLoss/plfs.c").path

    /// The built executable, or why there is none.
    static let executable: Result<String, PowerCutError> = build()

    private static func build() -> Result<String, PowerCutError> {
        guard access("/dev/fuse", R_OK | W_OK) == 0 else {
            return .failure(
                PowerCutError(
                    "/dev/fuse is missing or not usable here: the power-cut tests need FUSE (Debian's fuse3 and "
                        + "libfuse3-dev, and a machine that offers /dev/fuse)"))
        }
        let directory = NSTemporaryDirectory() + "/stitch-plfs-\(getpid())"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let output = directory + "/plfs"
        let log = directory + "/cc.log"
        let command = "cc -O2 -Wall -o '\(output)' '\(source)' $(pkg-config --cflags --libs fuse3)"
        do {
            let termination = try ChildProcess(
                executable: "/bin/sh", arguments: ["-c", command], environment: ProcessInfo.processInfo.environment,
                standardOutput: .file(log), standardError: .file(log)
            ).waitUntilExit()
            guard termination.status == 0, termination.signal == nil else {
                let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
                return .failure(PowerCutError("building plfs failed (needs libfuse3-dev and pkg-config): \(text)"))
            }
        } catch {
            return .failure(PowerCutError("cannot run the C compiler: \(error)"))
        }
        return .success(output)
    }
}

/// One mount of plfs: one "boot" of the test disk.
final class PowerLossMount: Sendable {
    let mountpoint: String
    let image: String
    private let process: ChildProcess
    private let log: String

    /// What a boot of the disk is started with.
    struct Options: Sendable {
        /// Cut specs (plfs's `--cut`): `KIND:SUFFIX:N[+M]`, or `bytes:SUFFIX:N`.
        var cuts: [String] = []
        var seed: UInt64 = 0
        /// Unsynced pages, sizes and directory entries survive a cut at random (seeded) rather than never.
        var torn = false
        /// Files whose names end so sit on a disk whose syncs keep the size and drop the data.
        var lie: String?
        var trace: String?
    }

    /// Mounts plfs at `mountpoint` with the image `load` (empty if nil); its image goes to `save` at a cut (what
    /// survives) or at a clean unmount (everything).
    init(at mountpoint: String, load: String?, save: String, options: Options) async throws {
        let executable = try PowerLossFS.executable.get()
        self.mountpoint = mountpoint
        self.image = save
        log = save + ".log"
        try FileManager.default.createDirectory(atPath: mountpoint, withIntermediateDirectories: true)
        var arguments = [mountpoint, "--save", save, "--seed", "\(options.seed)", "--mkdir", PowerCutRig.folderName]
        if let load { arguments += ["--load", load] }
        if options.torn { arguments.append("--torn") }
        if let lie = options.lie { arguments += ["--lie", lie] }
        if let trace = options.trace { arguments += ["--trace", trace] }
        for cut in options.cuts { arguments += ["--cut", cut] }
        process = try ChildProcess(
            executable: executable, arguments: arguments, environment: ProcessInfo.processInfo.environment,
            standardOutput: .file(log), standardError: .file(log))
        let parent = (mountpoint as NSString).deletingLastPathComponent
        let process = self.process
        let mounted = await waitUntil(timeout: .seconds(20)) {
            var inner = stat()
            var outer = stat()
            return !process.isRunning
                || (stat(mountpoint, &inner) == 0 && stat(parent, &outer) == 0 && inner.st_dev != outer.st_dev)
        }
        guard mounted, process.isRunning else {
            let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            _ = umount2(mountpoint, Int32(MNT_DETACH))
            throw PowerCutError("plfs did not mount at \(mountpoint): \(text)")
        }
    }

    /// Whether the power was cut (plfs saved its image and went away). The mount answering `ENOTCONN` says so as soon
    /// as plfs is gone, before its exit is reaped (a program that traps on the vanished disk may be reaped first).
    var isCut: Bool {
        if !process.isRunning { return true }
        var info = stat()
        return stat(mountpoint, &info) != 0 && (errno == ENOTCONN || errno == ECONNABORTED)
    }

    /// Detaches a mount whose file system has gone (after a cut).
    func detach() async {
        _ = umount2(mountpoint, Int32(MNT_DETACH))
        let process = self.process
        _ = try? await offload { process.waitUntilExit() }
    }

    /// A clean shutdown: unmount (retrying while busy), and plfs saves everything as the image.
    func unmount() async throws {
        let mountpoint = self.mountpoint
        let done = await waitUntil(timeout: .seconds(20)) { umount2(mountpoint, 0) == 0 || errno == EINVAL }
        let process = self.process
        let termination = try await offload { process.waitUntilExit() }
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        // Once in several hundred mounts the kernel ends the connection with ECONNABORTED rather than ENODEV as the
        // unmount completes; libfuse then exits with 8, after its destroy callback has saved the image. Only the
        // processes' runs were over by then (nothing but the writeback of the live record's pages could still come,
        // and a later boot never trusts that record), so the image is as a clean shutdown leaves it.
        let abortedAtTheEnd =
            termination.status == 8 && termination.signal == nil
            && text.contains("Software caused connection abort") && FileManager.default.fileExists(atPath: image)
        guard done, termination.status == 0 || abortedAtTheEnd else {
            throw PowerCutError("plfs did not unmount cleanly: \(termination) \(text)")
        }
    }
}

/// A served file the rig downloads, and where it lands.
struct PowerCutFile: Sendable {
    var name: String
    var file: ServedFile
    var path: String { "/" + name }
}

/// What one run on one boot did.
struct PowerCutRun: Sendable {
    var result: CommandResult
    var cut: Bool
}

/// A sandbox with a server, a mount point and the boots of one trial: each boot loads the image the last one left.
final class PowerCutRig: Sendable {
    let sandbox: Sandbox
    let server: TestHTTPServer
    let files: [PowerCutFile]
    let trialName: String
    private let boots = Locked(0)

    var mountpoint: String { sandbox.path("disk") }
    /// The folder downloads go to inside the mount (made by plfs, durably, before anything runs).
    static let folderName = "dl"
    var folder: String { mountpoint + "/" + Self.folderName }

    init(_ name: String, files: [PowerCutFile], throttle: Int? = nil) throws {
        sandbox = try Sandbox("powercut")
        server = try TestHTTPServer()
        server.throttle = throttle
        for file in files { server.serve(file.path, file: file.file) }
        self.files = files
        trialName = name
    }

    func stop() {
        _ = umount2(mountpoint, Int32(MNT_DETACH))
        server.stop()
        sandbox.cleanup()
    }

    private func image(_ number: Int) -> String { sandbox.path("image-\(number)") }

    /// The boot id the runs of boot `number` see.
    func bootID(_ number: Int) -> String { "00000000-0000-4000-8000-\(String(format: "%012x", number))" }

    /// The environment of a program run on boot `bootID`. Swift's crash reporter is off: a program whose disk vanished
    /// at a cut may trap, and the reporter it forks, orphaned by the SIGKILL that follows, would hold the program's
    /// output open for good.
    static func environment(_ bootID: String) -> [String: String] {
        ["STITCH_TEST_BOOT_ID": bootID, "SWIFT_BACKTRACE": "enable=no"]
    }

    /// Starts a new boot of the disk with `options`; returns the mount and the boot id its programs must see.
    func boot(_ options: PowerLossMount.Options = .init()) async throws -> (mount: PowerLossMount, bootID: String) {
        let number = boots.withLock { value -> Int in
            value += 1
            return value
        }
        let mount = try await PowerLossMount(
            at: mountpoint, load: number == 1 ? nil : image(number - 1), save: image(number), options: options)
        return (mount, bootID(number))
    }

    /// Runs `arguments` (in the download folder) on a new boot of the disk with `options`, until it ends or the power
    /// is cut.
    func run(
        _ arguments: [String], options: PowerLossMount.Options = .init(), timeout: Duration = .seconds(60),
        executable: String? = nil
    ) async throws -> PowerCutRun {
        let (mount, bootID) = try await boot(options)
        let process = try sandbox.start(
            arguments, environment: Self.environment(bootID), directory: folder, executable: executable)
        let ended = await waitUntil(timeout: timeout) { !process.isRunning || mount.isCut }
        if mount.isCut {
            process.kill()
            let result = await process.wait()
            await mount.detach()
            return PowerCutRun(result: result, cut: true)
        }
        let result = await process.wait(timeout: .seconds(5))
        if !ended { Issue.record("\(trialName): stitch \(arguments) outlasted \(timeout) on \(bootID)") }
        try await mount.unmount()
        return PowerCutRun(result: result, cut: false)
    }

    /// Runs `body` on a boot of its own before the trial (uncut, everything kept): what the disk holds to begin with.
    func prepare(_ body: (String) throws -> Void) async throws {
        try await inspect(body)
    }

    /// Mounts the last image read-only in spirit (nothing runs on it), lets `body` look at it, and unmounts it
    /// without changing it (the image is saved again as it was).
    func inspect<T>(_ body: (String) throws -> T) async throws -> T {
        let (mount, _) = try await boot()
        let value: T
        do { value = try body(folder) } catch {
            try? await mount.unmount()
            throw error
        }
        try await mount.unmount()
        return value
    }
}

/// What a disk image holds for one download after a cut: whether the destination is there (and its bytes), and the
/// byte ranges the state file (or a completion record) vouches for as durable.
struct CutImage: Sendable, CustomStringConvertible {
    var destination: [UInt8]?
    var hasPart: Bool
    var hasState: Bool
    /// Byte ranges the download claims durable: its state's durable extents, or the whole file when the part file
    /// carries a completion mark of the full length.
    var durable: [Range<Int>]
    var marked: Bool
    /// The destination is the complete file (set by the test, which knows the file).
    var complete = false

    var durableBytes: Int { durable.reduce(0) { $0 + $1.count } }

    var description: String {
        "dest=\(destination.map { "\($0.count) bytes" } ?? "none") part=\(hasPart) state=\(hasState) "
            + "durable=\(durableBytes) marked=\(marked)"
    }

    /// Reads what the image at `folder` holds for `name` (of `length` bytes).
    static func read(folder: String, name: String, length: Int) -> CutImage {
        let destination = folder + "/" + name
        let part = destination + ".part"
        var durable: [Range<Int>] = []
        var hasState = false
        if let data = FileManager.default.contents(atPath: destination + ".stitch"),
            let state = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        {
            hasState = true
            for segment in state["segments"] as? [[String: Any]] ?? [] {
                if let start = segment["start"] as? Int, let end = segment["durable"] as? Int, end > start {
                    durable.append(start..<end)
                }
            }
        }
        var marked = false
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        let n = buffer.withUnsafeMutableBytes { getxattr(part, "user.stitch", $0.baseAddress, $0.count) }
        if n > 0, let object = try? JSONSerialization.jsonObject(with: Data(buffer[0..<n])) as? [String: Any],
            object["length"] as? Int == length, fileSize(part) == length
        {
            marked = true
        }
        return CutImage(
            destination: fileExists(destination) ? readBytes(destination) : nil, hasPart: fileExists(part),
            hasState: hasState, durable: durable, marked: marked)
    }
}

/// The bytes of `responses` (body ranges the server sent) that fall in `ranges`.
func overlap(_ responses: [ServedResponse], _ ranges: [Range<Int>]) -> Int {
    var total = 0
    for response in responses where response.status == 200 || response.status == 206 {
        let sent = response.bodyStart..<(response.bodyStart + response.bodyBytesSent)
        for range in ranges {
            let common = max(sent.lowerBound, range.lowerBound)..<max(max(sent.lowerBound, range.lowerBound), min(sent.upperBound, range.upperBound))
            total += common.count
        }
    }
    return total
}

/// The files whose rename into place (`NAME.part` → `NAME`) was followed by a sync of their folder before the cut, in
/// a trace: each must be in the image (a download that reported success is not undone by a power cut).
func renamedAndSynced(_ trace: [TraceLine], folder: String) -> Set<String> {
    var renamed: Set<String> = []
    var synced: Set<String> = []
    for line in trace {
        if line.kind == "rename", line.name == line.target + ".part" { renamed.insert(line.target) }
        if line.kind == "fsyncdir", line.name == folder { synced.formUnion(renamed) }
    }
    return synced
}

/// Rule 2's order, read from the trace of a run that ended on its own (a persistence check in the manner of ALICE: it
/// needs no cut to fire, so it also catches a missing sync whose loss a cut at the wrong moment would not show). For
/// the downloads `names` in `folder`:
/// - a file is renamed onto a download's state (`NAME.stitch`) or into place (`NAME`) only once its data is synced;
/// - each state written after the first comes after a sync of the part file, unless nothing was written to it since
///   the previous state (data before the state that describes it);
/// - every such rename is followed by a sync of the folder before the same name is replaced again and before the run
///   ends (a state or a destination that a power cut could take back is not durable);
/// - no power cut leaves a sidecar (live record, state temporary or link, previous state) beside a finished download
///   without its state file: the rerun finds the file complete and, with no state, nothing to clean up, so the
///   sidecar stays for good. Checked after every step for every prefix of the folder's unsynced log (a journal
///   commits a folder's changes in order, and plfs's torn cuts keep such a prefix).
func durabilityOrderProblems(_ trace: [TraceLine], folder: String, names: [String]) -> [String] {
    var problems = orphanedSidecarProblems(trace, folder: folder, names: names)
    var watched: Set<String> = []
    for name in names { watched.formUnion([name, name + ".stitch", name + ".stitch.prev"]) }
    var unsynced: Set<String> = []
    var awaitingFolderSync: Set<String> = []
    // For each part file: written since its last sync; written (or left unsynced) since the last state; synced since
    // the last state; and whether a state was written yet.
    var writtenSinceSync: Set<String> = []
    var claimable: Set<String> = []
    var syncedSinceState: Set<String> = []
    var statesWritten: Set<String> = []
    for (step, line) in trace.enumerated() {
        switch line.kind {
        case "write", "truncate", "fallocate":
            unsynced.insert(line.name)
            if line.kind == "write" {
                writtenSinceSync.insert(line.name)
                claimable.insert(line.name)
            }
        case "fsync", "fdatasync":
            unsynced.remove(line.name)
            writtenSinceSync.remove(line.name)
            syncedSinceState.insert(line.name)
        case "fsyncdir" where line.name == folder:
            awaitingFolderSync.removeAll()
        case "rename" where watched.contains(line.target):
            let target = line.target
            if unsynced.contains(line.name) {
                problems.append("step \(step): \(line.name) renamed onto \(target) before its data was synced")
            }
            if awaitingFolderSync.contains(target) {
                problems.append(
                    "step \(step): \(target) replaced again before the folder was synced after its previous rename")
            }
            if target.hasSuffix(".stitch") {
                let part = String(target.dropLast(".stitch".count)) + ".part"
                // Bytes this state may claim: those written since the previous state, and those that were not yet
                // synced when it was written.
                if statesWritten.contains(target) && claimable.contains(part) && !syncedSinceState.contains(part) {
                    problems.append(
                        "step \(step): a state of \(part) written with no sync of the bytes written since the last one")
                }
                statesWritten.insert(target)
                syncedSinceState.remove(part)
                if writtenSinceSync.contains(part) { claimable.insert(part) } else { claimable.remove(part) }
            }
            awaitingFolderSync.insert(target)
            if unsynced.remove(line.name) != nil { unsynced.insert(target) }
        case "rename":
            if unsynced.remove(line.name) != nil { unsynced.insert(line.target) }
        default:
            break
        }
    }
    for name in awaitingFolderSync.sorted() {
        problems.append("\(name) was renamed, and the run ended without syncing its folder")
    }
    return problems
}

/// The sidecars a power cut could leave beside a finished download with no state file (see
/// ``durabilityOrderProblems(_:folder:names:)``), each named once, at the first step where it could.
func orphanedSidecarProblems(_ trace: [TraceLine], folder: String, names: [String]) -> [String] {
    // The folder's names as a reboot would find them: those its last sync made durable, and after them any prefix
    // of the changes since (all names are last path components; the downloads share one folder).
    var durable: Set<String> = []
    var log: [TraceLine] = []
    func apply(_ line: TraceLine, to names: inout Set<String>) {
        switch line.kind {
        case "create", "mkdir", "link": names.insert(line.target)
        case "unlink", "rmdir": names.remove(line.name)
        case "rename":
            if names.remove(line.name) != nil { names.insert(line.target) }
        default: break
        }
    }
    // The engine's own list of what it keeps beside a download, the state file apart (names are last components).
    let paths = names.map { DownloadPaths(destination: $0) }
    var named: Set<String> = []
    var problems: [String] = []
    for (step, line) in trace.enumerated() {
        switch line.kind {
        case "create", "mkdir", "link", "unlink", "rmdir", "rename": log.append(line)
        case "fsyncdir" where line.name == folder:
            for change in log { apply(change, to: &durable) }
            log.removeAll()
            continue
        default: continue
        }
        var found = durable
        for kept in 0...log.count {
            if kept > 0 { apply(log[kept - 1], to: &found) }
            for download in paths where found.contains(download.destination) && !found.contains(download.state) {
                for sidecar in download.sidecars where sidecar != download.state && found.contains(sidecar) {
                    guard named.insert(sidecar).inserted else { continue }
                    problems.append(
                        "step \(step): a power cut could leave \(sidecar) beside the finished \(download.destination) "
                            + "with no state file to have it removed (\(kept) of the folder's \(log.count) unsynced "
                            + "changes kept)")
                }
            }
        }
    }
    return problems
}

/// One line of a plfs trace: `SEQ KIND NAME [TO]`.
struct TraceLine: Sendable, Hashable {
    var kind: String
    var name: String
    var target: String

    static func read(_ path: String) -> [TraceLine] {
        let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { line in
            let words = line.split(separator: " ", omittingEmptySubsequences: false).map(String.init)
            guard words.count >= 3, UInt64(words[0]) != nil else { return nil }
            return TraceLine(kind: words[1], name: words[2], target: words.count > 3 ? words[3] : words[2])
        }
    }
}

/// Every step boundary of a trace worth a cut, as plfs cut specs, each counted in non-write operations from an
/// anchor that comes at the same point in every run of the same command: the operations before the part file's first
/// write (creating the files), those of the first and second checkpoint (from the part file's `fdatasync`), and every
/// operation from the finish's truncation of the part file to the end (the finish and the clean-up). Later
/// checkpoints come at times, not at counts, and are left to the seeded cuts.
func stepCuts(_ trace: [TraceLine], part: String) -> [String] {
    var cuts: [String] = []
    let nonWrite = trace.filter { $0.kind != "write" }
    if let firstWrite = trace.firstIndex(where: { $0.kind == "write" && $0.name == part }), let first = trace.first {
        let steps = trace[..<firstWrite].filter { $0.kind != "write" }.count
        for plus in 0..<steps { cuts.append("\(first.kind):\(first.target):1+\(plus)") }
    }
    let anchors = nonWrite.indices.filter { nonWrite[$0].kind == "fdatasync" && nonWrite[$0].name == part }
    for (occurrence, index) in anchors.prefix(2).enumerated() {
        let next = occurrence + 1 < anchors.count ? anchors[occurrence + 1] : nonWrite.count
        for plus in 0..<min(next - index, 10) { cuts.append("fdatasync:\(part):\(occurrence + 1)+\(plus)") }
    }
    // Each step after a checkpoint's state rename (the window where a state could claim data not yet synced, were
    // the order ever changed), for the first two state renames after the one made at the start.
    let state = String(part.dropLast(".part".count)) + ".stitch"
    let renames = nonWrite.indices.filter { nonWrite[$0].kind == "rename" && nonWrite[$0].target == state }
    for occurrence in renames.indices.dropFirst().prefix(2) {
        for plus in 0..<4 { cuts.append("rename:\(state):\(occurrence + 1)+\(plus)") }
    }
    let truncations = nonWrite.indices.filter { nonWrite[$0].kind == "truncate" && nonWrite[$0].name == part }
    if let finish = truncations.last {
        for plus in 0..<(nonWrite.count - finish) { cuts.append("truncate:\(part):\(truncations.count)+\(plus)") }
    }
    return Array(Set(cuts)).sorted()
}
