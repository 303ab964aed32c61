import Foundation
import Glibc
import StitchTestSupport
import Synchronization
import Testing

@testable import Stitch

/// Crash-consistency of the storage layer: the state file's atomic replacement, the live record, and how much of
/// a part file `PartStore.reopen` trusts after a process crash (same boot) or a reboot (other boot).
@Suite struct PartStoreTests {

    // MARK: StateFile

    @Test func stateRoundTripsAndMissingIsNil() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        #expect(try StateFile.read(path) == nil)
        let state = makeState(durable: 123, total: 1000)
        try StateFile.write(state, to: path)
        #expect(try StateFile.read(path) == state)
        #expect(!fileExists(path + ".tmp"))
    }

    /// A crash while writing the temporary file, or after writing it but before the rename, leaves `NAME.tmp`
    /// beside an intact state: readers ignore it and the next write replaces it.
    @Test(arguments: ["garbage", "", "{\"schemaVersion\": 1, \"url\": \"http://x/", "newer"])
    func leftoverTemporaryIsIgnored(_ leftover: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        let old = makeState(durable: 100, total: 1000)
        try StateFile.write(old, to: path)
        var newer = old
        newer.durableLength = 900
        let text = leftover == "newer" ? String(decoding: try JSONEncoder().encode(newer), as: UTF8.self) : leftover
        try writeFile(path + ".tmp", Array(text.utf8))

        #expect(try StateFile.read(path) == old)
        try StateFile.write(newer, to: path)
        #expect(try StateFile.read(path) == newer)
        #expect(!fileExists(path + ".tmp"))
    }

    static func validJSON() throws -> String {
        String(decoding: try JSONEncoder().encode(makeState(durable: 10, total: 100)), as: UTF8.self)
    }

    @Test(arguments: [
        ("empty", ""),
        ("not JSON", "garbage"),
        ("binary", "\u{0}\u{1}\u{2}\u{ff}"),
        ("truncated", "TRUNCATED"),
        ("other format", "{\"schemaVersion\": 2}"),
        ("format as a string", "{\"schemaVersion\": \"1\"}"),
        ("missing fields", "{\"schemaVersion\": 1, \"url\": \"http://x/\"}"),
        ("wrong type", "REPLACE:\"durableLength\":10=\"durableLength\":\"ten\""),
        ("negative length", "REPLACE:\"durableLength\":10=\"durableLength\":-1"),
        ("durable beyond total", "REPLACE:\"durableLength\":10=\"durableLength\":101"),
        ("a JSON array", "[1, 2, 3]"),
    ])
    func corruptStateIsUnusable(_ name: String, _ content: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        var text = content
        if content == "TRUNCATED" {
            let valid = try Self.validJSON()
            text = String(valid.prefix(valid.count / 2))
        } else if content.hasPrefix("REPLACE:") {
            let parts = content.dropFirst(8).split(separator: "=", maxSplits: 1).map(String.init)
            text = try Self.validJSON().replacingOccurrences(of: parts[0], with: parts[1])
            #expect(text != (try Self.validJSON()), "the replacement must apply")
        }
        try writeFile(path, Array(text.utf8))
        let error = #expect(throws: DownloadError.self) { try StateFile.read(path) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains(path) == true)
        #expect(error?.message.contains("\n") == false, "one line: \(error?.message ?? "")")
    }

    @Test func oversizedStateIsUnusable() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch"
        try writeFile(path, [UInt8](repeating: 0x20, count: StateFile.maximumSize + 1))
        let error = #expect(throws: DownloadError.self) { try StateFile.read(path) }
        #expect(error?.code == .unusableState)
        #expect(error?.message.contains("too large") == true)
    }

    // MARK: LiveRecord

    @Test func liveRecordTrustsOnlyItsOwnNonce() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch-live"
        #expect(LiveRecord.read(at: path, nonce: 7) == nil)
        do {
            let record = try LiveRecord(creatingAt: path, nonce: 7, written: 10)
            #expect(LiveRecord.read(at: path, nonce: 7) == 10)
            record.store(written: 123_456_789)
            // Seen by another reader at once: the page cache is shared, no sync needed within a boot.
            #expect(LiveRecord.read(at: path, nonce: 7) == 123_456_789)
            #expect(LiveRecord.read(at: path, nonce: 8) == nil)
            record.reset(nonce: 9, written: 5)
            #expect(LiveRecord.read(at: path, nonce: 7) == nil)
            #expect(LiveRecord.read(at: path, nonce: 9) == 5)
        }
        // Still readable after the mapping is gone (a crashed process).
        #expect(LiveRecord.read(at: path, nonce: 9) == 5)
        #expect(try readFile(path).count == LiveRecord.size)
    }

    @Test(arguments: ["truncated", "zeros", "bad magic", "bad version", "huge value"])
    func damagedLiveRecordIsIgnored(_ damage: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.stitch-live"
        _ = try LiveRecord(creatingAt: path, nonce: 7, written: 10)
        var bytes = try readFile(path)
        switch damage {
        case "truncated": bytes.removeLast(1)
        case "zeros": bytes = [UInt8](repeating: 0, count: LiveRecord.size)
        case "bad magic": bytes[0] ^= 0xFF
        case "bad version": bytes[8] = 2
        default: bytes[31] = 0x80  // > Int64.max
        }
        try writeFile(path, bytes)
        #expect(LiveRecord.read(at: path, nonce: 7) == nil)
    }

    // MARK: PartStore.reopen

    struct ReopenCase: Sendable, CustomTestStringConvertible {
        var name: String
        var partSize: Int
        var durable: Int64
        var total: Int64? = 1_000_000
        var sameBoot = true
        /// The live record's extent, or nil for no live record.
        var live: Int64?
        var liveNonceMatches = true
        var expected: Int64
        var expectNote = false
        var testDescription: String { name }
    }

    static let reopenCases: [ReopenCase] = [
        ReopenCase(name: "same boot: live record ahead", partSize: 400_000, durable: 100_000, live: 300_000,
            expected: 300_000),
        ReopenCase(name: "same boot: live record behind durable", partSize: 400_000, durable: 100_000,
            live: 50_000, expected: 100_000),
        ReopenCase(name: "same boot: no live record", partSize: 400_000, durable: 100_000, live: nil,
            expected: 100_000),
        ReopenCase(name: "same boot: live record of another generation", partSize: 400_000, durable: 100_000,
            live: 300_000, liveNonceMatches: false, expected: 100_000),
        ReopenCase(name: "same boot: live record beyond the part", partSize: 200_000, durable: 100_000,
            live: 300_000, expected: 200_000),
        ReopenCase(name: "same boot: live record beyond the length", partSize: 1_200_000, durable: 100_000,
            live: 1_100_000, expected: 1_000_000),
        ReopenCase(name: "other boot: durable only", partSize: 400_000, durable: 100_000, sameBoot: false,
            live: 300_000, expected: 100_000, expectNote: true),
        ReopenCase(name: "other boot: nothing beyond durable", partSize: 100_000, durable: 100_000,
            sameBoot: false, live: 100_000, expected: 100_000),
        ReopenCase(name: "part shorter than durable", partSize: 50_000, durable: 100_000, live: 300_000,
            expected: 0, expectNote: true),
        ReopenCase(name: "part missing", partSize: -1, durable: 100_000, live: 100_000, expected: 0,
            expectNote: true),
        ReopenCase(name: "unknown length", partSize: 400_000, durable: 100_000, total: nil, live: 300_000,
            expected: 300_000),
    ]

    @Test(arguments: reopenCases)
    func reopenTrusts(_ c: ReopenCase) throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: max(0, c.partSize), seed: 5)
        if c.partSize >= 0 { try writeFile(paths.part, data) }
        var state = makeState(durable: c.durable, total: c.total)
        if !c.sameBoot { state.bootID = "another-boot" }
        try StateFile.write(state, to: paths.state)
        if let live = c.live {
            _ = try LiveRecord(creatingAt: paths.live, nonce: c.liveNonceMatches ? state.nonce : state.nonce &+ 1,
                written: live)
        }

        let (store, point) = try PartStore.reopen(paths: paths, state: state)
        #expect(point.offset == c.expected)
        #expect((point.note != nil) == c.expectNote, "\(point.note ?? "no note")")
        #expect(store.written.load(ordering: .relaxed) == c.expected)
        // The untrusted tail is gone; the trusted prefix is untouched.
        #expect(try readFile(paths.part) == Array(data.prefix(Int(c.expected))))
        // The state now vouches for exactly the trusted bytes, in this boot, durably.
        let saved = try #require(try StateFile.read(paths.state))
        #expect(saved.bootID == BootID.current)
        #expect(saved.durableLength == c.expected)
        #expect(saved.liveNonce == state.liveNonce)
        #expect(LiveRecord.read(at: paths.live, nonce: state.nonce) == c.expected)
    }

    // MARK: Checkpoints and restarts

    /// Bytes written but not checkpointed are trusted after a process crash (live record) and not after a reboot.
    @Test func crashBetweenCheckpoints() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 400_000, seed: 9)
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 400_000).validators)
        try write(store!, data, 0..<300_000)
        try store!.checkpoint()
        #expect(try StateFile.read(paths.state)?.durableLength == 300_000)
        try write(store!, data, 300_000..<350_000)  // never checkpointed
        store = nil  // the process dies

        let state = try #require(try StateFile.read(paths.state))
        #expect(state.durableLength == 300_000)

        // Same boot: the live record vouches for 350 000.
        let sameBoot = try PartStore.reopen(paths: paths, state: state).1
        #expect(sameBoot.offset == 350_000)

        // A reboot instead (simulated: another boot id in the state written before the crash).
        var rebooted = state
        rebooted.bootID = "before-the-reboot"
        try StateFile.write(rebooted, to: paths.state)
        try writeFile(paths.part, Array(data[0..<350_000]))
        let afterReboot = try PartStore.reopen(paths: paths, state: rebooted).1
        #expect(afterReboot.offset == 300_000)
        #expect(try readFile(paths.part) == Array(data[0..<300_000]))
    }

    /// `restart` writes the new state (new nonce, nothing durable) before it touches the live record or the part
    /// file, so a crash at any point after it never trusts the previous generation's bytes.
    @Test func restartNeverTrustsTheOldGeneration() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 200_000, seed: 3)
        var store: PartStore? = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 200_000).validators)
        try write(store!, data, 0..<200_000)
        try store!.checkpoint()
        let oldNonce = try #require(try StateFile.read(paths.state)).nonce
        let oldLive = try readFile(paths.live)
        let oldPart = try readFile(paths.part)
        #expect(LiveRecord.read(at: paths.live, nonce: oldNonce) == 200_000)

        try store!.restart(validators: .none)
        let restarted = try #require(try StateFile.read(paths.state))
        #expect(restarted.durableLength == 0)
        #expect(restarted.validators == .none)
        #expect(restarted.nonce != oldNonce)
        #expect(LiveRecord.read(at: paths.live, nonce: oldNonce) == nil)
        #expect(LiveRecord.read(at: paths.live, nonce: restarted.nonce) == 0)
        #expect(try readFile(paths.part).isEmpty)
        #expect(store!.written.load(ordering: .relaxed) == 0)
        #expect(store!.durable.load(ordering: .relaxed) == 0)
        store = nil

        // A crash right after the new state was renamed into place: live record and part still old.
        try writeFile(paths.live, oldLive)
        try writeFile(paths.part, oldPart)
        let point = try PartStore.reopen(paths: paths, state: restarted).1
        #expect(point.offset == 0)
        #expect(try readFile(paths.part).isEmpty)
    }

    /// One partial download, one writer: a second store on the same files is refused before it changes anything,
    /// and leftovers are not removed from under a running download.
    @Test func oneWriterAtATime() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 100_000, seed: 8)
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 100_000).validators)
        try write(store, data, 0..<100_000)
        try store.checkpoint()
        let state = try #require(try StateFile.read(paths.state))

        for attempt in ["reopen", "create", "remove"] {
            let error = #expect(throws: DownloadError.self, "\(attempt)") {
                switch attempt {
                case "reopen": _ = try PartStore.reopen(paths: paths, state: state)
                case "create":
                    _ = try PartStore.create(
                        paths: paths, url: "http://x/", headers: [], checksum: nil, validators: .none)
                default: try PartStore.removeLeftovers(at: paths)
                }
            }
            #expect(error?.code == .io)
            #expect(error?.message.contains("another") == true)
            #expect(try readFile(paths.part) == data)
            #expect(try StateFile.read(paths.state) == state)
        }

        store.unlock()
        let (second, point) = try PartStore.reopen(paths: paths, state: state)
        #expect(point.offset == 100_000)
        second.unlock()
        try PartStore.removeLeftovers(at: paths)
        #expect(!fileExists(paths.part) && !fileExists(paths.state) && !fileExists(paths.live))
    }

    @Test func createReplacesAStalePart() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        try writeFile(paths.part, [1, 2, 3])
        let store = try PartStore.create(
            paths: paths, url: "http://x/", headers: ["X-A: b"], checksum: "sha-256=00",
            validators: .none)
        #expect(try readFile(paths.part).isEmpty)
        let state = try #require(try StateFile.read(paths.state))
        #expect(state.durableLength == 0 && state.bootID == BootID.current && state.headers == ["X-A: b"])
        #expect(LiveRecord.read(at: paths.live, nonce: state.nonce) == 0)
        _ = store
    }

    @Test func finishRenamesAndMarks() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 10_000, seed: 4)
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 10_000).validators)
        try write(store, data, 0..<10_000)
        try store.finish(url: "http://x/file.bin")
        #expect(try readFile(paths.destination) == data)
        #expect(!fileExists(paths.part) && !fileExists(paths.state) && !fileExists(paths.live))
        let mark = try #require(CompletionMark.read(at: paths.destination))
        #expect(mark.url == "http://x/file.bin" && mark.length == 10_000 && mark.etag == "\"v1\"")
    }

    @Test func discardRemovesEverything() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let store = try PartStore.create(
            paths: paths, url: "http://x/", headers: [], checksum: nil, validators: .none)
        try write(store, [1, 2, 3], 0..<3)
        store.discard()
        #expect(!fileExists(paths.part) && !fileExists(paths.state) && !fileExists(paths.live))
        #expect(!fileExists(paths.destination))
    }

    /// A restart whose state write fails (disk full) must not leave the new validators in memory beside the old
    /// bytes: a later checkpoint would record them as a pair and a resume would splice two versions.
    @Test func failedRestartStopsEveryLaterCheckpoint() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let data = ServedFile.randomBytes(count: 100_000, seed: 8)
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil,
            validators: makeState(durable: 0, total: 100_000).validators)
        try write(store, data, 0..<60_000)
        try store.checkpoint()

        // The temporary state file cannot be created while a directory has its name.
        #expect(mkdir(paths.state + ".tmp", 0o755) == 0)
        var changed = makeState(durable: 0, total: 100_000).validators
        changed.etag = "\"v2\""
        #expect(throws: DownloadError.self) { try store.restart(validators: changed) }
        #expect(rmdir(paths.state + ".tmp") == 0)

        #expect(throws: DownloadError.self) { try store.checkpoint(force: true) }
        #expect(throws: DownloadError.self) { try store.update(validators: changed) }
        #expect(throws: DownloadError.self) { try store.finish(url: "http://x/file.bin") }
        let onDisk = try #require(try StateFile.read(paths.state))
        #expect(onDisk.validators.etag == "\"v1\"")
        #expect(onDisk.durableLength == 60_000)
        #expect(!fileExists(paths.destination))
    }

    /// Validators learnt from a later response are in the state file before any of that response's bytes can be
    /// vouched for by the live record.
    @Test func updatedValidatorsAreDurableAtOnce() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let store = try PartStore.create(
            paths: paths, url: "http://x/file.bin", headers: [], checksum: nil, validators: .none)
        var learnt = makeState(durable: 0, total: 5_000).validators
        learnt.etag = "\"fresh\""
        try store.update(validators: learnt)
        #expect(try StateFile.read(paths.state)?.validators == learnt)
    }

    /// The state is read before the lock is taken; if another run changed it in between, reopening refuses
    /// instead of resuming from a stale picture.
    @Test func reopenRefusesAStateChangedUnderIt() throws {
        let dir = try TemporaryDirectory()
        let paths = DownloadPaths(destination: dir.path + "/file.bin")
        let seen = makeState(durable: 0, total: 1_000)
        try StateFile.write(seen, to: paths.state)
        try writeFile(paths.part, [])
        var changed = seen
        changed.liveNonce = "99"
        try StateFile.write(changed, to: paths.state)
        let error = #expect(throws: DownloadError.self) { try PartStore.reopen(paths: paths, state: seen) }
        #expect(error?.isResumable == true)
    }

    // MARK: Helpers

    static func makeState(durable: Int64, total: Int64?) -> DownloadState {
        DownloadState(
            url: "http://example.com/file.bin", headers: [], checksum: nil,
            validators: Validators(
                etag: "\"v1\"", lastModified: nil, date: nil, totalLength: total, acceptRanges: true),
            durableLength: durable, bootID: BootID.current, liveNonce: "1234abcd", updatedAt: 1_700_000_000)
    }

    func makeState(durable: Int64, total: Int64?) -> DownloadState { Self.makeState(durable: durable, total: total) }

    func write(_ store: PartStore, _ data: [UInt8], _ range: Range<Int>) throws {
        let error = data[range].withUnsafeBytes { store.write($0, at: Int64(range.lowerBound)) }
        #expect(error == nil)
        store.noteWritten(Int64(range.upperBound))
    }
}

// MARK: - File helpers shared by the engine tests

/// A fresh directory under /tmp, removed (with its contents) when the value is released.
final class TemporaryDirectory: Sendable {
    let path: String

    init() throws {
        var template = Array("/tmp/stitch-test-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw Errno(rawValue: errno)
        }
        path = String(cString: made)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}

func fileExists(_ path: String) -> Bool { access(path, F_OK) == 0 }

func fileSize(_ path: String) -> Int64? {
    var info = stat()
    return stat(path, &info) == 0 ? Int64(info.st_size) : nil
}

func readFile(_ path: String) throws -> [UInt8] {
    guard let data = FileManager.default.contents(atPath: path) else { throw Errno(rawValue: ENOENT) }
    return [UInt8](data)
}

/// Replaces the contents of `path` in place (same inode, as a crashed process's leftovers would be).
func writeFile(_ path: String, _ bytes: [UInt8]) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw Errno(rawValue: errno) }
    defer { close(fd) }
    var done = 0
    while done < bytes.count {
        let n = bytes[done...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { throw Errno(rawValue: errno) }
        done += n
    }
}
