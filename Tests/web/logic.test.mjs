// Unit tests for the web page's logic (Sources/StitchServer/Web/logic.mjs), run with Node's test runner:
//   node --test Tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import * as L from "../../Sources/StitchServer/Web/logic.mjs";

test("formatBytes uses IEC units as the command line does", () => {
  assert.equal(L.formatBytes(0), "0 B");
  assert.equal(L.formatBytes(1023), "1023 B");
  assert.equal(L.formatBytes(1024), "1.0 KiB");
  assert.equal(L.formatBytes(1536), "1.5 KiB");
  assert.equal(L.formatBytes(16 * 1024 * 1024), "16.0 MiB");
  assert.equal(L.formatBytes("41943040"), "40.0 MiB", "numbers arrive as strings");
  assert.equal(L.formatBytes(1024 * 1024 - 1), "1.0 MiB", "never 1024.0 KiB");
  assert.equal(L.formatBytes(5 * 2 ** 40), "5.0 TiB");
  assert.equal(L.formatBytes(-1), "?");
  assert.equal(L.formatBytes("junk"), "?");
  assert.equal(L.formatSpeed(2 * 1024 * 1024), "2.0 MiB/s");
});

test("formatETA says nothing without a speed, and rounds up", () => {
  assert.equal(L.formatETA(100, 0), "");
  assert.equal(L.formatETA(100, "0"), "");
  assert.equal(L.formatETA(-5, 10), "");
  assert.equal(L.formatETA(100, 10), "10 s");
  assert.equal(L.formatETA(101, 10), "11 s");
  assert.equal(L.formatETA(125, 1), "2 min 5 s");
  assert.equal(L.formatETA(3 * 3600 + 120, 1), "3 h 2 min");
  assert.equal(L.formatETA(2 * 86400 + 3600, 1), "2 d 1 h");
  assert.equal(L.formatETA(1e12, 1), "more than 100 days");
});

test("baseName takes the last part of a path or URL and decodes it", () => {
  assert.equal(L.baseName("/data/downloads/file.iso"), "file.iso");
  assert.equal(L.baseName("https://host/a/b/My%20File.bin?x=1#f"), "My File.bin");
  assert.equal(L.baseName("https://host/dir/"), "dir");
  assert.equal(L.baseName("https://host/bad%E0%A4%A"), "bad%E0%A4%A", "undecodable stays as it is");
  assert.equal(L.baseName(""), "");
});

function status(fields) {
  return {
    gid: "0123456789abcdef", status: "active", totalLength: "0", completedLength: "0", downloadSpeed: "0",
    files: [{ path: "", uris: [{ uri: "http://h/f.bin" }] }], ...fields,
  };
}

test("describe shows progress, speed and time left for an active download", () => {
  const view = L.describe(status({
    totalLength: String(40 << 20), completedLength: String(10 << 20), downloadSpeed: String(1 << 20),
    files: [{ path: "/d/f.bin", uris: [{ uri: "http://h/other.bin" }] }],
  }));
  assert.equal(view.name, "f.bin", "the file's name before the URL's");
  assert.equal(view.label, "Downloading");
  assert.equal(view.percent, 25);
  assert.equal(view.line, "10.0 MiB of 40.0 MiB · 1.0 MiB/s · 30 s left");
  assert.deepEqual(view.actions, ["pause", "remove"]);
  assert.equal(view.error, "");
});

test("describe: unknown size, done, failed, paused", () => {
  const unknown = L.describe(status({ completedLength: "2048" }));
  assert.equal(unknown.line, "2.0 KiB · 0 B/s");
  assert.equal(unknown.percent, 0);
  assert.equal(unknown.name, "f.bin", "the URL's name before a path is known");
  const done = L.describe(status({ status: "complete", totalLength: "100", completedLength: "100" }));
  assert.equal(done.percent, 100);
  assert.equal(done.line, "100 B");
  const emptyDone = L.describe(status({ status: "complete" }));
  assert.equal(emptyDone.percent, 100, "an empty file that is done is full");
  const failed = L.describe(status({ status: "error", errorMessage: "HTTP 404", "stitch.lastProblem": "gone: 404" }));
  assert.equal(failed.error, "gone: 404", "the plain-words problem first");
  assert.deepEqual(failed.actions, ["retry", "remove"]);
  assert.equal(L.describe(status({ status: "error", errorMessage: "HTTP 404" })).error, "HTTP 404");
  assert.deepEqual(L.describe(status({ status: "paused" })).actions, ["resume", "up", "down", "remove"]);
  assert.deepEqual(L.describe(status({ status: "removed" })).actions, ["remove"], "stitch.retry refuses removed ones");
  assert.deepEqual(L.describe(status({ status: "complete" })).actions, ["remove"]);
  const nameless = L.describe(status({ files: [] }));
  assert.equal(nameless.name, "0123456789abcdef", "the gid when nothing else names it");
  const over = L.describe(status({ totalLength: "100", completedLength: "150" }));
  assert.equal(over.percent, 100, "never beyond 100%");
});

