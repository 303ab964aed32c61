import Synchronization
import StitchLocks

/// Connections in use per host, shared with the engine's threads (which ask for more when they split).
final class HostSlots: Sendable {
    private let cap: Atomic<Int>
    private let used = Locked<[String: Int]>([:])

    init(cap: Int) { self.cap = Atomic(cap) }

    /// A new cap; connections held above it stay until released.
    func setCap(_ cap: Int) { self.cap.store(cap, ordering: .relaxed) }

    /// Takes up to `count` connections on `host`; returns how many it got (0 when the host is at its cap).
    func acquire(_ host: String, upTo count: Int) -> Int {
        guard count > 0 else { return 0 }
        let cap = cap.load(ordering: .relaxed)
        return used.withLock { used in
            let granted = min(count, cap - used[host, default: 0])
            guard granted > 0 else { return 0 }
            used[host, default: 0] += granted
            return granted
        }
    }

    func release(_ host: String, _ count: Int) {
        used.withLock { used in
            let left = used[host, default: 0] - count
            used[host] = left > 0 ? left : nil
        }
    }

    func inUse(_ host: String) -> Int { used.withLock { $0[host, default: 0] } }
}
