// The catalog store's one seam: SQLite's C interface, from Debian's libsqlite3 (the CSQLite module) on Linux and
// from the system's SQLite3 module on Apple platforms (the same functions; not compiled here).
#if canImport(SQLite3)
import SQLite3

// What Debian's build takes from the CSQLite shim (macros Swift does not import), for the system's SQLite3.
private let sqliteTransient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
private let stitch_sqlite_constraint_primarykey: Int32 = SQLITE_CONSTRAINT | (6 << 8)
private func stitch_sqlite3_bind_text_count_transient(
    _ statement: OpaquePointer?, _ index: Int32, _ text: UnsafePointer<CChar>?, _ count: Int32
) -> Int32 {
    guard let text else { return sqlite3_bind_text(statement, index, "", 0, sqliteTransient) }
    return sqlite3_bind_text(statement, index, text, count, sqliteTransient)
}
#else
import CSQLite
#endif
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The persistent list of a download manager's downloads: `DIRECTORY/catalog.sqlite3`, an SQLite database.
///
/// Only the `DownloadManager` actor uses a catalog, one call at a time (the connection is opened with
/// `SQLITE_OPEN_NOMUTEX`), so the class is deliberately not `Sendable`; ``CatalogEntry`` values cross isolation
/// instead.
///
/// ## Durability
/// The database runs in WAL mode with `synchronous=FULL`: every change is committed, and synced, before its method
/// returns, so it survives a kill of the process or a power cut at any instant. Each write is what a user asked for
/// (an add, a pause, a move, a removal) or a download's change of status, so an answered RPC call is never undone by
/// a power cut (PowerCutDaemonTests; with `NORMAL` every download added in the last minutes was gone after one). The
/// path to the database is made durable when it is opened (each folder on it synced), since SQLite syncs the folder
/// for its WAL and journal files but not for the database file, and nothing syncs the folders above. The bytes already
/// downloaded live in each download's own state file beside its destination, written with its own fsync discipline,
/// and `completedBytes` here is only a snapshot for listings.
///
/// ## Damage and versions
/// A file that is not a database, or that SQLite finds damaged (on open, on the first query, or because
/// `PRAGMA quick_check` does not answer "ok"), is moved aside to `catalog.sqlite3.corrupt-<unix seconds>` with its
/// `-wal`/`-journal` files, and an empty catalog takes its place; ``openReport`` says so, so that the manager can
/// re-add the downloads whose state files it finds. A catalog written by a newer Stitch (a higher
/// `PRAGMA user_version` than ``currentSchemaVersion``) is refused and left untouched; an older one is migrated in
/// one transaction.
final class Catalog {
    /// What opening the catalog found.
    struct OpenReport: Sendable, Hashable {
        /// The catalog is new and empty: there was no database, or a damaged one was moved aside.
        var created: Bool
        /// The schema version the catalog was migrated from, if it was older than the current one.
        var migratedFrom: Int?
        /// If the old file was damaged: one line saying what was wrong and where the file was moved.
        var rebuiltBecause: String?
    }

    /// The schema version this code reads and writes (`PRAGMA user_version`).
    ///
    /// - 1: the first schema (no `priority` or `error_code` columns; ordered by `position` alone).
    /// - 2: adds `priority INTEGER NOT NULL DEFAULT 0` and `error_code TEXT`; ordered by priority, then position.
    /// - 3: adds the `settings` table (a key, a value): settings an application keeps with its downloads.
    static let currentSchemaVersion = 3
    static let fileName = "catalog.sqlite3"
    /// How long opening waits for another connection's lock before failing with `SQLITE_BUSY` (long enough for
    /// a manager that is closing; a running one holds the lock until it closes).
    static let busyTimeoutMilliseconds: Int32 = 500

    /// The database file.
    let path: String
    /// What opening found: a new catalog, a migration, or a damaged file moved aside.
    let openReport: OpenReport

