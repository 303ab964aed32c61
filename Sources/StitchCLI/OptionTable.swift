/// One use of an option on the command line, as its `apply` closure sees it.
struct OptionUse {
    /// The name as the user spelled it (`-o` or `--output`), for messages.
    let name: String
    /// The value: the next argument, or what followed `=` in `--name=value`. Empty for a flag.
    let value: String
    /// Whether the value came after `=` in the same argument.
    let isInline: Bool
}

/// One command-line option: its names, whether it takes a value, its help, and what it does.
///
/// The same entry drives the reader (``OptionTable/parse(_:into:positional:)``) and the OPTIONS section of the
/// command's help (``OptionTable/help(column:)``), so the two cannot drift apart.
struct OptionSpec<Options>: Sendable {
    /// The names shown in help and accepted, short ones first (`["-o", "--output"]`).
    let names: [String]
    /// Other spellings accepted but not shown (`--directory` for `--dir`).
    let aliases: [String]
    /// What the value is called in help (`PATH`), or nil for a flag, which takes no value.
    let placeholder: String?
    /// The help text. A line break in it is kept; a line too long for the help's width is wrapped. Nil: the option
    /// is read but not shown (`--rpc-secret`, which is only there to be refused with a reason).
    let help: String?
    /// Parses the value into the command's options; throws ``UsageError`` for a bad one.
    let apply: @Sendable (inout Options, OptionUse) throws -> Void

    /// An option that takes a value (`-o PATH`, `--output PATH`, `--output=PATH`).
    static func value(
        _ names: [String], _ placeholder: String, aliases: [String] = [], help: String?,
        _ apply: @escaping @Sendable (inout Options, OptionUse) throws -> Void
    ) -> Self {
        Self(names: names, aliases: aliases, placeholder: placeholder, help: help, apply: apply)
    }

    /// A flag: it takes no value, and `--flag=value` is refused.
    static func flag(
        _ names: [String], aliases: [String] = [], help: String?,
        _ apply: @escaping @Sendable (inout Options, OptionUse) throws -> Void
    ) -> Self {
        Self(names: names, aliases: aliases, placeholder: nil, help: help, apply: apply)
    }

    /// Every name the reader accepts for this option.
    var allNames: [String] { names + aliases }
}

/// A command's options, and the one reader of the command line that every command uses (`stitch get`,
/// `stitch serve`, the client commands).
///
/// The reader's rules: `-o VALUE` and `--output VALUE`, or `--output=VALUE` (long names only); a flag given
/// `=VALUE` is an error; `--` ends the options; `-` alone is an argument, not an option.
struct OptionTable<Options>: Sendable {
    let specs: [OptionSpec<Options>]
    /// The message for an option not in the table (the name only, never an inline value, which could be a secret
    /// given to the wrong option).
    let unknownOption: @Sendable (String) -> String

    init(
        _ specs: [OptionSpec<Options>],
        unknownOption: @escaping @Sendable (String) -> String = { "unknown option '\($0)'" }
    ) {
        self.specs = specs
        self.unknownOption = unknownOption
    }

    /// The option with this name or alias.
    func spec(named name: String) -> OptionSpec<Options>? {
        specs.first { $0.allNames.contains(name) }
    }

    /// Reads `arguments` into `options`, in order.
    ///
    /// A flag's `apply` runs before a `=value` given to it is refused, so a flag that refuses itself
    /// (`--rpc-secret`) gives its own reason either way.
    /// - Parameter positional: what to do with an argument that is not an option; throws to refuse it.
    /// - Throws: ``UsageError``: an unknown option, a missing value, a value given to a flag, or whatever an
    ///   option's `apply` or `positional` throws.
    func parse(
        _ arguments: [String], into options: inout Options,
        positional: (inout Options, String) throws -> Void
    ) throws {
        var index = 0
        var optionsEnded = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if optionsEnded || argument == "-" || !argument.hasPrefix("-") {
                try positional(&options, argument)
                continue
            }
            if argument == "--" {
                optionsEnded = true
                continue
            }
            var name = argument
            var inlineValue: String?
            if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
                name = String(argument[..<equals])
                inlineValue = String(argument[argument.index(after: equals)...])
            }
            guard let spec = spec(named: name) else { throw UsageError(unknownOption(name)) }
            guard spec.placeholder != nil else {
                try spec.apply(&options, OptionUse(name: name, value: "", isInline: false))
                if inlineValue != nil { throw UsageError("\(name) takes no value") }
                continue
            }
            let value: String
            if let inlineValue {
                value = inlineValue
            } else {
                guard index < arguments.count else { throw UsageError("\(name) needs a value") }
                value = arguments[index]
                index += 1
            }
            try spec.apply(&options, OptionUse(name: name, value: value, isInline: inlineValue != nil))
        }
    }

    /// The lines of an OPTIONS section: each option's names and placeholder, then its help from `column` on.
    ///
    /// Names too long for the column are followed by two spaces and a one-line help, or by the help on the lines
    /// below. Help lines longer than `width` are wrapped at spaces. Hidden options (no help) are left out.
    func help(column: Int, width: Int = 110) -> String {
        var lines: [String] = []
        let indent = String(repeating: " ", count: column)
        for spec in specs {
            guard let help = spec.help else { continue }
            let head = "  " + Self.names(spec)
            let text = help.split(separator: "\n", omittingEmptySubsequences: false).flatMap {
                Self.wrap(String($0), width: width - column)
            }
            guard let first = text.first else {
                lines.append(head)
                continue
            }
            if head.count + 2 <= column {
                lines.append(head + String(repeating: " ", count: column - head.count) + first)
            } else if text.count == 1 {
                lines.append(head + "  " + first)
            } else {
                lines.append(head)
                lines.append(indent + first)
            }
            lines += text.dropFirst().map { indent + $0 }
        }
        return lines.joined(separator: "\n")
    }

    /// `-o, --output PATH`; a long name alone is indented to line up with the long names after short ones.
    static func names(_ spec: OptionSpec<Options>) -> String {
        let startsShort = spec.names.first.map { !$0.hasPrefix("--") } ?? false
        let names = (startsShort ? "" : "    ") + spec.names.joined(separator: ", ")
        return spec.placeholder.map { names + " " + $0 } ?? names
    }

    /// `text` in lines of at most `width` characters, broken at spaces (a longer word stays whole).
    static func wrap(_ text: String, width: Int) -> [String] {
        guard text.count > width else { return [text] }
        var lines: [String] = []
        var line = ""
        for word in text.split(separator: " ") {
            if !line.isEmpty && line.count + 1 + word.count > width {
                lines.append(line)
                line = ""
            }
            line += (line.isEmpty ? "" : " ") + word
        }
        if !line.isEmpty { lines.append(line) }
        return lines
    }
}
