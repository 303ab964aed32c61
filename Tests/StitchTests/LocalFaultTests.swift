import Foundation
import Glibc
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch
@testable import StitchCore
import StitchLocks

/// Local faults: a full disk, a read-only folder, files changed under a running download, damaged state files and
/// a damaged catalog. Faults fire on byte counts (server stalls), never on sleeps. The mount-based cases need root;
/// without it they print why they are skipped and pass.
@Suite(.serialized) struct LocalFaultTests {
    static let etag = "\"lf\""

    // MARK: Helpers

    /// A tmpfs of `size` bytes mounted on a fresh directory under /tmp, unmounted (and removed) on release.
    final class Tmpfs: Sendable {
        let path: String

        /// nil (with a printed reason) when mounting is not possible here.
        init?(size: Int, readOnly: Bool = false, label: String) {
            var template = Array("/tmp/stitch-tmpfs-XXXXXX".utf8CString)
            guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
                print("SKIP \(label): cannot make a mount point: \(Errno(rawValue: errno))")
                return nil
            }
            path = String(cString: made)
            let options = "size=\(size)" + (readOnly ? ",ro" : "")
            guard mount("tmpfs", path, "tmpfs", 0, options) == 0 else {
                let error = Errno(rawValue: errno)
                rmdir(path)
                print("SKIP \(label): cannot mount a tmpfs (\(error); needs root / CAP_SYS_ADMIN)")
                return nil
            }
        }

        /// Changes the size (frees space without touching the files).
        func resize(_ size: Int) throws {
            guard mount("tmpfs", path, "tmpfs", UInt(MS_REMOUNT), "size=\(size)") == 0 else {
                throw Errno(rawValue: errno)
            }
        }

