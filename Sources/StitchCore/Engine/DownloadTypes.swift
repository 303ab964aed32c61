public import Foundation

/// Where a download goes.
public enum Destination: Sendable, Hashable {
    /// Exactly this path (`-o PATH`).
    case file(String)
    /// This directory, named from `Content-Disposition`, else the URL path (`-d DIR`).
    case directory(String)
}

/// What to download.
public struct DownloadRequest: Sendable {
    /// The http or https URL to fetch.
    public var url: String
    /// Where the file goes: a path, or a directory to name it in.
    public var destination: Destination
    /// Extra request headers (`--header`), sent on every request.
    public var headers: HTTPHeaders
    /// Verify the finished file against this digest.
    public var checksum: ExpectedChecksum?
    /// Replace an existing destination that Stitch did not leave, or an unusable partial download.
    public var overwrite: Bool
    /// URLs this download had before `url` (an expired signed URL replaced by a fresh one): a partial or finished
    /// file that one of them left is this download's. The partial is resumed only if the new URL serves the same
    /// file (`If-Range` with the saved validators); otherwise it starts over and says why.
    public var formerURLs: [String] = []
    /// Take over a partial download that another program left at a ``Destination/file(_:)`` destination — `wget
    /// -c`'s or `curl -C -`'s (the file alone) or aria2c's (the file and `FILE.aria2`) — instead of refusing it,
    /// once the server proves it: ranges, a strong validator, a length that fits, and samples spread over the
    /// partial that match the server's bytes (docs/adopt.md; bytes between the samples are not checked, so give a
    /// ``checksum`` to prove every byte). Without proof the download starts from zero beside it and replaces it
    /// only once complete, as it does with ``overwrite``. Ignored for a ``Destination/directory(_:)``.
    public var adopt = false
    /// Other URLs of the same file (aria2's several URIs of one download): while the file is fetched over several
    /// connections, some of them fetch its segments from these. A mirror joins only once samples spread over the
    /// file match the first source's same bytes (and it has the same length and a strong validator of its own),
    /// and is dropped, with a notice, at any sign that it serves something else; never is a byte of a file that
    /// differs written. Credentials in ``headers`` (`Authorization`, `Cookie`) are not sent to a mirror on another
    /// host. Unused on one connection. docs/mirrors.md.
    public var mirrors: [String] = []
    /// Also take as ``mirrors`` the servers the first response advertises with `Link: <URI>; rel=duplicate`
    /// (Metalink/HTTP, RFC 6249), at most four, lowest `pri` first, under the same proof. Off by default: the
    /// server then chooses hosts the download contacts.
    public var useAdvertisedMirrors = false
    /// Fetch the file only if the server's is newer than the one at the destination (`wget -N`, `curl -z`, aria2's
    /// `conditional-get`): the request for it carries `If-None-Match` with the ETag the file came with and
    /// `If-Modified-Since` with its `Last-Modified` (both from its completion mark, when this download made it),
    /// else the file's modification time. A 304 — or a 200 with the same strong ETag and length, or with a
    /// `Last-Modified` no later and the same length — leaves the file untouched (``DownloadResult/notModified``);
    /// anything else is fetched beside it and replaces it once complete and verified, as always. A file there
    /// that does not match ``checksum`` is replaced unconditionally. With ``Destination/directory(_:)`` the file
    /// is named from the URL alone (the name must be known before the request; `Content-Disposition` is not used).
    public var ifNewer = false
    /// With ``Destination/directory(_:)``: given the path named by the first response, returns the path to use.
    /// ``DownloadManager`` uses it to keep two downloads off one file. Called on an arbitrary thread, once — or
    /// twice when a file or partial this URL left under the name the URL alone gives is found before the request:
    /// first with that name (the file is taken if the path returned is the same), then, if no file was taken,
    /// with the response's.
    public var choosePath: (@Sendable (String) -> String)?
    /// As ``choosePath``, with the verdict of the look that chose the path (``PathChoice/vacant``); used before
    /// ``choosePath`` when set (``DownloadManager`` sets it).
    var claimPath: (@Sendable (String) -> PathChoice)?

    /// The path to use for the path `named` by the first response, and whether it was found vacant.
    func pathChoice(_ named: String) -> PathChoice {
        if let claimPath { return claimPath(named) }
        return PathChoice(path: choosePath?(named) ?? named, vacant: false)
    }

