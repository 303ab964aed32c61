import Foundation
import StitchLocks

/// `--adopt` (``DownloadRequest/adopt``): taking over a partial download that `wget -c`, `curl -C -` or aria2c
/// left at the destination, only on proof (docs/adopt.md).
///
/// The proof: the server serves ranges and gives a strong validator (the partial's own program kept none), its
/// length fits the partial (aria2's recorded length exactly), and samples of the claimed bytes spread over the
/// whole partial — its first and last bytes among them — are byte for byte the server's. Then the partial becomes
/// a Stitch partial download whose state carries the validator just seen, and the run resumes it like any other.
/// Otherwise the download starts from zero beside it and replaces it only when complete.
///
/// What the samples cannot prove: that bytes between them are the server's. A file edited in its middle, or a
/// partial damaged there, passes; a checksum (``DownloadRequest/checksum``) closes that gap.
enum Adoption {
    /// Bytes per sample.
    static let sampleBytes: Int64 = 64 << 10
    /// Samples for a partial of up to 512 MiB; one more per 64 MiB above that, up to ``maximumSamples``.
    static let minimumSamples = 8
    static let maximumSamples = 32

    /// The byte ranges to compare: evenly spread over `claimed` (taken as one run of bytes), always including the
    /// first and the last `sampleBytes` of it; everything when it is no bigger than the samples would be. Each
    /// lies inside one claimed range; in order, not overlapping.
    static func samples(of claimed: [Range<Int64>]) -> [Range<Int64>] {
        let total = claimed.reduce(Int64(0)) { $0 + Int64($1.count) }
        guard total > 0 else { return [] }
        let count = Int64(min(maximumSamples, max(minimumSamples, Int(min(total / (64 << 20), 1 << 20)))))
        var picked: [Range<Int64>] = []
        if total <= count * sampleBytes {
            for range in claimed {
                var at = range.lowerBound
                while at < range.upperBound {
                    picked.append(at..<min(at + sampleBytes, range.upperBound))
                    at += sampleBytes
                }
            }
            return picked
        }
        /// The sample starting at `position` bytes into the claimed run, cut at its range's end.
        func sample(at position: Int64) -> Range<Int64> {
            var left = position
            for range in claimed {
                if left < Int64(range.count) {
                    let start = range.lowerBound + left
                    return start..<min(start + sampleBytes, range.upperBound)
                }
                left -= Int64(range.count)
            }
            let last = claimed[claimed.count - 1]
            return max(last.lowerBound, last.upperBound - sampleBytes)..<last.upperBound
        }
        for index in 0..<count {
            picked.append(sample(at: index * (total - sampleBytes) / (count - 1)))
        }
        // The last bytes of the last range, and the first of the first, whatever the arithmetic above did with
        // short ranges.
        let last = claimed[claimed.count - 1]
        picked.append(max(last.lowerBound, last.upperBound - sampleBytes)..<last.upperBound)
        picked.append(claimed[0].lowerBound..<min(claimed[0].lowerBound + sampleBytes, claimed[0].upperBound))
        picked.sort { $0.lowerBound < $1.lowerBound }
        var merged: [Range<Int64>] = []
        for range in picked {
            if let previous = merged.last, range.lowerBound <= previous.upperBound {
                // Overlapping samples inside one claimed range: join them (two ranges never touch, so a joined
                // sample still lies inside one).
                merged[merged.count - 1] = previous.lowerBound..<max(previous.upperBound, range.upperBound)
            } else {
                merged.append(range)
            }
        }
        return merged
    }

    /// The segments of a state that keeps `claimed` of a file of `total` bytes: one per claimed range, each
    /// durable to the range's end and reaching to the next claimed range (the missing bytes after it are its to
    /// fetch); a leading missing run is a segment of its own. At most `LiveRecord.slotCount`: beyond that, the
    /// claimed ranges that are smallest are given up (fetched again) by merging their segment into the one before.
    static func segments(claimed: [Range<Int64>], total: Int64) -> [Segment] {
        var segments: [Segment] = []
        var at: Int64 = 0
        for range in claimed where range.lowerBound >= at && range.lowerBound < total {
            let upper = min(range.upperBound, total)
            if range.lowerBound > at {
                if segments.isEmpty {
                    segments.append(Segment(start: 0, end: range.lowerBound, durable: 0))
                } else {
                    segments[segments.count - 1].end = range.lowerBound
                }
            }
            segments.append(Segment(start: range.lowerBound, end: upper, durable: upper))
            at = upper
        }
        if at < total {
            if segments.isEmpty {
                segments.append(Segment(start: 0, end: total, durable: 0))
            } else {
                segments[segments.count - 1].end = total
            }
        }
        while segments.count > LiveRecord.slotCount {
            // The segment (not the first) whose kept bytes are fewest joins the one before it.
            var smallest = 1
            for index in 2..<segments.count
            where segments[index].durable - segments[index].start
                < segments[smallest].durable - segments[smallest].start
            {
                smallest = index
            }
            segments[smallest - 1].end = segments[smallest].end
            segments.remove(at: smallest)
        }
        return segments
    }
}

/// `--adopt` for one run: looks for another program's partial at the destination and proves it (see ``Adoption``).
struct ForeignAdoption {
    let context: RunContext
    let reporter: RunReporter

    private var request: DownloadRequest { context.request }
    private var options: DownloadOptions { context.options }
    private var transport: any HTTPTransport { context.transport }
    private var clock: any DownloadClock { context.clock }
    private var startURL: URL { context.startURL }
    private func emit(_ event: DownloadEvent) { reporter.emit(event) }

