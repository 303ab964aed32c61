import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

/// How many connections a download uses (``ConnectionPlan``): wanted, granted once, and whether a resumed partial
/// is worth splitting.
@Suite struct ConnectionPlanTests {
    static let mib: Int64 = 1 << 20
    static func validators(_ length: Int64? = 64 << 20, ranges: Bool = true, etag: String? = "\"v\"") -> Validators {
        Validators(etag: etag, lastModified: nil, date: nil, totalLength: length, acceptRanges: ranges)
    }

    /// Counts the grant's calls, and answers with `allow`.
    final class Grant: @unchecked Sendable {
        var calls: [Int] = []
        let allow: Int
        init(_ allow: Int) { self.allow = allow }
        func callAsFunction(_ wanted: Int) -> Int {
            calls.append(wanted)
            return allow
        }
    }

    /// Asked for, or by the length (one per `automaticStep`), at most the maximum, at least one.
    @Test func wanted() {
        let asked = ConnectionPlan(asked: 8, maximum: 5, automaticStep: 16 * Self.mib, minimumSplitSize: Self.mib)
        #expect(asked.wanted(for: Self.validators()) == 5)
        let automatic = ConnectionPlan(asked: nil, maximum: nil, automaticStep: 16 * Self.mib, minimumSplitSize: Self.mib)
        #expect(automatic.wanted(for: Self.validators(64 << 20)) == 4)
        #expect(automatic.wanted(for: Self.validators(nil)) == 1)
        #expect(automatic.wanted(for: Self.validators(1000)) == 1)
    }

    /// The grant is asked once per run, only when more than one connection is wanted; what it allows is kept,
    /// never more than wanted, never fewer than one.
    @Test func grantedOnce() {
        var plan = ConnectionPlan(asked: 4, maximum: nil, automaticStep: Self.mib, minimumSplitSize: Self.mib)
        let grant = Grant(2)
        #expect(plan.lanes(for: Self.validators(), grant: grant.callAsFunction) == 2)
        #expect(plan.lanes(for: Self.validators(), grant: grant.callAsFunction) == 2)
        #expect(grant.calls == [4])

        var greedy = ConnectionPlan(asked: 4, maximum: nil, automaticStep: Self.mib, minimumSplitSize: Self.mib)
        #expect(greedy.lanes(for: Self.validators(), grant: Grant(9).callAsFunction) == 4)
        var refused = ConnectionPlan(asked: 4, maximum: nil, automaticStep: Self.mib, minimumSplitSize: Self.mib)
        #expect(refused.lanes(for: Self.validators(), grant: Grant(0).callAsFunction) == 1)

        var one = ConnectionPlan(asked: 1, maximum: nil, automaticStep: Self.mib, minimumSplitSize: Self.mib)
        let unasked = Grant(1)
        #expect(one.lanes(for: Self.validators(), grant: unasked.callAsFunction) == 1)
        #expect(unasked.calls.isEmpty)
        #expect(one.lanes(for: Self.validators(), grant: nil) == 1)
    }

    /// A resumed partial is split only with a length, ranges, a strong validator, more than one connection
    /// wanted and two minimum splits left — and then over what the grant allows, asked last; one granted is no
    /// split.
    @Test(arguments: [
        (validators(), 10 * mib, 4, Int?.some(4), true),
        (validators(), 62 * mib + 1, 4, nil, false),
        (validators(), 62 * mib, 4, 4, true),
        (validators(nil), 0, 4, nil, false),
        (validators(ranges: false), 0, 4, nil, false),
        (validators(etag: nil), 0, 4, nil, false),
        (validators(), 10 * mib, 1, nil, true),
    ])
    func resplit(_ known: Validators, _ written: Int64, _ allow: Int, _ lanes: Int?, _ grantAsked: Bool) {
        var plan = ConnectionPlan(asked: 4, maximum: nil, automaticStep: Self.mib, minimumSplitSize: Self.mib)
        let grant = Grant(allow)
        #expect(plan.resplit(known: known, written: written, grant: grant.callAsFunction) == lanes)
        #expect(!grant.calls.isEmpty == grantAsked)
        var single = ConnectionPlan(asked: 1, maximum: nil, automaticStep: Self.mib, minimumSplitSize: Self.mib)
        #expect(single.resplit(known: known, written: written, grant: nil) == nil)
        var unknown = plan
        #expect(unknown.resplit(known: nil, written: written, grant: nil) == nil)
    }
}
