import Foundation
import Glibc
import StitchRPC
import StitchTestSupport
import Testing

/// `stitch serve` with 20 downloads on the power-loss file system (PowerCutSupport.swift): downloads are added,
/// some paused, one moved to the front, and the power is cut at a seeded operation (torn writeback). After the
/// reboot the daemon starts again on the same folder: every download whose add was answered is there exactly once
/// (the add the cut interrupted at most once: it may have been kept), the paused ones are still paused, the waiting
/// ones keep their order, no file is listed twice; unpaused, all of them finish byte-exact with nothing else left in
/// the folder.
@Suite("power cuts under stitch serve", .serialized)
struct PowerCutServeTests {
    static let count = 20

    @Test(arguments: [0, 1, 2, 3])
    func twentyDownloads(_ trial: Int) async throws {
        let seed = testSeed(0xDAE0_0000) &+ UInt64(trial)
        print("PowerCutServeTests[\(trial)]: seed \(seed) (STITCH_TEST_SEED=\(seed &- UInt64(trial)) repeats it)")
        var rng = SplitMix64(seed: seed)
        let files = (0..<Self.count).map { index in
            PowerCutTests.file("d\(index).bin", size: Int.random(in: (200 << 10)...(1200 << 10), using: &rng), seed: seed &+ UInt64(index))
        }
        let rig = try PowerCutRig("serve \(trial)", files: files, throttle: 1 << 20)
        defer { rig.stop() }
        // A cut somewhere in the adds, the pauses and the downloads (torn); a second trial in four cuts by bytes.
        let cut = trial % 2 == 0 ? "any::\(Int.random(in: 20...400, using: &rng))" : "bytes:.part:\(Int.random(in: 1...(6 << 20), using: &rng))"
        let (mount, bootID) = try await rig.boot(.init(cuts: [cut], seed: rng.next(), torn: true))
        let label = "serve \(trial) \(cut)"
        var daemon: ServedDaemon? = try await ServedDaemon(
            directory: rig.folder, ["--max-concurrent-downloads", "3"], environment: PowerCutRig.environment(bootID),
            sandbox: rig.sandbox)
        var added: [(gid: String, file: PowerCutFile)] = []
        var paused: Set<String> = []
        var front: String?
        for file in files {
            guard !mount.isCut, let served = daemon,
                let gid = try? served.result(
                    "aria2.addUri", [.array([.string(rig.server.url(file.path))]), .object([("out", .string(file.name))])]
                ).string
            else { break }
            added.append((gid, file))
        }
        for index in stride(from: 4, to: added.count, by: 5) where !mount.isCut {
            if (try? daemon?.result("aria2.pause", [.string(added[index].gid)])) != nil { paused.insert(added[index].gid) }
        }
        if added.count > 10, !mount.isCut,
            (try? daemon?.result("aria2.changePosition", [.string(added[10].gid), .integer(0), .string("POS_SET")])) != nil
        {
            front = added[10].gid
        }
        let wasCut = await waitUntil(timeout: .seconds(60)) { mount.isCut }
        if let served = daemon {
            served.process.kill()
            _ = await served.process.wait()
        }
        daemon = nil
        if wasCut { await mount.detach() } else { try await mount.unmount() }
        print("PowerCutServeTests[\(trial)]: \(added.count) added, \(paused.count) paused, cut: \(wasCut)")

        // The reboot: the same folder, another boot.
        let (second, secondBoot) = try await rig.boot()
        let again = try await ServedDaemon(
            directory: rig.folder, ["--max-concurrent-downloads", "3"], environment: PowerCutRig.environment(secondBoot),
            sandbox: rig.sandbox)
        let listed =
            (try again.result("aria2.tellActive").array ?? [])
            + (try again.result("aria2.tellWaiting", [.integer(0), .integer(1000)]).array ?? [])
            + (try again.result("aria2.tellStopped", [.integer(0), .integer(1000)]).array ?? [])
        let gids = listed.compactMap { $0.text("gid") }
        let paths = listed.compactMap { $0["files"]?.array?.first?.text("path") }.filter { !$0.isEmpty }
        #expect(Set(gids).count == gids.count, "\(label): a download listed twice: \(gids)")
        #expect(Set(paths).count == paths.count, "\(label): a file listed twice: \(paths.sorted())")
        for (gid, file) in added {
            #expect(gids.contains(gid), "\(label): \(file.name) (\(gid)) was added and answered, and is lost")
        }
        // An add the cut interrupted may have been kept (committed, its answer lost with the connection): then it is
        // listed once, and finishes as the others do. Nothing else may appear.
        let answered = Set(added.map(\.gid))
        let extra = listed.filter { !answered.contains($0.text("gid") ?? "") }
        var finishing = added
        if added.count < files.count, extra.count == 1, let gid = extra[0].text("gid"),
            extra[0]["files"]?.array?.first?.text("path")?.hasSuffix("/" + files[added.count].name) == true
        {
            finishing.append((gid, files[added.count]))
        } else {
            #expect(extra.isEmpty, "\(label): listed but never added: \(extra)")
        }
        for gid in paused {
            let status = listed.first { $0.text("gid") == gid }?.text("status")
            #expect(status == "paused", "\(label): \(gid) was paused and is \(status ?? "gone")")
        }
        // The waiting queue keeps the order it had: the answered adds, with the one moved to the front first.
        var expected = added.map(\.gid)
        if let front, let at = expected.firstIndex(of: front) { expected.insert(expected.remove(at: at), at: 0) }
        let waiting = (try again.result("aria2.tellWaiting", [.integer(0), .integer(1000)]).array ?? []).compactMap {
            $0.text("gid")
        }
        let order = expected.filter { waiting.contains($0) }
        #expect(waiting.filter { expected.contains($0) } == order, "\(label): queue order \(waiting), expected \(order)")

        // Everything finishes, byte-exact.
        _ = try again.result("aria2.unpauseAll")
        for (gid, file) in finishing {
            let status = try await again.waitFor(gid, timeout: .seconds(120)) {
                ["complete", "error", "removed"].contains($0.text("status") ?? "")
            }
            #expect(status.text("status") == "complete", "\(label): \(file.name) ended \(status)")
        }
        let stopped = await again.stop()
        #expect(stopped.status == 0, "\(stopped)")
        try await second.unmount()
        let contents = try await rig.inspect { folder in
            (
                ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).filter { $0 != ".stitch" }.sorted(),
                finishing.map { readBytes(folder + "/" + $0.file.name) }
            )
        }
        #expect(contents.0 == finishing.map(\.file.name).sorted(), "\(label): the folder holds \(contents.0)")
        for ((_, file), bytes) in zip(finishing, contents.1) where bytes != file.file.data {
            Issue.record("\(label): \(file.name) is not byte-exact (\(PowerCutTests.difference(bytes ?? [], file.file.data)))")
        }
    }
}
