import Foundation
import Stitch

/// One option as the manual pages and completions show it, whatever command's table it comes from.
struct OptionDoc: Sendable {
    let names: [String]
    let placeholder: String?
    let help: String
}

extension OptionTable {
    /// The options shown in help, for the manual pages and completions.
    var docs: [OptionDoc] {
        specs.compactMap { spec in
            spec.help.map { OptionDoc(names: spec.names, placeholder: spec.placeholder, help: $0) }
        }
    }
}

/// The manual pages `stitch(1)` and `stitch-serve(8)` and the bash, zsh and fish completions, generated from the
/// help texts and the option tables that `--help` prints (`stitch help --man stitch.1`, `stitch help --completion
/// bash`), so that they cannot drift from it. scripts/package.sh writes them into the .deb.
enum Manual {
    /// A command's part of a page: its help text (USAGE, prose, EXIT STATUS) and its option tables by the
    /// heading the help gives them.
    struct Command {
        let name: String
        let help: String
        let options: [String: [OptionDoc]]
    }

    static var get: Command {
        Command(name: "get", help: Help.get, options: ["OPTIONS": GetOptions.table.docs])
    }
    static var verify: Command {
        Command(name: "verify", help: Help.verify, options: [:])
    }
    static var client: Command {
        Command(
            name: "add, ls, pause, resume, rm, stats, watch", help: Help.client,
            options: [
                "OPTIONS (every command)": OptionTable(Client.commonOptions).docs,
                "OPTIONS (add)": OptionTable(Client.addOptions).docs,
                "OPTIONS (watch)": OptionTable(Client.watchOptions).docs,
            ])
    }
    static var serve: Command {
        Command(name: "serve", help: Help.serve, options: ["OPTIONS": Serve.table.docs])
    }

    /// The page named `name` (`stitch.1`, `stitch-serve.8`), or nil.
    static func page(_ name: String) -> String? {
        switch name {
        case "stitch.1": stitch1()
        case "stitch-serve.8": serve8()
        default: nil
        }
    }

    // MARK: Pages

    static func stitch1() -> String {
        var page = header("STITCH", 1, "resumable, crash-safe HTTP(S) downloads")
        let (usage, prose, _) = split(Help.main)
        page += ".SH SYNOPSIS\n" + preformatted(usage)
        page += ".SH DESCRIPTION\n" + paragraphs(prose.filter { !$0.hasPrefix("stitch ") })
        for command in [get, verify, client] {
            page += ".SH \"" + escape("stitch " + command.name).uppercased() + "\"\n"
            page += body(command, subsection: true)
        }
        page += """
            .SH FILES
            .TP
            .I DEST.part\\fR, \\fIDEST.stitch
            A partial download's data and its state, beside where the file will be. DEST appears only when the file
            is complete and verified.
            .TP
            .I ~/.config/stitch/client.toml
            The client commands' daemon address and secret (see \\fBstitch add\\fR above).
            .SH SEE ALSO
            .BR stitch-serve (8),
            .BR curl (1),
            .BR wget (1),
            .BR aria2c (1)

            """
        return page
    }

    static func serve8() -> String {
        var page = header("STITCH-SERVE", 8, "the Stitch download daemon, driven over aria2's JSON-RPC")
        page += body(serve, subsection: false)
        page += """
            .SH SIGNALS
            .TP
            .B SIGTERM\\fR, \\fBSIGINT
            Save every download's state and stop (exit 0). After a kill \\-9 or a power cut the next start has every
            download back.
            .TP
            .B SIGHUP
            Read the \\fB\\-\\-conf\\-path\\fR file again and apply what can change while running (concurrency, limits,
            connections, the defaults for new downloads, allowed host names, the log level); the options set over RPC
            since the file was last read are forgotten. What cannot change is named in the log.
            .SH FILES
            .TP
            .I /etc/stitch/stitch.conf
            The packaged service's settings, in aria2.conf's syntax (\\fIname\\fB=\\fIvalue\\fR lines).
            .TP
            .I /etc/stitch/rpc-secret
            The packaged service's secret, made at install, readable by the \\fBstitch\\fR user only. Clients send it as
            \\fBtoken:\\fISECRET\\fR.
            .TP
            .I /var/lib/stitch/downloads
            The packaged service's downloads; its catalog is in \\fI/var/lib/stitch/downloads/.stitch\\fR.
            .TP
            .I DIR/.stitch
            The catalog: every download, its state and order, and the options set over RPC.
            .SH SEE ALSO
            .BR stitch (1),
            .BR systemctl (1),
            .BR aria2c (1)

            """
        return page
    }

