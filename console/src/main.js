// The Diaspora admin console: sign-in, then pages over the relay's views, topics, metrics
// and operator actions (docs/console.md). Preact + htm render every value as text (no
// innerHTML anywhere), uPlot draws the charts.
import { h, render } from "preact";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import htm from "htm";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import "./app.css";
import { api, ApiError, browseTopic, exportTopic, followChanges, parseMetrics, subscribe, token, view } from "./api.js";

const html = htm.bind(h);

const PAGES = [
  ["overview", "Overview"],
  ["topics", "Topics"],
  ["tasks", "Workflows & tasks"],
  ["sites", "Sites"],
  ["actions", "Actions"],
  ["consumers", "Consumers"],
  ["training", "Training"],
];

const fmtTime = (us) => (us > 0 ? new Date(us / 1000).toLocaleTimeString() : "—");
const fmtNum = (x, d = 0) => (x == null || Number.isNaN(x) ? "—" : Number(x).toLocaleString(undefined, { maximumFractionDigits: d }));

// ---- shared state: the live change feed, a counter pages watch to reload --------------

let changeListeners = new Set();
// Since when the live feed is down (null while it is up): the banner and the alarms say so.
const relayDown = { since: null };
function useChanges(filter) {
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let pending = null;
    const f = (c) => {
      if (!c.reset && filter && !filter(c)) return;
      if (pending) return;
      pending = setTimeout(() => {
        pending = null;
        setTick((t) => t + 1);
      }, 150);  // a burst of changes: one reload
    };
    changeListeners.add(f);
    return () => {
      changeListeners.delete(f);
      clearTimeout(pending);
    };
  }, []);
  return tick;
}

function useLoad(fn, deps) {
  const [state, setState] = useState({ data: null, error: null });
  useEffect(() => {
    let live = true;
    fn().then(
      (data) => live && setState({ data, error: null }),
      (error) => live && setState((s) => ({ data: s.data, error })),
    );
    return () => (live = false);
  }, deps);
  return state;
}

function ErrorLine({ error }) {
  if (!error) return null;
  const need = error.status === 403 ? " (this page needs more than your token's scopes)" : "";
  return html`<p class="error" role="alert">${error.message}${need}</p>`;
}

// ---- sign-in -----------------------------------------------------------------------------

// The run of a workflow has ended (every engine closed its plugin): its pages keep the last
// state it reached and say so.
function RunEnded({ workflow }) {
  if (!workflow?.ended_us) return null;
  return html`<p class="banner warn" role="status" id="run-ended">${`The run of ${workflow.workflow} ended at ${fmtTime(workflow.ended_us)} ` +
    "(every engine closed its plugin): this is the last state it reached. An action now waits for the next run's engine."}</p>`;
}

// "1 action", "2 actions".
const count = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`;

function SignIn({ onDone, message }) {
  const [value, setValue] = useState("");
  const [error, setError] = useState(message || "");
  async function submit(e) {
    e.preventDefault();
    token.set(value);
    try {
      await view("workflows", { limit: 1 });
      onDone();
    } catch (err) {
      token.clear();
      setError(err instanceof ApiError && err.status === 401 ? `The relay refused this token: ${err.message}` : err.message);
    }
  }
  return html`<main class="signin">
    <h1>Diaspora console</h1>
    <form onSubmit=${submit}>
      <label for="token">Bearer token</label>
      <textarea id="token" rows="4" autocomplete="off" spellcheck="false" value=${value}
        onInput=${(e) => setValue(e.target.value)} placeholder="diaspora token issue --scope admin ..."></textarea>
      <button type="submit" disabled=${!value.trim()}>Sign in</button>
      ${error && html`<p class="error" role="alert" id="signin-error">${error}</p>`}
      <p class="hint">Kept in this tab's session storage only. Pages show what the token's scopes allow.</p>
    </form>
  </main>`;
}

// ---- overview ------------------------------------------------------------------------------

function Overview() {
  const [rates, setRates] = useState(null);
  const [err, setErr] = useState(null);
  const last = useRef(null);
  useEffect(() => {
    let live = true;
    async function poll() {
      try {
        const m = parseMetrics(await api("/metrics"));
        const now = performance.now();
        if (last.current) {
          const dt = (now - last.current.t) / 1000;
          const fs = m.diaspora_relay_fsync_seconds_count - (last.current.m.diaspora_relay_fsync_seconds_count || 0);
          const fsum = m.diaspora_relay_fsync_seconds_sum - (last.current.m.diaspora_relay_fsync_seconds_sum || 0);
          live && setRates({
            in: (m.diaspora_relay_events_in_total - last.current.m.diaspora_relay_events_in_total) / dt,
            out: (m.diaspora_relay_events_out_total - last.current.m.diaspora_relay_events_out_total) / dt,
            fsync_ms: fs > 0 ? (fsum / fs) * 1000 : 0,
            connections: m.diaspora_relay_connections,
            websockets: m.diaspora_relay_websockets,
            refusals: m.diaspora_relay_auth_refusals_total,
            slow: m.diaspora_relay_slow_consumer_disconnects_total,
          });
        }
        last.current = { t: now, m };
        setErr(null);
      } catch (e) {
        live && setErr(e);
      }
    }
    poll();
    const id = setInterval(poll, 2000);
    return () => {
      live = false;
      clearInterval(id);
    };
  }, []);
  const tick = useChanges((c) => c.view === "workflows");
  const wfs = useLoad(() => view("workflows", { limit: 100 }), [tick]);
  // The log's size: every 10 s is plenty (on every change it was asked twice a second).
  const [slow, setSlow] = useState(0);
  useEffect(() => {
    const id = setInterval(() => setSlow((n) => n + 1), 10_000);
    return () => clearInterval(id);
  }, []);
  const topics = useLoad(() => api("/api/v1/topics"), [slow]);
  const disk = topics.data ? topics.data.topics.reduce((a, t) => a + t.bytes, 0) : null;
  const expired = useLoad(() => view("actions", { status: "expired", limit: 1 }), [tick]);
  const spent = useLoad(() => view("actions", { budget_spent: "true", limit: 5 }), [tick]);
  const alarms = [];
  if (relayDown.since || err?.status === 0)
    alarms.push(`The relay cannot be reached${relayDown.since ? " since " + new Date(relayDown.since).toLocaleTimeString() : ""}: what is shown is the last state seen`);
  if (rates?.slow) alarms.push(`${count(rates.slow, "slow subscriber")} disconnected`);
  for (const w of wfs.data?.items || []) {
    if ((w.states.failed || 0) > 0) alarms.push(`${w.workflow}: ${count(w.states.failed, "failed task instance")}`);
    if ((w.states.recovering || 0) > 0) alarms.push(`${w.workflow}: ${count(w.states.recovering, "task instance")} recovering (a restart or migration under way)`);
  }
  if (expired.data?.total > 0) alarms.push(`${count(expired.data.total, "action")} no engine answered (Actions page, status expired)`);
  if (spent.data?.total > 0) {
    const named = spent.data.items.map((a) => `${a.workflow}/${a.task_id || a.site} (${a.policy || "a policy"})`).join(", ");
    alarms.push(`${count(spent.data.total, "policy budget")} spent, nothing more will be done for ${spent.data.total === 1 ? "it" : "them"}: ${named}${spent.data.total > spent.data.items.length ? ", …" : ""}`);
  }
  return html`<section>
    <h2>Overview</h2>
    <${ErrorLine} error=${err} />
    <div class="cards">
      <div class="card"><span>Events in /s</span><strong data-k="in">${fmtNum(rates?.in, 1)}</strong></div>
      <div class="card"><span>Events out /s</span><strong data-k="out">${fmtNum(rates?.out, 1)}</strong></div>
      <div class="card"><span>fsync mean</span><strong>${rates ? fmtNum(rates.fsync_ms, 2) + " ms" : "—"}</strong></div>
      <div class="card"><span>Connections</span><strong>${fmtNum(rates?.connections)} (${fmtNum(rates?.websockets)} WebSocket)</strong></div>
      <div class="card"><span>Log on disk</span><strong>${disk == null ? "—" : fmtNum(disk / 1e6, 1) + " MB"}</strong></div>
      <div class="card"><span>Token refusals</span><strong>${fmtNum(rates?.refusals)}</strong></div>
    </div>
    <h3>Alarms</h3>
    ${alarms.length ? html`<ul class="alarms">${alarms.map((a) => html`<li>${a}</li>`)}</ul>` : html`<p>None.</p>`}
    <h3>Workflows</h3>
    <${ErrorLine} error=${wfs.error} />
    <div class="scroll"><table>
      <thead><tr><th>Workflow</th><th>Events</th><th>Pending</th><th>Running</th><th>Recovering</th><th>Completed</th><th>Failed</th><th>Anomalies</th><th>Last event</th><th>Run ended</th></tr></thead>
      <tbody>${(wfs.data?.items || []).map((w) => html`<tr>
        <td><a href="#/tasks?workflow=${encodeURIComponent(w.workflow)}">${w.workflow}</a></td><td>${fmtNum(w.events)}</td>
        <td>${w.states.pending || 0}</td><td>${w.states.running || 0}</td><td>${w.states.recovering || 0}</td><td>${w.states.completed || 0}</td>
        <td>${w.states.failed || 0}</td><td>${w.anomalies}</td><td>${fmtTime(w.last_us)}</td>
        <td>${w.ended_us ? fmtTime(w.ended_us) : "—"}</td></tr>`)}</tbody>
    </table></div>
  </section>`;
}

// ---- topics: list, browse, live tail ----------------------------------------------------

function retention(t) {
  const parts = [];
  if (t.retention_age_s > 0) parts.push(t.retention_age_s % 86400 === 0 ? `${t.retention_age_s / 86400} d` : `${fmtNum(t.retention_age_s / 3600, 1)} h`);
  if (t.retention_bytes > 0) parts.push(`${fmtNum(t.retention_bytes / 2 ** 20, 0)} MiB`);
  return parts.length ? parts.join(" or ") : "unlimited";
}

// What the Topics page browses, kept in the URL (#/topics?topic=…&from=…): a search can be
// bookmarked, shared and reloaded. `start` is newest | earliest | offset | time.
const BROWSE_KEYS = ["topic", "start", "offset", "time", "dir", "id", "type", "source", "subject", "q", "limit"];
const FILTER_KEYS = ["id", "type", "source", "subject", "q"];

function browseFromUrl() {
  const q = query();
  const b = { start: "newest", dir: "", limit: "100" };
  for (const k of BROWSE_KEYS) if (q.get(k) != null) b[k] = q.get(k);
  return b;
}

function saveBrowse(b) {
  const q = new URLSearchParams(Object.entries(b).filter(([k, v]) => BROWSE_KEYS.includes(k) && v !== "" && v != null));
  history.replaceState(null, "", `#/topics?${q}`);
}