test("callFor maps actions to aria2's methods; removing a stopped download forgets its result", () => {
  assert.deepEqual(L.callFor("pause", "g", "active"), ["aria2.pause", ["g"]]);
  assert.deepEqual(L.callFor("resume", "g", "paused"), ["aria2.unpause", ["g"]]);
  assert.deepEqual(L.callFor("retry", "g", "error"), ["stitch.retry", ["g"]]);
  assert.deepEqual(L.callFor("up", "g", "waiting"), ["aria2.changePosition", ["g", -1, "POS_CUR"]]);
  assert.deepEqual(L.callFor("down", "g", "waiting"), ["aria2.changePosition", ["g", 1, "POS_CUR"]]);
  assert.deepEqual(L.callFor("remove", "g", "active"), ["aria2.remove", ["g"]]);
  assert.deepEqual(L.callFor("remove", "g", "complete"), ["aria2.removeDownloadResult", ["g"]]);
  assert.deepEqual(L.callFor("remove", "g", "error"), ["aria2.removeDownloadResult", ["g"]]);
  assert.throws(() => L.callFor("explode", "g", "active"));
});

test("a selection acts only on the downloads the action applies to", () => {
  const rows = [
    { gid: "a", state: "active" }, { gid: "b", state: "paused" }, { gid: "c", state: "error" },
    { gid: "d", state: "complete" }, { gid: "e", state: "removed" },
  ];
  assert.deepEqual(L.callsForSelection("pause", rows), [["aria2.pause", ["a"]]]);
  assert.deepEqual(L.callsForSelection("resume", rows), [["aria2.unpause", ["b"]]]);
  assert.deepEqual(L.callsForSelection("retry", rows), [["stitch.retry", ["c"]]]);
  assert.deepEqual(L.callsForSelection("remove", rows).map((c) => c[0]), [
    "aria2.remove", "aria2.remove", "aria2.removeDownloadResult", "aria2.removeDownloadResult",
    "aria2.removeDownloadResult",
  ]);
  const selection = new Set(["a", "x", "c"]);
  L.pruneSelection(selection, ["a", "b", "c"]);
  assert.deepEqual([...selection], ["a", "c"]);
});

test("the secret goes first in every call, also inside a multicall", () => {
  assert.deepEqual(L.withToken(["g"], ""), ["g"]);
  assert.deepEqual(L.withToken(["g"], "s3"), ["token:s3", "g"]);
  assert.deepEqual(L.multicall([["aria2.tellActive", []], ["aria2.pause", ["g"]]], "s3"), [[
    { methodName: "aria2.tellActive", params: ["token:s3"] },
    { methodName: "aria2.pause", params: ["token:s3", "g"] },
  ]]);
});

