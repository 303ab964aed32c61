import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport
@testable import StitchURLSession

/// The background driver end to end, over real FoundationNetworking download tasks (`URLSessionDownloadTasks`)
/// against the fault-injecting server and nginx, and over a fake session that keeps its tasks across driver
/// instances (what a relaunch looks like, which corelibs cannot do) for the crash and relaunch cases. Every file is
/// compared byte for byte; every request after the probe must carry `If-Range`.
@Suite struct BackgroundDownloadsTests {
    static let etag = "\"bgd\""
    static let mib = 1 << 20

    /// A folder for one test: the downloads and the driver's state directory.
    final class Folder: Sendable {
        let path: String
        var state: String { path + "/state" }
        func file(_ name: String) -> String { path + "/" + name }

        init() throws {
            var template = Array("/tmp/stitch-bg-XXXXXX".utf8CString)
            let made = try #require(template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) })
            path = String(cString: made)
        }

        deinit { try? FileManager.default.removeItem(atPath: path) }

        /// Names in the folder other than the state directory and a fake session's (what a download left beside its
        /// file).
        var names: [String] {
            ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).filter { $0 != "state" && $0 != "session" }
                .sorted()
        }

        var stagedNames: [String] { ((try? FileManager.default.contentsOfDirectory(atPath: state + "/staged")) ?? []).sorted() }
    }

    static func configuration(rangeSize: Int = mib) -> BackgroundDownloads.Configuration {
        var configuration = BackgroundDownloads.Configuration()
        configuration.rangeSize = Int64(rangeSize)
        configuration.retryDelay = .milliseconds(10)
        return configuration
    }

    /// A driver over FoundationNetworking's download tasks, keeping its state in the test's folder.
    static func driver(_ folder: Folder) throws -> BackgroundDownloads {
        try BackgroundDownloads(identifier: "test", stateDirectory: folder.state, configuration: configuration())
    }

    /// Reads events until one ends the download `id` (finished or failed); every event on the way is returned.
    static func events(
        of downloads: BackgroundDownloads, until id: DownloadID, timeout: Duration = .seconds(120)
    ) async -> [BackgroundDownloadEvent] {
        await withTaskGroup(of: [BackgroundDownloadEvent]?.self) { group in
            group.addTask {
                var seen: [BackgroundDownloadEvent] = []
                for await event in downloads.events {
                    seen.append(event)
                    switch event {
                    case .finished(id, _), .failed(id, _): return seen
                    default: continue
                    }
                }
                return seen
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first ?? []
        }
    }

    static func finished(_ events: [BackgroundDownloadEvent]) -> Bool {
        if case .finished = events.last { return true }
        return false
    }

    static func contents(_ path: String) -> [UInt8]? {
        FileManager.default.contents(atPath: path).map { [UInt8]($0) }
    }

    /// Expects the file at `path` to hold exactly `data`; on failure says how it differs (not both arrays whole).
    static func expectFile(_ path: String, _ data: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
        guard let found = contents(path) else {
            Issue.record("no file at \(path)", sourceLocation: sourceLocation)
            return
        }
        if found == data { return }
        let difference = zip(found, data).enumerated().first { $0.element.0 != $0.element.1 }?.offset
        Issue.record(
            "\(path) has \(found.count) bytes, expected \(data.count); first difference at \(difference.map(String.init) ?? "none")",
            sourceLocation: sourceLocation)
    }

    /// Every range request carries the validator, and nothing asks for the same bytes twice unless a fault made it.
    static func expectValidated(_ requests: [RecordedRequest], etag: String = etag, sourceLocation: SourceLocation = #_sourceLocation) {
        for request in requests.dropFirst() where request.range != nil {
            #expect(request.header("If-Range") == etag, "\(request.range ?? "")", sourceLocation: sourceLocation)
        }
        #expect(requests.first?.header("If-Range") == nil, sourceLocation: sourceLocation)
        #expect(requests.allSatisfy { $0.header("Accept-Encoding") == "identity" }, sourceLocation: sourceLocation)
    }

    // MARK: Over FoundationNetworking's download tasks

    @Test func aFileArrivesInValidatedRangesByteExact() async throws {
        let folder = try Folder()
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 5 * Self.mib + 12_345, seed: 0xB61, etag: Self.etag)
        server.serve("/file", file: file)
        let downloads = try Self.driver(folder)
        let id = try await downloads.add(server.url("/file"), to: folder.file("out.bin"))
        let events = await Self.events(of: downloads, until: id)
        #expect(Self.finished(events), "\(events)")
        Self.expectFile(folder.file("out.bin"), file.data)
        #expect(folder.names == ["out.bin"], "left beside the file")
        #expect(folder.stagedNames.isEmpty)
        #expect(await downloads.downloads().isEmpty)
        let requests = server.requests
        #expect(requests.count == 6, "\(requests.map { $0.range ?? "" })")
        #expect(requests.first?.range == "bytes=0-1048575")
        #expect(Set(requests.compactMap(\.range)).count == requests.count, "a range asked for twice")
        Self.expectValidated(requests)
        // Progress only grows, and only in whole ranges.
        let progress = events.compactMap { event -> Int64? in
            if case .progress(_, let durable, _) = event { return durable }
            return nil
        }
        #expect(progress == progress.sorted() && progress.last == Int64(file.data.count), "\(progress)")
        await downloads.close()
    }

    @Test func aCutRangeIsAskedForAgainAndNothingOfItIsKept() async throws {
        let folder = try Folder()
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3 * Self.mib, seed: 0xB62, etag: Self.etag)
        // The second request is cut after 100 000 bytes, the third is reset: each range is asked for again.
        server.serve("/file", file: file, faults: .onRequests([1: .dropAfter(100_000), 2: .resetAfter(5000)]))
        let downloads = try Self.driver(folder)
        let id = try await downloads.add(server.url("/file"), to: folder.file("out.bin"))
        let events = await Self.events(of: downloads, until: id)
        #expect(Self.finished(events), "\(events)")
        Self.expectFile(folder.file("out.bin"), file.data)
        #expect(server.requests.count == 5, "\(server.requests.map { $0.range ?? "" })")
        Self.expectValidated(server.requests)
        #expect(!events.contains { if case .restarted = $0 { return true } else { return false } })
        await downloads.close()
    }

    @Test(arguments: ["ignoreRange", "changed", "wrongContentRange"])
    func aChangedFileStartsOverFromZeroAndSaysWhy(_ fault: String) async throws {
        let folder = try Folder()
        let server = try TestHTTPServer()
        defer { server.stop() }
        let old = ServedFile.random(size: 3 * Self.mib, seed: 0xB63, etag: Self.etag)
        let new = ServedFile.random(size: 3 * Self.mib + 7, seed: 0xB64, etag: "\"bgd-new\"")
        let expected: [UInt8]
        let reason: String
        switch fault {
        case "ignoreRange":
            server.serve("/file", file: old, faults: .onRequest(1, .ignoreRange))
            expected = old.data
            reason = RestartReason.rangeIgnored.description
        case "changed":
            // From the second request on, the server has another version.
            server.serve("/file", file: old, faults: FaultPolicy { _, index in index >= 1 ? .servedAs(new) : .none })
            expected = new.data
            reason = RestartReason.etagChanged(old: Self.etag, new: "\"bgd-new\"").description
        default:
            server.serve("/file", file: old, faults: .onRequest(1, .wrongContentRange(.shiftStart(by: 10))))
            expected = old.data
            reason = "does not match the request"
        }
        let downloads = try Self.driver(folder)
        let id = try await downloads.add(server.url("/file"), to: folder.file("out.bin"))
        let events = await Self.events(of: downloads, until: id)
        #expect(Self.finished(events), "\(events)")
        Self.expectFile(folder.file("out.bin"), expected)
        let restarts = events.compactMap { event -> String? in
            if case .restarted(_, let why) = event { return why }
            return nil
        }
        #expect(restarts.count >= 1 && restarts.allSatisfy { $0.contains(reason) }, "\(restarts)")
        // After the restart the probe goes out again without a validator.
        let probes = server.requests.filter { $0.range == "bytes=0-1048575" }
        #expect(probes.count >= 2 && probes.allSatisfy { $0.header("If-Range") == nil })
        #expect(folder.names == ["out.bin"])
        await downloads.close()
    }

    @Test func aRedirectIsFollowedAndOnlyTheFinalAnswerJudged() async throws {
        let folder = try Folder()
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 2 * Self.mib + 1, seed: 0xB65, etag: Self.etag)
        server.serve("/file", file: file)
        server.redirect(from: "/moved", to: server.url("/file"))
        let downloads = try Self.driver(folder)
        let id = try await downloads.add(server.url("/moved"), to: folder.file("out.bin"))
        let events = await Self.events(of: downloads, until: id)
        #expect(Self.finished(events), "\(events)")
        Self.expectFile(folder.file("out.bin"), file.data)
        // Every task starts from the URL as given; the redirected request kept Range and If-Range.
        #expect(server.requests(for: "/moved").count == 3)
        Self.expectValidated(server.requests(for: "/file"))
        await downloads.close()
    }

    @Test func anErrorPageIsNeverTheFile() async throws {
        let folder = try Folder()
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 2 * Self.mib, seed: 0xB66, etag: Self.etag)
        // The probe is fine; the second range gets a 404 page.
        server.serve(
            "/file", file: file,
            faults: .onRequest(1, .status(404, body: Array("<html>not here</html>".utf8))))
        let downloads = try Self.driver(folder)
        let id = try await downloads.add(server.url("/file"), to: folder.file("out.bin"))
        let events = await Self.events(of: downloads, until: id)
        guard case .failed(_, let message) = events.last else {
            Issue.record("not failed: \(events)")
            return
        }
        #expect(message == "the server answered 404")
        #expect(access(folder.file("out.bin"), F_OK) != 0, "an incomplete file at the destination")
        // The probe's megabyte stays, and a resume carries on from it with the validator.
        #expect(await downloads.downloads().first?.durableBytes == Int64(Self.mib))
        await downloads.resume(id)
        let more = await Self.events(of: downloads, until: id)
        #expect(Self.finished(more), "\(more)")
        Self.expectFile(folder.file("out.bin"), file.data)
        #expect(server.requests.count == 3)
        Self.expectValidated(server.requests)
        await downloads.close()
    }

    @Test func withoutAStrongValidatorTheWholeFileIsOneTask() async throws {
        let folder = try Folder()
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 3 * Self.mib, seed: 0xB67, etag: "W/\"weak\"")
        server.serve("/file", file: file)
        let downloads = try Self.driver(folder)
        let id = try await downloads.add(server.url("/file"), to: folder.file("out.bin"))
        let events = await Self.events(of: downloads, until: id)
        #expect(Self.finished(events), "\(events)")
        Self.expectFile(folder.file("out.bin"), file.data)
        #expect(server.requests.map(\.range) == ["bytes=0-1048575", nil])
        await downloads.close()
    }

    @Test func aChecksumMismatchLeavesNothingAtTheDestination() async throws {
        let folder = try Folder()
        let server = try TestHTTPServer()
        defer { server.stop() }
        let file = ServedFile.random(size: 2 * Self.mib + 3, seed: 0xB68, etag: Self.etag)
        server.serve("/file", file: file)
        let downloads = try Self.driver(folder)
        let good = try ExpectedChecksum(
            algorithm: .sha256, digest: DigestHasher.digest(.sha256, of: file.data))
        let bad = try ExpectedChecksum(algorithm: .sha256, digest: [UInt8](repeating: 7, count: 32))
        let ok = try await downloads.add(server.url("/file"), to: folder.file("good.bin"), checksum: good)
        #expect(Self.finished(await Self.events(of: downloads, until: ok)))
        Self.expectFile(folder.file("good.bin"), file.data)
        let wrong = try await downloads.add(server.url("/file"), to: folder.file("bad.bin"), checksum: bad)
        let events = await Self.events(of: downloads, until: wrong)
        guard case .failed(_, let message) = events.last else {
            Issue.record("not failed: \(events)")
            return
        }
        #expect(message.hasPrefix("checksum mismatch"))
        #expect(folder.names == ["good.bin"])
        await downloads.close()
    }

    @Test func badInputIsRefusedWithOneLine() async throws {
        let folder = try Folder()
        let downloads = try Self.driver(folder)
        let cases: [(String, [(name: String, value: String)], String)] = [
            ("not a url", [], "not a valid URL"),
            ("http:///x", [], "URL has no host"),
            ("ftp://127.0.0.1/x", [], "unsupported URL scheme 'ftp'"),
            ("http://127.0.0.1:1/x", [("Authorization", "Bearer x")], "do not send Authorization"),
            ("http://127.0.0.1:1/x", [("X-A", "b\r\nInjected: 1")], "bad header field"),
            ("http://127.0.0.1:1/x", [("Bad Name", "v")], "bad header field"),
            ("http://127.0.0.1:1/x", [("X-A:B", "v")], "bad header field"),
        ]
        for (url, headers, message) in cases {
            do {
                _ = try await downloads.add(url, to: folder.file("x"), headers: headers)
                Issue.record("\(url) \(headers) accepted")
            } catch {
                #expect(error.description.contains(message), "\(error)")
                #expect(!error.description.contains("\n"))
            }
        }
        #expect(folder.names.isEmpty)
        // Neither a file at the destination nor another run's partial download is replaced.
        #expect(FileManager.default.createFile(atPath: folder.file("mine.txt"), contents: Data("mine".utf8)))
        #expect(FileManager.default.createFile(atPath: folder.file("half.bin.part"), contents: Data("half".utf8)))
        for (name, message) in [("mine.txt", "mine.txt already exists"), ("half.bin", "is another run's partial download")] {
            do {
                _ = try await downloads.add("http://127.0.0.1:1/x", to: folder.file(name))
                Issue.record("\(name) accepted")
            } catch {
                #expect(error.code == .destinationExists && error.description.contains(message), "\(error)")
            }
        }
        #expect(Self.contents(folder.file("mine.txt")) == Array("mine".utf8))
        #expect(Self.contents(folder.file("half.bin.part")) == Array("half".utf8))
        #expect(folder.names == ["half.bin.part", "mine.txt"])
        await downloads.close()
    }

    @Test func aRealNginxServesItInRanges() async throws {
        let nginx = try Nginx.shared()
        let folder = try Folder()
        let data = ServedFile.randomBytes(count: 4 * Self.mib + 999, seed: 0xB69)
        let name = "bg-\(UInt32.random(in: 0...UInt32.max)).bin"
        _ = try nginx.publish(name, bytes: data)
        let url = nginx.httpURL(name)
        let downloads = try Self.driver(folder)
        let id = try await downloads.add(url, to: folder.file("out.bin"))
        let events = await Self.events(of: downloads, until: id)
        #expect(Self.finished(events), "\(events)")
        Self.expectFile(folder.file("out.bin"), data)
        let lines = nginx.accessLogLines(containing: "/" + name)
        #expect(lines.count == 5, "\(lines)")
        #expect(lines.filter { $0.contains(" 206 ") }.count == 5)
        // The probe without a validator, every other range with nginx's ETag.
        #expect(lines.first?.contains("if_range=\"-\"") == true, "\(lines)")
        #expect(lines.dropFirst().allSatisfy { $0.contains("if_range=\"\\x22") })
        #expect(lines.allSatisfy { $0.contains("ua=\"stitch/") }, "\(lines)")
        await downloads.close()
    }

    @Test func anEmptyFileFromNginxArrivesEmpty() async throws {
        let nginx = try Nginx.shared()
        let folder = try Folder()
        let name = "bg-empty-\(UInt32.random(in: 0...UInt32.max)).bin"
        _ = try nginx.publish(name, bytes: [])
        let downloads = try Self.driver(folder)
        let id = try await downloads.add(nginx.httpURL(name), to: folder.file("empty.bin"))
        let events = await Self.events(of: downloads, until: id)
        #expect(Self.finished(events), "\(events)")
        // The 416's error page is not the file.
        #expect(Self.contents(folder.file("empty.bin"))?.count == 0)
        #expect(folder.names == ["empty.bin"])
        await downloads.close()
    }
}
