// Checksums for verifying downloads: algorithm names, expected digests ("sha-256=<hex>") and incremental hashing
// through the platform's hash functions (Support/DigestContext.swift: OpenSSL's EVP interface on Linux).

// MARK: - ChecksumAlgorithm

/// A hash algorithm that can verify a download.
public struct ChecksumAlgorithm: Sendable, Hashable, CustomStringConvertible {
    enum Kind: Sendable, Hashable {
        case sha256, sha1, sha512, md5
    }

    let kind: Kind

    /// SHA-256 (32-byte digest). The recommended choice.
    public static let sha256 = ChecksumAlgorithm(kind: .sha256)
    /// SHA-1 (20-byte digest). Broken for collision resistance; only for matching published legacy checksums.
    public static let sha1 = ChecksumAlgorithm(kind: .sha1)
    /// SHA-512 (64-byte digest).
    public static let sha512 = ChecksumAlgorithm(kind: .sha512)
    /// MD5 (16-byte digest). Broken; only for matching published legacy checksums.
    public static let md5 = ChecksumAlgorithm(kind: .md5)

    /// Every supported algorithm, strongest first.
    public static let allCases: [ChecksumAlgorithm] = [.sha256, .sha512, .sha1, .md5]

    init(kind: Kind) {
        self.kind = kind
    }

    /// Looks an algorithm up by name, ignoring case, surrounding whitespace, `-` and `_`.
    ///
    /// Accepts for example `sha-256`, `sha256`, `SHA-256`, `sha_256`, `sha-1`, `sha1`, `sha-512`, `sha512`, `md5`.
    /// Returns `nil` for anything else.
    public init?(name: String) {
        let normalized = String(
            name.lowercased().unicodeScalars.filter { $0 != "-" && $0 != "_" && !$0.properties.isWhitespace })
        switch normalized {
        case "sha256": kind = .sha256
        case "sha1": kind = .sha1
        case "sha512": kind = .sha512
        case "md5": kind = .md5
        default: return nil
        }
    }

    /// The canonical name: `sha-256`, `sha-1`, `sha-512` or `md5` (the names of the IANA hash function registry
    /// used by HTTP `Digest` fields).
    public var name: String {
        switch kind {
        case .sha256: "sha-256"
        case .sha1: "sha-1"
        case .sha512: "sha-512"
        case .md5: "md5"
        }
    }

    /// The digest size in bytes (32, 20, 64 or 16).
    public var digestLength: Int {
        switch kind {
        case .sha256: 32
        case .sha1: 20
        case .sha512: 64
        case .md5: 16
        }
    }

    /// Same as ``name``.
    public var description: String { name }
}

// MARK: - ChecksumParseError

/// Why a checksum specification such as `sha-256=<hex>` could not be parsed. ``message`` is meant for users.
public struct ChecksumParseError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A human-readable explanation, e.g. `sha-256 digest must be 64 hex digits, got 12`.
    public let message: String

    /// Creates an error with a human-readable message.
    public init(_ message: String) {
        self.message = message
    }

    /// Same as ``message``.
    public var description: String { message }
}

// MARK: - ExpectedChecksum

