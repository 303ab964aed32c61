import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The files of finished download tasks between the session and the part files (docs/background-sessions.md,
/// "When a task finishes"). They live in one folder of the driver's state directory:
///
/// - `t-<launch>-<n>`: a task's file moved out of the session's hands, not judged yet. Only the launch that moved it
///   judges it; any other launch removes it.
/// - `a-<download>-<nonce>-<boot>-<start>-<end>`: a range judged to be exactly those bytes of the download's current
///   generation, not yet copied into its part file. It is copied again after a crash in the same boot (writing the
///   same bytes at the same offset again is harmless) and removed after a reboot (its bytes were never synced) or
///   once its generation is gone.
struct BackgroundStaging: Sendable {
    let directory: String
    /// This process's token in the names of the files it moves in.
    let launch: String

    init(directory: String) {
        self.directory = directory
        self.launch = String(UInt64.random(in: 1...UInt64.max), radix: 16)
    }

    /// The boot id's hexadecimal digits (all of them: two boots may share a prefix, as the power-cut tests' ids
    /// do): what an accepted file's name says about its boot.
    static var boot: String {
        String(BootID.current.filter(\.isHexDigit)).lowercased()
    }

    struct Accepted: Sendable, Hashable {
        var download: DownloadID
        var nonce: String
        var boot: String
        var range: Range<Int64>

        var name: String { "a-\(download)-\(nonce)-\(boot)-\(range.lowerBound)-\(range.upperBound)" }

        init(download: DownloadID, nonce: String, boot: String, range: Range<Int64>) {
            self.download = download
            self.nonce = nonce
            self.boot = boot
            self.range = range
        }

        init?(name: String) {
            let fields = name.split(separator: "-", omittingEmptySubsequences: false)
            guard fields.count == 6, fields[0] == "a", let download = DownloadID(String(fields[1])),
                let start = ContentRange.number(fields[4]), let end = ContentRange.number(fields[5]), start < end
            else { return nil }
            self.init(download: download, nonce: String(fields[2]), boot: String(fields[3]), range: start..<end)
        }
    }

    /// Moves a finished task's file (which the session deletes once its callback returns) in, under a name of this
    /// launch; returns the new path, or nil if it could not be moved (the task is then asked for again).
    func takeIn(_ path: String, serial: Int) -> String? {
        let target = "\(directory)/t-\(launch)-\(serial)"
        return Self.move(path, to: target) ? target : nil
    }

    /// Renames a judged file to its accepted name; returns the new path.
    func accept(_ path: String, as accepted: Accepted) -> String? {
        let target = "\(directory)/\(accepted.name)"
        return rename(path, target) == 0 ? target : nil
    }

    /// The accepted files in the folder.
    func acceptedFiles() -> [(path: String, accepted: Accepted)] {
        names().compactMap { name in Accepted(name: name).map { ("\(directory)/\(name)", $0) } }
    }

    /// Removes the files no one will judge: those another launch took in, and names that are not ours.
    func removeOrphans() {
        for name in names() where Accepted(name: name) == nil && !name.hasPrefix("t-\(launch)-") {
            unlink("\(directory)/\(name)")
        }
    }

    /// Removes the accepted files of `download` (every generation).
    func removeAccepted(of download: DownloadID) {
        for (path, accepted) in acceptedFiles() where accepted.download == download { unlink(path) }
    }

    private func names() -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
    }

    /// `rename`, or (across file systems) a copy in 1 MiB chunks and an unlink of the source.
    static func move(_ source: String, to target: String) -> Bool {
        if rename(source, target) == 0 { return true }
        guard errno == EXDEV else { return false }
        let input = retryingOnInterrupt { open(source, O_RDONLY | O_CLOEXEC) }
        guard input >= 0 else { return false }
        defer { close(input) }
        let output = retryingOnInterrupt { open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        guard output >= 0 else { return false }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        var ok = true
        copying: while true {
            let n = retryingOnInterrupt { read(input, buffer.baseAddress, buffer.count) }
            if n < 0 { ok = false }
            if n <= 0 { break }
            var done = 0
            while done < n {
                let written = retryingOnInterrupt { write(output, buffer.baseAddress! + done, n - done) }
                if written <= 0 {
                    ok = false
                    break copying
                }
                done += written
            }
        }
        close(output)
        if ok { unlink(source) } else { unlink(target) }
        return ok
    }

    /// Copies the file at `path` into `store` at `start`, in 1 MiB chunks, so memory stays flat; returns the CRC32C
    /// of every piece that lies wholly within the copied bytes (pieces of `pieceSize` from offset 0; the last one
    /// ends at `total`). `length`: the bytes the file must hold; a file of another size is refused with nothing
    /// written.
    static func copy(
        _ path: String, length: Int64, into store: PartStore, at start: Int64, pieceSize: Int64, total: Int64
    ) throws(DownloadError) -> [(piece: Int, crc: UInt32)] {
        guard let found = size(of: path), found == length else {
            throw DownloadError(
                .io, "\(path) holds \(size(of: path).map(String.init) ?? "nothing"), not the \(length) bytes it was accepted with",
                resumable: true)
        }
        let input = retryingOnInterrupt { open(path, O_RDONLY | O_CLOEXEC) }
        guard input >= 0 else { throw .io("cannot read", path: path, .current) }
        defer { close(input) }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        var pieces: [(piece: Int, crc: UInt32)] = []
        var at = start
        // The piece being summed, when the copy began at its first byte.
        var crc: CRC32C? = start % pieceSize == 0 ? CRC32C() : nil
        while true {
            let n = retryingOnInterrupt { read(input, buffer.baseAddress, buffer.count) }
            if n < 0 { throw .io("cannot read", path: path, .current) }
            if n == 0 { break }
            let chunk = UnsafeRawBufferPointer(rebasing: buffer[0..<n])
            if let error = store.write(chunk, at: at) { throw .io("cannot write", path: store.paths.part, error) }
            var offset = 0
            while offset < n {
                let pieceEnd = min((at / pieceSize + 1) * pieceSize, total)
                let take = Int(min(Int64(n - offset), max(pieceEnd - at, 1)))
                crc?.update(UnsafeRawBufferPointer(rebasing: chunk[offset..<offset + take]))
                at += Int64(take)
                offset += take
                if at == pieceEnd || at % pieceSize == 0 {
                    if let value = crc?.value { pieces.append((Int((at - 1) / pieceSize), value)) }
                    crc = CRC32C()
                }
            }
        }
        return pieces
    }

    /// The size of the file at `path`, or nil if there is none.
    static func size(of path: String) -> Int64? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return Int64(info.st_size)
    }

    /// Removes a task's file that is not (or no longer) wanted.
    static func discard(_ path: String) {
        unlink(path)
    }
}

