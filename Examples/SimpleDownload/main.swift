// A minimal use of the Stitch library: download a URL to a file with a progress line, resuming whatever an
// earlier run left. Build and run: swift run stitch-example URL PATH
import Glibc
import Stitch

let arguments = CommandLine.arguments
guard arguments.count == 3 else {
    print("usage: stitch-example URL PATH")
    exit(64)
}

do throws(DownloadError) {
    let result = try await Downloader().download(
        DownloadRequest(url: arguments[1], destination: .file(arguments[2]))
    ) { event in
        switch event {
        case .progress(let progress):
            let total = progress.total.map { " of \($0)" } ?? ""
            print("\(progress.bytes)\(total) bytes", terminator: "\r")
        case .restarting(let reason):
            print("starting over: \(reason)")
        default:
            break
        }
    }
    print("\nsaved \(result.destination) (\(result.bytes) bytes\(result.resumedFrom > 0 ? ", resumed" : ""))")
} catch {
    print("\nfailed: \(error.message)\(error.isResumable ? " (rerun to resume)" : "")")
    exit(1)
}
