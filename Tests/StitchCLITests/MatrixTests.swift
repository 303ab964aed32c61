import Foundation
import Glibc
import StitchTestSupport
import Testing

/// Rule 6: the rules hold for every combination of options, servers and interruptions (issue 10, part 3).
///
/// The full cross product — connections {auto, 1, 3, 8} × rate limit {none, well below the link, above it} ×
/// interruption {none, SIGINT, SIGKILL, then the same command again} × server {nginx, nginx capped at 2 MiB/s per
/// connection, the test server with a strong ETag, with Last-Modified only, with no validator, ignoring ranges} ×
/// size {1,500,000 bytes: below every split threshold; 8,000,000 bytes: above} — 432 cases, plus issue 10's own case
/// (40,000,000 bytes from nginx, automatic connections, `--limit-rate 10M`, default knobs). A proxy dimension {none,
/// tinyproxy (HTTP), microsocks (SOCKS5)} is combined pairwise with the others (issue 36): 8 proxied cases per server,
/// each proxy meeting every connection count, rate, interruption and size.
///
/// The knobs make the small files reach every path (MatrixKnobs): a 768 KiB minimum split, a 1 MiB connection step
/// (so automatic = 4 connections at 8 MB, 1 at 1.5 MB) and a 32 MiB/s probe (loopback nginx keeps one connection;
/// a rate limit or a capped server makes it split). Interruptions fire when the process has written a quarter of the
/// file (its `wchar`), never after a sleep. Each case checks: exit 0 at the end, the file byte-exact, only the file
/// left, If-Range on every ranged request when there is a validator (none without), one connection where one is due,
/// segments where `-c 3`/`-c 8` or a per-connection cap call for them, nothing the interrupted run saved fetched again
/// (server log, and the last run's own `transferred`), the bytes the server sent within docs/overlap.md's bound, and
/// with a rate well below the link the achieved rate within 5 % (judged after each run's first second). A download
/// too fast to interrupt (loopback nginx, SIGINT) is retried with earlier interruption points, then checked as
/// uninterrupted; the summary names those cases. A rate is not judged while the client was kept off the CPU or the
/// test server fell behind, and a case whose only failures other load can cause runs up to three times
/// (docs/overlap.md, "Other load on the machine").
///
/// Cases run side by side, 16 at a time over all matrix tests (STITCH_MATRIX_CONCURRENCY); rate-limited ones, the
/// longest (6–8 s), first. STITCH_MATRIX_ONLY=substring runs only the cases whose slug contains it.
@Suite("combination matrix (rule 6)")
struct MatrixTests {
    @Test("every combination against one server", arguments: MatrixServer.allCases)
    func matrix(_ server: MatrixServer) async throws {
        let cases = Self.selected(MatrixCase.all(for: server))
        try #require(!cases.isEmpty || ProcessInfo.processInfo.environment["STITCH_MATRIX_ONLY"] != nil)
        let started = ContinuousClock.now
        let outcomes = await MatrixRunner.runAll(cases.sorted { $0.expectedSeconds > $1.expectedSeconds })
        for outcome in outcomes { MatrixReport.record(outcome) }
        MatrixReport.summarize(server.rawValue, outcomes, seconds: (ContinuousClock.now - started) / .seconds(1))
    }

    /// Issue 10 as a new user met it: a shifted file saved with exit 0 (fixed); it was also reported slow (5.5 s
    /// instead of 3.8 s), which the rate check judges.
    @Test func issue10FortyMegabytesAutomaticConnectionsLimitRate10M() async throws {
        let cases = Self.selected([MatrixCase.issue10])
        let started = ContinuousClock.now
        let outcomes = await MatrixRunner.runAll(cases)
        for outcome in outcomes { MatrixReport.record(outcome) }
        MatrixReport.summarize("issue 10", outcomes, seconds: (ContinuousClock.now - started) / .seconds(1))
    }

    static func selected(_ cases: [MatrixCase]) -> [MatrixCase] {
        guard let only = ProcessInfo.processInfo.environment["STITCH_MATRIX_ONLY"], !only.isEmpty else { return cases }
        let wanted = only.split(separator: ",").map(String.init)
        return cases.filter { matrixCase in wanted.contains { matrixCase.slug.contains($0) } }
    }
}

/// Known bugs the matrix finds in the engine (Sources/Stitch is being rewritten elsewhere): their failures are
/// recorded as known issues, so the suite stays green and each mark can be removed once its bug is fixed.
struct MatrixKnownIssue: Sendable {
    let name: String
    let matches: @Sendable (MatrixCase, MatrixFailure) -> Bool

