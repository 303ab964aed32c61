// The seam between `DigestHasher` and the platform's hash functions: OpenSSL's EVP interface (libcrypto, the CCrypto
// module) wherever the package links it, CommonCrypto on Apple platforms. Linux is built and tested here; the
// CommonCrypto branch is written to Apple's documentation and has not been compiled on this project's machines.

#if canImport(CommonCrypto)
import CommonCrypto

/// One running digest in CommonCrypto's context for its algorithm.
final class DigestContext {
    private let kind: ChecksumAlgorithm.Kind
    /// Room for the largest of CommonCrypto's contexts, bound to the algorithm's context type when used.
    private let state: UnsafeMutableRawPointer

    init(_ kind: ChecksumAlgorithm.Kind) {
        self.kind = kind
        let size = max(
            MemoryLayout<CC_SHA256_CTX>.size, MemoryLayout<CC_SHA512_CTX>.size, MemoryLayout<CC_SHA1_CTX>.size,
            MemoryLayout<CC_MD5_CTX>.size)
        state = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 16)
        restart()
    }

    deinit { state.deallocate() }

    func restart() {
        switch kind {
        case .sha256: _ = CC_SHA256_Init(state.assumingMemoryBound(to: CC_SHA256_CTX.self))
        case .sha512: _ = CC_SHA512_Init(state.assumingMemoryBound(to: CC_SHA512_CTX.self))
        case .sha1: _ = CC_SHA1_Init(state.assumingMemoryBound(to: CC_SHA1_CTX.self))
        case .md5: _ = CC_MD5_Init(state.assumingMemoryBound(to: CC_MD5_CTX.self))
        }
    }

    func update(_ bytes: UnsafeRawPointer, count: Int) {
        // CommonCrypto takes a 32-bit length: larger buffers go in pieces.
        var offset = 0
        while offset < count {
            let piece = CC_LONG(min(count - offset, Int(Int32.max)))
            let at = bytes + offset
            switch kind {
            case .sha256: _ = CC_SHA256_Update(state.assumingMemoryBound(to: CC_SHA256_CTX.self), at, piece)
            case .sha512: _ = CC_SHA512_Update(state.assumingMemoryBound(to: CC_SHA512_CTX.self), at, piece)
            case .sha1: _ = CC_SHA1_Update(state.assumingMemoryBound(to: CC_SHA1_CTX.self), at, piece)
            case .md5: _ = CC_MD5_Update(state.assumingMemoryBound(to: CC_MD5_CTX.self), at, piece)
            }
            offset += Int(piece)
        }
    }

    func finish(into digest: UnsafeMutablePointer<UInt8>, length: Int) {
        switch kind {
        case .sha256: _ = CC_SHA256_Final(digest, state.assumingMemoryBound(to: CC_SHA256_CTX.self))
        case .sha512: _ = CC_SHA512_Final(digest, state.assumingMemoryBound(to: CC_SHA512_CTX.self))
        case .sha1: _ = CC_SHA1_Final(digest, state.assumingMemoryBound(to: CC_SHA1_CTX.self))
        case .md5: _ = CC_MD5_Final(digest, state.assumingMemoryBound(to: CC_MD5_CTX.self))
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
