// The console's views. User text (rules, events, errors, alert fields) only ever reaches the
// page through textContent / value: nothing here builds HTML from data.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function getJSON(url, opts) {
  const r = await fetch(url, opts);
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.detail ? JSON.stringify(body.detail) : `HTTP ${r.status}`);
  return body;
}

function fmtTime(ms) {
  return typeof ms === "number" ? new Date(ms).toISOString().replace(".000Z", "Z") : String(ms);
}

const main = document.getElementById("main");
const page = location.pathname.replace(/^\//, "") || "rules";
for (const a of document.querySelectorAll("nav a")) {
  if (a.dataset.page === page) a.classList.add("active");
}

// -- rules -----------------------------------------------------------------------------------
async function rulesView() {
  main.append(el("h2", {}, "Rules in force"));
  const data = await getJSON("/api/rules");
  const counts = data.alerts_last_hour && !data.alerts_last_hour.error ? data.alerts_last_hour : {};
  const live = data.live || {available: false, by_rule: {}};
  main.append(el("p", {class: "muted"}, `from ${data.dir}`));
  main.append(el("p", {class: "muted", id: "live-source"}, live.available
    ? `Per-rule figures: the live job's metrics (${live.age_s} s old).` +
      (live.alerts ? "" : " The job does not count alerts per rule: alerts counted from Redis over the last hour.") +
      (live.partial_matches ? "" : " The job does not export partial-match counts.")
    : `Live job: ${live.why}. Alerts counted from Redis over the last hour.`));
  for (const f of data.files) {
    const card = el("div", {class: "card file", "data-file": f.file},
      el("div", {}, el("strong", {}, f.file), " ",
         el("span", {class: `status-${f.status}`}, f.status)));
    for (const e of f.errors) card.append(el("pre", {class: "error"}, e));
    for (const r of f.rules) {
      const rc = el("div", {class: "card rule", "data-rule": r.id},
        el("div", {}, el("strong", {}, r.id), " ",
           el("span", {class: "pill"}, `v${r.version}`),
           el("span", {class: "pill"}, r.severity || ""),
           el("span", {class: "pill"}, r.enabled ? "enabled" : "disabled"),
           ...livePills(r.id, live, counts)),
        el("div", {class: "muted"}, `stream ${r.stream}, key ${r.key_field || "(whole stream)"}, emits '${r.alert}'`));
      const pre = el("pre", {}, r.explain);
      pre.hidden = true;
      const img = el("img", {class: "nfa", alt: `automaton of ${r.id}`, loading: "lazy"});
      img.hidden = true;
      rc.append(el("button", {onclick: () => { pre.hidden = !pre.hidden; }}, "state table"),
                el("button", {onclick: () => { if (!img.src) img.src = `/api/rules/${encodeURIComponent(r.id)}/svg`; img.hidden = !img.hidden; }}, "automaton"),
                pre, img);
      card.append(rc);
    }
    main.append(card);
  }
  if (!data.files.length) main.append(el("p", {}, "No *.cep files in the rules directory."));
}

// Per rule: from the live job's metrics when it has them, else the Redis count of the last hour.
function livePills(id, live, counts) {
  const m = (live.available ? live.by_rule[id] : null) || {};
  const out = m.alerts_per_min === undefined
    ? [el("span", {class: "pill alerts-hour"}, `${counts[id] ?? 0} alerts in the last hour`)]
    : [el("span", {class: "pill alert-rate"}, `${m.alerts_per_min} alerts/min`),
       el("span", {class: "pill alerts-hour"}, `${m.alerts_last_hour} alerts in the last hour`)];
  if (m.partial_matches !== undefined) out.push(el("span", {class: "pill partials"}, `${m.partial_matches} partial matches`));
  return out;
}

// -- alerts ----------------------------------------------------------------------------------
function alertDetail(box, a) {
  box.replaceChildren(
    el("h3", {}, `${a.rule_id} — ${a.alert} (${a.kind})`),
    el("div", {class: "muted"}, `key ${a.key}, ${fmtTime(a.first_ts)} → ${fmtTime(a.last_ts)}, severity ${a.severity ?? ""}`),
    el("h4", {}, "Measures"), el("pre", {class: "measures"}, JSON.stringify(a.measures, null, 1)),
    el("h4", {}, "Events"));
  const t = el("table", {class: "events"}, el("tr", {}, el("th", {}, "var"), el("th", {}, "time"), el("th", {}, "event")));
  for (const e of a.events || []) {
    t.append(el("tr", {}, el("td", {}, e.var), el("td", {}, fmtTime(e.ts)), el("td", {}, JSON.stringify(e.event))));
  }
  box.append(t);
  const img = el("img", {class: "nfa", alt: "timeline"});
  box.append(el("h4", {}, "Timeline"), img);
  fetch("/api/alerts/timeline", {method: "POST", headers: {"Content-Type": "application/json"},
                                 body: JSON.stringify({alert: a})})
    .then(r => r.ok ? r.blob() : null).then(b => { if (b) img.src = URL.createObjectURL(b); });
}

function alertRow(a, box) {
  return el("tr", {class: "clickable alert", "data-rule": a.rule_id, onclick: () => alertDetail(box, a)},
    el("td", {}, fmtTime(a.detected_at ?? a.last_ts)), el("td", {}, a.rule_id),
    el("td", {}, a.severity ?? ""), el("td", {}, a.key), el("td", {}, a.alert), el("td", {}, a.kind));
}

async function alertsView() {
  main.append(el("h2", {}, "Live alerts"));
  const rule = el("input", {placeholder: "rule", id: "f-rule"});
  const severity = el("input", {placeholder: "severity", id: "f-severity"});
  const key = el("input", {placeholder: "key", id: "f-key"});
  const status = el("span", {class: "muted", id: "alerts-status"}, "");
  const table = el("table", {id: "alerts"}, el("tr", {}, ...["detected", "rule", "severity", "key", "alert", "kind"].map(h => el("th", {}, h))));
  const box = el("div", {class: "card", id: "alert-detail"}, el("span", {class: "muted"}, "Click an alert to see its events and timeline."));
  let source = null;
  const start = async () => {
    if (source) source.close();
    table.replaceChildren(table.firstChild);
    const q = new URLSearchParams({rule: rule.value, severity: severity.value, key: key.value});
    try {
      for (const a of (await getJSON(`/api/alerts/recent?${q}&limit=50`)).reverse()) table.firstChild.after(alertRow(a, box));
    } catch (e) { status.textContent = `recent alerts: ${e.message}`; }
    source = new EventSource(`/api/alerts/stream?${q}`);
    source.addEventListener("ready", () => { status.textContent = "following"; });
    source.onmessage = m => { table.firstChild.after(alertRow(JSON.parse(m.data), box)); };
    source.onerror = () => { status.textContent = "reconnecting…"; };
  };
  main.append(el("div", {}, rule, " ", severity, " ", key, " ", el("button", {onclick: start}, "filter"), " ", status),
              el("div", {class: "row"}, el("div", {}, table), el("div", {}, box)));
  start();
}

// -- playground ------------------------------------------------------------------------------
const SAMPLE_RULES = `STREAM tx (ts INT, card STRING, amount FLOAT) TIME BY ts LATENESS 0s;

RULE small_then_big FROM tx PARTITION BY card
  PATTERN (small -> big)
  DEFINE small AS amount < 5, big AS amount >= 500
  WITHIN 10m
  MEASURES small.amount AS probe, big.amount AS amount
  EMIT 'small then big';
`;
const SAMPLE_EVENTS = `{"ts": 1767225600000, "card": "c1", "amount": 1.0}
{"ts": 1767225660000, "card": "c1", "amount": 900}
{"ts": 1767225600000, "card": "c2", "amount": 2.0}
{"ts": 1767229600000, "card": "c2", "amount": 800}
`;

const MAX_ROWS = 500;  // a sample stream can have thousands of near misses: show the first ones

function resultTable(items, box) {
  const t = el("table", {}, el("tr", {}, ...["rule", "key", "first", "last", "alert", "measures"].map(h => el("th", {}, h))));
  if (items.length > MAX_ROWS) t.append(el("tr", {}, el("td", {colspan: "6", class: "muted"}, `the first ${MAX_ROWS} of ${items.length}`)));
  for (const a of items.slice(0, MAX_ROWS)) {
    t.append(el("tr", {class: "clickable result", onclick: () => alertDetail(box, a)},
      el("td", {}, a.rule_id), el("td", {}, a.key), el("td", {}, fmtTime(a.first_ts)),
      el("td", {}, fmtTime(a.last_ts)), el("td", {}, a.alert), el("td", {}, JSON.stringify(a.measures))));
  }
  return t;
}

async function playgroundView() {
  main.append(el("h2", {}, "Playground"));
  const rules = el("textarea", {id: "pg-rules", rows: "16", spellcheck: "false"});
  rules.value = sessionStorage.getItem("pg-rules") || SAMPLE_RULES;
  const events = el("textarea", {id: "pg-events", rows: "16", spellcheck: "false"});
  events.value = sessionStorage.getItem("pg-events") || SAMPLE_EVENTS;
  const file = el("input", {type: "file", accept: ".jsonl,.json,.ndjson,.txt"});
  file.addEventListener("change", async () => { if (file.files[0]) { events.value = await file.files[0].text(); stream.value = ""; } });
  // The stream the events belong to ("" = the first enabled rule's); set when an input is picked.
  const stream = el("input", {id: "pg-stream", placeholder: "stream (default: the first rule's)", size: "28"});
  stream.value = sessionStorage.getItem("pg-stream") || "";
  const note = el("span", {class: "muted", id: "pg-input-note"}, "");
  // A replay's input: the sample streams (what `cep demo` replays) and the console's input folders.
  const picker = el("select", {id: "pg-input"}, el("option", {value: ""}, "pick a replay input…"));
  const rulesPicker = el("select", {id: "pg-rules-file"}, el("option", {value: ""}, "load a rules file…"));
  let inputs = [];
  getJSON("/api/playground/inputs").then(list => {
    inputs = list;
    for (const i of list) picker.append(el("option", {value: i.id}, `${i.id} (${i.stream}, ${Math.round(i.bytes / 1024)} KiB)`));
  }).catch(e => { note.textContent = `inputs: ${e.message}`; });
  getJSON("/api/rules").then(d => {
    for (const f of d.files) if (f.status === "accepted") rulesPicker.append(el("option", {value: f.file}, f.file));
  }).catch(() => {});
  const loadRules = async (name) => {
    const r = await fetch(`/api/rules-files/${name.split("/").map(encodeURIComponent).join("/")}`);
    if (!r.ok) throw new Error(`cannot load ${name}: HTTP ${r.status}`);
    rules.value = await r.text();
  };
  rulesPicker.addEventListener("change", async () => {
    if (!rulesPicker.value) return;
    try { await loadRules(rulesPicker.value); } catch (e) { note.textContent = e.message; }
    rulesPicker.value = "";
  });
  picker.addEventListener("change", async () => {
    const info = inputs.find(i => i.id === picker.value);
    if (!info) return;
    note.textContent = "loading…";
    try {
      const got = await getJSON(`/api/playground/inputs/${info.id.split("/").map(encodeURIComponent).join("/")}`);
      events.value = got.text;
      stream.value = got.stream;
      let msg = `${got.events} events of stream ${got.stream}` + (got.truncated ? " (the first ones: the playground's limit)" : "");
      // Rules that read the stream, when the rules in the editor do not declare it.
      if (!new RegExp(`\\bSTREAM\\s+${got.stream}\\b`, "i").test(rules.value) && info.rules_files.length) {
        await loadRules(info.rules_files[0]);
        msg += `; rules loaded from ${info.rules_files[0]}`;
      }
      note.textContent = msg;
    } catch (e) { note.textContent = e.message; }
  });
  const out = el("div", {id: "pg-out"});
  const box = el("div", {class: "card", id: "pg-detail"});
  const body = () => JSON.stringify({rules: rules.value, events: events.value, stream: stream.value.trim() || null});
  const run = async () => {
    sessionStorage.setItem("pg-rules", rules.value);
    try { sessionStorage.setItem("pg-events", events.value); } catch (e) { /* too large to keep */ }
    sessionStorage.setItem("pg-stream", stream.value);
    out.replaceChildren(el("span", {class: "muted"}, "running…"));
    let res;
    try {
      res = await getJSON("/api/playground/run", {method: "POST", headers: {"Content-Type": "application/json"}, body: body()});
    } catch (e) { out.replaceChildren(el("pre", {class: "error"}, e.message)); return; }
    out.replaceChildren();
    for (const e of res.errors) out.append(el("pre", {class: "error compile-error"}, e.rendered));
    if (res.errors.length) return;
    if (res.stopped) out.append(el("p", {class: "status-rejected"}, res.stopped));
    out.append(el("h3", {}, `Alerts (${res.alerts.length})`), resultTable(res.alerts, box),
               el("h3", {}, `Near misses: partial matches cut off by their time limit (${res.near_misses.length})`),
               resultTable(res.near_misses, box));
    if (res.dead_letters.length) {
      out.append(el("h3", {}, `Events rejected (${res.dead_letters.length})`));
      for (const d of res.dead_letters) out.append(el("pre", {class: "error dead"}, `line ${d.line}: ${d.reason}\n${d.raw}`));
    }
  };
  const save = async () => {
    const r = await fetch("/api/playground/save", {method: "POST", headers: {"Content-Type": "application/json"}, body: body()});
    if (!r.ok) { out.prepend(el("pre", {class: "error"}, `cannot save: HTTP ${r.status}`)); return; }
    const url = URL.createObjectURL(await r.blob());
    const a = el("a", {href: url, download: "playground-test.yaml"}, "download");
    a.click();
  };
  main.append(el("div", {class: "row"},
    el("div", {}, el("h3", {}, "Rules"), rules),
    el("div", {}, el("h3", {}, "Events (JSON lines or a JSON array)"), events,
       el("div", {}, picker, " ", rulesPicker, " ", file), el("div", {}, stream, " ", note))),
    el("div", {}, el("button", {id: "pg-run", onclick: run}, "Run"),
                  el("button", {id: "pg-save", onclick: save}, "Save as cep test case")),
    el("div", {class: "row"}, el("div", {}, out), el("div", {}, box)));
}

// -- saved searches --------------------------------------------------------------------------
async function searchesView() {
  main.append(el("h2", {}, "Saved searches"));
  const info = await getJSON("/api/rules");
  if (!info.searches) {
    main.append(el("p", {}, "The console was started without the saved-search registry (--searches)."));
    return;
  }
  const key = el("input", {id: "api-key", placeholder: "API key (cep search key OWNER)", size: "48"});
  key.value = sessionStorage.getItem("api-key") || "";
  const list = el("table", {id: "searches"});
  const msg = el("pre", {id: "search-msg"});
  const api = (path, opts = {}) => {
    sessionStorage.setItem("api-key", key.value);
    return getJSON(`/search-api/v1${path}`, {...opts, headers: {"Content-Type": "application/json", "X-API-Key": key.value}});
  };
  const query = el("input", {id: "new-query", placeholder: "title:kafka AND price:[10 TO 100]", size: "60"});
  const event = el("textarea", {id: "test-event", rows: "4"});
  event.value = '{"title": "kafka streams", "price": 42}';
  const more = el("button", {id: "more-searches", onclick: () => page(more.dataset.after)}, "more");
  more.hidden = true;
  const load = () => {
    list.replaceChildren(el("tr", {}, el("th", {}, "id"), el("th", {}, "query"), el("th", {}, "")));
    return page(null);
  };
  // The API lists a page at a time (docs/api.md): `next` is the cursor of the following page.
  const page = async (after) => {
    more.hidden = true;
    try {
      const q = new URLSearchParams({limit: "100"});
      if (after) q.set("after", after);
      const res = await api(`/searches?${q}`);
      if (res.next) { more.dataset.after = res.next; more.hidden = false; more.textContent = `more (${res.total} in all)`; }
      for (const s of res.searches) {
        list.append(el("tr", {class: "search"}, el("td", {}, s.id), el("td", {}, s.query),
          el("td", {}, el("button", {onclick: async () => { await api(`/searches/${encodeURIComponent(s.id)}`, {method: "DELETE"}).catch(() => {}); load(); }}, "delete"),
                       el("button", {class: "edit", onclick: () => { query.value = s.query; editing = s.id; addButton.textContent = `save ${s.id}`; }}, "edit"),
                       el("button", {class: "test", onclick: async () => {
                         msg.textContent = "";
                         try { const r = await api("/test", {method: "POST", body: JSON.stringify({query: s.query, event: JSON.parse(event.value)})});
                               msg.textContent = r.explanation; } catch (e) { msg.textContent = e.message; } }}, "test against the event"))));
      }
    } catch (e) { msg.textContent = e.message; }
  };
  let editing = null;
  const add = async () => {
    try {
      if (editing) {
        await api(`/searches/${encodeURIComponent(editing)}`, {method: "PUT", body: JSON.stringify({query: query.value})});
        msg.textContent = `saved ${editing}`;
      } else {
        await api("/searches", {method: "POST", body: JSON.stringify({query: query.value})});
        msg.textContent = "added";
      }
    } catch (e) { msg.textContent = e.message; }
    editing = null;
    addButton.textContent = "add";
    load();
  };
  const addButton = el("button", {id: "add-search", onclick: add}, "add");
  main.append(el("div", {}, key, " ", el("button", {id: "load-searches", onclick: load}, "load")),
              el("div", {}, query, " ", addButton),
              el("h3", {}, "Event to test against"), event, list, more, msg);
  if (key.value) load();
}

// -- health ----------------------------------------------------------------------------------
async function healthView() {
  main.append(el("h2", {}, "Health of the live job"));
  const h = await getJSON("/api/health");
  if (!h.available) { main.append(el("p", {}, h.why)); return; }
  const t = el("table", {class: "kv", id: "health"});
  const rows = [["metrics age (s)", h.age_s], ["events/s processed", h.events_per_s], ["events/s in", h.input_per_s],
    ["last batch", h.last_batch], ["last batch duration (ms)", h.last_batch_ms], ["event time", h.event_time],
    ["state rows", h.state_rows], ["events read", h.events_read], ["events processed", h.events],
    ["late events", h.late], ["dead letters", h.dead_letters], ["rules running", h.rules_running]];
  for (const [k, v] of rows) t.append(el("tr", {}, el("td", {}, k), el("td", {}, v ?? "—")));
  main.append(t, el("h3", {}, "Rules files"));
  for (const [f, s] of Object.entries(h.rules_files)) {
    main.append(el("div", {class: "card"}, el("strong", {}, f), " ", el("span", {class: `status-${s.status}`}, s.status),
      ...((s.errors || []).map(e => el("pre", {class: "error"}, typeof e === "string" ? e : JSON.stringify(e))))));
  }
}

const views = {rules: rulesView, alerts: alertsView, playground: playgroundView, searches: searchesView, health: healthView};
(views[page] || rulesView)().catch(e => main.append(el("pre", {class: "error"}, String(e))));
