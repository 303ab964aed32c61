// HTTP-date parsing and formatting (RFC 9110 §5.6.7) and Retry-After (RFC 9110 §10.2.3).
//
// Hand-written on purpose: DateFormatter is slow and locale-sensitive. Calendar arithmetic uses Howard Hinnant's
// days-from-civil / civil-from-days algorithms (proleptic Gregorian calendar, UTC, no leap seconds).

#if canImport(Glibc)
    private import Glibc
#elseif canImport(Darwin)
    private import Darwin
#endif

/// Parses and formats HTTP dates as seconds since the Unix epoch (1970-01-01T00:00:00Z).
public enum HTTPDate {

    /// Parses an HTTP-date in any of the three formats RFC 9110 §5.6.7 requires recipients to accept.
    ///
    /// - IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`
    /// - obsolete RFC 850: `Sunday, 06-Nov-94 08:49:37 GMT` (a two-digit year is placed within 50 years of the
    ///   current time; a four-digit year is also accepted)
    /// - ANSI C asctime(): `Sun Nov  6 08:49:37 1994`
    ///
    /// Leniencies: names are matched case-insensitively, runs of spaces/tabs count as one, the weekday is not
    /// checked against the date (but must be a valid name), single-digit days are accepted, the IMF weekday may be
    /// omitted, and the zone may be `GMT`, `UTC` or `UT`. Out-of-range fields (`31 Apr`, `29 Feb` in a non-leap year,
    /// hour 24) and trailing garbage are rejected.
    ///
    /// - Parameter string: The header value.
    /// - Returns: Seconds since the epoch, or `nil` if `string` is not an HTTP-date.
    public static func parse(_ string: String) -> Int64? {
        parse(string, now: currentTime())
    }

    /// Like ``parse(_:)``, with an explicit current time used only to place the two-digit years of RFC 850 dates.
    ///
    /// - Parameters:
    ///   - string: The header value.
    ///   - now: The current time in seconds since the epoch.
    public static func parse(_ string: String, now: Int64) -> Int64? {
        let tokens = Array(string.utf8).split(whereSeparator: isWhitespace)
        guard let first = tokens.first else { return nil }

        if first.last == UInt8(ascii: ",") {
            guard isDayName(first.dropLast()) else { return nil }
            if tokens.count == 4, tokens[1].contains(UInt8(ascii: "-")) {
                return parseRFC850(date: tokens[1], time: tokens[2], zone: tokens[3], now: now)
            }
            guard tokens.count == 6 else { return nil }
            return parseIMF(tokens[1...])
        }
        if tokens.count == 5, isDayName(first) {
            return parseAsctime(tokens[1...])
        }
        if tokens.count == 5, first.allSatisfy(isDigit) {
            return parseIMF(tokens[...])  // IMF-fixdate without the optional weekday
        }
        return nil
    }

    /// Formats seconds since the epoch as an IMF-fixdate, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
    ///
    /// Years outside 0000–9999 cannot be represented in an IMF-fixdate; they are printed with more digits (or a
    /// minus sign) and will not parse back.
    public static func format(_ seconds: Int64) -> String {
        var days = seconds / 86_400
        var secondOfDay = seconds % 86_400
        if secondOfDay < 0 {
            secondOfDay += 86_400
            days -= 1
        }
        let (year, month, day) = civil(fromDays: days)
        var weekday = (days + 4) % 7  // 1970-01-01 was a Thursday.
        if weekday < 0 { weekday += 7 }

        var result = ""
        result.reserveCapacity(29)
        result += shortDayNames[Int(weekday)]
        result += ", "
        result += padded(day, width: 2)
        result += " "
        result += monthNames[Int(month) - 1]
        result += " "
        result += padded(year, width: 4)
        result += " "
        result += padded(secondOfDay / 3600, width: 2)
        result += ":"
        result += padded(secondOfDay / 60 % 60, width: 2)
        result += ":"
        result += padded(secondOfDay % 60, width: 2)
        result += " GMT"
        return result
    }