/// The digest a download is expected to have, written `algorithm=hex` (e.g. `sha-256=ba7816bf…`).
///
/// Encodes to and decodes from that single string with `Codable`.
public struct ExpectedChecksum: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The hash algorithm.
    public let algorithm: ChecksumAlgorithm
    /// The expected digest; always exactly `algorithm.digestLength` bytes.
    public let digest: [UInt8]

    /// Creates an expected checksum from raw digest bytes.
    /// - Throws: ``ChecksumParseError`` if `digest` does not have `algorithm.digestLength` bytes.
    public init(algorithm: ChecksumAlgorithm, digest: [UInt8]) throws(ChecksumParseError) {
        guard digest.count == algorithm.digestLength else {
            throw ChecksumParseError(
                "\(algorithm.name) digest must be \(algorithm.digestLength) bytes, got \(digest.count)")
        }
        self.algorithm = algorithm
        self.digest = digest
    }

    /// Parses `algorithm=hex`, e.g. `sha-256=ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad`.
    ///
    /// The algorithm name is matched as by ``ChecksumAlgorithm/init(name:)``; `:` is accepted in place of `=`
    /// (`sha256:…`); hex digits may be upper or lower case; surrounding whitespace is ignored.
    ///
    /// - Throws: ``ChecksumParseError`` with a message suitable for showing to a user, e.g.
    ///   `unknown checksum algorithm 'crc9'; use sha-256, sha-512, sha-1 or md5` or
    ///   `sha-256 digest must be 64 hex digits, got 12`.
    public init(parsing text: String) throws(ChecksumParseError) {
        let trimmed = Self.trimmingWhitespace(text)
        guard let separator = trimmed.firstIndex(where: { $0 == "=" || $0 == ":" }), separator > trimmed.startIndex
        else {
            throw ChecksumParseError(
                "checksum '\(trimmed)' must have the form <algorithm>=<hex digest>, e.g. sha-256=<64 hex digits>")
        }
        let algorithmName = Self.trimmingWhitespace(trimmed[..<separator])
        guard let algorithm = ChecksumAlgorithm(name: algorithmName) else {
            throw ChecksumParseError(
                "unknown checksum algorithm '\(algorithmName)'; use sha-256, sha-512, sha-1 or md5")
        }
        let hexText = Self.trimmingWhitespace(trimmed[trimmed.index(after: separator)...])
        if let bad = hexText.first(where: { !($0.isASCII && $0.isHexDigit) }) {
            throw ChecksumParseError("\(algorithm.name) digest must be hexadecimal, found '\(bad)'")
        }
        let expectedDigits = algorithm.digestLength * 2
        guard hexText.utf8.count == expectedDigits, let digest = Self.bytes(fromHex: hexText) else {
            throw ChecksumParseError(
                "\(algorithm.name) digest must be \(expectedDigits) hex digits, got \(hexText.count)")
        }
        self.algorithm = algorithm
        self.digest = digest
    }

    /// The digest as lowercase hex.
    public var hex: String { Self.hexString(digest) }

    /// `algorithm=hex`, e.g. `sha-256=ba7816bf…`; parses back with ``init(parsing:)``.
    public var description: String { "\(algorithm.name)=\(hex)" }

    /// Whether `computed` equals the expected digest.
    public func matches(_ computed: [UInt8]) -> Bool {
        computed == digest
    }

    /// Decodes from a single string in the ``init(parsing:)`` format.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        do {
            try self.init(parsing: text)
        } catch {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: error.message)
        }
    }

    /// Encodes as the single string ``description``.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }

    /// Lowercase hex of arbitrary bytes, e.g. for showing a computed digest next to an expected one.
    public static func hexString(_ bytes: [UInt8]) -> String {
        let digits: StaticString = "0123456789abcdef"
        return String(unsafeUninitializedCapacity: bytes.count * 2) { buffer in
            digits.withUTF8Buffer { table in
                for (index, byte) in bytes.enumerated() {
                    buffer[2 * index] = table[Int(byte >> 4)]
                    buffer[2 * index + 1] = table[Int(byte & 0x0F)]
                }
            }
            return bytes.count * 2
        }
    }

    /// Decodes an even-length hex string, or returns `nil`.
    static func bytes(fromHex hex: String) -> [UInt8]? {
        let utf8 = Array(hex.utf8)
        guard utf8.count % 2 == 0 else { return nil }
        var result: [UInt8] = []
        result.reserveCapacity(utf8.count / 2)
        var index = 0
        while index < utf8.count {
            guard let high = FileNaming.hexValue(utf8[index]), let low = FileNaming.hexValue(utf8[index + 1]) else {
                return nil
            }
            result.append(high << 4 | low)
            index += 2
        }
        return result
    }

    static func trimmingWhitespace(_ text: some StringProtocol) -> String {
        guard let first = text.firstIndex(where: { !$0.isWhitespace }),
            let last = text.lastIndex(where: { !$0.isWhitespace })
        else { return "" }
        return String(text[first...last])
    }
}

// MARK: - DigestHasher

/// Incrementally hashes data with the platform's hash functions: OpenSSL's EVP interface (libcrypto) on Linux,
/// CryptoKit on Apple platforms.
///
/// Feed bytes with ``update(_:)-(UnsafeRawBufferPointer)`` as they arrive, then call ``finalize()``. Bytes are
/// passed straight to the hash functions without copying. Not thread-safe: use one hasher per download.
///
/// The context is created in `init` and freed when the hasher goes. Initialization traps only if the platform
/// cannot set the algorithm up at all (out of memory, or the algorithm disabled by a FIPS policy).
public final class DigestHasher {
    /// The algorithm this hasher computes.
    public let algorithm: ChecksumAlgorithm
    private let context: DigestContext

    /// Creates a hasher ready to receive data.
    public init(_ algorithm: ChecksumAlgorithm) {
        self.algorithm = algorithm
        self.context = DigestContext(algorithm.kind)
    }

    /// Adds bytes to the running digest. An empty buffer is a no-op.
    public func update(_ buffer: UnsafeRawBufferPointer) {
        guard let base = buffer.baseAddress, !buffer.isEmpty else { return }
        context.update(base, count: buffer.count)
    }

    /// Adds bytes to the running digest.
    public func update(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { update($0) }
    }

    /// Returns the digest of everything added since creation or the last ``reset()`` / `finalize()`, and resets the
    /// hasher so it can be reused for new data.
    public func finalize() -> [UInt8] {
        let length = algorithm.digestLength
        let digest = [UInt8](unsafeUninitializedCapacity: length) { buffer, initializedCount in
            context.finish(into: buffer.baseAddress!, length: length)
            initializedCount = length
        }
        context.restart()
        return digest
    }

    /// Discards everything added so far.
    public func reset() {
        context.restart()
    }

    /// One-shot digest of `buffer`.
    public static func digest(_ algorithm: ChecksumAlgorithm, of buffer: UnsafeRawBufferPointer) -> [UInt8] {
        let hasher = DigestHasher(algorithm)
        hasher.update(buffer)
        return hasher.finalize()
    }

    /// One-shot digest of `bytes`.
    public static func digest(_ algorithm: ChecksumAlgorithm, of bytes: [UInt8]) -> [UInt8] {
        bytes.withUnsafeBytes { digest(algorithm, of: $0) }
    }
}

/// `DigestHasher` owns mutable C state and must not be shared between concurrency domains.
@available(*, unavailable)
extension DigestHasher: Sendable {}
