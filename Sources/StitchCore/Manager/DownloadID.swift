/// Identifies one download of a download manager, for as long as the manager's catalog keeps it.
///
/// A 64-bit value written as 16 lowercase hexadecimal digits, zero-padded (the format of aria2's GIDs), for
/// example `00f3a9c27d1e4b08`. New identifiers come from ``random()``, which never returns zero.
///
/// In JSON (`Codable`) an identifier is that 16-digit string rather than a number, because JSON readers that use
/// doubles cannot hold every 64-bit value.
public struct DownloadID: Hashable, Sendable, Comparable, Codable, CustomStringConvertible, LosslessStringConvertible {
    /// The 64-bit value.
    public let rawValue: UInt64

    /// Wraps a 64-bit value.
    public init(rawValue: UInt64) {
        self.rawValue = rawValue
    }

    /// Parses 1 to 16 hexadecimal digits (either case), with no sign, prefix or spaces.
    ///
    /// - Parameter description: The text, as ``description`` writes it.
    /// - Returns: `nil` if `description` is empty, longer than 16 characters, or has a non-hexadecimal character.
    public init?(_ description: String) {
        let utf8 = description.utf8
        guard (1...16).contains(utf8.count) else { return nil }
        var value: UInt64 = 0
        for byte in utf8 {
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: return nil
            }
            value = value << 4 | UInt64(digit)
        }
        self.rawValue = value
    }

    /// A new identifier from the system's random number generator; never zero.
    public static func random() -> DownloadID {
        var generator = SystemRandomNumberGenerator()
        return random(using: &generator)
    }

    /// A new identifier drawn from `generator`; never zero.
    ///
    /// - Parameter generator: The source of randomness (a seeded one in tests).
    public static func random(using generator: inout some RandomNumberGenerator) -> DownloadID {
        while true {
            let value = generator.next()
            if value != 0 { return DownloadID(rawValue: value) }
        }
    }

    /// 16 lowercase hexadecimal digits, zero-padded.
    public var description: String {
        let digits: [UInt8] = Array("0123456789abcdef".utf8)
        return String(unsafeUninitializedCapacity: 16) { buffer in
            for index in 0..<16 {
                buffer[index] = digits[Int(truncatingIfNeeded: rawValue >> UInt64(60 - 4 * index)) & 0xF]
            }
            return 16
        }
    }

    /// Orders by the 64-bit value (the same order as the 16-digit strings).
    public static func < (lhs: DownloadID, rhs: DownloadID) -> Bool {
        lhs.rawValue < rhs.rawValue
    }

    /// Decodes from a single string of 1 to 16 hexadecimal digits, as ``init(_:)`` parses it.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        guard let id = DownloadID(text) else {
            throw DecodingError.dataCorruptedError(
                in: container, debugDescription: "\"\(text)\" is not a download ID (1 to 16 hexadecimal digits)")
        }
        self = id
    }

    /// Encodes as the single string ``description``.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}