    private var connection: OpaquePointer?
    /// The rows of a catalog in memory only (``init(inMemory:)``); `nil` for a database.
    private var memory: MemoryRows?
    /// Prepared statements, by their SQL text; finalized by ``close()``.
    private var statements: [String: OpaquePointer] = [:]
    /// Encodes the JSON columns; kept from call to call, so the many rows that share their headers and options
    /// (a list of URLs added at once, each written again when it ends) encode them once.
    private var fields: FieldEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return FieldEncoder(encoder: encoder)
    }()

    /// Opens the catalog in `directory`, creating the directory and an empty catalog if missing, migrating an
    /// older schema, and replacing a damaged file with an empty catalog (see ``openReport``).
    ///
    /// - Parameter directory: The manager's directory; the database is `directory/catalog.sqlite3`.
    /// - Throws: ``CatalogError`` if the directory or database cannot be opened or created, if the catalog was
    ///   written by a newer Stitch (`.newerSchema`), or if the file is an SQLite database that is not a catalog.
    init(directory: String) throws(CatalogError) {
        try Self.createDirectory(directory)
        let path = directory.hasSuffix("/") ? directory + Self.fileName : directory + "/" + Self.fileName
        self.path = path

        var rebuiltBecause: String?
        // An empty file where a catalog was is a catalog that lost everything (truncated by a crash or a full
        // disk): SQLite would take it as a new database; it is made anew, but reported, so that the manager looks
        // for the downloads' state files.
        var info = stat()
        if stat(path, &info) == 0, info.st_size == 0 {
            rebuiltBecause = "the catalog \(path) was an empty file; made a new one"
        }
        let opened: (connection: OpaquePointer, created: Bool, migratedFrom: Int?)
        do throws(CatalogError) {
            opened = try Self.openAndPrepare(path)
        } catch let error where error.code == .corrupt {
            let moved = try Self.moveAside(path)
            rebuiltBecause = "\(error.message); moved it to \(moved)".replacingOccurrences(of: "\n", with: " ")
            opened = try Self.openAndPrepare(path)
        }
        connection = opened.connection
        // The database's name, and the folders above it, durable: SQLite syncs the folder only for its WAL and
        // journal files. (A folder that cannot be synced is accepted, as for the downloads' own files.)
        var folder = (path as NSString).deletingLastPathComponent
        while !folder.isEmpty {
            try? syncDirectory(folder)
            let parent = (folder as NSString).deletingLastPathComponent
            if parent == folder { break }
            folder = parent
        }
        openReport = OpenReport(
            created: opened.created || rebuiltBecause != nil, migratedFrom: opened.migratedFrom,
            rebuiltBecause: rebuiltBecause)
    }

    /// A catalog that lives in memory only: for a manager whose downloads need not outlive the process, such as
    /// the command line's list of URLs, where each download's own state file is what a rerun resumes from. No file
    /// is created, and no SQLite is involved: the rows are kept in a dictionary, with the same answers and errors
    /// as a database's (an SQLite `:memory:` database cost each download of a long list of small files a row
    /// encoded and written twice, about 3 % of its CPU on the manager's one thread).
    init(inMemory: Void) throws(CatalogError) {
        path = ":memory:"
        memory = MemoryRows()
        openReport = OpenReport(created: true, migratedFrom: nil, rebuiltBecause: nil)
    }

    deinit {
        close()
    }

    /// Finalizes the prepared statements and closes the database. Later calls do nothing; other methods then
    /// throw `.closed`.
    func close() {
        memory?.isOpen = false
        guard let connection else { return }
        for statement in statements.values {
            sqlite3_finalize(statement)
        }
        statements = [:]
        sqlite3_close_v2(connection)
        self.connection = nil
    }

    // MARK: Reading

    /// Every download, highest priority first and, within a priority, lowest position first.
    func all() throws(CatalogError) -> [CatalogEntry] {
        if let rows = try inMemory({ $0.all() }) { return rows }
        return try withStatement(Self.selectAllSQL) { statement throws(CatalogError) in
            var entries: [CatalogEntry] = []
            var decoder = RowDecoder()
            while try statement.step(or: "cannot read the downloads") {
                entries.append(try decoder.entry(statement, path: path))
            }
            return entries
        }
    }

    /// The download with this ID, or `nil` if the catalog has none.
    func entry(_ id: DownloadID) throws(CatalogError) -> CatalogEntry? {
        if let rows = try inMemory({ $0.entries }) { return rows[id] }
        return try withStatement(Self.selectOneSQL) { statement throws(CatalogError) in
            try statement.bind(id, at: 1)
            guard try statement.step(or: "cannot read download \(id)") else { return nil }
            var decoder = RowDecoder()
            return try decoder.entry(statement, path: path)
        }
    }

    /// The highest position of any download, or 0 if there are none (a new last download goes one after it).
    func maxPosition() throws(CatalogError) -> Int64 {
        if let rows = try inMemory({ $0.entries.values }) { return rows.map(\.position).max() ?? 0 }
        return try scalar("SELECT COALESCE(MAX(position), 0) FROM downloads")
    }

    /// The lowest position of any download, or 0 if there are none (a new first download goes one before it).
    func minPosition() throws(CatalogError) -> Int64 {
        if let rows = try inMemory({ $0.entries.values }) { return rows.map(\.position).min() ?? 0 }
        return try scalar("SELECT COALESCE(MIN(position), 0) FROM downloads")
    }

    /// Every setting kept (``setSettings(_:)``), by key.
    func settings() throws(CatalogError) -> [String: String] {
        if let settings = try inMemory({ $0.settings }) { return settings }
        return try withStatement("SELECT key, value FROM settings") { statement throws(CatalogError) in
            var settings: [String: String] = [:]
            while try statement.step(or: "cannot read the settings") {
                if let key = statement.text(0), let value = statement.text(1) { settings[key] = value }
            }
            return settings
        }
    }

    // MARK: Writing

    /// Sets settings (a nil value removes the key), all in one transaction.
    func setSettings(_ changes: [String: String?]) throws(CatalogError) {
        guard !changes.isEmpty else { return }
        if try inMemory({ $0.apply(settings: changes) }) != nil { return }
        try transaction("cannot save settings") { () throws(CatalogError) in
            for (key, value) in changes.sorted(by: { $0.key < $1.key }) {
                if let value {
                    try withStatement("INSERT OR REPLACE INTO settings (key, value) VALUES (?1, ?2)") {
                        statement throws(CatalogError) in
                        try statement.bind(key, at: 1)
                        try statement.bind(value, at: 2)
                        _ = try statement.step(or: "cannot save the setting \(key)")
                    }
                } else {
                    try withStatement("DELETE FROM settings WHERE key = ?1") { statement throws(CatalogError) in
                        try statement.bind(key, at: 1)
                        _ = try statement.step(or: "cannot remove the setting \(key)")
                    }
                }
            }
        }
    }

    /// Adds downloads, and sets the priority and position of others (an add at a place in the queue), in one
    /// transaction: all of it, or none if any part fails.
    ///
    /// - Throws: `.duplicateID` if an ID is already in the catalog or appears twice in `entries`; `.invalidValue`
    ///   for a status that is not one of ``CatalogEntry/Status``; `.notFound` if a download to move is not there.
    func insert(
        _ entries: [CatalogEntry], moving changes: [(id: DownloadID, priority: Int, position: Int64)] = []
    ) throws(CatalogError) {
        guard !entries.isEmpty || !changes.isEmpty else { return }
        for entry in entries {
            try Self.validate(entry.status, id: entry.id)
        }
        let now = Date().timeIntervalSince1970
        if try inMemory({ rows throws(CatalogError) in try rows.insert(entries, moving: changes, updatedAt: now) }) != nil {
            return
        }
        try transaction("cannot insert downloads") { () throws(CatalogError) in
            for entry in entries {
                try withStatement(Self.insertSQL) { statement throws(CatalogError) in
                    try bind(entry, to: statement, encoder: &fields)
                    _ = try statement.step(or: "cannot insert download \(entry.id)")
                }
            }
            for change in changes {
                try setPosition(change.id, priority: change.priority, position: change.position, updatedAt: now)
            }
        }
    }

    /// Replaces every field of the download with `entry.id`.
    ///
    /// - Throws: `.notFound` if the catalog has no such download.
    func update(_ entry: CatalogEntry) throws(CatalogError) {
        try Self.validate(entry.status, id: entry.id)
        if try inMemory({ rows throws(CatalogError) in try rows.change(entry.id) { $0 = entry } }) != nil { return }
        try withStatement(Self.updateSQL) { statement throws(CatalogError) in
            try bind(entry, to: statement, encoder: &fields)
            _ = try statement.step(or: "cannot update download \(entry.id)")
        }
        try expectOneChange(entry.id)
    }

    /// Sets a download's status and error (pass `nil`s to clear the error), and its `updatedAt`.
    ///
    /// - Throws: `.notFound` if the catalog has no such download; `.invalidValue` for an unknown status.
    func setStatus(
        _ id: DownloadID, status: String, errorCode: String? = nil, errorMessage: String? = nil,
        updatedAt: Double = Date().timeIntervalSince1970
    ) throws(CatalogError) {
        try Self.validate(status, id: id)
        let changed: Void? = try inMemory { rows throws(CatalogError) in
            try rows.change(id) {
                $0.status = status
                $0.errorCode = errorCode
                $0.errorMessage = errorMessage
                $0.updatedAt = updatedAt
            }
        }
        if changed != nil { return }
        try withStatement(
            "UPDATE downloads SET status = ?2, error_code = ?3, error_message = ?4, updated_at = ?5 WHERE id = ?1"
        ) { statement throws(CatalogError) in
            try statement.bind(id, at: 1)
            try statement.bind(status, at: 2)
            try statement.bind(errorCode, at: 3)
            try statement.bind(errorMessage, at: 4)
            try statement.bind(updatedAt, at: 5)
            _ = try statement.step(or: "cannot set the status of download \(id)")
        }
        try expectOneChange(id)
    }

    /// Sets the priority and position of several downloads in one transaction: all or none.
    ///
    /// - Throws: `.notFound` if one of them is not in the catalog.
    func setPositions(_ changes: [(id: DownloadID, priority: Int, position: Int64)]) throws(CatalogError) {
        guard !changes.isEmpty else { return }
        let now = Date().timeIntervalSince1970
        if try inMemory({ rows throws(CatalogError) in try rows.move(changes, updatedAt: now) }) != nil { return }
        try transaction("cannot move downloads") { () throws(CatalogError) in
            for change in changes {
                try setPosition(change.id, priority: change.priority, position: change.position, updatedAt: now)
            }
        }
    }

    /// Moves a download in the queue, and sets its `updatedAt`.
    ///
    /// - Throws: `.notFound` if the catalog has no such download.
    func setPosition(
        _ id: DownloadID, priority: Int, position: Int64, updatedAt: Double = Date().timeIntervalSince1970
    ) throws(CatalogError) {
        let moved: Void? = try inMemory { rows throws(CatalogError) in
            try rows.move([(id, priority, position)], updatedAt: updatedAt)
        }
        if moved != nil { return }
        try withStatement(
            "UPDATE downloads SET priority = ?2, position = ?3, updated_at = ?4 WHERE id = ?1"
        ) { statement throws(CatalogError) in
            try statement.bind(id, at: 1)
            try statement.bind(Int64(priority), at: 2)
            try statement.bind(position, at: 3)
            try statement.bind(updatedAt, at: 4)
            _ = try statement.step(or: "cannot move download \(id)")
        }
        try expectOneChange(id)
    }

    /// Removes a download.
    ///
    /// - Returns: Whether the catalog had it.
    @discardableResult
    func delete(_ id: DownloadID) throws(CatalogError) -> Bool {
        if let had = try inMemory({ $0.entries.removeValue(forKey: id) != nil }) { return had }
        try withStatement("DELETE FROM downloads WHERE id = ?1") { statement throws(CatalogError) in
            try statement.bind(id, at: 1)
            _ = try statement.step(or: "cannot delete download \(id)")
        }
        return try changes() > 0
    }

    // MARK: Schema

    /// The columns every row query selects and `RowDecoder` reads, in this order; also the insert's columns.
    private static let columns = [
        "id", "url", "headers", "destination_kind", "destination_path", "resolved_path", "checksum", "options",
        "status", "error_code", "error_message", "priority", "position", "total_bytes", "completed_bytes", "etag",
        "last_modified", "created_at", "updated_at",
    ]
    private static let columnList = columns.joined(separator: ", ")
    private static let selectAllSQL =
        "SELECT \(columnList) FROM downloads ORDER BY priority DESC, position ASC, id ASC"
    private static let selectOneSQL = "SELECT \(columnList) FROM downloads WHERE id = ?1"
    private static let insertSQL =
        "INSERT INTO downloads (\(columnList)) VALUES ("
        + (1...columns.count).map { "?\($0)" }.joined(separator: ", ") + ")"
    private static let updateSQL =
        "UPDATE downloads SET "
        + columns.enumerated().dropFirst().map { "\($0.element) = ?\($0.offset + 1)" }.joined(separator: ", ")
        + " WHERE id = ?1"

    /// The current schema, for a new catalog.
    private static let schema = """
        CREATE TABLE downloads (
            id INTEGER PRIMARY KEY,
            url TEXT NOT NULL,
            headers TEXT NOT NULL,
            destination_kind TEXT NOT NULL,
            destination_path TEXT NOT NULL,
            resolved_path TEXT,
            checksum TEXT,
            options TEXT NOT NULL,
            status TEXT NOT NULL,
            error_code TEXT,
            error_message TEXT,
            priority INTEGER NOT NULL DEFAULT 0,
            position INTEGER NOT NULL,
            total_bytes INTEGER,
            completed_bytes INTEGER NOT NULL DEFAULT 0,
            etag TEXT,
            last_modified TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX downloads_order ON downloads (priority DESC, position);
        CREATE TABLE settings (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
        PRAGMA user_version = 3;
        """

    /// The SQL that takes a catalog from version `from` to `from + 1`, ending with the new `user_version`.
    ///
    /// Version 1 had the columns of version 2 except `priority` and `error_code`, and an index on `position`.
    private static let migrations: [(from: Int, sql: String)] = [
        (
            from: 1,
            sql: """
            ALTER TABLE downloads ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
            ALTER TABLE downloads ADD COLUMN error_code TEXT;
            DROP INDEX IF EXISTS downloads_position;
            CREATE INDEX downloads_order ON downloads (priority DESC, position);
            PRAGMA user_version = 2;
            """
        ),
        (
            from: 2,
            sql: """
            CREATE TABLE settings (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
            PRAGMA user_version = 3;
            """
        ),
    ]

    // MARK: Opening

    private static func createDirectory(_ directory: String) throws(CatalogError) {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw CatalogError(.io, "cannot create the catalog directory \(directory): \(error)")
        }
    }

    /// Opens, checks and creates or migrates the database; a `.corrupt` error at any step means "move it aside".
    private static func openAndPrepare(
        _ path: String
    ) throws(CatalogError) -> (connection: OpaquePointer, created: Bool, migratedFrom: Int?) {
        let opened = try openChecked(path)
        do throws(CatalogError) {
            let (created, migratedFrom) = try prepareSchema(opened.connection, path: path, version: opened.version)
            return (opened.connection, created, migratedFrom)
        } catch {
            sqlite3_close_v2(opened.connection)
            throw error
        }
    }

    /// Opens the database and checks that it is sound and not newer than this code, then sets WAL mode.
    ///
    /// - Returns: The connection and the schema version (0 for a new file).
    /// - Throws: `.corrupt` if the file is not a database or is damaged; `.newerSchema`; any other open failure.
    private static func openChecked(_ path: String) throws(CatalogError) -> (connection: OpaquePointer, version: Int) {
        var handle: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let result = sqlite3_open_v2(path, &handle, flags, nil)
        guard let handle else {
            throw CatalogError.sqlite("cannot open the catalog \(path)", connection: nil, result)
        }
        do throws(CatalogError) {
            guard result == SQLITE_OK else {
                throw CatalogError.sqlite("cannot open the catalog \(path)", connection: handle, result)
            }
            sqlite3_extended_result_codes(handle, 1)
            sqlite3_busy_timeout(handle, busyTimeoutMilliseconds)

            // Read-only checks first, so that a file we refuse is not modified.
            let check = try texts(handle, "PRAGMA quick_check(3)", or: "cannot read the catalog \(path)")
            guard check == ["ok"] else {
                throw CatalogError(
                    .corrupt, "the catalog \(path) is damaged (quick_check: \(check.joined(separator: "; ")))")
            }
            let version =
                try texts(handle, "PRAGMA user_version", or: "cannot read the catalog \(path)")
                .first.flatMap { Int($0) } ?? 0
            guard version <= currentSchemaVersion else {
                throw CatalogError(
                    .newerSchema,
                    "the catalog \(path) has schema version \(version), written by a newer Stitch; this Stitch reads "
                        + "version \(currentSchemaVersion) and older, and leaves the file alone"
                )
            }
            // WAL may be refused (for example on file systems without shared memory); the catalog then still
            // works in the default rollback-journal mode.
            _ = try texts(handle, "PRAGMA journal_mode = WAL", or: "cannot set WAL mode on \(path)")
            try execute(handle, "PRAGMA synchronous = FULL", or: "cannot set synchronous mode on \(path)")
            // One manager owns a catalog: the lock is held from the first access until close, so a second
            // process is refused (SQLITE_BUSY) instead of running the same downloads, and no transaction pays
            // for taking and dropping file locks (30 fcntl calls per download in the many-small-files bench).
            try execute(handle, "PRAGMA locking_mode = EXCLUSIVE", or: "cannot lock the catalog \(path)")
            // A read takes only a shared lock; an (empty) write transaction takes the exclusive one, which
            // exclusive mode then keeps until close — also when the schema needs no change.
            try execute(handle, "BEGIN EXCLUSIVE", or: "cannot lock the catalog \(path)")
            try execute(handle, "COMMIT", or: "cannot lock the catalog \(path)")
            return (handle, version)
        } catch {
            sqlite3_close_v2(handle)
            throw error
        }
    }

    /// Creates the schema in an empty database or migrates an older one, in one transaction.
    ///
    /// - Returns: Whether the schema was created, and the version migrated from, if any.
    private static func prepareSchema(
        _ handle: OpaquePointer, path: String, version: Int
    ) throws(CatalogError) -> (created: Bool, migratedFrom: Int?) {
        guard version != currentSchemaVersion else { return (false, nil) }
        try execute(handle, "BEGIN IMMEDIATE", or: "cannot prepare the catalog \(path)")
        do throws(CatalogError) {
            // Read again under the write lock: another connection may have created or migrated it meanwhile.
            let what = "cannot prepare the catalog \(path)"
            let version = try texts(handle, "PRAGMA user_version", or: what).first.flatMap { Int($0) } ?? 0
            var result: (created: Bool, migratedFrom: Int?) = (false, nil)
            switch version {
            case currentSchemaVersion:
                break
            case 0:
                let objects = try texts(handle, "SELECT count(*) FROM sqlite_master", or: what)
                guard objects == ["0"] else {
                    throw CatalogError(.notACatalog, "\(path) is an SQLite database but not a Stitch catalog")
                }
                try execute(handle, schema, or: "cannot create the catalog \(path)")
                result.created = true
            case 1..<currentSchemaVersion:
                for migration in migrations where migration.from >= version {
                    try execute(
                        handle, migration.sql,
                        or: "cannot migrate the catalog \(path) from version \(migration.from)")
                }
                result.migratedFrom = version
            default:
                throw CatalogError(
                    .newerSchema, "the catalog \(path) has schema version \(version), written by a newer Stitch")
            }
            try execute(handle, "COMMIT", or: "cannot prepare the catalog \(path)")
            return result
        } catch {
            if sqlite3_get_autocommit(handle) == 0 {
                sqlite3_exec(handle, "ROLLBACK", nil, nil, nil)
            }
            throw error
        }
    }

    /// Renames a damaged catalog to `NAME.corrupt-<unix seconds>` (with `.1`, `.2`… if taken), and its `-wal` and
    /// `-journal` files likewise, so that they are not replayed into the new catalog; removes its `-shm`.
    ///
    /// Closing the failed connection usually has SQLite remove the `-wal` and `-shm` already (after checkpointing
    /// any valid frames into the damaged file); this handles what is left, for example while another process
    /// still has the old file open.
    ///
    /// - Returns: The new path of the database file.
    private static func moveAside(_ path: String) throws(CatalogError) -> String {
        let base = "\(path).corrupt-\(time(nil))"
        var target = base
        var attempt = 0
        var info = stat()
        while lstat(target, &info) == 0 {
            attempt += 1
            target = "\(base).\(attempt)"
        }
        guard rename(path, target) == 0 else {
            throw CatalogError(.io, "cannot move the damaged catalog \(path) to \(target): \(Errno.current)")
        }
        for suffix in ["-wal", "-journal"] where rename(path + suffix, target + suffix) != 0 && errno != ENOENT {
            let failure = Errno.current
            guard unlink(path + suffix) == 0 || errno == ENOENT else {
                throw CatalogError(.io, "cannot move the damaged catalog's \(path + suffix): \(failure)")
            }
        }
        guard unlink(path + "-shm") == 0 || errno == ENOENT else {
            throw CatalogError(.io, "cannot remove the damaged catalog's \(path)-shm: \(Errno.current)")
        }
        return target
    }

    /// Runs SQL that binds no values (schema, pragmas, transactions) on a connection.
    private static func execute(_ handle: OpaquePointer, _ sql: String, or what: String) throws(CatalogError) {
        let result = sqlite3_exec(handle, sql, nil, nil, nil)
        guard result == SQLITE_OK else { throw CatalogError.sqlite(what, connection: handle, result) }
    }

    /// The first column of every row of an unprepared query that binds no values, as text.
    private static func texts(_ db: OpaquePointer, _ sql: String, or what: String) throws(CatalogError) -> [String] {
        var raw: OpaquePointer?
        let prepared = sqlite3_prepare_v2(db, sql, -1, &raw, nil)
        guard prepared == SQLITE_OK, let raw else { throw CatalogError.sqlite(what, connection: db, prepared) }
        defer { sqlite3_finalize(raw) }
        let statement = Statement(handle: raw)
        var rows: [String] = []
        while try statement.step(or: what) {
            rows.append(statement.text(0) ?? "")
        }
        return rows
    }

    /// `body` applied to the rows, for a catalog in memory only (`nil` for a database); `.closed` once closed.
    private func inMemory<T>(_ body: (inout MemoryRows) throws(CatalogError) -> T) throws(CatalogError) -> T? {
        guard memory != nil else { return nil }
        guard memory!.isOpen else { throw CatalogError(.closed, "the catalog \(path) is closed") }
        return try body(&memory!)
    }

    // MARK: Statements

    /// Runs `body` with the cached prepared statement for `sql`, then resets it and clears its bindings.
    private func withStatement<Result>(
        _ sql: String, _ body: (Statement) throws(CatalogError) -> Result
    ) throws(CatalogError) -> Result {
        guard let connection else { throw CatalogError(.closed, "the catalog \(path) is closed") }
        let handle: OpaquePointer
        if let cached = statements[sql] {
            handle = cached
        } else {
            var raw: OpaquePointer?
            let result = sqlite3_prepare_v3(connection, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &raw, nil)
            guard result == SQLITE_OK, let raw else {
                throw CatalogError.sqlite("cannot prepare a query on \(path)", connection: connection, result)
            }
            statements[sql] = raw
            handle = raw
        }
        defer {
            sqlite3_reset(handle)
            sqlite3_clear_bindings(handle)
        }
        return try body(Statement(handle: handle))
    }

    private func scalar(_ sql: String) throws(CatalogError) -> Int64 {
        try withStatement(sql) { statement throws(CatalogError) in
            guard try statement.step(or: "cannot query \(path)") else { return 0 }
            return statement.int64(0)
        }
    }

    /// Runs `body` in a write transaction; rolls back if it throws.
    private func transaction(_ what: String, _ body: () throws(CatalogError) -> Void) throws(CatalogError) {
        guard let connection else { throw CatalogError(.closed, "the catalog \(path) is closed") }
        try Self.execute(connection, "BEGIN IMMEDIATE", or: "\(what): cannot begin a transaction on \(path)")
        do throws(CatalogError) {
            try body()
            try Self.execute(connection, "COMMIT", or: "\(what): cannot commit to \(path)")
        } catch {
            if sqlite3_get_autocommit(connection) == 0 {
                sqlite3_exec(connection, "ROLLBACK", nil, nil, nil)
            }
            throw error
        }
    }

    private func changes() throws(CatalogError) -> Int32 {
        guard let connection else { throw CatalogError(.closed, "the catalog \(path) is closed") }
        return sqlite3_changes(connection)
    }

    private func expectOneChange(_ id: DownloadID) throws(CatalogError) {
        guard try changes() > 0 else { throw CatalogError(.notFound, "the catalog has no download \(id)") }
    }

    private static func validate(_ status: String, id: DownloadID) throws(CatalogError) {
        guard CatalogEntry.Status.all.contains(status) else {
            throw CatalogError(.invalidValue, "download \(id): \"\(status)\" is not a download status")
        }
    }

    /// Binds every column of `entry` in `columns` order (`?1` is the ID), for the insert and the update.
    private func bind(
        _ entry: CatalogEntry, to statement: Statement, encoder: inout FieldEncoder
    ) throws(CatalogError) {
        try statement.bind(entry.id, at: 1)
        try statement.bind(entry.url, at: 2)
        try statement.bind(try encoder.headers(entry.headers, id: entry.id), at: 3)
        try statement.bind(entry.destinationKind.rawValue, at: 4)
        try statement.bind(entry.destinationPath, at: 5)
        try statement.bind(entry.resolvedPath, at: 6)
        try statement.bind(entry.checksum, at: 7)
        try statement.bind(try encoder.options(entry.options, id: entry.id), at: 8)
        try statement.bind(entry.status, at: 9)
        try statement.bind(entry.errorCode, at: 10)
        try statement.bind(entry.errorMessage, at: 11)
        try statement.bind(Int64(entry.priority), at: 12)
        try statement.bind(entry.position, at: 13)
        try statement.bind(entry.totalBytes, at: 14)
        try statement.bind(entry.completedBytes, at: 15)
        try statement.bind(entry.etag, at: 16)
        try statement.bind(entry.lastModified, at: 17)
        try statement.bind(entry.createdAt, at: 18)
        try statement.bind(entry.updatedAt, at: 19)
    }
}

