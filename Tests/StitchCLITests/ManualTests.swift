import Foundation
import StitchTestSupport
import Testing

@testable import StitchCLI

/// The manual pages and the shell completions the package installs (`stitch help --man`, `--completion`) come from
/// the help texts and option tables: every option `--help` shows is in them, the pages render without a warning,
/// and each shell reads its completion and completes the subcommands and options.
@Suite struct ManualTests {
    @Test func everyOptionIsInItsPage() {
        let stitch1 = Manual.stitch1()
        let serve8 = Manual.serve8()
        for command in Manual.commands where command.name != "serve" {
            for doc in command.options where doc.names != ["--json"] {
                for name in doc.names {
                    #expect(stitch1.contains("\\fB" + Manual.escape(name) + "\\fR"), "stitch(1) lacks \(command.name) \(name)")
                }
            }
        }
        for doc in Serve.table.docs {
            for name in doc.names { #expect(serve8.contains("\\fB" + Manual.escape(name) + "\\fR"), "stitch-serve(8) lacks \(name)") }
        }
        // The prose is --help's.
        #expect(serve8.contains(Manual.escape("Runs a download daemon on DIR until SIGTERM, SIGINT or an RPC shutdown")))
        #expect(stitch1.contains(Manual.escape("Re-reads every byte of the partial download at DEST")))
        #expect(Manual.page("nothing.1") == nil && Manual.completion("csh") == nil)
    }

    @Test(arguments: ["stitch.1", "stitch-serve.8"])
    func pagesRenderWithoutWarnings(_ page: String) async throws {
        let sandbox = try Sandbox("manual")
        defer { sandbox.cleanup() }
        let made = try await sandbox.run(["help", "--man", page])
        #expect(made.status == 0)
        try Data(made.stdout.utf8).write(to: URL(fileURLWithPath: sandbox.path(page)))
        let shown = try await sandbox.run(
            ["-c", "MANWIDTH=100 man --warnings -l \(sandbox.path(page)) 2>&1 >/dev/null | head -5; MANWIDTH=100 man -l \(sandbox.path(page)) | head -3"],
            environment: ["PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"], executable: "/bin/bash")
        let lines = shown.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix(page.hasPrefix("stitch-serve") ? "STITCH-SERVE(8)" : "STITCH(1)") == true, "rendered: \(shown)")
        #expect(!shown.stdout.contains("warning"), "\(shown)")
    }

    /// Each shell parses its file; bash and fish complete subcommands, options and paths as asked.
    @Test func completionsLoadAndComplete() async throws {
        let sandbox = try Sandbox("manual")
        defer { sandbox.cleanup() }
        for shell in ["bash", "zsh", "fish"] {
            let made = try await sandbox.run(["help", "--completion", shell])
            #expect(made.status == 0)
            try Data(made.stdout.utf8).write(to: URL(fileURLWithPath: sandbox.path("completion.\(shell)")))
            let parsed = try await sandbox.run(["-n", sandbox.path("completion.\(shell)")], executable: "/usr/bin/\(shell)")
            #expect(parsed.status == 0, "\(shell): \(parsed)")
        }
        let bash = try await sandbox.run(
            [
                "-c",
                """
                source \(sandbox.path("completion.bash"))
                COMP_WORDS=(stitch se); COMP_CWORD=1; _stitch; echo "1:${COMPREPLY[*]}"
                COMP_WORDS=(stitch serve --rpc-l); COMP_CWORD=2; _stitch; echo "2:${COMPREPLY[*]}"
                COMP_WORDS=(stitch get -o \(sandbox.path("compl"))); COMP_CWORD=3; _stitch; echo "3:${COMPREPLY[*]}"
                COMP_WORDS=(stitch watch --un); COMP_CWORD=2; _stitch; echo "4:${COMPREPLY[*]}"
                """,
            ], executable: "/bin/bash")
        #expect(bash.stdout.contains("1:serve\n") && bash.stdout.contains("2:--rpc-listen --rpc-listen-port\n"), "\(bash)")
        #expect(bash.stdout.split(separator: "\n").first { $0.hasPrefix("3:") }?.contains(sandbox.path("completion.bash")) == true, "a path after -o: \(bash)")
        #expect(bash.stdout.contains("4:--until-idle\n"), "\(bash)")
        let fish = try await sandbox.run(
            ["-c", "source \(sandbox.path("completion.fish")); complete -C 'stitch se'; complete -C 'stitch serve --conf'"],
            executable: "/usr/bin/fish")
        #expect(fish.stdout.contains("serve\t") && fish.stdout.contains("--conf-path\t"), "\(fish)")
    }
}
