import Foundation
import Glibc

/// Finds an executable of this package built alongside the test bundle (e.g. `stitch`, `stitch-manager-harness`):
/// the value of `environmentVariable` if set, else the first regular executable file named `name` found by
/// walking up (at most six levels) from the test bundle (`CommandLine.arguments[0]`, `/proc/self/exe`,
/// `Bundle.main`).
public func builtExecutable(named name: String, environmentVariable: String) -> String? {
    if let override = ProcessInfo.processInfo.environment[environmentVariable], !override.isEmpty {
        return override
    }
    var starts: [URL] = []
    if let first = CommandLine.arguments.first {
        let cwd = URL(fileURLWithPath: FileManager.default.currentDirectoryPath)
        starts.append(URL(fileURLWithPath: first, relativeTo: cwd))
    }
    if let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
        starts.append(URL(fileURLWithPath: exe))
    }
    starts.append(Bundle.main.bundleURL.appendingPathComponent("x"))
    if let executable = Bundle.main.executableURL { starts.append(executable) }
    for start in starts {
        var directory = start.standardizedFileURL.deletingLastPathComponent()
        for _ in 0..<6 {
            let candidate = directory.appendingPathComponent(name).path
            var info = stat()
            if stat(candidate, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, access(candidate, X_OK) == 0 {
                return candidate
            }
            if directory.path == "/" { break }
            directory = directory.deletingLastPathComponent()
        }
    }
    return nil
}
