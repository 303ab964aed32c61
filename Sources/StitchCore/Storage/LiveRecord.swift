import CStitchSystem
import StitchLocks
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The cheap, frequent record of how far each segment of the part file has been *written* (not synced).
///
/// A small file mapped shared into memory, little-endian:
/// `magic u64 | version u64 (2) | nonce u64 | slot count u64 | written[slot count] i64`.
/// Slot *i* is the absolute offset up to which segment *i* of the state file has been written. Updating it is one
/// aligned 8-byte release store into the page cache — no system call — done after every `pwrite`, so it lags
/// the data by nothing. A `kill -9` keeps the page cache, so the next run sees it; a reboot does not, which is
/// why readers trust it only when the state file's boot id is the current one, and only when its nonce matches
/// the state file's (a restart from zero draws a new nonce, so a record from before the restart is never
/// believed). Segments are only ever appended to the state's list, so slot numbers are stable.
final class LiveRecord: Sendable {
    static let magic: UInt64 = 0x5654_4c48_4354_4954
    static let version: UInt64 = 2
    static let headerWords = 4
    /// The most segments one download may have.
    static let slotCount = 256
    static var size: Int { (headerWords + slotCount) * 8 }

    private let fd: Int32
    /// The header's words, then the slots': the file's layout, shared by every thread with atomic loads and stores.
    private let words: AtomicWords

    /// Creates (or replaces) the record at `path` for `nonce` with the given written offsets.
    init(creatingAt path: String, nonce: UInt64, written: [Int64]) throws(DownloadError) {
        let fd = retryingOnInterrupt { open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        guard fd >= 0 else { throw .io("cannot create", path: path, .current) }
        // Written, not just extended: the blocks are allocated now, so a full disk is an error here instead of a
        // SIGBUS at the first store into a sparse mapping.
        // Retrying short writes and `EINTR`, as PartStore.write does.
        let zeros = [UInt8](repeating: 0, count: Self.size)
        var done = 0
        while done < Self.size {
            let n = zeros.withUnsafeBytes { buffer in
                retryingOnInterrupt { pwrite(fd, buffer.baseAddress! + done, buffer.count - done, off_t(done)) }
            }
            if n <= 0 {
                if n == 0 { errno = ENOSPC }
                break
            }
            done += n
        }
        guard done == Self.size,
            ftruncate(fd, off_t(Self.size)) == 0,
            let mapped = mmap(nil, Self.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), mapped != MAP_FAILED
        else {
            let error = Errno.current
            close(fd)
            throw .io("cannot map", path: path, error)
        }
        self.fd = fd
        words = AtomicWords(adopting: mapped, count: Self.headerWords + Self.slotCount) { munmap($0, Self.size) }
        reset(nonce: nonce, written: written)
    }

    /// A record in private memory, for a download too small to be worth a file of its own: the same updates,
    /// nothing for a later run to read (an interrupted small download starts over).
    ///
    /// Heap memory, not an anonymous mapping: unmapping it at the end of each download made the kernel interrupt
    /// every other CPU to flush its TLB, a measurable part of fetching thousands of small files.
    init(anonymousWithNonce nonce: UInt64, written: [Int64]) throws(DownloadError) {
        self.fd = -1
        words = AtomicWords(count: Self.headerWords + Self.slotCount, repeating: 0)
        reset(nonce: nonce, written: written)
    }

    /// Whether the record lives in a file (not in private memory).
    var isFileBacked: Bool { fd >= 0 }

    deinit {
        // The mapping goes with `words` (after this); the file may close first: a mapping outlives its descriptor.
        if fd >= 0 { close(fd) }
    }

    /// Rewrites the record for a new generation of the download (new nonce, new segment list).
    func reset(nonce: UInt64, written: [Int64]) {
        setHeader(2, 0)  // invalid while half-written
        for slot in 0..<Self.slotCount {
            words.store(Self.headerWords + slot, slot < written.count ? written[slot].littleEndian : 0)
        }
        setHeader(0, Self.magic)
        setHeader(1, Self.version)
        setHeader(3, UInt64(Self.slotCount))
        setHeader(2, nonce)
    }

    /// Header word `index` (0 magic, 1 version, 2 nonce, 3 slot count), little-endian.
    private func setHeader(_ index: Int, _ value: UInt64) {
        words.store(index, Int64(bitPattern: value.littleEndian))
    }

    /// Voids the record (nonce 0 matches no state): after a failed sync nothing written may be trusted.
    func invalidate() {
        setHeader(2, 0)
    }

    /// Records that segment `slot` is written up to `offset`. One aligned 8-byte store.
    @inline(__always)
    func store(slot: Int, written offset: Int64) {
        words.store(Self.headerWords + slot, offset.littleEndian)
    }

    @inline(__always)
    func load(slot: Int) -> Int64 {
        Int64(littleEndian: words.load(Self.headerWords + slot))
    }

    /// Reads the written offsets at `path` if its header is intact and carries `nonce`.
    static func read(at path: String, nonce: UInt64) -> [Int64]? {
        let fd = retryingOnInterrupt { open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var words = [UInt64](repeating: 0, count: headerWords + slotCount)
        let count = words.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard count == size,
            UInt64(littleEndian: words[0]) == magic,
            UInt64(littleEndian: words[1]) == version,
            UInt64(littleEndian: words[2]) == nonce,
            UInt64(littleEndian: words[3]) == UInt64(slotCount)
        else { return nil }
        return words[headerWords...].map { Int64(bitPattern: UInt64(littleEndian: $0)) }
    }
}
