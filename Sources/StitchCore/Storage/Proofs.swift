/// The checksums that let a reader prove, after a reboot, every byte a state counts as durable (state format 3,
/// docs/state-file.md): the piece CRCs in ``DownloadState/pieces`` and, for the durable bytes no recorded piece
/// covers, the ``Proof``s.
///
/// The rule every state write of a ``PartStore`` keeps, so that a disk that acknowledged a sync but dropped the data
/// costs a refetch, never a wrong file:
/// - A piece all of whose bytes are durable (in one segment or several) has its CRC recorded: the one its writer
///   computed on the way (pending), else one assembled from the proofs of its parts.
/// - Every other durable byte lies in exactly one proof. A proof covers one part of one piece: the piece's bytes
///   within one segment's durable extent (with an unknown length, a chunk of ``chunkSize(pieceSize:durable:)``).
///
/// Nothing is read twice: a proof whose range grew is continued from the one before over the new bytes only
/// (`stitch_crc32c_update` continues a CRC), proofs that tile a larger range are joined without the data
/// (``CRC32C/combine(_:_:length2:)``), and only bytes no earlier proof or piece covers are read back from the part
/// file — at a checkpoint, the new bytes of pieces that are not complete, from the page cache.
enum Proofs {
    /// More proofs than a state written by a checkpoint can hold: one per piece (a chunk, with an unknown length)
    /// and one more per segment.
    static let maximumCount = Int(PieceLayout.maximumPieces) + LiveRecord.slotCount

    /// Continues `crc` over the part file's bytes `start..<end`; throws when they cannot be read.
    typealias Reader = (_ start: Int64, _ end: Int64, _ crc: UInt32) throws(DownloadError) -> UInt32

    /// The chunk the durable bytes of a download of unknown length are proven in: `pieceSize`, doubled until
    /// `durable` bytes make at most ``PieceLayout/maximumPieces`` chunks. A chunk that doubles is the join of two
    /// proofs already there (no byte is read again), and the state stays as small as a known length's: a check that
    /// fails after a reboot cuts the download at that chunk's start (it is one prefix), so a coarser chunk costs at
    /// most a chunk more to fetch again, 1/4096 of what is kept.
    static func chunkSize(pieceSize: Int64, durable: Int64) -> Int64 {
        var size = max(pieceSize, PieceLayout.minimumPieceSize)
        while durable / size + (durable % size == 0 ? 0 : 1) > PieceLayout.maximumPieces { size *= 2 }
        return size
    }

    /// One part of the file to prove: `start..<end`, within one piece (or chunk) and one segment's durable extent.
    struct Part: Hashable {
        var piece: Int
        var start: Int64
        var end: Int64
    }

    /// The parts `state`'s durable bytes fall into, in file order, grouped by piece.
    static func parts(of state: DownloadState) -> [Part] {
        let extents = state.segments.filter { $0.durable > $0.start }.sorted { $0.start < $1.start }
        let unit: Int64
        if state.validators.totalLength != nil {
            unit = state.pieceSize
        } else {
            unit = chunkSize(pieceSize: state.pieceSize, durable: extents.map(\.durable).max() ?? 0)
        }
        var parts: [Part] = []
        for extent in extents {
            var at = extent.start
            while at < extent.durable {
                let piece = at / unit
                let end = min((piece + 1) * unit, extent.durable)
                parts.append(Part(piece: Int(piece), start: at, end: end))
                at = end
            }
        }
        return parts
    }

    /// Brings `state`'s piece checksums and proofs up to date with its segments (see ``Proofs``), from the proofs
    /// of the state it replaces (`previous`: they must describe the same bytes — none in a piece cut since), the
    /// checksums its writers computed (`pending`), and the part file (`read`) for what neither covers. Marks the
    /// state as format 3. Returns the pieces whose pending checksum it recorded.
    ///
    /// A recorded piece keeps its checksum. With an unknown length there are no pieces: every durable byte is in a
    /// proof.
    @discardableResult
    static func update(
        _ state: inout DownloadState, previous: [Proof], pending: [Int: UInt32], read: Reader
    ) throws(DownloadError) -> [Int] {
        let assembler = Assembler(known: previous.map { ($0.start, $0.end, $0.crc) })
        let total = state.validators.totalLength
        var proofs: [Proof] = []
        var recorded: [Int] = []
        let parts = parts(of: state)
        var index = 0
        while index < parts.count {
            let piece = parts[index].piece
            var group = index
            while group < parts.count && parts[group].piece == piece { group += 1 }
            let pieceParts = parts[index..<group]
            index = group
            guard let total else {
                for part in pieceParts {
                    proofs.append(Proof(start: part.start, end: part.end, crc: try assembler.crc(part.start, part.end, read: read)))
                }
                continue
            }
            if piece < state.pieces.count, state.pieces[piece] != nil { continue }
            let pieceStart = Int64(piece) * state.pieceSize
            let pieceEnd = min(pieceStart + state.pieceSize, total)
            let durable = pieceParts.reduce(Int64(0)) { $0 + ($1.end - $1.start) }
            if durable == pieceEnd - pieceStart {
                // All of it is durable: its checksum is recorded, and no proof is needed.
                let crc: UInt32
                if let computed = pending[piece] {
                    crc = computed
                    recorded.append(piece)
                } else {
                    crc = try assembler.crc(pieceStart, pieceEnd, read: read)
                }
                if state.pieces.count <= piece {
                    state.pieces += Array(repeating: nil, count: piece + 1 - state.pieces.count)
                }
                state.pieces[piece] = crc
            } else {
                for part in pieceParts {
                    proofs.append(Proof(start: part.start, end: part.end, crc: try assembler.crc(part.start, part.end, read: read)))
                }
            }
        }
        state.proofs = proofs
        state.schemaVersion = DownloadState.currentSchemaVersion
        return recorded
    }