    /// A request for `url` into `destination`, with no former URLs and no ``choosePath``.
    public init(
        url: String, destination: Destination, headers: HTTPHeaders = HTTPHeaders(),
        checksum: ExpectedChecksum? = nil, overwrite: Bool = false
    ) {
        self.url = url
        self.destination = destination
        self.headers = headers
        self.checksum = checksum
        self.overwrite = overwrite
    }

    /// A request for `url` (its `absoluteString`) into `destination`, with no former URLs and no ``choosePath``.
    /// As with a `String`, a URL that is not http or https with a host (a `file:` URL) is refused when downloaded,
    /// with ``DownloadError/Code/unsupportedScheme`` or ``DownloadError/Code/invalidURL``.
    public init(
        url: URL, destination: Destination, headers: HTTPHeaders = HTTPHeaders(),
        checksum: ExpectedChecksum? = nil, overwrite: Bool = false
    ) {
        self.init(
            url: url.absoluteString, destination: destination, headers: headers, checksum: checksum,
            overwrite: overwrite)
    }

    /// Whether a partial or finished download of `other` belongs to this request.
    func owns(_ other: String) -> Bool { other == url || formerURLs.contains(other) }
}

/// How retries are spaced: exponential backoff with jitter, honouring `Retry-After`.
public struct RetryPolicy: Sendable, Hashable {
    /// Failed attempts in a row, without progress, before giving up. Once the attempts since the last reset have
    /// saved `minimumProgress` new bytes together, the count starts again, so a flaky but moving transfer is never
    /// abandoned.
    public var maxRetries: Int = 5
    /// New bytes that count as progress (and reset the retry count), summed over attempts. A server that sends a
    /// few bytes per connection would otherwise be retried for ever; one that cuts every connection after a few
    /// KiB still moves.
    public var minimumProgress: Int = 16 << 10
    /// Seconds of backoff before the first retry; it doubles for each further one. The wait is half of it plus a
    /// random part of the other half.
    public var baseDelay: Double = 1
    /// The most seconds of backoff (before jitter); `Retry-After` is capped by ``maxRetryAfter`` instead.
    public var maxDelay: Double = 60
    /// `Retry-After` values above this are clamped to it.
    public var maxRetryAfter: Double = 600
    /// Tries in all for a connection that is refused or times out (a server that is down, a wrong port): a few
    /// within seconds, not the long backoff of ``maxRetries``.
    public var maxConnectTries = 3
    /// The wait before the second try of a refused connection; it doubles for each further try (0.5 s and 1 s:
    /// three tries within two seconds).
    public var connectRetryDelay: Double = 0.5

    /// The default policy.
    public init() {}

    /// Seconds to wait before retry number `attempt` (1-based). `jitter` is in 0...1.
    public func delay(attempt: Int, retryAfter: String?, now: Int64, jitter: Double) -> Double {
        if let retryAfter, let seconds = HTTPDate.retryAfterDelay(retryAfter, now: now) {
            return min(Double(seconds), maxRetryAfter)
        }
        let exponential = min(maxDelay, baseDelay * pow2(attempt - 1))
        // "Equal jitter": half fixed, half random, so retries neither stampede nor collapse to zero.
        return exponential / 2 + exponential / 2 * jitter
    }

    private func pow2(_ n: Int) -> Double {
        var value = 1.0
        for _ in 0..<max(0, min(n, 30)) { value *= 2 }
        return value
    }
}

