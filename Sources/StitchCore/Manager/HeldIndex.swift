/// The downloads a manager holds, by where they go and a URL they have, for ``DownloadManager/AddOptions/reuseExisting``:
/// finding the download an add names is a hash lookup, not a walk over every download (10,000 adds in one batch
/// took minutes when each walked them all).
struct HeldIndex: Sendable {
    /// A place (a file, or a folder; its path as the manager compares paths) and a URL.
    struct Key: Hashable, Sendable {
        let kind: CatalogEntry.DestinationKind
        let path: String
        let url: String
    }

    /// Downloads by their current URL, each key's in the order added.
    private(set) var current: [Key: [DownloadID]] = [:]
    /// Downloads by a URL they had before (``DownloadManager/updateSource(_:url:headers:)-(_,String,_)``).
    private(set) var former: [Key: [DownloadID]] = [:]

    /// An index of `entries`, in their order.
    init(_ entries: some Sequence<CatalogEntry>) {
        for entry in entries { insert(entry) }
    }

    /// Adds `entry` under its place with its current and former URLs.
    mutating func insert(_ entry: CatalogEntry) {
        let path = DownloadManager.comparable(entry.destinationPath)
        current[Key(kind: entry.destinationKind, path: path, url: entry.url), default: []].append(entry.id)
        for url in entry.options.formerURLs {
            former[Key(kind: entry.destinationKind, path: path, url: url), default: []].append(entry.id)
        }
    }
}
