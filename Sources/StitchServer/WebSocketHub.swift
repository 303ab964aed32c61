import CMicroHTTPD
import CWslay
import Foundation
import Stitch
import StitchRPC
import Synchronization
import StitchLocks

/// The WebSocket clients of `/jsonrpc`: libwslay frames the messages (the pairing aria2 itself uses), one thread
/// polls every client's socket, and each client's calls run in order in a task of its own. Calls and notifications
/// reach a client through its outgoing queue, which the polling thread writes out as the socket takes it.
///
/// Bounded: at most `maxClients` clients, messages up to `maxMessage` bytes (a longer frame closes the client with
/// 1009), and a client that lets more than `maxQueued` bytes wait unread (a slow or stuck reader) is closed rather
/// than letting its queue grow.
final class WebSocketHub: Sendable {
    let rpc: Aria2RPC
    let throttle: AuthThrottle
    let maxClients: Int
    let maxMessage: Int
    let maxQueued: Int
    let log: @Sendable (String) -> Void
    /// Unanswered calls of one client before the hub stops reading from it.
    static let maxPendingCalls = 256

    /// A client: its socket and wslay context belong to the polling thread; `state` is shared with the tasks.
    final class Client: @unchecked Sendable {
        let socket: Int32
        let handle: OpaquePointer?
        let peer: String
        /// Calls received and not yet answered: above ``WebSocketHub/maxPendingCalls`` the hub stops reading.
        let pendingCalls = Atomic<Int>(0)
        /// Bytes MHD read past the upgrade request: the first of the stream.
        var extra: [UInt8]
        var context: OpaquePointer?
        struct Shared {
            var outgoing: [[UInt8]] = []
            var queuedBytes = 0
            var closing = false
        }
        let shared = Locked<Shared>(Shared())
        let calls: AsyncStream<[UInt8]>.Continuation
        let worker: Task<Void, Never>

        init(socket: Int32, handle: OpaquePointer?, peer: String, key: String, extra: [UInt8], hub: WebSocketHub) {
            self.socket = socket
            self.handle = handle
            self.peer = peer
            self.extra = extra
            let (stream, continuation) = AsyncStream<[UInt8]>.makeStream()
            self.calls = continuation
            // Filled in below: the worker needs `self` to answer.
            let box = WeakClient()
            self.worker = Task { [rpc = hub.rpc, throttle = hub.throttle] in
                calls: for await message in stream {
                    // A client that went away gets nothing more done: calls it queued are dropped.
                    guard !Task.isCancelled, let client = box.client else { break calls }
                    defer { client.pendingCalls.subtract(1, ordering: .relaxed) }
                    guard let wait = throttle.admit(key) else {
                        // With the call's id, so a client waiting for its answer gets one.
                        let id: JSON
                        switch rpc.decode(message) {
                        case .success(.object(let members)):
                            // A notification (no id) gets no answer, refused or not.
                            guard let given = members.first(where: { $0.0 == "id" })?.1 else { continue }
                            id = given
                        default:
                            id = .null
                        }
                        let refusal = JSON.object([
                            ("id", id), ("jsonrpc", .string("2.0")),
                            ("error", .object([("code", .integer(1)), ("message", .string("too many wrong secrets"))])),
                        ])
                        hub.send(refusal.serialized, to: client)
                        continue
                    }
                    let reply: Aria2RPC.Reply
                    switch rpc.decode(message) {
                    case .failure(let error):
                        reply = error
                    case .success(let request):
                        if wait == .zero, let immediate = rpc.handleImmediately(request, channel: .full) {
                            reply = immediate
                        } else {
                            if wait > .zero { try? await Task.sleep(for: wait) }
                            guard !Task.isCancelled else { break calls }
                            reply = await rpc.handle(request, channel: .full)
                        }
                    }
                    throttle.record(key, reply)
                    if reply.unauthorized > 0 { hub.log("\(reply.unauthorized) wrong secret(s) from \(peer) (WebSocket)") }
                    if reply.missingSecret > 0, let kept = throttle.logsMissingSecret(key) {
                        hub.log("\(reply.missingSecret) call(s) without the secret from \(peer) (WebSocket)"
                            + (kept > 0 ? " (and \(kept) such request(s) since the last such line)" : ""))
                    }
                    if let body = reply.body { hub.send(body, to: client) }
                }
            }
            box.client = self
        }
    }

