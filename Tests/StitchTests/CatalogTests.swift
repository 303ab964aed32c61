import CSQLite
import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// The manager's SQLite catalog: every field round trips, ordering, single-row changes, all-or-nothing batches,
/// reopening, schema migration and refusal, and rebuilding after damage; plus `DownloadID`'s text forms.
@Suite struct CatalogTests {

    // MARK: DownloadID

    @Test(arguments: [
        (UInt64(0), "0000000000000000"), (1, "0000000000000001"), (0xDEAD_BEEF, "00000000deadbeef"),
        (1 << 63, "8000000000000000"), (UInt64.max, "ffffffffffffffff"),
    ])
    func downloadIDText(_ value: UInt64, _ text: String) throws {
        let id = DownloadID(rawValue: value)
        #expect(id.description == text)
        #expect(DownloadID(text) == id)
        #expect(DownloadID(text.uppercased()) == id)
        let json = try JSONEncoder().encode([id])
        #expect(String(decoding: json, as: UTF8.self) == "[\"\(text)\"]")
        #expect(try JSONDecoder().decode([DownloadID].self, from: json) == [id])
    }

    @Test func downloadIDParsing() {
        #expect(DownloadID("f") == DownloadID(rawValue: 15))
        #expect(DownloadID("00ff") == DownloadID(rawValue: 255))
        for bad in ["", "g", "0x1", "+1", "-1", " 1", "1 ", "12345678901234567", "ffffffffffffffff0", "é"] {
            #expect(DownloadID(bad) == nil, "\(bad)")
        }
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode([DownloadID].self, from: Data("[\"xyz\"]".utf8))
        }
        #expect(throws: DecodingError.self) { try JSONDecoder().decode([DownloadID].self, from: Data("[12]".utf8)) }
        #expect(DownloadID(rawValue: 1) < DownloadID(rawValue: UInt64.max))
    }

    @Test func randomDownloadIDIsNeverZero() {
        /// Yields zero twice before a real value.
        struct ZeroFirst: RandomNumberGenerator {
            var values: [UInt64] = [0, 0, 42]
            mutating func next() -> UInt64 { values.removeFirst() }
        }
        var generator = ZeroFirst()
        #expect(DownloadID.random(using: &generator) == DownloadID(rawValue: 42))
        let ids = Set((0..<1000).map { _ in DownloadID.random() })
        #expect(ids.count == 1000)
        #expect(!ids.contains(DownloadID(rawValue: 0)))
    }

    // MARK: Round trips

    @Test func everyFieldRoundTrips() throws {
        let dir = try CatalogDirectory()
        let catalog = try Catalog(directory: dir.path + "/new/nested")
        #expect(catalog.openReport == Catalog.OpenReport(created: true, migratedFrom: nil, rebuiltBecause: nil))
        #expect(try catalog.all().isEmpty)

        let full = CatalogEntry(
            id: DownloadID(rawValue: UInt64.max),
            url: "https://例え.jp/ファイル?q=✓&x=%20",
            headers: ["Authorization: Bearer a\"b\\c/d", "X-Emoji: 😀 naïve", "X-Empty:"],
            destinationKind: .directory,
            destinationPath: "/tmp/dir with spaces/Ünïcödé",
            resolvedPath: "/tmp/dir with spaces/Ünïcödé/файл.iso",
            checksum: "sha-256=" + String(repeating: "ab", count: 32),
            options: StoredOptions(connections: 8, overwrite: true, rateLimit: Int64.max, http2Streams: true),
            status: CatalogEntry.Status.failed,
            errorCode: "checksumMismatch",
            errorMessage: "expected … got …; a NUL \u{0} inside, and a\nnewline",
            priority: -3,
            position: Int64.min,
            totalBytes: Int64.max,
            completedBytes: 1 << 40,
            etag: "W/\"ētag\"",
            lastModified: "Tue, 15 Nov 1994 08:12:31 GMT",
            createdAt: 1_700_000_000.123_456,
            updatedAt: 1_700_000_123.5
        )
        let sparse = CatalogEntry(
            id: DownloadID(rawValue: 1 << 63), url: "", destinationKind: .file, destinationPath: "",
            position: Int64.max, createdAt: 0, updatedAt: -1.5)
        let other = makeEntry(2, position: 0)
        try catalog.insert([full, sparse, other])

        #expect(try catalog.entry(full.id) == full)
        #expect(try catalog.entry(sparse.id) == sparse)
        #expect(try catalog.entry(DownloadID(rawValue: 3)) == nil)
        #expect(try catalog.all() == [other, sparse, full])

        catalog.close()
        let reopened = try Catalog(directory: dir.path + "/new/nested")
        #expect(reopened.openReport == Catalog.OpenReport(created: false, migratedFrom: nil, rebuiltBecause: nil))
        #expect(try reopened.all() == [other, sparse, full])
    }

    @Test(arguments: CatalogKind.allCases)
    func orderIsPriorityThenPosition(_ kind: CatalogKind) throws {
        let dir = try CatalogDirectory()
        let catalog = try kind.open(dir)
        let entries = [
            makeEntry(1, priority: 0, position: 5), makeEntry(2, priority: 1, position: 9),
            makeEntry(3, priority: 0, position: -2), makeEntry(4, priority: 1, position: 3),
            makeEntry(5, priority: -1, position: 0), makeEntry(6, priority: 0, position: 5),
        ]
        try catalog.insert(entries)
        #expect(try catalog.all().map(\.id.rawValue) == [4, 2, 3, 1, 6, 5])
        #expect(try catalog.maxPosition() == 9)
        #expect(try catalog.minPosition() == -2)

        // To the front of priority 0: before everything.
        try catalog.setPosition(DownloadID(rawValue: 1), priority: 0, position: try catalog.minPosition() - 1)
        #expect(try catalog.all().map(\.id.rawValue) == [4, 2, 1, 3, 6, 5])
        // Raised to the top priority, at the back.
        try catalog.setPosition(DownloadID(rawValue: 5), priority: 1, position: try catalog.maxPosition() + 1)
        #expect(try catalog.all().map(\.id.rawValue) == [4, 2, 5, 1, 3, 6])
        #expect(try catalog.maxPosition() == 10)
        #expect(try catalog.minPosition() == -3)
    }

    @Test(arguments: CatalogKind.allCases)
    func emptyCatalogPositionsAreZero(_ kind: CatalogKind) throws {
        let dir = try CatalogDirectory()
        let catalog = try kind.open(dir)
        #expect(try catalog.maxPosition() == 0)
        #expect(try catalog.minPosition() == 0)
    }

    // MARK: Changes

    @Test(arguments: CatalogKind.allCases)
    func updateSetStatusSetPositionDelete(_ kind: CatalogKind) throws {
        let dir = try CatalogDirectory()
        let catalog = try kind.open(dir)
        let a = makeEntry(1, position: 1)
        let b = makeEntry(2, position: 2)
        try catalog.insert([a, b])

        var changed = a
        changed.url = "http://example.com/other"
        changed.headers = []
        changed.resolvedPath = "/x/y"
        changed.options = StoredOptions(connections: 2)
        changed.totalBytes = 100
        changed.completedBytes = 50
        changed.etag = "\"e\""
        changed.updatedAt = 99
        try catalog.update(changed)
        #expect(try catalog.entry(a.id) == changed)
        #expect(try catalog.entry(b.id) == b)

        try catalog.setStatus(
            a.id, status: CatalogEntry.Status.failed, errorCode: "httpStatus", errorMessage: "404 Not Found",
            updatedAt: 123)
        var expected = changed
        expected.status = "failed"
        expected.errorCode = "httpStatus"
        expected.errorMessage = "404 Not Found"
        expected.updatedAt = 123
        #expect(try catalog.entry(a.id) == expected)
        try catalog.setStatus(a.id, status: CatalogEntry.Status.queued, updatedAt: 124)
        expected.status = "queued"
        expected.errorCode = nil
        expected.errorMessage = nil
        expected.updatedAt = 124
        #expect(try catalog.entry(a.id) == expected)

        try catalog.setPosition(a.id, priority: 7, position: -4, updatedAt: 125)
        expected.priority = 7
        expected.position = -4
        expected.updatedAt = 125
        #expect(try catalog.entry(a.id) == expected)

        #expect(try catalog.delete(a.id))
        #expect(try !catalog.delete(a.id))
        #expect(try catalog.all() == [b])

        let missing = DownloadID(rawValue: 77)
        #expect(code(.notFound) { try catalog.update(makeEntry(77, position: 0)) })
        #expect(code(.notFound) { try catalog.setStatus(missing, status: "paused") })
        #expect(code(.notFound) { try catalog.setPosition(missing, priority: 0, position: 0) })
        #expect(code(.invalidValue) { try catalog.setStatus(b.id, status: "exploded") })
        var invalid = b
        invalid.status = "Running"
        #expect(code(.invalidValue) { try catalog.update(invalid) })
        #expect(code(.invalidValue) { try catalog.insert([makeEntry(8, position: 0), invalid]) })
        #expect(try catalog.all() == [b])
    }

    @Test(arguments: CatalogKind.allCases)
    func duplicateIDRollsBackTheWholeBatch(_ kind: CatalogKind) throws {
        let dir = try CatalogDirectory()
        let catalog = try kind.open(dir)
        let a = makeEntry(1, position: 1)
        try catalog.insert([a])

        let batch = [makeEntry(2, position: 2), makeEntry(3, position: 3), makeEntry(1, position: 4)]
        let error = try #require(throws: CatalogError.self) { try catalog.insert(batch) }
        #expect(error.code == .duplicateID)
        #expect(error.description.contains("0000000000000001"))
        #expect(error.description.contains(kind == .database ? "result code" : "already in the catalog"))
        #expect(try catalog.all() == [a])

        // Twice in the same batch.
        #expect(code(.duplicateID) { try catalog.insert([makeEntry(5, position: 5), makeEntry(5, position: 6)]) })
        #expect(try catalog.all() == [a])

        // The catalog is still usable (no transaction left open).
        try catalog.insert(Array(batch.prefix(2)))
        #expect(try catalog.all().count == 3)
        try catalog.insert([])
    }

    @Test func unknownStoredValuesReadLeniently() throws {
        let dir = try CatalogDirectory()
        var catalog = try Catalog(directory: dir.path)
        try catalog.insert([makeEntry(1, position: 1), makeEntry(2, position: 2), makeEntry(3, position: 3)])
        catalog.close()  // the catalog holds its file exclusively while open
        try execute(
            catalog.path,
            """
            UPDATE downloads SET status = 'exploded', options = '{"connections": 3, "fromTheFuture": [1]}' WHERE id = 1;
            UPDATE downloads SET status = '', options = 'not json' WHERE id = 2;
            UPDATE downloads SET options = '{"overwrite": "yes", "rateLimit": 5, "http2Streams": true}' WHERE id = 3;
            """)
        catalog = try Catalog(directory: dir.path)
        let entries = try catalog.all()
        #expect(entries.map(\.status) == ["paused", "paused", "queued"])
        #expect(
            entries.map(\.options) == [
                StoredOptions(connections: 3), StoredOptions(),
                StoredOptions(overwrite: false, rateLimit: 5, http2Streams: true),
            ])

        catalog.close()
        try execute(catalog.path, "UPDATE downloads SET destination_kind = 'pipe' WHERE id = 3")
        catalog = try Catalog(directory: dir.path)
        #expect(code(.invalidValue) { _ = try catalog.all() })
    }

    /// The catalog in memory (a dictionary, not SQLite) gives a database's answers: the same random changes, some
    /// failing (a duplicate ID, a download not there), applied to both, leave the same rows, order, positions and
    /// settings after each step, and fail alike.
    @Test func inMemoryAnswersAsTheDatabaseDoes() throws {
        let dir = try CatalogDirectory()
        let database = try Catalog(directory: dir.path)
        let memory = try Catalog(inMemory: ())
        var random = SplitMix64(seed: 35)
        func outcome(_ body: (Catalog) throws -> String, on catalog: Catalog) -> String {
            do {
                return try body(catalog)
            } catch let error as CatalogError {
                return error.code.description
            } catch {
                return "\(error)"
            }
        }
        // The rows, with a time the catalog took from the clock itself (a move's, an insert's moves') made the same:
        // each catalog reads the clock on its own.
        func rows(_ catalog: Catalog) throws -> [CatalogEntry] {
            try catalog.all().map {
                var entry = $0
                if entry.updatedAt > 1_750_000_000 { entry.updatedAt = -1 }
                return entry
            }
        }
        var failures = 0
        for step in 0..<400 {
            // IDs from a small range, so that changes find, miss and collide; some with the top bit set (SQLite
            // orders them as negative numbers).
            func id() -> UInt64 {
                let low = UInt64.random(in: 1...12, using: &random)
                return Bool.random(using: &random) ? low : low | 1 << 63
            }
            func position() -> Int64 { Int64.random(in: -3...3, using: &random) }
            // What the change answers: "ok", whether a delete found the download, or the error's code.
            let change: (Catalog) throws -> String
            switch Int.random(in: 0..<7, using: &random) {
            case 0:
                let entries = (0..<Int.random(in: 0...3, using: &random)).map { _ in
                    makeEntry(id(), priority: Int.random(in: -1...1, using: &random), position: position())
                }
                let moves = Bool.random(using: &random) ? [(DownloadID(rawValue: id()), 1, position())] : []
                change = { try $0.insert(entries, moving: moves); return "ok" }
            case 1:
                var entry = makeEntry(id(), priority: Int.random(in: -1...1, using: &random), position: position())
                entry.status = Bool.random(using: &random) ? CatalogEntry.Status.completed : "exploded"
                entry.totalBytes = Int64(step)
                change = { try $0.update(entry); return "ok" }
            case 2:
                let (target, failed) = (DownloadID(rawValue: id()), Bool.random(using: &random))
                change = {
                    try $0.setStatus(
                        target, status: failed ? "failed" : "paused", errorCode: failed ? "io" : nil,
                        errorMessage: failed ? "disk full" : nil, updatedAt: Double(step))
                    return "ok"
                }
            case 3:
                let (target, priority, at) = (DownloadID(rawValue: id()), Int.random(in: -1...1, using: &random), position())
                change = {
                    try $0.setPosition(target, priority: priority, position: at, updatedAt: Double(step))
                    return "ok"
                }
            case 4:
                let moves = (0..<Int.random(in: 1...3, using: &random)).map { _ in
                    (DownloadID(rawValue: id()), Int.random(in: -1...1, using: &random), position())
                }
                change = { try $0.setPositions(moves); return "ok" }
            case 5:
                let key = "k\(Int.random(in: 0..<3, using: &random))"
                let value = Bool.random(using: &random) ? "v\(step)" : nil
                change = { try $0.setSettings([key: value]); return "ok" }
            default:
                let target = DownloadID(rawValue: id())
                change = { "deleted \(try $0.delete(target))" }
            }
            let expected = outcome(change, on: database)
            #expect(outcome(change, on: memory) == expected, "step \(step)")
            if !expected.hasPrefix("ok") && !expected.hasPrefix("deleted") { failures += 1 }
            #expect(try rows(memory) == rows(database), "step \(step)")
            #expect(try memory.maxPosition() == database.maxPosition())
            #expect(try memory.minPosition() == database.minPosition())
            #expect(try memory.settings() == database.settings())
            for raw: UInt64 in [3, 3 | 1 << 63] {
                #expect(try memory.entry(DownloadID(rawValue: raw))?.url == database.entry(DownloadID(rawValue: raw))?.url)
            }
        }
        // Both kinds of outcome were exercised.
        #expect(failures > 20 && failures < 380, "\(failures)")
        #expect(try database.all().count > 3)
        memory.close()
        #expect(code(.closed) { _ = try memory.all() })
        #expect(code(.closed) { try memory.update(makeEntry(1, position: 0)) })
        #expect(code(.closed) { try memory.setSettings(["a": "b"]) })
    }

    // MARK: Opening and closing

    @Test func closeIsIdempotentAndLaterCallsThrow() throws {
        let dir = try CatalogDirectory()
        let catalog = try Catalog(directory: dir.path)
        try catalog.insert([makeEntry(1, position: 1)])
        #expect(try catalog.all().count == 1)  // caches a statement that close must finalize
        catalog.close()
        catalog.close()
        #expect(code(.closed) { _ = try catalog.all() })
        #expect(code(.closed) { try catalog.insert([makeEntry(2, position: 2)]) })
        #expect(code(.closed) { _ = try catalog.maxPosition() })
        // Closed cleanly: the WAL was checkpointed and removed.
        #expect(!fileExists(catalog.path + "-wal"))
        #expect(try Catalog(directory: dir.path).all().count == 1)
    }

    /// One owner at a time: a second catalog on the directory is refused as busy (and the first's file is neither
    /// moved aside nor changed); once the first closes, the second opens and sees everything.
    @Test func secondCatalogOnOneDirectoryIsRefusedWhileTheFirstIsOpen() throws {
        let dir = try CatalogDirectory()
        let first = try Catalog(directory: dir.path)
        try first.insert([makeEntry(1, position: 1)])
        #expect(code(.busy) { _ = try Catalog(directory: dir.path) })
        try first.insert([makeEntry(2, position: 2)])
        #expect(try first.all().map(\.id.rawValue) == [1, 2])
        first.close()
        let second = try Catalog(directory: dir.path)
        #expect(second.openReport.created == false && second.openReport.rebuiltBecause == nil)
        #expect(try second.all().map(\.id.rawValue) == [1, 2])
        // Reopened at the current schema (nothing written at open) it is just as exclusive.
        #expect(code(.busy) { _ = try Catalog(directory: dir.path) })
        second.close()
    }

    @Test func migratesFromVersion1() throws {
        let dir = try CatalogDirectory()
        let path = dir.path + "/catalog.sqlite3"
        try execute(
            path,
            """
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
                error_message TEXT,
                position INTEGER NOT NULL,
                total_bytes INTEGER,
                completed_bytes INTEGER NOT NULL DEFAULT 0,
                etag TEXT,
                last_modified TEXT,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL
            );
            CREATE INDEX downloads_position ON downloads (position);
            INSERT INTO downloads VALUES
                (-1, 'http://a/1', '["X-A: 1"]', 'file', '/d/1', NULL, NULL, '{"overwrite":true}', 'failed',
                 'disk full', 2, 10, 5, '"e"', NULL, 10.5, 11.5),
                (7, 'http://a/2', '[]', 'directory', '/d', '/d/2', 'sha-256=00', '{}', 'completed',
                 NULL, 1, NULL, 0, NULL, 'Tue, 15 Nov 1994 08:12:31 GMT', 20, 21);
            PRAGMA user_version = 1;
            """)

        let catalog = try Catalog(directory: dir.path)
        #expect(catalog.openReport == Catalog.OpenReport(created: false, migratedFrom: 1, rebuiltBecause: nil))
        let expected = [
            CatalogEntry(
                id: DownloadID(rawValue: 7), url: "http://a/2", destinationKind: .directory, destinationPath: "/d",
                resolvedPath: "/d/2", checksum: "sha-256=00", status: "completed", position: 1,
                lastModified: "Tue, 15 Nov 1994 08:12:31 GMT", createdAt: 20, updatedAt: 21),
            CatalogEntry(
                id: DownloadID(rawValue: UInt64.max), url: "http://a/1", headers: ["X-A: 1"], destinationKind: .file,
                destinationPath: "/d/1", options: StoredOptions(overwrite: true), status: "failed",
                errorCode: nil, errorMessage: "disk full", priority: 0, position: 2, totalBytes: 10,
                completedBytes: 5, etag: "\"e\"", createdAt: 10.5, updatedAt: 11.5),
        ]
        #expect(try catalog.all() == expected)
        // The new columns work.
        try catalog.setPosition(DownloadID(rawValue: UInt64.max), priority: 1, position: 2, updatedAt: 1)
        try catalog.setStatus(DownloadID(rawValue: 7), status: "failed", errorCode: "io", errorMessage: "x")
        #expect(try catalog.all().map(\.id.rawValue) == [UInt64.max, 7])
        // Version 3's settings table too.
        try catalog.setSettings(["a": "1"])
        #expect(try catalog.settings() == ["a": "1"])
        catalog.close()

        #expect(try query(path, "PRAGMA user_version") == "3")
        let reopened = try Catalog(directory: dir.path)
        #expect(reopened.openReport == Catalog.OpenReport(created: false, migratedFrom: nil, rebuiltBecause: nil))
        #expect(try reopened.entry(DownloadID(rawValue: 7))?.errorCode == "io")
    }

    /// Settings are kept across a reopen; set in one transaction (a nil value forgets a key).
    @Test func settingsAreKept() throws {
        let dir = try CatalogDirectory()
        let catalog = try Catalog(directory: dir.path)
        #expect(try catalog.settings().isEmpty)
        try catalog.setSettings(["rpc.max-tries": "3", "rpc.split": "4", "x": "y"])
        try catalog.setSettings(["rpc.split": nil, "x": "z"])
        catalog.close()
        let reopened = try Catalog(directory: dir.path)
        #expect(try reopened.settings() == ["rpc.max-tries": "3", "x": "z"])
        reopened.close()
    }

    @Test func newerSchemaIsRefusedAndLeftAlone() throws {
        let dir = try CatalogDirectory()
        let path = dir.path + "/catalog.sqlite3"
        try execute(path, "CREATE TABLE downloads (id INTEGER PRIMARY KEY, shape TEXT); PRAGMA user_version = 4;")
        let before = try readFile(path)

        let error = try #require(throws: CatalogError.self) { try Catalog(directory: dir.path) }
        #expect(error.code == .newerSchema)
        #expect(error.description.contains("version 4"))
        #expect(try readFile(path) == before)
        #expect(!fileExists(path + "-wal"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path) == ["catalog.sqlite3"])
    }

    @Test func foreignDatabaseIsRefused() throws {
        let dir = try CatalogDirectory()
        try execute(dir.path + "/catalog.sqlite3", "CREATE TABLE other (x)")
        #expect(code(.notACatalog) { _ = try Catalog(directory: dir.path) })
        #expect(try query(dir.path + "/catalog.sqlite3", "SELECT count(*) FROM other") == "0")
    }

    /// An empty file (a catalog truncated to nothing) becomes a new catalog, reported as rebuilt so the manager
    /// looks for state files.
    @Test func emptyFileBecomesACatalogReportedAsRebuilt() throws {
        let dir = try CatalogDirectory()
        try writeFile(dir.path + "/catalog.sqlite3", [])
        let catalog = try Catalog(directory: dir.path)
        #expect(catalog.openReport.created)
        #expect(catalog.openReport.rebuiltBecause?.contains("empty file") == true)
        try catalog.insert([makeEntry(1, position: 1)])
        catalog.close()
        #expect(try Catalog(directory: dir.path).openReport.rebuiltBecause == nil)
    }

    // MARK: Damage

    enum Damage: String, CaseIterable, Sendable {
        case zeroFilled
        case garbage
        case truncated
        case overwrittenPage
    }

    @Test(arguments: Damage.allCases)
    func damagedCatalogIsMovedAsideAndRebuilt(_ damage: Damage) throws {
        let dir = try CatalogDirectory()
        let path = dir.path + "/catalog.sqlite3"
        switch damage {
        case .zeroFilled:
            try writeFile(path, [UInt8](repeating: 0, count: 16384))
        case .garbage:
            var generator = SplitMix64(seed: 7)
            try writeFile(path, (0..<10000).map { _ in UInt8.random(in: 0...255, using: &generator) })
        case .truncated, .overwrittenPage:
            let catalog = try Catalog(directory: dir.path)
            try catalog.insert((1...2000).map { makeEntry(UInt64($0), position: Int64($0)) })
            catalog.close()
            var bytes = try readFile(path)
            #expect(bytes.count > 64 * 1024)
            if damage == .truncated {
                bytes.removeLast(bytes.count / 2)
            } else {
                // The second page is the root of the downloads table.
                var generator = SplitMix64(seed: 11)
                for index in 4096..<8192 { bytes[index] = UInt8.random(in: 0...255, using: &generator) }
            }
            try writeFile(path, bytes)
        }
        // A leftover WAL of the damaged file must not be replayed into the new catalog: SQLite drops it when the
        // failed connection closes, or the catalog moves it aside with the file.
        try writeFile(path + "-wal", Array("not a wal".utf8))
        try writeFile(path + "-shm", [UInt8](repeating: 0, count: 100))
        let damagedBytes = try readFile(path)

        let catalog = try Catalog(directory: dir.path)
        let reason = try #require(catalog.openReport.rebuiltBecause)
        print("\(damage): \(reason)")
        #expect(catalog.openReport.created)
        #expect(catalog.openReport.migratedFrom == nil)
        #expect(!reason.contains("\n"))
        let names = try FileManager.default.contentsOfDirectory(atPath: dir.path)
        let moved = try #require(names.first { $0.hasPrefix("catalog.sqlite3.corrupt-") && !$0.contains("-wal") })
        #expect(reason.contains(dir.path + "/" + moved))
        #expect(try readFile(dir.path + "/" + moved) == damagedBytes)
        #expect((try? readFile(path + "-wal")) != Array("not a wal".utf8))
        if fileExists(dir.path + "/" + moved + "-wal") {
            #expect(try readFile(dir.path + "/" + moved + "-wal") == Array("not a wal".utf8))
        }
        let seconds = try #require(Int(moved.dropFirst("catalog.sqlite3.corrupt-".count)))
        #expect(abs(seconds - Int(time(nil))) < 60)

        #expect(try catalog.all().isEmpty)
        try catalog.insert([makeEntry(1, position: 1)])
        catalog.close()
        let reopened = try Catalog(directory: dir.path)
        #expect(reopened.openReport == Catalog.OpenReport(created: false, migratedFrom: nil, rebuiltBecause: nil))
        #expect(try reopened.all().map(\.id.rawValue) == [1])
    }

    @Test func secondRebuildInTheSameSecondKeepsBothFiles() throws {
        let dir = try CatalogDirectory()
        let path = dir.path + "/catalog.sqlite3"
        try writeFile(path, Array(String(repeating: "garbage ", count: 1000).utf8))
        let first = try #require(try Catalog(directory: dir.path).openReport.rebuiltBecause)
        try writeFile(path, Array(String(repeating: "rubbish ", count: 1000).utf8))
        let second = try #require(try Catalog(directory: dir.path).openReport.rebuiltBecause)
        #expect(first != second)
        let names = try FileManager.default.contentsOfDirectory(atPath: dir.path)
        #expect(names.filter { $0.hasPrefix("catalog.sqlite3.corrupt-") }.count == 2)
    }

    // MARK: Scale

    @Test func tenThousandRows() throws {
        let dir = try CatalogDirectory()
        let clock = ContinuousClock()
        var generator = SplitMix64(seed: 10_000)
        let entries = (0..<10_000).map { index in
            var entry = makeEntry(
                DownloadID.random(using: &generator).rawValue, priority: Int(index % 3),
                position: Int64.random(in: -1_000_000...1_000_000, using: &generator))
            if index % 2 == 0 { entry.headers = ["X-Index: \(index)"] }
            if index % 5 == 0 { entry.options = StoredOptions(connections: index % 16, rateLimit: Int64(index)) }
            entry.totalBytes = index % 7 == 0 ? nil : Int64(index) * 1000
            return entry
        }
        // Positions are drawn at random and may repeat; the catalog then orders by ID (signed, as SQLite compares).
        let expectedIDs = entries.sorted {
            if $0.priority != $1.priority { return $0.priority > $1.priority }
            if $0.position != $1.position { return $0.position < $1.position }
            return Int64(bitPattern: $0.id.rawValue) < Int64(bitPattern: $1.id.rawValue)
        }.map(\.id)

        let catalog = try Catalog(directory: dir.path)
        let insertStart = clock.now
        try catalog.insert(entries)
        let insertTime = clock.now - insertStart
        catalog.close()

        let openStart = clock.now
        let reopened = try Catalog(directory: dir.path)
        let openTime = clock.now - openStart
        let readStart = clock.now
        let read = try reopened.all()
        let readTime = clock.now - readStart
        print("catalog, 10,000 rows: insert \(insertTime), open \(openTime), all() \(readTime)")

        #expect(read.count == 10_000)
        #expect(read.map(\.id) == expectedIDs)
        let byID = Dictionary(uniqueKeysWithValues: entries.map { ($0.id, $0) })
        #expect(read.allSatisfy { byID[$0.id] == $0 })
        #expect(try reopened.maxPosition() == entries.map(\.position).max())
    }

    // MARK: Helpers

    func makeEntry(_ id: UInt64, priority: Int = 0, position: Int64) -> CatalogEntry {
        CatalogEntry(
            id: DownloadID(rawValue: id), url: "http://example.com/file\(id)", headers: [],
            destinationKind: .file, destinationPath: "/downloads/file\(id)", status: CatalogEntry.Status.queued,
            priority: priority, position: position, createdAt: 1_700_000_000, updatedAt: 1_700_000_000)
    }

    /// Whether `body` throws a `CatalogError` with `expected` code.
    func code(_ expected: CatalogError.Code, _ body: () throws -> Void) -> Bool {
        do {
            try body()
            return false
        } catch let error as CatalogError {
            return error.code == expected
        } catch {
            return false
        }
    }
}

