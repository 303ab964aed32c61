// Stitch's page: the daemon's own RPC over a WebSocket (HTTP POST when no WebSocket can be had), drawn with the
// helpers of logic.mjs. No framework, no inline script or style: the daemon's Content-Security-Policy allows
// only these files.
import * as L from "./logic.mjs";

const PAGE_SIZE = 50;
const LIST_KEYS = [
  "gid", "status", "totalLength", "completedLength", "downloadSpeed", "files", "errorMessage", "errorCode",
  "stitch.lastProblem",
];
const DETAIL_KEYS = [...LIST_KEYS, "dir", "stitch.segments", "stitch.validators"];
const SECRET_KEY = "stitch.secret";

const $ = (id) => document.getElementById(id);

const CALL_TIMEOUT = 15000; // longer than the daemon ever holds a call (a slowed client waits at most 10 s)

const app = {
  secret: sessionStorage.getItem(SECRET_KEY) || "",
  connection: new L.Connection(),
  socket: null,
  version: "",
  nextID: 1,
  pending: new Map(),
  retryTimer: 0,
  throttle: new L.Throttle(1000),
  pollTimer: 0,
  polling: false,
  polls: 0,
  pages: { waiting: 0, stopped: 0 },
  totals: { active: 0, waiting: 0, stopped: 0 },
  rows: new Map(),
  selection: new Set(),
  detail: null,
  history: new L.SpeedHistory(60),
  settingsLoaded: false,
};

// For the browser tests: when each poll started (performance.now()).
window.stitchPage = { pollTimes: [] };

// ---- transport ---------------------------------------------------------------------------------------------

function rpcURL(scheme) {
  const secure = location.protocol === "https:";
  return `${scheme}${secure ? "s" : ""}://${location.host}/jsonrpc`;
}

/** One call, over the WebSocket when it is open, else over HTTP. Rejects with the RPC's error. */
function call(method, params = [], { token = true } = {}) {
  const id = `p${app.nextID++}`;
  const request = { jsonrpc: "2.0", id, method, params: token ? L.withToken(params, app.secret) : params };
  const socket = app.socket;
  if (app.connection.transport === "websocket" && socket && socket.readyState === WebSocket.OPEN) {
    return new Promise((resolve, reject) => {
      // A daemon that stopped answering on a socket that looks open (a sleeping phone, a dropped network) is
      // found out here: the socket is closed and the page reconnects.
      const timer = setTimeout(() => {
        app.pending.delete(id);
        reject(new Error("the daemon did not answer"));
        // Given up on at once: its close event may take long on a dead network.
        if (app.socket === socket) dropSocket(Date.now());
      }, CALL_TIMEOUT);
      app.pending.set(id, {
        resolve: (value) => (clearTimeout(timer), resolve(value)),
        reject: (error) => (clearTimeout(timer), reject(error)),
      });
      socket.send(JSON.stringify(request));
    });
  }
  return httpCall(request);
}

async function httpCall(request) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), CALL_TIMEOUT);
  try {
    const response = await fetch(rpcURL("http"), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(request),
      cache: "no-store",
      credentials: "omit",
      signal: controller.signal,
    });
    const reply = await response.json();
    if (reply.error) throw rpcError(reply.error);
    return reply.result;
  } finally {
    clearTimeout(timer);
  }
}

function rpcError(error) {
  const failure = new Error(error.message || "error");
  failure.code = error.code;
  return failure;
}

/** Several calls in one `system.multicall`; each result is the value or an Error. */
async function multicall(calls) {
  const results = await call("system.multicall", L.multicall(calls, app.secret), { token: false });
  return results.map((entry) => (Array.isArray(entry) ? entry[0] : rpcError(entry)));
}

/** Carries out what the connection's state machine asks for. */
function perform(effects) {
  for (const effect of effects) {
    switch (effect.type) {
      case "openSocket":
        openSocket();
        break;
      case "closeSocket":
        if (app.socket) app.socket.close();
        break;
      case "probeHTTP":
        probeHTTP();
        break;
      case "handshake":
        handshake();
        break;
      case "poll":
        app.settingsLoaded = false;
        schedulePoll(0);
        break;
      case "askSecret":
        askForSecret(effect.rejected, effect.throttled);
        break;
      case "notice":
        showNotice(effect.text, "info");
        break;
      case "retry":
        clearTimeout(app.retryTimer);
        app.retryTimer = setTimeout(() => perform(app.connection.retryDue()), effect.delay);
        break;
      case "cancelRetry":
        clearTimeout(app.retryTimer);
        break;
    }
  }
  showConnection();
}

