import Foundation
import StitchLocks

/// The mirrors of one split transfer (``DownloadRequest/mirrors``): other URLs of the same file whose lanes fetch
/// segments beside the first source's. A mirror serves no byte until it is proven to serve the same file as the
/// first source (``MirrorProof``); from then on its own strong validator guards its ranges (`If-Range`), and any
/// sign that it serves something else — another version, a refused range, an error — drops it with one line,
/// never a byte of it reaching the file. Its lanes then retire and the others take over its segments.
///
/// Shared by the transfer's lanes (which wait for their mirror's proof) and its proofs; every field is behind one
/// lock, taken only to read or set a mirror's state.
final class MirrorSet: Sendable {
    /// A mirror's standing.
    enum Standing: Sendable {
        case proving
        /// Proven: the validators its answers are checked against.
        case proven(Validators)
        /// Dropped, and why (for the user).
        case dropped(String)
    }

    /// The first source's samples the mirrors are compared with: taken at the transfer's start, before the first
    /// source's lanes take the connections its server may limit, while the mirrors' own samples are taken.
    typealias Reference = [(Range<Int64>, [UInt8])]

    private struct State {
        var standings: [Standing]
        /// Lanes waiting for a mirror's proof, by mirror.
        var waiters: [Int: [CheckedContinuation<Validators?, Never>]] = [:]
        /// The reference once taken (nil inside: it could not be); its waiters.
        var reference: Reference??
        var referenceWaiters: [CheckedContinuation<Reference?, Never>] = []
    }

    let urls: [URL]
    private let state: Locked<State>

    init(urls: [URL]) {
        self.urls = urls
        state = Locked(State(standings: urls.map { _ in .proving }))
    }

    /// The source of transfer lane `lane`: nil for the first source, else the index of its mirror (lanes take the
    /// sources in turn, the first source first).
    func mirror(ofLane lane: Int) -> Int? {
        let index = lane % (urls.count + 1)
        return index == 0 ? nil : index - 1
    }

    /// The validators of mirror `index` once proven; nil while it is proven or once dropped.
    func validators(_ index: Int) -> Validators? {
        state.withLock { if case .proven(let validators) = $0.standings[index] { validators } else { nil } }
    }

    /// Whether mirror `index` is dropped.
    func isDropped(_ index: Int) -> Bool {
        state.withLock { if case .dropped = $0.standings[index] { true } else { false } }
    }