// The relay's parameters for a browse (docs/protocol.md, "Browsing a topic").
function browseParams(b) {
  const p = { limit: b.limit || 100 };
  if (b.start === "earliest") p.from = "earliest";
  else if (b.start === "offset") p.from = b.offset;
  else if (b.start === "time" && b.time) p.from_time = new Date(b.time).toISOString();
  if (b.dir) p.direction = b.dir;
  for (const k of FILTER_KEYS) if (b[k]) p[k] = b[k];
  return p;
}

// The live tail's filter: the relay's rules (case ignored; id exact; q anywhere).
function passes(e, b) {
  const has = (v, n) => !n || String(v ?? "").toLowerCase().includes(n.toLowerCase());
  return (!b.id || e.event.id === b.id) && has(e.event.type, b.type) && has(e.event.source, b.source) &&
    (!b.subject || has(e.event.subject, b.subject)) && (!b.q || has(JSON.stringify(e.event), b.q));
}

// Publishes a stored event again (POST /api/v1/topics/{to}/republish): under a new id and a
// source naming the operator, to its own topic or another.
function Republish({ topic, offset }) {
  const [open, setOpen] = useState(false);
  const [to, setTo] = useState(topic);
  const [result, setResult] = useState(null);
  async function send(e) {
    e.preventDefault();
    try {
      const r = await api(`/api/v1/topics/${encodeURIComponent(to)}/republish`, { method: "POST", body: { from_topic: topic, offset } });
      setResult({ ok: true, text: `Published again as ${r.id}, offset ${r.offset} of ${r.topic}` });
    } catch (err) {
      setResult({ ok: false, text: err.message });
    }
  }
  if (!open) return html`<button onClick=${() => setOpen(true)}>Publish again…</button>`;
  return html`<form class="filters republish" onSubmit=${send}>
    <label>To topic <input name="republish-to" value=${to} onInput=${(e) => setTo(e.target.value)} /></label>
    <button type="submit" class="danger">Publish under a new id</button>
    ${result && html`<span class=${result.ok ? "ok" : "error"} role="status" id="republish-result">${result.text}</span>`}
  </form>`;
}

