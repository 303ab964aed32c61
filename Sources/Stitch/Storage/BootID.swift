import Foundation

/// The kernel's id for the current boot. A state file records it: the page cache (and so the cheap
/// *written* record) survives a process crash but not a reboot, so after a reboot only the durable
/// extent is trusted.
enum BootID {
    static let current: String = {
        let raw = (try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)) ?? "unknown"
        return raw.trimmingCharacters(in: .whitespacesAndNewlines)
    }()
}
