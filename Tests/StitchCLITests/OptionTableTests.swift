import Foundation
import Testing

@testable import StitchCLI

/// The one option reader (`OptionTable`) that `stitch get`, `stitch serve` and the client commands share, and the
/// OPTIONS sections of their help, which are made from the same tables.
@Suite("option table")
struct OptionTableTests {

    // MARK: The reader, on a small table

    /// What the sample table's options and arguments set.
    struct Sample {
        var output: String?
        var outputWasInline = false
        var headers: [String] = []
        var verbose = false
        var arguments: [String] = []
    }

    static let sample = OptionTable<Sample>([
        .value(["-o", "--output"], "PATH", aliases: ["--out"], help: "save to PATH") { sample, use in
            sample.output = use.value
            sample.outputWasInline = use.isInline
        },
        .value(["-H", "--header"], "'K: V'", help: "add a header (repeatable)") { sample, use in
            sample.headers.append(use.value)
        },
        .flag(["-v", "--verbose"], help: "say more") { sample, _ in sample.verbose = true },
        .flag(["--refused"], help: nil) { _, _ in throw UsageError("--refused is refused, for a reason") },
    ])

    static func parse(_ arguments: [String]) throws -> Sample {
        var sample = Sample()
        try Self.sample.parse(arguments, into: &sample) { sample, argument in sample.arguments.append(argument) }
        return sample
    }

    /// The usage error's message, or nil if `body` did not throw one.
    static func usageError(_ body: () throws -> Void) -> String? {
        do {
            try body()
            return nil
        } catch let error as UsageError {
            return error.message
        } catch {
            return "not a usage error: \(error)"
        }
    }

    @Test func valuesSeparateAndInline() throws {
        #expect(try Self.parse(["-o", "a"]).output == "a")
        #expect(try Self.parse(["--output", "a"]).output == "a")
        let inline = try Self.parse(["--output=a=b"])
        #expect(inline.output == "a=b", "only the first '=' splits")
        #expect(inline.outputWasInline)
        #expect(try Self.parse(["--output="]).output == "", "an empty inline value is a value")
        #expect(try Self.parse(["--out", "c"]).output == "c", "an alias")
        #expect(try Self.parse(["-o", "-v"]).output == "-v", "a value may start with '-'")
        #expect(try Self.parse(["-o", "a", "-o", "b"]).output == "b", "the last one wins")
    }

    @Test func repeatedOptionsKeepOrder() throws {
        let sample = try Self.parse(["-H", "A: 1", "--header", "B: 2", "--header=C: 3", "x"])
        #expect(sample.headers == ["A: 1", "B: 2", "C: 3"])
        #expect(sample.arguments == ["x"])
    }

    @Test func argumentsDashAndDoubleDash() throws {
        let sample = try Self.parse(["a", "-", "-v", "--", "-o", "--verbose", "--", "b"])
        #expect(sample.arguments == ["a", "-", "-o", "--verbose", "--", "b"])
        #expect(sample.verbose)
        #expect(sample.output == nil)
    }

    @Test(arguments: [
        (["-o"], "-o needs a value"),
        (["x", "--output"], "--output needs a value"),
        (["--bogus"], "unknown option '--bogus'"),
        (["-x"], "unknown option '-x'"),
        (["--bogus=s3cret"], "unknown option '--bogus'"),
        (["-o=a"], "unknown option '-o=a'"),
        (["--verbose=yes"], "--verbose takes no value"),
        (["--verbose="], "--verbose takes no value"),
        (["--refused"], "--refused is refused, for a reason"),
        (["--refused=s3cret"], "--refused is refused, for a reason"),
    ])
    func usageErrors(_ arguments: [String], message: String) {
        #expect(Self.usageError { _ = try Self.parse(arguments) } == message)
    }

    @Test func unknownOptionMessageIsTheTables() {
        let table = OptionTable<Sample>(Self.sample.specs) { "unknown option '\($0)' for 'stitch sample'" }
        var sample = Sample()
        let message = Self.usageError { try table.parse(["--bogus=s3cret"], into: &sample) { _, _ in } }
        #expect(message == "unknown option '--bogus' for 'stitch sample'")
    }

    @Test func helpLayout() {
        let table = OptionTable<Sample>([
            .value(["-o", "--output"], "PATH", help: "save to PATH\nsecond line, as written") { _, _ in },
            .flag(["--long-only"], help: "lined up with long names") { _, _ in },
            .value(["--a-very-long-option-name"], "N", help: "one line: after two spaces") { _, _ in },
            .value(["--another-long-option-name"], "N", help: "two lines:\nbelow the names") { _, _ in },
            .flag(["--hidden"], help: nil) { _, _ in },
            .flag(["-w", "--wrapped"], help: "one two three four five six seven eight nine ten") { _, _ in },
        ])
        let expected = [
            "  -o, --output PATH     save to PATH",
            "                        second line, as written",
            "      --long-only       lined up with long names",
            "      --a-very-long-option-name N  one line: after two spaces",
            "      --another-long-option-name N",
            "                        two lines:",
            "                        below the names",
            "  -w, --wrapped         one two three four five six seven",
            "                        eight nine ten",
        ]
        // Width 60 leaves 36 columns for help text: the long line of the flag is wrapped, the others fit.
        let help = table.help(column: 24, width: 60)
        #expect(help.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) == expected, "\(help)")
    }