/** Forgets the current socket (its events are ignored from now on), failing its unanswered calls as stale. */
function detachSocket() {
  const old = app.socket;
  if (!old) return;
  app.socket = null;
  for (const { reject } of app.pending.values()) reject(staleError());
  app.pending.clear();
  old.close();
}

/** The WebSocket is given up on (a call went unanswered): the connection hears it closed, now. */
function dropSocket(now) {
  detachSocket();
  perform(app.connection.socketClosed(now));
}

function staleError() {
  const error = new Error("the connection to the daemon was lost; try again");
  error.stale = true;
  return error;
}

function openSocket() {
  detachSocket();
  let socket;
  try {
    socket = new WebSocket(rpcURL("ws"));
  } catch {
    perform(app.connection.socketFailed(Date.now()));
    return;
  }
  app.socket = socket;
  let opened = false;
  socket.addEventListener("open", () => {
    if (app.socket !== socket) return;
    opened = true;
    perform(app.connection.socketOpened());
  });
  socket.addEventListener("message", (event) => {
    if (app.socket === socket) onMessage(event.data);
  });
  socket.addEventListener("close", () => {
    if (app.socket !== socket) return;
    app.socket = null;
    for (const { reject } of app.pending.values()) reject(staleError());
    app.pending.clear();
    perform(opened ? app.connection.socketClosed(Date.now()) : app.connection.socketFailed(Date.now()));
  });
}

async function probeHTTP() {
  let ok = true;
  try {
    await httpCall({ jsonrpc: "2.0", id: "probe", method: "system.listMethods", params: [] });
  } catch {
    ok = false;
  }
  perform(app.connection.httpProbed(ok, Date.now()));
}

async function handshake() {
  let effects;
  try {
    const [version, session] = await multicall([["aria2.getVersion", []], ["aria2.getSessionInfo", []]]);
    if (version instanceof Error) throw version;
    app.version = version.version;
    // The secret is kept only once the daemon took it.
    if (app.secret) sessionStorage.setItem(SECRET_KEY, app.secret);
    effects = app.connection.handshaken(session instanceof Error ? undefined : session.sessionId);
  } catch (error) {
    if (error.stale) return; // its socket went, and the connection heard so
    const kind = L.failureKind(error);
    if (kind === "auth") sessionStorage.removeItem(SECRET_KEY);
    effects = app.connection.failed(kind, Date.now());
  }
  perform(effects);
}

function showConnection() {
  const c = app.connection;
  switch (c.phase) {
    case "live":
      setConnection("live", `Live · stitch ${app.version}${c.transport === "http" ? " (polling over HTTP)" : ""}`);
      break;
    case "lost":
      setConnection("lost", `The daemon is not answering (since ${new Date(c.lostSince).toLocaleTimeString()}); `
        + `trying again in ${(c.nextDelay / 1000).toFixed(1)} s`);
      break;
    case "secret":
      setConnection("secret", c.throttled ? "Too many wrong secrets from this address"
        : c.secretRejected ? "The secret was not accepted" : "This daemon needs its secret");
      break;
    default:
      setConnection("connecting", "Connecting…");
  }
}

function onMessage(text) {
  let message;
  try {
    message = JSON.parse(text);
  } catch {
    return;
  }
  if (message.id !== undefined && app.pending.has(message.id)) {
    const { resolve, reject } = app.pending.get(message.id);
    app.pending.delete(message.id);
    if (message.error) reject(rpcError(message.error));
    else resolve(message.result);
    return;
  }
  // aria2.onDownloadStart, …Pause, …Stop, …Complete, …Error: the lists changed.
  if (typeof message.method === "string") schedulePoll(0);
}

// ---- polling -----------------------------------------------------------------------------------------------

/** Asks for a refresh: at most one a second, whatever asks (notifications, actions, the clock). */
function schedulePoll(delay) {
  if (app.pollTimer) {
    if (delay > 0) return;
    clearTimeout(app.pollTimer);
  }
  const wait = Math.max(delay, app.throttle.due(performance.now()));
  app.pollTimer = setTimeout(runPoll, wait);
}