/// The two kinds of catalog: a database file, and rows in memory only.
enum CatalogKind: CaseIterable, CustomTestStringConvertible, Sendable {
    case database
    case memory

    func open(_ dir: CatalogDirectory) throws -> Catalog {
        switch self {
        case .database: try Catalog(directory: dir.path)
        case .memory: try Catalog(inMemory: ())
        }
    }

    var testDescription: String { self == .database ? "database" : "memory" }
}

/// A fresh directory under the temporary directory, named by a UUID, removed with its contents on release.
final class CatalogDirectory {
    let path: String

    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("stitch-catalog-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// Runs raw SQL on the database at `path` with a separate connection (fixtures and tampering).
private func execute(_ path: String, _ sql: String) throws {
    var handle: OpaquePointer?
    defer { sqlite3_close_v2(handle) }
    guard sqlite3_open(path, &handle) == SQLITE_OK else { throw RawSQLError(message: "cannot open \(path)") }
    var message: UnsafeMutablePointer<CChar>?
    guard sqlite3_exec(handle, sql, nil, nil, &message) == SQLITE_OK else {
        defer { sqlite3_free(message) }
        throw RawSQLError(message: message.map { String(cString: $0) } ?? "failed")
    }
}

/// The first column of the first row of `sql`, as text.
private func query(_ path: String, _ sql: String) throws -> String? {
    var handle: OpaquePointer?
    defer { sqlite3_close_v2(handle) }
    guard sqlite3_open(path, &handle) == SQLITE_OK else { throw RawSQLError(message: "cannot open \(path)") }
    var statement: OpaquePointer?
    guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else {
        throw RawSQLError(message: String(cString: sqlite3_errmsg(handle)))
    }
    defer { sqlite3_finalize(statement) }
    guard sqlite3_step(statement) == SQLITE_ROW else { return nil }
    return sqlite3_column_text(statement, 0).map { String(cString: $0) }
}

private struct RawSQLError: Error {
    var message: String
}
