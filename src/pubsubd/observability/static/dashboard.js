// pubsubd's dashboard: every page is static HTML; this script fetches the same JSON API that
// scripts read (/api/..., /alerts), writes the numbers into the elements marked
// data-metric="path.in.the.document" (formatted by data-format), fills the tables and draws
// the charts with uPlot (vendored, served by pubsubd). It polls every POLL_MS. Values from
// the server only ever reach the page as text (textContent), never as markup. The long lists
// page: which page a list shows comes from the page's own URL (<list>_page_token,
// <list>_filter, page_size), so its previous/next controls are plain links.
"use strict";

const POLL_MS = 5000;
const DASH = "\u2013";

const FORMATS = {
  text: (v) => (v == null ? DASH : String(v)),
  int: (v) => (v == null ? DASH : String(Math.round(v))),
  rate: (v) => (v == null ? DASH : v.toFixed(1)),
  ms: (v) => (v == null ? DASH : v.toFixed(1)),
  s: (v) => (v == null ? DASH : v.toFixed(1)),
  pct: (v) => (v == null ? DASH : (v * 100).toFixed(3)),
  bool: (v) => (v == null ? DASH : v ? "yes" : "no"),
  bytes: (v) => {
    if (v == null) return DASH;
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) {
      v /= 1024;
      i++;
    }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(1)) + " " + units[i];
  },
};

function get(obj, path) {
  return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
}

function show(v, format) {
  return (FORMATS[format || "text"] || FORMATS.text)(v);
}

// Every [data-metric] under root whose data-source is `source` gets its value from data.
function fill(root, source, data) {
  for (const el of root.querySelectorAll(`[data-source="${source}"] [data-metric], [data-metric][data-source="${source}"]`)) {
    el.textContent = show(get(data, el.dataset.metric), el.dataset.format);
  }
}

function param(name) {
  return new URLSearchParams(window.location.search).get(name) || "";
}

async function fetchJson(path) {
  const resp = await fetch(path, { cache: "no-store" });
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error || `${path}: HTTP ${resp.status}`);
  return body;
}

function link(page, name) {
  return `/ui/${page}?name=${encodeURIComponent(name)}`;
}

// columns: [{key, label, format, link: "topic"|"subscription"}]; rows get data-name.
function table(el, rows, columns, empty) {
  const head = document.createElement("tr");
  for (const c of columns) {
    const th = document.createElement("th");
    th.textContent = c.label;
    head.appendChild(th);
  }
  const body = [head];
  for (const row of rows) {
    const tr = document.createElement("tr");
    if (row.name != null) tr.dataset.name = row.name;
    for (const c of columns) {
      const td = document.createElement("td");
      td.dataset.col = c.key;
      const text = show(get(row, c.key), c.format);
      if (c.link && get(row, c.key) != null) {
        const a = document.createElement("a");
        a.href = link(c.link, get(row, c.key));
        a.textContent = text;
        td.appendChild(a);
      } else {
        td.textContent = text;
      }
      if (c.format && c.format !== "text") td.className = "num";
      tr.appendChild(td);
    }
    body.push(tr);
  }
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = columns.length;
    td.className = "empty";
    td.textContent = empty || "none";
    tr.appendChild(td);
    body.push(tr);
  }
  el.replaceChildren(...body);
}

const charts = new Map();
const COLORS = ["#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd"];

// A time-series chart in el: history.t (unix seconds) against history[key] for each series
// (points: true draws each value as a dot too, for sparse series whose values have gaps
// around them).
function chart(el, history, series) {
  const data = [history.t, ...series.map((s) => history[s.key])];
  let u = charts.get(el);
  if (u) {
    u.setData(data);
    return;
  }
  if (typeof uPlot === "undefined") {
    el.textContent = "charts unavailable (uPlot did not load)";
    return;
  }
  const opts = {
    title: el.dataset.title || "",
    width: Math.max(300, el.clientWidth || 560),
    height: 200,
    series: [{}, ...series.map((s, i) => ({
      label: s.label,
      stroke: COLORS[i % COLORS.length],
      width: 2,
      spanGaps: false,
      ...(s.points ? { points: { show: true, size: 5, fill: COLORS[i % COLORS.length] } } : {}),
    }))],
    axes: [{}, { size: 60 }],
  };
  u = new uPlot(opts, data, el);
  charts.set(el, u);
}

function setError(message) {
  const el = document.getElementById("error");
  if (!el) return;
  el.textContent = message || "";
  el.hidden = !message;
}

// --- paged lists -------------------------------------------------------------------------------

// The API path of a list's page named by this page's URL.
function listPath(list) {
  const here = new URLSearchParams(window.location.search);
  const query = new URLSearchParams();
  for (const [from, to] of [[`${list}_page_token`, "page_token"], [`${list}_filter`, "filter"], ["page_size", "page_size"]]) {
    const value = here.get(from);
    if (value) query.set(to, value);
  }
  const q = query.toString();
  return `/api/${list}` + (q ? `?${q}` : "");
}