async function runPoll() {
  app.pollTimer = 0;
  if (!app.connection.mayPoll) return;
  if (app.polling) {
    schedulePoll(100);
    return;
  }
  app.polling = true;
  const now = performance.now();
  app.throttle.ran(now);
  app.polls += 1;
  window.stitchPage.pollTimes.push(now);
  document.body.dataset.polls = String(app.polls);
  try {
    await poll();
  } catch (error) {
    if (!error.stale) perform(app.connection.failed(L.failureKind(error), Date.now()));
  } finally {
    app.polling = false;
  }
  if (app.connection.mayPoll) schedulePoll(1000);
}

async function poll() {
  const waiting = L.pageWindow(app.totals.waiting, PAGE_SIZE, app.pages.waiting, false);
  const stopped = L.pageWindow(app.totals.stopped, PAGE_SIZE, app.pages.stopped, true);
  const calls = [
    ["aria2.getGlobalStat", []],
    ["aria2.tellActive", [LIST_KEYS]],
    ["aria2.tellWaiting", [waiting.offset, waiting.count, LIST_KEYS]],
    ["aria2.tellStopped", [stopped.offset, stopped.count, LIST_KEYS]],
  ];
  const detail = app.detail && !app.detail.gone ? app.detail : null;
  if (detail) calls.push(["aria2.tellStatus", [detail.gid, DETAIL_KEYS]]);
  if (!app.settingsLoaded) calls.push(["aria2.getGlobalOption", []]);
  const results = await multicall(calls);
  const [stat, active, waitingList, stoppedList] = results;
  for (const result of results) if (result instanceof Error && L.failureKind(result) !== "network") throw result;
  const groups = { active, waiting: waitingList, stopped: stoppedList };
  if (!(stat instanceof Error)) {
    app.totals = { active: Number(stat.numActive), waiting: Number(stat.numWaiting), stopped: Number(stat.numStopped) };
    app.history.add(stat.downloadSpeed);
    renderGlobal(stat);
    // A page that no longer exists (its last rows went): keep what is shown, and ask for the right page.
    for (const [group, asked] of [["waiting", waiting], ["stopped", stopped]]) {
      const fresh = L.pageWindow(app.totals[group], PAGE_SIZE, app.pages[group], group === "stopped");
      if (fresh.offset !== asked.offset) {
        app.pages[group] = fresh.page;
        groups[group] = null;
        schedulePoll(0);
      }
    }
  }
  // A list whose call failed keeps its rows until the next poll.
  for (const group of Object.keys(groups)) if (groups[group] instanceof Error) groups[group] = null;
  render(groups);
  let next = 4;
  if (detail) {
    const status = results[next++];
    if (app.detail === detail) renderDetail(status);
  }
  if (!app.settingsLoaded) {
    const options = results[next++];
    if (!(options instanceof Error)) {
      app.settingsLoaded = true;
      fillSettings(options);
    }
  }
}

// ---- drawing -----------------------------------------------------------------------------------------------

function setConnection(state, text) {
  const element = $("connection");
  element.dataset.state = state;
  if (element.textContent !== text) element.textContent = text;
  document.body.dataset.connection = state;
}

function showNotice(text, kind = "error") {
  const notice = $("notice");
  notice.textContent = text;
  notice.dataset.kind = kind;
  notice.hidden = false;
  clearTimeout(showNotice.timer);
  showNotice.timer = setTimeout(() => (notice.hidden = true), kind === "error" ? 12000 : 5000);
}

function renderGlobal(stat) {
  setText($("global-speed"), L.formatSpeed(stat.downloadSpeed));
  $("chart-line").setAttribute("points", app.history.points(120, 32));
  $("chart").setAttribute("aria-label", `Download speed over the last minute, peak ${L.formatSpeed(app.history.peak)}`);
  setText($("global-counts"), `${stat.numActive} active · ${stat.numWaiting} waiting · ${stat.numStopped} stopped`);
}

function setText(element, text) {
  if (element.textContent !== text) element.textContent = text;
}

