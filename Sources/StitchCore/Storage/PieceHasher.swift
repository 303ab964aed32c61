/// Computes the CRC32C of each fixed-size piece as one connection writes it in order.
///
/// A piece gets a checksum only from the connection that writes it from its first byte (or that resumes it
/// after reading its already-trusted start back from disk); a piece written by two connections (a split inside
/// it) gets none and is simply not checkable later.
struct PieceHasher {
    let pieceSize: Int64
    let total: Int64?
    private var index: Int64 = -1
    private var crc = CRC32C()
    /// Whether `crc` covers the current piece from its first byte up to the write position.
    private var covering = false

    init(pieceSize: Int64, total: Int64?) {
        self.pieceSize = pieceSize
        self.total = total
    }

    /// Starts at `offset` in a segment that begins at `segmentStart`. When the piece began inside the same
    /// segment, its bytes before `offset` were written (and trusted) by it and are read back from `store`, so the
    /// piece's checksum can still be completed; when it began before the segment, another connection writes that
    /// part and this piece gets no checksum.
    mutating func start(at offset: Int64, segmentStart: Int64, store: PartStore) {
        index = offset / pieceSize
        crc = CRC32C()
        let pieceStart = index * pieceSize
        covering = pieceStart >= segmentStart
        guard covering, offset > pieceStart else { return }
        if let prefix = store.checksum(from: pieceStart, to: offset) {
            crc = CRC32C(value: prefix)
        } else {
            covering = false
        }
    }

    /// Feeds `bytes` written at `offset` (which must follow the previous bytes); completed pieces go to `store`.
    mutating func consume(_ bytes: UnsafeRawBufferPointer, at offset: Int64, store: PartStore) {
        var position = offset
        var rest = bytes
        while !rest.isEmpty {
            let pieceEnd = min((index + 1) * pieceSize, total ?? Int64.max)
            let count = Int(min(Int64(rest.count), pieceEnd - position))
            guard count > 0 else {
                // Past this piece: the next one starts here, from its first byte.
                index += 1
                crc = CRC32C()
                covering = true
                continue
            }
            if covering { crc.update(UnsafeRawBufferPointer(rebasing: rest[0..<count])) }
            position += Int64(count)
            rest = UnsafeRawBufferPointer(rebasing: rest[count...])
            if position == pieceEnd {
                if covering { store.notePiece(Int(index), crc: crc.value) }
                index += 1
                crc = CRC32C()
                covering = true
            }
        }
    }
}