// This page's URL with the list's parameter `name` set to value (removed when empty); a new
// filter starts from the first page.
function withListParam(list, name, value) {
  const query = new URLSearchParams(window.location.search);
  if (value) query.set(`${list}_${name}`, value);
  else query.delete(`${list}_${name}`);
  if (name === "filter") query.delete(`${list}_page_token`);
  const q = query.toString();
  return window.location.pathname + (q ? `?${q}` : "");
}

function setLink(el, href) {
  if (href == null) {
    el.removeAttribute("href");
    el.setAttribute("aria-disabled", "true");
  } else {
    el.href = href;
    el.removeAttribute("aria-disabled");
  }
}

// The controls of a list (ids <list>-previous, <list>-next, <list>-range) for its document.
function pager(list, doc) {
  const previous = doc.previous_page_token;
  setLink(document.getElementById(`${list}-previous`), previous == null ? null : withListParam(list, "page_token", previous));
  setLink(document.getElementById(`${list}-next`), doc.next_page_token ? withListParam(list, "page_token", doc.next_page_token) : null);
  const shown = doc[list].length;
  document.getElementById(`${list}-range`).textContent = shown
    ? `${doc.offset + 1}${DASH}${doc.offset + shown} of ${doc.total}`
    : `none of ${doc.total}`;
}

// Each form.filter[data-list] shows its list's filter and, submitted, reloads the page with it.
function filters() {
  for (const form of document.querySelectorAll("form.filter[data-list]")) {
    const list = form.dataset.list;
    const input = form.querySelector("input");
    input.value = param(`${list}_filter`);
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      window.location.href = withListParam(list, "filter", input.value);
    });
  }
}

// --- pages -----------------------------------------------------------------------------------

const SUB_COLUMNS = [
  { key: "name", label: "subscription", link: "subscription" },
  { key: "topic", label: "topic", link: "topic" },
  { key: "backlog_messages", label: "backlog", format: "int" },
  { key: "backlog_bytes", label: "backlog bytes", format: "bytes" },
  { key: "oldest_unacked_age_s", label: "oldest unacked (s)", format: "s" },
  { key: "consumers", label: "consumers", format: "int" },
  { key: "delivered", label: "delivered", format: "int" },
  { key: "acked", label: "acked", format: "int" },
  { key: "delivery_latency_ms.p99", label: "delivery p99 (ms, \u2264)", format: "ms" },
];

