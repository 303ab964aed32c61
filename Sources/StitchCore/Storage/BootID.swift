import Foundation

/// The kernel's id for the current boot. A state file records it: the page cache (and so the cheap
/// *written* record) survives a process crash but not a reboot, so after a reboot only the durable
/// extent is trusted.
enum BootID {
    static let current: String = {
        #if DEBUG
        // Test builds only: the power-cut tests (Tests/StitchCLITests/PowerCutTests.swift) "reboot" a test file
        // system that forgets what was never synced, and the next run must see another boot. A release build never
        // reads this, so nothing in a user's environment can make stitch trust a live record across a real reboot.
        if let id = ProcessInfo.processInfo.environment["STITCH_TEST_BOOT_ID"], !id.isEmpty { return id }
        #endif
        let raw = (try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)) ?? ""
        let id = raw.trimmingCharacters(in: .whitespacesAndNewlines)
        // Unknown: a value no other process shares, so only the durable extent is ever trusted.
        return id.isEmpty ? "unknown-\(UInt64.random(in: 1...UInt64.max))" : id
    }()
}