/// One download as the driver keeps it on disk (`ID.json` in the state directory).
struct BackgroundRecord: Codable, Sendable, Hashable {
    var id: DownloadID
    var url: String
    var destination: String
    /// The user's extra header fields, as "Name: value".
    var headers: [String]
    var checksum: String?
    /// The generation: redrawn at each restart from zero.
    var nonce: String
    /// What the current generation's tasks are: the probe, ranges, or the whole file.
    var kind: String
    var restarts: Int = 0
    var paused: Bool = false
    var failure: String?
    var added: Int64

    var taskKind: TaskLabel.Kind { TaskLabel.Kind(rawValue: kind) ?? .probe }
}

/// The records of a driver's downloads: `ID.json` in its state directory, each replaced atomically and durably.
enum BackgroundRecords {
    /// Every record in `directory`, in name order.
    static func load(from directory: String) throws(DownloadError) -> [BackgroundRecord] {
        var records: [BackgroundRecord] = []
        for name in ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted()
        where name.hasSuffix(".json") {
            let path = directory + "/" + name
            guard
                let bytes = try readSmallFile(
                    path, what: "background download record", maximumSize: 1 << 20,
                    tooLarge: DownloadError(.unusableState, "\(path) is not a Stitch record (too large)")),
                let record = try? JSONDecoder().decode(BackgroundRecord.self, from: Data(bytes)),
                "\(record.id).json" == name
            else { throw DownloadError(.unusableState, "\(path) is corrupt (not a Stitch background record)") }
            records.append(record)
        }
        return records
    }

    static func createDirectory(_ path: String) throws(DownloadError) {
        do { try FileOperations.createDirectory(path) } catch {
            throw DownloadError(.io, "cannot create \(path): \(error)")
        }
    }

    static func exists(_ path: String) -> Bool {
        access(path, F_OK) == 0
    }

    static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }

    /// Removes the record of `id` durably.
    static func remove(_ id: DownloadID, in directory: String) {
        unlink("\(directory)/\(id).json")
        try? syncDirectory(directory)
    }

    /// Replaces `ID.json` atomically and durably (temporary file, fsync, rename, fsync of the folder).
    static func write(_ record: BackgroundRecord, in directory: String) throws(DownloadError) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        let data: Data
        do { data = try encoder.encode(record) } catch { throw DownloadError(.io, "cannot encode a record: \(error)") }
        let path = "\(directory)/\(record.id).json"
        let temporary = path + ".tmp"
        try writeSynced(data, to: temporary, what: "background download record")
        guard rename(temporary, path) == 0 else { throw .io("cannot replace", path: path, .current) }
        try syncDirectory(directory)
    }
}
