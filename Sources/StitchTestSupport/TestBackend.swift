import Foundation
public import Stitch

/// The transport backends the engine's tests run over: the library's own list (``TransportBackend``).
public typealias TestBackend = TransportBackend

extension TransportBackend {
    /// The process-wide transport of this backend, for a test that has already chosen one this build has.
    public var testTransport: any HTTPTransport {
        guard let transport else { fatalError("this build has no \(self) transport (see TransportBackend.available)") }
        return transport
    }

    /// The backend the suites that drive the engine against the fault-injecting server use: the one named by
    /// `STITCH_TEST_TRANSPORT` (`libcurl` or `urlsession`), else the build's default. So the test script runs them
    /// once per backend; the conformance suite runs every backend the build has in one go. An unknown name, or one
    /// this build lacks, stops the run rather than silently testing the default.
    public static let selected: TransportBackend = {
        guard let name = ProcessInfo.processInfo.environment["STITCH_TEST_TRANSPORT"], !name.isEmpty else {
            return .default
        }
        guard let backend = TransportBackend(rawValue: name) else {
            fatalError("STITCH_TEST_TRANSPORT=\(name): expected one of \(TransportBackend.available)")
        }
        guard backend.transport != nil else {
            fatalError("STITCH_TEST_TRANSPORT=\(name): this build has no \(name) transport (the Libcurl trait is off)")
        }
        return backend
    }()
}

extension TransportBackend {
    /// The window the backend's shared transport asks for a whole file or an open range in (``URLSessionTransport``;
    /// Stitch's `RangeWindow`), or nil when it sends every request as the engine made it.
    public var requestWindow: Int? {
        switch self {
        case .urlSession: return URLSessionTransport.shared.window
        case .libcurl: return nil
        }
    }
}

extension RecordedRequest {
    /// The `Range` the engine asked for, seen through the window of the backend under test
    /// (``TransportBackend/selected``): over URLSession a request for the whole file, or for a range to the end,
    /// goes out as its first window, `bytes=A-(A+W-1)`; that stands for `bytes=A-`, or for no `Range` at all at
    /// `A = 0` without `If-Range`. Over libcurl this is ``range``. Meant for files no larger than a window: the
    /// windows after the first, and a lane's range longer than a window, are not told apart from the engine's own.
    public var askedRange: String? {
        guard let range, let window = TransportBackend.selected.requestWindow, range.hasPrefix("bytes="),
            let dash = range.firstIndex(of: "-"),
            let first = Int(range[range.index(range.startIndex, offsetBy: 6)..<dash]),
            let last = Int(range[range.index(after: dash)...]), last - first + 1 == window
        else { return range }
        return first == 0 && header("If-Range") == nil ? nil : "bytes=\(first)-"
    }
}
