import Foundation
import Testing

@testable import Stitch
@testable import StitchCore

/// What the start of a download decides about an earlier run's files (``OpenPolicy``): the state to go by, and
/// whether a partial is resumed, deleted or refused — with the partial kept whenever the download is refused.
@Suite struct OpenPolicyTests {
    static let url = "http://example.test/f.bin"
    static let paths = DownloadPaths(destination: "/d/f.bin")

    static func state(_ url: String = url) -> DownloadState {
        DownloadState(
            url: url, headers: [], checksum: nil,
            validators: Validators(etag: "\"v\"", lastModified: nil, date: nil, totalLength: 100, acceptRanges: true),
            segments: [Segment(start: 0, end: 100, durable: 40)], bootID: "b", liveNonce: "5eed", updatedAt: 0)
    }

    static func owns(_ other: String) -> Bool { other == url || other == "http://old.test/f.bin" }

    static func describe(_ choice: OpenPolicy.StateChoice) -> String {
        switch choice {
        case .none: "none"
        case .use(let state, let damaged): "use \(state.url)" + (damaged.map { " (damaged: \($0))" } ?? "")
        case .discard: "discard"
        case .refuse(let error): "refuse \(error.code): \(error.message)"
        }
    }

    /// A clean state is used; a damaged one gives way to this download's previous generation, else the partial is
    /// kept and the download refused (unless the user asked to overwrite: discarded); a state that could not be
    /// read for another reason is refused as it is, even with overwrite.
    @Test func theStateToGoBy() {
        let damaged = DownloadError(.unusableState, "the state file is damaged")
        let unreadable = DownloadError(.io, "cannot read the state file")
        let cases: [(PartialDownload.Saved, Bool, String)] = [
            (.none, false, "none"),
            (.state(Self.state()), false, "use \(Self.url)"),
            (.state(Self.state("http://other.test/x")), false, "use http://other.test/x"),
            (.unusable(damaged, previous: Self.state()), false, "use \(Self.url) (damaged: the state file is damaged)"),
            (.unusable(damaged, previous: Self.state("http://old.test/f.bin")), false,
                "use http://old.test/f.bin (damaged: the state file is damaged)"),
            (.unusable(damaged, previous: Self.state("http://other.test/x")), false,
                "refuse unusableState: the state file is damaged; the partial data is kept"),
            (.unusable(damaged, previous: nil), false, "refuse unusableState: the state file is damaged; the partial data is kept"),
            (.unusable(damaged, previous: nil), true, "discard"),
            (.unusable(unreadable, previous: Self.state()), true, "refuse io: cannot read the state file"),
        ]
        for (saved, overwrite, expected) in cases {
            #expect(Self.describe(OpenPolicy.state(saved, owns: Self.owns, overwrite: overwrite)) == expected)
        }
        if case .refuse(let error) = OpenPolicy.state(.unusable(damaged, previous: nil), owns: Self.owns, overwrite: false) {
            #expect(error.remedy == .overwrite(.startOver))
        }
    }

    static func partial(
        _ stateURL: String = url, overwrite: Bool = false, adopted: Bool = false, destination: Bool = false,
        part: Bool = true
    ) -> Choice {
        Choice(OpenPolicy.partial(
            stateURL: stateURL, owns: Self.owns, overwrite: overwrite,
            adoption: adopted ? AdoptionRecord(origin: .prefix, kept: true) : nil, destinationExists: destination,
            partExists: part, paths: Self.paths))
    }

    /// A ``OpenPolicy/PartialChoice`` that tests compare (a refusal by its error's code and message).
    enum Choice: Equatable {
        case resume, discard
        case refuse(DownloadError.Code, String)

        init(_ choice: OpenPolicy.PartialChoice) {
            switch choice {
            case .resume: self = .resume
            case .discard: self = .discard
            case .refuse(let error): self = .refuse(error.code, error.message)
            }
        }
    }

    /// This download's partial is resumed; another download's is refused (deleted with overwrite); a file that
    /// appeared at the destination refuses the resume unless the finished download may replace it (overwrite, or
    /// an adoption), with the message saying whether the part file is there.
    @Test func whetherThePartialIsResumed() {
        #expect(Self.partial() == .resume)
        #expect(Self.partial("http://old.test/f.bin") == .resume, "a former URL of the download")
        #expect(
            Self.partial("http://other.test/x")
                == .refuse(.unusableState, "/d/f.bin.part belongs to a download of http://other.test/x"))
        #expect(Self.partial("http://other.test/x", overwrite: true) == .discard)
        #expect(Self.partial("http://other.test/x", overwrite: true, destination: true) == .discard)

        #expect(
            Self.partial(destination: true)
                == .refuse(.destinationExists, "/d/f.bin already exists (the partial download beside it is kept)"))
        #expect(
            Self.partial(destination: true, part: false)
                == .refuse(
                    .destinationExists,
                    "/d/f.bin already exists, and taking it over as a partial download was cut short; ask to adopt "
                        + "it again to continue it"))
        #expect(Self.partial(overwrite: true, destination: true) == .resume)
        #expect(Self.partial(adopted: true, destination: true) == .resume)
        #expect(OpenPolicy.replacesDestination(overwrite: false, adoption: nil) == false)
    }
}