    final class WeakClient: @unchecked Sendable {
        weak var client: Client?
    }

    private struct State {
        var reserved = 0
        var clients: [ObjectIdentifier: Client] = [:]
        var adopted: [Client] = []
        var stopping = false
    }

    private let state = Locked<State>(State())
    private let wake: Int32
    private let finished = DispatchSemaphore(value: 0)

    init(
        rpc: Aria2RPC, throttle: AuthThrottle, maxClients: Int, maxMessage: Int, maxQueued: Int = 32 << 20,
        log: @escaping @Sendable (String) -> Void
    ) {
        self.rpc = rpc
        self.throttle = throttle
        self.maxClients = maxClients
        self.maxMessage = maxMessage
        self.maxQueued = maxQueued
        self.log = log
        self.wake = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        let thread = Thread { [self] in run() }
        thread.name = "stitch-websocket"
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// `Sec-WebSocket-Accept` for a client's key (RFC 6455 §4.2.2).
    static func accept(key: String) -> String {
        let hasher = DigestHasher(.sha1)
        hasher.update(Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))
        return Data(hasher.finalize()).base64EncodedString()
    }

    /// Holds a place for a client about to upgrade; false when the hub is full or stopping.
    func reserve() -> Bool {
        state.withLock { state in
            guard !state.stopping, state.reserved < maxClients else { return false }
            state.reserved += 1
            return true
        }
    }

    /// Gives back a place that `reserve` held and no client took.
    func release() { state.withLock { $0.reserved -= 1 } }

    /// Takes over an upgraded connection.
    func adopt(socket: Int32, handle: OpaquePointer?, extra: [UInt8], peer: String, key: String) {
        let flags = fcntl(socket, F_GETFL)
        _ = fcntl(socket, F_SETFL, flags | O_NONBLOCK)
        let client = Client(socket: socket, handle: handle, peer: peer, key: key, extra: extra, hub: self)
        let refused = state.withLock { state -> Bool in
            if state.stopping { return true }
            state.adopted.append(client)
            return false
        }
        if refused {
            client.calls.finish()
            _ = stitch_mhd_upgrade_close(handle)
            return
        }
        signal()
    }

    /// Queues `message` for every client.
    func broadcast(_ message: [UInt8]) {
        let clients = state.withLock { Array($0.clients.values) }
        for client in clients { enqueue(message, to: client) }
        signal()
    }

    func send(_ message: [UInt8], to client: Client) {
        enqueue(message, to: client)
        signal()
    }

    private func enqueue(_ message: [UInt8], to client: Client) {
        client.shared.withLock { shared in
            guard !shared.closing else { return }
            if shared.queuedBytes + message.count > maxQueued {
                shared.closing = true  // a reader this slow is dropped; it reconnects and asks again
                return
            }
            shared.outgoing.append(message)
            shared.queuedBytes += message.count
        }
    }

    /// Closes every client and ends the polling thread.
    func stop() {
        let first = state.withLock { state -> Bool in
            defer { state.stopping = true }
            return !state.stopping
        }
        guard first else { return }
        signal()
        finished.wait()
    }

    deinit { close(wake) }  // not in stop(): tasks still finishing may signal

    private func signal() {
        var one: UInt64 = 1
        _ = write(wake, &one, 8)
    }

    // MARK: The polling thread

    /// How long stopping waits for the calls under way to be answered.
    static let stopGrace: Duration = .seconds(5)

