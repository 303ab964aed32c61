import Synchronization
import StitchLocks

/// A token bucket that caps the bytes per second of every connection sharing it (all connections of a download,
/// later all downloads).
///
/// The libcurl write callback asks ``take(_:now:)`` before accepting a chunk: `nil` means write it now (its
/// tokens are spent); a number means pause the transfer (`CURL_WRITEFUNC_PAUSE`) and ask again with the same
/// chunk after that many seconds. The logic is pure: the caller passes the time (seconds on any monotonic
/// clock), so tests drive it with a simulated clock and nothing here sleeps.
///
/// The bucket holds at most ``burst`` bytes and starts full. The default burst is
/// `max(64 KiB, bytesPerSecond / 10)`:
/// - at most a tenth of a second of traffic, so the extra a full bucket lets through at the start (or after an
///   idle spell) is ≤ 1 % of ten seconds' worth — comfortably inside 5 % accuracy over 10 s — for rates from
///   640 KiB/s up. Below that the 64 KiB floor rules: still ≤ 5 % of 10 s down to 128 KiB/s; at slower rates
///   the fixed 64 KiB head start takes longer to wash out (≤ 5 % after 64 KiB / (5 % × rate) seconds);
/// - at least 64 KiB, four of libcurl's largest (16 KiB) write-callback chunks, so that connections are not
///   paused and unpaused on every callback at low rates, and a tenth of a second at high rates so that pauses
///   stay rare (each costs a curl wake-up) while eight connections draw from the same bucket.
///
/// A chunk larger than the burst is accepted once the bucket is full and drives it negative, so later chunks
/// wait for the debt and the average stays right. Waits are always positive and at most ``maximumWait``, so a
/// rate raised at runtime is noticed within that time by a paused connection.
///
/// Thread-safe: the state is behind a `Locked`; every method may be called from any thread.
public final class RateLimiter: Sendable {
    /// The longest wait ``take(_:now:)`` returns; a caller asking again early just gets another wait.
    public static let maximumWait: Double = 1.0

    private struct State {
        var rate: Int64
        var burst: Int64
        /// Whether `burst` follows the rate (it was not given explicitly).
        var burstFollowsRate: Bool
        /// May be negative after a take larger than what was in the bucket.
        var tokens: Double
        /// The latest `now` seen; nil before the first take.
        var last: Double?
        /// The bytes let through so far.
        var taken: Int64 = 0
    }

    private let state: Locked<State>
    private let enabled = Atomic<Bool>(true)
    /// The limiter this one is nested within (one download's limit within the limit over all of them).
    public let parent: RateLimiter?

    /// A full bucket refilling at `bytesPerSecond` (> 0) and holding at most `burst` bytes (> 0; default
    /// ``defaultBurst(forRate:)``, which then follows later rate changes).
    ///
    /// `within`: a limiter this one is nested in — a chunk passes only when both have room for it (one download's
    /// own limit within the limit over all downloads).
    public init(bytesPerSecond: Int64, burst: Int64? = nil, within parent: RateLimiter? = nil) {
        self.parent = parent
        precondition(bytesPerSecond > 0, "RateLimiter: bytesPerSecond must be positive")
        precondition(burst.map { $0 > 0 } ?? true, "RateLimiter: burst must be positive")
        let size = burst ?? Self.defaultBurst(forRate: bytesPerSecond)
        state = Locked(
            State(
                rate: bytesPerSecond, burst: size, burstFollowsRate: burst == nil, tokens: Double(size), last: nil))
    }

    /// `max(64 KiB, rate / 10)` — see the type's documentation for why.
    public static func defaultBurst(forRate rate: Int64) -> Int64 { max(64 * 1024, rate / 10) }

