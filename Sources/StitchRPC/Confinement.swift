import Foundation

/// Keeps a folder that a client names inside the folder the server was given: `..` is refused outright, and the
/// part that exists is resolved through its symbolic links and must still lie inside (so a link placed in the
/// served folder cannot lead a download elsewhere).
enum Confinement {
    /// The absolute folder `requested` names (relative to `base`, or absolute inside it).
    static func folder(_ requested: String, within base: String) throws(Aria2RPC.Failure) -> String {
        guard !requested.isEmpty, !requested.contains("\u{0}") else {
            throw .aria2("option dir: \(requested.debugDescription) is not a folder name")
        }
        let components = requested.split(separator: "/", omittingEmptySubsequences: true)
        guard !components.contains("..") else {
            throw .aria2("option dir: \(requested.debugDescription) may not contain '..'")
        }
        let root = resolved(base)
        let normal = normalized(requested.hasPrefix("/") ? requested : base + "/" + requested)
        // Named inside the folder, as written or with its links resolved …
        let named = [normalized(base), root].contains { normal == $0 || normal.hasPrefix($0 == "/" ? "/" : $0 + "/") }
        // … and the longest part that exists, its links resolved, is the folder or inside it.
        var existing = normal
        while existing != "/", !FileManager.default.fileExists(atPath: existing) {
            existing = (existing as NSString).deletingLastPathComponent
        }
        let real = resolved(existing)
        guard named, real == root || real.hasPrefix(root == "/" ? "/" : root + "/") else {
            throw .aria2("option dir: \(requested.debugDescription) is outside the served folder \(base)")
        }
        return normal
    }

    /// `path` absolute, without empty or `.` components.
    static func normalized(_ path: String) -> String {
        "/" + path.split(separator: "/").filter { $0 != "." }.joined(separator: "/")
    }

    /// `path` (absolute) with the links of its longest existing part resolved and the rest appended as written.
    static func resolvedPath(_ path: String) -> String {
        var existing = normalized(path)
        var rest: [Substring] = []
        while existing != "/", !FileManager.default.fileExists(atPath: existing) {
            rest.insert(Substring((existing as NSString).lastPathComponent), at: 0)
            existing = (existing as NSString).deletingLastPathComponent
        }
        let head = resolved(existing)
        return rest.isEmpty ? head : (head == "/" ? "" : head) + "/" + rest.joined(separator: "/")
    }

    /// `path` with every symbolic link resolved (the path itself when it does not exist).
    static func resolved(_ path: String) -> String {
        guard let pointer = realpath(path, nil) else { return path }
        defer { free(pointer) }
        return String(cString: pointer)
    }
}
