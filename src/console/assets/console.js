// rebound's operator console. No framework, no build step: the DOM is built with createElement
// and textContent only (what the admin API returns is data, never markup), and every request goes
// to this origin's admin API with the token in a header. The token lives in `token` below and
// nowhere else.
"use strict";

const REFRESH_MS = 5000;
let token = null;
let timer = null;
let openGroup = null; // the group whose entries are shown: {key, title}
let entriesCursor = null;

const $ = (id) => document.getElementById(id);

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "onclick") e.addEventListener("click", v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

function utc(ms) {
  if (!ms) return "-";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19);
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 90) return s + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  if (s < 172800) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

class Refused extends Error {}

async function api(method, path) {
  const resp = await fetch(path, {
    method,
    headers: { Authorization: "Bearer " + token, Accept: "application/json" },
    cache: "no-store",
    credentials: "omit",
    redirect: "error",
  });
  if (resp.status === 401) throw new Refused("the token was refused");
  const body = await resp.json().catch(() => null);
  if (!resp.ok) {
    const msg = body && body.error && body.error.message ? body.error.message : resp.statusText;
    throw new Error(method + " " + path.split("?")[0] + ": " + resp.status + " " + msg);
  }
  return body;
}

function say(text, bad) {
  const r = $("result");
  r.textContent = text;
  r.className = bad ? "bad" : "";
}

// ---- signing in and out ----

function signIn(t) {
  token = t;
  api("GET", "/admin/fleet")
    .then((fleet) => {
      $("login").hidden = true;
      $("fleet").hidden = false;
      $("groups").hidden = false;
      $("signout").hidden = false;
      $("login-error").textContent = "";
      renderFleet(fleet);
      refresh();
    })
    .catch((e) => {
      token = null;
      $("login-error").textContent = e instanceof Refused ? "The token was refused." : String(e.message || e);
    });
}

function signOut(why) {
  token = null;
  clearTimeout(timer);
  for (const id of ["fleet", "groups", "entries", "entry", "signout"]) $(id).hidden = true;
  $("login").hidden = false;
  $("status").textContent = "not signed in";
  $("login-error").textContent = why || "";
  $("token").value = "";
}

