import Foundation
import Glibc
import StitchTestSupport
import Testing

/// The power-loss file system itself (Tests/PowerLoss/plfs.c) keeps the promises the power-cut tests rely on: after
/// a cut, synced data and synced names are there, unsynced data and names are not (or, torn, a seeded part of them),
/// and a rename within a folder is one operation — one name or the other, never both or neither, as in a journal.
@Suite(.serialized) struct PowerLossFSTests {
    static func write(_ path: String, _ bytes: [UInt8], sync: Bool) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }
        _ = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        if sync { fdatasync(fd) }
        close(fd)
    }

    static func syncFolder(_ path: String) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }

    /// Cuts the power by syncing the file `marker` (the boot's cut spec is `fsync:marker:1`).
    static func cut(_ mount: PowerLossMount, in folder: String) async -> Bool {
        let fd = open(folder + "/marker", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        if fd >= 0 {
            fsync(fd)
            close(fd)
        }
        let cut = await waitUntil(timeout: .seconds(20)) { mount.isCut }
        await mount.detach()
        return cut
    }

    @Test func onlyWhatWasSyncedSurvives() async throws {
        let rig = try PowerCutRig("plfs promises", files: [])
        defer { rig.stop() }
        let (mount, _) = try await rig.boot(.init(cuts: ["fsync:marker:1"]))
        let folder = rig.folder
        let synced = [UInt8](repeating: 0x5A, count: 10_000)
        Self.write(folder + "/synced", synced, sync: true)
        Self.write(folder + "/unsynced", [UInt8](repeating: 0x33, count: 10_000), sync: false)
        Self.syncFolder(folder)
        Self.write(folder + "/unnamed", synced, sync: true)
        #expect(await Self.cut(mount, in: folder))
        let found = try await rig.inspect { folder in
            (readBytes(folder + "/synced"), readBytes(folder + "/unsynced"), access(folder + "/unnamed", F_OK) == 0)
        }
        #expect(found.0 == synced, "synced data lost: \(found.0?.count ?? -1) bytes")
        #expect(found.1 == [], "unsynced data kept: \(found.1?.count ?? -1) bytes")
        #expect(!found.2, "a name never synced into its folder survived")
    }

    @Test func aRenameInAFolderIsOneOperationWhenTorn() async throws {
        var outcomes: [String: Int] = [:]
        for seed in UInt64(1)...24 {
            let rig = try PowerCutRig("plfs rename \(seed)", files: [])
            defer { rig.stop() }
            let (mount, _) = try await rig.boot(.init(cuts: ["fsync:marker:1"], seed: seed, torn: true))
            let folder = rig.folder
            Self.write(folder + "/old", [1, 2, 3], sync: true)
            Self.syncFolder(folder)
            // Unsynced entry changes before and after, so the torn prefix ends on either side of the rename.
            Self.write(folder + "/before", [], sync: false)
            rename(folder + "/old", folder + "/new")
            Self.write(folder + "/after", [], sync: false)
            #expect(await Self.cut(mount, in: folder))
            let names = try await rig.inspect { folder in
                ["old", "new"].filter { access(folder + "/" + $0, F_OK) == 0 }
            }
            outcomes[names.joined(separator: "+"), default: 0] += 1
        }
        #expect(outcomes["old+new"] == nil && outcomes[""] == nil, "a rename half done: \(outcomes)")
        #expect(outcomes["old"] != nil && outcomes["new"] != nil, "the cut never fell on both sides: \(outcomes)")
    }
}