    /// What the proof came to.
    private enum Proof {
        case proven(Validators)
        /// Not adoptable, and why (for the user).
        case declined(String)
    }

    /// With ``DownloadRequest/adopt``: finds another program's partial download at `paths` and, on proof, makes it a
    /// Stitch partial that this run then resumes; on no proof, says why (the download then starts from zero beside
    /// it). Returns what the run keeps of it (nil: nothing found). Throws — leaving everything as it is — when the
    /// partial cannot be looked at (a damaged aria2 control file), or the server cannot be asked (the network, an
    /// HTTP error).
    func adopt(_ paths: DownloadPaths) async throws -> AdoptionRecord? {
        let inspection = try await offloaded { () throws(DownloadError) in try ForeignPartial.inspect(paths) }
        guard case .found(let foreign) = inspection else { return nil }
        let origin: AdoptionRecord.Origin
        switch foreign.origin {
        case .prefix: origin = .prefix
        case .aria2: origin = .aria2
        }
        let proof = try await prove(foreign, paths)
        switch proof {
        case .declined(let why):
            try await offloaded { () throws(DownloadError) in try ForeignPartial.discardInertState(paths) }
            emit(
                .restarting(
                    .untrustedPartial(
                        "cannot adopt \(paths.destination): \(why); downloading it again (it is replaced only by the "
                            + "complete file)")))
            return AdoptionRecord(origin: origin, kept: false)
        case .proven(let validators):
            let total = validators.totalLength ?? foreign.size
            let state = DownloadState(
                url: request.url, headers: request.headers.map { "\($0.name): \($0.value)" },
                checksum: request.checksum?.description, validators: validators,
                segments: Adoption.segments(claimed: foreign.claimed, total: total),
                pieceSize: PieceLayout.pieceSize(forTotal: total), pieces: [],
                adoption: AdoptionRecord(origin: origin, kept: true), bootID: BootID.current,
                liveNonce: PartStore.newNonce(), updatedAt: now())
            try await offloaded { () throws(DownloadError) in try ForeignPartial.takeOver(paths, state: state) }
            let source: String
            switch foreign.origin {
            // A prefix of the file, as wget's and curl's resumable downloads leave it.
            case .prefix: source = "wget or curl"
            case .aria2: source = "aria2"
            }
            let samples = Adoption.samples(of: foreign.claimed)
            let sampled = samples.reduce(Int64(0)) { $0 + Int64($1.count) }
            let proved =
                sampled >= foreign.claimedBytes
                ? "every byte matches the server's"
                : "\(samples.count) samples (\(sampled) bytes) spread over it match the server's; the bytes between "
                    + "them are not checked" + (request.checksum == nil ? " (a checksum would)" : "")
            emit(
                .notice(
                    "adopting \(paths.destination) (left by \(source)): \(foreign.claimedBytes) of \(total) bytes; "
                        + proved))
            return state.adoption
        }
    }

    /// Asks the server for the samples of `foreign` and compares them with the file.
    private func prove(_ foreign: ForeignPartial, _ paths: DownloadPaths) async throws -> Proof {
        let samples = Adoption.samples(of: foreign.claimed)
        var known: Validators?
        for range in samples {
            let fetched = try await fetch(range, known: known)
            let body: [UInt8]
            switch fetched {
            case .declined(let why):
                return .declined(why)
            case .bytes(let bytes, let validators):
                body = bytes
                if known == nil {
                    // The first answer: what the server's file is.
                    guard validators.ifRange != nil else {
                        return .declined(
                            "the server gives no strong validator (ETag or Last-Modified) to tie its bytes to")
                    }
                    guard let total = validators.totalLength else {
                        return .declined("the server does not say the file's length")
                    }
                    switch foreign.origin {
                    case .prefix where foreign.size > total:
                        return .declined("it has \(foreign.size) bytes but the server's file has \(total)")
                    case .aria2(_, let recorded) where recorded != total:
                        return .declined(
                            "aria2 recorded a length of \(recorded) bytes but the server's file has \(total)")
                    default:
                        break
                    }
                }
                known = validators
            }
            let local = try await offloaded { () throws(DownloadError) in
                try ForeignPartial.read(paths, at: range.lowerBound, count: range.count)
            }
            let common = min(local.count, body.count)
            let differing = (0..<common).first { local[$0] != body[$0] } ?? (local.count == body.count ? nil : common)
            if let difference = differing {
                return .declined("the server's copy differs at byte \(range.lowerBound + Int64(difference))")
            }
        }
        guard let known else { return .declined("nothing in it to compare") }
        return .proven(known)
    }

    /// One sample (``RangeSampler``); a server that will not answer a few ranges leaves the partial as it is.
    private func fetch(_ range: Range<Int64>, known: Validators?) async throws -> RangeSampler.Fetched {
        let sampler = RangeSampler(
            startURL: startURL, headers: { [context] in context.userHeaders(for: $0) }, options: options,
            transport: transport, clock: clock,
            emit: { [reporter] in reporter.emit($0) })
        do {
            return try await sampler.fetch(range, known: known)
        } catch let error as DownloadError where error.code != .httpStatus && error.code != .cancelled {
            throw DownloadError(
                error.code,
                "cannot check the partial download against the server: \(error.message); it is left as it is",
                cause: error.cause, resumable: error.code == .retriesExhausted,
                remedy: error.code == .retriesExhausted ? .rerun(.resume) : nil)
        }
    }
}