async function refresh() {
  clearTimeout(timer);
  if (!token) return;
  try {
    const since = Date.now() - Number($("window").value);
    const [fleet, summary] = await Promise.all([
      api("GET", "/admin/fleet"),
      api("GET", "/admin/dead-letters/summary?since=" + since),
    ]);
    renderFleet(fleet);
    renderGroups(summary);
    $("status").textContent = "refreshed " + utc(Date.now()).slice(11) + " UTC, every " + REFRESH_MS / 1000 + " s";
  } catch (e) {
    if (e instanceof Refused) return signOut("The token was refused.");
    $("status").textContent = "refresh failed: " + (e.message || e);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

// ---- the fleet now ----

function renderFleet(f) {
  $("fleet-meta").textContent =
    "Redis " + f.redis + " · " + (f.requests_in_flight ?? 0) + " request(s) in flight · " + (f.dead_letters ?? 0) + " dead letter(s) held";
  const body = clear($("upstreams").tBodies[0]);
  for (const u of f.upstreams) {
    const targets = u.targets.map((t) => el("span", { class: "pill state-" + t.state }, t.route + ": " + t.state));
    const conc = u.concurrency.map((c) =>
      el("div", {}, (c.model || "(all)") + ": " + (c.limit ?? "?") + " / " + (c.in_flight ?? 0))
    );
    const minute = [];
    if (u.held_back) {
      const models = Object.entries(u.held_back_by_model || {}).map(([m, n]) => m + ": " + n);
      minute.push(u.held_back + " held back by a cooldown (" + models.join(", ") + ")");
    }
    if (u.failed_over) minute.push(u.failed_over + " failed over");
    if (u.limit_lowered) minute.push("limit lowered " + u.limit_lowered + "×");
    if (u.credential_expires_in_s !== null && u.credential_expires_in_s !== undefined) {
      minute.push("credential expires in " + Math.round(u.credential_expires_in_s) + " s");
    }
    body.append(
      el("tr", { class: "fleet-upstream", "data-upstream": u.name },
        el("td", {}, u.name),
        el("td", {}, el("span", { class: "pill circuit-" + (u.circuit || "none") }, u.circuit || "-")),
        el("td", {}, targets.length ? targets : "-"),
        el("td", {}, conc.length ? conc : "-"),
        el("td", {}, minute.length ? minute.join("; ") : "-"))
    );
  }
  const limits = clear($("limits").tBodies[0]);
  for (const l of f.limits) {
    const n = (k) => String(l.last_minute[k] || 0);
    limits.append(el("tr", {}, el("td", {}, l.name), el("td", {}, n("admitted")), el("td", {}, n("queued")), el("td", {}, n("rejected"))));
  }
  if (!f.limits.length) limits.append(el("tr", {}, el("td", { colspan: "4", class: "dim" }, "no limit decided anything")));
  const cont = Object.entries(f.continuations_last_minute || {}).map(([k, v]) => v + " " + k.replace(/_/g, " "));
  $("work").textContent =
    (f.jobs_unfinished ?? 0) + " job(s) queued or running · continuations in the last minute: " + (cont.length ? cont.join(", ") : "none");
  const events = clear($("events"));
  for (const e of f.events) events.append(el("li", { class: "event-" + e.kind }, e.upstream ? e.upstream + ": " + e.text : e.text));
  if (!f.events.length) events.append(el("li", { class: "dim" }, "nothing in the last 15 minutes"));
}

// ---- dead letters by cause ----

const VERDICTS = {
  replay: "replay",
  replay_with_care: "replay with care",
  wait: "wait",
  fix_app: "fix the app",
  not_replayable: "not replayable",
};

function timeline(g, window) {
  const max = Math.max(1, ...g.timeline);
  const bars = g.timeline.map((n, i) => {
    const bar = el("span", { title: n + " from " + utc(window.from_ms + i * window.bucket_ms) });
    bar.style.height = (n ? Math.max(8, Math.round((100 * n) / max)) : 0) + "%";
    return bar;
  });
  return el("div", { class: "timeline", "aria-label": "entries over the window" }, bars);
}

function renderGroups(s) {
  const list = clear($("group-list"));
  $("groups-meta").textContent = s.total + " entr" + (s.total === 1 ? "y" : "ies") + (s.truncated ? " (read stopped at its bound: oldest not counted)" : "");
  $("groups-empty").hidden = s.groups.length > 0;
  for (const g of s.groups) {
    const a = g.analysis || { verdict: "", line: "" };
    const title = g.route + " → " + g.upstream + " · " + g.reason + " · " + g.error_class + " · " + g.final_status;
    list.append(
      el("article", { class: "group", "data-key": g.key },
        el("div", { class: "group-head" },
          el("span", { class: "count" }, String(g.count)),
          el("div", { class: "cause" },
            el("div", { class: "title" }, title),
            g.message ? el("div", { class: "message" }, g.message) : null,
            el("div", { class: "dim" }, "first " + utc(g.first_seen_ms) + " · last " + utc(g.last_seen_ms) + " (" + ago(g.last_seen_ms) + ") · " +
              g.replayable + " with body · " + g.with_key + " with Idempotency-Key · " + g.replayed + " replayed")),
          el("span", { class: "verdict verdict-" + a.verdict }, VERDICTS[a.verdict] || a.verdict)),
        timeline(g, s.window),
        el("p", { class: "analysis" }, a.line),
        el("div", { class: "buttons" },
          el("button", { type: "button", class: "entries", onclick: () => showEntries(g.key, title, null) }, "Entries"),
          el("button", { type: "button", class: "replay", onclick: () => confirmReplay({ group: g.key }, title) }, "Replay group…"),
          el("button", { type: "button", class: "purge danger", onclick: () => confirmPurge(g.key, title, g.count) }, "Purge…")))
    );
  }
}

// ---- entries and one entry ----

async function showEntries(key, title, cursor) {
  try {
    const q = "group=" + encodeURIComponent(key) + "&limit=100" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    const page = await api("GET", "/admin/dead-letters?" + q);
    openGroup = { key, title };
    entriesCursor = page.next_cursor || null;
    $("entries").hidden = false;
    $("entries-title").textContent = title;
    const body = $("entry-table").tBodies[0];
    if (!cursor) clear(body);
    for (const e of page.items) {
      const last = e.replays.length ? e.replays[e.replays.length - 1] : null;
      body.append(
        el("tr", { class: "entry-row", "data-id": e.id },
          el("td", {}, utc(e.time_ms)),
          el("td", {}, e.method + " " + e.path),
          el("td", {}, String(e.final_status)),
          el("td", {}, String(e.attempts.length)),
          el("td", {}, e.idempotency_key || "-"),
          el("td", {}, last ? e.replays.length + " (last " + last.status + (last.from_store ? ", from store" : "") + ")" : "-"),
          el("td", {}, el("button", { type: "button", class: "open-entry", onclick: () => showEntry(e.id) }, "Open")))
      );
    }
    $("entries-more").hidden = !entriesCursor;
    $("entries").scrollIntoView({ block: "start" });
  } catch (e) {
    if (e instanceof Refused) return signOut("The token was refused.");
    say(String(e.message || e), true);
  }
}

function bodyText(e) {
  if (!e.body_kept || !e.body_base64) return e.body_missing || "(empty)";
  try {
    const bytes = Uint8Array.from(atob(e.body_base64), (c) => c.charCodeAt(0));
    const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch {
      return text;
    }
  } catch {
    return "(" + e.body_base64.length + " base64 characters)";
  }
}

async function showEntry(id) {
  try {
    const e = await api("GET", "/admin/dead-letters/" + encodeURIComponent(id));
    $("entry").hidden = false;
    $("entry-id").textContent = e.id;
    const facts = clear($("entry-facts"));
    const fact = (k, v) => facts.append(el("dt", {}, k), el("dd", {}, v === null || v === undefined || v === "" ? "-" : String(v)));
    fact("Time (UTC)", utc(e.time_ms));
    fact("Request", e.method + " " + e.path + (e.query ? "?" + e.query : ""));
    fact("Route → upstream", e.route + " → " + e.upstream);
    fact("Why it stopped", e.reason + " (" + e.error_class + "), the app got " + e.final_status);
    fact("Provider's message", e.error_message);
    fact("Idempotency-Key", e.idempotency_key);
    fact("Job", e.job_id);
    fact("Replays", e.replays.map((r) => utc(r.at_ms) + ": " + r.status + (r.from_store ? " (from store)" : "")).join("; "));
    const attempts = clear($("attempts").tBodies[0]);
    e.attempts.forEach((a, i) =>
      attempts.append(el("tr", {}, el("td", {}, String(i + 1)), el("td", {}, a.outcome), el("td", {}, a.status ?? "-"),
        el("td", {}, a.duration_ms + " ms"), el("td", {}, a.wait_ms ? a.wait_ms + " ms" : "-")))
    );
    const headers = clear($("entry-headers").tBodies[0]);
    for (const [k, v] of e.headers) headers.append(el("tr", {}, el("th", {}, k), el("td", {}, v)));
    $("entry-body").textContent = bodyText(e);
    $("entry-replay").onclick = () => confirmReplay({ id: e.id }, e.method + " " + e.path);
    $("entry").scrollIntoView({ block: "start" });
  } catch (err) {
    if (err instanceof Refused) return signOut("The token was refused.");
    say(String(err.message || err), true);
  }
}

// ---- replay and purge, after a confirmation that says what will happen ----

function ask(title, text, go, action) {
  const d = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-go").textContent = go;
  $("confirm-go").onclick = () => {
    d.close();
    action();
  };
  $("confirm-cancel").onclick = () => d.close();
  d.showModal();
}

async function confirmReplay(what, title) {
  try {
    let text;
    let path;
    if (what.group) {
      const q = "group=" + encodeURIComponent(what.group);
      const plan = await api("POST", "/admin/dead-letters/replay?dry_run=true&" + q);
      const lines = [
        title,
        "",
        plan.replayable + " request(s) will be sent, " + plan.with_key + " with their original Idempotency-Key" +
          (plan.without_key ? ", " + plan.without_key + " WITHOUT one (a replay of those may generate twice)" : "") + ":",
        ...plan.requests.map((r) => "  " + r.count + " × " + r.method + " " + r.path + " on route " + r.route),
      ];
      for (const [why, n] of Object.entries(plan.skipped)) lines.push(n + " skipped: " + why);
      lines.push("", plan.note);
      text = lines.join("\n");
      path = "/admin/dead-letters/replay?" + q;
    } else {
      text = title + "\n\nThis one request will be sent again through its route, with its original headers, body and Idempotency-Key.";
      path = "/admin/dead-letters/" + encodeURIComponent(what.id) + "/replay";
    }
    ask("Replay?", text, "Replay", async () => {
      try {
        const r = await api("POST", path);
        if (r.results) {
          say("Replayed " + r.replayed + ": " + r.succeeded + " succeeded, " + r.skipped + " skipped.");
        } else {
          say(r.error ? "Not replayed: " + r.error : "Replayed: " + r.status + (r.from_store ? " (answered from the idempotency store)" : ""), !!r.error);
        }
        refresh();
        if (openGroup) showEntries(openGroup.key, openGroup.title, null);
      } catch (e) {
        say(String(e.message || e), true);
      }
    });
  } catch (e) {
    if (e instanceof Refused) return signOut("The token was refused.");
    say(String(e.message || e), true);
  }
}

function confirmPurge(key, title, count) {
  ask("Purge?", title + "\n\n" + count + " dead letter(s) of this group will be deleted for good. Nothing is sent.", "Purge", async () => {
    try {
      const r = await api("DELETE", "/admin/dead-letters?group=" + encodeURIComponent(key));
      say("Purged " + r.purged + ".");
      if (openGroup && openGroup.key === key) $("entries").hidden = true;
      refresh();
    } catch (e) {
      say(String(e.message || e), true);
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    signIn($("token").value);
    $("token").value = "";
  });
  $("signout").addEventListener("click", () => signOut(""));
  $("window").addEventListener("change", refresh);
  $("entries-close").addEventListener("click", () => {
    $("entries").hidden = true;
    openGroup = null;
  });
  $("entries-more").addEventListener("click", () => openGroup && showEntries(openGroup.key, openGroup.title, entriesCursor));
  $("entry-close").addEventListener("click", () => ($("entry").hidden = true));
});