function Topics() {
  const list = useLoad(() => api("/api/v1/topics"), []);
  const [b, setB] = useState(browseFromUrl);
  const [page, setPage] = useState(null);  // the relay's answer to the last browse
  const [tail, setTail] = useState(null);  // live tail: { events, state }
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const [note, setNote] = useState("");
  const [detail, setDetail] = useState(null);
  const set = (k) => (e) => setB({ ...b, [k]: e.target.value });

  async function search(over = {}) {
    const next = { ...b, ...over };
    setB(next);
    saveBrowse(next);
    setTail(null);
    setDetail(null);
    if (!next.topic) return;
    setBusy(true);
    try {
      setPage(await browseTopic(next.topic, browseParams(next)));
      setError(null);
    } catch (err) {
      setError(err);
    }
    setBusy(false);
  }
  useEffect(() => void (b.topic && search()), []);  // a search saved in the URL runs on load

  useEffect(() => {
    if (!tail || !b.topic) return;
    return subscribe(b.topic, "latest", (evs) => setTail((t) => t && { ...t, events: [...evs.reverse(), ...t.events].slice(0, 500) }),
      (state) => setTail((t) => t && { ...t, state }));
  }, [tail === null, b.topic]);

  const open = (name, start) => search({ topic: name, start, offset: "", time: "", dir: "" });
  const rows = tail ? tail.events.filter((e) => passes(e, b)) : page?.events || [];
  const sc = page?.scanned;
  // The pages on either side of this one: the scan's own direction goes on from `next`.
  const older = page && (page.direction === "backward" ? page.next != null && { start: "offset", offset: String(page.next), dir: "backward" }
    : sc?.low > page.first_offset && { start: "offset", offset: String(sc.low - 1), dir: "backward" });
  const newer = page && (page.direction === "forward" ? !page.reached_end && { start: "offset", offset: String(page.next), dir: "forward" }
    : sc?.high != null && sc.high + 1 < page.end_offset && { start: "offset", offset: String(sc.high + 1), dir: "forward" });
  async function save(format) {
    try {
      setNote(`Saved ${await exportTopic(b.topic, browseParams(b), format)}`);
    } catch (err) {
      setError(err);
    }
  }
  return html`<section>
    <h2>Topics</h2>
    <${ErrorLine} error=${list.error} />
    <div class="scroll"><table>
      <thead><tr><th>Topic</th><th>Offsets</th><th>Size</th><th>Segments</th><th>Retention</th><th></th></tr></thead>
      <tbody>${(list.data?.topics || []).map((t) => html`<tr>
        <td>${t.name}</td><td>${fmtNum(t.first_offset)} – ${fmtNum(t.next_offset)}</td><td>${fmtNum(t.bytes / 1024, 1)} KiB</td>
        <td>${t.segments}</td><td>${retention(t)}</td>
        <td><button onClick=${() => open(t.name, "newest")}>Newest</button>
            <button onClick=${() => open(t.name, "earliest")}>From the start</button>
            <button onClick=${() => { setB({ ...b, topic: t.name }); setPage(null); setTail({ events: [], state: "connecting" }); }}>Live tail</button></td>
      </tr>`)}</tbody>
    </table></div>
    ${list.data && !list.data.topics.length && html`<p>No topic this token may read.</p>`}
    ${b.topic && html`<div class="tail">
      <h3>${b.topic} <small>${tail ? `live tail; ${tail.state}` : b.start === "offset" ? `from offset ${b.offset}` :
        b.start === "time" ? `from ${b.time ? new Date(b.time).toLocaleString() : "a time"}` : b.start === "earliest" ? "from the start" : "newest first"}</small></h3>
      <form class="filters browse" onSubmit=${(e) => { e.preventDefault(); search(); }}>
        <label>Start <select name="start" value=${b.start} onChange=${(e) => setB({ ...b, start: e.target.value, dir: "" })}>
          <option value="newest">newest</option><option value="earliest">the start</option>
          <option value="offset">an offset</option><option value="time">a time</option></select></label>
        ${b.start === "offset" && html`<label>Offset <input name="offset" inputmode="numeric" value=${b.offset || ""} onInput=${set("offset")} /></label>`}
        ${b.start === "time" && html`<label>Time <input name="from-time" type="datetime-local" step="1" value=${b.time || ""} onInput=${set("time")} /></label>`}
        <label>Direction <select name="direction" value=${b.dir} onChange=${set("dir")}>
          <option value="">default</option><option value="forward">forward</option><option value="backward">backward</option></select></label>
        ${FILTER_KEYS.map((k) => html`<label>${k === "q" ? "text" : k}
          <input name=${"filter-" + k} value=${b[k] || ""} onInput=${set(k)} /></label>`)}
        <label>Limit <input name="limit" inputmode="numeric" size="5" value=${b.limit} onInput=${set("limit")} /></label>
        <button type="submit" disabled=${busy}>${busy ? "Searching…" : "Search"}</button>
      </form>
      <${ErrorLine} error=${error} />
      ${page && !tail && html`<p id="scan-status" role="status">${sc?.records
        ? `Scanned offsets ${fmtNum(sc.low)}–${fmtNum(sc.high)} (${fmtNum(sc.records)} records): ${fmtNum(page.events.length)} found`
        : page.direction === "forward" ? `Nothing stored from offset ${fmtNum(page.next)} on yet` : "Nothing stored there"}${page.limited_by_scan ? `; stopped after ${fmtNum(page.max_scan)} records, search on for more` : ""}${page.reached_end ? (page.direction === "backward" ? "; the topic's first offset reached" : "; the end reached") : ""}.${" "}
        <span class="buttons">
          <button disabled=${!older} onClick=${() => search(older)}>‹ Older</button>
          <button disabled=${!newer} onClick=${() => search(newer)}>Newer ›</button>
          <button onClick=${() => save("jsonl")}>Export JSON lines</button>
          <button onClick=${() => save("csv")}>Export CSV</button>
        </span>${note && html` <span class="ok">${note}</span>`}</p>`}
      <div class="scroll"><table class="events">
        <thead><tr><th>Offset</th><th>Type</th><th>Source</th><th>Subject</th><th>Time</th></tr></thead>
        <tbody>${rows.map((e) => html`<tr tabindex="0" class="event-row" onClick=${() => setDetail(e)}
            onKeyDown=${(k) => k.key === "Enter" && setDetail(e)}>
          <td>${e.offset}</td><td>${e.event.type}</td><td>${e.event.source}</td><td>${e.event.subject || ""}</td><td>${e.event.time || ""}</td></tr>`)}</tbody>
      </table></div>
      ${detail && html`<aside class="detail" aria-label="Event detail"><h4>Event ${detail.offset}</h4>
        <button autofocus onClick=${() => setDetail(null)}>Close</button>
        <${Republish} topic=${b.topic} offset=${detail.offset} key=${detail.offset} />
        <pre id="event-detail">${JSON.stringify(detail.event, null, 2)}</pre></aside>`}
    </div>`}
  </section>`;
}

// ---- workflows and tasks: table, per-site timeline, operator actions ----------------------

function query() {
  return new URLSearchParams(location.hash.split("?")[1] || "");
}

// Sends an operator's action; what the dialog shows: the action id, or the relay's refusal.
async function sendAction(body) {
  try {
    const r = await api("/api/v1/actions", { method: "POST", body });
    // Nobody reading the control topic: the action waits there for nobody (a run that ended).
    return r.warning ? { ok: false, warn: true, text: `Sent: ${r.action_id} on ${r.topic}, but ${r.warning}` }
      : { ok: true, text: `Sent: ${r.action_id} on ${r.topic}` };
  } catch (err) {
    return { ok: false, text: err.status === 403 ? `Refused by the relay (403): ${err.message}` : err.message };
  }
}

// Before sending: does an engine read the control topic the action would go to? (POST with
// dry_run: checked by the relay like the real one, nothing appended.) Its warning, or null.
function useReaders(body) {
  const [warning, setWarning] = useState(null);
  useEffect(() => {
    api("/api/v1/actions", { method: "POST", body: { ...body, dry_run: true } }).then((r) => setWarning(r.warning || null), () => setWarning(null));
  }, []);
  return warning;
}

const Readers = ({ warning }) => warning && html`<p class="warn" id="readers-warning">Before you send it: ${warning}.</p>`;

