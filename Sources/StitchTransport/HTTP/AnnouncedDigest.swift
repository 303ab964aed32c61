// Digests a server announces for the file it sends: RFC 9530's `Repr-Digest` and `Content-Digest` (structured
// dictionaries of byte sequences, `sha-256=:BASE64:`) and RFC 3230's older `Digest` (`SHA-256=BASE64`).

/// A digest of the whole file that a response announced, in one of the algorithms that can prove it (SHA-256,
/// SHA-512; RFC 9530 calls MD5 and SHA-1 insecure, and they are not taken from a server).
package struct AnnouncedDigest: Codable, Sendable, Hashable {
    /// `sha-256` or `sha-512`.
    package var algorithm: String
    /// The digest, lowercase hex.
    package var hex: String
    /// The header field it came from: `Repr-Digest`, `Content-Digest` or `Digest`.
    package var field: String

    /// A digest with these values.
    package init(algorithm: String, hex: String, field: String) {
        self.algorithm = algorithm
        self.hex = hex
        self.field = field
    }

    /// `algorithm=hex`, as `--checksum` takes it.
    package var text: String { "\(algorithm)=\(hex)" }

    /// The digest of the whole file a final response head announces, if any: `Repr-Digest` (on a 200 or a 206, it
    /// describes the whole representation), else on a 200 `Content-Digest` (the content is the representation:
    /// the body is never encoded, `Accept-Encoding: identity`), else on a 200 `Digest`. Of several algorithms the strongest
    /// (SHA-512, then SHA-256); a value that does not decode to the algorithm's length is not taken.
    package init?(from head: ResponseHead) {
        func values(_ name: String) -> String? {
            let all = head.headers.values(name)
            return all.isEmpty ? nil : all.joined(separator: ",")
        }
        var candidates: [(field: String, found: [String: [UInt8]])] = []
        if let repr = values("repr-digest") { candidates.append(("Repr-Digest", Self.dictionary(repr))) }
        if head.status == 200, let content = values("content-digest") {
            candidates.append(("Content-Digest", Self.dictionary(content)))
        }
        // RFC 3230's Digest was computed over the message body by some (HTTP signatures): on a 206 it may be the
        // part's, so it is taken from a 200 only.
        if head.status == 200, let legacy = values("digest") { candidates.append(("Digest", Self.legacy(legacy))) }
        for (field, found) in candidates {
            for (algorithm, length) in [("sha-512", 64), ("sha-256", 32)] {
                if let bytes = found[algorithm], bytes.count == length {
                    self.init(algorithm: algorithm, hex: Self.hex(bytes), field: field)
                    return
                }
            }
        }
        return nil
    }

    /// The digest a 206's `Content-Digest` gives for the bytes of that response alone (its part of the file).
    package static func part(of head: ResponseHead) -> AnnouncedDigest? {
        guard head.status == 206 else { return nil }
        let all = head.headers.values("content-digest")
        guard !all.isEmpty else { return nil }
        let found = dictionary(all.joined(separator: ","))
        for (algorithm, length) in [("sha-512", 64), ("sha-256", 32)] {
            if let bytes = found[algorithm], bytes.count == length {
                return AnnouncedDigest(algorithm: algorithm, hex: hex(bytes), field: "Content-Digest")
            }
        }
        return nil
    }

    /// The members of an RFC 8941 dictionary whose values are byte sequences (`key=:BASE64:`, parameters after
    /// `;` ignored), by lowercase key. Members that do not parse are left out.
    static func dictionary(_ text: String) -> [String: [UInt8]] {
        var found: [String: [UInt8]] = [:]
        for member in text.split(separator: ",") {
            guard let equals = member.firstIndex(of: "=") else { continue }
            let key = String(member[..<equals]).trimming(" \t").lowercased()
            var value = Substring(String(member[member.index(after: equals)...]).trimming(" \t"))
            if let semicolon = value.firstIndex(of: ";") { value = value[..<semicolon] }
            guard value.count >= 2, value.first == ":", value.last == ":",
                let bytes = base64(value.dropFirst().dropLast())
            else { continue }
            if found[key] == nil { found[key] = bytes }
        }
        return found
    }

    /// The members of an RFC 3230 `Digest` field (`SHA-256=BASE64`, algorithm names in any case), by lowercase name.
    static func legacy(_ text: String) -> [String: [UInt8]] {
        var found: [String: [UInt8]] = [:]
        for member in text.split(separator: ",") {
            guard let equals = member.firstIndex(of: "=") else { continue }
            let key = String(member[..<equals]).trimming(" \t").lowercased()
            let value = Substring(String(member[member.index(after: equals)...]).trimming(" \t"))
            guard let bytes = base64(value) else { continue }
            if found[key] == nil { found[key] = bytes }
        }
        return found
    }

    /// Decodes standard base64 (RFC 4648 §4; padding optional); nil for any other character.
    static func base64(_ text: Substring) -> [UInt8]? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count * 3 / 4)
        var buffer: UInt32 = 0
        var bits = 0
        var padding = 0
        for c in text.utf8 {
            let value: UInt32
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): value = UInt32(c - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = UInt32(c - UInt8(ascii: "a")) + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = UInt32(c - UInt8(ascii: "0")) + 52
            case UInt8(ascii: "+"): value = 62
            case UInt8(ascii: "/"): value = 63
            case UInt8(ascii: "="):
                padding += 1
                continue
            default: return nil
            }
            guard padding == 0 else { return nil }  // nothing after the padding
            buffer = (buffer << 6) | value
            bits += 6
            if bits >= 8 {
                bits -= 8
                bytes.append(UInt8((buffer >> UInt32(bits)) & 0xFF))
            }
        }
        guard padding <= 2 else { return nil }
        return bytes
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