    /// Waits for mirror `index`'s proof: its validators, or nil when it was dropped.
    func proof(_ index: Int) async -> Validators? {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Validators?? in
                switch state.standings[index] {
                case .proven(let validators): return .some(validators)
                case .dropped: return .some(nil)
                case .proving:
                    state.waiters[index, default: []].append(continuation)
                    return nil
                }
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    /// Settles mirror `index`: proven with `validators`, or dropped (`validators` nil) for `why`. Returns false
    /// when it was dropped already (its first reason stands, and was said).
    @discardableResult
    func settle(_ index: Int, validators: Validators?, why: String = "") -> Bool {
        let (waiters, changed) = state.withLock { state -> ([CheckedContinuation<Validators?, Never>], Bool) in
            if case .dropped = state.standings[index] { return ([], false) }
            state.standings[index] = validators.map { .proven($0) } ?? .dropped(why)
            return (state.waiters.removeValue(forKey: index) ?? [], true)
        }
        for waiter in waiters { waiter.resume(returning: validators) }
        return changed
    }

    /// Waits for the first source's samples: nil when they could not be taken.
    func reference() async -> Reference? {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Reference?? in
                if let reference = state.reference { return .some(reference) }
                state.referenceWaiters.append(continuation)
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    /// The first source's samples are taken (nil: they could not be); said once.
    func setReference(_ reference: Reference?) {
        let waiters = state.withLock { state -> [CheckedContinuation<Reference?, Never>] in
            guard state.reference == nil else { return [] }
            state.reference = .some(reference)
            defer { state.referenceWaiters = [] }
            return state.referenceWaiters
        }
        for waiter in waiters { waiter.resume(returning: reference) }
    }

    /// Drops every mirror still being proven (the transfer is over): no lane waits forever.
    func dropUnsettled() {
        setReference(nil)
        for index in urls.indices {
            let proving = state.withLock { if case .proving = $0.standings[index] { true } else { false } }
            if proving { settle(index, validators: nil, why: "the transfer ended before it was proven") }
        }
    }
}

/// The proof that a mirror serves the first source's file (docs/mirrors.md): the same length, a strong validator of
/// its own (to tie its later ranges to the version proven), and samples of 64 KiB spread over the file — its first
/// and last bytes among them, 8 to 32 as for `--adopt` — byte for byte equal to the first source's same ranges
/// (``reference(known:total:)``: asked of it once per transfer, before its lanes start, with its own `If-Range`, so
/// they are the version the download has and take none of the connections a server may limit). Nothing of either
/// is written: the samples are compared in memory (at most 2 MiB).
///
/// What it cannot prove: that the bytes between the samples are equal. Two files that differ only there pass; a
/// checksum (``DownloadRequest/checksum``, or a digest the server announces) verifies every byte at the end.
struct MirrorProof {
    let context: RunContext
    let emit: @Sendable (DownloadEvent) -> Void

    /// What the proof came to.
    enum Outcome: Sendable {
        case proven(Validators, samples: Int, bytes: Int64)
        case differs(String)
    }

    /// The first source's samples of its file (`known`, `total` bytes) that mirrors are compared with.
    /// - Throws: why they cannot be had (the mirrors are then not used), as a sentence.
    func reference(known: Validators, total: Int64) async throws(DownloadError) -> [(Range<Int64>, [UInt8])] {
        let ranges = Adoption.samples(of: [0..<total])
        let fetched: [RangeSampler.Fetched]
        do { fetched = try await sampler(context.startURL).fetchAll(ranges, known: known) } catch { throw .wrapping(error) }
        var samples: [(Range<Int64>, [UInt8])] = []
        for (range, one) in zip(ranges, fetched) {
            switch one {
            case .bytes(let bytes, _): samples.append((range, bytes))
            case .declined(let why): throw DownloadError(.protocolViolation, why)
            }
        }
        guard samples.count == ranges.count else { throw DownloadError(.protocolViolation, "a sample is missing") }
        return samples
    }

    /// Proves `mirror` against the first source's samples of its file of `total` bytes (``MirrorSet/reference()``,
    /// taken meanwhile): the mirror's samples are asked for while the first source's are, and compared once both
    /// are in.
    func prove(_ mirror: URL, in mirrors: MirrorSet, total: Int64) async -> Outcome {
        let other = sampler(mirror)
        var mirrorKnown: Validators?
        var sampled: Int64 = 0
        var theirSamples: [[UInt8]] = []
        let ranges = Adoption.samples(of: [0..<total])
        do {
            // The first sample tells the mirror's validators; the rest are tied to them, two at a time.
            var answers = [try await other.fetch(ranges[0], known: nil)]
            // Its length and validator are judged on the first answer, before any other sample is asked.
            if case .bytes(_, let validators) = answers[0], ranges.count > 1, validators.totalLength == total,
                validators.ifRange != nil
            {
                answers += try await other.fetchAll(Array(ranges.dropFirst()), known: validators)
            }
            for got in answers {
                guard case .bytes(let theirs, let validators) = got else {
                    if case .declined(let why) = got { return .differs(why) }
                    return .differs("no sample")
                }
                if mirrorKnown == nil {
                    guard validators.totalLength == total else {
                        return .differs(
                            "its file has \(validators.totalLength.map { "\($0)" } ?? "an unknown number of") bytes, "
                                + "the first source's \(total)")
                    }
                    guard validators.ifRange != nil else {
                        return .differs("it gives no strong validator (ETag or Last-Modified) to tie its ranges to")
                    }
                    mirrorKnown = validators
                }
                theirSamples.append(theirs)
            }
        } catch let error as DownloadError {
            return .differs(error.message)
        } catch {
            return .differs("\(error)")
        }
        guard let reference = await mirrors.reference() else {
            return .differs("no samples of the first source to compare it with")
        }
        guard let mirrorKnown, reference.count == theirSamples.count else { return .differs("nothing to compare") }
        for ((range, ours), theirs) in zip(reference, theirSamples) {
            let common = min(ours.count, theirs.count)
            if let at = (0..<common).first(where: { ours[$0] != theirs[$0] })
                ?? (ours.count == theirs.count ? nil : common)
            {
                return .differs("its bytes differ from the first source's at byte \(range.lowerBound + Int64(at))")
            }
            sampled += Int64(range.count)
        }
        return .proven(mirrorKnown, samples: reference.count, bytes: sampled)
    }

    private func sampler(_ url: URL) -> RangeSampler {
        RangeSampler(
            startURL: url, headers: { [context] in context.userHeaders(for: $0) }, options: context.options,
            transport: context.transport, clock: context.clock, emit: { _ in })
    }
}
