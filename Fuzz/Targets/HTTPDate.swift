// Fuzz target: HTTP-date parsing and formatting (`HTTPDate.parse`, `format`) and Retry-After
// (`HTTPDate.retryAfterDelay`, `RetryPolicy.delay`).
//
// Input: the header value; its first 8 bytes also give a time to format.

import Stitch

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTPDate(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let text = input.text
    let nows: [Int64] = [0, 1_764_000_000, -1, Int64.min, Int64.max, input.leadingInt64]

    for now in nows {
        if let seconds = HTTPDate.parse(text, now: now) {
            // Whatever parses formats back to a date that parses to the same instant (for years 0000-9999,
            // the years an IMF-fixdate can hold).
            let formatted = HTTPDate.format(seconds)
            let year = Int64(formatted.split(separator: " ").dropFirst(3).first ?? "") ?? -1
            if (0...9999).contains(year) {
                check(HTTPDate.parse(formatted, now: now) == seconds, "\(text.debugDescription) → \(seconds) → \(formatted)")
            }
        }
        if let delay = HTTPDate.retryAfterDelay(text, now: now) {
            check(delay >= 0, "negative Retry-After delay \(delay) for \(text.debugDescription) at \(now)")
        }
        let policy = RetryPolicy()
        for attempt in [1, 3, Int.max] {
            let wait = policy.delay(attempt: attempt, retryAfter: text, now: now, jitter: 0.5)
            check(wait.isFinite && wait >= 0 && wait <= max(policy.maxRetryAfter, policy.maxDelay), "delay \(wait)")
        }
    }

    // Formatting any instant does not crash and gives something printable.
    let formatted = HTTPDate.format(input.leadingInt64)
    check(!formatted.isEmpty && formatted.hasSuffix(" GMT"), "format gave \(formatted.debugDescription)")
    _ = HTTPDate.parse(text)
    return 0
}