function ActionDialog({ task, sites, ended, onClose }) {
  const [kind, setKind] = useState("restart");
  const [target, setTarget] = useState("");
  const [reason, setReason] = useState("");
  const [result, setResult] = useState(null);
  const readers = useReaders({ workflow: task.workflow, action: "restart", task_id: task.task_id, reason: "check" });
  const ref = useRef();
  useEffect(() => ref.current?.showModal?.(), []);
  async function confirm(e) {
    e.preventDefault();
    const body = { workflow: task.workflow, action: kind, task_id: task.task_id, reason: reason || `operator ${kind}` };
    if (kind === "migrate") body.target_site = target;
    setResult(await sendAction(body));
  }
  return html`<dialog ref=${ref} class="action-dialog" onClose=${onClose}>
    <form onSubmit=${confirm}>
      <h3>Act on ${task.task_id}</h3>
      <label>Action <select name="action" value=${kind} onChange=${(e) => setKind(e.target.value)}>
        ${["restart", "migrate", "cancel", "checkpoint", "speculate"].map((k) => html`<option value=${k}>${k}</option>`)}
      </select></label>
      ${kind === "migrate" && html`<label>To site <select name="target" value=${target} onChange=${(e) => setTarget(e.target.value)}>
        <option value="">choose…</option>${sites.filter((s) => s !== task.site).map((s) => html`<option value=${s}>${s}</option>`)}</select></label>`}
      <label>Reason <input name="reason" value=${reason} onInput=${(e) => setReason(e.target.value)} /></label>
      <p>This ${kind} goes to the engine of ${task.workflow} (${task.engine || "unknown engine"}) and is recorded with your token's name.</p>
      ${ended ? html`<p class="warn" id="run-ended-warning">The run of ${task.workflow} ended at ${fmtTime(ended)}: no engine of it reads its control topic now; this ${kind} waits for the next run's engine.</p>`
        : html`<${Readers} warning=${readers} />`}
      ${["completed", "failed", "cancelled"].includes(task.state) && html`<p class="warn" id="action-warning">${task.task_id} has ${task.state}${task.end_us ? ` (at ${fmtTime(task.end_us)})` : ""}: ${kind === "restart" ? "a restart runs it again, if its engine still runs" : `a ${kind} may find nothing to act on`}.</p>`}
      <div class="buttons">
        <button type="submit" class="danger" disabled=${kind === "migrate" && !target}>Confirm ${kind}</button>
        <button type="button" onClick=${() => ref.current.close()}>Close</button>
      </div>
      ${result && html`<p class=${result.ok ? "ok" : result.warn ? "warn" : "error"} role="status" id="action-result">${result.text}</p>`}
    </form>
  </dialog>`;
}

// A fault report that says the fault is over: the resource back up, or the fault's value 0.
const faultEnded = (f) => f.state === "up" || f.value === 0;

function Timeline({ tasks, actions, faults = [] }) {
  const rows = useMemo(() => {
    const by = new Map();
    let t0 = Infinity, t1 = 0;
    for (const t of tasks)
      for (const a of t.attempts) {
        if (!a.site) continue;
        const end = a.end_us || t.last_heartbeat_us || a.start_us;
        t0 = Math.min(t0, a.start_us);
        t1 = Math.max(t1, end, t.anomaly_us || 0);
        if (!by.has(a.site)) by.set(a.site, []);
        by.get(a.site).push({ task: t, a, end });
      }
    for (const x of actions) t1 = Math.max(t1, x.requested_us);
    for (const f of faults) if (by.has(f.site)) t1 = Math.max(t1, f.t_us);
    return { by: [...by.entries()].sort(), t0, t1: Math.max(t1, t0 + 1) };
  }, [tasks, actions, faults]);
  if (!rows.by.length) return html`<p>No attempts yet.</p>`;
  const pos = (us) => `${(100 * (us - rows.t0)) / (rows.t1 - rows.t0)}%`;
  return html`<div class="timeline" aria-label="Attempts per site over time">
    ${rows.by.map(([site, bars]) => html`<div class="lane"><span class="lane-name">${site}</span><div class="lane-track">
      ${bars.map(({ task, a, end }) => html`<span class=${"bar " + a.outcome} style=${{ left: pos(a.start_us), width: `max(3px, ${(100 * (end - a.start_us)) / (rows.t1 - rows.t0)}%)` }}
        title=${`${task.task_id} attempt ${a.attempt}: ${a.outcome}${a.reason ? " — " + a.reason : ""}`}></span>`)}
      ${tasks.filter((t) => t.anomaly_us && t.site === site).map((t) => html`<span class="mark anomaly" style=${{ left: pos(t.anomaly_us) }}
        title=${`anomaly ${t.anomaly_score.toFixed(2)} on ${t.task_id}: ${t.anomaly_explanation}`}>◆</span>`)}
      ${actions.filter((x) => x.site === site || x.target_site === site).map((x) => html`<span class="mark action" style=${{ left: pos(x.requested_us) }}
        title=${`${x.action} ${x.task_id} (${x.origin}): ${x.reason}`}>▲</span>`)}
      ${faults.filter((f) => f.site === site && f.t_us >= rows.t0).map((f) => html`<span class="mark fault" style=${{ left: pos(f.t_us) }}
        title=${`fault ${f.fault} on ${f.resource}: ${f.state}${f.value !== 1 && f.value !== 0 ? ` (${fmtNum(f.value, 2)})` : ""}${faultEnded(f) ? " (ended)" : ""}`}>${faultEnded(f) ? "✓" : "⚡"}</span>`)}
    </div></div>`)}
    <div class="lane axis" aria-hidden="true"><span class="lane-name">time</span><div class="axis-track">
      ${[0, 0.25, 0.5, 0.75, 1].map((f) => html`<span class="tick" style=${{ left: `${100 * f}%` }}>${
        new Date((rows.t0 + f * (rows.t1 - rows.t0)) / 1000).toLocaleTimeString()}${f > 0 ? ` (+${fmtNum((f * (rows.t1 - rows.t0)) / 1e6, 0)} s)` : ""}</span>`)}
    </div></div>
    <p class="legend"><span class="bar completed"></span> completed <span class="bar failed"></span> failed${" "}<span class="bar running"></span> running${" "}<span class="bar cancelled"></span> stopped ◆ anomaly ▲ action ⚡ fault (✓ ended)</p>
  </div>`;
}

// An incident per task instance that actions named (a copy "ID@copyN" is its original's):
// the evidence (its failed attempts, its last anomaly, what the first decision saw), each
// decision with its outcome, and how the instance ended.
const instanceOf = (id) => id.split("@copy")[0];

function Incidents({ tasks, actions }) {
  const groups = useMemo(() => {
    const by = new Map();
    for (const a of [...actions].sort((x, y) => x.requested_us - y.requested_us)) {
      if (!a.task_id) continue;
      const id = instanceOf(a.task_id);
      if (!by.has(id)) by.set(id, []);
      by.get(id).push(a);
    }
    return [...by.entries()].map(([id, acts]) => {
      const runs = tasks.filter((t) => t.task_id === id || t.task_id.startsWith(id + "@copy"));
      const evidence = [];
      for (const t of runs)
        for (const a of t.attempts)
          if (a.outcome === "failed") evidence.push(`${t.task_id} attempt ${a.attempt} on ${a.site} failed${a.reason ? ": " + a.reason : ""}`);
      const first = acts[0].reason || "";
      if (first) evidence.push(first.split("; ")[0]);
      const won = runs.find((t) => t.state === "completed");
      const live = runs.find((t) => t.state === "running" || t.state === "pending");
      const outcome = won ? `completed on ${won.site}${won.task_id !== id ? " (by its copy " + won.task_id + ")" : ""}`
        : live ? `${live.state} on ${live.site || "?"}` : runs.length ? runs[0].state : "unknown";
      return { id, acts, evidence, outcome, ok: !!won };
    });
  }, [tasks, actions]);
  if (!groups.length) return html`<p>None: no action named a task.</p>`;
  return html`<div class="scroll"><table class="incidents">
    <thead><tr><th>Instance</th><th>Evidence</th><th>Decisions</th><th>Outcome</th></tr></thead>
    <tbody>${groups.map((g) => html`<tr data-incident=${g.id}>
      <td>${g.id}</td><td>${g.evidence.map((e) => html`<div>${e}</div>`)}</td>
      <td>${g.acts.map((a) => html`<div>${fmtTime(a.requested_us)} ${a.action}${a.target_site ? " → " + a.target_site : ""}
        (${a.policy || a.origin}) <span class=${"state " + a.status}>${a.status}</span></div>`)}</td>
      <td><span class=${"state " + (g.ok ? "completed" : "failed")}>${g.outcome}</span></td></tr>`)}</tbody>
  </table></div>`;
}

// One task instance in full (#/tasks?workflow=…&task=…): every attempt with its site,
// worker, times, outcome and reason; the actions that named it (its incident: what each
// decided, why, how it ended); the last anomaly prediction about it and its explanation;
// its last metrics; a link to its events on the Topics page.
function TaskDetail({ task: t, actions, onClose }) {
  const mine = actions.filter((a) => a.task_id === t.task_id).sort((x, y) => x.requested_us - y.requested_us);
  const dur = (a, b) => (a && b ? `${fmtNum((b - a) / 1e6, 1)} s` : "");
  const events = `#/topics?${new URLSearchParams({ topic: `${t.workflow}.events`, start: "earliest", subject: t.task_id })}`;
  const ref = useRef();
  useEffect(() => ref.current?.focus(), [t.task_id]);
  return html`<aside class="detail task-detail" aria-label=${"Task " + t.task_id} tabindex="-1" ref=${ref}>
    <h4>${t.task_id} <span class=${"state " + t.state}>${t.state}</span></h4>
    <button onClick=${onClose}>Close</button> <a href=${events}>Its events</a>
    <p class="task-summary">${[
      `${t.name} on ${t.site || "no site yet"}${t.worker ? ` (${t.worker})` : ""}, engine ${t.engine || "unknown"}; attempt ${t.attempt}; `,
      `submitted ${fmtTime(t.submitted_us)}${t.started_us ? `, started ${fmtTime(t.started_us)}` : ""}${t.ended_us ? `, ended ${fmtTime(t.ended_us)}` : ""}; `,
      `progress ${Math.round(t.progress * 100)}%${t.last_heartbeat_us ? `; last heartbeat ${fmtTime(t.last_heartbeat_us)}` : ""}.`].join("")}
      ${t.reason && html`<br />Reason: ${t.reason}`}</p>
    <h5>Attempts</h5>
    <table class="attempts"><thead><tr><th>#</th><th>Site</th><th>Worker</th><th>Started</th><th>Took</th><th>Outcome</th><th>Reason</th></tr></thead>
      <tbody>${t.attempts.map((a) => html`<tr data-attempt=${a.attempt}><td>${a.attempt}</td><td>${a.site}</td><td>${a.worker}</td>
        <td>${fmtTime(a.start_us)}</td><td>${dur(a.start_us, a.end_us)}</td>
        <td><span class=${"state " + a.outcome}>${a.outcome}</span></td><td>${a.reason}</td></tr>`)}</tbody></table>
    <h5>Incident</h5>
    ${mine.length ? html`<ul class="incident">${mine.map((a) => html`<li>${fmtTime(a.requested_us)} <b>${a.action}</b>${
      (a.target_site ? " → " + a.target_site : "") + ` by ${a.policy ? `policy ${a.policy}` : a.origin}: `}<span class=${"state " + a.status}>${a.status}</span>${
      a.message ? ` (${a.message})` : ""}${a.reason && html`<div class="hint">${a.reason}</div>`}</li>`)}</ul>` : html`<p>No action named it.</p>`}
    <h5>Anomaly</h5>
    <p>${t.anomaly_score >= 0 ? `score ${t.anomaly_score.toFixed(2)} at ${fmtTime(t.anomaly_us)}: ${t.anomaly_explanation || "no explanation"}` : "No prediction about it."}</p>
    ${Object.keys(t.metrics || {}).length > 0 && html`<h5>Last metrics</h5>
      <table class="metrics"><tbody>${Object.entries(t.metrics).map(([k, v]) => html`<tr><td>${k}</td><td>${fmtNum(v, 3)}</td></tr>`)}</tbody></table>`}
  </aside>`;
}

