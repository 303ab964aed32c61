import Testing

/// The trace checker the power-cut suite runs on every uncut run (`durabilityOrderProblems`), on traces written by
/// hand: the order Stitch keeps passes, and each sync taken out of it is named.
@Suite struct DurabilityOrderTests {
    static func trace(_ text: String) -> [TraceLine] {
        text.split(separator: "\n").map { line in
            let words = line.split(separator: " ").map(String.init)
            return TraceLine(kind: words[0], name: words[1], target: words.count > 2 ? words[2] : words[1])
        }
    }

    /// A download as Stitch writes it: a first state, two checkpoints with writes racing them, the finish.
    static let kept = """
        create f.part
        create f.stitch.tmp
        write f.stitch.tmp
        fsync f.stitch.tmp
        rename f.stitch.tmp f.stitch
        fsyncdir dl
        write f.part
        write f.part
        fdatasync f.part
        write f.part
        create f.stitch.tmp
        write f.stitch.tmp
        fsync f.stitch.tmp
        rename f.stitch.tmp f.stitch
        fsyncdir dl
        fdatasync f.part
        create f.stitch.tmp
        write f.stitch.tmp
        fsync f.stitch.tmp
        rename f.stitch.tmp f.stitch
        fsyncdir dl
        truncate f.part
        fsync f.part
        rename f.part f
        fsyncdir dl
        unlink f.stitch
        """

    static func without(_ step: Int) -> [TraceLine] {
        var lines = trace(kept)
        lines.remove(at: step)
        return lines
    }

    @Test func theOrderStitchKeepsPasses() {
        #expect(durabilityOrderProblems(Self.trace(Self.kept), folder: "dl", names: ["f"]) == [])
    }

    @Test func aStateRenameNotFollowedByAFolderSyncIsNamed() {
        let problems = durabilityOrderProblems(Self.without(14), folder: "dl", names: ["f"])
        #expect(problems.count == 1)
        #expect(problems.first?.contains("replaced again before the folder was synced") == true)
    }

    @Test func aDestinationWhoseFolderIsNotSyncedIsNamed() {
        let problems = durabilityOrderProblems(Self.without(24), folder: "dl", names: ["f"])
        #expect(problems == ["f was renamed, and the run ended without syncing its folder"])
    }

    @Test func aStateWrittenBeforeTheDataIsSyncedIsNamed() {
        let problems = durabilityOrderProblems(Self.without(8), folder: "dl", names: ["f"])
        #expect(problems.count == 1)
        #expect(problems.first?.contains("no sync of the bytes written since the last one") == true)
        // The second checkpoint's sync covers the write that raced the first: dropping it leaves that write unclaimed.
        let second = durabilityOrderProblems(Self.without(15), folder: "dl", names: ["f"])
        #expect(second.count == 1)
    }

    @Test func aTemporaryRenamedBeforeItsSyncIsNamed() {
        let problems = durabilityOrderProblems(Self.without(3), folder: "dl", names: ["f"])
        #expect(problems == ["step 3: f.stitch.tmp renamed onto f.stitch before its data was synced"])
    }

    @Test func aPartRenamedIntoPlaceBeforeItsSyncIsNamed() {
        let problems = durabilityOrderProblems(Self.without(22), folder: "dl", names: ["f"])
        #expect(problems == ["step 22: f.part renamed onto f before its data was synced"])
    }

    /// The finish's clean-up: the live record and the previous state removed before the state file, which goes last.
    static func cleanUp(_ removals: String) -> [TraceLine] {
        trace(
            """
            create f.part
            create f.stitch.tmp
            write f.stitch.tmp
            fsync f.stitch.tmp
            rename f.stitch.tmp f.stitch
            fsyncdir dl
            create f.stitch-live
            link f.stitch f.stitch.lnk
            rename f.stitch.lnk f.stitch.prev
            create f.stitch.tmp
            write f.stitch.tmp
            fsync f.stitch.tmp
            rename f.stitch.tmp f.stitch
            fsyncdir dl
            write f.part
            truncate f.part
            fsync f.part
            rename f.part f
            fsyncdir dl
            \(removals)
            """)
    }

    @Test func theStateFileRemovedLastPasses() {
        let problems = durabilityOrderProblems(
            Self.cleanUp("unlink f.stitch-live\nunlink f.stitch.prev\nunlink f.stitch"), folder: "dl", names: ["f"])
        #expect(problems == [])
    }

    @Test func aSidecarThatCouldOutliveTheStateFileIsNamed() {
        // The state file first: a cut that keeps one of the three removals leaves the live record and the previous
        // state beside the finished file, and a rerun, finding no state, would leave them there for good.
        let problems = durabilityOrderProblems(
            Self.cleanUp("unlink f.stitch\nunlink f.stitch.prev\nunlink f.stitch-live"), folder: "dl", names: ["f"])
        #expect(problems.count == 2)
        #expect(problems.contains { $0.contains("could leave f.stitch-live beside the finished f") })
        #expect(problems.contains { $0.contains("could leave f.stitch.prev beside the finished f") })
        #expect(problems.allSatisfy { $0.hasPrefix("step 19:") && $0.contains("(1 of the folder's 1 unsynced changes kept)") })
    }
}
