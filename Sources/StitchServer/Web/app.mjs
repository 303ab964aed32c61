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

const app = {
  secret: sessionStorage.getItem(SECRET_KEY) || "",
  socket: null,
  transport: "none", // "websocket", "http" or "none"
  nextID: 1,
  pending: new Map(),
  backoff: new L.Backoff(),
  reconnectTimer: 0,
  throttle: new L.Throttle(1000),
  pollTimer: 0,
  polling: false,
  polls: 0,
  sessionID: null,
  pages: { waiting: 0, stopped: 0 },
  totals: { active: 0, waiting: 0, stopped: 0 },
  rows: new Map(),
  selection: new Set(),
  detail: null,
  history: new L.SpeedHistory(60),
  settingsLoaded: false,
  waitingForSecret: false,
  lostSince: 0,
};

// ---- transport ---------------------------------------------------------------------------------------------

function rpcURL(scheme) {
  const secure = location.protocol === "https:";
  return `${scheme}${secure ? "s" : ""}://${location.host}/jsonrpc`;
}

/** One call, over the WebSocket when it is open, else over HTTP. Rejects with the RPC's error. */
function call(method, params = [], { token = true } = {}) {
  const id = `p${app.nextID++}`;
  const request = { jsonrpc: "2.0", id, method, params: token ? L.withToken(params, app.secret) : params };
  if (app.transport === "websocket" && app.socket && app.socket.readyState === WebSocket.OPEN) {
    return new Promise((resolve, reject) => {
      app.pending.set(id, { resolve, reject });
      app.socket.send(JSON.stringify(request));
    });
  }
  return httpCall(request);
}

