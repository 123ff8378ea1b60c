// HAMS-Go dashboard: renders the manager's state (/api/state, pushed over
// Server-Sent Events at /api/events). Plain DOM, no build step; every
// value from the server goes through textContent or an attribute.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (digits === undefined) digits = v >= 100 ? 0 : v >= 10 ? 1 : 2;
  return v.toFixed(digits);
}

function fmtBytes(v) {
  if (v === null || v === undefined) return "–";
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + u[i];
}

function fmtDur(ns) {
  if (!ns) return "";
  const ms = ns / 1e6;
  if (ms < 1) return (ns / 1e3).toFixed(0) + " µs";
  if (ms < 1000) return ms.toFixed(ms < 10 ? 1 : 0) + " ms";
  return (ms / 1000).toFixed(2) + " s";
}

function fmtLag(s) {
  if (s === null || s === undefined) return "–";
  return fmtDur(s * 1e9) || "0 ms";
}

function instClass(i) {
  if (i.health_unknown) return "unknown";
  return i.alive && (!i.server || i.server_alive) ? "alive" : "dead";
}

// instLabel: "backup/3 · pid 1234" (the id's part after the model), with
// what is dead.
function instLabel(i) {
  const parts = i.id.split("/");
  const rest = parts.length > 2 ? parts.slice(2).join("/") : i.id;
  let s = rest === i.role ? i.role : `${i.role} (${rest})`;
  if (i.kind === "model-server" || i.kind.startsWith("pool-")) s = `${i.role} ${rest}`;
  if (!i.health_unknown && !i.alive) s = `dead (${rest})`;
  else if (i.server && !i.server_alive) s += ", server dead";
  if (i.pid) s += ` · pid ${i.pid}`;
  return s;
}

// ---- service graph -------------------------------------------------------

const NODE_W = 230, GAP_X = 56, GAP_Y = 18, IO_W = 84;

// layout assigns each node a layer (longest path from the source) and a
// position; "in" and "out" stand for the frontend as source and sink.
function layout(service, models) {
  const succ = new Map(), pred = new Map(), order = [];
  const add = (n) => { if (!succ.has(n)) { succ.set(n, []); pred.set(n, []); order.push(n); } };
  add("in");
  const edges = service.edges.map(([a, b]) => [a === "frontend" ? "in" : a, b === "frontend" ? "out" : b]);
  for (const [a, b] of edges) { add(a); add(b); }
  for (const [a, b] of edges) { succ.get(a).push(b); pred.get(b).push(a); }
  const layer = new Map();
  const visit = (n, seen) => {
    if (layer.has(n)) return layer.get(n);
    if (seen.has(n)) return 0; // a cycle: the config forbids it
    seen.add(n);
    let l = 0;
    for (const p of pred.get(n)) l = Math.max(l, visit(p, seen) + 1);
    layer.set(n, l);
    return l;
  };
  for (const n of order) visit(n, new Set());
  let maxL = 0;
  for (const [n, l] of layer) if (n !== "out") maxL = Math.max(maxL, l);
  if (layer.has("out")) layer.set("out", maxL + 1);
  const cols = [];
  for (const n of order) {
    const l = layer.get(n);
    (cols[l] = cols[l] || []).push(n);
  }
  const height = (n) => {
    if (n === "in" || n === "out") return 48;
    const m = models.get(n);
    const rows = m ? m.instances.length : 0;
    return 64 + (m && m.stateful ? 15 : 0) + (m && m.pool ? 15 : 0) + 15 * rows;
  };
  const colH = cols.map((c) => c.reduce((s, n) => s + height(n), 0) + GAP_Y * (c.length - 1));
  const totalH = Math.max(...colH, 60);
  const pos = new Map();
  let x = 0;
  cols.forEach((c, i) => {
    const w = c.every((n) => n === "in" || n === "out") ? IO_W : NODE_W;
    let y = (totalH - colH[i]) / 2;
    for (const n of c) {
      pos.set(n, { x, y, w, h: height(n) });
      y += height(n) + GAP_Y;
    }
    x += w + GAP_X;
  });
  return { pos, edges, width: x - GAP_X, height: totalH };
}