    private func run() {
        var clients: [Client] = []
        var descriptors: [pollfd] = []
        var stopDeadline: ContinuousClock.Instant?
        while true {
            let (adopted, stopping) = state.withLock { state -> ([Client], Bool) in
                defer { state.adopted = [] }
                for client in state.adopted { state.clients[ObjectIdentifier(client)] = client }
                return (state.adopted, state.stopping)
            }
            for client in adopted where start(client) {
                clients.append(client)
                // Frames that came with the upgrade request are already here: read them now, not on the next
                // bytes from the socket.
                if !client.extra.isEmpty, wslay_event_recv(client.context) != 0 {
                    finish(client, code: nil)
                    clients.removeLast()
                }
            }
            // Stopping: no call is read any more; the calls under way are answered (an `aria2.shutdown` made over
            // this socket gets its "OK") and their answers sent, for at most `stopGrace`; then every client is
            // closed (1001: going away).
            if stopping, stopDeadline == nil { stopDeadline = .now + Self.stopGrace }
            // Move what the tasks queued into each client's wslay context; close those marked.
            clients.removeAll { client in
                let (messages, closing) = client.shared.withLock { shared -> ([[UInt8]], Bool) in
                    defer {
                        shared.outgoing = []
                        shared.queuedBytes = 0
                    }
                    return (shared.outgoing, shared.closing)
                }
                if closing {
                    finish(client, code: 1008)
                    return true
                }
                for message in messages {
                    let queued = message.withUnsafeBufferPointer { buffer -> Int32 in
                        var frame = wslay_event_msg(opcode: UInt8(WSLAY_TEXT_FRAME.rawValue), msg: buffer.baseAddress,
                            msg_length: buffer.count)
                        return wslay_event_queue_msg(client.context, &frame)
                    }
                    if queued != 0 { break }
                }
                guard wslay_event_want_read(client.context) != 0 || wslay_event_want_write(client.context) != 0 else {
                    finish(client, code: nil)
                    return true
                }
                // What waits in wslay's queue counts too: a client that does not read is closed, not buffered.
                if wslay_event_get_queued_msg_length(client.context) > maxQueued {
                    finish(client, code: 1008)
                    return true
                }
                return false
            }
            if let deadline = stopDeadline {
                let busy = clients.contains { client in
                    client.pendingCalls.load(ordering: .relaxed) > 0 || wslay_event_want_write(client.context) != 0
                        || client.shared.withLock { !$0.outgoing.isEmpty }
                }
                if !busy || ContinuousClock.now >= deadline {
                    for client in clients { finish(client, code: 1001) }
                    finished.signal()
                    return
                }
            }
            descriptors.removeAll(keepingCapacity: true)
            descriptors.append(pollfd(fd: wake, events: Int16(POLLIN), revents: 0))
            for client in clients {
                var events: Int16 = 0
                // Reading waits while the client has many calls unanswered (its own back-pressure), and for good
                // once the hub stops.
                if stopDeadline == nil, wslay_event_want_read(client.context) != 0,
                    client.pendingCalls.load(ordering: .relaxed) < Self.maxPendingCalls
                {
                    events |= Int16(POLLIN)
                }
                if wslay_event_want_write(client.context) != 0 { events |= Int16(POLLOUT) }
                descriptors.append(pollfd(fd: client.socket, events: events, revents: 0))
            }
            // While stopping, a call's answer arrives through the wake descriptor; the deadline needs a timeout.
            let ready = poll(&descriptors, nfds_t(descriptors.count), stopDeadline == nil ? -1 : 20)
            if ready < 0 { continue }  // EINTR
            if descriptors[0].revents != 0 {
                var count: UInt64 = 0
                _ = read(wake, &count, 8)
            }
            var gone: Set<ObjectIdentifier> = []
            for (index, client) in clients.enumerated() {
                let events = descriptors[index + 1].revents
                if events == 0 { continue }
                var failed = false
                if events & Int16(POLLIN | POLLERR | POLLHUP) != 0 { failed = wslay_event_recv(client.context) != 0 }
                if !failed, wslay_event_want_write(client.context) != 0 {
                    failed = wslay_event_send(client.context) != 0
                }
                if failed {
                    finish(client, code: nil)
                    gone.insert(ObjectIdentifier(client))
                }
            }
            if !gone.isEmpty { clients.removeAll { gone.contains(ObjectIdentifier($0)) } }
        }
    }

