import Foundation

/// What a manager opening its catalog makes of each row: the status it comes back in, the path it claims, the
/// progress its own files prove; and, when the catalog had to be rebuilt, rows for the partial downloads whose state
/// files lie in the download folder. No actor state: ``DownloadManager`` calls these while it opens.
enum CatalogRestore {
    /// The status the row says (a failed one with its code and message; anything unknown is paused).
    static func status(of entry: CatalogEntry) -> DownloadStatus {
        switch entry.status {
        case CatalogEntry.Status.queued: return .queued
        case CatalogEntry.Status.running: return .running
        case CatalogEntry.Status.completed: return .completed
        case CatalogEntry.Status.failed:
            let code = DownloadError.Code.named(entry.errorCode ?? "io")
            return .failed(DownloadFailure(code: code, message: entry.errorMessage ?? "failed", isResumable: true))
        default: return .paused
        }
    }

    /// The path a download writes to, once known.
    static func claimedPath(_ entry: CatalogEntry) -> String? {
        entry.resolvedPath ?? (entry.destinationKind == .file ? entry.destinationPath : nil)
    }

    /// What the download's own files prove: the state file's durable bytes, or the whole file once completed.
    static func restoredProgress(_ entry: CatalogEntry, status: DownloadStatus) -> TransferProgress {
        if status == .completed {
            let bytes = entry.totalBytes ?? entry.completedBytes
            return TransferProgress(
                bytes: bytes, total: bytes, durableBytes: bytes, writtenRanges: [0..<bytes],
                pieceLength: PieceLayout.pieceSize(forTotal: bytes))
        }
        guard let path = claimedPath(entry),
            let state = PartialDownload(DownloadPaths(destination: path)).state,
            state.url == entry.url || entry.options.formerURLs.contains(state.url)
        else { return TransferProgress(total: entry.totalBytes) }
        let durable = state.durableBytes
        return TransferProgress(
            bytes: durable, total: state.validators.totalLength, durableBytes: durable,
            writtenRanges: RunReporter.merged(state.segments.map { $0.start..<$0.durable }), pieceLength: state.pieceSize)
    }

    /// Catalog entries for the partial downloads whose state files lie in `directory` (a rebuilt catalog).
    static func entriesFromStateFiles(in directory: String) -> [CatalogEntry] {
        let now = Date().timeIntervalSince1970
        var entries: [CatalogEntry] = []
        for destination in FileOperations.destinationsWithStateFiles(in: directory) {
            // A damaged state file with a readable previous generation is still a download (the engine falls back).
            guard let state = PartialDownload(DownloadPaths(destination: destination)).state else { continue }
            entries.append(
                CatalogEntry(
                    id: DownloadID.random(), url: state.url, headers: state.headers, destinationKind: .file,
                    destinationPath: destination, resolvedPath: destination, checksum: state.checksum,
                    status: CatalogEntry.Status.queued, position: Int64(entries.count + 1),
                    totalBytes: state.validators.totalLength, completedBytes: state.durableBytes,
                    etag: state.validators.etag, lastModified: state.validators.lastModified,
                    createdAt: now, updatedAt: now))
        }
        return entries
    }
}
