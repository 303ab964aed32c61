import Foundation
import Glibc
import StitchTestSupport
import Testing

@testable import StitchCore

/// The records a small download writes without Foundation's generic machinery (issue 35): the completion mark's
/// JSON, the folder of a destination, and the claims on file names the engine's decision threads make at once.
@Suite struct SmallRecordTests {
    static let hostile = [
        "", "plain", "\"quoted\"", "back\\slash", "a/b/c", "tab\there", "line\nbreak\r\n", "nul\u{0}byte",
        "bell\u{7}esc\u{1B}del\u{7F}", "sep\u{2028}and\u{2029}", "é ü ß 中文", "🧵 stitch", "\u{FEFF}bom",
        "W/\"weak\"", "\\u0041 not an escape", "}{\",\":", "dash \u{2014} euro \u{20AC} \u{2027}\u{202A} end\u{2028}",
        "\u{2029}", "\u{E2}\u{80}",
    ]

    /// Every mark the hand-written JSON gives decodes back to itself, whatever its strings hold, with the keys the
    /// `Codable` encoding had.
    @Test(arguments: hostile)
    func completionMarkJSONRoundTrips(_ text: String) throws {
        let marks = [
            CompletionMark(url: "http://h/" + text, length: 0, etag: text, crc32c: 0),
            CompletionMark(url: text, length: Int64.max, etag: nil, crc32c: UInt32.max),
            CompletionMark(url: text, length: 12_345, etag: "\"" + text + "\"", crc32c: nil),
            CompletionMark(url: text, length: 7, etag: nil, lastModified: text, crc32c: 9),
        ]
        for mark in marks {
            let decoded = try JSONDecoder().decode(CompletionMark.self, from: Data(mark.json.utf8))
            #expect(decoded == mark, "\(mark.json)")
            // Control characters, DEL and the two JavaScript line breaks only escaped.
            #expect(
                !mark.json.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F || (0x2028...0x2029).contains($0.value) },
                "\(mark.json)")
            // The same keys as the `Codable` encoding (absent optionals left out).
            let object = try #require(JSONSerialization.jsonObject(with: Data(mark.json.utf8)) as? [String: Any])
            let reference = try #require(
                JSONSerialization.jsonObject(with: try JSONEncoder().encode(mark)) as? [String: Any])
            #expect(Set(object.keys) == Set(reference.keys), "\(mark.json)")
        }
    }

    /// Header names compare as RFC 9110 says, without allocating: ASCII letters without case, every other byte as
    /// it is (against a plain mapping of the bytes, over random names made of the characters next to the letters'
    /// ranges, and non-ASCII ones); the Kelvin sign is not a `k`, as Unicode lowercasing made it.
    @Test func headerNamesCompareWithoutCaseInASCIIOnly() {
        let alphabet: [String] = ["a", "A", "z", "Z", "m", "M", "@", "`", "[", "{", "-", "0", "é", "É", "\u{212A}", "k", "K"]
        var random = SplitMix64(seed: 35)
        func folded(_ text: String) -> [UInt8] {
            text.utf8.map { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") ? $0 + 32 : $0 }
        }
        var equal = 0
        for _ in 0..<5000 {
            let length = Int.random(in: 0...3, using: &random)
            let a = (0..<length).map { _ in alphabet.randomElement(using: &random)! }.joined()
            let b = (0..<Int.random(in: length...length + 1, using: &random)).map { _ in
                alphabet.randomElement(using: &random)!
            }.joined()
            let expected = folded(a) == folded(b)
            if expected { equal += 1 }
            #expect(HTTPHeaders.sameName(a, b) == expected, "\(a.debugDescription) \(b.debugDescription)")
            #expect(HTTPHeaders.sameName(a, a))
            #expect(HTTPHeaders.sameName(a, a.uppercased()) == (folded(a) == folded(a.uppercased())))
        }
        #expect(equal > 100)
        let headers = HTTPHeaders([
            ("CONTENT-LENGTH", "5"), ("Lin\u{212A}", "<http://k/>"), ("link", "<http://a/>"), ("LINK", "<http://b/>"),
        ])
        #expect(headers["content-length"] == "5")
        #expect(headers["Content-Length"] == "5")
        #expect(headers["link"] == "<http://a/>")
        #expect(headers.values("Link") == ["<http://a/>", "<http://b/>"])
        #expect(headers.values("content-lengt").isEmpty)
    }

    /// The mark set on a file reads back through the extended attribute.
    @Test func completionMarkReadsBackFromTheFile() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f"
        #expect(FileManager.default.createFile(atPath: path, contents: Data([1, 2, 3])))
        let mark = CompletionMark(
            url: "http://h/\"x\"\\y\u{1}", length: 3, etag: "\"e\"", lastModified: "Sun, 06 Nov 1994 08:49:37 GMT",
            crc32c: 42)
        let fd = open(path, O_RDWR)
        try #require(fd >= 0)
        mark.write(fd: fd)
        close(fd)
        #expect(try #require(CompletionMark.read(at: path)) == mark)
    }

    /// The folder of a path, as Foundation gives it, for the plain absolute paths the fast path takes and the
    /// others it hands on.
    @Test(arguments: [
        "/a/b", "/a", "/", "/a/b/c.txt", "/a//b", "//a", "/a/b/", "a/b", "/a/./b", "/a/../b", "/é/中/🧵",
        "/a/b.part", "///", "/a b/c d",
    ])
    func parentDirectoryIsFoundationsAnswer(_ path: String) {
        #expect(parentDirectory(of: path) == (path as NSString).deletingLastPathComponent, "\(path)")
    }

    /// A name without a slash has no folder (Foundation on Linux traps on it, so it is not asked).
    @Test func aBareNameHasNoFolder() {
        #expect(parentDirectory(of: "a") == "")
        #expect(parentDirectory(of: "") == "")
    }

    /// Many downloads naming the same file at once each get a name of their own, and a name is given again only
    /// after its claim is released.
    @Test func concurrentChoicesNeverShareAName() async throws {
        let dir = try TemporaryDirectory()
        let claims = PathClaims()
        let proposed = dir.path + "/file.tar.gz"
        let count = 24
        let names = await withTaskGroup(of: (DownloadID, String).self) { group in
            for index in 1...count {
                group.addTask {
                    let id = DownloadID(rawValue: UInt64(index))
                    return (id, claims.choose(proposed, for: id, urls: ["http://h/\(index)"]))
                }
            }
            var names: [DownloadID: String] = [:]
            for await (id, name) in group { names[id] = name }
            return names
        }
        #expect(Set(names.values).count == count)
        #expect(Set(names.values).contains(proposed))
        #expect(Set(names.values).contains(dir.path + "/file.\(count - 1).tar.gz"))
        for (id, name) in names { #expect(claims.owner(of: name) == id) }
        // Released, the first name is free again (nothing is on disk there).
        let first = try #require(names.first { $0.value == proposed }?.key)
        claims.release(proposed, for: first)
        #expect(claims.choose(proposed, for: DownloadID(rawValue: 999), urls: ["http://h/999"]) == proposed)
    }

    /// A finished file another URL left is not a free name; one this URL left is.
    @Test func aFileOfAnotherURLIsSkipped() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/f.bin"
        #expect(FileManager.default.createFile(atPath: path, contents: Data([1, 2, 3])))
        let fd = open(path, O_RDWR)
        try #require(fd >= 0)
        CompletionMark(url: "http://h/other", length: 3, etag: nil, crc32c: nil).write(fd: fd)
        close(fd)
        let claims = PathClaims()
        #expect(claims.choose(path, for: DownloadID(rawValue: 1), urls: ["http://h/mine"]) == dir.path + "/f.1.bin")
        guard CompletionMark.read(at: path) != nil else { return }  // no user xattrs here: the rest needs them
        #expect(claims.choose(path, for: DownloadID(rawValue: 2), urls: ["http://h/other"]) == path)
    }

    /// A part file without a state file is a free name unless another run holds it (its lock is all that shows a
    /// small download in progress); held, the next name is given.
    @Test func aPartFileAnotherRunHoldsIsSkipped() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/g.bin"
        #expect(FileManager.default.createFile(atPath: path + ".part", contents: Data([1])))
        let holder = open(path + ".part", O_RDONLY)
        try #require(holder >= 0)
        defer { close(holder) }
        try #require(flock(holder, LOCK_EX | LOCK_NB) == 0)
        let claims = PathClaims()
        #expect(claims.choose(path, for: DownloadID(rawValue: 1), urls: ["http://h/g"]) == dir.path + "/g.1.bin")
        _ = flock(holder, LOCK_UN)
        #expect(claims.choose(path, for: DownloadID(rawValue: 2), urls: ["http://h/g"]) == path)
    }

    /// A path is vacant only when the look that chose it found nothing of a download there: no part file, no state
    /// file, no file at the destination. Each of those (even of this download's URL) makes it not vacant, so the
    /// engine then reopens and creates as it always did.
    @Test func aPathIsVacantOnlyWithNothingThere() throws {
        let dir = try TemporaryDirectory()
        let claims = PathClaims()
        let url = "http://h/v.bin"
        let path = dir.path + "/v.bin"
        let paths = DownloadPaths(destination: path)
        var next: UInt64 = 0
        func choice() -> PathChoice {
            next += 1
            let id = DownloadID(rawValue: next)
            defer { claims.release(path, for: id) }
            return claims.choice(path, for: id, urls: [url])
        }
        #expect(choice() == PathChoice(path: path, vacant: true))

        // A part file nobody holds (a small download stopped before its first checkpoint): free, not vacant.
        #expect(FileManager.default.createFile(atPath: paths.part, contents: Data()))
        #expect(choice() == PathChoice(path: path, vacant: false))
        unlink(paths.part)

        // A state file of this URL: free (resumable), not vacant.
        var state = PartStoreTests.makeState(durable: 0, total: 10)
        state.url = url
        try StateFile.write(state, to: paths.state)
        #expect(choice() == PathChoice(path: path, vacant: false))
        unlink(paths.state)

        // A finished file of this URL: free (already done), not vacant.
        #expect(FileManager.default.createFile(atPath: path, contents: Data([1, 2, 3])))
        let fd = open(path, O_RDWR)
        try #require(fd >= 0)
        CompletionMark(url: url, length: 3, etag: nil, crc32c: nil).write(fd: fd)
        close(fd)
        if CompletionMark.read(at: path) != nil {
            #expect(choice() == PathChoice(path: path, vacant: false))
        }
        unlink(path)
        #expect(choice() == PathChoice(path: path, vacant: true))
    }
}