const PAGES = {
  async overview() {
    const [overview, topics, subs] = await Promise.all([
      fetchJson("/api/overview"),
      fetchJson(listPath("topics")),
      fetchJson(listPath("subscriptions")),
    ]);
    fill(document, "overview", overview);
    const slos = overview.slos.map((o) => ({ name: `${o.slo} ${o.scope}`, ...o }));
    table(document.getElementById("slos"), slos, [
      { key: "slo", label: "SLO" },
      { key: "scope", label: "scope" },
      { key: "objective", label: "objective" },
      { key: "sli", label: "SLI (%)", format: "pct" },
      { key: "total", label: "requests", format: "int" },
      { key: "error_budget_remaining", label: "error budget left (%)", format: "pct" },
      { key: "firing", label: "firing", format: "bool" },
    ]);
    const errors = Object.entries(overview.errors_by_code).map(([code, count]) => ({ code, count }));
    table(document.getElementById("errors"), errors, [
      { key: "code", label: "code" },
      { key: "count", label: "requests", format: "int" },
    ], "no errors");
    table(document.getElementById("topics"), topics.topics, [
      { key: "name", label: "topic", link: "topic" },
      { key: "subscriptions", label: "subscriptions", format: "int" },
      { key: "published", label: "published", format: "int" },
      { key: "publish_per_s", label: "publish/s", format: "rate" },
    ]);
    pager("topics", topics);
    table(document.getElementById("subscriptions"), subs.subscriptions, SUB_COLUMNS);
    pager("subscriptions", subs);
    const h = overview.history;
    chart(document.getElementById("chart-throughput"), h, [
      { key: "publish_per_s", label: "published/s" },
      { key: "deliver_per_s", label: "delivered/s" },
      { key: "ack_per_s", label: "acked/s" },
    ]);
    chart(document.getElementById("chart-latency"), h, [
      { key: "publish_p50_ms", label: "p50 ms" },
      { key: "publish_p99_ms", label: "p99 ms" },
    ]);
    chart(document.getElementById("chart-errors"), h, [{ key: "errors_per_s", label: "server errors/s" }]);
  },

  async topic() {
    const name = param("name");
    document.getElementById("name").textContent = name;
    const topic = await fetchJson(`/api/topic?name=${encodeURIComponent(name)}`);
    fill(document, "topic", topic);
    table(document.getElementById("subscriptions"), topic.subscription_backlogs, SUB_COLUMNS);
    chart(document.getElementById("chart-publish"), topic.history, [{ key: "publish_per_s", label: "published/s" }]);
    chart(document.getElementById("chart-bytes"), topic.history, [{ key: "publish_bytes_per_s", label: "bytes/s" }]);
  },

  async subscription() {
    const name = param("name");
    document.getElementById("name").textContent = name;
    const sub = await fetchJson(`/api/subscription?name=${encodeURIComponent(name)}`);
    fill(document, "subscription", sub);
    const topic = document.getElementById("topic-link");
    topic.href = link("topic", sub.topic);
    chart(document.getElementById("chart-backlog"), sub.history, [{ key: "backlog_messages", label: "backlog" }]);
    chart(document.getElementById("chart-age"), sub.history, [{ key: "oldest_unacked_age_s", label: "oldest unacked (s)" }]);
    chart(document.getElementById("chart-rates"), sub.history, [
      { key: "deliver_per_s", label: "delivered/s" },
      { key: "ack_per_s", label: "acked/s" },
    ]);
    chart(document.getElementById("chart-delivery"), sub.history, [
      { key: "delivery_p50_ms", label: "p50 ms", points: true },
      { key: "delivery_p99_ms", label: "p99 ms", points: true },
    ]);
  },

  async cluster() {
    const c = await fetchJson("/api/cluster");
    fill(document, "cluster", c);
    const single = c.cluster == null && !c.error;
    document.getElementById("single").hidden = !single;
    document.getElementById("clustered").hidden = single;
    if (single) return;
    setError(c.error ? `cluster state unavailable: ${c.error}` : "");
    const routing = c.routing || { forwarders: [] };
    table(document.getElementById("forwarders"), routing.forwarders.map((f) => ({ name: f.forwarder_id, ...f })), [
      { key: "forwarder_id", label: "forwarder" },
      { key: "address", label: "address" },
      { key: "zone", label: "zone" },
      { key: "version", label: "version" },
      { key: "drained", label: "drained", format: "bool" },
      { key: "publishing_units", label: "publishing units", format: "int" },
      { key: "subscribing_units", label: "subscribing units", format: "int" },
    ]);
    // A subscription whole: its backlog summed over the forwarders serving its sources.
    const whole = (routing.subscriptions || []).map((s) => ({
      name: s.subscription,
      ...s,
      served_by: Object.entries(s.forwarders)
        .map(([f, share]) => `${f}: ${share.sources.join(",") || "-"} (${share.backlog_messages})`)
        .join("; "),
    }));
    table(document.getElementById("backlogs"), whole, [
      { key: "subscription", label: "subscription", link: "subscription" },
      { key: "backlog_messages", label: "backlog", format: "int" },
      { key: "backlog_bytes", label: "bytes", format: "bytes" },
      { key: "oldest_unacked_age_s", label: "oldest unacked s", format: "s" },
      { key: "spread", label: "spread", format: "bool" },
      { key: "complete", label: "complete", format: "bool" },
      { key: "served_by", label: "forwarder: sources (backlog)" },
    ], "no subscription reported with a backlog");
    const storage = c.cluster || { nodes: [] };
    table(document.getElementById("nodes"), storage.nodes.map((n) => ({ name: n.node_id, ...n })), [
      { key: "node_id", label: "storage node" },
      { key: "address", label: "address" },
      { key: "zone", label: "zone" },
      { key: "free_bytes", label: "free", format: "bytes" },
    ]);
    const pins = Object.entries((routing.constraints || {}).pinned_topics || {}).map(([topic, f]) => ({ topic, forwarder: f }));
    table(document.getElementById("pins"), pins, [
      { key: "topic", label: "pinned topic" },
      { key: "forwarder", label: "forwarder" },
    ]);
  },

  async alerts() {
    const a = await fetchJson("/alerts");
    a.firing_count = a.firing.length;
    fill(document, "alerts", a);
    table(document.getElementById("firing"), a.firing, [
      { key: "alert", label: "alert" },
      { key: "severity", label: "severity" },
      { key: "slo", label: "SLO" },
      { key: "scope", label: "scope" },
      { key: "why", label: "why" },
    ], "nothing is firing");
    const rows = [];
    for (const o of a.objectives) {
      for (const w of o.windows) {
        rows.push({ ...o, name: `${o.slo} ${o.scope} ${w.long_window}`, window: `${w.long_window} / ${w.short_window}`, threshold: w.threshold, long_burn_rate: w.long_burn_rate, short_burn_rate: w.short_burn_rate, window_firing: w.firing });
      }
    }
    table(document.getElementById("objectives"), rows, [
      { key: "slo", label: "SLO" },
      { key: "scope", label: "scope" },
      { key: "objective", label: "objective" },
      { key: "error_budget_remaining", label: "error budget left (%)", format: "pct" },
      { key: "window", label: "windows" },
      { key: "threshold", label: "burn threshold", format: "rate" },
      { key: "long_burn_rate", label: "long burn", format: "rate" },
      { key: "short_burn_rate", label: "short burn", format: "rate" },
      { key: "window_firing", label: "firing", format: "bool" },
    ]);
  },
};

async function refresh(page) {
  try {
    await PAGES[page]();
    setError("");
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  } catch (e) {
    setError(String(e.message || e));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  filters();
  refresh(page);
  setInterval(() => refresh(page), POLL_MS);
});
