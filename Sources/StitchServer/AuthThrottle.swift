import Foundation
import StitchRPC
import StitchLocks

/// Slows down a client that sends wrong secrets, without spending the server's CPU on it: each wrong token from an
/// address pushes that address's next answer further into the future (doubling, from 0.1 s up to `maxDelay`), and
/// every request from the address waits for its turn with its connection suspended (a timer, not a thread).
/// So guesses from one address are answered one per delay however many connections it opens. A right token
/// clears it.
final class AuthThrottle: Sendable {
    struct Entry {
        var failures: Int
        var until: ContinuousClock.Instant
    }

    private let table = Locked<[String: Entry]>([:])
    /// When each address's calls without a token were last logged, and how many went unlogged since.
    private let missingLog = Locked<[String: (last: ContinuousClock.Instant, kept: Int)]>([:])
    let firstDelay: Duration
    let maxDelay: Duration
    /// The longest a request waits for its turn; later ones are refused at once.
    let maxWait: Duration
    /// Addresses remembered at most; the oldest deadline is forgotten first.
    let capacity: Int

    init(
        firstDelay: Duration = .milliseconds(100), maxDelay: Duration = .seconds(5), maxWait: Duration = .seconds(10),
        capacity: Int = 4_096
    ) {
        self.firstDelay = firstDelay
        self.maxDelay = maxDelay
        self.maxWait = maxWait
        self.capacity = capacity
    }

    /// How long a request from `address` must wait before it is handled (zero for most); nil when its turn
    /// would come later than `maxWait` (it is refused at once, and keeps no connection waiting). Once an
    /// address has sent a wrong token (until it sends a right one), each of its requests takes the next free
    /// moment, one delay after the previous one's, so parallel connections do not multiply its guesses.
    func admit(_ address: String) -> Duration? {
        let now = ContinuousClock.now
        return table.withLock { table -> Duration? in
            guard var entry = table[address] else { return .zero }
            // Turns are taken even once the last delay has passed: guesses sent together after a pause are
            // still answered one per delay, not all at once.
            let slot = max(entry.until, now)
            guard slot - now <= maxWait else { return nil }
            entry.until = slot + delay(after: entry.failures)
            table[address] = entry
            return slot - now
        }
    }

    private func delay(after failures: Int) -> Duration {
        var delay = firstDelay
        for _ in 1..<max(1, min(failures, 32)) where delay < maxDelay { delay *= 2 }
        return min(delay, maxDelay)
    }

    /// Records how a request from `address` fared: each wrong token counts; only a right one clears the
    /// address (a request that carried none changes nothing).
    func record(_ address: String, _ reply: Aria2RPC.Reply) {
        let now = ContinuousClock.now
        table.withLock { table in
            guard reply.unauthorized > 0 else {
                if reply.authorized { table[address] = nil }
                return
            }
            var entry = table[address] ?? Entry(failures: 0, until: now)
            entry.failures += reply.unauthorized
            entry.until = max(entry.until, now + delay(after: entry.failures))
            table[address] = entry
            if table.count > capacity {
                let expired = table.filter { $0.value.until <= now }.map(\.key)
                for key in expired { table[key] = nil }
                if table.count > capacity, let oldest = table.min(by: { $0.value.until < $1.value.until }) {
                    table[oldest.key] = nil
                }
            }
        }
    }

    /// Whether calls without a token from `address` are to be logged now: at most once a minute per address,
    /// since they are not slowed down and any client could otherwise write log lines at its request rate. The
    /// answer is how many such requests went unlogged since the last line (nil: not now).
    func logsMissingSecret(_ address: String, every interval: Duration = .seconds(60)) -> Int? {
        let now = ContinuousClock.now
        return missingLog.withLock { log -> Int? in
            if let entry = log[address], now - entry.last < interval {
                log[address] = (entry.last, entry.kept + 1)
                return nil
            }
            let kept = log[address]?.kept ?? 0
            log[address] = (now, 0)
            if log.count > capacity { log = log.filter { now - $0.value.last < interval } }
            return kept
        }
    }
}