/** Which row control has the focus (a row's element moves between lists, or its buttons are rebuilt). */
function focusedControl() {
  const element = document.activeElement;
  const item = element && element.closest && element.closest("li.item");
  if (!item) return null;
  const list = item.parentElement;
  return {
    gid: item.dataset.gid, action: element.dataset.action || "", select: element.classList.contains("select"),
    list: list.id, index: [...list.children].indexOf(item),
  };
}

/** Gives the focus back to the same control of the same row, or to the row's first button when that one went. */
function restoreFocus(control) {
  if (!control) return;
  const row = app.rows.get(control.gid);
  if (!row || !row.element.isConnected) {
    // The row went (removed, or paged away): the row now in its place, else the group's heading.
    if (document.activeElement && document.activeElement !== document.body) return;
    focusNear(control.list, control.index);
    return;
  }
  if (row.element.contains(document.activeElement)) return;
  const again = control.select
    ? row.box
    : row.element.querySelector(`[data-action="${control.action}"]`) || row.actions.firstElementChild || row.name;
  again.focus();
}

function focusNear(listID, index) {
  const list = $(listID);
  if (!list) return;
  const near = list.children[Math.min(index, list.children.length - 1)];
  if (near) near.querySelector("button.name").focus();
  else list.closest(".group").querySelector("h2").focus();
}

function render(groups) {
  const control = focusedControl();
  const shown = new Set();
  for (const group of ["active", "waiting", "stopped"]) {
    const list = $(`list-${group}`);
    const statuses = groups[group];
    if (!statuses) {
      for (const li of list.children) shown.add(li.dataset.gid);
      continue;
    }
    let index = 0;
    for (const status of statuses) {
      const view = L.describe(status);
      shown.add(view.gid);
      let row = app.rows.get(view.gid);
      if (!row) {
        row = createRow(view.gid);
        app.rows.set(view.gid, row);
      }
      updateRow(row, view);
      if (list.children[index] !== row.element) list.insertBefore(row.element, list.children[index] || null);
      index += 1;
    }
    while (list.children.length > index) list.lastElementChild.remove();
    setText($(`count-${group}`), String(app.totals[group]));
    $(`empty-${group}`).hidden = statuses.length > 0;
    if (group !== "active") renderPager(group);
    updateSelectAll(group, statuses);
  }
  for (const [gid, row] of app.rows) if (!shown.has(gid)) app.rows.delete(gid);
  // A row that moved (up, down, to another group) lost the focus; give it back.
  restoreFocus(control);
  L.pruneSelection(app.selection, [...shown]);
  renderBulk();
}

function renderPager(group) {
  const window = L.pageWindow(app.totals[group], PAGE_SIZE, app.pages[group], group === "stopped");
  app.pages[group] = window.page;
  setText($(`pager-${group}`), window.pages > 1 ? `${window.label}` : "");
  for (const button of document.querySelectorAll(`[data-page="${group}"]`)) {
    const step = Number(button.dataset.step);
    button.hidden = window.pages <= 1;
    button.disabled = step < 0 ? window.page === 0 : window.page >= window.pages - 1;
  }
}

function updateSelectAll(group, statuses) {
  const box = $(`select-${group}`);
  const gids = statuses.map((s) => s.gid);
  const chosen = gids.filter((gid) => app.selection.has(gid)).length;
  box.hidden = gids.length === 0;
  box.checked = gids.length > 0 && chosen === gids.length;
  box.indeterminate = chosen > 0 && chosen < gids.length;
}

const ACTION_LABELS = { pause: "Pause", resume: "Resume", retry: "Retry", up: "↑", down: "↓", remove: "Remove" };
const ACTION_WORDS = { pause: "Pause", resume: "Resume", retry: "Retry", up: "Move up", down: "Move down", remove: "Remove" };