    /// What a check of `state`'s checksums against the part file found (``check(_:read:)``).
    struct Check: Equatable {
        /// Pieces with a recorded checksum or a proof that no longer matches the bytes.
        var damaged: [Int] = []
        /// Pieces holding durable bytes that no recorded checksum or proof covers (a format 2 state's partial and
        /// shared pieces).
        var unproven: [Int] = []
        /// With an unknown length: where the proven durable bytes end (the download is one prefix).
        var provenEnd: Int64?
        /// Pieces the check read, for the report (recorded or proven, damaged or not).
        var checked = 0

        /// Every piece to fetch again.
        var cut: [Int] { Array(Set(damaged).union(unproven)).sorted() }
    }

    /// Reads back every recorded piece and every proof of `state` and compares them with the bytes (`read` from 0);
    /// lists the pieces that fail and those with durable bytes nothing proves.
    static func check(_ state: DownloadState, read: Reader) -> Check {
        var check = Check()
        func matches(_ start: Int64, _ end: Int64, _ crc: UInt32) -> Bool {
            (try? read(start, end, 0)) == crc
        }
        guard let total = state.validators.totalLength else {
            // One segment from its start: proven up to the first chunk that fails or that no proof covers.
            guard let only = state.segments.first, state.segments.count == 1 else { return check }
            var at = only.start
            for proof in state.proofs {
                guard proof.start == at, proof.end <= only.durable else { break }
                check.checked += 1
                guard matches(proof.start, proof.end, proof.crc) else { break }
                at = proof.end
            }
            check.provenEnd = at
            return check
        }
        var damaged = Set<Int>()
        var checked = Set<Int>()
        for (piece, recorded) in state.pieces.enumerated() {
            guard let recorded else { continue }
            let start = Int64(piece) * state.pieceSize
            checked.insert(piece)
            if !matches(start, min(start + state.pieceSize, total), recorded) { damaged.insert(piece) }
        }
        var proven = Set<Part>()
        for proof in state.proofs {
            let piece = Int(proof.start / state.pieceSize)
            checked.insert(piece)
            if matches(proof.start, proof.end, proof.crc) {
                proven.insert(Part(piece: piece, start: proof.start, end: proof.end))
            } else {
                damaged.insert(piece)
            }
        }
        var unproven = Set<Int>()
        for part in parts(of: state) where !damaged.contains(part.piece) {
            let recorded = part.piece < state.pieces.count && state.pieces[part.piece] != nil
            if !recorded && !proven.contains(part) { unproven.insert(part.piece) }
        }
        check.damaged = damaged.sorted()
        check.unproven = unproven.sorted()
        check.checked = checked.count
        return check
    }

    /// The CRC32C of the file's `length` bytes from the checksums known for them — `pieces` of `pieceSize` (the
    /// last one ending at `length`) and `ranges` — reading only the bytes none covers.
    static func wholeFile(
        length: Int64, pieceSize: Int64, pieces: [Int: UInt32], ranges: [Proof], read: Reader
    ) throws(DownloadError) -> UInt32 {
        var known = ranges.map { ($0.start, $0.end, $0.crc) }
        for (piece, crc) in pieces where Int64(piece) * pieceSize < length {
            let start = Int64(piece) * pieceSize
            known.append((start, min(start + pieceSize, length), crc))
        }
        return try Assembler(known: known).crc(0, length, read: read)
    }

    /// Assembles the CRC of a range from known CRCs of ranges within it, joined without the data, and the bytes
    /// between them, read.
    struct Assembler {
        /// Known ranges by start, the longest first.
        private var known: [Int64: [(end: Int64, crc: UInt32)]] = [:]
        private let starts: [Int64]

        init(known ranges: [(Int64, Int64, UInt32)]) {
            for (start, end, crc) in ranges where end > start { known[start, default: []].append((end, crc)) }
            for start in known.keys { known[start]!.sort { $0.end > $1.end } }
            starts = known.keys.sorted()
        }

        /// The CRC32C of `start..<end`, reading (`read`) what no known range covers.
        func crc(_ start: Int64, _ end: Int64, read: Reader) throws(DownloadError) -> UInt32 {
            var crc: UInt32 = 0
            var at = start
            while at < end {
                if let range = known[at]?.first(where: { $0.end <= end }) {
                    crc = CRC32C.combine(crc, range.crc, length2: range.end - at)
                    at = range.end
                    continue
                }
                // Read up to the next range that starts inside (or to the end).
                let next = nextStart(after: at).map { min($0, end) } ?? end
                crc = try read(at, next, crc)
                at = next
            }
            return crc
        }

        private func nextStart(after offset: Int64) -> Int64? {
            var low = 0
            var high = starts.count
            while low < high {
                let middle = (low + high) / 2
                if starts[middle] <= offset { low = middle + 1 } else { high = middle }
            }
            return low < starts.count ? starts[low] : nil
        }
    }
}