function Tasks() {
  const q = query();
  const [workflow, setWorkflow] = useState(q.get("workflow") || "");
  const [shown, setShown] = useState(q.get("task") || "");
  const show = (id) => {
    setShown(id);
    const p = query();
    if (id) p.set("task", id);
    else p.delete("task");
    if (workflow) p.set("workflow", workflow);
    history.replaceState(null, "", `#/tasks?${p}`);
  };
  const [state, setState] = useState("");
  const [site, setSite] = useState("");
  const [acting, setActing] = useState(null);
  const tick = useChanges((c) => !workflow || c.workflow === workflow);
  const wfs = useLoad(() => view("workflows", { limit: 1000 }), [tick]);
  const wf = workflow || wfs.data?.items?.[0]?.workflow || "";
  const tasks = useLoad(() => (wf ? view("tasks", { workflow: wf, state, site, limit: 1000 }) : Promise.resolve(null)), [wf, state, site, tick]);
  const sites = useLoad(() => (wf ? view("sites", { workflow: wf, limit: 1000 }) : Promise.resolve(null)), [wf, tick]);
  const acts = useLoad(() => (wf ? view("actions", { workflow: wf, limit: 1000 }) : Promise.resolve(null)), [wf, tick]);
  const siteNames = (sites.data?.items || []).map((s) => s.site);
  const items = tasks.data?.items || [];
  const current = (wfs.data?.items || []).find((w) => w.workflow === wf);
  return html`<section>
    <h2>Workflows and tasks</h2>
    <${RunEnded} workflow=${current} />
    <div class="filters">
      <label>Workflow <select name="workflow" value=${wf} onChange=${(e) => setWorkflow(e.target.value)}>
        ${(wfs.data?.items || []).map((w) => html`<option value=${w.workflow}>${w.workflow}</option>`)}</select></label>
      <label>State <select name="state" value=${state} onChange=${(e) => setState(e.target.value)}>
        ${["", "pending", "running", "recovering", "completed", "failed", "cancelled"].map((s) => html`<option value=${s}>${s || "any"}</option>`)}</select></label>
      <label>Site <select name="site" value=${site} onChange=${(e) => setSite(e.target.value)}>
        <option value="">any</option>${siteNames.map((s) => html`<option value=${s}>${s}</option>`)}</select></label>
    </div>
    <${ErrorLine} error=${tasks.error} />
    <h3>Timeline</h3>
    <${Timeline} tasks=${items} actions=${acts.data?.items || []}
      faults=${(sites.data?.items || []).flatMap((x) => x.faults.map((f) => ({ ...f, site: x.site })))} />
    <h3>Incidents</h3>
    <${Incidents} tasks=${items} actions=${acts.data?.items || []} />
    <h3>Task instances <small>(${tasks.data ? tasks.data.total : "…"})</small></h3>
    <div class="scroll"><table class="tasks">
      <thead><tr><th>Task</th><th>State</th><th>Attempt</th><th>Site</th><th>Progress</th><th>Anomaly</th><th>Last heartbeat</th><th></th></tr></thead>
      <tbody>${items.map((t) => html`<tr data-task=${t.task_id}>
        <td><button class="link" onClick=${() => show(t.task_id)} aria-label=${"Details of " + t.task_id}>${t.task_id}</button></td>
        <td><span class=${"state " + t.state}>${t.state}</span></td><td>${t.attempt}</td><td>${t.site}</td>
        <td>${Math.round(t.progress * 100)}%</td><td>${t.anomaly_score >= 0 ? t.anomaly_score.toFixed(2) : ""}</td>
        <td>${fmtTime(t.last_heartbeat_us)}</td>
        <td><button onClick=${() => setActing(t)} aria-label=${"Act on " + t.task_id}>Act…</button></td></tr>`)}</tbody>
    </table></div>
    ${acting && html`<${ActionDialog} task=${acting} sites=${siteNames} ended=${current?.ended_us} onClose=${() => setActing(null)} />`}
    ${shown && items.find((t) => t.task_id === shown) && html`<${TaskDetail} task=${items.find((t) => t.task_id === shown)}
      actions=${acts.data?.items || []} onClose=${() => show("")} />`}
  </section>`;
}