/// Tuning for one download.
public struct DownloadOptions: Sendable {
    /// Connection settings for every request: timeouts, TLS, user agent, credentials.
    public var transport = TransportOptions()
    /// How failed attempts are retried.
    public var retry = RetryPolicy()
    /// Redirects followed from the URL asked for; one more fails with ``DownloadError/Code/redirects``.
    public var maxRedirects = 10
    /// A durable checkpoint (fdatasync + state) at least this often while data flows…
    public var checkpointInterval: Double = 1
    /// …and after at most this many bytes.
    public var checkpointBytes: Int64 = 16 << 20
    /// Restarts from zero allowed in one run before the source is called unstable.
    public var maxRestarts = 3
    /// Bytes re-fetched and compared when resuming without a validator (at most 4 MiB: they are held in memory
    /// for the comparison).
    public var overlapWindow: Int64 = 64 * 1024
    /// How often `.progress` events are sent.
    public var progressInterval: Double = 0.25
    /// TCP connections for one download; nil chooses by size (see ``Connections/automatic(forLength:step:)``).
    public var connections: Int?
    /// The connections one download may be asked to use: 1 to 16. Every interface (the manager, the command line,
    /// the daemon's RPC, input lists) checks a number it is given against this range.
    public static let connectionRange: ClosedRange<Int> = 1...16
    /// An upper bound on ``connections`` and on the automatic choice.
    public var maximumConnections: Int?
    /// Asked once, when the download is about to use `wanted` (> 1) connections: how many it may use (the first
    /// is already open, so the answer is at least 1). ``DownloadManager`` enforces its per-host cap with it.
    public var connectionGrant: (@Sendable (_ wanted: Int) -> Int)?
    /// A bandwidth cap; pass the same limiter to several downloads to cap them together.
    public var rateLimiter: RateLimiter?
    /// With several connections over HTTPS: carry them as HTTP/2 streams of one TCP connection instead of N
    /// TCP connections (fewer handshakes; no gain where a server caps each connection's speed).
    public var http2Streams = false
    /// Never split a range into parts smaller than this.
    public var minimumSplitSize: Int64 = 1 << 20
    /// With the automatic choice of connections (``connections`` nil): the speed at which one connection is
    /// enough. A download that could split first receives for 10 ms (or 8 MiB) on its first connection, and
    /// stays on it when that arrives at least this fast; otherwise it splits from where the first response got
    /// to. More connections beat a server's per-connection cap; on a link that one connection fills they only add
    /// work for both ends. nil splits at the first response whatever the speed, as an explicit ``connections``
    /// always does.
    public var singleConnectionRate: Int64? = 128 << 20
    /// The size one automatic connection is worth (``Connections/automaticStep``, 16 MiB): the automatic choice
    /// is `length / step` connections, at most ``Connections/automaticMaximum``. Smaller values let tests reach
    /// the split paths with small files.
    public var automaticConnectionStep: Int64 = Connections.automaticStep
    /// Tests only: called on the blocking pool before the engine judges a response head (and does the disk work
    /// that goes with it), so a test can hold one download's decision and watch the others go on.
    var headDecisionHook: (@Sendable () -> Void)?
    /// Tests only: called before a resumed body's overlap (the bytes asked for again before the resume point) is
    /// read from the part file to be compared, so a test can hold that read as a slow disk would.
    var overlapReadHook: (@Sendable () -> Void)?
    /// Tests only: called before each chunk of written bytes is hashed into the running digest of a checksum, so a
    /// test can hold the hashing and watch the transport go on.
    var hashHook: (@Sendable () -> Void)?
    /// Tests only: called on the blocking pool when every byte is in and checked, before the file's sync and rename,
    /// so a test can hold one download's finish and watch the others go on.
    var finishHook: (@Sendable (DownloadPaths) -> Void)?

    /// The defaults.
    public init() {}
}

/// Bytes on disk so far.
public struct DownloadProgress: Sendable, Hashable {
    /// Bytes written to the part file (the download's position).
    public var bytes: Int64
    /// The complete length, if the server said it.
    public var total: Int64?
    /// Bytes that would survive a power cut.
    public var durableBytes: Int64
    /// The byte ranges written to the part file, in order, adjacent ones merged (empty before the part file).
    public var writtenRanges: [Range<Int64>] = []
    /// The size of the pieces the download is checked in (1 MiB, doubled for very large files); nil before the
    /// part file.
    public var pieceLength: Int64? = nil
    /// Requests transferring now (each over a connection of its own).
    public var connections = 0
}

/// Something a download wants its user to know. Delivered in order, one at a time, on a queue of the download's own
/// (never the transport's thread); every event arrives before the file is in place.
public enum DownloadEvent: Sendable {
    /// The final path is known (with `.directory`, after the first response).
    case destinationResolved(String)
    /// A partial download was found and will continue from `offset`; `note` says why less was trusted, if so.
    case resuming(from: Int64, note: String?)
    /// A response is being saved; `offset` is where its body goes.
    case receiving(status: Int, offset: Int64, total: Int64?)
    /// Bytes on disk so far; sent every ``DownloadOptions/progressInterval`` seconds while the download runs.
    case progress(DownloadProgress)
    /// A redirect is followed to this URL.
    case redirected(to: String)
    /// The partial data is discarded and the download starts over.
    case restarting(RestartReason)
    /// An attempt failed: retry number `attempt` of `maxRetries` follows after `delay` seconds; `reason` says
    /// why.
    case retrying(attempt: Int, maxRetries: Int, delay: Double, reason: String)
    /// Something worth saying that changes nothing, e.g. falling back to one connection.
    case notice(String)
    /// Every byte is in: the file is being checked, made durable and moved into place, with no connection in use
    /// any more. The last event of a run that goes on to finish, none after it (the finish may still fail: a
    /// checksum that does not match, a full disk).
    case finishing
}

