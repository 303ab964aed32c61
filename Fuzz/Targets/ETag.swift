// Fuzz target: the validators a response carries (ETag, Last-Modified + Date → If-Range) and header lines:
// `Downloader.parseHeaderLine`, `Validators(from:)`, `echoable`, `change(from:to:)`, `evaluate`,
// `requestHeaders`, `Validators.strongETag` / `strongLastModified` / `ifRange`, and a conditional (`-N`) request.
//
// Input: byte 0 picks the status, byte 1 the request plan; the rest is a response head, one "Name: value" line
// per LF, taken as a hostile server would send it (CR and other control characters kept).

@testable import Stitch
@testable import StitchCore
@testable import StitchTransport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzETag(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    guard input.bytes.count >= 2 else { return 0 }
    let statuses = [200, 206, 416, 304, 302, 408, 429, 503, 404, 100]
    let status = statuses[Int(input.bytes[0]) % statuses.count]
    let lines = input.bytes[2...].split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
        .map { String(decoding: $0, as: UTF8.self) }

    var headers = HTTPHeaders()
    for line in lines {
        // As the transport hands them over: split at the first colon, nothing checked.
        if let colon = line.firstIndex(of: ":") {
            headers.add(name: String(line[..<colon]), value: String(line[line.index(after: colon)...]).trimming(" "))
        }
        // As a user's -H / header= line: a header that cannot smuggle another line.
        if let (name, value) = Downloader.parseHeaderLine(line) {
            check(!name.isEmpty && !name.utf8.contains(where: { $0 <= 0x20 || $0 >= 0x7F || $0 == UInt8(ascii: ":") }),
                "bad header name \(name.debugDescription)")
            check(!hasControlCharacter(value, allowingTab: true), "control character in value \(value.debugDescription)")
            check(value == value.trimming(" \t"), "untrimmed value \(value.debugDescription)")
            check(Downloader.parseHeaderLine("\(name): \(value)").map { $0 == (name, value) } ?? false,
                "header \(name): \(value) does not parse back")
        }
    }

    let head = ResponseHead(status: status, headers: headers)
    let fresh = Validators(from: head)
    checkValidators(fresh)
    check(ResumePolicy.change(from: fresh, to: fresh) == nil, "validators differ from themselves")

    let offset = Int64(input.bytes[1] % 4) * 1000
    // A conditional request (`-N`) for a file at the destination that is what this response says, or one byte
    // longer: a 304 or a 200 naming the same file is "not modified", a different length never.
    var conditional = ResumePolicy.plan(offset: 0, known: nil)
    let sameLength = input.bytes[1] & 0x80 == 0
    conditional.condition = FreshnessCondition(
        etag: fresh.strongETag, modifiedSince: fresh.lastModified ?? "Thu, 01 Jan 1970 00:00:00 GMT",
        serverDate: fresh.lastModified != nil, length: (fresh.totalLength ?? 0) + (sameLength ? 0 : 1))
    let plans = [
        ResumePolicy.plan(offset: offset, known: fresh),
        ResumePolicy.plan(offset: offset, known: nil),
        ResumePolicy.plan(offset: offset, known: Validators.none),
        conditional,
    ]
    for plan in plans {
        if let ifRange = plan.ifRange { check(!hasControlCharacter(ifRange), "If-Range \(ifRange.debugDescription)") }
        let sent = ResumePolicy.requestHeaders(user: headers, plan: plan)
        check(sent.filter { $0.name.lowercased() == "accept-encoding" }.count == 1, "Accept-Encoding not sent once")
        check(sent.filter { $0.name.lowercased() == "range" }.count == (plan.isRanged ? 1 : 0), "Range sent wrongly")
        check(sent.filter { $0.name.lowercased() == "if-range" }.count == (plan.ifRange == nil ? 0 : 1), "If-Range")

        for known in [nil, fresh, Validators.none] {
            switch ResumePolicy.evaluate(head, plan: plan, known: known) {
            case .accept(let bodyStart, let validators):
                check(status == 200 || status == 206, "accepted a \(status)")
                check(bodyStart == (status == 206 ? plan.rangeStart : 0), "body placed at \(bodyStart)")
                checkValidators(validators)
                if let known, status == 206 {
                    check(ResumePolicy.change(from: known, to: validators) == nil, "accepted a changed file")
                }
            case .restartWithBody(_, let validators):
                check(status == 200 && plan.isRanged, "restart with body for \(status)")
                checkValidators(validators)
            case .complete:
                check(status == 416, "complete on \(status)")
            case .notModified(let why):
                check(plan.condition != nil && !plan.isRanged, "not modified without a condition")
                check(status == 304 || (status == 200 && sameLength), "not modified on \(status): \(why)")
            case .redirect(let location):
                check(!location.isEmpty, "empty redirect")
            case .retry(let retryStatus, _):
                check(retryStatus == status, "retry status")
            case .restart, .malformed, .refused, .fail:
                break
            }
        }
    }
    return 0
}

func checkValidators(_ validators: Validators) {
    for value in [validators.etag, validators.lastModified, validators.ifRange, validators.strongETag] {
        if let value { check(!value.isEmpty && !hasControlCharacter(value), "validator \(value.debugDescription)") }
    }
    if let strong = validators.strongETag {
        check(strong.hasPrefix("\"") && !strong.hasPrefix("W/"), "weak ETag called strong: \(strong)")
    }
    if let total = validators.totalLength { check(total >= 0 && total < 1_000_000_000_000_000_000, "total \(total)") }
    _ = validators.strongLastModified
}