async function httpCall(request) {
  const response = await fetch(rpcURL("http"), {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(request),
    cache: "no-store",
    credentials: "omit",
  });
  const reply = await response.json();
  if (reply.error) throw rpcError(reply.error);
  return reply.result;
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

function connect() {
  clearTimeout(app.reconnectTimer);
  setConnection("connecting", app.lostSince ? "Reconnecting…" : "Connecting…");
  let socket;
  try {
    socket = new WebSocket(rpcURL("ws"));
  } catch {
    fallBackToHTTP();
    return;
  }
  app.socket = socket;
  let opened = false;
  socket.addEventListener("open", () => {
    opened = true;
    app.transport = "websocket";
    established();
  });
  socket.addEventListener("message", (event) => onMessage(event.data));
  socket.addEventListener("close", () => {
    if (app.socket !== socket) return;
    app.socket = null;
    for (const { reject } of app.pending.values()) reject(new Error("the connection closed"));
    app.pending.clear();
    // A WebSocket that never opened: on a first visit, perhaps refused (too many clients) while HTTP works; after
    // losing the daemon, most likely the daemon is still away, and the next try is the WebSocket again.
    if (opened || app.lostSince) lost();
    else fallBackToHTTP();
  });
}

/** No WebSocket (refused, or too many clients): poll over HTTP while trying the WebSocket again later. */
async function fallBackToHTTP() {
  app.transport = "http";
  try {
    await call("aria2.getVersion");
  } catch (error) {
    if (L.isUnauthorized(error)) {
      askForSecret(true);
      return;
    }
    app.transport = "none";
    lost();
    return;
  }
  established();
  scheduleReconnect(); // the WebSocket is still wanted
}

async function established() {
  try {
    const [version, session] = await multicall([["aria2.getVersion", []], ["aria2.getSessionInfo", []]]);
    if (version instanceof Error) throw version;
    const restarted = app.sessionID !== null && session && session.sessionId !== app.sessionID;
    if (session && !(session instanceof Error)) app.sessionID = session.sessionId;
    app.backoff.reset();
    const wasLost = app.lostSince !== 0;
    app.lostSince = 0;
    app.waitingForSecret = false;
    setConnection("live", `Live · stitch ${version.version}${app.transport === "http" ? " (polling)" : ""}`);
    if (restarted) showNotice("The daemon restarted; the page is live again.", "info");
    else if (wasLost) showNotice("Connected again.", "info");
    app.settingsLoaded = false;
    schedulePoll(0);
  } catch (error) {
    if (L.isUnauthorized(error)) askForSecret(app.secret !== "");
    else lost();
  }
}

function lost() {
  if (!app.lostSince) app.lostSince = Date.now();
  if (app.transport === "websocket") app.transport = "none";
  scheduleReconnect();
}

function scheduleReconnect() {
  clearTimeout(app.reconnectTimer);
  const delay = app.backoff.next();
  if (app.transport !== "http") {
    const since = new Date(app.lostSince).toLocaleTimeString();
    setConnection("lost", `The daemon is not answering (since ${since}); trying again in ${(delay / 1000).toFixed(1)} s`);
  }
  app.reconnectTimer = setTimeout(connect, delay);
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
  if (app.transport === "none" || app.waitingForSecret) return;
  if (app.polling) {
    schedulePoll(100);
    return;
  }
  app.polling = true;
  app.throttle.ran(performance.now());
  app.polls += 1;
  document.body.dataset.polls = String(app.polls);
  try {
    await poll();
  } catch (error) {
    if (L.isUnauthorized(error)) askForSecret(true);
    else if (app.transport === "http") {
      app.transport = "none";
      lost();
    }
    // Over a WebSocket the close event reports a lost daemon.
  } finally {
    app.polling = false;
  }
  if (app.transport !== "none" && !app.waitingForSecret) schedulePoll(1000);
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
  const detail = app.detail;
  if (detail) calls.push(["aria2.tellStatus", [detail.gid, DETAIL_KEYS]]);
  if (!app.settingsLoaded) calls.push(["aria2.getGlobalOption", []]);
  const results = await multicall(calls);
  const [stat, active, waitingList, stoppedList] = results;
  for (const result of results) if (result instanceof Error && L.isUnauthorized(result)) throw result;
  if (!(stat instanceof Error)) {
    app.totals = { active: Number(stat.numActive), waiting: Number(stat.numWaiting), stopped: Number(stat.numStopped) };
    app.history.add(stat.downloadSpeed);
    renderGlobal(stat);
  }
  render({
    active: active instanceof Error ? [] : active,
    waiting: waitingList instanceof Error ? [] : waitingList,
    stopped: stoppedList instanceof Error ? [] : stoppedList,
  });
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
  return { gid: item.dataset.gid, action: element.dataset.action || "", select: element.classList.contains("select") };
}

/** Gives the focus back to the same control of the same row, or to the row's first button when that one went. */
function restoreFocus(control) {
  if (!control) return;
  const row = app.rows.get(control.gid);
  if (!row || !row.element.isConnected || row.element.contains(document.activeElement)) return;
  const again = control.select
    ? row.box
    : row.element.querySelector(`[data-action="${control.action}"]`) || row.actions.firstElementChild || row.name;
  again.focus();
}

function render(groups) {
  const control = focusedControl();
  const shown = new Set();
  for (const group of ["active", "waiting", "stopped"]) {
    const list = $(`list-${group}`);
    const statuses = groups[group];
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
    setText($("detail-line"), status.message);
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

async function perform(calls, what) {
  if (calls.length === 0) return;
  try {
    const results = calls.length === 1 ? [await call(...calls[0])] : await multicall(calls);
    const failures = results.filter((r) => r instanceof Error);
    if (failures.length) showNotice(`${what}: ${failures[0].message}`);
  } catch (error) {
    if (L.isUnauthorized(error)) askForSecret(true);
    else showNotice(`${what}: ${error.message}`);
  }
  schedulePoll(0);
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
  perform([[method, params]], `${ACTION_WORDS[action]} ${row.view.name}`);
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
  perform(L.callsForSelection(action, rows), `${ACTION_WORDS[action]} ${rows.length} downloads`);
  if (action === "remove") app.selection.clear();
}

function visible(group) {
  return [...$(`list-${group}`).children].map((li) => app.rows.get(li.dataset.gid)?.view).filter(Boolean);
}

function openDetail(gid, name) {
  app.detail = { gid, sample: null };
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
    if (L.isUnauthorized(error)) askForSecret(true);
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
    if (L.isUnauthorized(error)) askForSecret(true);
    message.dataset.kind = "error";
    message.textContent = error.message;
  }
  schedulePoll(0);
}

function askForSecret(rejected) {
  app.waitingForSecret = true;
  setConnection("secret", rejected ? "The secret was not accepted" : "This daemon needs its secret");
  $("secret-message").textContent = rejected
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
  app.secret = value;
  sessionStorage.setItem(SECRET_KEY, value);
  $("secret-input").value = "";
  $("secret-dialog").close();
  app.waitingForSecret = false;
  if (app.transport === "none") connect();
  else established();
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
    const gid = app.detail && app.detail.gid;
    app.detail = null;
    const row = gid && app.rows.get(gid);
    if (row) row.name.focus();
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
connect();
