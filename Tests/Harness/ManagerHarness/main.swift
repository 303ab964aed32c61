// A small program around `DownloadManager` for the crash tests (Tests/StitchTests/ManagerCrashTests.swift): the
// tests SIGKILL it at arbitrary moments and start it again on the same directory.
//
//     stitch-manager-harness --directory DIR --downloads DIR [--spec FILE] [--max-concurrent N] [--no-auto-resume]
//
// It opens the manager kept in `--directory`, adds the downloads of the JSON spec file that the catalog does not
// have yet (matched by their `out` path, so a restart never adds one twice), prints one line per status change,
// waits until no download is queued or running, prints every download, and exits 0.
//
// Spec: `[{"url": "...", "out": "name.bin", "connections": 4, "paused": false}, ...]`; `out` is relative to
// `--downloads`.
//
// Output lines (stdout, flushed at once):
//     restored <count> rebuilt <yes|no>
//     added <id> <out>
//     ready
//     status <id> <status>
//     final <id> <status> <path>
//
// For bench/manager.sh:
//     stitch-manager-harness --directory DIR --fill N   adds N paused downloads in one batch, closes; prints
//                                                      "filled N in S s"
//     stitch-manager-harness --directory DIR --open     opens (restoring everything) and closes; prints
//                                                      "restored N in S s" (open, restore and list all)

import Foundation
import Stitch

struct Item: Decodable {
    var url: String
    var out: String
    var connections: Int?
    var paused: Bool?
}

/// Writes one line to stdout at once (unbuffered: a kill must not lose what was said).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("stitch-manager-harness: \(message)\n".utf8))
    exit(2)
}

var directory: String?
var downloads: String?
var specPath: String?
var maxConcurrent: Int?
var autoResume = true
var fill: Int?
var openOnly = false
var arguments = CommandLine.arguments.dropFirst()
while let argument = arguments.popFirst() {
    switch argument {
    case "--directory": directory = arguments.popFirst()
    case "--downloads": downloads = arguments.popFirst()
    case "--spec": specPath = arguments.popFirst()
    case "--max-concurrent": maxConcurrent = arguments.popFirst().flatMap { Int($0) }
    case "--no-auto-resume": autoResume = false
    case "--fill": fill = arguments.popFirst().flatMap { Int($0) }
    case "--open": openOnly = true
    default: fail("unknown argument \(argument)")
    }
}
guard let directory else { fail("--directory is required") }
let folder = downloads ?? directory

var items: [Item] = []
if let specPath {
    guard let data = FileManager.default.contents(atPath: specPath) else { fail("cannot read \(specPath)") }
    do { items = try JSONDecoder().decode([Item].self, from: data) } catch { fail("bad spec: \(error)") }
}

var configuration = DownloadManager.Configuration(downloadDirectory: folder)
if let maxConcurrent { configuration.maxConcurrentDownloads = maxConcurrent }
configuration.autoResume = autoResume
configuration.retry.baseDelay = 0.01
configuration.retry.maxDelay = 0.1
configuration.transport.connectTimeout = 10
configuration.transport.stallTimeout = 30

func seconds(since start: ContinuousClock.Instant) -> String {
    let elapsed = ContinuousClock.now - start
    return String(format: "%.3f", Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}

let opening = ContinuousClock.now
let manager: DownloadManager
do { manager = try DownloadManager(directory: directory, configuration: configuration) } catch {
    fail("cannot open the manager: \(error)")
}
if openOnly {
    let count = await manager.downloads().count
    say("restored \(count) in \(seconds(since: opening)) s")
    await manager.close()
    exit(0)
}
if let fill {
    let started = ContinuousClock.now
    let batch = (0..<fill).map { index -> (url: String, options: DownloadManager.AddOptions) in
        var options = DownloadManager.AddOptions(out: "file-\(index).bin")
        options.paused = true
        return ("http://127.0.0.1:9/file-\(index).bin", options)
    }
    do { _ = try await manager.add(batch) } catch { fail("cannot add: \(error)") }
    await manager.close()
    say("filled \(fill) in \(seconds(since: started)) s")
    exit(0)
}
let report = manager.restoreReport
say("restored \(report.restored) rebuilt \(report.rebuiltBecause == nil ? "no" : "yes")")

let events = await manager.events()
let printer = Task {
    for await event in events {
        if case .statusChanged(let id, let status) = event { say("status \(id) \(status.name)") }
    }
}

func absolute(_ out: String) -> String { out.hasPrefix("/") ? out : folder + "/" + out }

let known = Set(
    await manager.downloads().compactMap { snapshot -> String? in
        if case .file(let path) = snapshot.destination { path } else { nil }
    })
let missing = items.filter { !known.contains(absolute($0.out)) }
if !missing.isEmpty {
    let batch = missing.map { item -> (url: String, options: DownloadManager.AddOptions) in
        var options = DownloadManager.AddOptions(out: item.out)
        options.connections = item.connections
        options.paused = item.paused ?? false
        return (item.url, options)
    }
    do {
        let ids = try await manager.add(batch)
        for (id, item) in zip(ids, missing) { say("added \(id) \(item.out)") }
    } catch {
        fail("cannot add: \(error)")
    }
}
say("ready")
await manager.waitUntilIdle()
for snapshot in await manager.downloads() {
    say("final \(snapshot.id) \(snapshot.status.name) \(snapshot.path ?? "-")")
}
await manager.close()
await printer.value
exit(0)