        /// Writes zeros to `name` until the file system is full; returns the bytes written.
        @discardableResult
        func fill(_ name: String, upTo limit: Int = Int.max) -> Int {
            let fd = open(path + "/" + name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
            guard fd >= 0 else { return 0 }
            defer { close(fd) }
            let chunk = [UInt8](repeating: 0, count: 4096)
            var total = 0
            while total < limit {
                let n = chunk.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, min($0.count, limit - total)) }
                if n <= 0 { break }
                total += n
            }
            return total
        }

        deinit {
            umount2(path, Int32(MNT_DETACH))
            rmdir(path)
        }
    }

    static func options(connections: Int? = 1) -> DownloadOptions {
        var options = DownloadOptions.testing
        options.connections = connections
        return options
    }

    static func download(
        _ f: Fixture, _ url: String, to path: String, overwrite: Bool = false,
        options: DownloadOptions = LocalFaultTests.options(),
        events: @escaping @Sendable (DownloadEvent) -> Void = { _ in }
    ) async throws -> DownloadResult {
        let request = DownloadRequest(url: url, destination: .file(path), checksum: nil, overwrite: overwrite)
        return try await Downloader(transport: TestBackend.selected.testTransport, clock: f.clock).download(
            request, options: options, onEvent: events)
    }

    static func expectOneLine(_ error: DownloadError?, sourceLocation: SourceLocation = #_sourceLocation) {
        guard let error else { return }
        #expect(!error.message.contains("\n"), "multi-line: \(error.message)", sourceLocation: sourceLocation)
        #expect(!error.message.isEmpty, sourceLocation: sourceLocation)
    }

    static func expectBytes(_ path: String, _ data: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
        let bytes = try? readFile(path)
        #expect(bytes?.count == data.count, "\(path): \(bytes?.count ?? -1) bytes", sourceLocation: sourceLocation)
        let same = bytes == data
        #expect(same, "\(path) differs from the source", sourceLocation: sourceLocation)
        let paths = DownloadPaths(destination: path)
        for leftover in [paths.part, paths.state, paths.live, paths.state + ".tmp"] {
            #expect(!fileExists(leftover), "\(leftover) left behind", sourceLocation: sourceLocation)
        }
    }

    static func rangeStart(_ request: RecordedRequest?) -> Int? {
        guard let range = request?.askedRange, range.hasPrefix("bytes=") else { return nil }
        return Int(range.dropFirst(6).prefix { $0 != "-" })
    }

    // MARK: 1. Full disk

    /// A 6 MiB file into a 3 MiB tmpfs that already holds a 1 MiB filler: a one-line `.io` error naming the lack
    /// of space, the partial kept, and after the space is freed the same download resumes and ends byte-exact.
    @Test(arguments: [false, true])
    func fullDiskKeepsThePartialAndResumes(chunked: Bool) async throws {
        guard let disk = Tmpfs(size: 3 << 20, label: "fullDiskKeepsThePartialAndResumes") else { return }
        let f = try Fixture()
        let file = ServedFile.random(size: 6 << 20, seed: 71, etag: Self.etag)
        // The first response without ranges too, so that URLSession's first window (whose Content-Range would tell the
        // length) is answered as libcurl's request for the whole file is.
        f.serve(file, faults: chunked ? FaultPolicy { _, index in index == 0 ? .all([.chunked, .ignoreRange]) : .chunked } : .none)
        #expect(disk.fill("filler", upTo: 1 << 20) == 1 << 20)
        let dest = disk.path + "/file.bin"
        let paths = DownloadPaths(destination: dest)

        let error = await #expect(throws: DownloadError.self) { try await Self.download(f, f.url, to: dest) }
        #expect(error?.code == .io)
        #expect(error?.message.contains("No space left on device") == true, "\(error?.message ?? "")")
        #expect(error?.isResumable == true)
        Self.expectOneLine(error)
        print("full disk (\(chunked ? "chunked" : "known length")): \(error?.message ?? "")")
        #expect(!fileExists(dest))
        #expect(fileExists(paths.part))
        #expect(fileExists(paths.state))
        let kept = fileSize(paths.part) ?? -1
        if chunked {
            #expect(kept > 1 << 20, "only \(kept) bytes were kept")
            // What is kept is the source's bytes.
            let prefix = try readFile(paths.part)
            #expect(prefix == Array(file.data[0..<prefix.count]))
        }

        // Free space: remove the filler and make room for the whole file.
        unlink(disk.path + "/filler")
        try disk.resize(16 << 20)
        let before = f.server.requests.count
        let result = try await Self.download(f, f.url, to: dest)
        #expect(result.destination == dest)
        Self.expectBytes(dest, file.data)
        let resumed = f.server.requests[before...]
        if chunked {
            let start = try #require(Self.rangeStart(resumed.first), "no range in \(resumed.map(\.askedRange))")
            #expect(start > 1 << 20 && Int64(start) <= kept, "resumed from \(start), kept \(kept)")
            #expect(result.resumedFrom == Int64(start))
        } else {
            #expect(result.resumedFrom == 0)
        }
    }

    /// A small file (no preallocation up to `PartStore.smallFileLimit`) into a tmpfs with less room than it needs:
    /// the first write that finds the disk full ends the download with the same one-line `.io` error a
    /// preallocation gave, no file appears at the destination, and with room a rerun ends byte-exact.
    @Test func fullDiskWithASmallFile() async throws {
        guard let disk = Tmpfs(size: 1 << 20, label: "fullDiskWithASmallFile") else { return }
        let f = try Fixture()
        let file = ServedFile.random(size: 768 << 10, seed: 73, etag: Self.etag)
        f.serve(file)
        let filled = disk.fill("filler", upTo: 640 << 10)
        #expect(filled == 640 << 10)
        let dest = disk.path + "/small.bin"

        let error = await #expect(throws: DownloadError.self) { try await Self.download(f, f.url, to: dest) }
        #expect(error?.code == .io)
        #expect(error?.message.contains("No space left on device") == true, "\(error?.message ?? "")")
        Self.expectOneLine(error)
        print("full disk (small file): \(error?.message ?? "")")
        #expect(!fileExists(dest))

        unlink(disk.path + "/filler")
        let result = try await Self.download(f, f.url, to: dest)
        #expect(result.destination == dest)
        Self.expectBytes(dest, file.data)
    }

    /// The data fits (preallocated) but the state's temporary file does not: the checkpoint fails with a clear
    /// error (or the download, already able to finish, completes); the previous state file is intact, no temporary
    /// file is left, and once space is freed a rerun ends byte-exact.
    @Test func fullDiskWhileWritingTheState() async throws {
        guard let disk = Tmpfs(size: 8 << 20, label: "fullDiskWhileWritingTheState") else { return }
        let f = try Fixture()
        let size = 6 << 20
        let file = ServedFile.random(size: size, seed: 72, etag: Self.etag)
        let stallAt = 3 << 19  // 1.5 MiB
        f.serve(file, faults: .onRequest(0, .stallAfter(stallAt)))
        let dest = disk.path + "/file.bin"
        let paths = DownloadPaths(destination: dest)
        var options = Self.options()
        options.checkpointBytes = 1 << 20
        options.checkpointInterval = 3600

        let task = Task { try await Self.download(f, f.url, to: dest, options: options) }
        let server = f.server
        #expect(await blocking { server.waitForStall(timeout: .seconds(30)) })
        #expect(await blocking { waitUntil { fileSize(paths.part) == Int64(stallAt) } })
        // The checkpoint poked at 1 MiB has written the state.
        #expect(await blocking { waitUntil { ((try? StateFile.read(paths.state))??.durableBytes ?? 0) >= 1 << 20 } })
        let previous = try readFile(paths.state)
        let filled = disk.fill("filler")
        #expect(filled > 0)
        server.releaseStalls()

        let outcome = await task.result
        switch outcome {
        case .success:
            print("state write on a full disk: the download finished anyway (data was preallocated)")
            Self.expectBytes(dest, file.data)
        case .failure(let failure):
            let error = try #require(failure as? DownloadError, "\(failure)")
            print("state write on a full disk: \(error.message)")
            #expect(error.code == .io)
            #expect(error.message.contains("No space left on device"), "\(error.message)")
            Self.expectOneLine(error)
            #expect(!fileExists(dest))
            #expect(fileExists(paths.part))
            #expect(!fileExists(paths.state + ".tmp"))
            #expect(try readFile(paths.state) == previous, "the previous state was changed")
            unlink(disk.path + "/filler")
            let result = try await Self.download(f, f.url, to: dest, options: options)
            #expect(result.resumedFrom >= 1 << 20)
            Self.expectBytes(dest, file.data)
        }
    }

    /// The state writer itself on a full disk: one-line `.io` error, old file byte-identical, no temporary left.
    @Test func stateFileWriteOnAFullDiskKeepsTheOldState() throws {
        guard let disk = Tmpfs(size: 1 << 20, label: "stateFileWriteOnAFullDiskKeepsTheOldState") else { return }
        let f = try Fixture()
        let path = disk.path + "/file.bin.stitch"
        let old = f.state(durable: 1000, total: 4096)
        try StateFile.write(old, to: path)
        let bytes = try readFile(path)
        disk.fill("filler")
        var next = old
        next.segments[0].durable = 2000
        let error = #expect(throws: DownloadError.self) { try StateFile.write(next, to: path) }
        #expect(error?.code == .io)
        #expect(error?.message.contains("No space left on device") == true, "\(error?.message ?? "")")
        Self.expectOneLine(error)
        #expect(try readFile(path) == bytes)
        #expect(try StateFile.read(path) == old)
        #expect(!fileExists(path + ".tmp"))
    }

    /// The manager's catalog on a full disk: a pause (and a pause of all) that the catalog could not keep is not
    /// answered as done — an RPC client told "paused" must find it paused after a power cut. The download stays
    /// paused in memory, and a resume once there is room again is kept.
    @Test func aPauseTheCatalogCannotKeepIsNotAnsweredAsKept() async throws {
        guard let disk = Tmpfs(size: 2 << 20, label: "aPauseTheCatalogCannotKeepIsNotAnsweredAsKept") else { return }
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 4 << 20, seed: 0xF11, etag: "\"full\"")
        f.server.serve("/held.bin", file: file)
        f.server.throttle = 256 << 10
        let manager = try DownloadManager(directory: disk.path + "/manager", configuration: f.configuration())
        let id = try await manager.add(f.server.url("/held.bin"), options: .init(out: "held.bin"))
        disk.fill("filler")
        let error = await #expect(throws: DownloadManagerError.self) { try await manager.pause(id) }
        let message = error.map { "\($0)" } ?? ""
        #expect(message.contains("full"), "\(message)")
        #expect(error?.isCatalogFailure == true, "\(message)")
        print("aPauseTheCatalogCannotKeepIsNotAnsweredAsKept: \(message)")
        #expect(await manager.download(id)?.status == .paused)
        // Paused all the same: the run stops (its request ends).
        #expect(await eventually(timeout: 30) { f.server.activeRequests == 0 }, "the run went on")
        // Once there is room, the row the catalog refused is written again (at the latest when the manager closes).
        try disk.resize(8 << 20)
        await manager.close()
        let reopened = try DownloadManager(directory: disk.path + "/manager", configuration: f.configuration())
        #expect(await reopened.download(id)?.status == .paused)
        // And a pause of all, on a full disk again, stops every run and says it was not kept.
        try await reopened.resume(id)
        #expect(await eventually(timeout: 30) { f.server.activeRequests == 1 }, "the resumed run never asked")
        disk.fill("filler2")
        let all = await #expect(throws: DownloadManagerError.self) { try await reopened.pauseAll() }
        #expect(all?.isCatalogFailure == true, "\(String(describing: all))")
        #expect(await eventually(timeout: 30) { f.server.activeRequests == 0 }, "pauseAll left a run going")
        await reopened.close()
    }

    // MARK: 2. Read-only folder

    /// Root ignores permission bits, so the folder is a tmpfs mounted read-only: a one-line `.io` error and
    /// nothing created.
    @Test func readOnlyFolder() async throws {
        guard let disk = Tmpfs(size: 1 << 20, readOnly: true, label: "readOnlyFolder") else { return }
        let f = try Fixture()
        let file = ServedFile.random(size: 2 << 20, seed: 73, etag: Self.etag)
        f.serve(file)
        let dest = disk.path + "/file.bin"
        let error = await #expect(throws: DownloadError.self) { try await Self.download(f, f.url, to: dest) }
        #expect(error?.code == .io)
        #expect(error?.message.contains("Read-only file system") == true, "\(error?.message ?? "")")
        Self.expectOneLine(error)
        print("read-only folder: \(error?.message ?? "")")
        #expect(try FileManager.default.contentsOfDirectory(atPath: disk.path).isEmpty)
    }

    // MARK: 3. DEST replaced by a directory

    @Test func destinationBecomesADirectoryBeforeTheRename() async throws {
        let f = try Fixture()
        f.watch.disarm()
        let size = 3 << 20
        let file = ServedFile.random(size: size, seed: 74, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1 << 20)))
        let task = Task { try await Self.download(f, f.url, to: f.dest) }
        let server = f.server
        #expect(await blocking { server.waitForStall(timeout: .seconds(30)) })
        #expect(await blocking { waitUntil { fileSize(f.paths.part) == 1 << 20 } })
        #expect(mkdir(f.dest, 0o755) == 0)
        server.releaseStalls()
        let error = await #expect(throws: DownloadError.self) { try await task.value }
        #expect(error?.code == .io)
        Self.expectOneLine(error)
        print("destination became a directory: \(error?.message ?? "")")
        #expect(fileExists(f.paths.part))
        #expect(fileSize(f.paths.part) == Int64(size))
        #expect(try readFile(f.paths.part) == file.data)

        // While the directory is there a rerun refuses, keeping the data.
        let refused = await #expect(throws: DownloadError.self) { try await Self.download(f, f.url, to: f.dest) }
        Self.expectOneLine(refused)
        #expect(fileSize(f.paths.part) == Int64(size))

        #expect(rmdir(f.dest) == 0)
        let before = f.server.bodyBytesSent
        let result = try await Self.download(f, f.url, to: f.dest)
        Self.expectBytes(f.dest, file.data)
        #expect(f.server.bodyBytesSent == before, "the data was fetched again")
        #expect(result.resumedFrom == Int64(size))
    }

    // MARK: 4. The part file changed under a running download

    enum PartDamage: String, CaseIterable, Sendable {
        case deleted, truncated
    }

    @Test(arguments: PartDamage.allCases)
    func partFileChangedUnderARunningDownload(_ damage: PartDamage) async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 75, etag: Self.etag)
        let stallAt = 5 << 19  // 2.5 MiB
        f.serve(file, faults: .onRequest(0, .stallAfter(stallAt)))
        let task = Task { try await Self.download(f, f.url, to: f.dest) }
        let server = f.server
        #expect(await blocking { server.waitForStall(timeout: .seconds(30)) })
        #expect(await blocking { waitUntil { fileSize(f.paths.part) == Int64(stallAt) } })
        switch damage {
        case .deleted:
            #expect(unlink(f.paths.part) == 0)
        case .truncated:
            let fd = open(f.paths.part, O_RDWR | O_CLOEXEC)
            #expect(fd >= 0)
            #expect(ftruncate(fd, off_t(1 << 19)) == 0)
            close(fd)
        }
        server.releaseStalls()
        switch await task.result {
        case .success(let result):
            print("part \(damage) under a running download: finished")
            #expect(result.destination == f.dest)
            Self.expectBytes(f.dest, file.data)
            return
        case .failure(let failure):
            let error = try #require(failure as? DownloadError, "\(failure)")
            print("part \(damage) under a running download: \(error.code): \(error.message)")
            Self.expectOneLine(error)
            #expect(error.isResumable)
            let landed = fileExists(f.dest) ? try readFile(f.dest) : nil
            #expect(landed == nil || landed == file.data, "wrong bytes at the destination")
        }
        let result = try await Self.download(f, f.url, to: f.dest)
        #expect(result.destination == f.dest)
        Self.expectBytes(f.dest, file.data)
    }

    // MARK: 5. Damaged state file and live record

    enum StateDamage: String, CaseIterable, Sendable {
        case truncated, zeroFilled, emptied, garbage
    }

    /// Writes `damage` over the file at `path`.
    static func damage(_ path: String, _ damage: StateDamage, seed: UInt64 = 9) throws {
        let state = try readFile(path)
        #expect(state.count > 100)
        switch damage {
        case .truncated: try writeFile(path, Array(state[0..<(state.count / 2)]))
        case .zeroFilled: try writeFile(path, [UInt8](repeating: 0, count: state.count))
        case .emptied: try writeFile(path, [])
        case .garbage:
            var generator = SplitMix64(seed: seed)
            try writeFile(path, (0..<state.count).map { _ in UInt8.random(in: 0...255, using: &generator) })
        }
    }

    /// A partial interrupted at 1.5 MiB of 4 MiB, then its state file damaged and no usable previous generation
    /// (none, or damaged too): one line, `.unusableState`, the part file untouched; with `overwrite` the download
    /// starts over from byte 0 (its data was not trusted).
    @Test(arguments: StateDamage.allCases, [false, true])
    func damagedStateFileIsReportedAndOverwriteStartsOver(_ damage: StateDamage, previousDamagedToo: Bool) async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 76, etag: Self.etag)
        let stallAt = 3 << 19
        f.serve(file, faults: .onRequest(0, .stallAfter(stallAt)))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: Int64(stallAt))
        if previousDamagedToo {
            // The newest state doubles as the previous generation, then both are damaged.
            try writeFile(f.paths.previousState, try readFile(f.paths.state))
            try Self.damage(f.paths.previousState, damage, seed: 10)
        } else {
            unlink(f.paths.previousState)
        }
        try Self.damage(f.paths.state, damage)
        let part = try readFile(f.paths.part)

        let error = await #expect(throws: DownloadError.self) {
            try await Self.download(f, f.url, to: f.dest)
        }
        #expect(error?.code == .unusableState)
        Self.expectOneLine(error)
        #expect(error?.message.contains(f.paths.state) == true, "\(error?.message ?? "")")
        print("state \(damage): \(error?.message ?? "")")
        #expect(try readFile(f.paths.part) == part, "the partial data was changed")
        #expect(!fileExists(f.dest))

        let before = f.server.requests.count
        let result = try await Self.download(f, f.url, to: f.dest, overwrite: true)
        Self.expectBytes(f.dest, file.data)
        #expect(result.resumedFrom == 0)
        #expect(f.server.requests[before...].first?.askedRange == nil)
    }

    /// A damaged state file beside a readable previous generation (here: the state as it was at the interruption,
    /// 1.5 MiB of 4 MiB with piece 0 recorded and the half piece after it proven): the resume falls back on it, says
    /// so in one notice, keeps exactly what its checksums prove (all 1.5 MiB) and fetches the rest. With piece 0's
    /// bytes also damaged in the part file, piece 0 is fetched again and the proven half piece kept.
    @Test(arguments: StateDamage.allCases, [false, true])
    func damagedStateFallsBackToThePreviousCheckpoint(_ damage: StateDamage, partDamaged: Bool) async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 77, etag: Self.etag)
        let stallAt = 3 << 19
        f.serve(file, faults: .onRequest(0, .stallAfter(stallAt)))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: Int64(stallAt))
        let saved = try #require(try StateFile.read(f.paths.state))
        #expect(saved.durableBytes == Int64(stallAt))
        #expect(saved.pieces.first.flatMap { $0 } != nil, "piece 0 has no checksum: \(saved.pieces)")
        try writeFile(f.paths.previousState, try readFile(f.paths.state))
        try Self.damage(f.paths.state, damage)
        if partDamaged {
            let fd = open(f.paths.part, O_WRONLY)
            #expect(fd >= 0)
            var junk: [UInt8] = [0xDE, 0xAD, 0xBE, 0xEF]
            #expect(pwrite(fd, &junk, junk.count, 1000) == junk.count)
            close(fd)
        }

        // `stitch get --resume DEST` finds the URL in the previous generation too.
        #expect(try Downloader.savedDownload(at: f.dest).url == f.url)

        let before = f.server.requests.count
        let notices = Locked<[String]>([])
        let result = try await Self.download(f, f.url, to: f.dest) { event in
            if case .resuming(_, let note?) = event { notices.withLock { $0.append(note) } }
        }
        Self.expectBytes(f.dest, file.data)
        let kept: Int64 = partDamaged ? 1 << 19 : 3 << 19
        #expect(result.resumedFrom == kept)
        let first = f.server.requests[before...].first
        #expect(Self.rangeStart(first) == (partDamaged ? 0 : Int(kept)), "\(String(describing: first?.askedRange))")
        let note = notices.withLock { $0 }
        #expect(note.count == 1, "\(note)")
        #expect(note.first?.contains(f.paths.state) == true && note.first?.contains("checkpoint before it") == true,
            "\(note)")
        #expect(!note.contains { $0.contains("\n") })
        let leftovers = [f.paths.part] + f.paths.sidecars
        #expect(leftovers.filter(fileExists).isEmpty, "\(leftovers.filter(fileExists))")
    }

    /// A previous generation without a length (a chunked response) has no piece checksums, but proofs of its durable
    /// prefix in 1 MiB chunks: the fallback keeps what they prove (all of it here), as the download of the URL it
    /// names, and says so; the file ends byte-exact.
    @Test func previousStateWithoutALengthKeepsItsProvenPrefix() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 3 << 20, seed: 86, etag: Self.etag)
        // (The first response ignores ranges, so that URLSession's first window gets no Content-Range either.)
        f.serve(file, faults: FaultPolicy { _, index in
            index == 0 ? .all([.chunked, .stallAfter(3 << 19), .ignoreRange]) : .chunked
        })
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 3 << 19)
        let saved = try #require(try StateFile.read(f.paths.state))
        #expect(saved.validators.totalLength == nil && saved.durableBytes > 0, "\(saved)")
        try writeFile(f.paths.previousState, try readFile(f.paths.state))
        try Self.damage(f.paths.state, .truncated)

        let before = f.server.requests.count
        let notices = Locked<[String]>([])
        let result = try await Self.download(f, f.url, to: f.dest) { event in
            if case .resuming(_, let note?) = event { notices.withLock { $0.append(note) } }
        }
        Self.expectBytes(f.dest, file.data)
        #expect(result.resumedFrom == 3 << 19)
        #expect(f.server.requests[before...].first?.askedRange == "bytes=1572864-")
        #expect(notices.withLock { $0 }.contains { $0.contains("keeping the 1572864 bytes") }, "\(notices.withLock { $0 })")
    }

    /// Damage too scattered to repair in place: a sparse part file of 514 MiB of zeros, and a state (of a 600 MiB
    /// download, written by `bootID`) recording every piece, every odd one with a wrong checksum — cutting them
    /// would leave more than 256 runs.
    static func scatteredDamage(_ f: Fixture, bootID: String) throws -> DownloadState {
        let piece = 1 << 20
        let pieces = 514
        let total = Int64(600 * piece)
        let fd = open(f.paths.part, O_RDWR | O_CREAT, 0o644)
        #expect(fd >= 0 && ftruncate(fd, off_t(pieces * piece)) == 0)
        close(fd)
        var zeros = CRC32C()
        [UInt8](repeating: 0, count: piece).withUnsafeBytes { zeros.update($0) }
        return DownloadState(
            url: f.url, headers: [], checksum: nil,
            validators: Validators(etag: Self.etag, lastModified: nil, date: nil, totalLength: total, acceptRanges: true),
            segments: [Segment(start: 0, end: total, durable: Int64(pieces * piece))],
            pieceSize: PieceLayout.pieceSize(forTotal: total),
            pieces: (0..<pieces).map { $0 % 2 == 0 ? zeros.value : zeros.value ^ 1 },
            bootID: bootID, liveNonce: "1234", updatedAt: 0)
    }

    /// A fallback that cannot repair in place (more than 256 separate proven runs would be left) refuses in one line
    /// and changes nothing on disk: the damaged state and the previous one stay byte for byte, so a second try does
    /// the same, and nothing unproven is ever written as a valid state. (A state rewritten before the check would
    /// be trusted by the next run.) Then `overwrite` starts over.
    @Test func fallbackThatCannotRepairChangesNothing() async throws {
        let f = try Fixture()
        try StateFile.write(try Self.scatteredDamage(f, bootID: BootID.current), to: f.paths.previousState)
        try writeFile(f.paths.state, [UInt8](repeating: 0, count: 300))
        let before = (state: try readFile(f.paths.state), previous: try readFile(f.paths.previousState))
        f.serve(ServedFile.random(size: 1 << 20, seed: 80, etag: Self.etag))

        for _ in 0..<2 {
            let error = await #expect(throws: DownloadError.self) { try await Self.download(f, f.url, to: f.dest) }
            #expect(error?.code == .unusableState, "\(String(describing: error))")
            Self.expectOneLine(error)
            #expect(try readFile(f.paths.state) == before.state, "the damaged state was replaced")
            #expect(try readFile(f.paths.previousState) == before.previous, "the previous state changed")
            #expect(f.server.requests.isEmpty)
        }
        let result = try await Self.download(f, f.url, to: f.dest, overwrite: true)
        #expect(result.resumedFrom == 0)
    }

    /// The same for damage found after a reboot: the pieces are checked before the state is rewritten with this
    /// boot's id (a state with it is never checked again), so a repair that cannot be done in place leaves the state
    /// byte for byte, and the next run checks again; `overwrite` starts over.
    @Test func rebootRepairThatCannotBeDoneChangesNothing() async throws {
        let f = try Fixture()
        try StateFile.write(try Self.scatteredDamage(f, bootID: "before-the-reboot"), to: f.paths.state)
        let before = try readFile(f.paths.state)
        let file = ServedFile.random(size: 1 << 20, seed: 84, etag: Self.etag)
        f.serve(file)

        for _ in 0..<2 {
            let error = await #expect(throws: DownloadError.self) { try await Self.download(f, f.url, to: f.dest) }
            #expect(error?.code == .unusableState, "\(String(describing: error))")
            #expect(try readFile(f.paths.state) == before, "the state was rewritten before its pieces were checked")
            #expect(f.server.requests.isEmpty)
        }
        let result = try await Self.download(f, f.url, to: f.dest, overwrite: true)
        #expect(result.resumedFrom == 0)
        Self.expectBytes(f.dest, file.data)
    }

    /// The same repair that cannot be done in place, for a download that adopted aria2's partial and was cut
    /// between the adoption's rename and the removal of aria2's control file: with `overwrite` the partial is
    /// deleted and the download starts over, still as the adopting download, so the control file (which
    /// describes a file no longer there) goes when the file is finished. Before the fix of bf30e6c the start over
    /// forgot the adoption, and the control file stayed beside the finished file for good.
    @Test func anAdoptedDownloadStartedOverStillRemovesAria2sControlFile() async throws {
        let f = try Fixture()
        var state = try Self.scatteredDamage(f, bootID: "before-the-reboot")
        state.adoption = AdoptionRecord(origin: .aria2, kept: false)
        try StateFile.write(state, to: f.paths.state)
        let control = ForeignPartial.controlFile(of: f.dest)
        try writeFile(control, [UInt8](repeating: 7, count: 64))
        let file = ServedFile.random(size: 1 << 20, seed: 85, etag: Self.etag)
        f.serve(file)

        let error = await #expect(throws: DownloadError.self) { try await Self.download(f, f.url, to: f.dest) }
        #expect(error?.code == .unusableState, "\(String(describing: error))")
        #expect(fileExists(control), "a refused run removed aria2's control file")
        let result = try await Self.download(f, f.url, to: f.dest, overwrite: true)
        #expect(result.resumedFrom == 0)
        Self.expectBytes(f.dest, file.data)
        #expect(!fileExists(control), "aria2's control file stayed beside the finished file")
    }

    /// A fallback stopped by an error before its first state write (here the live record cannot be created) leaves the
    /// damaged state and the previous one as they were; the next run falls back again and keeps what is proven.
    @Test func fallbackInterruptedBeforeItsFirstWriteFallsBackAgain() async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 81, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(3 << 19)))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 3 << 19)
        try writeFile(f.paths.previousState, try readFile(f.paths.state))
        try Self.damage(f.paths.state, .garbage)
        let damaged = try readFile(f.paths.state)
        unlink(f.paths.live)
        #expect(mkdir(f.paths.live, 0o755) == 0)

        let error = await #expect(throws: DownloadError.self) { try await Self.download(f, f.url, to: f.dest) }
        Self.expectOneLine(error)
        #expect(try readFile(f.paths.state) == damaged)
        #expect(try StateFile.read(f.paths.previousState)?.durableBytes == Int64(3 << 19))

        #expect(rmdir(f.paths.live) == 0)
        let result = try await Self.download(f, f.url, to: f.dest)
        Self.expectBytes(f.dest, file.data)
        #expect(result.resumedFrom == 3 << 19)
    }

    /// A run that fails after taking the download's lock lets go of it before it returns, even while another
    /// thread spawns processes (each child holds a copy of every open file description from its fork to its exec,
    /// and a lock released only by a close lived that long): a retry at once never finds the download "being
    /// downloaded by another stitch run". 200 failed runs back to back, with a spawner running throughout.
    @Test func aFailedRunLetsGoOfTheLockWhileProcessesSpawn() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: 4 << 20, seed: 84, etag: Self.etag)
        f.serve(file, faults: .onRequest(0, .stallAfter(1 << 20)))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 1 << 20)
        unlink(f.paths.live)
        #expect(mkdir(f.paths.live, 0o755) == 0)  // every run now fails after its lock: no live record

        let spawning = Atomic<Bool>(true)
        let spawned = Atomic<Int>(0)
        let spawner = Thread {
            while spawning.load(ordering: .acquiring) {
                var pid: pid_t = 0
                let argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/true"), nil]
                defer { for argument in argv { free(argument) } }
                if posix_spawn(&pid, "/bin/true", nil, nil, argv, environ) == 0 {
                    var status: Int32 = 0
                    waitpid(pid, &status, 0)
                    spawned.add(1, ordering: .relaxed)
                }
            }
        }
        spawner.start()
        defer { spawning.store(false, ordering: .releasing) }
        var busy: [Int] = []
        for attempt in 0..<200 {
            do {
                _ = try await Self.download(f, f.url, to: f.dest)
                Issue.record("attempt \(attempt) succeeded without a live record")
            } catch let error as DownloadError where error.message.contains("another stitch run") {
                busy.append(attempt)
            } catch {}
        }
        spawning.store(false, ordering: .releasing)
        #expect(busy.isEmpty, "found busy by its own earlier run: attempts \(busy) (\(spawned.load(ordering: .relaxed)) spawns)")
        #expect(rmdir(f.paths.live) == 0)
        let result = try await Self.download(f, f.url, to: f.dest)
        Self.expectBytes(f.dest, file.data)
        #expect(result.resumedFrom == 1 << 20)
    }

    /// Sidecars of an earlier download never outlive it: a clean-up cut short after the rename is finished by the
    /// next run ("already complete"), and a new download at the same name removes an old previous generation
    /// before its first byte.
    @Test func previousGenerationsOfOtherDownloadsAreRemoved() async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 82, etag: Self.etag)
        f.serve(file, faults: .onRequests([0: .stallAfter(1 << 20), 1: .stallAfter(1 << 20)]))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 1 << 20)
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 2 << 20)
        let state = try readFile(f.paths.state)
        let previous = try readFile(f.paths.previousState)
        _ = try await Self.download(f, f.url, to: f.dest)
        Self.expectBytes(f.dest, file.data)
        #expect(f.paths.sidecars.filter(fileExists).isEmpty)

        // Killed between the rename and the unlinks: the state, its previous generation and a link left over.
        try writeFile(f.paths.state, state)
        try writeFile(f.paths.previousState, previous)
        try writeFile(f.paths.state + ".lnk", previous)
        let again = try await Self.download(f, f.url, to: f.dest)
        #expect(again.alreadyComplete)
        #expect(f.paths.sidecars.filter(fileExists).isEmpty, "\(f.paths.sidecars.filter(fileExists))")

        // The file is deleted and the server has a new version: the old previous generation must go at once.
        unlink(f.dest)
        try writeFile(f.paths.previousState, previous)
        let changed = ServedFile.random(size: size, seed: 83, etag: "\"v2\"")
        f.serve(changed, faults: .always(.stallAfter(1)))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 1)
        if let stale = try StateFile.read(f.paths.previousState) {
            #expect(stale.validators.etag == "\"v2\"", "the old download's previous state survived")
        }
    }

    /// Real checkpoints keep the previous generation: after two interruptions the previous state reads, describes
    /// the same download, and is no newer than the state; a restart from zero (new validators) removes it.
    @Test func checkpointsKeepThePreviousGenerationAndARestartDropsIt() async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 78, etag: Self.etag)
        f.serve(file, faults: .onRequests([0: .stallAfter(1 << 20), 1: .stallAfter(2 << 20)]))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 1 << 20)
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 3 << 20)
        let state = try #require(try StateFile.read(f.paths.state))
        let previous = try #require(try StateFile.read(f.paths.previousState))
        #expect(previous.url == state.url && previous.liveNonce == state.liveNonce)
        #expect(previous.validators == state.validators)
        #expect(previous.durableBytes <= state.durableBytes && previous.durableBytes >= 1 << 20,
            "\(previous.durableBytes) vs \(state.durableBytes)")
        #expect(!fileExists(f.paths.state + ".lnk"))

        // A new ETag: the resume restarts from zero, and the old generation must not survive beside new bytes.
        // Interrupted before any new byte, so no later checkpoint replaces what the restart itself left.
        let changed = ServedFile.random(size: size, seed: 79, etag: "\"other\"")
        f.serve(changed, faults: .always(.stallAfter(0)))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: 0)
        let restarted = try #require(try StateFile.read(f.paths.state))
        #expect(restarted.validators.etag == "\"other\"")
        #expect(restarted.durableBytes == 0)
        #expect(!fileExists(f.paths.previousState), "a previous state of the old file survived the restart")
    }

    /// A valid state beside a garbage live record: only the durable bytes are trusted (the live record's claim is
    /// ignored), and the download ends byte-exact.
    @Test func garbageLiveRecordTrustsOnlyTheDurableState() async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 77, etag: Self.etag)
        let stallAt = 3 << 19
        f.serve(file, faults: .onRequest(0, .stallAfter(stallAt)))
        try await f.interruptedDownload(f.request(), options: Self.options(), at: Int64(stallAt))
        let state = try #require(try StateFile.read(f.paths.state))
        let live = try readFile(f.paths.live)
        var generator = SplitMix64(seed: 10)
        try writeFile(f.paths.live, (0..<live.count).map { _ in UInt8.random(in: 0...255, using: &generator) })
        let before = f.server.requests.count
        let result = try await Self.download(f, f.url, to: f.dest)
        Self.expectBytes(f.dest, file.data)
        #expect(result.resumedFrom == state.durableBytes)
        let start = Self.rangeStart(f.server.requests[before...].first) ?? 0
        #expect(Int64(start) == state.durablePrefix)
    }

    /// Not regressed: with piece checksums in a valid state, a corrupted part is found by `verify(at:)`.
    @Test func verifyFindsACorruptedPieceInAValidState() async throws {
        let f = try Fixture()
        let size = 4 << 20
        let file = ServedFile.random(size: size, seed: 78, etag: Self.etag)
        let stallAt = 3 << 20
        f.serve(file, faults: .onRequest(0, .stallAfter(stallAt)))
        var options = Self.options()
        options.checkpointBytes = 1 << 20
        let task = Task { try await Self.download(f, f.url, to: f.dest, options: options) }
        let server = f.server
        #expect(await blocking { server.waitForStall(timeout: .seconds(30)) })
        #expect(await blocking { waitUntil { fileSize(f.paths.part) == Int64(stallAt) } })
        #expect(
            await blocking {
                waitUntil { ((try? StateFile.read(f.paths.state))??.pieces.compactMap { $0 }.count ?? 0) >= 2 }
            })
        task.cancel()
        _ = await task.result
        let state = try #require(try StateFile.read(f.paths.state))
        let piece = try #require(state.pieces.firstIndex { $0 != nil })
        let fd = open(f.paths.part, O_RDWR | O_CLOEXEC)
        let junk = [UInt8](repeating: 0xA5, count: 100)
        _ = junk.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(Int64(piece) * state.pieceSize + 10)) }
        close(fd)
        let report = try Downloader.verify(at: f.dest)
        print("verify after corruption: \(report)")
        let after = try #require(try StateFile.read(f.paths.state))
        #expect(after.pieces.count <= piece || after.pieces[piece] == nil)
        let result = try await Self.download(f, f.url, to: f.dest)
        #expect(result.destination == f.dest)
        Self.expectBytes(f.dest, file.data)
    }

    // MARK: 6. Damaged catalog

    enum CatalogDamage: String, CaseIterable, Sendable {
        case truncatedToHalf, truncatedToZero, truncatedInHeader, zeroFilled, garbage
    }

    @Test(arguments: CatalogDamage.allCases)
    func damagedCatalogIsRebuiltAndPartialsFinish(_ damage: CatalogDamage) async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 2 << 20, seed: 79, etag: "\"k\"")
        f.server.serve("/k.bin", file: file, faults: .onRequest(0, .stallAfter(700_000, then: .close)))
        var manager = try f.open()
        let server = f.server
        let id = try await manager.add(server.url("/k.bin"), options: .init(out: "k.bin"))
        try #require(await blocking { server.waitForStall() })
        #expect(await eventually { await manager.download(id)?.progress.bytes == 700_000 })
        try await manager.pause(id)
        await manager.waitUntilIdle()
        await manager.close()

        let catalog = f.managerDirectory + "/catalog.sqlite3"
        let bytes = try readFile(catalog)
        #expect(bytes.count >= 4096)
        switch damage {
        case .truncatedToHalf: try writeFile(catalog, Array(bytes[0..<(bytes.count / 2)]))
        case .truncatedToZero: try writeFile(catalog, [])
        case .truncatedInHeader: try writeFile(catalog, Array(bytes[0..<50]))
        case .zeroFilled: try writeFile(catalog, [UInt8](repeating: 0, count: bytes.count))
        case .garbage: try writeFile(catalog, Array(String(repeating: "not a database ", count: 500).utf8))
        }
        try writeFile(catalog + "-wal", Array(String(repeating: "garbage wal ", count: 100).utf8))
        manager = try f.open()
        let report = manager.restoreReport
        print("catalog \(damage): \(report)")
        #expect(report.rebuiltBecause != nil, "\(damage): not rebuilt")
        #expect(report.rebuiltBecause?.contains("\n") != true)
        #expect(report.recoveredFromStateFiles == 1)
        #expect(report.restored == 1)
        let restored = try #require(await manager.downloads().first, "\(damage): the partial was not restored")
        #expect(restored.url == server.url("/k.bin"))
        #expect(restored.path == f.path("k.bin"))
        await manager.waitUntilIdle()
        #expect(await manager.download(restored.id)?.status == .completed)
        expectFile(f.path("k.bin"), file.data)
        #expect(server.requests(for: "/k.bin").last?.askedRange == "bytes=700000-")
        await manager.close()
    }

    /// Both the catalog and the download's state file damaged: the rebuilt catalog finds the download through the
    /// previous state generation, restores its progress from it, and the engine falls back on it (keeping what its
    /// checksums prove: the piece and the half piece after it).
    @Test func damagedCatalogAndStateRecoverThroughThePreviousState() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 4 << 20, seed: 85, etag: "\"p\"")
        f.server.serve("/p.bin", file: file, faults: .onRequest(0, .stallAfter(3 << 19, then: .close)))
        var manager = try f.open()
        let server = f.server
        let id = try await manager.add(server.url("/p.bin"), options: .init(out: "p.bin"))
        try #require(await blocking { server.waitForStall() })
        #expect(await eventually { await manager.download(id)?.progress.bytes == 3 << 19 })
        try await manager.pause(id)
        await manager.waitUntilIdle()
        await manager.close()

        let paths = DownloadPaths(destination: f.path("p.bin"))
        try writeFile(paths.previousState, try readFile(paths.state))
        try Self.damage(paths.state, .zeroFilled)
        try writeFile(f.managerDirectory + "/catalog.sqlite3", [])
        manager = try f.open()
        #expect(manager.restoreReport.recoveredFromStateFiles == 1)
        let restored = try #require(await manager.downloads().first, "the partial was not restored")
        #expect(restored.url == server.url("/p.bin"))
        // The previous state's progress; once the restored download runs (it starts at once, and on a loaded
        // machine its first event may come before this look), what the engine keeps: what its checksums prove.
        let bytes = restored.progress.bytes
        #expect(bytes >= 3 << 19, "\(restored.status) \(bytes)")
        await manager.waitUntilIdle()
        #expect(await manager.download(restored.id)?.status == .completed)
        expectFile(f.path("p.bin"), file.data)
        #expect(server.requests(for: "/p.bin").last?.askedRange == "bytes=1572864-")
        await manager.close()
    }
}
