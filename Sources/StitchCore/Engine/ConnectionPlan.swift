import Foundation

/// How many connections one download uses, as a pure value: the connections wanted (asked for, or chosen by the
/// file's length; at most the maximum), then granted once per run by the host's cap (``DownloadOptions/
/// connectionGrant``, asked only when more than one is wanted and a split is otherwise worth it: asking may take
/// connections from other downloads). Whether a resumed partial is worth splitting is decided here too. Unit
/// tests: ConnectionPlanTests.
struct ConnectionPlan: Sendable {
    /// What the user asked for (nil: chosen by the file's length).
    let asked: Int?
    let maximum: Int?
    let automaticStep: Int64
    let minimumSplitSize: Int64
    /// What the grant allowed, once asked.
    private(set) var granted: Int?

    init(asked: Int?, maximum: Int?, automaticStep: Int64, minimumSplitSize: Int64) {
        self.asked = asked
        self.maximum = maximum
        self.automaticStep = automaticStep
        self.minimumSplitSize = minimumSplitSize
    }

    init(_ options: DownloadOptions) {
        self.init(
            asked: options.connections, maximum: options.maximumConnections,
            automaticStep: options.automaticConnectionStep, minimumSplitSize: options.minimumSplitSize)
    }

    /// Connections wanted for a file the server describes so, before any grant.
    func wanted(for validators: Validators) -> Int {
        let wanted = asked ?? Connections.automatic(forLength: validators.totalLength, step: automaticStep)
        return max(1, min(wanted, maximum ?? wanted))
    }

    /// The connections to use: the wanted ones, or (more than one wanted and a `grant` to ask) what the grant
    /// allows, asked once per run and kept.
    mutating func lanes(for validators: Validators, grant: ((Int) -> Int)?) -> Int {
        if let granted { return granted }
        let wanted = wanted(for: validators)
        guard wanted > 1, let grant else { return wanted }
        let allowed = max(1, min(wanted, grant(wanted)))
        granted = allowed
        return allowed
    }

    /// The connections over which to continue a resumed partial on one segment, written up to `written`; nil to
    /// keep one. Only with a length, ranges and a strong validator to check them with, more than one connection
    /// wanted, at least two minimum splits left — and then only if the grant allows more than one.
    mutating func resplit(known: Validators?, written: Int64, grant: ((Int) -> Int)?) -> Int? {
        guard let known, let total = known.totalLength, wanted(for: known) > 1, known.acceptRanges,
            known.ifRange != nil, total - written >= 2 * minimumSplitSize
        else { return nil }
        let lanes = lanes(for: known, grant: grant)
        return lanes > 1 ? lanes : nil
    }
}