    /// The refill rate (> 0), changeable while transfers run. The new rate applies from the next
    /// ``take(_:now:)`` on, including to the refill since the previous one (at most a burst's worth). With the
    /// default burst, the burst follows the rate and the bucket is trimmed to it.
    public var bytesPerSecond: Int64 {
        get { state.withLock { $0.rate } }
        set {
            precondition(newValue > 0, "RateLimiter: bytesPerSecond must be positive")
            state.withLock { s in
                s.rate = newValue
                if s.burstFollowsRate {
                    s.burst = Self.defaultBurst(forRate: newValue)
                    s.tokens = min(s.tokens, Double(s.burst))
                }
            }
        }
    }

    /// The most the bucket holds.
    public var burst: Int64 { state.withLock { $0.burst } }

    /// Whether the limit applies. Off, ``take(_:now:)`` asks only the limiter this one is nested within (without
    /// one, every chunk passes at once: one atomic load, no lock), so a limiter shared by many downloads can be
    /// switched off and on while they run (a daemon's
    /// `max-overall-download-limit` set to 0 and back). Switched on again, the bucket starts from what it held,
    /// refilled for the time in between (at most a burst).
    public var isEnabled: Bool {
        get { enabled.load(ordering: .relaxed) }
        set { enabled.store(newValue, ordering: .relaxed) }
    }

    /// Whether this limiter or one it is nested within limits now.
    public var isLimiting: Bool { isEnabled || parent?.isLimiting == true }

    /// The lowest rate that applies now, this limiter's or one it is nested within; nil when none limits.
    public var limitingRate: Int64? {
        let own = isEnabled ? bytesPerSecond : nil
        switch (own, parent?.limitingRate) {
        case (let a?, let b?): return min(a, b)
        case (let a?, nil), (nil, let a?): return a
        case (nil, nil): return nil
        }
    }

    /// Asks to write `bytes` (≥ 0) at time `now` (seconds, monotonic). Returns nil when they may be written now
    /// (their tokens are spent), else the seconds (> 0, ≤ ``maximumWait``) to wait before asking again with the
    /// same chunk. A `now` earlier than one already seen adds no tokens.
    public func take(_ bytes: Int, now: Double) -> Double? {
        precondition(bytes >= 0, "RateLimiter: negative byte count")
        guard enabled.load(ordering: .relaxed) else { return parent?.take(bytes, now: now) }
        if let wait = takeOwn(bytes, now: now) { return wait }
        guard let parent, let wait = parent.take(bytes, now: now) else { return nil }
        // The outer limit has no room: this one's tokens go back, the chunk is asked for again later.
        state.withLock {
            $0.tokens = min(Double($0.burst), $0.tokens + Double(bytes))
            $0.taken -= Int64(bytes)
        }
        return wait
    }

    /// The bytes this limiter has let through so far (while enabled).
    var bytesTaken: Int64 { state.withLock { $0.taken } }

    private func takeOwn(_ bytes: Int, now: Double) -> Double? {
        state.withLock { s -> Double? in
            if let last = s.last {
                if now > last {
                    s.tokens = min(Double(s.burst), s.tokens + (now - last) * Double(s.rate))
                    s.last = now
                }
            } else {
                s.last = now
            }
            guard bytes > 0 else { return nil }
            // A chunk larger than the bucket only needs a full one.
            let needed = min(Double(bytes), Double(s.burst))
            // Half a byte of slack: after waiting exactly the returned time, rounding must not ask for a
            // vanishingly short second wait.
            if s.tokens + 0.5 >= needed {
                s.tokens -= Double(bytes)
                s.taken += Int64(bytes)
                return nil
            }
            return min((needed - s.tokens) / Double(s.rate), Self.maximumWait)
        }
    }

    /// Parses a rate in bytes per second: a size as ``ByteSize/parse(_:)`` reads it (`500K`, `1.5M`, `800`, `2MiB`),
    /// then an optional `/s`, case-insensitive (`64KB/s`). Nil for zero, negatives, anything else, or more than
    /// `Int64.max`.
    public static func parse(_ text: String) -> Int64? {
        let perSecond = text.utf8.count >= 2 && text.lowercased().hasSuffix("/s")
        return ByteSize.parse(perSecond ? String(text.dropLast(2)) : text)
    }
}