test("addCalls checks the form and makes one addUri per URL", () => {
  assert.deepEqual(L.addCalls({ urls: "" }), { error: "Enter at least one URL." });
  assert.match(L.addCalls({ urls: "not a url" }).error, /Not an http/);
  assert.match(L.addCalls({ urls: "file:///etc/passwd" }).error, /Not an http/);
  const two = L.addCalls({ urls: "http://h/a.bin\n\n# note\n  https://h/b.bin  \r\n" });
  assert.deepEqual(two.calls, [["aria2.addUri", [["http://h/a.bin"], {}]], ["aria2.addUri", [["https://h/b.bin"], {}]]]);
  assert.match(L.addCalls({ urls: "http://h/a\nhttp://h/b", out: "x.bin" }).error, /one URL/);
  assert.match(L.addCalls({ urls: "http://h/a", out: "../x" }).error, /cannot contain/);
  assert.match(L.addCalls({ urls: "http://h/a", split: "0" }).error, /1 to 16/);
  assert.match(L.addCalls({ urls: "http://h/a", split: "2.5" }).error, /1 to 16/);
  assert.match(L.addCalls({ urls: "http://h/a", checksum: "sha-256" }).error, /ALGORITHM=HEX/);
  const full = L.addCalls({
    urls: "http://h/a", out: "x.bin", split: "4", checksum: "sha-256=abc123", headers: "X-A: 1\n\nAuthorization:  Bearer t",
  });
  assert.deepEqual(full.calls, [["aria2.addUri", [["http://h/a"], {
    out: "x.bin", split: "4", checksum: "sha-256=abc123", header: ["X-A: 1", "Authorization: Bearer t"],
  }]]]);
  const shared = L.addCalls({ urls: "http://h/a\nhttp://h/b", split: "2" }).calls;
  assert.notEqual(shared[0][1][1], shared[1][1][1], "each call has its own options object");
});

test("parseHeaders refuses what is not a header", () => {
  assert.deepEqual(L.parseHeaders(""), { list: [] });
  assert.match(L.parseHeaders("no colon").error, /Not a header/);
  assert.match(L.parseHeaders(": empty name").error, /Not a header/);
  assert.match(L.parseHeaders("Bad Name: x").error, /Not a header/);
  assert.deepEqual(L.parseHeaders("Cookie: a=b; c=d").list, ["Cookie: a=b; c=d"]);
});

test("pageWindow pages oldest-first and newest-first lists", () => {
  assert.deepEqual(L.pageWindow(1000, 50, 0, true), { page: 0, pages: 20, offset: -1, count: 50, label: "1–50 of 1000" });
  assert.deepEqual(L.pageWindow(1000, 50, 1, true).offset, -51);
  assert.deepEqual(L.pageWindow(1000, 50, 19, false), { page: 19, pages: 20, offset: 950, count: 50, label: "951–1000 of 1000" });
  assert.equal(L.pageWindow(1000, 50, 25, false).page, 19, "clamped to the last page");
  assert.equal(L.pageWindow(1000, 50, -3, false).page, 0);
  assert.equal(L.pageWindow(0, 50, 4, true).label, "none");
  assert.equal(L.pageWindow(0, 50, 4, true).pages, 1);
  assert.equal(L.pageWindow(51, 50, 1, false).label, "51–51 of 51");
});

