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