// ---- sites: health and anomaly score over time ----------------------------------------------

// [lo, hi] around the values, never empty (uPlot spreads a single point over years).
function span(xs, pad) {
  const lo = Math.min(...xs), hi = Math.max(...xs);
  return hi - lo < pad ? [lo - pad, hi + pad] : [lo, hi];
}

// Health (line, over time), each prediction's anomaly score (points), the deciding policy's
// threshold on the score's scale (dashed steps) and forecast crossings (points at t + eta).
// Over this long without a point of the site's health (the views add one every 10 s while
// events about it come), the site was silent: the health line breaks there.
const kSilenceS = 30;

function ScoreChart({ site }) {
  const ref = useRef();
  const [gaps, setGaps] = useState(0);
  useEffect(() => {
    const rows = [];
    let silences = 0;
    site.history.forEach((p, i) => {
      const t = p.t_us / 1e6, prev = i > 0 ? site.history[i - 1].t_us / 1e6 : t;
      if (t - prev > kSilenceS) {
        rows.push({ t: prev + 10, health: null });  // known until the next keep-alive was due; then nothing
        silences++;
      }
      rows.push({ t, health: p.health });
    });
    setGaps(silences);
    const last = site.history[site.history.length - 1];
    if (last && site.updated_us > last.t_us) rows.push({ t: site.updated_us / 1e6, health: site.health });  // to its last event
    for (const p of site.scores) {
      rows.push({ t: p.t_us / 1e6, score: p.score, thr: p.threshold >= 0 ? p.threshold : null });
      if (p.forecast_eta_s >= 0) rows.push({ t: p.t_us / 1e6 + p.forecast_eta_s, forecast: 1 });
    }
    rows.sort((a, b) => a.t - b.t);
    const col = (k) => rows.map((r) => (r[k] === undefined ? null : r[k]));
    const dark = document.documentElement.dataset.theme === "dark";
    const axis = { stroke: dark ? "#ccc" : "#333", grid: { stroke: dark ? "#333" : "#eee" } };
    const plot = new uPlot({
      width: Math.min(ref.current.clientWidth || 600, 900), height: 200,
      scales: { x: { time: true, range: span(rows.map((r) => r.t), 30) }, y: { range: [0, 1.02] } },
      axes: [axis, axis],
      series: [{},
        // Health holds its value until the next change the views recorded: steps, not slopes
        // (a straight line between two sparse points drew recoveries that did not happen).
        // A silence is a gap (null), not a value held across it; rows of the other series
        // have no health (undefined), which the line spans.
        { label: "health", stroke: "#2b8a3e", width: 2, spanGaps: false, paths: uPlot.paths.stepped({ align: 1 }) },
        { label: "anomaly score", stroke: "#d9480f", width: 0, points: { show: true, size: 7, fill: "#d9480f" } },
        { label: "policy threshold", stroke: "#868e96", dash: [6, 4], width: 1.5, spanGaps: true, paths: uPlot.paths.stepped({ align: 1 }) },
        { label: "forecast crossing", stroke: "#1971c2", width: 0, points: { show: true, size: 9, fill: "#1971c2" } }],
    }, [col("t"), rows.map((r) => r.health), col("score"), col("thr"), col("forecast")], ref.current);
    return () => plot.destroy();
  }, [site]);
  return html`<div class="chart" ref=${ref} data-gaps=${gaps}></div>
    ${gaps > 0 && html`<p class="explain">Gaps in the health line: no event about the site for over ${kSilenceS} s (${gaps}).</p>`}`;
}

function SiteDialog({ site, drain, onClose }) {
  const [reason, setReason] = useState("");
  const [result, setResult] = useState(null);
  const ref = useRef();
  const kind = drain ? "drain" : "undrain";
  const readers = useReaders({ workflow: site.workflow, action: kind, site: site.site, reason: "check", ...(site.engine ? { engine: site.engine } : {}) });
  useEffect(() => ref.current?.showModal?.(), []);
  async function confirm(e) {
    e.preventDefault();
    const body = { workflow: site.workflow, action: kind, site: site.site, reason: reason || `operator ${kind}` };
    if (site.engine) body.engine = site.engine;
    setResult(await sendAction(body));
  }
  return html`<dialog ref=${ref} class="action-dialog" onClose=${onClose}>
    <form onSubmit=${confirm}>
      <h3>${drain ? "Drain" : "Undrain"} ${site.site}</h3>
      <p>${drain ? "Nothing new will start on this site; attempts running there finish." : "The site takes new work again."}
        The action goes to the engine of ${site.workflow} (${site.engine || "unknown engine"}) and is recorded with your token's name.</p>
      <label>Reason <input name="reason" value=${reason} onInput=${(e) => setReason(e.target.value)} /></label>
      <${Readers} warning=${readers} />
      <div class="buttons">
        <button type="submit" class="danger">Confirm ${kind}</button>
        <button type="button" onClick=${() => ref.current.close()}>Close</button>
      </div>
      ${result && html`<p class=${result.ok ? "ok" : result.warn ? "warn" : "error"} role="status" id="action-result">${result.text}</p>`}
    </form>
  </dialog>`;
}

// What a site's badge says: its engine's report, unless the health the views measure is
// worse (an engine that says "up" or "degraded" while everything there fails is failing to
// an operator): under 0.3 failing, under 0.7 degraded (docs/console.md).
function siteCondition(s) {
  const rank = { up: 0, degraded: 1, failing: 2 };
  if (!(s.state in rank)) return s.state;  // down, or a state of the engine's own
  const measured = s.health < 0.3 ? "failing" : s.health < 0.7 ? "degraded" : "up";
  return rank[measured] > rank[s.state] ? measured : s.state;  // the worse of the two
}