function createRow(gid) {
  const element = document.createElement("li");
  element.className = "item";
  element.dataset.gid = gid;
  const box = document.createElement("input");
  box.type = "checkbox";
  box.className = "select";
  const main = document.createElement("div");
  main.className = "item-main";
  const title = document.createElement("div");
  title.className = "item-title";
  const name = document.createElement("button");
  name.type = "button";
  name.className = "name";
  name.dataset.action = "detail";
  const state = document.createElement("span");
  state.className = "state";
  title.append(name, state);
  const bar = document.createElement("div");
  bar.className = "bar";
  bar.setAttribute("role", "progressbar");
  bar.setAttribute("aria-valuemin", "0");
  bar.setAttribute("aria-valuemax", "100");
  const fill = document.createElement("div");
  fill.className = "bar-fill";
  bar.append(fill);
  const line = document.createElement("div");
  line.className = "line";
  const error = document.createElement("div");
  error.className = "error";
  main.append(title, bar, line, error);
  const actions = document.createElement("div");
  actions.className = "actions";
  element.append(box, main, actions);
  return { element, box, name, state, bar, fill, line, error, actions, view: null, actionKey: "" };
}

function updateRow(row, view) {
  const previous = row.view;
  row.view = view;
  row.element.dataset.state = view.state;
  if (!previous || previous.name !== view.name) {
    row.name.textContent = view.name;
    row.name.setAttribute("aria-label", `Details of ${view.name}`);
    row.box.setAttribute("aria-label", `Select ${view.name}`);
    row.bar.setAttribute("aria-label", `Progress of ${view.name}`);
    row.actionKey = "";
  }
  row.box.checked = app.selection.has(view.gid);
  row.state.dataset.state = view.state;
  setText(row.state, view.label);
  row.fill.style.width = `${view.percent}%`;
  row.bar.setAttribute("aria-valuenow", String(view.percent));
  setText(row.line, view.line);
  setText(row.error, view.error);
  const key = view.actions.join(",");
  if (row.actionKey !== key) {
    // Rebuilt only when the set changes, so a focused button survives refreshes (render() restores the focus
    // when the focused one went: Pause becomes Resume in place).
    row.actions.replaceChildren(
      ...view.actions.map((action) => {
        const button = document.createElement("button");
        button.type = "button";
        button.dataset.action = action;
        button.textContent = ACTION_LABELS[action];
        button.setAttribute("aria-label", `${ACTION_WORDS[action]} ${view.name}`);
        if (action === "remove") button.className = "danger";
        return button;
      }),
    );
    row.actionKey = key;
  }
}

function renderBulk() {
  const count = app.selection.size;
  $("bulk").hidden = count === 0;
  setText($("bulk-count"), `${count} selected`);
}

