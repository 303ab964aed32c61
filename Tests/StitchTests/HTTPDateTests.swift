import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport

@Suite struct HTTPDateTests {
    /// 2023-11-14T22:13:20Z.
    static let now: Int64 = 1_700_000_000

    // MARK: The three RFC 9110 formats

    @Test(arguments: [
        "Sun, 06 Nov 1994 08:49:37 GMT",  // IMF-fixdate
        "Sunday, 06-Nov-94 08:49:37 GMT",  // obsolete RFC 850
        "Sun Nov  6 08:49:37 1994",  // ANSI C asctime()
    ])
    func rfc9110Examples(text: String) {
        #expect(HTTPDate.parse(text, now: Self.now) == 784_111_777)
        #expect(HTTPDate.parse(text) == 784_111_777)
    }

    @Test(
        arguments: [
            ("Thu, 01 Jan 1970 00:00:00 GMT", 0),
            ("Wed, 31 Dec 1969 23:59:59 GMT", -1),
            ("Fri, 31 Dec 1999 23:59:59 GMT", 946_684_799),
            ("Tue, 19 Jan 2038 03:14:08 GMT", 2_147_483_648),
            ("Fri, 31 Dec 9999 23:59:59 GMT", 253_402_300_799),
            ("Sat, 01 Jan 0000 00:00:00 GMT", -62_167_219_200),
            // Leap years: 2024 (÷4), 2000 (÷400).
            ("Thu, 29 Feb 2024 12:00:00 GMT", 1_709_208_000),
            ("Tue, 29 Feb 2000 00:00:00 GMT", 951_782_400),
            // Non-leap centuries: the day after 28 Feb is 1 Mar.
            ("Thu, 01 Mar 1900 00:00:00 GMT", -2_203_891_200),
            ("Mon, 01 Mar 2100 00:00:00 GMT", 4_107_542_400),
        ] as [(String, Int64)])
    func imfFixdate(text: String, expected: Int64) {
        #expect(HTTPDate.parse(text, now: Self.now) == expected)
        #expect(HTTPDate.format(expected) == text)
    }

    @Test(
        arguments: [
            ("Thursday, 29-Feb-24 12:00:00 GMT", 1_709_208_000),
            ("Tuesday, 29-Feb-00 00:00:00 GMT", 951_782_400),
            ("Friday, 31-Dec-99 23:59:59 GMT", 946_684_799),
            ("Sunday, 06-Nov-1994 08:49:37 GMT", 784_111_777),  // four-digit year, as in old cookies
            ("Sat, 06-Nov-76 08:49:37 GMT", 216_118_177),  // short weekday
        ] as [(String, Int64)])
    func rfc850(text: String, expected: Int64) {
        #expect(HTTPDate.parse(text, now: Self.now) == expected)
    }