function Sites() {
  const tick = useChanges((c) => c.view === "sites" || c.view === "workflows");
  const wf = query().get("workflow");
  const sites = useLoad(() => view("sites", wf ? { limit: 1000, workflow: wf } : { limit: 1000 }), [tick]);
  const wfs = useLoad(() => (wf ? view("workflows", { workflow: wf, limit: 1 }) : Promise.resolve(null)), [tick]);
  const [acting, setActing] = useState(null);
  return html`<section>
    <h2>Sites</h2>
    <${RunEnded} workflow=${wfs.data?.items?.[0]} />
    <${ErrorLine} error=${sites.error} />
    ${(sites.data?.items || []).map((s) => html`<article class="site" data-site=${s.site}>
      <h3>${s.workflow} / ${s.site} <span class=${"state " + siteCondition(s)} title=${`reported ${s.state}; health ${fmtNum(s.health, 2)}`}>${siteCondition(s)}</span>
        ${s.drained && html` <span class="state drained">drained</span>`}
        <button class="act" onClick=${() => setActing({ site: s, drain: !s.drained })}>${s.drained ? "Undrain…" : "Drain…"}</button></h3>
      <p>${`Health ${fmtNum(s.health, 2)} · ${fmtNum(s.rate * 60, 1)} completions/min · failure rate ${fmtNum(s.failure_rate, 2)} · ` +
        `${s.running} running, ${s.completed} completed, ${s.failed} failed · ${s.predicted} predictions`}</p>
      ${s.explanation && html`<p class="explain">Last prediction: ${s.explanation}</p>`}
      ${s.history.length + s.scores.length ? html`<${ScoreChart} site=${s} />` : html`<p>No health changes or predictions yet.</p>`}
      ${s.scores.length > 0 && html`<details><summary>Last predictions</summary><div class="scroll"><table>
        <thead><tr><th>Time</th><th>Policy</th><th>Series</th><th>Detector</th><th>Score</th><th>Threshold</th><th>Forecast</th></tr></thead>
        <tbody>${s.scores.slice(-10).reverse().map((p) => html`<tr><td>${fmtTime(p.t_us)}</td><td>${p.policy}</td><td>${p.series}</td>
          <td>${p.detector}</td><td>${fmtNum(p.score, 3)}</td><td>${p.threshold >= 0 ? fmtNum(p.threshold, 3) : "—"}</td>
          <td>${p.forecast_eta_s >= 0 ? "crossing in " + fmtNum(p.forecast_eta_s, 0) + " s" : "—"}</td></tr>`)}</tbody>
      </table></div></details>`}
    </article>`)}
    ${acting && html`<${SiteDialog} site=${acting.site} drain=${acting.drain} onClose=${() => setActing(null)} />`}
  </section>`;
}

// ---- actions, consumers, training ---------------------------------------------------------

function Actions() {
  const tick = useChanges((c) => c.view === "actions");
  const acts = useLoad(() => view("actions", { limit: 1000 }), [tick]);
  const items = [...(acts.data?.items || [])].sort((a, b) => b.requested_us - a.requested_us);
  return html`<section>
    <h2>Actions</h2>
    <${ErrorLine} error=${acts.error} />
    <div class="scroll"><table class="actions">
      <thead><tr><th>Time</th><th>Workflow</th><th>Action</th><th>Task</th><th>Site</th><th>Origin</th><th>Reason</th><th>Outcome</th></tr></thead>
      <tbody>${items.map((a) => html`<tr data-action=${a.action_id}>
        <td>${fmtTime(a.requested_us)}</td><td>${a.workflow}</td><td>${a.action}${a.target_site ? " → " + a.target_site : ""}</td>
        <td>${a.task_id}</td><td>${a.site}</td><td>${a.origin}${a.policy ? " (" + a.policy + ")" : ""}</td><td>${a.reason}</td>
        <td><span class=${"state " + a.status}>${a.status}</span> ${a.message}</td></tr>`)}</tbody>
    </table></div>
  </section>`;
}

// Resets a consumer group's committed offset on a topic (admin; POST /api/v1/groups/{group}/reset):
// to an offset, the start, the end, or the first event appended at a time.
function ResetDialog({ group, onClose }) {
  const [to, setTo] = useState("offset");
  const [value, setValue] = useState(String(group.offset));
  const [result, setResult] = useState(null);
  const ref = useRef();
  useEffect(() => ref.current?.showModal?.(), []);
  async function confirm(e) {
    e.preventDefault();
    const body = { topic: group.topic };
    if (to === "time") body.time = new Date(value).toISOString();
    else body.offset = to === "offset" ? Number(value) : to;
    try {
      const r = await api(`/api/v1/groups/${encodeURIComponent(group.group)}/reset`, { method: "POST", body });
      setResult({ ok: true, text: `${r.group} now reads ${r.topic} from offset ${r.offset} (was ${r.previous ?? "none"})` });
    } catch (err) {
      setResult({ ok: false, text: err.message });
    }
  }
  return html`<dialog ref=${ref} class="action-dialog" onClose=${onClose}>
    <form onSubmit=${confirm}>
      <h3>Reset ${group.group} on ${group.topic}</h3>
      <p>Its next session starts there. A member reading now commits over it: stop the group's consumers first.</p>
      <label>To <select name="reset-to" value=${to} onChange=${(e) => setTo(e.target.value)}>
        <option value="offset">an offset</option><option value="earliest">the start</option>
        <option value="latest">the end</option><option value="time">a time</option></select></label>
      ${to === "offset" && html`<label>Offset <input name="reset-offset" inputmode="numeric" value=${value} onInput=${(e) => setValue(e.target.value)} /></label>`}
      ${to === "time" && html`<label>Time <input name="reset-time" type="datetime-local" step="1" onInput=${(e) => setValue(e.target.value)} /></label>`}
      <div class="buttons">
        <button type="submit" class="danger">Reset</button>
        <button type="button" onClick=${() => ref.current.close()}>Close</button>
      </div>
      ${result && html`<p class=${result.ok ? "ok" : "error"} role="status" id="reset-result">${result.text}</p>`}
    </form>
  </dialog>`;
}

function Consumers() {
  const tick = useChanges(() => true);
  const groups = useLoad(() => view("consumers", { limit: 1000 }), [tick]);
  const [resetting, setResetting] = useState(null);
  const admin = (token.claims()?.scope || []).includes("admin");
  return html`<section>
    <h2>Consumer groups</h2>
    <${ErrorLine} error=${groups.error} />
    <div class="scroll"><table>
      <thead><tr><th>Group</th><th>Topic</th><th>Committed</th><th>End</th><th>Lag</th><th></th></tr></thead>
      <tbody>${(groups.data?.items || []).map((g) => html`<tr data-group=${g.group + "/" + g.topic}><td>${g.group}</td><td>${g.topic}</td>
        <td>${fmtNum(g.offset)}</td><td>${fmtNum(g.end)}</td><td>${fmtNum(g.lag)}</td>
        <td>${admin && html`<button onClick=${() => setResetting(g)} aria-label=${`Reset ${g.group} on ${g.topic}`}>Reset…</button>`}</td></tr>`)}</tbody>
    </table></div>
    ${resetting && html`<${ResetDialog} group=${resetting} onClose=${() => setResetting(null)} />`}
    <${Links} tick=${tick} />
  </section>`;
}