/// The rows of a ``Catalog`` in memory only: what its SQLite tables would hold, with the same answers (the rows
/// ordered by priority, then position, then ID) and errors (`.closed`, `.duplicateID`, `.notFound`; a change that
/// fails changes nothing).
private struct MemoryRows {
    var entries: [DownloadID: CatalogEntry] = [:]
    var settings: [String: String] = [:]
    var isOpen = true

    /// In the database's order: priority down, position up, then the ID as SQLite compares it (a signed integer).
    func all() -> [CatalogEntry] {
        entries.values.sorted { a, b in
            if a.priority != b.priority { return a.priority > b.priority }
            if a.position != b.position { return a.position < b.position }
            return Int64(bitPattern: a.id.rawValue) < Int64(bitPattern: b.id.rawValue)
        }
    }

    mutating func apply(settings changes: [String: String?]) {
        for (key, value) in changes { settings[key] = value }
    }

    mutating func insert(
        _ new: [CatalogEntry], moving changes: [(id: DownloadID, priority: Int, position: Int64)], updatedAt: Double
    ) throws(CatalogError) {
        var seen: Set<DownloadID> = []
        for entry in new where entries[entry.id] != nil || !seen.insert(entry.id).inserted {
            throw CatalogError(.duplicateID, "cannot insert download \(entry.id): it is already in the catalog")
        }
        // Every check before any change (all or nothing), without copying the rows.
        for change in changes where entries[change.id] == nil && !seen.contains(change.id) {
            throw CatalogError(.notFound, "the catalog has no download \(change.id)")
        }
        for entry in new { entries[entry.id] = entry }
        try move(changes, updatedAt: updatedAt)
    }