    // MARK: The commands' tables and their help

    /// Options read but not shown in help, and why: aria2's `--rpc-secret`, refused with a reason.
    static let hiddenOptions: Set<String> = ["--rpc-secret"]

    /// Each command's help and the tables it shows.
    /// Every client command's options, as `stitch help client` lists them.
    static let clientOptions = Client.commonOptions + Client.addOptions + Client.watchOptions

    static let helpAndTables: [(name: String, help: String, visible: [[String]], hidden: [String])] = [
        ("get", Help.get, visibleNames(GetOptions.table.specs), hiddenNames(GetOptions.table.specs)),
        ("serve", Help.serve, visibleNames(Serve.table.specs), hiddenNames(Serve.table.specs)),
        ("client", Help.client, visibleNames(clientOptions), hiddenNames(clientOptions)),
    ]

    /// The option names at the start of the lines of every OPTIONS section of `help`: `-o` and `--output` from
    /// `  -o, --output PATH   save to …`, nothing from a help text's continuation line.
    static func optionNames(inOptionsSectionsOf help: String) -> [[String]] {
        var inSection = false
        var names: [[String]] = []
        for line in help.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("OPTIONS") {
                inSection = true
                continue
            }
            if line.trimmingCharacters(in: .whitespaces).isEmpty { inSection = false }
            guard inSection, line.hasPrefix("  -") || line.hasPrefix("      --") else { continue }
            var lineNames: [String] = []
            for word in line.split(separator: " ") {
                guard word.hasPrefix("-") else { break }
                lineNames.append(word.hasSuffix(",") ? String(word.dropLast()) : String(word))
                if !word.hasSuffix(",") { break }
            }
            names.append(lineNames)
        }
        return names
    }

    @Test(arguments: 0..<3)
    func helpListsEveryOptionAndNothingElse(_ index: Int) {
        let (name, help, visible, hidden) = Self.helpAndTables[index]
        let listed = Self.optionNames(inOptionsSectionsOf: help)
        #expect(!listed.isEmpty, "\(name): no OPTIONS section found")
        // Every option of the table, with all its shown names on one line; and no line that is not one of them.
        #expect(listed.sorted { $0.joined() < $1.joined() } == visible.sorted { $0.joined() < $1.joined() }, "\(name)")
        for names in visible {
            #expect(listed.contains(names), "\(name) --help lacks \(names.joined(separator: ", "))")
        }
        for names in listed {
            #expect(visible.contains(names), "\(name) --help lists \(names), which its table has not")
        }
        for option in hidden {
            #expect(Self.hiddenOptions.contains(option), "\(name): \(option) is read but not in the help")
        }
    }

    @Test func namesAreUniquePerCommand() {
        let clients = Client.commands.sorted().map { ($0, Client.table(for: $0).specs.flatMap(\.allNames)) }
        let tables: [(String, [String])] =
            [("get", GetOptions.table.specs.flatMap(\.allNames)), ("serve", Serve.table.specs.flatMap(\.allNames))]
            + clients
        for (command, names) in tables {
            #expect(Set(names).count == names.count, "\(command) has a name twice: \(names)")
            for name in names {
                let short = name.count == 2 && name.hasPrefix("-") && name != "--"
                let long = name.hasPrefix("--") && name.count > 2 && !name.contains("=")
                #expect(short || long, "\(command): '\(name)' is neither -x nor --name")
            }
        }
    }

    @Test func clientCommandsTakeTheirOwnOptionsOnly() {
        let environment = ["STITCH_CLIENT_CONFIG": "/nonexistent/stitch-client.toml"]
        #expect(
            Self.usageError { _ = try Client.parse("ls", ["-d", "x"], environment: environment) }
                == "unknown option '-d' for 'stitch ls'")
        #expect(
            Self.usageError { _ = try Client.parse("add", ["http://h/f", "--until-idle"], environment: environment) }
                == "unknown option '--until-idle' for 'stitch add'")
        #expect((try? Client.parse("watch", ["--until-idle"], environment: environment))?.untilIdle == true)
    }

    // MARK: One reader for get, serve and the client

    static let clientEnvironment = ["STITCH_CLIENT_CONFIG": "/nonexistent/stitch-client.toml"]

    /// The same arguments to `get`, `serve` and `add` (each with what it needs besides), parsed as the binary does.
    static func errors(get: [String], serve: [String], add: [String]) -> [String?] {
        [
            usageError { _ = try GetOptions.parse(["http://h/f"] + get) },
            usageError { _ = try Serve.parse(["--dir", "/nonexistent/stitch-dir"] + serve, environment: [:]) },
            usageError { _ = try Client.parse("add", ["http://h/f"] + add, environment: clientEnvironment) },
        ]
    }

    @Test func sameUnknownOption() {
        for message in Self.errors(get: ["--bogus=s3cret"], serve: ["--bogus=s3cret"], add: ["--bogus=s3cret"]) {
            #expect(message?.hasPrefix("unknown option '--bogus'") == true, "\(message ?? "no error")")
            #expect(message?.contains("s3cret") == false, "an inline value is never echoed")
        }
    }

    @Test func sameInlineValue() {
        // Each value reaches the option, which refuses it and quotes it.
        let messages = Self.errors(get: ["--connections=99"], serve: ["--split=99"], add: ["--connections=99"])
        #expect(
            messages == [
                "--connections takes a whole number from 1 to 16, not '99'",
                "--split takes a number 1-16, not '99'",
                "--connections takes a number of connections from 1 to 16, not '99'",
            ])
    }

    @Test func sameFlagGivenAValue() {
        #expect(
            Self.errors(get: ["--quiet=yes"], serve: ["--verbose=yes"], add: ["--quiet=yes"])
                == ["--quiet takes no value", "--verbose takes no value", "--quiet takes no value"])
    }

    @Test func sameMissingValue() {
        #expect(
            Self.errors(get: ["-c"], serve: ["-c"], add: ["-c"])
                == ["-c needs a value", "-c needs a value", "-c needs a value"])
    }

    @Test func sameDoubleDash() throws {
        let get = try GetOptions.parse(["-o", "f", "--", "-x.example/f"])
        #expect(get.urls == ["http://-x.example/f"])
        let add = try Client.parse("add", ["--", "-x.example/f"], environment: Self.clientEnvironment)
        #expect(add.arguments == ["http://-x.example/f"])
        // serve takes no arguments: after `--` a word is refused as before.
        #expect(Self.errors(get: [], serve: ["--", "x"], add: [])[1] == "unknown option 'x'")
        // An option after `--` is shown without its value, which could be a secret.
        #expect(Self.errors(get: [], serve: ["--", "--rpc-secret=hunter2"], add: [])[1] == "unknown option '--rpc-secret'")
    }

    @Test func getDashCWithAURL() throws {
        // wget's and aria2c's `-c URL` (continue): the URL is a URL, with a note; stitch's -c is connections.
        let options = try GetOptions.parse(["-c", "example.com/f"])
        #expect(options.urls == ["http://example.com/f"])
        #expect(options.connections == nil)
        #expect(
            options.notes.first
                == "-c sets the number of connections here (aria2c's -x); a partial download is always continued, "
                + "no flag needed")
        #expect(try GetOptions.parse(["-c", "4", "http://h/f"]).connections == 4)
        #expect(
            Self.usageError { _ = try GetOptions.parse(["--connections", "example.com/f", "http://h/f"]) }
                == "--connections takes a whole number from 1 to 16, not 'example.com/f'")
    }

    // MARK: The binary

    @Test(arguments: [["get", "http://127.0.0.1:9/f", "--bogus"], ["serve", "--bogus"], ["add", "--bogus"]])
    func binaryRefusesUnknownOptionAlike(_ arguments: [String]) async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(arguments, environment: Self.clientEnvironment)
        #expect(result.status == 64, "\(result)")
        #expect(result.stderrLines.first?.contains("unknown option '--bogus'") == true, "\(result)")
        #expect(sandbox.entries().isEmpty)
    }

    @Test(arguments: [(["get", "--help"], 0), (["serve", "--help"], 1), (["help", "client"], 2)])
    func binaryPrintsTheGeneratedHelp(_ arguments: [String], index: Int) async throws {
        let sandbox = try Sandbox()
        defer { sandbox.cleanup() }
        let result = try await sandbox.run(arguments)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout == Self.helpAndTables[index].help + "\n")
        let (_, _, visible, _) = Self.helpAndTables[index]
        let listed = Self.optionNames(inOptionsSectionsOf: result.stdout)
        for names in visible { #expect(listed.contains(names), "\(arguments) lacks \(names)") }
    }
}

/// The shown names of each option that help shows.
private func visibleNames<Options>(_ specs: [OptionSpec<Options>]) -> [[String]] {
    specs.filter { $0.help != nil }.map(\.names)
}

/// The names of the options that help does not show.
private func hiddenNames<Options>(_ specs: [OptionSpec<Options>]) -> [String] {
    specs.filter { $0.help == nil }.flatMap(\.allNames)
}
