// The seam between `DigestHasher` and the platform's hash functions: OpenSSL's EVP interface (libcrypto, the CCrypto
// module) on Linux, CryptoKit on Apple platforms (incremental, and without CommonCrypto's deprecation warnings for
// MD5 and SHA-1). Linux is built and tested here; the CryptoKit branch is written to Apple's documentation and has
// not been compiled on this project's machines.

#if canImport(CryptoKit)
import CryptoKit

/// One running digest in CryptoKit's hash function for its algorithm.
final class DigestContext {
    private enum State {
        case sha256(SHA256)
        case sha512(SHA512)
        case sha1(Insecure.SHA1)
        case md5(Insecure.MD5)
    }

    private let kind: ChecksumAlgorithm.Kind
    private var state: State

    init(_ kind: ChecksumAlgorithm.Kind) {
        self.kind = kind
        state = Self.fresh(kind)
    }

    private static func fresh(_ kind: ChecksumAlgorithm.Kind) -> State {
        switch kind {
        case .sha256: .sha256(SHA256())
        case .sha512: .sha512(SHA512())
        case .sha1: .sha1(Insecure.SHA1())
        case .md5: .md5(Insecure.MD5())
        }
    }

    func restart() { state = Self.fresh(kind) }

    func update(_ bytes: UnsafeRawPointer, count: Int) {
        let buffer = UnsafeRawBufferPointer(start: bytes, count: count)
        switch state {
        case .sha256(var hash):
            hash.update(bufferPointer: buffer)
            state = .sha256(hash)
        case .sha512(var hash):
            hash.update(bufferPointer: buffer)
            state = .sha512(hash)
        case .sha1(var hash):
            hash.update(bufferPointer: buffer)
            state = .sha1(hash)
        case .md5(var hash):
            hash.update(bufferPointer: buffer)
            state = .md5(hash)
        }
    }

    func finish(into digest: UnsafeMutablePointer<UInt8>, length: Int) {
        func copy(_ bytes: some Sequence<UInt8>) {
            var at = 0
            for byte in bytes where at < length {
                digest[at] = byte
                at += 1
            }
            precondition(at == length, "a \(kind) digest of \(at) bytes, not \(length)")
        }
        switch state {
        case .sha256(let hash): copy(hash.finalize())
        case .sha512(let hash): copy(hash.finalize())
        case .sha1(let hash): copy(hash.finalize())
        case .md5(let hash): copy(hash.finalize())
        }
    }
}
#else
import CCrypto

/// One running digest in an OpenSSL `EVP_MD_CTX`.
final class DigestContext {
    private let kind: ChecksumAlgorithm.Kind
    private let context: OpaquePointer

    init(_ kind: ChecksumAlgorithm.Kind) {
        guard let context = EVP_MD_CTX_new() else { fatalError("EVP_MD_CTX_new failed: out of memory") }
        self.kind = kind
        self.context = context
        restart()
    }

    deinit { EVP_MD_CTX_free(context) }

    /// OpenSSL's static `EVP_MD` for the algorithm.
    private var evpMD: OpaquePointer? {
        switch kind {
        case .sha256: EVP_sha256()
        case .sha1: EVP_sha1()
        case .sha512: EVP_sha512()
        case .md5: EVP_md5()
        }
    }

    func restart() {
        guard EVP_DigestInit_ex(context, evpMD, nil) == 1 else {
            fatalError("OpenSSL could not initialize \(kind) (disabled by a FIPS policy?)")
        }
    }

    func update(_ bytes: UnsafeRawPointer, count: Int) {
        let status = EVP_DigestUpdate(context, bytes, count)
        precondition(status == 1, "EVP_DigestUpdate failed for \(kind)")
    }

    func finish(into digest: UnsafeMutablePointer<UInt8>, length: Int) {
        var written: UInt32 = 0
        let status = EVP_DigestFinal_ex(context, digest, &written)
        precondition(status == 1 && Int(written) == length, "EVP_DigestFinal_ex failed for \(kind)")
    }
}
#endif