    mutating func move(
        _ changes: [(id: DownloadID, priority: Int, position: Int64)], updatedAt: Double
    ) throws(CatalogError) {
        for change in changes where entries[change.id] == nil {
            throw CatalogError(.notFound, "the catalog has no download \(change.id)")
        }
        for change in changes {
            entries[change.id]!.priority = change.priority
            entries[change.id]!.position = change.position
            entries[change.id]!.updatedAt = updatedAt
        }
    }

    mutating func change(_ id: DownloadID, _ body: (inout CatalogEntry) -> Void) throws(CatalogError) {
        guard entries[id] != nil else { throw CatalogError(.notFound, "the catalog has no download \(id)") }
        body(&entries[id]!)
    }
}

/// Why the catalog could not do something: one line, with SQLite's message and result code when SQLite failed.
struct CatalogError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is; compare with the static members.
    struct Code: Sendable, Hashable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        var description: String { name }

        /// Any SQLite failure without a more specific code (I/O error, busy, disk full…).
        static let sqlite = Code("sqlite")
        /// The file is not a database or is damaged (`SQLITE_NOTADB`, `SQLITE_CORRUPT`, a failed quick check).
        static let corrupt = Code("corrupt")
        /// The catalog was written by a newer Stitch; it was not modified.
        static let newerSchema = Code("newerSchema")
        /// The file is an SQLite database of something else; it was not modified.
        static let notACatalog = Code("notACatalog")
        /// An inserted ID is already in the catalog (or twice in the batch).
        static let duplicateID = Code("duplicateID")
        /// No download has the ID.
        static let notFound = Code("notFound")
        /// A value cannot be stored or a stored value cannot be read (unknown status, malformed headers…).
        static let invalidValue = Code("invalidValue")
        /// The catalog was closed.
        static let closed = Code("closed")
        /// Another connection (another manager, maybe in another process) holds the catalog.
        static let busy = Code("busy")
        /// Creating the directory or moving a damaged file aside failed.
        static let io = Code("io")
    }

    let code: Code
    /// One line for people.
    let message: String
    /// SQLite's extended result code, when SQLite reported the failure.
    let resultCode: Int32?

    init(_ code: Code, _ message: String, resultCode: Int32? = nil) {
        self.code = code
        self.message = message
        self.resultCode = resultCode
    }

    var description: String { message }

    /// An SQLite failure: `what`, SQLite's message for the connection (or for the code) and the result code.
    static func sqlite(_ what: String, connection: OpaquePointer?, _ result: Int32) -> CatalogError {
        let detail =
            connection.flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) }
            ?? String(cString: sqlite3_errstr(result))
        let code: Code
        switch result & 0xFF {
        case SQLITE_CORRUPT, SQLITE_NOTADB: code = .corrupt
        case SQLITE_BUSY, SQLITE_LOCKED:
            return CatalogError(
                .busy, "\(what): another download manager is using it (SQLite result code \(result))",
                resultCode: result)
        case _ where result == stitch_sqlite_constraint_primarykey: code = .duplicateID
        default: code = .sqlite
        }
        return CatalogError(code, "\(what): \(detail) (SQLite result code \(result))", resultCode: result)
    }
}

