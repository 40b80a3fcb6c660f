// The status page: lists resources under a prefix (GET /v1/resources) and
// follows their transitions live (GET /v1/watch, NDJSON over fetch so that the
// Authorization header can be sent, which EventSource cannot). Every event
// re-reads the listing, so the table never drifts from the coordinator's view.
// Names are shown with textContent only: they come from clients. Characters
// in them that are invisible or reorder the text around them are written out
// (`shown`), and names inside a line are isolated (<bdi>), so a name can
// neither pose as another nor turn the rest of a line around.
"use strict";

const LIST_LIMIT = 500;
const EVENTS_KEPT = 100;
const RETRY_MS = 1000;
const REFRESH_MS = 500;
const TOKEN_KEY = "leasefence.token";

const $ = (id) => document.getElementById(id);
let prefix = new URLSearchParams(location.search).get("prefix") || "";
let watchAbort = null;
let refreshTimer = null;
let rows = []; // [{cell, expiresAt}]
let listed = 0; // the latest listing asked for; older answers are dropped

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

// Unicode's Default_Ignorable_Code_Point (bidi controls, zero-width and other
// invisible characters) and the line and paragraph separators: the set that
// leasefence-core's `names::shown` writes out for the CLI, in the same form.
const HIDDEN =
  /[\u00AD\u034F\u061C\u115F\u1160\u17B4\u17B5\u180B-\u180F\u200B-\u200F\u2028-\u202E\u2060-\u206F\u3164\uFE00-\uFE0F\uFEFF\uFFA0\uFFF0-\uFFF8\u{1BCA0}-\u{1BCA3}\u{1D173}-\u{1D17A}\u{E0000}-\u{E0FFF}]/gu;

function shown(name) {
  return name.replace(HIDDEN, (c) => "\\u{" + c.codePointAt(0).toString(16) + "}");
}

// A name inside a line of text, isolated from the text around it.
function isolated(name) {
  const bdi = document.createElement("bdi");
  bdi.textContent = shown(name);
  return bdi;
}

function say(text, isError) {
  $("message").textContent = text;
  $("message").className = isError ? "error" : "";
}

function connection(state, text) {
  $("connection").dataset.state = state;
  $("connection").textContent = text;
}

// A refusal's JSON message, or the status line.
async function refusal(resp) {
  try {
    const body = await resp.json();
    return `${resp.status} ${body.error}: ${body.message}`;
  } catch (_) {
    return `${resp.status} ${resp.statusText}`;
  }
}

function cell(tr, cls, text) {
  const td = document.createElement("td");
  td.className = cls;
  td.textContent = text;
  tr.appendChild(td);
  return td;
}

function expiresText(row) {
  const left = row.expiresAt - performance.now();
  return left > 0 ? (left / 1000).toFixed(1) + " s" : "expiring";
}

function render(page) {
  const body = $("resources");
  body.replaceChildren();
  rows = [];
  for (const r of page.resources) {
    const tr = document.createElement("tr");
    const held = r.token !== null;
    tr.dataset.resource = r.resource;
    tr.dataset.state = held ? "held" : "free";
    cell(tr, "resource", shown(r.resource));
    cell(tr, "state", held ? "held" : "free");
    cell(tr, "holder", held ? shown(r.holder) : "—");
    cell(tr, "token", held ? String(r.token) : "—");
    const expires = cell(tr, "expires", "—");
    cell(tr, "waiters", String(r.waiters));
    cell(tr, "last", r.last_token === null ? "—" : String(r.last_token));
    if (held) {
      const row = { cell: expires, expiresAt: performance.now() + r.expires_in_ms };
      expires.textContent = expiresText(row);
      rows.push(row);
    }
    body.appendChild(tr);
  }
  const more = page.next_after !== null ? `, first ${page.resources.length} shown` : "";
  $("count").textContent = `(${page.resources.length}${more})`;
}

async function refresh() {
  const query = new URLSearchParams({ prefix, limit: String(LIST_LIMIT) });
  const mine = ++listed;
  try {
    const resp = await fetch("/v1/resources?" + query, { headers: authHeaders() });
    if (!resp.ok) {
      say(await refusal(resp), true);
      return;
    }
    const page = await resp.json();
    if (mine !== listed) return;
    render(page);
    say("", false);
  } catch (e) {
    say("cannot reach the coordinator: " + e.message, true);
  }
}

// At most one listing every REFRESH_MS however fast events come: a listing
// scans the coordinator's resources, so a busy one is not asked for more.
let lastRefresh = 0;
function refreshSoon() {
  if (refreshTimer !== null) return;
  const wait = Math.max(50, lastRefresh + REFRESH_MS - performance.now());
  refreshTimer = setTimeout(() => {
    refreshTimer = null;
    lastRefresh = performance.now();
    refresh();
  }, wait);
}

function showEvent(e) {
  const li = document.createElement("li");
  li.dataset.resource = e.resource;
  li.dataset.kind = e.kind;
  const kind = document.createElement("span");
  kind.className = "kind";
  kind.textContent = e.kind;
  li.append(`#${e.revision} `, kind, " ", isolated(e.resource), ` token ${e.token}`);
  if (e.holder) li.append(" by ", isolated(e.holder));
  const list = $("events");
  list.prepend(li);
  while (list.children.length > EVENTS_KEPT) list.lastElementChild.remove();
}

// Follows the watch stream until it ends, then reconnects (from now: the
// listing is re-read on connect, so nothing is missed in the table).
async function watch() {
  if (watchAbort) watchAbort.abort();
  const abort = new AbortController();
  watchAbort = abort;
  const query = new URLSearchParams({ prefix });
  try {
    const resp = await fetch("/v1/watch?" + query, { headers: authHeaders(), signal: abort.signal });
    if (!resp.ok) {
      say(await refusal(resp), true);
      // A refusal of the request (a bad prefix, a missing or wrong token)
      // waits for the user; a coordinator that cannot serve now is retried.
      if (resp.status < 500) {
        connection("down", "not watching");
        return;
      }
      throw new Error(`${resp.status}`);
    }
    connection("live", "live");
    refresh();
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const text = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (!text) continue;
        const msg = JSON.parse(text);
        if (msg.error) {
          say(`watch ended: ${msg.error}: ${msg.message}`, true);
        } else {
          showEvent(msg);
          refreshSoon();
        }
      }
    }
  } catch (e) {
    if (abort.signal.aborted) return;
    if (!$("message").textContent) say("watch failed: " + e.message, true);
  }
  if (watchAbort !== abort) return;
  connection("down", "reconnecting…");
  setTimeout(() => { if (watchAbort === abort) watch(); }, RETRY_MS);
}

function tick() {
  for (const row of rows) row.cell.textContent = expiresText(row);
  if (rows.some((r) => r.expiresAt < performance.now() - 500)) refreshSoon();
}

function start() {
  $("prefix").value = prefix;
  $("search").addEventListener("submit", (ev) => {
    ev.preventDefault();
    prefix = $("prefix").value;
    const url = new URL(location.href);
    if (prefix) url.searchParams.set("prefix", prefix); else url.searchParams.delete("prefix");
    history.replaceState(null, "", url);
    $("events").replaceChildren();
    watch();
  });
  $("auth").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = $("token").value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    $("token").placeholder = token ? "set (hidden)" : "none";
    watch();
  });
  if (sessionStorage.getItem(TOKEN_KEY)) $("token").placeholder = "set (hidden)";
  setInterval(tick, 250);
  watch();
}

start();
