import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// `DownloadRequest.ifNewer` (`stitch get -N`, aria2's `conditional-get`) end to end over the real transport: the
/// request carries what the file at the destination came with, a 304 (or a 200 that shows the same file) leaves it
/// untouched, a newer file replaces it only once complete, and an interrupted update resumes by the rules.
@Suite struct ConditionalDownloadTests {
    static let size = 1 << 20
    static let older = ServedFile.httpDate(secondsSince1970: 1_700_000_000)
    static let newer = ServedFile.httpDate(secondsSince1970: 1_700_086_400)

    static func ifNewer(_ f: Fixture, checksum: ExpectedChecksum? = nil) -> DownloadRequest {
        var request = f.request(checksum: checksum)
        request.ifNewer = true
        return request
    }

    /// Inode and modification time: what shows a file was left as it was.
    static func identity(_ path: String) -> [Int] {
        var info = stat()
        guard stat(path, &info) == 0 else { return [] }
        return [Int(info.st_ino), Int(info.st_mtim.tv_sec), Int(info.st_mtim.tv_nsec)]
    }

    static func notices(_ f: Fixture) -> [String] {
        f.watch.events.compactMap { if case .notice(let text) = $0 { text } else { nil } }
    }

    @Test func unchangedFileIsLeftAsItIs() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 71, etag: "\"c1\"", lastModified: Self.older)
        f.serve(file)
        _ = try await f.download(f.request())
        f.watch.disarm()
        let before = Self.identity(f.dest)

        let result = try await f.download(Self.ifNewer(f))
        #expect(result.notModified && result.alreadyComplete)
        #expect(result.bytes == Int64(Self.size) && result.bytesTransferred == 0)
        let asked = try #require(f.server.requests.last)
        #expect(f.server.requests.count == 2)
        #expect(asked.header("If-None-Match") == "\"c1\"")
        #expect(asked.header("If-Modified-Since") == Self.older)  // the server's own date, from the mark
        // (URLSession asks for the whole file in windows: a range from 0.)
        #expect(asked.header("Range") == nil || TestBackend.selected.requestWindow != nil)
        #expect(Self.identity(f.dest) == before)
        #expect(try readFile(f.dest) == file.data)
        #expect(try f.leftovers() == ["file.bin"])
        #expect(Self.notices(f).contains { $0.contains("is up to date (the server answered 304 Not Modified)") })
    }

    @Test func newerFileReplacesItOnceComplete() async throws {
        let f = try Fixture()
        let v1 = ServedFile.random(size: Self.size, seed: 72, etag: "\"c1\"", lastModified: Self.older)
        let v2 = ServedFile.random(size: Self.size + 5, seed: 73, etag: "\"c2\"", lastModified: Self.newer)
        f.serve(v1)
        _ = try await f.download(f.request())
        f.watch.disarm()
        f.server.replaceFile("/file.bin", with: v2)

        let result = try await f.download(Self.ifNewer(f))
        #expect(!result.notModified && !result.alreadyComplete)
        try f.expectComplete(result, v2.data)
        #expect(f.server.requests.last?.header("If-None-Match") == "\"c1\"")

        // The new file's mark is what the next check goes by.
        let again = try await f.download(Self.ifNewer(f))
        #expect(again.notModified)
        #expect(f.server.requests.last?.header("If-None-Match") == "\"c2\"")
        #expect(f.server.requests.last?.header("If-Modified-Since") == Self.newer)
    }

    @Test func aServerIgnoringTheConditionIsJudgedByItsAnswer() async throws {
        let f = try Fixture()
        var v1 = ServedFile.random(size: Self.size, seed: 74, etag: "\"c1\"", lastModified: Self.older)
        v1.honoursConditions = false
        f.serve(v1)
        _ = try await f.download(f.request())
        f.watch.disarm()
        let before = Self.identity(f.dest)

        // The same strong ETag and length in a 200: the same file; its body is not taken.
        let same = try await f.download(Self.ifNewer(f))
        #expect(same.notModified && same.bytesTransferred == 0)
        #expect(Self.identity(f.dest) == before)
        #expect(Self.notices(f).contains { $0.contains("the server ignored the condition but sent the same ETag") })

        // Another ETag: fetched and replaced.
        var v2 = ServedFile.random(size: Self.size, seed: 75, etag: "\"c2\"", lastModified: Self.older)
        v2.honoursConditions = false
        f.server.replaceFile("/file.bin", with: v2)
        let changed = try await f.download(Self.ifNewer(f))
        #expect(!changed.notModified)
        try f.expectComplete(changed, v2.data)
    }

    @Test func aFileFromElsewhereGoesByItsModificationTime() async throws {
        let f = try Fixture()
        f.watch.disarm()
        let mine = Array("a file another program wrote\n".utf8)
        try Data(mine).write(to: URL(fileURLWithPath: f.dest))
        var times = [timespec(tv_sec: 1_700_040_000, tv_nsec: 0), timespec(tv_sec: 1_700_040_000, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, f.dest, &times, 0) == 0)
        let stamp = ServedFile.httpDate(secondsSince1970: 1_700_040_000)

        // Without the option a file Stitch did not leave is refused, as before.
        let older = ServedFile.random(size: Self.size, seed: 76, lastModified: Self.older)
        f.serve(older)
        let refused = await #expect(throws: DownloadError.self) { try await f.download(f.request()) }
        #expect(refused?.code == .destinationExists)

        // The server's file is older than this one: 304, untouched.
        let kept = try await f.download(Self.ifNewer(f))
        #expect(kept.notModified)
        #expect(f.server.requests.last?.header("If-Modified-Since") == stamp)
        #expect(f.server.requests.last?.header("If-None-Match") == nil)
        #expect(try readFile(f.dest) == mine)

        // Newer on the server: replaced.
        let newer = ServedFile.random(size: Self.size, seed: 77, lastModified: Self.newer)
        f.server.replaceFile("/file.bin", with: newer)
        let replaced = try await f.download(Self.ifNewer(f))
        try f.expectComplete(replaced, newer.data)
    }

    @Test func anInterruptedUpdateResumesAndTheOldFileStaysUntilTheEnd() async throws {
        let f = try Fixture()
        let v1 = ServedFile.random(size: Self.size, seed: 78, etag: "\"c1\"", lastModified: Self.older)
        let v2 = ServedFile.random(size: 2 * Self.size, seed: 79, etag: "\"c2\"", lastModified: Self.newer)
        f.serve(v1)
        _ = try await f.download(f.request())
        f.watch.disarm()
        f.serve(v2, faults: .onRequest(1, .stallAfter(600_000, then: .close)))

        try await f.interruptedDownload(Self.ifNewer(f), at: 600_000)
        #expect(try readFile(f.dest) == v1.data)  // the old file stays until the new one is complete

        let result = try await f.download(Self.ifNewer(f))
        try f.expectComplete(result, v2.data)
        #expect(result.resumedFrom == 600_000)
        let resumed = try #require(f.server.requests.last)
        #expect(resumed.header("Range")?.hasPrefix("bytes=600000-") == true)
        #expect(resumed.header("If-Range") == "\"c2\"")
        #expect(resumed.header("If-None-Match") == nil)
    }

    /// A partial of a plain download (not begun as the newer file under -N) beside a file that appeared there is
    /// not allowed to replace it: refused as without -N, the partial kept.
    @Test func aPlainPartialBesideAFileDoesNotReplaceIt() async throws {
        let f = try Fixture()
        let v1 = ServedFile.random(size: Self.size, seed: 82, etag: "\"c1\"", lastModified: Self.older)
        f.serve(v1, faults: .onRequest(0, .stallAfter(600_000, then: .close)))
        try await f.interruptedDownload(f.request(), at: 600_000)
        f.watch.disarm()
        let mine = Array("put here meanwhile\n".utf8)
        try Data(mine).write(to: URL(fileURLWithPath: f.dest))
        let error = await #expect(throws: DownloadError.self) { try await f.download(Self.ifNewer(f)) }
        #expect(error?.code == .destinationExists, "\(String(describing: error))")
        #expect(try readFile(f.dest) == mine)
        #expect(fileSize(f.paths.part) ?? 0 > 0, "the partial is kept")
    }

    @Test func aFileThatFailsTheChecksumIsFetchedWhatever() async throws {
        let f = try Fixture()
        let file = ServedFile.random(size: Self.size, seed: 80, etag: "\"c1\"", lastModified: Self.older)
        f.serve(file)
        _ = try await f.download(f.request())
        f.watch.disarm()
        // Damaged in place (the mark still says complete).
        let fd = open(f.dest, O_WRONLY)
        #expect(pwrite(fd, [0xFF, 0xFF], 2, 1000) == 2)
        close(fd)
        let checksum = try ExpectedChecksum(algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: file.data))

        let result = try await f.download(Self.ifNewer(f, checksum: checksum))
        #expect(!result.notModified)
        try f.expectComplete(result, file.data)
        #expect(f.server.requests.last?.header("If-None-Match") == nil)
        #expect(Self.notices(f).contains { $0.contains("does not match") })
    }

    @Test func inAFolderTheNameComesFromTheURL() async throws {
        let f = try Fixture(directoryMode: true)
        let file = ServedFile.random(
            size: Self.size, seed: 81, etag: "\"c1\"", lastModified: Self.older,
            contentDisposition: "attachment; filename=\"other.bin\"")
        f.serve(file)
        var request = f.request()
        request.ifNewer = true
        let first = try await f.download(request)
        #expect(first.destination == f.downloads + "/file.bin")
        #expect(try readFile(f.downloads + "/file.bin") == file.data)
        f.watch.disarm()
        let again = try await f.download(request)
        #expect(again.notModified)
        #expect(!fileExists(f.downloads + "/other.bin"))
    }

    // MARK: Pure decisions

    @Test func policyDecisions() throws {
        let condition = FreshnessCondition(etag: "\"e\"", modifiedSince: Self.older, serverDate: true, length: 10)
        let plan = RequestPlan(rangeStart: nil, resumeOffset: 0, ifRange: nil, condition: condition)
        let headers = ResumePolicy.requestHeaders(
            user: HTTPHeaders([("If-None-Match", "\"mine\""), ("X-A", "1")]), plan: plan)
        func values(_ name: String) -> [String] { headers.filter { $0.name == name }.map(\.value) }
        #expect(values("If-None-Match") == ["\"e\""])
        #expect(values("If-Modified-Since") == [Self.older])
        #expect(values("X-A") == ["1"])

        func head(_ status: Int, _ fields: [(String, String)]) -> ResponseHead {
            ResponseHead(status: status, headers: HTTPHeaders(fields))
        }
        func isNotModified(_ verdict: HeadVerdict) -> Bool { if case .notModified = verdict { true } else { false } }
        #expect(isNotModified(ResumePolicy.evaluate(head(304, []), plan: plan, known: nil)))
        // A 304 to a request without a condition is no answer.
        let plain = RequestPlan(rangeStart: nil, resumeOffset: 0, ifRange: nil)
        #expect(ResumePolicy.evaluate(head(304, []), plan: plain, known: nil) == .fail(status: 304))
        // 200s: the same strong ETag and length; a weak one or another length is newer.
        let same = head(200, [("ETag", "\"e\""), ("Content-Length", "10")])
        #expect(isNotModified(ResumePolicy.evaluate(same, plan: plan, known: nil)))
        for other in [
            head(200, [("ETag", "W/\"e\""), ("Content-Length", "10")]),
            head(200, [("ETag", "\"e\""), ("Content-Length", "11")]),
            head(200, [("ETag", "\"f\""), ("Content-Length", "10")]),
        ] {
            #expect(!isNotModified(ResumePolicy.evaluate(other, plan: plan, known: nil)))
        }
        // Without an ETag: Last-Modified no later than the date and the same length.
        let byDate = FreshnessCondition(etag: nil, modifiedSince: Self.newer, serverDate: false, length: 10)
        let datePlan = RequestPlan(rangeStart: nil, resumeOffset: 0, ifRange: nil, condition: byDate)
        #expect(
            isNotModified(
                ResumePolicy.evaluate(
                    head(200, [("Last-Modified", Self.older), ("Content-Length", "10")]), plan: datePlan, known: nil)))
        #expect(
            !isNotModified(
                ResumePolicy.evaluate(
                    head(200, [("Last-Modified", Self.newer), ("Content-Length", "9")]), plan: datePlan, known: nil)))
        #expect(
            !isNotModified(
                ResumePolicy.evaluate(
                    head(200, [("Last-Modified", ServedFile.httpDate(secondsSince1970: 1_800_000_000)),
                        ("Content-Length", "10")]), plan: datePlan, known: nil)))
        // An ETag in the condition decides alone: another (even weak) one with an old date is a new file.
        #expect(
            !isNotModified(
                ResumePolicy.evaluate(
                    head(200, [("ETag", "W/\"f\""), ("Last-Modified", Self.older), ("Content-Length", "10")]),
                    plan: plan, known: nil)))
        // A ranged request never carries the condition.
        let ranged = RequestPlan(rangeStart: 5, resumeOffset: 5, ifRange: "\"e\"", condition: condition)
        #expect(ResumePolicy.headers(for: ranged).allSatisfy { $0.0 != "If-None-Match" })
    }
}
