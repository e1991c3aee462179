// The relay's APIs as the console uses them: the token (kept in session storage), JSON
// requests, the views' live changes (server-sent events read with fetch, since
// EventSource cannot send a bearer token) and the diaspora.v1 WebSocket for topics.
// Everything goes to this page's own origin.

const KEY = "diaspora.console.token";

export const token = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (t) => sessionStorage.setItem(KEY, t.trim()),
  clear: () => sessionStorage.removeItem(KEY),
  /** The token's claims (not verified here: the relay does that), or null. */
  claims() {
    try {
      const part = token.get().split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      return JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4)));
    } catch {
      return null;
    }
  },
};

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// What the relay refused this token (403: its scopes do not reach it), by path without its
// query: asked again, the refusal is answered here, so that no page polls what it may not
// see (every refusal counts in the relay's auth_refusals). A token's scopes never change;
// signing in with another token starts afresh.
const refused = new Map();

/** GET or POST `path`; the parsed JSON (or text) answer; ApiError with the relay's reason. */
export async function api(path, { method = "GET", body } = {}) {
  const key = `${token.get()} ${path.split("?")[0]}`;
  if (method === "GET" && refused.has(key)) throw refused.get(key);
  const headers = { Authorization: `Bearer ${token.get()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, `the relay cannot be reached (${e.message})`);
  }
  const type = r.headers.get("content-type") || "";
  const payload = type.includes("json") ? await r.json().catch(() => ({})) : await r.text();
  if (!r.ok) {
    const err = new ApiError(r.status, typeof payload === "string" ? payload.trim() : payload.message || r.statusText);
    if (r.status === 403 && method === "GET") refused.set(key, err);
    throw err;
  }
  return payload;
}

/** Query parameters without the empty ones. */
const params = (p) => new URLSearchParams(Object.entries(p).filter(([, v]) => v !== "" && v != null));

/** A page of a view: /api/v1/views/<view>?params. */
export const view = (name, p = {}) => {
  const q = params(p);
  return api(`/api/v1/views/${name}${q.size ? "?" + q : ""}`);
};

/** A page of a topic's stored events, scanned and filtered by the relay (docs/protocol.md, "Browsing a topic"). */
export const browseTopic = (topic, p) => api(`/api/v1/topics/${encodeURIComponent(topic)}/events?${params(p)}`);

/**
 * Saves the selection of a browse as a file (format "jsonl" or "csv"): fetched with the
 * token (a plain link could not send it), then handed to the browser as a download.
 * Returns the file's name; ApiError as api().
 */
export async function exportTopic(topic, p, format) {
  let r;
  try {
    r = await fetch(`/api/v1/topics/${encodeURIComponent(topic)}/events?${params({ ...p, format })}`,
                    { headers: { Authorization: `Bearer ${token.get()}` } });
  } catch (e) {
    throw new ApiError(0, `the relay cannot be reached (${e.message})`);
  }
  if (!r.ok) throw new ApiError(r.status, ((await r.json().catch(() => ({}))).message) || r.statusText);
  const name = /filename="([^"]+)"/.exec(r.headers.get("content-disposition") || "")?.[1] || `${topic}.${format}`;
  const url = URL.createObjectURL(await r.blob());
  const a = Object.assign(document.createElement("a"), { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
  return name;
}

/**
 * Follows /api/v1/views/stream: onChange({version, view, workflow, id}) for each change,
 * onState("live" | "reconnecting" | "refused: ...") as the connection goes. Reconnects
 * after a second (relay restarts), resuming after the last version seen. Returns stop().
 */
export function followChanges(onChange, onState) {
  let stopped = false, since = "", ctrl = null, reconnected = false;
  async function run() {
    while (!stopped) {
      ctrl = new AbortController();
      try {
        const r = await fetch(`/api/v1/views/stream${since ? "?since=" + since : ""}`, {
          headers: { Authorization: `Bearer ${token.get()}` },
          signal: ctrl.signal,
        });
        if (r.status === 401) {
          onState(`refused: ${(await r.text()).trim()}`);
          return;
        }
        if (!r.ok) throw new Error(r.statusText);
        onState("live");
        // Back after a gap (a relay restart): what changed meanwhile may predate `since`
        // (or no change had been seen yet): the pages reload everything once.
        if (reconnected) onChange({ reset: true });
        reconnected = true;
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = "", event = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let nl;
          while ((nl = buf.indexOf("\n")) >= 0) {
            const line = buf.slice(0, nl);
            buf = buf.slice(nl + 1);
            if (line.startsWith("event: ")) event = line.slice(7);
            else if (line.startsWith("data: ")) {
              const data = JSON.parse(line.slice(6));
              if (data.version) since = String(data.version);
              if (event === "change") onChange(data);
              else if (event === "reset") onChange({ reset: true, version: data.version });
              else if (event === "expired") {
                onState("refused: the token expired; sign in again");
                return;
              }
            }
          }
        }
      } catch (e) {
        if (stopped) return;
      }
      onState("reconnecting");
      await new Promise((res) => setTimeout(res, 1000));
    }
  }
  run();
  return () => {
    stopped = true;
    ctrl?.abort();
  };
}

/**
 * A diaspora.v1 session subscribed to `topic` from `from` ("latest", "earliest", an
 * offset or {time: RFC 3339}): onEvents([{offset, event}]) for each delivery, onState(text) as it goes.
 * Reconnects after a second, from the offset after the last one seen. Returns close().
 */
export function subscribe(topic, from, onEvents, onState) {
  let ws = null, closed = false, next = from;
  function open() {
    ws = new WebSocket(`wss://${location.host}/v1`, "diaspora.v1");
    ws.binaryType = "arraybuffer";
    ws.onopen = () => ws.send(JSON.stringify({ op: "hello", client_id: "console", token: token.get() }));
    ws.onmessage = (m) => {
      if (typeof m.data !== "string") return;  // a data item's chunk (docs/streaming.md): the tail shows events
      const msg = JSON.parse(m.data);
      if (msg.op === "welcome") {
        const at = typeof next === "object" ? next : /^\d+$/.test(String(next)) ? Number(next) : String(next);  // an offset is a JSON integer
        ws.send(JSON.stringify({ op: "subscribe", id: "s", topic, from: at }));
        onState("live");
      } else if (msg.op === "events") {
        const evs = msg.events.map((e) => ({ offset: e.offset, event: e.event }));
        if (evs.length) next = evs[evs.length - 1].offset + 1;
        onEvents(evs);
      } else if (msg.op === "error") {
        onState(`refused: ${msg.message || msg.code}`);
      }
    };
    ws.onclose = () => {
      if (closed) return;
      onState("reconnecting");
      setTimeout(() => !closed && open(), 1000);
    };
  }
  open();
  return () => {
    closed = true;
    ws?.close();
  };
}

/** Prometheus text -> {name: value} (labels dropped, summed). */
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
    if (m) out[m[1]] = (out[m[1]] || 0) + Number(m[3]);
  }
  return out;
}
