// One download through `BackgroundDownloads` (download tasks: FoundationNetworking's on Linux), for
// bench/background.sh: `stitch-background-bench URL DEST STATE_DIR [RANGE_MIB]`. Exits 0 once the file is in place,
// 1 if the download failed (the message on stderr), 64 for bad arguments.
//
// Run again after it was killed (or the power was cut: PowerCutTests), it does what an app does at launch: reattaches
// and carries on with the download to DEST it finds in STATE_DIR (resuming it if it had stopped), or, finding none and
// DEST in place, is done.
import Foundation
import Stitch

let arguments = CommandLine.arguments
guard arguments.count == 4 || arguments.count == 5 else {
    FileHandle.standardError.write(Data("usage: stitch-background-bench URL DEST STATE_DIR [RANGE_MIB]\n".utf8))
    exit(64)
}
var configuration = BackgroundDownloads.Configuration()
if arguments.count == 5 {
    guard let mib = Int64(arguments[4]), mib > 0 else {
        FileHandle.standardError.write(Data("stitch-background-bench: RANGE_MIB must be a positive number\n".utf8))
        exit(64)
    }
    configuration.rangeSize = mib << 20
}
do {
    let downloads = try BackgroundDownloads(
        identifier: "bench", stateDirectory: arguments[3], configuration: configuration)
    await downloads.reattach()
    let destination = URL(fileURLWithPath: arguments[2]).standardizedFileURL.path
    let known = await downloads.downloads().first {
        URL(fileURLWithPath: $0.destination).standardizedFileURL.path == destination
    }
    let id: DownloadID
    if let known {
        id = known.id
        if known.phase != .active { await downloads.resume(id) }
    } else if FileManager.default.fileExists(atPath: destination) {
        await downloads.close()
        exit(0)
    } else {
        id = try await downloads.add(arguments[1], to: arguments[2])
    }
    // Finished while reattaching (every byte was already durable).
    if FileManager.default.fileExists(atPath: destination),
        await !downloads.downloads().contains(where: { $0.id == id })
    {
        await downloads.close()
        exit(0)
    }
    for await event in downloads.events {
        switch event {
        case .finished(id, _):
            await downloads.close()
            exit(0)
        case .failed(id, let message):
            FileHandle.standardError.write(Data("stitch-background-bench: \(message)\n".utf8))
            exit(1)
        case .restarted(_, let reason):
            FileHandle.standardError.write(Data("stitch-background-bench: starting over: \(reason)\n".utf8))
        default:
            continue
        }
    }
    exit(1)
} catch {
    FileHandle.standardError.write(Data("stitch-background-bench: \(error)\n".utf8))
    exit(1)
}