/// A borrowed prepared statement: binding, stepping and reading columns.
private struct Statement {
    let handle: OpaquePointer

    /// Steps once. Returns `true` for a row, `false` when done.
    func step(or what: String) throws(CatalogError) -> Bool {
        switch sqlite3_step(handle) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        case let result: throw CatalogError.sqlite(what, connection: sqlite3_db_handle(handle), result)
        }
    }

    private func check(_ result: Int32, _ index: Int32) throws(CatalogError) {
        guard result == SQLITE_OK else {
            throw CatalogError.sqlite("cannot bind parameter \(index)", connection: sqlite3_db_handle(handle), result)
        }
    }

    func bind(_ value: Int64?, at index: Int32) throws(CatalogError) {
        try check(value.map { sqlite3_bind_int64(handle, index, $0) } ?? sqlite3_bind_null(handle, index), index)
    }

    func bind(_ value: Double, at index: Int32) throws(CatalogError) {
        try check(sqlite3_bind_double(handle, index, value), index)
    }

    func bind(_ id: DownloadID, at index: Int32) throws(CatalogError) {
        try bind(Int64(bitPattern: id.rawValue), at: index)
    }

    func bind(_ value: String?, at index: Int32) throws(CatalogError) {
        guard var value else { return try check(sqlite3_bind_null(handle, index), index) }
        let result = value.withUTF8 { utf8 in
            utf8.withMemoryRebound(to: CChar.self) { text in
                stitch_sqlite3_bind_text_count_transient(handle, index, text.baseAddress, Int32(text.count))
            }
        }
        try check(result, index)
    }

    func isNull(_ column: Int32) -> Bool {
        sqlite3_column_type(handle, column) == SQLITE_NULL
    }

    func int64(_ column: Int32) -> Int64 {
        sqlite3_column_int64(handle, column)
    }

    func optionalInt64(_ column: Int32) -> Int64? {
        isNull(column) ? nil : int64(column)
    }

    func double(_ column: Int32) -> Double {
        sqlite3_column_double(handle, column)
    }

    /// The column as UTF-8 text; `nil` for NULL.
    func text(_ column: Int32) -> String? {
        guard !isNull(column), let bytes = sqlite3_column_text(handle, column) else { return nil }
        let count = Int(sqlite3_column_bytes(handle, column))
        return String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self)
    }
}