    /// Interprets a `Retry-After` header value (RFC 9110 §10.2.3) as a delay in seconds.
    ///
    /// - Parameters:
    ///   - header: Either delta-seconds (`120`) or an HTTP-date.
    ///   - now: The current time in seconds since the epoch.
    /// - Returns: The delay in seconds: delta-seconds as given (saturating at `Int64.max`), or the HTTP-date minus
    ///   `now`, clamped at 0 for dates in the past. `nil` if the value is neither form (e.g. `-5`, `soon`, empty).
    public static func retryAfterDelay(_ header: String, now: Int64) -> Int64? {
        let bytes = Array(header.utf8)
        guard let start = bytes.firstIndex(where: { !isWhitespace($0) }),
            let last = bytes.lastIndex(where: { !isWhitespace($0) })
        else { return nil }
        let trimmed = bytes[start...last]
        if trimmed.allSatisfy(isDigit) {
            return number(trimmed, saturating: true)
        }
        guard let date = parse(header, now: now) else { return nil }
        let (delay, overflow) = date.subtractingReportingOverflow(now)
        if overflow { return now < 0 ? Int64.max : 0 }
        return max(0, delay)
    }
}

// MARK: - Calendar arithmetic

extension HTTPDate {

    /// Days since 1970-01-01 of a proleptic Gregorian date (month 1–12).
    static func days(fromCivilYear year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400  // [0, 399]
        let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1  // [0, 365]
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear  // [0, 146096]
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The proleptic Gregorian (year, month 1–12, day 1–31) of a day count since 1970-01-01.
    static func civil(fromDays days: Int64) -> (year: Int64, month: Int64, day: Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097  // [0, 146096]
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365  // [0, 399]
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)  // [0, 365]
        let shiftedMonth = (5 * dayOfYear + 2) / 153  // [0, 11], March-based
        let day = dayOfYear - (153 * shiftedMonth + 2) / 5 + 1
        let month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        return (year, month, day)
    }

    static func isLeapYear(_ year: Int64) -> Bool {
        year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
    }

    static func daysInMonth(year: Int64, month: Int64) -> Int64 {
        switch month {
        case 2: return isLeapYear(year) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }
}

// MARK: - Parsing helpers

extension HTTPDate {
    typealias Bytes = ArraySlice<UInt8>

    static let shortDayNames = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    static let longDayNames = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
    static let monthNames = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    static func currentTime() -> Int64 {
        Int64(time(nil))
    }

    static func isWhitespace(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") || byte == UInt8(ascii: "\r")
            || byte == UInt8(ascii: "\n")
    }

    static func isDigit(_ byte: UInt8) -> Bool {
        byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")
    }

    /// ASCII case-insensitive comparison of `bytes` with an ASCII string.
    static func matches(_ bytes: Bytes, _ name: String) -> Bool {
        bytes.count == name.utf8.count
            && zip(bytes, name.utf8).allSatisfy { byte, expected in
                byte == expected || (isASCIILetter(byte) && (byte ^ 0x20) == expected)
            }
    }

    static func isASCIILetter(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
            || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
    }

    static func isDayName(_ bytes: Bytes) -> Bool {
        shortDayNames.contains { matches(bytes, $0) } || longDayNames.contains { matches(bytes, $0) }
    }

    /// 1–12, or `nil`.
    static func month(_ bytes: Bytes) -> Int64? {
        monthNames.firstIndex { matches(bytes, $0) }.map { Int64($0) + 1 }
    }