    /// Makes the client's wslay context; false (and the client closed) when it cannot.
    private func start(_ client: Client) -> Bool {
        var callbacks = wslay_event_callbacks(
            recv_callback: receiveCallback, send_callback: sendCallback, genmask_callback: nil,
            on_frame_recv_start_callback: nil, on_frame_recv_chunk_callback: nil, on_frame_recv_end_callback: nil,
            on_msg_recv_callback: messageCallback)
        var context: OpaquePointer?
        let user = Unmanaged.passUnretained(client).toOpaque()
        guard wslay_event_context_server_init(&context, &callbacks, user) == 0, let context else {
            finish(client, code: nil)
            return false
        }
        wslay_event_config_set_max_recv_msg_length(context, UInt64(maxMessage))
        client.context = context
        return true
    }

    /// Closes a client (with a close frame carrying `code` when given, sent if the socket takes it at once).
    private func finish(_ client: Client, code: UInt16?) {
        if let context = client.context {
            if let code {
                _ = wslay_event_queue_close(context, code, nil, 0)
                _ = wslay_event_send(context)
            }
            wslay_event_context_free(context)
            client.context = nil
        }
        client.calls.finish()
        client.worker.cancel()
        _ = stitch_mhd_upgrade_close(client.handle)
        state.withLock { state in
            if state.clients.removeValue(forKey: ObjectIdentifier(client)) != nil { state.reserved -= 1 }
        }
    }

}

private let receiveCallback: wslay_event_recv_callback = { context, buffer, length, _, user in
    guard let user, let buffer else { return -1 }
    let client = Unmanaged<WebSocketHub.Client>.fromOpaque(user).takeUnretainedValue()
    if !client.extra.isEmpty {
        let count = min(length, client.extra.count)
        client.extra.withUnsafeBufferPointer { buffer.update(from: $0.baseAddress!, count: count) }
        client.extra.removeFirst(count)
        return count
    }
    let got = recv(client.socket, buffer, length, 0)
    if got > 0 { return got }
    if got < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR {
        wslay_event_set_error(context, Int32(WSLAY_ERR_WOULDBLOCK.rawValue))
    } else {
        wslay_event_set_error(context, Int32(WSLAY_ERR_CALLBACK_FAILURE.rawValue))
    }
    return -1
}

private let sendCallback: wslay_event_send_callback = { context, data, length, _, user in
    guard let user, let data else { return -1 }
    let client = Unmanaged<WebSocketHub.Client>.fromOpaque(user).takeUnretainedValue()
    let sent = send(client.socket, data, length, Int32(MSG_NOSIGNAL))
    if sent >= 0 { return sent }
    if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR {
        wslay_event_set_error(context, Int32(WSLAY_ERR_WOULDBLOCK.rawValue))
    } else {
        wslay_event_set_error(context, Int32(WSLAY_ERR_CALLBACK_FAILURE.rawValue))
    }
    return -1
}

private let messageCallback: wslay_event_on_msg_recv_callback = { _, argument, user in
    guard let user, let argument else { return }
    let client = Unmanaged<WebSocketHub.Client>.fromOpaque(user).takeUnretainedValue()
    let opcode = argument.pointee.opcode
    guard opcode == UInt8(WSLAY_TEXT_FRAME.rawValue) || opcode == UInt8(WSLAY_BINARY_FRAME.rawValue) else { return }
    client.pendingCalls.add(1, ordering: .relaxed)
    client.calls.yield(Array(UnsafeBufferPointer(start: argument.pointee.msg, count: argument.pointee.msg_length)))
}
