public import Foundation

/// Downloads one URL to one file, resuming whatever an earlier run left, and never putting anything but
/// the complete, verified file at the destination.
///
/// ```swift
/// let result = try await Downloader().download(
///     DownloadRequest(url: "https://example.com/big.iso", destination: .file("big.iso")))
/// ```
public struct Downloader: Sendable {
    let transport: any HTTPTransport
    let clock: any DownloadClock

    /// - Parameters:
    ///   - transport: moves the bytes (`Downloader()`, from `import Stitch`, takes the shared transport of the
    ///     build's default backend).
    ///   - clock: waits between retries; inject a fake in tests.
    public init(transport: any HTTPTransport, clock: any DownloadClock = SystemClock()) {
        self.transport = transport
        self.clock = clock
    }

    /// Downloads `request`, resuming a partial download at its destination if there is one.
    ///
    /// Cancel the calling task to stop: the state is saved and a later call resumes.
    /// - Parameters:
    ///   - request: the URL, where to save it, headers and the expected checksum.
    ///   - options: retries, timeouts, connections, rate limit and checkpoint settings.
    ///   - onEvent: called for each ``DownloadEvent``, one at a time, in order, on a queue of this download's own: a
    ///     slow callback delays only this download's events (progress waiting behind it folds into the latest).
    /// - Returns: the finished download.
    /// - Throws: ``DownloadError``.
    public func download(
        _ request: DownloadRequest,
        options: DownloadOptions = DownloadOptions(),
        onEvent: @escaping @Sendable (DownloadEvent) -> Void = { _ in }
    ) async throws(DownloadError) -> DownloadResult {
        let run = try DownloadRun(
            request: request, options: options, transport: transport, clock: clock, onEvent: onEvent)
        return try await run.run()
    }

    /// The partial download saved beside `destination`, for resuming it without knowing its URL.
    /// - Throws: ``DownloadError`` with code `.nothingToResume` or `.unusableState`.
    public static func savedDownload(at destination: String) throws(DownloadError) -> SavedDownload {
        let paths = DownloadPaths(destination: absolutePath(destination))
        let partial = PartialDownload(paths)
        // A damaged state with a usable previous generation: the download itself will fall back on it.
        if case .unusable(let error, previous: nil) = partial.saved { throw error }
        guard let state = partial.state else {
            throw DownloadError(.nothingToResume, "no partial download at \(destination) (no \(paths.state))")
        }
        var headers = HTTPHeaders()
        for line in state.headers {
            guard let (name, value) = parseHeaderLine(line) else { continue }
            headers.add(name: name, value: value)
        }
        // What the live record says was written since the last checkpoint (this boot only, as a resume trusts it).
        let live = state.bootID == BootID.current ? LiveRecord.read(at: paths.live, nonce: state.nonce) : nil
        return SavedDownload(
            url: state.url, headers: headers,
            checksum: state.checksum.flatMap { try? ExpectedChecksum(parsing: $0) },
            durableBytes: state.durableBytes, totalBytes: state.validators.totalLength,
            segments: state.segments.enumerated().map { index, segment in
                let written = live.flatMap { index < $0.count ? $0[index] : nil } ?? segment.durable
                let end = segment.end ?? Int64.max
                return SavedSegment(
                    start: segment.start, end: segment.end, durable: segment.durable,
                    written: min(end, max(segment.durable, written)))
            },
            etag: state.validators.etag, lastModified: state.validators.lastModified)
    }

    /// Re-reads the checksummed pieces of the partial download at `destination` and marks every damaged one as
    /// not downloaded, so that the next ``download(_:options:onEvent:)`` fetches only those pieces again.
    ///
    /// Finds torn or rotted writes after a crash without asking the server. A piece's checksum is recorded once all
    /// of it is durable; the durable bytes of a piece not yet complete have checksums of their own (proofs, by
    /// range), checked too. Bytes not yet durable are not checked.
    /// - Throws: ``DownloadError`` (`.nothingToResume`, `.unusableState`, `.io`).
    public static func verify(at destination: String) throws(DownloadError) -> VerifyReport {
        let paths = DownloadPaths(destination: absolutePath(destination))
        let state: DownloadState
        switch PartialDownload(paths).saved {
        case .none:
            throw DownloadError(.nothingToResume, "no partial download at \(destination) (no \(paths.state))")
        case .unusable(let error, _):
            throw error  // what the state's damage costs is decided by the next download, not by a check
        case .state(let saved):
            state = saved
        }
        let (store, point) = try PartStore.reopen(paths: paths, state: state)
        defer { store.unlock() }
        // After a reboot reopen has checked and cut the damaged pieces already.
        let before = store.snapshot
        let check = store.check()
        let damaged = Array(Set(point.damagedPieces + check.damaged)).sorted()
        var ranges: [DamagedPiece] = []
        if let total = before.validators.totalLength {
            try store.invalidate(pieces: check.damaged)
            ranges = damaged.map { index in
                let start = Int64(index) * before.pieceSize
                return DamagedPiece(index: index, bytes: start..<min(start + before.pieceSize, total))
            }
        } else if let end = check.provenEnd, let only = before.segments.first, end < only.durable {
            // One prefix (an unknown length): cut where its checks stop holding; all from there is fetched again.
            let index = Int(end / before.pieceSize)
            try store.invalidate(pieces: [index])
            ranges = [DamagedPiece(index: index, bytes: end..<only.durable)]
        }
        return VerifyReport(
            pieceSize: before.pieceSize, piecesChecked: check.checked + point.damagedPieces.count,
            damagedPieces: ranges)
    }

    /// Checks that `url` is one the engine can download (http or https, with a host).
    /// - Throws: ``DownloadError`` with code `.invalidURL` or `.unsupportedScheme`.
    public static func validate(url: String) throws(DownloadError) {
        _ = try validateURL(url)
    }

    /// Checks that `url` (its `absoluteString`) is one the engine can download (http or https, with a host).
    /// - Throws: ``DownloadError`` with code `.invalidURL` or `.unsupportedScheme`.
    public static func validate(url: URL) throws(DownloadError) {
        _ = try validateURL(url.absoluteString)
    }

    /// Splits "Name: value", rejecting what would smuggle another header or request line.
    public static func parseHeaderLine(_ line: String) -> (String, String)? {
        guard let colon = line.firstIndex(of: ":") else { return nil }
        let name = String(line[..<colon])
        let value = String(line[line.index(after: colon)...]).trimming(" \t")
        let tokenCharacters = Set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        guard !name.isEmpty, name.allSatisfy({ tokenCharacters.contains($0) }) else { return nil }
        guard !value.unicodeScalars.contains(where: { $0.value < 0x20 && $0 != "\t" || $0.value == 0x7f }) else {
            return nil
        }
        return (name, value)
    }
}

/// Validates a URL the way the engine needs it: http or https with a host.
func validateURL(_ text: String) throws(DownloadError) -> URL {
    guard !text.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7f }),
        let url = URL(string: text), let scheme = url.scheme?.lowercased()
    else { throw DownloadError(.invalidURL, "not a valid URL: \(text.debugDescription)") }
    guard scheme == "http" || scheme == "https" else {
        throw DownloadError(.unsupportedScheme, "unsupported URL scheme '\(scheme)' (use http or https)")
    }
    guard let host = url.host, !host.isEmpty else {
        throw DownloadError(.invalidURL, "URL has no host: \(text)")
    }
    return url
}