test("Backoff doubles to a 5 s cap and starts over after reset", () => {
  const backoff = new L.Backoff();
  const delays = Array.from({ length: 8 }, () => backoff.next());
  assert.deepEqual(delays, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
  backoff.reset();
  assert.equal(backoff.next(), 250);
});

test("Throttle allows one run a second", () => {
  const throttle = new L.Throttle(1000);
  assert.equal(throttle.due(0), 0);
  throttle.ran(100);
  assert.equal(throttle.due(100), 1000);
  assert.equal(throttle.due(600), 500);
  assert.equal(throttle.due(1100), 0);
  assert.equal(throttle.due(5000), 0);
});

test("pieceBar places segments and fills them by written and durable bytes", () => {
  const bar = L.pieceBar([
    { start: "0", end: "50", durable: "10", written: "25" },
    { start: "50", end: "100", durable: "100", written: "100" },
  ], "100");
  assert.deepEqual(bar, [
    { left: 0, width: 50, written: 50, durable: 20, done: false },
    { left: 50, width: 50, written: 100, durable: 100, done: true },
  ]);
  const open = L.pieceBar([{ start: "0", durable: "0", written: "30" }], "60");
  assert.deepEqual(open, [{ left: 0, width: 100, written: 50, durable: 0, done: false }], "no end: to the total");
  assert.deepEqual(L.pieceBar([{ start: 0, end: 10, written: 10, durable: 10 }], 0), [], "unknown size: no bar");
  assert.deepEqual(L.pieceBar(null, 10), []);
  const clamped = L.pieceBar([{ start: 0, end: 10, written: 20, durable: -5 }], 10)[0];
  assert.equal(clamped.written, 100);
  assert.equal(clamped.durable, 0);
});

test("connectionSpeeds: the segments that moved, with their speed", () => {
  const before = { time: 1000, segments: [
    { start: "0", end: "100", written: "10" }, { start: "100", end: "200", written: "150" },
    { start: "200", end: "300", written: "300" },
  ] };
  const after = { time: 3000, segments: [
    { start: "0", end: "100", written: "50" }, { start: "100", end: "200", written: "150" },
    { start: "200", end: "300", written: "300" }, { start: "300", end: "400", written: "310" },
  ] };
  assert.deepEqual(L.connectionSpeeds(before, after), [{ start: 0, end: 100, written: 50, speed: 20 }]);
  assert.deepEqual(L.connectionSpeeds(null, after), []);
  assert.deepEqual(L.connectionSpeeds(after, after), [], "no time passed");
});

test("SpeedHistory keeps the last samples and draws them scaled to the peak", () => {
  const history = new L.SpeedHistory(3);
  for (const v of ["10", "20", "40", "-5"]) history.add(v);
  assert.deepEqual(history.samples, [20, 40, 0]);
  assert.equal(history.peak, 40);
  assert.equal(history.points(100, 10), "0.0,5.0 50.0,0.0 100.0,10.0");
  const young = new L.SpeedHistory(3);
  young.add(5);
  assert.equal(young.points(100, 10), "100.0,0.0", "newest at the right");
  assert.equal(new L.SpeedHistory(3).points(100, 10), "");
});

test("parseRate and rateText", () => {
  assert.deepEqual(L.parseRate(""), { value: "0" });
  assert.deepEqual(L.parseRate(" 10m "), { value: "10M" });
  assert.deepEqual(L.parseRate("1.5K"), { value: "1.5K" });
  assert.match(L.parseRate("fast").error, /bytes per second/);
  assert.match(L.parseRate("-1").error, /bytes per second/);
  assert.equal(L.rateText("0"), "0");
  assert.equal(L.rateText(String(10 << 20)), "10M");
  assert.equal(L.rateText(String(512 << 10)), "512K");
  assert.equal(L.rateText(String(1 << 30)), "1G");
  assert.equal(L.rateText("1000"), "1000");
});

test("failureKind tells the secret's troubles from the network's", () => {
  assert.equal(L.failureKind(new Error("Unauthorized")), "auth");
  assert.equal(L.failureKind(new Error("too many wrong secrets from 127.0.0.1; try again later")), "throttled");
  assert.equal(L.failureKind(new Error("too many wrong secrets")), "throttled", "the WebSocket's refusal");
  assert.equal(L.failureKind(new Error("the connection closed")), "network");
  assert.equal(L.failureKind(new Error("GID not found")), "network");
  assert.equal(L.failureKind(undefined), "network");
  assert.equal(L.failureKind(null), "network");
});

const types = (effects) => effects.map((e) => e.type);

test("Connection: a WebSocket, a handshake, then polling", () => {
  const c = new L.Connection();
  assert.deepEqual(types(c.start(false)), ["openSocket"]);
  assert.equal(c.mayPoll, false);
  assert.deepEqual(types(c.socketOpened()), ["handshake"]);
  assert.deepEqual(types(c.handshaken("s1")), ["poll"]);
  assert.equal(c.phase, "live");
  assert.equal(c.mayPoll, true);
});

/** A live page whose daemon went away at `now`, and every retry since has failed: [connection, delays]. */
function lostFor(tries, now = 1000) {
  const c = new L.Connection();
  c.start(false);
  c.socketOpened();
  c.handshaken("s1");
  const delays = [c.socketClosed(now)[0].delay];
  for (let i = 0; i < tries; i++) {
    assert.deepEqual(types(c.retryDue()), ["openSocket"]);
    assert.deepEqual(types(c.socketFailed(now + i)), ["probeHTTP"], "HTTP might still work");
    const effects = c.httpProbed(false, now + i);
    assert.deepEqual(types(effects), ["retry"]);
    delays.push(effects[0].delay);
  }
  return [c, delays];
}

test("Connection: a daemon that goes away is retried with backoff capped at 5 s; a restart is said", () => {
  const [c, delays] = lostFor(7);
  assert.deepEqual(delays, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
  assert.equal(c.phase, "lost");
  assert.equal(c.mayPoll, false);
  assert.equal(c.lostSince, 1000, "lost since the first failure");
  c.retryDue();
  assert.deepEqual(types(c.socketOpened()), ["handshake"]);
  const back = c.handshaken("s2");
  assert.deepEqual(back[1], { type: "notice", text: "The daemon restarted; the page is live again." });
  assert.equal(c.lostSince, 0);
  c.socketClosed(5000);
  assert.equal(c.nextDelay, 250, "the backoff started over once the WebSocket worked");
  c.retryDue();
  c.socketOpened();
  assert.deepEqual(c.handshaken("s2")[1], { type: "notice", text: "Connected again." }, "same session: no restart");
  assert.deepEqual(types(c.handshaken(undefined)), ["poll"], "an unknown session is no restart");
});

test("Connection: a WebSocket that opens and fails at once every time keeps backing off", () => {
  const c = new L.Connection();
  c.start(false);
  c.socketOpened();
  c.handshaken("s");
  const delays = [];
  for (let i = 0; i < 7; i++) {
    const effects = c.socketClosed(i);
    delays.push(effects[0].delay);
    c.retryDue();
    c.socketOpened(); // then it closes before its handshake answers
  }
  assert.deepEqual(delays, [250, 500, 1000, 2000, 4000, 5000, 5000]);
});

test("Connection: no WebSocket falls back to HTTP, whose WebSocket retries back off", () => {
  const c = new L.Connection();
  c.start(false);
  assert.deepEqual(types(c.socketFailed(0)), ["probeHTTP"]);
  assert.deepEqual(types(c.httpProbed(true, 0)), ["handshake", "retry"]);
  assert.equal(c.transport, "http");
  assert.deepEqual(types(c.handshaken("s1")), ["poll"]);
  assert.equal(c.mayPoll, true);
  const delays = [c.nextDelay];
  for (let i = 0; i < 6; i++) {
    c.retryDue();
    const effects = c.socketFailed(i);
    assert.deepEqual(types(effects), ["retry"], "quietly: no new handshake or probe");
    delays.push(effects[0].delay);
    assert.equal(c.phase, "live", "still live over HTTP");
  }
  assert.deepEqual(delays, [250, 500, 1000, 2000, 4000, 5000, 5000], "the handshake did not reset the backoff");
  c.retryDue();
  assert.deepEqual(types(c.socketOpened()), ["handshake"]);
  assert.equal(c.transport, "websocket");
});

test("Connection: HTTP live, one failed poll, and HTTP is tried again (not only the WebSocket)", () => {
  const c = new L.Connection();
  c.start(false);
  c.socketFailed(0);
  c.httpProbed(true, 0);
  c.handshaken("s");
  assert.deepEqual(types(c.failed("network", 3)), [], "its WebSocket retry is already pending");
  assert.equal(c.phase, "lost");
  assert.equal(c.transport, "none");
  c.retryDue();
  assert.deepEqual(types(c.socketFailed(4)), ["probeHTTP"]);
  assert.deepEqual(types(c.httpProbed(true, 5)), ["handshake", "retry"]);
  assert.deepEqual(types(c.handshaken("s")), ["poll", "notice"]);
  assert.equal(c.phase, "live");
});

test("Connection: a first visit while the daemon is down keeps trying both", () => {
  const c = new L.Connection();
  c.start(false);
  c.socketFailed(0);
  assert.deepEqual(types(c.httpProbed(false, 7)), ["retry"]);
  assert.equal(c.phase, "lost");
  assert.equal(c.lostSince, 7);
  c.retryDue();
  assert.deepEqual(types(c.socketFailed(8)), ["probeHTTP"]);
});

test("Connection: a retry never replaces a WebSocket that is open or on its way", () => {
  const c = new L.Connection();
  c.start(false);
  c.socketFailed(0);
  c.httpProbed(true, 0); // a WebSocket retry is pending
  c.handshaken("s");
  assert.deepEqual(types(c.retryDue()), ["openSocket"]);
  // While it opens, an HTTP poll fails: no second retry is booked.
  assert.deepEqual(c.failed("network", 1), []);
  assert.deepEqual(types(c.socketOpened()), ["handshake"], "nothing to cancel");
  assert.deepEqual(c.retryDue(), [], "a stray timer does not replace the open socket");
  // A secret entered over HTTP while a WebSocket is on its way books nothing more either.
  const h = new L.Connection();
  h.start(false);
  h.socketFailed(0);
  h.httpProbed(true, 0);
  h.failed("auth", 0);
  h.retryDue(); // opening
  assert.deepEqual(types(h.secretEntered()), ["handshake"]);
  assert.deepEqual(types(h.socketOpened()), ["handshake"]);
  // A retry booked, then a socket opens some other way: the retry is cancelled.
  const r = new L.Connection();
  r.start(false);
  r.socketFailed(0);
  r.httpProbed(true, 0);
  r.retryDue();
  r.socketFailed(1); // books a retry
  assert.equal(r.retryPending, true);
  r.socketOpening = true; // (as if opened by the secret dialog)
  assert.deepEqual(types(r.socketOpened()), ["cancelRetry", "handshake"]);
  assert.equal(r.retryPending, false);
});

test("Connection: the answer of a transport given up on does not make the page live", () => {
  const c = new L.Connection();
  c.start(false);
  c.socketOpened();
  c.handshaken("s");
  c.failed("network", 1); // closeSocket
  c.socketClosed(1);
  assert.deepEqual(c.handshaken("s"), [], "a late answer");
  assert.equal(c.phase, "lost");
});

test("Connection: a live WebSocket whose call goes unanswered is closed and retried", () => {
  const ws = new L.Connection();
  ws.start(false);
  ws.socketOpened();
  ws.handshaken("s");
  assert.deepEqual(types(ws.failed("network", 3)), ["closeSocket"]);
  assert.deepEqual(types(ws.socketClosed(4)), ["retry"]);
  assert.equal(ws.phase, "lost");
});

test("Connection: the secret is asked for, and nothing is sent while the page waits for it", () => {
  const c = new L.Connection();
  c.start(false);
  c.socketOpened();
  assert.deepEqual(c.failed("auth", 0), [{ type: "askSecret", rejected: false, throttled: false }],
    "none given yet: not 'rejected'");
  assert.equal(c.mayPoll, false);
  // The daemon restarts while the dialog is open: the page reconnects but sends nothing.
  assert.deepEqual(types(c.socketClosed(1)), ["retry"]);
  assert.equal(c.phase, "secret");
  c.retryDue();
  assert.deepEqual(c.socketOpened(), [], "no handshake with a refused secret");
  assert.deepEqual(types(c.secretEntered()), ["handshake"]);
  assert.deepEqual(c.failed("auth", 2), [{ type: "askSecret", rejected: true, throttled: false }]);
  assert.deepEqual(c.failed("throttled", 3), [{ type: "askSecret", rejected: false, throttled: true }],
    "the address is slowed: not necessarily this secret's fault");
  c.secretEntered();
  assert.deepEqual(types(c.handshaken("s")), ["poll"]);
  assert.equal(c.secretRejected, false);
  assert.equal(c.throttled, false);
});

test("Connection: a secret entered while polling over HTTP brings the WebSocket back too", () => {
  const c = new L.Connection();
  c.start(false);
  c.socketFailed(0);
  c.httpProbed(true, 0);
  c.failed("auth", 0);
  c.retryDue(); // the pending WebSocket try happened and failed meanwhile
  c.socketFailed(1);
  assert.deepEqual(types(c.secretEntered()), ["handshake"], "its retry is pending already");
  // No transport at all (the daemon away) while the dialog waits: the retry already booked brings the socket,
  // which then handshakes with the new secret.
  const away = new L.Connection();
  away.start(true);
  away.socketFailed(0);
  away.httpProbed(false, 0);
  away.failed("auth", 0);
  away.retryDue();
  away.socketFailed(1); // waiting for the secret: no probe, a retry
  assert.equal(away.retryPending, true);
  assert.deepEqual(away.secretEntered(), []);
  assert.deepEqual(types(away.retryDue()), ["openSocket"]);
  assert.deepEqual(types(away.socketOpened()), ["handshake"]);
});
