import CStitchSystem

/// A run of aligned 64-bit words that threads share without a lock: each load acquires and each store releases (the
/// C11 atomics of `CStitchSystem`, which ThreadSanitizer sees). Over memory it allocates, or over a mapping it is
/// handed (a file mapped shared, whose layout is the file's) and gives back when it ends.
///
/// `@unchecked Sendable`, reviewed: the words are reached only through ``load(_:)`` and ``store(_:_:)``, both atomic;
/// the pointer and count never change; the memory is given back only in `deinit`, when no thread can reach it.
public final class AtomicWords: @unchecked Sendable {
    private let base: UnsafeMutablePointer<Int64>
    /// How many words.
    public let count: Int
    /// Gives the memory back when this ends (nil: allocated here, deallocated here).
    private let release: (@Sendable (UnsafeMutableRawPointer) -> Void)?

    /// `count` words of its own, each `value`.
    public init(count: Int, repeating value: Int64) {
        base = .allocate(capacity: count)
        base.initialize(repeating: value, count: count)
        self.count = count
        release = nil
    }

    /// The `count` words at `pointer` (8-byte aligned: a mapping), handed over: `release` gives them back (an
    /// `munmap`) when this ends, once no thread can reach them.
    public init(adopting pointer: UnsafeMutableRawPointer, count: Int, release: @escaping @Sendable (UnsafeMutableRawPointer) -> Void) {
        precondition(Int(bitPattern: pointer) % 8 == 0, "atomic words must be 8-byte aligned")
        base = pointer.assumingMemoryBound(to: Int64.self)
        self.count = count
        self.release = release
    }

    deinit {
        if let release { release(UnsafeMutableRawPointer(base)) } else { base.deallocate() }
    }

    /// Word `index`, with acquire ordering.
    @inline(__always)
    public func load(_ index: Int) -> Int64 {
        precondition(index >= 0 && index < count, "word \(index) of \(count)")
        return stitch_load_acquire_i64(base + index)
    }

    /// Sets word `index` to `value`, with release ordering.
    @inline(__always)
    public func store(_ index: Int, _ value: Int64) {
        precondition(index >= 0 && index < count, "word \(index) of \(count)")
        stitch_store_release_i64(base + index, value)
    }
}