/// Encodes the JSON columns, remembering the last texts: most downloads share their headers and options. A text is
/// reused only for values identical byte for byte: Swift's `==` on strings is canonical equivalence, and a URL or
/// header in another normalization form is another request.
private struct FieldEncoder {
    let encoder: JSONEncoder
    private var lastHeaders: ([String], String)?
    private var lastOptions: (StoredOptions, String)?

    init(encoder: JSONEncoder) {
        self.encoder = encoder
    }

    mutating func headers(_ headers: [String], id: DownloadID) throws(CatalogError) -> String {
        if headers.isEmpty { return "[]" }
        if let lastHeaders, Self.identical(lastHeaders.0, headers) { return lastHeaders.1 }
        let text = try encode(headers, id: id)
        lastHeaders = (headers, text)
        return text
    }

    mutating func options(_ options: StoredOptions, id: DownloadID) throws(CatalogError) -> String {
        if let lastOptions, Self.identical(lastOptions.0, options) { return lastOptions.1 }
        let text = try encode(options, id: id)
        lastOptions = (options, text)
        return text
    }

    private static func identical(_ a: [String], _ b: [String]) -> Bool {
        a.count == b.count && zip(a, b).allSatisfy { $0.utf8.elementsEqual($1.utf8) }
    }

    private static func identical(_ a: Double?, _ b: Double?) -> Bool { a?.bitPattern == b?.bitPattern }

