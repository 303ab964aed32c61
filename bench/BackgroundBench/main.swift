// One download through `BackgroundDownloads` (download tasks: FoundationNetworking's on Linux), for
// bench/background.sh: `stitch-background-bench URL DEST STATE_DIR [RANGE_MIB]`. Exits 0 once the file is in place,
// 1 if the download failed (the message on stderr), 64 for bad arguments.
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
    let id = try await downloads.add(arguments[1], to: arguments[2])
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