    /// A non-negative decimal number made only of ASCII digits. Without `saturating`, more than 18 digits fail.
    static func number(_ bytes: Bytes, saturating: Bool = false) -> Int64? {
        guard !bytes.isEmpty, bytes.allSatisfy(isDigit) else { return nil }
        var value: Int64 = 0
        for byte in bytes {
            let (shifted, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = shifted.addingReportingOverflow(Int64(byte - UInt8(ascii: "0")))
            if overflow1 || overflow2 { return saturating ? Int64.max : nil }
            value = sum
        }
        return value
    }

    static func isGMT(_ bytes: Bytes) -> Bool {
        matches(bytes, "GMT") || matches(bytes, "UTC") || matches(bytes, "UT")
    }

    /// `HH:MM:SS` → seconds into the day (second 60 is allowed for leap seconds and rolls over).
    static func timeOfDay(_ bytes: Bytes) -> Int64? {
        guard bytes.count == 8 else { return nil }
        let base = bytes.startIndex
        guard bytes[base + 2] == UInt8(ascii: ":"), bytes[base + 5] == UInt8(ascii: ":"),
            let hour = number(bytes[base..<base + 2]), let minute = number(bytes[base + 3..<base + 5]),
            let second = number(bytes[base + 6..<base + 8]),
            hour < 24, minute < 60, second <= 60
        else { return nil }
        return hour * 3600 + minute * 60 + second
    }

    /// Validates the calendar fields and combines them into seconds since the epoch.
    static func timestamp(year: Int64, month: Int64, day: Int64, secondOfDay: Int64) -> Int64? {
        guard (1...12).contains(month), day >= 1, day <= daysInMonth(year: year, month: month) else { return nil }
        // Overflow-checked: an RFC 850 two-digit year placed around an extreme `now` can be hundreds of billions of
        // years away, whose seconds do not fit in an Int64 (found by Fuzz/Targets/HTTPDate.swift).
        let (daySeconds, overflow) = days(fromCivilYear: year, month: month, day: day).multipliedReportingOverflow(
            by: 86_400)
        guard !overflow else { return nil }
        let (seconds, carry) = daySeconds.addingReportingOverflow(secondOfDay)
        return carry ? nil : seconds
    }

    /// `DD Mon YYYY HH:MM:SS GMT` (the tokens after the weekday).
    static func parseIMF(_ tokens: ArraySlice<Bytes>) -> Int64? {
        let t = Array(tokens)
        guard t.count == 5, (1...2).contains(t[0].count), let day = number(t[0]), let month = month(t[1]),
            t[2].count == 4, let year = number(t[2]), let time = timeOfDay(t[3]), isGMT(t[4])
        else { return nil }
        return timestamp(year: year, month: month, day: day, secondOfDay: time)
    }

    /// `DD-Mon-YY HH:MM:SS GMT`.
    static func parseRFC850(date: Bytes, time: Bytes, zone: Bytes, now: Int64) -> Int64? {
        let parts = date.split(separator: UInt8(ascii: "-"), omittingEmptySubsequences: false)
        guard parts.count == 3, (1...2).contains(parts[0].count), let day = number(parts[0]),
            let month = month(parts[1]), parts[2].count == 2 || parts[2].count == 4, var year = number(parts[2]),
            let secondOfDay = timeOfDay(time), isGMT(zone)
        else { return nil }
        if parts[2].count == 2 {
            year = expandTwoDigitYear(year, now: now)
        }
        return timestamp(year: year, month: month, day: day, secondOfDay: secondOfDay)
    }

    /// RFC 9110: a two-digit year that would be more than 50 years in the future means the most recent past year
    /// with those digits. Years more than 50 years in the past are likewise moved forward a century.
    static func expandTwoDigitYear(_ twoDigits: Int64, now: Int64) -> Int64 {
        var nowDays = now / 86_400
        if now % 86_400 < 0 { nowDays -= 1 }
        let currentYear = civil(fromDays: nowDays).year
        var century = currentYear / 100
        if currentYear % 100 < 0 { century -= 1 }
        var year = century * 100 + twoDigits
        if year > currentYear + 50 { year -= 100 } else if year <= currentYear - 50 { year += 100 }
        return year
    }

    /// `Mon D HH:MM:SS YYYY` (the tokens after the weekday; the day may be space-padded).
    static func parseAsctime(_ tokens: ArraySlice<Bytes>) -> Int64? {
        let t = Array(tokens)
        guard t.count == 4, let month = month(t[0]), (1...2).contains(t[1].count), let day = number(t[1]),
            let time = timeOfDay(t[2]), t[3].count == 4, let year = number(t[3])
        else { return nil }
        return timestamp(year: year, month: month, day: day, secondOfDay: time)
    }

    /// Zero-padded decimal; negative numbers get a leading minus sign.
    static func padded(_ value: Int64, width: Int) -> String {
        let digits = String(value.magnitude)
        let padding = String(repeating: "0", count: max(0, width - digits.count))
        return (value < 0 ? "-" : "") + padding + digits
    }
}