function renderDetail(status) {
  if (status instanceof Error) {
    // Forgotten (removed from the list) while shown: said, and no longer asked for.
    app.detail.gone = /not found/i.test(status.message);
    setText($("detail-line"), app.detail.gone ? "This download is no longer in the daemon's list." : status.message);
    if (app.detail.gone) {
      $("pieces").replaceChildren();
      $("connections").replaceChildren();
      $("connections-empty").hidden = false;
    }
    return;
  }
  const view = L.describe(status);
  setText($("detail-title"), view.name);
  setText($("detail-line"), `${view.label} · ${view.line}`);
  const total = Number(status.totalLength || 0);
  const segments = status["stitch.segments"] || [];
  const bar = $("pieces");
  const pieces = L.pieceBar(segments, total);
  while (bar.children.length > pieces.length) bar.lastElementChild.remove();
  pieces.forEach((piece, index) => {
    let element = bar.children[index];
    if (!element) {
      element = document.createElement("div");
      element.className = "piece";
      const written = document.createElement("div");
      written.className = "piece-written";
      const durable = document.createElement("div");
      durable.className = "piece-durable";
      element.append(written, durable);
      bar.append(element);
    }
    element.style.left = `${piece.left}%`;
    element.style.width = `${piece.width}%`;
    element.children[0].style.width = `${piece.written}%`;
    element.children[1].style.width = `${piece.durable}%`;
    element.dataset.done = String(piece.done);
  });
  const doneCount = pieces.filter((p) => p.done).length;
  bar.setAttribute("aria-label", `${pieces.length} pieces, ${doneCount} complete`);
  bar.dataset.pieces = String(pieces.length);
  bar.dataset.complete = String(doneCount);

  const sample = { time: performance.now(), segments };
  const speeds = L.connectionSpeeds(app.detail.sample, sample);
  app.detail.sample = sample;
  const rows = speeds.map((c) => {
    const tr = document.createElement("tr");
    const end = Number.isFinite(c.end) ? L.formatBytes(c.end) : "end";
    for (const text of [`${L.formatBytes(c.start)} – ${end}`, L.formatBytes(c.written - c.start), L.formatSpeed(c.speed)]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  });
  $("connections").replaceChildren(...rows);
  $("connections-empty").hidden = rows.length > 0;
  const file = (status.files && status.files[0]) || {};
  setText($("detail-url"), view.uri || "—");
  setText($("detail-path"), file.path || "—");
  const validators = status["stitch.validators"] || {};
  setText($("detail-etag"), validators.etag || "none");
  setText($("detail-modified"), validators.lastModified || "none");
  setText($("detail-problem"), status["stitch.lastProblem"] || status.errorMessage || "none");
}

function fillSettings(options) {
  const rate = $("set-rate");
  const concurrent = $("set-concurrent");
  if (document.activeElement !== rate) rate.value = L.rateText(options["max-overall-download-limit"]);
  if (document.activeElement !== concurrent) concurrent.value = options["max-concurrent-downloads"] || "";
}

// ---- actions -----------------------------------------------------------------------------------------------

/** An action's calls; failures are said in the notice (a refused secret opens the secret dialog). */
async function act(calls, what) {
  if (calls.length === 0) return;
  try {
    const results = calls.length === 1 ? [await call(...calls[0])] : await multicall(calls);
    const failures = results.filter((r) => r instanceof Error);
    if (failures.length && !secretTrouble(failures[0])) showNotice(`${what}: ${failures[0].message}`);
  } catch (error) {
    if (!secretTrouble(error)) showNotice(`${what}: ${error.message}`);
  }
  schedulePoll(0);
}

/** Whether `error` is about the secret; if so the connection asks for it. */
function secretTrouble(error) {
  const kind = L.failureKind(error);
  if (kind === "network") return false;
  perform(app.connection.failed(kind, Date.now()));
  return true;
}

function rowAction(button) {
  const item = button.closest(".item");
  const row = item && app.rows.get(item.dataset.gid);
  if (!row) return;
  const action = button.dataset.action;
  if (action === "detail") {
    openDetail(row.view.gid, row.view.name);
    return;
  }
  const [method, params] = L.callFor(action, row.view.gid, row.view.state);
  act([[method, params]], `${ACTION_WORDS[action]} ${row.view.name}`);
}

function bulkAction(action) {
  if (action === "clear") {
    app.selection.clear();
    for (const row of app.rows.values()) row.box.checked = false;
    renderBulk();
    for (const group of ["active", "waiting", "stopped"]) updateSelectAll(group, visible(group));
    return;
  }
  const rows = [...app.selection].map((gid) => app.rows.get(gid)?.view).filter(Boolean);
  act(L.callsForSelection(action, rows), `${ACTION_WORDS[action]} ${rows.length} downloads`);
  if (action === "remove") bulkAction("clear");
}

function visible(group) {
  return [...$(`list-${group}`).children].map((li) => app.rows.get(li.dataset.gid)?.view).filter(Boolean);
}

function openDetail(gid, name) {
  const item = app.rows.get(gid)?.element;
  const list = item ? item.parentElement : null;
  app.detail = { gid, sample: null, gone: false, list: list ? list.id : "list-active",
    index: list ? [...list.children].indexOf(item) : 0 };
  setText($("detail-title"), name);
  setText($("detail-line"), "");
  $("pieces").replaceChildren();
  $("connections").replaceChildren();
  const dialog = $("detail");
  dialog.dataset.gid = gid;
  if (!dialog.open) dialog.showModal();
  schedulePoll(0);
}

async function addDownloads(event) {
  event.preventDefault();
  const form = event.target;
  const message = $("add-message");
  const plan = L.addCalls({
    urls: form.urls.value, out: form.out.value, split: form.split.value, checksum: form.checksum.value,
    headers: form.headers.value,
  });
  if (plan.error) {
    message.dataset.kind = "error";
    message.textContent = plan.error;
    return;
  }
  const button = $("add-submit");
  button.disabled = true;
  try {
    const results = plan.calls.length === 1 ? [await call(...plan.calls[0])] : await multicall(plan.calls);
    const failures = results.filter((r) => r instanceof Error);
    const added = results.length - failures.length;
    message.dataset.kind = failures.length ? "error" : "ok";
    message.textContent = failures.length
      ? `Added ${added} of ${results.length}: ${failures[0].message}`
      : `Added ${added} download${added === 1 ? "" : "s"}.`;
    if (!failures.length) {
      form.urls.value = "";
      form.out.value = "";
    }
  } catch (error) {
    secretTrouble(error);
    message.dataset.kind = "error";
    message.textContent = `Not added: ${error.message}`;
  } finally {
    button.disabled = false;
  }
  schedulePoll(0);
}

async function applySettings(event) {
  event.preventDefault();
  const message = $("settings-message");
  const rate = L.parseRate($("set-rate").value);
  const concurrent = $("set-concurrent").value.trim();
  if (rate.error) {
    message.dataset.kind = "error";
    message.textContent = rate.error;
    return;
  }
  if (!/^\d+$/.test(concurrent) || Number(concurrent) < 1 || Number(concurrent) > 1000) {
    message.dataset.kind = "error";
    message.textContent = "Downloads at once is a whole number from 1 to 1000.";
    return;
  }
  try {
    await call("aria2.changeGlobalOption", [{ "max-overall-download-limit": rate.value, "max-concurrent-downloads": concurrent }]);
    message.dataset.kind = "ok";
    message.textContent = "Applied.";
    app.settingsLoaded = false;
  } catch (error) {
    secretTrouble(error);
    message.dataset.kind = "error";
    message.textContent = error.message;
  }
  schedulePoll(0);
}

function askForSecret(rejected, throttled) {
  $("secret-message").textContent = throttled
    ? "Too many wrong secrets came from this address (this page or another client); the daemon waits before it "
      + "answers again. Enter the secret to try again in a few seconds."
    : rejected
      ? "The secret was not accepted. Enter the daemon's RPC secret (the contents of --rpc-secret-file)."
      : "This daemon needs its RPC secret (the contents of --rpc-secret-file).";
  const dialog = $("secret-dialog");
  dialog.dataset.rejected = String(rejected);
  if (!dialog.open) dialog.showModal();
  $("secret-input").focus();
}

function submitSecret(event) {
  event.preventDefault();
  const value = $("secret-input").value;
  if (!value) return;
  app.secret = value; // kept in session storage once the daemon takes it
  $("secret-input").value = "";
  $("secret-dialog").close();
  perform(app.connection.secretEntered());
}

// ---- wiring ------------------------------------------------------------------------------------------------

function wire() {
  $("add-form").addEventListener("submit", addDownloads);
  $("add-urls").addEventListener("keydown", (event) => {
    // Enter adds a line; Ctrl+Enter (or ⌘+Enter) adds the downloads.
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("add-form").requestSubmit();
  });
  $("settings-form").addEventListener("submit", applySettings);
  $("secret-form").addEventListener("submit", submitSecret);
  $("secret-dialog").addEventListener("cancel", (event) => event.preventDefault());
  $("detail-close").addEventListener("click", () => $("detail").close());
  $("detail").addEventListener("close", () => {
    const detail = app.detail;
    app.detail = null;
    const row = detail && app.rows.get(detail.gid);
    if (row && row.element.isConnected) row.name.focus();
    else if (detail) focusNear(detail.list, detail.index);
  });
  document.querySelector("main").addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    if (button.dataset.action) rowAction(button);
    else if (button.dataset.bulk) bulkAction(button.dataset.bulk);
    else if (button.dataset.page) {
      const group = button.dataset.page;
      app.pages[group] = Math.max(0, app.pages[group] + Number(button.dataset.step));
      schedulePoll(0);
    }
  });
  document.querySelector("main").addEventListener("change", (event) => {
    const box = event.target;
    if (box.classList.contains("select")) {
      const gid = box.closest(".item").dataset.gid;
      if (box.checked) app.selection.add(gid);
      else app.selection.delete(gid);
      renderBulk();
      const group = box.closest(".group").id.replace("group-", "");
      updateSelectAll(group, visible(group));
    } else if (box.classList.contains("select-all")) {
      const group = box.id.replace("select-", "");
      for (const view of visible(group)) {
        if (box.checked) app.selection.add(view.gid);
        else app.selection.delete(view.gid);
        app.rows.get(view.gid).box.checked = box.checked;
      }
      renderBulk();
    }
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) schedulePoll(0);
  });
}

wire();
perform(app.connection.start(app.secret !== ""));
