/// Sizes in bytes as people write them: `800`, `1.5M`, `16M`, `512K`, `2GiB`, `64KB`.
public enum ByteSize {
    /// Parses a size in bytes: a decimal number (`800`, `1.5`) with an optional unit `K`, `M`, `G` or `T` (powers
    /// of 1024; `Ki`… also accepted), then an optional `B`, case-insensitive. Fractions of a byte are dropped. Nil
    /// for zero, negatives, anything else, or more than `Int64.max`.
    public static func parse(_ text: String) -> Int64? {
        var chars = Array(text.utf8.lazy.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 })  // ASCII lowercase
        if chars.last == UInt8(ascii: "b") { chars.removeLast() }
        var shift: UInt64 = 0
        let units: [UInt8: UInt64] = [
            UInt8(ascii: "k"): 10, UInt8(ascii: "m"): 20, UInt8(ascii: "g"): 30, UInt8(ascii: "t"): 40,
        ]
        if chars.count >= 2, chars.last == UInt8(ascii: "i"), let unit = units[chars[chars.count - 2]] {
            shift = unit
            chars.removeLast(2)
        } else if let last = chars.last, let unit = units[last] {
            shift = unit
            chars.removeLast()
        }

        // Digits, optionally "." and more digits; all of them form `mantissa`, scaled down by 10^fractionDigits.
        let parts = chars.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 1 || parts.count == 2, parts.allSatisfy({ !$0.isEmpty }) else { return nil }
        var mantissa: UInt64 = 0
        for c in parts.joined() {
            guard c >= UInt8(ascii: "0"), c <= UInt8(ascii: "9") else { return nil }
            let (times10, o1) = mantissa.multipliedReportingOverflow(by: 10)
            let (sum, o2) = times10.addingReportingOverflow(UInt64(c - UInt8(ascii: "0")))
            guard !o1, !o2 else { return nil }
            mantissa = sum
        }
        let fractionDigits = parts.count == 2 ? parts[1].count : 0
        guard fractionDigits <= 18 else { return nil }
        var divisor: UInt64 = 1
        for _ in 0..<fractionDigits { divisor *= 10 }

        let product = mantissa.multipliedFullWidth(by: UInt64(1) << shift)
        guard product.high < divisor else { return nil }  // quotient would not fit in 64 bits
        let (quotient, _) = divisor.dividingFullWidth(product)
        guard quotient > 0, quotient <= UInt64(Int64.max) else { return nil }
        return Int64(quotient)
    }
}
