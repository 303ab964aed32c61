// stitch-chaos-server: a TestHTTPServer serving random files with seeded random faults, for bench/chaos.sh.
//
//   stitch-chaos-server --files N --seed S --fault-rate P --port-file PATH --dir DIR
//                       [--replace-rate R] [--max-versions V] [--throttle BYTES_PER_SECOND]
//
// Writes DIR/list.txt (aria2 input format), DIR/SHA256SUMS (current versions), DIR/versions/<name>
// (one line per version ever served: sha256, size, ETag), then the port to PATH, and serves until
// SIGTERM/SIGINT, when it writes its counters to DIR/server-stats.txt and exits.
import Glibc
import StitchTestSupport
import Synchronization
import StitchLocks

struct Options {
    var files = 20
    var seed: UInt64 = 1
    var faultRate = 0.15
    var replaceRate = 0.02
    var maxVersions = 4
    var throttle = 0
    var portFile = ""
    var dir = ""
}

func log(_ message: String) {
    let line = Array("stitch-chaos-server: \(message)\n".utf8)
    _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}

func fail(_ message: String) -> Never {
    log(message)
    exit(64)
}

func parseOptions() -> Options {
    var options = Options()
    var args = CommandLine.arguments.dropFirst()
    func value(_ name: String) -> String {
        guard let next = args.popFirst() else { fail("\(name) needs a value") }
        return next
    }
    while let arg = args.popFirst() {
        switch arg {
        case "--files": options.files = Int(value(arg)) ?? 0
        case "--seed": options.seed = UInt64(value(arg)) ?? 0
        case "--fault-rate": options.faultRate = Double(value(arg)) ?? -1
        case "--replace-rate": options.replaceRate = Double(value(arg)) ?? -1
        case "--max-versions": options.maxVersions = Int(value(arg)) ?? 0
        case "--throttle": options.throttle = Int(value(arg)) ?? -1
        case "--port-file": options.portFile = value(arg)
        case "--dir": options.dir = value(arg)
        default: fail("unknown argument \(arg)")
        }
    }
    guard options.files > 0, (0...1).contains(options.faultRate), (0...1).contains(options.replaceRate),
        options.maxVersions >= 1, options.throttle >= 0, !options.portFile.isEmpty, !options.dir.isEmpty
    else {
        fail(
            "usage: stitch-chaos-server --files N --seed S --fault-rate P --port-file PATH --dir DIR "
                + "[--replace-rate R] [--max-versions V] [--throttle BPS]")
    }
    return options
}

/// Writes `text` to `path` through a temporary file and `rename`, so readers never see a partial file.
func writeAtomically(_ path: String, _ text: String) {
    let temporary = path + ".tmp"
    guard let file = fopen(temporary, "w") else { fail("cannot write \(temporary)") }
    fputs(text, file)
    fflush(file)
    fsync(fileno(file))
    fclose(file)
    guard rename(temporary, path) == 0 else { fail("cannot rename \(temporary)") }
}

func appendLine(_ path: String, _ line: String) {
    guard let file = fopen(path, "a") else { fail("cannot append to \(path)") }
    fputs(line + "\n", file)
    fflush(file)
    fsync(fileno(file))
    fclose(file)
}

/// One served file: its name and the version now served.
struct Entry: Sendable {
    let name: String
    let split: Bool
    var size: Int
    var version: Int
    var sha256: String
}

final class Chaos: Sendable {
    let server: TestHTTPServer
    let options: Options
    private let state: Locked<State>
    /// Serialises replacements and the files they write.
    private let replaceLock = Locked(())

    struct State {
        var rng: SplitMix64
        var entries: [Entry]
        var requests = 0
        var faults: [String: Int] = [:]
        var replacing: Set<Int> = []
        var replacements = 0
    }

    init(options: Options) throws(TestServerError) {
        self.options = options
        server = try TestHTTPServer()
        if options.throttle > 0 { server.throttle = options.throttle }
        var rng = SplitMix64(seed: options.seed)
        var entries: [Entry] = []
        for index in 0..<options.files {
            // A quarter large (16-24 MiB, always split=4), a quarter medium (1-16 MiB, half split=4),
            // half small (100 KiB - 1 MiB).
            let size: Int
            let split: Bool
            switch index % 4 {
            case 0:
                size = Int.random(in: (16 << 20)...(24 << 20), using: &rng)
                split = true
            case 1:
                size = Int.random(in: (1 << 20)...(16 << 20), using: &rng)
                split = Bool.random(using: &rng)
            default:
                size = Int.random(in: (100 << 10)...(1 << 20), using: &rng)
                split = false
            }
            entries.append(Entry(name: (index < 10 ? "f0\(index)" : "f\(index)") + ".bin", split: split, size: size, version: 0, sha256: ""))
        }
        state = Locked(State(rng: rng, entries: entries))
    }

    private func path(_ index: Int) -> String { "/" + state.withLock { $0.entries[index].name } }

    private func makeFile(index: Int, version: Int, size: Int) -> (ServedFile, String) {
        let seed = options.seed &* 1_000_003 &+ UInt64(index) &* 1009 &+ UInt64(version)
        let data = ServedFile.randomBytes(count: size, seed: seed)
        let sha = SHA256.hex(data)
        let etag = "\"v\(version)-\(sha.prefix(16))\""
        let modified = ServedFile.httpDate(secondsSince1970: 1_700_000_000 + index * 86_400 + version * 3_600)
        return (ServedFile(data: data, etag: etag, lastModified: modified), sha)
    }

