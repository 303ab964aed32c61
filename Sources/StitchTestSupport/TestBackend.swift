import Foundation
public import Stitch

/// The transport backends the engine's tests can run over. Suites that drive the engine against the fault-injecting
/// server take theirs from ``selected`` (the `STITCH_TEST_TRANSPORT` environment variable: `libcurl`, the default,
/// or `urlsession`), so the test script runs them once per backend; the conformance suite runs both in one go.
public enum TestBackend: String, Sendable, CaseIterable, CustomStringConvertible {
    case libcurl
    case urlSession = "urlsession"

    /// The process-wide transport of this backend.
    public var transport: any HTTPTransport {
        switch self {
        case .libcurl: return CurlTransport.shared
        case .urlSession: return URLSessionTransport.shared
        }
    }

    /// The backend named by `STITCH_TEST_TRANSPORT`; libcurl when it is unset. An unknown name stops the run
    /// rather than silently testing the default.
    public static let selected: TestBackend = {
        guard let name = ProcessInfo.processInfo.environment["STITCH_TEST_TRANSPORT"], !name.isEmpty else {
            return .libcurl
        }
        guard let backend = TestBackend(rawValue: name) else {
            fatalError("STITCH_TEST_TRANSPORT=\(name): expected libcurl or urlsession")
        }
        return backend
    }()

    public var description: String { rawValue }
}