// Connections the relay said congested (resource.status, kind link: docs/streaming.md,
// "Congestion as events"): per class, the longest wait in a queue, what waits now and the rate.
const CLASSES = ["control", "lifecycle", "telemetry", "bulk"];
function Links({ tick }) {
  const links = useLoad(() => view("resources", { kind: "link", limit: 1000 }), [tick]);
  const items = links.data?.items || [];
  const m = (r, k) => r.metrics?.[k];
  return html`<h2>Connections</h2>
    <${ErrorLine} error=${links.error} />
    ${items.length === 0 ? html`<p class="hint" id="links-none">No connection has been congested.</p>` : html`<div class="scroll"><table id="links">
      <thead><tr><th>Connection</th><th>State</th>${CLASSES.map((c) => html`<th title=${`the longest wait of a ${c} frame in its queue, and the frames waiting`}>${c} wait (queued)</th>`)}
        <th>Bulk rate</th><th>Said</th></tr></thead>
      <tbody>${items.map((r) => html`<tr data-link=${r.resource_id}><td>${r.resource_id}</td>
        <td><span class=${"state " + r.state}>${r.state}</span>${m(r, "paused") ? " (paused)" : ""}</td>
        ${CLASSES.map((c) => html`<td>${fmtNum(m(r, "wait_max_s_" + c) * 1000)} ms (${fmtNum(m(r, "queue_frames_" + c))})</td>`)}
        <td>${m(r, "bulk_rate") ? fmtNum(m(r, "bulk_rate") / 1e6, 1) + " MB/s" : "—"}</td><td>${fmtTime(r.updated_us)}</td></tr>`)}</tbody>
    </table></div>`}`;
}

function SeriesChart({ task }) {
  const ref = useRef();
  useEffect(() => {
    const pts = task.series;
    const names = [...new Set(pts.flatMap((p) => Object.keys(p.values)))].sort();
    const colors = ["#d9480f", "#1971c2", "#2b8a3e", "#9c36b5", "#e67700", "#0b7285"];
    const dark = document.documentElement.dataset.theme === "dark";
    const plot = new uPlot({
      width: Math.min(ref.current.clientWidth || 600, 900), height: 200,
      scales: { x: { time: false, range: span(pts.map((p, i) => (p.step >= 0 ? p.step : i)), 1) } },
      // One scale per metric (a loss near 0 and a buffer fill in thousands): the first two
      // get an axis each, left and right, in their colour.
      axes: [{ stroke: dark ? "#ccc" : "#333", label: "step" },
        ...names.slice(0, 2).map((n, i) => ({ scale: n, side: i ? 1 : 3, stroke: colors[i], label: n }))],
      series: [{ label: "step" }, ...names.map((n, i) => ({ label: n, scale: n, stroke: colors[i % colors.length], width: 2 }))],
    }, [pts.map((p, i) => (p.step >= 0 ? p.step : i)), ...names.map((n) => pts.map((p) => p.values[n] ?? null))], ref.current);
    return () => plot.destroy();
  }, [task]);
  return html`<div class="chart" ref=${ref}></div>`;
}

// A rehearsal job's evaluations: after each task trained, its accuracy (or error) on every
// task seen so far, the forgetting matrix read row by row.
function EvalTable({ task }) {
  if (!task.evals.length) return html`<p>No evaluation yet (one at the end of each training task).</p>`;
  const names = [...new Set(task.evals.flatMap((e) => Object.keys(e.values)))]
    .sort((a, b) => (a.startsWith("average") - b.startsWith("average")) || a.localeCompare(b, undefined, { numeric: true }));
  const steps = task.evals.some((e) => e.step >= 0);
  return html`<div class="scroll"><table class="evals">
    <caption>Evaluation after each task</caption>
    <thead><tr><th>After task</th>${steps && html`<th>Step</th>`}${names.map((n) => html`<th>${n}</th>`)}</tr></thead>
    <tbody>${task.evals.map((e) => html`<tr><td>${e.after_task}</td>${steps && html`<td>${e.step >= 0 ? e.step : "—"}</td>`}
      ${names.map((n) => html`<td>${e.values[n] == null ? "" : fmtNum(e.values[n], 4)}</td>`)}</tr>`)}</tbody>
  </table></div>`;
}

function Training() {
  const tick = useChanges((c) => c.view === "tasks");
  const tasks = useLoad(() => view("tasks", { limit: 1000 }), [tick]);
  const jobs = (tasks.data?.items || []).filter((t) => t.series.length > 0 || t.evals.length > 0);
  return html`<section>
    <h2>Training</h2>
    <${ErrorLine} error=${tasks.error} />
    <p>Tasks that report metrics of their own with their progress (a rehearsal job: its loss, buffer fill, samples per
      second, waiting time), their last values and their course over the last 64 reports.</p>
    ${jobs.length === 0 && html`<p>No such task yet.</p>`}
    ${jobs.map((t) => html`<article class="site">
      <h3>${t.workflow} / ${t.task_id} <span class=${"state " + t.state}>${t.state}</span></h3>
      <p>${t.site} · ${Math.round(t.progress * 100)}% · ${Object.entries(t.metrics).filter(([k]) => k !== "step_time_s")
        .map(([k, v]) => `${k} ${fmtNum(v, 4)}`).join(" · ")}</p>
      <${SeriesChart} task=${t} />
      <${EvalTable} task=${t} />
    </article>`)}
  </section>`;
}

// ---- shell ---------------------------------------------------------------------------------

function App() {
  const [signedIn, setSignedIn] = useState(!!token.get());
  const [page, setPage] = useState(location.hash.slice(2).split("?")[0] || "overview");
  const [live, setLive] = useState("");
  const [theme, setTheme] = useState(localStorage.getItem("diaspora.console.theme") ||
    (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"));
  const [refusal, setRefusal] = useState("");
  useEffect(() => {
    document.documentElement.dataset.theme = theme;
    localStorage.setItem("diaspora.console.theme", theme);
  }, [theme]);
  useEffect(() => {
    const f = () => setPage(location.hash.slice(2).split("?")[0] || "overview");
    addEventListener("hashchange", f);
    return () => removeEventListener("hashchange", f);
  }, []);
  useEffect(() => {
    if (!signedIn) return;
    return followChanges((c) => changeListeners.forEach((f) => f(c)), (s) => {
      setLive(s);
      relayDown.since = s === "live" ? null : relayDown.since ?? Date.now();
      if (s.startsWith("refused")) {
        token.clear();
        setRefusal(s.slice(9));
        setSignedIn(false);
      }
    });
  }, [signedIn]);
  if (!signedIn) return html`<${SignIn} message=${refusal} onDone=${() => setSignedIn(true)} />`;
  const Page = { overview: Overview, topics: Topics, tasks: Tasks, sites: Sites, actions: Actions, consumers: Consumers, training: Training }[page] || Overview;
  const who = token.claims();
  return html`<div class="shell">
    <header>
      <strong class="brand">Diaspora</strong>
      <nav aria-label="Pages">${PAGES.map(([k, label]) => html`<a href=${"#/" + k} aria-current=${page === k ? "page" : null}>${label}</a>`)}</nav>
      <span class=${"live " + (live === "live" ? "on" : "off")} title="Live updates">${live || "connecting"}</span>
      <span class="who">${who?.sub || ""}</span>
      <button onClick=${() => setTheme(theme === "dark" ? "light" : "dark")} aria-label="Switch dark or light">${theme === "dark" ? "Light" : "Dark"}</button>
      <button onClick=${() => { token.clear(); setSignedIn(false); }}>Sign out</button>
    </header>
    ${live && live !== "live" && relayDown.since && html`<p class="banner warn" role="alert" id="relay-down">The relay cannot be reached since
      ${" " + new Date(relayDown.since).toLocaleTimeString()}: the pages show the last state they saw (a run whose relay was embedded
      has ended: open it again with <code>diaspora run --serve OUT</code>, OUT its <code>--out</code> folder).</p>`}
    <main><${Page} key=${page} /></main>
  </div>`;
}

const root = document.getElementById("app");
root.textContent = "";  // the "Loading…" line of index.html
render(html`<${App} />`, root);
