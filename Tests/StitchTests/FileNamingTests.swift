import StitchTestSupport
import Testing

@testable import Stitch
@testable import StitchCore

@Suite struct FileNamingTests {

    // MARK: Content-Disposition: RFC 6266 / RFC 8187 examples and variants

    @Test(
        arguments: [
            // RFC 6266 §5 examples.
            ("Attachment; filename=example.html", "example.html"),
            ("INLINE; FILENAME= \"an example.html\"", "an example.html"),
            ("attachment; filename*= UTF-8''%e2%82%ac%20rates", "€ rates"),
            ("attachment; filename=\"EURO rates\"; filename*=utf-8''%e2%82%ac%20rates", "€ rates"),
            // RFC 8187 §3.2.2 examples.
            ("attachment; filename*=iso-8859-1'en'%A3%20rates", "£ rates"),
            ("attachment; filename*=UTF-8''%c2%a3%20and%20%e2%82%ac%20rates", "£ and € rates"),
            // The brief's example.
            ("attachment; filename*=UTF-8''%E2%82%AC%20rates.pdf", "€ rates.pdf"),
            // Quoted strings.
            ("attachment; filename=\"a b.txt\"", "a b.txt"),
            (#"attachment; filename="a \"quoted\" \\ name.txt""#, #"a "quoted" \ name.txt"#),
            (#"attachment; filename="\a\b\c.txt""#, "abc.txt"),
            ("attachment; filename=\"semi;colon.txt\"", "semi;colon.txt"),
            ("attachment; filename=\"semi;colon.txt\"; size=3", "semi;colon.txt"),
            ("attachment; filename=\"€uro.txt\"", "€uro.txt"),
            // Parameter order, case, whitespace, other parameters.
            ("attachment; filename*=UTF-8''new.txt; filename=old.txt", "new.txt"),
            ("attachment; filename=old.txt; filename*=UTF-8''new.txt", "new.txt"),
            ("attachment; FileName*=utf-8'en-US'caf%C3%A9.txt", "café.txt"),
            ("attachment;filename=x.bin", "x.bin"),
            ("attachment ; filename = x.bin ;", "x.bin"),
            ("\tattachment;\tfilename=x.bin\t", "x.bin"),
            ("attachment; creation-date=\"Wed, 12 Feb 1997 16:29:51 -0500\"; filename=report.pdf", "report.pdf"),
            ("attachment; name=\"field\"; filename=\"f.txt\"", "f.txt"),
            ("inline; filename=page.html", "page.html"),
            ("form-data; name=upload; filename=u.png", "u.png"),
            // Leniencies seen in the wild.
            ("attachment; filename=two words.txt", "two words.txt"),
            ("filename=no-type.txt", "no-type.txt"),
            ("attachment; filename*=\"UTF-8''quoted%20ext.txt\"", "quoted ext.txt"),
            ("attachment; filename=first.txt; filename=second.txt", "first.txt"),
            ("attachment; bogus; filename=after-bogus.txt", "after-bogus.txt"),
            ("attachment; junk=\"unterminated; filename=x", nil),
            // filename* that cannot be decoded falls back to filename.
            ("attachment; filename=fallback.txt; filename*=KOI8-R''%C1", "fallback.txt"),
            ("attachment; filename=fallback.txt; filename*=UTF-8''%FF%FE", "fallback.txt"),
            ("attachment; filename=fallback.txt; filename*=UTF-8''bad%2", "fallback.txt"),
            ("attachment; filename=fallback.txt; filename*=no-quotes", "fallback.txt"),
            // Raw (unsanitized) results: sanitizing is a separate step.
            ("attachment; filename=\"../../etc/passwd\"", "../../etc/passwd"),
            ("attachment; filename*=UTF-8''..%2F..%2Fetc%2Fpasswd", "../../etc/passwd"),
        ] as [(String, String?)])
    func contentDisposition(header: String, expected: String?) {
        #expect(FileNaming.filename(fromContentDisposition: header) == expected)
    }

    @Test(arguments: [
        "",
        "   ",
        "attachment",
        "inline",
        "attachment; size=42",
        "attachment; filename=",
        "attachment; filename=\"\"",
        "attachment; filename=\"unterminated",
        "attachment; filename*=UTF-8''",
        "attachment; filename*=UTF-8''%ZZ",
        "\"quoted\"; filename=x",
        "foo bar baz",
        "attachment filename=x.txt",
        "; ; ;",
        "=",
        "%%%",
    ])
    func contentDispositionGarbage(header: String) {
        #expect(FileNaming.filename(fromContentDisposition: header) == nil)
    }

    // MARK: URL path

    @Test(
        arguments: [
            ("/files/report.pdf", "report.pdf"),
            ("/files/report%202024.pdf", "report 2024.pdf"),
            ("/a/b/c/", "c"),
            ("/a//b//", "b"),
            ("/download?file=evil.exe", "download"),
            ("/download#frag/ment", "download"),
            ("/dir/%E2%82%AC.txt", "€.txt"),
            ("/dir/100%25.txt", "100%.txt"),
            ("/dir/bad%zzescape", "bad%zzescape"),
            ("/dir/trailing%", "trailing%"),
            ("/dir/latin%E9.txt", "latiné.txt"),
            ("relative/name.txt", "name.txt"),
            ("https://example.com/pub/file.iso?x=1", "file.iso"),
            ("http://user@host:8080/a/b.tar.gz#top", "b.tar.gz"),
            ("/a/..%2F..%2Fetc%2Fpasswd", "../../etc/passwd"),
            ("/a/..", ".."),
        ] as [(String, String)])
    func urlPath(path: String, expected: String) {
        #expect(FileNaming.filename(fromURLPath: path) == expected)
    }

    @Test(arguments: ["", "/", "///", "?q=1", "/#x", "https://example.com", "https://example.com/", "https://h/?a/b"])
    func urlPathWithoutName(path: String) {
        #expect(FileNaming.filename(fromURLPath: path) == nil)
    }

    // MARK: sanitize

    @Test(
        arguments: [
            ("report.pdf", "report.pdf"),
            ("a b.txt", "a b.txt"),
            ("../../etc/passwd", "passwd"),
            ("/etc/passwd", "passwd"),
            ("..\\..\\win.ini", "win.ini"),
            ("C:\\Windows\\system.ini", "system.ini"),
            ("dir/", "dir"),
            ("a\u{0}b", "ab"),
            ("line\r\nbreak.txt", "linebreak.txt"),
            ("tab\there", "tabhere"),
            ("del\u{7F}c1\u{85}\u{9F}.txt", "delc1.txt"),
            (".bashrc", "bashrc"),
            ("...hidden", "hidden"),
            (". .profile", "profile"),
            ("  spaced  ", "spaced"),
            ("name.", "name"),
            ("name. . ", "name"),
            ("a:b*c?d\"e<f>g|h.txt", "a_b_c_d_e_f_g_h.txt"),
            ("€ rates.pdf", "€ rates.pdf"),
            ("日本語のファイル.txt", "日本語のファイル.txt"),
            ("café.txt", "café.txt"),
            ("👨‍👩‍👧.png", "👨‍👩‍👧.png"),
            ("evil\u{202E}gpj.exe", "evilgpj.exe"),
            ("\u{FEFF}bom.txt", "bom.txt"),
            ("a\u{2028}b", "ab"),
            ("\u{00A0}nbsp\u{3000}", "nbsp"),
            // A "/" followed by a combining mark is one Character but still a separator.
            ("../\u{301}etc", "\u{301}etc"),
            ("x/.\u{301}hidden", "\u{301}hidden"),
        ] as [(String, String)])
    func sanitize(name: String, expected: String) {
        #expect(FileNaming.sanitize(name) == expected)
    }

    @Test(arguments: [
        "", ".", "..", "...", "/", "//", "\\", "../..", "..\\..", "  ", " . . ", "\u{0}", "\r\n", "\u{0}\u{1}\u{7F}",
        "foo/..", "foo/.", ". . ./ . .", "\u{202E}",
    ])
    func sanitizeRejects(name: String) {
        #expect(FileNaming.sanitize(name) == nil)
    }

    @Test func sanitizeNeverEscapes() {
        let hostile = [
            "../../etc/passwd", "/etc/passwd", "..", ".", "a\u{0}b", "\r\n", "..\\..\\win.ini", "....//....//x",
            "..%2F..%2Fx", ".\u{0}.", "\u{0}../x", "./././", "~/.ssh/authorized_keys", "-rf",
            String(repeating: "../", count: 200) + "x",
        ]
        for name in hostile {
            guard let safe = FileNaming.sanitize(name) else { continue }
            #expect(!safe.isEmpty)
            #expect(safe != "." && safe != "..")
            #expect(safe.utf8.first != UInt8(ascii: "."))
            #expect(!safe.utf8.contains(UInt8(ascii: "/")))
            #expect(!safe.utf8.contains(UInt8(ascii: "\\")))
            #expect(!safe.utf8.contains(0))
            #expect(safe.utf8.count <= 255)
        }
    }

    @Test func longNameKeepsExtension() throws {
        let name = String(repeating: "a", count: 300) + ".pdf"
        let safe = try #require(FileNaming.sanitize(name))
        #expect(safe.utf8.count == 255)
        #expect(safe.hasSuffix(".pdf"))
        #expect(safe == String(repeating: "a", count: 251) + ".pdf")
    }

    @Test func longNameKeepsDoubleExtension() throws {
        let safe = try #require(FileNaming.sanitize(String(repeating: "b", count: 400) + ".tar.gz"))
        #expect(safe == String(repeating: "b", count: 248) + ".tar.gz")
    }

    @Test func longNameWithoutExtension() throws {
        let safe = try #require(FileNaming.sanitize(String(repeating: "c", count: 1000)))
        #expect(safe == String(repeating: "c", count: 255))
    }

    @Test func longNameWithLongExtensionIsCutPlainly() throws {
        let name = "x." + String(repeating: "e", count: 300)
        let safe = try #require(FileNaming.sanitize(name))
        #expect(safe == "x." + String(repeating: "e", count: 253))
    }

    @Test func longMultibyteNameIsCutOnCharacterBoundary() throws {
        // "€" is 3 UTF-8 bytes; 100 of them = 300 bytes.
        let safe = try #require(FileNaming.sanitize(String(repeating: "€", count: 100) + ".txt"))
        #expect(safe == String(repeating: "€", count: 83) + ".txt")  // 249 + 4 = 253 bytes
        #expect(safe.utf8.count <= 255)

        // Family emoji: 18 bytes per grapheme; never split in the middle.
        let family = "👨‍👩‍👧"
        let emoji = try #require(FileNaming.sanitize(String(repeating: family, count: 30)))
        #expect(emoji == String(repeating: family, count: 14))  // 252 bytes
    }

    @Test func hugeSingleGraphemeFallsBackToScalars() throws {
        // One Character made of a base letter and 300 combining marks (601 bytes).
        let zalgo = "z" + String(repeating: "\u{301}", count: 300)
        let safe = try #require(FileNaming.sanitize(zalgo))
        #expect(safe.utf8.count <= 255)
        #expect(safe.unicodeScalars.first == "z")
        #expect(String(decoding: Array(safe.utf8), as: UTF8.self) == safe)
    }

    @Test func longNameTrimsWhitespaceBeforeExtension() throws {
        let name = String(repeating: "a", count: 250) + " " + String(repeating: "b", count: 20) + ".txt"
        let safe = try #require(FileNaming.sanitize(name))
        #expect(safe == String(repeating: "a", count: 250) + ".txt")
    }

    // MARK: resolve

    @Test func resolvePrefersContentDisposition() {
        #expect(
            FileNaming.resolve(
                contentDisposition: "attachment; filename=\"from-header.zip\"", urlPath: "/x/from-url.bin")
                == "from-header.zip")
    }

    @Test func resolveSanitizesContentDisposition() {
        #expect(
            FileNaming.resolve(contentDisposition: "attachment; filename=\"../../.bashrc\"", urlPath: "/x/y")
                == "bashrc")
    }

