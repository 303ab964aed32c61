// Fuzz target: the Content-Range parser (`ContentRange(parsing:)`, `ContentRange.number`) and the 206/416 decisions
// of `ResumePolicy.evaluate` that rely on it.
//
// Input: the header value (first line); the text after the first LF, if any, is used as a Content-Length.

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzContentRange(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let (header, rest) = input.firstLineAndRest
    let limit: Int64 = 1_000_000_000_000_000_000  // 10^18: the parser's bound, so offsets can be summed

    // number: digits only, below 10^18, and the value of those digits.
    if let n = ContentRange.number(Substring(header)) {
        check(n >= 0 && n < limit, "number out of range: \(n)")
        check(header.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }, "number accepted a non-digit: \(header.debugDescription)")
        check(Int64(header) == n, "number misread \(header.debugDescription) as \(n)")
    }

    guard let range = ContentRange(parsing: header) else {
        // Unparseable: a 206 carrying it is never accepted.
        let head = ResponseHead(status: 206, headers: HTTPHeaders([("Content-Range", header)]))
        let plan = RequestPlan(rangeStart: 0, resumeOffset: 0, ifRange: nil)
        if case .accept = ResumePolicy.evaluate(head, plan: plan, known: nil) {
            check(false, "206 accepted with unparseable Content-Range \(header.debugDescription)")
        }
        return 0
    }
    if let complete = range.completeLength { check(complete >= 0 && complete < limit, "bad complete length") }
    switch (range.first, range.last) {
    case (let first?, let last?):
        check(first >= 0 && first <= last && last < limit, "bad range \(first)-\(last)")
    case (nil, nil):
        check(range.completeLength != nil, "bytes */* accepted")
    default:
        check(false, "half a range")
    }

    // A 206 answering a request from `first`: accepted only for a self-consistent range, and the body starts there.
    var fields = [("Content-Range", header)]
    if !rest.isEmpty { fields.append(("Content-Length", rest)) }
    let head = ResponseHead(status: 206, headers: HTTPHeaders(fields))
    let start = range.first ?? 0
    let plan = RequestPlan(rangeStart: start, resumeOffset: start, ifRange: nil)
    switch ResumePolicy.evaluate(head, plan: plan, known: nil) {
    case .accept(let bodyStart, let validators):
        check(bodyStart == start, "body placed at \(bodyStart), asked for \(start)")
        guard let first = range.first, let last = range.last, let complete = range.completeLength else {
            check(false, "accepted a 206 without a byte range: \(header.debugDescription)")
            return 0
        }
        check(first <= last && last < complete, "accepted an impossible range \(header.debugDescription)")
        check(validators.totalLength == complete, "total \(String(describing: validators.totalLength)) ≠ \(complete)")
        if let length = Int64(rest) { check(length == last - first + 1, "accepted a mismatched Content-Length") }
    case .restart, .malformed:
        break
    case let other:
        check(false, "unexpected verdict for a 206: \(other)")
    }

    // A 416: complete only when the local data is exactly the whole file.
    let refused = ResponseHead(status: 416, headers: HTTPHeaders([("Content-Range", header)]))
    let total = range.completeLength ?? 0
    let known = Validators(etag: nil, lastModified: nil, date: nil, totalLength: total, acceptRanges: true)
    let resumed = RequestPlan(rangeStart: total, resumeOffset: total, ifRange: nil)
    if case .complete = ResumePolicy.evaluate(refused, plan: resumed, known: known) {
        check(range.completeLength == total, "416 called complete without a matching length")
    }
    return 0
}