    @Test func rfc850TwoDigitYearWindow() {
        let in2023 = Self.now
        // 74 → 2074 would be 51 years ahead of 2023, so it means 1974.
        #expect(
            HTTPDate.parse("Wednesday, 06-Nov-74 00:00:00 GMT", now: in2023)
                == HTTPDate.parse("Wed, 06 Nov 1974 00:00:00 GMT"))
        #expect(
            HTTPDate.parse("Monday, 06-Nov-73 00:00:00 GMT", now: in2023)
                == HTTPDate.parse("Mon, 06 Nov 2073 00:00:00 GMT"))
        // Near a century boundary the window moves with "now".
        let in2099: Int64 = 4_070_908_800  // 2099-01-01
        #expect(
            HTTPDate.parse("Monday, 01-Jan-01 00:00:00 GMT", now: in2099)
                == HTTPDate.parse("Sat, 01 Jan 2101 00:00:00 GMT"))
        #expect(
            HTTPDate.parse("Monday, 01-Jan-60 00:00:00 GMT", now: in2099)
                == HTTPDate.parse("Thu, 01 Jan 2060 00:00:00 GMT"))
    }

    @Test(
        arguments: [
            ("Thu Feb 29 12:00:00 2024", 1_709_208_000),
            ("Thu Jan  1 00:00:00 1970", 0),
            ("Thu Jan 1 00:00:00 1970", 0),
            ("Fri Dec 31 23:59:59 1999", 946_684_799),
        ] as [(String, Int64)])
    func asctime(text: String, expected: Int64) {
        #expect(HTTPDate.parse(text, now: Self.now) == expected)
    }

    @Test(arguments: [
        "  Sun, 06 Nov 1994 08:49:37 GMT  ",
        "Sun, 06 Nov 1994 08:49:37 GMT\r\n",
        "sun, 06 nov 1994 08:49:37 gmt",
        "SUN,  06  NOV  1994  08:49:37  GMT",
        "Sun,\t06 Nov 1994 08:49:37 GMT",
        "Sun, 6 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 08:49:37 UT",
        "06 Nov 1994 08:49:37 GMT",  // IMF without the optional weekday
        "Mon, 06 Nov 1994 08:49:37 GMT",  // wrong weekday is tolerated
        "Sunday, 06 Nov 1994 08:49:37 GMT",  // long weekday in IMF layout
    ])
    func lenientVariants(text: String) {
        #expect(HTTPDate.parse(text, now: Self.now) == 784_111_777)
    }

    @Test func leapSecondRollsOver() {
        #expect(HTTPDate.parse("Sat, 31 Dec 2016 23:59:60 GMT", now: Self.now) == 1_483_228_800)
    }

    @Test(arguments: [
        "",
        "   ",
        "garbage",
        "Sun, 06 Nov 1994 08:49:37",  // no zone
        "Sun, 06 Nov 1994 08:49:37 PST",
        "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 06 Nov 1994 08:49:37 GMT extra",
        "Sun, 06 Nov 94 08:49:37 GMT",  // IMF needs four digits
        "Sun, 06 Nov 19940 08:49:37 GMT",
        "Sun, 006 Nov 1994 08:49:37 GMT",
        "Sun, 06 Foo 1994 08:49:37 GMT",
        "Xyz, 06 Nov 1994 08:49:37 GMT",
        "Sun 06 Nov 1994 08:49:37 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 31 Nov 1994 08:49:37 GMT",
        "Sun, 32 Jan 1994 08:49:37 GMT",
        "Sun, 29 Feb 2023 00:00:00 GMT",  // not a leap year
        "Sun, 29 Feb 1900 00:00:00 GMT",  // century, not a leap year
        "Sun, 29 Feb 2100 00:00:00 GMT",
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:60:00 GMT",
        "Sun, 06 Nov 1994 08:49:61 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun, 06 Nov 1994 08:49 GMT",
        "Sun, 06 Nov 1994 08-49-37 GMT",
        "Sun, -6 Nov 1994 08:49:37 GMT",
        "Sun, +6 Nov 1994 08:49:37 GMT",
        "Sun, ٠٦ Nov 1994 08:49:37 GMT",  // non-ASCII digits
        "Sunday, 06-Nov-9 08:49:37 GMT",
        "Sunday, 06-Nov-994 08:49:37 GMT",
        "Sunday, 06-Nov 08:49:37 GMT",
        "Sunday, 06-Nov-94-1 08:49:37 GMT",
        "Sunday, 31-Apr-94 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37",
        "Sun Nov  6 08:49:37",
        "Sun Nov  6 08:49:37 94",
        "Sun Nov 31 08:49:37 1994",
        "Sun Nov  6 08:49:37 1994 GMT",
        "Nov  6 08:49:37 1994",
        "1994-11-06T08:49:37Z",
        "784111777",
    ])
    func invalid(text: String) {
        #expect(HTTPDate.parse(text, now: Self.now) == nil)
    }

    // MARK: Formatting and calendar arithmetic

    @Test func formatExamples() {
        #expect(HTTPDate.format(784_111_777) == "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(HTTPDate.format(0) == "Thu, 01 Jan 1970 00:00:00 GMT")
        #expect(HTTPDate.format(-62_167_219_200 - 1) == "Fri, 31 Dec -0001 23:59:59 GMT")
        #expect(HTTPDate.format(253_402_300_800) == "Sat, 01 Jan 10000 00:00:00 GMT")
        // Extremes do not trap.
        #expect(!HTTPDate.format(.max).isEmpty)
        #expect(!HTTPDate.format(.min).isEmpty)
    }

    @Test func roundTripsAcrossCenturies() {
        // Every 7919 * 3607 seconds (an odd stride that hits all times of day and weekdays) from 1600 to 2400.
        var seconds: Int64 = -11_676_096_000
        let end: Int64 = 13_569_465_600
        let stride: Int64 = 7919 * 3607
        var count = 0
        while seconds < end {
            let text = HTTPDate.format(seconds)
            #expect(HTTPDate.parse(text, now: Self.now) == seconds, "\(seconds) → \(text)")
            seconds += stride
            count += 1
        }
        #expect(count > 800)
    }

    @Test func civilConversionIsConsistentDayByDay() {
        // Days from 1600-03-01 through 2400-12-31: each consecutive day advances the calendar by exactly one day.
        var days = HTTPDate.days(fromCivilYear: 1600, month: 3, day: 1)
        var (year, month, day): (Int64, Int64, Int64) = (1600, 3, 1)
        var mismatches = 0
        while year <= 2400 {
            let civil = HTTPDate.civil(fromDays: days)
            if civil != (year, month, day) || HTTPDate.days(fromCivilYear: year, month: month, day: day) != days {
                mismatches += 1
            }
            days += 1
            day += 1
            if day > HTTPDate.daysInMonth(year: year, month: month) {
                day = 1
                month += 1
                if month > 12 {
                    month = 1
                    year += 1
                }
            }
        }
        #expect(mismatches == 0)
    }

    @Test func leapYears() {
        #expect(HTTPDate.isLeapYear(2024))
        #expect(HTTPDate.isLeapYear(2000))
        #expect(HTTPDate.isLeapYear(1600))
        #expect(!HTTPDate.isLeapYear(2023))
        #expect(!HTTPDate.isLeapYear(1900))
        #expect(!HTTPDate.isLeapYear(2100))
    }

    // MARK: Retry-After

    @Test(
        arguments: [
            ("120", 120),
            ("0", 0),
            (" 5 ", 5),
            ("007", 7),
            ("99999999999999999999999", Int64.max),  // saturates
        ] as [(String, Int64)])
    func retryAfterDeltaSeconds(header: String, expected: Int64) {
        #expect(HTTPDate.retryAfterDelay(header, now: Self.now) == expected)
    }

    @Test func retryAfterDate() {
        let now: Int64 = 784_111_777 - 90
        #expect(HTTPDate.retryAfterDelay("Sun, 06 Nov 1994 08:49:37 GMT", now: now) == 90)
        #expect(HTTPDate.retryAfterDelay("Sunday, 06-Nov-94 08:49:37 GMT", now: now) == 90)
        #expect(HTTPDate.retryAfterDelay("Sun Nov  6 08:49:37 1994", now: now) == 90)
        #expect(HTTPDate.retryAfterDelay("Sun, 06 Nov 1994 08:49:37 GMT", now: 784_111_777) == 0)
    }

    @Test func retryAfterDateInThePastIsZero() {
        #expect(HTTPDate.retryAfterDelay("Sun, 06 Nov 1994 08:49:37 GMT", now: Self.now) == 0)
        #expect(HTTPDate.retryAfterDelay("Thu, 01 Jan 1970 00:00:00 GMT", now: .max) == 0)
        #expect(HTTPDate.retryAfterDelay("Fri, 31 Dec 9999 23:59:59 GMT", now: .min) == .max)
    }

    @Test(arguments: ["", "  ", "-5", "+5", "1.5", "5s", "soon", "120 seconds", "0x10", "Sun, 06 Nov 1994", "١٢٠"])
    func retryAfterGarbage(header: String) {
        #expect(HTTPDate.retryAfterDelay(header, now: Self.now) == nil)
    }
}