    @Test func resolveFallsBackToURL() {
        #expect(FileNaming.resolve(contentDisposition: nil, urlPath: "/pub/linux.iso?mirror=1") == "linux.iso")
        #expect(FileNaming.resolve(contentDisposition: "inline", urlPath: "/pub/linux.iso") == "linux.iso")
        #expect(FileNaming.resolve(contentDisposition: "attachment; filename=\"..\"", urlPath: "/a.txt") == "a.txt")
        #expect(FileNaming.resolve(contentDisposition: nil, urlPath: "/a/..%2F..%2Fsecret") == "secret")
    }

    @Test func resolveFallsBackToFallback() {
        #expect(FileNaming.resolve(contentDisposition: nil, urlPath: "/") == "index.html")
        #expect(FileNaming.resolve(contentDisposition: nil, urlPath: "") == "index.html")
        #expect(FileNaming.resolve(contentDisposition: nil, urlPath: "/..") == "index.html")
        #expect(
            FileNaming.resolve(contentDisposition: "garbage", urlPath: "/", fallback: "download.bin") == "download.bin")
        #expect(FileNaming.resolve(contentDisposition: nil, urlPath: "/", fallback: "../evil") == "evil")
        #expect(FileNaming.resolve(contentDisposition: nil, urlPath: "/", fallback: "..") == "index.html")
    }

    /// A name the byte check takes as it is (``FileNaming/isSafeAsItIs(_:)``) is what the scalar-by-scalar rules make
    /// of it, and every other name still goes through those rules: random names from the characters each rule looks
    /// at, and names about the length limit.
    @Test func plainASCIINamesTakeTheShortWayToTheSameAnswer() {
        let seed: UInt64 = 0xF11E_4A3E_0000_0035
        var rng = SplitMix64(seed: seed)
        let ascii = ["a", "Z", "0", "-", "_", "~", "%", "+", ".", " "]
        let others = [
            "/", "\\", "<", ">", ":", "\"", "|", "?", "*", "\t", "\u{0}", "\u{1F}", "\u{7F}", "\u{85}", "é", "中",
            "\u{200E}", "\u{2028}", "\u{FEFF}", "\u{3000}", "🧵",
        ]
        var names: [String] = []
        for index in 0..<20_000 {
            // Half of them from the characters the short way may take; the other half from every character.
            let pieces = index.isMultiple(of: 2) ? ascii : ascii + others
            let count = Int(rng.next() % 10)
            names.append((0..<count).map { _ in pieces[Int(rng.next() % UInt64(pieces.count))] }.joined())
        }
        for length in 250...258 {
            names += [String(repeating: "a", count: length), String(repeating: "b", count: length - 4) + ".pdf"]
        }
        var short = 0
        var differ: [String] = []
        for name in names {
            if FileNaming.isSafeAsItIs(name) { short += 1 }
            if FileNaming.sanitize(name) != FileNaming.sanitizeScalars(name) { differ.append(name.debugDescription) }
        }
        #expect(differ.count == 0, "seed \(seed): \(differ.count) names differ, as \(differ.prefix(5))")
        #expect(short > 1_000 && short < names.count / 2, "the short way taken \(short) times of \(names.count)")
    }
}