/// A finished download.
public struct DownloadResult: Sendable, Hashable {
    /// The finished file's path.
    public var destination: String
    /// The file's length in bytes.
    public var bytes: Int64
    /// Body bytes this run fetched and kept: written to the file, or compared with bytes already on it.
    public var bytesTransferred: Int64
    /// Body bytes this run fetched and dropped: those a connection received past the point where its range had been
    /// split off to another connection (fetched twice: the price of steals and of replaced connections).
    public var bytesDiscarded: Int64 = 0
    /// The offset this run resumed from (0 for a fresh start).
    public var resumedFrom: Int64
    /// True when nothing was fetched because the file was already complete.
    public var alreadyComplete: Bool
    /// True when, with ``DownloadRequest/ifNewer``, the server showed the file at the destination to be its own
    /// (``alreadyComplete`` is true too): nothing was fetched and the file was left as it was.
    public var notModified = false
    /// The verified checksum, if one was asked for.
    public var checksum: ExpectedChecksum?
    /// The digest of the whole file the server announced, which the file was verified against; nil when it
    /// announced none in SHA-256 or SHA-512 (or nothing was fetched).
    public var serverDigest: ExpectedChecksum? = nil
    /// The header field ``serverDigest`` came in: `Repr-Digest`, `Content-Digest` or `Digest`.
    public var serverDigestField: String? = nil
}

/// A partial download found on disk: what `stitch get --resume DEST` continues.
public struct SavedDownload: Sendable, Hashable {
    /// The URL it was downloading.
    public var url: String
    /// The extra request headers it was started with.
    public var headers: HTTPHeaders
    /// The digest the finished file is to be verified against, if one was given.
    public var checksum: ExpectedChecksum?
    /// Bytes on stable storage as of the last checkpoint.
    public var durableBytes: Int64
    /// The complete length, if the server said it.
    public var totalBytes: Int64?
    /// The byte ranges of the file and how much of each is on stable storage (as of the last checkpoint).
    public var segments: [SavedSegment] = []
    /// The validators a resume is checked against.
    public var etag: String?
    /// The saved `Last-Modified` date, if the server sent one.
    public var lastModified: String?
}

/// A byte range `start..<end` of a partial download (`end` nil while the length is unknown), of which
/// `start..<durable` is on stable storage and `start..<written` was written (in the page cache: what a crash of
/// the process, not of the machine, keeps; the live record says so within this boot).
public struct SavedSegment: Sendable, Hashable {
    /// The first byte's offset.
    public var start: Int64
    /// The offset just past the range; nil while the length is unknown.
    public var end: Int64?
    /// The offset up to which the range is on stable storage.
    public var durable: Int64
    /// The offset up to which the range was written (at least ``durable``).
    public var written: Int64
}

/// How many connections a download uses.
public enum Connections {
    /// The most connections the automatic choice uses: enough to beat a per-connection cap, few enough to be
    /// polite to a server (aria2's default is 1 per server; browsers open 6 per host).
    public static let automaticMaximum = 4
    /// Size that one connection is worth: below 2 × this, one connection.
    public static let automaticStep: Int64 = 16 << 20

    /// The automatic choice: one connection per 16 MiB, at least 1 and at most 4. A small file is not worth
    /// the extra round trips; a large one gains from several connections when a server caps each one.
    public static func automatic(forLength length: Int64?, step: Int64 = automaticStep) -> Int {
        guard let length else { return 1 }
        return Int(max(1, min(Int64(automaticMaximum), length / max(1, step))))
    }
}

/// What ``Downloader/verify(at:)`` found.
public struct VerifyReport: Sendable, Hashable {
    /// Bytes per checksummed piece (the last piece may be shorter).
    public var pieceSize: Int64
    /// Pieces whose durable bytes had checksums (a whole piece's, or proofs of its durable parts) and were read back.
    public var piecesChecked: Int
    /// Pieces whose bytes did not match; they are now marked to be fetched again.
    public var damagedPieces: [DamagedPiece]
}

/// One piece whose bytes on disk do not match the checksum recorded when it was written.
public struct DamagedPiece: Sendable, Hashable {
    /// The piece's number, counted from 0 at the start of the file.
    public var index: Int
    /// The file offsets the piece covers.
    public var bytes: Range<Int64>
}
