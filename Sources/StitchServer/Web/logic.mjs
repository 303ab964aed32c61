// The page's logic without the DOM: formatting, the RPC's shapes, paging, backoff, the piece bar and the speed
// chart. Tests/web/logic.test.mjs runs these under Node; app.mjs draws with them.

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/** Bytes in IEC units, as the command line prints them: "0 B", "812 B", "1.5 KiB", "40.0 MiB". */
export function formatBytes(value) {
  let n = Number(value);
  if (!Number.isFinite(n) || n < 0) return "?";
  let unit = 0;
  while (n >= 1024 && unit < UNITS.length - 1) {
    n /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${Math.round(n)} B`;
  // 1023.96 KiB would print as "1024.0 KiB": carry it into the next unit.
  if (n >= 1023.95 && unit < UNITS.length - 1) return `1.0 ${UNITS[unit + 1]}`;
  return `${n.toFixed(1)} ${UNITS[unit]}`;
}

export function formatSpeed(bytesPerSecond) {
  return `${formatBytes(bytesPerSecond)}/s`;
}

/** Time left, or "" when it cannot be told (no speed, unknown size). */
export function formatETA(remaining, bytesPerSecond) {
  const left = Number(remaining);
  const speed = Number(bytesPerSecond);
  if (!(speed > 0) || !(left >= 0)) return "";
  return formatDuration(left / speed);
}

export function formatDuration(seconds) {
  const s = Math.ceil(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  if (s < 100 * 86400) return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  return "more than 100 days";
}

/** The last path component of a file path or URL, for a row's title. */
export function baseName(text) {
  const trimmed = String(text || "").replace(/[?#].*$/, "").replace(/\/+$/, "");
  const slash = trimmed.lastIndexOf("/");
  const name = slash >= 0 ? trimmed.slice(slash + 1) : trimmed;
  try {
    return decodeURIComponent(name) || text || "";
  } catch {
    return name || text || "";
  }
}

/** What a row shows, from one aria2 status object (numbers arrive as strings). */
export function describe(status) {
  const total = Number(status.totalLength || 0);
  const done = Number(status.completedLength || 0);
  const speed = Number(status.downloadSpeed || 0);
  const file = (status.files && status.files[0]) || {};
  const uri = (file.uris && file.uris[0] && file.uris[0].uri) || "";
  const name = baseName(file.path) || baseName(uri) || status.gid;
  const state = status.status || "unknown";
  const fraction = total > 0 ? Math.min(1, done / total) : state === "complete" ? 1 : 0;
  let detail;
  if (state === "complete") detail = formatBytes(total > 0 ? total : done);
  else if (total > 0) detail = `${formatBytes(done)} of ${formatBytes(total)}`;
  else detail = formatBytes(done);
  const parts = [detail];
  if (state === "active") {
    parts.push(formatSpeed(speed));
    const eta = total > 0 ? formatETA(total - done, speed) : "";
    if (eta) parts.push(`${eta} left`);
  }
  return {
    gid: status.gid,
    name,
    uri,
    state,
    label: STATE_LABELS[state] || state,
    fraction,
    percent: Math.floor(fraction * 1000) / 10,
    line: parts.join(" · "),
    error: state === "error" ? status["stitch.lastProblem"] || status.errorMessage || "failed" : "",
    actions: actionsFor(state),
  };
}

const STATE_LABELS = {
  active: "Downloading",
  waiting: "Waiting",
  paused: "Paused",
  complete: "Done",
  error: "Failed",
  removed: "Removed",
};

/** The buttons a row in `state` offers, in order. */
export function actionsFor(state) {
  switch (state) {
    case "active":
      return ["pause", "remove"];
    case "waiting":
      return ["pause", "up", "down", "remove"];
    case "paused":
      return ["resume", "up", "down", "remove"];
    case "error":
      return ["retry", "remove"]; // stitch.retry takes a failed download, not a removed one
    case "removed":
      return ["remove"];
    case "complete":
      return ["remove"];
    default:
      return ["remove"];
  }
}

/** The RPC call an action on `gid` in `state` is. Removing a stopped download forgets its result. */
export function callFor(action, gid, state) {
  switch (action) {
    case "pause":
      return ["aria2.pause", [gid]];
    case "resume":
      return ["aria2.unpause", [gid]];
    case "retry":
      return ["stitch.retry", [gid]];
    case "up":
      return ["aria2.changePosition", [gid, -1, "POS_CUR"]];
    case "down":
      return ["aria2.changePosition", [gid, 1, "POS_CUR"]];
    case "remove":
      return isStopped(state) ? ["aria2.removeDownloadResult", [gid]] : ["aria2.remove", [gid]];
    default:
      throw new Error(`unknown action ${action}`);
  }
}

export function isStopped(state) {
  return state === "complete" || state === "error" || state === "removed";
}

/** The calls for acting on several downloads at once: only those the action applies to. */
export function callsForSelection(action, rows) {
  return rows.filter((row) => actionsFor(row.state).includes(action)).map((row) => callFor(action, row.gid, row.state));
}

/** Prepends the secret as aria2 expects it (`token:SECRET` as the first parameter). */
export function withToken(params, secret) {
  return secret ? [`token:${secret}`, ...params] : params;
}

/** One `system.multicall` request body for several [method, params] calls, each with the secret. */
export function multicall(calls, secret) {
  return [calls.map(([methodName, params]) => ({ methodName, params: withToken(params, secret) }))];
}

/**
 * The add form, checked, as the calls to make: one `aria2.addUri` per URL line. Returns `{ calls }` or
 * `{ error }` in plain words. Blank lines and lines starting with # are skipped.
 */
export function addCalls(form) {
  const urls = String(form.urls || "")
    .split(/\r?\n/)
    .map((line) => line.trim())
    .filter((line) => line && !line.startsWith("#"));
  if (urls.length === 0) return { error: "Enter at least one URL." };
  for (const url of urls) {
    if (!/^(https?|ftp):\/\/[^\s/?#]+/i.test(url)) return { error: `Not an http(s) URL: ${url}` };
    if (/\s/.test(url)) return { error: `A URL cannot contain spaces: ${url}` };
  }
  const options = {};
  const out = String(form.out || "").trim();
  if (out) {
    if (urls.length > 1) return { error: "A file name applies to one URL; leave it empty to add several." };
    if (out.includes("/") || out === "." || out === "..") return { error: "The file name cannot contain /." };
    options.out = out;
  }
  const split = String(form.split || "").trim();
  if (split) {
    const n = Number(split);
    if (!Number.isInteger(n) || n < 1 || n > 16) return { error: "Connections must be a whole number from 1 to 16." };
    options.split = String(n);
  }
  const checksum = String(form.checksum || "").trim();
  if (checksum) {
    if (!/^[A-Za-z0-9-]+=[0-9A-Fa-f]+$/.test(checksum)) {
      return { error: "A checksum is written ALGORITHM=HEX, for example sha-256=9f86d0…" };
    }
    options.checksum = checksum;
  }
  const headers = parseHeaders(form.headers);
  if (headers.error) return { error: headers.error };
  if (headers.list.length) options.header = headers.list;
  return { calls: urls.map((url) => ["aria2.addUri", [[url], { ...options }]]) };
}

/** Header lines `Name: value`, one per line; `{ list }` or `{ error }`. */
export function parseHeaders(text) {
  const list = [];
  for (const raw of String(text || "").split(/\r?\n/)) {
    const line = raw.trim();
    if (!line) continue;
    const colon = line.indexOf(":");
    if (colon <= 0 || !/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(line.slice(0, colon))) {
      return { error: `Not a header (Name: value): ${line}` };
    }
    list.push(`${line.slice(0, colon)}: ${line.slice(colon + 1).trim()}`);
  }
  return { list };
}

/**
 * One page of a list that the RPC windows: `tellWaiting(offset, count)` oldest first, `tellStopped` newest first
 * (a negative offset counts from the end). `page` is clamped to the pages there are.
 */
export function pageWindow(total, pageSize, page, newestFirst) {
  const pages = Math.max(1, Math.ceil(total / pageSize));
  const current = Math.min(Math.max(0, page), pages - 1);
  const first = current * pageSize;
  const count = Math.max(0, Math.min(pageSize, total - first));
  return {
    page: current,
    pages,
    offset: newestFirst ? -1 - first : first,
    count: pageSize,
    label: total === 0 ? "none" : `${first + 1}–${first + count} of ${total}`,
  };
}

/** Reconnection delays: 0.25 s doubling to at most 5 s; `reset` after a connection lasts. */
export class Backoff {
  constructor(first = 250, cap = 5000) {
    this.first = first;
    this.cap = cap;
    this.current = 0;
  }
  next() {
    this.current = this.current === 0 ? this.first : Math.min(this.cap, this.current * 2);
    return this.current;
  }
  reset() {
    this.current = 0;
  }
}

/**
 * Lets something run at most once per `interval` ms: `due(now)` says how long to wait before it may run again
 * (0: now), `ran(now)` records a run.
 */
export class Throttle {
  constructor(interval = 1000) {
    this.interval = interval;
    this.last = -Infinity;
  }
  due(now) {
    return Math.max(0, this.last + this.interval - now);
  }
  ran(now) {
    this.last = now;
  }
}

/**
 * The piece bar: each segment as a span of the file (percent from the left and wide), with how much of it is
 * written and how much is durable (percent of the segment). A segment without an end runs to the total.
 */
export function pieceBar(segments, total) {
  const size = Number(total);
  if (!(size > 0) || !Array.isArray(segments)) return [];
  return segments.map((segment) => {
    const start = Number(segment.start);
    const end = segment.end === undefined || segment.end === null ? size : Number(segment.end);
    const length = Math.max(0, end - start);
    const part = (value) => (length > 0 ? clamp01((Number(value) - start) / length) * 100 : 100);
    return {
      left: (start / size) * 100,
      width: (length / size) * 100,
      written: part(segment.written),
      durable: part(segment.durable),
      done: Number(segment.written) >= end,
    };
  });
}

function clamp01(x) {
  return Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0;
}

/**
 * The connections at work: segments whose written end moved since the previous sample, with their speed.
 * `before` and `after` are `{ time (ms), segments }`; segments are matched by their start.
 */
export function connectionSpeeds(before, after) {
  if (!before || !after || !(after.time > before.time)) return [];
  const seconds = (after.time - before.time) / 1000;
  const earlier = new Map((before.segments || []).map((s) => [String(s.start), Number(s.written)]));
  const result = [];
  for (const segment of after.segments || []) {
    const written = Number(segment.written);
    const end = segment.end === undefined || segment.end === null ? Infinity : Number(segment.end);
    const was = earlier.get(String(segment.start));
    if (was === undefined || written >= end) continue;
    const speed = Math.max(0, (written - was) / seconds);
    if (speed > 0) result.push({ start: Number(segment.start), end, written, speed });
  }
  return result;
}

/** The last `capacity` samples of the global speed. */
export class SpeedHistory {
  constructor(capacity = 60) {
    this.capacity = capacity;
    this.samples = [];
  }
  add(value) {
    this.samples.push(Math.max(0, Number(value) || 0));
    if (this.samples.length > this.capacity) this.samples.shift();
  }
  /** SVG polyline points for a `width` × `height` box, newest at the right, scaled to the highest sample. */
  points(width, height) {
    const peak = Math.max(1, ...this.samples);
    const step = width / Math.max(1, this.capacity - 1);
    const offset = this.capacity - this.samples.length;
    return this.samples
      .map((v, i) => `${((offset + i) * step).toFixed(1)},${(height - (v / peak) * height).toFixed(1)}`)
      .join(" ");
  }
  get peak() {
    return Math.max(0, ...this.samples);
  }
}

/** Keeps a selection to the downloads that still exist. */
export function pruneSelection(selection, gids) {
  const present = new Set(gids);
  for (const gid of [...selection]) if (!present.has(gid)) selection.delete(gid);
  return selection;
}

/** A rate as the daemon takes it ("0", "512K", "10M"): `{ value }` or `{ error }`. */
export function parseRate(text) {
  const t = String(text || "").trim();
  if (t === "" || t === "0") return { value: "0" };
  if (!/^\d+(\.\d+)?[KkMmGg]?$/.test(t)) return { error: "A rate is a number of bytes per second, with K, M or G: 10M" };
  return { value: t.toUpperCase() };
}

/** A rate in bytes per second as a short text for the rate field ("0" for none). */
export function rateText(bytes) {
  const n = Number(bytes);
  if (!(n > 0)) return "0";
  for (const [unit, size] of [["G", 1 << 30], ["M", 1 << 20], ["K", 1 << 10]]) {
    if (n % size === 0) return `${n / size}${unit}`;
  }
  return String(n);
}

/** What a failed call means for the connection: "auth" (no or a wrong secret), "throttled" (too many wrong
 * secrets from this address: wait, then a right one), or "network" (anything else). */
export function failureKind(error) {
  const message = String((error && error.message) || "");
  if (/unauthorized/i.test(message)) return "auth";
  if (/too many wrong secrets/i.test(message)) return "throttled";
  return "network";
}

/**
 * The page's connection to the daemon, as a state machine without timers or I/O: each event returns the effects
 * to perform, which app.mjs carries out and reports back as events.
 *
 * Effects: `openSocket` (a WebSocket to /jsonrpc), `closeSocket`, `probeHTTP` (one call over HTTP POST),
 * `handshake` (getVersion and getSessionInfo), `poll` (start polling), `askSecret` ({ rejected }), `notice`
 * ({ text }), `retry` ({ delay } in ms, then `retryDue`), `cancelRetry`.
 *
 * - A WebSocket first. One that does not open (refused, too many clients, a proxy) is answered by a probe over
 *   HTTP; if that works the page polls over HTTP and tries the WebSocket again now and then, quietly. A
 *   WebSocket that is open or on its way is never replaced by a retry.
 * - Backoff grows from 0.25 s to 5 s and starts over only when a WebSocket works (its handshake answered).
 * - While the page waits for the user's secret it sends nothing that needs one: a reconnect does not resend a
 *   secret that was refused.
 */
export class Connection {
  constructor() {
    this.transport = "none"; // "none", "websocket", "http"
    this.phase = "connecting"; // "connecting", "live", "lost", "secret"
    this.socketOpening = false;
    this.socketOpen = false;
    this.everLive = false;
    this.lostSince = 0;
    this.sessionID = null;
    this.hasSecret = false;
    this.secretRejected = false;
    this.throttled = false;
    this.retryPending = false;
    this.nextDelay = 0;
    this.backoff = new Backoff();
  }

  start(hasSecret) {
    this.hasSecret = hasSecret;
    return [this.open()];
  }

  socketOpened() {
    this.socketOpening = false;
    this.socketOpen = true;
    this.transport = "websocket";
    const effects = this.retryPending ? [{ type: "cancelRetry" }] : [];
    this.retryPending = false;
    return this.phase === "secret" ? effects : [...effects, { type: "handshake" }];
  }

  /** The WebSocket closed before it opened: HTTP may still work (a proxy without WebSocket, no place left). */
  socketFailed(now) {
    this.socketOpening = false;
    this.socketOpen = false;
    if (this.transport === "http") return this.retryPending ? [] : [this.retry()]; // live over HTTP: quietly
    if (this.phase !== "secret") return [{ type: "probeHTTP" }];
    return this.lose(now);
  }

  /** The WebSocket closed after it had opened (or was given up on: a call went unanswered). */
  socketClosed(now) {
    this.socketOpen = false;
    if (this.transport === "websocket") this.transport = "none";
    return this.lose(now);
  }

  httpProbed(ok, now) {
    if (!ok) return this.lose(now);
    this.transport = "http";
    const effects = this.phase === "secret" ? [] : [{ type: "handshake" }];
    if (!this.retryPending && !this.socketOpening) effects.push(this.retry()); // the WebSocket, later
    return effects;
  }

  /** The handshake answered; `sessionID` is the daemon's (a new one means it restarted). */
  handshaken(sessionID) {
    if (this.transport === "none") return []; // an answer from a transport given up on meanwhile
    const restarted = this.sessionID !== null && typeof sessionID === "string" && sessionID !== this.sessionID;
    const wasLost = this.lostSince !== 0;
    if (typeof sessionID === "string") this.sessionID = sessionID;
    // The backoff starts over only once a WebSocket really works (one that opens and then fails every time, as
    // behind a broken proxy, keeps backing off).
    if (this.transport === "websocket") this.backoff.reset();
    this.phase = "live";
    this.everLive = true;
    this.lostSince = 0;
    this.secretRejected = false;
    this.throttled = false;
    const effects = [{ type: "poll" }];
    if (restarted) effects.push({ type: "notice", text: "The daemon restarted; the page is live again." });
    else if (wasLost) effects.push({ type: "notice", text: "Connected again." });
    return effects;
  }

  /** A handshake or poll failed; `kind` as failureKind() says. */
  failed(kind, now) {
    if (kind === "auth" || kind === "throttled") {
      this.throttled = kind === "throttled";
      this.secretRejected = this.hasSecret && !this.throttled;
      this.phase = "secret";
      return [{ type: "askSecret", rejected: this.secretRejected, throttled: this.throttled }];
    }
    if (this.transport === "websocket" && this.socketOpen) return [{ type: "closeSocket" }]; // then socketClosed
    if (this.transport === "http") this.transport = "none";
    return this.lose(now);
  }

  secretEntered() {
    this.hasSecret = true;
    this.phase = "connecting";
    if (this.transport === "websocket" && this.socketOpen) return [{ type: "handshake" }];
    if (this.transport === "http") {
      const effects = [{ type: "handshake" }];
      if (!this.retryPending && !this.socketOpening) effects.push(this.retry());
      return effects;
    }
    return this.retryPending || this.socketOpening ? [] : [this.open()];
  }

  retryDue() {
    this.retryPending = false;
    // A WebSocket that is open or opening already is not replaced.
    return this.socketOpen || this.socketOpening ? [] : [this.open()];
  }

  get mayPoll() {
    return this.phase === "live" && this.transport !== "none";
  }

  open() {
    this.socketOpening = true;
    return { type: "openSocket" };
  }

  lose(now) {
    if (this.phase !== "secret") {
      this.phase = "lost";
      if (!this.lostSince) this.lostSince = now;
    }
    // A WebSocket on its way decides what comes next; else one try, after the backoff.
    return this.retryPending || this.socketOpening ? [] : [this.retry()];
  }

  retry() {
    this.retryPending = true;
    this.nextDelay = this.backoff.next();
    return { type: "retry", delay: this.nextDelay };
  }
}
