import Glibc

/// The cheap, frequent record of how many bytes of the part file have been *written* (not synced).
///
/// A 32-byte file mapped shared into memory: `magic[8] | version u64 | nonce u64 | written u64`, all
/// little-endian. Updating it is one aligned 8-byte store into the page cache — no system call — so it is
/// done after every `pwrite` and lags the data by nothing. A `kill -9` keeps the page cache, so the store is
/// seen by the next run; a reboot does not, which is why readers trust it only when the state file's boot id
/// is the current one, and only when its nonce matches the state file's (a restart from zero draws a new
/// nonce, so a record from before the restart is never believed).
final class LiveRecord: @unchecked Sendable {
    static let size = 32
    static let magic: UInt64 = 0x5654_4c48_4354_4954  // "TITCHLTV" read little-endian; any fixed value works
    static let version: UInt64 = 1

    private let fd: Int32
    private let base: UnsafeMutableRawPointer

    /// Creates (or replaces) the record at `path` with `nonce` and `written`.
    init(creatingAt path: String, nonce: UInt64, written: Int64) throws(DownloadError) {
        let fd = retryingOnInterrupt { open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
        guard fd >= 0 else { throw .io("cannot create", path: path, .current) }
        // Written, not just extended: the block is allocated now, so a full disk is an error here instead of a
        // SIGBUS at the first store into a sparse mapping.
        let zeros = [UInt8](repeating: 0, count: Self.size)
        guard zeros.withUnsafeBytes({ pwrite(fd, $0.baseAddress, $0.count, 0) }) == Self.size,
            let mapped = mmap(nil, Self.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), mapped != MAP_FAILED
        else {
            let error = Errno.current
            close(fd)
            throw .io("cannot map", path: path, error)
        }
        self.fd = fd
        self.base = mapped
        reset(nonce: nonce, written: written)
    }

    deinit {
        munmap(base, Self.size)
        close(fd)
    }

    /// Rewrites the header for a new generation of the download.
    func reset(nonce: UInt64, written: Int64) {
        base.storeBytes(of: 0, toByteOffset: 24, as: UInt64.self)
        base.storeBytes(of: Self.magic.littleEndian, toByteOffset: 0, as: UInt64.self)
        base.storeBytes(of: Self.version.littleEndian, toByteOffset: 8, as: UInt64.self)
        base.storeBytes(of: nonce.littleEndian, toByteOffset: 16, as: UInt64.self)
        store(written: written)
    }

    /// Records that bytes `0..<written` have been handed to the kernel. One aligned 8-byte store.
    @inline(__always)
    func store(written: Int64) {
        base.storeBytes(of: UInt64(written).littleEndian, toByteOffset: 24, as: UInt64.self)
    }

    /// Reads the written extent at `path` if its header is intact and carries `nonce`.
    static func read(at path: String, nonce: UInt64) -> Int64? {
        let fd = retryingOnInterrupt { open(path, O_RDONLY | O_CLOEXEC) }
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var words = [UInt64](repeating: 0, count: 4)
        let count = words.withUnsafeMutableBytes { pread(fd, $0.baseAddress, size, 0) }
        guard count == size,
            UInt64(littleEndian: words[0]) == magic,
            UInt64(littleEndian: words[1]) == version,
            UInt64(littleEndian: words[2]) == nonce
        else { return nil }
        let written = UInt64(littleEndian: words[3])
        return written <= UInt64(Int64.max) ? Int64(written) : nil
    }
}