    private func versionsPath(_ name: String) -> String { options.dir + "/versions/" + name }

    private func writeSums() {
        let entries = state.withLock { $0.entries }
        writeAtomically(options.dir + "/SHA256SUMS", entries.map { "\($0.sha256)  \($0.name)\n" }.joined())
    }

    func start() {
        mkdir(options.dir + "/versions", 0o755)
        let count = state.withLock { $0.entries.count }
        var list = ""
        for index in 0..<count {
            let (name, size, split) = state.withLock { ($0.entries[index].name, $0.entries[index].size, $0.entries[index].split) }
            let (file, sha) = makeFile(index: index, version: 0, size: size)
            state.withLock { $0.entries[index].sha256 = sha }
            writeAtomically(versionsPath(name), "\(sha) \(size) \(file.etag ?? "-")\n")
            server.serve("/" + name, file: file) { [self] request, requestIndex in
                fault(index: index, request: request, requestIndex: requestIndex)
            }
            list += server.url("/" + name) + "\n  out=\(name)\n" + (split ? "  split=4\n" : "")
        }
        writeSums()
        writeAtomically(options.dir + "/list.txt", list)
        writeAtomically(options.portFile, "\(server.port)\n")
    }

    private func fault(index: Int, request: RecordedRequest, requestIndex: Int) -> Fault {
        let (fault, replace) = state.withLock { state -> (Fault, Bool) in
            state.requests += 1
            let size = state.entries[index].size
            var replace = false
            if state.entries[index].version + 1 < options.maxVersions, !state.replacing.contains(index),
                Double.random(in: 0..<1, using: &state.rng) < options.replaceRate
            {
                state.replacing.insert(index)
                replace = true
            }
            guard Double.random(in: 0..<1, using: &state.rng) < options.faultRate else { return (.none, replace) }
            let cut = Int.random(in: 0...max(0, min(size - 1, 8 << 20)), using: &state.rng)
            let kind: String
            let fault: Fault
            switch Int.random(in: 0..<5, using: &state.rng) {
            case 0: (kind, fault) = ("drop", .dropAfter(cut))
            case 1: (kind, fault) = ("reset", .resetAfter(cut))
            case 2: (kind, fault) = ("stall", .stallAfter(cut, then: .close))
            case 3: (kind, fault) = ("status503", .status(503, headers: [("Retry-After", "1")]))
            default: (kind, fault) = ("ignoreRange", .ignoreRange)
            }
            state.faults[kind, default: 0] += 1
            return (fault, replace)
        }
        // This request is already bound to the version served before the replacement.
        if replace { self.replace(index: index) }
        return fault
    }

    /// A validator change: new content (maybe a new size) and a new ETag. The version is recorded
    /// before it is served, so a client can never complete a version the script does not know.
    private func replace(index: Int) {
        replaceLock.withLock { _ in
            let (entry, newSize) = state.withLock { state -> (Entry, Int) in
                let entry = state.entries[index]
                let delta = Int.random(in: -(entry.size / 8)...(entry.size / 8), using: &state.rng)
                return (entry, Bool.random(using: &state.rng) ? entry.size : max(1, entry.size + delta))
            }
            let version = entry.version + 1
            let (file, sha) = makeFile(index: index, version: version, size: newSize)
            appendLine(versionsPath(entry.name), "\(sha) \(newSize) \(file.etag ?? "-")")
            state.withLock { state in
                state.entries[index].version = version
                state.entries[index].size = newSize
                state.entries[index].sha256 = sha
                state.replacements += 1
                state.faults["validatorChange", default: 0] += 1
            }
            server.replaceFile("/" + entry.name, with: file)
            writeSums()
            state.withLock { _ = $0.replacing.remove(index) }
        }
    }

    func writeStats() {
        let stats = state.withLock { state in
            var lines = ["requests \(state.requests)", "body_bytes_sent \(server.bodyBytesSent)"]
            for kind in ["drop", "reset", "stall", "status503", "ignoreRange", "validatorChange"] {
                lines.append("fault_\(kind) \(state.faults[kind, default: 0])")
            }
            lines.append("connections \(server.connectionCount)")
            for entry in state.entries {
                lines.append("file \(entry.name) version \(entry.version) size \(entry.size)")
            }
            return lines.joined(separator: "\n") + "\n"
        }
        writeAtomically(options.dir + "/server-stats.txt", stats)
    }
}

let options = parseOptions()
// Block the signals in every thread (server threads inherit the mask); the main thread takes them with sigtimedwait.
var signals = sigset_t()
sigemptyset(&signals)
sigaddset(&signals, SIGTERM)
sigaddset(&signals, SIGINT)
pthread_sigmask(SIG_BLOCK, &signals, nil)

let chaos: Chaos
do {
    chaos = try Chaos(options: options)
} catch {
    fail("cannot start the server: \(error)")
}
chaos.start()
log("serving \(options.files) files on \(chaos.server.baseURL)")

// Release stalls every second, so a stall lasts at most about 1 s (well under the client's --timeout).
var tick = timespec(tv_sec: 1, tv_nsec: 0)
while true {
    let signal = sigtimedwait(&signals, nil, &tick)
    if signal == SIGTERM || signal == SIGINT {
        chaos.writeStats()
        log("stopped by signal \(signal)")
        exit(0)
    }
    chaos.server.releaseStalls()
}