function renderGraph(service, models) {
  const L = layout(service, models);
  const pad = 6;
  const root = svg("svg", {
    viewBox: `${-pad} ${-pad} ${L.width + 2 * pad} ${L.height + 2 * pad}`,
    width: L.width + 2 * pad, height: L.height + 2 * pad, role: "img",
    "aria-label": `service graph of ${service.name}`,
  });
  const defs = svg("defs");
  const marker = svg("marker", { id: `arrow-${service.name}`, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
  defs.append(marker);
  root.append(defs);
  for (const [a, b] of L.edges) {
    const p = L.pos.get(a), q = L.pos.get(b);
    if (!p || !q) continue;
    const x1 = p.x + p.w, y1 = p.y + p.h / 2, x2 = q.x, y2 = q.y + q.h / 2, mx = (x1 + x2) / 2;
    root.append(svg("path", { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, class: "edge", "marker-end": `url(#arrow-${service.name})` }));
  }
  for (const [n, p] of L.pos) {
    const g = svg("g", { transform: `translate(${p.x},${p.y})` });
    if (n === "in" || n === "out") {
      g.setAttribute("class", "node io");
      g.append(svg("rect", { class: "box", width: p.w, height: p.h, rx: 8 }));
      g.append(svg("text", { x: p.w / 2, y: 21, "text-anchor": "middle", class: "title" }, "frontend"));
      g.append(svg("text", { x: p.w / 2, y: 37, "text-anchor": "middle", class: "sub" }, n === "in" ? "requests" : "replies"));
      root.append(g);
      continue;
    }
    const m = models.get(n);
    g.setAttribute("class", `node ${m ? m.health : "down"}`);
    g.setAttribute("data-model", n);
    g.append(svg("rect", { class: "box", width: p.w, height: p.h, rx: 8 }));
    g.append(svg("text", { x: 10, y: 18, class: "title" }, n));
    if (!m) { root.append(g); continue; }
    const kind = (m.stateful ? "stateful" : "stateless") + (m.kind ? " " + m.kind : "") + (m.epoch ? " · epoch " + m.epoch : "");
    g.append(svg("text", { x: 10, y: 33, class: "sub" }, kind));
    const s = m.stats;
    let y = 50;
    g.append(svg("text", { x: 10, y, class: "stat" }, `${fmt(s.throughput_rps)} req/s · p50 ${fmt(s.p50_ms)} · p99 ${fmt(s.p99_ms)} ms`));
    if (m.stateful) {
      y += 15;
      g.append(svg("text", { x: 10, y, class: "stat" }, `lag ${fmtLag(s.durability_lag_s)} · out-log ${fmtBytes(s.output_log_bytes)}`));
    }
    if (m.pool) {
      y += 15;
      const rec = (m.pool.outcomes && m.pool.outcomes.reconstructed) || 0;
      g.append(svg("text", { x: 10, y, class: "stat" }, `${m.pool.redundancy}${m.pool.k ? " k=" + m.pool.k : ""} · ${fmt(rec, 0)} reconstructed`));
    }
    for (const i of m.instances) {
      y += 15;
      const c = instClass(i);
      g.append(svg("circle", { cx: 14, cy: y - 4, r: 4, class: c }));
      g.append(svg("text", { x: 24, y, class: c === "dead" ? "dead" : "", "data-instance": i.id, "data-role": i.role, "data-alive": String(i.alive) }, instLabel(i)));
    }
    root.append(g);
  }
  return root;
}

// ---- tables and timeline --------------------------------------------------

function renderModels(st) {
  const tb = $("models").tBodies[0];
  tb.replaceChildren();
  for (const m of st.models) {
    const inst = el("td");
    for (const i of m.instances) {
      const title = i.id + (i.address ? " @ " + i.address : "") + (i.server ? ", model server " + i.server : "") + (i.metrics ? ", metrics " + i.metrics : "");
      const dead = !i.health_unknown && !i.alive;
      inst.append(el("span", { class: `chip ${instClass(i)}`, title }, (dead ? "dead" : i.role) + (i.epoch ? " e" + i.epoch : "")));
    }
    const s = m.stats;
    let parm = "";
    if (m.pool) {
      const o = m.pool.outcomes || {};
      parm = `${m.pool.replicas}+${m.pool.parity} ${m.pool.redundancy}: ${fmt(o.reconstructed || 0, 0)} rec. (${fmt(m.pool.reconstructed_per_s)}/s), ${fmt(o.original || 0, 0)} orig.`;
    }
    const outlog = s.output_log_bytes === undefined ? "–" :
      fmtBytes(s.output_log_bytes) + (s.output_log_limit_bytes ? " / " + fmtBytes(s.output_log_limit_bytes) : "");
    tb.append(el("tr", { "data-model": m.name },
      el("td", {}, el("b", {}, m.name)),
      el("td", { class: `health ${m.health}` }, m.health),
      inst,
      el("td", { class: "num" }, fmt(s.throughput_rps)),
      el("td", { class: "num" }, fmt(s.p50_ms)),
      el("td", { class: "num" }, fmt(s.p99_ms)),
      el("td", { class: "num" }, m.stateful ? fmtLag(s.durability_lag_s) : ""),
      el("td", { class: "num" }, m.stateful ? outlog : ""),
      el("td", { class: "num" }, fmt(s.queue_depth, 0)),
      el("td", { class: "small" }, parm)));
  }
  const fb = $("frontends").tBodies[0];
  fb.replaceChildren();
  for (const f of st.frontends || []) {
    fb.append(el("tr", {}, el("td", {}, f.id), el("td", {}, f.role),
      el("td", { class: `health ${f.alive ? "ok" : "down"}` }, f.alive ? "alive" : "dead")));
  }
  const errs = Object.entries(st.scrape_errors || {});
  $("errors").textContent = errs.length ? "metrics not scraped: " + errs.map(([k, v]) => `${k}: ${v}`).join("; ") : "";
}

const KIND_LABEL = {
  "suspicion": "suspicion", "failover": "failover", "promotion": "promotion",
  "redundancy-restored": "redundancy restored", "unrecoverable": "unrecoverable",
  "retired": "retired", "readmitted": "readmitted", "active": "manager active", "standby": "manager standby",
};

function renderTimeline(st) {
  const ol = $("timeline");
  ol.replaceChildren();
  const evs = (st.timeline || []).slice().reverse();
  $("timeline-empty").hidden = evs.length > 0;
  for (const e of evs) {
    const t = new Date(e.at);
    const ts = t.toLocaleTimeString([], { hour12: false }) + "." + String(t.getMilliseconds()).padStart(3, "0");
    const what = [];
    if (e.model) what.push(el("b", {}, e.model));
    if (e.component) what.push(" " + e.component);
    if (e.role) what.push(" (" + e.role + (e.epoch ? ", epoch " + e.epoch : "") + ")");
    if (e.count > 1) what.push(` ×${e.count}`);
    const dur = [];
    if (e.duration_ns) dur.push(el("span", { class: "dur" }, fmtDur(e.duration_ns)));
    if (e.from_failure_ns) dur.push(el("span", { class: "dim" }, ` (${fmtDur(e.from_failure_ns)} after the failure)`));
    const li = el("li", { "data-kind": e.kind, "data-model": e.model || "" },
      el("span", { class: "t" }, ts),
      el("span", { class: `k ${e.kind}` }, KIND_LABEL[e.kind] || e.kind),
      el("span", {}, ...what, what.length && dur.length ? " — " : "", ...dur));
    if (e.detail) li.append(el("span", { class: "d dim small" }, e.detail));
    ol.append(li);
  }
}

function render(st) {
  $("deployment").textContent = st.deployment;
  $("mode").textContent = st.mode;
  $("manager").textContent = st.manager.id || "manager";
  const r = $("manager-role");
  r.textContent = st.manager.role;
  r.className = "badge " + st.manager.role;
  $("revision").textContent = st.revision;
  $("window").textContent = `(rates and percentiles over the last ${st.window_s} s; latency: backend call per batch)`;
  const models = new Map(st.models.map((m) => [m.name, m]));
  const graphs = $("graphs");
  graphs.replaceChildren();
  for (const sv of st.services) {
    const s = sv.stats;
    const head = el("h2", {}, "service " + sv.name,
      el("span", { class: "dim small" }, `end to end: ${fmt(s.throughput_rps)} req/s · p50 ${fmt(s.p50_ms)} ms · p99 ${fmt(s.p99_ms)} ms`));
    graphs.append(el("div", { class: "service", "data-service": sv.name }, head, renderGraph(sv, models)));
  }
  renderModels(st);
  renderTimeline(st);
  document.body.dataset.revision = st.revision;
  document.body.dataset.events = (st.timeline || []).length;
}

function setConn(state) {
  const c = $("conn");
  c.textContent = state;
  c.className = "badge " + (state === "live" ? "conn-live" : state === "connecting" ? "conn-wait" : "conn-lost");
}

function connect() {
  const es = new EventSource("api/events");
  es.addEventListener("state", (ev) => {
    setConn("live");
    render(JSON.parse(ev.data));
  });
  es.onerror = () => setConn(es.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting");
}

fetch("api/state").then((r) => r.json()).then(render).catch(() => {});
connect();
