import Testing

@testable import Stitch

/// The download-level rules (``DownloadStateMachine``) without a server: what comes next, the restart budget,
/// and when the rest of a run stays on one connection.
@Suite struct DownloadStateMachineTests {
    typealias Store = DownloadStateMachine.Store

    @Test func nextStep() {
        let machine = DownloadStateMachine(maxRestarts: 3)
        var asked = 0
        func next(_ store: Store?, splitNow: Bool = false, worth: Bool = false) -> DownloadStateMachine.Step {
            machine.next(
                store: store, splitNow: splitNow,
                worthSplitting: {
                    asked += 1
                    return worth
                })
        }
        // Nothing to continue from: the whole file on the first connection (the split is not asked about).
        #expect(next(nil) == .firstRequest)
        #expect(next(Store(segments: 1, written: 0)) == .firstRequest)
        #expect(asked == 0)
        // Just split, or several segments: lanes.
        #expect(next(Store(segments: 1, written: 0), splitNow: true) == .split)
        #expect(next(Store(segments: 4, written: 0)) == .split)
        #expect(asked == 0)
        // Bytes on one segment: one lane, unless a resumed partial is worth splitting.
        #expect(next(Store(segments: 1, written: 10)) == .alone)
        #expect(next(Store(segments: 1, written: 10), worth: true) == .split)
        #expect(asked == 2)
    }

    @Test func restartBudget() {
        var machine = DownloadStateMachine(maxRestarts: 2)
        let first = machine.restart(.rangeIgnored)
        #expect(first == .restart)
        #expect(!machine.exhausted)
        let inPlace = machine.restartInPlace()
        #expect(inPlace)
        let third = machine.restart(.rangeNotSatisfiable)
        #expect(third == .unstable, "the third restart of two allowed")
        #expect(machine.exhausted && machine.restarts == 3)
        let fourth = machine.restartInPlace()
        #expect(!fourth)
        // Restarts outside a split never keep the run on one connection.
        #expect(machine.splittingFailed == nil)
    }

    @Test(arguments: [
        (RestartReason.rangeIgnored, false, SplitPolicy.Failure?.some(.rangesIgnored)),
        (.etagChanged(old: "\"a\"", new: "\"b\""), true, .versionsDiffer),
        (.etagChanged(old: "\"a\"", new: "\"b\""), false, nil),
    ])
    func oneRestartWhileSplit(_ reason: RestartReason, _ disagreed: Bool, _ expected: SplitPolicy.Failure?) {
        var machine = DownloadStateMachine(maxRestarts: 5)
        let step = machine.restart(reason, whileSplit: true, connectionsDisagreed: disagreed)
        #expect(step == .restart)
        #expect(machine.splittingFailed == expected)
    }

    /// A changed file may split again once; a second restart while split keeps one connection. Connections that
    /// disagreed keep it too, whatever comes after; a split that completed with disagreeing connections as well.
    @Test func repeatedTroubleWhileSplit() {
        var machine = DownloadStateMachine(maxRestarts: 5)
        let change = RestartReason.lengthChanged(old: 1, new: 2)
        _ = machine.restart(change, whileSplit: true)
        #expect(machine.splittingFailed == nil)
        _ = machine.restart(.untrustedPartial("x"))  // not while split: not counted as such
        #expect(machine.splittingFailed == nil)
        _ = machine.restart(change, whileSplit: true)
        #expect(machine.splittingFailed == .restarted)

        var disagreeing = DownloadStateMachine(maxRestarts: 5)
        _ = disagreeing.restart(change, whileSplit: true, connectionsDisagreed: true)
        _ = disagreeing.restart(.rangeIgnored, whileSplit: true)
        #expect(disagreeing.splittingFailed == .versionsDiffer)

        var completed = DownloadStateMachine(maxRestarts: 5)
        completed.splitEnded(connectionsDisagreed: false)
        #expect(completed.splittingFailed == nil)
        completed.splitEnded(connectionsDisagreed: true)
        #expect(completed.splittingFailed == .versionsDiffer)
    }
}