    /// Two, both of the URLSession backend's windows (the build without the Libcurl trait; docs/urlsession.md, "Not
    /// yet"), recorded as known issues there so that a regression elsewhere still fails the run. (The automatic
    /// count's 10 ms probe measuring nginx's unthrottled first chunk and keeping one connection on the capped port
    /// was one, until the re-probe at 2 s: SplitPolicy.reprobeSeconds.)
    static let all: [MatrixKnownIssue] = [
        // The rate is judged from the process's `wchar`, which over URLSession also counts dispatch's eventfd
        // wake-ups (8 bytes each) that FoundationNetworking's socket and timer sources cause while bytes arrive:
        // measured 9.46 MB written for an 8,000,000-byte file with `--limit-rate 1M` from the capped port, the
        // extra 1.46 MB in the 3 s the server was sending. The file's own bytes keep to the limit (8 MB in 7.58 s).
        MatrixKnownIssue(name: "URLSession: wchar counts dispatch's wake-ups, so the achieved rate reads high") {
            _, failure in StitchUnderTest.window != nil && failure.kind == .rate
        },
        // A file larger than a window with automatic connections: the probe's first window (8 MiB) arrives whole
        // though the split keeps about 1 MiB of it (the transfer cannot be stopped promptly), and a connection the
        // engine replaces drops up to a window and a half it held, which is fetched again. nginx logs these
        // responses as complete, so the bound's per-cut-request slack does not cover them (seen in CI: 49.5 MB sent
        // for the 40 MB case, bound 48.4 MB).
        MatrixKnownIssue(name: "URLSession: a probe's or replaced connection's window is read whole") {
            matrixCase, failure in
            guard let window = StitchUnderTest.window else { return false }
            return failure.kind == .overfetch && matrixCase.bytes > window
        },
    ]
}

enum MatrixReport {
    /// One issue per failure, naming the case (every dimension), with every run's status and stderr tail and the
    /// server's log for the file.
    static func record(_ outcome: MatrixOutcome) {
        for failure in outcome.failures {
            let comment = Comment(
                rawValue: "\(outcome.matrixCase) \(failure.kind.rawValue): \(failure.message)\n\(outcome.context)")
            if let known = MatrixKnownIssue.all.first(where: { $0.matches(outcome.matrixCase, failure) }) {
                withKnownIssue(Comment(rawValue: known.name), isIntermittent: true) {
                    Issue.record(comment)
                }
            } else {
                Issue.record(comment)
            }
        }
    }

    static func summarize(_ label: String, _ outcomes: [MatrixOutcome], seconds: Double) {
        let failed = outcomes.filter { !$0.failures.isEmpty }
        var kinds: [String: Int] = [:]
        for outcome in outcomes {
            for failure in outcome.failures { kinds[failure.kind.rawValue, default: 0] += 1 }
        }
        let interrupted = outcomes.filter(\.interrupted).count
        let wanted = outcomes.filter { $0.matrixCase.interruption != .none }.count
        let missed = outcomes.reduce(0) { $0 + $1.missedInterruptions }
        let overlap = outcomes.max { $0.largestCutOverlap < $1.largestCutOverlap }
        let slowest = outcomes.max { $0.seconds < $1.seconds }
        var text = "MatrixTests \(label): \(outcomes.count) cases in \(String(format: "%.1f", seconds)) s, "
        text += "\(failed.count) with failures \(kinds.sorted { $0.key < $1.key })"
        text += "; interrupted \(interrupted) of \(wanted) (\(missed) attempts finished before the signal)"
        if let overlap {
            text += "; largest cut-request overlap \(overlap.largestCutOverlap) bytes (\(overlap.matrixCase.slug))"
        }
        if let slowest { text += "; slowest \(slowest.matrixCase.slug) \(String(format: "%.1f", slowest.seconds)) s" }
        print(text)
        let uninterrupted = outcomes.filter { $0.matrixCase.interruption != .none && !$0.interrupted }
        if !uninterrupted.isEmpty {
            print("  finished before every interruption attempt: " + uninterrupted.map(\.matrixCase.slug).joined(separator: ", "))
        }
        for outcome in outcomes where !outcome.notes.isEmpty {
            print("  \(outcome.matrixCase.slug): " + outcome.notes.joined(separator: "; "))
        }
        if ProcessInfo.processInfo.environment["STITCH_MATRIX_VERBOSE"] != nil {
            for outcome in outcomes {
                print(
                    "  \(outcome.matrixCase.slug): \(String(format: "%.1f", outcome.seconds)) s, sent \(outcome.sent) "
                        + "(bound \(outcome.bound)), interrupted \(outcome.interrupted), missed \(outcome.missedInterruptions); "
                        + outcome.runs.map(\.summary).joined(separator: " | "))
            }
        }
        for outcome in failed {
            print("  FAILED \(outcome.matrixCase): " + outcome.failures.map { "\($0.kind.rawValue): \($0.message)" }.joined(separator: "; "))
        }
    }
}
