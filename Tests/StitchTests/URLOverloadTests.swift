import Foundation
import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

/// The `Foundation.URL` forms of the API that takes URL strings: each does what its `String` form does with the
/// URL's `absoluteString`, and refuses what is not http or https the same way (the same error).
@Suite struct URLOverloadTests {
    /// URLs the engine refuses, each a `URL` Foundation accepts.
    static let refused: [URL] = [
        URL(fileURLWithPath: "/etc/passwd"),
        URL(string: "ftp://example.com/file.bin")!,
        URL(string: "http:///no-host")!,
    ]

    /// `add(_:options:)` and `add(_:)` with `URL`s: the downloads complete byte-exact from those URLs; the
    /// snapshots, `downloads(url:)` and `updateSource(_:url:headers:)` agree with the strings.
    @Test func managerTakesURLs() async throws {
        let f = try ManagerFixture()
        let files = (0..<3).map { ServedFile.random(size: 48 << 10, seed: 60 + UInt64($0), etag: "\"u\($0)\"") }
        for (index, file) in files.enumerated() { f.server.serve("/u\(index).bin", file: file) }
        let manager = try f.open()
        let urls = try (0..<3).map { try #require(URL(string: f.server.url("/u\($0).bin"))) }

        let one = try await manager.add(urls[0], options: .init(out: "u0.bin"))
        let batch = try await manager.add([
            (url: urls[1], options: .init(out: "u1.bin")), (url: urls[2], options: .init(out: "u2.bin")),
        ])
        #expect(batch.count == 2)
        await manager.waitUntilIdle()
        for (index, id) in ([one] + batch).enumerated() {
            let snapshot = try #require(await manager.download(id))
            #expect(snapshot.url == urls[index].absoluteString)
            #expect(snapshot.status == .completed)
            expectFile(snapshot.path, files[index].data)
            #expect(await manager.downloads(url: urls[index]).map(\.id) == [id])
            #expect(
                await manager.downloads(url: urls[index]) == (await manager.downloads(url: urls[index].absoluteString)))
        }

        // A new source for a paused download, as a URL; the old one is still found as a former URL.
        var options = DownloadManager.AddOptions(out: "moved.bin")
        options.paused = true
        let moved = try await manager.add(urls[0], options: options)
        try await manager.updateSource(moved, url: urls[1])
        #expect(await manager.download(moved)?.url == urls[1].absoluteString)
        #expect(await manager.downloads(url: urls[0]).map(\.id).contains(moved))
        await manager.close()
    }

    /// Mirrors given as `URL`s are the strings of those URLs, and come back as the same `URL`s.
    @Test func mirrorsAsURLs() async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let urls = try ["/a.bin", "/b.bin"].map { try #require(URL(string: f.server.url($0))) }
        var options = DownloadManager.AddOptions(out: "mirrored.bin")
        options.paused = true
        options.mirrorURLs = urls
        #expect(options.mirrors == urls.map(\.absoluteString))
        #expect(options.mirrorURLs == urls)
        let id = try await manager.add(urls[0], options: options)
        #expect(await manager.download(id)?.mirrors == urls.map(\.absoluteString))

        var refused = DownloadManager.AddOptions(out: "refused.bin")
        refused.mirrorURLs = [URL(fileURLWithPath: "/tmp/x")]
        let error = await #expect(throws: DownloadManagerError.self) {
            try await manager.add(urls[0], options: refused)
        }
        #expect(
            error?.description.hasPrefix("mirror: unsupported URL scheme 'file'") == true,
            "\(String(describing: error))")
        await manager.close()
    }

    /// What is not http or https is refused by every `URL` form with the error of its `String` form, and nothing is
    /// added.
    @Test(arguments: refused)
    func refusedLikeTheString(_ url: URL) async throws {
        let f = try ManagerFixture()
        let manager = try f.open()
        let byString = await #expect(throws: DownloadManagerError.self) { try await manager.add(url.absoluteString) }
        let byURL = await #expect(throws: DownloadManagerError.self) { try await manager.add(url) }
        #expect(byURL != nil && byURL == byString, "\(String(describing: byURL)) vs \(String(describing: byString))")
        let batch = await #expect(throws: DownloadManagerError.self) {
            try await manager.add([(url: url, options: .init(out: "x.bin"))])
        }
        #expect(batch == byString)
        #expect(await manager.downloads().isEmpty)
        var options = DownloadManager.AddOptions(out: "p.bin")
        options.paused = true
        let id = try await manager.add(f.server.url("/p.bin"), options: options)
        let update = await #expect(throws: DownloadManagerError.self) { try await manager.updateSource(id, url: url) }
        #expect(update == byString)
        await manager.close()

        let validated = #expect(throws: DownloadError.self) { try Downloader.validate(url: url) }
        let validatedString = #expect(throws: DownloadError.self) { try Downloader.validate(url: url.absoluteString) }
        #expect(validated?.code == validatedString?.code && validated?.message == validatedString?.message)

        let downloaded = await #expect(throws: DownloadError.self) {
            try await Downloader().download(DownloadRequest(url: url, destination: .file(f.path("refused.bin"))))
        }
        #expect(downloaded?.code == validatedString?.code && downloaded?.message == validatedString?.message)
    }

    /// `DownloadRequest(url: URL, …)` is the request of the URL's string, and downloads it.
    @Test func requestFromURL() async throws {
        let f = try ManagerFixture()
        let file = ServedFile.random(size: 40 << 10, seed: 70, etag: "\"r\"")
        f.server.serve("/r.bin", file: file)
        let url = try #require(URL(string: f.server.url("/r.bin")))
        var headers = HTTPHeaders()
        headers.add(name: "X-Test", value: "1")
        let request = DownloadRequest(url: url, destination: .file(f.path("r.bin")), headers: headers, overwrite: true)
        #expect(request.url == url.absoluteString)
        #expect(request.headers == headers)
        #expect(request.overwrite)
        let result = try await Downloader(transport: TestBackend.selected.testTransport).download(request)
        #expect(result.bytes == Int64(file.data.count))
        expectFile(result.destination, file.data)
        #expect(f.server.requests(for: "/r.bin").first?.header("X-Test") == "1")
        try Downloader.validate(url: url)
    }

    /// Credentials for `URL`s are sent to the same origins as for their strings.
    @Test func credentialsForURLs() throws {
        let urls = try ["https://example.com/a", "http://Example.org:8080/b", "file:///x"].map {
            try #require(URL(string: $0))
        }
        let byURL = TransportOptions.Credentials(user: "u", password: "p", for: urls)
        let byString = TransportOptions.Credentials(user: "u", password: "p", for: urls.map(\.absoluteString))
        #expect(byURL == byString)
        #expect(byURL.origins == ["https://example.com:443", "http://example.org:8080"])
    }
}