    /// Equal, with the strings equal byte for byte and the numbers bit for bit (`-0.0` encodes apart from `0.0`).
    private static func identical(_ a: StoredOptions, _ b: StoredOptions) -> Bool {
        a == b && identical(a.formerURLs, b.formerURLs) && identical(a.mirrors, b.mirrors)
            && identical(a.tuning.retryDelay, b.tuning.retryDelay)
            && identical(a.tuning.stallTimeout, b.tuning.stallTimeout)
            && identical(a.tuning.connectTimeout, b.tuning.connectTimeout)
    }

    private func encode(_ value: some Encodable, id: DownloadID) throws(CatalogError) -> String {
        do {
            return String(decoding: try encoder.encode(value), as: UTF8.self)
        } catch {
            throw CatalogError(.invalidValue, "cannot encode download \(id): \(error)")
        }
    }
}

/// Reads rows in `Catalog.columns` order, decoding each distinct JSON text once.
private struct RowDecoder {
    private let decoder = JSONDecoder()
    private var headers: [String: [String]] = ["[]": []]
    private var options: [String: StoredOptions] = [:]

    mutating func entry(_ row: Statement, path: String) throws(CatalogError) -> CatalogEntry {
        let id = DownloadID(rawValue: UInt64(bitPattern: row.int64(0)))
        let headersText = row.text(2) ?? "[]"
        let headers: [String]
        if let known = self.headers[headersText] {
            headers = known
        } else {
            guard let decoded = try? decoder.decode([String].self, from: Data(headersText.utf8)) else {
                throw CatalogError(.invalidValue, "download \(id) in \(path) has malformed headers: \(headersText)")
            }
            self.headers[headersText] = decoded
            headers = decoded
        }
        let kindText = row.text(3) ?? ""
        guard let kind = CatalogEntry.DestinationKind(rawValue: kindText) else {
            throw CatalogError(
                .invalidValue, "download \(id) in \(path) has an unknown destination kind \"\(kindText)\"")
        }
        let optionsText = row.text(7) ?? "{}"
        let options: StoredOptions
        if let known = self.options[optionsText] {
            options = known
        } else {
            // Lenient: text that is not even JSON reads as the defaults, like missing keys.
            options = (try? decoder.decode(StoredOptions.self, from: Data(optionsText.utf8))) ?? StoredOptions()
            self.options[optionsText] = options
        }
        let status =
            row.text(8).flatMap { CatalogEntry.Status.all.contains($0) ? $0 : nil }
            ?? CatalogEntry.Status.paused
        return CatalogEntry(
            id: id,
            url: row.text(1) ?? "",
            headers: headers,
            destinationKind: kind,
            destinationPath: row.text(4) ?? "",
            resolvedPath: row.text(5),
            checksum: row.text(6),
            options: options,
            status: status,
            errorCode: row.text(9),
            errorMessage: row.text(10),
            priority: Int(truncatingIfNeeded: row.int64(11)),
            position: row.int64(12),
            totalBytes: row.optionalInt64(13),
            completedBytes: row.int64(14),
            etag: row.text(15),
            lastModified: row.text(16),
            createdAt: row.double(17),
            updatedAt: row.double(18)
        )
    }
}