    /// A command's usage, prose, options and exit status.
    static func body(_ command: Command, subsection: Bool) -> String {
        var text = ""
        var usage: [String] = []
        var current = ""
        var prose: [String] = []
        func flush() {
            guard !current.isEmpty else { return }
            if let options = command.options[current] {
                text += (subsection ? ".SS " : ".SH ") + quoted(current == "OPTIONS" ? "OPTIONS" : current) + "\n"
                text += Self.options(options)
                // What the help says after an options list (the client's configuration file) is prose.
                text += paragraphs(prose)
            } else if current == "USAGE" {
                text += (subsection ? ".SS SYNOPSIS\n" : ".SH SYNOPSIS\n") + preformatted(usage)
                text += (subsection ? "" : ".SH DESCRIPTION\n") + paragraphs(prose)
            } else {
                text += (subsection ? ".SS " : ".SH ") + quoted(current) + "\n" + preformatted(prose)
            }
            usage = []
            prose = []
        }
        for line in command.help.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
            if let heading = Self.heading(line) {
                flush()
                current = heading.title
                if !heading.rest.isEmpty {
                    if current == "USAGE" { usage.append(heading.rest) } else { prose.append(heading.rest) }
                }
                continue
            }
            if current == "USAGE", line.hasPrefix(" "), prose.isEmpty {
                usage.append(line.trimmingCharacters(in: .whitespaces))
            } else if command.options[current] != nil, line.hasPrefix("  ") {
                continue  // the rendered options: shown from the table instead
            } else {
                prose.append(line)
            }
        }
        flush()
        return text
    }

    /// `USAGE: …`, `OPTIONS (add):`, `EXIT STATUS: …`: a heading at the start of a line, and what follows it.
    static func heading(_ line: String) -> (title: String, rest: String)? {
        guard let colon = line.firstIndex(of: ":"), line.first?.isUppercase == true else { return nil }
        let title = String(line[..<colon])
        let words = title.split(separator: "(", maxSplits: 1)
        guard let first = words.first, first.allSatisfy({ $0.isUppercase || $0 == " " }) else { return nil }
        return (title, line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
    }

    /// The main help's usage lines, prose lines, and nothing else.
    static func split(_ help: String) -> (usage: [String], prose: [String], rest: [String]) {
        var usage: [String] = []
        var prose: [String] = []
        var inUsage = false
        for line in help.split(separator: "\n", omittingEmptySubsequences: false).map(String.init).dropFirst() {
            if line.hasPrefix("USAGE:") {
                inUsage = true
                continue
            }
            if inUsage, line.hasPrefix(" ") {
                usage.append(line.trimmingCharacters(in: .whitespaces))
                continue
            }
            inUsage = false
            prose.append(line)
        }
        return (usage, prose, [])
    }

    // MARK: troff

    static func header(_ title: String, _ section: Int, _ summary: String) -> String {
        let name = title.lowercased()
        return """
            .\\" Generated by `stitch help --man \(name).\(section)` from stitch's own help; do not edit.
            .TH \(title) \(section) "" "stitch \(StitchVersion.string)" "\(section == 1 ? "User Commands" : "System Administration")"
            .SH NAME
            \(escape(name)) \\- \(escape(summary))

            """
    }

    static func options(_ docs: [OptionDoc]) -> String {
        var text = ""
        for doc in docs {
            let names = doc.names.map { "\\fB" + escape($0) + "\\fR" }.joined(separator: ", ")
            text += ".TP\n" + names + (doc.placeholder.map { " \\fI" + escape($0) + "\\fR" } ?? "") + "\n"
            text += escape(doc.help.replacingOccurrences(of: "\n", with: " ")).lineStart() + "\n"
        }
        return text
    }

    /// Lines as paragraphs: blank lines separate them; an indented line starts a line of its own.
    static func paragraphs(_ lines: [String]) -> String {
        var text = ""
        var paragraph: [String] = []
        func end() {
            guard !paragraph.isEmpty else { return }
            text += ".PP\n" + escape(paragraph.joined(separator: " ")).lineStart() + "\n"
            paragraph = []
        }
        for line in lines {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty { end() } else { paragraph.append(trimmed) }
        }
        end()
        return text
    }

    static func preformatted(_ lines: [String]) -> String {
        let kept = lines.drop { $0.trimmingCharacters(in: .whitespaces).isEmpty }
        guard !kept.isEmpty else { return "" }
        let body = kept.reversed().drop { $0.trimmingCharacters(in: .whitespaces).isEmpty }.reversed()
        return ".nf\n" + body.map { escape($0).lineStart() }.joined(separator: "\n") + "\n.fi\n"
    }

    static func quoted(_ text: String) -> String { "\"" + escape(text) + "\"" }

    /// Text as troff prints it literally: backslashes doubled, hyphens as minus signs (options stay
    /// copy-pastable).
    static func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "\\", with: "\\e").replacingOccurrences(of: "-", with: "\\-")
    }

    // MARK: Completions

    /// The subcommands and their options, for the completions.
    static var commands: [(name: String, summary: String, options: [OptionDoc])] {
        let common = OptionTable(Client.commonOptions).docs
        return [
            ("get", "download URLs (rerun to resume)", GetOptions.table.docs),
            ("verify", "check a partial download's pieces", [OptionDoc(names: ["--json"], placeholder: nil, help: "JSON output")]),
            ("serve", "the download daemon (aria2 JSON-RPC)", Serve.table.docs),
            ("add", "add downloads to a running daemon", common + OptionTable(Client.addOptions).docs),
            ("ls", "list the daemon's downloads", common),
            ("pause", "pause downloads", common),
            ("resume", "resume downloads", common),
            ("rm", "remove downloads", common),
            ("stats", "the daemon's totals", common),
            ("watch", "show progress until done", common + OptionTable(Client.watchOptions).docs),
            ("help", "help on a command", []),
            ("version", "the version", []),
        ]
    }

    /// Whether an option's value is a path (completed with file names).
    static func takesPath(_ doc: OptionDoc) -> Bool {
        guard let placeholder = doc.placeholder else { return false }
        return ["PATH", "DIR", "FILE", "DEST"].contains { placeholder.contains($0) }
    }

    static func completion(_ shell: String) -> String? {
        switch shell {
        case "bash": bash()
        case "zsh": zsh()
        case "fish": fish()
        default: nil
        }
    }

    static func bash() -> String {
        var cases = ""
        for command in commands {
            let words = command.options.flatMap(\.names).joined(separator: " ")
            let paths = command.options.filter(takesPath).flatMap(\.names).joined(separator: "|")
            let values = command.options.filter { $0.placeholder != nil && !takesPath($0) }.flatMap(\.names)
                .joined(separator: "|")
            cases += "        \(command.name))\n"
            if !paths.isEmpty { cases += "            case $prev in \(paths)) COMPREPLY=($(compgen -f -- \"$cur\")); return ;; esac\n" }
            if !values.isEmpty { cases += "            case $prev in \(values)) return ;; esac\n" }
            cases += "            opts=\"\(words)\" ;;\n"
        }
        let names = commands.map(\.name).joined(separator: " ")
        return """
            # bash completion for stitch; generated by `stitch help --completion bash`.
            _stitch() {
                local cur prev command opts
                cur=${COMP_WORDS[COMP_CWORD]}
                prev=${COMP_WORDS[COMP_CWORD-1]}
                if ((COMP_CWORD == 1)); then
                    COMPREPLY=($(compgen -W "\(names) --help --version" -- "$cur"))
                    return
                fi
                command=${COMP_WORDS[1]}
                case $command in
            \(cases)        help)
                    COMPREPLY=($(compgen -W "get serve client" -- "$cur")); return ;;
                *) return ;;
                esac
                if [[ $cur == -* ]]; then
                    COMPREPLY=($(compgen -W "$opts --help" -- "$cur"))
                elif [[ $command == verify || $command == get ]]; then
                    COMPREPLY=($(compgen -f -- "$cur"))
                fi
            }
            complete -F _stitch stitch

            """
    }

    static func zsh() -> String {
        func single(_ text: String) -> String { text.replacingOccurrences(of: "'", with: "'\\''") }
        func summary(_ doc: OptionDoc) -> String {
            let first = doc.help.split(separator: "\n").first.map(String.init) ?? ""
            return single(first.replacingOccurrences(of: "[", with: "\\[").replacingOccurrences(of: "]", with: "\\]")
                .replacingOccurrences(of: ":", with: "\\:"))
        }
        var functions = ""
        for command in commands {
            var specs: [String] = []
            for doc in command.options {
                // The value's message without what would end it (a colon) or the quoting.
                let message = (doc.placeholder ?? "").lowercased().filter { $0 != ":" && $0 != "'" && $0 != "\\" }
                let action = doc.placeholder == nil ? "" : takesPath(doc) ? ":\(message):_files" : ":\(message): "
                if doc.names.count > 1 {
                    let group = "(\(doc.names.joined(separator: " ")))"
                    specs.append("'\(group)'{\(doc.names.joined(separator: ","))}'[\(summary(doc))]\(action)'")
                } else {
                    specs.append("'\(doc.names[0])[\(summary(doc))]\(action)'")
                }
            }
            specs.append(command.name == "get" || command.name == "verify" ? "'*:file:_files'" : "'*:argument: '")
            functions += "_stitch_\(command.name)() {\n    _arguments -s \\\n        "
                + specs.joined(separator: " \\\n        ") + "\n}\n\n"
        }
        let list = commands.map { "'\($0.name):\(single($0.summary))'" }.joined(separator: "\n        ")
        return """
            #compdef stitch
            # zsh completion for stitch; generated by `stitch help --completion zsh`.

            \(functions)_stitch() {
                local -a commands
                commands=(
                    \(list)
                )
                if (( CURRENT == 2 )); then
                    _describe -t commands 'stitch command' commands
                    return
                fi
                local command=${words[2]}
                shift words
                (( CURRENT-- ))
                if (( $+functions[_stitch_$command] )); then
                    _stitch_$command
                fi
            }

            _stitch "$@"

            """
    }

    static func fish() -> String {
        func single(_ text: String) -> String { text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'") }
        var lines = [
            "# fish completion for stitch; generated by `stitch help --completion fish`.",
            "complete -c stitch -f",
        ]
        let names = commands.map(\.name).joined(separator: " ")
        for command in commands {
            lines.append(
                "complete -c stitch -n 'not __fish_seen_subcommand_from \(names)' -a \(command.name) -d '\(single(command.summary))'")
        }
        for command in commands {
            for doc in command.options {
                var line = "complete -c stitch -n '__fish_seen_subcommand_from \(command.name)'"
                for name in doc.names {
                    if name.hasPrefix("--") { line += " -l \(name.dropFirst(2))" } else { line += " -s \(name.dropFirst())" }
                }
                if doc.placeholder != nil { line += takesPath(doc) ? " -r -F" : " -r" }
                let first = doc.help.split(separator: "\n").first.map(String.init) ?? ""
                line += " -d '\(single(first))'"
                lines.append(line)
            }
        }
        lines.append("complete -c stitch -n '__fish_seen_subcommand_from get verify' -F")
        return lines.joined(separator: "\n") + "\n"
    }
}

extension String {
    /// A line troff would read as a request (starting with `.` or `'`) is made text.
    fileprivate func lineStart() -> String {
        hasPrefix(".") || hasPrefix("'") ? "\\&" + self : self
    }
}
